/* tokenizer_load.c: tokenizers from GGUF metadata, Hugging Face
 * tokenizer.json (+ tokenizer_config.json), and the auto-detecting loader. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tokenizer_internal.h"
#include "vkswarm/vks_gguf.h"

/* ---- GGUF ---- */

typedef struct {
    const char **pieces, **merges;
    size_t *lens, *merge_lens;
    float *scores;
    uint8_t *types;
    int32_t *raw_types;
} gguf_arrays;

static void free_arrays(gguf_arrays *a) {
    free(a->pieces);
    free(a->merges);
    free(a->lens);
    free(a->merge_lens);
    free(a->scores);
    free(a->types);
    free(a->raw_types);
}

static bool has_key(const vks_gguf *g, const char *key) { return vks_gguf_find_key(g, key) >= 0; }

/* A vks_gguf getter failed: its message already names the file and the key. */
static int gguf_failed(void) { return VKS_ERR_FORMAT; }

/* A string array's elements; *n is its length (checked against limit). */
static int string_array(const vks_gguf *g, const char *name, const char *key, uint64_t limit, const char ***out,
                        size_t **lens, uint64_t *n) {
    vks_gguf_type et;
    int rc = vks_gguf_get_arr_info(g, key, &et, n);
    if (rc != VKS_OK) return gguf_failed();
    if (et != VKS_GGUF_STRING) return vks_set_error(VKS_ERR_FORMAT, "%s: %s is not a string array", name, key);
    if (*n > limit) return vks_set_error(VKS_ERR_FORMAT, "%s: %s has %llu entries (limit %llu)", name, key,
                                         (unsigned long long)*n, (unsigned long long)limit);
    *out = malloc((*n ? *n : 1) * sizeof **out);
    *lens = malloc((*n ? *n : 1) * sizeof **lens);
    if (!*out || !*lens) return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory for %s", name, key);
    for (uint64_t i = 0; i < *n; i++) {
        rc = vks_gguf_get_arr_str(g, key, i, &(*out)[i], &(*lens)[i]);
        if (rc != VKS_OK) return gguf_failed();
    }
    return VKS_OK;
}

/* Optional numeric arrays of length n: scores and token types. */
static int optional_arrays(const vks_gguf *g, const char *name, uint64_t n, gguf_arrays *a) {
    vks_gguf_type et;
    uint64_t len;
    if (has_key(g, "tokenizer.ggml.scores")) {
        if (vks_gguf_get_arr_info(g, "tokenizer.ggml.scores", &et, &len) || len != n)
            return vks_set_error(VKS_ERR_FORMAT, "%s: tokenizer.ggml.scores is not an array of %llu numbers", name,
                                 (unsigned long long)n);
        a->scores = malloc(n * sizeof *a->scores);
        if (!a->scores) return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", name);
        if (vks_gguf_get_arr_f32(g, "tokenizer.ggml.scores", a->scores, n))
            return gguf_failed();
    }
    if (has_key(g, "tokenizer.ggml.token_type")) {
        if (vks_gguf_get_arr_info(g, "tokenizer.ggml.token_type", &et, &len) || len != n)
            return vks_set_error(VKS_ERR_FORMAT, "%s: tokenizer.ggml.token_type is not an array of %llu integers",
                                 name, (unsigned long long)n);
        a->raw_types = malloc(n * sizeof *a->raw_types);
        a->types = malloc(n);
        if (!a->raw_types || !a->types) return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", name);
        if (vks_gguf_get_arr_i32(g, "tokenizer.ggml.token_type", a->raw_types, n))
            return gguf_failed();
        for (uint64_t i = 0; i < n; i++) {
            if (a->raw_types[i] < 0 || a->raw_types[i] > VKS_TOKEN_TYPE_BYTE)
                return vks_set_error(VKS_ERR_FORMAT, "%s: token %llu has unknown type %d", name,
                                     (unsigned long long)i, a->raw_types[i]);
            a->types[i] = (uint8_t)a->raw_types[i];
        }
    }
    return VKS_OK;
}

/* Optional token id: *id keeps its default when the key is absent. */
static int optional_id(const vks_gguf *g, const char *name, const char *key, int n, int32_t *id) {
    if (!has_key(g, key)) {
        if (*id >= n) *id = -1;
        return VKS_OK;
    }
    uint32_t v;
    if (vks_gguf_get_u32(g, key, &v)) return gguf_failed();
    if (v >= (uint32_t)n)
        return vks_set_error(VKS_ERR_FORMAT, "%s: %s = %u outside the %d-token vocabulary", name, key, v, n);
    *id = (int32_t)v;
    return VKS_OK;
}

static int optional_bool(const vks_gguf *g, const char *key, bool *v) {
    if (!has_key(g, key)) return VKS_OK;
    if (vks_gguf_get_bool(g, key, v)) return gguf_failed();
    return VKS_OK;
}

static int optional_str(const vks_gguf *g, const char *name, const char *key, const char **v) {
    if (!has_key(g, key)) return VKS_OK;
    size_t len;
    if (vks_gguf_get_str(g, key, v, &len)) return gguf_failed();
    if (strlen(*v) != len) return vks_set_error(VKS_ERR_FORMAT, "%s: %s contains a NUL byte", name, key);
    return VKS_OK;
}

static int gguf_kind(const vks_gguf *g, const char *name, tok_kind *kind) {
    const char *model = NULL;
    if (!has_key(g, "tokenizer.ggml.model"))
        return vks_set_error(VKS_ERR_FORMAT, "%s: no tokenizer (tokenizer.ggml.model is missing)", name);
    int rc = optional_str(g, name, "tokenizer.ggml.model", &model);
    if (rc != VKS_OK) return rc;
    if (!strcmp(model, "llama")) *kind = TOK_KIND_SPM;
    else if (!strcmp(model, "gpt2")) *kind = TOK_KIND_BPE;
    else
        return vks_set_error(VKS_ERR_FORMAT, "%s: unsupported tokenizer.ggml.model '%s' (llama and gpt2 are)", name,
                             model);
    return VKS_OK;
}

static int gguf_specials(const vks_gguf *g, const char *name, tok_vocab_spec *s) {
    bool spm = s->kind == TOK_KIND_SPM;
    s->bos = spm ? 1 : -1;
    s->eos = spm ? 2 : -1;
    s->unk = spm ? 0 : -1;
    s->pad = -1;
    s->add_bos = spm;
    s->add_space_prefix = spm;
    int rc = optional_id(g, name, "tokenizer.ggml.bos_token_id", s->n, &s->bos);
    if (rc == VKS_OK) rc = optional_id(g, name, "tokenizer.ggml.eos_token_id", s->n, &s->eos);
    if (rc == VKS_OK) rc = optional_id(g, name, "tokenizer.ggml.unknown_token_id", s->n, &s->unk);
    if (rc == VKS_OK) rc = optional_id(g, name, "tokenizer.ggml.padding_token_id", s->n, &s->pad);
    if (rc == VKS_OK) rc = optional_bool(g, "tokenizer.ggml.add_bos_token", &s->add_bos);
    if (rc == VKS_OK) rc = optional_bool(g, "tokenizer.ggml.add_eos_token", &s->add_eos);
    if (rc == VKS_OK) rc = optional_bool(g, "tokenizer.ggml.add_space_prefix", &s->add_space_prefix);
    if (rc == VKS_OK) rc = optional_str(g, name, "tokenizer.ggml.pre", &s->pre_name);
    if (rc == VKS_OK) rc = optional_str(g, name, "tokenizer.chat_template", &s->chat_template);
    return rc;
}

/* llama.cpp's default SPM unk is id 0: only a fallback when token 0 is an
 * UNKNOWN token (else bytes without a byte token would silently become
 * whatever token 0 is). */
static void check_default_unk(const vks_gguf *g, const uint8_t *types, tok_vocab_spec *s) {
    bool declared = has_key(g, "tokenizer.ggml.unknown_token_id");
    if (s->kind == TOK_KIND_SPM && !declared && s->unk == 0 && (!types || types[0] != VKS_TOKEN_TYPE_UNKNOWN))
        s->unk = -1;
}

int vks_tokenizer_load_gguf_handle(const struct vks_gguf *g, const char *name, vks_tokenizer **out) {
    if (!g || !out) return vks_set_error(VKS_ERR_ARG, "vks_tokenizer_load_gguf_handle: NULL argument");
    *out = NULL;
    if (!name) name = "gguf";
    tok_vocab_spec s = {.source = name};
    gguf_arrays a = {0};
    uint64_t n = 0, n_merges = 0;
    int rc = gguf_kind(g, name, &s.kind);
    if (rc == VKS_OK) rc = string_array(g, name, "tokenizer.ggml.tokens", TOK_MAX_VOCAB, &a.pieces, &a.lens, &n);
    if (rc == VKS_OK && n == 0) rc = vks_set_error(VKS_ERR_FORMAT, "%s: tokenizer.ggml.tokens is empty", name);
    s.n = (int)n;
    if (rc == VKS_OK) rc = optional_arrays(g, name, n, &a);
    if (rc == VKS_OK && s.kind == TOK_KIND_BPE)
        rc = string_array(g, name, "tokenizer.ggml.merges", TOK_MAX_MERGES, &a.merges, &a.merge_lens, &n_merges);
    if (rc == VKS_OK) rc = gguf_specials(g, name, &s);
    if (rc == VKS_OK) check_default_unk(g, a.types, &s);
    if (rc == VKS_OK) {
        s.pieces = a.pieces;
        s.lens = a.lens;
        s.scores = a.scores;
        s.types = a.types;
        s.merges = a.merges;
        s.merge_lens = a.merge_lens;
        s.n_merges = (size_t)n_merges;
        rc = vks_tok_build(&s, out);
    }
    free_arrays(&a);
    return rc;
}

int vks_tokenizer_load_gguf(const char *path, vks_tokenizer **out) {
    if (!path || !out) return vks_set_error(VKS_ERR_ARG, "vks_tokenizer_load_gguf: NULL argument");
    *out = NULL;
    vks_gguf *g = NULL;
    int rc = vks_gguf_open(path, &g);
    if (rc != VKS_OK) return rc;
    rc = vks_tokenizer_load_gguf_handle(g, path, out);
    vks_gguf_close(g);
    return rc;
}

/* ---- tokenizer.json ---- */

typedef struct {
    const char **pieces;
    size_t *lens;
    uint8_t *types;
    char **merges;
    size_t *merge_lens, n_merges;
} json_vocab;

static void free_json_vocab(json_vocab *v) {
    free(v->pieces);
    free(v->lens);
    free(v->types);
    for (size_t i = 0; v->merges && i < v->n_merges; i++) free(v->merges[i]);
    free(v->merges);
    free(v->merge_lens);
}

/* Vocabulary size: one past the largest id in model.vocab and added_tokens. */
static int json_vocab_size(const char *path, json_t *vocab, json_t *added, int *n) {
    json_int_t max = -1;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= TOK_MAX_VOCAB)
            return vks_set_error(VKS_ERR_FORMAT, "%s: model.vocab entry has a bad id (need 0..%d)", path,
                                 TOK_MAX_VOCAB - 1);
        if (json_integer_value(val) > max) max = json_integer_value(val);
    }
    size_t i;
    json_array_foreach(added, i, val) {
        json_t *id = json_object_get(val, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= TOK_MAX_VOCAB ||
            !json_is_string(json_object_get(val, "content")))
            return vks_set_error(VKS_ERR_FORMAT, "%s: added_tokens[%zu] needs an id in 0..%d and a content string",
                                 path, i, TOK_MAX_VOCAB - 1);
        if (json_integer_value(id) > max) max = json_integer_value(id);
    }
    if (max < 0) return vks_set_error(VKS_ERR_FORMAT, "%s: empty vocabulary", path);
    *n = (int)max + 1;
    return VKS_OK;
}

static int json_pieces(const char *path, json_t *vocab, json_t *added, int n, json_vocab *v) {
    v->pieces = calloc((size_t)n, sizeof *v->pieces);
    v->lens = calloc((size_t)n, sizeof *v->lens);
    v->types = malloc((size_t)n);
    if (!v->pieces || !v->lens || !v->types) return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", path);
    memset(v->types, VKS_TOKEN_TYPE_UNUSED, (size_t)n); /* ids nobody names stay empty and unused */
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        json_int_t id = json_integer_value(val);
        v->pieces[id] = key;
        v->lens[id] = strlen(key); /* jansson object keys are NUL-terminated */
        v->types[id] = VKS_TOKEN_TYPE_NORMAL;
    }
    size_t i;
    json_array_foreach(added, i, val) {
        json_int_t id = json_integer_value(json_object_get(val, "id"));
        json_t *content = json_object_get(val, "content");
        v->pieces[id] = json_string_value(content);
        v->lens[id] = json_string_length(content);
        v->types[id] = json_is_true(json_object_get(val, "special")) ? VKS_TOKEN_TYPE_CONTROL
                                                                     : VKS_TOKEN_TYPE_USER_DEFINED;
    }
    for (int k = 0; k < n; k++)
        if (!v->pieces[k]) v->pieces[k] = "";
    return VKS_OK;
}

/* merges: ["a b", ...] or [["a", "b"], ...] */
static int json_merges(const char *path, json_t *merges, json_vocab *v) {
    if (!merges) return VKS_OK;
    if (!json_is_array(merges)) return vks_set_error(VKS_ERR_FORMAT, "%s: model.merges is not an array", path);
    size_t n = json_array_size(merges);
    if (n > TOK_MAX_MERGES) return vks_set_error(VKS_ERR_FORMAT, "%s: %zu merges (limit %d)", path, n, TOK_MAX_MERGES);
    v->merges = calloc(n ? n : 1, sizeof *v->merges);
    v->merge_lens = calloc(n ? n : 1, sizeof *v->merge_lens);
    if (!v->merges || !v->merge_lens) return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", path);
    v->n_merges = n;
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(merges, i);
        const char *a, *b = NULL;
        size_t la, lb = 0;
        if (json_is_string(m)) {
            a = json_string_value(m);
            la = json_string_length(m);
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            la = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            lb = json_string_length(json_array_get(m, 1));
        } else {
            return vks_set_error(VKS_ERR_FORMAT, "%s: model.merges[%zu] is not \"a b\" or [a, b]", path, i);
        }
        size_t total = la + (b ? lb + 1 : 0);
        v->merges[i] = malloc(total + 1);
        if (!v->merges[i]) return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", path);
        memcpy(v->merges[i], a, la);
        if (b) {
            v->merges[i][la] = ' ';
            memcpy(v->merges[i] + la + 1, b, lb);
        }
        v->merges[i][total] = '\0';
        v->merge_lens[i] = total;
    }
    return VKS_OK;
}

static const char GPT2_REGEX_MARK[] = "gpt2";

/* Finds the pre-tokenizer regex: a Split with a Regex pattern, else a
 * ByteLevel with use_regex (GPT-2's). Sets *byte_level when a ByteLevel is seen. */
static void scan_pre(json_t *node, const char **pattern, bool *byte_level) {
    if (!json_is_object(node)) return;
    const char *type = json_string_value(json_object_get(node, "type"));
    if (!type) return;
    if (!strcmp(type, "Sequence")) {
        size_t i;
        json_t *child;
        json_array_foreach(json_object_get(node, "pretokenizers"), i, child) scan_pre(child, pattern, byte_level);
    } else if (!strcmp(type, "Split") && !*pattern) {
        *pattern = json_string_value(json_object_get(json_object_get(node, "pattern"), "Regex"));
    } else if (!strcmp(type, "ByteLevel")) {
        *byte_level = true;
        json_t *use = json_object_get(node, "use_regex");
        if (!*pattern && (!use || json_is_true(use))) *pattern = GPT2_REGEX_MARK;
    }
}

/* BOS from a TemplateProcessing post-processor that starts with a special token. */
static void scan_post(json_t *node, tok_vocab_spec *s, const json_vocab *v) {
    if (!json_is_object(node)) return;
    const char *type = json_string_value(json_object_get(node, "type"));
    if (!type) return;
    if (!strcmp(type, "Sequence")) {
        size_t i;
        json_t *child;
        json_array_foreach(json_object_get(node, "processors"), i, child) scan_post(child, s, v);
    } else if (!strcmp(type, "TemplateProcessing")) {
        json_t *first = json_array_get(json_object_get(node, "single"), 0);
        const char *tok = json_string_value(json_object_get(json_object_get(first, "SpecialToken"), "id"));
        int32_t id = -1;
        for (int i = 0; tok && i < s->n && id < 0; i++)
            if (v->lens[i] == strlen(tok) && !memcmp(v->pieces[i], tok, v->lens[i])) id = i;
        if (id >= 0) {
            s->bos = id;
            s->add_bos = true;
        }
    }
}

static int32_t find_piece(const tok_vocab_spec *s, const char *text) {
    size_t n = strlen(text);
    for (int i = 0; i < s->n; i++)
        if (s->lens[i] == n && !memcmp(s->pieces[i], text, n)) return i;
    return -1;
}

/* bos_token / eos_token: "text" or {"content": "text"}. */
static int32_t config_token(json_t *cfg, const char *key, const tok_vocab_spec *s) {
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? find_piece(s, json_string_value(v)) : -1;
}

/* tokenizer_config.json beside tokenizer.json: special tokens, flags, chat
 * template (cfg_path gets the file's path: the template's, in messages). */
static json_t *read_config(const char *path, tok_vocab_spec *s, char cfg_path[4096]) {
    const char *slash = strrchr(path, '/');
    int dir_len = slash ? (int)(slash - path) : 1;
    snprintf(cfg_path, 4096, "%.*s/tokenizer_config.json", dir_len, slash ? path : ".");
    FILE *f = NULL;
    json_t *cfg = vks_fopen_regular(cfg_path, &f) ? NULL : json_loadf(f, JSON_DECODE_ANY, NULL); /* optional */
    if (f) fclose(f);
    if (!json_is_object(cfg)) {
        json_decref(cfg);
        return NULL;
    }
    int32_t id = config_token(cfg, "bos_token", s);
    if (id >= 0) s->bos = id;
    if ((id = config_token(cfg, "eos_token", s)) >= 0) s->eos = id;
    if ((id = config_token(cfg, "unk_token", s)) >= 0) s->unk = id;
    if ((id = config_token(cfg, "pad_token", s)) >= 0) s->pad = id;
    json_t *b = json_object_get(cfg, "add_bos_token");
    if (json_is_boolean(b)) s->add_bos = json_is_true(b);
    if (json_is_boolean(b = json_object_get(cfg, "add_eos_token"))) s->add_eos = json_is_true(b);
    json_t *tmpl = json_object_get(cfg, "chat_template");
    if (json_is_string(tmpl)) s->chat_template = json_string_value(tmpl);
    size_t i;
    json_t *entry;
    json_array_foreach(tmpl, i, entry) { /* [{"name": "default", "template": "..."}] */
        const char *name = json_string_value(json_object_get(entry, "name"));
        if (name && !strcmp(name, "default")) s->chat_template = json_string_value(json_object_get(entry, "template"));
    }
    s->chat_template_file = cfg_path;
    return cfg;
}

static int json_spec(const char *path, json_t *root, json_vocab *v, tok_vocab_spec *s) {
    json_t *model = json_object_get(root, "model");
    const char *type = json_string_value(json_object_get(model, "type"));
    json_t *vocab = json_object_get(model, "vocab"), *added = json_object_get(root, "added_tokens");
    if (!json_is_object(model) || (type && strcmp(type, "BPE")) || !json_is_object(vocab))
        return vks_set_error(VKS_ERR_FORMAT, "%s: only BPE models with a vocab object are supported (model.type %s)",
                             path, type ? type : "missing");
    if (json_is_true(json_object_get(model, "byte_fallback")))
        return vks_set_error(VKS_ERR_FORMAT, "%s: SentencePiece-style BPE (byte_fallback) is not supported here; use "
                             "the model's GGUF", path);
    if (added && !json_is_array(added)) return vks_set_error(VKS_ERR_FORMAT, "%s: added_tokens is not an array", path);
    bool byte_level = false;
    const char *pattern = NULL;
    scan_pre(json_object_get(root, "pre_tokenizer"), &pattern, &byte_level);
    if (!byte_level || !pattern)
        return vks_set_error(VKS_ERR_FORMAT, "%s: no byte-level pre-tokenizer with a regex (only byte-level BPE is "
                             "supported)", path);
    int rc = json_vocab_size(path, vocab, added, &s->n);
    if (rc == VKS_OK) rc = json_pieces(path, vocab, added, s->n, v);
    if (rc == VKS_OK) rc = json_merges(path, json_object_get(model, "merges"), v);
    if (rc != VKS_OK) return rc;
    s->source = path;
    s->kind = TOK_KIND_BPE;
    s->pieces = v->pieces;
    s->lens = v->lens;
    s->types = v->types;
    s->merges = (const char *const *)v->merges;
    s->merge_lens = v->merge_lens;
    s->n_merges = v->n_merges;
    s->pre_pattern = pattern == GPT2_REGEX_MARK ? NULL : pattern;
    s->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    s->bos = s->eos = s->unk = s->pad = -1;
    scan_post(json_object_get(root, "post_processor"), s, v);
    const char *eos_names[] = {"<|endoftext|>", "<|end_of_text|>", "</s>"};
    for (int k = 0; k < 3 && s->eos < 0; k++) s->eos = find_piece(s, eos_names[k]);
    return VKS_OK;
}

/* json_load_file of a regular file (a FIFO does not block), but a UTF-8 byte
 * order mark (some editors write one) is skipped. NULL: *rc says why (the
 * message is set), or 0 and err holds jansson's. */
static json_t *load_json_skipping_bom(const char *path, json_error_t *err, int *rc) {
    FILE *f = NULL;
    if ((*rc = vks_fopen_regular(path, &f))) return NULL;
    unsigned char bom[3];
    if (fread(bom, 1, 3, f) != 3 || memcmp(bom, "\xef\xbb\xbf", 3) != 0) rewind(f);
    json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES, err);
    fclose(f);
    return root;
}

int vks_tokenizer_load_hf_json(const char *path, vks_tokenizer **out) {
    if (!path || !out) return vks_set_error(VKS_ERR_ARG, "vks_tokenizer_load_hf_json: NULL argument");
    *out = NULL;
    json_error_t err;
    int rc = VKS_OK;
    json_t *root = load_json_skipping_bom(path, &err, &rc);
    if (rc) return rc;
    if (!root) return vks_set_error(VKS_ERR_FORMAT, "%s: JSON error at line %d: %s", path, err.line, err.text);
    json_vocab v = {0};
    tok_vocab_spec s = {0};
    json_t *cfg = NULL;
    char cfg_path[4096];
    rc = json_is_object(root) ? json_spec(path, root, &v, &s)
                              : vks_set_error(VKS_ERR_FORMAT, "%s: not a JSON object", path);
    if (rc == VKS_OK) {
        cfg = read_config(path, &s, cfg_path);
        rc = vks_tok_build(&s, out);
    }
    json_decref(cfg);
    free_json_vocab(&v);
    json_decref(root);
    return rc;
}

/* ---- auto ---- */

static bool is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* What a tokenizer file holds, from its name and first bytes: 'g' GGUF, 'j'
 * JSON (a *.json name, or '{' or '[' after a byte order mark and whitespace),
 * 'b' anything else (a llama2.c tokenizer.bin). An empty file is an error. */
static int sniff(const char *path, char *kind) {
    FILE *f = NULL;
    int rc = vks_fopen_regular(path, &f);
    if (rc) return rc;
    unsigned char head[64];
    size_t n = fread(head, 1, sizeof head, f);
    fclose(f);
    if (n == 0) return vks_set_error(VKS_ERR_FORMAT, "%s: empty file, not a tokenizer", path);
    *kind = ends_with(path, ".json") ? 'j' : 'b';
    if (n >= 4 && !memcmp(head, "GGUF", 4)) *kind = 'g';
    size_t i = n >= 3 && !memcmp(head, "\xef\xbb\xbf", 3) ? 3 : 0;
    for (; i < n && *kind == 'b'; i++) {
        if (head[i] == '{' || head[i] == '[') *kind = 'j';
        if (head[i] != ' ' && head[i] != '\n' && head[i] != '\r' && head[i] != '\t') break;
    }
    return VKS_OK;
}

/* A model directory's tokenizer: the first of tokenizer.json, tokenizer.gguf
 * and tokenizer.bin (vks_tokenizer.h) that is present. */
static int load_dir(const char *dir, const vks_tokenizer_source *m, vks_tokenizer **out) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s/" VKS_TOKENIZER_JSON, dir);
    if (is_file(buf)) return vks_tokenizer_load_hf_json(buf, out);
    snprintf(buf, sizeof buf, "%s/" VKS_TOKENIZER_GGUF, dir);
    if (is_file(buf)) return vks_tokenizer_load_gguf(buf, out);
    snprintf(buf, sizeof buf, "%s/" VKS_TOKENIZER_BIN, dir);
    if (is_file(buf)) {
        if (!m) return vks_set_error(VKS_ERR_ARG, "%s: a llama2.c tokenizer.bin needs the model's vocab size", buf);
        return vks_tokenizer_load_llama2c(buf, m->vocab_size, out);
    }
    return vks_set_error(VKS_ERR_ARG, "%s: no " VKS_TOKENIZER_JSON ", " VKS_TOKENIZER_GGUF " or " VKS_TOKENIZER_BIN
                         " in the directory; give --tokenizer", dir);
}

static int load_path(const char *path, const vks_tokenizer_source *m, vks_tokenizer **out) {
    if (is_dir(path)) return load_dir(path, m, out);
    char kind = 'b';
    int rc = sniff(path, &kind);
    if (rc != VKS_OK) return rc;
    if (kind == 'g') return vks_tokenizer_load_gguf(path, out);
    if (kind == 'j') return vks_tokenizer_load_hf_json(path, out);
    if (!m)
        return vks_set_error(VKS_ERR_ARG, "%s: neither GGUF nor JSON; read as a llama2.c tokenizer.bin it needs the "
                             "model's vocab size", path);
    return vks_tokenizer_load_llama2c(path, m->vocab_size, out);
}

static int load_from_model(const vks_tokenizer_source *m, vks_tokenizer **out) {
    if (m->gguf) return vks_tokenizer_load_gguf_handle(m->gguf, m->name, out);
    if (m->dir && m->dir[0]) return load_dir(m->dir, m, out);
    return vks_set_error(VKS_ERR_ARG, "%s: the model carries no tokenizer; give --tokenizer", m->name);
}

int vks_tokenizer_load_for(const char *path, const vks_tokenizer_source *m, vks_tokenizer **out) {
    if (!out || (!path && !m)) return vks_set_error(VKS_ERR_ARG, "vks_tokenizer_load_auto: no tokenizer or model");
    *out = NULL;
    int rc = path ? load_path(path, m, out) : load_from_model(m, out);
    if (rc != VKS_OK || !m) return rc;
    if (vks_tokenizer_vocab_size(*out) > m->vocab_size) {
        rc = vks_set_error(VKS_ERR_FORMAT, "%s: tokenizer has %d tokens but the model only %d", path ? path : m->name,
                           vks_tokenizer_vocab_size(*out), m->vocab_size);
        vks_tokenizer_free(*out);
        *out = NULL;
    }
    return rc;
}
