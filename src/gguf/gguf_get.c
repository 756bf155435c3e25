/* gguf_get.c: typed GGUF metadata getters. The file was validated at open,
 * so these only fail on a missing key, a type that does not fit, or a bad index. */
#include "gguf/gguf_internal.h"

#include <string.h>

/* ---- accessors ---- */

uint32_t vks_gguf_version(const vks_gguf *g) { return g ? g->version : 0; }
uint32_t vks_gguf_alignment(const vks_gguf *g) { return g ? g->alignment : 0; }
uint64_t vks_gguf_data_offset(const vks_gguf *g) { return g ? g->data_offset : 0; }
int64_t vks_gguf_n_kv(const vks_gguf *g) { return g ? g->n_kv : 0; }
int64_t vks_gguf_n_tensors(const vks_gguf *g) { return g ? g->n_tensors : 0; }

const char *vks_gguf_key(const vks_gguf *g, int64_t i) {
    return g && i >= 0 && i < g->n_kv ? arena_str(g, g->kv[i].key) : NULL;
}

vks_gguf_type vks_gguf_kv_type(const vks_gguf *g, int64_t i) {
    return g && i >= 0 && i < g->n_kv ? g->kv[i].type : VKS_GGUF_TYPE_COUNT;
}

const vks_gguf_tensor *vks_gguf_tensor_at(const vks_gguf *g, int64_t i) {
    return g && i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

static int lookup(const vks_gguf *g, const char *key, const kv_entry **e) {
    if (!g || !key) return vks_set_error(VKS_ERR_ARG, "gguf: NULL argument");
    int64_t i = vks_gguf_find_key(g, key);
    if (i < 0) return vks_set_error(VKS_ERR_ARG, "%s: missing key '%s'", g->name, key);
    *e = &g->kv[i];
    return VKS_OK;
}

static int wrong_type(const vks_gguf *g, const char *key, const char *want) {
    return vks_set_error(VKS_ERR_FORMAT, "%s: key '%s' is not %s", g->name, key, want);
}

/* Reads integer element `i` of type t at file offset `off`: signed or unsigned. */
static bool load_int(const vks_gguf *g, vks_gguf_type t, size_t off, int64_t *s, uint64_t *u, bool *is_signed) {
    const uint8_t *p = g->base + off;
    *is_signed = true;
    switch (t) {
    case VKS_GGUF_UINT8: *u = p[0]; *is_signed = false; return true;
    case VKS_GGUF_INT8: { int8_t v; memcpy(&v, p, 1); *s = v; return true; }
    case VKS_GGUF_UINT16: { uint16_t v; memcpy(&v, p, 2); *u = v; *is_signed = false; return true; }
    case VKS_GGUF_INT16: { int16_t v; memcpy(&v, p, 2); *s = v; return true; }
    case VKS_GGUF_UINT32: { uint32_t v; memcpy(&v, p, 4); *u = v; *is_signed = false; return true; }
    case VKS_GGUF_INT32: { int32_t v; memcpy(&v, p, 4); *s = v; return true; }
    case VKS_GGUF_UINT64: memcpy(u, p, 8); *is_signed = false; return true;
    case VKS_GGUF_INT64: memcpy(s, p, 8); return true;
    default: return false;
    }
}

/* Integer in [lo, hi] (hi as u64 so uint64 values fit). */
static int get_int_range(const vks_gguf *g, const char *key, int64_t lo, uint64_t hi, int64_t *s_out,
                         uint64_t *u_out) {
    const kv_entry *e = NULL;
    int rc = lookup(g, key, &e);
    if (rc != VKS_OK) return rc;
    int64_t s = 0;
    uint64_t u = 0;
    bool is_signed;
    if (!load_int(g, e->type, e->val, &s, &u, &is_signed)) return wrong_type(g, key, "an integer");
    if (is_signed) {
        if (s < lo || (s > 0 && (uint64_t)s > hi)) return wrong_type(g, key, "an integer in range");
        u = (uint64_t)s;
    } else {
        if (u > hi) return wrong_type(g, key, "an integer in range");
        s = (int64_t)u; /* only used when hi <= INT64_MAX */
    }
    if (s_out) *s_out = s;
    if (u_out) *u_out = u;
    return VKS_OK;
}

int vks_gguf_get_u32(const vks_gguf *g, const char *key, uint32_t *out) {
    uint64_t u = 0;
    int rc = get_int_range(g, key, 0, UINT32_MAX, NULL, &u);
    if (rc == VKS_OK && out) *out = (uint32_t)u;
    return rc;
}

int vks_gguf_get_i64(const vks_gguf *g, const char *key, int64_t *out) {
    return get_int_range(g, key, INT64_MIN, INT64_MAX, out, NULL);
}

int vks_gguf_get_u64(const vks_gguf *g, const char *key, uint64_t *out) {
    return get_int_range(g, key, 0, UINT64_MAX, NULL, out);
}

int vks_gguf_get_f64(const vks_gguf *g, const char *key, double *out) {
    const kv_entry *e = NULL;
    int rc = lookup(g, key, &e);
    if (rc != VKS_OK) return rc;
    if (e->type == VKS_GGUF_FLOAT32) {
        float f;
        memcpy(&f, g->base + e->val, 4);
        if (out) *out = f;
    } else if (e->type == VKS_GGUF_FLOAT64) {
        double d;
        memcpy(&d, g->base + e->val, 8);
        if (out) *out = d;
    } else {
        return wrong_type(g, key, "a float");
    }
    return VKS_OK;
}

int vks_gguf_get_f32(const vks_gguf *g, const char *key, float *out) {
    double d;
    int rc = vks_gguf_get_f64(g, key, &d);
    if (rc == VKS_OK && out) *out = (float)d;
    return rc;
}

int vks_gguf_get_bool(const vks_gguf *g, const char *key, bool *out) {
    const kv_entry *e = NULL;
    int rc = lookup(g, key, &e);
    if (rc != VKS_OK) return rc;
    if (e->type != VKS_GGUF_BOOL) return wrong_type(g, key, "a bool");
    if (out) *out = g->base[e->val] != 0;
    return VKS_OK;
}

int vks_gguf_get_str(const vks_gguf *g, const char *key, const char **out, size_t *len) {
    const kv_entry *e = NULL;
    int rc = lookup(g, key, &e);
    if (rc != VKS_OK) return rc;
    if (e->type != VKS_GGUF_STRING) return wrong_type(g, key, "a string");
    if (out) *out = arena_str(g, g->strs[e->val]);
    if (len) *len = g->strs[e->val].len;
    return VKS_OK;
}

static int lookup_array(const vks_gguf *g, const char *key, const kv_entry **e) {
    int rc = lookup(g, key, e);
    if (rc == VKS_OK && (*e)->type != VKS_GGUF_ARRAY) rc = wrong_type(g, key, "an array");
    return rc;
}

int vks_gguf_get_arr_info(const vks_gguf *g, const char *key, vks_gguf_type *elem_type, uint64_t *n) {
    const kv_entry *e = NULL;
    int rc = lookup_array(g, key, &e);
    if (rc != VKS_OK) return rc;
    if (elem_type) *elem_type = e->elem;
    if (n) *n = e->n;
    return VKS_OK;
}

int vks_gguf_get_arr_str(const vks_gguf *g, const char *key, uint64_t i, const char **out, size_t *len) {
    const kv_entry *e = NULL;
    int rc = lookup_array(g, key, &e);
    if (rc != VKS_OK) return rc;
    if (e->elem != VKS_GGUF_STRING) return wrong_type(g, key, "an array of strings");
    if (i >= e->n) return vks_set_error(VKS_ERR_ARG, "%s: key '%s': index %llu out of range", g->name, key,
                                        (unsigned long long)i);
    str_ref s = g->strs[e->val + (size_t)i];
    if (out) *out = arena_str(g, s);
    if (len) *len = s.len;
    return VKS_OK;
}

static int numeric_array(const vks_gguf *g, const char *key, uint64_t n, const kv_entry **e) {
    int rc = lookup_array(g, key, e);
    if (rc != VKS_OK) return rc;
    if ((*e)->elem == VKS_GGUF_STRING || (*e)->elem == VKS_GGUF_BOOL) return wrong_type(g, key, "a numeric array");
    if ((*e)->n != n)
        return vks_set_error(VKS_ERR_ARG, "%s: key '%s' has %llu elements, caller expects %llu", g->name, key,
                             (unsigned long long)(*e)->n, (unsigned long long)n);
    return VKS_OK;
}

int vks_gguf_get_arr_f32(const vks_gguf *g, const char *key, float *dst, uint64_t n) {
    const kv_entry *e = NULL;
    int rc = numeric_array(g, key, n, &e);
    if (rc != VKS_OK || !dst) return rc;
    size_t es = vks_gguf_scalar_size(e->elem);
    for (uint64_t i = 0; i < n; i++) {
        size_t off = e->val + (size_t)i * es;
        int64_t s = 0;
        uint64_t u = 0;
        bool is_signed;
        if (e->elem == VKS_GGUF_FLOAT32) {
            memcpy(&dst[i], g->base + off, 4);
        } else if (e->elem == VKS_GGUF_FLOAT64) {
            double d;
            memcpy(&d, g->base + off, 8);
            dst[i] = (float)d;
        } else {
            load_int(g, e->elem, off, &s, &u, &is_signed);
            dst[i] = is_signed ? (float)s : (float)u;
        }
    }
    return VKS_OK;
}

int vks_gguf_get_arr_i32(const vks_gguf *g, const char *key, int32_t *dst, uint64_t n) {
    const kv_entry *e = NULL;
    int rc = numeric_array(g, key, n, &e);
    if (rc != VKS_OK || !dst) return rc;
    if (e->elem == VKS_GGUF_FLOAT32 || e->elem == VKS_GGUF_FLOAT64) return wrong_type(g, key, "an integer array");
    size_t es = vks_gguf_scalar_size(e->elem);
    for (uint64_t i = 0; i < n; i++) {
        int64_t s = 0;
        uint64_t u = 0;
        bool is_signed;
        load_int(g, e->elem, e->val + (size_t)i * es, &s, &u, &is_signed);
        if (is_signed ? (s < INT32_MIN || s > INT32_MAX) : u > INT32_MAX)
            return vks_set_error(VKS_ERR_FORMAT, "%s: key '%s': element %llu does not fit int32", g->name, key,
                                 (unsigned long long)i);
        dst[i] = is_signed ? (int32_t)s : (int32_t)u;
    }
    return VKS_OK;
}
