/* vks_ops.h: records one transformer op into a command buffer. Each op picks
 * its kernel variant (weight dtype, matvec vs tiled, subgroup/tile sizes) from
 * the device features. All activations are f32. Buffers are passed as
 * vks_binding (buffer + byte offset). Barriers: vks_cmd_dispatch inserts a full
 * compute barrier before every dispatch, so ops may be recorded back to back. */
#ifndef VKS_OPS_H
#define VKS_OPS_H
#include "vks_gpu.h"

typedef struct vks_ops vks_ops;
int vks_ops_create(vks_gpu *g, vks_ops **out);
void vks_ops_destroy(vks_ops *o);
/* Half storage in the tiled (prefill) matmul, the *_h kernel variants: x and
 * the weights rounded to half when staged, f32 products and sums (the
 * functions keep the "f16_math" name). On by default on GPUs with shaderFloat16; never on
 * CPU drivers, which compute half math in f32 and gain nothing. The
 * environment VKSWARM_FP16_MATH=0|1 overrides the default (1 only where the
 * device has shaderFloat16). Setting it on where the device lacks the
 * feature leaves it off. */
bool vks_ops_f16_math(const vks_ops *o);
void vks_ops_set_f16_math(vks_ops *o, bool on);

/* GPU layout of one sampling request (32 bytes, std430). */
typedef struct {
    float temperature;   /* <= 0: greedy */
    uint32_t top_k;      /* 0: off */
    float top_p;         /* <= 0 or >= 1: off */
    uint32_t seed_lo, seed_hi;
    uint32_t seq, pos;
    uint32_t pad;
} vks_gpu_sample_row;

/* out[r, :] = table[tokens[r] - row0, :] for rows whose token lies in
 * [row0, row0 + table_rows); other rows are left untouched (tables larger
 * than max_storage_range are split into chunks, one call per chunk).
 * tokens: uint32[R]. table: [table_rows, D] of dtype. out: f32 [R, D]. */
int vks_op_embed(vks_ops *o, vks_cmd *c, vks_binding tokens, vks_binding table, vks_dtype dtype,
                 uint32_t row0, uint32_t table_rows, uint32_t D, vks_binding out, uint32_t R);
/* Weight matrices on the device. f32/f16/bf16: the elements, packed. Block
 * types q8_0, q4_0, q4_k stay quantized (they are dequantized in registers by
 * the kernels): Q8_0/Q4_0 hold the quants of every block first (32 resp. 16
 * bytes per block, in llama.cpp's order) and then the f16 block scales, two
 * per 32-bit word; Q4_K keeps llama.cpp's 144-byte blocks (16-byte aligned as
 * they are). vks_op_weight_bytes: bytes of a [rows, cols] matrix in this
 * layout (block types: a multiple of 16; others: of 4), 0 when cols is not a whole number of blocks, the
 * dtype has no kernel (q6_k) or the size overflows. vks_op_pack_weights
 * writes that layout from row-major llama.cpp blocks (as in GGUF files; for
 * f32/f16/bf16 the plain elements). */
size_t vks_op_weight_bytes(vks_dtype t, uint64_t rows, uint64_t cols);
int vks_op_pack_weights(vks_dtype t, const void *blocks, uint64_t rows, uint64_t cols, void *dst);
/* The same for rows [row0, row0 + n) only (n rows of blocks), written into dst
 * holding the whole matrix's layout: lets the engine convert a matrix in steps. */
int vks_op_pack_weight_rows(vks_dtype t, const void *blocks, uint64_t row0, uint64_t n, uint64_t rows,
                            uint64_t cols, void *dst);

/* out[r,:] = x[r,:] / sqrt(mean(x[r,:]^2) + eps) * w  (w f32 [D]); out may equal x. */
int vks_op_rmsnorm(vks_ops *o, vks_cmd *c, vks_binding x, vks_binding w, vks_binding out,
                   uint32_t R, uint32_t D, float eps);
/* y[m, y_col0 + n] = (accumulate ? y[m, y_col0 + n] : 0) + sum_k x[m,k] W[n,k]
 * x f32 [M, K]; W [N, K] of dtype (f16/bf16 packed two per 32-bit word,
 * element e at word e/2, low half first; q8_0, q4_0, q4_k in the layout of
 * vks_op_pack_weights, K a whole number of blocks, x and W 16-byte aligned);
 * y f32 with row stride ldy. */
int vks_op_matmul(vks_ops *o, vks_cmd *c, vks_binding x, vks_binding W, vks_dtype dtype,
                  vks_binding y, uint32_t M, uint32_t N, uint32_t K, uint32_t ldy,
                  uint32_t y_col0, bool accumulate);
/* Which kernel a matmul uses. AUTO picks by M (matvec for a few rows, tiled
 * above). DECODE always uses the matrix-vector kernel (in groups of rows; on
 * CPU drivers with subgroup broadcasts, f32, f16, bf16 and q8_0 weights: the
 * tiled kernel in tiles of 8 rows or one, the same arithmetic as PREFILL) and
 * PREFILL always the tiled one: each kernel's result for a row does not
 * depend on the other rows, so fixing the kernel per kind of step makes a
 * row's arithmetic independent of the batch around it. */
typedef enum { VKS_MATMUL_AUTO, VKS_MATMUL_DECODE, VKS_MATMUL_PREFILL } vks_matmul_kind;
int vks_op_matmul_kind(vks_ops *o, vks_cmd *c, vks_binding x, vks_binding W, vks_dtype dtype, vks_binding y,
                       uint32_t M, uint32_t N, uint32_t K, uint32_t ldy, uint32_t y_col0, bool accumulate,
                       vks_matmul_kind kind);
/* Up to VKS_MATMUL_MAX_PARTS products of the same x, each with its own
 * weights and output: for each part, y[m, y_col0 + n] (+)= sum_k x[m,k] W[n,k]
 * as vks_op_matmul_kind(x, W, dtype, y, M, N, K, ldy, y_col0, accumulate,
 * kind) would write it, bit for bit. Recorded as one dispatch where every part
 * takes the same matmul.comp kernel alone (same dtype; prefill, or decode
 * through the tiled kernel on CPU drivers), as one dispatch per 8 rows where
 * every part's decode takes the same matvec / matvec_q kernel (same dtype and
 * alignment: decode on GPUs, q4_0 / q4_k decode on CPU drivers), else one
 * dispatch per part (mixed dtypes or paths). CPU drivers fuse only one-row
 * decode through the tiles (the 8-row tiles and the matvec kernels were slower
 * fused on lavapipe); VKSWARM_MATMUL_FUSE=0 never fuses, =1 fuses wherever the
 * kernel allows. No y may overlap x, a W or another y (the whole bindings are
 * compared). */
#define VKS_MATMUL_MAX_PARTS 3
typedef struct {
    vks_binding W;
    vks_dtype dtype;
    vks_binding y;
    uint32_t N, ldy, y_col0;
} vks_matmul_part;
int vks_op_matmul_multi(vks_ops *o, vks_cmd *c, vks_binding x, const vks_matmul_part *parts, int n_parts,
                        uint32_t M, uint32_t K, bool accumulate, vks_matmul_kind kind);
/* The gate and up products of a SwiGLU FFN fused with the SwiGLU itself:
 * y[m, n] = silu(g) * u with g = x W_gate^T, u = x W_up^T (x f32 [M, K], both
 * W dtype [N, K], y f32 [M, N]), the bits of vks_op_matmul_multi of the two
 * (kind as there) into y and u followed by vks_op_swiglu(y, u, y, M * N).
 * One dispatch (matmul.comp SWIGLU: each workgroup computes the same tile of
 * both products) wherever the products alone take the tiled matmul.comp
 * (prefill; decode of f32/f16/bf16/q8_0 on CPU drivers), else (the matvec
 * kernels of decode), or with VKSWARM_SWIGLU_FUSE=0, those two ops: u is their scratch for the up
 * product, M * N floats (undefined afterwards). y and u may not overlap x, a
 * W or each other (the whole bindings are compared). */
int vks_op_matmul_swiglu(vks_ops *o, vks_cmd *c, vks_binding x, vks_binding W_gate, vks_binding W_up,
                         vks_dtype dtype, vks_binding y, vks_binding u, uint32_t M, uint32_t N, uint32_t K,
                         vks_matmul_kind kind);
/* In place: x[r, col0 + h*head_dim + ...] for h < n_heads, row stride `stride`;
 * pos uint32[R], each < n_pos; pair i of position p rotates by the angle whose
 * (cos, sin) is table[p * head_dim/2 + i] (f32 pairs, [n_pos, head_dim/2];
 * vks_rope_table); mode VKS_ROPE_ADJACENT or VKS_ROPE_HALF. */
int vks_op_rope(vks_ops *o, vks_cmd *c, vks_binding x, vks_binding pos, vks_binding table, uint32_t n_pos, uint32_t R,
                uint32_t stride, uint32_t col0, uint32_t n_heads, uint32_t head_dim, uint32_t mode);
/* kcache[(slot[r]*seq_len + pos[r])*kv_dim + j] = k[r*kv_dim + j]; same for v. */
int vks_op_kv_store(vks_ops *o, vks_cmd *c, vks_binding k, vks_binding v, vks_binding kcache,
                    vks_binding vcache, vks_binding slot, vks_binding pos, uint32_t R,
                    uint32_t kv_dim, uint32_t seq_len);
/* RoPE fused with the KV-cache write: q [R, n_heads*head_dim] rotated in
 * place as vks_op_rope (stride n_heads*head_dim, col0 0), and k
 * [R, n_kv_heads*head_dim] rotated the same way on its way into kcache
 * (k itself unchanged), v stored as vks_op_kv_store; the same bits as
 * vks_op_rope on q and k followed by vks_op_kv_store, in one dispatch. */
int vks_op_rope_kv_store(vks_ops *o, vks_cmd *c, vks_binding q, vks_binding k, vks_binding v, vks_binding kcache,
                         vks_binding vcache, vks_binding slot, vks_binding pos, vks_binding table, uint32_t n_pos,
                         uint32_t R, uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim, uint32_t mode,
                         uint32_t seq_len);
/* Causal GQA attention, row r over keys 0..pos[r] of slot[r]; head h uses kv
 * head h / (n_heads/n_kv_heads). q, out: f32 [R, n_heads*head_dim]. */
int vks_op_attention(vks_ops *o, vks_cmd *c, vks_binding q, vks_binding kcache,
                     vks_binding vcache, vks_binding slot, vks_binding pos, vks_binding out,
                     uint32_t R, uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim,
                     uint32_t seq_len);
/* The same; kind DECODE runs one row per subgroup (CPU drivers) or
 * workgroup (the tile kernel, GPUs), PREFILL (and AUTO with R > 1) groups
 * up to 4 consecutive rows so that rows of one slot share K/V loads (a group
 * spanning slots runs its rows slot by slot): per subgroup on CPU drivers
 * (attention_rows_sg), per workgroup of the tile kernel on other devices
 * (attention_rows; within maxComputeSharedMemorySize). VKSWARM_ATTN_ROWS=1..4
 * fixes the rows per group for both (1: one row); on CPU drivers the tile
 * kernel (VKSWARM_NO_SUBGROUP=1) groups rows only when it is set. Each row's
 * bits are the same whatever the kind, grouping or batch. */
int vks_op_attention_kind(vks_ops *o, vks_cmd *c, vks_binding q, vks_binding kcache,
                          vks_binding vcache, vks_binding slot, vks_binding pos, vks_binding out,
                          uint32_t R, uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim,
                          uint32_t seq_len, vks_matmul_kind kind);
/* The f16 KV cache (issue 28): caches of halves [n_slots, seq_len, kv_dim],
 * two per 32-bit word, low half first, each rounded to nearest even exactly
 * as vks_f32_to_f16 (no 16-bit storage feature needed). kv_dim even. */
int vks_op_kv_store_f16(vks_ops *o, vks_cmd *c, vks_binding k, vks_binding v, vks_binding kcache,
                        vks_binding vcache, vks_binding slot, vks_binding pos, uint32_t R, uint32_t kv_dim,
                        uint32_t seq_len);
/* Keys per split of vks_op_attention_f16: a row with n keys is split into
 * ceil(n / VKS_ATTN_SPLIT_KEYS) parts at fixed positions (never dependent on
 * the batch or the cache length), combined in order. */
#define VKS_ATTN_SPLIT_KEYS 256u
/* Whether this device runs the f16-cache kernels (subgroup arithmetic and
 * shuffle, subgroups of 4 lanes or more). */
bool vks_ops_kv_f16_supported(const vks_ops *o);
/* vks_op_attention over the f16 caches, f32 arithmetic; part: scratch of
 * vks_op_attention_f16_scratch_bytes(R, n_heads, head_dim, seq_len) bytes.
 * head_dim a multiple of 4. */
int vks_op_attention_f16(vks_ops *o, vks_cmd *c, vks_binding q, vks_binding kcache, vks_binding vcache,
                         vks_binding slot, vks_binding pos, vks_binding part, vks_binding out, uint32_t R,
                         uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim, uint32_t seq_len);
/* The same grouped by kind as vks_op_attention_kind (the same bits). */
int vks_op_attention_f16_kind(vks_ops *o, vks_cmd *c, vks_binding q, vks_binding kcache, vks_binding vcache,
                              vks_binding slot, vks_binding pos, vks_binding part, vks_binding out, uint32_t R,
                              uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim, uint32_t seq_len,
                              vks_matmul_kind kind);
uint64_t vks_op_attention_f16_scratch_bytes(uint32_t R, uint32_t n_heads, uint32_t head_dim, uint32_t seq_len);
/* out[i] = silu(g[i]) * u[i]; out may equal g. */
int vks_op_swiglu(vks_ops *o, vks_cmd *c, vks_binding g, vks_binding u, vks_binding out,
                  uint32_t n);
/* x[r, j] += bias[j] for r < R, j < D (x f32 [R, D], bias f32 [D]). */
int vks_op_bias_add(vks_ops *o, vks_cmd *c, vks_binding x, vks_binding bias, uint32_t R,
                    uint32_t D);
/* x[i] += y[i] */
int vks_op_add(vks_ops *o, vks_cmd *c, vks_binding x, vks_binding y, uint32_t n);
/* x[i] *= s (one f32 product each), n elements */
int vks_op_scale(vks_ops *o, vks_cmd *c, vks_binding x, float s, uint32_t n);
/* dst[i, :] = src[idx[i], :], D floats per row. */
int vks_op_gather_rows(vks_ops *o, vks_cmd *c, vks_binding src, vks_binding idx,
                       vks_binding dst, uint32_t n, uint32_t D);
/* tokens[s] = sample(logits[s, :], params[s]) as vks_ref_sample, one workgroup
 * per row. Top-p's masses are exp(z - zmax) in 64-bit fixed point (2^-38), so
 * their sums, the threshold and the token depend on no summation order (the
 * same at any workgroup size and in vks_op_sample_split); V <= VKS_SAMPLE_MAX_V (< 2^26). */
#define VKS_SAMPLE_MAX_V ((1u << 26) - 1)
int vks_op_sample(vks_ops *o, vks_cmd *c, vks_binding logits, vks_binding params,
                  vks_binding tokens, uint32_t S, uint32_t V);
/* Top-k's and top-p's radix selects spread over W workgroups per row (their
 * 4 + 4 histogram passes, integer counts and fixed-point masses added with
 * atomics; the Gumbel argmax stays one workgroup per row): used for
 * at most VKS_SAMPLE_SPREAD_MAX_ROWS rows, one workgroup per
 * VKS_SAMPLE_SPREAD_SLICE logits of a row, at most VKS_SAMPLE_SPREAD_MAX_W. */
#define VKS_SAMPLE_SPREAD_MAX_ROWS 8u
#define VKS_SAMPLE_SPREAD_SLICE 4096u
#define VKS_SAMPLE_SPREAD_MAX_W 64u
/* Workgroups per row for S rows of V logits on o's device: 1 (the
 * one-workgroup kernel) when rows are many, the row is under 4 slices, or on
 * CPU drivers (VKSWARM_SAMPLE_SPREAD=0|1 overrides); o = NULL: the choice of
 * a device that spreads (for sizing scratch before the device is known). */
uint32_t vks_op_sample_groups(const vks_ops *o, uint32_t S, uint32_t V);
/* Scratch bytes vks_op_sample_split needs for S rows at W workgroups per row (0 for W = 1):
 * VKS_SAMPLE_ROW_SCRATCH uints a row (top-k counts, top-p masses, the largest key). */
#define VKS_SAMPLE_ROW_SCRATCH 3076u
uint64_t vks_op_sample_scratch_bytes(uint32_t S, uint32_t W);
/* vks_op_sample with top-k's and top-p's passes over W workgroups per row: the
 * same tokens bit for bit (integer counts and masses, summed exactly).
 * W = 1 is vks_op_sample (scratch unused, may be empty). */
int vks_op_sample_split(vks_ops *o, vks_cmd *c, vks_binding logits, vks_binding params,
                        vks_binding tokens, vks_binding scratch, uint32_t S, uint32_t V, uint32_t W);
#endif
