/* tokenizer_save.c: writes an SPM or BPE tokenizer back out: as GGUF
 * tokenizer.ggml.* metadata (llama.cpp's keys) or as a Hugging Face
 * tokenizer.json + tokenizer_config.json, in the forms tokenizer_load.c
 * reads, so a tokenizer survives every checkpoint format unchanged. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"
#include "vkswarm/vks_gguf.h"

static const char *piece(const vks_tokenizer *t, int id) { return t->blob + t->offset[id]; }

/* ---- merges in rank order ---- */

typedef struct {
    int32_t rank, left, right;
} merge_entry;

static int by_rank(const void *pa, const void *pb) {
    const merge_entry *a = pa, *b = pb;
    return (a->rank > b->rank) - (a->rank < b->rank);
}

/* The merge table as a list sorted by rank (*out malloc'd, *n entries). */
static int merges_by_rank(const vks_tokenizer *t, merge_entry **out, size_t *n) {
    *out = malloc((t->n_merges ? t->n_merges : 1) * sizeof **out);
    if (!*out) return vks_set_error(VKS_ERR_NOMEM, "tokenizer writer: out of memory for %zu merges", t->n_merges);
    size_t k = 0;
    for (size_t i = 0; t->merges && i < t->merge_cap && k < t->n_merges; i++) {
        const tok_merge_slot *s = &t->merges[i];
        if (s->key != UINT64_MAX)
            (*out)[k++] = (merge_entry){s->rank, (int32_t)(s->key >> 32), (int32_t)(uint32_t)s->key};
    }
    qsort(*out, k, sizeof **out, by_rank);
    *n = k;
    return VKS_OK;
}

/* ---- GGUF ---- */

/* GGUF strings here are C strings: a piece holding a NUL byte cannot be written. */
static int check_pieces_have_no_nul(const vks_tokenizer *t) {
    for (int i = 0; i < t->vocab_size; i++)
        if (strlen(piece(t, i)) != (size_t)t->len[i])
            return vks_set_error(VKS_ERR_ARG, "tokenizer writer: token %d holds a NUL byte", i);
    return VKS_OK;
}

static int gguf_vocab(const vks_tokenizer *t, vks_gguf_writer *w) {
    size_t V = (size_t)t->vocab_size;
    const char **pieces = malloc(V * sizeof *pieces);
    int32_t *types = malloc(V * sizeof *types);
    int rc = pieces && types ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "tokenizer writer: out of memory");
    for (size_t i = 0; rc == VKS_OK && i < V; i++) {
        pieces[i] = piece(t, (int)i);
        types[i] = t->type[i];
    }
    if (rc == VKS_OK) rc = vks_gguf_add_arr_str(w, "tokenizer.ggml.tokens", pieces, V);
    if (rc == VKS_OK && t->kind == TOK_KIND_SPM)
        rc = vks_gguf_add_arr(w, "tokenizer.ggml.scores", VKS_GGUF_FLOAT32, t->score, V);
    if (rc == VKS_OK) rc = vks_gguf_add_arr(w, "tokenizer.ggml.token_type", VKS_GGUF_INT32, types, V);
    free(pieces);
    free(types);
    return rc;
}

/* "left right": the reader splits at the first space after the first byte,
 * so a left piece with a space past its first byte cannot be written. */
static int gguf_merges(const vks_tokenizer *t, vks_gguf_writer *w) {
    merge_entry *m = NULL;
    size_t n = 0;
    int rc = merges_by_rank(t, &m, &n);
    char **text = rc == VKS_OK ? calloc(n ? n : 1, sizeof *text) : NULL;
    if (rc == VKS_OK && !text) rc = vks_set_error(VKS_ERR_NOMEM, "tokenizer writer: out of memory");
    for (size_t i = 0; rc == VKS_OK && i < n; i++) {
        size_t ll = (size_t)t->len[m[i].left], rl = (size_t)t->len[m[i].right];
        if (ll > 1 && memchr(piece(t, m[i].left) + 1, ' ', ll - 1)) {
            rc = vks_set_error(VKS_ERR_ARG, "tokenizer writer: merge %zu's left piece (token %d) holds a space", i,
                               m[i].left);
            break;
        }
        text[i] = malloc(ll + rl + 2);
        if (!text[i]) {
            rc = vks_set_error(VKS_ERR_NOMEM, "tokenizer writer: out of memory");
            break;
        }
        memcpy(text[i], piece(t, m[i].left), ll);
        text[i][ll] = ' ';
        memcpy(text[i] + ll + 1, piece(t, m[i].right), rl + 1);
    }
    if (rc == VKS_OK) rc = vks_gguf_add_arr_str(w, "tokenizer.ggml.merges", (const char *const *)text, n);
    for (size_t i = 0; text && i < n; i++) free(text[i]);
    free(text);
    free(m);
    return rc;
}

static int gguf_id(vks_gguf_writer *w, const char *key, int32_t id) {
    return id >= 0 ? vks_gguf_add_u32(w, key, (uint32_t)id) : VKS_OK;
}

static int gguf_specials(const vks_tokenizer *t, vks_gguf_writer *w) {
    int rc = gguf_id(w, "tokenizer.ggml.bos_token_id", t->bos);
    if (rc == VKS_OK) rc = gguf_id(w, "tokenizer.ggml.eos_token_id", t->eos);
    if (rc == VKS_OK) rc = gguf_id(w, "tokenizer.ggml.unknown_token_id", t->unk);
    if (rc == VKS_OK) rc = gguf_id(w, "tokenizer.ggml.padding_token_id", t->pad);
    if (rc == VKS_OK) rc = vks_gguf_add_bool(w, "tokenizer.ggml.add_bos_token", t->add_bos);
    if (rc == VKS_OK) rc = vks_gguf_add_bool(w, "tokenizer.ggml.add_eos_token", t->add_eos);
    if (rc == VKS_OK && t->kind == TOK_KIND_SPM)
        rc = vks_gguf_add_bool(w, "tokenizer.ggml.add_space_prefix", t->add_space_prefix);
    if (rc == VKS_OK && t->chat_template) rc = vks_gguf_add_str(w, "tokenizer.chat_template", t->chat_template);
    return rc;
}

int vks_tokenizer_save_gguf(const vks_tokenizer *t, vks_gguf_writer *w) {
    if (!t || !w) return vks_set_error(VKS_ERR_ARG, "vks_tokenizer_save_gguf: NULL argument");
    if (t->kind == TOK_KIND_LLAMA2C)
        return vks_set_error(VKS_ERR_ARG, "tokenizer writer: a llama2.c tokenizer.bin is embedded from its file "
                                          "(convert --tokenizer)");
    const char *pre = t->kind == TOK_KIND_BPE ? vks_tok_pretok_name(t) : NULL;
    if (t->kind == TOK_KIND_BPE && !pre)
        return vks_set_error(VKS_ERR_ARG, "tokenizer writer: the pre-tokenizer regex has no GGUF name (known: gpt-2, "
                                          "llama-bpe, qwen2)");
    int rc = check_pieces_have_no_nul(t);
    if (rc == VKS_OK) rc = vks_gguf_add_str(w, "tokenizer.ggml.model", t->kind == TOK_KIND_SPM ? "llama" : "gpt2");
    if (rc == VKS_OK && pre) rc = vks_gguf_add_str(w, "tokenizer.ggml.pre", pre);
    if (rc == VKS_OK) rc = gguf_vocab(t, w);
    if (rc == VKS_OK && t->kind == TOK_KIND_BPE) rc = gguf_merges(t, w);
    if (rc == VKS_OK) rc = gguf_specials(t, w);
    return rc;
}

/* ---- tokenizer.json ---- */

/* Sets o[key] = v, taking the reference to v; false when v is NULL (jansson
 * refused a string that is not UTF-8, or out of memory). */
static bool put(json_t *o, const char *key, json_t *v) { return v && json_object_set_new(o, key, v) == 0; }
static bool append(json_t *a, json_t *v) { return v && json_array_append_new(a, v) == 0; }

static json_t *piece_string(const vks_tokenizer *t, int id) { return json_stringn(piece(t, id), (size_t)t->len[id]); }

static bool is_added(const vks_tokenizer *t, int id) {
    uint8_t ty = t->type[id];
    return ty == VKS_TOKEN_TYPE_CONTROL || ty == VKS_TOKEN_TYPE_USER_DEFINED || ty == VKS_TOKEN_TYPE_UNKNOWN;
}

static int not_utf8(const char *name, int id) {
    return vks_set_error(VKS_ERR_ARG, "%s: token %d is not valid UTF-8 (tokenizer.json cannot hold it)", name, id);
}

static int json_added_tokens(const vks_tokenizer *t, const char *name, json_t *root) {
    json_t *added = json_array();
    if (!put(root, "added_tokens", added)) return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", name);
    for (int i = 0; i < t->vocab_size; i++) {
        if (!is_added(t, i) || t->len[i] == 0) continue;
        json_t *e = json_object();
        if (!append(added, e)) return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", name);
        bool ok = put(e, "id", json_integer(i)) && put(e, "content", piece_string(t, i)) &&
                  put(e, "single_word", json_false()) && put(e, "lstrip", json_false()) &&
                  put(e, "rstrip", json_false()) && put(e, "normalized", json_false()) &&
                  put(e, "special", json_boolean(t->type[i] != VKS_TOKEN_TYPE_USER_DEFINED));
        if (!ok) return not_utf8(name, i);
    }
    return VKS_OK;
}

static json_t *byte_level(bool use_regex) {
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1,
                     "use_regex", use_regex);
}

/* GPT-2's regex is ByteLevel's own; any other goes in a Split before it. */
static json_t *pre_tokenizer(const vks_tokenizer *t) {
    if (!strcmp(t->pre_pattern, vks_tok_gpt2_pattern())) return byte_level(true);
    json_t *split = json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "Regex", t->pre_pattern,
                              "behavior", "Isolated", "invert", 0);
    return json_pack("{s:s, s:[o, o]}", "type", "Sequence", "pretokenizers", split, byte_level(false));
}

/* BOS (and EOS) around every sequence, as Llama 3's tokenizer.json says it. */
static json_t *post_processor(const vks_tokenizer *t) {
    bool bos = t->add_bos && t->bos >= 0, eos = t->add_eos && t->eos >= 0;
    if (!bos && !eos) return json_null();
    json_t *single = json_array(), *pair = json_array(), *specials = json_object();
    const int32_t ids[2] = {bos ? t->bos : -1, eos ? t->eos : -1};
    for (int k = 0; k < 2; k++) {
        if (k == 1) {
            append(single, json_pack("{s:{s:s, s:i}}", "Sequence", "id", "A", "type_id", 0));
            append(pair, json_pack("{s:{s:s, s:i}}", "Sequence", "id", "A", "type_id", 0));
            append(pair, json_pack("{s:{s:s, s:i}}", "Sequence", "id", "B", "type_id", 1));
        }
        if (ids[k] < 0) continue;
        json_t *text = piece_string(t, ids[k]);
        append(single, json_pack("{s:{s:O, s:i}}", "SpecialToken", "id", text, "type_id", 0));
        append(pair, json_pack("{s:{s:O, s:i}}", "SpecialToken", "id", text, "type_id", 0));
        json_object_set_new(specials, json_string_value(text),
                            json_pack("{s:O, s:[i], s:[O]}", "id", text, "ids", ids[k], "tokens", text));
        json_decref(text);
    }
    return json_pack("{s:s, s:o, s:o, s:o}", "type", "TemplateProcessing", "single", single, "pair", pair,
                     "special_tokens", specials);
}

static int json_model(const vks_tokenizer *t, const char *name, json_t *root) {
    json_t *model = json_pack("{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b}", "type", "BPE", "dropout", "unk_token",
                              "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0, "byte_fallback", 0,
                              "ignore_merges", t->ignore_merges);
    json_t *vocab = json_object(), *merges = json_array();
    if (!put(root, "model", model) || !put(model, "vocab", vocab) || !put(model, "merges", merges))
        return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", name);
    for (int i = 0; i < t->vocab_size; i++) {
        if (is_added(t, i) || t->len[i] == 0) continue; /* empty: an id nobody names */
        char *key = strndup(piece(t, i), (size_t)t->len[i]);
        if (!key) return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", name);
        bool dup = json_object_get(vocab, key) != NULL, ok = !dup && put(vocab, key, json_integer(i));
        free(key);
        if (dup) return vks_set_error(VKS_ERR_ARG, "%s: token %d repeats an earlier piece", name, i);
        if (!ok || strlen(piece(t, i)) != (size_t)t->len[i]) return not_utf8(name, i);
    }
    merge_entry *m = NULL;
    size_t n = 0;
    int rc = merges_by_rank(t, &m, &n);
    for (size_t i = 0; rc == VKS_OK && i < n; i++) /* [left, right]: pieces may hold spaces */
        if (!append(merges, json_pack("[o, o]", piece_string(t, m[i].left), piece_string(t, m[i].right))))
            rc = vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", name);
    free(m);
    return rc;
}

static json_t *tokenizer_json(const vks_tokenizer *t, const char *name, int *rc) {
    json_t *root = json_pack("{s:s, s:n, s:n}", "version", "1.0", "truncation", "padding");
    *rc = root ? json_added_tokens(t, name, root) : vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", name);
    if (*rc == VKS_OK && !(put(root, "normalizer", json_null()) && put(root, "pre_tokenizer", pre_tokenizer(t)) &&
                           put(root, "post_processor", post_processor(t)) &&
                           put(root, "decoder", byte_level(true))))
        *rc = vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", name);
    if (*rc == VKS_OK) *rc = json_model(t, name, root);
    return root;
}

static bool put_token(const vks_tokenizer *t, json_t *cfg, const char *key, int32_t id) {
    return id < 0 || put(cfg, key, piece_string(t, id));
}

static json_t *config_json(const vks_tokenizer *t, const char *name, int *rc) {
    json_t *cfg = json_pack("{s:b, s:b, s:s}", "add_bos_token", t->add_bos, "add_eos_token", t->add_eos,
                            "tokenizer_class", "PreTrainedTokenizerFast");
    bool ok = cfg && put_token(t, cfg, "bos_token", t->bos) && put_token(t, cfg, "eos_token", t->eos) &&
              put_token(t, cfg, "pad_token", t->pad) && put_token(t, cfg, "unk_token", t->unk) &&
              (!t->chat_template || put(cfg, "chat_template", json_string(t->chat_template)));
    *rc = ok ? VKS_OK : vks_set_error(VKS_ERR_ARG, "%s: a special token or the chat template is not UTF-8", name);
    return cfg;
}

static int dump(json_t *root, FILE *f, const char *name) {
    if (json_dumpf(root, f, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0 || fputc('\n', f) == EOF)
        return vks_set_error(VKS_ERR_IO, "%s: write failed", name);
    return VKS_OK;
}

int vks_tokenizer_save_hf(const vks_tokenizer *t, FILE *tok, const char *tok_name, FILE *cfg, const char *cfg_name) {
    if (!t || !tok || !tok_name || !cfg || !cfg_name)
        return vks_set_error(VKS_ERR_ARG, "vks_tokenizer_save_hf: NULL argument");
    if (t->kind != TOK_KIND_BPE)
        return vks_set_error(VKS_ERR_ARG, "%s: only byte-level BPE tokenizers are written as tokenizer.json (this "
                             "one is %s)", tok_name, vks_tokenizer_kind(t));
    int rc = VKS_OK;
    json_t *root = tokenizer_json(t, tok_name, &rc);
    json_t *conf = rc == VKS_OK ? config_json(t, cfg_name, &rc) : NULL;
    if (rc == VKS_OK) rc = dump(root, tok, tok_name);
    if (rc == VKS_OK) rc = dump(conf, cfg, cfg_name);
    json_decref(root);
    json_decref(conf);
    return rc;
}

/* ---- tokenizer.gguf and tokenizer.bin: the files beside a model directory's weights ---- */

/* The GGUF vocabulary alone (no tensors), as vks_tokenizer_load_gguf reads it. */
static int save_gguf_vocab(const vks_tokenizer *t, FILE *f, const char *name) {
    vks_gguf_writer *w = NULL;
    int rc = vks_gguf_writer_create(&w);
    if (rc == VKS_OK) rc = vks_tokenizer_save_gguf(t, w);
    if (rc == VKS_OK) rc = vks_gguf_writer_write_stream(w, f, name);
    vks_gguf_writer_free(w);
    return rc;
}

static bool put_le32(FILE *f, uint32_t v) {
    unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16), (unsigned char)(v >> 24)};
    return fwrite(b, 1, 4, f) == 4;
}

/* llama2.c's tokenizer.bin as the loader read it: the same bytes back. */
static int save_llama2c(const vks_tokenizer *t, FILE *f, const char *name) {
    bool ok = put_le32(f, (uint32_t)t->max_token_length);
    for (int i = 0; ok && i < t->vocab_size; i++) {
        uint32_t score;
        memcpy(&score, &t->score[i], 4);
        ok = put_le32(f, score) && put_le32(f, (uint32_t)t->len[i]) &&
             fwrite(piece(t, i), 1, (size_t)t->len[i], f) == (size_t)t->len[i];
    }
    return ok ? VKS_OK : vks_set_error(VKS_ERR_IO, "%s: write failed", name);
}

int vks_tokenizer_dir_files(const vks_tokenizer *t, const char *names[2]) {
    names[0] = names[1] = NULL;
    if (!t) return 0;
    if (t->kind == TOK_KIND_BPE) {
        names[0] = VKS_TOKENIZER_JSON;
        names[1] = VKS_TOKENIZER_CONFIG_JSON;
        return 2;
    }
    names[0] = t->kind == TOK_KIND_SPM ? VKS_TOKENIZER_GGUF : VKS_TOKENIZER_BIN;
    return 1;
}

int vks_tokenizer_save_dir_files(const vks_tokenizer *t, FILE *const f[2], const char *const names[2]) {
    if (!t || !f || !names || !f[0] || !names[0])
        return vks_set_error(VKS_ERR_ARG, "vks_tokenizer_save_dir_files: NULL argument");
    if (t->kind == TOK_KIND_BPE) {
        if (!f[1] || !names[1]) return vks_set_error(VKS_ERR_ARG, "vks_tokenizer_save_dir_files: no config file");
        return vks_tokenizer_save_hf(t, f[0], names[0], f[1], names[1]);
    }
    return t->kind == TOK_KIND_SPM ? save_gguf_vocab(t, f[0], names[0]) : save_llama2c(t, f[0], names[0]);
}

int vks_tokenizer_check_dir_files(const vks_tokenizer *t) {
    if (!t) return vks_set_error(VKS_ERR_ARG, "vks_tokenizer_check_dir_files: NULL argument");
    const char *names[2];
    int n = vks_tokenizer_dir_files(t, names);
    FILE *f[2] = {fopen("/dev/null", "w"), n > 1 ? fopen("/dev/null", "w") : NULL};
    int rc = f[0] && (n < 2 || f[1]) ? vks_tokenizer_save_dir_files(t, f, names)
                                     : vks_set_error(VKS_ERR_IO, "/dev/null: cannot open");
    for (int i = 0; i < 2; i++)
        if (f[i]) fclose(f[i]);
    return rc;
}
