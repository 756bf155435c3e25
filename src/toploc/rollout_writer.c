/* rollout_writer.c: rollout files from generation (generate and pipeline
 * --rollouts-out). Committed hidden rows go to a TOPLOC builder thread as they
 * come back from the device; the file is written whole when generation ends
 * (temporary name, fsync, rename: on failure nothing stays). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "vkswarm/vks_toploc.h"

struct vks_rollout_writer {
    char *path;
    vks_rollout_header header;
    vks_sched_params sp;
    vks_toploc_builder *builder; /* NULL without TOPLOC proofs made here */
    int n_seqs;
    int hidden_rc;               /* the first failure of on_hidden, reported by finish */
    char hidden_error[256];
};

int vks_rollout_writer_create(const char *path, const vks_model *m, const vks_lora_adapter *lora, const char *model_name,
                              const vks_sched_params *sp, int n_seqs, bool toploc, vks_rollout_writer **out) {
    if (!path || !m || !sp || !out || n_seqs < 1)
        return vks_set_error(VKS_ERR_ARG, "vks_rollout_writer_create: bad argument");
    *out = NULL;
    /* fail before generating when the file cannot be made (it is written at the end) */
    vks_outfile probe;
    int rc = vks_outfile_open(&probe, path, 0666);
    if (rc) return rc;
    vks_outfile_abort(&probe);
    vks_rollout_writer *r = calloc(1, sizeof *r);
    if (!r || !(r->path = strdup(path))) {
        free(r);
        return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    }
    r->sp = *sp;
    r->n_seqs = n_seqs;
    r->header.version = VKS_ROLLOUT_VERSION;
    snprintf(r->header.model, sizeof r->header.model, "%s", model_name ? model_name : "");
    if (sp->stop_token_a >= 0) r->header.stop_ids[r->header.n_stop++] = sp->stop_token_a;
    if (sp->stop_token_b >= 0 && sp->stop_token_b != sp->stop_token_a)
        r->header.stop_ids[r->header.n_stop++] = sp->stop_token_b;
    if ((rc = vks_lora_model_hash(m, lora, r->header.model_hash)) ||
        (toploc && (rc = vks_toploc_builder_create(n_seqs, m->cfg.dim, &r->builder)))) {
        vks_rollout_writer_destroy(r);
        return vks_error_prefix(rc, "rollouts");
    }
    *out = r;
    return VKS_OK;
}

void vks_rollout_writer_set_policy(vks_rollout_writer *r, int64_t step, const char *weights) {
    if (!r || step < 0) return;
    r->header.has_policy = true, r->header.policy_step = step;
    snprintf(r->header.policy_weights, sizeof r->header.policy_weights, "%s", weights ? weights : "");
}

void vks_rollout_writer_set_kv_f16(vks_rollout_writer *r, bool on) {
    if (r) r->header.kv_f16 = on;
}

void vks_rollout_writer_on_hidden(vks_rollout_writer *r, const vks_step *st, const vks_seq_state *states,
                                  const float *hidden) {
    if (!r || !r->builder || r->hidden_rc) return;
    size_t dim = vks_toploc_builder_dim(r->builder);
    for (int i = 0; i < st->n_out; i++) {
        int s = st->out_seq[i];
        if (states[s].done) continue; /* vks_sched_apply skips it too */
        int rc = vks_toploc_builder_push(r->builder, s, hidden + (size_t)i * dim);
        if (rc) {
            r->hidden_rc = rc;
            snprintf(r->hidden_error, sizeof r->hidden_error, "%s", vks_last_error());
            return;
        }
    }
}

/* The generated ids, then the stop token when one ended the sequence. */
static int32_t *output_ids(const vks_sequence *s, int *n_out) {
    int n = s->n_ids > s->n_prompt ? s->n_ids - s->n_prompt : 0;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(n + 1));
    if (!ids) return NULL;
    if (n) memcpy(ids, s->ids + s->n_prompt, sizeof(int32_t) * (size_t)n);
    if (s->stop_token >= 0) ids[n++] = s->stop_token;
    *n_out = n;
    return ids;
}

static int write_sample(vks_rollout_writer *r, FILE *f, const vks_sequence *seq, int i, uint32_t stream) {
    char id[64];
    snprintf(id, sizeof id, "%llu-%d", (unsigned long long)r->sp.seed, i);
    vks_rollout_sample s = {.id = id, .seed = r->sp.seed, .seq = stream,
                            .temperature = r->sp.temperature, .top_k = r->sp.top_k, .top_p = r->sp.top_p,
                            .max_steps = r->sp.steps, .prompt_ids = seq->ids, .n_prompt = seq->n_prompt};
    memcpy(s.model_hash, r->header.model_hash, 32);
    s.has_policy = r->header.has_policy, s.policy_step = r->header.policy_step;
    if (!(s.output_ids = output_ids(seq, &s.n_output))) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    int rc = VKS_OK;
    if (r->builder) {
        s.proofs = (uint8_t *)vks_toploc_builder_proofs(r->builder, i, &s.proof_bytes);
        if (vks_toploc_builder_rows(r->builder, i) != s.n_output)
            rc = vks_set_error(VKS_ERR_ARG, "toploc: sequence %d has %d committed rows for %d output tokens", i,
                               vks_toploc_builder_rows(r->builder, i), s.n_output);
    } else if (seq->proofs) { /* made elsewhere: the pipeline's last stage */
        s.proofs = seq->proofs;
        s.proof_bytes = seq->proof_bytes;
    }
    s.stage_proofs = seq->stage_proofs; /* a pipeline's stage commitments, when it made them */
    s.n_stage_proofs = seq->n_stage_proofs;
    if (rc == VKS_OK && (rc = vks_rollout_write_sample(f, &s))) vks_error_prefix(rc, "%s", r->path);
    free(s.output_ids);
    return rc;
}

int vks_rollout_writer_finish(vks_rollout_writer *r, const vks_sequence *seqs, int n, uint32_t seq_base) {
    return vks_rollout_writer_finish_indexed(r, seqs, n, seq_base, NULL);
}

int vks_rollout_writer_finish_indexed(vks_rollout_writer *r, const vks_sequence *seqs, int n, uint32_t seq_base,
                                      const uint32_t *seq_index) {
    if (!r || (!seqs && n > 0)) return vks_set_error(VKS_ERR_ARG, "vks_rollout_writer_finish: bad argument");
    if (r->hidden_rc) return vks_set_error(r->hidden_rc, "toploc: %s", r->hidden_error);
    int rc;
    if (r->builder && (rc = vks_toploc_builder_finish(r->builder))) return vks_error_prefix(rc, "toploc");
    vks_outfile out;
    if ((rc = vks_outfile_open(&out, r->path, 0666))) return rc;
    if ((rc = vks_rollout_write_header(out.f, &r->header))) vks_error_prefix(rc, "%s", r->path);
    for (int i = 0; rc == VKS_OK && i < n && i < r->n_seqs; i++)
        rc = write_sample(r, out.f, &seqs[i], i, seq_index ? seq_index[i] : seq_base + (uint32_t)i);
    if (rc) {
        vks_outfile_abort(&out);
        return rc;
    }
    return vks_outfile_commit(&out);
}

void vks_rollout_writer_destroy(vks_rollout_writer *r) {
    if (!r) return;
    vks_toploc_builder_destroy(r->builder);
    free(r->path);
    free(r);
}
