/* test_lora.c: adapters as data (vks_lora.h): target lists, layout, PEFT
 * initialisation, identities. No device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "test_util.h"
#include "vkswarm/vks_gguf.h"
#include "vkswarm/vks_lora.h"
#include "vkswarm/vks_safetensors.h"

static vks_model *tiny_model(void) {
    vks_model_config c;
    vks_model_tiny_config(&c);
    vks_model *m = NULL;
    assert_int_equal(vks_model_random(&c, 7, &m), VKS_OK);
    return m;
}

static void test_parse_targets(void **state) {
    (void)state;
    uint32_t t = 0;
    assert_int_equal(vks_lora_parse_targets("all", &t, "x"), VKS_OK);
    assert_int_equal(t, VKS_LORA_ALL_TARGETS);
    assert_int_equal(vks_lora_parse_targets("q,v_proj,down", &t, "x"), VKS_OK);
    assert_int_equal(t, (1u << VKS_LORA_Q) | (1u << VKS_LORA_V) | (1u << VKS_LORA_DOWN));
    assert_int_equal(vks_lora_parse_targets("q,lm_head", &t, "--lora-targets"), VKS_ERR_ARG);
    assert_non_null(strstr(vks_last_error(), "unknown LoRA target 'lm_head'"));
    assert_int_equal(vks_lora_parse_targets("", &t, "x"), VKS_ERR_ARG);
    assert_int_equal(vks_lora_parse_targets("q,,k", &t, "x"), VKS_ERR_ARG);
}

static void test_adapter_layout(void **state) {
    (void)state;
    vks_model *m = tiny_model();
    const vks_model_config *c = &m->cfg;
    vks_lora_config lc = {4, 8.0, (1u << VKS_LORA_Q) | (1u << VKS_LORA_DOWN)};
    vks_lora_adapter *a = NULL;
    assert_int_equal(vks_lora_adapter_create(c, &lc, &a), VKS_OK);
    assert_int_equal(vks_lora_adapter_n_layers(a), c->n_layers);
    assert_null(vks_lora_adapter_A(a, 0, VKS_LORA_K));
    assert_null(vks_lora_adapter_A(a, c->n_layers, VKS_LORA_Q));
    /* matrices are disjoint and in order: B of (l, q) ends where A of (l, down) starts */
    int64_t out, in, dout, din;
    vks_lora_target_shape(c, VKS_LORA_Q, &out, &in);
    vks_lora_target_shape(c, VKS_LORA_DOWN, &dout, &din);
    for (int l = 0; l < c->n_layers; l++) {
        assert_ptr_equal(vks_lora_adapter_B(a, l, VKS_LORA_Q), vks_lora_adapter_A(a, l, VKS_LORA_Q) + 4 * in);
        assert_ptr_equal(vks_lora_adapter_A(a, l, VKS_LORA_DOWN), vks_lora_adapter_B(a, l, VKS_LORA_Q) + 4 * out);
    }
    assert_int_equal(vks_lora_adapter_init(a, 99), VKS_OK);
    /* the same draw as vks_lora_init of that matrix alone */
    float A[4 * 2048], B[4 * 2048];
    assert_true(4 * din <= 4 * 2048 && 4 * dout <= 4 * 2048);
    assert_int_equal(vks_lora_init(A, B, 4, din, dout, 99, vks_lora_stream(2, VKS_LORA_DOWN)), VKS_OK);
    assert_memory_equal(A, vks_lora_adapter_A(a, 2, VKS_LORA_DOWN), (size_t)(4 * din) * sizeof(float));
    assert_memory_equal(B, vks_lora_adapter_B(a, 2, VKS_LORA_DOWN), (size_t)(4 * dout) * sizeof(float));
    vks_lora_adapter_free(a);

    vks_lora_config bad = {0, 8.0, VKS_LORA_ALL_TARGETS};
    assert_int_equal(vks_lora_adapter_create(c, &bad, &a), VKS_ERR_ARG);
    assert_null(a);
    bad.rank = 4;
    bad.alpha = 0.0 / 0.0;
    assert_int_equal(vks_lora_adapter_create(c, &bad, &a), VKS_ERR_ARG);
    vks_model_free(m);
}

static void test_hashes(void **state) {
    (void)state;
    vks_model *m = tiny_model();
    vks_lora_config lc = {2, 16.0, VKS_LORA_ALL_TARGETS};
    vks_lora_adapter *a = NULL;
    assert_int_equal(vks_lora_adapter_create(&m->cfg, &lc, &a), VKS_OK);
    assert_int_equal(vks_lora_adapter_init(a, 1), VKS_OK);
    uint8_t base[32], none[32], with[32], h1[32], h2[32];
    assert_int_equal(vks_model_hash(m, base), VKS_OK);
    assert_int_equal(vks_lora_model_hash(m, NULL, none), VKS_OK);
    assert_memory_equal(base, none, 32);
    assert_int_equal(vks_lora_model_hash(m, a, with), VKS_OK);
    assert_memory_not_equal(base, with, 32);
    assert_int_equal(vks_lora_adapter_hash(a, h1), VKS_OK);
    vks_lora_adapter_B(a, 3, VKS_LORA_UP)[5] = 1e-7f; /* one value */
    assert_int_equal(vks_lora_adapter_hash(a, h2), VKS_OK);
    assert_memory_not_equal(h1, h2, 32);
    vks_lora_adapter_B(a, 3, VKS_LORA_UP)[5] = 0.0f;
    assert_int_equal(vks_lora_adapter_hash(a, h2), VKS_OK);
    assert_memory_equal(h1, h2, 32);
    vks_lora_adapter_free(a);
    lc.alpha = 32.0; /* a scaled adapter is another model */
    assert_int_equal(vks_lora_adapter_create(&m->cfg, &lc, &a), VKS_OK);
    assert_int_equal(vks_lora_adapter_init(a, 1), VKS_OK);
    assert_int_equal(vks_lora_adapter_hash(a, h2), VKS_OK);
    assert_memory_not_equal(h1, h2, 32);
    vks_lora_adapter_free(a);
    vks_model_free(m);
}

/* ---- files: PEFT and GGUF, merge ---- */


/* An adapter with PEFT's A and a B of random values (a fresh B is zero and hides permutations). */
static vks_lora_adapter *random_adapter(const vks_model *m, int rank, double alpha, uint32_t targets, uint64_t seed) {
    vks_lora_config lc = {rank, alpha, targets};
    vks_lora_adapter *a = NULL;
    assert_int_equal(vks_lora_adapter_create(&m->cfg, &lc, &a), VKS_OK);
    assert_int_equal(vks_lora_adapter_init(a, seed), VKS_OK);
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int t = 0; t < VKS_LORA_TARGET_COUNT; t++) {
            int64_t out, in;
            if (!(targets & (1u << t))) continue;
            vks_lora_target_shape(&m->cfg, (vks_lora_target)t, &out, &in);
            tu_fill_uniform(vks_lora_adapter_B(a, l, (vks_lora_target)t), (size_t)(out * rank), seed * 100 + l * 8 + t,
                            -0.05f, 0.05f);
        }
    assert_int_equal(vks_lora_adapter_set_base(a, m), VKS_OK);
    return a;
}

static void assert_same_adapter(const vks_lora_adapter *x, const vks_lora_adapter *y, const vks_model_config *c) {
    const vks_lora_config *cx = vks_lora_adapter_config(x), *cy = vks_lora_adapter_config(y);
    assert_int_equal(cx->rank, cy->rank);
    assert_true(cx->alpha == cy->alpha);
    assert_int_equal(cx->targets, cy->targets);
    for (int l = 0; l < c->n_layers; l++)
        for (int t = 0; t < VKS_LORA_TARGET_COUNT; t++) {
            int64_t out, in;
            if (!(cx->targets & (1u << t))) continue;
            vks_lora_target_shape(c, (vks_lora_target)t, &out, &in);
            assert_memory_equal(vks_lora_adapter_A(x, l, t), vks_lora_adapter_A(y, l, t), (size_t)(cx->rank * in) * 4);
            assert_memory_equal(vks_lora_adapter_B(x, l, t), vks_lora_adapter_B(y, l, t), (size_t)(cx->rank * out) * 4);
        }
}

/* One temporary directory per run; path of name inside it in buf. */
static const char *tmp_path(const char *name, char *buf, size_t cap) {
    static char dir[256];
    if (!dir[0]) snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    snprintf(buf, cap, "%s/%s", dir, name);
    return buf;
}

/* A fresh copy of the tiny test model: in its own half-split q/k order, or
 * in the adjacent-pair order of a llama2.c file written from it. */
static vks_model *load_base(bool adjacent) {
    if (!adjacent) return tiny_model();
    char path[512];
    tmp_path("adjacent.bin", path, sizeof path);
    vks_model *half = tiny_model(), *adj = NULL;
    assert_int_equal(vks_model_save_llama2c(half, path), VKS_OK);
    vks_model_free(half);
    assert_int_equal(vks_model_load_llama2c(path, &adj), VKS_OK);
    assert_int_equal(adj->cfg.rope_mode, VKS_ROPE_ADJACENT);
    return adj;
}

/* Row r of a q/k matrix in adjacent-pair order is Hugging Face's row
 * j * half + i of its head, r = 2 i + j (llama.cpp's permute; written here
 * again so that the library's permutation is checked against it). */
static int64_t hf_row_of_adjacent(int64_t r, int head_dim) {
    int64_t head = r / head_dim, k = r % head_dim, half = head_dim / 2;
    return head * head_dim + (k % 2) * half + k / 2;
}

static bool rope_target(vks_lora_target t) { return t == VKS_LORA_Q || t == VKS_LORA_K; }

static void test_peft_round_trip(void **state) {
    (void)state;
    vks_model *bases[2] = {load_base(false), load_base(true)};
    for (int i = 0; i < 2; i++) {
        vks_lora_adapter *a = random_adapter(bases[i], 4, 8.0, VKS_LORA_ALL_TARGETS, 5), *b = NULL;
        char dir[512], name[16];
        snprintf(name, sizeof name, "peft%d", i);
        tmp_path(name, dir, sizeof dir);
        assert_int_equal(vks_lora_save_peft(dir, a), VKS_OK);
        assert_int_equal(vks_lora_load(dir, bases[i], &b), VKS_OK);
        assert_same_adapter(a, b, &bases[i]->cfg);
        assert_memory_equal(vks_lora_adapter_base_hash(a), vks_lora_adapter_base_hash(b), 32);
        uint8_t ha[32], hb[32];
        assert_int_equal(vks_lora_adapter_hash(a, ha), VKS_OK);
        assert_int_equal(vks_lora_adapter_hash(b, hb), VKS_OK);
        assert_memory_equal(ha, hb, 32);
        /* the file holds B of k in HF's half-split order whatever the base's */
        char st_path[600];
        snprintf(st_path, sizeof st_path, "%s/adapter_model.safetensors", dir);
        vks_st_file *f = NULL;
        assert_int_equal(vks_st_open(st_path, &f), VKS_OK);
        const vks_st_tensor *tk = vks_st_find(f, "base_model.model.model.layers.2.self_attn.k_proj.lora_B.weight");
        assert_non_null(tk);
        assert_true(tk->dtype == VKS_DTYPE_F32 && tk->n_dims == 2 && tk->shape[0] == 64 && tk->shape[1] == 4);
        const float *bk = vks_lora_adapter_B(a, 2, VKS_LORA_K);
        for (int64_t r = 0; r < 64; r++) {
            int64_t hr = i ? hf_row_of_adjacent(r, 32) : r;
            assert_memory_equal((const float *)tk->data + hr * 4, bk + r * 4, 16);
        }
        vks_st_close(f);
        vks_lora_adapter_free(b);
        /* a caller's hash of the base stands for the base's */
        uint8_t zero[32] = {0};
        assert_int_equal(vks_lora_load_hashed(dir, bases[i], zero, &b), VKS_ERR_FORMAT);
        assert_non_null(strstr(vks_last_error(), "the adapter was made for base model"));
        assert_int_equal(vks_lora_load_hashed(dir, bases[i], vks_lora_adapter_base_hash(a), &b), VKS_OK);
        vks_lora_adapter_free(b);
        b = NULL;
        /* the file names its base's hash: the same weights in the other q/k order are another base */
        assert_int_equal(vks_lora_load(dir, bases[1 - i], &b), VKS_ERR_FORMAT);
        assert_null(b);
        assert_non_null(strstr(vks_last_error(), "adapter_config.json: vkswarm.base_model_hash"));
        vks_lora_adapter_free(a);
    }
    vks_model_free(bases[0]);
    vks_model_free(bases[1]);
}

/* ---- a PEFT adapter written by hand, as PEFT would (BF16 or F16) ---- */

typedef struct {
    int rank;             /* of the tensors */
    const char *r;        /* "r" in adapter_config.json */
    const char *targets;  /* target_modules */
    const char *rslora, *fan_in_fan_out;
    const char *extra;    /* more keys, each starting with ',' */
    const char *skip;     /* a tensor left out */
    const char *add;      /* a tensor added ([rank, 128] of zeros) */
    const char *bad;      /* a tensor with one NaN (or Inf when bad_inf) */
    bool bad_inf;
    vks_dtype dtype;      /* BF16 or F16 */
} hand_opts;

static hand_opts hand_default(void) {
    return (hand_opts){4, "4", "\"q_proj\", \"k_proj\", \"o_proj\", \"up_proj\"", "false", "false", "",
                       NULL, NULL, NULL, false, VKS_DTYPE_BF16};
}
#define HAND_TARGETS ((1u << VKS_LORA_Q) | (1u << VKS_LORA_K) | (1u << VKS_LORA_O) | (1u << VKS_LORA_UP))
#define HAND_ALPHA 16.0
static const vks_lora_target hand_targets[4] = {VKS_LORA_Q, VKS_LORA_K, VKS_LORA_O, VKS_LORA_UP};
static const char *const hand_modules[4] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.o_proj", "mlp.up_proj"};

/* The matrices written, decoded back to f32: A [rank, in], B [out, rank] in HF order. */
typedef struct {
    float *A[4][4], *B[4][4]; /* [layer][target] */
} hand_values;

static void hand_values_free(hand_values *v) {
    for (int l = 0; l < 4; l++)
        for (int t = 0; t < 4; t++) {
            free(v->A[l][t]);
            free(v->B[l][t]);
        }
}

static void *encode(const float *x, size_t n, vks_dtype dt, float *decoded) {
    uint16_t *h = malloc(n * 2);
    assert_non_null(h);
    for (size_t i = 0; i < n; i++) {
        h[i] = dt == VKS_DTYPE_BF16 ? vks_f32_to_bf16(x[i]) : vks_f32_to_f16(x[i]);
        decoded[i] = dt == VKS_DTYPE_BF16 ? vks_bf16_to_f32(h[i]) : vks_f16_to_f32(h[i]);
    }
    return h;
}

static void add_hand_tensor(vks_st_write_tensor *t, size_t *n, const char *name, int64_t rows, int64_t cols,
                            float *values, const hand_opts *o, float **decoded) {
    size_t count = (size_t)(rows * cols);
    if (o->bad && !strcmp(name, o->bad)) values[count / 2] = o->bad_inf ? INFINITY : NAN;
    *decoded = malloc(count * sizeof(float));
    assert_non_null(*decoded);
    t[*n] = (vks_st_write_tensor){strdup(name), o->dtype, 2, {rows, cols}, encode(values, count, o->dtype, *decoded)};
    (*n)++;
}

static void write_hand_safetensors(const char *path, const vks_model_config *c, const hand_opts *o, hand_values *v) {
    vks_st_write_tensor t[40];
    size_t n = 0;
    static float buf[384 * 16];
    for (int l = 0; l < 4; l++)
        for (int k = 0; k < 4; k++) {
            int64_t out, in;
            vks_lora_target_shape(c, hand_targets[k], &out, &in);
            char name[128];
            for (int w = 0; w < 2; w++) {
                snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.lora_%c.weight", l, hand_modules[k],
                         w ? 'B' : 'A');
                if (o->skip && !strcmp(name, o->skip)) continue;
                int64_t rows = w ? out : o->rank, cols = w ? o->rank : in;
                assert_true(rows * cols <= 384 * 16);
                tu_fill_uniform(buf, (size_t)(rows * cols), (uint64_t)(1000 + l * 10 + k * 2 + w), -0.1f, 0.1f);
                add_hand_tensor(t, &n, name, rows, cols, buf, o, w ? &v->B[l][k] : &v->A[l][k]);
            }
        }
    if (o->add) {
        memset(buf, 0, sizeof buf);
        float *unused = NULL;
        add_hand_tensor(t, &n, o->add, o->rank, 128, buf, o, &unused);
        free(unused);
    }
    assert_int_equal(vks_st_write(path, t, n), VKS_OK);
    for (size_t i = 0; i < n; i++) {
        free((void *)t[i].name);
        free((void *)t[i].data);
    }
}

static void write_hand_config(const char *path, const hand_opts *o) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "{\"alpha_pattern\": {}, \"base_model_name_or_path\": \"elsewhere/tiny\", \"bias\": \"none\",\n"
               " \"fan_in_fan_out\": %s, \"inference_mode\": true, \"lora_alpha\": 16, \"lora_dropout\": 0.05,\n"
               " \"peft_type\": \"LORA\", \"r\": %s, \"target_modules\": [%s], \"task_type\": \"CAUSAL_LM\",\n"
               " \"use_rslora\": %s%s}\n",
            o->fan_in_fan_out, o->r, o->targets, o->rslora, o->extra);
    assert_int_equal(fclose(f), 0);
}

static const char *write_hand_peft(const char *name, const hand_opts *o, hand_values *v) {
    static char dir[512];
    char path[600];
    vks_model_config c;
    vks_model_tiny_config(&c);
    tmp_path(name, dir, sizeof dir);
    assert_int_equal(mkdir(dir, 0777), 0);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    write_hand_safetensors(path, &c, o, v);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    write_hand_config(path, o);
    return dir;
}

/* Weight [r][i] of m's layer l tensor idx, decoded. */
static float weight_at(const vks_model *m, int l, int idx, int64_t r, int64_t i) {
    const vks_tensor *t = &m->layers[l].t[idx];
    float row[512];
    assert_true(t->cols <= 512);
    vks_tensor_row_f32(t, r, row);
    return row[i];
}

/* The adapter loaded for base (either q/k order) holds the values written,
 * B's q/k rows in the base's order; merged into a fresh copy of base, every
 * targeted W equals W + (alpha / r) B A computed here in double from the
 * HF-order values, q/k rows found through hf_row_of_adjacent. */
static void check_hand_adapter(const vks_model *base, const vks_lora_adapter *a, const hand_values *v) {
    bool adj = base->cfg.rope_mode == VKS_ROPE_ADJACENT;
    int rank = 4, hd = base->cfg.head_dim;
    double s = HAND_ALPHA / rank;
    vks_model *m = load_base(adj);
    assert_int_equal(vks_lora_merge(m, a), VKS_OK);
    for (int l = 0; l < 4; l++)
        for (int k = 0; k < 4; k++) {
            vks_lora_target t = hand_targets[k];
            int64_t out, in;
            vks_lora_target_shape(&base->cfg, t, &out, &in);
            assert_memory_equal(vks_lora_adapter_A(a, l, t), v->A[l][k], (size_t)(rank * in) * 4);
            const float *B = vks_lora_adapter_B(a, l, t);
            int idx = vks_lora_target_tensor(t);
            assert_int_equal(m->layers[l].t[idx].dtype, VKS_DTYPE_F32);
            for (int64_t r = 0; r < out; r++) {
                int64_t hr = adj && rope_target(t) ? hf_row_of_adjacent(r, hd) : r;
                assert_memory_equal(B + r * rank, v->B[l][k] + hr * rank, (size_t)rank * 4);
                for (int64_t i = 0; i < in; i += 7) {
                    double d = 0;
                    for (int j = 0; j < rank; j++) d += (double)v->B[l][k][hr * rank + j] * v->A[l][k][j * in + i];
                    float want = (float)((double)weight_at(base, l, idx, r, i) + s * d);
                    assert_true(weight_at(m, l, idx, r, i) == want);
                }
            }
        }
    /* an untargeted matrix is unchanged */
    for (int64_t r = 0; r < base->cfg.kv_dim; r += 5)
        assert_true(weight_at(m, 1, VKS_T_wv, r, 3) == weight_at(base, 1, VKS_T_wv, r, 3));
    vks_model_free(m);
}

static void test_peft_by_hand(void **state) {
    (void)state;
    vks_dtype types[2] = {VKS_DTYPE_BF16, VKS_DTYPE_F16};
    for (int d = 0; d < 2; d++) {
        hand_values v = {0};
        hand_opts o = hand_default();
        o.dtype = types[d];
        const char *dir = write_hand_peft(d ? "hand_f16" : "hand_bf16", &o, &v);
        for (int adj = 0; adj < 2; adj++) {
            vks_model *base = load_base(adj);
            vks_lora_adapter *a = NULL;
            assert_int_equal(vks_lora_load(dir, base, &a), VKS_OK);
            const vks_lora_config *lc = vks_lora_adapter_config(a);
            assert_int_equal(lc->rank, 4);
            assert_true(lc->alpha == HAND_ALPHA);
            assert_int_equal(lc->targets, HAND_TARGETS);
            check_hand_adapter(base, a, &v);
            /* what vkswarm writes back loads to the same matrices */
            char again[512];
            tmp_path(adj ? "hand_again_adj" : "hand_again", again, sizeof again);
            vks_lora_adapter *b = NULL;
            assert_int_equal(vks_lora_save_peft(again, a), VKS_OK);
            assert_int_equal(vks_lora_load(again, base, &b), VKS_OK);
            assert_same_adapter(a, b, &base->cfg);
            vks_lora_adapter_free(b);
            vks_lora_adapter_free(a);
            vks_model_free(base);
        }
        hand_values_free(&v);
    }
}

/* An adapter written with o is refused for the tiny model, the message naming file and what. */
static void expect_refused(const char *name, const hand_opts *o, const char *file, const char *what) {
    hand_values v = {0};
    const char *dir = write_hand_peft(name, o, &v);
    vks_model *base = load_base(false);
    vks_lora_adapter *a = NULL;
    int rc = vks_lora_load(dir, base, &a);
    if (rc != VKS_ERR_FORMAT || !strstr(vks_last_error(), file) || !strstr(vks_last_error(), what))
        fail_msg("%s: rc %d, message '%s' (wanted %s and %s)", name, rc, vks_last_error(), file, what);
    assert_null(a);
    assert_null(strchr(vks_last_error(), '\n'));
    vks_model_free(base);
    hand_values_free(&v);
}

#define CFG "adapter_config.json"
#define ST "adapter_model.safetensors"

static void test_peft_refused(void **state) {
    (void)state;
    hand_opts o = hand_default();
    o.skip = "base_model.model.model.layers.2.self_attn.k_proj.lora_B.weight";
    expect_refused("missing", &o, ST, "missing tensor base_model.model.model.layers.2.self_attn.k_proj.lora_B.weight");
    o = hand_default();
    o.add = "base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight";
    expect_refused("extra", &o, ST, "tensor base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight is not");
    o = hand_default();
    o.add = "base_model.model.model.layers.4.self_attn.q_proj.lora_A.weight"; /* a layer the base lacks */
    expect_refused("extra_layer", &o, ST, "layers.4.self_attn.q_proj.lora_A.weight is not");
    o = hand_default();
    o.bad = "base_model.model.model.layers.1.mlp.up_proj.lora_B.weight";
    expect_refused("nan", &o, ST, "tensor base_model.model.model.layers.1.mlp.up_proj.lora_B.weight: element 768 is NaN");
    o.bad_inf = true;
    expect_refused("inf", &o, ST, "layers.1.mlp.up_proj.lora_B.weight: element 768 is Inf");
    o = hand_default();
    o.r = "0";
    expect_refused("rank0", &o, CFG, "r: must be an integer >= 1");
    o.r = "65";
    expect_refused("rank_big", &o, CFG, "LoRA rank 65 is outside 1..64 (k_proj is 64 x 128)");
    o = hand_default();
    o.r = "8"; /* tensors of rank 4 */
    expect_refused("rank_other", &o, ST, "layers.0.self_attn.q_proj.lora_A.weight has shape [4, 128]; r and the base need [8, 128]");
    o = hand_default();
    o.targets = "\"q_proj\", \"lm_head\"";
    expect_refused("unknown_target", &o, CFG, "target_modules: unknown module 'lm_head'");
    o = hand_default();
    o.rslora = "true";
    expect_refused("rslora", &o, CFG, "use_rslora: true is not supported");
    o = hand_default();
    o.fan_in_fan_out = "true";
    expect_refused("fifo", &o, CFG, "fan_in_fan_out: true is not supported");
    const char *extras[][2] = {{", \"layers_to_transform\": [0, 1]", "layers_to_transform: is not supported"},
                               {", \"rank_pattern\": {\"q_proj\": 8}", "rank_pattern: is not supported"},
                               {", \"use_dora\": true", "use_dora: true is not supported"},
                               /* modules_to_save: the final norm only */
                               {", \"modules_to_save\": [\"lm_head\"]", "modules_to_save: only [\"norm\"]"},
                               {", \"vkswarm\": {\"base_model_hash\": "
                                "\"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\"}",
                                "the adapter was made for base model 0011223344556677..."}};
    for (size_t i = 0; i < sizeof extras / sizeof extras[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "extra_key%zu", i);
        o = hand_default();
        o.extra = extras[i][0];
        expect_refused(name, &o, CFG, extras[i][1]);
    }
    /* modules_to_save ["norm"] without its tensor */
    o = hand_default();
    o.extra = ", \"modules_to_save\": [\"norm\"]";
    expect_refused("norm_missing", &o, ST, "missing tensor base_model.model.model.norm.weight");
    /* alpha_pattern replaces the empty one of the template: a duplicate key is refused too */
    o = hand_default();
    o.extra = ", \"alpha_pattern\": {\"q_proj\": 8}";
    expect_refused("alpha_pattern", &o, CFG, "bad JSON: duplicate object key");

    /* another base: the shape of its up_proj differs */
    hand_values v = {0};
    o = hand_default();
    const char *dir = write_hand_peft("other_base", &o, &v);
    vks_model_config c;
    vks_model_tiny_config(&c);
    c.hidden_dim = 256;
    vks_model *other = NULL;
    vks_lora_adapter *a = NULL;
    assert_int_equal(vks_model_random(&c, 3, &other), VKS_OK);
    assert_int_equal(vks_lora_load(dir, other, &a), VKS_ERR_FORMAT);
    assert_non_null(strstr(vks_last_error(), ST ": tensor base_model.model.model.layers.0.mlp.up_proj.lora_B.weight has "
                                             "shape [384, 4]; r and the base need [256, 4]"));
    vks_model_free(other);
    hand_values_free(&v);
}

/* ---- GGUF ---- */

static void test_gguf_round_trip(void **state) {
    (void)state;
    /* GGUF names the base's architecture: an adapter whose base is unset is refused */
    vks_model *tiny = load_base(false);
    vks_lora_config lc = {2, 4.0, 1u << VKS_LORA_V};
    vks_lora_adapter *unset = NULL;
    char upath[512];
    assert_int_equal(vks_lora_adapter_create(&tiny->cfg, &lc, &unset), VKS_OK);
    assert_int_equal(vks_lora_save_gguf(tmp_path("unset.gguf", upath, sizeof upath), unset), VKS_ERR_ARG);
    assert_non_null(strstr(vks_last_error(), "set the base first"));
    vks_lora_adapter_free(unset);
    vks_model_free(tiny);
    for (int adj = 0; adj < 2; adj++) {
        vks_model *base = load_base(adj);
        vks_lora_adapter *a = random_adapter(base, 4, 8.0, VKS_LORA_ALL_TARGETS, 9), *g = NULL, *p = NULL;
        char gpath[512], pdir[512];
        tmp_path(adj ? "adj.gguf" : "half.gguf", gpath, sizeof gpath);
        tmp_path(adj ? "adj_peft" : "half_peft", pdir, sizeof pdir);
        assert_int_equal(vks_lora_save_gguf(gpath, a), VKS_OK);
        assert_int_equal(vks_lora_load(gpath, base, &g), VKS_OK);
        assert_same_adapter(a, g, &base->cfg);
        assert_memory_equal(vks_lora_adapter_base_hash(a), vks_lora_adapter_base_hash(g), 32);
        /* the same adapter through PEFT loads to the same matrices */
        assert_int_equal(vks_lora_save_peft(pdir, a), VKS_OK);
        assert_int_equal(vks_lora_load(pdir, base, &p), VKS_OK);
        assert_same_adapter(g, p, &base->cfg);
        /* the file as llama.cpp reads it: metadata, ne = [in, rank] / [rank, out], q rows in llama's GGUF order */
        vks_gguf *f = NULL;
        assert_int_equal(vks_gguf_open(gpath, &f), VKS_OK);
        const char *s = NULL;
        float alpha = 0;
        assert_int_equal(vks_gguf_get_str(f, "general.type", &s, NULL), VKS_OK);
        assert_string_equal(s, "adapter");
        assert_int_equal(vks_gguf_get_str(f, "adapter.type", &s, NULL), VKS_OK);
        assert_string_equal(s, "lora");
        assert_int_equal(vks_gguf_get_str(f, "general.architecture", &s, NULL), VKS_OK);
        assert_string_equal(s, "llama");
        assert_int_equal(vks_gguf_get_f32(f, "adapter.lora.alpha", &alpha), VKS_OK);
        assert_true(alpha == 8.0f);
        assert_int_equal(vks_gguf_n_tensors(f), 2 * 7 * 4);
        const vks_gguf_tensor *ta = vks_gguf_find_tensor(f, "blk.3.ffn_down.weight.lora_a");
        const vks_gguf_tensor *tb = vks_gguf_find_tensor(f, "blk.1.attn_q.weight.lora_b");
        assert_non_null(ta);
        assert_non_null(tb);
        assert_true(ta->ne[0] == 384 && ta->ne[1] == 4 && tb->ne[0] == 4 && tb->ne[1] == 128);
        const float *bq = vks_lora_adapter_B(a, 1, VKS_LORA_Q), *fb = tb->data;
        for (int64_t r = 0; r < 128; r++) { /* GGUF llama rows are adjacent pairs */
            int64_t src = adj ? r : hf_row_of_adjacent(r, 32);
            assert_memory_equal(fb + r * 4, bq + src * 4, 16);
        }
        vks_gguf_close(f);
        vks_lora_adapter_free(p);
        vks_lora_adapter_free(g);
        vks_lora_adapter_free(a);
        vks_model_free(base);
    }
}

/* GGUF adapters that do not fit: one line naming the file and the key or tensor. */
static void test_gguf_refused(void **state) {
    (void)state;
    vks_model *base = load_base(false);
    char path[512];
    tmp_path("bad.gguf", path, sizeof path);
    struct { const char *key, *value, *tensor, *want; } cases[] = {
        {"general.type", "model", NULL, "general.type is 'model', not 'adapter'"},
        {"general.architecture", "qwen2", NULL, "general.architecture is 'qwen2', not 'llama'"},
        {NULL, NULL, "output.weight.lora_a", "tensor output.weight.lora_a is not a LoRA tensor"},
        {NULL, NULL, "blk.4.attn_q.weight.lora_a", "tensor blk.4.attn_q.weight.lora_a is not a LoRA tensor"},
        {NULL, NULL, "nan", "tensor blk.0.attn_k.weight.lora_b: element 0 is NaN"},
        {NULL, NULL, NULL, NULL}, /* the same making unchanged loads: k only, rank 4, alpha 8 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        vks_gguf_writer *w = NULL;
        assert_int_equal(vks_gguf_writer_create(&w), VKS_OK);
        assert_int_equal(vks_gguf_add_str(w, "general.type", cases[i].key && !strcmp(cases[i].key, "general.type") ? cases[i].value : "adapter"), VKS_OK);
        assert_int_equal(vks_gguf_add_str(w, "general.architecture", cases[i].key && !strcmp(cases[i].key, "general.architecture") ? cases[i].value : "llama"), VKS_OK);
        assert_int_equal(vks_gguf_add_str(w, "adapter.type", "lora"), VKS_OK);
        assert_int_equal(vks_gguf_add_f32(w, "adapter.lora.alpha", 8.0f), VKS_OK);
        static float A[4 * 128], B[64 * 4];
        memset(B, 0, sizeof B);
        if (cases[i].tensor && !strcmp(cases[i].tensor, "nan")) B[0] = NAN;
        int64_t ne_a[2] = {128, 4}, ne_b[2] = {4, 64};
        for (int l = 0; l < 4; l++) {
            char n[64];
            snprintf(n, sizeof n, "blk.%d.attn_k.weight.lora_a", l);
            assert_int_equal(vks_gguf_add_tensor(w, n, VKS_DTYPE_F32, 2, ne_a, A), VKS_OK);
            snprintf(n, sizeof n, "blk.%d.attn_k.weight.lora_b", l);
            assert_int_equal(vks_gguf_add_tensor(w, n, VKS_DTYPE_F32, 2, ne_b, B), VKS_OK);
        }
        if (cases[i].tensor && strcmp(cases[i].tensor, "nan"))
            assert_int_equal(vks_gguf_add_tensor(w, cases[i].tensor, VKS_DTYPE_F32, 2, ne_a, A), VKS_OK);
        assert_int_equal(vks_gguf_writer_save(w, path), VKS_OK);
        vks_gguf_writer_free(w);
        vks_lora_adapter *a = NULL;
        int rc = vks_lora_load(path, base, &a);
        if (!cases[i].want) {
            if (rc != VKS_OK) fail_msg("the good file: %s", vks_last_error());
            const vks_lora_config *lc = vks_lora_adapter_config(a);
            assert_true(lc->rank == 4 && lc->alpha == 8.0 && lc->targets == 1u << VKS_LORA_K);
            vks_lora_adapter_free(a);
            continue;
        }
        if (rc != VKS_ERR_FORMAT || !strstr(vks_last_error(), path) || !strstr(vks_last_error(), cases[i].want))
            fail_msg("case %zu: rc %d, message '%s'", i, rc, vks_last_error());
        assert_null(a);
    }
    vks_model_free(base);
}

/* A Qwen2 base: its GGUF keeps Hugging Face's half-split q/k order, so the
 * GGUF file holds B of q as the PEFT file does, and both load to the same
 * adapter. */
static void test_gguf_qwen2(void **state) {
    (void)state;
    vks_model_config c = {.dim = 64, .hidden_dim = 96, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                          .vocab_size = 50, .seq_len = 64};
    vks_model *base = NULL;
    assert_int_equal(vks_model_random_arch(&c, "qwen2", 3, &base), VKS_OK);
    assert_int_equal(base->cfg.rope_mode, VKS_ROPE_HALF);
    vks_lora_adapter *a = random_adapter(base, 2, 4.0, (1u << VKS_LORA_Q) | (1u << VKS_LORA_K), 4), *g = NULL, *p = NULL;
    char gpath[512], pdir[512];
    tmp_path("qwen2.gguf", gpath, sizeof gpath);
    tmp_path("qwen2_peft", pdir, sizeof pdir);
    assert_int_equal(vks_lora_save_gguf(gpath, a), VKS_OK);
    assert_int_equal(vks_lora_save_peft(pdir, a), VKS_OK);
    assert_int_equal(vks_lora_load(gpath, base, &g), VKS_OK);
    assert_int_equal(vks_lora_load(pdir, base, &p), VKS_OK);
    assert_same_adapter(a, g, &base->cfg);
    assert_same_adapter(a, p, &base->cfg);
    vks_gguf *f = NULL;
    assert_int_equal(vks_gguf_open(gpath, &f), VKS_OK);
    const char *arch = NULL;
    assert_int_equal(vks_gguf_get_str(f, "general.architecture", &arch, NULL), VKS_OK);
    assert_string_equal(arch, "qwen2");
    const vks_gguf_tensor *tb = vks_gguf_find_tensor(f, "blk.1.attn_k.weight.lora_b");
    assert_non_null(tb);
    assert_memory_equal(tb->data, vks_lora_adapter_B(a, 1, VKS_LORA_K), (size_t)(32 * 2) * 4);
    vks_gguf_close(f);
    /* a llama base of the same shape is another architecture */
    vks_model *llama = NULL;
    vks_lora_adapter *x = NULL;
    assert_int_equal(vks_model_random_arch(&c, "llama", 3, &llama), VKS_OK);
    assert_int_equal(vks_lora_load(gpath, llama, &x), VKS_ERR_FORMAT);
    assert_non_null(strstr(vks_last_error(), "general.architecture is 'qwen2', not 'llama'"));
    vks_model_free(llama);
    vks_lora_adapter_free(p);
    vks_lora_adapter_free(g);
    vks_lora_adapter_free(a);
    vks_model_free(base);
}

/* ---- merge ---- */

/* A merged model in any q/k order gives W + s B A of its own rows, in double
 * here; the merged model's logits through the float64 reference equal those
 * of the merged weights written out and read back (GGUF, then quantized). */
static void test_merge(void **state) {
    (void)state;
    vks_model *base = load_base(false), *m = load_base(false);
    vks_lora_adapter *a = random_adapter(base, 8, 32.0, VKS_LORA_ALL_TARGETS, 11);
    assert_int_equal(vks_lora_merge(m, a), VKS_OK);
    double s = 32.0 / 8;
    for (int l = 0; l < base->cfg.n_layers; l++)
        for (int t = 0; t < VKS_LORA_TARGET_COUNT; t++) {
            int64_t out, in;
            vks_lora_target_shape(&base->cfg, (vks_lora_target)t, &out, &in);
            const float *A = vks_lora_adapter_A(a, l, t), *B = vks_lora_adapter_B(a, l, t);
            int idx = vks_lora_target_tensor((vks_lora_target)t);
            for (int64_t r = 0; r < out; r += 3)
                for (int64_t i = 0; i < in; i += 5) {
                    double d = 0;
                    for (int k = 0; k < 8; k++) d += (double)B[r * 8 + k] * A[k * in + i];
                    double want = (double)weight_at(base, l, idx, r, i) + s * d;
                    assert_true(weight_at(m, l, idx, r, i) == (float)want);
                }
        }
    /* a quantized base (q8_0 GGUF, adjacent q/k rows): W is its decoded values */
    char qpath[512];
    tmp_path("base_q8.gguf", qpath, sizeof qpath);
    vks_model_save_options qo = {.dtype = VKS_DTYPE_Q8_0};
    assert_int_equal(vks_model_save_gguf(base, qpath, &qo), VKS_OK);
    vks_model *q = NULL, *qm = NULL;
    assert_int_equal(vks_model_load_gguf(qpath, &q), VKS_OK);
    assert_int_equal(vks_model_load_gguf(qpath, &qm), VKS_OK);
    assert_int_equal(q->layers[0].wq.dtype, VKS_DTYPE_Q8_0);
    vks_lora_adapter *qa = random_adapter(q, 2, 4.0, (1u << VKS_LORA_Q) | (1u << VKS_LORA_DOWN), 12);
    assert_int_equal(vks_lora_merge(qm, qa), VKS_OK);
    for (int l = 0; l < 4; l++)
        for (int t = 0; t < VKS_LORA_TARGET_COUNT; t++) {
            int64_t out, in;
            vks_lora_target_shape(&q->cfg, (vks_lora_target)t, &out, &in);
            const float *A = vks_lora_adapter_A(qa, l, t), *B = vks_lora_adapter_B(qa, l, t);
            int idx = vks_lora_target_tensor((vks_lora_target)t);
            assert_int_equal(qm->layers[l].t[idx].dtype, VKS_DTYPE_F32);
            for (int64_t r = 0; r < out; r += 11)
                for (int64_t i = 0; i < in; i += 13) {
                    double d = 0;
                    for (int k = 0; A && k < 2; k++) d += (double)B[r * 2 + k] * A[k * in + i];
                    assert_true(weight_at(qm, l, idx, r, i) == (float)((double)weight_at(q, l, idx, r, i) + 2.0 * d));
                }
        }
    vks_lora_adapter_free(qa);
    vks_model_free(qm);
    vks_model_free(q);
    /* a fresh adapter (B = 0) leaves every weight as it was */
    vks_lora_adapter *fresh = NULL;
    vks_lora_config lc = {4, 8.0, VKS_LORA_ALL_TARGETS};
    vks_model *m2 = load_base(false);
    assert_int_equal(vks_lora_adapter_create(&base->cfg, &lc, &fresh), VKS_OK);
    assert_int_equal(vks_lora_adapter_init(fresh, 1), VKS_OK);
    assert_int_equal(vks_lora_merge(m2, fresh), VKS_OK);
    uint8_t h1[32], h2[32];
    assert_int_equal(vks_model_hash(base, h1), VKS_OK);
    assert_int_equal(vks_model_hash(m2, h2), VKS_OK);
    assert_memory_equal(h1, h2, 32); /* the tiny model is f32: the same bytes */
    /* an adapter for another q/k order is refused */
    vks_model *adj = load_base(true);
    assert_int_equal(vks_lora_merge(adj, a), VKS_ERR_ARG);
    assert_non_null(strstr(vks_last_error(), "another shape or q/k RoPE order"));
    vks_model_free(adj);
    vks_model_free(m2);
    vks_lora_adapter_free(fresh);
    vks_lora_adapter_free(a);
    vks_model_free(m);
    vks_model_free(base);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_targets),
        cmocka_unit_test(test_adapter_layout),
        cmocka_unit_test(test_hashes),
        cmocka_unit_test(test_peft_round_trip),
        cmocka_unit_test(test_peft_by_hand),
        cmocka_unit_test(test_peft_refused),
        cmocka_unit_test(test_gguf_round_trip),
        cmocka_unit_test(test_gguf_refused),
        cmocka_unit_test(test_gguf_qwen2),
        cmocka_unit_test(test_merge),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
