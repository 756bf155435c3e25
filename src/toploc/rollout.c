/* rollout.c: rollout JSONL files (see vks_rollout.h), read with jansson and
 * checked field by field as hostile input. */
#include "vkswarm/vks_rollout.h"
#include "vkswarm/vks_toploc.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

static const char format_name[] = "vkswarm-rollouts";

/* ---- field readers: each returns VKS_OK or sets a one-line error ---- */

static json_t *field(json_t *o, const char *name) {
    json_t *v = json_object_get(o, name);
    if (!v) vks_set_error(VKS_ERR_FORMAT, "missing field \"%s\"", name);
    return v;
}

static int get_int(json_t *o, const char *name, long long lo, long long hi, long long *out) {
    json_t *v = field(o, name);
    if (!v) return VKS_ERR_FORMAT;
    if (!json_is_integer(v)) return vks_set_error(VKS_ERR_FORMAT, "\"%s\" is not an integer", name);
    long long x = json_integer_value(v);
    if (x < lo || x > hi) return vks_set_error(VKS_ERR_FORMAT, "\"%s\" = %lld outside [%lld, %lld]", name, x, lo, hi);
    *out = x;
    return VKS_OK;
}

static int get_float(json_t *o, const char *name, double lo, double hi, float *out) {
    json_t *v = field(o, name);
    if (!v) return VKS_ERR_FORMAT;
    if (!json_is_number(v)) return vks_set_error(VKS_ERR_FORMAT, "\"%s\" is not a number", name);
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi) return vks_set_error(VKS_ERR_FORMAT, "\"%s\" = %g outside [%g, %g]", name, x, lo, hi);
    *out = (float)x;
    return VKS_OK;
}

/* A u64 as a JSON integer (up to 2^63-1) or a string of decimal digits. */
static int get_u64(json_t *o, const char *name, uint64_t *out) {
    json_t *v = field(o, name);
    if (!v) return VKS_ERR_FORMAT;
    if (json_is_integer(v) && json_integer_value(v) >= 0) {
        *out = (uint64_t)json_integer_value(v);
        return VKS_OK;
    }
    const char *s = json_is_string(v) ? json_string_value(v) : NULL;
    if (!s || !*s || strlen(s) > 20 || strspn(s, "0123456789") != strlen(s))
        return vks_set_error(VKS_ERR_FORMAT, "\"%s\" is not an unsigned 64-bit integer", name);
    errno = 0;
    unsigned long long x = strtoull(s, NULL, 10);
    if (errno == ERANGE) return vks_set_error(VKS_ERR_FORMAT, "\"%s\" does not fit 64 bits", name);
    *out = x;
    return VKS_OK;
}

static int get_hash(json_t *o, const char *name, uint8_t out[32]) {
    json_t *v = field(o, name);
    if (!v) return VKS_ERR_FORMAT;
    if (!json_is_string(v) || vks_hash_parse_hex(json_string_value(v), out))
        return vks_set_error(VKS_ERR_FORMAT, "\"%s\" is not 64 hex digits", name);
    return VKS_OK;
}

/* A list of token ids in [0, 2^31): at most max entries, malloc'd (>= 1 slot). */
static int get_ids(json_t *o, const char *name, int max, int32_t **ids, int *n) {
    json_t *v = field(o, name);
    if (!v) return VKS_ERR_FORMAT;
    if (!json_is_array(v)) return vks_set_error(VKS_ERR_FORMAT, "\"%s\" is not an array", name);
    size_t count = json_array_size(v);
    if (count > (size_t)max) return vks_set_error(VKS_ERR_FORMAT, "\"%s\" has %zu ids (at most %d)", name, count, max);
    *ids = malloc((count ? count : 1) * sizeof **ids);
    if (!*ids) return vks_set_error(VKS_ERR_NOMEM, "out of host memory for \"%s\"", name);
    for (size_t i = 0; i < count; i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > INT32_MAX)
            return vks_set_error(VKS_ERR_FORMAT, "\"%s\"[%zu] is not a token id", name, i);
        (*ids)[i] = (int32_t)json_integer_value(e);
    }
    *n = (int)count;
    return VKS_OK;
}

static int get_base64(json_t *o, const char *name, uint8_t **out, size_t *len) {
    json_t *v = field(o, name);
    if (!v) return VKS_ERR_FORMAT;
    if (!json_is_string(v)) return vks_set_error(VKS_ERR_FORMAT, "\"%s\" is not a base64 string", name);
    const char *s = json_string_value(v);
    size_t slen = json_string_length(v), cap = slen / 4 * 3 + 3;
    *out = malloc(cap);
    if (!*out) return vks_set_error(VKS_ERR_NOMEM, "out of host memory for \"%s\"", name);
    const char *end = NULL;
    if (sodium_base642bin(*out, cap, s, slen, NULL, len, &end, sodium_base64_VARIANT_ORIGINAL) != 0 ||
        end != s + slen)
        return vks_set_error(VKS_ERR_FORMAT, "\"%s\" is not valid base64", name);
    return VKS_OK;
}

/* One "stage_proofs" entry: rank, layer range and base64 proofs, each bounded
 * (the layers against the model and the proofs against the output are the
 * verifier's checks). */
static int stage_from_json(json_t *e, size_t i, vks_stage_proof *p) {
    if (!json_is_object(e)) return vks_set_error(VKS_ERR_FORMAT, "\"stage_proofs\"[%zu] is not an object", i);
    long long rank = 0;
    int rc = get_int(e, "rank", 0, VKS_ROLLOUT_MAX_RANK, &rank);
    if (rc) return vks_error_prefix(rc, "\"stage_proofs\"[%zu]", i);
    p->rank = (int)rank;
    json_t *l = json_object_get(e, "layers");
    if (!l || !json_is_array(l) || json_array_size(l) != 2 || !json_is_integer(json_array_get(l, 0)) ||
        !json_is_integer(json_array_get(l, 1)))
        return vks_set_error(VKS_ERR_FORMAT, "\"stage_proofs\"[%zu]: \"layers\" is not [first, end]", i);
    long long first = json_integer_value(json_array_get(l, 0)), end = json_integer_value(json_array_get(l, 1));
    if (first < 0 || end <= first || end > VKS_ROLLOUT_MAX_LAYERS)
        return vks_set_error(VKS_ERR_FORMAT, "\"stage_proofs\"[%zu]: layers [%lld, %lld) is not a range within [0, %d)", i,
                             first, end, VKS_ROLLOUT_MAX_LAYERS);
    p->layer_begin = (int)first, p->layer_end = (int)end;
    if ((rc = get_base64(e, "proofs", &p->proofs, &p->proof_bytes))) return vks_error_prefix(rc, "\"stage_proofs\"[%zu]", i);
    return VKS_OK;
}

/* The optional "stage_proofs" list (absent: none). */
static int get_stage_proofs(json_t *o, vks_rollout_sample *s) {
    json_t *v = json_object_get(o, "stage_proofs");
    if (!v) return VKS_OK;
    if (!json_is_array(v)) return vks_set_error(VKS_ERR_FORMAT, "\"stage_proofs\" is not an array");
    size_t n = json_array_size(v);
    if (n > VKS_ROLLOUT_MAX_STAGES)
        return vks_set_error(VKS_ERR_FORMAT, "\"stage_proofs\" has %zu entries (at most %d)", n, VKS_ROLLOUT_MAX_STAGES);
    if (n == 0) return VKS_OK;
    if (!(s->stage_proofs = calloc(n, sizeof *s->stage_proofs)))
        return vks_set_error(VKS_ERR_NOMEM, "out of host memory for \"stage_proofs\"");
    for (size_t i = 0; i < n; i++) {
        s->n_stage_proofs = (int)i + 1; /* freed with the sample from here on */
        int rc = stage_from_json(json_array_get(v, i), i, &s->stage_proofs[i]);
        if (rc) return rc;
    }
    return VKS_OK;
}

static json_t *parse_object(const char *line, size_t len) {
    if (!line) {
        vks_set_error(VKS_ERR_ARG, "NULL line");
        return NULL;
    }
    if (len > VKS_ROLLOUT_MAX_LINE) {
        vks_set_error(VKS_ERR_FORMAT, "line of %zu bytes (at most %d)", len, VKS_ROLLOUT_MAX_LINE);
        return NULL;
    }
    json_error_t err;
    json_t *o = json_loadb(line, len, JSON_REJECT_DUPLICATES, &err);
    if (!o) {
        vks_set_error(VKS_ERR_FORMAT, "not JSON: %s (column %d)", err.text, err.column);
        return NULL;
    }
    if (!json_is_object(o)) {
        json_decref(o);
        vks_set_error(VKS_ERR_FORMAT, "not a JSON object");
        return NULL;
    }
    return o;
}

/* ---- header ---- */

/* The optional "policy_step" (absent: *has false). */
static int get_policy(json_t *o, bool *has, int64_t *step) {
    *has = false, *step = -1;
    if (!json_object_get(o, "policy_step")) return VKS_OK;
    long long v = 0;
    int rc = get_int(o, "policy_step", 0, VKS_ROLLOUT_MAX_POLICY_STEP, &v);
    if (!rc) *has = true, *step = v;
    return rc;
}

static int header_from_json(json_t *o, vks_rollout_header *h) {
    json_t *fmt = field(o, "format");
    if (!fmt) return VKS_ERR_FORMAT;
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), format_name))
        return vks_set_error(VKS_ERR_FORMAT, "\"format\" is not \"%s\" (not a rollout file header)", format_name);
    long long version = 0;
    int rc = get_int(o, "version", 1, 1000000, &version);
    if (rc) return rc;
    if (version != VKS_ROLLOUT_VERSION)
        return vks_set_error(VKS_ERR_FORMAT, "format version %lld (this build reads %d)", version, VKS_ROLLOUT_VERSION);
    h->version = (int)version;
    json_t *name = json_object_get(o, "model");
    if (name && json_is_string(name)) snprintf(h->model, sizeof h->model, "%s", json_string_value(name));
    if ((rc = get_hash(o, "model_hash", h->model_hash))) return rc;
    int32_t *stops = NULL;
    rc = get_ids(o, "stop_ids", VKS_ROLLOUT_MAX_STOP, &stops, &h->n_stop);
    if (rc == VKS_OK) memcpy(h->stop_ids, stops, (size_t)h->n_stop * sizeof *stops);
    free(stops);
    if (rc) return rc;
    json_t *kv = json_object_get(o, "kv_type");
    if (kv && (!json_is_string(kv) || (strcmp(json_string_value(kv), "f16") && strcmp(json_string_value(kv), "f32"))))
        return vks_set_error(VKS_ERR_FORMAT, "\"kv_type\" is not \"f16\" or \"f32\"");
    h->kv_f16 = kv && !strcmp(json_string_value(kv), "f16");
    if ((rc = get_policy(o, &h->has_policy, &h->policy_step))) return rc;
    json_t *w = json_object_get(o, "policy_weights");
    if (w && (!json_is_string(w) || json_string_length(w) >= sizeof h->policy_weights ||
              strlen(json_string_value(w)) != json_string_length(w)))
        return vks_set_error(VKS_ERR_FORMAT, "\"policy_weights\" is not a string of at most %zu bytes",
                             sizeof h->policy_weights - 1);
    if (w) snprintf(h->policy_weights, sizeof h->policy_weights, "%s", json_string_value(w));
    json_t *t = json_object_get(o, "toploc");
    if (t) {
        long long rows = 0, k = 0, prime = 0;
        if (!json_is_object(t)) return vks_set_error(VKS_ERR_FORMAT, "\"toploc\" is not an object");
        if ((rc = get_int(t, "chunk_rows", 0, 1 << 20, &rows)) || (rc = get_int(t, "k", 0, 1 << 20, &k)) ||
            (rc = get_int(t, "prime", 0, 1LL << 40, &prime)))
            return rc;
        if (rows != VKS_TOPLOC_CHUNK_ROWS || k != VKS_TOPLOC_K || prime != VKS_TOPLOC_PRIME)
            return vks_set_error(VKS_ERR_FORMAT, "TOPLOC parameters %lld/%lld/%lld (this build uses %d/%d/%d)", rows,
                                 k, prime, VKS_TOPLOC_CHUNK_ROWS, VKS_TOPLOC_K, VKS_TOPLOC_PRIME);
    }
    return VKS_OK;
}

int vks_rollout_parse_header(const char *line, size_t len, vks_rollout_header *out) {
    if (!out) return vks_set_error(VKS_ERR_ARG, "NULL header");
    memset(out, 0, sizeof *out);
    json_t *o = parse_object(line, len);
    if (!o) return VKS_ERR_FORMAT;
    int rc = header_from_json(o, out);
    json_decref(o);
    return rc;
}

/* s as valid UTF-8 (JSON strings must be): each invalid byte becomes U+FFFD. */
static void valid_utf8_copy(const char *s, char *out, size_t cap) {
    size_t o = 0, len = strlen(s);
    for (size_t i = 0; i < len;) {
        size_t n = vks_utf8_decode(s + i, len - i, NULL);
        const char *piece = n ? s + i : "\xef\xbf\xbd";
        size_t plen = n ? n : 3;
        if (o + plen >= cap) break;
        memcpy(out + o, piece, plen);
        o += plen;
        i += n ? n : 1;
    }
    out[o] = '\0';
}

int vks_rollout_write_header(FILE *f, const vks_rollout_header *h) {
    if (!f || !h || h->n_stop < 0 || h->n_stop > VKS_ROLLOUT_MAX_STOP)
        return vks_set_error(VKS_ERR_ARG, "rollout header: bad arguments");
    char hex[65];
    vks_hash_hex(h->model_hash, hex);
    json_t *stops = json_array();
    for (int i = 0; i < h->n_stop; i++) json_array_append_new(stops, json_integer(h->stop_ids[i]));
    char model[3 * sizeof h->model];
    valid_utf8_copy(h->model, model, sizeof model); /* a path need not be UTF-8 */
    json_t *o = json_pack("{s:s, s:i, s:s, s:s, s:o, s:{s:i, s:i, s:i}}", "format", format_name, "version",
                          VKS_ROLLOUT_VERSION, "model", model, "model_hash", hex, "stop_ids", stops, "toploc",
                          "chunk_rows", VKS_TOPLOC_CHUNK_ROWS, "k", VKS_TOPLOC_K, "prime", VKS_TOPLOC_PRIME);
    if (o && h->kv_f16) json_object_set_new(o, "kv_type", json_string("f16"));
    if (o && h->has_policy) json_object_set_new(o, "policy_step", json_integer((json_int_t)h->policy_step));
    if (o && h->has_policy && h->policy_weights[0]) {
        char where[3 * sizeof h->policy_weights];
        valid_utf8_copy(h->policy_weights, where, sizeof where);
        json_object_set_new(o, "policy_weights", json_string(where));
    }
    int rc = o && json_dumpf(o, f, JSON_COMPACT) == 0 && fputc('\n', f) != EOF
                 ? VKS_OK : vks_set_error(VKS_ERR_IO, "cannot write the rollout header");
    json_decref(o);
    return rc;
}

/* ---- samples ---- */

static int sample_from_json(json_t *o, vks_rollout_sample *s) {
    json_t *id = field(o, "id");
    if (!id) return VKS_ERR_FORMAT;
    if (!json_is_string(id) || json_string_length(id) > VKS_ROLLOUT_MAX_ID_LEN ||
        strlen(json_string_value(id)) != json_string_length(id))
        return vks_set_error(VKS_ERR_FORMAT, "\"id\" is not a string of at most %d bytes", VKS_ROLLOUT_MAX_ID_LEN);
    if (!(s->id = strdup(json_string_value(id)))) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    long long seq = 0, top_k = 0, max_steps = 0;
    int rc;
    if ((rc = get_ids(o, "prompt_ids", VKS_ROLLOUT_MAX_IDS, &s->prompt_ids, &s->n_prompt)) ||
        (rc = get_ids(o, "output_ids", VKS_ROLLOUT_MAX_IDS, &s->output_ids, &s->n_output)) ||
        (rc = get_u64(o, "seed", &s->seed)) || (rc = get_int(o, "seq", 0, UINT32_MAX, &seq)) ||
        (rc = get_float(o, "temperature", 0.0, 1e6, &s->temperature)) ||
        (rc = get_int(o, "top_k", 0, 1 << 24, &top_k)) || (rc = get_float(o, "top_p", 0.0, 1.0, &s->top_p)) ||
        (rc = get_int(o, "max_steps", 1, VKS_ROLLOUT_MAX_IDS, &max_steps)) ||
        (rc = get_hash(o, "model_hash", s->model_hash)) ||
        (rc = get_base64(o, "proofs", &s->proofs, &s->proof_bytes)) || (rc = get_stage_proofs(o, s)) ||
        (rc = get_policy(o, &s->has_policy, &s->policy_step)))
        return rc;
    s->seq = (uint32_t)seq;
    s->top_k = (uint32_t)top_k;
    s->max_steps = (int)max_steps;
    return VKS_OK;
}

int vks_rollout_parse_sample(const char *line, size_t len, vks_rollout_sample *out) {
    if (!out) return vks_set_error(VKS_ERR_ARG, "NULL sample");
    memset(out, 0, sizeof *out);
    json_t *o = parse_object(line, len);
    if (!o) return VKS_ERR_FORMAT;
    int rc = sample_from_json(o, out);
    json_decref(o);
    if (rc) vks_rollout_sample_free(out);
    return rc;
}

static json_t *ids_json(const int32_t *ids, int n) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

static json_t *seed_json(uint64_t seed) {
    if (seed <= (uint64_t)INT64_MAX) return json_integer((json_int_t)seed);
    char buf[24];
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)seed);
    return json_string(buf);
}

static char *base64_of(const uint8_t *bytes, size_t n) {
    size_t b64_len = sodium_base64_ENCODED_LEN(n, sodium_base64_VARIANT_ORIGINAL);
    char *b64 = malloc(b64_len);
    if (b64) sodium_bin2base64(b64, b64_len, bytes ? bytes : (const uint8_t *)"", n, sodium_base64_VARIANT_ORIGINAL);
    return b64;
}

static json_t *stage_proofs_json(const vks_stage_proof *p, int n) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) {
        char *b64 = base64_of(p[i].proofs, p[i].proof_bytes);
        json_t *e = b64 ? json_pack("{s:i, s:[i,i], s:s}", "rank", p[i].rank, "layers", p[i].layer_begin,
                                    p[i].layer_end, "proofs", b64)
                        : NULL;
        free(b64);
        if (!e || json_array_append_new(a, e)) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

static bool stage_proofs_ok(const vks_rollout_sample *s) {
    if (s->n_stage_proofs < 0 || s->n_stage_proofs > VKS_ROLLOUT_MAX_STAGES || (s->n_stage_proofs && !s->stage_proofs))
        return false;
    for (int i = 0; i < s->n_stage_proofs; i++)
        if (s->stage_proofs[i].proof_bytes && !s->stage_proofs[i].proofs) return false;
    return true;
}

int vks_rollout_write_sample(FILE *f, const vks_rollout_sample *s) {
    if (!f || !s || !s->id || s->n_prompt < 0 || s->n_output < 0 || (s->proof_bytes && !s->proofs) ||
        !stage_proofs_ok(s))
        return vks_set_error(VKS_ERR_ARG, "rollout sample: bad arguments");
    char hex[65];
    vks_hash_hex(s->model_hash, hex);
    char *b64 = base64_of(s->proofs, s->proof_bytes);
    if (!b64) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    json_t *o = json_pack("{s:s, s:o, s:o, s:o, s:I, s:f, s:I, s:f, s:i, s:s, s:s}", "id", s->id, "prompt_ids",
                          ids_json(s->prompt_ids, s->n_prompt), "output_ids", ids_json(s->output_ids, s->n_output),
                          "seed", seed_json(s->seed), "seq", (json_int_t)s->seq, "temperature",
                          (double)s->temperature, "top_k", (json_int_t)s->top_k, "top_p", (double)s->top_p,
                          "max_steps", s->max_steps, "model_hash", hex, "proofs", b64);
    free(b64);
    if (o && s->has_policy) json_object_set_new(o, "policy_step", json_integer((json_int_t)s->policy_step));
    if (o && s->n_stage_proofs > 0) { /* only when there are some: files without stay as they were */
        json_t *sp = stage_proofs_json(s->stage_proofs, s->n_stage_proofs);
        if (!sp || json_object_set_new(o, "stage_proofs", sp)) {
            json_decref(o);
            o = NULL;
        }
    }
    int rc = o && json_dumpf(o, f, JSON_COMPACT | JSON_REAL_PRECISION(9)) == 0 && fputc('\n', f) != EOF
                 ? VKS_OK : vks_set_error(VKS_ERR_IO, "cannot write rollout sample \"%s\"", s->id);
    json_decref(o);
    return rc;
}

void vks_rollout_sample_free(vks_rollout_sample *s) {
    if (!s) return;
    free(s->id);
    free(s->prompt_ids);
    free(s->output_ids);
    free(s->proofs);
    vks_stage_proofs_free(s->stage_proofs, s->n_stage_proofs);
    memset(s, 0, sizeof *s);
}

void vks_stage_proofs_free(vks_stage_proof *p, int n) {
    for (int i = 0; p && i < n; i++) free(p[i].proofs);
    free(p);
}

int vks_stage_proofs_copy(const vks_stage_proof *src, int n, vks_stage_proof **out) {
    if (!out || n < 0 || (n > 0 && !src)) return vks_set_error(VKS_ERR_ARG, "vks_stage_proofs_copy: bad arguments");
    *out = NULL;
    if (n == 0) return VKS_OK;
    vks_stage_proof *p = calloc((size_t)n, sizeof *p);
    if (!p) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    for (int i = 0; i < n; i++) {
        p[i] = src[i];
        p[i].proofs = src[i].proof_bytes ? malloc(src[i].proof_bytes) : NULL;
        if (src[i].proof_bytes && !p[i].proofs) {
            vks_stage_proofs_free(p, i);
            return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
        }
        if (src[i].proof_bytes) memcpy(p[i].proofs, src[i].proofs, src[i].proof_bytes);
    }
    *out = p;
    return VKS_OK;
}

/* ---- whole files ---- */

enum { MAX_SAMPLES = 1 << 20 };

/* "name:line: <the last error>" (copied first: the error buffer is the destination). */
static int prefix_error(const char *name, int lineno) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", vks_last_error());
    return vks_set_error(VKS_ERR_FORMAT, "%s:%d: %s", name, lineno, msg);
}

static int add_sample(vks_rollout_file *f, int *cap, const char *line, size_t len, const char *name, int lineno) {
    if (f->n_samples == MAX_SAMPLES) return vks_set_error(VKS_ERR_FORMAT, "%s: more than %d samples", name, MAX_SAMPLES);
    if (f->n_samples == *cap) {
        int nc = *cap ? *cap * 2 : 64;
        vks_rollout_sample *s = realloc(f->samples, (size_t)nc * sizeof *s);
        if (!s) return vks_set_error(VKS_ERR_NOMEM, "%s: out of host memory", name);
        f->samples = s;
        *cap = nc;
    }
    if (vks_rollout_parse_sample(line, len, &f->samples[f->n_samples])) return prefix_error(name, lineno);
    f->n_samples++;
    return VKS_OK;
}

int vks_rollout_read_mem(const char *data, size_t len, const char *name, vks_rollout_file *out) {
    if (!out || (!data && len)) return vks_set_error(VKS_ERR_ARG, "vks_rollout_read_mem: bad arguments");
    memset(out, 0, sizeof *out);
    if (!name) name = "rollouts";
    int cap = 0, lineno = 0, rc = VKS_OK;
    bool have_header = false;
    for (size_t pos = 0; pos < len && rc == VKS_OK;) {
        const char *nl = memchr(data + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - data) : len, line_len = end - pos;
        const char *line = data + pos;
        pos = end + 1;
        lineno++;
        if (line_len && line[line_len - 1] == '\r') line_len--;
        if (line_len == 0) continue; /* blank lines are allowed */
        if (!have_header) {
            rc = vks_rollout_parse_header(line, line_len, &out->header);
            if (rc) rc = prefix_error(name, lineno);
            have_header = true;
        } else {
            rc = add_sample(out, &cap, line, line_len, name, lineno);
        }
    }
    if (rc == VKS_OK && !have_header) rc = vks_set_error(VKS_ERR_FORMAT, "%s: empty (no header line)", name);
    if (rc) vks_rollout_file_free(out);
    return rc;
}

int vks_rollout_read(const char *path, vks_rollout_file *out) {
    if (!path || !out) return vks_set_error(VKS_ERR_ARG, "vks_rollout_read: NULL argument");
    memset(out, 0, sizeof *out);
    char *buf = NULL;
    size_t len = 0;
    int rc = vks_file_read_all(path, (size_t)1 << 34, &buf, &len); /* 16 GiB: refuse */
    if (!rc) rc = vks_rollout_read_mem(buf, len, path, out);
    free(buf);
    return rc;
}

void vks_rollout_file_free(vks_rollout_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n_samples; i++) vks_rollout_sample_free(&f->samples[i]);
    free(f->samples);
    memset(f, 0, sizeof *f);
}
