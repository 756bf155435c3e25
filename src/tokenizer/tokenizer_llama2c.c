/* tokenizer_llama2c.c: llama2.c tokenizer.bin reader with run.c's encode/decode.
 *
 * File: int32 max_token_length, then vocab_size records of
 * (float32 score, int32 len, len bytes), nothing after them. The file does not
 * store its token count: a file holding more or fewer records than the
 * model's vocabulary (a tokenizer of another model) is refused naming both
 * counts. Every length is validated before use.
 *
 * Encode follows run.c: optional BOS, the dummy prefix " " when the text is
 * not empty, UTF-8 code point groups (a lead byte plus up to 3 following
 * continuation bytes, exactly as run.c groups them, so invalid UTF-8 simply
 * falls back to bytes), byte fallback id = byte + 3, then repeatedly merge the
 * adjacent pair with the highest score (leftmost on ties; only scores above
 * -1e10 as in run.c), then optional EOS. The merges run through the engine
 * shared with SPM and BPE (tokenizer_merge.c: a heap with lazy invalidation)
 * instead of run.c's full rescans: same result, O(n log n).
 * Deviations only matter for hostile vocabularies: if " " is not in the
 * vocabulary the dummy prefix uses byte fallback (run.c would emit -1), byte
 * fallback ids beyond the vocabulary become 0 (<unk>), and duplicate pieces
 * resolve to the lowest id.
 */
#include "tokenizer_internal.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOK_BOS 1
#define TOK_EOS 2
#define TOK_BYTE_BASE 3           /* "<0x00>" is id 3 */
#define TOK_MIN_MERGE_SCORE -1e10f /* run.c's initial best score: never merged at or below */

/* ---- loading ---- */

static int32_t le_i32(const unsigned char *b) {
    uint32_t u = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    int32_t v;
    memcpy(&v, &u, sizeof v);
    return v;
}

static float le_f32(const unsigned char *b) {
    int32_t i = le_i32(b);
    float f;
    memcpy(&f, &i, sizeof f);
    return f;
}

/* Reads the whole file into *out (malloc'd, *size bytes). */
static int read_whole_file(const char *path, unsigned char **out, size_t *size) {
    FILE *f = NULL;
    int rc = vks_fopen_regular(path, &f);
    if (rc) return rc;
    unsigned char *buf = NULL;
    size_t used = 0, cap = 0;
    for (;;) {
        if (used == cap) {
            size_t ncap = cap ? cap * 2 : 65536;
            unsigned char *nb = ncap > cap ? realloc(buf, ncap) : NULL;
            if (!nb) {
                rc = vks_set_error(VKS_ERR_NOMEM, "%s: out of memory reading the file", path);
                break;
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + used, 1, cap - used, f);
        used += got;
        if (got == 0) break;
    }
    if (rc == VKS_OK && ferror(f)) rc = vks_set_error(VKS_ERR_IO, "%s: read error", path);
    fclose(f);
    if (rc != VKS_OK) {
        free(buf);
        return rc;
    }
    *out = buf;
    *size = used;
    return VKS_OK;
}

static int alloc_tables(vks_tokenizer *t, const char *path) {
    size_t V = (size_t)t->vocab_size;
    t->offset = malloc(V * sizeof *t->offset);
    t->len = malloc(V * sizeof *t->len);
    t->score = malloc(V * sizeof *t->score);
    t->sorted = malloc(V * sizeof *t->sorted);
    if (!t->offset || !t->len || !t->score || !t->sorted)
        return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory for the vocabulary", path);
    return VKS_OK;
}

/* Validates every record; fills offset/len/score (offsets into `file`) and
 * the blob size needed for NUL-terminated copies. */
static int parse_records(vks_tokenizer *t, const unsigned char *file, size_t size,
                         const char *path, size_t *blob_bytes) {
    size_t pos = 4, blob = 0;
    for (int i = 0; i < t->vocab_size; i++) {
        if (size - pos < 8)
            return vks_set_error(VKS_ERR_FORMAT, "%s: truncated: record %d needs 8 bytes at offset %zu, file has %zu",
                                 path, i, pos, size);
        float score = le_f32(file + pos);
        int32_t len = le_i32(file + pos + 4);
        pos += 8;
        if (isnan(score)) return vks_set_error(VKS_ERR_FORMAT, "%s: token %d has a NaN score", path, i);
        if (len < 0 || len > t->max_token_length)
            return vks_set_error(VKS_ERR_FORMAT, "%s: token %d has length %d outside 0..%d", path, i, len,
                                 t->max_token_length);
        if (size - pos < (size_t)len)
            return vks_set_error(VKS_ERR_FORMAT, "%s: truncated: token %d needs %d bytes at offset %zu, file has %zu",
                                 path, i, len, pos, size);
        t->score[i] = score;
        t->len[i] = len;
        t->offset[i] = pos; /* file offset for now; rebased onto the blob later */
        pos += (size_t)len;
        blob += (size_t)len + 1;
    }
    *blob_bytes = blob;
    return VKS_OK;
}

/* Copies pieces into the NUL-terminated blob and builds the sorted index. */
static void build_index(vks_tokenizer *t, const unsigned char *file) {
    size_t at = 0;
    for (int i = 0; i < t->vocab_size; i++) {
        memcpy(t->blob + at, file + t->offset[i], (size_t)t->len[i]);
        t->blob[at + (size_t)t->len[i]] = '\0';
        t->offset[i] = at;
        at += (size_t)t->len[i] + 1;
        t->sorted[i] = (sorted_piece){t->blob + t->offset[i], t->len[i], i};
    }
    vks_tok_sort_index(t);
    t->space_id = vks_tok_lookup(t, " ", 1);
}

/* Number of whole records from `pos` on (lengths within 0..max_len); *end is
 * where the last one ends. */
static int64_t count_records(const unsigned char *file, size_t size, size_t pos, int32_t max_len, size_t *end) {
    int64_t n = 0;
    while (size - pos >= 8) {
        int32_t len = le_i32(file + pos + 4);
        if (len < 0 || len > max_len || size - pos - 8 < (size_t)len) break;
        pos += 8 + (size_t)len;
        n++;
    }
    *end = pos;
    return n;
}

/* A file of whole records but not vocab_size of them belongs to another model. */
static int check_token_count(const vks_tokenizer *t, const unsigned char *file, size_t size, const char *path) {
    size_t end = 0;
    int64_t n = count_records(file, size, 4, t->max_token_length, &end);
    if (end == size && n != t->vocab_size)
        return vks_set_error(VKS_ERR_FORMAT, "%s: holds %lld tokens but the model's vocabulary has %d "
                             "(a tokenizer of another model?)", path, (long long)n, t->vocab_size);
    return VKS_OK;
}

/* After the last record: nothing (else say what follows). */
static int check_file_end(const vks_tokenizer *t, const unsigned char *file, size_t size, const char *path) {
    size_t pos = 4;
    for (int i = 0; i < t->vocab_size; i++) pos += 8 + (size_t)t->len[i];
    if (pos == size) return VKS_OK;
    size_t end = 0;
    int64_t more = count_records(file, size, pos, t->max_token_length, &end);
    if (more > 0)
        return vks_set_error(VKS_ERR_FORMAT, "%s: holds more than the model's %d tokens (%lld more records follow)",
                             path, t->vocab_size, (long long)more);
    return vks_set_error(VKS_ERR_FORMAT, "%s: %zu stray bytes after the last of %d tokens", path, size - pos,
                         t->vocab_size);
}

static int parse_file(vks_tokenizer *t, const unsigned char *file, size_t size, const char *path) {
    if (size < 4) return vks_set_error(VKS_ERR_FORMAT, "%s: truncated: %zu bytes, no header", path, size);
    t->max_token_length = le_i32(file);
    if (t->max_token_length < 1 || t->max_token_length > TOK_MAX_PIECE)
        return vks_set_error(VKS_ERR_FORMAT, "%s: max_token_length %d outside 1..%d", path,
                             t->max_token_length, TOK_MAX_PIECE);
    int rc = check_token_count(t, file, size, path);
    if (rc != VKS_OK) return rc;
    size_t min_size = 4 + 8 * (size_t)t->vocab_size; /* vocab is bounded: cannot overflow */
    if (size < min_size)
        return vks_set_error(VKS_ERR_FORMAT, "%s: truncated: %d tokens need at least %zu bytes, file has %zu",
                             path, t->vocab_size, min_size, size);
    size_t blob_bytes = 0;
    rc = alloc_tables(t, path);
    if (rc == VKS_OK) rc = parse_records(t, file, size, path, &blob_bytes);
    if (rc == VKS_OK) rc = check_file_end(t, file, size, path);
    if (rc != VKS_OK) return rc;
    t->blob = malloc(blob_bytes);
    if (!t->blob) return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory for the vocabulary", path);
    build_index(t, file);
    return VKS_OK;
}

int vks_tokenizer_load_llama2c(const char *path, int vocab_size, vks_tokenizer **out) {
    if (!path || !out) return vks_set_error(VKS_ERR_ARG, "vks_tokenizer_load_llama2c: NULL argument");
    *out = NULL;
    if (vocab_size < TOK_BYTE_BASE || vocab_size > TOK_MAX_VOCAB)
        return vks_set_error(VKS_ERR_ARG, "%s: vocab_size %d outside %d..%d", path, vocab_size,
                             TOK_BYTE_BASE, TOK_MAX_VOCAB);
    size_t size = 0;
    unsigned char *file = NULL;
    int rc = read_whole_file(path, &file, &size);
    if (rc != VKS_OK) return rc;
    vks_tokenizer *t = calloc(1, sizeof *t);
    if (!t) rc = vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", path);
    else {
        t->kind = TOK_KIND_LLAMA2C;
        t->vocab_size = vocab_size;
        t->bos = TOK_BOS;
        t->eos = TOK_EOS;
        t->unk = 0;
        t->pad = -1;
        t->add_bos = true;
        rc = parse_file(t, file, size, path);
    }
    free(file);
    if (rc != VKS_OK) {
        vks_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return VKS_OK;
}

/* ---- encode ---- */

static int32_t byte_token(const vks_tokenizer *t, unsigned char b) {
    int32_t id = TOK_BYTE_BASE + b;
    return id < t->vocab_size ? id : 0;
}

/* Appends the ids for one code point group: its piece, else its bytes. */
static int emit_group(const vks_tokenizer *t, const char *group, size_t n, int32_t *ids, int n_ids) {
    int32_t id = vks_tok_lookup(t, group, n);
    if (id >= 0) {
        ids[n_ids++] = id;
        return n_ids;
    }
    for (size_t i = 0; i < n; i++) ids[n_ids++] = byte_token(t, (unsigned char)group[i]);
    return n_ids;
}

static bool is_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

/* run.c's split: a byte plus following continuation bytes, at most 4 in all. */
static int split_codepoints(const vks_tokenizer *t, const char *text, size_t len, int32_t *ids, int n_ids) {
    size_t start = 0, group = 0;
    for (size_t i = 0; i < len; i++) {
        if (group == 0) start = i;
        group++;
        bool next_cont = i + 1 < len && is_continuation((unsigned char)text[i + 1]);
        if (next_cont && group < 4) continue;
        n_ids = emit_group(t, text + start, group, ids, n_ids);
        group = 0;
    }
    return n_ids;
}

/* run.c's merge rule through the shared engine (tokenizer_merge.c): the pair
 * whose concatenated pieces form the best-scoring vocabulary entry merges
 * first (priority = -score), leftmost on ties, and only entries scoring above
 * -1e10. Pieces are concatenated by id, as run.c does, so byte-fallback
 * tokens merge by their "<0xAB>" text. ctx: 2 * max_token_length bytes. */
static bool llama2c_pair(const vks_tokenizer *t, void *ctx, const tok_sym *a, const tok_sym *b, double *priority,
                         int32_t *id) {
    char *joined = ctx;
    size_t la = (size_t)t->len[a->id], lb = (size_t)t->len[b->id];
    memcpy(joined, t->blob + t->offset[a->id], la);
    memcpy(joined + la, t->blob + t->offset[b->id], lb);
    int32_t m = vks_tok_lookup(t, joined, la + lb);
    if (m < 0 || !(t->score[m] > TOK_MIN_MERGE_SCORE)) return false;
    *priority = -(double)t->score[m];
    *id = m;
    return true;
}

/* Merges ids[0..n) in place; returns the new count, or -1 on allocation failure. */
static int merge_pairs(const vks_tokenizer *t, int32_t *ids, int n) {
    if (n < 2) return n;
    tok_sym *syms = malloc((size_t)n * sizeof *syms);
    char *joined = malloc(2 * (size_t)t->max_token_length);
    size_t count = (size_t)n;
    int rc = syms && joined ? VKS_OK : VKS_ERR_NOMEM;
    for (int i = 0; rc == VKS_OK && i < n; i++) syms[i] = (tok_sym){0, 0, ids[i]};
    if (rc == VKS_OK) rc = vks_tok_merge(t, joined, syms, &count, llama2c_pair);
    for (size_t i = 0; rc == VKS_OK && i < count; i++) ids[i] = syms[i].id;
    free(syms);
    free(joined);
    return rc == VKS_OK ? (int)count : -1;
}

/* SPM / BPE through vks_tokenizer_tokenize, into the caller's len + 3 ids. */
static int encode_other(const vks_tokenizer *t, const char *text, size_t len, bool bos, bool eos, int32_t *ids,
                        int *n_out) {
    vks_tokenize_options o = {.add_bos = bos, .add_eos = eos, .parse_special = false};
    int32_t *v = NULL;
    int n = 0;
    int rc = vks_tokenizer_tokenize(t, text, len, &o, &v, &n);
    if (rc != VKS_OK) return rc;
    if ((size_t)n > len + 3) {
        free(v);
        return vks_set_error(VKS_ERR_FORMAT, "vks_tokenizer_encode: %d ids do not fit the %zu-entry buffer", n,
                             len + 3);
    }
    memcpy(ids, v, (size_t)n * sizeof *ids);
    free(v);
    *n_out = n;
    return VKS_OK;
}

int vks_tokenizer_encode(const vks_tokenizer *t, const char *text, size_t len, bool bos, bool eos,
                         int32_t *ids, int *n_out) {
    if (!t || !ids || !n_out || (!text && len > 0))
        return vks_set_error(VKS_ERR_ARG, "vks_tokenizer_encode: NULL argument");
    if (len > (size_t)INT32_MAX - 3)
        return vks_set_error(VKS_ERR_ARG, "vks_tokenizer_encode: text of %zu bytes is too long", len);
    *n_out = 0;
    if (t->kind != TOK_KIND_LLAMA2C) return encode_other(t, text, len, bos, eos, ids, n_out);
    int n = 0;
    if (bos) ids[n++] = TOK_BOS;
    if (len > 0) ids[n++] = t->space_id >= 0 ? t->space_id : byte_token(t, ' ');
    n = split_codepoints(t, text, len, ids, n);
    n = merge_pairs(t, ids, n);
    if (n < 0) return vks_set_error(VKS_ERR_NOMEM, "vks_tokenizer_encode: out of memory");
    if (eos) ids[n++] = TOK_EOS;
    *n_out = n;
    return VKS_OK;
}

/* ---- decode ---- */

const char *vks_tokenizer_decode(const vks_tokenizer *t, int prev, int next, char *buf, size_t *len) {
    static const char empty[1] = "";
    if (len) *len = 0;
    if (!t || !buf || !len || next < 0 || next >= t->vocab_size) return empty;
    if (t->kind != TOK_KIND_LLAMA2C) { /* decoded bytes; control tokens print nothing */
        if (t->type[next] == VKS_TOKEN_TYPE_CONTROL) return empty;
        const char *text = t->text_blob + t->text_offset[next];
        size_t n = (size_t)t->text_len[next];
        if (t->kind == TOK_KIND_SPM && t->add_space_prefix && prev == t->bos && n > 0 && text[0] == ' ') {
            text++;
            n--;
        }
        *len = n;
        return text;
    }
    const char *piece = t->blob + t->offset[next];
    size_t n = (size_t)t->len[next];
    if (prev == TOK_BOS && n > 0 && piece[0] == ' ') { /* sentencepiece strips it after BOS */
        piece++;
        n--;
    }
    int byte = vks_tok_byte_piece(piece, n);
    if (byte >= 0) {
        buf[0] = (char)byte;
        buf[1] = '\0';
        *len = 1;
        return buf;
    }
    *len = n;
    return piece;
}

bool vks_tokenizer_piece_printable(const char *piece, size_t len) {
    if (!piece || len == 0 || piece[0] == '\0') return false; /* run.c: empty C string */
    if (len == 1) {
        unsigned char b = (unsigned char)piece[0];
        return isprint(b) || isspace(b);
    }
    return true;
}
