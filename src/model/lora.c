/* lora.c: the adapters' targets, shapes, scale and PEFT initialisation (vks_lora.h). */
#include "vkswarm/vks_lora.h"

#include <math.h>
#include <sodium.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model/lora_internal.h"
#include "model/model_internal.h"
#include "vkswarm/vks_philox.h"

static const char *const target_names[VKS_LORA_TARGET_COUNT] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                                "gate_proj", "up_proj", "down_proj"};

const char *vks_lora_target_name(vks_lora_target t) {
    return (unsigned)t < VKS_LORA_TARGET_COUNT ? target_names[t] : NULL;
}

int vks_lora_target_shape(const vks_model_config *c, vks_lora_target t, int64_t *out, int64_t *in) {
    if (!c || !out || !in || (unsigned)t >= VKS_LORA_TARGET_COUNT)
        return vks_set_error(VKS_ERR_ARG, "vks_lora_target_shape: bad arguments");
    int64_t dim = c->dim, q = (int64_t)c->n_heads * c->head_dim, kv = c->kv_dim, hidden = c->hidden_dim;
    const int64_t shapes[VKS_LORA_TARGET_COUNT][2] = {
        {q, dim}, {kv, dim}, {kv, dim}, {dim, q}, {hidden, dim}, {hidden, dim}, {dim, hidden},
    };
    *out = shapes[t][0];
    *in = shapes[t][1];
    return VKS_OK;
}

int64_t vks_lora_param_count(const vks_model_config *c, int rank, uint32_t targets) {
    if (!c || rank < 1 || !targets || (targets & ~VKS_LORA_ALL_TARGETS)) return -1;
    int64_t per_layer = 0;
    for (int t = 0; t < VKS_LORA_TARGET_COUNT; t++) {
        int64_t out, in;
        if (!(targets & (1u << t))) continue;
        vks_lora_target_shape(c, (vks_lora_target)t, &out, &in);
        per_layer += (int64_t)rank * (out + in);
    }
    return per_layer * c->n_layers;
}

int vks_lora_check(const vks_model_config *c, int rank, uint32_t targets, const char *what) {
    if (!c || !targets || (targets & ~VKS_LORA_ALL_TARGETS))
        return vks_set_error(VKS_ERR_ARG, "%s: LoRA targets 0x%x are not a set of q, k, v, o, gate, up, down", what,
                             targets);
    for (int t = 0; t < VKS_LORA_TARGET_COUNT; t++) {
        int64_t out, in;
        if (!(targets & (1u << t)) || vks_lora_target_shape(c, (vks_lora_target)t, &out, &in)) continue;
        int64_t side = out < in ? out : in;
        if (rank < 1 || rank > side)
            return vks_set_error(VKS_ERR_ARG, "%s: LoRA rank %d is outside 1..%lld (%s is %lld x %lld)", what, rank,
                                 (long long)side, target_names[t], (long long)out, (long long)in);
    }
    return VKS_OK;
}

double vks_lora_scale(double alpha, int rank) { return rank > 0 ? alpha / rank : 0.0; }

uint32_t vks_lora_stream(int layer, vks_lora_target t) {
    return (uint32_t)layer * VKS_LORA_TARGET_COUNT + (uint32_t)t;
}

int vks_lora_init(float *A, float *B, int rank, int64_t in, int64_t out, uint64_t seed, uint32_t stream) {
    if (!A || !B || rank < 1 || in < 1 || out < 1 || (uint64_t)rank * (uint64_t)in > UINT32_MAX ||
        (uint64_t)rank * (uint64_t)out > UINT32_MAX)
        return vks_set_error(VKS_ERR_ARG, "vks_lora_init: bad sizes (rank %d, in %lld, out %lld)", rank,
                             (long long)in, (long long)out);
    /* kaiming_uniform_(a=sqrt(5)): gain sqrt(2 / (1 + 5)), bound gain * sqrt(3 / fan_in) = 1 / sqrt(in) */
    double bound = 1.0 / sqrt((double)in);
    uint32_t n = (uint32_t)((uint64_t)rank * (uint64_t)in);
    for (uint32_t i = 0; i < n; i++) {
        double u = vks_rng_uniform(vks_philox_u32(seed, stream, 0, i));
        A[i] = (float)((2.0 * u - 1.0) * bound);
    }
    memset(B, 0, (size_t)rank * (size_t)out * sizeof *B);
    return VKS_OK;
}

/* ---- Adapters as data ---- */

struct vks_lora_adapter {
    vks_lora_config cfg;
    vks_model_config base; /* the base model's shape */
    int n_layers;
    bool has_base_hash;
    uint8_t base_hash[32];
    char base_arch[32];   /* vks_model.arch of the base ("" until set) */
    char base_name[512];  /* the base's path, for PEFT's base_model_name_or_path ("" until set) */
    float *block;                                   /* every matrix, layer by layer, target by target, A then B */
    int64_t (*off_a)[VKS_LORA_TARGET_COUNT]; /* [n_layers]; -1: not targeted */
    int64_t (*off_b)[VKS_LORA_TARGET_COUNT];
    float *norm; /* PEFT modules_to_save ["norm"]: the final norm's weight [dim]; NULL: the base's */
};

int vks_lora_parse_targets(const char *s, uint32_t *targets, const char *what) {
    if (!s || !targets) return vks_set_error(VKS_ERR_ARG, "vks_lora_parse_targets: NULL argument");
    static const char *const short_names[VKS_LORA_TARGET_COUNT] = {"q", "k", "v", "o", "gate", "up", "down"};
    uint32_t mask = 0;
    const char *p = s;
    if (!strcmp(s, "all")) {
        *targets = VKS_LORA_ALL_TARGETS;
        return VKS_OK;
    }
    while (*p) {
        size_t n = strcspn(p, ",");
        int found = -1;
        for (int t = 0; t < VKS_LORA_TARGET_COUNT && found < 0; t++)
            if ((strlen(short_names[t]) == n && !strncmp(p, short_names[t], n)) ||
                (strlen(target_names[t]) == n && !strncmp(p, target_names[t], n)))
                found = t;
        if (found < 0)
            return vks_set_error(VKS_ERR_ARG, "%s: unknown LoRA target '%.*s' (q, k, v, o, gate, up, down or all)",
                                 what ? what : "lora targets", (int)(n > 64 ? 64 : n), p);
        mask |= 1u << found;
        p += n;
        if (*p == ',') p++;
    }
    if (!mask) return vks_set_error(VKS_ERR_ARG, "%s: no LoRA target given", what ? what : "lora targets");
    *targets = mask;
    return VKS_OK;
}

int vks_lora_adapter_create(const vks_model_config *c, const vks_lora_config *lc, vks_lora_adapter **out) {
    if (!c || !lc || !out) return vks_set_error(VKS_ERR_ARG, "vks_lora_adapter_create: NULL argument");
    *out = NULL;
    if (c->n_layers < 1 || c->n_layers > (1 << 16))
        return vks_set_error(VKS_ERR_ARG, "vks_lora_adapter_create: %d layers", c->n_layers);
    if (!(lc->alpha > 0) || !isfinite(lc->alpha))
        return vks_set_error(VKS_ERR_ARG, "LoRA alpha %g is not a finite positive number", lc->alpha);
    int rc = vks_lora_check(c, lc->rank, lc->targets, "LoRA adapter");
    if (rc) return rc;
    vks_lora_adapter *a = calloc(1, sizeof *a);
    if (!a) return vks_set_error(VKS_ERR_NOMEM, "LoRA adapter: out of memory");
    a->off_a = calloc((size_t)c->n_layers, sizeof *a->off_a);
    a->off_b = calloc((size_t)c->n_layers, sizeof *a->off_b);
    if (!a->off_a || !a->off_b) {
        vks_lora_adapter_free(a);
        return vks_set_error(VKS_ERR_NOMEM, "LoRA adapter: out of memory");
    }
    a->cfg = *lc;
    a->base = *c;
    a->n_layers = c->n_layers;
    int64_t total = 0;
    for (int l = 0; l < c->n_layers; l++)
        for (int t = 0; t < VKS_LORA_TARGET_COUNT; t++) {
            int64_t o, i;
            a->off_a[l][t] = a->off_b[l][t] = -1;
            if (!(lc->targets & (1u << t))) continue;
            vks_lora_target_shape(c, (vks_lora_target)t, &o, &i);
            a->off_a[l][t] = total;
            total += (int64_t)lc->rank * i;
            a->off_b[l][t] = total;
            total += (int64_t)lc->rank * o;
        }
    if (total <= 0 || (uint64_t)total > SIZE_MAX / sizeof(float) || !(a->block = calloc((size_t)total, sizeof(float)))) {
        vks_lora_adapter_free(a);
        return vks_set_error(VKS_ERR_NOMEM, "LoRA adapter: cannot hold %lld parameters", (long long)total);
    }
    *out = a;
    return VKS_OK;
}

void vks_lora_adapter_free(vks_lora_adapter *a) {
    if (!a) return;
    free(a->block);
    free(a->norm);
    free(a->off_a);
    free(a->off_b);
    free(a);
}

const vks_lora_config *vks_lora_adapter_config(const vks_lora_adapter *a) { return a ? &a->cfg : NULL; }

int vks_lora_adapter_set_norm(vks_lora_adapter *a, const float *w) {
    if (!a) return vks_set_error(VKS_ERR_ARG, "vks_lora_adapter_set_norm: NULL adapter");
    if (!w) {
        free(a->norm);
        a->norm = NULL;
        return VKS_OK;
    }
    for (int i = 0; i < a->base.dim; i++)
        if (!isfinite(w[i])) return vks_set_error(VKS_ERR_ARG, "LoRA adapter: the final norm holds NaN or Inf");
    if (!a->norm && !(a->norm = malloc((size_t)a->base.dim * sizeof *a->norm)))
        return vks_set_error(VKS_ERR_NOMEM, "LoRA adapter: out of memory");
    memcpy(a->norm, w, (size_t)a->base.dim * sizeof *a->norm);
    return VKS_OK;
}

const float *vks_lora_adapter_norm(const vks_lora_adapter *a) { return a ? a->norm : NULL; }
int vks_lora_adapter_n_layers(const vks_lora_adapter *a) { return a ? a->n_layers : 0; }
const vks_model_config *vks_lora_adapter_base_config(const vks_lora_adapter *a) { return a ? &a->base : NULL; }

int vks_lora_adapter_check_shape(const vks_lora_adapter *a, const vks_model_config *c, const char *what) {
    if (!a || !c) return vks_set_error(VKS_ERR_ARG, "vks_lora_adapter_check_shape: NULL argument");
    if (a->n_layers != c->n_layers)
        return vks_set_error(VKS_ERR_FORMAT, "%s: the LoRA adapter has %d layers, the model %d", what, a->n_layers,
                             c->n_layers);
    for (int t = 0; t < VKS_LORA_TARGET_COUNT; t++) {
        int64_t ao, ai, mo, mi;
        if (!(a->cfg.targets & (1u << t))) continue;
        vks_lora_target_shape(&a->base, (vks_lora_target)t, &ao, &ai);
        vks_lora_target_shape(c, (vks_lora_target)t, &mo, &mi);
        if (ao != mo || ai != mi)
            return vks_set_error(VKS_ERR_FORMAT, "%s: the LoRA adapter's %s is for a %lld x %lld matrix, the model's is "
                                 "%lld x %lld", what, target_names[t], (long long)ao, (long long)ai, (long long)mo,
                                 (long long)mi);
    }
    return VKS_OK;
}

float *vks_lora_adapter_A(const vks_lora_adapter *a, int layer, vks_lora_target t) {
    if (!a || layer < 0 || layer >= a->n_layers || (unsigned)t >= VKS_LORA_TARGET_COUNT || a->off_a[layer][t] < 0)
        return NULL;
    return a->block + a->off_a[layer][t];
}

float *vks_lora_adapter_B(const vks_lora_adapter *a, int layer, vks_lora_target t) {
    if (!a || layer < 0 || layer >= a->n_layers || (unsigned)t >= VKS_LORA_TARGET_COUNT || a->off_b[layer][t] < 0)
        return NULL;
    return a->block + a->off_b[layer][t];
}

int vks_lora_adapter_init(vks_lora_adapter *a, uint64_t seed) {
    if (!a) return vks_set_error(VKS_ERR_ARG, "vks_lora_adapter_init: NULL adapter");
    for (int l = 0; l < a->n_layers; l++)
        for (int t = 0; t < VKS_LORA_TARGET_COUNT; t++) {
            int64_t o, i;
            if (a->off_a[l][t] < 0) continue;
            vks_lora_target_shape(&a->base, (vks_lora_target)t, &o, &i);
            int rc = vks_lora_init(vks_lora_adapter_A(a, l, t), vks_lora_adapter_B(a, l, t), a->cfg.rank, i, o, seed,
                                   vks_lora_stream(l, (vks_lora_target)t));
            if (rc) return rc;
        }
    return VKS_OK;
}

int vks_lora_adapter_set_base(vks_lora_adapter *a, const vks_model *base) {
    if (!a || !base) return vks_set_error(VKS_ERR_ARG, "vks_lora_adapter_set_base: NULL argument");
    uint8_t h[32];
    int rc = vks_model_hash(base, h);
    if (rc) return rc;
    vks_lora_adapter_set_base_id(a, h, base->arch, base->path);
    return VKS_OK;
}

void vks_lora_adapter_set_base_id(vks_lora_adapter *a, const uint8_t hash[32], const char *arch, const char *name) {
    memcpy(a->base_hash, hash, 32);
    a->has_base_hash = true;
    snprintf(a->base_arch, sizeof a->base_arch, "%s", arch ? arch : "");
    snprintf(a->base_name, sizeof a->base_name, "%s", name ? name : "");
}

const uint8_t *vks_lora_adapter_base_hash(const vks_lora_adapter *a) {
    return a && a->has_base_hash ? a->base_hash : NULL;
}

const char *vks_lora_adapter_base_arch(const vks_lora_adapter *a) { return a ? a->base_arch : ""; }
const char *vks_lora_adapter_base_name(const vks_lora_adapter *a) { return a ? a->base_name : ""; }

int vks_lora_target_tensor(vks_lora_target t) {
    static const int index[VKS_LORA_TARGET_COUNT] = {VKS_T_wq, VKS_T_wk, VKS_T_wv, VKS_T_wo,
                                                     VKS_T_w1, VKS_T_w3, VKS_T_w2};
    return (unsigned)t < VKS_LORA_TARGET_COUNT ? index[t] : -1;
}

/* B's rows follow the base's q/k RoPE order when the target's base matrix does. */
static bool target_rope(vks_lora_target t) { return vks_layer_schema[vks_lora_target_tensor(t)].rope; }

void vks_lora_permute_b(const vks_lora_adapter *a, vks_lora_target t, const float *src, float *dst, int from, int to) {
    int64_t out, in;
    vks_lora_target_shape(&a->base, t, &out, &in);
    size_t r = (size_t)a->cfg.rank;
    bool rope = target_rope(t) && from != to;
    for (int64_t row = 0; row < out; row++) {
        int64_t s = rope ? vks_rope_src_row(row, a->base.head_dim, from, to) : row;
        memcpy(dst + (size_t)row * r, src + (size_t)s * r, r * sizeof *dst);
    }
}

static void hash_i64(crypto_generichash_state *st, int64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)v >> (8 * i));
    crypto_generichash_update(st, b, sizeof b);
}

static void hash_f32s(crypto_generichash_state *st, const float *m, int64_t n) {
    for (int64_t k = 0; k < n; k++) {
        uint32_t u;
        memcpy(&u, &m[k], sizeof u);
        uint8_t b[4] = {(uint8_t)u, (uint8_t)(u >> 8), (uint8_t)(u >> 16), (uint8_t)(u >> 24)};
        crypto_generichash_update(st, b, 4);
    }
}

int vks_lora_adapter_hash(const vks_lora_adapter *a, uint8_t out[32]) {
    if (!a || !out) return vks_set_error(VKS_ERR_ARG, "vks_lora_adapter_hash: NULL argument");
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, 32);
    crypto_generichash_update(&st, (const uint8_t *)"vkswarm-lora-v1", 15);
    double alpha = a->cfg.alpha;
    uint64_t alpha_bits;
    memcpy(&alpha_bits, &alpha, sizeof alpha_bits);
    hash_i64(&st, a->cfg.rank);
    hash_i64(&st, (int64_t)alpha_bits);
    hash_i64(&st, a->cfg.targets);
    hash_i64(&st, a->n_layers);
    /* matrices in block order, as little-endian f32 bits */
    for (int l = 0; l < a->n_layers; l++)
        for (int t = 0; t < VKS_LORA_TARGET_COUNT; t++) {
            int64_t o, i;
            if (a->off_a[l][t] < 0) continue;
            vks_lora_target_shape(&a->base, (vks_lora_target)t, &o, &i);
            const float *m = a->block + a->off_a[l][t];
            hash_f32s(&st, m, (int64_t)a->cfg.rank * (i + o)); /* A then B are adjacent */
        }
    if (a->norm) { /* absent before modules_to_save: adapters without it keep their hash */
        crypto_generichash_update(&st, (const uint8_t *)"norm", 4);
        hash_f32s(&st, a->norm, a->base.dim);
    }
    crypto_generichash_final(&st, out, 32);
    return VKS_OK;
}

int vks_lora_model_hash(const vks_model *base, const vks_lora_adapter *a, uint8_t out[32]) {
    if (!base || !out) return vks_set_error(VKS_ERR_ARG, "vks_lora_model_hash: NULL argument");
    uint8_t bh[32], ah[32];
    int rc = vks_model_hash(base, bh);
    if (rc || !a) {
        if (!rc) memcpy(out, bh, 32);
        return rc;
    }
    if ((rc = vks_lora_adapter_hash(a, ah))) return rc;
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, 32);
    crypto_generichash_update(&st, (const uint8_t *)"vkswarm-model+lora-v1", 21);
    crypto_generichash_update(&st, bh, 32);
    crypto_generichash_update(&st, ah, 32);
    crypto_generichash_final(&st, out, 32);
    return VKS_OK;
}
