/* vks_ref_train.h: the float64 reference of training a whole model: forward
 * over packed token sequences with the log-probability of each next token, and
 * the gradient of every parameter tensor (src/ref/ref_train.c, built from the
 * vks_ref_grad.h ops). The truth the GPU trainer is tested against. */
#ifndef VKS_REF_TRAIN_H
#define VKS_REF_TRAIN_H
#include "vks_model.h"

/* One parameter tensor of a vks_ref_params: rows x cols doubles, row-major. */
typedef struct {
    char name[32]; /* "tok_emb", "layers.<l>.<field>" (fields as vks_layer_weights), "final_norm", "classifier" */
    double *data;
    int64_t rows, cols;
} vks_ref_tensor;

/* Per-layer views (shapes as vks_layer_weights; by name or by schema index);
 * tensors absent from the model (biases without has_bias) NULL. */
#define VKS_REF_FIELD_(field, ...) double *field;
typedef union {
    struct { VKS_LAYER_TENSORS(VKS_REF_FIELD_) };
    double *t[VKS_LAYER_N_TENSORS];
} vks_ref_layer;

/* Parameters of a model as doubles, or anything shaped like them (gradients,
 * Adam moments). One block `data` of n_values doubles, seen two ways: fields
 * for the forward, and tensors[] by name, in vks_schema_list's order (tok_emb,
 * each layer's in the schema's order, final_norm, classifier). A tied classifier (cfg.shared_classifier) is tok_emb itself:
 * classifier == tok_emb and no "classifier" tensor is listed, so its gradient
 * is the sum of both uses. Elementwise updates (AdamW, norms) run on `data`. */
typedef struct vks_ref_params {
    vks_model_config cfg;
    bool has_bias; /* Qwen2's q/k/v biases */
    double *tok_emb, *final_norm, *classifier;
    vks_ref_layer *layers; /* cfg.n_layers */
    vks_ref_tensor *tensors;
    int n_tensors;
    double *data;
    size_t n_values;
} vks_ref_params;

/* Zeroed parameters of a config (validated by vks_model_config_check). */
int vks_ref_params_create(const vks_model_config *cfg, bool has_bias, vks_ref_params **out);
/* The weights of m (any dtype, converted as vks_ref_forward converts them). */
int vks_ref_params_from_model(const vks_model *m, vks_ref_params **out);
void vks_ref_params_free(vks_ref_params *p);
void vks_ref_params_zero(vks_ref_params *p);
/* The tensor called `name`, or NULL. */
vks_ref_tensor *vks_ref_params_find(const vks_ref_params *p, const char *name);

/* Packed sequences: sequence s is seq_lens[s] consecutive tokens at positions
 * 0..seq_lens[s]-1, attending only to itself. Each length is 1..cfg.seq_len,
 * they add up to n_tokens. seq_lens NULL (n_seqs 0): one sequence of n_tokens.
 * Row r's target is the next token of its own sequence; the last row of each
 * sequence has none (its logp is 0 and its dlogp is ignored). */
typedef struct {
    const int32_t *tokens;
    int n_tokens;
    const int *seq_lens;
    int n_seqs;
} vks_ref_batch;

/* What the forward keeps for the backward (opaque). Per token it holds
 * n_layers * (6 dim + 2 kv_dim + 3 hidden + 2 n_heads) + 2 dim + vocab doubles
 * (the backward's scratch adds 4 dim + 2 kv_dim + 3 hidden + vocab); attention
 * scores are never held beyond one row (T doubles), so the only length limit
 * is each sequence's cfg.seq_len and memory (VKS_ERR_NOMEM past it). */
typedef struct vks_ref_acts vks_ref_acts;

/* Runs the forward: logp[n_tokens] (0 where no target), logits [n_tokens, vocab]
 * when not NULL, and, when acts is not NULL, the activation store for
 * vks_ref_train_backward (free with vks_ref_acts_free). */
int vks_ref_train_forward(const vks_ref_params *p, const vks_ref_batch *b, double *logp, double *logits,
                          vks_ref_acts **acts);
/* Accumulates into grads (shaped like p: same config and biases) the gradient
 * of sum_r dlogp[r] * logp[r], given the forward's store for the same p and b. */
int vks_ref_train_backward(const vks_ref_params *p, const vks_ref_batch *b, const vks_ref_acts *acts,
                           const double *dlogp, vks_ref_params *grads);
/* The same plus the gradient of sum_r dentropy[r] * H_r over rows with a
 * target, H_r the entropy of row r's distribution (vks_ref_token_entropy_forward
 * of the forward's logits): the entropy bonus. dentropy NULL: none (as
 * vks_ref_train_backward). */
int vks_ref_train_backward_entropy(const vks_ref_params *p, const vks_ref_batch *b, const vks_ref_acts *acts,
                                   const double *dlogp, const double *dentropy, vks_ref_params *grads);
void vks_ref_acts_free(vks_ref_acts *a);

/* Supervised loss = -sum_r weight[r] * logp[r] / normaliser over rows with a
 * target (weight NULL: 1 for every row; a mask is weights of 0 and 1), and,
 * when grads is not NULL, its gradient accumulated into grads. */
int vks_ref_train_loss(const vks_ref_params *p, const vks_ref_batch *b, const double *weight, double normaliser,
                       double *loss, vks_ref_params *grads);
#endif
