/* vks_shard.h: the pure logic of Shardcast, the signed sharded weight
 * broadcast: manifest format, signing and verification (Ed25519),
 * shard hashing (BLAKE2b-256), delta encoding against the previous version
 * (byte-wise XOR or subtraction, then zstd), key files, and the on-disk
 * version store with its atomic switch. No MPI here: mpi/broadcast.c moves
 * the bytes, everything it trusts is decided by these functions.
 *
 * Manifest (all integers little-endian), signed as a whole:
 *   "VKSMAN01" | u64 version | u64 step | u8[32] model_hash | u64 file_size
 *   | u32 shard_size | u32 n_shards | u8[32] file_hash | u32 delta | u32 0
 *   | u64 base_version | u8[32] base_hash
 *   | n_shards x { u32 encoding | u32 wire_size | u8[32] wire_hash | u8[32] data_hash }
 *   | u8[64] Ed25519 signature of every byte before it.
 * Shard i covers file bytes [i*shard_size, min(file_size, (i+1)*shard_size)).
 * Its wire payload is either the bytes themselves (encoding RAW) or the zstd
 * frame of their delta against the same bytes of the base version (DELTA);
 * wire_hash is checked on arrival (before anything is decoded), data_hash and
 * file_hash after decoding. A raw shard's wire and data hashes must be equal
 * (the parser refuses others), so a receiver of raw shards checks each once. */
#ifndef VKS_SHARD_H
#define VKS_SHARD_H
#include "vks_common.h"

#define VKS_HASH_BYTES 32       /* BLAKE2b-256 */
#define VKS_PUBLIC_KEY_BYTES 32 /* Ed25519 */
#define VKS_SECRET_KEY_BYTES 64
#define VKS_SIGNATURE_BYTES 64

#define VKS_SHARD_DEFAULT_BYTES (32u << 20)
#define VKS_SHARD_MIN_BYTES 4096u
#define VKS_SHARD_MAX_BYTES (1u << 30)
#define VKS_SHARD_MAX_COUNT (1u << 20)
#define VKS_MANIFEST_MAX_FILE (1ull << 40) /* 1 TiB */
#define VKS_MANIFEST_HEADER_BYTES 152
#define VKS_MANIFEST_ENTRY_BYTES 72

/* Delta modes (manifest-wide) and shard encodings. */
typedef enum { VKS_DELTA_NONE = 0, VKS_DELTA_XOR = 1, VKS_DELTA_SUB = 2 } vks_delta_mode;
typedef enum { VKS_SHARD_RAW = 0, VKS_SHARD_DELTA = 1 } vks_shard_encoding;

typedef struct {
    uint32_t encoding;  /* vks_shard_encoding */
    uint32_t wire_size; /* bytes sent */
    uint64_t wire_offset; /* derived: offset in the concatenated wire stream (not serialized) */
    uint8_t wire_hash[VKS_HASH_BYTES];
    uint8_t data_hash[VKS_HASH_BYTES];
} vks_shard_entry;

typedef struct {
    uint64_t version, step, file_size, base_version;
    uint32_t shard_size, n_shards, delta; /* delta: vks_delta_mode */
    uint8_t model_hash[VKS_HASH_BYTES], file_hash[VKS_HASH_BYTES], base_hash[VKS_HASH_BYTES];
    uint64_t wire_size;      /* derived: sum of the shards' wire sizes */
    vks_shard_entry *shards; /* n_shards entries, owned */
} vks_manifest;

/* What the origin puts in a manifest. */
typedef struct {
    uint64_t version, step;
    uint8_t model_hash[VKS_HASH_BYTES];
    uint32_t shard_size;     /* 0 = VKS_SHARD_DEFAULT_BYTES */
    vks_delta_mode delta;    /* NONE, or the delta against base (needs base) */
    uint64_t base_version;   /* version of base (must be < version) */
} vks_manifest_params;

/* BLAKE2b-256 of len bytes. */
void vks_hash(const void *data, size_t len, uint8_t out[VKS_HASH_BYTES]);
/* Model identity hash: BLAKE2b-256 of "vkswarm-model:" + id. */
void vks_model_id_hash(const char *id, uint8_t out[VKS_HASH_BYTES]);
/* Lower-case hex of a hash into out (65 bytes). */
void vks_shard_hash_hex(const uint8_t h[VKS_HASH_BYTES], char out[2 * VKS_HASH_BYTES + 1]);

/* Cuts data into shards and fills *m and the wire stream (*wire, malloc'd,
 * m->wire_size bytes). With p->delta != NONE and base (same size as data),
 * each shard whose zstd'd delta is smaller than the shard is sent as delta;
 * other shards stay raw. */
int vks_manifest_build(const uint8_t *data, size_t size, const uint8_t *base, size_t base_size,
                       const vks_manifest_params *p, vks_manifest *m, uint8_t **wire);
void vks_manifest_free(vks_manifest *m);
/* Serializes and signs with the Ed25519 secret key: *blob is malloc'd. */
int vks_manifest_sign(const vks_manifest *m, const uint8_t sk[VKS_SECRET_KEY_BYTES], uint8_t **blob, size_t *len);
/* Structural parse of a (hostile) blob: sizes, counts, encodings, exact
 * length. Does not check the signature. `what` names the source in errors. */
int vks_manifest_parse(const uint8_t *blob, size_t len, const char *what, vks_manifest *m);
/* Checks the signature with the public key (VKS_ERR_FORMAT if it fails). */
int vks_manifest_verify(const uint8_t *blob, size_t len, const uint8_t pk[VKS_PUBLIC_KEY_BYTES], const char *what);
/* parse + verify: the only way a receiver should read a manifest. */
int vks_manifest_open(const uint8_t *blob, size_t len, const uint8_t pk[VKS_PUBLIC_KEY_BYTES], const char *what,
                      vks_manifest *m);

/* File range of shard i. */
void vks_shard_range(const vks_manifest *m, uint32_t i, uint64_t *offset, uint32_t *len);
/* True if the wire payload of shard i (len bytes) has the signed length and hash. */
bool vks_shard_wire_ok(const vks_manifest *m, uint32_t i, const uint8_t *wire, size_t len);
/* Decodes the (already checked) wire payload of shard i into out (its file
 * range length), using base (the whole base file, NULL if none) for deltas,
 * and checks data_hash. */
int vks_shard_decode(const vks_manifest *m, uint32_t i, const uint8_t *wire, const uint8_t *base, size_t base_size,
                     uint8_t *out);

/* Delta of n bytes: XOR or byte-wise subtraction (new - base mod 256), then
 * zstd into out (cap bytes). Returns VKS_OK and *out_len, or an error when it
 * does not fit in cap. */
int vks_delta_encode(vks_delta_mode mode, const uint8_t *data, const uint8_t *base, size_t n, uint8_t *out,
                     size_t cap, size_t *out_len);
/* Inverse: the zstd frame must decode to exactly n bytes. */
int vks_delta_decode(vks_delta_mode mode, const uint8_t *in, size_t in_len, const uint8_t *base, size_t n,
                     uint8_t *out);

/* Keys: DIR/shardcast.pub (64 hex digits) and DIR/shardcast.key (128 hex
 * digits, mode 0600). */
int vks_keygen(const char *dir);
/* A fresh key pair in memory (a run's own key; the caller wipes sk). */
int vks_keypair_new(uint8_t pk[VKS_PUBLIC_KEY_BYTES], uint8_t sk[VKS_SECRET_KEY_BYTES]);
int vks_key_load_public(const char *path, uint8_t pk[VKS_PUBLIC_KEY_BYTES]);
int vks_key_load_secret(const char *path, uint8_t sk[VKS_SECRET_KEY_BYTES]);

/* Version store: DIR/v<N>/model.bin, DIR/current -> v<N> (symlink switched by
 * rename, so readers see the old or the new version, never a partial one).
 * New versions are assembled in DIR/.v<N>.partial/. */
#define VKS_STORE_FILE "model.bin"
/* Version DIR/current points to; 0 when there is none. */
int vks_store_current(const char *dir, uint64_t *version);
/* Path of the file of `version` (0 = current) into out. */
int vks_store_path(const char *dir, uint64_t version, char *out, size_t cap);
/* Creates DIR (if needed) and a fresh staging directory for version; writes
 * the staging file path into out. */
int vks_store_stage(const char *dir, uint64_t version, char *out, size_t cap);
/* Removes what interrupted transfers left in DIR: staging directories of any
 * version (.v<N>.partial) and half-switched links (.current.<N>.tmp). Called
 * by vks_store_stage and when a broadcast starts; one writer per store. */
void vks_store_sweep(const char *dir);
/* Writes len bytes to the staging file of version, fsyncs it. */
int vks_store_write(const char *dir, uint64_t version, const uint8_t *data, size_t len);
/* Moves staging into DIR/v<N>, switches DIR/current to it atomically and
 * removes versions older than the newest `keep` (>= 1). */
int vks_store_commit(const char *dir, uint64_t version, int keep);
/* Removes the staging directory of version (after a failed transfer). */
void vks_store_abort(const char *dir, uint64_t version);
/* Reads the current version's file (malloc'd); *data = NULL, *len = 0 if none. */
int vks_store_read_current(const char *dir, uint64_t *version, uint8_t **data, size_t *len);
#endif
