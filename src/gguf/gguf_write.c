/* gguf_write.c: GGUF version-3 writer. Metadata is serialized as it is added
 * (into one growing buffer); tensors are referenced (or owned) and written,
 * each padded to the alignment, at save. */
#include "vkswarm/vks_gguf.h"
#include "vkswarm/vks_quant.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    char *name;
    uint32_t ggml_type;
    int n_dims;
    int64_t ne[VKS_GGUF_MAX_DIMS];
    uint64_t size, offset;
    const void *data;
    void *owned;
} wtensor;

typedef struct { uint8_t *p; size_t len, cap; } bytes;

struct vks_gguf_writer {
    bytes kv;           /* serialized key/value pairs */
    uint64_t n_kv;
    char **keys; size_t n_keys;
    wtensor *tensors; size_t n_tensors, cap_tensors;
    uint32_t alignment;
};

static int bytes_put(bytes *b, const void *src, size_t n) {
    if (n > SIZE_MAX - b->len) return vks_set_error(VKS_ERR_NOMEM, "gguf writer: metadata too large");
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->len + n) cap = cap > SIZE_MAX / 2 ? b->len + n : cap * 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) return vks_set_error(VKS_ERR_NOMEM, "gguf writer: out of memory");
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
    return VKS_OK;
}

static int put_u32(bytes *b, uint32_t v) { return bytes_put(b, &v, 4); }
static int put_u64(bytes *b, uint64_t v) { return bytes_put(b, &v, 8); }
static int put_str(bytes *b, const char *s, size_t len) {
    int rc = put_u64(b, len);
    return rc == VKS_OK ? bytes_put(b, s, len) : rc;
}

int vks_gguf_writer_create(vks_gguf_writer **out) {
    if (!out) return vks_set_error(VKS_ERR_ARG, "vks_gguf_writer_create: NULL argument");
    *out = calloc(1, sizeof **out);
    if (!*out) return vks_set_error(VKS_ERR_NOMEM, "gguf writer: out of memory");
    (*out)->alignment = VKS_GGUF_DEFAULT_ALIGNMENT;
    return VKS_OK;
}

void vks_gguf_writer_free(vks_gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_keys; i++) free(w->keys[i]);
    for (size_t i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
        free(w->tensors[i].owned);
    }
    free(w->keys);
    free(w->tensors);
    free(w->kv.p);
    free(w);
}

int vks_gguf_writer_set_alignment(vks_gguf_writer *w, uint32_t alignment) {
    if (!w || alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > (1u << 20))
        return vks_set_error(VKS_ERR_ARG, "gguf writer: alignment must be a power of two <= 2^20");
    w->alignment = alignment;
    return VKS_OK;
}

/* Records a new key (refusing duplicates) and writes its name and type. */
static int begin_kv(vks_gguf_writer *w, const char *key, vks_gguf_type t) {
    if (!w || !key || !*key) return vks_set_error(VKS_ERR_ARG, "gguf writer: NULL or empty key");
    for (size_t i = 0; i < w->n_keys; i++)
        if (strcmp(w->keys[i], key) == 0) return vks_set_error(VKS_ERR_ARG, "gguf writer: duplicate key '%s'", key);
    char **keys = realloc(w->keys, (w->n_keys + 1) * sizeof *keys);
    if (!keys) return vks_set_error(VKS_ERR_NOMEM, "gguf writer: out of memory");
    w->keys = keys;
    if (!(w->keys[w->n_keys] = strdup(key))) return vks_set_error(VKS_ERR_NOMEM, "gguf writer: out of memory");
    w->n_keys++;
    w->n_kv++;
    int rc = put_str(&w->kv, key, strlen(key));
    return rc == VKS_OK ? put_u32(&w->kv, (uint32_t)t) : rc;
}

static size_t elem_size(vks_gguf_type t) {
    switch (t) {
    case VKS_GGUF_UINT8: case VKS_GGUF_INT8: case VKS_GGUF_BOOL: return 1;
    case VKS_GGUF_UINT16: case VKS_GGUF_INT16: return 2;
    case VKS_GGUF_UINT32: case VKS_GGUF_INT32: case VKS_GGUF_FLOAT32: return 4;
    case VKS_GGUF_UINT64: case VKS_GGUF_INT64: case VKS_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

int vks_gguf_add_scalar(vks_gguf_writer *w, const char *key, vks_gguf_type t, const void *value) {
    size_t es = elem_size(t);
    if (es == 0 || !value) return vks_set_error(VKS_ERR_ARG, "gguf writer: key '%s': not a scalar type", key ? key : "");
    if (t == VKS_GGUF_BOOL && *(const uint8_t *)value > 1)
        return vks_set_error(VKS_ERR_ARG, "gguf writer: key '%s': bool must be 0 or 1", key ? key : "");
    int rc = begin_kv(w, key, t);
    return rc == VKS_OK ? bytes_put(&w->kv, value, es) : rc;
}

int vks_gguf_add_u32(vks_gguf_writer *w, const char *key, uint32_t v) {
    return vks_gguf_add_scalar(w, key, VKS_GGUF_UINT32, &v);
}
int vks_gguf_add_i32(vks_gguf_writer *w, const char *key, int32_t v) {
    return vks_gguf_add_scalar(w, key, VKS_GGUF_INT32, &v);
}
int vks_gguf_add_f32(vks_gguf_writer *w, const char *key, float v) {
    return vks_gguf_add_scalar(w, key, VKS_GGUF_FLOAT32, &v);
}
int vks_gguf_add_bool(vks_gguf_writer *w, const char *key, bool v) {
    uint8_t b = v ? 1 : 0;
    return vks_gguf_add_scalar(w, key, VKS_GGUF_BOOL, &b);
}

int vks_gguf_add_strn(vks_gguf_writer *w, const char *key, const char *s, size_t len) {
    if (!s && len) return vks_set_error(VKS_ERR_ARG, "gguf writer: NULL string");
    int rc = begin_kv(w, key, VKS_GGUF_STRING);
    return rc == VKS_OK ? put_str(&w->kv, s, len) : rc;
}

int vks_gguf_add_str(vks_gguf_writer *w, const char *key, const char *s) {
    if (!s) return vks_set_error(VKS_ERR_ARG, "gguf writer: NULL string");
    return vks_gguf_add_strn(w, key, s, strlen(s));
}

int vks_gguf_add_arr(vks_gguf_writer *w, const char *key, vks_gguf_type elem_type, const void *data, uint64_t n) {
    size_t es = elem_size(elem_type), total;
    if (es == 0 || (!data && n) || n > SIZE_MAX || !vks_mul_size((size_t)n, es, &total))
        return vks_set_error(VKS_ERR_ARG, "gguf writer: key '%s': bad numeric array", key ? key : "");
    int rc = begin_kv(w, key, VKS_GGUF_ARRAY);
    if (rc == VKS_OK) rc = put_u32(&w->kv, (uint32_t)elem_type);
    if (rc == VKS_OK) rc = put_u64(&w->kv, n);
    return rc == VKS_OK ? bytes_put(&w->kv, data, total) : rc;
}

int vks_gguf_add_arr_str(vks_gguf_writer *w, const char *key, const char *const *strs, uint64_t n) {
    if (!strs && n) return vks_set_error(VKS_ERR_ARG, "gguf writer: NULL string array");
    int rc = begin_kv(w, key, VKS_GGUF_ARRAY);
    if (rc == VKS_OK) rc = put_u32(&w->kv, VKS_GGUF_STRING);
    if (rc == VKS_OK) rc = put_u64(&w->kv, n);
    for (uint64_t i = 0; i < n && rc == VKS_OK; i++) {
        const char *s = strs[i] ? strs[i] : "";
        rc = put_str(&w->kv, s, strlen(s));
    }
    return rc;
}

/* ---- tensors ---- */

static int tensor_shape(const char *name, vks_dtype dtype, int n_dims, const int64_t *ne, wtensor *t) {
    t->ggml_type = vks_gguf_ggml_from_dtype(dtype);
    if (t->ggml_type == UINT32_MAX) return vks_set_error(VKS_ERR_ARG, "gguf writer: tensor '%s': unsupported dtype", name);
    if (n_dims < 1 || n_dims > VKS_GGUF_MAX_DIMS || !ne)
        return vks_set_error(VKS_ERR_ARG, "gguf writer: tensor '%s': n_dims must be 1..4", name);
    uint64_t rows = 1, row_bytes;
    for (int d = 0; d < VKS_GGUF_MAX_DIMS; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    for (int d = 1; d < n_dims; d++)
        if (ne[d] <= 0 || __builtin_mul_overflow(rows, (uint64_t)ne[d], &rows))
            return vks_set_error(VKS_ERR_ARG, "gguf writer: tensor '%s': bad shape", name);
    if (ne[0] <= 0 || !vks_dtype_row_bytes(dtype, (uint64_t)ne[0], &row_bytes) ||
        __builtin_mul_overflow(rows, row_bytes, &t->size))
        return vks_set_error(VKS_ERR_ARG, "gguf writer: tensor '%s': ne[0] is not a whole number of %s blocks", name,
                             vks_dtype_name(dtype));
    t->n_dims = n_dims;
    return VKS_OK;
}

/* Adds a tensor; `owned` (may be NULL) is freed with the writer, or now on failure. */
static int add_tensor(vks_gguf_writer *w, const char *name, vks_dtype dtype, int n_dims, const int64_t *ne,
                      const void *data, void *owned) {
    wtensor t = {0};
    int rc = !w || !name || !data ? vks_set_error(VKS_ERR_ARG, "gguf writer: NULL tensor argument")
                                  : tensor_shape(name, dtype, n_dims, ne, &t);
    for (size_t i = 0; rc == VKS_OK && i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0) rc = vks_set_error(VKS_ERR_ARG, "gguf writer: duplicate tensor '%s'", name);
    if (rc == VKS_OK && w->n_tensors == w->cap_tensors) {
        size_t cap = w->cap_tensors ? 2 * w->cap_tensors : 64;
        wtensor *p = realloc(w->tensors, cap * sizeof *p);
        if (!p) rc = vks_set_error(VKS_ERR_NOMEM, "gguf writer: out of memory");
        else {
            w->tensors = p;
            w->cap_tensors = cap;
        }
    }
    if (rc == VKS_OK && !(t.name = strdup(name))) rc = vks_set_error(VKS_ERR_NOMEM, "gguf writer: out of memory");
    if (rc != VKS_OK) {
        free(owned);
        return rc;
    }
    t.data = data;
    t.owned = owned;
    w->tensors[w->n_tensors++] = t;
    return VKS_OK;
}

int vks_gguf_add_tensor_owned(vks_gguf_writer *w, const char *name, vks_dtype dtype, int n_dims, const int64_t *ne,
                              void *data) {
    return add_tensor(w, name, dtype, n_dims, ne, data, data);
}

int vks_gguf_add_tensor(vks_gguf_writer *w, const char *name, vks_dtype dtype, int n_dims, const int64_t *ne,
                        const void *data) {
    return add_tensor(w, name, dtype, n_dims, ne, data, NULL);
}

/* ---- save ---- */

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static int serialize_header(vks_gguf_writer *w, bytes *h) {
    int rc = VKS_OK;
    bool has_align = false;
    for (size_t i = 0; i < w->n_keys; i++) has_align |= strcmp(w->keys[i], "general.alignment") == 0;
    if (w->alignment != VKS_GGUF_DEFAULT_ALIGNMENT && !has_align)
        rc = vks_gguf_add_u32(w, "general.alignment", w->alignment);
    if (rc == VKS_OK) rc = bytes_put(h, "GGUF", 4);
    if (rc == VKS_OK) rc = put_u32(h, 3);
    if (rc == VKS_OK) rc = put_u64(h, w->n_tensors);
    if (rc == VKS_OK) rc = put_u64(h, w->n_kv);
    if (rc == VKS_OK) rc = bytes_put(h, w->kv.p, w->kv.len);
    uint64_t offset = 0;
    for (size_t i = 0; i < w->n_tensors && rc == VKS_OK; i++) {
        wtensor *t = &w->tensors[i];
        t->offset = offset;
        offset = align_up(offset + t->size, w->alignment);
        rc = put_str(h, t->name, strlen(t->name));
        if (rc == VKS_OK) rc = put_u32(h, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims && rc == VKS_OK; d++) rc = put_u64(h, (uint64_t)t->ne[d]);
        if (rc == VKS_OK) rc = put_u32(h, t->ggml_type);
        if (rc == VKS_OK) rc = put_u64(h, t->offset);
    }
    return rc;
}

static bool write_padding(FILE *f, uint64_t pos, uint32_t alignment) {
    static const uint8_t zeros[64];
    uint64_t pad = align_up(pos, alignment) - pos;
    while (pad > 0) {
        size_t k = pad < sizeof zeros ? (size_t)pad : sizeof zeros;
        if (fwrite(zeros, 1, k, f) != k) return false;
        pad -= k;
    }
    return true;
}

int vks_gguf_writer_write_stream(vks_gguf_writer *w, FILE *f, const char *name) {
    if (!w || !f || !name) return vks_set_error(VKS_ERR_ARG, "vks_gguf_writer_write_stream: NULL argument");
    bytes h = {0};
    int rc = serialize_header(w, &h);
    bool ok = rc == VKS_OK && fwrite(h.p, 1, h.len, f) == h.len && write_padding(f, h.len, w->alignment);
    for (size_t i = 0; ok && i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        ok = fwrite(t->data, 1, (size_t)t->size, f) == t->size && write_padding(f, t->size, w->alignment);
    }
    free(h.p);
    if (rc == VKS_OK && !ok) rc = vks_set_error(VKS_ERR_IO, "%s: write failed", name);
    return rc;
}

int vks_gguf_writer_save(vks_gguf_writer *w, const char *path) {
    if (!w || !path) return vks_set_error(VKS_ERR_ARG, "vks_gguf_writer_save: NULL argument");
    vks_outfile o; /* a temporary renamed into place: `path` may be the mapped input */
    int rc = vks_outfile_open(&o, path, 0666);
    if (rc != VKS_OK) return rc;
    rc = vks_gguf_writer_write_stream(w, o.f, path);
    if (rc == VKS_OK) return vks_outfile_commit(&o);
    vks_outfile_abort(&o);
    return rc;
}
