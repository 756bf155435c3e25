/* `vkswarm verify`: recomputes rollout samples and accepts or rejects each
 * (TOPLOC proofs, sampler replay, stop rules). */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include "cli_model.h"
#include "cli_mpi.h"
#include "cli_prompts.h"
#include "cli_util.h"
#include "vkswarm/vks_mpi.h"
#include "vkswarm/vks_verifier.h"
#include "commands.h"
#include "vkswarm/vks_toploc.h"
#include "vkswarm/vks_verify_group.h"

static const char verify_usage[] =
    "usage: vkswarm verify --model M --rollouts FILE [--prompts FILE [--tokenizer T]] [--device N]\n"
    "                      [--cpu] [--jsonl] [--batch N] [--stop-ids LIST] [--max-exp-mismatches N]\n"
    "                      [--max-mant-mean X] [--max-mant-median X] [--logit-margin X]\n"
    "                      [--dtype f32|f16|bf16] [--kv-type f32|f16] [--mpi [--timeout-s T]] [--threads N] [--cpu-reference]\n"
    "                      [--sample-fraction F | --sample N] [--sample-seed S] [--bad-fraction P] [--group-by seed|file]\n"
    "                      [--lora PATH]\n"
    "Verifies every sample of a rollout file (written by generate/pipeline --rollouts-out) by\n"
    "recomputing it with one prefill over prompt + output: the TOPLOC proof of each chunk of 32\n"
    "committed rows, the seeded sampler's choice at every position, and the stop rule (a sample that\n"
    "stops before max_steps ends with a stop token). Prints one line per sample (id, accepted or\n"
    "rejected: reason) and a summary; with --jsonl one {\"id\",\"accepted\",\"reason\"} per sample and\n"
    "nothing else on stdout. Exit 0 when all pass, 1 when any is rejected, 2 on bad input: also when the\n"
    "rollouts name another model than --model (wrong weights: stderr says both hashes and, for vkswarm rl's\n"
    "rollouts, the policy step whose weights they need and where those are).\n"
    "Samples from a pipeline carry stage_proofs, each stage's commitment of what it handed on: they\n"
    "are checked in stage order (the residual stream at each stage's last layer, same prefill), and\n"
    "the first that fails names its stage: \"rejected: stage 1 (rank 1, layers [2,4)): ...\".\n"
    "--mpi (under mpirun): rank 0 reads the file and hands batches to verifier ranks 1..N-1, which\n"
    "verify them (each with its own GPU, or --cpu) and send back verdicts; output as without --mpi.\n"
    "--timeout-s T (default 20): a verifier rank silent that long loses its batches to the others (or\n"
    "to rank 0 when none is left; a late answer is discarded) and the job then ends with status 3 after\n"
    "the complete output; a silent rank 0 stops the verifiers within T.\n"
    "Without --device, a machine (or verifier rank) where no Vulkan device opens verifies with --cpu.\n"
    "--cpu verifies with the fast f32 CPU forward (OpenBLAS; no GPU) on --threads N threads (default:\n"
    "every core); --cpu-reference uses the float64 reference forward instead (slow, one thread).\n"
    "--batch N: samples per batched prefill (GPU KV slots, default 16). --stop-ids: the stop tokens\n"
    "the verifier trusts (default 1,2, BOS and EOS of llama2.c models, and the model's own declared\n"
    "BOS and EOS); the file's must be among them. Thresholds default to TOPLOC's:\n"
    "38 exponent mismatches, mantissa error mean 10 and median 8 (of 128 values per chunk), and a\n"
    "sampler margin of 0.001 logits for cross-device rounding.\n"
    "--prompts FILE: the task, the prompts file given to generate/pipeline (one prompt per line or,\n"
    "for *.jsonl, one {\"prompt\": \"...\"} object per line;\n"
    "encoded with --tokenizer, or token ids after BOS without one): a sample with seq i must carry\n"
    "exactly prompt i, else it is rejected (\"prompt does not match the task\"). Without it a\n"
    "changed prompt token can go unseen: TOPLOC commits only the rows that sample tokens.\n"
    "Group verdicts (TOPLOC v2): --sample-fraction F (0 < F <= 1; ceil(F n), at least 1) or --sample N\n"
    "verifies only that many samples of each group (--group-by seed, the default: the samples sharing a\n"
    "sampler seed, one generation batch; file: the whole file) and accepts or rejects the group whole:\n"
    "rejected when any checked sample fails, else its unchecked samples are \"accepted unverified\".\n"
    "The subset is drawn from --sample-seed S (the verifier's secret: keep it from the workers; default:\n"
    "a random one) and a hash of the group's samples. Bound: if k of a group's n samples are bad and m\n"
    "are checked, the group passes with probability C(n-k, m) / C(n, m) <= (1 - k/n)^m; a line per group\n"
    "gives it for k = ceil(P n), --bad-fraction P (default 0.1): \"group 1 (seed 10): accepted: 16 of 128\n"
    "checked; a group with >= 10% bad rollouts passes with probability <= 0.1605\". --jsonl adds\n"
    "\"checked\" to each sample and one {\"group\",...,\"pass_bound\"} object per group.\n"
    CLI_LORA_HELP
    "(every path: GPU, --cpu, --cpu-reference, verifier ranks); the rollouts must name the hash of base and\n"
    "adapter: those of another adapter, another alpha or none are rejected as another model.\n";

typedef struct {
    cli_model_args m;
    const char *rollouts, *prompts;
    bool cpu, jsonl, mpi;
    int batch;
    double timeout_s;
    vks_verify_options vo;
    int32_t trusted_stop[VKS_ROLLOUT_MAX_STOP];
    int n_trusted;
    bool stop_ids_given;
    bool sampled, secret_given;   /* --sample-fraction / --sample; --sample-seed */
    bool fraction_given, group_opts_given; /* --sample-fraction; --bad-fraction or --group-by */
    vks_group_sampling gs;
} verify_args;

/* Without --stop-ids: 1 and 2 (llama2.c's BOS and EOS) and the model's own
 * declared BOS and EOS (a checkpoint's config, a GGUF's metadata). */
static void trust_model_tokens(verify_args *a, const vks_model *m) {
    int32_t ids[2] = {m->bos_id, m->eos_id};
    for (int i = 0; i < 2 && !a->stop_ids_given; i++) {
        bool known = ids[i] < 0;
        for (int j = 0; j < a->n_trusted; j++) known = known || a->trusted_stop[j] == ids[i];
        if (!known && a->n_trusted < VKS_ROLLOUT_MAX_STOP) a->trusted_stop[a->n_trusted++] = ids[i];
    }
}

static void parse_stop_ids(const char *s, verify_args *a) {
    a->n_trusted = 0;
    a->stop_ids_given = true;
    char *copy = strdup(s);
    if (!copy) cli_die(1, "out of host memory");
    for (char *tok = strtok(copy, ","); tok; tok = strtok(NULL, ",")) {
        if (a->n_trusted == VKS_ROLLOUT_MAX_STOP) cli_die(EXIT_BAD_INPUT, "--stop-ids: at most %d ids", VKS_ROLLOUT_MAX_STOP);
        a->trusted_stop[a->n_trusted++] = (int32_t)cli_parse_long("--stop-ids", tok, 0, INT32_MAX);
    }
    free(copy);
    if (a->n_trusted == 0) cli_die(EXIT_BAD_INPUT, "--stop-ids: no ids in '%s'", s);
}

static bool verify_option(verify_args *a, const char *name, const char *val) {
    if (!strcmp(name, "rollouts")) a->rollouts = val;
    else if (!strcmp(name, "prompts")) a->prompts = val;
    else if (!strcmp(name, "cpu")) a->cpu = true;
    else if (!strcmp(name, "mpi")) a->mpi = true;
    else if (!strcmp(name, "threads")) a->vo.cpu_threads = (int)cli_parse_long("--threads", val, 1, 256);
    else if (!strcmp(name, "cpu-reference")) a->cpu = a->vo.cpu_reference = true;
    else if (!strcmp(name, "jsonl")) a->jsonl = true;
    else if (!strcmp(name, "batch")) a->batch = (int)cli_parse_long("--batch", val, 1, 4096);
    else if (!strcmp(name, "timeout-s")) a->timeout_s = cli_parse_double("--timeout-s", val, 0.1, 1e5);
    else if (!strcmp(name, "stop-ids")) parse_stop_ids(val, a);
    else if (!strcmp(name, "max-exp-mismatches"))
        a->vo.toploc.max_exp_mismatches = (int)cli_parse_long("--max-exp-mismatches", val, 0, VKS_TOPLOC_K);
    else if (!strcmp(name, "max-mant-mean")) a->vo.toploc.max_mant_mean = cli_parse_double("--max-mant-mean", val, 0, 128);
    else if (!strcmp(name, "max-mant-median"))
        a->vo.toploc.max_mant_median = cli_parse_double("--max-mant-median", val, 0, 128);
    else if (!strcmp(name, "sample-fraction")) {
        a->gs.fraction = cli_parse_double("--sample-fraction", val, 1e-9, 1);
        a->sampled = a->fraction_given = true;
    } else if (!strcmp(name, "sample")) {
        a->gs.count = (int)cli_parse_long("--sample", val, 1, INT32_MAX);
        a->sampled = true;
    } else if (!strcmp(name, "sample-seed")) {
        a->gs.secret = cli_parse_u64("--sample-seed", val);
        a->secret_given = true;
    } else if (!strcmp(name, "bad-fraction")) {
        a->gs.bad_fraction = cli_parse_double("--bad-fraction", val, 1e-9, 1);
        a->group_opts_given = true;
    } else if (!strcmp(name, "group-by")) {
        a->group_opts_given = true;
        if (strcmp(val, "seed") && strcmp(val, "file")) cli_usage_error("verify", "--group-by: seed or file, not '%s'", val);
        a->gs.whole_file = !strcmp(val, "file");
    } else if (!strcmp(name, "logit-margin")) a->vo.logit_margin = (float)cli_parse_double("--logit-margin", val, 0, 1e6);
    else return false;
    return true;
}

static void parse_verify(int argc, char **argv, verify_args *a) {
    static const struct option opts[] = {
        CLI_MODEL_LONG_OPTIONS, CLI_LORA_LONG_OPTION, {"rollouts", required_argument, 0, 0}, {"prompts", required_argument, 0, 0},
        {"cpu", no_argument, 0, 0}, {"mpi", no_argument, 0, 0}, {"threads", required_argument, 0, 0},
        {"cpu-reference", no_argument, 0, 0},
        {"jsonl", no_argument, 0, 0}, {"batch", required_argument, 0, 0}, {"stop-ids", required_argument, 0, 0},
        {"max-exp-mismatches", required_argument, 0, 0}, {"max-mant-mean", required_argument, 0, 0},
        {"max-mant-median", required_argument, 0, 0}, {"logit-margin", required_argument, 0, 0},
        {"timeout-s", required_argument, 0, 0}, {"sample-fraction", required_argument, 0, 0},
        {"sample", required_argument, 0, 0}, {"sample-seed", required_argument, 0, 0},
        {"bad-fraction", required_argument, 0, 0}, {"group-by", required_argument, 0, 0},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    a->m.device = -1;
    a->batch = 16;
    a->timeout_s = 20;
    vks_verify_options_default(&a->vo);
    vks_group_sampling_default(&a->gs);
    a->trusted_stop[0] = 1;
    a->trusted_stop[1] = 2;
    a->n_trusted = 2;
    int c, idx;
    while ((c = cli_getopt(argc, argv, "h", opts, &idx)) != -1) {
        if (c == 'h') { fputs(verify_usage, stdout); exit(0); }
        const char *name = opts[idx].name;
        if (!cli_model_option(&a->m, name, optarg)) verify_option(a, name, optarg);
    }
    if (optind < argc) cli_usage_error("verify", "unexpected argument '%s'", argv[optind]);
    if (!a->rollouts) cli_usage_error("verify", "--rollouts FILE is required");
    if (a->gs.count > 0 && a->fraction_given) cli_usage_error("verify", "--sample and --sample-fraction: give one");
    if (!a->sampled && (a->secret_given || a->group_opts_given))
        cli_usage_error("verify", "--sample-seed, --bad-fraction and --group-by go with --sample-fraction or --sample");
    if (a->sampled && !a->secret_given && vks_group_secret_random(&a->gs.secret)) cli_die(1, "verify: %s", vks_last_error());
}

/* checked: NULL without group sampling (the output is then as it always was). */
static void print_verdict(const verify_args *a, const vks_rollout_sample *s, const vks_verdict *v, const bool *checked) {
    if (a->jsonl) {
        fputs("{\"id\":", stdout);
        cli_json_string(stdout, s->id, strlen(s->id));
        printf(",\"accepted\":%s,\"reason\":", v->accepted ? "true" : "false");
        cli_json_string(stdout, v->reason, strlen(v->reason));
        if (checked) printf(",\"checked\":%s", *checked ? "true" : "false");
        fputs("}\n", stdout);
    } else { /* ids come from the file and reasons from verifier ranks: no raw tab or newline may forge a line */
        cli_put_escaped(stdout, s->id, strlen(s->id));
        fputs(v->accepted ? (checked && !*checked ? "\taccepted unverified" : "\taccepted") : "\trejected: ", stdout);
        if (!v->accepted) cli_put_escaped(stdout, v->reason, strnlen(v->reason, sizeof v->reason));
        fputc('\n', stdout);
    }
}

/* What verifies a batch here: a GPU engine, or the C reference forward. */
typedef struct {
    const verify_args *a;
    const vks_model *m;
    vks_gpu *g;
    vks_engine *e;
    bool opened;
} verifier;

static void verifier_open(verifier *v, const verify_args *a, const vks_model *m) {
    *v = (verifier){.a = a, .m = m, .opened = true};
    if (a->cpu) return;
    if (a->m.device < 0 && !(v->g = cli_try_open_gpu(&a->m))) { /* no Vulkan device here: verify on the CPU */
        cli_note("verify: no GPU (%s); verifying with the CPU forward (--cpu)", vks_last_error());
        return;
    }
    if (!v->g) v->g = cli_open_gpu(&a->m);
    /* vks_verify_batch sizes the KV cache by each batch's longest sample */
    vks_engine_options eo = a->m.engine;
    eo.f32_math = true, eo.n_slots = a->batch, eo.kv_len = 1, eo.max_rows = 512, eo.max_out_rows = 512;
    v->e = cli_create_engine(v->g, m, &eo);
    cli_engine_lora(&a->m, v->e);
}

static int verifier_close(verifier *v) {
    if (!v->e) return 0;
    if (v->a->m.profile) cli_print_profile(v->g);
    vks_engine_destroy(v->e);
    return cli_finish_gpu(v->g);
}

static int verify_batch(void *ctx, const vks_rollout_sample *s, int n, vks_verdict *out) {
    verifier *v = ctx;
    if (!v->opened) verifier_open(v, v->a, v->m); /* rank 0 verifies only when every verifier rank is lost */
    return v->e ? vks_verify_batch(v->e, &v->a->vo, s, n, out) : vks_verify_batch_cpu(v->m, &v->a->vo, s, n, out);
}

static int verify_all(const verify_args *a, const vks_model *m, const vks_rollout_file *rf, vks_verdict *verdicts) {
    verifier v;
    verifier_open(&v, a, m);
    cli_progress p;
    cli_progress_start(&p, "verify");
    int rc = VKS_OK;
    for (int i0 = 0; i0 < rf->n_samples && rc == VKS_OK; i0 += a->batch) {
        int n = rf->n_samples - i0 < a->batch ? rf->n_samples - i0 : a->batch;
        rc = verify_batch(&v, rf->samples + i0, n, verdicts + i0);
        cli_progress_update(&p, i0 + n, rf->n_samples, "samples");
    }
    if (rc) cli_die(1, "verify: %s", vks_last_error());
    cli_progress_end(&p, rf->n_samples, "samples");
    return verifier_close(&v);
}

/* A verifier rank went silent: say so; the verdicts are still complete. */
static void report_lost(const vks_dispatch_report *r, double timeout_s) {
    if (r->n_lost)
        fprintf(stderr, "vkswarm: verify: verifier rank %d went silent for %.1f s (%d rank%s lost); its batches were "
                "verified by the remaining ranks\n", r->first_lost, timeout_s, r->n_lost, r->n_lost > 1 ? "s" : "");
    else if (!r->all_stopped)
        cli_note("verify: a verifier rank did not answer the final stop within %.1f s", timeout_s);
}

/* --mpi, rank 0: batches go to the verifier ranks (or are verified here when alone or all are lost). */
static int verify_dispatch(const verify_args *a, const vks_model *m, const vks_rollout_file *rf,
                           vks_verdict *verdicts, vks_dispatch_report *report) {
    verifier v = {.a = a, .m = m};
    if (vks_verifier_dispatch(vks_mpi_world(), 1, rf->samples, rf->n_samples, a->batch, a->timeout_s, verify_batch, &v,
                              verdicts, report)) {
        cli_note("verify: %s", vks_last_error());
        cli_mpi_abort(1);
    }
    report_lost(report, a->timeout_s);
    return verifier_close(&v);
}

/* --mpi, ranks 1..N-1: verify what rank 0 sends until it says stop. */
static int serve_verifier(const verify_args *a, const vks_model *m, int rank) {
    verifier v;
    verifier_open(&v, a, m);
    int rc = vks_verifier_serve(vks_mpi_world(), 0, a->batch, a->timeout_s, verify_batch, &v);
    if (rc) {
        cli_note("verifier rank %d: %s", rank, vks_last_error());
        cli_mpi_abort(rc == VKS_ERR_TIMEOUT ? 3 : 2);
    }
    return verifier_close(&v);
}

/* --mpi: the verifier ranks learn the file's stop tokens from rank 0 (bounded by --timeout-s). */
static void share_stop_ids(verify_args *a, int rank) {
    static struct { int32_t ids[VKS_ROLLOUT_MAX_STOP]; int32_t n; } settings; /* outlives the sends */
    if (rank == 0) {
        memcpy(settings.ids, a->vo.stop_ids, sizeof settings.ids);
        settings.n = a->vo.n_stop;
        if (vks_verifier_send_settings(vks_mpi_world(), 1, &settings, sizeof settings)) cli_die(1, "%s", vks_last_error());
        return;
    }
    if (vks_verifier_recv_settings(vks_mpi_world(), 0, &settings, sizeof settings, a->timeout_s)) {
        cli_note("verifier rank %d: %s", rank, vks_last_error());
        cli_mpi_abort(3);
    }
    if (settings.n < 0 || settings.n > VKS_ROLLOUT_MAX_STOP) cli_die(EXIT_BAD_INPUT, "bad stop ids from rank 0");
    memcpy(a->vo.stop_ids, settings.ids, sizeof settings.ids);
    a->vo.n_stop = settings.n;
}

/* Group sampling: the library hands over the samples it chose to check. */
typedef struct {
    const verify_args *a;
    const vks_model *m;
    const vks_rollout_header *header;
    vks_dispatch_report *report;
    int rc;
} subset_job;

static int verify_subset(void *ctx, const vks_rollout_sample *samples, int n, vks_verdict *out) {
    subset_job *j = ctx;
    vks_rollout_file sub = {.header = *j->header, .samples = (vks_rollout_sample *)samples, .n_samples = n};
    j->rc = j->a->mpi ? verify_dispatch(j->a, j->m, &sub, out, j->report) : verify_all(j->a, j->m, &sub, out);
    return VKS_OK;
}

static void print_group(const verify_args *a, int g, const vks_group_verdict *v, const vks_rollout_sample *samples) {
    if (a->jsonl) {
        printf("{\"group\":%d,\"seed\":", g + 1);
        if (a->gs.whole_file) fputs("null", stdout);
        else printf("%llu", (unsigned long long)v->seed);
        printf(",\"samples\":%d,\"checked\":%d,\"failed\":%d,\"accepted\":%s,\"bad_fraction\":%.17g,"
               "\"pass_bound\":%.17g}\n", v->n, v->n_checked, v->n_failed, v->accepted ? "true" : "false",
               a->gs.bad_fraction, v->pass_bound);
        return;
    }
    if (a->gs.whole_file) printf("group %d (file): ", g + 1);
    else printf("group %d (seed %llu): ", g + 1, (unsigned long long)v->seed);
    if (v->accepted) {
        printf("accepted: %d of %d checked; a group with >= %g%% bad rollouts passes with probability <= %.4g\n",
               v->n_checked, v->n, 100 * a->gs.bad_fraction, v->pass_bound);
        return;
    }
    printf("rejected: %d of %d checked failed, the first ", v->n_failed, v->n_checked);
    const char *id = samples[v->first_failed].id;
    cli_put_escaped(stdout, id, strlen(id));
    printf("; its %d samples rejected\n", v->n);
}

/* --sample-fraction / --sample: verdicts for groups from a checked subset of each. */
static int verify_sampled(const verify_args *a, const vks_model *m, const vks_rollout_file *rf, vks_verdict *verdicts,
                          vks_dispatch_report *report, vks_group_plan *plan) {
    if (!a->secret_given) cli_note("verify: sampling with a random secret (--sample-seed S repeats a draw)");
    subset_job j = {.a = a, .m = m, .header = &rf->header, .report = report};
    if (vks_verify_groups(rf->samples, rf->n_samples, &a->gs, verify_subset, &j, verdicts, plan)) {
        cli_note("verify: %s", vks_last_error());
        if (a->mpi) cli_mpi_abort(1);
        exit(1);
    }
    return j.rc;
}

/* The task: every prompt of the prompts file, encoded as generate does. */
typedef struct {
    vks_sequence *seqs;
    int32_t **ids;
    int *lens;
    int n;
} task_prompts;

static void load_task(const verify_args *a, const vks_model *m, task_prompts *tp) {
    vks_tokenizer *t = cli_load_tokenizer(&a->m, m);
    char **lines = cli_read_prompts(a->prompts, &tp->n);
    tp->seqs = calloc((size_t)tp->n, sizeof *tp->seqs);
    tp->ids = calloc((size_t)tp->n, sizeof *tp->ids);
    tp->lens = calloc((size_t)tp->n, sizeof *tp->lens);
    if (!tp->seqs || !tp->ids || !tp->lens) cli_die(1, "out of host memory");
    for (int i = 0; i < tp->n; i++) {
        cli_encode_prompt(t, m->cfg.vocab_size, lines[i], &tp->seqs[i], 1);
        tp->ids[i] = tp->seqs[i].ids;
        tp->lens[i] = tp->seqs[i].n_prompt;
        free(lines[i]);
    }
    free(lines);
    vks_tokenizer_free(t);
}

static void free_task(task_prompts *tp) {
    for (int i = 0; i < tp->n; i++) vks_sequence_free(&tp->seqs[i]);
    free(tp->seqs);
    free(tp->ids);
    free(tp->lens);
}

/* The verifier's KV cache is the generator's (the header's kv_type): an f16
 * cache is replayed with the same rounding (kv_store_f16 = vks_f32_to_f16) by
 * the GPU engine or the CPU forwards; not with --mpi (its verifier ranks do
 * not read the header). */
static void check_kv_type(verify_args *a, const vks_rollout_header *h) {
    const char *file = h->kv_f16 ? "f16" : "f32";
    if (a->m.kv_type_given && a->m.engine.kv_f16 != h->kv_f16)
        cli_usage_error("verify", "--kv-type %s, but %s was made with an %s KV cache", a->m.engine.kv_f16 ? "f16" : "f32",
                        a->rollouts, file);
    if (h->kv_f16 && a->mpi)
        cli_usage_error("verify", "%s was made with an f16 KV cache: --mpi verifies f32-cache rollouts only",
                        a->rollouts);
    a->m.engine.kv_f16 = a->vo.kv_f16 = h->kv_f16;
}

/* The rollouts name another model than --model: both hashes, and the policy
 * step whose weights they need and where those are (rollout files of
 * `vkswarm rl`; older ones and generate's do not say). */
static void say_wrong_weights(const verify_args *a, const vks_rollout_header *h) {
    char want[65], have[65];
    vks_hash_hex(h->model_hash, want);
    vks_hash_hex(a->vo.model_hash, have);
    fputs("vkswarm: verify: wrong weights: ", stderr);
    cli_put_escaped(stderr, a->rollouts, strlen(a->rollouts));
    fprintf(stderr, " was made by model_hash %s, --model has model_hash %s; ", want, have);
    if (!h->has_policy) {
        fputs("the file does not say which policy step made it (written by generate or pipeline, or by an older vkswarm rl)\n", stderr);
        return;
    }
    fprintf(stderr, "it needs the weights of policy step %lld", (long long)h->policy_step);
    if (h->policy_weights[0]) {
        fputs(": ", stderr);
        cli_put_escaped(stderr, h->policy_weights, strlen(h->policy_weights));
    }
    fputc('\n', stderr);
}

int cmd_verify(int argc, char **argv) {
    verify_args a = {0};
    parse_verify(argc, argv, &a);
    int rank = 0, size = 1;
    if (a.mpi) vks_mpi_start_within(VKS_MPI_THREADS_FUNNELED, a.timeout_s, cli_mpi_stuck, &rank, &size); /* verify threads beside MPI */
    vks_model *m = cli_load_model(&a.m);
    trust_model_tokens(&a, m);
    vks_rollout_file rf = {0};
    if (rank == 0 && vks_rollout_read(a.rollouts, &rf)) cli_die(EXIT_BAD_INPUT, "%s", vks_last_error());
    cli_model_hash(&a.m, m, a.vo.model_hash);
    a.vo.lora = a.m.lora;
    check_kv_type(&a, &rf.header);
    memcpy(a.vo.stop_ids, rf.header.stop_ids, sizeof a.vo.stop_ids);
    a.vo.n_stop = rf.header.n_stop;
    if (a.mpi) share_stop_ids(&a, rank);
    task_prompts task = {0};
    if (a.prompts) {
        load_task(&a, m, &task);
        a.vo.task_prompts = (const int32_t *const *)task.ids;
        a.vo.task_prompt_lens = task.lens;
        a.vo.n_task_prompts = task.n;
    }
    if (rank > 0) {
        int rc = serve_verifier(&a, m, rank);
        free_task(&task);
        cli_free_model(&a.m, m);
        vks_mpi_stop_within(a.timeout_s, cli_mpi_stuck);
        return rc;
    }
    vks_verdict *verdicts = calloc((size_t)rf.n_samples + 1, sizeof *verdicts);
    if (!verdicts) cli_die(1, "out of host memory");
    const char *problem = vks_verify_header_problem(&rf.header, a.vo.model_hash, a.trusted_stop, a.n_trusted);
    bool wrong_weights = memcmp(rf.header.model_hash, a.vo.model_hash, 32) != 0;
    if (wrong_weights) say_wrong_weights(&a, &rf.header);
    int rc = 0;
    vks_dispatch_report report = {.first_lost = -1, .all_stopped = true};
    vks_group_plan plan = {0};
    if (problem) {
        for (int i = 0; i < rf.n_samples; i++) snprintf(verdicts[i].reason, sizeof verdicts[i].reason, "%s", problem);
        verifier idle = {.a = &a, .m = m, .opened = true}; /* verifies nothing */
        if (a.mpi && size > 1 && vks_verifier_dispatch(vks_mpi_world(), 1, rf.samples, 0, a.batch, a.timeout_s,
                                                       verify_batch, &idle, verdicts, &report) == VKS_OK)
            report_lost(&report, a.timeout_s);
    } else if (a.sampled) {
        rc = verify_sampled(&a, m, &rf, verdicts, &report, &plan);
    } else {
        rc = a.mpi ? verify_dispatch(&a, m, &rf, verdicts, &report) : verify_all(&a, m, &rf, verdicts);
    }
    int accepted = 0, total = rf.n_samples, checked = 0, unverified = 0;
    for (int i = 0; i < total; i++) {
        print_verdict(&a, &rf.samples[i], &verdicts[i], plan.checked ? &plan.checked[i] : NULL);
        accepted += verdicts[i].accepted;
        checked += plan.checked && plan.checked[i];
        unverified += plan.checked && !plan.checked[i] && verdicts[i].accepted;
    }
    for (int g = 0; g < plan.n_groups; g++) print_group(&a, g, &plan.groups[g], rf.samples);
    FILE *summary = a.jsonl ? stderr : stdout;
    fprintf(summary, "verified %d samples: %d accepted, %d rejected", total, accepted, total - accepted);
    if (plan.checked)
        fprintf(summary, " (%d group%s; %d samples checked, %d accepted unverified)", plan.n_groups,
                plan.n_groups == 1 ? "" : "s", checked, unverified);
    fputc('\n', summary);
    if (a.mpi && !report.all_stopped) { /* MPI_Finalize would wait for the silent rank */
        cli_stdout_ok(); /* says so when the verdicts did not reach stdout */
        cli_mpi_abort(3);
    }
    fflush(stdout);
    free(verdicts);
    vks_group_plan_free(&plan);
    free_task(&task);
    vks_rollout_file_free(&rf);
    cli_free_model(&a.m, m);
    if (a.mpi) vks_mpi_stop_within(a.timeout_s, cli_mpi_stuck);
    if (rc) return rc;
    if (wrong_weights) return EXIT_BAD_INPUT; /* every sample rejected for it, said above */
    return accepted == total ? 0 : 1;
}
