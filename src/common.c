/* common.c: last-error buffer, dtype helpers and f16/bf16 scalar conversions. */
#include "vkswarm/vks_common.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---- errors ---- */

static _Thread_local char last_error[1024];

const char *vks_last_error(void) { return last_error; }

int vks_set_error(int code, const char *fmt, ...) {
    if (!fmt) {
        last_error[0] = '\0';
        return code;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    /* The contract is one line: fold any line breaks a caller let through. */
    for (char *c = last_error; *c; c++)
        if (*c == '\n' || *c == '\r') *c = ' ';
    return code;
}

/* ---- dtypes ---- */

const char *vks_dtype_name(vks_dtype t) {
    switch (t) {
    case VKS_DTYPE_F32: return "f32";
    case VKS_DTYPE_F16: return "f16";
    case VKS_DTYPE_BF16: return "bf16";
    case VKS_DTYPE_Q8_0: return "q8_0";
    case VKS_DTYPE_Q4_0: return "q4_0";
    case VKS_DTYPE_Q4_K: return "q4_k";
    case VKS_DTYPE_Q6_K: return "q6_k";
    case VKS_DTYPE_COUNT: break;
    }
    return "unknown";
}

int vks_dtype_parse(const char *s, vks_dtype *out) {
    static const vks_dtype all[] = {VKS_DTYPE_F32,  VKS_DTYPE_F16,  VKS_DTYPE_BF16, VKS_DTYPE_Q8_0,
                                    VKS_DTYPE_Q4_0, VKS_DTYPE_Q4_K, VKS_DTYPE_Q6_K};
    if (!s || !out) return -1;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (strcmp(s, vks_dtype_name(all[i])) == 0) {
            *out = all[i];
            return 0;
        }
    }
    return -1;
}

size_t vks_dtype_size(vks_dtype t) {
    switch (t) {
    case VKS_DTYPE_F32: return 4;
    case VKS_DTYPE_F16: return 2;
    case VKS_DTYPE_BF16: return 2;
    default: return 0; /* block formats: see vks_dtype_row_bytes() */
    }
}

/* ---- float conversions ---- */

static uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Shifts `value` right by `shift` (1..31) rounding to nearest, ties to even. */
static uint32_t shift_round_even(uint32_t value, unsigned shift) {
    uint32_t kept = value >> shift;
    uint32_t rest = value & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (kept & 1u))) kept++;
    return kept;
}

float vks_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (man << 13)); /* inf / NaN */
    if (exp != 0) return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
    if (man == 0) return bits_float(sign);
    /* Subnormal: renormalize. 113 is the f32 biased exponent of 2^-14. */
    uint32_t e = 113;
    while (!(man & 0x400u)) {
        man <<= 1;
        e--;
    }
    return bits_float(sign | (e << 23) | ((man & 0x3ffu) << 13));
}

uint16_t vks_f32_to_f16(float f) {
    uint32_t x = float_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN: keep top payload bits, force quiet so it stays NaN */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u) /* >= 65520 (incl. inf) rounds to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (ax >= 0x38800000u) { /* normal f16 range, >= 2^-14 */
        uint32_t rebased = ax - (112u << 23); /* f16 exponent in bits 23.. */
        return (uint16_t)(sign | shift_round_even(rebased, 13)); /* carry may bump exponent */
    }
    if (ax <= 0x33000000u) /* <= 2^-25: rounds to zero (the tie goes to even 0) */
        return sign;
    /* Subnormal f16: value / 2^-24 = mantissa-with-implicit-bit >> (126 - exp). */
    uint32_t exp = ax >> 23;
    uint32_t man = (ax & 0x7fffffu) | 0x800000u;
    return (uint16_t)(sign | shift_round_even(man, 126u - exp));
}

float vks_bf16_to_f32(uint16_t h) { return bits_float((uint32_t)h << 16); }

uint16_t vks_f32_to_bf16(float f) {
    uint32_t x = float_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: truncate and force quiet */
        return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)shift_round_even(x, 16); /* overflow carries into inf correctly */
}

void vks_hash_hex(const uint8_t hash[32], char out[65]) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        out[2 * i] = digits[hash[i] >> 4];
        out[2 * i + 1] = digits[hash[i] & 15];
    }
    out[64] = 0;
}
