/* ops_internal.h: what the op files of src/gpu share (ops.c records the
 * forward ops; backward and optimizer ops sit in their own files beside it):
 * the per-device kernel choices and the checked dispatch helpers. */
#ifndef VKS_OPS_INTERNAL_H
#define VKS_OPS_INTERNAL_H
#include "vkswarm/vks_ops.h"

#define MAX_PUSH_BYTES 128u
/* Workgroup counts per grid dimension that every Vulkan device supports. */
#define MIN_GROUP_COUNT_YZ 65535u
/* matvec handles M up to this many activation rows (M is a spec constant). */
#define MATVEC_MAX_M 8u
#define ATTENTION_MAX_HEAD_DIM 256u

/* Kernel variants chosen once per device in vks_ops_create. */
struct vks_ops {
    vks_gpu *g;
    vks_device_info info;
    uint32_t wg_elementwise;  /* embed, rope, kv_store, swiglu, add, gather_rows */
    uint32_t wg_row;          /* sample, token_logprob: one workgroup per row */
    uint32_t wg_norm;         /* rmsnorm and its backward: one workgroup per row */
    uint32_t wg_attention;    /* attention_train kernels */
    uint32_t wg_attention_kv; /* attention over the KV cache (one workgroup per row and head); also the key tile */
    bool attention_kv_sg;     /* its barrier-free subgroup variant (CPU drivers) */
    uint32_t attention_rows;  /* prefill rows per subgroup there (attention_rows_sg; 1 = attention_sg) */
    uint32_t attention_tile_rows; /* prefill rows per workgroup of the tile kernel (attention_rows; 1 = attention) */
    bool attention_train_sg;  /* the training attention's subgroup variant (CPU drivers) */
    uint32_t attention_train_per; /* its rows (keys) per lane when fixed by VKSWARM_ATTN_PER, else 0 */
    /* matvec: lane groups are subgroups (mv_subgroup) or the whole workgroup */
    bool mv_subgroup;
    uint32_t mv_wg, mv_rows, mv_rows_per_wg;
    /* matmul tiles */
    uint32_t mm_bm, mm_bn, mm_bk, mm_tm, mm_tn;
    uint32_t mm_direct; /* no shared-memory staging (CPU drivers; VKSWARM_MATMUL_DIRECT=0|1) */
    bool mm_decode;     /* decode rows through matmul_<type>_dsg in 8-row tiles (ops.c) */
    bool mm_f16_math; /* matmul_*_h variants */
    bool sample_spread; /* vks_op_sample_groups may spread top-k over workgroups (not on CPU drivers) */
    bool sample_serial_scan; /* top-p's digit scan by one invocation (CPU drivers) */
    /* vks_op_matmul_multi: 0 = one dispatch per product, 1 = fused where the
     * kernel has one-row tiles or runs staged (GPUs), 2 = fused wherever it applies */
    int mm_fuse;
    bool mv_fuse; /* vks_op_matmul_multi fuses the matvec kernels (choose_matmul_tiles) */
    /* vks_op_matmul_swiglu fuses wherever its kernel applies (VKSWARM_SWIGLU_FUSE=0: never) */
    bool swiglu_fuse;
};

static inline uint32_t round_down(uint32_t x, uint32_t m) { return x / m * m; }
static inline uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

/* Kernel name suffix of a weight dtype; NULL for Q6_K, which has no kernel
 * (the engine dequantizes it on upload). */
static inline const char *vks_ops_dtype_suffix(vks_dtype t) {
    return (unsigned)t < VKS_DTYPE_COUNT && t != VKS_DTYPE_Q6_K ? vks_dtype_name(t) : NULL;
}

static inline bool vks_ops_is_block_type(vks_dtype t) {
    return t == VKS_DTYPE_Q8_0 || t == VKS_DTYPE_Q4_0 || t == VKS_DTYPE_Q4_K;
}

/* Bytes a binding exposes, or 0 when it is unusable. */
size_t vks_ops_binding_bytes(vks_binding b);
/* True when a and b expose overlapping bytes of the same buffer. */
bool vks_ops_overlap(vks_binding a, vks_binding b);
/* A workgroup size near `target`: a multiple of the subgroup size, within limits. */
uint32_t vks_ops_pick_wg(const vks_device_info *info, uint32_t target);
/* Checks that `b` holds at least count elements of elem_bytes (count may be
 * fractional for packed 16-bit types: bytes = ceil(count*elem_bytes/4)*4),
 * within 2^32 words; VKS_ERR_ARG naming op and what otherwise. */
int vks_ops_check_range(const char *op, const char *what, vks_binding b, uint64_t count, uint32_t elem_bytes);
/* Checks that `b` holds a [rows, cols] weight matrix of dtype in the GPU layout. */
int vks_ops_check_weights(const char *op, const char *what, vks_binding b, vks_dtype t, uint64_t rows,
                          uint64_t cols);
/* Splits a linear workgroup count over x, y, z (kernels use the linear index). */
int vks_ops_grid(const vks_ops *o, const char *op, uint64_t groups, uint32_t g[3]);
/* Looks up (or builds) kernel `name` with its specialization constants and
 * records one dispatch over `groups` workgroups (push: at most 128 bytes). */
int vks_ops_dispatch(vks_ops *o, vks_cmd *c, const char *name, const uint32_t *spec, int n_spec,
                     const vks_binding *b, int n_bindings, const void *push, uint32_t push_bytes, uint64_t groups,
                     const char *label);
/* One thread per element i < n over nb f32 bindings of n elements each
 * (kernel `name` of shaders/elementwise.comp style; push: n). */
int vks_ops_elementwise(vks_ops *o, vks_cmd *c, const char *name, const vks_binding *b, int nb, uint32_t n);
/* Records RoPE in place with kernel "rope" (the forward) or "rope_backward"
 * (the inverse rotation): the same arguments and checks (vks_op_rope). */
int vks_ops_rope_kernel(vks_ops *o, vks_cmd *c, const char *kernel, vks_binding x, vks_binding pos, vks_binding table,
                        uint32_t n_pos, uint32_t R, uint32_t stride, uint32_t col0, uint32_t n_heads, uint32_t head_dim,
                        uint32_t mode);
#endif
