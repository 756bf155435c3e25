/* Delta of a shard against the same bytes of the previous version: byte-wise
 * XOR or subtraction (mod 256), then zstd. Small weight updates leave most
 * high-order bytes unchanged, which zstd squeezes. */
#include <stdlib.h>
#include <zstd.h>
#include "vkswarm/vks_shard.h"

#define DELTA_ZSTD_LEVEL 3

static void apply_delta(vks_delta_mode mode, const uint8_t *a, const uint8_t *b, size_t n, uint8_t *out, bool encode) {
    if (mode == VKS_DELTA_XOR) {
        for (size_t i = 0; i < n; i++) out[i] = a[i] ^ b[i];
    } else if (encode) {
        for (size_t i = 0; i < n; i++) out[i] = (uint8_t)(a[i] - b[i]);
    } else {
        for (size_t i = 0; i < n; i++) out[i] = (uint8_t)(a[i] + b[i]);
    }
}

int vks_delta_encode(vks_delta_mode mode, const uint8_t *data, const uint8_t *base, size_t n, uint8_t *out,
                     size_t cap, size_t *out_len) {
    if (!data || !base || !out || !out_len || n == 0 || (mode != VKS_DELTA_XOR && mode != VKS_DELTA_SUB))
        return vks_set_error(VKS_ERR_ARG, "delta: bad argument");
    uint8_t *diff = malloc(n);
    if (!diff) return vks_set_error(VKS_ERR_NOMEM, "delta: out of host memory");
    apply_delta(mode, data, base, n, diff, true);
    size_t r = ZSTD_compress(out, cap, diff, n, DELTA_ZSTD_LEVEL);
    free(diff);
    if (ZSTD_isError(r)) return vks_set_error(VKS_ERR_NOMEM, "delta: zstd: %s", ZSTD_getErrorName(r));
    *out_len = r;
    return VKS_OK;
}

int vks_delta_decode(vks_delta_mode mode, const uint8_t *in, size_t in_len, const uint8_t *base, size_t n,
                     uint8_t *out) {
    if (!in || !base || !out || n == 0 || (mode != VKS_DELTA_XOR && mode != VKS_DELTA_SUB))
        return vks_set_error(VKS_ERR_ARG, "delta: bad argument");
    unsigned long long claimed = ZSTD_getFrameContentSize(in, in_len);
    if (claimed != n)
        return vks_set_error(VKS_ERR_FORMAT, "delta: zstd frame claims %llu bytes, the shard has %zu", claimed, n);
    size_t r = ZSTD_decompress(out, n, in, in_len);
    if (ZSTD_isError(r) || r != n)
        return vks_set_error(VKS_ERR_FORMAT, "delta: bad zstd frame (%s)",
                             ZSTD_isError(r) ? ZSTD_getErrorName(r) : "short output");
    apply_delta(mode, out, base, n, out, false);
    return VKS_OK;
}
