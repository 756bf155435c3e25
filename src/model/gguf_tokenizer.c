/* gguf_tokenizer.c: the tokenizer.ggml.* metadata of a written GGUF: from a
 * llama2.c tokenizer.bin (as llama.cpp stores a SentencePiece vocabulary), or
 * copied from the source GGUF.
 *
 * llama2.c tokenizer.bin: int32 max_token_length, then per token f32 score,
 * int32 length, bytes. Its pieces use ' ' where SentencePiece (and GGUF) use
 * U+2581, and BOS/EOS read "\n<s>\n" / "\n</s>\n"; both are mapped back. */
#include "model/model_internal.h"
#include "vkswarm/vks_gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_BYTE = 6 };

typedef struct {
    char **pieces;
    float *scores;
    int32_t *types;
    int n;
} l2c_vocab;

static void vocab_free(l2c_vocab *v) {
    for (int i = 0; v->pieces && i < v->n; i++) free(v->pieces[i]);
    free(v->pieces);
    free(v->scores);
    free(v->types);
}

/* SentencePiece form of a llama2.c piece: ' ' -> U+2581 (3 bytes). */
static char *spm_piece(const unsigned char *p, size_t len, int id) {
    if (id == 1 && len == 5 && memcmp(p, "\n<s>\n", 5) == 0) return strdup("<s>");
    if (id == 2 && len == 6 && memcmp(p, "\n</s>\n", 6) == 0) return strdup("</s>");
    char *s = malloc(3 * len + 1), *o = s;
    if (!s) return NULL;
    for (size_t i = 0; i < len; i++) {
        if (p[i] == ' ') {
            memcpy(o, "\xe2\x96\x81", 3);
            o += 3;
        } else {
            *o++ = (char)p[i];
        }
    }
    *o = '\0';
    return s;
}

static int32_t token_type(const char *piece, int id) {
    unsigned hex;
    char tail;
    if (id == 0) return TT_UNKNOWN;
    if (id == 1 || id == 2) return TT_CONTROL;
    if (strlen(piece) == 6 && sscanf(piece, "<0x%2X%c", &hex, &tail) == 2 && tail == '>') return TT_BYTE;
    return TT_NORMAL;
}

static int read_entry(const unsigned char *buf, size_t size, size_t *pos, const char *path, int id, l2c_vocab *v) {
    int32_t len;
    if (size - *pos < 8) return vks_set_error(VKS_ERR_FORMAT, "%s: truncated at token %d", path, id);
    memcpy(&v->scores[id], buf + *pos, 4);
    memcpy(&len, buf + *pos + 4, 4);
    *pos += 8;
    if (len < 0 || (size_t)len > size - *pos)
        return vks_set_error(VKS_ERR_FORMAT, "%s: token %d has a bad length %d", path, id, len);
    v->pieces[id] = spm_piece(buf + *pos, (size_t)len, id);
    if (!v->pieces[id]) return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", path);
    v->types[id] = token_type(v->pieces[id], id);
    *pos += (size_t)len;
    return VKS_OK;
}

static int read_file(const char *path, unsigned char **buf, size_t *size) {
    FILE *f = NULL;
    int rc = vks_fopen_regular(path, &f);
    if (rc) return rc;
    long end = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (end < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return vks_set_error(VKS_ERR_IO, "%s: cannot read", path);
    }
    *buf = malloc((size_t)end + 1);
    bool ok = *buf && fread(*buf, 1, (size_t)end, f) == (size_t)end;
    fclose(f);
    if (!ok) {
        free(*buf);
        return vks_set_error(VKS_ERR_IO, "%s: cannot read", path);
    }
    *size = (size_t)end;
    return VKS_OK;
}

static int load_l2c_vocab(const char *path, int n, l2c_vocab *v) {
    unsigned char *buf = NULL;
    size_t size = 0, pos = 4;
    int rc = read_file(path, &buf, &size);
    if (rc != VKS_OK) return rc;
    v->n = n;
    v->pieces = calloc((size_t)n, sizeof *v->pieces);
    v->scores = calloc((size_t)n, sizeof *v->scores);
    v->types = calloc((size_t)n, sizeof *v->types);
    if (!v->pieces || !v->scores || !v->types) rc = vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", path);
    if (rc == VKS_OK && size < 4) rc = vks_set_error(VKS_ERR_FORMAT, "%s: truncated header", path);
    for (int i = 0; i < n && rc == VKS_OK; i++) rc = read_entry(buf, size, &pos, path, i, v);
    free(buf);
    return rc;
}

static int add_l2c_tokenizer(vks_gguf_writer *w, const vks_model *m, const char *path) {
    l2c_vocab v = {0};
    int rc = load_l2c_vocab(path, m->cfg.vocab_size, &v);
    if (rc == VKS_OK) rc = vks_gguf_add_str(w, "tokenizer.ggml.model", "llama");
    if (rc == VKS_OK) rc = vks_gguf_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v.pieces, (uint64_t)v.n);
    if (rc == VKS_OK) rc = vks_gguf_add_arr(w, "tokenizer.ggml.scores", VKS_GGUF_FLOAT32, v.scores, (uint64_t)v.n);
    if (rc == VKS_OK) rc = vks_gguf_add_arr(w, "tokenizer.ggml.token_type", VKS_GGUF_INT32, v.types, (uint64_t)v.n);
    if (rc == VKS_OK) rc = vks_gguf_add_u32(w, "tokenizer.ggml.bos_token_id", 1);
    if (rc == VKS_OK) rc = vks_gguf_add_u32(w, "tokenizer.ggml.eos_token_id", 2);
    if (rc == VKS_OK) rc = vks_gguf_add_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    vocab_free(&v);
    return rc;
}

/* Copies one scalar or string key. */
static int copy_scalar(vks_gguf_writer *w, const vks_gguf *g, const char *key, vks_gguf_type t) {
    if (t == VKS_GGUF_STRING) {
        const char *s;
        size_t len;
        vks_gguf_get_str(g, key, &s, &len);
        return vks_gguf_add_strn(w, key, s, len);
    }
    union { int64_t i; uint64_t u; double d; float f; bool b; uint8_t byte; } v;
    if (t == VKS_GGUF_BOOL) {
        vks_gguf_get_bool(g, key, &v.b);
        v.byte = v.b ? 1 : 0;
    } else if (t == VKS_GGUF_FLOAT32) vks_gguf_get_f32(g, key, &v.f);
    else if (t == VKS_GGUF_FLOAT64) vks_gguf_get_f64(g, key, &v.d);
    else if (t == VKS_GGUF_UINT64) vks_gguf_get_u64(g, key, &v.u);
    else vks_gguf_get_i64(g, key, &v.i); /* little-endian: the low bytes are the narrow value */
    return vks_gguf_add_scalar(w, key, t, &v);
}

static int copy_array(vks_gguf_writer *w, const vks_gguf *g, const char *key) {
    vks_gguf_type et;
    uint64_t n;
    vks_gguf_get_arr_info(g, key, &et, &n);
    int rc = VKS_OK;
    if (et == VKS_GGUF_STRING) {
        const char **s = malloc((size_t)(n ? n : 1) * sizeof *s);
        if (!s) return vks_set_error(VKS_ERR_NOMEM, "out of memory copying %s", key);
        for (uint64_t i = 0; i < n; i++) vks_gguf_get_arr_str(g, key, i, &s[i], NULL);
        rc = vks_gguf_add_arr_str(w, key, s, n);
        free(s);
        return rc;
    }
    bool is_float = et == VKS_GGUF_FLOAT32 || et == VKS_GGUF_FLOAT64;
    void *buf = malloc((size_t)(n ? n : 1) * 4);
    if (!buf) return vks_set_error(VKS_ERR_NOMEM, "out of memory copying %s", key);
    rc = is_float ? vks_gguf_get_arr_f32(g, key, buf, n) : vks_gguf_get_arr_i32(g, key, buf, n);
    if (rc == VKS_OK) rc = vks_gguf_add_arr(w, key, is_float ? VKS_GGUF_FLOAT32 : VKS_GGUF_INT32, buf, n);
    free(buf);
    return rc;
}

static int copy_gguf_tokenizer(vks_gguf_writer *w, const vks_gguf *g) {
    int rc = VKS_OK;
    for (int64_t i = 0; i < vks_gguf_n_kv(g) && rc == VKS_OK; i++) {
        const char *key = vks_gguf_key(g, i);
        if (strncmp(key, "tokenizer.", 10) != 0) continue;
        vks_gguf_type t = vks_gguf_kv_type(g, i);
        rc = t == VKS_GGUF_ARRAY ? copy_array(w, g, key) : copy_scalar(w, g, key, t);
    }
    return rc;
}

int vks_gguf_add_tokenizer(vks_gguf_writer *w, const vks_model *m, const char *tokenizer_path) {
    if (tokenizer_path) return add_l2c_tokenizer(w, m, tokenizer_path);
    if (m->gguf) return copy_gguf_tokenizer(w, m->gguf);
    int rc = VKS_OK;
    if (m->bos_id >= 0) rc = vks_gguf_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)m->bos_id);
    if (rc == VKS_OK && m->eos_id >= 0) rc = vks_gguf_add_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)m->eos_id);
    return rc;
}
