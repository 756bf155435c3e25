/* ref_lora.c: float64 forward and backward of the LoRA linear (vks_ref_grad.h),
 * composed of the reference matmul: the adapter is two small products. */
#include "vkswarm/vks_ref_grad.h"

#include <stdlib.h>

static int bad_args(const char *fn) {
    return vks_set_error(VKS_ERR_ARG, "%s: NULL pointer or a size out of range", fn);
}

int vks_ref_lora_forward(const double *x, const double *W, const double *A, const double *B, int M, int N, int K,
                         int r, double s, double *y, double *h) {
    if (!x || !W || !A || !B || !y || M <= 0 || N <= 0 || K <= 0 || r <= 0) return bad_args("vks_ref_lora_forward");
    double *ax = malloc((size_t)M * r * sizeof *ax), *bax = malloc((size_t)M * N * sizeof *bax);
    int rc = ax && bax ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "vks_ref_lora_forward: out of memory");
    if (!rc) rc = vks_ref_matmul_forward(x, W, M, N, K, y);
    if (!rc) rc = vks_ref_matmul_forward(x, A, M, r, K, ax);
    if (!rc) rc = vks_ref_matmul_forward(ax, B, M, N, r, bax);
    for (size_t i = 0; !rc && i < (size_t)M * N; i++) y[i] += s * bax[i];
    for (size_t i = 0; !rc && h && i < (size_t)M * r; i++) h[i] = ax[i];
    free(ax);
    free(bax);
    return rc;
}

int vks_ref_lora_backward(const double *x, const double *W, const double *A, const double *B, int M, int N, int K,
                          int r, double s, const double *dy, double *dx, double *dA, double *dB) {
    if (!x || !W || !A || !B || !dy || M <= 0 || N <= 0 || K <= 0 || r <= 0) return bad_args("vks_ref_lora_backward");
    double *ax = calloc((size_t)M * r, sizeof *ax), *g = calloc((size_t)M * r, sizeof *g);
    int rc = ax && g ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "vks_ref_lora_backward: out of memory");
    if (!rc) rc = vks_ref_matmul_forward(x, A, M, r, K, ax);
    /* the adapter's output u = s (x A^T) B^T: du = dy, so d(x A^T) = s dy B and dB = s dy^T (x A^T) */
    for (size_t i = 0; !rc && i < (size_t)M * r; i++) ax[i] *= s;
    if (!rc) rc = vks_ref_matmul_backward(ax, B, M, N, r, dy, g, dB);
    for (size_t i = 0; !rc && i < (size_t)M * r; i++) g[i] *= s;
    if (!rc) rc = vks_ref_matmul_backward(x, A, M, r, K, g, dx, dA);
    if (!rc && dx) rc = vks_ref_matmul_backward(x, W, M, N, K, dy, dx, NULL);
    free(ax);
    free(g);
    return rc;
}
