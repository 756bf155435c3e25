/* bench_matmul_multi: vks_op_matmul_multi fused vs one dispatch per product
 * on the default device; not a test (numbers depend on the machine).
 * Two recordings of REPS decode calls (kind DECODE) of the same products of
 * one x, made with VKSWARM_MATMUL_FUSE=1 and =0, replayed alternately ROUNDS
 * times; prints the minimum time per call of each and their ratio. The
 * environment chooses the path as for any run (VKSWARM_MATMUL_DIRECT=0: the
 * matvec kernels for every type on CPU drivers; VKSWARM_NO_SUBGROUP=1).
 * Usage: bench_matmul_multi dtype M K N0 N1 [N2]   (dtype f32 f16 bf16 q8_0 q4_0 q4_k) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "vkswarm/vks_gpu.h"
#include "vkswarm/vks_ops.h"
#include "vkswarm/vks_quant.h"

enum { REPS = 10, ROUNDS = 9 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static int die(const char *what) {
    fprintf(stderr, "bench_matmul_multi: %s: %s\n", what, vks_last_error());
    return 1;
}

int main(int argc, char **argv) {
    static const struct { const char *name; vks_dtype t; } types[] = {
        {"f32", VKS_DTYPE_F32}, {"f16", VKS_DTYPE_F16}, {"bf16", VKS_DTYPE_BF16},
        {"q8_0", VKS_DTYPE_Q8_0}, {"q4_0", VKS_DTYPE_Q4_0}, {"q4_k", VKS_DTYPE_Q4_K}};
    int type = -1;
    for (int i = 0; argc > 1 && i < 6; i++)
        if (!strcmp(argv[1], types[i].name)) type = i;
    if (argc < 6 || argc > 7 || type < 0) {
        fprintf(stderr, "usage: bench_matmul_multi dtype M K N0 N1 [N2]\n");
        return 2;
    }
    vks_dtype dt = types[type].t;
    uint32_t M = (uint32_t)atoi(argv[2]), K = (uint32_t)atoi(argv[3]), N[3];
    int n = argc - 4;
    for (int i = 0; i < n; i++) N[i] = (uint32_t)atoi(argv[4 + i]);
    vks_gpu_options opt = {.device_index = -1};
    vks_gpu *g;
    if (vks_gpu_create(&opt, &g)) return die("device");
    vks_ops *o[2]; /* [0]: one dispatch per product, [1]: fused */
    for (int f = 0; f < 2; f++) {
        setenv("VKSWARM_MATMUL_FUSE", f ? "1" : "0", 1);
        if (vks_ops_create(g, &o[f])) return die("ops");
    }
    size_t xb = (size_t)M * K * 4;
    float *x = malloc(xb);
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = (float)(i % 13) / 13.0f - 0.5f;
    vks_buffer *bx, *bw[3], *by[3];
    if (vks_buffer_create(g, xb, &bx) || vks_buffer_upload(bx, 0, x, xb)) return die("x");
    vks_matmul_part p[3];
    for (int i = 0; i < n; i++) {
        size_t wb = vks_op_weight_bytes(dt, N[i], K);
        void *w = calloc(1, wb ? wb : 1); /* zero weights: the kernels' time does not depend on them */
        if (!wb || vks_buffer_create(g, wb, &bw[i]) || vks_buffer_upload(bw[i], 0, w, wb) ||
            vks_buffer_create(g, (size_t)M * N[i] * 4, &by[i]))
            return die("weights");
        free(w);
        p[i] = (vks_matmul_part){.W = {bw[i], 0, 0}, .dtype = dt, .y = {by[i], 0, 0}, .N = N[i], .ldy = N[i]};
    }
    vks_cmd *c[2];
    uint64_t dispatches[2];
    for (int f = 0; f < 2; f++) {
        if (vks_cmd_begin_reusable(g, &c[f])) return die("record");
        for (int r = 0; r < REPS; r++)
            if (vks_op_matmul_multi(o[f], c[f], (vks_binding){bx, 0, 0}, p, n, M, K, false, VKS_MATMUL_DECODE))
                return die("matmul_multi");
        vks_cmd_counts k;
        vks_cmd_counts_get(c[f], &k);
        dispatches[f] = k.dispatches / REPS;
        if (vks_cmd_run(c[f])) return die("run"); /* warm-up: compiles the pipelines */
    }
    double best[2] = {1e30, 1e30};
    for (int round = 0; round < ROUNDS; round++)
        for (int f = 0; f < 2; f++) {
            double t0 = now();
            if (vks_cmd_run(c[f])) return die("run");
            double t = (now() - t0) / REPS;
            if (t < best[f]) best[f] = t;
        }
    printf("%s M%u K%u N", argv[1], M, K);
    for (int i = 0; i < n; i++) printf(" %u", N[i]);
    printf(": separate %.3f ms (%llu dispatches), fused %.3f ms (%llu), fused/separate %.2f\n", best[0] * 1e3,
           (unsigned long long)dispatches[0], best[1] * 1e3, (unsigned long long)dispatches[1], best[1] / best[0]);
    for (int f = 0; f < 2; f++) {
        vks_cmd_discard(c[f]);
        vks_ops_destroy(o[f]);
    }
    for (int i = 0; i < n; i++) {
        vks_buffer_destroy(bw[i]);
        vks_buffer_destroy(by[i]);
    }
    vks_buffer_destroy(bx);
    free(x);
    vks_gpu_destroy(g);
    return 0;
}
