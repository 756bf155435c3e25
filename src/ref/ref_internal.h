/* ref_internal.h: internals of src/ref exposed for tests. Not a public API. */
#ifndef VKS_REF_INTERNAL_H
#define VKS_REF_INTERNAL_H
#include <stdint.h>

/* Philox4x32-10 block function exactly as Random123 philox4x32_R(10, ctr, key). */
void vks_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

#endif
