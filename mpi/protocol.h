/* protocol.h: the pipeline's messages between ranks. Every message starts
 * with a fixed header; the receiver checks the header against the message
 * size and its own limits before reading anything else.
 *
 *   ACT    stage s -> s+1   header, meta[n_rows] {slot, pos, seq}, out_rows[n_out],
 *                           rows [n_rows, dim] as f32 or f16
 *   TOKENS stage S-1 -> 0   header, tokens[n_out]
 *   DONE   rank 0 -> all    header
 *   PROOFS stage S-1 -> 0   header (n_out = sequences), lengths[n_out], TOPLOC proofs
 *   LOGP   stage S-1 -> 0   header (n_out = sequences, n_rows = steps), f32 [n_out, n_rows]: the
 *                           log-probability of the token sampled from each sequence's position
 *                           (NaN where none was), sent before PROOFS
 *   PROOFS stage s -> 0      (0 < s < S-1, tag VKS_TAG_STAGE_PROOFS) the same layout: stage s's
 *                           commitments of the activations it handed on (vks_pipeline_options.stage_proofs)
 *   HELLO  start-up check   header + vks_hello
 * MPI tags: VKS_TAG_MB + micro-batch id for ACT and TOKENS; fixed tags below. */
#ifndef VKS_PROTOCOL_H
#define VKS_PROTOCOL_H
#include <stddef.h>
#include <stdint.h>
#include "vkswarm/vks_pipeline.h"

#define VKS_MSG_MAGIC 0x504b5356u /* "VSKP" */
enum { VKS_MSG_ACT = 1, VKS_MSG_TOKENS = 2, VKS_MSG_DONE = 3, VKS_MSG_HEARTBEAT = 4, VKS_MSG_PROOFS = 5, VKS_MSG_LOGP = 6 };
enum { VKS_TAG_DONE = 1, VKS_TAG_HEARTBEAT = 2, VKS_TAG_PROOFS = 3, VKS_TAG_LOGP = 4, VKS_TAG_STAGE_PROOFS = 5, VKS_TAG_MB = 1000 };
/* the start-up and finish tags and the wire types are public: vkswarm/vks_pipeline.h */

typedef struct {
    uint32_t magic, type, mb, n_rows, n_out, dim, wire, flags; /* flags: VKS_MSG_PREFILL */
} vks_msg_header;
#define VKS_MSG_PREFILL 1u /* ACT: prompt rows (the tiled matmul), else decode rows */

typedef struct {
    uint32_t slot, pos, seq;
} vks_row_meta;

/* Exact byte size of a message with these counts (0 on overflow). */
size_t vks_msg_size(uint32_t type, uint32_t n_rows, uint32_t n_out, uint32_t dim, uint32_t wire);

typedef struct {
    uint32_t max_rows, max_out, dim, n_mb;
} vks_msg_limits;

/* Validates a received message: header fields against the limits, the size
 * against the header, the type against what the sender may send. On failure
 * writes a one-line reason into err. */
int vks_msg_check(const void *buf, size_t bytes, int tag, uint32_t expect_type, const vks_msg_limits *lim,
                  char *err, size_t err_len);

/* Views into a checked message. */
static inline const vks_row_meta *vks_msg_meta(const void *buf) {
    return (const vks_row_meta *)((const char *)buf + sizeof(vks_msg_header));
}
static inline const uint32_t *vks_msg_out_rows(const void *buf) {
    const vks_msg_header *h = buf;
    return (const uint32_t *)(vks_msg_meta(buf) + h->n_rows);
}
static inline const void *vks_msg_rows(const void *buf) {
    const vks_msg_header *h = buf;
    return vks_msg_out_rows(buf) + h->n_out;
}
static inline const int32_t *vks_msg_tokens(const void *buf) {
    return (const int32_t *)((const char *)buf + sizeof(vks_msg_header));
}

/* Packs per-sequence proofs into one PROOFS message (malloc'd). */
void *vks_msg_pack_proofs(const uint8_t *const *proofs, const size_t *lens, uint32_t n, size_t *bytes);
/* Checks a PROOFS message: n sequences, each proof a whole number of chunks of
 * at most max_bytes. Fills lens[n] and offsets of each proof in buf. */
int vks_msg_check_proofs(const void *buf, size_t bytes, uint32_t n, size_t chunk_bytes, size_t max_bytes,
                         size_t *lens, size_t *offsets, char *err, size_t err_len);
#endif
