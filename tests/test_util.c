/* test_util.c: helpers shared by the cmocka suites (see test_util.h). */
#include "test_util.h"
#include <math.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "vkswarm/vks_gpu.h"
#include "vkswarm/vks_ops.h"
#include "vkswarm/vks_quant.h"
#include "vkswarm/vks_model.h"

const char *tu_shared_path(const char *rel) {
    static char buf[4096];
    const char *root = getenv("VKSWARM_SHARED");
    if (!root) root = VKS_TEST_SHARED;
    snprintf(buf, sizeof buf, "%s/models/%s", root, rel);
    if (access(buf, R_OK) != 0) {
        fprintf(stderr, "SKIP: %s not found (%s is missing)\n", buf, root);
        return NULL;
    }
    return buf;
}

unsigned char *tu_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    fclose(f);
    if (b) { b[n] = 0; if (len) *len = (size_t)n; }
    return b;
}

double tu_nmse(const float *a, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * (double)ref[i];
    }
    return num / (den > 1e-30 ? den : 1e-30);
}

bool tu_has_nonfinite(const float *a, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(a[i])) return true;
    return false;
}

void tu_fill_uniform(float *x, size_t n, uint64_t seed, float lo, float hi) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s >> 12; s ^= s << 25; s ^= s >> 27;
        uint32_t u = (uint32_t)((s * 0x2545F4914F6CDD1Dull) >> 40);
        x[i] = lo + (hi - lo) * (float)u / 16777216.0f;
    }
}

bool tu_test_short(void) {
    const char *s = getenv("VKSWARM_TEST_SHORT");
    return s && s[0] && strcmp(s, "0") != 0;
}

bool tu_case_skipped(const char *name) {
    const char *list = getenv("VKSWARM_TEST_SKIP");
    if (!list) return false;
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        char pattern[256];
        if (n > 0 && n < sizeof pattern) {
            memcpy(pattern, p, n);
            pattern[n] = '\0';
            if (fnmatch(pattern, name, 0) == 0) {
                fprintf(stderr, "VKSWARM_TEST_SKIP: left out: %s\n", name);
                return true;
            }
        }
        p += n + (p[n] == ',');
    }
    return false;
}

const char *tu_tmpdir(void) {
    static char buf[256];
    snprintf(buf, sizeof buf, "/tmp/vkstest.XXXXXX");
    if (!mkdtemp(buf)) return "/tmp";
    return buf;
}

struct vks_gpu *tu_gpu_open(void) {
    vks_gpu_options opt = {.device_index = -1, .validation = getenv("VKSWARM_VALIDATION") != NULL};
    vks_gpu *g = NULL;
    if (vks_gpu_create(&opt, &g)) {
        fprintf(stderr, "vks_gpu_create: %s\n", vks_last_error());
        return NULL;
    }
    return g;
}

const char *tu_bin(void) {
    const char *b = getenv("VKSWARM_BIN");
    return b ? b : VKS_TEST_BIN;
}

const char *tu_source(void) {
    const char *s = getenv("VKSWARM_SOURCE");
    return s ? s : VKS_TEST_SOURCE;
}

int tu_run(const char *cmd, char **out) {
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, len = 0, n;
    char *buf = malloc(cap);
    assert_non_null(buf);
    while ((n = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += n;
        if (len + 1 == cap) {
            buf = realloc(buf, cap *= 2);
            assert_non_null(buf);
        }
    }
    buf[len] = 0;
    int st = pclose(p);
    if (out) *out = buf;
    else free(buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* Block types: quantize with vks_quantize, replace w by the dequantized values
 * (vks_dequantize: the reference) and repack for the GPU. */
static void *pack_blocks(float *w, size_t rows, size_t cols, vks_dtype t, size_t *bytes) {
    size_t n = rows * cols;
    uint64_t row_bytes;
    if (!vks_dtype_row_bytes(t, cols, &row_bytes)) return NULL;
    void *blocks = malloc(rows * row_bytes);
    *bytes = vks_op_weight_bytes(t, rows, cols);
    void *gpu_layout = *bytes ? malloc(*bytes) : NULL;
    bool ok = blocks && gpu_layout && vks_quantize(t, w, blocks, n) == VKS_OK;
    if (ok) vks_dequantize(t, blocks, w, n);
    ok = ok && vks_op_pack_weights(t, blocks, rows, cols, gpu_layout) == VKS_OK;
    free(blocks);
    if (!ok) { free(gpu_layout); return NULL; }
    return gpu_layout;
}

void *tu_pack_weights(float *w, size_t rows, size_t cols, vks_dtype t, size_t *bytes) {
    size_t n = rows * cols;
    void *p;
    if (vks_dtype_block_elems(t) > 1) p = pack_blocks(w, rows, cols, t, bytes);
    else if (t == VKS_DTYPE_F32) {
        *bytes = n * 4;
        p = malloc(*bytes ? *bytes : 1);
        if (p) memcpy(p, w, *bytes);
    } else {
        *bytes = (n * 2 + 3) / 4 * 4;
        uint16_t *h = calloc(*bytes / 2 + 1, 2);
        for (size_t i = 0; h && i < n; i++) {
            h[i] = t == VKS_DTYPE_F16 ? vks_f32_to_f16(w[i]) : vks_f32_to_bf16(w[i]);
            w[i] = t == VKS_DTYPE_F16 ? vks_f16_to_f32(h[i]) : vks_bf16_to_f32(h[i]);
        }
        p = h;
    }
    assert_non_null(p);
    return p;
}

static double rope_freqs[256];

const double *tu_rope_freqs(double theta, int head_dim) {
    vks_model_config c = {.head_dim = head_dim > 512 ? 512 : head_dim, .rope_theta = (float)theta};
    vks_rope_freqs(&c, rope_freqs);
    return rope_freqs;
}

float *tu_rope_table(double theta, int head_dim, int n_pos) {
    vks_model_config c = {.head_dim = head_dim, .rope_theta = (float)theta};
    float *t = malloc((size_t)n_pos * (size_t)head_dim * sizeof *t);
    if (!t || !vks_rope_table(&c, n_pos, t)) abort();
    return t;
}
