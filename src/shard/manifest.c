/* Shardcast manifest: build from a file, serialize + sign, parse hostile
 * blobs, verify signatures, check and decode shards. */
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>
#include "vkswarm/vks_shard.h"

static const char magic[8] = {'V', 'K', 'S', 'M', 'A', 'N', '0', '1'};

void vks_hash(const void *data, size_t len, uint8_t out[VKS_HASH_BYTES]) {
    crypto_generichash(out, VKS_HASH_BYTES, data, len, NULL, 0);
}

void vks_model_id_hash(const char *id, uint8_t out[VKS_HASH_BYTES]) {
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, VKS_HASH_BYTES);
    crypto_generichash_update(&st, (const uint8_t *)"vkswarm-model:", 14);
    crypto_generichash_update(&st, (const uint8_t *)id, strlen(id));
    crypto_generichash_final(&st, out, VKS_HASH_BYTES);
}

void vks_shard_hash_hex(const uint8_t h[VKS_HASH_BYTES], char out[2 * VKS_HASH_BYTES + 1]) {
    sodium_bin2hex(out, 2 * VKS_HASH_BYTES + 1, h, VKS_HASH_BYTES);
}

void vks_manifest_free(vks_manifest *m) {
    if (!m) return;
    free(m->shards);
    memset(m, 0, sizeof *m);
}

void vks_shard_range(const vks_manifest *m, uint32_t i, uint64_t *offset, uint32_t *len) {
    uint64_t off = (uint64_t)i * m->shard_size;
    uint64_t left = m->file_size - off;
    *offset = off;
    *len = (uint32_t)(left < m->shard_size ? left : m->shard_size);
}

/* ---- build ---- */

/* Fills entry i from the file bytes; tries the delta when asked. `scratch`
 * holds at least ZSTD_compressBound(shard_size) bytes. */
static int build_shard(vks_manifest *m, uint32_t i, const uint8_t *data, const uint8_t *base, uint8_t *wire,
                       uint64_t *wire_at, uint8_t *scratch, size_t scratch_cap) {
    uint64_t off;
    uint32_t len;
    vks_shard_range(m, i, &off, &len);
    vks_shard_entry *e = &m->shards[i];
    vks_hash(data + off, len, e->data_hash);
    e->encoding = VKS_SHARD_RAW;
    const uint8_t *payload = data + off;
    size_t payload_len = len;
    size_t dlen = 0;
    if (m->delta != VKS_DELTA_NONE &&
        vks_delta_encode((vks_delta_mode)m->delta, data + off, base + off, len, scratch, scratch_cap, &dlen) == VKS_OK &&
        dlen < len) {
        e->encoding = VKS_SHARD_DELTA;
        payload = scratch;
        payload_len = dlen;
    }
    e->wire_size = (uint32_t)payload_len;
    e->wire_offset = *wire_at;
    memcpy(wire + *wire_at, payload, payload_len);
    vks_hash(payload, payload_len, e->wire_hash);
    *wire_at += payload_len;
    return VKS_OK;
}

int vks_manifest_build(const uint8_t *data, size_t size, const uint8_t *base, size_t base_size,
                       const vks_manifest_params *p, vks_manifest *m, uint8_t **wire) {
    if (!data || !p || !m || !wire) return vks_set_error(VKS_ERR_ARG, "manifest: null argument");
    memset(m, 0, sizeof *m);
    *wire = NULL;
    uint32_t shard = p->shard_size ? p->shard_size : VKS_SHARD_DEFAULT_BYTES;
    if (shard < VKS_SHARD_MIN_BYTES || shard > VKS_SHARD_MAX_BYTES)
        return vks_set_error(VKS_ERR_ARG, "manifest: shard size %u outside [%u, %u]", shard, VKS_SHARD_MIN_BYTES,
                             VKS_SHARD_MAX_BYTES);
    if (size == 0 || size > VKS_MANIFEST_MAX_FILE)
        return vks_set_error(VKS_ERR_ARG, "manifest: file size %zu outside [1, 1 TiB]", size);
    uint64_t n = (size + shard - 1) / shard;
    if (n > VKS_SHARD_MAX_COUNT)
        return vks_set_error(VKS_ERR_ARG, "manifest: %llu shards (max %u): use larger shards", (unsigned long long)n,
                             VKS_SHARD_MAX_COUNT);
    if (p->delta > VKS_DELTA_SUB) return vks_set_error(VKS_ERR_ARG, "manifest: unknown delta mode %d", p->delta);
    bool delta = p->delta != VKS_DELTA_NONE;
    if (delta && (!base || base_size != size))
        return vks_set_error(VKS_ERR_ARG, "manifest: a delta needs a base of the same size (%zu vs %zu bytes)",
                             base_size, size);
    if (delta && p->base_version >= p->version)
        return vks_set_error(VKS_ERR_ARG, "manifest: base version %llu is not older than version %llu",
                             (unsigned long long)p->base_version, (unsigned long long)p->version);
    *m = (vks_manifest){.version = p->version, .step = p->step, .file_size = size, .shard_size = shard,
                        .n_shards = (uint32_t)n, .delta = (uint32_t)p->delta,
                        .base_version = delta ? p->base_version : 0};
    memcpy(m->model_hash, p->model_hash, VKS_HASH_BYTES);
    vks_hash(data, size, m->file_hash);
    if (delta) vks_hash(base, base_size, m->base_hash);
    m->shards = calloc(n, sizeof *m->shards);
    *wire = malloc(size);
    size_t scratch_cap = ZSTD_compressBound(shard);
    uint8_t *scratch = delta ? malloc(scratch_cap) : NULL;
    if (!m->shards || !*wire || (delta && !scratch)) {
        free(scratch);
        free(*wire);
        *wire = NULL;
        vks_manifest_free(m);
        return vks_set_error(VKS_ERR_NOMEM, "manifest: out of host memory for %zu bytes", size);
    }
    uint64_t at = 0;
    for (uint32_t i = 0; i < m->n_shards; i++) build_shard(m, i, data, base, *wire, &at, scratch, scratch_cap);
    m->wire_size = at;
    free(scratch);
    return VKS_OK;
}

/* ---- serialize ---- */

static uint8_t *put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
    return p + 4;
}
static uint8_t *put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
    return p + 8;
}
static uint8_t *put_bytes(uint8_t *p, const uint8_t *b, size_t n) {
    memcpy(p, b, n);
    return p + n;
}
static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get_u64(const uint8_t *p) { return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32; }

int vks_manifest_sign(const vks_manifest *m, const uint8_t sk[VKS_SECRET_KEY_BYTES], uint8_t **blob, size_t *len) {
    if (!m || !sk || !blob || !len || !m->shards || m->n_shards == 0 || m->n_shards > VKS_SHARD_MAX_COUNT)
        return vks_set_error(VKS_ERR_ARG, "manifest: nothing to sign");
    size_t body = VKS_MANIFEST_HEADER_BYTES + (size_t)m->n_shards * VKS_MANIFEST_ENTRY_BYTES;
    uint8_t *b = malloc(body + VKS_SIGNATURE_BYTES);
    if (!b) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    uint8_t *p = put_bytes(b, (const uint8_t *)magic, 8);
    p = put_u64(p, m->version);
    p = put_u64(p, m->step);
    p = put_bytes(p, m->model_hash, VKS_HASH_BYTES);
    p = put_u64(p, m->file_size);
    p = put_u32(p, m->shard_size);
    p = put_u32(p, m->n_shards);
    p = put_bytes(p, m->file_hash, VKS_HASH_BYTES);
    p = put_u32(p, m->delta);
    p = put_u32(p, 0);
    p = put_u64(p, m->base_version);
    p = put_bytes(p, m->base_hash, VKS_HASH_BYTES);
    for (uint32_t i = 0; i < m->n_shards; i++) {
        const vks_shard_entry *e = &m->shards[i];
        p = put_u32(p, e->encoding);
        p = put_u32(p, e->wire_size);
        p = put_bytes(p, e->wire_hash, VKS_HASH_BYTES);
        p = put_bytes(p, e->data_hash, VKS_HASH_BYTES);
    }
    crypto_sign_detached(p, NULL, b, body, sk);
    *blob = b;
    *len = body + VKS_SIGNATURE_BYTES;
    return VKS_OK;
}

/* ---- parse (hostile input) ---- */

static int parse_header(const uint8_t *b, size_t len, const char *what, vks_manifest *m) {
    if (len < VKS_MANIFEST_HEADER_BYTES + VKS_SIGNATURE_BYTES)
        return vks_set_error(VKS_ERR_FORMAT, "%s: manifest truncated (%zu bytes)", what, len);
    if (memcmp(b, magic, 8)) return vks_set_error(VKS_ERR_FORMAT, "%s: not a vkswarm manifest (bad magic)", what);
    const uint8_t *p = b + 8;
    m->version = get_u64(p), p += 8;
    m->step = get_u64(p), p += 8;
    memcpy(m->model_hash, p, VKS_HASH_BYTES), p += VKS_HASH_BYTES;
    m->file_size = get_u64(p), p += 8;
    m->shard_size = get_u32(p), p += 4;
    m->n_shards = get_u32(p), p += 4;
    memcpy(m->file_hash, p, VKS_HASH_BYTES), p += VKS_HASH_BYTES;
    m->delta = get_u32(p), p += 4;
    uint32_t reserved = get_u32(p);
    p += 4;
    m->base_version = get_u64(p), p += 8;
    memcpy(m->base_hash, p, VKS_HASH_BYTES);
    if (m->version == 0) return vks_set_error(VKS_ERR_FORMAT, "%s: version 0 is reserved", what);
    if (m->file_size == 0 || m->file_size > VKS_MANIFEST_MAX_FILE)
        return vks_set_error(VKS_ERR_FORMAT, "%s: absurd file size %llu (max 1 TiB)", what,
                             (unsigned long long)m->file_size);
    if (m->shard_size < VKS_SHARD_MIN_BYTES || m->shard_size > VKS_SHARD_MAX_BYTES)
        return vks_set_error(VKS_ERR_FORMAT, "%s: absurd shard size %u", what, m->shard_size);
    uint64_t want = (m->file_size + m->shard_size - 1) / m->shard_size;
    if (m->n_shards == 0 || m->n_shards > VKS_SHARD_MAX_COUNT || m->n_shards != want)
        return vks_set_error(VKS_ERR_FORMAT, "%s: %u shards claimed, %llu bytes in %u-byte shards need %llu", what,
                             m->n_shards, (unsigned long long)m->file_size, m->shard_size, (unsigned long long)want);
    if (m->delta > VKS_DELTA_SUB || reserved)
        return vks_set_error(VKS_ERR_FORMAT, "%s: unknown delta mode %u", what, m->delta);
    if (m->delta != VKS_DELTA_NONE && m->base_version >= m->version)
        return vks_set_error(VKS_ERR_FORMAT, "%s: delta base version %llu is not older than %llu", what,
                             (unsigned long long)m->base_version, (unsigned long long)m->version);
    if (m->delta == VKS_DELTA_NONE && m->base_version)
        return vks_set_error(VKS_ERR_FORMAT, "%s: base version without a delta", what);
    size_t need = VKS_MANIFEST_HEADER_BYTES + (size_t)m->n_shards * VKS_MANIFEST_ENTRY_BYTES + VKS_SIGNATURE_BYTES;
    if (len != need)
        return vks_set_error(VKS_ERR_FORMAT, "%s: manifest is %zu bytes, %u shards need %zu", what, len,
                             m->n_shards, need);
    return VKS_OK;
}

static int parse_entry(const uint8_t *p, uint32_t i, const char *what, vks_manifest *m, uint64_t *wire_at) {
    vks_shard_entry *e = &m->shards[i];
    e->encoding = get_u32(p);
    e->wire_size = get_u32(p + 4);
    memcpy(e->wire_hash, p + 8, VKS_HASH_BYTES);
    memcpy(e->data_hash, p + 8 + VKS_HASH_BYTES, VKS_HASH_BYTES);
    uint64_t off;
    uint32_t len;
    vks_shard_range(m, i, &off, &len);
    if (e->encoding == VKS_SHARD_RAW) {
        if (e->wire_size != len)
            return vks_set_error(VKS_ERR_FORMAT, "%s: shard %u is raw with %u wire bytes, its range has %u", what, i,
                                 e->wire_size, len);
        /* the same bytes: receivers check raw shards by their wire hash alone */
        if (memcmp(e->wire_hash, e->data_hash, VKS_HASH_BYTES))
            return vks_set_error(VKS_ERR_FORMAT, "%s: raw shard %u has different wire and data hashes", what, i);
    } else if (e->encoding == VKS_SHARD_DELTA && m->delta != VKS_DELTA_NONE) {
        if (e->wire_size == 0 || e->wire_size >= len)
            return vks_set_error(VKS_ERR_FORMAT, "%s: delta shard %u has %u wire bytes (range %u)", what, i,
                                 e->wire_size, len);
    } else {
        return vks_set_error(VKS_ERR_FORMAT, "%s: shard %u has unknown encoding %u", what, i, e->encoding);
    }
    e->wire_offset = *wire_at;
    *wire_at += e->wire_size; /* <= file_size in total: cannot overflow */
    return VKS_OK;
}

int vks_manifest_parse(const uint8_t *blob, size_t len, const char *what, vks_manifest *m) {
    if (!what) what = "manifest";
    if (!blob || !m) return vks_set_error(VKS_ERR_ARG, "%s: null argument", what);
    memset(m, 0, sizeof *m);
    int rc = parse_header(blob, len, what, m);
    if (rc) {
        memset(m, 0, sizeof *m);
        return rc;
    }
    m->shards = calloc(m->n_shards, sizeof *m->shards);
    if (!m->shards) return vks_set_error(VKS_ERR_NOMEM, "%s: out of host memory", what);
    uint64_t at = 0;
    for (uint32_t i = 0; i < m->n_shards; i++) {
        rc = parse_entry(blob + VKS_MANIFEST_HEADER_BYTES + (size_t)i * VKS_MANIFEST_ENTRY_BYTES, i, what, m, &at);
        if (rc) {
            vks_manifest_free(m);
            return rc;
        }
    }
    m->wire_size = at;
    return VKS_OK;
}

int vks_manifest_verify(const uint8_t *blob, size_t len, const uint8_t pk[VKS_PUBLIC_KEY_BYTES], const char *what) {
    if (!what) what = "manifest";
    if (!blob || !pk) return vks_set_error(VKS_ERR_ARG, "%s: null argument", what);
    if (len < VKS_SIGNATURE_BYTES) return vks_set_error(VKS_ERR_FORMAT, "%s: manifest truncated", what);
    size_t body = len - VKS_SIGNATURE_BYTES;
    if (crypto_sign_verify_detached(blob + body, blob, body, pk) != 0)
        return vks_set_error(VKS_ERR_FORMAT, "%s: bad signature (not signed by the trainer's key)", what);
    return VKS_OK;
}

int vks_manifest_open(const uint8_t *blob, size_t len, const uint8_t pk[VKS_PUBLIC_KEY_BYTES], const char *what,
                      vks_manifest *m) {
    int rc = vks_manifest_verify(blob, len, pk, what);
    if (rc) {
        if (m) memset(m, 0, sizeof *m);
        return rc;
    }
    return vks_manifest_parse(blob, len, what, m);
}

/* ---- shards ---- */

bool vks_shard_wire_ok(const vks_manifest *m, uint32_t i, const uint8_t *wire, size_t len) {
    if (!m || !wire || i >= m->n_shards || len != m->shards[i].wire_size) return false;
    uint8_t h[VKS_HASH_BYTES];
    vks_hash(wire, len, h);
    return sodium_memcmp(h, m->shards[i].wire_hash, VKS_HASH_BYTES) == 0;
}

int vks_shard_decode(const vks_manifest *m, uint32_t i, const uint8_t *wire, const uint8_t *base, size_t base_size,
                     uint8_t *out) {
    if (!m || !wire || !out || i >= m->n_shards) return vks_set_error(VKS_ERR_ARG, "shard: bad argument");
    const vks_shard_entry *e = &m->shards[i];
    uint64_t off;
    uint32_t len;
    vks_shard_range(m, i, &off, &len);
    if (e->encoding == VKS_SHARD_RAW) {
        memcpy(out, wire, len);
    } else {
        if (!base || base_size != m->file_size)
            return vks_set_error(VKS_ERR_FORMAT, "shard %u: delta without the base version %llu", i,
                                 (unsigned long long)m->base_version);
        int rc = vks_delta_decode((vks_delta_mode)m->delta, wire, e->wire_size, base + off, len, out);
        if (rc) return rc;
    }
    uint8_t h[VKS_HASH_BYTES];
    vks_hash(out, len, h);
    if (sodium_memcmp(h, e->data_hash, VKS_HASH_BYTES))
        return vks_set_error(VKS_ERR_FORMAT, "shard %u: decoded bytes do not match the signed hash", i);
    return VKS_OK;
}
