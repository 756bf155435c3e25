/* philox.c: the counter-based RNG every seeded draw uses (the sampler on the
 * GPU and in the reference, the task and data shuffles, the tiny model's
 * weights): Philox4x32-10 as Random123 defines it, and its uniform in (0,1)
 * (see ref_sample.c for why 23 bits). */
#include "vkswarm/vks_philox.h"

#include <string.h>

enum {
    PHILOX_M0 = 0xD2511F53u,
    PHILOX_M1 = 0xCD9E8D57u,
    PHILOX_W0 = 0x9E3779B9u,
    PHILOX_W1 = 0xBB67AE85u,
};

static void philox_round(uint32_t ctr[4], const uint32_t key[2]) {
    uint64_t p0 = (uint64_t)PHILOX_M0 * ctr[0];
    uint64_t p1 = (uint64_t)PHILOX_M1 * ctr[2];
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    uint32_t next[4] = {hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0};
    memcpy(ctr, next, sizeof next);
}

void vks_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
    uint32_t k[2] = {key[0], key[1]};
    for (int round = 0; round < 10; round++) {
        philox_round(c, k);
        k[0] += PHILOX_W0; /* the bump after the last round is unused */
        k[1] += PHILOX_W1;
    }
    memcpy(out, c, sizeof c);
}

void vks_philox4_u32(uint64_t seed, uint32_t seq, uint32_t pos, uint32_t idx, uint32_t out[4]) {
    const uint32_t ctr[4] = {idx, pos, seq, 0};
    const uint32_t key[2] = {(uint32_t)(seed & 0xffffffffu), (uint32_t)(seed >> 32)};
    vks_philox4x32_10(ctr, key, out);
}

uint32_t vks_philox_u32(uint64_t seed, uint32_t seq, uint32_t pos, uint32_t idx) {
    uint32_t out[4];
    vks_philox4_u32(seed, seq, pos, idx, out);
    return out[0];
}

/* The same rounds lane by lane, in loops compilers vectorize (10x the
 * one-at-a-time rate). */
void vks_philox_u32_lanes(uint64_t seed, uint32_t seq, uint32_t pos, uint32_t first, uint32_t out[VKS_PHILOX_LANES]) {
    uint32_t c0[VKS_PHILOX_LANES], c1[VKS_PHILOX_LANES], c2[VKS_PHILOX_LANES], c3[VKS_PHILOX_LANES];
    uint32_t k0 = (uint32_t)(seed & 0xffffffffu), k1 = (uint32_t)(seed >> 32);
    for (int l = 0; l < VKS_PHILOX_LANES; l++) c0[l] = first + (uint32_t)l, c1[l] = pos, c2[l] = seq, c3[l] = 0;
    for (int round = 0; round < 10; round++) {
        for (int l = 0; l < VKS_PHILOX_LANES; l++) {
            uint64_t p0 = (uint64_t)PHILOX_M0 * c0[l], p1 = (uint64_t)PHILOX_M1 * c2[l];
            uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[l] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3[l] ^ k1;
            c1[l] = (uint32_t)p1, c3[l] = (uint32_t)p0, c0[l] = n0, c2[l] = n2;
        }
        k0 += PHILOX_W0, k1 += PHILOX_W1;
    }
    memcpy(out, c0, sizeof c0);
}

float vks_rng_uniform(uint32_t u32) { return ((float)(u32 >> 9) + 0.5f) * (1.0f / 8388608.0f); }
