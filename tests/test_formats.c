/* test_formats.c: block quantization (known blocks, error bounds), GGUF and
 * safetensors readers/writers (round trips, every metadata type, real vocab
 * files), one model giving the same logits from every format, the convert
 * CLI, content-based detection, and hostile files (mutants and the fuzz
 * regression corpus). */
#define _GNU_SOURCE /* memmem */
#include "test_util.h"

#include "vkswarm/vks_checkpoint.h"
#include "vkswarm/vks_ref_forward.h"
#include "vkswarm/vks_gguf.h"
#include "vkswarm/vks_model.h"
#include "vkswarm/vks_quant.h"
#include "vkswarm/vks_ref.h"
#include "vkswarm/vks_safetensors.h"
#include "vkswarm/vks_tokenizer.h"

#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers ---- */

static char *path_in(const char *dir, const char *name) {
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", dir, name);
    return p;
}

static char *shared_file(const char *rel) {
    const char *p = tu_shared_path(rel);
    return p ? strdup(p) : NULL;
}

static void write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static uint16_t h16(float f) { return vks_f32_to_f16(f); }

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

static const int32_t test_ids[] = {1, 403, 407, 261, 9, 33, 45, 100, 200, 300, 17, 2};
#define N_IDS ((int)(sizeof test_ids / sizeof test_ids[0]))

static float *logits_of(const vks_model *m) {
    float *l = malloc((size_t)N_IDS * (size_t)m->cfg.vocab_size * sizeof(float));
    int rc = vks_ref_forward(m, test_ids, N_IDS, l, NULL);
    if (rc != VKS_OK) fail_msg("cpu forward of %s: %s", m->path, vks_last_error());
    return l;
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - (double)b[i]));
    return m;
}

static vks_model *small_random(int vocab, uint64_t seed) {
    vks_model_config c = {.dim = 64, .hidden_dim = 96, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                          .vocab_size = vocab, .seq_len = 32};
    vks_model *m = NULL;
    if (vks_model_random(&c, seed, &m) != VKS_OK) fail_msg("random model: %s", vks_last_error());
    return m;
}

/* ---- quantization: hand-built blocks ---- */

static void test_q8_0_known_block(void **state) {
    (void)state;
    uint8_t b[34];
    put16(b, h16(0.5f));
    for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)(j - 16);
    float y[32];
    vks_dequantize(VKS_DTYPE_Q8_0, b, y, 32);
    for (int j = 0; j < 32; j++) assert_true(y[j] == 0.5f * (float)(j - 16));
    /* quantizing x = j - 16: amax 16, d = 16/127, q = round(x * 127/16) */
    float x[32];
    for (int j = 0; j < 32; j++) x[j] = (float)(j - 16);
    uint8_t q[34];
    assert_int_equal(vks_quantize(VKS_DTYPE_Q8_0, x, q, 32), VKS_OK);
    uint16_t d;
    memcpy(&d, q, 2);
    assert_int_equal(d, h16(16.0f / 127.0f));
    for (int j = 0; j < 32; j++) assert_int_equal((int8_t)q[2 + j], (int)roundf((float)(j - 16) * (127.0f / 16.0f)));
    assert_int_equal(vks_dtype_block_bytes(VKS_DTYPE_Q8_0), 34);
}

static void test_q4_0_known_block(void **state) {
    (void)state;
    uint8_t b[18];
    put16(b, h16(2.0f));
    for (int j = 0; j < 16; j++) b[2 + j] = (uint8_t)(j | ((15 - j) << 4));
    float y[32];
    vks_dequantize(VKS_DTYPE_Q4_0, b, y, 32);
    for (int j = 0; j < 16; j++) {
        assert_true(y[j] == 2.0f * (float)(j - 8));
        assert_true(y[j + 16] == 2.0f * (float)(15 - j - 8));
    }
    /* llama.cpp q4_0: d = max/-8 with the signed largest value; -8 maps to level 0 */
    float x[32] = {0};
    x[3] = -8.0f;
    x[20] = 4.0f;
    uint8_t q[18];
    assert_int_equal(vks_quantize(VKS_DTYPE_Q4_0, x, q, 32), VKS_OK);
    vks_dequantize(VKS_DTYPE_Q4_0, q, y, 32);
    for (int j = 0; j < 32; j++) assert_true(y[j] == x[j]);
    assert_int_equal(vks_dtype_block_bytes(VKS_DTYPE_Q4_0), 18);
}

/* Q4_K: 8 sub-blocks of 32 with 6-bit scale sc and min m: y = d*sc*q - dmin*m. */
static void test_q4_k_known_block(void **state) {
    (void)state;
    const uint8_t sc[8] = {1, 7, 33, 63, 5, 40, 17, 62}, mn[8] = {0, 9, 63, 2, 50, 3, 31, 16};
    uint8_t b[144] = {0};
    put16(b, h16(0.25f));
    put16(b + 2, h16(0.125f));
    uint8_t *s = b + 4;
    for (int j = 0; j < 4; j++) { /* low 6 bits of scales 0-3 and mins 0-3; top 2 bits hold the high bits of 4-7 */
        s[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        s[j + 4] = (uint8_t)(mn[j] | ((mn[j + 4] >> 4) << 6));
        s[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
    }
    int level[256];
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            int lo = l & 15, hi = (l * 3 + c) & 15;
            b[16 + 32 * c + l] = (uint8_t)(lo | (hi << 4));
            level[64 * c + l] = lo;
            level[64 * c + 32 + l] = hi;
        }
    float y[256];
    vks_dequantize(VKS_DTYPE_Q4_K, b, y, 256);
    for (int e = 0; e < 256; e++) {
        int sb = e / 32;
        float want = (0.25f * sc[sb]) * (float)level[e] - 0.125f * mn[sb];
        if (y[e] != want) fail_msg("q4_k element %d: got %g want %g", e, y[e], want);
    }
    assert_int_equal(vks_dtype_block_bytes(VKS_DTYPE_Q4_K), 144);
}

/* Q6_K: 16 sub-blocks of 16 with int8 scales: y = d*scale*(L-32), L in 0..63. */
static void test_q6_k_known_block(void **state) {
    (void)state;
    uint8_t b[210] = {0}, L[256];
    for (int e = 0; e < 256; e++) L[e] = (uint8_t)((e * 7 + e / 64) % 64);
    uint8_t *ql = b, *qh = b + 128;
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *q = L + 128 * h + l; /* elements l, l+32, l+64, l+96 of this half */
            ql[64 * h + l] = (uint8_t)((q[0] & 15) | ((q[64] & 15) << 4));
            ql[64 * h + l + 32] = (uint8_t)((q[32] & 15) | ((q[96] & 15) << 4));
            qh[32 * h + l] = (uint8_t)((q[0] >> 4) | ((q[32] >> 4) << 2) | ((q[64] >> 4) << 4) | ((q[96] >> 4) << 6));
        }
    for (int i = 0; i < 16; i++) b[192 + i] = (uint8_t)(int8_t)(i * 9 - 70);
    put16(b + 208, h16(0.25f));
    float y[256];
    vks_dequantize(VKS_DTYPE_Q6_K, b, y, 256);
    for (int e = 0; e < 256; e++) {
        float want = 0.25f * (float)(int8_t)b[192 + e / 16] * (float)(L[e] - 32);
        if (y[e] != want) fail_msg("q6_k element %d: got %g want %g", e, y[e], want);
    }
    assert_int_equal(vks_dtype_block_bytes(VKS_DTYPE_Q6_K), 210);
}

/* ---- quantization: error bounds on random data ---- */

static void check_quant_error(vks_dtype t, double max_nmse, double min_nmse) {
    enum { N = 256 * 64 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    uint64_t bytes;
    assert_true(vks_dtype_row_bytes(t, N, &bytes));
    uint8_t *q = malloc((size_t)bytes);
    tu_fill_uniform(x, N, 42 + (uint64_t)t, -1.0f, 1.0f);
    for (int i = 0; i < N; i += 97) x[i] *= 6.0f; /* outliers */
    assert_int_equal(vks_quantize(t, x, q, N), VKS_OK);
    vks_dequantize(t, q, y, N);
    double e = tu_nmse(y, x, N);
    print_message("%s: nmse %.3g\n", vks_dtype_name(t), e);
    assert_true(e < max_nmse);
    assert_true(e > min_nmse); /* lossy formats must actually lose something */
    /* Q8_0 per element: levels come from the exact d but decode with d rounded to
     * f16 (relative error <= 2^-11), so |err| <= d/2 + 127 * d * 2^-11 < 0.563 d. */
    if (t == VKS_DTYPE_Q8_0)
        for (int blk = 0; blk < N / 32; blk++) {
            float amax = 0;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[32 * blk + j]));
            for (int j = 0; j < 32; j++) assert_true(fabsf(x[32 * blk + j] - y[32 * blk + j]) <= amax / 127.0f * 0.563f + 1e-7f);
        }
    free(x);
    free(y);
    free(q);
}

static void test_quant_error_bounds(void **state) {
    (void)state;
    check_quant_error(VKS_DTYPE_Q8_0, 1e-4, 1e-7);
    check_quant_error(VKS_DTYPE_Q4_0, 1.5e-2, 1e-4);
    check_quant_error(VKS_DTYPE_Q4_K, 1e-2, 1e-4);
    check_quant_error(VKS_DTYPE_Q6_K, 1e-3, 1e-6);
    float x[32] = {0};
    uint8_t q[64];
    assert_int_equal(vks_quantize(VKS_DTYPE_Q4_K, x, q, 32), VKS_ERR_ARG); /* not a whole block */
    assert_int_equal(vks_quantize(VKS_DTYPE_COUNT, x, q, 32), VKS_ERR_ARG);
    uint64_t rb;
    assert_false(vks_dtype_row_bytes(VKS_DTYPE_Q8_0, 33, &rb));
    assert_true(vks_dtype_row_bytes(VKS_DTYPE_Q4_K, 512, &rb));
    assert_int_equal(rb, 288);
}

/* A zero block stays zero (no NaN from 0/0). */
static void test_quant_zero_block(void **state) {
    (void)state;
    const vks_dtype all[] = {VKS_DTYPE_Q8_0, VKS_DTYPE_Q4_0, VKS_DTYPE_Q4_K, VKS_DTYPE_Q6_K};
    float x[256] = {0}, y[256];
    uint8_t q[8 * 34]; /* the largest: 8 q8_0 blocks */
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(vks_quantize(all[i], x, q, 256), VKS_OK);
        vks_dequantize(all[i], q, y, 256);
        for (int j = 0; j < 256; j++) assert_true(y[j] == 0.0f);
    }
}

/* ---- GGUF container ---- */

static void test_gguf_tensor_round_trip(void **state) {
    (void)state;
    const vks_dtype all[] = {VKS_DTYPE_F32,  VKS_DTYPE_F16,  VKS_DTYPE_BF16, VKS_DTYPE_Q8_0,
                             VKS_DTYPE_Q4_0, VKS_DTYPE_Q4_K, VKS_DTYPE_Q6_K};
    enum { ROWS = 3, COLS = 512 };
    float src[ROWS * COLS];
    tu_fill_uniform(src, ROWS * COLS, 7, -2.0f, 2.0f);
    vks_gguf_writer *w;
    assert_int_equal(vks_gguf_writer_create(&w), VKS_OK);
    void *enc[7];
    size_t sizes[7];
    char name[32];
    for (int i = 0; i < 7; i++) {
        uint64_t rb;
        assert_true(vks_dtype_row_bytes(all[i], COLS, &rb));
        sizes[i] = (size_t)rb * ROWS;
        enc[i] = malloc(sizes[i]);
        assert_int_equal(vks_quantize(all[i], src, enc[i], ROWS * COLS), VKS_OK);
        snprintf(name, sizeof name, "t.%s", vks_dtype_name(all[i]));
        int64_t ne[2] = {COLS, ROWS};
        assert_int_equal(vks_gguf_add_tensor(w, name, all[i], 2, ne, enc[i]), VKS_OK);
    }
    int64_t ne1[1] = {COLS};
    assert_int_equal(vks_gguf_add_tensor(w, "t.f32", VKS_DTYPE_F32, 1, ne1, src), VKS_ERR_ARG); /* duplicate */
    int64_t bad[1] = {100};
    assert_int_equal(vks_gguf_add_tensor(w, "bad", VKS_DTYPE_Q8_0, 1, bad, src), VKS_ERR_ARG); /* not whole blocks */
    char *path = path_in(tu_tmpdir(), "t.gguf");
    assert_int_equal(vks_gguf_writer_save(w, path), VKS_OK);
    vks_gguf_writer_free(w);
    vks_gguf *g;
    if (vks_gguf_open(path, &g) != VKS_OK) fail_msg("%s", vks_last_error());
    assert_int_equal(vks_gguf_version(g), 3);
    assert_int_equal(vks_gguf_n_tensors(g), 7);
    assert_int_equal(vks_gguf_data_offset(g) % 32, 0);
    for (int i = 0; i < 7; i++) {
        snprintf(name, sizeof name, "t.%s", vks_dtype_name(all[i]));
        const vks_gguf_tensor *t = vks_gguf_find_tensor(g, name);
        assert_non_null(t);
        assert_int_equal(t->dtype, all[i]);
        assert_int_equal(t->ne[0], COLS);
        assert_int_equal(t->ne[1], ROWS);
        assert_int_equal(t->size, sizes[i]);
        assert_int_equal(t->offset % 32, 0);
        assert_memory_equal(t->data, enc[i], sizes[i]);
        free(enc[i]);
    }
    assert_null(vks_gguf_find_tensor(g, "t.q5_k"));
    vks_gguf_close(g);
    free(path);
}

static void test_gguf_metadata_every_type(void **state) {
    (void)state;
    vks_gguf_writer *w;
    assert_int_equal(vks_gguf_writer_create(&w), VKS_OK);
    assert_int_equal(vks_gguf_writer_set_alignment(w, 64), VKS_OK);
    uint8_t u8 = 200; int8_t i8 = -100; uint16_t u16 = 60000; int16_t i16 = -30000;
    uint64_t u64 = 0xFFFFFFFFFFFFFFF0ull; int64_t i64 = -((int64_t)1 << 60); double f64 = 3.141592653589793;
    assert_int_equal(vks_gguf_add_scalar(w, "k.u8", VKS_GGUF_UINT8, &u8), VKS_OK);
    assert_int_equal(vks_gguf_add_scalar(w, "k.i8", VKS_GGUF_INT8, &i8), VKS_OK);
    assert_int_equal(vks_gguf_add_scalar(w, "k.u16", VKS_GGUF_UINT16, &u16), VKS_OK);
    assert_int_equal(vks_gguf_add_scalar(w, "k.i16", VKS_GGUF_INT16, &i16), VKS_OK);
    assert_int_equal(vks_gguf_add_u32(w, "k.u32", 4000000000u), VKS_OK);
    assert_int_equal(vks_gguf_add_i32(w, "k.i32", -2000000000), VKS_OK);
    assert_int_equal(vks_gguf_add_f32(w, "k.f32", 0.1f), VKS_OK);
    assert_int_equal(vks_gguf_add_bool(w, "k.bool", true), VKS_OK);
    assert_int_equal(vks_gguf_add_strn(w, "k.str", "a\0b", 3), VKS_OK);
    assert_int_equal(vks_gguf_add_scalar(w, "k.u64", VKS_GGUF_UINT64, &u64), VKS_OK);
    assert_int_equal(vks_gguf_add_scalar(w, "k.i64", VKS_GGUF_INT64, &i64), VKS_OK);
    assert_int_equal(vks_gguf_add_scalar(w, "k.f64", VKS_GGUF_FLOAT64, &f64), VKS_OK);
    const char *strs[] = {"", "x", "\xe2\x96\x81hello"};
    float fa[3] = {1.5f, -2.0f, 1e30f};
    int32_t ia[4] = {-1, 0, 7, INT32_MAX};
    uint8_t ba[2] = {1, 0};
    int16_t sa[2] = {-5, 5};
    assert_int_equal(vks_gguf_add_arr_str(w, "a.str", strs, 3), VKS_OK);
    assert_int_equal(vks_gguf_add_arr(w, "a.f32", VKS_GGUF_FLOAT32, fa, 3), VKS_OK);
    assert_int_equal(vks_gguf_add_arr(w, "a.i32", VKS_GGUF_INT32, ia, 4), VKS_OK);
    assert_int_equal(vks_gguf_add_arr(w, "a.bool", VKS_GGUF_BOOL, ba, 2), VKS_OK);
    assert_int_equal(vks_gguf_add_arr(w, "a.i16", VKS_GGUF_INT16, sa, 2), VKS_OK);
    assert_int_equal(vks_gguf_add_arr(w, "a.empty", VKS_GGUF_UINT8, NULL, 0), VKS_OK);
    assert_int_equal(vks_gguf_add_u32(w, "k.u32", 1), VKS_ERR_ARG); /* duplicate */
    char *path = path_in(tu_tmpdir(), "meta.gguf");
    assert_int_equal(vks_gguf_writer_save(w, path), VKS_OK);
    vks_gguf_writer_free(w);

    vks_gguf *g;
    if (vks_gguf_open(path, &g) != VKS_OK) fail_msg("%s", vks_last_error());
    assert_int_equal(vks_gguf_n_kv(g), 19); /* 12 scalars + 6 arrays + general.alignment */
    assert_int_equal(vks_gguf_alignment(g), 64);
    int64_t v;
    uint64_t uv;
    uint32_t u32;
    assert_int_equal(vks_gguf_get_i64(g, "k.u8", &v), VKS_OK); assert_int_equal(v, 200);
    assert_int_equal(vks_gguf_get_i64(g, "k.i8", &v), VKS_OK); assert_int_equal(v, -100);
    assert_int_equal(vks_gguf_get_i64(g, "k.u16", &v), VKS_OK); assert_int_equal(v, 60000);
    assert_int_equal(vks_gguf_get_i64(g, "k.i16", &v), VKS_OK); assert_int_equal(v, -30000);
    assert_int_equal(vks_gguf_get_u32(g, "k.u32", &u32), VKS_OK); assert_int_equal(u32, 4000000000u);
    assert_int_equal(vks_gguf_get_i64(g, "k.i32", &v), VKS_OK); assert_int_equal(v, -2000000000);
    assert_int_equal(vks_gguf_get_u32(g, "k.i32", &u32), VKS_ERR_FORMAT); /* negative does not fit */
    assert_int_equal(vks_gguf_get_u64(g, "k.u64", &uv), VKS_OK); assert_true(uv == u64);
    assert_int_equal(vks_gguf_get_i64(g, "k.u64", &v), VKS_ERR_FORMAT);
    assert_int_equal(vks_gguf_get_i64(g, "k.i64", &v), VKS_OK); assert_true(v == i64);
    float f;
    double d;
    bool b;
    assert_int_equal(vks_gguf_get_f32(g, "k.f32", &f), VKS_OK); assert_true(f == 0.1f);
    assert_int_equal(vks_gguf_get_f64(g, "k.f64", &d), VKS_OK); assert_true(d == f64);
    assert_int_equal(vks_gguf_get_bool(g, "k.bool", &b), VKS_OK); assert_true(b);
    assert_int_equal(vks_gguf_get_f32(g, "k.bool", &f), VKS_ERR_FORMAT);
    const char *s;
    size_t len;
    assert_int_equal(vks_gguf_get_str(g, "k.str", &s, &len), VKS_OK);
    assert_int_equal(len, 3);
    assert_memory_equal(s, "a\0b", 4);
    assert_int_equal(vks_gguf_get_str(g, "missing", &s, &len), VKS_ERR_ARG);
    vks_gguf_type et;
    uint64_t n;
    assert_int_equal(vks_gguf_get_arr_info(g, "a.str", &et, &n), VKS_OK);
    assert_int_equal(et, VKS_GGUF_STRING);
    assert_int_equal(n, 3);
    for (uint64_t i = 0; i < 3; i++) {
        assert_int_equal(vks_gguf_get_arr_str(g, "a.str", i, &s, &len), VKS_OK);
        assert_string_equal(s, strs[i]);
    }
    assert_int_equal(vks_gguf_get_arr_str(g, "a.str", 3, &s, &len), VKS_ERR_ARG);
    float fo[3];
    int32_t io[4];
    assert_int_equal(vks_gguf_get_arr_f32(g, "a.f32", fo, 3), VKS_OK);
    assert_memory_equal(fo, fa, sizeof fa);
    assert_int_equal(vks_gguf_get_arr_i32(g, "a.i32", io, 4), VKS_OK);
    assert_memory_equal(io, ia, sizeof ia);
    assert_int_equal(vks_gguf_get_arr_i32(g, "a.f32", io, 3), VKS_ERR_FORMAT);
    assert_int_equal(vks_gguf_get_arr_i32(g, "a.i32", io, 3), VKS_ERR_ARG); /* wrong length */
    assert_int_equal(vks_gguf_get_arr_i32(g, "a.i16", io, 2), VKS_OK);
    assert_int_equal(io[0], -5);
    assert_int_equal(vks_gguf_get_arr_info(g, "a.bool", &et, &n), VKS_OK);
    assert_int_equal(et, VKS_GGUF_BOOL);
    assert_int_equal(vks_gguf_get_arr_info(g, "a.empty", &et, &n), VKS_OK);
    assert_int_equal(n, 0);
    vks_gguf_close(g);
    free(path);
}

static void check_vocab(const char *file, int64_t n_kv, const char *model, uint64_t n_tokens) {
    char rel[128];
    snprintf(rel, sizeof rel, "llamacpp-vocab/%s", file);
    char *path = shared_file(rel);
    if (!path) return;
    vks_gguf *g;
    if (vks_gguf_open(path, &g) != VKS_OK) fail_msg("%s", vks_last_error());
    assert_int_equal(vks_gguf_version(g), 3);
    assert_int_equal(vks_gguf_n_kv(g), n_kv);
    assert_int_equal(vks_gguf_n_tensors(g), 0);
    const char *s;
    assert_int_equal(vks_gguf_get_str(g, "tokenizer.ggml.model", &s, NULL), VKS_OK);
    assert_string_equal(s, model);
    uint64_t n;
    vks_gguf_type et;
    assert_int_equal(vks_gguf_get_arr_info(g, "tokenizer.ggml.tokens", &et, &n), VKS_OK);
    assert_int_equal(n, n_tokens);
    int32_t *types = malloc(n * sizeof *types);
    assert_int_equal(vks_gguf_get_arr_i32(g, "tokenizer.ggml.token_type", types, n), VKS_OK);
    free(types);
    vks_gguf_close(g);
    free(path);
}

static void test_gguf_real_vocab_files(void **state) {
    (void)state;
    check_vocab("ggml-vocab-llama-spm.gguf", 22, "llama", 32000);
    check_vocab("ggml-vocab-phi-3.gguf", 26, "llama", 32064);
    check_vocab("ggml-vocab-gpt-2.gguf", 16, "gpt2", 50257);
    char *path = shared_file("llamacpp-vocab/ggml-vocab-llama-spm.gguf");
    if (!path) return;
    vks_gguf *g;
    assert_int_equal(vks_gguf_open(path, &g), VKS_OK);
    float eps, score;
    assert_int_equal(vks_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &eps), VKS_OK);
    assert_true(eps == 1e-5f);
    float *scores = malloc(32000 * sizeof(float));
    assert_int_equal(vks_gguf_get_arr_f32(g, "tokenizer.ggml.scores", scores, 32000), VKS_OK);
    score = scores[300];
    assert_true(isfinite(score) && score < 0);
    free(scores);
    const char *s;
    assert_int_equal(vks_gguf_get_arr_str(g, "tokenizer.ggml.tokens", 1, &s, NULL), VKS_OK);
    assert_string_equal(s, "<s>");
    vks_gguf_close(g);
    /* A vocab-only file is not a model: one line naming the file and the problem. */
    vks_model *m = NULL;
    assert_int_equal(vks_model_load(path, &m), VKS_ERR_FORMAT);
    assert_non_null(strstr(vks_last_error(), path));
    assert_non_null(strstr(vks_last_error(), "token_embd.weight"));
    free(path);
}

/* ---- one model, every format, same logits ---- */

static void test_stories_gguf_safetensors_logits(void **state) {
    (void)state;
    char *bin = shared_file("stories260K/stories260K.bin");
    if (!bin) return;
    vks_model *orig, *g, *h, *back;
    assert_int_equal(vks_model_load(bin, &orig), VKS_OK);
    const char *dir = tu_tmpdir();
    char *gguf = path_in(dir, "s.gguf"), *hf = path_in(dir, "hf"), *bin2 = path_in(dir, "back.bin");
    assert_int_equal(vks_model_save_gguf(orig, gguf, NULL), VKS_OK);
    assert_int_equal(vks_model_load(gguf, &g), VKS_OK);
    assert_non_null(vks_model_gguf(g));
    assert_int_equal(g->cfg.rope_mode, VKS_ROPE_ADJACENT);
    assert_int_equal(vks_model_save_safetensors(g, hf, NULL), VKS_OK);
    assert_int_equal(vks_model_load(hf, &h), VKS_OK);
    assert_int_equal(h->cfg.rope_mode, VKS_ROPE_HALF);
    assert_string_equal(vks_model_dir(h), hf);
    assert_null(vks_model_dir(g));
    assert_true(h->cfg.shared_classifier);
    assert_true(h->cfg.norm_eps == orig->cfg.norm_eps);
    /* HF q rows are permuted: HF row j*half+i is adjacent row 2i+j (head 1, i=1, j=1). */
    int hd = orig->cfg.head_dim, row_hf = hd + hd / 2 + 1, row_adj = hd + 2 + 1;
    assert_memory_equal((const float *)h->layers[2].wq.data + row_hf * 64,
                        (const float *)orig->layers[2].wq.data + row_adj * 64, 64 * sizeof(float));
    float *lo = logits_of(orig), *lg = logits_of(g), *lh = logits_of(h);
    size_t n = (size_t)N_IDS * 512;
    assert_true(max_abs_diff(lg, lo, n) == 0.0);
    double dh = max_abs_diff(lh, lo, n);
    print_message("stories260K -> gguf -> safetensors: max |logit diff| %.3g\n", dh);
    assert_true(dh <= 1e-6);
    /* and back to llama2.c: the same body bytes (the unused freq_cis tables are zeros) */
    assert_int_equal(vks_model_save_llama2c(h, bin2), VKS_OK);
    assert_int_equal(vks_model_load(bin2, &back), VKS_OK);
    float *lb = logits_of(back);
    assert_true(max_abs_diff(lb, lo, n) == 0.0);
    assert_memory_equal(back->layers[4].wk.data, orig->layers[4].wk.data, 32 * 64 * sizeof(float));
    free(lo); free(lg); free(lh); free(lb);
    vks_model_free(orig); vks_model_free(g); vks_model_free(h); vks_model_free(back);
    free(gguf); free(hf); free(bin2); free(bin);
}

/* ---- the built-in tiny model's checkpoints (issue 11) ---- */

/* got == want element for element; q/k matrices (head_dim > 0) of a GGUF
 * (adjacent RoPE pairs) against the tiny model's half-split rows: GGUF row
 * 2i+j of a head is row j*half+i. */
static void assert_same_f32(const vks_tensor *got, const vks_tensor *want, int head_dim, const char *name) {
    assert_int_equal(got->dtype, VKS_DTYPE_F32);
    assert_int_equal(got->rows, want->rows);
    assert_int_equal(got->cols, want->cols);
    for (int64_t r = 0; r < got->rows; r++) {
        int64_t k = head_dim ? r % head_dim : 0, src = head_dim ? r - k + (k % 2) * (head_dim / 2) + k / 2 : r;
        const float *g = (const float *)got->data + r * got->cols, *w = (const float *)want->data + src * want->cols;
        if (memcmp(g, w, (size_t)got->cols * sizeof(float))) fail_msg("%s: row %lld differs", name, (long long)r);
    }
}

static void assert_same_tiny_weights(const vks_model *got, const vks_model *want) {
    int hd = got->cfg.rope_mode == want->cfg.rope_mode ? 0 : want->cfg.head_dim;
    assert_same_f32(&got->tok_emb, &want->tok_emb, 0, "tok_emb");
    assert_same_f32(&got->final_norm, &want->final_norm, 0, "final_norm");
    assert_true(got->cfg.shared_classifier);
    for (int l = 0; l < want->cfg.n_layers; l++) {
        const vks_layer_weights *g = &got->layers[l], *w = &want->layers[l];
        assert_same_f32(&g->attn_norm, &w->attn_norm, 0, "attn_norm");
        assert_same_f32(&g->wq, &w->wq, hd, "wq");
        assert_same_f32(&g->wk, &w->wk, hd, "wk");
        assert_same_f32(&g->wv, &w->wv, 0, "wv");
        assert_same_f32(&g->wo, &w->wo, 0, "wo");
        assert_same_f32(&g->ffn_norm, &w->ffn_norm, 0, "ffn_norm");
        assert_same_f32(&g->w1, &w->w1, 0, "w1");
        assert_same_f32(&g->w2, &w->w2, 0, "w2");
        assert_same_f32(&g->w3, &w->w3, 0, "w3");
    }
}

/* The checkpoint's own tokenizer is the byte-level one: one id per byte. */
static void assert_byte_level_tokenizer(const vks_model *m) {
    vks_tokenizer *t = NULL;
    int rc = vks_tokenizer_load_auto(NULL, m, &t);
    if (rc) fail_msg("%s: %s", m->path, vks_last_error());
    assert_string_equal(vks_tokenizer_kind(t), "bpe");
    assert_int_equal(vks_tokenizer_vocab_size(t), 259);
    assert_int_equal(vks_tokenizer_bos(t), 256);
    assert_int_equal(vks_tokenizer_eos(t), 257);
    assert_int_equal(vks_tokenizer_pad(t), 258);
    assert_true(vks_tokenizer_wants_bos(t));
    static const char text[] = "x\xff\x01 \xc3(<|eos|>";
    vks_tokenize_options o = {.add_bos = true};
    int32_t *ids = NULL;
    int n = 0;
    assert_int_equal(vks_tokenizer_tokenize(t, text, sizeof text - 1, &o, &ids, &n), VKS_OK);
    assert_int_equal(n, (int)sizeof text);
    assert_int_equal(ids[0], 256);
    for (size_t i = 0; i + 1 < sizeof text; i++) assert_int_equal(ids[i + 1], (unsigned char)text[i]);
    char *back = NULL;
    size_t len = 0;
    assert_int_equal(vks_tokenizer_detokenize(t, ids, n, true, &back, &len), VKS_OK);
    assert_int_equal(len, 7 + sizeof text - 1);
    assert_memory_equal(back, "<|bos|>", 7);
    assert_memory_equal(back + 7, text, sizeof text - 1);
    free(back);
    free(ids);
    vks_tokenizer_free(t);
}

static void test_tiny_model_checkpoints(void **state) {
    (void)state;
    vks_model *m = NULL;
    vks_tokenizer *tok = NULL;
    assert_int_equal(vks_model_init_tiny(5, &m, &tok), VKS_OK);
    const char *dir = tu_tmpdir();
    char *gguf = path_in(dir, "tiny.gguf"), *hf = path_in(dir, "tiny-hf");
    vks_model_save_options o = {.dtype = VKS_DTYPE_F32, .tokenizer = tok};
    assert_int_equal(vks_model_save_gguf(m, gguf, &o), VKS_OK);
    assert_int_equal(vks_model_save_safetensors(m, hf, &o), VKS_OK);
    const char *paths[2] = {gguf, hf};
    const int32_t ids[6] = {256, 'H', 'i', 0xff, 10, 257};
    float *want = malloc(6 * 259 * sizeof(float)), *got = malloc(6 * 259 * sizeof(float));
    assert_int_equal(vks_ref_forward(m, ids, 6, want, NULL), VKS_OK);
    for (int i = 0; i < 2; i++) {
        vks_model *back = NULL;
        int rc = vks_model_load(paths[i], &back);
        if (rc) fail_msg("%s: %s", paths[i], vks_last_error());
        const vks_model_config *a = &back->cfg, *b = &m->cfg;
        int x[9] = {a->dim, a->hidden_dim, a->n_layers, a->n_heads, a->n_kv_heads, a->vocab_size, a->seq_len, a->head_dim, a->kv_dim};
        int y[9] = {b->dim, b->hidden_dim, b->n_layers, b->n_heads, b->n_kv_heads, b->vocab_size, b->seq_len, b->head_dim, b->kv_dim};
        assert_memory_equal(x, y, sizeof x);
        assert_true(a->norm_eps == b->norm_eps && a->rope_theta == b->rope_theta);
        assert_int_equal(a->rope_mode, i == 0 ? VKS_ROPE_ADJACENT : VKS_ROPE_HALF);
        assert_int_equal(back->bos_id, 256);
        assert_int_equal(back->eos_id, 257);
        assert_same_tiny_weights(back, m);
        assert_byte_level_tokenizer(back);
        assert_int_equal(vks_ref_forward(back, ids, 6, got, NULL), VKS_OK);
        double d = max_abs_diff(got, want, 6 * 259);
        print_message("tiny -> %s: max |logit diff| %.3g\n", i == 0 ? "gguf" : "safetensors", d);
        assert_true(d <= 1e-6);
        vks_model_free(back);
    }
    free(want);
    free(got);
    vks_tokenizer_free(tok);
    vks_model_free(m);
    free(gguf);
    free(hf);
}

/* Quantized GGUF: loads with block dtypes in place; logits near the original. */
static void test_quantized_gguf_model(void **state) {
    (void)state;
    vks_model *m = small_random(256, 5);
    m->bos_id = 1;
    m->eos_id = 2;
    char *path = path_in(tu_tmpdir(), "q.gguf");
    const vks_dtype types[] = {VKS_DTYPE_Q8_0, VKS_DTYPE_Q4_0, VKS_DTYPE_F16, VKS_DTYPE_BF16};
    for (size_t i = 0; i < 4; i++) {
        vks_model_save_options o = {.dtype = types[i]};
        assert_int_equal(vks_model_save_gguf(m, path, &o), VKS_OK);
        vks_model *q;
        if (vks_model_load(path, &q) != VKS_OK) fail_msg("%s", vks_last_error());
        assert_int_equal(q->layers[1].w2.dtype, types[i]);
        assert_int_equal(q->final_norm.dtype, VKS_DTYPE_F32);
        assert_int_equal(q->bos_id, 1);
        assert_int_equal(q->eos_id, 2);
        /* dequantized rows match a direct quantize/dequantize of the original */
        float want[96], got[96];
        uint8_t enc[400];
        assert_int_equal(vks_quantize(types[i], (const float *)m->layers[1].w1.data + 5 * 64, enc, 64), VKS_OK);
        vks_dequantize(types[i], enc, want, 64);
        uint64_t rb;
        assert_true(vks_dtype_row_bytes(types[i], 64, &rb));
        vks_dequantize(types[i], (const uint8_t *)q->layers[1].w1.data + 5 * rb, got, 64);
        assert_memory_equal(got, want, 64 * sizeof(float));
        /* round trip through an f32 llama2.c file dequantizes */
        char *bin = path_in(tu_tmpdir(), "q.bin");
        assert_int_equal(vks_model_save_llama2c(q, bin), VKS_OK);
        vks_model *b;
        assert_int_equal(vks_model_load(bin, &b), VKS_OK);
        assert_int_equal(b->layers[1].w1.dtype, VKS_DTYPE_F32);
        assert_memory_equal((const float *)b->layers[1].w1.data + 5 * 64, want, 64 * sizeof(float));
        vks_model_free(b);
        vks_model_free(q);
        free(bin);
    }
    vks_model_free(m);
    free(path);
}

/* Qwen2: biases survive both formats; GGUF qwen2 keeps HF's half-split order. */
static void test_qwen2_biases(void **state) {
    (void)state;
    vks_model *m = small_random(512, 9);
    snprintf(m->arch, sizeof m->arch, "qwen2");
    m->cfg.rope_mode = VKS_ROPE_HALF;
    int L = m->cfg.n_layers, per = m->cfg.dim + 2 * m->cfg.kv_dim;
    float *bias = malloc((size_t)(L * per) * sizeof(float));
    tu_fill_uniform(bias, (size_t)(L * per), 3, -0.5f, 0.5f);
    for (int l = 0; l < L; l++) {
        float *p = bias + l * per;
        m->layers[l].bq = (vks_tensor){VKS_DTYPE_F32, 1, m->cfg.dim, p};
        m->layers[l].bk = (vks_tensor){VKS_DTYPE_F32, 1, m->cfg.kv_dim, p + m->cfg.dim};
        m->layers[l].bv = (vks_tensor){VKS_DTYPE_F32, 1, m->cfg.kv_dim, p + m->cfg.dim + m->cfg.kv_dim};
    }
    const char *dir = tu_tmpdir();
    char *gguf = path_in(dir, "qw.gguf"), *hf = path_in(dir, "qw");
    assert_int_equal(vks_model_save_gguf(m, gguf, NULL), VKS_OK);
    assert_int_equal(vks_model_save_safetensors(m, hf, NULL), VKS_OK);
    vks_model *g, *h;
    if (vks_model_load(gguf, &g) != VKS_OK) fail_msg("%s", vks_last_error());
    if (vks_model_load(hf, &h) != VKS_OK) fail_msg("%s", vks_last_error());
    vks_model *all[] = {g, h};
    for (int i = 0; i < 2; i++) {
        assert_string_equal(all[i]->arch, "qwen2");
        assert_int_equal(all[i]->cfg.rope_mode, VKS_ROPE_HALF);
        for (int l = 0; l < L; l++) {
            assert_memory_equal(all[i]->layers[l].bq.data, m->layers[l].bq.data, (size_t)m->cfg.dim * 4);
            assert_memory_equal(all[i]->layers[l].bk.data, m->layers[l].bk.data, (size_t)m->cfg.kv_dim * 4);
            assert_memory_equal(all[i]->layers[l].bv.data, m->layers[l].bv.data, (size_t)m->cfg.kv_dim * 4);
            assert_memory_equal(all[i]->layers[l].wq.data, m->layers[l].wq.data, 64 * 64 * 4);
        }
    }
    /* same logits from the in-memory model and both files (the biases are used) */
    float *lm = logits_of(m), *lg = logits_of(g), *lh = logits_of(h);
    size_t nl = (size_t)N_IDS * 512;
    assert_true(max_abs_diff(lg, lm, nl) == 0.0);
    assert_true(max_abs_diff(lh, lm, nl) == 0.0);
    m->layers[0].bq.data = NULL, m->layers[0].bk.data = NULL, m->layers[0].bv.data = NULL;
    m->layers[1].bq.data = NULL, m->layers[1].bk.data = NULL, m->layers[1].bv.data = NULL;
    float *ln = logits_of(m); /* without biases the logits change: they were applied */
    assert_true(max_abs_diff(ln, lm, nl) > 1e-3);
    free(lm); free(lg); free(lh); free(ln);
    /* llama2.c cannot hold biases */
    char *bin = path_in(dir, "qw.bin");
    assert_int_equal(vks_model_save_llama2c(g, bin), VKS_ERR_ARG);
    vks_model_free(g); vks_model_free(h); vks_model_free(m);
    free(bias); free(gguf); free(hf); free(bin);
}

/* An explicit head_dim (32 with 4 heads on dim 64: q is 128 wide) goes
 * through GGUF (attention.key_length/value_length) and config.json
 * ("head_dim") for llama (q/k rows permuted), qwen2 and qwen3 (q_norm and
 * k_norm as attn_q_norm/self_attn.q_norm); llama2.c refuses it. */
static void test_head_dim_formats(void **state) {
    (void)state;
    vks_model_config c = {.dim = 64, .hidden_dim = 96, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .head_dim = 32,
                          .vocab_size = 512, .seq_len = 32};
    const char *archs[] = {"llama", "qwen2", "qwen3"};
    const char *dir = tu_tmpdir();
    for (int a = 0; a < 3; a++) {
        vks_model *m = NULL;
        c.rope_mode = a ? VKS_ROPE_HALF : VKS_ROPE_ADJACENT;
        c.qk_norm = a == 2;
        assert_int_equal(vks_model_random(&c, 21, &m), VKS_OK);
        snprintf(m->arch, sizeof m->arch, "%s", archs[a]);
        char hf_name[32];
        snprintf(hf_name, sizeof hf_name, "hd-%s", archs[a]);
        char *gguf = path_in(dir, "hd.gguf"), *hf = path_in(dir, hf_name), *bin = path_in(dir, "hd.bin");
        assert_int_equal(vks_model_save_gguf(m, gguf, NULL), VKS_OK);
        assert_int_equal(vks_model_save_safetensors(m, hf, NULL), VKS_OK);
        assert_int_equal(vks_model_save_llama2c(m, bin), VKS_ERR_ARG);
        assert_non_null(strstr(vks_last_error(), a == 2 ? "cannot hold q/k norms" : "head_dim 32"));
        vks_model *g, *h;
        if (vks_model_load(gguf, &g) != VKS_OK) fail_msg("%s", vks_last_error());
        if (vks_model_load(hf, &h) != VKS_OK) fail_msg("%s", vks_last_error());
        float *lm = logits_of(m), *lg = logits_of(g), *lh = logits_of(h);
        size_t nl = (size_t)N_IDS * 512;
        assert_int_equal(g->cfg.head_dim, 32);
        assert_int_equal(h->cfg.head_dim, 32);
        assert_int_equal(g->layers[0].wq.rows, 128);
        assert_string_equal(g->arch, archs[a]);
        assert_string_equal(h->arch, archs[a]);
        assert_true(g->cfg.qk_norm == (a == 2) && h->cfg.qk_norm == (a == 2));
        if (a == 2) assert_memory_equal(g->layers[1].k_norm.data, m->layers[1].k_norm.data, 32 * 4);
        assert_true(max_abs_diff(lg, lm, nl) < 1e-5);
        assert_true(max_abs_diff(lh, lm, nl) < 1e-5);
        free(lm); free(lg); free(lh);
        vks_model_free(g); vks_model_free(h); vks_model_free(m);
        free(gguf); free(hf); free(bin);
    }
}

/* Llama 3.1's RoPE scaling, transcribed from transformers'
 * _compute_llama3_parameters (modeling_rope_utils.py) as published. */
static double llama3_formula(double base, int dim, int i, double factor, double low, double high, double orig) {
    double inv_freq = 1.0 / pow(base, (double)(2 * i) / dim);
    double low_freq_wavelen = orig / low, high_freq_wavelen = orig / high;
    double wavelen = 2 * M_PI / inv_freq;
    double inv_freq_llama = wavelen > low_freq_wavelen ? inv_freq / factor : inv_freq;
    double smooth_factor = (orig / wavelen - low) / (high - low);
    double smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama;
    bool is_medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    return is_medium ? smoothed : inv_freq_llama;
}

/* vks_rope_freqs with llama3 scaling equals the formula at every dimension
 * (Llama 3.1 8B's numbers: all three bands occur), and a Llama 3 model goes
 * through config.json (rope_scaling) and GGUF (rope_freqs) unchanged. */
static void test_llama3_rope(void **state) {
    (void)state;
    vks_model_config c = {.head_dim = 128, .rope_theta = 500000.0f,
                          .rope_scaling = {VKS_ROPE_SCALING_LLAMA3, 8.0f, 1.0f, 4.0f, 8192}};
    double f[64];
    vks_rope_freqs(&c, f);
    int scaled = 0, kept = 0;
    for (int i = 0; i < 64; i++) {
        double want = llama3_formula(500000.0, 128, i, 8, 1, 4, 8192), plain = 1.0 / pow(500000.0, (double)(2 * i) / 128);
        if (fabs(f[i] - want) > 1e-14 * want) fail_msg("pair %d: %.17g, the formula gives %.17g", i, f[i], want);
        scaled += fabs(want - plain / 8) <= 1e-14 * want;
        kept += fabs(want - plain) <= 1e-14 * want;
    }
    assert_true(scaled > 0 && kept > 0 && scaled + kept < 64); /* low, high and the band between */
    vks_model_config m_cfg = {.dim = 64, .hidden_dim = 96, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                              .vocab_size = 512, .seq_len = 64, .rope_theta = 500000.0f,
                              .rope_scaling = {VKS_ROPE_SCALING_LLAMA3, 32.0f, 1.0f, 4.0f, 16}};
    vks_model *m;
    assert_int_equal(vks_model_random(&m_cfg, 31, &m), VKS_OK);
    const char *dir = tu_tmpdir();
    char *gguf = path_in(dir, "l3.gguf"), *hf = path_in(dir, "l3");
    assert_int_equal(vks_model_save_gguf(m, gguf, NULL), VKS_OK);
    assert_int_equal(vks_model_save_safetensors(m, hf, NULL), VKS_OK);
    vks_model *g, *h;
    if (vks_model_load(gguf, &g) != VKS_OK) fail_msg("%s", vks_last_error());
    if (vks_model_load(hf, &h) != VKS_OK) fail_msg("%s", vks_last_error());
    assert_non_null(vks_gguf_find_tensor(vks_model_gguf(g), "rope_freqs.weight"));
    const vks_model *all[] = {g, h};
    for (int i = 0; i < 2; i++) {
        const vks_rope_scaling *s = &all[i]->cfg.rope_scaling;
        assert_true(s->type == VKS_ROPE_SCALING_LLAMA3 && s->factor == 32.0f && s->low_freq_factor == 1.0f &&
                    s->high_freq_factor == 4.0f && s->original_context == 16);
    }
    float *lm = logits_of(m), *lg = logits_of(g), *lh = logits_of(h);
    size_t nl = (size_t)N_IDS * 512;
    assert_true(max_abs_diff(lg, lm, nl) < 1e-5 && max_abs_diff(lh, lm, nl) < 1e-5);
    m->cfg.rope_scaling.type = VKS_ROPE_SCALING_NONE;
    float *ln = logits_of(m); /* the scaling is applied: without it the logits differ */
    assert_true(max_abs_diff(ln, lm, nl) > 1e-4);
    free(lm); free(lg); free(lh); free(ln);
    vks_model_free(g); vks_model_free(h); vks_model_free(m);
    free(gguf); free(hf);
}

/* A llama2.c tokenizer embedded in GGUF equals llama.cpp's own vocab file. */
static void test_embedded_tokenizer_matches_llama_cpp(void **state) {
    (void)state;
    char *tok = shared_file("llamacpp-vocab/llama2c-tokenizer.bin");
    char *ref = shared_file("llamacpp-vocab/ggml-vocab-llama-spm.gguf");
    if (!tok || !ref) { free(tok); free(ref); return; }
    vks_model_config c = {.dim = 8, .hidden_dim = 8, .n_layers = 1, .n_heads = 1, .n_kv_heads = 1,
                          .vocab_size = 32000, .seq_len = 8};
    vks_model *m;
    assert_int_equal(vks_model_random(&c, 1, &m), VKS_OK);
    char *path = path_in(tu_tmpdir(), "tok.gguf");
    vks_model_save_options o = {.dtype = VKS_DTYPE_F32, .tokenizer_path = tok};
    assert_int_equal(vks_model_save_gguf(m, path, &o), VKS_OK);
    vks_gguf *a, *b;
    assert_int_equal(vks_gguf_open(path, &a), VKS_OK);
    assert_int_equal(vks_gguf_open(ref, &b), VKS_OK);
    float *sa = malloc(32000 * 4), *sb = malloc(32000 * 4);
    int32_t *ta = malloc(32000 * 4), *tb = malloc(32000 * 4);
    assert_int_equal(vks_gguf_get_arr_f32(a, "tokenizer.ggml.scores", sa, 32000), VKS_OK);
    assert_int_equal(vks_gguf_get_arr_f32(b, "tokenizer.ggml.scores", sb, 32000), VKS_OK);
    assert_memory_equal(sa, sb, 32000 * 4);
    assert_int_equal(vks_gguf_get_arr_i32(a, "tokenizer.ggml.token_type", ta, 32000), VKS_OK);
    assert_int_equal(vks_gguf_get_arr_i32(b, "tokenizer.ggml.token_type", tb, 32000), VKS_OK);
    assert_memory_equal(ta, tb, 32000 * 4);
    for (uint64_t i = 0; i < 32000; i++) {
        const char *x, *y;
        size_t lx, ly;
        assert_int_equal(vks_gguf_get_arr_str(a, "tokenizer.ggml.tokens", i, &x, &lx), VKS_OK);
        assert_int_equal(vks_gguf_get_arr_str(b, "tokenizer.ggml.tokens", i, &y, &ly), VKS_OK);
        if (lx != ly || memcmp(x, y, lx) != 0) fail_msg("token %llu: '%s' vs '%s'", (unsigned long long)i, x, y);
    }
    const char *model;
    assert_int_equal(vks_gguf_get_str(a, "tokenizer.ggml.model", &model, NULL), VKS_OK);
    assert_string_equal(model, "llama");
    uint32_t bos, eos;
    assert_int_equal(vks_gguf_get_u32(a, "tokenizer.ggml.bos_token_id", &bos), VKS_OK);
    assert_int_equal(vks_gguf_get_u32(a, "tokenizer.ggml.eos_token_id", &eos), VKS_OK);
    assert_int_equal(bos, 1);
    assert_int_equal(eos, 2);
    vks_gguf_close(a);
    vks_gguf_close(b);
    /* GGUF -> GGUF copies the tokenizer metadata */
    vks_model *g;
    char *path2 = path_in(tu_tmpdir(), "tok2.gguf");
    assert_int_equal(vks_model_load(path, &g), VKS_OK);
    assert_int_equal(vks_model_save_gguf(g, path2, NULL), VKS_OK);
    assert_int_equal(vks_gguf_open(path2, &a), VKS_OK);
    assert_int_equal(vks_gguf_get_arr_f32(a, "tokenizer.ggml.scores", sa, 32000), VKS_OK);
    assert_memory_equal(sa, sb, 32000 * 4);
    vks_gguf_close(a);
    vks_model_free(g);
    vks_model_free(m);
    free(sa); free(sb); free(ta); free(tb); free(path); free(path2); free(tok); free(ref);
}

/* ---- sharded safetensors, detection by content ---- */

static void test_sharded_safetensors_and_detection(void **state) {
    (void)state;
    vks_model *m = small_random(512, 11);
    const char *dir = tu_tmpdir();
    char *hf = path_in(dir, "one");
    assert_int_equal(vks_model_save_safetensors(m, hf, NULL), VKS_OK);
    /* Split model.safetensors into two shards with an index. */
    char *single = path_in(hf, "model.safetensors");
    vks_st_file *f;
    assert_int_equal(vks_st_open(single, &f), VKS_OK);
    int64_t n = vks_st_n_tensors(f);
    vks_st_write_tensor *wt = calloc((size_t)n, sizeof *wt);
    char *index = malloc(1 << 16);
    int len = sprintf(index, "{\"metadata\": {}, \"weight_map\": {");
    for (int64_t i = 0; i < n; i++) {
        const vks_st_tensor *t = vks_st_tensor_at(f, i);
        wt[i] = (vks_st_write_tensor){.name = t->name, .dtype = t->dtype, .n_dims = t->n_dims, .data = t->data};
        memcpy(wt[i].shape, t->shape, sizeof t->shape);
        len += sprintf(index + len, "%s\"%s\": \"model-0000%d-of-00002.safetensors\"", i ? ", " : "", t->name,
                       i < n / 2 ? 1 : 2);
    }
    sprintf(index + len, "}}");
    char *shard_dir = path_in(dir, "sharded");
    assert_int_equal(mkdir(shard_dir, 0777), 0);
    char *p1 = path_in(shard_dir, "model-00001-of-00002.safetensors");
    char *p2 = path_in(shard_dir, "model-00002-of-00002.safetensors");
    char *pi = path_in(shard_dir, "model.safetensors.index.json");
    char *pc = path_in(shard_dir, "config.json"), *pc0 = path_in(hf, "config.json");
    assert_int_equal(vks_st_write(p1, wt, (size_t)(n / 2)), VKS_OK);
    assert_int_equal(vks_st_write(p2, wt + n / 2, (size_t)(n - n / 2)), VKS_OK);
    write_file(pi, index, strlen(index));
    size_t clen;
    unsigned char *cfg = tu_read_file(pc0, &clen);
    write_file(pc, cfg, clen);
    vks_model *a, *b, *c;
    if (vks_model_load(hf, &a) != VKS_OK) fail_msg("%s", vks_last_error());
    if (vks_model_load(shard_dir, &b) != VKS_OK) fail_msg("%s", vks_last_error());
    if (vks_model_load(single, &c) != VKS_OK) fail_msg("%s", vks_last_error()); /* the file, config beside it */
    float *la = logits_of(a), *lb = logits_of(b), *lc = logits_of(c);
    size_t nl = (size_t)N_IDS * 512;
    assert_true(max_abs_diff(la, lb, nl) == 0.0);
    assert_true(max_abs_diff(la, lc, nl) == 0.0);
    /* A shard name that escapes the directory is refused. */
    char *evil = strdup(index);
    char *at = strstr(evil, "model-00002-of-00002");
    memcpy(at, "../00002-of-00002.ss", 20);
    write_file(pi, evil, strlen(evil));
    vks_model *d = NULL;
    assert_int_equal(vks_model_load(shard_dir, &d), VKS_ERR_FORMAT);
    assert_non_null(strstr(vks_last_error(), "shard"));
    /* Detection is by content: a GGUF named .bin and a llama2.c file named .gguf */
    char *g_as_bin = path_in(dir, "model.bin"), *l_as_gguf = path_in(dir, "model.gguf");
    assert_int_equal(vks_model_save_gguf(m, g_as_bin, NULL), VKS_OK);
    assert_int_equal(vks_model_save_llama2c(m, l_as_gguf), VKS_OK);
    vks_model *e, *f2;
    assert_int_equal(vks_model_load(g_as_bin, &e), VKS_OK);
    assert_non_null(vks_model_gguf(e));
    assert_int_equal(vks_model_load(l_as_gguf, &f2), VKS_OK);
    assert_null(vks_model_gguf(f2));
    float *le = logits_of(e), *lf = logits_of(f2);
    assert_true(max_abs_diff(le, lf, nl) == 0.0);
    assert_true(max_abs_diff(le, la, nl) <= 1e-6);
    free(la); free(lb); free(lc); free(le); free(lf);
    vks_model_free(a); vks_model_free(b); vks_model_free(c); vks_model_free(e); vks_model_free(f2);
    vks_model_free(m);
    vks_st_close(f);
    free(wt); free(index); free(evil); free(cfg);
    free(hf); free(single); free(shard_dir); free(p1); free(p2); free(pi); free(pc); free(pc0);
    free(g_as_bin); free(l_as_gguf);
}

/* ---- hostile files ---- */

/* A small valid GGUF in memory (metadata of several types, two tensors). */
static unsigned char *small_gguf(size_t *len, size_t *data_end) {
    vks_gguf_writer *w;
    assert_int_equal(vks_gguf_writer_create(&w), VKS_OK);
    const char *strs[] = {"a", "bb", "ccc"};
    float fa[2] = {1, 2};
    static float t1[64], t2[32];
    assert_int_equal(vks_gguf_add_str(w, "general.architecture", "llama"), VKS_OK);
    assert_int_equal(vks_gguf_add_u32(w, "x.u32", 7), VKS_OK);
    assert_int_equal(vks_gguf_add_bool(w, "x.bool", false), VKS_OK);
    assert_int_equal(vks_gguf_add_arr_str(w, "x.strs", strs, 3), VKS_OK);
    assert_int_equal(vks_gguf_add_arr(w, "x.f32s", VKS_GGUF_FLOAT32, fa, 2), VKS_OK);
    int64_t ne1[2] = {32, 2}, ne2[1] = {32};
    uint8_t *q = malloc(68);
    assert_int_equal(vks_quantize(VKS_DTYPE_Q8_0, t1, q, 64), VKS_OK);
    assert_int_equal(vks_gguf_add_tensor_owned(w, "t.q8", VKS_DTYPE_Q8_0, 2, ne1, q), VKS_OK);
    assert_int_equal(vks_gguf_add_tensor(w, "t.f32", VKS_DTYPE_F32, 1, ne2, t2), VKS_OK);
    char *path = path_in(tu_tmpdir(), "small.gguf");
    assert_int_equal(vks_gguf_writer_save(w, path), VKS_OK);
    vks_gguf_writer_free(w);
    unsigned char *b = tu_read_file(path, len);
    vks_gguf *g;
    assert_int_equal(vks_gguf_open_memory(b, *len, "small", &g), VKS_OK);
    *data_end = vks_gguf_data_offset(g) + vks_gguf_find_tensor(g, "t.f32")->offset + 128;
    vks_gguf_close(g);
    free(path);
    return b;
}

static int open_bytes(const unsigned char *b, size_t len) {
    vks_gguf *g = NULL;
    int rc = vks_gguf_open_memory(b, len, "mutant", &g);
    if (rc == VKS_OK) { /* whatever opened must be safe to walk */
        for (int64_t i = 0; i < vks_gguf_n_kv(g); i++) (void)strlen(vks_gguf_key(g, i));
        for (int64_t i = 0; i < vks_gguf_n_tensors(g); i++) {
            const vks_gguf_tensor *t = vks_gguf_tensor_at(g, i);
            volatile uint8_t sink = 0;
            for (uint64_t k = 0; k < t->size; k++) sink ^= ((const uint8_t *)t->data)[k];
            (void)sink;
        }
        vks_gguf_close(g);
    } else {
        assert_non_null(strstr(vks_last_error(), "mutant"));
        assert_null(strchr(vks_last_error(), '\n'));
    }
    return rc;
}

static void set_u64(unsigned char *b, size_t off, uint64_t v) { memcpy(b + off, &v, 8); }

static void test_gguf_hostile(void **state) {
    (void)state;
    size_t len, data_end;
    unsigned char *good = small_gguf(&len, &data_end);
    assert_int_equal(open_bytes(good, len), VKS_OK);
    for (size_t cut = 0; cut < data_end; cut++) assert_int_not_equal(open_bytes(good, cut), VKS_OK);
    unsigned char *b = malloc(len);
    uint64_t s = 12345;
    for (int iter = 0; iter < 3000; iter++) { /* flipped bytes */
        memcpy(b, good, len);
        for (int k = 0; k < 1 + iter % 4; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            size_t pos = (size_t)(s >> 33) % (data_end < len ? data_end : len);
            b[pos] ^= (uint8_t)(1u << ((s >> 20) & 7));
        }
        open_bytes(b, len);
    }
    struct { size_t off; uint64_t v; const char *msg; } edits[] = {
        {4, 1, "version"},                   /* version 1 */
        {8, 1ull << 40, "claims"},           /* tensor count */
        {16, 1ull << 40, "claims"},          /* metadata count */
        {16, 6, NULL},                       /* one key too many: reads tensor infos as a key */
        {24, UINT64_MAX, "claims"},          /* first key length */
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        memcpy(b, good, len);
        if (edits[i].off == 4) {
            uint32_t v = (uint32_t)edits[i].v;
            memcpy(b + 4, &v, 4);
        } else {
            set_u64(b, edits[i].off, edits[i].v);
        }
        assert_int_not_equal(open_bytes(b, len), VKS_OK);
        if (edits[i].msg && !strstr(vks_last_error(), edits[i].msg)) fail_msg("edit %zu: '%s'", i, vks_last_error());
    }
    /* Duplicate key: rename x.u32 to x.f32 is not the same length; rename "x.bool" -> "x.u32" region instead. */
    memcpy(b, good, len);
    unsigned char *k = memmem(b, len, "x.bool", 6);
    assert_non_null(k);
    memcpy(k, "x.strs", 6);
    assert_int_equal(open_bytes(b, len), VKS_ERR_FORMAT);
    assert_non_null(strstr(vks_last_error(), "duplicate"));
    /* Tensor offset past the end, and an unknown ggml type. */
    memcpy(b, good, len);
    unsigned char *tn = memmem(b, len, "t.f32", 5);
    assert_non_null(tn);
    /* after the name: u32 n_dims (1), u64 ne0, u32 type, u64 offset */
    set_u64(b, (size_t)(tn - b) + 5 + 4 + 8 + 4, 1ull << 30);
    assert_int_equal(open_bytes(b, len), VKS_ERR_FORMAT);
    memcpy(b, good, len);
    uint32_t bad_type = 99;
    memcpy(tn + 5 + 4 + 8, &bad_type, 4);
    assert_int_equal(open_bytes(b, len), VKS_ERR_FORMAT);
    assert_non_null(strstr(vks_last_error(), "ggml type"));
    /* Overlap: point t.f32 at t.q8's data */
    memcpy(b, good, len);
    set_u64(b, (size_t)(tn - b) + 5 + 4 + 8 + 4, 0);
    assert_int_equal(open_bytes(b, len), VKS_ERR_FORMAT);
    free(b);
    free(good);
}

/* Model-level checks: shapes that disagree with the config, missing tensors. */
static void test_gguf_model_hostile(void **state) {
    (void)state;
    vks_model *m = small_random(64, 2);
    char *path = path_in(tu_tmpdir(), "h.gguf");
    assert_int_equal(vks_model_save_gguf(m, path, NULL), VKS_OK);
    size_t len;
    unsigned char *good = tu_read_file(path, &len);
    unsigned char *b = malloc(len);
    struct { const char *key; uint32_t value; const char *msg; } edits[] = {
        {"llama.embedding_length", 32, "partial RoPE"}, /* head_dim changes first */
        {"llama.block_count", 3, "missing tensor blk.2"},
        {"llama.feed_forward_length", 97, "shape"},
        {"llama.attention.head_count_kv", 3, "does not divide"},
        {"llama.rope.dimension_count", 8, "partial RoPE"},
        {"llama.vocab_size", 65, "disagrees"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        memcpy(b, good, len);
        unsigned char *k = memmem(b, len, edits[i].key, strlen(edits[i].key));
        assert_non_null(k);
        memcpy(k + strlen(edits[i].key) + 4, &edits[i].value, 4); /* key, u32 type, value */
        write_file(path, b, len);
        vks_model *x = NULL;
        int rc = vks_model_load(path, &x);
        if (rc != VKS_ERR_FORMAT || !strstr(vks_last_error(), edits[i].msg) || !strstr(vks_last_error(), path))
            fail_msg("edit %s: rc %d, '%s'", edits[i].key, rc, vks_last_error());
    }
    for (size_t cut = 0; cut < len; cut += 97) { /* truncations of a model file */
        write_file(path, good, cut);
        vks_model *x = NULL;
        assert_int_not_equal(vks_model_load(path, &x), VKS_OK);
    }
    free(b);
    free(good);
    free(path);
    vks_model_free(m);
}

/* Occurrences of `needle` in the last error message. */
static int times_named(const char *needle) {
    int n = 0;
    for (const char *p = vks_last_error(); (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* Sets the value type of metadata `key` (the u32 after the key string). */
static void set_key_type(unsigned char *b, size_t len, const char *key, uint32_t type) {
    unsigned char *k = memmem(b, len, key, strlen(key));
    assert_non_null(k);
    memcpy(k + strlen(key), &type, 4);
}

/* Every loader message names the file exactly once: metadata of the wrong
 * type (the getters name the file, callers used to add it again), and every
 * truncation of a model file. */
static void test_gguf_errors_name_file_once(void **state) {
    (void)state;
    vks_model *m = small_random(64, 3);
    char *path = path_in(tu_tmpdir(), "once.gguf");
    assert_int_equal(vks_model_save_gguf(m, path, NULL), VKS_OK);
    vks_model_free(m);
    size_t len;
    unsigned char *good = tu_read_file(path, &len), *b = malloc(len);
    const char *u32_keys[] = {"llama.context_length", "llama.embedding_length", "llama.block_count",
                              "llama.feed_forward_length", "llama.attention.head_count_kv", "llama.vocab_size",
                              "llama.rope.dimension_count"};
    for (size_t i = 0; i < sizeof u32_keys / sizeof u32_keys[0]; i++) {
        memcpy(b, good, len);
        set_key_type(b, len, u32_keys[i], VKS_GGUF_FLOAT32);
        write_file(path, b, len);
        vks_model *x = NULL;
        assert_int_equal(vks_model_load(path, &x), VKS_ERR_FORMAT);
        if (times_named(path) != 1 || !strstr(vks_last_error(), u32_keys[i]))
            fail_msg("%s as f32: '%s'", u32_keys[i], vks_last_error());
    }
    memcpy(b, good, len);
    set_key_type(b, len, "llama.rope.freq_base", VKS_GGUF_UINT32);
    write_file(path, b, len);
    vks_model *x = NULL;
    assert_int_equal(vks_model_load(path, &x), VKS_ERR_FORMAT);
    if (times_named(path) != 1) fail_msg("freq_base as u32: '%s'", vks_last_error());
    for (size_t cut = 0; cut < len; cut += 13) {
        write_file(path, good, cut);
        assert_int_not_equal(vks_model_load(path, &x), VKS_OK);
        if (times_named(path) != 1) fail_msg("cut at %zu: '%s'", cut, vks_last_error());
    }
    uint64_t seed = 99;
    for (int iter = 0; iter < 1500; iter++) { /* flipped bits in the header and metadata */
        memcpy(b, good, len);
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        b[(seed >> 33) % 1200] ^= (uint8_t)(1u << ((seed >> 20) & 7));
        write_file(path, b, len);
        if (vks_model_load(path, &x) == VKS_OK) {
            vks_model_free(x);
            continue;
        }
        if (times_named(path) != 1) fail_msg("flip %d: '%s'", iter, vks_last_error());
    }
    free(b);
    free(good);
    free(path);
}

/* The same for tokenizer metadata read from a GGUF. */
static void test_gguf_tokenizer_errors_name_file_once(void **state) {
    (void)state;
    const char *keys[] = {"tokenizer.ggml.tokens", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.add_bos_token",
                          "tokenizer.chat_template", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"};
    char *path = path_in(tu_tmpdir(), "tok-once.gguf");
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        vks_gguf_writer *w;
        assert_int_equal(vks_gguf_writer_create(&w), VKS_OK);
        const char *toks[] = {"<unk>", "<s>", "</s>", "a"};
        float scores[4] = {0, 0, 0, -1};
        int32_t types[4] = {2, 3, 3, 1};
        assert_int_equal(vks_gguf_add_str(w, "tokenizer.ggml.model", "llama"), VKS_OK);
        bool broken = i == 0;
        if (broken) assert_int_equal(vks_gguf_add_u32(w, keys[0], 4), VKS_OK);
        else assert_int_equal(vks_gguf_add_arr_str(w, keys[0], toks, 4), VKS_OK);
        /* the others: a string where a number, bool or array is expected, or a number for a string */
        for (size_t k = 1; k < sizeof keys / sizeof keys[0]; k++) {
            if (k != i) continue;
            if (!strcmp(keys[k], "tokenizer.chat_template")) assert_int_equal(vks_gguf_add_u32(w, keys[k], 1), VKS_OK);
            else assert_int_equal(vks_gguf_add_str(w, keys[k], "x"), VKS_OK);
        }
        if (i != 4) assert_int_equal(vks_gguf_add_arr(w, "tokenizer.ggml.scores", VKS_GGUF_FLOAT32, scores, 4), VKS_OK);
        if (i != 5) assert_int_equal(vks_gguf_add_arr(w, "tokenizer.ggml.token_type", VKS_GGUF_INT32, types, 4), VKS_OK);
        assert_int_equal(vks_gguf_writer_save(w, path), VKS_OK);
        vks_gguf_writer_free(w);
        vks_tokenizer *t = NULL;
        assert_int_equal(vks_tokenizer_load_gguf(path, &t), VKS_ERR_FORMAT);
        if (times_named(path) != 1 || !strstr(vks_last_error(), keys[i]))
            fail_msg("%s: '%s'", keys[i], vks_last_error());
    }
    free(path);
}

static int open_st(const char *s, size_t len) {
    vks_st_file *f = NULL;
    int rc = vks_st_open_memory(s, len, "mutant.safetensors", &f);
    vks_st_close(f);
    return rc;
}

/* Builds "<u64 len><header><data>" in buf; returns the total length. */
static size_t st_bytes(char *buf, const char *header, size_t data_len) {
    uint64_t n = strlen(header);
    memcpy(buf, &n, 8);
    memcpy(buf + 8, header, n);
    memset(buf + 8 + n, 0, data_len);
    return 8 + n + data_len;
}

static void test_safetensors_hostile(void **state) {
    (void)state;
    char buf[4096];
    struct { const char *header; size_t data; int rc; const char *msg; } cases[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16, VKS_OK, NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 15, VKS_ERR_FORMAT, "outside"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,16]}}", 24, VKS_ERR_FORMAT, "disagrees"},
        {"{\"a\":{\"dtype\":\"F33\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16, VKS_ERR_FORMAT, "dtype"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 16, VKS_ERR_FORMAT, "shape"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,16]}}", 16, VKS_ERR_FORMAT,
         "overflow"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,0]}}", 16, VKS_ERR_FORMAT, "outside"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", 24, VKS_ERR_FORMAT, "overlaps"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, VKS_ERR_FORMAT, "JSON"},
        {"[1,2]", 0, VKS_ERR_FORMAT, "not an object"},
        {"{\"a\":", 0, VKS_ERR_FORMAT, "JSON"},
        {"{\"__metadata__\":{\"format\":\"pt\"}}", 0, VKS_OK, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len = st_bytes(buf, cases[i].header, cases[i].data);
        int rc = open_st(buf, len);
        if (rc != cases[i].rc || (cases[i].msg && !strstr(vks_last_error(), cases[i].msg)))
            fail_msg("case %zu: rc %d, '%s'", i, rc, vks_last_error());
    }
    size_t len = st_bytes(buf, cases[0].header, 16);
    uint64_t huge = (uint64_t)1 << 62;
    memcpy(buf, &huge, 8);
    assert_int_equal(open_st(buf, len), VKS_ERR_FORMAT);
    assert_non_null(strstr(vks_last_error(), "header length"));
    for (size_t cut = 0; cut < len; cut++) {
        st_bytes(buf, cases[0].header, 16);
        assert_int_not_equal(open_st(buf, cut), VKS_OK);
    }
}

static void test_hf_config_hostile(void **state) {
    (void)state;
    const char *good = "{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":96,"
                       "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
                       "\"vocab_size\":100,\"rms_norm_eps\":1e-6,\"rope_theta\":1000000.0,"
                       "\"tie_word_embeddings\":true,\"bos_token_id\":null,\"eos_token_id\":[7,8]}";
    vks_hf_config c;
    assert_int_equal(vks_hf_config_parse(good, strlen(good), "config.json", &c), VKS_OK);
    assert_string_equal(c.arch, "qwen2");
    assert_true(c.attention_bias);
    assert_int_equal(c.cfg.kv_dim, 32);
    assert_int_equal(c.cfg.seq_len, 2048);
    assert_true(c.cfg.rope_theta == 1e6f);
    assert_int_equal(c.bos_id, -1);
    assert_int_equal(c.eos_id, 7);
    assert_int_equal(c.cfg.rope_mode, VKS_ROPE_HALF);
    const char *bad[][2] = {
        {"{\"architectures\":[\"GPT2LMHeadModel\"],\"hidden_size\":64}", "unsupported"},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":-64}", "hidden_size"},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":\"64\"}", "hidden_size"},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":96,\"num_hidden_layers\":2,"
         "\"num_attention_heads\":5,\"vocab_size\":10}", "n_heads"},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":96,\"num_hidden_layers\":2,"
         "\"num_attention_heads\":4,\"vocab_size\":10,\"rope_scaling\":{\"type\":\"linear\"}}", "rope_scaling"},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":96,\"num_hidden_layers\":2,"
         "\"num_attention_heads\":4,\"vocab_size\":10,\"head_dim\":33}", "head_dim"},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":96,\"num_hidden_layers\":2,"
         "\"num_attention_heads\":4,\"vocab_size\":10,\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,"
         "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0}}", "original_max_position_embeddings"},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":96,\"num_hidden_layers\":2,"
         "\"num_attention_heads\":4,\"vocab_size\":10,\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,"
         "\"low_freq_factor\":4.0,\"high_freq_factor\":1.0,\"original_max_position_embeddings\":8192}}",
         "high_freq_factor"},
        {"{\"hidden_size\":1,\"hidden_size\":2}", "JSON"},
        {"not json", "JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = vks_hf_config_parse(bad[i][0], strlen(bad[i][0]), "cfg", &c);
        if (rc != VKS_ERR_FORMAT || !strstr(vks_last_error(), bad[i][1]) || !strstr(vks_last_error(), "cfg"))
            fail_msg("case %zu: rc %d '%s'", i, rc, vks_last_error());
    }
}

/* ---- issue 9 items 12, 13: configs the engine does not run, unused tensors, NaN/Inf weights ---- */

/* Replaces the first `from` in file `path` by `to`. */
static void edit_file(const char *path, const char *from, const char *to) {
    size_t len;
    unsigned char *b = tu_read_file(path, &len);
    assert_non_null(b);
    unsigned char *at = memmem(b, len, from, strlen(from));
    if (!at) fail_msg("%s: no '%s'", path, from);
    size_t head = (size_t)(at - b), tail = len - head - strlen(from);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, head, f), head);
    assert_int_equal(fwrite(to, 1, strlen(to), f), strlen(to));
    assert_int_equal(fwrite(at + strlen(from), 1, tail, f), tail);
    assert_int_equal(fclose(f), 0);
    free(b);
}

/* vks_model_load(path) fails with VKS_ERR_FORMAT and a message holding path and want. */
static void expect_load_error(const char *path, const char *want) {
    vks_model *x = NULL;
    int rc = vks_model_load(path, &x);
    vks_model_free(x);
    if (rc != VKS_ERR_FORMAT || !strstr(vks_last_error(), want) || !strstr(vks_last_error(), path))
        fail_msg("%s: rc %d, '%s' (want '%s')", path, rc, vks_last_error(), want);
}

static void expect_load_ok(const char *path) {
    vks_model *x = NULL;
    if (vks_model_load(path, &x) != VKS_OK) fail_msg("%s: %s", path, vks_last_error());
    vks_model_free(x);
}

static void test_hf_unsupported_config_refused(void **state) {
    (void)state;
    vks_model *m = small_random(64, 21);
    char *hf = path_in(tu_tmpdir(), "hf-extra");
    assert_int_equal(vks_model_save_safetensors(m, hf, NULL), VKS_OK);
    char *cfg = path_in(hf, "config.json");
    expect_load_ok(hf);
    edit_file(cfg, "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 1"); /* the file holds 2 */
    expect_load_error(hf, "tensor model.layers.1.");
    edit_file(cfg, "\"num_hidden_layers\": 1", "\"num_hidden_layers\": 2");
    edit_file(cfg, "\"tie_word_embeddings\": false", "\"tie_word_embeddings\": true"); /* lm_head unused */
    expect_load_error(hf, "tensor lm_head.weight");
    edit_file(cfg, "\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false");
    edit_file(cfg, "\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"");
    expect_load_error(hf, "hidden_act 'gelu'");
    edit_file(cfg, "\"hidden_act\": \"gelu\"", "\"hidden_act\": \"silu\", \"rope_scaling\": {\"rope_type\": \"yarn\"}");
    expect_load_error(hf, "rope_scaling type 'yarn'");
    edit_file(cfg, "\"yarn\"", "\"default\"");
    expect_load_ok(hf);
    edit_file(cfg, "\"hidden_act\": \"silu\"", "\"hidden_act\": \"silu\", \"sliding_window\": 16"); /* context 32 */
    expect_load_error(hf, "sliding_window 16 is shorter than the context 32");
    edit_file(cfg, "\"sliding_window\": 16", "\"sliding_window\": 16, \"use_sliding_window\": false"); /* as Qwen2/3 */
    expect_load_ok(hf);
    edit_file(cfg, "\"sliding_window\": 16, \"use_sliding_window\": false", "\"sliding_window\": 32");
    expect_load_ok(hf);
    free(cfg);
    free(hf);
    vks_model_free(m);
}

/* Copies the u32/f32/string keys and every tensor of GGUF `g` into a new file,
 * plus one string key (NULL: none). */
/* What rewrite_gguf_with adds or replaces: one string key, one u32 key, one tensor's data (NULL: none). */
typedef struct {
    const char *str_key, *str_value, *u32_key;
    uint32_t u32_value;
    const char *tensor;
    const void *tensor_data;
} gguf_edit;

static void rewrite_gguf_with(const vks_gguf *g, const char *path, const gguf_edit *e) {
    vks_gguf_writer *w;
    assert_int_equal(vks_gguf_writer_create(&w), VKS_OK);
    for (int64_t i = 0; i < vks_gguf_n_kv(g); i++) {
        const char *k = vks_gguf_key(g, i), *str;
        uint32_t u;
        float f;
        if (vks_gguf_kv_type(g, i) == VKS_GGUF_UINT32 && vks_gguf_get_u32(g, k, &u) == VKS_OK)
            assert_int_equal(vks_gguf_add_u32(w, k, u), VKS_OK);
        else if (vks_gguf_kv_type(g, i) == VKS_GGUF_FLOAT32 && vks_gguf_get_f32(g, k, &f) == VKS_OK)
            assert_int_equal(vks_gguf_add_f32(w, k, f), VKS_OK);
        else if (vks_gguf_kv_type(g, i) == VKS_GGUF_STRING && vks_gguf_get_str(g, k, &str, NULL) == VKS_OK)
            assert_int_equal(vks_gguf_add_str(w, k, str), VKS_OK);
    }
    if (e->str_key) assert_int_equal(vks_gguf_add_str(w, e->str_key, e->str_value), VKS_OK);
    if (e->u32_key) assert_int_equal(vks_gguf_add_u32(w, e->u32_key, e->u32_value), VKS_OK);
    for (int64_t i = 0; i < vks_gguf_n_tensors(g); i++) {
        const vks_gguf_tensor *t = vks_gguf_tensor_at(g, i);
        const void *data = e->tensor && !strcmp(t->name, e->tensor) ? e->tensor_data : t->data;
        assert_int_equal(vks_gguf_add_tensor(w, t->name, t->dtype, t->n_dims, t->ne, data), VKS_OK);
    }
    if (vks_gguf_writer_save(w, path) != VKS_OK) fail_msg("%s", vks_last_error());
    vks_gguf_writer_free(w);
}

/* Copies the u32/f32/string keys and every tensor of GGUF `g` into a new file,
 * plus one string key (NULL: none). */
static void rewrite_gguf(const vks_gguf *g, const char *path, const char *key, const char *value) {
    rewrite_gguf_with(g, path, &(gguf_edit){.str_key = key, .str_value = value});
}

/* A sliding window shorter than the context is refused by name; a Llama 3
 * rope_freqs that is not the llama3 formula's is refused, naming the pair. */
static void test_gguf_sliding_window_and_rope_freqs_refused(void **state) {
    (void)state;
    vks_model_config c = {.dim = 64, .hidden_dim = 96, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .vocab_size = 64,
                          .seq_len = 32};
    vks_model *m;
    assert_int_equal(vks_model_random_arch(&c, "llama3", 3, &m), VKS_OK);
    char *path = path_in(tu_tmpdir(), "l3w.gguf"), *edited = path_in(tu_tmpdir(), "l3w-edited.gguf");
    assert_int_equal(vks_model_save_gguf(m, path, NULL), VKS_OK);
    expect_load_ok(path);
    vks_gguf *g;
    assert_int_equal(vks_gguf_open(path, &g), VKS_OK);
    rewrite_gguf_with(g, edited, &(gguf_edit){.u32_key = "llama.attention.sliding_window", .u32_value = 16});
    expect_load_error(edited, "llama.attention.sliding_window 16 is shorter than the context 32");
    rewrite_gguf_with(g, edited, &(gguf_edit){.u32_key = "llama.attention.sliding_window", .u32_value = 32});
    expect_load_ok(edited);
    const vks_gguf_tensor *rf = vks_gguf_find_tensor(g, "rope_freqs.weight");
    assert_non_null(rf);
    float ff[8];
    assert_int_equal(rf->ne[0], 8);
    memcpy(ff, rf->data, sizeof ff);
    ff[5] *= 1.01f;
    rewrite_gguf_with(g, edited, &(gguf_edit){.tensor = "rope_freqs.weight", .tensor_data = ff});
    expect_load_error(edited, "rope_freqs.weight[5]");
    vks_gguf_close(g);
    free(path);
    free(edited);
    vks_model_free(m);
}

static void test_gguf_unsupported_config_refused(void **state) {
    (void)state;
    vks_model *m = small_random(64, 22);
    char *path = path_in(tu_tmpdir(), "extra.gguf"), *edited = path_in(tu_tmpdir(), "extra-edited.gguf");
    assert_int_equal(vks_model_save_gguf(m, path, NULL), VKS_OK);
    vks_gguf *g;
    assert_int_equal(vks_gguf_open(path, &g), VKS_OK);
    rewrite_gguf(g, edited, "llama.rope.scaling.type", "linear");
    expect_load_error(edited, "RoPE scaling type 'linear'");
    rewrite_gguf(g, edited, "llama.rope.scaling.type", "none");
    expect_load_ok(edited);
    vks_gguf_close(g);
    uint32_t one = 1;
    size_t len;
    unsigned char *b = tu_read_file(path, &len);
    const char *key = "llama.block_count";
    unsigned char *k = memmem(b, len, key, strlen(key));
    assert_non_null(k);
    memcpy(k + strlen(key) + 4, &one, 4); /* declares 1 layer, holds 2 */
    write_file(edited, b, len);
    expect_load_error(edited, "tensor blk.1.");
    free(b);
    free(edited);
    free(path);
    vks_model_free(m);
}

/* Overwrites `n` bytes at `offset` of file `path`. */
static void poke(const char *path, long offset, const void *bytes, size_t n) {
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    if (offset < 0) assert_int_equal(fseek(f, offset, SEEK_END), 0);
    else assert_int_equal(fseek(f, offset, SEEK_SET), 0);
    assert_int_equal(fwrite(bytes, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static void test_non_finite_weights_refused(void **state) {
    (void)state;
    vks_model *m = small_random(64, 23);
    const char *dir = tu_tmpdir();
    /* llama2.c f32: element 5 of the embedding (after the 28-byte header). */
    char *l2c = path_in(dir, "nan.bin");
    assert_int_equal(vks_model_save_llama2c(m, l2c), VKS_OK);
    expect_load_ok(l2c);
    uint32_t nan32 = 0x7fc00000u, inf32 = 0xff800000u;
    poke(l2c, 28 + 4 * 5, &nan32, 4);
    expect_load_error(l2c, "tensor tok_emb holds NaN or Inf (row 0, column 5)");
    poke(l2c, 28 + 4 * 5, &inf32, 4);
    expect_load_error(l2c, "tok_emb holds NaN or Inf");
    /* GGUF Q8_0: the f16 scale of layer 1's q block 1 is Inf. */
    char *q8 = path_in(dir, "inf.gguf");
    vks_model_save_options opt = {.dtype = VKS_DTYPE_Q8_0};
    assert_int_equal(vks_model_save_gguf(m, q8, &opt), VKS_OK);
    expect_load_ok(q8);
    vks_gguf *g;
    assert_int_equal(vks_gguf_open(q8, &g), VKS_OK);
    const vks_gguf_tensor *t = vks_gguf_find_tensor(g, "blk.1.attn_q.weight");
    assert_non_null(t);
    long at = (long)(vks_gguf_data_offset(g) + t->offset) + 34; /* block 1 of row 0 */
    vks_gguf_close(g);
    uint16_t inf16 = 0x7c00, nan16 = 0x7e00, bf_inf = 0x7f80;
    poke(q8, at, &inf16, 2);
    expect_load_error(q8, "tensor wq of layer 1 holds NaN or Inf (row 0, column 32)");
    /* safetensors f16 and bf16: the last element of the file. */
    const vks_dtype halves[2] = {VKS_DTYPE_F16, VKS_DTYPE_BF16};
    const uint16_t bad[2] = {nan16, bf_inf};
    for (int i = 0; i < 2; i++) {
        char name[32];
        snprintf(name, sizeof name, "nan-%d", i);
        char *hf = path_in(dir, name);
        vks_model_save_options o = {.dtype = halves[i]};
        assert_int_equal(vks_model_save_safetensors(m, hf, &o), VKS_OK);
        expect_load_ok(hf);
        char *st = path_in(hf, "model.safetensors");
        poke(st, -2, &bad[i], 2);
        expect_load_error(hf, "holds NaN or Inf");
        free(st);
        free(hf);
    }
    free(q8);
    free(l2c);
    vks_model_free(m);
}

/* llama2.c: a header declaring fewer layers than the file holds (or any bytes
 * after the weights) is refused. */
static void test_llama2c_extra_bytes_refused(void **state) {
    (void)state;
    vks_model *m = small_random(64, 24);
    char *path = path_in(tu_tmpdir(), "extra.bin");
    assert_int_equal(vks_model_save_llama2c(m, path), VKS_OK);
    expect_load_ok(path);
    int32_t one = 1;
    poke(path, 8, &one, 4); /* n_layers 2 -> 1 */
    expect_load_error(path, "bytes after the");
    int32_t two = 2;
    poke(path, 8, &two, 4);
    expect_load_ok(path);
    FILE *f = fopen(path, "ab");
    assert_non_null(f);
    assert_int_equal(fwrite(&one, 4, 1, f), 1);
    assert_int_equal(fclose(f), 0);
    expect_load_error(path, "4 bytes after the");
    free(path);
    vks_model_free(m);
}

/* Every input the fuzzers once crashed on (tests/fuzz/regressions/<parser>/...)
 * must now be handled: a clean error or a clean open. */
static int replay_dir(const char *dir, int which) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int count = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char *p = path_in(dir, e->d_name);
        size_t len;
        unsigned char *b = tu_read_file(p, &len);
        assert_non_null(b);
        if (which == 0) open_bytes(b, len);
        else if (which == 1) open_st((const char *)b, len);
        else {
            vks_hf_config c;
            (void)vks_hf_config_parse((const char *)b, len, "mutant", &c);
        }
        free(b);
        free(p);
        count++;
    }
    closedir(d);
    print_message("%s: %d regression inputs\n", dir, count);
    return count;
}

static void test_fuzz_regressions(void **state) {
    (void)state;
    /* this file's directory (meson compiles it by a path relative to the build dir, the tests' cwd) */
    char here[1024], dir[1200];
    snprintf(here, sizeof here, "%s", __FILE__);
    char *slash = strrchr(here, '/');
    if (slash) *slash = '\0';
    else snprintf(here, sizeof here, ".");
    const char *sub[] = {"gguf", "safetensors", "config"};
    int total = 0;
    for (int i = 0; i < 3; i++) {
        snprintf(dir, sizeof dir, "%s/fuzz/regressions/%s", here, sub[i]);
        total += replay_dir(dir, i);
    }
    assert_true(total > 0); /* the corpus is in the repository: not finding it is a bug */
}

/* ---- the convert CLI ---- */

static void test_convert_cli(void **state) {
    (void)state;
    char *model = shared_file("stories260K/stories260K.bin");
    char *tok = shared_file("stories260K/tok512.bin");
    if (!model || !tok) { free(model); free(tok); return; }
    const char *dir = tu_tmpdir();
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s convert --in %s --out %s/a.gguf --tokenizer %s 2>/dev/null", tu_bin(), model, dir,
             tok);
    assert_int_equal(tu_run(cmd, NULL), 0);
    snprintf(cmd, sizeof cmd, "%s convert --in %s/a.gguf --out %s/hf --type bf16 2>/dev/null", tu_bin(), dir, dir);
    assert_int_equal(tu_run(cmd, NULL), 0);
    snprintf(cmd, sizeof cmd, "%s convert --in %s/a.gguf --out %s/q.gguf --type q8_0 2>/dev/null", tu_bin(), dir, dir);
    assert_int_equal(tu_run(cmd, NULL), 0);
    snprintf(cmd, sizeof cmd, "%s convert --in %s/hf --out %s/b.bin 2>/dev/null", tu_bin(), dir, dir);
    assert_int_equal(tu_run(cmd, NULL), 0);
    snprintf(cmd, sizeof cmd, "%s convert --random-model 256,320,1,4,4,64,64 --out %s/r.gguf --type q4_k 2>/dev/null",
             tu_bin(), dir);
    assert_int_equal(tu_run(cmd, NULL), 0);
    char p[1024];
    vks_model *o, *h, *q, *b, *r;
    assert_int_equal(vks_model_load(model, &o), VKS_OK);
    snprintf(p, sizeof p, "%s/hf", dir);
    assert_int_equal(vks_model_load(p, &h), VKS_OK);
    assert_int_equal(h->layers[0].wq.dtype, VKS_DTYPE_BF16);
    snprintf(p, sizeof p, "%s/q.gguf", dir);
    assert_int_equal(vks_model_load(p, &q), VKS_OK);
    assert_int_equal(q->layers[0].wq.dtype, VKS_DTYPE_Q8_0);
    assert_int_equal(q->layers[0].w2.dtype, VKS_DTYPE_F32); /* 172 columns: not whole q8_0 blocks */
    const vks_gguf *qg = vks_model_gguf(q);
    uint64_t ntok;
    assert_int_equal(vks_gguf_get_arr_info(qg, "tokenizer.ggml.tokens", NULL, &ntok), VKS_OK); /* copied along */
    assert_int_equal(ntok, 512);
    snprintf(p, sizeof p, "%s/b.bin", dir);
    assert_int_equal(vks_model_load(p, &b), VKS_OK);
    snprintf(p, sizeof p, "%s/r.gguf", dir);
    assert_int_equal(vks_model_load(p, &r), VKS_OK);
    assert_int_equal(r->layers[0].wq.dtype, VKS_DTYPE_Q4_K);
    assert_int_equal(r->layers[0].w2.dtype, VKS_DTYPE_Q4_0); /* 320 columns: not whole q4_k blocks, whole q4_0 ones */
    assert_int_equal(r->tok_emb.dtype, VKS_DTYPE_Q4_K);
    assert_int_equal(r->cfg.seq_len, 64);
    float *lo = logits_of(o), *lh = logits_of(h), *lq = logits_of(q), *lb = logits_of(b);
    size_t n = (size_t)N_IDS * 512;
    double eh = tu_nmse(lh, lo, n), eq = tu_nmse(lq, lo, n), eb = tu_nmse(lb, lh, n);
    print_message("convert: nmse bf16 %.3g, q8_0 %.3g, bf16->bin %.3g\n", eh, eq, eb);
    assert_true(eh < 1e-3 && eh > 0);
    assert_true(eq < 1e-3 && eq > 0);
    assert_true(eb < 1e-10);
    free(lo); free(lh); free(lq); free(lb);
    vks_model_free(o); vks_model_free(h); vks_model_free(q); vks_model_free(b); vks_model_free(r);
    /* bad input: exit 2 with one line */
    const char *bad[] = {
        "convert --in /nonexistent --out x.gguf",
        "convert --in %s --out %s/x.bin --type q8_0",
        "convert --in %s --out %s/x --type q4_0",
        "convert --in %s --out %s/x.gguf --type q5_k",
        "convert --out x.gguf",
        "convert --in %s --out %s/x --tokenizer t.bin",
        "convert --random-model 64,96,2,4,2,97 --arch mistral --out %s/x.gguf",
        "convert --in %s --arch qwen3 --out %s/x.gguf",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char args[2048];
        snprintf(args, sizeof args, bad[i], model, dir);
        snprintf(cmd, sizeof cmd, "%s %s 2>/dev/null", tu_bin(), args);
        if (tu_run(cmd, NULL) != 2) fail_msg("'%s' did not exit 2", args);
    }
    char args_path[1200];
    /* --random-model with --arch: a Qwen3 of head_dim 32 (4 heads on dim 64), a Llama 3.1, a Qwen2 */
    const char *archs[][2] = {{"qwen3", "qwen3"}, {"llama3", "llama"}, {"qwen2", "qwen2"}};
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, "%s convert --random-model 64,96,2,4,2,97,64,32 --arch %s --out %s/ra.gguf 2>/dev/null",
                 tu_bin(), archs[i][0], dir);
        assert_int_equal(tu_run(cmd, NULL), 0);
        snprintf(args_path, sizeof args_path, "%s/ra.gguf", dir);
        vks_model *ra;
        if (vks_model_load(args_path, &ra)) fail_msg("%s", vks_last_error());
        assert_string_equal(ra->arch, archs[i][1]);
        assert_int_equal(ra->cfg.head_dim, 32);
        assert_true(ra->cfg.qk_norm == (i == 0) && (ra->cfg.rope_scaling.type != 0) == (i == 1));
        assert_true(vks_model_has_bias(ra) == (i == 2));
        vks_model_free(ra);
    }
    snprintf(cmd, sizeof cmd, "%s convert --help | grep -q 'usage: vkswarm convert'", tu_bin());
    assert_int_equal(tu_run(cmd, NULL), 0);
    /* --model in other commands takes any format */
    snprintf(cmd, sizeof cmd, "cd %s && printf '1 403 407' > ids && %s logits --model hf --ids ids --out l 2>/dev/null",
             dir, tu_bin());
    assert_int_equal(tu_run(cmd, NULL), 0);
    free(model);
    free(tok);
}

/* ---- vks_outfile: whole files or nothing ---- */

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static void put_file(vks_outfile *o, const char *path, const char *text) {
    assert_int_equal(vks_outfile_open(o, path, 0644), VKS_OK);
    assert_int_equal(fputs(text, o->f) >= 0, 1);
}

static void assert_file_text(const char *path, const char *want) {
    char *got = (char *)tu_read_file(path, NULL);
    assert_non_null(got);
    assert_string_equal(got, want);
    free(got);
}

/* A FIFO (or device) in place of a model's, tokenizer's or checkpoint's file
 * is refused at once, naming it: opening one for reading used to block until
 * a writer came (forever: generate, eval, train and rl hung). An alarm turns a
 * hang into a failure. */
static void expect_not_regular(int rc, const char *path, const char *what) {
    if (rc == VKS_OK || !strstr(vks_last_error(), path) || !strstr(vks_last_error(), "regular file"))
        fail_msg("%s on a FIFO: %d '%s'", what, rc, vks_last_error());
}

static void test_fifo_inputs_refused(void **state) {
    (void)state;
    alarm(120);
    const char *dir = tu_tmpdir();
    char *fifo = path_in(dir, "pipe.gguf"), *hf = path_in(dir, "fifo-hf"), *ck = path_in(dir, "fifo-ck");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    vks_model *m = NULL;
    vks_tokenizer *tok = NULL;
    vks_gguf *g = NULL;
    vks_st_file *st = NULL;
    vks_hf_config cfg;
    expect_not_regular(vks_model_load(fifo, &m), fifo, "vks_model_load");
    expect_not_regular(vks_model_load_gguf(fifo, &m), fifo, "vks_model_load_gguf");
    expect_not_regular(vks_model_load_llama2c(fifo, &m), fifo, "vks_model_load_llama2c");
    expect_not_regular(vks_gguf_open(fifo, &g), fifo, "vks_gguf_open");
    expect_not_regular(vks_st_open(fifo, &st), fifo, "vks_st_open");
    expect_not_regular(vks_hf_config_load(fifo, &cfg), fifo, "vks_hf_config_load");
    expect_not_regular(vks_tokenizer_load_llama2c(fifo, 512, &tok), fifo, "vks_tokenizer_load_llama2c");
    expect_not_regular(vks_tokenizer_load_gguf(fifo, &tok), fifo, "vks_tokenizer_load_gguf");
    expect_not_regular(vks_tokenizer_load_hf_json(fifo, &tok), fifo, "vks_tokenizer_load_hf_json");
    expect_not_regular(vks_tokenizer_load_auto(fifo, NULL, &tok), fifo, "vks_tokenizer_load_auto");
    /* each file of a saved model directory in turn */
    assert_int_equal(vks_model_init_tiny(5, &m, &tok), VKS_OK);
    vks_model_save_options o = {.dtype = VKS_DTYPE_F32, .tokenizer = tok};
    assert_int_equal(vks_model_save_safetensors(m, hf, &o), VKS_OK);
    vks_model_free(m);
    vks_tokenizer_free(tok);
    m = NULL, tok = NULL;
    const char *names[] = {"model.safetensors", "config.json", "tokenizer.json"};
    for (int i = 0; i < 3; i++) {
        char *p = path_in(hf, names[i]), saved[1024];
        snprintf(saved, sizeof saved, "%s.saved", p);
        assert_int_equal(rename(p, saved), 0);
        assert_int_equal(mkfifo(p, 0600), 0);
        int rc = i < 2 ? vks_model_load(hf, &m) : vks_tokenizer_load_hf_json(p, &tok);
        expect_not_regular(rc, p, names[i]);
        assert_int_equal(unlink(p), 0);
        assert_int_equal(rename(saved, p), 0);
        free(p);
    }
    assert_int_equal(vks_model_load(hf, &m), VKS_OK); /* whole again */
    vks_model_free(m);
    /* a checkpoint's state.json */
    assert_int_equal(mkdir(ck, 0777), 0);
    char *state_json = path_in(ck, "state.json");
    assert_int_equal(mkfifo(state_json, 0600), 0);
    vks_checkpoint *c = NULL;
    expect_not_regular(vks_checkpoint_load(ck, &c), state_json, "vks_checkpoint_load");
    alarm(0);
    free(state_json), free(fifo), free(hf), free(ck);
}

static void test_outfile_rules(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    char *a = path_in(dir, "a"), *b = path_in(dir, "b"), *fifo = path_in(dir, "fifo");
    vks_outfile o[2];
    write_file(a, "old", 3);
    put_file(&o[0], a, "new");
    assert_int_equal(count_entries(dir), 2); /* a and its temporary */
    assert_file_text(a, "old");              /* untouched until the commit */
    vks_outfile_abort(&o[0]);
    assert_int_equal(count_entries(dir), 1);
    assert_file_text(a, "old");
    put_file(&o[0], a, "new");
    assert_int_equal(vks_outfile_commit(&o[0]), VKS_OK);
    assert_file_text(a, "new");
    assert_int_equal(count_entries(dir), 1);
    /* noreplace: b is new but a exists: neither is placed, a is kept */
    put_file(&o[0], b, "b");
    put_file(&o[1], a, "a2");
    assert_int_equal(vks_outfile_commit_all(o, 2, true), VKS_ERR_IO);
    assert_non_null(strstr(vks_last_error(), "/a: exists"));
    assert_int_equal(count_entries(dir), 1);
    assert_file_text(a, "new");
    /* a FIFO (like /dev/stdout) is written in place, not replaced */
    assert_int_equal(mkfifo(fifo, 0600), 0);
    int rd = open(fifo, O_RDONLY | O_NONBLOCK);
    assert_true(rd >= 0);
    put_file(&o[0], fifo, "through");
    assert_int_equal(vks_outfile_commit(&o[0]), VKS_OK);
    char buf[16] = {0};
    assert_int_equal(read(rd, buf, sizeof buf - 1), 7);
    assert_string_equal(buf, "through");
    close(rd);
    struct stat st;
    assert_int_equal(lstat(fifo, &st), 0);
    assert_true(S_ISFIFO(st.st_mode));
    assert_int_equal(count_entries(dir), 2);
    unlink(fifo);
    unlink(a);
    rmdir(dir);
    free(a);
    free(b);
    free(fifo);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_q8_0_known_block),
        cmocka_unit_test(test_q4_0_known_block),
        cmocka_unit_test(test_q4_k_known_block),
        cmocka_unit_test(test_q6_k_known_block),
        cmocka_unit_test(test_quant_error_bounds),
        cmocka_unit_test(test_quant_zero_block),
        cmocka_unit_test(test_gguf_tensor_round_trip),
        cmocka_unit_test(test_gguf_metadata_every_type),
        cmocka_unit_test(test_gguf_real_vocab_files),
        cmocka_unit_test(test_stories_gguf_safetensors_logits),
        cmocka_unit_test(test_quantized_gguf_model),
        cmocka_unit_test(test_tiny_model_checkpoints),
        cmocka_unit_test(test_qwen2_biases),
        cmocka_unit_test(test_head_dim_formats),
        cmocka_unit_test(test_llama3_rope),
        cmocka_unit_test(test_gguf_sliding_window_and_rope_freqs_refused),
        cmocka_unit_test(test_embedded_tokenizer_matches_llama_cpp),
        cmocka_unit_test(test_sharded_safetensors_and_detection),
        cmocka_unit_test(test_gguf_hostile),
        cmocka_unit_test(test_gguf_model_hostile),
        cmocka_unit_test(test_gguf_errors_name_file_once),
        cmocka_unit_test(test_gguf_tokenizer_errors_name_file_once),
        cmocka_unit_test(test_safetensors_hostile),
        cmocka_unit_test(test_hf_config_hostile),
        cmocka_unit_test(test_hf_unsupported_config_refused),
        cmocka_unit_test(test_gguf_unsupported_config_refused),
        cmocka_unit_test(test_non_finite_weights_refused),
        cmocka_unit_test(test_llama2c_extra_bytes_refused),
        cmocka_unit_test(test_fuzz_regressions),
        cmocka_unit_test(test_convert_cli),
        cmocka_unit_test(test_outfile_rules),
        cmocka_unit_test(test_fifo_inputs_refused),
    };
    if (getenv("VKSWARM_TEST_FILTER")) cmocka_set_test_filter(getenv("VKSWARM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
