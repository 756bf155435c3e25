/* Ed25519 key files for Shardcast: hex text, the secret one mode 0600. */
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "vkswarm/vks_shard.h"

static int write_hex_file(const char *path, const uint8_t *key, size_t n, mode_t mode) {
    char hex[2 * VKS_SECRET_KEY_BYTES + 2];
    sodium_bin2hex(hex, sizeof hex, key, n);
    size_t len = 2 * n;
    hex[len++] = '\n';
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, mode);
    if (fd < 0) return vks_set_error(VKS_ERR_IO, "%s: cannot create (%s)", path, strerror(errno));
    bool ok = write(fd, hex, len) == (ssize_t)len && fsync(fd) == 0;
    sodium_memzero(hex, sizeof hex);
    if (close(fd) != 0 || !ok) return vks_set_error(VKS_ERR_IO, "%s: write failed", path);
    return VKS_OK;
}

int vks_keygen(const char *dir) {
    if (!dir) return vks_set_error(VKS_ERR_ARG, "keygen: no directory");
    if (sodium_init() < 0) return vks_set_error(VKS_ERR_IO, "keygen: libsodium failed to initialize");
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return vks_set_error(VKS_ERR_IO, "%s: cannot create directory (%s)", dir, strerror(errno));
    char pub[4096], sec[4096];
    if (snprintf(pub, sizeof pub, "%s/shardcast.pub", dir) >= (int)sizeof pub ||
        snprintf(sec, sizeof sec, "%s/shardcast.key", dir) >= (int)sizeof sec)
        return vks_set_error(VKS_ERR_ARG, "%s: path too long", dir);
    uint8_t pk[VKS_PUBLIC_KEY_BYTES], sk[VKS_SECRET_KEY_BYTES];
    crypto_sign_keypair(pk, sk);
    int rc = write_hex_file(sec, sk, sizeof sk, 0600);
    sodium_memzero(sk, sizeof sk);
    if (rc) return rc;
    rc = write_hex_file(pub, pk, sizeof pk, 0644);
    if (rc) unlink(sec);
    return rc;
}

/* A secret key others can read is refused, as ssh does (checked on the open file). */
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
