/* common.c: last-error buffer, dtype helpers and f16/bf16 scalar conversions. */
#include "vkswarm/vks_common.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* ---- errors ---- */

static _Thread_local char last_error[1024];

const char *vks_last_error(void) { return last_error; }

/* Formats into a scratch buffer first: the arguments may be last_error itself. */
static void set_message(const char *prefix, const char *fmt, va_list ap) {
    char raw[sizeof last_error];
    int n = 0;
    if (prefix) n = snprintf(raw, sizeof raw, "%s: ", prefix);
    if (n < 0) n = 0;
    if ((size_t)n < sizeof raw) vsnprintf(raw + n, sizeof raw - (size_t)n, fmt, ap);
    vks_escape(raw, strlen(raw), last_error, sizeof last_error);
}

int vks_set_error(int code, const char *fmt, ...) {
    if (!fmt) {
        last_error[0] = '\0';
        return code;
    }
    va_list ap;
    va_start(ap, fmt);
    set_message(NULL, fmt, ap);
    va_end(ap);
    return code;
}

int vks_error_prefix(int code, const char *fmt, ...) {
    char context[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(context, sizeof context, fmt, ap);
    va_end(ap);
    char old[sizeof last_error];
    memcpy(old, last_error, sizeof old);
    return vks_set_error(code, "%s: %s", context, old);
}

size_t vks_utf8_decode(const char *str, size_t len, uint32_t *cp_out) {
    const unsigned char *s = (const unsigned char *)str;
    if (!s || len == 0) return 0;
    unsigned c = s[0];
    size_t n;
    uint32_t cp;
    if (c < 0x80) { n = 1; cp = c; }
    else if (c >= 0xc2 && c <= 0xdf) { n = 2; cp = c & 0x1f; }
    else if (c >= 0xe0 && c <= 0xef) { n = 3; cp = c & 0x0f; }
    else if (c >= 0xf0 && c <= 0xf4) { n = 4; cp = c & 0x07; }
    else return 0;
    if (n > len) return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    if (cp_out) *cp_out = cp;
    return n;
}

/* Length of the valid, printable UTF-8 character at s[0..len), or 0 when the
 * byte must be escaped (control character, C1 control, invalid or overlong
 * sequence, surrogate, beyond U+10FFFF). */
static size_t printable_utf8_len(const unsigned char *s, size_t len) {
    uint32_t cp = 0;
    size_t n = vks_utf8_decode((const char *)s, len, &cp);
    if (n == 0 || cp < 0x20 || cp == 0x7f) return 0;
    if (cp >= 0x80 && cp <= 0x9f) return 0; /* C1 controls: 0x9b is CSI on some terminals */
    return n;
}

size_t vks_escape(const char *in, size_t len, char *out, size_t cap) {
    if (!out || cap == 0) return 0;
    const unsigned char *s = (const unsigned char *)(in ? in : "");
    if (!in) len = 0;
    size_t o = 0;
    const size_t room = cap > 4 ? cap - 4 : 0; /* keeps space for "..." + NUL */
    for (size_t i = 0; i < len;) {
        size_t n = printable_utf8_len(s + i, len - i);
        size_t need = n ? n : 4;
        if (o + need > room) {
            if (cap > 4) memcpy(out + o, "...", 3), o += 3;
            break;
        }
        if (n) {
            memcpy(out + o, s + i, n);
            o += n;
            i += n;
        } else {
            static const char hex[] = "0123456789abcdef";
            out[o++] = '\\';
            out[o++] = 'x';
            out[o++] = hex[s[i] >> 4];
            out[o++] = hex[s[i] & 15];
            i++;
        }
    }
    out[o] = '\0';
    return o;
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

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

int vks_hash_parse_hex(const char *s, uint8_t out[32]) {
    if (!s || strlen(s) != 64) return -1;
    for (int i = 0; i < 32; i++) {
        int hi = hex_digit(s[2 * i]), lo = hex_digit(s[2 * i + 1]);
        if (hi < 0 || lo < 0) return -1;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

/* ---- time ---- */

double vks_seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
