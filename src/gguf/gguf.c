/* gguf.c: GGUF reader (versions 2 and 3, little-endian).
 *
 * Layout: "GGUF", u32 version, u64 n_tensors, u64 n_kv, n_kv key/value pairs
 * (string key, u32 type, value), n_tensors tensor infos (string name, u32
 * n_dims, u64 ne[n_dims], u32 ggml type, u64 offset), padding to
 * general.alignment (default 32), then the data section. Strings are u64
 * length + bytes (no NUL).
 *
 * Hostile input: every read is bounds-checked against the file size, counts
 * are capped by the bytes that could hold them before anything is allocated,
 * keys and tensor names must be unique (checked after sorting, so a file with
 * a million keys cannot make us quadratic), tensors must lie inside the file,
 * be aligned and not overlap. Everything is validated at open, so getters only
 * fail on a missing key or a type mismatch.
 */
#include "vkswarm/vks_gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC "GGUF"
#define MAX_ALIGNMENT (1u << 20)

#include "gguf/gguf_internal.h"

/* ---- type tables ---- */

size_t vks_gguf_scalar_size(vks_gguf_type t) {
    switch (t) {
    case VKS_GGUF_UINT8: case VKS_GGUF_INT8: case VKS_GGUF_BOOL: return 1;
    case VKS_GGUF_UINT16: case VKS_GGUF_INT16: return 2;
    case VKS_GGUF_UINT32: case VKS_GGUF_INT32: case VKS_GGUF_FLOAT32: return 4;
    case VKS_GGUF_UINT64: case VKS_GGUF_INT64: case VKS_GGUF_FLOAT64: return 8;
    default: return 0; /* string, array */
    }
}

/* ggml types a file may hold: block elements and bytes (0 = unknown). Types
 * vkswarm cannot compute with are still sized so their files open. */
static bool ggml_type_size(uint32_t t, uint64_t *blck, uint64_t *bytes) {
    static const struct { uint32_t type, blck, bytes; } table[] = {
        {0, 1, 4},      {1, 1, 2},      {2, 32, 18},    {3, 32, 20},  {6, 32, 22},
        {7, 32, 24},    {8, 32, 34},    {9, 32, 36},    {10, 256, 84}, {11, 256, 110},
        {12, 256, 144}, {13, 256, 176}, {14, 256, 210}, {15, 256, 292}, {24, 1, 1},
        {25, 1, 2},     {26, 1, 4},     {27, 1, 8},     {28, 1, 8},   {30, 1, 2},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (table[i].type == t) {
            *blck = table[i].blck;
            *bytes = table[i].bytes;
            return true;
        }
    }
    return false;
}

vks_dtype vks_gguf_dtype_from_ggml(uint32_t t) {
    switch (t) {
    case VKS_GGML_F32: return VKS_DTYPE_F32;
    case VKS_GGML_F16: return VKS_DTYPE_F16;
    case VKS_GGML_BF16: return VKS_DTYPE_BF16;
    case VKS_GGML_Q8_0: return VKS_DTYPE_Q8_0;
    case VKS_GGML_Q4_0: return VKS_DTYPE_Q4_0;
    case VKS_GGML_Q4_K: return VKS_DTYPE_Q4_K;
    case VKS_GGML_Q6_K: return VKS_DTYPE_Q6_K;
    default: return VKS_DTYPE_COUNT;
    }
}

uint32_t vks_gguf_ggml_from_dtype(vks_dtype t) {
    switch (t) {
    case VKS_DTYPE_F32: return VKS_GGML_F32;
    case VKS_DTYPE_F16: return VKS_GGML_F16;
    case VKS_DTYPE_BF16: return VKS_GGML_BF16;
    case VKS_DTYPE_Q8_0: return VKS_GGML_Q8_0;
    case VKS_DTYPE_Q4_0: return VKS_GGML_Q4_0;
    case VKS_DTYPE_Q4_K: return VKS_GGML_Q4_K;
    case VKS_DTYPE_Q6_K: return VKS_GGML_Q6_K;
    default: return UINT32_MAX;
    }
}

/* ---- bounded reading ---- */

typedef struct {
    vks_gguf *g;
    size_t pos;
} reader;

static int truncated(reader *r, const char *what) {
    return vks_set_error(VKS_ERR_FORMAT, "%s: truncated: %s at offset %zu runs past the end (%zu bytes)",
                         r->g->name, what, r->pos, r->g->size);
}

static int read_bytes(reader *r, void *dst, size_t n, const char *what) {
    if (n > r->g->size - r->pos) {
        memset(dst, 0, n); /* defined even on error: gcc -O3 cannot see that truncated() returns non-zero */
        return truncated(r, what);
    }
    memcpy(dst, r->g->base + r->pos, n);
    r->pos += n;
    return VKS_OK;
}

static int read_u32(reader *r, uint32_t *v, const char *what) { return read_bytes(r, v, 4, what); }
static int read_u64(reader *r, uint64_t *v, const char *what) { return read_bytes(r, v, 8, what); }

static size_t remaining(const reader *r) { return r->g->size - r->pos; }

/* Copies `len` bytes + NUL into the arena (growing it); returns the reference. */
static int arena_add(vks_gguf *g, const uint8_t *src, size_t len, str_ref *out) {
    size_t need;
    if (!vks_add_size(g->arena_len, len, &need) || !vks_add_size(need, 1, &need))
        return vks_set_error(VKS_ERR_NOMEM, "%s: metadata too large", g->name);
    if (need > g->arena_cap) {
        size_t cap = g->arena_cap ? g->arena_cap : 4096;
        while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
        char *a = realloc(g->arena, cap);
        if (!a) return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory for metadata strings", g->name);
        g->arena = a;
        g->arena_cap = cap;
    }
    memcpy(g->arena + g->arena_len, src, len);
    g->arena[g->arena_len + len] = '\0';
    out->off = g->arena_len;
    out->len = len;
    g->arena_len = need;
    return VKS_OK;
}

/* Reads a GGUF string (u64 length, bytes) into the arena. */
static int read_string(reader *r, str_ref *out, const char *what) {
    uint64_t len;
    int rc = read_u64(r, &len, what);
    if (rc != VKS_OK) return rc;
    if (len > remaining(r))
        return vks_set_error(VKS_ERR_FORMAT, "%s: %s at offset %zu claims %llu bytes, only %zu remain",
                             r->g->name, what, r->pos - 8, (unsigned long long)len, remaining(r));
    rc = arena_add(r->g, r->g->base + r->pos, (size_t)len, out);
    r->pos += (size_t)len;
    return rc;
}


/* ---- metadata ---- */

static int strs_reserve(vks_gguf *g, uint64_t more) {
    if (more > SIZE_MAX / sizeof(str_ref) - g->n_strs)
        return vks_set_error(VKS_ERR_FORMAT, "%s: too many strings", g->name);
    size_t need = g->n_strs + (size_t)more;
    if (need <= g->cap_strs) return VKS_OK;
    size_t cap = g->cap_strs ? g->cap_strs : 64;
    while (cap < need) cap = cap > SIZE_MAX / 2 / sizeof(str_ref) ? need : cap * 2;
    str_ref *s = realloc(g->strs, cap * sizeof *s);
    if (!s) return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory for metadata", g->name);
    g->strs = s;
    g->cap_strs = cap;
    return VKS_OK;
}

static int read_string_value(reader *r, kv_entry *e, const char *what) {
    int rc = strs_reserve(r->g, 1);
    if (rc != VKS_OK) return rc;
    e->val = r->g->n_strs;
    rc = read_string(r, &r->g->strs[r->g->n_strs], what);
    if (rc == VKS_OK) r->g->n_strs++;
    return rc;
}

static int check_bools(reader *r, const kv_entry *e, uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        if (r->g->base[e->val + i] > 1)
            return vks_set_error(VKS_ERR_FORMAT, "%s: key '%s': bool value %u is not 0 or 1", r->g->name,
                                 arena_str(r->g, e->key), r->g->base[e->val + i]);
    return VKS_OK;
}

static int read_array(reader *r, kv_entry *e) {
    const char *key = arena_str(r->g, e->key);
    uint32_t elem;
    int rc = read_u32(r, &elem, "array type");
    if (rc == VKS_OK) rc = read_u64(r, &e->n, "array length");
    if (rc != VKS_OK) return rc;
    if (elem == VKS_GGUF_ARRAY || elem >= VKS_GGUF_TYPE_COUNT)
        return vks_set_error(VKS_ERR_FORMAT, "%s: key '%s': unsupported array element type %u", r->g->name, key,
                             elem);
    e->elem = (vks_gguf_type)elem;
    size_t es = elem == VKS_GGUF_STRING ? 8 : vks_gguf_scalar_size(e->elem); /* strings: at least their length */
    if (e->n > remaining(r) / es)
        return vks_set_error(VKS_ERR_FORMAT, "%s: key '%s': array of %llu elements does not fit in the file",
                             r->g->name, key, (unsigned long long)e->n);
    if (elem != VKS_GGUF_STRING) {
        e->val = r->pos;
        r->pos += (size_t)e->n * es;
        return elem == VKS_GGUF_BOOL ? check_bools(r, e, e->n) : VKS_OK;
    }
    if ((rc = strs_reserve(r->g, e->n)) != VKS_OK) return rc;
    e->val = r->g->n_strs;
    for (uint64_t i = 0; i < e->n; i++) {
        if ((rc = read_string(r, &r->g->strs[r->g->n_strs], "array string")) != VKS_OK) return rc;
        r->g->n_strs++;
    }
    return VKS_OK;
}

static int read_kv(reader *r, kv_entry *e) {
    uint32_t type;
    int rc = read_string(r, &e->key, "key");
    if (rc == VKS_OK) rc = read_u32(r, &type, "value type");
    if (rc != VKS_OK) return rc;
    const char *key = arena_str(r->g, e->key);
    if (e->key.len == 0 || strlen(key) != e->key.len)
        return vks_set_error(VKS_ERR_FORMAT, "%s: empty metadata key or a key with a NUL byte", r->g->name);
    if (type >= VKS_GGUF_TYPE_COUNT)
        return vks_set_error(VKS_ERR_FORMAT, "%s: key '%s': unknown value type %u", r->g->name, key, type);
    e->type = (vks_gguf_type)type;
    if (type == VKS_GGUF_STRING) return read_string_value(r, e, key);
    if (type == VKS_GGUF_ARRAY) return read_array(r, e);
    e->val = r->pos;
    rc = read_bytes(r, &(uint64_t){0}, vks_gguf_scalar_size(e->type), key);
    return rc == VKS_OK && type == VKS_GGUF_BOOL ? check_bools(r, e, 1) : rc;
}

/* ---- sorted lookup ---- */

static _Thread_local const vks_gguf *sort_g; /* qsort has no context argument */

static int cmp_kv(const void *a, const void *b) {
    const vks_gguf *g = sort_g;
    return strcmp(arena_str(g, g->kv[*(const int64_t *)a].key), arena_str(g, g->kv[*(const int64_t *)b].key));
}

static int cmp_tensor_name(const void *a, const void *b) {
    const vks_gguf *g = sort_g;
    return strcmp(g->tensors[*(const int64_t *)a].name, g->tensors[*(const int64_t *)b].name);
}

static int cmp_tensor_offset(const void *a, const void *b) {
    const vks_gguf *g = sort_g;
    uint64_t x = g->tensors[*(const int64_t *)a].offset, y = g->tensors[*(const int64_t *)b].offset;
    return x < y ? -1 : x > y;
}

static int64_t *sorted_indices(vks_gguf *g, int64_t n, int (*cmp)(const void *, const void *)) {
    int64_t *idx = malloc((size_t)(n > 0 ? n : 1) * sizeof *idx);
    if (!idx) return NULL;
    for (int64_t i = 0; i < n; i++) idx[i] = i;
    sort_g = g;
    qsort(idx, (size_t)n, sizeof *idx, cmp);
    return idx;
}

static int index_keys(vks_gguf *g) {
    g->kv_sorted = sorted_indices(g, g->n_kv, cmp_kv);
    if (!g->kv_sorted) return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", g->name);
    for (int64_t i = 1; i < g->n_kv; i++) {
        const char *a = arena_str(g, g->kv[g->kv_sorted[i - 1]].key), *b = arena_str(g, g->kv[g->kv_sorted[i]].key);
        if (strcmp(a, b) == 0) return vks_set_error(VKS_ERR_FORMAT, "%s: duplicate metadata key '%s'", g->name, a);
    }
    return VKS_OK;
}

int64_t vks_gguf_find_key(const vks_gguf *g, const char *key) {
    if (!g || !key) return -1;
    int64_t lo = 0, hi = g->n_kv - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(arena_str(g, g->kv[g->kv_sorted[mid]].key), key);
        if (c == 0) return g->kv_sorted[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

/* ---- tensor infos ---- */

static int tensor_error(const vks_gguf *g, const vks_gguf_tensor *t, const char *problem) {
    return vks_set_error(VKS_ERR_FORMAT, "%s: tensor '%s': %s", g->name, t->name, problem);
}

static int read_dims(reader *r, vks_gguf_tensor *t, uint64_t *n_elems) {
    uint32_t n_dims;
    int rc = read_u32(r, &n_dims, "tensor n_dims");
    if (rc != VKS_OK) return rc;
    if (n_dims < 1 || n_dims > VKS_GGUF_MAX_DIMS) return tensor_error(r->g, t, "n_dims must be 1..4");
    t->n_dims = (int)n_dims;
    *n_elems = 1;
    for (int d = 0; d < VKS_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        uint64_t ne;
        if ((rc = read_u64(r, &ne, "tensor dimension")) != VKS_OK) return rc;
        if (ne == 0 || ne > (uint64_t)INT64_MAX || __builtin_mul_overflow(*n_elems, ne, n_elems) ||
            *n_elems > (uint64_t)INT64_MAX)
            return tensor_error(r->g, t, "dimension is zero or the element count overflows");
        t->ne[d] = (int64_t)ne;
    }
    return VKS_OK;
}

static int read_tensor_info(reader *r, vks_gguf_tensor *t) {
    str_ref name;
    int rc = read_string(r, &name, "tensor name");
    if (rc != VKS_OK) return rc;
    t->name = (const char *)(uintptr_t)name.off; /* resolved to a pointer after the arena stops moving */
    vks_gguf_tensor shown = *t;
    shown.name = arena_str(r->g, name);
    if (strlen(shown.name) != name.len) return tensor_error(r->g, &shown, "name holds a NUL byte");
    uint64_t n_elems = 0, blck = 1, bytes = 0;
    if ((rc = read_dims(r, &shown, &n_elems)) != VKS_OK) return rc;
    if ((rc = read_u32(r, &shown.ggml_type, "tensor type")) != VKS_OK) return rc;
    if ((rc = read_u64(r, &shown.offset, "tensor offset")) != VKS_OK) return rc;
    if (!ggml_type_size(shown.ggml_type, &blck, &bytes)) return tensor_error(r->g, &shown, "unknown ggml type");
    if (shown.ne[0] % (int64_t)blck != 0) return tensor_error(r->g, &shown, "row is not a whole number of blocks");
    if (__builtin_mul_overflow(n_elems / blck, bytes, &shown.size)) return tensor_error(r->g, &shown, "size overflows");
    shown.dtype = vks_gguf_dtype_from_ggml(shown.ggml_type);
    shown.name = t->name;
    *t = shown;
    return VKS_OK;
}

/* Checks alignment, extent and overlap of every tensor, then points data into the file. */
static int place_tensors(vks_gguf *g) {
    for (int64_t i = 0; i < g->n_tensors; i++) {
        vks_gguf_tensor *t = &g->tensors[i];
        uint64_t start, end;
        if (t->offset % g->alignment != 0) return tensor_error(g, t, "offset is not a multiple of the alignment");
        if (__builtin_add_overflow(g->data_offset, t->offset, &start) ||
            __builtin_add_overflow(start, t->size, &end) || end > g->size)
            return tensor_error(g, t, "data runs past the end of the file");
        t->data = g->base + start;
    }
    int64_t *by_off = sorted_indices(g, g->n_tensors, cmp_tensor_offset);
    if (!by_off) return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", g->name);
    int rc = VKS_OK;
    for (int64_t i = 1; i < g->n_tensors && rc == VKS_OK; i++) {
        const vks_gguf_tensor *a = &g->tensors[by_off[i - 1]], *b = &g->tensors[by_off[i]];
        if (a->offset + a->size > b->offset) rc = tensor_error(g, b, "overlaps another tensor");
    }
    free(by_off);
    return rc;
}

static int index_tensors(vks_gguf *g) {
    for (int64_t i = 0; i < g->n_tensors; i++)
        g->tensors[i].name = g->arena + (size_t)(uintptr_t)g->tensors[i].name;
    g->tensor_sorted = sorted_indices(g, g->n_tensors, cmp_tensor_name);
    if (!g->tensor_sorted) return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", g->name);
    for (int64_t i = 1; i < g->n_tensors; i++) {
        const char *a = g->tensors[g->tensor_sorted[i - 1]].name, *b = g->tensors[g->tensor_sorted[i]].name;
        if (strcmp(a, b) == 0) return vks_set_error(VKS_ERR_FORMAT, "%s: duplicate tensor '%s'", g->name, a);
    }
    return VKS_OK;
}

const vks_gguf_tensor *vks_gguf_find_tensor(const vks_gguf *g, const char *name) {
    if (!g || !name) return NULL;
    int64_t lo = 0, hi = g->n_tensors - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        const vks_gguf_tensor *t = &g->tensors[g->tensor_sorted[mid]];
        int c = strcmp(t->name, name);
        if (c == 0) return t;
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

/* ---- open ---- */

static int read_header(reader *r, uint64_t *n_tensors, uint64_t *n_kv) {
    vks_gguf *g = r->g;
    char magic[4];
    int rc = read_bytes(r, magic, 4, "magic");
    if (rc == VKS_OK && memcmp(magic, GGUF_MAGIC, 4) != 0)
        return vks_set_error(VKS_ERR_FORMAT, "%s: not a GGUF file (bad magic)", g->name);
    if (rc == VKS_OK) rc = read_u32(r, &g->version, "version");
    if (rc != VKS_OK) return rc;
    if (g->version != 2 && g->version != 3)
        return vks_set_error(VKS_ERR_FORMAT, "%s: unsupported GGUF version %u (need 2 or 3)", g->name, g->version);
    rc = read_u64(r, n_tensors, "tensor count");
    if (rc == VKS_OK) rc = read_u64(r, n_kv, "metadata count");
    if (rc != VKS_OK) return rc;
    /* A key/value needs >= 13 bytes (length, 1-byte key, type), a tensor info >= 29. */
    if (*n_kv > remaining(r) / 13 || *n_tensors > remaining(r) / 29)
        return vks_set_error(VKS_ERR_FORMAT, "%s: header claims %llu keys and %llu tensors, more than %zu bytes hold",
                             g->name, (unsigned long long)*n_kv, (unsigned long long)*n_tensors, remaining(r));
    return VKS_OK;
}

static int read_alignment(vks_gguf *g) {
    g->alignment = VKS_GGUF_DEFAULT_ALIGNMENT;
    int64_t i = vks_gguf_find_key(g, "general.alignment");
    if (i < 0) return VKS_OK;
    if (g->kv[i].type != VKS_GGUF_UINT32)
        return vks_set_error(VKS_ERR_FORMAT, "%s: general.alignment must be a uint32", g->name);
    uint32_t a;
    memcpy(&a, g->base + g->kv[i].val, 4);
    if (a == 0 || (a & (a - 1)) != 0 || a > MAX_ALIGNMENT)
        return vks_set_error(VKS_ERR_FORMAT, "%s: general.alignment %u is not a power of two <= %u", g->name, a,
                             MAX_ALIGNMENT);
    g->alignment = a;
    return VKS_OK;
}

static int parse(vks_gguf *g) {
    reader r = {g, 0};
    uint64_t n_tensors = 0, n_kv = 0;
    int rc = read_header(&r, &n_tensors, &n_kv);
    if (rc != VKS_OK) return rc;
    g->kv = calloc((size_t)n_kv + 1, sizeof *g->kv);
    g->tensors = calloc((size_t)n_tensors + 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", g->name);
    for (uint64_t i = 0; i < n_kv && rc == VKS_OK; i++, g->n_kv++) rc = read_kv(&r, &g->kv[i]);
    if (rc == VKS_OK) rc = index_keys(g);
    if (rc == VKS_OK) rc = read_alignment(g);
    for (uint64_t i = 0; i < n_tensors && rc == VKS_OK; i++, g->n_tensors++)
        rc = read_tensor_info(&r, &g->tensors[i]);
    if (rc != VKS_OK) return rc;
    g->data_offset = ((uint64_t)r.pos + g->alignment - 1) / g->alignment * g->alignment;
    if ((rc = index_tensors(g)) != VKS_OK) return rc;
    return place_tensors(g);
}

static int open_common(vks_gguf *g, vks_gguf **out) {
    int rc = parse(g);
    if (rc != VKS_OK) {
        vks_gguf_close(g);
        return rc;
    }
    *out = g;
    return VKS_OK;
}

static vks_gguf *alloc_gguf(const char *name) {
    vks_gguf *g = calloc(1, sizeof *g);
    if (!g) {
        vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", name);
        return NULL;
    }
    snprintf(g->name, sizeof g->name, "%s", name);
    return g;
}

int vks_gguf_open(const char *path, vks_gguf **out) {
    if (!path || !out) return vks_set_error(VKS_ERR_ARG, "vks_gguf_open: NULL argument");
    *out = NULL;
    int fd = vks_open_read(path, 0); /* a FIFO must not block: refused below */
    if (fd < 0) return vks_set_error(VKS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 || (uintmax_t)st.st_size > SIZE_MAX) {
        close(fd);
        return vks_set_error(st.st_size == 0 ? VKS_ERR_FORMAT : VKS_ERR_IO, "%s: not a readable, non-empty regular file",
                             path);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return vks_set_error(VKS_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
    vks_gguf *g = alloc_gguf(path);
    if (!g) {
        munmap(map, (size_t)st.st_size);
        return VKS_ERR_NOMEM;
    }
    g->map = map;
    g->base = map;
    g->size = (size_t)st.st_size;
    return open_common(g, out);
}

int vks_gguf_open_memory(const void *data, size_t size, const char *name, vks_gguf **out) {
    if (!out || (!data && size)) return vks_set_error(VKS_ERR_ARG, "vks_gguf_open_memory: NULL argument");
    *out = NULL;
    if (!name) name = "(memory)";
    vks_gguf *g = alloc_gguf(name);
    if (!g) return VKS_ERR_NOMEM;
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) {
        free(g);
        return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", name);
    }
    if (size) memcpy(copy, data, size);
    g->base = copy;
    g->size = size;
    return open_common(g, out);
}

void vks_gguf_close(vks_gguf *g) {
    if (!g) return;
    if (g->map) munmap(g->map, g->size);
    else free((void *)g->base);
    free(g->kv);
    free(g->kv_sorted);
    free(g->strs);
    free(g->arena);
    free(g->tensors);
    free(g->tensor_sorted);
    free(g);
}
