/* engine.c: an engine is the forward over a layer range on one device.
 * create() checks the options and that everything fits, uploads the weights
 * (engine_weights.c), allocates the KV cache and the activations; the forward
 * is recorded in engine_forward.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine_internal.h"
#include "vkswarm/vks_quant.h"

/* Bytes of one layer's K (or V) cache; UINT64_MAX when that overflows. */
static uint64_t kv_bytes_of(const vks_engine *e, int n_slots, int kv_len) {
    size_t b = e->opt.kv_f16 ? 2 : 4;
    if (!vks_mul_size(b, (size_t)n_slots, &b) || !vks_mul_size(b, (size_t)kv_len, &b) ||
        !vks_mul_size(b, (size_t)e->cfg.kv_dim, &b))
        return UINT64_MAX;
    return b;
}

static uint64_t kv_bytes_per_layer(const vks_engine *e) { return kv_bytes_of(e, e->opt.n_slots, e->opt.kv_len); }

/* The f16 cache's split-attention scratch (0 with the f32 cache). */
static uint64_t att_part_bytes(const vks_engine *e, int kv_len) {
    const vks_model_config *c = &e->cfg;
    return e->opt.kv_f16 ? vks_op_attention_f16_scratch_bytes((uint32_t)e->opt.max_rows, (uint32_t)c->n_heads,
                                                              (uint32_t)c->head_dim, (uint32_t)kv_len)
                         : 0;
}

/* vks_op_sample_split's scratch for up to VKS_SAMPLE_SPREAD_MAX_ROWS output rows (0 when the one-workgroup
 * sampler serves every batch on any device; VKS_SAMPLE_ROW_SCRATCH uints, 12 KiB, a row). */
static uint64_t sample_scratch_bytes(const vks_engine *e) {
    uint32_t O = (uint32_t)e->opt.max_out_rows < VKS_SAMPLE_SPREAD_MAX_ROWS ? (uint32_t)e->opt.max_out_rows
                                                                            : VKS_SAMPLE_SPREAD_MAX_ROWS;
    return vks_op_sample_scratch_bytes(O, vks_op_sample_groups(NULL, O, (uint32_t)e->cfg.vocab_size));
}

static uint64_t activation_bytes(const vks_engine *e) {
    const vks_model_config *c = &e->cfg;
    uint64_t R = (uint64_t)e->opt.max_rows, O = (uint64_t)e->opt.max_out_rows;
    uint64_t qd = (uint64_t)c->n_heads * c->head_dim;
    uint64_t rope_table = (uint64_t)e->opt.kv_len * (uint64_t)c->head_dim * 4;
    return rope_table + att_part_bytes(e, e->opt.kv_len) + sample_scratch_bytes(e) +
           R * 4 * (2 * (uint64_t)c->dim + 2 * qd + 2 * (uint64_t)c->kv_dim + 2 * (uint64_t)c->hidden_dim + 3) +
           O * 4 * ((uint64_t)c->dim + (uint64_t)c->vocab_size + 2) + O * sizeof(vks_gpu_sample_row);
}

static int new_buffer(vks_engine *e, uint64_t bytes, const char *what, vks_buffer **out) {
    if (bytes > vks_gpu_info(e->gpu)->max_storage_range)
        return vks_set_error(VKS_ERR_NOMEM, "%s needs %llu bytes in one binding; the device allows %llu "
                             "(lower the batch or context)", what, (unsigned long long)bytes,
                             (unsigned long long)vks_gpu_info(e->gpu)->max_storage_range);
    return vks_buffer_create(e->gpu, (size_t)bytes, out);
}

static int create_layer_kv(vks_engine *e, dev_layer_kv *l) {
    uint64_t kv = kv_bytes_per_layer(e);
    int rc = new_buffer(e, kv, "the KV cache of one layer", &l->kcache);
    if (rc == VKS_OK) rc = new_buffer(e, kv, "the KV cache of one layer", &l->vcache);
    return rc;
}

static void free_layer_kv(dev_layer_kv *l) {
    vks_buffer_destroy(l->kcache);
    vks_buffer_destroy(l->vcache);
    l->kcache = l->vcache = NULL;
}

static int create_activations(vks_engine *e) {
    const vks_model_config *c = &e->cfg;
    dev_activations *a = &e->act;
    uint64_t R = (uint64_t)e->opt.max_rows, O = (uint64_t)e->opt.max_out_rows;
    uint64_t qd = (uint64_t)c->n_heads * c->head_dim;
    struct { vks_buffer **b; uint64_t bytes; const char *what; } list[] = {
        {&a->x, R * c->dim * 4, "activations"}, {&a->xb, R * c->dim * 4, "activations"},
        {&a->q, R * qd * 4, "queries"}, {&a->att, R * qd * 4, "attention output"},
        {&a->k, R * c->kv_dim * 4, "keys"}, {&a->v, R * c->kv_dim * 4, "values"},
        {&a->hb, R * c->hidden_dim * 4, "FFN activations"}, {&a->hb2, R * c->hidden_dim * 4, "FFN activations"},
        {&a->tokens, R * 4, "tokens"}, {&a->slot, R * 4, "slots"}, {&a->pos, R * 4, "positions"},
        {&a->out_rows, O * 4, "output rows"}, {&a->xo, O * c->dim * 4, "output hidden rows"},
        {&a->logits, O * c->vocab_size * 4, "logits"}, {&a->sample, O * sizeof(vks_gpu_sample_row), "sampler"},
        {&a->sampled, O * 4, "sampled tokens"}, {&a->logp, O * 4, "sampled tokens' log-probabilities"},
    };
    for (size_t i = 0; i < sizeof list / sizeof list[0]; i++) {
        int rc = new_buffer(e, list[i].bytes, list[i].what, list[i].b);
        if (rc) return rc;
    }
    if (e->opt.kv_f16) {
        int rc = new_buffer(e, att_part_bytes(e, e->opt.kv_len), "the split attention's partials", &a->att_part);
        if (rc) return rc;
    }
    if (sample_scratch_bytes(e)) {
        int rc = new_buffer(e, sample_scratch_bytes(e), "the sampler's partial histograms", &a->sample_scratch);
        if (rc) return rc;
    }
    return vks_rope_table_upload(e->gpu, c, e->opt.kv_len, &a->rope_table); /* positions < kv_len; resize remakes it */
}

static void free_activations(dev_activations *a) {
    vks_buffer **all = (vks_buffer **)a;
    for (size_t i = 0; i < sizeof *a / sizeof(vks_buffer *); i++) vks_buffer_destroy(all[i]);
}

static int check_options(vks_engine *e, const vks_model *m, const vks_engine_options *opt) {
    e->opt = *opt;
    vks_engine_options *o = &e->opt;
    if (o->layer_begin == 0 && o->layer_end == 0) o->layer_end = m->cfg.n_layers;
    if (o->max_rows <= 0) o->max_rows = 256;
    if (o->max_out_rows <= 0) o->max_out_rows = o->max_rows;
    if (o->n_slots <= 0) o->n_slots = 1;
    if (o->kv_len <= 0) o->kv_len = m->cfg.seq_len;
    if (o->layer_begin < 0 || o->layer_end > m->cfg.n_layers || o->layer_begin >= o->layer_end)
        return vks_set_error(VKS_ERR_ARG, "layer range [%d, %d) is not inside the model's %d layers", o->layer_begin,
                             o->layer_end, m->cfg.n_layers);
    if (o->max_rows > 65536 || o->max_out_rows > o->max_rows || o->n_slots > 65536 || o->kv_len > m->cfg.seq_len ||
        (unsigned)o->dtype >= VKS_DTYPE_COUNT)
        return vks_set_error(VKS_ERR_ARG, "engine options out of range (rows %d, out rows %d, slots %d, kv_len %d)",
                             o->max_rows, o->max_out_rows, o->n_slots, o->kv_len);
    if (!o->keep_file_dtype && !vks_op_weight_bytes(o->dtype, 1, vks_dtype_block_elems(o->dtype)))
        return vks_set_error(VKS_ERR_ARG, "engine: weights cannot be stored as %s on the device (f32, f16, bf16, "
                             "q8_0, q4_0 or q4_k)", vks_dtype_name(o->dtype));
    if (o->kv_f16 && m->cfg.head_dim % 4)
        return vks_set_error(VKS_ERR_ARG, "engine: an f16 KV cache needs head_dim a multiple of 4 (the model has %d)",
                             m->cfg.head_dim);
    return VKS_OK;
}

static int check_fits(vks_engine *e, const vks_model *m) {
    uint64_t weights = vks_param_set_bytes_needed(&e->opt, m);
    uint64_t need = weights + 2 * kv_bytes_per_layer(e) * (uint64_t)(e->opt.layer_end - e->opt.layer_begin) +
                    activation_bytes(e);
    uint64_t avail = vks_gpu_free_bytes(e->gpu);
    if (need > avail)
        return vks_set_error(VKS_ERR_NOMEM, "model does not fit on %s: needs %llu bytes of device memory "
                             "(weights %llu, KV cache and activations %llu), %llu available",
                             vks_gpu_info(e->gpu)->name, (unsigned long long)need,
                             (unsigned long long)weights, (unsigned long long)(need - weights),
                             (unsigned long long)avail);
    return VKS_OK;
}

int vks_engine_create(vks_gpu *g, const vks_model *m, const vks_engine_options *opt, vks_engine **out) {
    if (!g || !m || !opt || !out) return vks_set_error(VKS_ERR_ARG, "vks_engine_create: NULL argument");
    *out = NULL;
    vks_engine *e = calloc(1, sizeof *e);
    if (!e) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    e->gpu = g;
    e->cfg = m->cfg;
    uint64_t before = vks_gpu_free_bytes(g);
    int rc = check_options(e, m, opt);
    if (rc) goto fail;
    if ((rc = check_fits(e, m)) || (rc = vks_ops_create(g, &e->ops))) goto fail;
    if (e->opt.f32_math) vks_ops_set_f16_math(e->ops, false);
    if (e->opt.kv_f16 && !vks_ops_kv_f16_supported(e->ops)) {
        rc = vks_set_error(VKS_ERR_GPU, "%s cannot hold an f16 KV cache (its kernels need subgroup arithmetic and "
                           "shuffle); use the f32 cache", vks_gpu_info(g)->name);
        goto fail;
    }
    if ((rc = vks_param_set_upload(g, m, &e->opt, &e->w))) goto fail;
    e->weight_bytes = before - vks_gpu_free_bytes(g);
    e->kv = calloc((size_t)e->w.n_layers, sizeof *e->kv);
    if (!e->kv) { rc = vks_set_error(VKS_ERR_NOMEM, "out of host memory"); goto fail; }
    for (int i = 0; i < e->w.n_layers; i++)
        if ((rc = create_layer_kv(e, &e->kv[i]))) goto fail;
    if ((rc = create_activations(e)) || (rc = vks_engine_host_buffers_create(e))) goto fail;
    e->device_bytes = before - vks_gpu_free_bytes(g);
    *out = e;
    return VKS_OK;
fail:
    vks_engine_destroy(e);
    return rc;
}

void vks_engine_destroy(vks_engine *e) {
    if (!e) return;
    vks_engine_host_buffers_free(e); /* the recordings first: they bind the buffers below */
    vks_engine_lora_free(e);
    for (int i = 0; e->kv && i < e->w.n_layers; i++) free_layer_kv(&e->kv[i]);
    free(e->kv);
    vks_param_set_free(&e->w);
    free_activations(&e->act);
    for (int i = 0; i < e->n_tap_bufs; i++) vks_buffer_destroy(e->tap_bufs[i]);
    free(e->tap_bufs);
    vks_ops_destroy(e->ops);
    free(e);
}

uint64_t vks_engine_device_bytes(const vks_engine *e) { return e ? e->device_bytes : 0; }
uint64_t vks_engine_weight_bytes(const vks_engine *e) { return e ? e->weight_bytes : 0; }
uint64_t vks_engine_decode_weight_bytes(const vks_engine *e) {
    if (!e) return 0;
    bool shared = e->w.has_head && e->cfg.shared_classifier;
    return e->weight_bytes - (shared ? 0 : e->w.embed_bytes);
}
const vks_model_config *vks_engine_config(const vks_engine *e) { return e ? &e->cfg : NULL; }
bool vks_engine_has_embed(const vks_engine *e) { return e && e->w.has_embed; }
bool vks_engine_has_head(const vks_engine *e) { return e && e->w.has_head; }
int vks_engine_max_rows(const vks_engine *e) { return e ? e->opt.max_rows : 0; }
int vks_engine_max_out_rows(const vks_engine *e) { return e ? e->opt.max_out_rows : 0; }
int vks_engine_n_slots(const vks_engine *e) { return e ? e->opt.n_slots : 0; }
int vks_engine_kv_len(const vks_engine *e) { return e ? e->opt.kv_len : 0; }
bool vks_engine_kv_f16(const vks_engine *e) { return e && e->opt.kv_f16; }

/* ---------- KV cache shape ---------- */

int vks_engine_kv_fits(const vks_engine *e, int n_slots, int kv_len) {
    if (!e || n_slots < 1 || n_slots > 65536 || kv_len < 1 || kv_len > e->cfg.seq_len)
        return vks_set_error(VKS_ERR_ARG, "KV cache of %d slots x %d positions: outside 1..65536 x 1..%d", n_slots,
                             kv_len, e ? e->cfg.seq_len : 0);
    uint64_t layers = (uint64_t)(e->opt.layer_end - e->opt.layer_begin);
    uint64_t per_layer = kv_bytes_of(e, n_slots, kv_len), range = vks_gpu_info(e->gpu)->max_storage_range;
    uint64_t avail = vks_gpu_free_bytes(e->gpu) + 2 * layers * kv_bytes_per_layer(e) + att_part_bytes(e, e->opt.kv_len);
    uint64_t part = att_part_bytes(e, kv_len); /* the split attention's partials follow kv_len */
    if (part > range)
        return vks_set_error(VKS_ERR_NOMEM, "the split attention of %d rows over %d positions needs %llu bytes in one "
                             "binding; the device allows %llu", e->opt.max_rows, kv_len, (unsigned long long)part,
                             (unsigned long long)range);
    if (per_layer > range)
        return vks_set_error(VKS_ERR_NOMEM, "a KV cache of %d x %d positions needs %llu bytes per layer in one "
                             "binding; the device allows %llu", n_slots, kv_len, (unsigned long long)per_layer,
                             (unsigned long long)range);
    if (2 * layers * per_layer + part > avail)
        return vks_set_error(VKS_ERR_NOMEM, "a KV cache of %d x %d positions needs %llu bytes of device memory, "
                             "%llu available", n_slots, kv_len, (unsigned long long)(2 * layers * per_layer + part),
                             (unsigned long long)avail);
    return VKS_OK;
}

int vks_engine_resize_kv(vks_engine *e, int n_slots, int kv_len) {
    int rc = vks_engine_kv_fits(e, n_slots, kv_len);
    if (rc) return rc;
    int n = e->w.n_layers;
    uint64_t before = vks_gpu_free_bytes(e->gpu);
    vks_engine_drop_recordings(e); /* they bind the old cache */
    for (int i = 0; i < n; i++) free_layer_kv(&e->kv[i]);
    e->opt.n_slots = n_slots;
    e->opt.kv_len = kv_len;
    for (int i = 0; i < n && rc == VKS_OK; i++) rc = create_layer_kv(e, &e->kv[i]);
    vks_buffer_destroy(e->act.rope_table); /* positions < kv_len */
    e->act.rope_table = NULL;
    if (rc == VKS_OK) rc = vks_rope_table_upload(e->gpu, &e->cfg, kv_len, &e->act.rope_table);
    vks_buffer_destroy(e->act.att_part); /* sized by kv_len's splits */
    e->act.att_part = NULL;
    if (rc == VKS_OK && e->opt.kv_f16)
        rc = new_buffer(e, att_part_bytes(e, kv_len), "the split attention's partials", &e->act.att_part);
    if (rc) { /* no KV cache: every forward is refused until a resize succeeds */
        for (int i = 0; i < n; i++) free_layer_kv(&e->kv[i]);
        e->opt.n_slots = e->opt.kv_len = 0;
    }
    e->device_bytes += before - vks_gpu_free_bytes(e->gpu); /* modulo 2^64: right when the cache shrank too */
    return rc;
}


/* ---------- measuring a stage for pipeline placement ---------- */
int vks_engine_measure_stage(vks_gpu *g, const vks_model *m, const vks_engine_options *opt, int rows,
                             vks_stage_measure *out) {
    if (!g || !m || !opt || !out || rows < 1) return vks_set_error(VKS_ERR_ARG, "vks_engine_measure_stage: bad argument");
    *out = (vks_stage_measure){.seconds_per_layer = 1.0, .free_bytes = vks_gpu_free_bytes(g)};
    vks_engine_options eo = {.layer_begin = 0, .layer_end = 1, .max_rows = rows, .max_out_rows = 1, .kv_len = 8,
                             .dtype = opt->dtype, .keep_file_dtype = opt->keep_file_dtype};
    vks_engine *e;
    int rc = vks_engine_create(g, m, &eo, &e);
    if (rc) return rc;
    int n = rows < 8 ? rows : 8;
    int32_t *tok = calloc((size_t)rows, 4);
    uint32_t *slot = calloc((size_t)rows, 4), *pos = calloc((size_t)rows, 4);
    float *x = malloc(sizeof(float) * (size_t)rows * (size_t)m->cfg.dim);
    if (!tok || !slot || !pos || !x) rc = vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    for (int i = 0; rc == VKS_OK && i < n; i++) pos[i] = (uint32_t)i;
    vks_forward_batch b = {.n_rows = n, .tokens = tok, .slot = slot, .pos = pos, .x_out = x};
    if (rc == VKS_OK) rc = vks_engine_forward(e, &b); /* warm-up */
    double t0 = vks_seconds_now();
    for (int r = 0; r < 3 && rc == VKS_OK; r++) rc = vks_engine_forward(e, &b);
    if (rc == VKS_OK) out->seconds_per_layer = (vks_seconds_now() - t0) / 3;
    free(tok);
    free(slot);
    free(pos);
    free(x);
    vks_engine_destroy(e);
    return rc;
}
