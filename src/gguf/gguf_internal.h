/* gguf_internal.h: the GGUF reader's state, shared by gguf.c (parsing) and
 * gguf_get.c (typed getters). Not a public API. */
#ifndef VKS_GGUF_INTERNAL_H
#define VKS_GGUF_INTERNAL_H
#include "vkswarm/vks_gguf.h"

typedef struct { size_t off, len; } str_ref; /* into the arena */

typedef struct {
    str_ref key;
    vks_gguf_type type, elem;
    uint64_t n;      /* arrays: element count */
    size_t val;      /* numeric: file offset; string: index into strs; arrays of strings: first index */
} kv_entry;

struct vks_gguf {
    char name[512];
    const uint8_t *base; size_t size;
    void *map;           /* mmap, or NULL when `base` is a malloc'd copy */
    uint32_t version, alignment;
    uint64_t data_offset;
    kv_entry *kv; int64_t n_kv;
    int64_t *kv_sorted;  /* kv indices sorted by key */
    str_ref *strs; size_t n_strs, cap_strs; /* every string value and array element */
    char *arena; size_t arena_len, arena_cap;
    vks_gguf_tensor *tensors; int64_t n_tensors;
    int64_t *tensor_sorted;
};

/* Bytes of one scalar of type t; 0 for strings and arrays. */
size_t vks_gguf_scalar_size(vks_gguf_type t);
static inline const char *arena_str(const vks_gguf *g, str_ref s) { return g->arena + s.off; }
#endif
