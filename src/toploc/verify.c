/* verify.c: verification of rollout samples (see vks_toploc.h): structure
 * checks, TOPLOC chunks and sampler replay, with the rows recomputed on the
 * CPU reference forward or in batched prefill on a GPU engine. */
#include "vkswarm/vks_toploc.h"
#include "vkswarm/vks_ref_forward.h"
#include "vkswarm/vks_cpu.h"
#include "vkswarm/vks_ref.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void vks_verify_options_default(vks_verify_options *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    vks_toploc_thresholds_default(&o->toploc);
    o->logit_margin = 1e-3f; /* 13x the measured honest f32 gap bound (see vks_toploc.h) */
}

static bool reject(vks_verdict *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool reject(vks_verdict *v, const char *fmt, ...) {
    if (!v->accepted) return false; /* keep the first reason */
    v->accepted = false;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->reason, sizeof v->reason, fmt, ap);
    va_end(ap);
    return false;
}

static bool is_stop(const vks_verify_options *o, int32_t t) {
    for (int i = 0; i < o->n_stop; i++)
        if (o->stop_ids[i] == t) return true;
    return false;
}

static bool ids_in_vocab(const int32_t *ids, int n, int vocab, const char *what, vks_verdict *v) {
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return reject(v, "%s token %d at index %d is outside the vocabulary (%d)", what, ids[i], i, vocab);
    return true;
}

/* The sample with stream index seq was given task prompt seq. */
static bool prompt_matches_task(const vks_verify_options *o, const vks_rollout_sample *s, vks_verdict *v) {
    if (s->seq >= (uint32_t)o->n_task_prompts)
        return reject(v, "prompt does not match the task: seq %u names none of its %d prompts", s->seq,
                      o->n_task_prompts);
    const int32_t *want = o->task_prompts[s->seq];
    int n = o->task_prompt_lens[s->seq];
    if (n != s->n_prompt)
        return reject(v, "prompt does not match the task: %d ids where task prompt %u has %d", s->n_prompt, s->seq, n);
    for (int i = 0; i < n; i++)
        if (want[i] != s->prompt_ids[i])
            return reject(v, "prompt does not match the task: id %d at index %d where task prompt %u has %d",
                          s->prompt_ids[i], i, s->seq, want[i]);
    return true;
}

/* The stage commitments: stages in order from layer 0, each handing on
 * before the last layer, with the proof bytes of the committed rows. */
static bool stage_proofs_fit(const vks_model_config *c, const vks_rollout_sample *s, size_t want, vks_verdict *v) {
    if (s->n_stage_proofs < 0 || s->n_stage_proofs > VKS_ROLLOUT_MAX_STAGES || (s->n_stage_proofs && !s->stage_proofs))
        return reject(v, "stage_proofs: %d entries", s->n_stage_proofs);
    for (int k = 0, begin = 0; k < s->n_stage_proofs; k++) {
        const vks_stage_proof *p = &s->stage_proofs[k];
        if (p->layer_begin != begin || p->layer_end <= p->layer_begin || p->layer_end >= c->n_layers)
            return reject(v, "stage %d (rank %d): layers [%d,%d) are not [%d, end) with end < %d (the last stage holds "
                          "the last layer)", k, p->rank, p->layer_begin, p->layer_end, begin, c->n_layers);
        if (p->proof_bytes != want || (want && !p->proofs))
            return reject(v, "stage %d (rank %d, layers [%d,%d)): proofs are %zu bytes; %d committed rows need %zu", k,
                          p->rank, p->layer_begin, p->layer_end, p->proof_bytes, s->n_output, want);
        begin = p->layer_end;
    }
    return true;
}

/* Everything that can be checked without running the model. */
static bool check_structure(const vks_model_config *c, const vks_verify_options *o, const vks_rollout_sample *s,
                            vks_verdict *v) {
    if (memcmp(s->model_hash, o->model_hash, 32) != 0) return reject(v, "model hash differs from the verifier's model");
    if (s->n_prompt < 1) return reject(v, "empty prompt");
    if (s->max_steps < 1 || s->max_steps > c->seq_len)
        return reject(v, "max_steps %d outside 1..%d (the model's context)", s->max_steps, c->seq_len);
    if (s->n_prompt > s->max_steps) return reject(v, "prompt of %d ids exceeds max_steps %d", s->n_prompt, s->max_steps);
    int room = s->max_steps + 1 - s->n_prompt; /* output tokens a full-length generation has */
    if (s->n_output > room) return reject(v, "%d output tokens exceed the %d that max_steps allows", s->n_output, room);
    if (!ids_in_vocab(s->prompt_ids, s->n_prompt, c->vocab_size, "prompt", v) ||
        !ids_in_vocab(s->output_ids, s->n_output, c->vocab_size, "output", v))
        return false;
    if (o->task_prompts && !prompt_matches_task(o, s, v)) return false;
    for (int t = 0; t + 1 < s->n_output; t++)
        if (is_stop(o, s->output_ids[t]))
            return reject(v, "output continues after stop token %d at output index %d", s->output_ids[t], t);
    if (s->n_output < room && (s->n_output == 0 || !is_stop(o, s->output_ids[s->n_output - 1])))
        return reject(v, "stops after %d of %d output tokens without a stop token", s->n_output, room);
    size_t want = vks_toploc_proof_size((size_t)s->n_output);
    if (s->proof_bytes != want)
        return reject(v, "proofs are %zu bytes; %d committed rows need %zu (%zu chunks of %d)", s->proof_bytes,
                      s->n_output, want, want / VKS_TOPLOC_PROOF_BYTES, VKS_TOPLOC_PROOF_BYTES);
    if (!stage_proofs_fit(c, s, want, v)) return false;
    return true;
}

/* ---- sampler replay ---- */

typedef struct {
    uint8_t *keep;
    float *z;
} sampler_scratch;

/* Checks output token t of sample s against the verifier's logits row. */
static int check_token(const vks_rollout_sample *s, int t, const float *logits, int V, const vks_verify_options *o,
                       sampler_scratch *scr, vks_verdict *v, float *logp) {
    int pos = s->n_prompt - 1 + t;
    vks_sample_params p = {.temperature = s->temperature, .top_k = s->top_k, .top_p = s->top_p, .seed = s->seed,
                           .seq = s->seq, .pos = (uint32_t)pos};
    double gap, outside;
    int32_t token = s->output_ids[t];
    if (logp) logp[t] = vks_token_logp(logits, V, token);
    vks_ref_sample_gap(logits, V, &p, token, scr->keep, scr->z, &gap, &outside);
    if (!(gap <= (double)o->logit_margin))
        reject(v, "position %d (output %d): token %d is not the seeded sampler's draw (gap %.4g > margin %.4g)", pos, t,
               token, gap, (double)o->logit_margin);
    else if (!(outside <= (double)o->logit_margin))
        reject(v, "position %d (output %d): token %d is outside the top-k/top-p set (by %.4g)", pos, t, token, outside);
    if (gap > v->max_gap && gap <= 1e30) v->max_gap = (float)gap;
    return VKS_OK;
}

/* Where sample i's replayed log-probabilities go (NULL: nowhere). */
static float *logp_of(const vks_verify_options *o, int i) { return o->logp_out ? o->logp_out[i] : NULL; }

/* ---- per-sample state while its rows arrive ---- */

/* Layer boundaries whose residual stream a group's stage commitments need:
 * layers[0..n) for the forward's taps, of[L] the tap of boundary L (-1: none). */
typedef struct {
    int n;
    int *layers, *of; /* [n_layers + 1] each */
} tap_set;

static int tap_set_init(tap_set *t, int n_layers) {
    t->n = 0;
    t->layers = malloc(sizeof(int) * ((size_t)n_layers + 1));
    t->of = malloc(sizeof(int) * ((size_t)n_layers + 1));
    if (!t->layers || !t->of) return vks_set_error(VKS_ERR_NOMEM, "verify: out of host memory");
    for (int l = 0; l <= n_layers; l++) t->of[l] = -1;
    return VKS_OK;
}

/* After check_structure passed s: its boundaries lie in 1..n_layers-1. */
static void tap_set_add(tap_set *t, const vks_rollout_sample *s) {
    for (int k = 0; k < s->n_stage_proofs; k++) {
        int l = s->stage_proofs[k].layer_end;
        if (t->of[l] < 0) t->of[l] = t->n, t->layers[t->n++] = l;
    }
}

static void tap_set_free(tap_set *t) {
    free(t->layers);
    free(t->of);
}

typedef struct {
    const vks_rollout_sample *s;
    vks_verdict *v;
    float *logp;     /* o->logp_out's array for this sample, or NULL */
    float *hidden;   /* [n_output, dim] */
    float *stage_rows; /* [n_stage_proofs, n_output, dim]: the residual stream each stage handed on */
    int rows_seen;
} sample_job;

static int job_start(sample_job *j, const vks_rollout_sample *s, vks_verdict *v, int dim, float *logp) {
    j->s = s;
    j->v = v;
    j->logp = logp;
    j->rows_seen = 0;
    j->hidden = malloc(sizeof(float) * (size_t)s->n_output * (size_t)dim);
    j->stage_rows = s->n_stage_proofs > 0
                        ? malloc(sizeof(float) * (size_t)s->n_stage_proofs * (size_t)s->n_output * (size_t)dim)
                        : NULL;
    if (j->hidden && (j->stage_rows || s->n_stage_proofs == 0)) return VKS_OK;
    free(j->hidden);
    free(j->stage_rows);
    j->hidden = j->stage_rows = NULL;
    return vks_set_error(VKS_ERR_NOMEM, "verify: out of host memory");
}

static void job_free(sample_job *j) {
    free(j->hidden);
    free(j->stage_rows);
    j->hidden = j->stage_rows = NULL;
}

/* Output row t's residual stream at each stage's boundary: tap k of the row
 * is at taps + k * stride. */
static void job_taps(sample_job *j, int t, const float *taps, size_t stride, const tap_set *ts, int dim) {
    const vks_rollout_sample *s = j->s;
    for (int k = 0; k < s->n_stage_proofs; k++)
        memcpy(j->stage_rows + ((size_t)k * (size_t)s->n_output + (size_t)t) * (size_t)dim,
               taps + (size_t)ts->of[s->stage_proofs[k].layer_end] * stride, sizeof(float) * (size_t)dim);
}

static int job_row(sample_job *j, int t, const float *logits, const float *hidden, const vks_model_config *c,
                   const vks_verify_options *o, sampler_scratch *scr) {
    memcpy(j->hidden + (size_t)t * (size_t)c->dim, hidden, sizeof(float) * (size_t)c->dim);
    j->rows_seen++;
    return check_token(j->s, t, logits, c->vocab_size, o, scr, j->v, j->logp);
}

/* Checks the chunks of one commitment (proofs of n rows) against rows; the
 * first failing chunk goes to reason (left alone when all pass). */
static int check_commitment(const uint8_t *proofs, const float *rows, int n, const vks_model_config *c,
                            const vks_verify_options *o, bool *ok_all, char *reason, size_t reason_len) {
    *ok_all = true;
    for (int r0 = 0, ch = 0; r0 < n; r0 += VKS_TOPLOC_CHUNK_ROWS, ch++) {
        int nr = n - r0 < VKS_TOPLOC_CHUNK_ROWS ? n - r0 : VKS_TOPLOC_CHUNK_ROWS;
        bool ok;
        vks_toploc_stats st;
        char why[160];
        int rc = vks_toploc_check_chunk(proofs + (size_t)ch * VKS_TOPLOC_PROOF_BYTES, VKS_TOPLOC_PROOF_BYTES,
                                        rows + (size_t)r0 * (size_t)c->dim, nr, c->dim, &o->toploc, &ok, &st, why,
                                        sizeof why);
        if (rc) return rc;
        if (!ok && *ok_all) {
            *ok_all = false;
            snprintf(reason, reason_len, "TOPLOC chunk %d (rows %d..%d): %.120s", ch, r0, r0 + nr - 1, why);
        }
    }
    return VKS_OK;
}

/* The stage commitments in stage order: the first that fails names its stage
 * (the ones before it handed on what the model computes). */
static int check_stages(sample_job *j, const vks_model_config *c, const vks_verify_options *o, bool *ok_all,
                        char *reason, size_t reason_len, int *blamed) {
    const vks_rollout_sample *s = j->s;
    *ok_all = true;
    for (int k = 0; k < s->n_stage_proofs && *ok_all; k++) {
        const vks_stage_proof *p = &s->stage_proofs[k];
        char why[200];
        int rc = check_commitment(p->proofs, j->stage_rows + (size_t)k * (size_t)s->n_output * (size_t)c->dim,
                                  s->n_output, c, o, ok_all, why, sizeof why);
        if (rc) return rc;
        if (!*ok_all) {
            snprintf(reason, reason_len, "stage %d (rank %d, layers [%d,%d)): %.180s", k, p->rank, p->layer_begin,
                     p->layer_end, why);
            *blamed = p->rank;
        }
    }
    return VKS_OK;
}

/* Every row is in: check the stage commitments, then the TOPLOC chunks; the
 * first failing one is the reason. */
static int job_finish(sample_job *j, const vks_model_config *c, const vks_verify_options *o) {
    const vks_rollout_sample *s = j->s;
    vks_verdict *v = j->v;
    bool stages_ok = true;
    char stage_reason[256] = "";
    int blamed = -1;
    int rc = check_stages(j, c, o, &stages_ok, stage_reason, sizeof stage_reason, &blamed);
    if (rc) return rc;
    bool toploc_ok = true;
    char toploc_reason[256] = "";
    for (int r0 = 0, ch = 0; r0 < s->n_output; r0 += VKS_TOPLOC_CHUNK_ROWS, ch++) {
        int nr = s->n_output - r0 < VKS_TOPLOC_CHUNK_ROWS ? s->n_output - r0 : VKS_TOPLOC_CHUNK_ROWS;
        bool ok;
        vks_toploc_stats st;
        char why[160];
        rc = vks_toploc_check_chunk(s->proofs + (size_t)ch * VKS_TOPLOC_PROOF_BYTES, VKS_TOPLOC_PROOF_BYTES,
                                    j->hidden + (size_t)r0 * (size_t)c->dim, nr, c->dim, &o->toploc, &ok, &st,
                                    why, sizeof why);
        if (rc) return rc;
        v->n_chunks++;
        if (ch == 0) v->worst = st;
        v->worst.exp_mismatches = st.exp_mismatches > v->worst.exp_mismatches ? st.exp_mismatches : v->worst.exp_mismatches;
        v->worst.mant_mean = st.mant_mean > v->worst.mant_mean ? st.mant_mean : v->worst.mant_mean;
        v->worst.mant_median = st.mant_median > v->worst.mant_median ? st.mant_median : v->worst.mant_median;
        if (!ok && toploc_ok) {
            toploc_ok = false;
            int last = s->n_stage_proofs - 1; /* with stage commitments: the last stage's */
            if (last >= 0)
                snprintf(toploc_reason, sizeof toploc_reason, "last stage (layers [%d,%d)): TOPLOC chunk %d (rows %d..%d): %.150s",
                         s->stage_proofs[last].layer_end, c->n_layers, ch, r0, r0 + nr - 1, why);
            else
                snprintf(toploc_reason, sizeof toploc_reason, "TOPLOC chunk %d (rows %d..%d): %s", ch, r0, r0 + nr - 1, why);
        }
    }
    if (!stages_ok || !toploc_ok) { /* a failed commitment outranks a sampler finding; the first stage's first */
        v->accepted = false;
        snprintf(v->reason, sizeof v->reason, "%s", stages_ok ? toploc_reason : stage_reason);
        v->blamed_rank = stages_ok ? -1 : blamed;
    }
    job_free(j);
    return VKS_OK;
}

static int scratch_alloc(sampler_scratch *s, int V) {
    s->keep = malloc((size_t)V);
    s->z = malloc(sizeof(float) * (size_t)V);
    return s->keep && s->z ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "verify: out of host memory");
}

static void scratch_free(sampler_scratch *s) {
    free(s->keep);
    free(s->z);
}

static int start_verdicts(const vks_model_config *c, const vks_verify_options *o, const vks_rollout_sample *samples,
                          int n, vks_verdict *out, bool *live) {
    for (int i = 0; i < n; i++) {
        memset(&out[i], 0, sizeof out[i]);
        out[i].accepted = true, out[i].blamed_rank = -1;
        live[i] = check_structure(c, o, &samples[i], &out[i]);
    }
    return VKS_OK;
}

static bool task_ok(const vks_verify_options *o) {
    if (!o->task_prompts) return true;
    if (!o->task_prompt_lens || o->n_task_prompts < 0 || o->n_task_prompts > VKS_VERIFY_MAX_TASK_PROMPTS) return false;
    for (int q = 0; q < o->n_task_prompts; q++)
        if (o->task_prompt_lens[q] < 0 || (o->task_prompt_lens[q] > 0 && !o->task_prompts[q])) return false;
    return true;
}

static bool verify_args_ok(const vks_verify_options *o, const vks_rollout_sample *samples, int n, vks_verdict *out) {
    return o && out && n >= 0 && (samples || n == 0) && o->n_stop >= 0 && o->n_stop <= VKS_ROLLOUT_MAX_STOP &&
           o->logit_margin >= 0 && task_ok(o);
}

/* ---- CPU ---- */

static int verify_one_cpu(const vks_model *m, const vks_verify_options *o, const vks_rollout_sample *s,
                          vks_verdict *v, sampler_scratch *scr, float *logp) {
    const vks_model_config *c = &m->cfg;
    int L = s->n_prompt + s->n_output - 1;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)L);
    float *logits = malloc(sizeof(float) * (size_t)L * (size_t)c->vocab_size);
    float *hidden = malloc(sizeof(float) * (size_t)L * (size_t)c->dim);
    sample_job j = {0};
    tap_set ts = {0};
    float *taps = NULL;
    int rc = ids && logits && hidden ? tap_set_init(&ts, c->n_layers) : vks_set_error(VKS_ERR_NOMEM, "verify: out of host memory");
    if (rc == VKS_OK) tap_set_add(&ts, s);
    if (rc == VKS_OK && ts.n && !(taps = malloc(sizeof(float) * (size_t)ts.n * (size_t)L * (size_t)c->dim)))
        rc = vks_set_error(VKS_ERR_NOMEM, "verify: out of host memory");
    if (rc == VKS_OK) rc = job_start(&j, s, v, c->dim, logp);
    if (rc == VKS_OK) {
        memcpy(ids, s->prompt_ids, sizeof(int32_t) * (size_t)s->n_prompt);
        memcpy(ids + s->n_prompt, s->output_ids, sizeof(int32_t) * (size_t)(s->n_output - 1));
        vks_layer_taps lt = {.n = ts.n, .layers = ts.layers, .out = taps};
        rc = o->kv_f16 ? vks_ref_forward_kv_f16(m, o->lora, ids, L, logits, hidden, &lt)
                       : vks_ref_forward_lora(m, o->lora, ids, L, logits, hidden, &lt);
    }
    for (int t = 0; rc == VKS_OK && t < s->n_output; t++) {
        size_t r = (size_t)(s->n_prompt - 1 + t);
        if (ts.n) job_taps(&j, t, taps + r * (size_t)c->dim, (size_t)L * (size_t)c->dim, &ts, c->dim);
        rc = job_row(&j, t, logits + r * (size_t)c->vocab_size, hidden + r * (size_t)c->dim, c, o, scr);
    }
    if (rc == VKS_OK) rc = job_finish(&j, c, o);
    job_free(&j);
    tap_set_free(&ts);
    free(taps);
    free(ids);
    free(logits);
    free(hidden);
    return rc;
}

/* ---- CPU, fast: every sample of a group in one batched prefill ---- */

enum { CPU_GROUP_MAX_ROWS = 4096 }; /* rows per prefill; a longer sample goes alone */

typedef struct {
    const vks_model *m;
    const vks_verify_options *o;
    const vks_rollout_sample *samples;
    vks_verdict *out;
    const int *which;     /* the group's samples */
    const int *first_out; /* each one's first row in logits/hidden */
    const float *logits, *hidden;
    const tap_set *taps;  /* the group's stage boundaries */
    const float *tap_rows; /* [taps->n, n_out, dim] */
    size_t tap_stride;
    pthread_mutex_t lock;
    int rc;               /* first failure, under lock */
    char error[512];
} cpu_replay;

static int replay_sample(cpu_replay *r, int g) {
    const vks_model_config *c = &r->m->cfg;
    const vks_rollout_sample *s = &r->samples[r->which[g]];
    sampler_scratch scr = {0};
    sample_job j = {0};
    int rc = scratch_alloc(&scr, c->vocab_size);
    if (rc == VKS_OK) rc = job_start(&j, s, &r->out[r->which[g]], c->dim, logp_of(r->o, r->which[g]));
    for (int t = 0; rc == VKS_OK && t < s->n_output; t++) {
        size_t row = (size_t)(r->first_out[g] + t);
        if (r->taps->n) job_taps(&j, t, r->tap_rows + row * (size_t)c->dim, r->tap_stride, r->taps, c->dim);
        rc = job_row(&j, t, r->logits + row * (size_t)c->vocab_size, r->hidden + row * (size_t)c->dim, c, r->o, &scr);
    }
    if (rc == VKS_OK) rc = job_finish(&j, c, r->o);
    job_free(&j);
    scratch_free(&scr);
    return rc;
}

static void replay_samples(void *ctx, int begin, int end) {
    cpu_replay *r = ctx;
    for (int g = begin; g < end; g++) {
        int rc = replay_sample(r, g);
        if (rc == VKS_OK) continue;
        pthread_mutex_lock(&r->lock);
        if (r->rc == VKS_OK) {
            r->rc = rc;
            snprintf(r->error, sizeof r->error, "%s", vks_last_error()); /* errors are per thread */
        }
        pthread_mutex_unlock(&r->lock);
    }
}

/* Ids of the group's samples (prompt + output but the last) and where each one's output rows are. */
static void group_layout(const vks_rollout_sample *samples, const int *which, int n, int32_t *ids, int *lens,
                         int *out_rows, int *first_out) {
    int row = 0, n_out = 0;
    for (int g = 0; g < n; g++) {
        const vks_rollout_sample *s = &samples[which[g]];
        lens[g] = s->n_prompt + s->n_output - 1;
        memcpy(ids + row, s->prompt_ids, sizeof(int32_t) * (size_t)s->n_prompt);
        memcpy(ids + row + s->n_prompt, s->output_ids, sizeof(int32_t) * (size_t)(s->n_output - 1));
        first_out[g] = n_out;
        for (int t = 0; t < s->n_output; t++) out_rows[n_out++] = row + s->n_prompt - 1 + t;
        row += lens[g];
    }
}

static int verify_group_fast(vks_cpu *cpu, cpu_replay *r, const int *which, int n, int rows, int n_out) {
    const vks_model_config *c = &r->m->cfg;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)rows);
    int *lens = malloc(sizeof(int) * (size_t)n), *first = malloc(sizeof(int) * (size_t)n);
    int *out_rows = malloc(sizeof(int) * (size_t)n_out);
    float *logits = malloc(sizeof(float) * (size_t)n_out * (size_t)c->vocab_size);
    float *hidden = malloc(sizeof(float) * (size_t)n_out * (size_t)c->dim), *taps = NULL;
    tap_set ts = {0};
    int rc = ids && lens && first && out_rows && logits && hidden ? tap_set_init(&ts, c->n_layers)
                                                                   : vks_set_error(VKS_ERR_NOMEM, "verify: out of host memory");
    for (int g = 0; rc == VKS_OK && g < n; g++) tap_set_add(&ts, &r->samples[which[g]]);
    if (rc == VKS_OK && ts.n && !(taps = malloc(sizeof(float) * (size_t)ts.n * (size_t)n_out * (size_t)c->dim)))
        rc = vks_set_error(VKS_ERR_NOMEM, "verify: out of host memory");
    if (rc == VKS_OK) {
        group_layout(r->samples, which, n, ids, lens, out_rows, first);
        vks_layer_taps lt = {.n = ts.n, .layers = ts.layers, .out = taps};
        rc = vks_cpu_prefill_taps(cpu, ids, lens, n, out_rows, n_out, logits, hidden, &lt);
    }
    if (rc == VKS_OK) {
        r->taps = &ts, r->tap_rows = taps, r->tap_stride = (size_t)n_out * (size_t)c->dim;
        r->which = which, r->first_out = first, r->logits = logits, r->hidden = hidden;
        vks_cpu_parallel(cpu, n, replay_samples, r); /* the sampler replay, one sample per item */
        if ((rc = r->rc) != VKS_OK) vks_set_error(rc, "%s", r->error);
    }
    free(ids), free(lens), free(first), free(out_rows), free(logits), free(hidden), free(taps);
    tap_set_free(&ts);
    return rc;
}

static int verify_live_fast(vks_cpu *cpu, cpu_replay *r, const bool *live, int n) {
    int *which = malloc(sizeof(int) * (size_t)(n + 1));
    if (!which) return vks_set_error(VKS_ERR_NOMEM, "verify: out of host memory");
    int rc = VKS_OK;
    for (int i = 0; i < n && rc == VKS_OK;) {
        int count = 0, rows = 0, n_out = 0;
        for (; i < n; i++) {
            if (!live[i]) continue;
            int len = r->samples[i].n_prompt + r->samples[i].n_output - 1;
            if (count > 0 && rows + len > CPU_GROUP_MAX_ROWS) break;
            which[count++] = i, rows += len, n_out += r->samples[i].n_output;
        }
        if (count > 0) rc = verify_group_fast(cpu, r, which, count, rows, n_out);
    }
    free(which);
    return rc;
}

static int verify_batch_fast(const vks_model *m, const vks_verify_options *o, const vks_rollout_sample *samples, int n,
                             vks_verdict *out, const bool *live) {
    vks_cpu_options co = {.threads = o->cpu_threads, .kv_f16 = o->kv_f16};
    vks_cpu *cpu = NULL;
    int rc = vks_cpu_create(m, &co, &cpu);
    if (rc == VKS_OK) rc = vks_cpu_set_lora(cpu, o->lora);
    if (rc != VKS_OK) {
        vks_cpu_destroy(cpu);
        return rc;
    }
    cpu_replay r = {.m = m, .o = o, .samples = samples, .out = out};
    pthread_mutex_init(&r.lock, NULL);
    rc = verify_live_fast(cpu, &r, live, n);
    pthread_mutex_destroy(&r.lock);
    vks_cpu_destroy(cpu);
    return rc;
}

int vks_verify_batch_cpu(const vks_model *m, const vks_verify_options *o, const vks_rollout_sample *samples, int n,
                         vks_verdict *out) {
    if (!m || !verify_args_ok(o, samples, n, out)) return vks_set_error(VKS_ERR_ARG, "vks_verify_batch_cpu: bad arguments");
    bool *live = calloc((size_t)n + 1, sizeof *live);
    sampler_scratch scr = {0};
    int rc = live ? scratch_alloc(&scr, m->cfg.vocab_size) : vks_set_error(VKS_ERR_NOMEM, "verify: out of host memory");
    if (rc == VKS_OK) rc = start_verdicts(&m->cfg, o, samples, n, out, live);
    if (rc == VKS_OK && !o->cpu_reference) rc = verify_batch_fast(m, o, samples, n, out, live);
    for (int i = 0; rc == VKS_OK && o->cpu_reference && i < n; i++)
        if (live[i]) rc = verify_one_cpu(m, o, &samples[i], &out[i], &scr, logp_of(o, i));
    scratch_free(&scr);
    free(live);
    return rc;
}

/* ---- GPU: batched prefill over a group of samples, one KV slot each ---- */

/* Checks the output rows of one forward (sampler replay, TOPLOC rows) on
 * checker threads while the GPU computes the next forward: the replay over
 * the vocabulary per row is CPU work that would otherwise leave the GPU idle.
 * Worker w takes the rows of the jobs with job % n_workers == w, so a job's
 * verdict is written by one thread. At most one forward's rows are with the
 * checkers: submit waits until the previous forward's are done (the feed
 * reuses a forward's buffer two forwards later). */
enum { MAX_CHECKERS = 16 };

typedef struct row_checker row_checker;

typedef struct {
    row_checker *k;
    int id;
    pthread_t thread;
    sampler_scratch scr;
} checker_worker;

struct row_checker {
    pthread_mutex_t lock;
    pthread_cond_t wake, idle;
    const vks_feed_rows *pending; /* being checked; NULL when idle */
    uint64_t generation;          /* bumped per submitted forward */
    int busy;                     /* workers still on `pending` */
    bool stop;
    int n_workers;
    checker_worker w[MAX_CHECKERS];
    sample_job *jobs;
    const vks_model_config *c;
    const vks_verify_options *o;
    tap_set taps;                 /* the group's stage boundaries */
};

/* Checker threads: VKSWARM_VERIFY_THREADS, else one per core beyond the
 * one that drives the GPU. */
static int checker_threads(void) {
    const char *env = getenv("VKSWARM_VERIFY_THREADS");
    long n = env ? strtol(env, NULL, 10) : sysconf(_SC_NPROCESSORS_ONLN) - 1;
    return n < 1 ? 1 : n > MAX_CHECKERS ? MAX_CHECKERS : (int)n;
}

/* Feed sequence j is job j; its output rows start at the prompt's last position. */
static void check_rows(checker_worker *w, const vks_feed_rows *rows) {
    const row_checker *k = w->k;
    for (int i = 0; i < rows->n; i++) {
        if (rows->seq[i] % k->n_workers != w->id) continue;
        sample_job *j = &k->jobs[rows->seq[i]];
        int t = rows->pos[i] - (j->s->n_prompt - 1);
        if (k->taps.n)
            job_taps(j, t, rows->taps + (size_t)i * (size_t)k->c->dim, (size_t)rows->n * (size_t)k->c->dim, &k->taps,
                     k->c->dim);
        /* job_row cannot fail: its findings go to the verdict */
        job_row(j, t, rows->logits + (size_t)i * (size_t)k->c->vocab_size, rows->hidden + (size_t)i * (size_t)k->c->dim,
                k->c, k->o, &w->scr);
    }
}

static void *checker_main(void *arg) {
    checker_worker *w = arg;
    row_checker *k = w->k;
    uint64_t seen = 0;
    pthread_mutex_lock(&k->lock);
    for (;;) {
        while (k->generation == seen && !k->stop) pthread_cond_wait(&k->wake, &k->lock);
        if (k->generation == seen) break; /* stop, nothing new */
        seen = k->generation;
        const vks_feed_rows *rows = k->pending;
        pthread_mutex_unlock(&k->lock);
        check_rows(w, rows);
        pthread_mutex_lock(&k->lock);
        if (--k->busy == 0) {
            k->pending = NULL;
            pthread_cond_broadcast(&k->idle);
        }
    }
    pthread_mutex_unlock(&k->lock);
    return NULL;
}

static void checker_wait_idle(row_checker *k) {
    pthread_mutex_lock(&k->lock);
    while (k->pending) pthread_cond_wait(&k->idle, &k->lock);
    pthread_mutex_unlock(&k->lock);
}

static void checker_submit(row_checker *k, const vks_feed_rows *rows) {
    pthread_mutex_lock(&k->lock);
    while (k->pending) pthread_cond_wait(&k->idle, &k->lock);
    k->pending = rows;
    k->busy = k->n_workers;
    k->generation++;
    pthread_cond_broadcast(&k->wake);
    pthread_mutex_unlock(&k->lock);
}

/* Joins the started workers (after checker_wait_idle) and frees them. */
static void checker_stop(row_checker *k) {
    pthread_mutex_lock(&k->lock);
    k->stop = true;
    pthread_cond_broadcast(&k->wake);
    pthread_mutex_unlock(&k->lock);
    for (int i = 0; i < k->n_workers; i++) {
        pthread_join(k->w[i].thread, NULL);
        scratch_free(&k->w[i].scr);
    }
    pthread_mutex_destroy(&k->lock);
    pthread_cond_destroy(&k->wake);
    pthread_cond_destroy(&k->idle);
}

static int checker_start(row_checker *k, sample_job *jobs, const vks_model_config *c, const vks_verify_options *o) {
    *k = (row_checker){.jobs = jobs, .c = c, .o = o};
    pthread_mutex_init(&k->lock, NULL);
    pthread_cond_init(&k->wake, NULL);
    pthread_cond_init(&k->idle, NULL);
    int want = checker_threads(), rc = VKS_OK;
    for (int i = 0; i < want && rc == VKS_OK; i++) {
        checker_worker *w = &k->w[i];
        *w = (checker_worker){.k = k, .id = i};
        rc = scratch_alloc(&w->scr, c->vocab_size);
        if (rc == VKS_OK && pthread_create(&w->thread, NULL, checker_main, w) != 0)
            rc = vks_set_error(VKS_ERR_NOMEM, "verify: cannot start a row checker thread");
        if (rc) scratch_free(&w->scr);
        else k->n_workers++;
    }
    if (rc) checker_stop(k); /* nothing was submitted: the started workers just leave */
    return rc;
}

/* Positions a sample's prefill covers: the prompt and every output token but the last. */
static int sample_positions(const vks_rollout_sample *s) { return s->n_prompt + s->n_output - 1; }

/* The group's samples as feed sequences, job j in KV slot j; ids holds each
 * one's prompt and output ids by position. */
static int32_t *group_seqs(const sample_job *jobs, int n_jobs, vks_feed_seq *seqs) {
    size_t total = 1;
    for (int j = 0; j < n_jobs; j++) total += (size_t)sample_positions(jobs[j].s);
    int32_t *ids = malloc(sizeof(int32_t) * total), *at = ids;
    for (int j = 0; ids && j < n_jobs; j++) {
        const vks_rollout_sample *s = jobs[j].s;
        memcpy(at, s->prompt_ids, sizeof(int32_t) * (size_t)s->n_prompt);
        memcpy(at + s->n_prompt, s->output_ids, sizeof(int32_t) * (size_t)(s->n_output - 1));
        seqs[j] = (vks_feed_seq){.slot = (uint32_t)j, .ids = at, .begin = 0, .end = sample_positions(s),
                                 .out_begin = s->n_prompt - 1};
        at += sample_positions(s);
    }
    return ids;
}

/* Feeds the group through the engine; each forward's output rows go to the
 * checker threads while the GPU runs the next one. */
static int feed_group(vks_engine *e, row_checker *k, const sample_job *jobs, int n_jobs) {
    vks_feed_seq *seqs = malloc(sizeof *seqs * (size_t)(n_jobs + 1));
    int32_t *ids = seqs ? group_seqs(jobs, n_jobs, seqs) : NULL;
    vks_feed *f = NULL;
    vks_feed_options fo = {.want_hidden = true, .n_taps = k->taps.n, .tap_layers = k->taps.layers};
    int rc = ids ? vks_feed_create(e, seqs, n_jobs, &fo, &f) : vks_set_error(VKS_ERR_NOMEM, "verify: out of host memory");
    const vks_feed_rows *rows = NULL;
    while (rc == VKS_OK && (rc = vks_feed_next(f, &rows)) == VKS_OK && rows) checker_submit(k, rows);
    checker_wait_idle(k); /* the last forward's rows are in, and the feed's buffers free to go */
    vks_feed_destroy(f);
    free(ids);
    free(seqs);
    return rc;
}

static int run_group(vks_engine *e, const vks_verify_options *o, sample_job *jobs, int n_jobs) {
    const vks_model_config *c = vks_engine_config(e);
    row_checker k;
    int rc = checker_start(&k, jobs, c, o);
    if (rc == VKS_OK) { /* the checkers read k.taps only for submitted rows (after the mutex) */
        if ((rc = tap_set_init(&k.taps, c->n_layers)) == VKS_OK)
            for (int j = 0; j < n_jobs; j++) tap_set_add(&k.taps, jobs[j].s);
        if (rc == VKS_OK) rc = feed_group(e, &k, jobs, n_jobs);
        checker_stop(&k);
        tap_set_free(&k.taps);
    }
    for (int j = 0; rc == VKS_OK && j < n_jobs; j++) rc = job_finish(&jobs[j], c, o);
    for (int j = 0; j < n_jobs; j++) job_free(&jobs[j]); /* after an error: the rows of unfinished jobs */
    return rc;
}

/* Runs a group with the KV cache sized to it: n_jobs slots of the group's
 * longest sample (kept when the current cache already holds that). */
static int run_sized_group(vks_engine *e, const vks_verify_options *o, sample_job *jobs, int n_jobs, int longest) {
    if (vks_engine_n_slots(e) < n_jobs || vks_engine_kv_len(e) < longest) {
        int rc = vks_engine_resize_kv(e, n_jobs, longest);
        if (rc) {
            for (int j = 0; j < n_jobs; j++) job_free(&jobs[j]);
            return rc;
        }
    }
    return run_group(e, o, jobs, n_jobs);
}

/* Groups the live samples in order: a group grows while its KV cache (group
 * size x longest sample) fits on the device, up to max_slots samples. A
 * sample that does not fit even alone is rejected. */
static int verify_gpu_live(vks_engine *e, const vks_verify_options *o, const vks_rollout_sample *samples, int n,
                           vks_verdict *out, const bool *live) {
    const vks_model_config *c = vks_engine_config(e);
    int max_slots = n < 4096 ? n : 4096;
    sample_job *jobs = calloc((size_t)max_slots + 1, sizeof *jobs);
    int rc = jobs ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "verify: out of host memory");
    int n_jobs = 0, longest = 0;
    for (int i = 0; rc == VKS_OK && i < n; i++) {
        if (!live[i]) continue;
        int len = sample_positions(&samples[i]);
        if (n_jobs > 0 && (n_jobs == max_slots || vks_engine_kv_fits(e, n_jobs + 1, len > longest ? len : longest))) {
            rc = run_sized_group(e, o, jobs, n_jobs, longest);
            n_jobs = longest = 0;
            if (rc) break;
        }
        if (n_jobs == 0 && vks_engine_kv_fits(e, 1, len) != VKS_OK) {
            reject(&out[i], "%d positions do not fit the verifier's device: %s", len, vks_last_error());
            continue;
        }
        rc = job_start(&jobs[n_jobs], &samples[i], &out[i], c->dim, logp_of(o, i));
        if (rc == VKS_OK) {
            n_jobs++;
            if (len > longest) longest = len;
        }
    }
    if (rc == VKS_OK && n_jobs > 0) rc = run_sized_group(e, o, jobs, n_jobs, longest);
    else
        for (int j = 0; j < n_jobs; j++) job_free(&jobs[j]); /* started but not run (an error) */
    free(jobs);
    return rc;
}

int vks_verify_batch(vks_engine *e, const vks_verify_options *o, const vks_rollout_sample *samples, int n,
                     vks_verdict *out) {
    if (!e || !verify_args_ok(o, samples, n, out)) return vks_set_error(VKS_ERR_ARG, "vks_verify_batch: bad arguments");
    if (!vks_engine_has_embed(e) || !vks_engine_has_head(e))
        return vks_set_error(VKS_ERR_ARG, "vks_verify_batch needs an engine holding every layer");
    if (vks_engine_kv_f16(e) != o->kv_f16)
        return vks_set_error(VKS_ERR_ARG, "verify: the samples were made with an %s KV cache, the engine holds %s",
                             o->kv_f16 ? "f16" : "f32", o->kv_f16 ? "f32" : "f16");
    bool *live = calloc((size_t)n + 1, sizeof *live);
    if (!live) return vks_set_error(VKS_ERR_NOMEM, "verify: out of host memory");
    int rc = start_verdicts(vks_engine_config(e), o, samples, n, out, live);
    if (rc == VKS_OK) rc = verify_gpu_live(e, o, samples, n, out, live);
    free(live);
    return rc;
}

const char *vks_verify_header_problem(const vks_rollout_header *h, const uint8_t model_hash[32],
                                      const int32_t *trusted_stop, int n_trusted) {
    if (!h || !model_hash) return "no rollout header";
    if (memcmp(h->model_hash, model_hash, 32) != 0) return "the rollout file names another model (model_hash differs)";
    for (int i = 0; i < h->n_stop; i++) {
        bool trusted = false;
        for (int j = 0; j < n_trusted && trusted_stop; j++) trusted |= trusted_stop[j] == h->stop_ids[i];
        if (!trusted) return "the rollout file's stop_ids are not among the trusted stop tokens";
    }
    return NULL;
}
