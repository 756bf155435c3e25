/* `vkswarm bench`: prefill and decode tokens/s, with the device's copy
 * bandwidth and large-matmul rate measured in the same run. */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli_model.h"
#include "cli_util.h"
#include "vkswarm/vks_ops.h"
#include "vkswarm/vks_quant.h"
#include "vkswarm/vks_ref.h"
#include "vkswarm/vks_cpu.h"

static const char bench_usage[] =
    "usage: vkswarm bench (--model M |\n"
    "                      --random-model dim,hidden,layers,heads,kv_heads,vocab[,seq[,head_dim]]\n"
    "                      [--arch llama|llama3|qwen2|qwen3])\n"
    "                     [--batch B] [--prompt-len P] [--gen N] [--dtype T] [--kv-type f32|f16] [--device N] [--profile]\n"
    "                     [--lora PATH | --lora-rank R]\n"
    "Prints prefill and decode tokens/s and, measured in the same run, the device's copy bandwidth and\n"
    "large-matmul FLOP/s, with the fraction of each that prefill and decode reach.\n"
    "--dtype: f32, f16, bf16, q8_0, q4_0, q4_k (quantized on upload) or file (the file's types).\n"
    "Defaults: --batch 1 --prompt-len 128 --gen 32 --dtype f32.\n"
    "--lora PATH runs with that adapter, unmerged; --lora-rank R with a random one of rank R on every\n"
    "target (alpha 32; the merged model runs as fast as the base of the merged type).\n"
    "       vkswarm bench --sgemm M,N,K [--threads N]\n"
    "prints OpenBLAS cblas_sgemm's GFLOP/s on y[M,N] = x[M,K] W[N,K]^T as the CPU forward calls it\n"
    "(--threads: default every core), the ceiling for `verify --cpu`, and the BLAS kernels in use.\n";

/* --sgemm M,N,K: the CPU forward's matrix-product rate (no model, no GPU). */
static int bench_sgemm(const char *spec, int threads) {
    long v[3];
    char extra;
    if (sscanf(spec, "%ld,%ld,%ld%c", &v[0], &v[1], &v[2], &extra) != 3)
        cli_die(EXIT_BAD_INPUT, "--sgemm: '%s' is not M,N,K", spec);
    for (int i = 0; i < 3; i++)
        if (v[i] < 1 || v[i] > 65536) cli_die(EXIT_BAD_INPUT, "--sgemm: %ld outside 1..65536", v[i]);
    double gflops;
    if (vks_cpu_sgemm_rate((int)v[0], (int)v[1], (int)v[2], threads, 2.0, &gflops)) cli_die(1, "bench: %s", vks_last_error());
    char blas[256];
    vks_cpu_blas_info(blas, sizeof blas);
    printf("sgemm %ldx%ldx%ld, %d threads: %.1f GFLOP/s\nBLAS: %s\n", v[0], v[1], v[2], vks_cpu_thread_count(threads),
           gflops, blas);
    return 0;
}

/* Bytes/s of a device-local buffer-to-buffer copy, counting read + write. */
static double measure_copy_bandwidth(vks_gpu *g) {
    size_t bytes = 64u << 20;
    if (bytes > vks_gpu_info(g)->max_storage_range) bytes = (size_t)vks_gpu_info(g)->max_storage_range;
    vks_buffer *a, *b;
    if (vks_buffer_create(g, bytes, &a) || vks_buffer_create(g, bytes, &b)) cli_die(1, "bench: %s", vks_last_error());
    vks_buffer_fill(a, 0x3f800000u);
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        vks_cmd *c;
        if (vks_cmd_begin(g, &c)) cli_die(1, "bench: %s", vks_last_error());
        for (int i = 0; i < 4; i++) vks_cmd_copy(c, i % 2 ? b : a, 0, i % 2 ? a : b, 0, bytes);
        double t0 = cli_now();
        if (vks_cmd_submit(c)) cli_die(1, "bench: %s", vks_last_error());
        double bw = 4.0 * 2.0 * (double)bytes / (cli_now() - t0);
        if (bw > best) best = bw;
    }
    vks_buffer_destroy(a);
    vks_buffer_destroy(b);
    return best;
}

/* Uploads random x [M, K] and W [N, K] (W in dtype dt, packed for the
 * kernel) and returns W as the kernel sees it (dequantized), for the check. */
static float *upload_random_operands(vks_buffer *x, vks_buffer *w, vks_dtype dt, uint32_t M, uint32_t N, uint32_t K,
                                     float **x_host) {
    size_t nx = (size_t)M * K, nw = (size_t)N * K;
    float *xs = malloc(nx * 4), *ws = malloc(nw * 4);
    uint64_t row_bytes = 0;
    if (!xs || !ws || !vks_dtype_row_bytes(dt, K, &row_bytes)) cli_die(1, "bench: out of host memory");
    uint32_t state = 12345u;
    for (size_t i = 0; i < nx + nw; i++) {
        state = state * 1664525u + 1013904223u;
        float v = (float)(state >> 8) / 16777216.0f * 2.0f - 1.0f;
        if (i < nx) xs[i] = v;
        else ws[i - nx] = v;
    }
    void *blocks = malloc(row_bytes * N), *packed = malloc(vks_op_weight_bytes(dt, N, K));
    if (!blocks || !packed) cli_die(1, "bench: out of host memory");
    if (vks_quantize(dt, ws, blocks, nw) || vks_op_pack_weights(dt, blocks, N, K, packed) ||
        vks_buffer_upload(x, 0, xs, nx * 4) || vks_buffer_upload(w, 0, packed, vks_op_weight_bytes(dt, N, K)))
        cli_die(1, "bench: %s", vks_last_error());
    vks_dequantize(dt, blocks, ws, nw);
    free(blocks);
    free(packed);
    *x_host = xs;
    return ws;
}

/* Checks the first rows of y against the float64 reference: a broken kernel
 * must not report a rate. Bound: the normalized squared error of half
 * rounding ((3 * 2^-11)^2) or of f32 sums, as in test_ops. */
static void check_matmul_result(vks_buffer *y, const float *xs, const float *ws, uint32_t N, uint32_t K, bool half) {
    enum { ROWS = 4 };
    float *got = malloc((size_t)ROWS * N * 4), *want = malloc((size_t)ROWS * N * 4);
    if (!got || !want) cli_die(1, "bench: out of host memory");
    if (vks_buffer_download(y, 0, got, (size_t)ROWS * N * 4)) cli_die(1, "bench: %s", vks_last_error());
    vks_ref_matmul(xs, ws, ROWS, (int)N, (int)K, want);
    double err = 0, ref = 0;
    for (size_t i = 0; i < (size_t)ROWS * N; i++) {
        double d = (double)got[i] - want[i];
        err += d * d;
        ref += (double)want[i] * want[i];
    }
    double nmse = ref > 0 ? err / ref : err, bound = half ? 9.0 / (1 << 22) : 1e-10;
    if (!(nmse <= bound)) cli_die(1, "bench: the matmul kernel's result is wrong (nmse %.3g > %.3g): no rate", nmse, bound);
    free(got);
    free(want);
}

/* FLOP/s of the tiled matmul kernel on an M x K x N problem with dtype weights,
 * after checking its result; *half: whether it ran the half-arithmetic variant. */
static double measure_matmul_rate(vks_gpu *g, vks_dtype dt, uint32_t M, uint32_t N, uint32_t K, bool *half) {
    vks_ops *ops;
    vks_buffer *x, *w, *y;
    if (vks_ops_create(g, &ops) || vks_buffer_create(g, (size_t)M * K * 4, &x) ||
        vks_buffer_create(g, vks_op_weight_bytes(dt, N, K), &w) || vks_buffer_create(g, (size_t)M * N * 4, &y))
        cli_die(1, "bench: %s", vks_last_error());
    *half = vks_ops_f16_math(ops);
    float *xs, *ws = upload_random_operands(x, w, dt, M, N, K, &xs);
    vks_buffer_fill(y, 0x7fc00000u); /* NaN: rows the kernel does not write fail the check */
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        vks_cmd *c;
        if (vks_cmd_begin(g, &c)) cli_die(1, "bench: %s", vks_last_error());
        for (int i = 0; i < 2; i++)
            if (vks_op_matmul(ops, c, (vks_binding){x, 0, 0}, (vks_binding){w, 0, 0}, dt, (vks_binding){y, 0, 0}, M, N, K,
                              N, 0, false))
                cli_die(1, "bench: %s", vks_last_error());
        double t0 = cli_now();
        if (vks_cmd_submit(c)) cli_die(1, "bench: %s", vks_last_error());
        double rate = 2.0 * 2.0 * M * (double)N * K / (cli_now() - t0);
        if (rep == 0) check_matmul_result(y, xs, ws, N, K, *half); /* the timed runs are the checked kernel */
        else if (rate > best) best = rate;
    }
    free(xs);
    free(ws);
    vks_buffer_destroy(x);
    vks_buffer_destroy(w);
    vks_buffer_destroy(y);
    vks_ops_destroy(ops);
    return best;
}

/* The host CPU's model name (lavapipe's figures depend on it), or "unknown". */
static void host_cpu_model(char *out, size_t cap) {
    snprintf(out, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        const char *v = strchr(line, ':');
        if (!v) break;
        v++;
        while (*v == ' ' || *v == '\t') v++;
        size_t n = strcspn(v, "\n");
        vks_escape(v, n, out, cap);
        break;
    }
    fclose(f);
}

typedef struct { int batch, prompt_len, gen; } bench_shape;

static void forward_rows(vks_engine *e, int32_t *tok, uint32_t *slot, uint32_t *pos, int R, int with_head) {
    uint32_t *rows = malloc(4 * (size_t)R);
    for (int i = 0; i < R; i++) rows[i] = (uint32_t)i;
    vks_forward_batch b = {.n_rows = R, .tokens = tok, .slot = slot, .pos = pos, .n_out = with_head ? R : 0,
                           .out_rows = rows};
    if (vks_engine_forward(e, &b)) cli_die(1, "bench: %s", vks_last_error());
    free(rows);
}

/* Returns prefill seconds; every sequence gets prompt_len random tokens. */
static double run_prefill(vks_engine *e, const bench_shape *s, int vocab, int chunk) {
    int total = s->batch * s->prompt_len;
    int32_t *tok = malloc(4 * (size_t)chunk);
    uint32_t *slot = malloc(4 * (size_t)chunk), *pos = malloc(4 * (size_t)chunk);
    double t0 = cli_now();
    for (int r0 = 0; r0 < total; r0 += chunk) {
        int R = total - r0 < chunk ? total - r0 : chunk;
        for (int i = 0; i < R; i++) {
            int r = r0 + i;
            tok[i] = (int32_t)((r * 7919u) % (unsigned)vocab);
            slot[i] = (uint32_t)(r / s->prompt_len);
            pos[i] = (uint32_t)(r % s->prompt_len);
        }
        /* logits only for each sequence's last row would be usual; all rows is the upper bound: use none */
        forward_rows(e, tok, slot, pos, R, 0);
    }
    double dt = cli_now() - t0;
    free(tok); free(slot); free(pos);
    return dt;
}

static double run_decode(vks_engine *e, const bench_shape *s, int vocab) {
    int B = s->batch;
    int32_t *tok = malloc(4 * (size_t)B);
    uint32_t *slot = malloc(4 * (size_t)B), *pos = malloc(4 * (size_t)B);
    double t0 = cli_now();
    for (int step = 0; step < s->gen; step++) {
        for (int i = 0; i < B; i++) {
            tok[i] = (int32_t)((step * 31 + i) % vocab);
            slot[i] = (uint32_t)i;
            pos[i] = (uint32_t)(s->prompt_len + step);
        }
        forward_rows(e, tok, slot, pos, B, 1);
    }
    double dt = cli_now() - t0;
    free(tok); free(slot); free(pos);
    return dt;
}

/* --profile: the decode steps' host time, GPU busy fraction (timestamped
 * kernel time over wall time) and the counts per step and per layer, from
 * the engine's and the device's counters taken around the decode loop. */
static void print_decode_steps(const vks_engine_stats *a, const vks_engine_stats *b, const vks_gpu_counters *ga,
                               const vks_gpu_counters *gb) {
    double n = (double)(b->forwards - a->forwards), layers = (double)(b->layers - a->layers);
    if (n <= 0) return;
    double wall = (b->wall_s - a->wall_s) / n * 1e3, wait = (b->wait_s - a->wait_s) / n * 1e3;
    double kernels = (gb->kernel_ms - ga->kernel_ms) / n;
    printf("decode step:       %10.3f ms wall, %.3f ms host (not waiting), %.3f ms waiting, %.3f ms in kernels\n",
           wall, wall - wait, wait, kernels);
    printf("gpu busy: %.0f%%\n", wall > 0 ? 100.0 * kernels / wall : 0.0);
    printf("decode step:       %10.1f dispatches, %.1f barriers, %.1f descriptor writes, %.1f submits, %.0f%% recorded, "
           "%.0f bytes to the host\n",
           (double)(b->dispatches - a->dispatches) / n, (double)(b->barriers - a->barriers) / n,
           (double)(b->descriptor_writes - a->descriptor_writes) / n, (double)(b->submits - a->submits) / n,
           100.0 * (double)(b->recorded - a->recorded) / n, (double)(b->download_bytes - a->download_bytes) / n);
    if (layers > 0)
        printf("decode layer:      %10.1f dispatches, %.1f barriers, %.1f descriptor writes\n",
               (double)(b->layer_dispatches - a->layer_dispatches) / layers,
               (double)(b->layer_barriers - a->layer_barriers) / layers,
               (double)(b->layer_descriptor_writes - a->layer_descriptor_writes) / layers);
}

/* A random adapter of rank r on every target (PEFT's A, B drawn small and nonzero). */
static vks_lora_adapter *random_adapter(const vks_model *m, int r) {
    vks_lora_config lc = {.rank = r, .alpha = VKS_LORA_DEFAULT_ALPHA, .targets = VKS_LORA_ALL_TARGETS};
    vks_lora_adapter *a = NULL;
    if (vks_lora_adapter_create(&m->cfg, &lc, &a) || vks_lora_adapter_init(a, 1))
        cli_die(EXIT_BAD_INPUT, "--lora-rank: %s", vks_last_error());
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int t = 0; t < VKS_LORA_TARGET_COUNT; t++) {
            int64_t out, in;
            vks_lora_target_shape(&m->cfg, (vks_lora_target)t, &out, &in);
            float *B = vks_lora_adapter_B(a, l, (vks_lora_target)t);
            for (int64_t i = 0; i < out * r; i++) B[i] = 1e-3f * (float)((i * 7919) % 201 - 100) / 100.0f;
        }
    return a;
}

int cmd_bench(int argc, char **argv) {
    static const struct option opts[] = {CLI_MODEL_LONG_OPTIONS, CLI_LORA_LONG_OPTION, {"lora-rank", required_argument, 0, 0},
                                         {"batch", required_argument, 0, 0},
                                         {"prompt-len", required_argument, 0, 0}, {"gen", required_argument, 0, 0},
                                         {"sgemm", required_argument, 0, 0}, {"threads", required_argument, 0, 0},
                                         {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    cli_model_args ma = {.device = -1};
    bench_shape s = {1, 128, 32};
    const char *sgemm = NULL;
    int threads = 0, lora_rank = 0;
    int c, idx;
    while ((c = cli_getopt(argc, argv, "h", opts, &idx)) != -1) {
        if (c == 'h') { fputs(bench_usage, stdout); return 0; }
        const char *name = opts[idx].name;
        if (cli_model_option(&ma, name, optarg)) continue;
        if (!strcmp(name, "batch")) s.batch = (int)cli_parse_long("--batch", optarg, 1, 4096);
        else if (!strcmp(name, "prompt-len")) s.prompt_len = (int)cli_parse_long("--prompt-len", optarg, 1, 1 << 20);
        else if (!strcmp(name, "gen")) s.gen = (int)cli_parse_long("--gen", optarg, 1, 1 << 20);
        else if (!strcmp(name, "sgemm")) sgemm = optarg;
        else if (!strcmp(name, "threads")) threads = (int)cli_parse_long("--threads", optarg, 1, 256);
        else if (!strcmp(name, "lora-rank")) lora_rank = (int)cli_parse_long("--lora-rank", optarg, 1, 65536);
    }
    if (optind < argc) cli_usage_error("bench", "unexpected argument '%s'", argv[optind]);
    if (lora_rank && ma.lora_path) cli_usage_error("bench", "give --lora or --lora-rank, not both");
    if (sgemm) return bench_sgemm(sgemm, threads);
    vks_model *m = cli_load_model(&ma);
    if (s.prompt_len + s.gen > m->cfg.seq_len)
        cli_die(EXIT_BAD_INPUT, "bench: prompt-len + gen = %d exceeds the model's context %d", s.prompt_len + s.gen,
                m->cfg.seq_len);
    vks_gpu *g = cli_open_gpu(&ma);
    int chunk = s.batch * s.prompt_len < 512 ? s.batch * s.prompt_len : 512;
    if (chunk < s.batch) chunk = s.batch;
    vks_engine_options eo = ma.engine;
    eo.n_slots = s.batch, eo.kv_len = s.prompt_len + s.gen, eo.max_rows = chunk, eo.max_out_rows = s.batch;
    vks_engine *e = cli_create_engine(g, m, &eo);
    if (lora_rank) ma.lora = random_adapter(m, lora_rank);
    cli_engine_lora(&ma, e);
    if (ma.lora)
        fprintf(stderr, "vkswarm: bench: LoRA adapter of rank %d on every target, unmerged\n",
                vks_lora_adapter_config(ma.lora)->rank);
    int64_t params = vks_model_param_count(m);
    fprintf(stderr, "vkswarm: bench: %lld parameters, %s weights, %.1f MiB on the device\n", (long long)params,
            ma.engine.keep_file_dtype ? "file-typed" : vks_dtype_name(ma.engine.dtype), vks_engine_weight_bytes(e) / 1048576.0);
    double copy_bw = measure_copy_bandwidth(g);
    bool half = false;
    double mm_rate = measure_matmul_rate(g, ma.engine.dtype, 512, 1024, 1024, &half);
    run_decode(e, &(bench_shape){s.batch, 0, 1}, m->cfg.vocab_size); /* warm-up: pipelines, caches */
    /* and the prefill's pipelines (their first use compiles them: lavapipe, ~0.1-0.5 s each), one chunk */
    run_prefill(e, &(bench_shape){1, s.prompt_len < chunk ? s.prompt_len : chunk, 0}, m->cfg.vocab_size, chunk);
    vks_gpu_profile_reset(g);
    double t_pre = run_prefill(e, &s, m->cfg.vocab_size, chunk);
    vks_engine_stats dec0, dec1;
    vks_gpu_counters gpu0, gpu1;
    vks_engine_stats_get(e, &dec0);
    vks_gpu_counters_get(g, &gpu0);
    double t_dec = run_decode(e, &s, m->cfg.vocab_size);
    vks_engine_stats_get(e, &dec1);
    vks_gpu_counters_get(g, &gpu1);
    const vks_model_config *cf = &m->cfg;
    /* per token: every matrix except the embedding lookup is read (decode) / multiplied (prefill) */
    double matrix_params = (double)params - (cf->shared_classifier ? 0 : (double)cf->vocab_size * cf->dim);
    double pre_tps = s.batch * s.prompt_len / t_pre, dec_tps = s.batch * s.gen / t_dec;
    double dec_bytes = (double)vks_engine_decode_weight_bytes(e); /* device bytes: quantized as stored */
    double dec_bw = dec_bytes * s.gen / t_dec, pre_flops = 2.0 * matrix_params * pre_tps;
    char cpu[256];
    host_cpu_model(cpu, sizeof cpu);
    const char *lp_threads = getenv("LP_NUM_THREADS");
    printf("device: %s\n", vks_gpu_info(g)->name);
    printf("host: %s, %ld cores online%s%s\n", cpu, sysconf(_SC_NPROCESSORS_ONLN),
           lp_threads ? ", LP_NUM_THREADS=" : "", lp_threads ? lp_threads : "");
    printf("model: %lld params, %s, batch %d, prompt %d, gen %d\n", (long long)params,
           ma.engine.keep_file_dtype ? "file types" : vks_dtype_name(ma.engine.dtype),
           s.batch, s.prompt_len, s.gen);
    printf("copy bandwidth:    %10.2f GB/s\n", copy_bw / 1e9);
    printf("matmul rate:       %10.2f GFLOP/s (512x1024x1024, %s weights, %s arithmetic)\n", mm_rate / 1e9,
           vks_dtype_name(ma.engine.dtype), half ? "half-storage" : "f32");
    printf("prefill:           %10.1f tokens/s  %8.2f GFLOP/s  %5.1f%% of matmul rate\n", pre_tps, pre_flops / 1e9,
           100.0 * pre_flops / mm_rate);
    printf("decode:            %10.1f tokens/s  %8.2f GB/s     %5.1f%% of copy bandwidth\n", dec_tps, dec_bw / 1e9,
           100.0 * dec_bw / copy_bw);
    if (ma.profile) {
        print_decode_steps(&dec0, &dec1, &gpu0, &gpu1);
        cli_print_profile(g);
    }
    vks_engine_destroy(e);
    int rc = cli_finish_gpu(g);
    cli_free_model(&ma, m);
    return rc;
}
