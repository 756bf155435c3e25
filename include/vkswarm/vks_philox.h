/* vks_philox.h: the counter-based RNG of every seeded draw (src/core/philox.c). */
#ifndef VKS_PHILOX_H
#define VKS_PHILOX_H
#include <stdint.h>

/* Philox4x32-10 block function exactly as Random123 philox4x32_R(10, ctr, key). */
void vks_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
/* Philox4x32-10: key = (seed lo, seed hi), counter = (idx, pos, seq, 0); returns word 0. */
uint32_t vks_philox_u32(uint64_t seed, uint32_t seq, uint32_t pos, uint32_t idx);
/* All four words of that block (vks_philox_u32 is out[0]). */
void vks_philox4_u32(uint64_t seed, uint32_t seq, uint32_t pos, uint32_t idx, uint32_t out[4]);
/* vks_philox_u32(seed, seq, pos, first + l) for l < VKS_PHILOX_LANES. */
enum { VKS_PHILOX_LANES = 16 };
void vks_philox_u32_lanes(uint64_t seed, uint32_t seq, uint32_t pos, uint32_t first, uint32_t out[VKS_PHILOX_LANES]);
/* Uniform strictly in (0,1): ((u32 >> 9) + 0.5) / 2^23. */
float vks_rng_uniform(uint32_t u32);

#endif
