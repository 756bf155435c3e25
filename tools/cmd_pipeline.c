/* `vkswarm pipeline`: generation with the model cut into stages across MPI
 * ranks (run under mpirun). Prints exactly what `vkswarm generate --prompts`
 * prints for the same prompts and seed. */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include "cli_model.h"
#include "cli_mpi.h"
#include "cli_prompts.h"
#include "cli_util.h"
#include "vkswarm/vks_toploc.h"
#include "vkswarm/vks_mpi.h"
#include "vkswarm/vks_pipeline.h"
#include "vkswarm/vks_partition.h"

static const char pipeline_usage[] =
    "usage: mpirun -np S vkswarm pipeline --model M [--tokenizer T] --prompts FILE [--batch B]\n"
    "           [--micro-batches K] [--chunk R] [-n STEPS] [--temp X] [--top-p P] [--top-k K] [--seed S]\n"
    "           [--partition even|auto|n1,n2,...] [--wire f32|f16] [--link-latency-ms L] [--link-mbps R]\n"
    "           [--timeout-s T] [--dtype f32|f16|bf16] [--kv-type f32|f16] [--device N]\n"
    "           [--rollouts-out FILE [--toploc|--no-toploc]] [--lora PATH]\n"
    "           [--chat-template NAME [--system TEXT] [--no-think]]\n"
    "Rank s holds a contiguous range of layers; rank 0 also the embedding and the schedule, rank S-1 the\n"
    "final norm, the classifier and the sampler. K micro-batches of B sequences circulate in a ring; the\n"
    "MPI tag carries the micro-batch id. Output on rank 0's stdout: one JSON object per prompt, in prompt\n"
    "order, exactly as `vkswarm generate --prompts` prints. Defaults: --micro-batches S, --batch\n"
    "ceil(prompts / K), --chunk 32 rows per prefill step, --partition even, --wire f32 (exact; f16 halves\n"
    "the bytes), --timeout-s 20 (a rank silent that long is reported lost and the job stops, exit status\n"
    "3; it bounds every start-up step too, so each rank must load its model within it).\n"
    "--link-latency-ms / --link-mbps delay each message between stages by L plus its size over R.\n"
    "--rollouts-out FILE writes the rollout file of `generate --rollouts-out`; the last stage builds the\n"
    "TOPLOC proofs while it samples and sends them to rank 0 at the end (--no-toploc: empty proofs); every\n"
    "other stage commits the activations it hands on at the sampling positions (\"stage_proofs\"), so that\n"
    "verify names the first stage whose commitment fails.\n"
    "--chat-template / --system / --no-think: each prompt as one user message in that chat format, exactly\n"
    "as `vkswarm generate` feeds it (rank 0 renders and tokenizes; see `vkswarm generate --help`).\n"
    CLI_LORA_HELP "(each rank puts on its device the adapter's matrices of its own layers; every rank must hold the same\n"
    "base and adapter).\n";

typedef struct {
    cli_model_args m;
    cli_sampling s;
    const char *prompts_file, *partition, *wire, *rollouts_out;
    bool no_toploc;
    int batch, micro_batches, chunk;
    double latency_ms, mbps, timeout_s;
    vks_prompt_format format; /* the chat flags, as generate's; default: BOS + the prompt */
} pipeline_args;

static void parse_pipeline(int argc, char **argv, pipeline_args *a) {
    static const struct option opts[] = {CLI_MODEL_LONG_OPTIONS, CLI_SAMPLING_LONG_OPTIONS, CLI_LORA_LONG_OPTION,
                                         {"prompts", required_argument, 0, 0}, {"batch", required_argument, 0, 0},
                                         {"micro-batches", required_argument, 0, 0}, {"chunk", required_argument, 0, 0},
                                         {"partition", required_argument, 0, 0}, {"wire", required_argument, 0, 0},
                                         {"link-latency-ms", required_argument, 0, 0},
                                         {"link-mbps", required_argument, 0, 0}, {"timeout-s", required_argument, 0, 0},
                                         {"rollouts-out", required_argument, 0, 0}, {"toploc", no_argument, 0, 0},
                                         {"no-toploc", no_argument, 0, 0}, CLI_CHAT_LONG_OPTIONS,
                                         {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    a->m.device = -1;
    cli_sampling_defaults(&a->s);
    a->partition = "even";
    a->wire = "f32";
    a->chunk = 32;
    a->timeout_s = 20;
    vks_prompt_format_default(&a->format);
    int c, idx;
    while ((c = cli_getopt(argc, argv, "n:h", opts, &idx)) != -1) {
        if (c == 'h') { fputs(pipeline_usage, stdout); exit(0); }
        if (c == 'n') { cli_sampling_option(&a->s, "n", optarg); continue; }
        const char *name = opts[idx].name;
        if (cli_model_option(&a->m, name, optarg) || cli_sampling_option(&a->s, name, optarg) ||
            cli_prompt_option(&a->format, "pipeline", name, optarg))
            continue;
        if (!strcmp(name, "prompts")) a->prompts_file = optarg;
        else if (!strcmp(name, "batch")) a->batch = (int)cli_parse_long("--batch", optarg, 1, 4096);
        else if (!strcmp(name, "micro-batches")) a->micro_batches = (int)cli_parse_long("--micro-batches", optarg, 1, 256);
        else if (!strcmp(name, "chunk")) a->chunk = (int)cli_parse_long("--chunk", optarg, 1, 4096);
        else if (!strcmp(name, "partition")) a->partition = optarg;
        else if (!strcmp(name, "wire")) a->wire = optarg;
        else if (!strcmp(name, "link-latency-ms")) a->latency_ms = cli_parse_double("--link-latency-ms", optarg, 0, 1e5);
        else if (!strcmp(name, "link-mbps")) a->mbps = cli_parse_double("--link-mbps", optarg, 0, 1e7);
        else if (!strcmp(name, "timeout-s")) a->timeout_s = cli_parse_double("--timeout-s", optarg, 0.1, 1e5);
        else if (!strcmp(name, "rollouts-out")) a->rollouts_out = optarg;
        else if (!strcmp(name, "toploc")) a->no_toploc = false;
        else if (!strcmp(name, "no-toploc")) a->no_toploc = true;
    }
    if (optind < argc) cli_usage_error("pipeline", "unexpected argument '%s'", argv[optind]);
    if (!a->prompts_file) cli_usage_error("pipeline", "--prompts FILE is required");
    if (strcmp(a->wire, "f32") && strcmp(a->wire, "f16")) cli_die(EXIT_BAD_INPUT, "--wire: '%s' is not f32 or f16", a->wire);
    if (vks_prompt_check(&a->format)) cli_usage_error("pipeline", "%s", vks_last_error());
}

/* A rank went silent during start-up: MPI_Finalize would wait for it, so the job ends here. */
static _Noreturn void die_startup(int rank) {
    fprintf(stderr, "vkswarm: rank %d: %s; stopping the job\n", rank, vks_last_error());
    cli_mpi_abort(3);
}

/* vks_pipeline_run failed on this rank: say so, and end the job (cleanly when
 * every rank failed at the same point, else by MPI_Abort: peers may be waiting). */
static _Noreturn void end_failed_run(int rc, const vks_pipeline_stats *st, double timeout_s) {
    fprintf(stderr, "vkswarm: %s\n", vks_last_error());
    if (!st->ended_together) cli_mpi_abort(cli_mpi_status(rc));
    vks_mpi_stop_within(timeout_s, cli_mpi_stuck);
    exit(EXIT_BAD_INPUT);
}

static void choose_partition(const pipeline_args *a, vks_gpu *g, const vks_model *m, int rank, int size, int *first) {
    int n = m->cfg.n_layers, rc;
    if (!strcmp(a->partition, "even")) rc = vks_partition_even(n, size, first);
    else if (strcmp(a->partition, "auto")) rc = vks_partition_parse(a->partition, n, size, first);
    else {
        const vks_engine_options *types = &a->m.engine;
        vks_stage_measure me, *all = malloc(sizeof me * (size_t)size);
        if (!all) cli_die(1, "out of host memory");
        if (vks_engine_measure_stage(g, m, types, a->batch, &me)) /* unmeasured: placed by memory alone */
            me = (vks_stage_measure){.seconds_per_layer = 1.0, .free_bytes = vks_gpu_free_bytes(g)};
        if (vks_mpi_exchange(vks_mpi_world(), &me, all, sizeof me, VKS_TAG_MEASURE, a->timeout_s, "measuring the ranks"))
            die_startup(rank);
        const vks_model_config *c = &m->cfg;
        uint64_t layer_w = vks_engine_layer_bytes(m, types, 0);
        uint64_t layer_kv = 2ull * (uint64_t)a->micro_batches * a->batch * (uint64_t)c->seq_len * c->kv_dim * 4;
        uint64_t table = vks_engine_embedding_bytes(m, types);
        double table_layers = (double)table / (double)(layer_w ? layer_w : 1); /* the classifier's matmul vs a layer's */
        rc = vks_partition_auto(n, size, all, layer_w + layer_kv, table, table, 0.0, table_layers, first);
        free(all);
    }
    if (rc) cli_die(EXIT_BAD_INPUT, "%s", vks_last_error());
    if (rank == 0) {
        char buf[1024];
        vks_partition_describe(first, size, buf, sizeof buf);
        fprintf(stderr, "vkswarm: partition (%s): %s\n", a->partition, buf);
    }
}

static void print_results(const pipeline_args *a, vks_tokenizer *t, char **lines, vks_sequence *seqs, int n) {
    (void)a;
    for (int i = 0; i < n; i++) {
        size_t len = 0;
        char *text = cli_sequence_text(t, &seqs[i], &len);
        cli_print_json(lines[i], &seqs[i], text, len);
        free(text);
    }
    fflush(stdout);
}

int cmd_pipeline(int argc, char **argv) {
    pipeline_args a = {0};
    parse_pipeline(argc, argv, &a);
    int rank, size;
    vks_mpi_start_within(VKS_MPI_THREADS_FUNNELED, a.timeout_s, cli_mpi_stuck, &rank, &size);
    vks_model *m = cli_load_model(&a.m);
    uint8_t hash[32];
    cli_model_hash(&a.m, m, hash);
    int rc = vks_mpi_check_ranks(vks_mpi_world(), hash, a.timeout_s);
    if (rc == VKS_ERR_TIMEOUT) die_startup(rank);
    if (rc) {
        if (rank == 0) fprintf(stderr, "vkswarm: %s\n", vks_last_error());
        vks_mpi_stop_within(a.timeout_s, cli_mpi_stuck);
        return EXIT_BAD_INPUT;
    }
    vks_tokenizer *t = rank == 0 ? cli_load_tokenizer(&a.m, m) : NULL;
    char **lines = NULL;
    int n = 0;
    vks_sequence *seqs = NULL;
    if (rank == 0) {
        cli_check_chat_flags("pipeline", &a.format, t);
        cli_sampling_finish(&a.s);
        lines = cli_read_prompts(a.prompts_file, &n);
        seqs = calloc((size_t)n, sizeof *seqs);
        if (!seqs) cli_die(1, "out of host memory");
        for (int i = 0; i < n; i++)
            cli_encode_formatted_prompt("pipeline", &a.format, t, m->cfg.vocab_size, lines[i], i, &seqs[i]);
    }
    vks_pipeline_job job = {.seed = a.s.seed, .n_prompts = n, .stop_token_a = t ? vks_tokenizer_bos(t) : 1,
                            .stop_token_b = t ? vks_tokenizer_eos(t) : -1};
    rc = vks_pipeline_share_job(vks_mpi_world(), &job, a.timeout_s);
    if (rc == VKS_ERR_TIMEOUT) die_startup(rank);
    if (rc) cli_die(EXIT_BAD_INPUT, "%s", vks_last_error());
    a.s.seed = job.seed;
    n = job.n_prompts;
    if (a.micro_batches == 0) a.micro_batches = size;
    if (a.batch == 0) a.batch = (n + a.micro_batches - 1) / a.micro_batches;
    vks_sched_params sp = cli_sched_params(&a.s, m, NULL);
    sp.stop_token_a = job.stop_token_a;
    sp.stop_token_b = job.stop_token_b;
    vks_gpu *g = cli_open_gpu(&a.m);
    int *first = malloc(sizeof(int) * (size_t)(size + 1));
    choose_partition(&a, g, m, rank, size, first);
    vks_pipeline_options po = {.micro_batches = a.micro_batches, .batch = a.batch, .chunk = a.chunk, .sched = sp,
                               .wire = strcmp(a.wire, "f16") ? VKS_WIRE_F32 : VKS_WIRE_F16,
                               .link = {a.latency_ms, a.mbps}, .timeout_s = a.timeout_s, .first = first,
                               .engine = a.m.engine, .toploc = a.rollouts_out && !a.no_toploc, .lora = a.m.lora};
    po.engine.f32_math = a.rollouts_out != NULL;
    po.stage_proofs = po.toploc; /* every stage but the last commits what it hands on */
    vks_rollout_writer *rollouts = NULL;
    if (rank == 0 && a.rollouts_out && /* no proofs made here: the last stage makes them */
        vks_rollout_writer_create(a.rollouts_out, m, a.m.lora, a.m.model_path ? a.m.model_path : a.m.random_spec, &sp, n, false,
                                  &rollouts))
        cli_die(EXIT_BAD_INPUT, "%s", vks_last_error());
    vks_rollout_writer_set_kv_f16(rollouts, po.engine.kv_f16); /* every stage's engine holds the same cache type */
    vks_pipeline_stats st;
    rc = vks_pipeline_run(vks_mpi_world(), g, m, &po, seqs, n, &st);
    if (rc) end_failed_run(rc, &st, a.timeout_s);
    fprintf(stderr, "vkswarm: rank %d: layers [%d,%d), %ld steps in %.2fs, step %.2f ms, GPU busy %.0f%%, %.1f MB sent\n",
            rank, first[rank], first[rank + 1], st.steps, st.wall_s, 1e3 * st.gpu_busy_s / (st.steps ? st.steps : 1),
            100.0 * st.gpu_busy_s / (st.wall_s + 1e-9), st.bytes_sent / 1e6);
    if (po.stage_proofs && rank < size - 1) /* what committing what this stage hands on cost it */
        fprintf(stderr, "vkswarm: rank %d: stage commitments: %.3f ms/step on the GPU thread (%.2f%% of the step), "
                "%.3f ms/step building proofs on their own thread\n", rank, 1e3 * st.commit_s / (st.steps ? st.steps : 1),
                100.0 * st.commit_s / (st.gpu_busy_s + 1e-9), 1e3 * st.commit_build_s / (st.steps ? st.steps : 1));
    if (rank == 0) {
        long produced = cli_generated_tokens(seqs, n);
        fprintf(stderr, "vkswarm: %ld tokens in %.2fs (%.1f tokens/s)\n", produced, st.wall_s, produced / st.wall_s);
        print_results(&a, t, lines, seqs, n);
        if (rollouts && vks_rollout_writer_finish(rollouts, seqs, n, 0)) cli_die(1, "%s", vks_last_error());
        vks_rollout_writer_destroy(rollouts);
        for (int i = 0; i < n; i++) { vks_sequence_free(&seqs[i]); free(lines[i]); }
    }
    rc = cli_finish_gpu(g);
    free(seqs); free(lines); free(first);
    vks_tokenizer_free(t);
    cli_free_model(&a.m, m);
    vks_mpi_stop_within(a.timeout_s, cli_mpi_stuck);
    return rc;
}
