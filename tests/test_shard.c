/* Shardcast pure logic (issue 6): manifest round trip, signatures, hostile
 * manifests, shard checks, deltas, key files and the version store. */
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "test_util.h"
#include "vkswarm/vks_shard.h"

#define FILE_BYTES (100000u)
#define SHARD 8192u

static uint8_t pk[32], sk[64], pk2[32], sk2[64];

static uint8_t *random_bytes(size_t n, uint32_t seed) {
    uint8_t *b = malloc(n);
    uint32_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 17, s ^= s << 5;
        b[i] = (uint8_t)s;
    }
    return b;
}

/* A small float update: most bytes of each float stay the same. */
static uint8_t *updated(const uint8_t *base, size_t n) {
    uint8_t *b = malloc(n);
    memcpy(b, base, n);
    for (size_t i = 0; i + 4 <= n; i += 4) b[i] ^= (uint8_t)(i * 7);
    return b;
}

static void build_signed(const uint8_t *data, size_t n, uint64_t version, vks_manifest *m, uint8_t **wire,
                         uint8_t **blob, size_t *blob_len) {
    vks_manifest_params p = {.version = version, .step = 7, .shard_size = SHARD};
    vks_model_id_hash("test", p.model_hash);
    assert_int_equal(vks_manifest_build(data, n, NULL, 0, &p, m, wire), VKS_OK);
    assert_int_equal(vks_manifest_sign(m, sk, blob, blob_len), VKS_OK);
}

static void test_roundtrip(void **state) {
    (void)state;
    uint8_t *data = random_bytes(FILE_BYTES, 1), *wire, *blob;
    vks_manifest m, back;
    size_t len;
    build_signed(data, FILE_BYTES, 3, &m, &wire, &blob, &len);
    assert_int_equal(m.n_shards, (FILE_BYTES + SHARD - 1) / SHARD);
    assert_int_equal(m.wire_size, FILE_BYTES);
    assert_memory_equal(wire, data, FILE_BYTES); /* raw shards: the wire is the file */
    assert_int_equal(vks_manifest_open(blob, len, pk, "t", &back), VKS_OK);
    assert_int_equal(back.version, 3);
    assert_int_equal(back.step, 7);
    assert_int_equal(back.n_shards, m.n_shards);
    assert_memory_equal(back.file_hash, m.file_hash, 32);
    uint8_t h[32];
    crypto_generichash(h, 32, data, FILE_BYTES, NULL, 0);
    assert_memory_equal(back.file_hash, h, 32);
    uint8_t *out = malloc(FILE_BYTES);
    for (uint32_t i = 0; i < back.n_shards; i++) {
        uint64_t off;
        uint32_t sl;
        vks_shard_range(&back, i, &off, &sl);
        assert_true(vks_shard_wire_ok(&back, i, wire + back.shards[i].wire_offset, back.shards[i].wire_size));
        assert_int_equal(vks_shard_decode(&back, i, wire + back.shards[i].wire_offset, NULL, 0, out + off), VKS_OK);
    }
    assert_memory_equal(out, data, FILE_BYTES);
    vks_manifest_free(&m);
    vks_manifest_free(&back);
    free(out), free(data), free(wire), free(blob);
}

static void test_signature_refused(void **state) {
    (void)state;
    uint8_t *data = random_bytes(FILE_BYTES, 2), *wire, *blob;
    vks_manifest m, back;
    size_t len;
    build_signed(data, FILE_BYTES, 1, &m, &wire, &blob, &len);
    assert_int_equal(vks_manifest_open(blob, len, pk2, "t", &back), VKS_ERR_FORMAT); /* another key */
    assert_non_null(strstr(vks_last_error(), "bad signature"));
    for (size_t at = 0; at < len; at += 37) { /* any flipped byte, body or signature */
        blob[at] ^= 0x10;
        assert_int_equal(vks_manifest_open(blob, len, pk, "t", &back), VKS_ERR_FORMAT);
        blob[at] ^= 0x10;
    }
    assert_int_equal(vks_manifest_open(blob, len - 1, pk, "t", &back), VKS_ERR_FORMAT);
    assert_int_equal(vks_manifest_open(blob, len, pk, "t", &back), VKS_OK);
    vks_manifest_free(&back);
    vks_manifest_free(&m);
    free(data), free(wire), free(blob);
}

/* Rewrites a field of a signed manifest and re-signs it: the parser alone must refuse. */
static int parse_with(uint8_t *blob, size_t len, size_t at, uint64_t value, int bytes) {
    for (int i = 0; i < bytes; i++) blob[at + (size_t)i] = (uint8_t)(value >> (8 * i));
    crypto_sign_detached(blob + len - 64, NULL, blob, len - 64, sk);
    vks_manifest m;
    int rc = vks_manifest_open(blob, len, pk, "hostile", &m);
    if (rc == VKS_OK) vks_manifest_free(&m);
    return rc;
}

static void test_absurd_manifests(void **state) {
    (void)state;
    uint8_t *data = random_bytes(FILE_BYTES, 3), *wire, *blob;
    vks_manifest m;
    size_t len;
    build_signed(data, FILE_BYTES, 1, &m, &wire, &blob, &len);
    uint8_t *copy = malloc(len);
    struct { size_t at; uint64_t v; int bytes; } bad[] = {
        {0, 0x58, 1},                      /* magic */
        {8, 0, 8},                         /* version 0 */
        {56, 0, 8}, {56, 1ull << 41, 8},   /* file size 0, 2 TiB */
        {56, FILE_BYTES * 2ull, 8},        /* file size that needs more shards than listed */
        {64, 1, 4}, {64, 0xffffffffu, 4},  /* shard size */
        {68, 0xffffffffu, 4}, {68, 0, 4},  /* shard count */
        {68, 12, 4},                       /* shard count off by one */
        {104, 7, 4},                       /* delta mode */
        {112, 5, 8},                       /* base version without a delta */
        {152, 9, 4},                       /* shard 0 encoding */
        {156, SHARD + 1, 4},               /* shard 0 wire size (wrong length) */
        {156 + 72 * 12, 0, 4},             /* last shard's wire size */
        {152 + 40, 0x1234, 2},             /* raw shard 0: data hash is not its wire hash */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memcpy(copy, blob, len);
        assert_int_equal(parse_with(copy, len, bad[i].at, bad[i].v, bad[i].bytes), VKS_ERR_FORMAT);
    }
    memcpy(copy, blob, len);
    assert_int_equal(parse_with(copy, len, 16, 99, 8), VKS_OK); /* the step is free: control */
    vks_manifest p;
    assert_int_equal(vks_manifest_parse(blob, 10, "t", &p), VKS_ERR_FORMAT);
    assert_int_equal(vks_manifest_parse(blob, len + 72, "t", &p), VKS_ERR_FORMAT);
    vks_manifest_free(&m);
    free(copy), free(data), free(wire), free(blob);
}

static void test_tampered_shard(void **state) {
    (void)state;
    uint8_t *data = random_bytes(FILE_BYTES, 4), *wire, *blob;
    vks_manifest m;
    size_t len;
    build_signed(data, FILE_BYTES, 1, &m, &wire, &blob, &len);
    uint8_t *s2 = wire + m.shards[2].wire_offset;
    assert_true(vks_shard_wire_ok(&m, 2, s2, SHARD));
    s2[100] ^= 1;
    assert_false(vks_shard_wire_ok(&m, 2, s2, SHARD));
    s2[100] ^= 1;
    assert_false(vks_shard_wire_ok(&m, 2, s2, SHARD - 1)); /* wrong length */
    assert_false(vks_shard_wire_ok(&m, 99, s2, SHARD));
    vks_manifest_free(&m);
    free(data), free(wire), free(blob);
}

static void test_delta(void **state) {
    (void)state;
    uint8_t *base = random_bytes(FILE_BYTES, 5), *next = updated(base, FILE_BYTES);
    for (int mode = VKS_DELTA_XOR; mode <= VKS_DELTA_SUB; mode++) {
        vks_manifest_params p = {.version = 2, .base_version = 1, .shard_size = SHARD, .delta = (vks_delta_mode)mode};
        vks_manifest m;
        uint8_t *wire, *blob;
        size_t len;
        assert_int_equal(vks_manifest_build(next, FILE_BYTES, base, FILE_BYTES, &p, &m, &wire), VKS_OK);
        assert_true(m.wire_size < FILE_BYTES / 2); /* three bytes in four unchanged */
        assert_int_equal(m.shards[0].encoding, VKS_SHARD_DELTA);
        assert_int_equal(vks_manifest_sign(&m, sk, &blob, &len), VKS_OK);
        vks_manifest back;
        assert_int_equal(vks_manifest_open(blob, len, pk, "t", &back), VKS_OK);
        uint8_t *out = malloc(FILE_BYTES);
        for (uint32_t i = 0; i < back.n_shards; i++) {
            uint64_t off;
            uint32_t sl;
            vks_shard_range(&back, i, &off, &sl);
            const uint8_t *w = wire + back.shards[i].wire_offset;
            assert_true(vks_shard_wire_ok(&back, i, w, back.shards[i].wire_size));
            assert_int_equal(vks_shard_decode(&back, i, w, base, FILE_BYTES, out + off), VKS_OK);
        }
        assert_memory_equal(out, next, FILE_BYTES);
        /* the wrong base decodes to bytes that fail the signed hash */
        uint8_t *other = random_bytes(FILE_BYTES, 6);
        assert_int_equal(vks_shard_decode(&back, 0, wire, other, FILE_BYTES, out), VKS_ERR_FORMAT);
        assert_int_equal(vks_shard_decode(&back, 0, wire, NULL, 0, out), VKS_ERR_FORMAT);
        free(other), free(out), free(wire), free(blob);
        vks_manifest_free(&m);
        vks_manifest_free(&back);
    }
    /* a zstd frame of the wrong length is refused */
    uint8_t frame[1024], out[SHARD];
    size_t flen;
    assert_int_equal(vks_delta_encode(VKS_DELTA_XOR, next, base, 1000, frame, sizeof frame, &flen), VKS_OK);
    assert_int_equal(vks_delta_decode(VKS_DELTA_XOR, frame, flen, base, 999, out), VKS_ERR_FORMAT);
    assert_int_equal(vks_delta_decode(VKS_DELTA_XOR, frame, flen / 2, base, 1000, out), VKS_ERR_FORMAT);
    assert_int_equal(vks_delta_decode(VKS_DELTA_XOR, frame, flen, base, 1000, out), VKS_OK);
    assert_memory_equal(out, next, 1000);
    free(base), free(next);
}

static void test_keys(void **state) {
    (void)state;
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/keys", tu_tmpdir());
    assert_int_equal(vks_keygen(dir), VKS_OK);
    assert_int_equal(vks_keygen(dir), VKS_ERR_IO); /* never overwrites */
    uint8_t p[32], s[64], derived[32];
    snprintf(path, sizeof path, "%s/shardcast.pub", dir);
    assert_int_equal(vks_key_load_public(path, p), VKS_OK);
    snprintf(path, sizeof path, "%s/shardcast.key", dir);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(vks_key_load_secret(path, s), VKS_OK);
    crypto_sign_ed25519_sk_to_pk(derived, s);
    assert_memory_equal(derived, p, 32);
    assert_int_equal(vks_key_load_public(path, p), VKS_ERR_FORMAT); /* a secret key is not a public one */
    FILE *f = fopen(path, "r+");
    fputc('z', f);
    fclose(f);
    assert_int_equal(vks_key_load_secret(path, s), VKS_ERR_FORMAT);
}

/* Rewrites a key file with its hex digits followed by `end`. */
static void rewrite_key_line(const char *path, const char *end) {
    char hex[200] = "";
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_non_null(fgets(hex, sizeof hex, f));
    fclose(f);
    hex[strcspn(hex, "\r\n")] = 0;
    f = fopen(path, "wb");
    fprintf(f, "%s%s", hex, end);
    fclose(f);
}

/* A secret key readable by group or others is refused, naming the file and
 * its mode (as ssh does); "\r\n" ends a key line like "\n", a lone "\r" does not. */
static void test_key_permissions_and_line_ends(void **state) {
    (void)state;
    char dir[512], sec[600], pub[600];
    snprintf(dir, sizeof dir, "%s/keys2", tu_tmpdir());
    assert_int_equal(vks_keygen(dir), VKS_OK);
    snprintf(sec, sizeof sec, "%s/shardcast.key", dir);
    snprintf(pub, sizeof pub, "%s/shardcast.pub", dir);
    uint8_t s[64], p[32], p2[32];
    const unsigned refused[] = {0640, 0604, 0644, 0660, 0606};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        char mode[16];
        snprintf(mode, sizeof mode, "%04o", refused[i]);
        assert_int_equal(chmod(sec, refused[i]), 0);
        assert_int_not_equal(vks_key_load_secret(sec, s), VKS_OK);
        if (!strstr(vks_last_error(), sec) || !strstr(vks_last_error(), mode))
            fail_msg("mode %s: '%s'", mode, vks_last_error());
    }
    assert_int_equal(chmod(sec, 0400), 0);
    assert_int_equal(vks_key_load_secret(sec, s), VKS_OK);
    assert_int_equal(chmod(sec, 0600), 0);
    assert_int_equal(vks_key_load_public(pub, p), VKS_OK);
    rewrite_key_line(pub, "\r\n");
    assert_int_equal(vks_key_load_public(pub, p2), VKS_OK);
    assert_memory_equal(p, p2, 32);
    rewrite_key_line(sec, "\r\n");
    assert_int_equal(vks_key_load_secret(sec, s), VKS_OK);
    rewrite_key_line(pub, "\r");
    assert_int_equal(vks_key_load_public(pub, p2), VKS_ERR_FORMAT);
    rewrite_key_line(pub, "\n\n");
    assert_int_equal(vks_key_load_public(pub, p2), VKS_ERR_FORMAT);
}

static void test_store(void **state) {
    (void)state;
    char dir[512], path[700];
    snprintf(dir, sizeof dir, "%s/store", tu_tmpdir());
    uint64_t v = 99;
    assert_int_equal(vks_store_current(dir, &v), VKS_OK);
    assert_int_equal(v, 0);
    const uint8_t a[] = "version one", b[] = "version two", c[] = "three";
    assert_int_equal(vks_store_write(dir, 1, a, sizeof a), VKS_OK);
    assert_int_equal(vks_store_current(dir, &v), VKS_OK);
    assert_int_equal(v, 0); /* staged only: not visible */
    assert_int_equal(vks_store_commit(dir, 1, 2), VKS_OK);
    assert_int_equal(vks_store_write(dir, 2, b, sizeof b), VKS_OK);
    assert_int_equal(vks_store_commit(dir, 2, 2), VKS_OK);
    uint8_t *data;
    size_t len;
    assert_int_equal(vks_store_read_current(dir, &v, &data, &len), VKS_OK);
    assert_int_equal(v, 2);
    assert_int_equal(len, sizeof b);
    assert_memory_equal(data, b, len);
    free(data);
    /* an aborted version leaves the current one untouched */
    assert_int_equal(vks_store_write(dir, 3, c, sizeof c), VKS_OK);
    vks_store_abort(dir, 3);
    assert_int_equal(vks_store_current(dir, &v), VKS_OK);
    assert_int_equal(v, 2);
    assert_int_equal(vks_store_write(dir, 3, c, sizeof c), VKS_OK);
    assert_int_equal(vks_store_commit(dir, 3, 2), VKS_OK);
    snprintf(path, sizeof path, "%s/v1", dir);
    assert_int_not_equal(access(path, F_OK), 0); /* pruned: keep 2 */
    snprintf(path, sizeof path, "%s/v2/%s", dir, VKS_STORE_FILE);
    assert_int_equal(access(path, F_OK), 0);
    /* a FIFO in place of the current weights: refused at once (reading it blocked for ever) */
    snprintf(path, sizeof path, "%s/v3/%s", dir, VKS_STORE_FILE);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkfifo(path, 0600), 0);
    alarm(60);
    assert_int_equal(vks_store_read_current(dir, &v, &data, &len), VKS_ERR_FORMAT);
    alarm(0);
    assert_non_null(strstr(vks_last_error(), "not a regular file"));
    /* a hostile `current` link */
    snprintf(path, sizeof path, "%s/current", dir);
    unlink(path);
    assert_int_equal(symlink("../../etc", path), 0);
    assert_int_equal(vks_store_current(dir, &v), VKS_ERR_FORMAT);
}

/* A receiver killed mid-transfer leaves .v<N>.partial behind: the next
 * version's staging (the next broadcast) removes it, whatever its version,
 * and a symlink in a stage's place is removed without being followed. */
static void test_store_sweeps_stale_stages(void **state) {
    (void)state;
    char dir[512], path[700], outside[512];
    snprintf(dir, sizeof dir, "%s/sweep", tu_tmpdir());
    snprintf(outside, sizeof outside, "%s/sweep-outside", tu_tmpdir());
    const uint8_t a[] = "version one", b[] = "version two";
    assert_int_equal(vks_store_write(dir, 1, a, sizeof a), VKS_OK);
    assert_int_equal(vks_store_commit(dir, 1, 2), VKS_OK);
    assert_int_equal(vks_store_stage(dir, 5, path, sizeof path), VKS_OK); /* killed while receiving v5 */
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs("half", f);
    fclose(f);
    assert_int_equal(vks_store_stage(dir, 7, path, sizeof path), VKS_OK); /* and v7 */
    snprintf(path, sizeof path, "%s/.current.7.tmp", dir);
    assert_int_equal(symlink("v7", path), 0);
    assert_int_equal(mkdir(outside, 0755), 0);
    snprintf(path, sizeof path, "%s/keep.me", outside);
    f = fopen(path, "wb");
    fclose(f);
    snprintf(path, sizeof path, "%s/.v9.partial", dir);
    assert_int_equal(symlink(outside, path), 0);
    assert_int_equal(vks_store_write(dir, 6, b, sizeof b), VKS_OK); /* the next broadcast */
    assert_int_equal(vks_store_commit(dir, 6, 2), VKS_OK);
    const char *gone[] = {".v5.partial", ".v7.partial", ".current.7.tmp", ".v9.partial"};
    for (size_t i = 0; i < sizeof gone / sizeof gone[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, gone[i]);
        struct stat st;
        assert_int_not_equal(lstat(path, &st), 0);
    }
    snprintf(path, sizeof path, "%s/keep.me", outside);
    assert_int_equal(access(path, F_OK), 0); /* not followed */
    uint64_t v = 0;
    assert_int_equal(vks_store_current(dir, &v), VKS_OK);
    assert_int_equal(v, 6);
    vks_store_sweep(dir); /* idempotent; the current version stays */
    snprintf(path, sizeof path, "%s/v6/%s", dir, VKS_STORE_FILE);
    assert_int_equal(access(path, F_OK), 0);
}

/* A run's own key pair (the RL run's default): what it signs opens with its
 * public key only, and two pairs differ. */
static void test_keypair_in_memory(void **state) {
    (void)state;
    uint8_t rpk[32], rsk[64], opk[32], osk[64];
    assert_int_equal(vks_keypair_new(rpk, rsk), VKS_OK);
    assert_int_equal(vks_keypair_new(opk, osk), VKS_OK);
    assert_memory_not_equal(rpk, opk, 32);
    uint8_t *data = random_bytes(FILE_BYTES, 9), *wire, *blob;
    vks_manifest_params p = {.version = 1, .step = 0, .shard_size = SHARD};
    vks_manifest m, back;
    size_t len;
    assert_int_equal(vks_manifest_build(data, FILE_BYTES, NULL, 0, &p, &m, &wire), VKS_OK);
    assert_int_equal(vks_manifest_sign(&m, rsk, &blob, &len), VKS_OK);
    assert_int_equal(vks_manifest_open(blob, len, opk, "t", &back), VKS_ERR_FORMAT);
    assert_int_equal(vks_manifest_open(blob, len, rpk, "t", &back), VKS_OK);
    vks_manifest_free(&back);
    vks_manifest_free(&m);
    free(data), free(wire), free(blob);
}

int main(void) {
    if (sodium_init() < 0) return 1;
    crypto_sign_keypair(pk, sk);
    crypto_sign_keypair(pk2, sk2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),        cmocka_unit_test(test_signature_refused),
        cmocka_unit_test(test_absurd_manifests), cmocka_unit_test(test_tampered_shard),
        cmocka_unit_test(test_delta),            cmocka_unit_test(test_keys),
        cmocka_unit_test(test_key_permissions_and_line_ends),
        cmocka_unit_test(test_store),            cmocka_unit_test(test_store_sweeps_stale_stages),
        cmocka_unit_test(test_keypair_in_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
