/* test_ref.c: sanity tests of the reference ops, conversions, RNG and sampler. */
#include "test_util.h"

#include "vkswarm/vks_common.h"
#include "vkswarm/vks_ref.h"
#include "vkswarm/vks_philox.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ASSERT_NEAR(a, b, tol) \
    do { \
        double a_ = (a), b_ = (b); \
        if (!(fabs(a_ - b_) <= (tol))) fail_msg("%s = %.9g, want %.9g (tol %g)", #a, a_, b_, (double)(tol)); \
    } while (0)

/* ---- ops ---- */

static void test_matmul_small(void **state) {
    (void)state;
    const float x[2 * 3] = {1, 2, 3, -1, 0.5f, 2};
    const float W[2 * 3] = {0.5f, -1, 2, 3, 1, -0.25f};
    float y[2 * 2];
    vks_ref_matmul(x, W, 2, 2, 3, y);
    ASSERT_NEAR(y[0], 0.5 - 2 + 6, 1e-6);
    ASSERT_NEAR(y[1], 3 + 2 - 0.75, 1e-6);
    ASSERT_NEAR(y[2], -0.5 - 0.5 + 4, 1e-6);
    ASSERT_NEAR(y[3], -3 + 0.5 - 0.5, 1e-6);
}

static void test_rmsnorm_known(void **state) {
    (void)state;
    const float x[4] = {1, 2, 3, 4}, w[4] = {1, 1, 2, 0.5f};
    float out[4];
    vks_ref_rmsnorm(x, w, 1, 4, 0.0f, out);
    double inv = 1.0 / sqrt(7.5); /* mean of squares = 30/4 */
    ASSERT_NEAR(out[0], 1 * inv, 1e-6);
    ASSERT_NEAR(out[1], 2 * inv, 1e-6);
    ASSERT_NEAR(out[2], 6 * inv, 1e-6);
    ASSERT_NEAR(out[3], 2 * inv, 1e-6);
    vks_ref_rmsnorm(x, w, 1, 4, 1.0f, out); /* eps enters under the root */
    ASSERT_NEAR(out[0], 1.0 / sqrt(8.5), 1e-6);
}

static void test_rope_adjacent_hand(void **state) {
    (void)state;
    float x[4] = {1, 2, 3, 4};
    const uint32_t pos[1] = {3};
    vks_ref_rope(x, pos, 1, 4, 0, 1, 4, tu_rope_freqs(10000.0, 4), VKS_ROPE_ADJACENT);
    double a0 = 3.0, a1 = 3.0 * 0.01; /* freq_i = 10000^(-2i/4) */
    ASSERT_NEAR(x[0], 1 * cos(a0) - 2 * sin(a0), 1e-6);
    ASSERT_NEAR(x[1], 1 * sin(a0) + 2 * cos(a0), 1e-6);
    ASSERT_NEAR(x[2], 3 * cos(a1) - 4 * sin(a1), 1e-6);
    ASSERT_NEAR(x[3], 3 * sin(a1) + 4 * cos(a1), 1e-6);
}

static void test_rope_half_hand(void **state) {
    (void)state;
    float x[4] = {1, 2, 3, 4};
    const uint32_t pos[1] = {3};
    vks_ref_rope(x, pos, 1, 4, 0, 1, 4, tu_rope_freqs(10000.0, 4), VKS_ROPE_HALF);
    double a0 = 3.0, a1 = 0.03; /* pairs (0,2) and (1,3) */
    ASSERT_NEAR(x[0], 1 * cos(a0) - 3 * sin(a0), 1e-6);
    ASSERT_NEAR(x[2], 1 * sin(a0) + 3 * cos(a0), 1e-6);
    ASSERT_NEAR(x[1], 2 * cos(a1) - 4 * sin(a1), 1e-6);
    ASSERT_NEAR(x[3], 2 * sin(a1) + 4 * cos(a1), 1e-6);
}

static void test_rope_position_zero_identity_and_col0(void **state) {
    (void)state;
    float x[2 * 6] = {9, 1, 2, 3, 4, 9, 9, 5, 6, 7, 8, 9};
    const uint32_t pos[2] = {0, 1};
    vks_ref_rope(x, pos, 2, 6, 1, 1, 4, tu_rope_freqs(10000.0, 4), VKS_ROPE_ADJACENT);
    const float row0[6] = {9, 1, 2, 3, 4, 9};
    assert_memory_equal(x, row0, sizeof row0); /* pos 0 rotates by 0 */
    assert_true(x[6] == 9 && x[11] == 9);        /* outside the head: untouched */
    ASSERT_NEAR(x[7], 5 * cos(1.0) - 6 * sin(1.0), 1e-6);
}

/* HALF on a head whose elements were permuted (even -> first half, odd ->
 * second half) equals ADJACENT on the original, element for element. */
static void test_rope_half_equals_permuted_adjacent(void **state) {
    (void)state;
    enum { HD = 8, NH = 3, D = HD * NH };
    float adj[D], half[D];
    tu_fill_uniform(adj, D, 11, -2.0f, 2.0f);
    for (int h = 0; h < NH; h++)
        for (int j = 0; j < HD; j++) {
            int src = j < HD / 2 ? 2 * j : 2 * (j - HD / 2) + 1;
            half[h * HD + j] = adj[h * HD + src];
        }
    const uint32_t pos[1] = {37};
    vks_ref_rope(adj, pos, 1, D, 0, NH, HD, tu_rope_freqs(10000.0, HD), VKS_ROPE_ADJACENT);
    vks_ref_rope(half, pos, 1, D, 0, NH, HD, tu_rope_freqs(10000.0, HD), VKS_ROPE_HALF);
    for (int h = 0; h < NH; h++)
        for (int j = 0; j < HD; j++) {
            int src = j < HD / 2 ? 2 * j : 2 * (j - HD / 2) + 1;
            assert_true(half[h * HD + j] == adj[h * HD + src]);
        }
}

static void test_attention_one_key_is_v(void **state) {
    (void)state;
    enum { NH = 4, NKV = 2, HD = 2, SEQ = 3, SLOTS = 2, KV = NKV * HD };
    float k[SLOTS * SEQ * KV], v[SLOTS * SEQ * KV], q[NH * HD], out[NH * HD];
    tu_fill_uniform(k, SLOTS * SEQ * KV, 1, -1, 1);
    tu_fill_uniform(v, SLOTS * SEQ * KV, 2, -1, 1);
    tu_fill_uniform(q, NH * HD, 3, -1, 1);
    const uint32_t slot[1] = {1}, pos[1] = {0};
    vks_ref_attention(q, k, v, slot, pos, 1, NH, NKV, HD, SEQ, out);
    for (int h = 0; h < NH; h++)
        for (int j = 0; j < HD; j++) {
            float want = v[1 * SEQ * KV + (h / 2) * HD + j]; /* slot 1, t 0, kv head h/2 */
            ASSERT_NEAR(out[h * HD + j], want, 1e-6);
        }
}

static void test_attention_two_keys_softmax(void **state) {
    (void)state;
    enum { HD = 2, SEQ = 4 };
    const float q[HD] = {1.0f, -0.5f};
    float k[SEQ * HD] = {0.3f, 0.2f, -1.0f, 0.7f, 100, 100, 100, 100};
    float v[SEQ * HD] = {1, 2, -3, 4, 100, 100, 100, 100};
    const uint32_t slot[1] = {0}, pos[1] = {1}; /* keys 0 and 1 only */
    float out[HD];
    vks_ref_attention(q, k, v, slot, pos, 1, 1, 1, HD, SEQ, out);
    double s0 = (1.0 * 0.3 - 0.5 * 0.2) / sqrt(2.0), s1 = (1.0 * -1.0 - 0.5 * 0.7) / sqrt(2.0);
    double w0 = exp(s0) / (exp(s0) + exp(s1)), w1 = 1 - w0;
    ASSERT_NEAR(out[0], w0 * 1 + w1 * -3, 1e-6);
    ASSERT_NEAR(out[1], w0 * 2 + w1 * 4, 1e-6);
}

static void test_swiglu_add_embed(void **state) {
    (void)state;
    const float g[3] = {0, 1, -2}, u[3] = {1, 2, 3};
    float out[3];
    vks_ref_swiglu(g, u, 3, out);
    ASSERT_NEAR(out[0], 0.0, 1e-7);
    ASSERT_NEAR(out[1], 2.0 / (1 + exp(-1.0)), 1e-6);
    ASSERT_NEAR(out[2], -2.0 / (1 + exp(2.0)) * 3, 1e-6);
    float x[3] = {1, 2, 3};
    vks_ref_add(x, u, 3);
    assert_true(x[0] == 2 && x[1] == 4 && x[2] == 6);
    const float table[3 * 2] = {0, 1, 10, 11, 20, 21};
    const uint32_t toks[2] = {2, 0};
    float e[4];
    vks_ref_embed(table, 3, 2, toks, 2, e);
    assert_true(e[0] == 20 && e[1] == 21 && e[2] == 0 && e[3] == 1);
}

/* ---- conversions and common ---- */

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void test_f16_known(void **state) {
    (void)state;
    assert_int_equal(vks_f32_to_f16(1.0f), 0x3C00);
    assert_int_equal(vks_f32_to_f16(-2.0f), 0xC000);
    assert_int_equal(vks_f32_to_f16(65504.0f), 0x7BFF);
    assert_int_equal(vks_f32_to_f16(65519.0f), 0x7BFF);  /* below the halfway point */
    assert_int_equal(vks_f32_to_f16(65520.0f), 0x7C00);  /* halfway: ties to even = inf */
    assert_int_equal(vks_f32_to_f16(INFINITY), 0x7C00);
    assert_int_equal(vks_f32_to_f16(-INFINITY), 0xFC00);
    assert_int_equal(vks_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(vks_f32_to_f16(ldexpf(1, -24)), 0x0001);      /* smallest subnormal */
    assert_int_equal(vks_f32_to_f16(ldexpf(1, -25)), 0x0000);      /* tie -> even 0 */
    assert_int_equal(vks_f32_to_f16(ldexpf(1.5f, -25)), 0x0001);
    assert_int_equal(vks_f32_to_f16(ldexpf(3, -25)), 0x0002);      /* 1.5 ulp: tie -> 2 */
    assert_int_equal(vks_f32_to_f16(ldexpf(5, -25)), 0x0002);      /* 2.5 ulp: tie -> 2 */
    assert_int_equal(vks_f32_to_f16(ldexpf(1023, -24)), 0x03FF);   /* largest subnormal */
    assert_int_equal(vks_f32_to_f16(ldexpf(1, -14)), 0x0400);      /* smallest normal */
    assert_int_equal(vks_f32_to_f16(1.0f + ldexpf(1, -11)), 0x3C00); /* tie -> even */
    assert_int_equal(vks_f32_to_f16(1.0f + ldexpf(3, -11)), 0x3C02); /* tie -> even */
    assert_int_equal(vks_f32_to_f16(1.0f + ldexpf(1, -11) + ldexpf(1, -20)), 0x3C01);
    uint16_t nan16 = vks_f32_to_f16(NAN);
    assert_true((nan16 & 0x7C00) == 0x7C00 && (nan16 & 0x3FF) != 0);
    assert_true(isnan(vks_f16_to_f32(vks_f32_to_f16(from_bits(0x7F800001u))))); /* signalling */
    assert_true(vks_f16_to_f32(0x0001) == ldexpf(1, -24));
    assert_true(vks_f16_to_f32(0x03FF) == ldexpf(1023, -24));
    assert_true(vks_f16_to_f32(0x7BFF) == 65504.0f);
    assert_true(isinf(vks_f16_to_f32(0x7C00)) && vks_f16_to_f32(0xFC00) < 0);
    assert_true(isnan(vks_f16_to_f32(0x7E00)));
    for (uint32_t h = 0; h < 0x10000; h++) { /* every non-NaN half survives a round trip */
        float f = vks_f16_to_f32((uint16_t)h);
        if (!isnan(f)) assert_int_equal(vks_f32_to_f16(f), h);
    }
}

static void test_bf16_known(void **state) {
    (void)state;
    assert_int_equal(vks_f32_to_bf16(1.0f), 0x3F80);
    assert_int_equal(vks_f32_to_bf16(-2.0f), 0xC000);
    assert_int_equal(vks_f32_to_bf16(1.0f + ldexpf(1, -8)), 0x3F80);  /* tie -> even */
    assert_int_equal(vks_f32_to_bf16(1.0f + ldexpf(3, -8)), 0x3F82);  /* tie -> even */
    assert_int_equal(vks_f32_to_bf16(1.0f + ldexpf(1, -8) + ldexpf(1, -20)), 0x3F81);
    assert_int_equal(vks_f32_to_bf16(from_bits(0x7F7FFFFFu)), 0x7F80); /* FLT_MAX -> inf */
    assert_int_equal(vks_f32_to_bf16(INFINITY), 0x7F80);
    assert_true(isnan(vks_bf16_to_f32(vks_f32_to_bf16(NAN))));
    assert_true(isnan(vks_bf16_to_f32(vks_f32_to_bf16(from_bits(0x7F800001u))))); /* payload below 16 bits */
    assert_true(vks_bf16_to_f32(0x3F80) == 1.0f);
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = vks_bf16_to_f32((uint16_t)h);
        if (!isnan(f)) assert_int_equal(vks_f32_to_bf16(f), h);
    }
}

static void test_dtype_and_errors(void **state) {
    (void)state;
    vks_dtype t;
    assert_int_equal(vks_dtype_parse("bf16", &t), 0);
    assert_int_equal(t, VKS_DTYPE_BF16);
    assert_int_equal(vks_dtype_parse("f16", &t), 0);
    assert_int_equal(t, VKS_DTYPE_F16);
    assert_int_equal(vks_dtype_parse("f64", &t), -1);
    assert_int_equal(vks_dtype_parse(NULL, &t), -1);
    assert_string_equal(vks_dtype_name(VKS_DTYPE_F32), "f32");
    assert_int_equal(vks_dtype_size(VKS_DTYPE_F32), 4);
    assert_int_equal(vks_dtype_size(VKS_DTYPE_BF16), 2);
    assert_int_equal(vks_set_error(VKS_ERR_FORMAT, "bad %d\nline", 7), VKS_ERR_FORMAT);
    assert_string_equal(vks_last_error(), "bad 7\\x0aline"); /* one line, the break visible */
    /* the arguments may be the current message (it used to format into itself) */
    vks_set_error(VKS_ERR_FORMAT, "r llama.context_length");
    assert_int_equal(vks_set_error(VKS_ERR_IO, "%s: %s", "fz.gguf", vks_last_error()), VKS_ERR_IO);
    assert_string_equal(vks_last_error(), "fz.gguf: r llama.context_length");
    assert_int_equal(vks_error_prefix(VKS_ERR_IO, "%s", "m.bin"), VKS_ERR_IO);
    assert_string_equal(vks_last_error(), "m.bin: fz.gguf: r llama.context_length");
    /* bytes a terminal acts on are escaped; printable UTF-8 and backslashes pass */
    vks_set_error(VKS_ERR_FORMAT, "arch '%s'", "\x1b]0;pwned\x07\xc2\x9b" "2J\xff\\ok \xc3\xa9");
    assert_string_equal(vks_last_error(), "arch '\\x1b]0;pwned\\x07\\xc2\\x9b2J\\xff\\ok \xc3\xa9'");
    char esc[16];
    assert_int_equal(vks_escape("\x01\x02\x03\x04", 4, esc, sizeof esc), 15); /* cut at a whole escape */
    assert_string_equal(esc, "\\x01\\x02\\x03...");
    assert_int_equal(vks_escape("\xe2\x82", 2, esc, sizeof esc), 8); /* a sequence cut short */
    assert_string_equal(esc, "\\xe2\\x82");
    size_t out;
    assert_false(vks_mul_size(SIZE_MAX / 2 + 1, 2, &out));
    assert_true(vks_add_size(1, 2, &out) && out == 3);
}

/* ---- Philox ---- */

static void check_philox(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1,
                         const uint32_t want[4]) {
    const uint32_t ctr[4] = {c0, c1, c2, c3}, key[2] = {k0, k1};
    uint32_t out[4];
    vks_philox4x32_10(ctr, key, out);
    for (int i = 0; i < 4; i++)
        if (out[i] != want[i]) fail_msg("philox word %d = 0x%08x, want 0x%08x", i, out[i], want[i]);
}

static void test_philox_kat(void **state) {
    (void)state;
    const uint32_t zero[4] = {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8};
    const uint32_t ones[4] = {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd};
    const uint32_t pi[4] = {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1};
    check_philox(0, 0, 0, 0, 0, 0, zero);
    check_philox(~0u, ~0u, ~0u, ~0u, ~0u, ~0u, ones);
    check_philox(0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, pi);
    /* The public helper maps (seed, seq, pos, idx) to counter {idx,pos,seq,0}, key {lo,hi}. */
    uint32_t out[4];
    const uint32_t ctr[4] = {7, 5, 3, 0}, key[2] = {0x89abcdefu, 0x01234567u};
    vks_philox4x32_10(ctr, key, out);
    assert_int_equal(vks_philox_u32(0x0123456789abcdefull, 3, 5, 7), out[0]);
}

static void test_rng_uniform_range(void **state) {
    (void)state;
    assert_true(vks_rng_uniform(0) > 0.0f);
    assert_true(vks_rng_uniform(0) == 0.5f / 8388608.0f);
    /* every input, the largest included, stays strictly inside (0, 1) */
    assert_true(vks_rng_uniform(0xffffffffu) < 1.0f);
    assert_true(vks_rng_uniform(0xffffffffu) == (float)((0x7fffff + 0.5) / 8388608.0));
    assert_true(vks_rng_uniform(0x80000000u) == (float)((0x400000 + 0.5) / 8388608.0));
}

/* ---- sampler ---- */

static vks_sample_params params(float temp, uint32_t k, float p, uint64_t seed, uint32_t seq, uint32_t pos) {
    vks_sample_params sp = {temp, k, p, seed, seq, pos};
    return sp;
}

static void test_sample_greedy(void **state) {
    (void)state;
    const float logits[6] = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f, 0.0f};
    vks_sample_params p = params(0.0f, 0, 0, 1, 0, 0);
    assert_int_equal(vks_ref_sample(logits, 6, &p), 1); /* tie: lowest index */
    p.temperature = -1.0f;
    assert_int_equal(vks_ref_sample(logits, 6, &p), 1);
    for (int t = 0; t < 5; t++) {
        const float temps[5] = {0.1f, 0.5f, 1.0f, 2.0f, 100.0f};
        for (uint64_t seed = 0; seed < 50; seed++) {
            const float distinct[6] = {0.5f, 3.0f, -1.0f, 2.99f, 2.9f, 0.0f};
            p = params(temps[t], 1, 0, seed, 2, 9);
            assert_int_equal(vks_ref_sample(distinct, 6, &p), 1);
            uint32_t tied = vks_ref_sample(logits, 6, &p); /* top_k=1 keeps both 3.0s */
            assert_true(tied == 1 || tied == 3);
        }
    }
    const float single[4] = {0, 0, 5, 0};
    for (uint64_t seed = 0; seed < 50; seed++) {
        p = params(3.0f, 1, 0, seed, 0, 0);
        assert_int_equal(vks_ref_sample(single, 4, &p), 2);
    }
}

static int kept_count(const float *logits, int V, vks_sample_params p) {
    uint8_t keep[64];
    float z[64];
    int n = vks_ref_sample_kept(logits, V, &p, keep, z);
    int check = 0;
    for (int i = 0; i < V; i++) check += keep[i];
    assert_int_equal(check, n);
    return n;
}

static void test_sample_top_k_ties(void **state) {
    (void)state;
    const float logits[6] = {1, 3, 3, 2, 3, 0};
    assert_int_equal(kept_count(logits, 6, params(1, 1, 0, 0, 0, 0)), 3); /* all three 3s */
    assert_int_equal(kept_count(logits, 6, params(1, 2, 0, 0, 0, 0)), 3);
    assert_int_equal(kept_count(logits, 6, params(1, 3, 0, 0, 0, 0)), 3);
    assert_int_equal(kept_count(logits, 6, params(1, 4, 0, 0, 0, 0)), 4);
    assert_int_equal(kept_count(logits, 6, params(1, 0, 0, 0, 0, 0)), 6);
    assert_int_equal(kept_count(logits, 6, params(1, 6, 0, 0, 0, 0)), 6);
    uint8_t keep[6];
    float z[6];
    vks_sample_params p = params(2.0f, 4, 0, 0, 0, 0);
    vks_ref_sample_kept(logits, 6, &p, keep, z);
    assert_true(z[1] == 1.5f && z[5] == 0.0f);
    const uint8_t want[6] = {0, 1, 1, 1, 1, 0};
    assert_memory_equal(keep, want, 6);
}

static void test_sample_top_p_minimal(void **state) {
    (void)state;
    const double probs[4] = {0.5, 0.3, 0.15, 0.05};
    float logits[4];
    for (int i = 0; i < 4; i++) logits[i] = (float)log(probs[i]);
    assert_int_equal(kept_count(logits, 4, params(1, 0, 0.3f, 0, 0, 0)), 1);
    assert_int_equal(kept_count(logits, 4, params(1, 0, 0.5f - 1e-4f, 0, 0, 0)), 1);
    assert_int_equal(kept_count(logits, 4, params(1, 0, 0.7f, 0, 0, 0)), 2);
    assert_int_equal(kept_count(logits, 4, params(1, 0, 0.81f, 0, 0, 0)), 3);
    assert_int_equal(kept_count(logits, 4, params(1, 0, 0.96f, 0, 0, 0)), 4);
    assert_int_equal(kept_count(logits, 4, params(1, 0, 1.0f, 0, 0, 0)), 4); /* off */
    /* After top-k=3 the kept mass renormalizes to {0.526, 0.316, 0.158}. */
    assert_int_equal(kept_count(logits, 4, params(1, 3, 0.8f, 0, 0, 0)), 2);
    assert_int_equal(kept_count(logits, 4, params(1, 3, 0.9f, 0, 0, 0)), 3);
    /* Tied values enter together. */
    const float tied[4] = {1, 1, 1, 0};
    assert_int_equal(kept_count(tied, 4, params(1, 0, 0.1f, 0, 0, 0)), 3);
}

/* The top-p rule of ref_sample.c's header, written as plainly as possible
 * (quadratic): distinct values from the largest down, each value's tokens
 * added in index order. The reference sorts instead; results must be equal. */
static int naive_top_p_keep(const float *z, int n, double top_p, uint8_t *keep) {
    double zmax = -INFINITY, total = 0.0, cum = 0.0, prev = INFINITY;
    for (int i = 0; i < n; i++) zmax = z[i] > zmax ? z[i] : zmax;
    for (int i = 0; i < n; i++) total += exp((double)z[i] - zmax);
    float tau = INFINITY;
    for (;;) {
        float v = -INFINITY; /* next distinct value below prev */
        bool any = false;
        for (int i = 0; i < n; i++)
            if (z[i] < prev && (!any || z[i] > v)) v = z[i], any = true;
        if (!any) break;
        tau = v;
        for (int i = 0; i < n; i++)
            if (z[i] == v) cum += exp((double)z[i] - zmax) / total;
        if (cum >= top_p) break;
        prev = v;
    }
    int count = 0;
    for (int i = 0; i < n; i++) count += keep[i] = z[i] >= tau;
    return count;
}

static void test_sample_top_p_matches_rule(void **state) {
    (void)state;
    enum { V = 300 };
    float logits[V], z[V];
    uint8_t keep[V], want[V];
    uint32_t x = 12345;
    for (int trial = 0; trial < 200; trial++) {
        int levels = 1 + trial % 40; /* few levels: many ties, some spanning the threshold */
        for (int i = 0; i < V; i++) {
            x = x * 1664525u + 1013904223u;
            logits[i] = (float)((int)(x >> 8) % levels) * 0.37f - 3.0f;
            if (trial % 7 == 0 && i % 11 == 0) logits[i] = (x & 256) ? -0.0f : 0.0f;
        }
        float top_p = 0.05f + 0.9f * (float)(trial % 19) / 18.0f;
        vks_sample_params p = params(1, 0, top_p, 0, 0, 0);
        int got = vks_ref_sample_kept(logits, V, &p, keep, z);
        int expect = naive_top_p_keep(z, V, (double)top_p, want);
        assert_int_equal(got, expect);
        assert_memory_equal(keep, want, V);
    }
}

/* Empirical frequency of each token over `draws` seeds vs softmax over kept. */
static void check_frequencies(const float *logits, int V, vks_sample_params base, int draws, double tol) {
    uint8_t keep[16];
    float z[16];
    vks_ref_sample_kept(logits, V, &base, keep, z);
    double want[16], total = 0;
    for (int i = 0; i < V; i++) total += want[i] = keep[i] ? exp((double)z[i]) : 0.0;
    int counts[16] = {0};
    for (int d = 0; d < draws; d++) {
        vks_sample_params p = base;
        p.seed = 1000003ull * (uint64_t)d + 17;
        uint32_t tok = vks_ref_sample(logits, V, &p);
        assert_true(tok < (uint32_t)V);
        counts[tok]++;
    }
    for (int i = 0; i < V; i++) {
        double freq = (double)counts[i] / draws, p = want[i] / total;
        if (!keep[i]) assert_int_equal(counts[i], 0);
        if (fabs(freq - p) > tol) fail_msg("token %d: frequency %.4f, softmax %.4f", i, freq, p);
    }
}

static void test_sample_frequencies(void **state) {
    (void)state;
    const float logits[5] = {0.1f, -1.0f, 2.0f, 0.5f, 1.2f};
    check_frequencies(logits, 5, params(0.8f, 0, 0, 0, 3, 11), 20000, 0.02);
    check_frequencies(logits, 5, params(1.0f, 3, 0, 0, 0, 0), 20000, 0.02);
    check_frequencies(logits, 5, params(1.5f, 0, 0.8f, 0, 1, 2), 20000, 0.02);
}

static void test_sample_deterministic_and_order_free(void **state) {
    (void)state;
    enum { V = 32, N = 40 };
    float logits[V];
    tu_fill_uniform(logits, V, 5, -2, 2);
    uint32_t forward[N], again[N];
    for (int i = 0; i < N; i++) {
        vks_sample_params p = params(1.0f, 0, 0.95f, 42, (uint32_t)i % 3, (uint32_t)i);
        forward[i] = vks_ref_sample(logits, V, &p);
    }
    for (int i = N - 1; i >= 0; i--) {
        vks_sample_params p = params(1.0f, 0, 0.95f, 42, (uint32_t)i % 3, (uint32_t)i);
        again[i] = vks_ref_sample(logits, V, &p);
    }
    assert_memory_equal(forward, again, sizeof forward);
    int distinct = 0;
    for (int i = 0; i < N; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++) seen = seen || forward[j] == forward[i];
        distinct += !seen;
    }
    assert_true(distinct > 3); /* positions do get different draws */
}

static void test_sample_bad_args(void **state) {
    (void)state;
    const float logits[2] = {NAN, 1.0f};
    vks_sample_params p = params(0, 0, 0, 0, 0, 0);
    assert_int_equal(vks_ref_sample(logits, 2, &p), 1); /* NaN never wins */
    assert_int_equal(vks_ref_sample(NULL, 2, &p), 0);
    assert_int_equal(vks_ref_sample(logits, 0, &p), 0);
    p.temperature = 1.0f;
    p.top_k = 1;
    assert_int_equal(vks_ref_sample(logits, 2, &p), 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_small),
        cmocka_unit_test(test_rmsnorm_known),
        cmocka_unit_test(test_rope_adjacent_hand),
        cmocka_unit_test(test_rope_half_hand),
        cmocka_unit_test(test_rope_position_zero_identity_and_col0),
        cmocka_unit_test(test_rope_half_equals_permuted_adjacent),
        cmocka_unit_test(test_attention_one_key_is_v),
        cmocka_unit_test(test_attention_two_keys_softmax),
        cmocka_unit_test(test_swiglu_add_embed),
        cmocka_unit_test(test_f16_known),
        cmocka_unit_test(test_bf16_known),
        cmocka_unit_test(test_dtype_and_errors),
        cmocka_unit_test(test_philox_kat),
        cmocka_unit_test(test_rng_uniform_range),
        cmocka_unit_test(test_sample_greedy),
        cmocka_unit_test(test_sample_top_k_ties),
        cmocka_unit_test(test_sample_top_p_minimal),
        cmocka_unit_test(test_sample_top_p_matches_rule),
        cmocka_unit_test(test_sample_frequencies),
        cmocka_unit_test(test_sample_deterministic_and_order_free),
        cmocka_unit_test(test_sample_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
