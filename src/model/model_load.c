/* model_load.c: loads any supported model file, detected by content (never by
 * name): "GGUF" magic, a safetensors file (u64 header length then '{') or a
 * directory holding config.json, else a llama2.c checkpoint. */
#include "model/model_internal.h"
#include "vkswarm/vks_tokenizer.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef enum { FMT_LLAMA2C, FMT_GGUF, FMT_SAFETENSORS } model_format;

/* A safetensors file starts with a plausible header length and '{'. */
static bool looks_like_safetensors(const unsigned char *b, size_t got, size_t file_size) {
    if (got < 9 || b[8] != '{') return false;
    uint64_t n;
    memcpy(&n, b, 8);
    return n >= 2 && n <= file_size - 8;
}

static int detect(const char *path, model_format *fmt) {
    struct stat st;
    if (stat(path, &st) != 0) return vks_set_error(VKS_ERR_IO, "%s: no such file or directory", path);
    if (S_ISDIR(st.st_mode)) {
        *fmt = FMT_SAFETENSORS;
        return VKS_OK;
    }
    if (!S_ISREG(st.st_mode)) return vks_set_error(VKS_ERR_FORMAT, "%s: not a regular file or directory", path);
    int fd = vks_open_read(path, 0);
    if (fd < 0) return vks_set_error(VKS_ERR_IO, "%s: cannot open", path);
    unsigned char b[9] = {0};
    ssize_t got = pread(fd, b, sizeof b, 0);
    close(fd);
    if (got < 0) return vks_set_error(VKS_ERR_IO, "%s: cannot read", path);
    if (got >= 4 && memcmp(b, "GGUF", 4) == 0) *fmt = FMT_GGUF;
    else if (looks_like_safetensors(b, (size_t)got, (size_t)st.st_size)) *fmt = FMT_SAFETENSORS;
    else *fmt = FMT_LLAMA2C;
    return VKS_OK;
}

int vks_model_load(const char *path, vks_model **out) {
    if (!path || !out) return vks_set_error(VKS_ERR_ARG, "vks_model_load: NULL argument");
    *out = NULL;
    model_format fmt = FMT_LLAMA2C;
    int rc = detect(path, &fmt);
    if (rc != VKS_OK) return rc;
    switch (fmt) {
    case FMT_GGUF: return vks_model_load_gguf(path, out);
    case FMT_SAFETENSORS: return vks_model_load_safetensors(path, out);
    default: return vks_model_load_llama2c(path, out);
    }
}

int vks_tokenizer_load_auto(const char *path, const vks_model *m, vks_tokenizer **out) {
    if (!m) return vks_tokenizer_load_for(path, NULL, out);
    const vks_tokenizer_source src = {m->gguf, m->dir, m->path, m->cfg.vocab_size};
    return vks_tokenizer_load_for(path, &src, out);
}
