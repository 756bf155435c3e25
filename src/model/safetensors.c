/* safetensors.c: safetensors reader and writer.
 *
 * Layout: u64 little-endian header length N, N bytes of JSON (an object:
 * tensor name -> {"dtype", "shape", "data_offsets": [begin, end]}, plus an
 * optional "__metadata__" of strings), then the data section; offsets are
 * relative to its start.
 *
 * Hostile input: N is checked against the file size and a 100 MiB cap before
 * the JSON is parsed (jansson, duplicate keys refused); every tensor's dtype
 * must be known, its shape product times the element size must equal
 * end - begin without overflow, the range must lie in the data section, and
 * ranges must not overlap.
 */
#include "vkswarm/vks_safetensors.h"
#include "model/model_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct vks_st_file {
    char name[512];
    const uint8_t *base; size_t size;
    void *map;
    vks_st_tensor *tensors; int64_t n;
    int64_t *sorted; /* by name */
};

static const struct { const char *name; size_t bytes; vks_dtype dtype; } st_dtypes[] = {
    {"F32", 4, VKS_DTYPE_F32},    {"F16", 2, VKS_DTYPE_F16},    {"BF16", 2, VKS_DTYPE_BF16},
    {"F64", 8, VKS_DTYPE_COUNT},  {"I64", 8, VKS_DTYPE_COUNT},  {"U64", 8, VKS_DTYPE_COUNT},
    {"I32", 4, VKS_DTYPE_COUNT},  {"U32", 4, VKS_DTYPE_COUNT},  {"I16", 2, VKS_DTYPE_COUNT},
    {"U16", 2, VKS_DTYPE_COUNT},  {"I8", 1, VKS_DTYPE_COUNT},   {"U8", 1, VKS_DTYPE_COUNT},
    {"BOOL", 1, VKS_DTYPE_COUNT}, {"F8_E4M3", 1, VKS_DTYPE_COUNT}, {"F8_E5M2", 1, VKS_DTYPE_COUNT},
};

static int find_dtype(const char *s) {
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (strcmp(s, st_dtypes[i].name) == 0) return (int)i;
    return -1;
}

static int bad(const vks_st_file *f, const char *tensor, const char *problem) {
    return vks_set_error(VKS_ERR_FORMAT, "%s: tensor '%s': %s", f->name, tensor, problem);
}

static int parse_shape(const vks_st_file *f, const char *name, json_t *shape, vks_st_tensor *t, uint64_t *numel) {
    if (!json_is_array(shape) || json_array_size(shape) > VKS_ST_MAX_DIMS) return bad(f, name, "bad shape");
    t->n_dims = (int)json_array_size(shape);
    *numel = 1;
    for (int d = 0; d < t->n_dims; d++) {
        json_t *v = json_array_get(shape, (size_t)d);
        if (!json_is_integer(v) || json_integer_value(v) < 0) return bad(f, name, "shape entries must be integers >= 0");
        t->shape[d] = (int64_t)json_integer_value(v);
        if (__builtin_mul_overflow(*numel, (uint64_t)t->shape[d], numel)) return bad(f, name, "shape overflows");
    }
    return VKS_OK;
}

static int parse_tensor(const vks_st_file *f, const char *name, json_t *obj, uint64_t data_size, vks_st_tensor *t) {
    if (!json_is_object(obj)) return bad(f, name, "entry is not an object");
    json_t *dt = json_object_get(obj, "dtype"), *offs = json_object_get(obj, "data_offsets");
    int di = json_is_string(dt) ? find_dtype(json_string_value(dt)) : -1;
    if (di < 0) return bad(f, name, "unknown or missing dtype");
    uint64_t numel = 0, bytes = 0;
    int rc = parse_shape(f, name, json_object_get(obj, "shape"), t, &numel);
    if (rc != VKS_OK) return rc;
    if (!json_is_array(offs) || json_array_size(offs) != 2 || !json_is_integer(json_array_get(offs, 0)) ||
        !json_is_integer(json_array_get(offs, 1)))
        return bad(f, name, "data_offsets must be [begin, end]");
    json_int_t begin = json_integer_value(json_array_get(offs, 0)), end = json_integer_value(json_array_get(offs, 1));
    if (begin < 0 || end < begin || (uint64_t)end > data_size) return bad(f, name, "data_offsets outside the data section");
    if (__builtin_mul_overflow(numel, (uint64_t)st_dtypes[di].bytes, &bytes) || bytes != (uint64_t)(end - begin))
        return bad(f, name, "byte size of the shape disagrees with data_offsets");
    t->dtype_name = st_dtypes[di].name;
    t->dtype = st_dtypes[di].dtype;
    t->size = bytes;
    t->data = (const uint8_t *)(uintptr_t)(uint64_t)begin; /* offset; made a pointer by the caller */
    return VKS_OK;
}

static _Thread_local const vks_st_file *sort_f;

static int cmp_name(const void *a, const void *b) {
    return strcmp(sort_f->tensors[*(const int64_t *)a].name, sort_f->tensors[*(const int64_t *)b].name);
}

static int cmp_offset(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)sort_f->tensors[*(const int64_t *)a].data;
    uintptr_t y = (uintptr_t)sort_f->tensors[*(const int64_t *)b].data;
    return x < y ? -1 : x > y;
}

/* Sorts by offset to refuse overlaps, then by name for lookups. */
static int index_tensors(vks_st_file *f) {
    f->sorted = malloc((size_t)(f->n ? f->n : 1) * sizeof *f->sorted);
    if (!f->sorted) return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", f->name);
    for (int64_t i = 0; i < f->n; i++) f->sorted[i] = i;
    sort_f = f;
    qsort(f->sorted, (size_t)f->n, sizeof *f->sorted, cmp_offset);
    for (int64_t i = 1; i < f->n; i++) {
        const vks_st_tensor *a = &f->tensors[f->sorted[i - 1]], *b = &f->tensors[f->sorted[i]];
        if ((uintptr_t)a->data + a->size > (uintptr_t)b->data) return bad(f, b->name, "overlaps another tensor");
    }
    qsort(f->sorted, (size_t)f->n, sizeof *f->sorted, cmp_name);
    return VKS_OK;
}

static int parse_entries(vks_st_file *f, json_t *root, size_t data_start) {
    f->tensors = calloc(json_object_size(root) + 1, sizeof *f->tensors);
    if (!f->tensors) return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", f->name);
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(val)) return vks_set_error(VKS_ERR_FORMAT, "%s: __metadata__ is not an object", f->name);
            continue;
        }
        vks_st_tensor *t = &f->tensors[f->n];
        if (!(t->name = strdup(key))) return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", f->name);
        f->n++;
        int rc = parse_tensor(f, key, val, f->size - data_start, t);
        if (rc != VKS_OK) return rc;
    }
    int rc = index_tensors(f);
    for (int64_t i = 0; i < f->n; i++) f->tensors[i].data = f->base + data_start + (uintptr_t)f->tensors[i].data;
    return rc;
}

static int parse(vks_st_file *f) {
    uint64_t n;
    if (f->size < 8) return vks_set_error(VKS_ERR_FORMAT, "%s: truncated: no header length", f->name);
    memcpy(&n, f->base, 8);
    if (n > f->size - 8 || n > VKS_ST_MAX_HEADER)
        return vks_set_error(VKS_ERR_FORMAT, "%s: header length %llu exceeds the file (%zu bytes) or the %llu-byte cap",
                             f->name, (unsigned long long)n, f->size, (unsigned long long)VKS_ST_MAX_HEADER);
    json_error_t err;
    json_t *root = json_loadb((const char *)f->base + 8, (size_t)n, JSON_REJECT_DUPLICATES, &err);
    if (!root) return vks_set_error(VKS_ERR_FORMAT, "%s: bad JSON header: %s (at byte %d)", f->name, err.text, err.position);
    int rc = json_is_object(root) ? parse_entries(f, root, 8 + (size_t)n)
                                   : vks_set_error(VKS_ERR_FORMAT, "%s: JSON header is not an object", f->name);
    json_decref(root);
    return rc;
}

static int finish_open(vks_st_file *f, vks_st_file **out) {
    int rc = parse(f);
    if (rc != VKS_OK) {
        vks_st_close(f);
        return rc;
    }
    *out = f;
    return VKS_OK;
}

int vks_st_open(const char *path, vks_st_file **out) {
    if (!path || !out) return vks_set_error(VKS_ERR_ARG, "vks_st_open: NULL argument");
    *out = NULL;
    int fd = vks_open_read(path, 0); /* a FIFO must not block: refused below */
    if (fd < 0) return vks_set_error(VKS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 8 || (uintmax_t)st.st_size > SIZE_MAX) {
        close(fd);
        return vks_set_error(VKS_ERR_FORMAT, "%s: not a regular file of at least 8 bytes", path);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return vks_set_error(VKS_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
    vks_st_file *f = calloc(1, sizeof *f);
    if (!f) {
        munmap(map, (size_t)st.st_size);
        return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", path);
    }
    snprintf(f->name, sizeof f->name, "%s", path);
    f->map = map;
    f->base = map;
    f->size = (size_t)st.st_size;
    return finish_open(f, out);
}

int vks_st_open_memory(const void *data, size_t size, const char *name, vks_st_file **out) {
    if (!out || (!data && size)) return vks_set_error(VKS_ERR_ARG, "vks_st_open_memory: NULL argument");
    *out = NULL;
    vks_st_file *f = calloc(1, sizeof *f);
    uint8_t *copy = malloc(size ? size : 1);
    if (!f || !copy) {
        free(f);
        free(copy);
        return vks_set_error(VKS_ERR_NOMEM, "out of memory");
    }
    snprintf(f->name, sizeof f->name, "%s", name ? name : "(memory)");
    if (size) memcpy(copy, data, size);
    f->base = copy;
    f->size = size;
    return finish_open(f, out);
}

void vks_st_close(vks_st_file *f) {
    if (!f) return;
    if (f->map) munmap(f->map, f->size);
    else free((void *)f->base);
    for (int64_t i = 0; i < f->n; i++) free((void *)f->tensors[i].name);
    free(f->tensors);
    free(f->sorted);
    free(f);
}

int64_t vks_st_n_tensors(const vks_st_file *f) { return f ? f->n : 0; }

const vks_st_tensor *vks_st_tensor_at(const vks_st_file *f, int64_t i) {
    return f && i >= 0 && i < f->n ? &f->tensors[i] : NULL;
}

const vks_st_tensor *vks_st_find(const vks_st_file *f, const char *name) {
    if (!f || !name) return NULL;
    int64_t lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->tensors[f->sorted[mid]].name, name);
        if (c == 0) return &f->tensors[f->sorted[mid]];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

/* ---- writer ---- */

static const char *st_dtype_name(vks_dtype t) {
    return t == VKS_DTYPE_F32 ? "F32" : t == VKS_DTYPE_F16 ? "F16" : t == VKS_DTYPE_BF16 ? "BF16" : NULL;
}

static int tensor_bytes(const vks_st_write_tensor *t, uint64_t *bytes) {
    *bytes = vks_dtype_size(t->dtype);
    if (!st_dtype_name(t->dtype) || t->n_dims < 0 || t->n_dims > VKS_ST_MAX_DIMS || !t->name || !t->data)
        return vks_set_error(VKS_ERR_ARG, "safetensors writer: tensor '%s': bad dtype, dims or data",
                             t->name ? t->name : "");
    for (int d = 0; d < t->n_dims; d++)
        if (t->shape[d] < 0 || __builtin_mul_overflow(*bytes, (uint64_t)t->shape[d], bytes))
            return vks_set_error(VKS_ERR_ARG, "safetensors writer: tensor '%s': bad shape", t->name);
    return VKS_OK;
}

static char *build_header(const vks_st_write_tensor *t, size_t n) {
    json_t *root = json_object(), *meta = json_object();
    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(root, "__metadata__", meta);
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t bytes = 0;
        if (tensor_bytes(&t[i], &bytes) != VKS_OK) {
            json_decref(root);
            return NULL;
        }
        json_t *e = json_object(), *shape = json_array();
        for (int d = 0; d < t[i].n_dims; d++) json_array_append_new(shape, json_integer(t[i].shape[d]));
        json_object_set_new(e, "dtype", json_string(st_dtype_name(t[i].dtype)));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets", json_pack("[II]", (json_int_t)off, (json_int_t)(off + bytes)));
        json_object_set_new(root, t[i].name, e);
        off += bytes;
    }
    char *s = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(root);
    if (!s) vks_set_error(VKS_ERR_NOMEM, "safetensors writer: cannot build the header");
    return s;
}

int vks_st_write_stream(FILE *f, const char *name, const vks_st_write_tensor *t, size_t n) {
    if (!f || !name || (!t && n)) return vks_set_error(VKS_ERR_ARG, "vks_st_write_stream: NULL argument");
    char *hdr = build_header(t, n);
    if (!hdr) return VKS_ERR_ARG;
    size_t len = strlen(hdr);
    uint64_t padded = (len + 7) / 8 * 8; /* data section 8-byte aligned */
    bool ok = fwrite(&padded, 8, 1, f) == 1 && fwrite(hdr, 1, len, f) == len;
    for (uint64_t i = len; ok && i < padded; i++) ok = fputc(' ', f) != EOF;
    for (size_t i = 0; ok && i < n; i++) {
        uint64_t bytes = 0;
        tensor_bytes(&t[i], &bytes);
        ok = fwrite(t[i].data, 1, (size_t)bytes, f) == bytes;
    }
    int e = errno;
    free(hdr);
    return ok ? VKS_OK : vks_set_error(VKS_ERR_IO, "%s: write failed: %s", name, strerror(e ? e : EIO));
}

int vks_st_write(const char *path, const vks_st_write_tensor *t, size_t n) {
    if (!path || (!t && n)) return vks_set_error(VKS_ERR_ARG, "vks_st_write: NULL argument");
    vks_outfile o;
    int rc = vks_outfile_open(&o, path, 0666);
    if (rc == VKS_OK) rc = vks_st_write_stream(o.f, path, t, n);
    if (rc == VKS_OK) return vks_outfile_commit(&o);
    vks_outfile_abort(&o);
    return rc;
}
