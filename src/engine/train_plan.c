/* train_plan.c: the memory plan of a training run (vks_train.h), from the
 * shapes alone (no device). What each line counts, in device bytes:
 *  - base: rank 0 (full fine-tuning): every parameter as an f32 master (the
 *    trainer's params set); LoRA: the frozen weights as the inference engine
 *    stores them (vks_param_set_bytes_needed: matrices in their type, norms
 *    and biases f32).
 *  - adapter, gradients, optimizer: 4, 4 and 8 bytes per trainable parameter
 *    (rank 0: the trainer's grads, m and v sets; LoRA: A and B, their
 *    gradients and moments).
 *  - activations, logits, scratch: the trainer's activation store as train.c
 *    allocates it, through the same lists (vks_train_layer_buffers,
 *    vks_train_other_buffers): each layer's input (n_layers + 1 of [T, dim]),
 *    the per-layer sets (normed inputs, q, k, v, attention output and its
 *    softmax statistics, the mid residual and its norm, FFN gate, up and
 *    product: n_layers sets, one under recompute) and the final norm's output
 *    are activations; [T, vocab] logits (their gradient replaces them) and the
 *    log-probabilities are logits; the backward's activation gradients, the
 *    RMSNorm and attention backward scratch, the embedding index, the gradient
 *    norm's partial sums and the batch and GRPO rows are scratch. LoRA adds
 *    per adapter and kept layer set the [T, rank] z = scale A x that
 *    vks_op_lora_forward keeps (activations), and one [T, rank] buffer for
 *    vks_op_lora_backward (scratch).
 * Not counted: pipelines, descriptor pools, the driver's own memory. */
#include <stdio.h>
#include "engine_internal.h"
#include "train_internal.h"
#include "vkswarm/vks_lora.h"

/* Elements per gradient-norm partial sum at a 256-lane workgroup (the
 * trainer asks vks_op_grad_squares_partials on its device). */
#define PLAN_SQUARES_CHUNK (256u * 32u)

/* The model's parameters (rank 0's trained set): the schema's present
 * tensors, in every layer, as vks_ref_params and the trainer list them. */
static int64_t model_params(const vks_model_config *c, bool has_bias) {
    int64_t total = 0;
    vks_schema_item it;
    for (int i = 0; vks_schema_list_nth(c, has_bias, i, &it) == VKS_OK; i++) total += it.rows * it.cols;
    return total;
}

/* The trainer's activation store for T rows, split by kind into bytes[]. */
static void store_bytes(const vks_model_config *c, const vks_lora_config *lora, uint64_t T, bool recompute,
                        uint64_t n_partials, uint64_t bytes[3]) {
    train_layer_acts layer;
    train_acts acts;
    train_buffer list[TRAIN_OTHER_BUFFERS];
    uint64_t sets = recompute ? 1 : (uint64_t)c->n_layers;
    int n = vks_train_layer_buffers(c, lora, T, &layer, list);
    for (int i = 0; i < n; i++) bytes[list[i].kind] += sets * list[i].n * 4;
    bytes[TRAIN_BUF_ACT] += ((uint64_t)c->n_layers + 1) * T * (uint64_t)c->dim * 4; /* x_in */
    n = vks_train_other_buffers(c, lora, T, n_partials, &acts, list);
    for (int i = 0; i < n; i++) bytes[list[i].kind] += list[i].n * 4;
}

int vks_train_plan_make(const vks_model *m, const vks_train_plan_options *o, vks_train_plan *out) {
    if (!m || !o || !out) return vks_set_error(VKS_ERR_ARG, "train plan: NULL argument");
    const vks_model_config *c = &m->cfg;
    int rc = vks_model_config_check(c, "train plan");
    if (rc) return rc;
    uint32_t targets = o->lora_targets ? o->lora_targets : VKS_LORA_ALL_TARGETS;
    if (o->tokens < 1 || o->tokens > VKS_TRAIN_MAX_TOKENS)
        return vks_set_error(VKS_ERR_ARG, "train plan: %d tokens per micro-batch (1..%d)", o->tokens,
                             VKS_TRAIN_MAX_TOKENS);
    if (o->lora_rank < 0) return vks_set_error(VKS_ERR_ARG, "train plan: LoRA rank %d", o->lora_rank);
    if (o->lora_rank > 0 && (rc = vks_lora_check(c, o->lora_rank, targets, "train plan"))) return rc;
    if (o->lora_rank > 0 && o->keep_file_dtype && !m->layers)
        return vks_set_error(VKS_ERR_ARG, "train plan: file types need a model's tensors");
    const vks_arch *arch = vks_arch_find(m->arch);
    /* a shape without weights (train plan --random-model): its architecture says */
    bool lora = o->lora_rank > 0, has_bias = m->layers ? m->layers[0].bq.data != NULL : arch && arch->bias;
    vks_train_plan p = {.params = model_params(c, has_bias)};
    p.trainable = lora ? vks_lora_param_count(c, o->lora_rank, targets) : p.params;
    uint64_t tr = (uint64_t)p.trainable;
    if (lora) {
        vks_engine_options e = {.layer_end = c->n_layers, .dtype = o->base_dtype, .keep_file_dtype = o->keep_file_dtype};
        p.base = vks_param_set_bytes_needed(&e, m);
        p.adapter = tr * 4;
    } else {
        p.base = tr * 4;
    }
    p.gradients = tr * 4;
    p.optimizer = tr * 8;
    uint64_t T = (uint64_t)o->tokens, bytes[3] = {0, 0, 0};
    uint64_t n_targets = (uint64_t)__builtin_popcount(targets), layers = (uint64_t)c->n_layers;
    uint64_t tensors = lora ? 2 * n_targets * layers : layers * 12 + 3; /* each rounds its partials up */
    vks_lora_config lc = {.rank = o->lora_rank, .targets = targets};
    store_bytes(c, &lc, T, o->recompute, tr / PLAN_SQUARES_CHUNK + tensors, bytes);
    p.activations = bytes[TRAIN_BUF_ACT];
    p.logits = bytes[TRAIN_BUF_LOGITS];
    p.scratch = bytes[TRAIN_BUF_SCRATCH];
    p.total = p.base + p.adapter + p.gradients + p.optimizer + p.activations + p.logits + p.scratch;
    *out = p;
    return VKS_OK;
}

/* bytes as "12.3 MiB" or "1.23 GiB" */
static void put_size(char *buf, size_t cap, uint64_t bytes) {
    if (bytes >= (1ull << 30)) snprintf(buf, cap, "%.2f GiB", (double)bytes / (1ull << 30));
    else snprintf(buf, cap, "%.1f MiB", (double)bytes / (1ull << 20));
}

int vks_train_plan_describe(const vks_train_plan *p, char *buf, size_t cap) {
    if (!p || !buf || !cap) return vks_set_error(VKS_ERR_ARG, "vks_train_plan_describe: NULL argument");
    const uint64_t parts[8] = {p->base, p->adapter, p->gradients, p->optimizer, p->activations, p->logits,
                               p->scratch, p->total};
    const char *names[8] = {"base", "adapter", "gradients", "optimizer", "activations", "logits", "scratch", "total"};
    char s[8][32];
    for (int i = 0; i < 8; i++) put_size(s[i], sizeof s[i], parts[i]);
    snprintf(buf, cap, "%s %s, %s %s, %s %s, %s %s, %s %s, %s %s, %s %s: %s %s", names[0], s[0], names[1], s[1],
             names[2], s[2], names[3], s[3], names[4], s[4], names[5], s[5], names[6], s[6], names[7], s[7]);
    return VKS_OK;
}
