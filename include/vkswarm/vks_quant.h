/* vks_quant.h: llama.cpp block formats (Q8_0, Q4_0, Q4_K, Q6_K) with their
 * exact block layouts, quantization and dequantization (src/core/quant.c). */
#ifndef VKS_QUANT_H
#define VKS_QUANT_H
#include "vks_common.h"

/* Elements per block (1 for f32/f16/bf16) and bytes per block. */
size_t vks_dtype_block_elems(vks_dtype t);
size_t vks_dtype_block_bytes(vks_dtype t);
/* Bytes of a row of `cols` elements; false when cols is not a whole number of
 * blocks or the size overflows. */
bool vks_dtype_row_bytes(vks_dtype t, uint64_t cols, uint64_t *bytes);
/* dst[0..n) = the n elements of src (n a multiple of the block size). */
void vks_dequantize(vks_dtype t, const void *src, float *dst, size_t n);
/* Quantizes n floats (a multiple of the block size) as llama.cpp's reference
 * quantizers do. Returns VKS_ERR_ARG for a bad n or type. */
int vks_quantize(vks_dtype t, const float *src, void *dst, size_t n);
#endif
