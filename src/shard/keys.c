/* Ed25519 key files for Shardcast: hex text, the secret one mode 0600. */
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "vkswarm/vks_shard.h"

/* Key as hex digits and a newline, with write(2): no stdio buffer keeps a copy
 * of the secret. Returns 0 or an errno. */
static int write_hex(const vks_outfile *o, const uint8_t *key, size_t n) {
    char hex[2 * VKS_SECRET_KEY_BYTES + 2];
    sodium_bin2hex(hex, sizeof hex, key, n);
    size_t len = 2 * n;
    hex[len++] = '\n';
    ssize_t w = write(fileno(o->f), hex, len);
    int e = w == (ssize_t)len ? 0 : w < 0 ? errno : ENOSPC;
    sodium_memzero(hex, sizeof hex);
    return e;
}

static int refuse_existing(const char *path) {
    struct stat st;
    if (lstat(path, &st) == 0) return vks_set_error(VKS_ERR_IO, "%s: exists (not overwritten)", path);
    return VKS_OK;
}

/* Both files through temporaries, placed together and never over an existing
 * file: a failure (full disk) leaves neither. */
static int write_key_pair(const char *sec, const char *pub, const uint8_t *sk, const uint8_t *pk) {
    vks_outfile o[2] = {{0}};
    int rc = vks_outfile_open(&o[0], sec, 0600);
    if (rc == VKS_OK) rc = vks_outfile_open(&o[1], pub, 0644);
    int e = 0;
    const char *failed = sec;
    if (rc == VKS_OK && (e = write_hex(&o[0], sk, VKS_SECRET_KEY_BYTES)) == 0) {
        failed = pub;
        e = write_hex(&o[1], pk, VKS_PUBLIC_KEY_BYTES);
    }
    if (rc == VKS_OK && e == 0) return vks_outfile_commit_all(o, 2, true);
    if (rc == VKS_OK) rc = vks_set_error(VKS_ERR_IO, "%s: write failed: %s", failed, strerror(e));
    vks_outfile_abort(&o[0]);
    vks_outfile_abort(&o[1]);
    return rc;
}

int vks_keygen(const char *dir) {
    if (!dir) return vks_set_error(VKS_ERR_ARG, "keygen: no directory");
    if (sodium_init() < 0) return vks_set_error(VKS_ERR_IO, "keygen: libsodium failed to initialize");
    char pub[4096], sec[4096];
    if (snprintf(pub, sizeof pub, "%s/shardcast.pub", dir) >= (int)sizeof pub ||
        snprintf(sec, sizeof sec, "%s/shardcast.key", dir) >= (int)sizeof sec)
        return vks_set_error(VKS_ERR_ARG, "%s: path too long", dir);
    bool created = mkdir(dir, 0700) == 0;
    if (!created && errno != EEXIST)
        return vks_set_error(VKS_ERR_IO, "%s: cannot create directory (%s)", dir, strerror(errno));
    int rc = refuse_existing(sec);
    if (rc == VKS_OK) rc = refuse_existing(pub);
    if (rc == VKS_OK) {
        uint8_t pk[VKS_PUBLIC_KEY_BYTES], sk[VKS_SECRET_KEY_BYTES];
        crypto_sign_keypair(pk, sk);
        rc = write_key_pair(sec, pub, sk, pk);
        sodium_memzero(sk, sizeof sk);
    }
    if (rc != VKS_OK && created) rmdir(dir);
    return rc;
}

/* A secret key others can read is refused, as ssh does (checked on the open file). */
int vks_keypair_new(uint8_t pk[VKS_PUBLIC_KEY_BYTES], uint8_t sk[VKS_SECRET_KEY_BYTES]) {
    if (sodium_init() < 0) return vks_set_error(VKS_ERR_IO, "keygen: libsodium failed to initialize");
    crypto_sign_keypair(pk, sk);
    return VKS_OK;
}

static int check_private(FILE *f, const char *path) {
    struct stat st;
    if (fstat(fileno(f), &st) != 0) return vks_set_error(VKS_ERR_IO, "%s: cannot stat (%s)", path, strerror(errno));
    if (st.st_mode & 077)
        return vks_set_error(VKS_ERR_ARG, "%s: secret key is accessible by group or others (mode %04o); chmod 600 it",
                             path, (unsigned)(st.st_mode & 07777));
    return VKS_OK;
}

/* Reads exactly n bytes of key as 2n hex digits plus an optional line end
 * ("\n" or "\r\n", for public and secret keys alike). */
static int load_hex_file(const char *path, uint8_t *key, size_t n, const char *kind, bool secret) {
    FILE *f = fopen(path, "rb");
    if (!f) return vks_set_error(VKS_ERR_IO, "%s: cannot open %s key (%s)", path, kind, strerror(errno));
    int rc = secret ? check_private(f, path) : VKS_OK;
    if (rc) {
        fclose(f);
        return rc;
    }
    char buf[2 * VKS_SECRET_KEY_BYTES + 4];
    size_t got = fread(buf, 1, sizeof buf, f);
    fclose(f);
    size_t len = got;
    if (len > 0 && buf[len - 1] == '\n') len--;
    if (len > 0 && buf[len - 1] == '\r' && len < got) len--;
    size_t bin_len = 0;
    if (len != 2 * n || sodium_hex2bin(key, n, buf, len, NULL, &bin_len, NULL) != 0 || bin_len != n)
        rc = vks_set_error(VKS_ERR_FORMAT, "%s: not a %s key (%zu hex digits expected)", path, kind, 2 * n);
    sodium_memzero(buf, sizeof buf);
    return rc;
}

int vks_key_load_public(const char *path, uint8_t pk[VKS_PUBLIC_KEY_BYTES]) {
    if (!path || !pk) return vks_set_error(VKS_ERR_ARG, "key: null argument");
    return load_hex_file(path, pk, VKS_PUBLIC_KEY_BYTES, "Ed25519 public", false);
}

int vks_key_load_secret(const char *path, uint8_t sk[VKS_SECRET_KEY_BYTES]) {
    if (!path || !sk) return vks_set_error(VKS_ERR_ARG, "key: null argument");
    int rc = load_hex_file(path, sk, VKS_SECRET_KEY_BYTES, "Ed25519 secret", true);
    if (rc) return rc;
    /* the libsodium secret key ends with its public key: check they match */
    uint8_t seed[32], pk[32], sk2[64];
    crypto_sign_ed25519_sk_to_seed(seed, sk);
    crypto_sign_seed_keypair(pk, sk2, seed);
    bool ok = sodium_memcmp(sk2, sk, sizeof sk2) == 0;
    sodium_memzero(seed, sizeof seed);
    sodium_memzero(sk2, sizeof sk2);
    if (!ok) return vks_set_error(VKS_ERR_FORMAT, "%s: corrupt Ed25519 secret key", path);
    return VKS_OK;
}
