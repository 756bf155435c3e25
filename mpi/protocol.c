/* Pipeline message sizes and validation (see protocol.h). No MPI calls. */
#include "protocol.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "vkswarm/vks_common.h"

size_t vks_msg_size(uint32_t type, uint32_t n_rows, uint32_t n_out, uint32_t dim, uint32_t wire) {
    size_t n = sizeof(vks_msg_header), part;
    switch (type) {
    case VKS_MSG_ACT: {
        size_t row_bytes = wire == VKS_WIRE_F16 ? 2 : 4;
        if (!vks_mul_size(n_rows, sizeof(vks_row_meta), &part) || !vks_add_size(n, part, &n)) return 0;
        if (!vks_mul_size(n_out, 4, &part) || !vks_add_size(n, part, &n)) return 0;
        if (!vks_mul_size((size_t)n_rows * row_bytes, dim, &part) || !vks_add_size(n, part, &n)) return 0;
        return n;
    }
    case VKS_MSG_TOKENS:
        return vks_mul_size(n_out, 4, &part) && vks_add_size(n, part, &n) ? n : 0;
    case VKS_MSG_DONE:
    case VKS_MSG_HEARTBEAT:
        return n;
    default:
        return 0;
    }
}

int vks_msg_check(const void *buf, size_t bytes, int tag, uint32_t expect_type, const vks_msg_limits *lim, char *err,
                  size_t err_len) {
    vks_msg_header h;
    if (bytes < sizeof h) {
        snprintf(err, err_len, "message of %zu bytes is shorter than a header", bytes);
        return VKS_ERR_FORMAT;
    }
    memcpy(&h, buf, sizeof h);
    const char *why = NULL;
    if (h.magic != VKS_MSG_MAGIC) why = "bad magic";
    else if (h.type != expect_type) why = "unexpected message type";
    else if (h.type == VKS_MSG_ACT && (h.dim != lim->dim || (h.wire != VKS_WIRE_F32 && h.wire != VKS_WIRE_F16)))
        why = "row width or wire type does not match this pipeline";
    else if (h.n_rows > lim->max_rows || h.n_out > lim->max_out || (h.type == VKS_MSG_ACT && h.n_out > h.n_rows))
        why = "more rows than the pipeline allows";
    else if (h.mb >= lim->n_mb) why = "unknown micro-batch id";
    else if (h.flags & ~VKS_MSG_PREFILL) why = "unknown flags";
    else if ((h.type == VKS_MSG_ACT || h.type == VKS_MSG_TOKENS) && tag != VKS_TAG_MB + (int)h.mb)
        why = "tag does not carry the micro-batch id";
    else if (vks_msg_size(h.type, h.n_rows, h.n_out, h.dim, h.wire) != bytes) why = "size does not match its header";
    if (!why && h.type == VKS_MSG_ACT) {
        const vks_row_meta *meta = vks_msg_meta(buf);
        const uint32_t *out = vks_msg_out_rows(buf);
        for (uint32_t i = 0; i < h.n_out && !why; i++)
            if (out[i] >= h.n_rows) why = "output row outside the message";
        for (uint32_t r = 0; r < h.n_rows && !why; r++)
            if (r > 0 && meta[r].slot == meta[r - 1].slot && meta[r].pos <= meta[r - 1].pos) why = "rows out of order";
    }
    if (why) {
        snprintf(err, err_len, "%s (type %u, micro-batch %u, %u rows, %zu bytes)", why, h.type, h.mb, h.n_rows, bytes);
        return VKS_ERR_FORMAT;
    }
    return VKS_OK;
}

void *vks_msg_pack_proofs(const uint8_t *const *proofs, const size_t *lens, uint32_t n, size_t *bytes) {
    size_t total = sizeof(vks_msg_header) + 4 * (size_t)n;
    for (uint32_t i = 0; i < n; i++) total += lens[i];
    char *buf = malloc(total);
    if (!buf) return NULL;
    vks_msg_header h = {VKS_MSG_MAGIC, VKS_MSG_PROOFS, 0, 0, n, 0, 0, 0};
    memcpy(buf, &h, sizeof h);
    size_t at = sizeof h + 4 * (size_t)n;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t len = (uint32_t)lens[i];
        memcpy(buf + sizeof h + 4 * (size_t)i, &len, 4);
        if (len) memcpy(buf + at, proofs[i], len);
        at += len;
    }
    *bytes = total;
    return buf;
}

int vks_msg_check_proofs(const void *buf, size_t bytes, uint32_t n, size_t chunk_bytes, size_t max_bytes,
                         size_t *lens, size_t *offsets, char *err, size_t err_len) {
    vks_msg_header h;
    size_t at = sizeof h + 4 * (size_t)n;
    if (bytes < at) {
        snprintf(err, err_len, "proof message of %zu bytes is too short for %u sequences", bytes, n);
        return VKS_ERR_FORMAT;
    }
    memcpy(&h, buf, sizeof h);
    if (h.magic != VKS_MSG_MAGIC || h.type != VKS_MSG_PROOFS || h.n_out != n) {
        snprintf(err, err_len, "proof message header does not describe %u sequences", n);
        return VKS_ERR_FORMAT;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t len;
        memcpy(&len, (const char *)buf + sizeof h + 4 * (size_t)i, 4);
        if (len % chunk_bytes || len > max_bytes || len > bytes - at) {
            snprintf(err, err_len, "proof of sequence %u has %u bytes (chunks of %zu, at most %zu, %zu left)", i, len,
                     chunk_bytes, max_bytes, bytes - at);
            return VKS_ERR_FORMAT;
        }
        lens[i] = len;
        offsets[i] = at;
        at += len;
    }
    if (at != bytes) {
        snprintf(err, err_len, "proof message has %zu bytes after its last proof", bytes - at);
        return VKS_ERR_FORMAT;
    }
    return VKS_OK;
}
