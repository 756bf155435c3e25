/* hf_config.c: Hugging Face config.json for LlamaForCausalLM and
 * Qwen2ForCausalLM (read with jansson; every field type- and range-checked). */
#include "vkswarm/vks_safetensors.h"
#include "model/model_internal.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CONFIG_BYTES (1 << 20)

/* Integer field in 1..INT32_MAX; absent is an error unless a default is given (def >= 0). */
static int get_int(json_t *root, const char *name, const char *key, int def, int *out) {
    json_t *v = json_object_get(root, key);
    if (!v && def >= 0) {
        *out = def;
        return VKS_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > INT32_MAX)
        return vks_set_error(VKS_ERR_FORMAT, "%s: '%s' must be a positive integer", name, key);
    *out = (int)json_integer_value(v);
    return VKS_OK;
}

static int get_float(json_t *root, const char *name, const char *key, float def, float *out) {
    json_t *v = json_object_get(root, key);
    if (!v) {
        *out = def;
        return VKS_OK;
    }
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return vks_set_error(VKS_ERR_FORMAT, "%s: '%s' must be a finite number", name, key);
    *out = (float)json_number_value(v);
    return VKS_OK;
}

/* bos/eos: an integer >= 0, or a list (first entry), or null/absent (-1). */
static int get_token_id(json_t *root, const char *name, const char *key, int *out) {
    json_t *v = json_object_get(root, key);
    *out = -1;
    if (json_is_array(v)) v = json_array_get(v, 0);
    if (!v || json_is_null(v)) return VKS_OK;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
        return vks_set_error(VKS_ERR_FORMAT, "%s: '%s' must be a token id", name, key);
    *out = (int)json_integer_value(v);
    return VKS_OK;
}

static int get_arch(json_t *root, const char *name, vks_hf_config *c) {
    json_t *archs = json_object_get(root, "architectures"), *mt = json_object_get(root, "model_type");
    const char *a = json_is_array(archs) ? json_string_value(json_array_get(archs, 0)) : NULL;
    const char *t = json_string_value(mt);
    const vks_arch *arch = vks_arch_find_hf(a, t);
    if (!arch) {
        char names[512];
        vks_arch_list(names, sizeof names, true);
        return vks_set_error(VKS_ERR_FORMAT, "%s: unsupported architecture '%.40s' (need one of: %s)", name,
                             a ? a : t ? t : "(none)", names);
    }
    snprintf(c->arch, sizeof c->arch, "%s", arch->name);
    c->cfg.qk_norm = arch->qk_norm;
    json_t *hd = json_object_get(root, "head_dim");
    if (hd && !json_is_null(hd)) {
        int head_dim = 0;
        int rc = get_int(root, name, "head_dim", -1, &head_dim);
        if (rc != VKS_OK) return rc;
        c->cfg.head_dim = head_dim; /* the model's own (Qwen3), else hidden_size / heads below */
    }
    return VKS_OK;
}

static int get_bool(json_t *root, const char *name, const char *key, bool def, bool *out) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return VKS_OK;
    }
    if (!json_is_boolean(v)) return vks_set_error(VKS_ERR_FORMAT, "%s: '%s' must be true or false", name, key);
    *out = json_is_true(v);
    return VKS_OK;
}

/* hidden_act: the engine computes SiLU only ("silu", or its other name "swish"; absent means silu). */
static int check_activation(json_t *root, const char *name) {
    json_t *v = json_object_get(root, "hidden_act");
    if (!v || json_is_null(v)) return VKS_OK;
    const char *act = json_string_value(v);
    if (!act) return vks_set_error(VKS_ERR_FORMAT, "%s: 'hidden_act' must be a string", name);
    if (strcmp(act, "silu") == 0 || strcmp(act, "swish") == 0) return VKS_OK;
    return vks_set_error(VKS_ERR_FORMAT, "%s: activation hidden_act '%.40s' is not supported (only silu)", name, act);
}

/* rope_scaling: null, absent or of type "default" (no scaling), or "llama3"
 * (Llama 3.1/3.2) with its four numbers; other types are refused by name. */
static int read_rope_scaling(json_t *root, const char *name, vks_rope_scaling *s) {
    json_t *rs = json_object_get(root, "rope_scaling");
    if (!rs || json_is_null(rs)) return VKS_OK;
    if (!json_is_object(rs)) return vks_set_error(VKS_ERR_FORMAT, "%s: 'rope_scaling' must be an object or null", name);
    json_t *ty = json_object_get(rs, "rope_type");
    if (!ty) ty = json_object_get(rs, "type");
    const char *type = json_string_value(ty);
    if (type && strcmp(type, "default") == 0) return VKS_OK;
    if (!type || strcmp(type, "llama3") != 0)
        return vks_set_error(VKS_ERR_FORMAT, "%s: rope_scaling type '%.40s' is not supported (default or llama3)", name,
                             type ? type : "(none given)");
    s->type = VKS_ROPE_SCALING_LLAMA3;
    int rc = get_float(rs, name, "factor", -1.0f, &s->factor);
    if (rc == VKS_OK) rc = get_float(rs, name, "low_freq_factor", -1.0f, &s->low_freq_factor);
    if (rc == VKS_OK) rc = get_float(rs, name, "high_freq_factor", -1.0f, &s->high_freq_factor);
    if (rc == VKS_OK) rc = get_int(rs, name, "original_max_position_embeddings", -1, &s->original_context);
    return rc; /* ranges: vks_model_config_check */
}

/* Mistral-style sliding-window attention: a window shorter than the context
 * is refused by name (attention here sees the whole context). Qwen2/Qwen3
 * configs carry sliding_window with use_sliding_window false. */
static int check_sliding_window(json_t *root, const char *name, int context) {
    json_t *sw = json_object_get(root, "sliding_window"), *use = json_object_get(root, "use_sliding_window");
    if (!sw || json_is_null(sw) || json_is_false(use)) return VKS_OK;
    if (!json_is_integer(sw)) return vks_set_error(VKS_ERR_FORMAT, "%s: 'sliding_window' must be an integer or null", name);
    if (json_integer_value(sw) >= context) return VKS_OK;
    return vks_set_error(VKS_ERR_FORMAT, "%s: sliding_window %lld is shorter than the context %d: sliding-window "
                         "attention (Mistral) is not supported", name, (long long)json_integer_value(sw), context);
}

static int parse_fields(json_t *root, const char *name, vks_hf_config *c) {
    vks_model_config *m = &c->cfg;
    int rc = get_arch(root, name, c);
    if (rc == VKS_OK) rc = get_int(root, name, "hidden_size", -1, &m->dim);
    if (rc == VKS_OK) rc = get_int(root, name, "intermediate_size", -1, &m->hidden_dim);
    if (rc == VKS_OK) rc = get_int(root, name, "num_hidden_layers", -1, &m->n_layers);
    if (rc == VKS_OK) rc = get_int(root, name, "num_attention_heads", -1, &m->n_heads);
    if (rc == VKS_OK) rc = get_int(root, name, "num_key_value_heads", m->n_heads, &m->n_kv_heads);
    if (rc == VKS_OK) rc = get_int(root, name, "vocab_size", -1, &m->vocab_size);
    if (rc == VKS_OK) rc = get_int(root, name, "max_position_embeddings", 2048, &m->seq_len);
    if (rc == VKS_OK) rc = get_float(root, name, "rms_norm_eps", 1e-6f, &m->norm_eps);
    if (rc == VKS_OK) rc = get_float(root, name, "rope_theta", 10000.0f, &m->rope_theta);
    if (rc == VKS_OK) rc = get_bool(root, name, "tie_word_embeddings", false, &m->shared_classifier);
    bool bias = rc == VKS_OK && vks_arch_find(c->arch)->bias;
    if (rc == VKS_OK) rc = get_bool(root, name, "attention_bias", bias, &c->attention_bias);
    if (rc == VKS_OK) rc = get_token_id(root, name, "bos_token_id", &c->bos_id);
    if (rc == VKS_OK) rc = get_token_id(root, name, "eos_token_id", &c->eos_id);
    if (rc != VKS_OK) return rc;
    if ((rc = check_activation(root, name)) != VKS_OK || (rc = read_rope_scaling(root, name, &m->rope_scaling)) != VKS_OK ||
        (rc = check_sliding_window(root, name, m->seq_len)) != VKS_OK)
        return rc;
    if (m->head_dim == 0 && m->dim % m->n_heads != 0)
        return vks_set_error(VKS_ERR_FORMAT, "%s: n_heads %d does not divide hidden_size %d (and no head_dim is given)",
                             name, m->n_heads, m->dim);
    if (m->head_dim == 0) m->head_dim = m->dim / m->n_heads;
    m->kv_dim = m->n_kv_heads <= m->n_heads ? m->n_kv_heads * m->head_dim : 0;
    m->rope_mode = VKS_ROPE_HALF;
    return vks_model_config_check(m, name);
}

int vks_hf_config_parse(const char *json, size_t len, const char *name, vks_hf_config *out) {
    if (!json || !out) return vks_set_error(VKS_ERR_ARG, "vks_hf_config_parse: NULL argument");
    if (!name) name = "config.json";
    memset(out, 0, sizeof *out);
    out->bos_id = out->eos_id = -1;
    if (len > MAX_CONFIG_BYTES) return vks_set_error(VKS_ERR_FORMAT, "%s: larger than 1 MiB", name);
    json_error_t err;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &err);
    if (!root) return vks_set_error(VKS_ERR_FORMAT, "%s: bad JSON: %s (at byte %d)", name, err.text, err.position);
    int rc = json_is_object(root) ? parse_fields(root, name, out)
                                   : vks_set_error(VKS_ERR_FORMAT, "%s: not a JSON object", name);
    json_decref(root);
    return rc;
}

int vks_hf_config_load(const char *path, vks_hf_config *out) {
    if (!path || !out) return vks_set_error(VKS_ERR_ARG, "vks_hf_config_load: NULL argument");
    FILE *f = NULL;
    int rc = vks_fopen_regular(path, &f);
    if (rc) return rc;
    char *buf = malloc(MAX_CONFIG_BYTES + 1);
    size_t len = buf ? fread(buf, 1, MAX_CONFIG_BYTES + 1, f) : 0;
    fclose(f);
    if (!buf) return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", path);
    rc = vks_hf_config_parse(buf, len, path, out);
    free(buf);
    return rc;
}

int vks_hf_config_write_stream(FILE *f, const char *path, const vks_hf_config *c, vks_dtype torch_dtype) {
    if (!f || !path || !c) return vks_set_error(VKS_ERR_ARG, "vks_hf_config_write_stream: NULL argument");
    const vks_model_config *m = &c->cfg;
    const vks_arch *arch = vks_arch_find(c->arch);
    if (!arch) return vks_set_error(VKS_ERR_ARG, "%s: cannot write architecture '%s'", path, c->arch);
    json_t *root = json_pack("{s:[s],s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:f,s:f,s:b,s:s,s:s}", "architectures",
                             arch->hf_class, "model_type", arch->name,
                             "hidden_size", m->dim, "intermediate_size", m->hidden_dim, "num_hidden_layers", m->n_layers,
                             "num_attention_heads", m->n_heads, "num_key_value_heads", m->n_kv_heads, "vocab_size",
                             m->vocab_size, "max_position_embeddings", m->seq_len, "rms_norm_eps", (double)m->norm_eps,
                             "rope_theta", (double)m->rope_theta, "tie_word_embeddings", m->shared_classifier,
                             "hidden_act", arch->activation, "torch_dtype",
                             torch_dtype == VKS_DTYPE_F16 ? "float16" : torch_dtype == VKS_DTYPE_BF16 ? "bfloat16" : "float32");
    if (!root) return vks_set_error(VKS_ERR_NOMEM, "%s: cannot build JSON", path);
    if (c->bos_id >= 0) json_object_set_new(root, "bos_token_id", json_integer(c->bos_id));
    if (c->eos_id >= 0) json_object_set_new(root, "eos_token_id", json_integer(c->eos_id));
    if (m->n_heads * m->head_dim != m->dim) json_object_set_new(root, "head_dim", json_integer(m->head_dim));
    const vks_rope_scaling *rs = &m->rope_scaling;
    if (rs->type == VKS_ROPE_SCALING_LLAMA3)
        json_object_set_new(root, "rope_scaling",
                            json_pack("{s:s,s:f,s:f,s:f,s:i}", "rope_type", "llama3", "factor", (double)rs->factor,
                                      "low_freq_factor", (double)rs->low_freq_factor, "high_freq_factor",
                                      (double)rs->high_freq_factor, "original_max_position_embeddings",
                                      rs->original_context));
    if (c->attention_bias != arch->bias) json_object_set_new(root, "attention_bias", json_boolean(c->attention_bias));
    bool ok = json_dumpf(root, f, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(9)) == 0;
    int e = errno;
    json_decref(root);
    return ok ? VKS_OK : vks_set_error(VKS_ERR_IO, "%s: write failed: %s", path, strerror(e ? e : EIO));
}

int vks_hf_config_save(const char *path, const vks_hf_config *c, vks_dtype torch_dtype) {
    if (!path || !c) return vks_set_error(VKS_ERR_ARG, "vks_hf_config_save: NULL argument");
    vks_outfile o;
    int rc = vks_outfile_open(&o, path, 0666);
    if (rc == VKS_OK) rc = vks_hf_config_write_stream(o.f, path, c, torch_dtype);
    if (rc == VKS_OK) return vks_outfile_commit(&o);
    vks_outfile_abort(&o);
    return rc;
}
