/* The GPU engine end to end: stories260K logits and greedy text against the
 * llama2.c references, the CPU forward on random models, weight splitting,
 * feeds of several sequences, batch-invariant sampling and refusals. */
#include "test_util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "vkswarm/vks_ref_forward.h"
#include "vkswarm/vks_engine.h"
#include "vkswarm/vks_ref.h"
#include "vkswarm/vks_cpu.h"
#include "vkswarm/vks_tokenizer.h"

static vks_gpu *gpu;

static int setup(void **state) {
    (void)state;
    if (!(gpu = tu_gpu_open())) return -1;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    vks_gpu_destroy(gpu);
    return 0;
}

static void assert_no_validation_messages(void) { assert_int_equal(vks_gpu_validation_messages(gpu), 0); }

/* Reads a ref .ids file: the data line (tokens fed, then one sampled). */
static int32_t *read_ref_ids(const char *name, int *n) {
    char rel[256];
    snprintf(rel, sizeof rel, "stories260K/ref/%s.ids", name);
    const char *path = tu_shared_path(rel);
    if (!path) return NULL;
    char *text = (char *)tu_read_file(path, NULL);
    assert_non_null(text);
    int32_t *ids = malloc(sizeof(int32_t) * 4096);
    *n = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#') continue;
        for (char *tok = line; *tok;) {
            char *end;
            long v = strtol(tok, &end, 10);
            if (end == tok) break;
            ids[(*n)++] = (int32_t)v;
            tok = end;
        }
    }
    free(text);
    return ids;
}

static float *read_ref_logits(const char *name, size_t *n_floats) {
    char rel[256];
    snprintf(rel, sizeof rel, "stories260K/ref/%s.logits.f32", name);
    const char *path = tu_shared_path(rel);
    size_t bytes;
    float *l = path ? (float *)tu_read_file(path, &bytes) : NULL;
    if (l) *n_floats = bytes / 4;
    return l;
}

static vks_model *load_stories(void) {
    const char *path = tu_shared_path("stories260K/stories260K.bin");
    if (!path) return NULL;
    vks_model *m = NULL;
    assert_int_equal(vks_model_load_llama2c(path, &m), VKS_OK);
    return m;
}

/* Feeds ids at positions 0..n-1 of slot 0 in chunks of `chunk` rows; logits for every row. */
static void engine_logits(vks_engine *e, const int32_t *ids, int n, int chunk, float *logits, int V) {
    (void)V;
    int rc = vks_engine_logits(e, 0, ids, 0, n, chunk, logits, NULL);
    if (rc) fprintf(stderr, "forward: %s\n", vks_last_error());
    assert_int_equal(rc, VKS_OK);
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = d; /* NaN propagates as a failure */
    }
    return m;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[best]) best = i;
    return best;
}

/* Runs one ref case with the given dtype/chunking; returns max |diff| and top-1 agreement. */
static void run_ref_case(vks_model *m, const char *name, vks_dtype dt, int chunk, uint64_t max_chunk_bytes,
                         double *max_diff, double *top1) {
    int n_ids;
    int32_t *ids = read_ref_ids(name, &n_ids);
    size_t nf = 0;
    float *ref = read_ref_logits(name, &nf);
    assert_non_null(ids);
    assert_non_null(ref);
    int V = m->cfg.vocab_size, N = (int)(nf / (size_t)V);
    assert_true(N <= n_ids);
    vks_engine_options o = {.dtype = dt, .n_slots = 1, .kv_len = N, .max_rows = chunk,
                            .max_chunk_bytes = max_chunk_bytes};
    vks_engine *e = NULL;
    assert_int_equal(vks_engine_create(gpu, m, &o, &e), VKS_OK);
    float *got = malloc(sizeof(float) * nf);
    for (size_t i = 0; i < nf; i++) got[i] = NAN;
    engine_logits(e, ids, N, chunk, got, V);
    assert_false(tu_has_nonfinite(got, nf));
    *max_diff = max_abs_diff(got, ref, nf);
    int agree = 0;
    for (int p = 0; p < N; p++) agree += argmax(got + (size_t)p * V, V) == argmax(ref + (size_t)p * V, V);
    *top1 = (double)agree / N;
    vks_engine_destroy(e);
    free(got); free(ref); free(ids);
}

static void test_stories_logits_f32(void **state) {
    (void)state;
    vks_model *m = load_stories();
    if (!m) skip();
    const char *cases[] = {"greedy_noprompt_n200", "greedy_onceuponatime_n64"};
    int chunks[] = {200, 17, 1};
    for (int c = 0; c < 2; c++)
        for (int k = 0; k < 3; k++) {
            double d, top1;
            run_ref_case(m, cases[c], VKS_DTYPE_F32, chunks[k], 0, &d, &top1);
            fprintf(stderr, "%s chunk %d: max |diff| %.3g, top-1 %.4f\n", cases[c], chunks[k], d, top1);
            assert_true(d <= 1e-4);
            assert_true(top1 == 1.0);
        }
    vks_model_free(m);
    assert_no_validation_messages();
}

static void test_stories_logits_half(void **state) {
    (void)state;
    vks_model *m = load_stories();
    if (!m) skip();
    vks_dtype types[] = {VKS_DTYPE_F16, VKS_DTYPE_BF16};
    for (int t = 0; t < 2; t++) {
        double d, top1;
        run_ref_case(m, "greedy_noprompt_n200", types[t], 64, 0, &d, &top1);
        fprintf(stderr, "%s: max |diff| %.3g, top-1 agreement %.4f\n", vks_dtype_name(types[t]), d, top1);
        assert_true(top1 >= 0.99);
        assert_true(d < 1.0); /* a sanity bound: the weights, not the method, differ */
    }
    vks_model_free(m);
    assert_no_validation_messages();
}

/* Weights split into many bindings (as tensors above 128 MiB are on lavapipe) give the same logits. */
static void test_split_weights(void **state) {
    (void)state;
    vks_model *m = load_stories();
    if (!m) skip();
    double d, top1;
    run_ref_case(m, "greedy_onceuponatime_n64", VKS_DTYPE_F32, 32, 12000, &d, &top1);
    assert_true(d <= 1e-4);
    run_ref_case(m, "greedy_onceuponatime_n64", VKS_DTYPE_F16, 32, 12000, &d, &top1);
    assert_true(top1 >= 0.98);
    vks_model_free(m);
    assert_no_validation_messages();
}

/* Progress: the reported step never passes the total, and reaches its end. */
typedef struct { int last, calls; } progress_seen;
static void check_progress(void *user, int step, int n_steps, int active) {
    progress_seen *p = user;
    if (!(step >= p->last && step < n_steps && active > 0)) fail_msg("step %d after %d of %d, %d active", step, p->last, n_steps, active);
    p->last = step;
    p->calls++;
}

static char *generate_text(vks_model *m, vks_tokenizer *t, const char *prompt, int steps) {
    vks_sequence s = {0};
    s.ids = malloc(sizeof(int32_t) * (strlen(prompt) + 3));
    assert_int_equal(vks_tokenizer_encode(t, prompt, strlen(prompt), true, false, s.ids, &s.n_prompt), VKS_OK);
    vks_engine_options o = {.n_slots = 1, .kv_len = steps, .max_rows = 8};
    vks_engine *e;
    assert_int_equal(vks_engine_create(gpu, m, &o, &e), VKS_OK);
    progress_seen seen = {0};
    vks_generate_options g = {.sched = {.steps = steps, .temperature = 0, .stop_token_a = 1, .stop_token_b = -1},
                              .on_step = check_progress, .user = &seen};
    assert_int_equal(vks_generate(e, &g, &s, 1, 0), VKS_OK);
    assert_true(seen.calls > 0);
    assert_true(seen.last >= s.n_ids - 2 && seen.last < steps); /* reached the end */
    char *out = calloc(1, 65536);
    size_t len = 0;
    for (int i = 0; i + 1 < s.n_ids; i++) {
        char buf[32];
        size_t plen;
        const char *piece = vks_tokenizer_decode(t, s.ids[i], s.ids[i + 1], buf, &plen);
        if (!vks_tokenizer_piece_printable(piece, plen)) continue;
        memcpy(out + len, piece, plen);
        len += plen;
    }
    out[len++] = '\n';
    vks_engine_destroy(e);
    vks_sequence_free(&s);
    return out;
}

static void test_greedy_text(void **state) {
    (void)state;
    vks_model *m = load_stories();
    const char *tokp = tu_shared_path("stories260K/tok512.bin");
    if (!m || !tokp) skip();
    vks_tokenizer *t;
    assert_int_equal(vks_tokenizer_load_llama2c(tokp, m->cfg.vocab_size, &t), VKS_OK);
    struct { const char *prompt; int steps; const char *ref; } cases[] = {
        {"", 200, "stories260K/ref/greedy_noprompt_n200.txt"},
        {"Once upon a time", 64, "stories260K/ref/greedy_onceuponatime_n64.txt"},
        {"", 256, "stories260K/ref/greedy_noprompt_n256.txt"},
    };
    for (int c = 0; c < 3; c++) {
        char *want = (char *)tu_read_file(tu_shared_path(cases[c].ref), NULL);
        char *got = generate_text(m, t, cases[c].prompt, cases[c].steps);
        assert_string_equal(got, want);
        free(want);
        free(got);
    }
    vks_tokenizer_free(t);
    vks_model_free(m);
    assert_no_validation_messages();
}

/* A random GQA model with sizes that are not multiples of any tile. */
static vks_model *odd_random_model(uint64_t seed) {
    vks_model_config c = {.dim = 96, .hidden_dim = 200, .n_layers = 2, .n_heads = 6, .n_kv_heads = 2,
                          .vocab_size = 301, .seq_len = 64, .head_dim = 16, .kv_dim = 32, .norm_eps = 1e-5f,
                          .rope_theta = 10000.0f, .rope_mode = VKS_ROPE_HALF, .shared_classifier = false};
    vks_model *m;
    assert_int_equal(vks_model_random(&c, seed, &m), VKS_OK);
    return m;
}

/* GPU logits of m against the float64 reference forward (frees m). */
static void check_model_vs_ref(vks_model *m, const char *label) {
    const vks_model_config c = m->cfg;
    int N = 40;
    int32_t ids[40];
    for (int i = 0; i < N; i++) ids[i] = (i * 37 + 5) % c.vocab_size;
    float *want = malloc(sizeof(float) * (size_t)N * c.vocab_size), *got = malloc(sizeof(float) * (size_t)N * c.vocab_size);
    assert_int_equal(vks_ref_forward(m, ids, N, want, NULL), VKS_OK);
    vks_engine_options o = {.n_slots = 1, .kv_len = N, .max_rows = 13};
    vks_engine *e;
    assert_int_equal(vks_engine_create(gpu, m, &o, &e), VKS_OK);
    engine_logits(e, ids, N, 13, got, c.vocab_size);
    double nmse = tu_nmse(got, want, (size_t)N * c.vocab_size);
    fprintf(stderr, "%s: nmse %.3g\n", label, nmse);
    assert_true(nmse < 1e-10);
    vks_engine_destroy(e);
    vks_model_free(m);
    free(want);
    free(got);
    assert_no_validation_messages();
}

/* The f16 KV cache (kv_f16) against the reference forward whose K and V are
 * rounded to half as the cache stores them: the f32 cache's limit. The odd
 * random model with a 300-position context, 3 query heads per KV head:
 * rows on both sides of the split attention's first boundary (256 keys). */
static void test_kv_f16_vs_ref(void **state) {
    (void)state;
    vks_model_config c = {.dim = 96, .hidden_dim = 200, .n_layers = 2, .n_heads = 6, .n_kv_heads = 2,
                          .vocab_size = 301, .seq_len = 300, .head_dim = 16, .kv_dim = 32, .norm_eps = 1e-5f,
                          .rope_theta = 10000.0f, .rope_mode = VKS_ROPE_HALF, .shared_classifier = false};
    vks_model *m;
    assert_int_equal(vks_model_random(&c, 7, &m), VKS_OK);
    enum { N = 300 };
    static int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (i * 37 + 5) % c.vocab_size;
    size_t nl = (size_t)N * c.vocab_size;
    float *want = malloc(sizeof(float) * nl), *got = malloc(sizeof(float) * nl);
    assert_int_equal(vks_ref_forward_kv_f16(m, NULL, ids, N, want, NULL, NULL), VKS_OK);
    vks_engine_options o = {.n_slots = 1, .kv_len = N, .max_rows = 64, .kv_f16 = true};
    vks_engine *e;
    assert_int_equal(vks_engine_create(gpu, m, &o, &e), VKS_OK);
    engine_logits(e, ids, N, 64, got, c.vocab_size);
    double nmse = tu_nmse(got, want, nl);
    fprintf(stderr, "kv f16 vs reference with f16 K/V: nmse %.3g\n", nmse);
    assert_true(nmse < 1e-10);
    assert_int_equal(vks_ref_forward(m, ids, N, want, NULL), VKS_OK); /* the rounding shows: not the f32 answer */
    double nmse32 = tu_nmse(got, want, nl);
    fprintf(stderr, "kv f16 vs reference with f32 K/V: nmse %.3g\n", nmse32);
    assert_true(nmse32 > 1e-10);
    vks_engine_destroy(e);
    vks_model_free(m);
    free(want);
    free(got);
    assert_no_validation_messages();
}

/* The odd random model: GPU vs CPU forward. */
static void test_random_model_vs_cpu(void **state) {
    (void)state;
    check_model_vs_ref(odd_random_model(7), "random model");
}

/* Largest |a - ref| over the largest |ref|. */
static double rel_diff(const float *a, const float *ref, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - ref[i]));
        s = fmax(s, fabs((double)ref[i]));
    }
    return d / s;
}

/* Every architecture (convert --random-model --arch's models): written as a
 * Hugging Face directory and as GGUF, each read back gives the in-memory
 * model's reference logits on the GPU, on the CPU verifier and in the
 * reference (1e-4 relative). */
static void test_architectures_every_path(void **state) {
    (void)state;
    const char *archs[] = {"llama", "llama3", "qwen2", "qwen3"};
    const char *dir = tu_tmpdir();
    enum { N = 24 };
    int32_t ids[N];
    for (int a = 0; a < 4; a++) {
        vks_model_config c = {.dim = 64, .hidden_dim = 96, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                              .vocab_size = 97, .seq_len = 64, .head_dim = a == 3 ? 32 : 0, .norm_eps = 1e-6f};
        vks_model *m;
        if (vks_model_random_arch(&c, archs[a], 40 + (uint64_t)a, &m)) fail_msg("%s", vks_last_error());
        size_t V = (size_t)c.vocab_size;
        for (int i = 0; i < N; i++) ids[i] = (i * 31 + 7 * a) % c.vocab_size;
        float *want = malloc(sizeof(float) * N * V), *got = malloc(sizeof(float) * N * V);
        assert_int_equal(vks_ref_forward(m, ids, N, want, NULL), VKS_OK);
        char gguf[1100], hf[1100];
        snprintf(gguf, sizeof gguf, "%s/%s.gguf", dir, archs[a]);
        snprintf(hf, sizeof hf, "%s/%s-hf", dir, archs[a]);
        assert_int_equal(vks_model_save_gguf(m, gguf, NULL), VKS_OK);
        assert_int_equal(vks_model_save_safetensors(m, hf, NULL), VKS_OK);
        const char *files[] = {gguf, hf};
        for (int f = 0; f < 2; f++) {
            vks_model *l;
            if (vks_model_load(files[f], &l)) fail_msg("%s", vks_last_error());
            assert_int_equal(vks_ref_forward(l, ids, N, got, NULL), VKS_OK);
            double ref = rel_diff(got, want, N * V);
            vks_cpu *cpu;
            int lens[1] = {N};
            assert_int_equal(vks_cpu_create(l, NULL, &cpu), VKS_OK);
            assert_int_equal(vks_cpu_prefill(cpu, ids, lens, 1, NULL, N, got, NULL), VKS_OK);
            vks_cpu_destroy(cpu);
            double on_cpu = rel_diff(got, want, N * V);
            vks_engine_options o = {.n_slots = 1, .kv_len = N, .max_rows = 16};
            vks_engine *e;
            assert_int_equal(vks_engine_create(gpu, l, &o, &e), VKS_OK);
            engine_logits(e, ids, N, 16, got, c.vocab_size);
            vks_engine_destroy(e);
            double on_gpu = rel_diff(got, want, N * V);
            fprintf(stderr, "%-6s from %-4s: relative logit difference reference %.2g, CPU %.2g, GPU %.2g\n", archs[a],
                    f ? "HF" : "GGUF", ref, on_cpu, on_gpu);
            assert_true(ref < 1e-4 && on_cpu < 1e-4 && on_gpu < 1e-4);
            vks_model_free(l);
        }
        free(want);
        free(got);
        vks_model_free(m);
    }
    assert_no_validation_messages();
}

/* Qwen3: per-head q/k RMSNorm before RoPE, head_dim 24 with 6 heads on dim 96. */
static void test_qwen3_vs_cpu(void **state) {
    (void)state;
    vks_model_config c = {.dim = 96, .hidden_dim = 200, .n_layers = 2, .n_heads = 6, .n_kv_heads = 2,
                          .vocab_size = 301, .seq_len = 64, .head_dim = 24, .kv_dim = 48, .norm_eps = 1e-6f,
                          .rope_theta = 1000000.0f, .rope_mode = VKS_ROPE_HALF, .shared_classifier = true,
                          .qk_norm = true};
    vks_model *m;
    assert_int_equal(vks_model_random(&c, 6, &m), VKS_OK);
    assert_string_equal(m->arch, "qwen3");
    check_model_vs_ref(m, "qwen3 (q/k norm, head_dim 24)");
}

/* head_dim 24 with 6 heads on dim 96 (q 144 wide), as Qwen3's 128 x 16 on 1024. */
static void test_head_dim_vs_cpu(void **state) {
    (void)state;
    vks_model_config c = {.dim = 96, .hidden_dim = 200, .n_layers = 2, .n_heads = 6, .n_kv_heads = 2,
                          .vocab_size = 301, .seq_len = 64, .head_dim = 24, .kv_dim = 48, .norm_eps = 1e-5f,
                          .rope_theta = 10000.0f, .rope_mode = VKS_ROPE_HALF, .shared_classifier = false};
    vks_model *m;
    assert_int_equal(vks_model_random(&c, 5, &m), VKS_OK);
    check_model_vs_ref(m, "head_dim 24 of 96 / 6 heads");
}

/* A feed of three sequences (one starting mid-way, with its earlier positions
 * in the cache already) packs them into forwards of 13 rows with at most 4
 * output rows: every output row arrives once, in feeding order, with the
 * reference forward's logits and final-norm rows, and a forward's rows are
 * still intact after the next forward (the two buffers alternate). */
static void test_feed_several_sequences(void **state) {
    (void)state;
    vks_model *m = odd_random_model(11);
    const vks_model_config c = m->cfg;
    enum { S = 3, L = 30 };
    const int end[S] = {9, 30, 5}, out_begin[S] = {6, 12, 0};
    size_t V = (size_t)c.vocab_size, D = (size_t)c.dim;
    int32_t ids[S][L];
    float *want_logits[S], *want_hidden[S];
    for (int s = 0; s < S; s++) {
        for (int p = 0; p < L; p++) ids[s][p] = (p * 37 + s * 101 + 5) % c.vocab_size;
        want_logits[s] = malloc(sizeof(float) * L * V);
        want_hidden[s] = malloc(sizeof(float) * L * D);
        assert_int_equal(vks_ref_forward(m, ids[s], end[s], want_logits[s], want_hidden[s]), VKS_OK);
    }
    vks_engine_options o = {.n_slots = S, .kv_len = L, .max_rows = 13, .max_out_rows = 4};
    vks_engine *e;
    assert_int_equal(vks_engine_create(gpu, m, &o, &e), VKS_OK);
    /* sequence 1's positions 0..9 go in first, alone */
    float *skipped = malloc(sizeof(float) * 10 * V);
    assert_int_equal(vks_engine_logits(e, 1, ids[1], 0, 10, 0, skipped, NULL), VKS_OK);
    vks_feed_seq seqs[S];
    for (int s = 0; s < S; s++)
        seqs[s] = (vks_feed_seq){.slot = (uint32_t)s, .ids = ids[s], .end = end[s], .out_begin = out_begin[s]};
    seqs[1].begin = 10;
    vks_feed *f;
    vks_feed_options fo = {.want_hidden = true};
    assert_int_equal(vks_feed_create(e, seqs, S, &fo, &f), VKS_OK);
    const vks_feed_rows *rows, *prev = NULL;
    float *prev_copy = malloc(sizeof(float) * 4 * V);
    int next_seq = 0, next_pos = out_begin[0], forwards = 0, worst_pos = -1;
    double worst = 0, worst_h = 0;
    for (;;) {
        assert_int_equal(vks_feed_next(f, &rows), VKS_OK);
        if (!rows) break;
        forwards++;
        assert_true(rows->n >= 0 && rows->n <= 4);
        if (prev) assert_memory_equal(prev->logits, prev_copy, sizeof(float) * (size_t)prev->n * V);
        for (int i = 0; i < rows->n; i++) {
            if (next_pos == end[next_seq]) next_seq++, next_pos = out_begin[next_seq];
            assert_int_equal(rows->seq[i], next_seq);
            assert_int_equal(rows->pos[i], next_pos);
            size_t at = (size_t)next_pos;
            double d = tu_nmse(rows->logits + i * V, want_logits[next_seq] + at * V, V);
            double h = tu_nmse(rows->hidden + i * D, want_hidden[next_seq] + at * D, D);
            if (d > worst) worst = d, worst_pos = next_pos;
            if (h > worst_h) worst_h = h;
            next_pos++;
        }
        memcpy(prev_copy, rows->logits, sizeof(float) * (size_t)rows->n * V);
        prev = rows;
    }
    assert_int_equal(next_seq, S - 1);
    assert_int_equal(next_pos, end[S - 1]);
    /* 9 + 20 + 5 rows, 3 + 18 + 5 of them output rows: at least 7 forwards */
    fprintf(stderr, "feed: %d forwards, worst nmse %.3g (position %d), hidden %.3g\n", forwards, worst, worst_pos,
            worst_h);
    assert_true(forwards >= 7);
    assert_true(worst < 1e-10 && worst_h < 1e-10);
    vks_feed_destroy(f);
    vks_engine_destroy(e);
    vks_model_free(m);
    for (int s = 0; s < S; s++) free(want_logits[s]), free(want_hidden[s]);
    free(skipped);
    free(prev_copy);
    assert_no_validation_messages();
}

/* Seeded sampling does not depend on what else is in the batch. */
static void test_batch_invariant_sampling(void **state) {
    (void)state;
    vks_model *m = load_stories();
    if (!m) skip();
    int32_t prompts[3][4] = {{1, 403, 407, 261}, {1, 300}, {1}};
    int lens[3] = {4, 2, 1};
    vks_generate_options g = {.sched = {.steps = 40, .temperature = 0.9f, .top_p = 0.9f, .top_k = 40, .seed = 42,
                                        .stop_token_a = 1, .stop_token_b = -1}};
    vks_sequence batch[3] = {{0}};
    for (int s = 0; s < 3; s++) {
        batch[s].ids = malloc(16);
        memcpy(batch[s].ids, prompts[s], sizeof(int32_t) * (size_t)lens[s]);
        batch[s].n_prompt = lens[s];
    }
    vks_engine_options o = {.n_slots = 3, .kv_len = 40, .max_rows = 5};
    vks_engine *e;
    assert_int_equal(vks_engine_create(gpu, m, &o, &e), VKS_OK);
    assert_int_equal(vks_generate(e, &g, batch, 3, 0), VKS_OK);
    for (int s = 0; s < 3; s++) {
        vks_sequence alone = {0};
        alone.ids = malloc(16);
        memcpy(alone.ids, prompts[s], sizeof(int32_t) * (size_t)lens[s]);
        alone.n_prompt = lens[s];
        assert_int_equal(vks_generate(e, &g, &alone, 1, (uint32_t)s), VKS_OK);
        assert_int_equal(alone.n_ids, batch[s].n_ids);
        assert_memory_equal(alone.ids, batch[s].ids, sizeof(int32_t) * (size_t)alone.n_ids);
        vks_sequence_free(&alone);
    }
    /* different seeds give different text */
    vks_sequence other = {0};
    other.ids = malloc(16);
    other.ids[0] = 1;
    other.n_prompt = 1;
    g.sched.seed = 43;
    assert_int_equal(vks_generate(e, &g, &other, 1, 2), VKS_OK);
    assert_true(other.n_ids != batch[2].n_ids || memcmp(other.ids, batch[2].ids, 4 * (size_t)other.n_ids) != 0);
    vks_sequence_free(&other);
    for (int s = 0; s < 3; s++) vks_sequence_free(&batch[s]);
    vks_engine_destroy(e);
    vks_model_free(m);
    assert_no_validation_messages();
}

/* record_logp: every sampled token's recorded log-probability (and the stop
 * token's) equals log-softmax at temperature 1 of the float64 reference
 * forward's logits over the finished sequence, whatever the sampling
 * temperature; ids do not change when recording. */
static void test_record_logp(void **state) {
    (void)state;
    vks_model *m = odd_random_model(11);
    const int V = m->cfg.vocab_size, S = 3, steps = 24;
    vks_generate_options g = {.sched = {.steps = steps, .temperature = 0.7f, .top_p = 1.0f, .seed = 5,
                                        .stop_token_a = -1, .stop_token_b = -1}};
    vks_engine_options o = {.n_slots = S, .kv_len = steps, .max_rows = 7};
    vks_engine *e;
    assert_int_equal(vks_engine_create(gpu, m, &o, &e), VKS_OK);
    vks_sequence plain[3] = {{0}}, rec[3] = {{0}};
    for (int s = 0; s < S; s++)
        for (int k = 0; k < 2; k++) {
            vks_sequence *q = k ? &rec[s] : &plain[s];
            q->ids = malloc(sizeof(int32_t) * 4);
            for (int i = 0; i < 2 + s; i++) q->ids[i] = (i * 7 + s + 1) % V;
            q->n_prompt = 2 + s;
        }
    /* a first run without stop tokens picks one that sequence 0 samples */
    vks_sequence probe = {.ids = malloc(sizeof(int32_t) * 4), .n_prompt = 2};
    memcpy(probe.ids, plain[0].ids, sizeof(int32_t) * 2);
    assert_int_equal(vks_generate(e, &g, &probe, 1, 0), VKS_OK);
    assert_true(probe.n_ids > probe.n_prompt + 2);
    g.sched.stop_token_a = probe.ids[probe.n_prompt + 2];
    vks_sequence_free(&probe);
    assert_int_equal(vks_generate(e, &g, plain, S, 0), VKS_OK);
    assert_null(plain[0].logp);
    assert_true(plain[0].stop_token >= 0);
    g.record_logp = true;
    assert_int_equal(vks_generate(e, &g, rec, S, 0), VKS_OK);
    float *logits = malloc(sizeof(float) * (size_t)(steps + 1) * (size_t)V);
    int stopped = 0;
    for (int s = 0; s < S; s++) {
        vks_sequence *q = &rec[s];
        assert_int_equal(q->n_ids, plain[s].n_ids);
        assert_memory_equal(q->ids, plain[s].ids, sizeof(int32_t) * (size_t)q->n_ids);
        assert_non_null(q->logp);
        int n_out = q->n_ids - q->n_prompt + (q->stop_token >= 0);
        stopped += q->stop_token >= 0;
        int32_t all[64];
        memcpy(all, q->ids, sizeof(int32_t) * (size_t)q->n_ids);
        if (q->stop_token >= 0) all[q->n_ids] = q->stop_token;
        assert_int_equal(vks_ref_forward(m, all, q->n_prompt + n_out - 1, logits, NULL), VKS_OK);
        for (int i = 0; i < n_out; i++) {
            const float *row = logits + (size_t)(q->n_prompt - 1 + i) * (size_t)V;
            double mx = row[0], sum = 0;
            for (int v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
            for (int v = 0; v < V; v++) sum += exp(row[v] - mx);
            double want = row[all[q->n_prompt + i]] - mx - log(sum);
            assert_true(want <= 0);
            if (fabs(q->logp[i] - want) > 1e-4) fail_msg("seq %d token %d: logp %.6f, reference %.6f", s, i, q->logp[i], want);
        }
    }
    fprintf(stderr, "record_logp: %d of %d sequences stopped on the stop token\n", stopped, S);
    for (int s = 0; s < S; s++) vks_sequence_free(&plain[s]), vks_sequence_free(&rec[s]);
    free(logits);
    vks_engine_destroy(e);
    vks_model_free(m);
    assert_no_validation_messages();
}

/* A bound on |GPU f32 log-softmax - double log-softmax| for one row, from
 * f32 rounding (u = 2^-24) and the Vulkan precision of exp (3 + 2|x| ulp)
 * and log (3 ulp, or 2^-21 absolute inside [0.5, 2]). The shifted sum
 * s = sum_j exp(x_j - m) (token_logprob.comp: running (max, sum) pairs per
 * lane, then a tree): term j's exp is off by (3 + 2|x_j - m|) u; along its
 * path to the root it passes at most V additions or products (u each) and
 * rescales exp(m_old - m_new) whose arguments sum to at most the row's range
 * (the running max only grows), (3 + 2 |arg|) u each. So s is off by at most
 * u (sum_j (3 + 2|d_j|) e^d_j / s + 7 V + 2 range) relatively, that much
 * absolutely in log(s); lse = m + log(s) and logp = x_t - lse round once
 * each (u |lse|, u |logp|), and the double result rounds to f32 (u |logp|). */
static double logp_f32_bound(const float *row, int V, double logp) {
    const double u = 0x1p-24;
    double mx = row[0], mn = row[0], s = 0, w = 0;
    for (int v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx, mn = row[v] < mn ? row[v] : mn;
    for (int v = 0; v < V; v++) {
        double d = (double)row[v] - mx;
        s += exp(d), w += (3 - 2 * d) * exp(d);
    }
    double range = mx - mn, lse = mx + log(s);
    return u * (w / s + 7.0 * V + 2 * range + 8 + 3 * log(s) + fabs(lse) + 2 * fabs(logp));
}

/* sampled_logp: the device's log-softmax of each sampled token against the
 * host's double path (vks_token_logp over the same forward's logits) within
 * the f32 bound above, the same values whether or not the logits are
 * downloaded, and the step's download shrinking from O x (vocab + 1) floats
 * to 2 O floats. */
static void check_sampled_logp(vks_model *m, const char *label) {
    const int V = m->cfg.vocab_size, N = 24;
    vks_engine_options o = {.n_slots = 1, .kv_len = N, .max_rows = N};
    vks_engine *e;
    assert_int_equal(vks_engine_create(gpu, m, &o, &e), VKS_OK);
    int32_t ids[24], sampled[24], sampled2[24];
    uint32_t slot[24] = {0}, pos[24], rows[24];
    vks_gpu_sample_row sample[24];
    float logp[24], logp2[24], *logits = malloc(sizeof(float) * (size_t)N * (size_t)V);
    for (int i = 0; i < N; i++) {
        ids[i] = (i * 37 + 5) % V, pos[i] = rows[i] = (uint32_t)i;
        sample[i] = (vks_gpu_sample_row){.temperature = i % 3 == 0 ? 0.0f : 0.4f * (float)(i % 5), .top_k = (uint32_t)(i % 4) * 7,
                                         .top_p = i % 2 ? 0.9f : 1.0f, .seed_lo = 7, .seq = 0, .pos = (uint32_t)i};
    }
    vks_forward_batch b = {.n_rows = N, .tokens = ids, .slot = slot, .pos = pos, .n_out = N, .out_rows = rows,
                           .logits = logits, .sample = sample, .sampled = sampled, .sampled_logp = logp};
    vks_engine_stats s0, s1, s2;
    vks_engine_stats_get(e, &s0);
    assert_int_equal(vks_engine_forward(e, &b), VKS_OK);
    vks_engine_stats_get(e, &s1);
    double worst = 0, worst_bound = 0;
    for (int i = 0; i < N; i++) {
        const float *row = logits + (size_t)i * (size_t)V;
        double want = vks_token_logp(row, V, sampled[i]), bound = logp_f32_bound(row, V, want);
        double d = fabs((double)logp[i] - want);
        if (!(d <= bound)) fail_msg("%s row %d: GPU logp %.9g, host %.9g, bound %.3g", label, i, logp[i], want, bound);
        if (d > worst) worst = d, worst_bound = bound;
    }
    b.logits = NULL, b.sampled = sampled2, b.sampled_logp = logp2;
    assert_int_equal(vks_engine_forward(e, &b), VKS_OK);
    vks_engine_stats_get(e, &s2);
    assert_memory_equal(sampled2, sampled, sizeof sampled);
    assert_memory_equal(logp2, logp, sizeof logp);
    uint64_t with_logits = s1.download_bytes - s0.download_bytes, without = s2.download_bytes - s1.download_bytes;
    assert_int_equal(with_logits, (uint64_t)N * ((uint64_t)V + 2) * 4);
    assert_int_equal(without, (uint64_t)N * 2 * 4);
    fprintf(stderr, "%s: GPU logp within %.3g of the host's double (bound there %.3g); download per step %llu -> %llu bytes\n",
            label, worst, worst_bound, (unsigned long long)(with_logits - (uint64_t)N * 4), (unsigned long long)without);
    free(logits);
    vks_engine_destroy(e);
    vks_model_free(m);
    assert_no_validation_messages();
}

static void test_sampled_logp_on_gpu(void **state) {
    (void)state;
    check_sampled_logp(odd_random_model(12), "odd random model");
    vks_model *m = load_stories();
    if (m) check_sampled_logp(m, "stories260K");
}

/* Few sampling rows of a large vocabulary: the engine spreads top-k's and
 * top-p's histograms over several workgroups per row (vks_op_sample_split: 9
 * dispatches more than the one-workgroup sampler); the tokens are those of
 * the one-workgroup sampler in a 12-row batch (> VKS_SAMPLE_SPREAD_MAX_ROWS),
 * and a row's token depends on neither path nor batch (VKSWARM_SAMPLE_SPREAD=1:
 * the default on GPUs, off on CPU drivers). */
static void test_sample_split_in_engine(void **state) {
    (void)state;
    vks_model_config c = {.dim = 32, .hidden_dim = 72, .n_layers = 1, .n_heads = 2, .n_kv_heads = 1,
                          .vocab_size = 20011, .seq_len = 16, .head_dim = 16, .kv_dim = 16, .norm_eps = 1e-5f,
                          .rope_theta = 10000.0f, .rope_mode = VKS_ROPE_HALF, .shared_classifier = false};
    vks_model *m;
    assert_int_equal(vks_model_random(&c, 31, &m), VKS_OK);
    enum { N = 12 };
    const uint32_t V = (uint32_t)c.vocab_size, top_k[4] = {40, 1, 0, 20010};
    assert_true(vks_op_sample_groups(NULL, 8, V) > 1 && vks_op_sample_groups(NULL, N, V) == 1);
    vks_engine_options o = {.n_slots = 1, .kv_len = N, .max_rows = N};
    vks_engine *e;
    setenv("VKSWARM_SAMPLE_SPREAD", "1", 1); /* CPU drivers keep one workgroup per row by default */
    int rc = vks_engine_create(gpu, m, &o, &e);
    unsetenv("VKSWARM_SAMPLE_SPREAD");
    assert_int_equal(rc, VKS_OK);
    int32_t ids[N], all[N], part[N];
    uint32_t slot[N] = {0}, pos[N], rows[N];
    vks_gpu_sample_row sample[N];
    for (int i = 0; i < N; i++) {
        ids[i] = (i * 3779 + 5) % (int)V, pos[i] = rows[i] = (uint32_t)i;
        sample[i] = (vks_gpu_sample_row){.temperature = i % 5 == 4 ? 0.0f : 0.5f + 0.25f * (float)(i % 3),
                                         .top_k = top_k[i % 4], .top_p = i % 3 == 0 ? 0.8f : 1.0f,
                                         .seed_lo = 11u + (uint32_t)i, .seed_hi = 3, .seq = (uint32_t)i, .pos = (uint32_t)i};
    }
    vks_forward_batch b = {.n_rows = N, .tokens = ids, .slot = slot, .pos = pos, .n_out = N, .out_rows = rows,
                           .sample = sample, .sampled = all};
    vks_engine_stats s0, s1, s2;
    vks_engine_stats_get(e, &s0);
    assert_int_equal(vks_engine_forward(e, &b), VKS_OK);
    vks_engine_stats_get(e, &s1);
    /* the same prefill, the first 4 rows sampled, then the last 8: 9 more
     * dispatches for the spread (12 rows take one workgroup each), and the
     * gather of the output rows (every row in order needs none) */
    b.n_out = 4, b.sampled = part;
    assert_int_equal(vks_engine_forward(e, &b), VKS_OK);
    vks_engine_stats_get(e, &s2);
    assert_int_equal((s2.dispatches - s1.dispatches) - (s1.dispatches - s0.dispatches), 9 + 1);
    b.n_out = 8, b.out_rows = rows + 4, b.sample = sample + 4, b.sampled = part + 4;
    assert_int_equal(vks_engine_forward(e, &b), VKS_OK);
    assert_memory_equal(part, all, sizeof all);
    vks_engine_destroy(e);
    vks_model_free(m);
    assert_no_validation_messages();
}

/* Captures the committed hidden rows of every sampled position, by sequence
 * index and position, to compare batched and lone runs bit for bit. */
enum { CAP_SEQS = 12, CAP_POS = 300, CAP_DIM = 64 };
static float captured[2][CAP_SEQS][CAP_POS][CAP_DIM];
static int capture_run;

static void capture_hidden(void *user, const vks_step *st, const vks_seq_state *seqs, const float *hidden,
                           const int32_t *sampled) {
    (void)user;
    (void)sampled;
    for (int i = 0; i < st->n_out; i++) {
        const vks_seq_state *s = &seqs[st->out_seq[i]];
        uint32_t pos = st->pos[st->out_rows[i]];
        if (s->seq_index < CAP_SEQS && pos < CAP_POS)
            memcpy(captured[capture_run][s->seq_index][pos], hidden + (size_t)i * CAP_DIM, sizeof(float) * CAP_DIM);
    }
}

/* Twelve sequences decode as one batch (more rows than the matrix-vector
 * kernel takes at once, prompts longer than a tile): each one's tokens and
 * hidden rows equal, bit for bit, those of the sequence generated alone.
 * prompt0: tokens every prompt has beyond 1..23; steps: the context. */
static void batch_invariance_run(bool kv_f16, int prompt0, int steps) {
    vks_model *m = load_stories();
    if (!m) skip();
    enum { N = 12 };
    assert_true(steps <= CAP_POS);
    vks_generate_options g = {.sched = {.steps = steps, .temperature = 0.8f, .top_p = 0.95f, .seed = 9,
                                        .stop_token_a = 1, .stop_token_b = -1},
                              .on_hidden = capture_hidden};
    memset(captured, 0, sizeof captured);
    vks_sequence batch[N] = {{0}};
    for (int s = 0; s < N; s++) {
        batch[s].n_prompt = prompt0 + 1 + (s * 5) % 23; /* 1..23 prompt tokens beyond prompt0 */
        batch[s].ids = malloc(sizeof(int32_t) * (size_t)steps);
        batch[s].ids[0] = 1;
        for (int i = 1; i < batch[s].n_prompt; i++) batch[s].ids[i] = 259 + (s * 31 + i * 7) % 250;
    }
    vks_engine_options o = {.n_slots = N, .kv_len = steps, .max_rows = 40, .kv_f16 = kv_f16};
    vks_engine *e;
    assert_int_equal(vks_engine_create(gpu, m, &o, &e), VKS_OK);
    vks_sequence alone[N] = {{0}};
    for (int s = 0; s < N; s++) {
        alone[s].n_prompt = batch[s].n_prompt;
        alone[s].ids = malloc(sizeof(int32_t) * (size_t)steps);
        memcpy(alone[s].ids, batch[s].ids, sizeof(int32_t) * (size_t)batch[s].n_prompt);
    }
    capture_run = 0;
    assert_int_equal(vks_generate(e, &g, batch, N, 0), VKS_OK);
    capture_run = 1;
    for (int s = 0; s < N; s++) {
        assert_int_equal(vks_generate(e, &g, &alone[s], 1, (uint32_t)s), VKS_OK);
        assert_memory_equal(captured[0][s], captured[1][s], sizeof captured[0][s]);
        assert_int_equal(alone[s].n_ids, batch[s].n_ids);
        assert_memory_equal(alone[s].ids, batch[s].ids, sizeof(int32_t) * (size_t)alone[s].n_ids);
        vks_sequence_free(&alone[s]);
        vks_sequence_free(&batch[s]);
    }
    vks_engine_destroy(e);
    vks_model_free(m);
    assert_no_validation_messages();
}

static void test_batch_invariance_large(void **state) {
    (void)state;
    batch_invariance_run(false, 0, 48);
}

/* The same with the f16 KV cache, prompts of 241..263 tokens and 296
 * positions: prefill and decode rows on both sides of the first split
 * boundary (VKS_ATTN_SPLIT_KEYS keys) of the split attention. */
static void test_batch_invariance_kv_f16(void **state) {
    (void)state;
    assert_true(VKS_ATTN_SPLIT_KEYS < 264);
    batch_invariance_run(true, 240, 296);
}

/* Hidden rows of every sampled position of the big-batch test, by run, sequence and position. */
enum { BIG_SEQS = 2560, BIG_STEPS = 3, BIG_DIM = 16 };
static float (*big_hidden)[BIG_SEQS][BIG_STEPS][BIG_DIM];

static void capture_big_hidden(void *user, const vks_step *st, const vks_seq_state *seqs, const float *hidden,
                               const int32_t *sampled) {
    int run = *(const int *)user;
    (void)sampled;
    for (int i = 0; i < st->n_out; i++) {
        const vks_seq_state *s = &seqs[st->out_seq[i]];
        uint32_t pos = st->pos[st->out_rows[i]];
        assert_true(s->seq_index < BIG_SEQS && pos < BIG_STEPS);
        memcpy(big_hidden[run][s->seq_index][pos], hidden + (size_t)i * BIG_DIM, sizeof(float) * BIG_DIM);
    }
}

static void make_big_batch(vks_sequence *seqs, int n, int first, int vocab) {
    for (int s = 0; s < n; s++) {
        seqs[s] = (vks_sequence){.n_prompt = 2, .ids = malloc(sizeof(int32_t) * 2)};
        seqs[s].ids[0] = 1;
        seqs[s].ids[1] = 3 + (first + s) * 7 % (vocab - 3);
    }
}

/* One decode step of 2560 rows on 8 layers records about 18,300 dispatches
 * (320 groups of 8 rows x 7 matmuls x 8 layers, plus the head), more than one
 * command buffer's descriptor pools hold (64 x 256): the recording continues
 * in further command buffers, and every sequence's tokens and hidden rows
 * equal, bit for bit, those of runs in batches of 512. */
static void test_dispatches_beyond_one_command_buffer(void **state) {
    (void)state;
    vks_model_config c = {.dim = BIG_DIM, .hidden_dim = 32, .n_layers = 8, .n_heads = 2, .n_kv_heads = 2,
                          .vocab_size = 64, .seq_len = 64, .head_dim = 8, .kv_dim = 16, .norm_eps = 1e-5f,
                          .rope_theta = 10000.0f, .rope_mode = VKS_ROPE_ADJACENT};
    vks_model *m;
    assert_int_equal(vks_model_random(&c, 11, &m), VKS_OK);
    vks_engine_options o = {.n_slots = BIG_SEQS, .kv_len = BIG_STEPS, .max_rows = 2 * BIG_SEQS, .max_out_rows = BIG_SEQS};
    vks_engine *e;
    assert_int_equal(vks_engine_create(gpu, m, &o, &e), VKS_OK);
    big_hidden = calloc(2, sizeof *big_hidden);
    vks_sequence *big = calloc(BIG_SEQS, sizeof *big), part[512];
    int run = 0;
    vks_generate_options g = {.sched = {.steps = BIG_STEPS, .temperature = 1.0f, .top_p = 1.0f, .seed = 5,
                                        .stop_token_a = -1, .stop_token_b = -1},
                              .on_hidden = capture_big_hidden, .user = &run};
    make_big_batch(big, BIG_SEQS, 0, c.vocab_size);
    int rc = vks_generate(e, &g, big, BIG_SEQS, 0);
    if (rc) fprintf(stderr, "big batch: %s\n", vks_last_error());
    assert_int_equal(rc, VKS_OK);
    run = 1;
    for (int first = 0; first < BIG_SEQS; first += 512) {
        make_big_batch(part, 512, first, c.vocab_size);
        assert_int_equal(vks_generate(e, &g, part, 512, (uint32_t)first), VKS_OK);
        for (int s = 0; s < 512; s++) {
            assert_int_equal(part[s].n_ids, big[first + s].n_ids);
            assert_memory_equal(part[s].ids, big[first + s].ids, sizeof(int32_t) * (size_t)part[s].n_ids);
            vks_sequence_free(&part[s]);
        }
    }
    assert_memory_equal(big_hidden[0], big_hidden[1], sizeof big_hidden[0]);
    for (int s = 0; s < BIG_SEQS; s++) vks_sequence_free(&big[s]);
    free(big);
    free(big_hidden);
    vks_engine_destroy(e);
    vks_model_free(m);
    assert_no_validation_messages();
}

/* The KV cache (and the RoPE table of its positions) can be resized after the weights are up: a cache too large
 * for one binding is refused with the bytes, before anything is freed; after
 * a resize the forward uses the new shape and still equals the CPU forward. */
/* kv_f16: the f16 cache (halves) and its split attention's partials, which
 * follow kv_len (300 positions: two parts of 256 keys). */
static void kv_resize_run(bool kv_f16) {
    vks_model_config c = {.dim = 32, .hidden_dim = 48, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                          .vocab_size = 50, .seq_len = 1 << 20, .head_dim = 8, .kv_dim = 16, .norm_eps = 1e-5f,
                          .rope_theta = 10000.0f, .rope_mode = VKS_ROPE_ADJACENT};
    vks_model *m;
    assert_int_equal(vks_model_random(&c, 13, &m), VKS_OK);
    vks_engine_options o = {.n_slots = 1, .kv_len = 2, .max_rows = 16, .kv_f16 = kv_f16};
    vks_engine *e;
    assert_int_equal(vks_engine_create(gpu, m, &o, &e), VKS_OK);
    uint64_t bytes = vks_engine_device_bytes(e);
    assert_int_equal(vks_engine_kv_fits(e, 65536, 1 << 20), VKS_ERR_NOMEM);
    assert_non_null(strstr(vks_last_error(), "needs"));
    assert_int_equal(vks_engine_resize_kv(e, 65536, 1 << 20), VKS_ERR_NOMEM);
    assert_int_equal(vks_engine_kv_fits(e, 1, (1 << 20) + 1), VKS_ERR_ARG);
    assert_int_equal(vks_engine_n_slots(e), 1);
    assert_int_equal(vks_engine_kv_len(e), 2);
    int N = kv_f16 ? 300 : 40;
    /* a forward of the shape used below: its recording binds the old cache
     * and must not be replayed after the resize */
    int32_t two[2] = {3, 20};
    float early[2 * 50];
    engine_logits(e, two, 2, 2, early, c.vocab_size);
    assert_int_equal(vks_engine_resize_kv(e, 3, N), VKS_OK);
    assert_int_equal(vks_engine_n_slots(e), 3);
    assert_int_equal(vks_engine_kv_len(e), N);
    /* K and V of 2 layers, and the RoPE table's (cos, sin) of head_dim / 2 pairs per position; f16: halves, and
     * the partials of 16 rows x 4 heads x one more part of head_dim + 4 floats */
    uint64_t kv = 2ull * 2 * (uint64_t)(3 * N - 2) * 16 * (kv_f16 ? 2 : 4), rope = (uint64_t)(N - 2) * 8 * 4;
    uint64_t part = kv_f16 ? 16ull * 4 * 1 * (8 + 4) * 4 : 0;
    assert_true(vks_engine_device_bytes(e) == bytes + kv + rope + part);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)N);
    for (int i = 0; i < N; i++) ids[i] = (i * 17 + 3) % c.vocab_size;
    float *want = malloc(sizeof(float) * (size_t)N * 50), *got = malloc(sizeof(float) * (size_t)N * 50);
    if (kv_f16) assert_int_equal(vks_ref_forward_kv_f16(m, NULL, ids, N, want, NULL, NULL), VKS_OK);
    else assert_int_equal(vks_ref_forward(m, ids, N, want, NULL), VKS_OK);
    engine_logits(e, ids, N, kv_f16 ? 16 : 2, got, c.vocab_size);
    assert_true(tu_nmse(got, want, (size_t)N * 50) < 1e-10);
    free(ids);
    free(want);
    free(got);
    vks_engine_destroy(e);
    vks_model_free(m);
    assert_no_validation_messages();
}

static void test_kv_resize(void **state) {
    (void)state;
    kv_resize_run(false);
}

static void test_kv_resize_kv_f16(void **state) {
    (void)state;
    kv_resize_run(true);
}

/* Forwards of 12 shapes, more than the engine keeps recordings of, twice:
 * the second round (every shape recorded again, evicted in between) equals
 * the first bit for bit. A shape run again at once replays its recording:
 * one submit, no descriptor written by the host, the same dispatches. */
static void test_recordings_replayed(void **state) {
    (void)state;
    vks_model_config c = {.dim = 32, .hidden_dim = 48, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                          .vocab_size = 50, .seq_len = 64, .head_dim = 8, .kv_dim = 16, .norm_eps = 1e-5f,
                          .rope_theta = 10000.0f, .rope_mode = VKS_ROPE_ADJACENT};
    vks_model *m;
    assert_int_equal(vks_model_random(&c, 29, &m), VKS_OK);
    vks_engine_options o = {.n_slots = 1, .kv_len = 64, .max_rows = 16};
    vks_engine *e;
    assert_int_equal(vks_engine_create(gpu, m, &o, &e), VKS_OK);
    enum { SHAPES = 12 };
    int32_t ids[SHAPES];
    for (int i = 0; i < SHAPES; i++) ids[i] = (i * 7 + 2) % c.vocab_size;
    static float got[2][SHAPES][SHAPES * 50];
    for (int round = 0; round < 2; round++)
        for (int n = 1; n <= SHAPES; n++) engine_logits(e, ids, n, n, got[round][n - 1], c.vocab_size);
    for (int n = 1; n <= SHAPES; n++) assert_memory_equal(got[0][n - 1], got[1][n - 1], sizeof(float) * 50 * (size_t)n);
    vks_engine_stats s0, s1, s2;
    vks_engine_stats_get(e, &s0);
    assert_true(s0.forwards == 2 * SHAPES && s0.recorded == 2 * SHAPES); /* 12 shapes cycle through 8 kept */
    float again[SHAPES * 50];
    engine_logits(e, ids, SHAPES, SHAPES, again, c.vocab_size);
    vks_engine_stats_get(e, &s1);
    assert_memory_equal(again, got[0][SHAPES - 1], sizeof again);
    assert_true(s1.forwards == s0.forwards + 1 && s1.recorded == s0.recorded);
    assert_true(s1.submits == s0.submits + 1 && s1.descriptor_writes == s0.descriptor_writes);
    assert_true(s1.layers == s0.layers + 2 && s1.layer_descriptor_writes == s0.layer_descriptor_writes);
    engine_logits(e, ids, SHAPES, SHAPES, again, c.vocab_size);
    vks_engine_stats_get(e, &s2);
    assert_true(s2.dispatches - s1.dispatches == s1.dispatches - s0.dispatches && s2.dispatches > s1.dispatches);
    assert_true(s2.barriers - s1.barriers == s1.barriers - s0.barriers);
    assert_true(s2.layer_dispatches - s1.layer_dispatches == s1.layer_dispatches - s0.layer_dispatches);
    vks_engine_destroy(e);
    vks_model_free(m);
    assert_no_validation_messages();
}

/* The decode forward's shape per layer (Llama, no biases): rmsnorm, q/k/v
 * (one dispatch, vks_op_matmul_multi), rope_kv_store (RoPE fused with the KV
 * write), attention, wo (+= x), rmsnorm, gate/up with SwiGLU (one dispatch,
 * vks_op_matmul_swiglu), down (+= x): 8 dispatches and 8 barriers (before the
 * fusions: 14 and 10; with rope_kv_store only: 12 and 9; with gate/up as one
 * and a swiglu dispatch: 9 and 9). */
static void test_layer_counts(void **state) {
    (void)state;
    vks_model *m = odd_random_model(13);
    vks_engine_options o = {.n_slots = 1, .kv_len = 8, .max_rows = 2};
    vks_engine *e;
    assert_int_equal(vks_engine_create(gpu, m, &o, &e), VKS_OK);
    int32_t tok = 3;
    uint32_t slot = 0, pos = 0, row = 0;
    float *logits = malloc(sizeof(float) * (size_t)m->cfg.vocab_size);
    vks_forward_batch b = {.n_rows = 1, .matmul_kind = VKS_MATMUL_DECODE, .tokens = &tok, .slot = &slot, .pos = &pos,
                           .n_out = 1, .out_rows = &row, .logits = logits};
    vks_engine_stats s0, s1;
    vks_engine_stats_get(e, &s0);
    assert_int_equal(vks_engine_forward(e, &b), VKS_OK);
    vks_engine_stats_get(e, &s1);
    uint64_t layers = s1.layers - s0.layers;
    assert_int_equal(layers, (uint64_t)m->cfg.n_layers);
    /* rmsnorm, q/k/v (one), rope_kv_store, attention, wo, rmsnorm, gate/up + swiglu (one), w2 */
    /* q/k/v and gate/up fused where decode takes the one-row tiles (CPU drivers with subgroup
     * ops) or the matvec kernels on a GPU (matvec MULTI); CPU drivers' matvec decode (without
     * subgroups, VKSWARM_MATMUL_DIRECT=0) stays one dispatch per product; VKSWARM_MATMUL_FUSE=0|1
     * never / always fuses (ops.c). SwiGLU joins gate/up where the tiled kernel runs them
     * (VKSWARM_SWIGLU_FUSE=0: never), else it is one more dispatch. */
    const vks_device_info *info = vks_gpu_info(gpu);
    const char *direct = getenv("VKSWARM_MATMUL_DIRECT"), *fuse = getenv("VKSWARM_MATMUL_FUSE"),
               *f16 = getenv("VKSWARM_FP16_MATH"), *sw = getenv("VKSWARM_SWIGLU_FUSE");
    bool cpu = info->type == VKS_DEVTYPE_CPU;
    bool tiles = cpu && info->subgroup_arith && info->subgroup_ballot && !getenv("VKSWARM_NO_SUBGROUP") &&
                 !(direct && !strcmp(direct, "0")) && !(f16 && !strcmp(f16, "1") && info->fp16_arith);
    bool fused = fuse && (!strcmp(fuse, "0") || !strcmp(fuse, "1")) ? fuse[0] == '1' : tiles || !cpu;
    bool swiglu = tiles && !(sw && !strcmp(sw, "0"));
    /* 6 single dispatches, q/k/v, gate/up(/swiglu) */
    uint64_t per_layer = 6 + (fused ? 1 : 3) + (swiglu ? 1 : (fused ? 1 : 2) + 1);
    assert_int_equal(s1.layer_dispatches - s0.layer_dispatches, per_layer * layers);
    assert_int_equal(s1.layer_barriers - s0.layer_barriers, (swiglu ? 8 : 9) * layers);
    free(logits);
    vks_engine_destroy(e);
    vks_model_free(m);
    assert_no_validation_messages();
}

/* The head norms the residual rows straight into the classifier's input when
 * the output rows are every row in order (each decode step), and gathers them
 * first otherwise: one dispatch fewer, the same logits bit for bit (a
 * permutation of the rows gives the permuted logits; a recording of one kind
 * is never replayed for the other). */
static void test_head_gathers_only_when_needed(void **state) {
    (void)state;
    vks_model *m = odd_random_model(14);
    vks_engine_options o = {.n_slots = 3, .kv_len = 8, .max_rows = 3};
    vks_engine *e;
    assert_int_equal(vks_engine_create(gpu, m, &o, &e), VKS_OK);
    int32_t tok[3] = {3, 5, 7};
    uint32_t slot[3] = {0, 1, 2}, pos[3] = {0, 0, 0}, in_order[3] = {0, 1, 2}, permuted[3] = {2, 0, 1};
    size_t V = (size_t)m->cfg.vocab_size;
    float *a = malloc(sizeof(float) * 3 * V), *b = malloc(sizeof(float) * 3 * V);
    vks_forward_batch fb = {.n_rows = 3, .matmul_kind = VKS_MATMUL_DECODE, .tokens = tok, .slot = slot, .pos = pos,
                            .n_out = 3, .out_rows = in_order, .logits = a};
    uint64_t step[2];
    for (int run = 0; run < 2; run++) {
        vks_engine_stats s0, s1;
        fb.out_rows = run ? permuted : in_order;
        fb.logits = run ? b : a;
        vks_engine_stats_get(e, &s0);
        assert_int_equal(vks_engine_forward(e, &fb), VKS_OK);
        vks_engine_stats_get(e, &s1);
        step[run] = s1.dispatches - s0.dispatches;
    }
    assert_int_equal(step[1], step[0] + 1); /* the gather */
    for (int i = 0; i < 3; i++) assert_memory_equal(b + (size_t)i * V, a + (size_t)permuted[i] * V, V * sizeof(float));
    fb.out_rows = in_order, fb.logits = b; /* the first recording again: replayed, the same logits */
    assert_int_equal(vks_engine_forward(e, &fb), VKS_OK);
    assert_memory_equal(b, a, 3 * V * sizeof(float));
    free(a);
    free(b);
    vks_engine_destroy(e);
    vks_model_free(m);
    assert_no_validation_messages();
}

static void test_refusals(void **state) {
    (void)state;
    /* a model far larger than the device: refused before reading any weight */
    vks_model big = {.cfg = {.dim = 8192, .hidden_dim = 28672, .n_layers = 80, .n_heads = 64, .n_kv_heads = 8,
                             .vocab_size = 128256, .seq_len = 4096, .head_dim = 128, .kv_dim = 1024,
                             .norm_eps = 1e-5f, .rope_theta = 5e5f}};
    vks_engine_options o = {0};
    vks_engine *e = NULL;
    assert_int_equal(vks_engine_create(gpu, &big, &o, &e), VKS_ERR_NOMEM);
    assert_null(e);
    assert_non_null(strstr(vks_last_error(), "needs"));
    assert_non_null(strstr(vks_last_error(), "available"));
    /* an f16 KV cache needs head_dim a multiple of 4 (its kernels read 4 halves at once) */
    vks_model_config c6 = {.dim = 12, .hidden_dim = 16, .n_layers = 1, .n_heads = 2, .n_kv_heads = 2, .vocab_size = 11,
                           .seq_len = 8, .head_dim = 6, .kv_dim = 12, .norm_eps = 1e-5f, .rope_theta = 10000.0f};
    vks_model *m6;
    assert_int_equal(vks_model_random(&c6, 3, &m6), VKS_OK);
    vks_engine_options o6 = {.kv_f16 = true};
    assert_int_equal(vks_engine_create(gpu, m6, &o6, &e), VKS_ERR_ARG);
    assert_null(e);
    assert_non_null(strstr(vks_last_error(), "head_dim a multiple of 4"));
    o6.kv_f16 = false;
    assert_int_equal(vks_engine_create(gpu, m6, &o6, &e), VKS_OK);
    vks_engine_destroy(e);
    vks_model_free(m6);
    /* bad rows are refused, not executed */
    vks_model *m = load_stories();
    if (!m) return;
    vks_engine_options o2 = {.n_slots = 2, .kv_len = 16, .max_rows = 4};
    assert_int_equal(vks_engine_create(gpu, m, &o2, &e), VKS_OK);
    int32_t tok[2] = {1, 5};
    uint32_t slot[2] = {0, 2}, pos[2] = {0, 1}, rows[1] = {0};
    vks_forward_batch b = {.n_rows = 2, .tokens = tok, .slot = slot, .pos = pos, .n_out = 1, .out_rows = rows};
    assert_int_equal(vks_engine_forward(e, &b), VKS_ERR_ARG);
    slot[1] = 1;
    pos[1] = 16;
    assert_int_equal(vks_engine_forward(e, &b), VKS_ERR_ARG);
    pos[1] = 1;
    tok[1] = 512;
    assert_int_equal(vks_engine_forward(e, &b), VKS_ERR_ARG);
    tok[1] = 5;
    rows[0] = 2;
    assert_int_equal(vks_engine_forward(e, &b), VKS_ERR_ARG);
    rows[0] = 1;
    b.n_rows = 5;
    assert_int_equal(vks_engine_forward(e, &b), VKS_ERR_ARG);
    b.n_rows = 2;
    float logp[1];
    b.sampled_logp = logp; /* log-probabilities of sampled tokens without sampling */
    assert_int_equal(vks_engine_forward(e, &b), VKS_ERR_ARG);
    assert_non_null(strstr(vks_last_error(), "sampled_logp"));
    b.sampled_logp = NULL;
    assert_int_equal(vks_engine_forward(e, &b), VKS_OK);
    vks_engine_destroy(e);
    vks_model_free(m);
    assert_no_validation_messages();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories_logits_f32),   cmocka_unit_test(test_stories_logits_half),
        cmocka_unit_test(test_split_weights),        cmocka_unit_test(test_greedy_text),
        cmocka_unit_test(test_random_model_vs_cpu),  cmocka_unit_test(test_feed_several_sequences),
        cmocka_unit_test(test_head_dim_vs_cpu),       cmocka_unit_test(test_qwen3_vs_cpu),
        cmocka_unit_test(test_architectures_every_path),
        cmocka_unit_test(test_batch_invariant_sampling), cmocka_unit_test(test_record_logp),
        cmocka_unit_test(test_sampled_logp_on_gpu),
        cmocka_unit_test(test_sample_split_in_engine),
        cmocka_unit_test(test_batch_invariance_large), cmocka_unit_test(test_batch_invariance_kv_f16),
        cmocka_unit_test(test_kv_f16_vs_ref),          cmocka_unit_test(test_dispatches_beyond_one_command_buffer),
        cmocka_unit_test(test_kv_resize), cmocka_unit_test(test_kv_resize_kv_f16), cmocka_unit_test(test_recordings_replayed),
        cmocka_unit_test(test_layer_counts),
        cmocka_unit_test(test_head_gathers_only_when_needed),
        cmocka_unit_test(test_refusals),
    };
    if (getenv("VKSWARM_TEST_FILTER")) cmocka_set_test_filter(getenv("VKSWARM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
