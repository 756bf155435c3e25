/* vks_ref_forward.h: the reference model forward (src/ref ops, float64 sums),
 * exactly as llama2.c run.c (f32 weights; others converted). The truth for
 * the GPU engine's tests. */
#ifndef VKS_REF_FORWARD_H
#define VKS_REF_FORWARD_H
#include "vks_model.h"
#include "vks_lora.h"
/* Feeds ids[0..n-1] at positions 0..n-1 of one sequence; writes logits
 * [n, vocab] (and, when hidden != NULL, the final-norm hidden rows [n, dim]). */
int vks_ref_forward(const vks_model *m, const int32_t *ids, int n, float *logits, float *hidden);
/* The same with residual-stream taps of every position (n_out = n; taps may be NULL). */
int vks_ref_forward_taps(const vks_model *m, const int32_t *ids, int n, float *logits, float *hidden,
                         const vks_layer_taps *taps);
/* The same with a LoRA adapter (NULL: none): each targeted product adds
 * scale B (A x) in double (vks_lora.h). */
int vks_ref_forward_lora(const vks_model *m, const vks_lora_adapter *a, const int32_t *ids, int n, float *logits,
                         float *hidden, const vks_layer_taps *taps);
/* vks_ref_forward_lora with K and V rounded to half (nearest even,
 * vks_f32_to_f16) before attention: the reference of the engine's f16 KV
 * cache (vks_engine_options.kv_f16). */
int vks_ref_forward_kv_f16(const vks_model *m, const vks_lora_adapter *a, const int32_t *ids, int n, float *logits,
                           float *hidden, const vks_layer_taps *taps);
#endif
