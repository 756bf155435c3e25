/* vks_gguf.h: GGUF (versions 2 and 3, little-endian) reader and writer.
 *
 * Reader: the file is mmapped and fully validated at open (every length,
 * count, offset and tensor extent against the file size), so getters never
 * fail on a bad file, only on a missing key or a wrong type. Metadata strings
 * are copied, NUL-terminated, into one arena no larger than the file.
 * Writer: collects metadata and tensors, then writes a version-3 file.
 */
#ifndef VKS_GGUF_H
#define VKS_GGUF_H
#include "vks_common.h"

/* Metadata value types, numbered as in the GGUF spec. */
typedef enum {
    VKS_GGUF_UINT8 = 0,
    VKS_GGUF_INT8 = 1,
    VKS_GGUF_UINT16 = 2,
    VKS_GGUF_INT16 = 3,
    VKS_GGUF_UINT32 = 4,
    VKS_GGUF_INT32 = 5,
    VKS_GGUF_FLOAT32 = 6,
    VKS_GGUF_BOOL = 7,
    VKS_GGUF_STRING = 8,
    VKS_GGUF_ARRAY = 9,
    VKS_GGUF_UINT64 = 10,
    VKS_GGUF_INT64 = 11,
    VKS_GGUF_FLOAT64 = 12,
    VKS_GGUF_TYPE_COUNT
} vks_gguf_type;

/* ggml tensor type numbers of the formats vkswarm reads and writes. */
enum {
    VKS_GGML_F32 = 0,
    VKS_GGML_F16 = 1,
    VKS_GGML_Q4_0 = 2,
    VKS_GGML_Q8_0 = 8,
    VKS_GGML_Q4_K = 12,
    VKS_GGML_Q6_K = 14,
    VKS_GGML_BF16 = 30,
};

#define VKS_GGUF_DEFAULT_ALIGNMENT 32
#define VKS_GGUF_MAX_DIMS 4

typedef struct vks_gguf vks_gguf;

typedef struct {
    const char *name;       /* NUL-terminated */
    uint32_t ggml_type;     /* as stored */
    vks_dtype dtype;        /* VKS_DTYPE_COUNT when vkswarm has no such dtype */
    int n_dims;             /* 1..4 */
    int64_t ne[VKS_GGUF_MAX_DIMS]; /* ne[0] is the contiguous (column) dimension; unused = 1 */
    uint64_t offset;        /* from the start of the data section */
    uint64_t size;          /* bytes */
    const void *data;       /* into the map, checked to lie inside the file */
} vks_gguf_tensor;

/* ---- reader ---- */

/* Opens and validates a GGUF file. Errors name the file and the problem. */
int vks_gguf_open(const char *path, vks_gguf **out);
/* Same for bytes in memory (copied; `name` is used in error messages). */
int vks_gguf_open_memory(const void *data, size_t size, const char *name, vks_gguf **out);
void vks_gguf_close(vks_gguf *g);

uint32_t vks_gguf_version(const vks_gguf *g);
uint32_t vks_gguf_alignment(const vks_gguf *g);
uint64_t vks_gguf_data_offset(const vks_gguf *g); /* file offset of the data section */

/* Metadata by index (0..n_kv-1) */
int64_t vks_gguf_n_kv(const vks_gguf *g);
const char *vks_gguf_key(const vks_gguf *g, int64_t i);
vks_gguf_type vks_gguf_kv_type(const vks_gguf *g, int64_t i);
/* Index of key or -1. */
int64_t vks_gguf_find_key(const vks_gguf *g, const char *key);

/* Typed getters by key. Return VKS_OK; VKS_ERR_ARG (message names the key)
 * when the key is missing, or VKS_ERR_FORMAT when its type does not fit.
 * Integer getters accept any integer type whose value fits the result. */
int vks_gguf_get_u32(const vks_gguf *g, const char *key, uint32_t *out);
int vks_gguf_get_i64(const vks_gguf *g, const char *key, int64_t *out);
int vks_gguf_get_u64(const vks_gguf *g, const char *key, uint64_t *out);
/* float32 or float64 (rounded) */
int vks_gguf_get_f32(const vks_gguf *g, const char *key, float *out);
int vks_gguf_get_f64(const vks_gguf *g, const char *key, double *out);
int vks_gguf_get_bool(const vks_gguf *g, const char *key, bool *out);
/* NUL-terminated string owned by g; *len (optional) excludes the NUL. GGUF
 * strings may contain NUL bytes: use len when that matters. */
int vks_gguf_get_str(const vks_gguf *g, const char *key, const char **out, size_t *len);

/* Arrays: element type and length. */
int vks_gguf_get_arr_info(const vks_gguf *g, const char *key, vks_gguf_type *elem_type, uint64_t *n);
/* Element i of a string array (owned by g). */
int vks_gguf_get_arr_str(const vks_gguf *g, const char *key, uint64_t i, const char **out, size_t *len);
/* Copies the whole numeric array (n must equal its length), converting from
 * any numeric element type (integers must fit; i32 from floats refused). */
int vks_gguf_get_arr_f32(const vks_gguf *g, const char *key, float *dst, uint64_t n);
int vks_gguf_get_arr_i32(const vks_gguf *g, const char *key, int32_t *dst, uint64_t n);

/* Tensors */
int64_t vks_gguf_n_tensors(const vks_gguf *g);
const vks_gguf_tensor *vks_gguf_tensor_at(const vks_gguf *g, int64_t i);
const vks_gguf_tensor *vks_gguf_find_tensor(const vks_gguf *g, const char *name); /* NULL if absent */

/* Maps between ggml type numbers and vkswarm dtypes. */
vks_dtype vks_gguf_dtype_from_ggml(uint32_t ggml_type);   /* VKS_DTYPE_COUNT if none */
uint32_t vks_gguf_ggml_from_dtype(vks_dtype t);           /* UINT32_MAX if none */

/* ---- writer ---- */

typedef struct vks_gguf_writer vks_gguf_writer;

int vks_gguf_writer_create(vks_gguf_writer **out);
void vks_gguf_writer_free(vks_gguf_writer *w);
/* Power of two (default 32); also written as general.alignment when != 32. */
int vks_gguf_writer_set_alignment(vks_gguf_writer *w, uint32_t alignment);
/* Scalars: `value` points to one value of type t (bool: one byte 0/1).
 * Duplicate keys are refused. */
int vks_gguf_add_scalar(vks_gguf_writer *w, const char *key, vks_gguf_type t, const void *value);
int vks_gguf_add_u32(vks_gguf_writer *w, const char *key, uint32_t v);
int vks_gguf_add_i32(vks_gguf_writer *w, const char *key, int32_t v);
int vks_gguf_add_f32(vks_gguf_writer *w, const char *key, float v);
int vks_gguf_add_bool(vks_gguf_writer *w, const char *key, bool v);
int vks_gguf_add_str(vks_gguf_writer *w, const char *key, const char *s);
/* String with explicit length (may hold NUL bytes). */
int vks_gguf_add_strn(vks_gguf_writer *w, const char *key, const char *s, size_t len);
/* Numeric array of n elements of elem_type, packed little-endian in data. */
int vks_gguf_add_arr(vks_gguf_writer *w, const char *key, vks_gguf_type elem_type, const void *data,
                     uint64_t n);
int vks_gguf_add_arr_str(vks_gguf_writer *w, const char *key, const char *const *strs, uint64_t n);
/* Adds a tensor of shape ne[0..n_dims) (ne[0] contiguous) and dtype. `data`
 * (the exact bytes) is referenced, not copied: keep it alive until save. */
int vks_gguf_add_tensor(vks_gguf_writer *w, const char *name, vks_dtype dtype, int n_dims,
                        const int64_t *ne, const void *data);
/* Same, but the writer takes ownership of malloc'd `data` (freed with the writer,
 * also on failure). */
int vks_gguf_add_tensor_owned(vks_gguf_writer *w, const char *name, vks_dtype dtype, int n_dims,
                              const int64_t *ne, void *data);
/* Writes the file (version 3). */
int vks_gguf_writer_save(vks_gguf_writer *w, const char *path);
/* Same, to an open stream (name is used in errors); a metadata-only file when
 * no tensor was added. */
int vks_gguf_writer_write_stream(vks_gguf_writer *w, FILE *f, const char *name);
#endif
