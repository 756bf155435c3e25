/* bench_attention: attention over the KV cache on the default device; not
 * a test (numbers depend on the machine).
 * Decode (default): time per token, f32 cache (attention) vs f16 cache
 * (attention_split_f16 + reduce). One decoding row per sequence at
 * position P - 1 of a cache of P positions, the two kernels alternated, REPS
 * dispatches per submit, the median of ROUNDS submits each.
 * Prefill (`prefill` first): one sequence's P rows at positions 0..P-1 over
 * its cache, one row per subgroup (kind DECODE: the kernels before rows were
 * grouped) vs grouped rows (kind PREFILL), both caches, all alternated, one
 * dispatch per submit, the median of ROUNDS; the process's CPU time (the
 * CPU driver's threads) per prefill token.
 * Usage: bench_attention [prefill] [heads kv_heads head_dim seqs] (default 32 8 128 1) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "vkswarm/vks_gpu.h"
#include "vkswarm/vks_ops.h"

enum { REPS = 8, ROUNDS = 7 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* The process's CPU time (every thread's, the CPU driver's included): on a
 * machine shared with other work, steadier than the wall clock. */
static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static vks_binding bind(vks_buffer *b) { return (vks_binding){.buf = b}; }

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static vks_buffer *buffer(vks_gpu *g, size_t bytes, unsigned seed) {
    vks_buffer *b;
    if (vks_buffer_create(g, bytes, &b)) { fprintf(stderr, "bench_attention: %s\n", vks_last_error()); exit(1); }
    uint16_t *h = malloc(bytes);
    for (size_t i = 0; i < bytes / 2; i++) h[i] = (uint16_t)(0x3000u + ((i * 2654435761u + seed) >> 20) % 0x800u);
    vks_buffer_upload(b, 0, h, bytes); /* halves in [2^-3, 2^-2), or as floats: small normal values */
    free(h);
    return b;
}

static int prefill(vks_gpu *g, vks_ops *o, uint32_t H, uint32_t KH, uint32_t hd) {
    printf("prefill, one sequence; CPU us (process time) per prompt token (one row per subgroup -> grouped rows)\n");
    printf("| positions | f32 1 row | f32 grouped | ratio | f16 1 row | f16 grouped | ratio |\n"
           "|---|---|---|---|---|---|---|\n");
    uint32_t lens[] = {128, 512}, n_lens = 2;
    if (getenv("BENCH_ATTN_P")) lens[0] = (uint32_t)atoi(getenv("BENCH_ATTN_P")), n_lens = 1; /* one length only */
    for (uint32_t li = 0; li < n_lens; li++) {
        uint32_t P = lens[li], kvd = KH * hd;
        size_t cache = (size_t)P * kvd;
        vks_buffer *q = buffer(g, (size_t)P * H * hd * 4, 1), *out = buffer(g, (size_t)P * H * hd * 4, 2);
        vks_buffer *k32 = buffer(g, cache * 4, 3), *v32 = buffer(g, cache * 4, 4);
        vks_buffer *k16 = buffer(g, cache * 2, 5), *v16 = buffer(g, cache * 2, 6);
        vks_buffer *part = buffer(g, vks_op_attention_f16_scratch_bytes(P, H, hd, P), 7);
        uint32_t *sp = malloc(8 * P);
        for (uint32_t r = 0; r < P; r++) sp[r] = 0, sp[P + r] = r;
        vks_buffer *slot, *pos;
        vks_buffer_create(g, 4 * P, &slot), vks_buffer_create(g, 4 * P, &pos);
        vks_buffer_upload(slot, 0, sp, 4 * P), vks_buffer_upload(pos, 0, sp + P, 4 * P);
        free(sp);
        double t[4][ROUNDS];
        for (int r = -1; r < ROUNDS; r++) /* round -1: compiles the pipelines */
            for (int v = 0; v < 4; v++) {
                vks_matmul_kind kind = v % 2 ? VKS_MATMUL_PREFILL : VKS_MATMUL_DECODE;
                vks_cmd *c;
                vks_cmd_begin(g, &c);
                double t0 = cpu_now();
                int rc = v >= 2 ? vks_op_attention_f16_kind(o, c, bind(q), bind(k16), bind(v16), bind(slot), bind(pos),
                                                            bind(part), bind(out), P, H, KH, hd, P, kind)
                                : vks_op_attention_kind(o, c, bind(q), bind(k32), bind(v32), bind(slot), bind(pos),
                                                        bind(out), P, H, KH, hd, P, kind);
                if (rc || vks_cmd_submit(c)) { fprintf(stderr, "bench_attention: %s\n", vks_last_error()); return 1; }
                if (r >= 0) t[v][r] = cpu_now() - t0;
            }
        double m[4];
        for (int v = 0; v < 4; v++) qsort(t[v], ROUNDS, sizeof(double), cmp_double), m[v] = t[v][ROUNDS / 2] * 1e6 / P;
        printf("| %u | %.0f | %.0f | %.2f | %.0f | %.0f | %.2f |\n", P, m[0], m[1], m[1] / m[0], m[2], m[3], m[3] / m[2]);
        fflush(stdout);
        vks_buffer *all[] = {q, out, k32, v32, k16, v16, part, slot, pos};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) vks_buffer_destroy(all[i]);
    }
    return 0;
}

int main(int argc, char **argv) {
    bool pre = argc > 1 && !strcmp(argv[1], "prefill");
    if (pre) argc--, argv++;
    uint32_t H = argc > 4 ? (uint32_t)atoi(argv[1]) : 32, KH = argc > 4 ? (uint32_t)atoi(argv[2]) : 8;
    uint32_t hd = argc > 4 ? (uint32_t)atoi(argv[3]) : 128, S = argc > 4 ? (uint32_t)atoi(argv[4]) : 1;
    vks_gpu_options go = {.device_index = -1};
    vks_gpu *g;
    vks_ops *o;
    if (vks_gpu_create(&go, &g) || vks_ops_create(g, &o)) { fprintf(stderr, "bench_attention: %s\n", vks_last_error()); return 1; }
    printf("device: %s; %u heads, %u KV heads, head_dim %u, %u sequence(s)\n", vks_gpu_info(g)->name, H, KH, hd, S);
    if (pre) {
        int rc = prefill(g, o, H, KH, hd);
        vks_ops_destroy(o);
        vks_gpu_destroy(g);
        return rc;
    }
    printf("| positions | f32 cache, us/token | f16 cache, us/token | f16 / f32 |\n|---|---|---|---|\n");
    uint32_t lens[] = {512, 2048, 4096};
    for (int li = 0; li < 3; li++) {
        uint32_t P = lens[li], kvd = KH * hd;
        size_t cache = (size_t)S * P * kvd;
        vks_buffer *q = buffer(g, (size_t)S * H * hd * 4, 1), *out = buffer(g, (size_t)S * H * hd * 4, 2);
        vks_buffer *k32 = buffer(g, cache * 4, 3), *v32 = buffer(g, cache * 4, 4);
        vks_buffer *k16 = buffer(g, cache * 2, 5), *v16 = buffer(g, cache * 2, 6);
        vks_buffer *part = buffer(g, vks_op_attention_f16_scratch_bytes(S, H, hd, P), 7);
        uint32_t *sp = malloc(8 * S);
        for (uint32_t s = 0; s < S; s++) sp[s] = s, sp[S + s] = P - 1;
        vks_buffer *slot, *pos;
        vks_buffer_create(g, 4 * S, &slot), vks_buffer_create(g, 4 * S, &pos);
        vks_buffer_upload(slot, 0, sp, 4 * S), vks_buffer_upload(pos, 0, sp + S, 4 * S);
        free(sp);
        double t[2][ROUNDS];
        for (int r = -1; r < ROUNDS; r++) /* round -1: compiles the pipelines */
            for (int f16 = 0; f16 < 2; f16++) {
                vks_cmd *c;
                vks_cmd_begin(g, &c);
                double t0 = now();
                for (int i = 0; i < REPS; i++) {
                    int rc = f16 ? vks_op_attention_f16(o, c, bind(q), bind(k16), bind(v16), bind(slot), bind(pos),
                                                        bind(part), bind(out), S, H, KH, hd, P)
                                 : vks_op_attention(o, c, bind(q), bind(k32), bind(v32), bind(slot), bind(pos), bind(out),
                                                    S, H, KH, hd, P);
                    if (rc) { fprintf(stderr, "bench_attention: %s\n", vks_last_error()); return 1; }
                }
                if (vks_cmd_submit(c)) { fprintf(stderr, "bench_attention: %s\n", vks_last_error()); return 1; }
                if (r >= 0) t[f16][r] = (now() - t0) / REPS;
            }
        qsort(t[0], ROUNDS, sizeof(double), cmp_double), qsort(t[1], ROUNDS, sizeof(double), cmp_double);
        double a = t[0][ROUNDS / 2] * 1e6 / S, b = t[1][ROUNDS / 2] * 1e6 / S;
        printf("| %u | %.0f | %.0f | %.2f |\n", P, a, b, b / a);
        vks_buffer *all[] = {q, out, k32, v32, k16, v16, part, slot, pos};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) vks_buffer_destroy(all[i]);
    }
    vks_ops_destroy(o);
    vks_gpu_destroy(g);
    return 0;
}
