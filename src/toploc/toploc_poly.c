/* toploc_poly.c: polynomials over GF(65497) for TOPLOC proofs: Newton divided
 * differences, expansion to ascending monomial coefficients, Horner
 * evaluation, and the 258-byte wire form. */
#include "vkswarm/vks_toploc.h"

#include <pthread.h>
#include <string.h>

#define P VKS_TOPLOC_PRIME

static uint32_t mod_sub(uint32_t a, uint32_t b) { return a >= b ? a - b : a + P - b; }
static uint32_t mod_mul(uint32_t a, uint32_t b) { return (uint32_t)(((uint64_t)a * b) % P); }

/* Inverses of 1..P-1, built once: inv[i] = -(P / i) * inv[P mod i]. */
static uint16_t inverse_table[P];
static pthread_once_t inverse_once = PTHREAD_ONCE_INIT;

static void build_inverses(void) {
    inverse_table[1] = 1;
    for (uint32_t i = 2; i < P; i++)
        inverse_table[i] = (uint16_t)mod_sub(0, mod_mul(P / i, inverse_table[P % i]));
}

static uint32_t mod_inv(uint32_t a) { return inverse_table[a % P]; }

int vks_toploc_interpolate(const uint32_t *x, const uint16_t *y, int n, uint16_t coeffs[VKS_TOPLOC_K]) {
    if (!x || !y || !coeffs || n < 1 || n > VKS_TOPLOC_K)
        return vks_set_error(VKS_ERR_ARG, "toploc: interpolate over %d points (1..%d)", n, VKS_TOPLOC_K);
    for (int i = 0; i < n; i++)
        if (x[i] >= P) return vks_set_error(VKS_ERR_ARG, "toploc: x %u is not below the prime", x[i]);
    pthread_once(&inverse_once, build_inverses);
    /* Divided differences in place: dd[i] becomes f[x_0..x_i]. */
    uint32_t dd[VKS_TOPLOC_K];
    for (int i = 0; i < n; i++) dd[i] = y[i] % P;
    for (int k = 1; k < n; k++) {
        for (int i = n - 1; i >= k; i--) {
            uint32_t den = mod_sub(x[i], x[i - k]);
            if (den == 0) return vks_set_error(VKS_ERR_ARG, "toploc: interpolation points are not distinct");
            dd[i] = mod_mul(mod_sub(dd[i], dd[i - 1]), mod_inv(den));
        }
    }
    /* Expand sum_i dd[i] * prod_{j<i} (X - x_j) into monomials. */
    uint32_t acc[VKS_TOPLOC_K] = {0}, basis[VKS_TOPLOC_K + 1] = {1};
    for (int i = 0; i < n; i++) {
        for (int j = 0; j <= i; j++) acc[j] = (acc[j] + mod_mul(dd[i], basis[j])) % P;
        if (i + 1 == n) break;
        /* basis *= (X - x_i) */
        uint32_t neg = mod_sub(0, x[i]);
        for (int j = i + 1; j >= 0; j--) {
            uint32_t shifted = j > 0 ? basis[j - 1] : 0;
            basis[j] = (shifted + mod_mul(basis[j], neg)) % P;
        }
    }
    for (int i = 0; i < VKS_TOPLOC_K; i++) coeffs[i] = (uint16_t)(i < n ? acc[i] : 0);
    return VKS_OK;
}

uint32_t vks_toploc_poly_eval(const vks_toploc_poly *p, uint32_t idx) {
    if (!p || p->m == 0) return 0;
    uint32_t x = idx % p->m, r = 0;
    for (int i = VKS_TOPLOC_K - 1; i >= 0; i--) r = (mod_mul(r, x) + p->coeffs[i]) % P;
    return r;
}

int vks_toploc_poly_parse(const uint8_t *bytes, size_t len, vks_toploc_poly *out) {
    if (!bytes || !out) return vks_set_error(VKS_ERR_ARG, "toploc: NULL proof");
    if (len != VKS_TOPLOC_PROOF_BYTES)
        return vks_set_error(VKS_ERR_FORMAT, "chunk proof of %zu bytes (expected %d)", len, VKS_TOPLOC_PROOF_BYTES);
    out->m = (uint16_t)(bytes[0] << 8 | bytes[1]);
    if (out->m == 0) return vks_set_error(VKS_ERR_FORMAT, "proof modulus m = 0");
    if (out->m > P) return vks_set_error(VKS_ERR_FORMAT, "proof modulus m = %u above %d", out->m, P);
    for (int i = 0; i < VKS_TOPLOC_K; i++) {
        out->coeffs[i] = (uint16_t)(bytes[2 + 2 * i] << 8 | bytes[3 + 2 * i]);
        if (out->coeffs[i] >= P)
            return vks_set_error(VKS_ERR_FORMAT, "proof coefficient %d = %u is not below %d", i, out->coeffs[i], P);
    }
    return VKS_OK;
}

void vks_toploc_poly_write(const vks_toploc_poly *p, uint8_t out[VKS_TOPLOC_PROOF_BYTES]) {
    out[0] = (uint8_t)(p->m >> 8);
    out[1] = (uint8_t)p->m;
    for (int i = 0; i < VKS_TOPLOC_K; i++) {
        out[2 + 2 * i] = (uint8_t)(p->coeffs[i] >> 8);
        out[3 + 2 * i] = (uint8_t)p->coeffs[i];
    }
}
