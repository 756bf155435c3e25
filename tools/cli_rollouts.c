#include "cli_rollouts.h"
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include "cli_util.h"
#include "vkswarm/vks_rollout.h"
#include "vkswarm/vks_toploc.h"

struct cli_rollouts {
    vks_outfile out; /* open only while cli_rollouts_finish writes */
    const char *path;
    vks_rollout_header header;
    vks_sched_params sp;
    vks_toploc_builder *builder; /* NULL without --toploc */
    int n_seqs;
};

cli_rollouts *cli_rollouts_start(const char *path, const vks_model *m, const char *model_name,
                                 const vks_sched_params *sp, int n_seqs, bool toploc) {
    cli_rollouts *r = calloc(1, sizeof *r);
    if (!r) cli_die(1, "out of host memory");
    /* fail before generating when the file cannot be made (it is written at the end) */
    if (vks_outfile_open(&r->out, path, 0666)) cli_die(EXIT_BAD_INPUT, "%s", vks_last_error());
    vks_outfile_abort(&r->out);
    r->path = path;
    r->sp = *sp;
    r->n_seqs = n_seqs;
    r->header.version = VKS_ROLLOUT_VERSION;
    snprintf(r->header.model, sizeof r->header.model, "%s", model_name ? model_name : "");
    if (vks_model_hash(m, r->header.model_hash)) cli_die(1, "model hash: %s", vks_last_error());
    if (sp->stop_token_a >= 0) r->header.stop_ids[r->header.n_stop++] = sp->stop_token_a;
    if (sp->stop_token_b >= 0 && sp->stop_token_b != sp->stop_token_a)
        r->header.stop_ids[r->header.n_stop++] = sp->stop_token_b;
    if (toploc && vks_toploc_builder_create(n_seqs, m->cfg.dim, &r->builder))
        cli_die(1, "toploc: %s", vks_last_error());
    return r;
}

void cli_rollouts_on_hidden(cli_rollouts *r, const vks_step *st, const vks_seq_state *states, const float *hidden) {
    if (!r->builder) return;
    size_t dim = vks_toploc_builder_dim(r->builder);
    for (int i = 0; i < st->n_out; i++) {
        int s = st->out_seq[i];
        if (states[s].done) continue; /* vks_sched_apply skips it too */
        if (vks_toploc_builder_push(r->builder, s, hidden + (size_t)i * dim))
            cli_die(1, "toploc: %s", vks_last_error());
    }
}

static int32_t *output_ids(const vks_sequence *s, int *n_out) {
    int n = s->n_ids > s->n_prompt ? s->n_ids - s->n_prompt : 0;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(n + 1));
    if (!ids) cli_die(1, "out of host memory");
    if (n) memcpy(ids, s->ids + s->n_prompt, sizeof(int32_t) * (size_t)n);
    if (s->stop_token >= 0) ids[n++] = s->stop_token;
    *n_out = n;
    return ids;
}

/* Drops the unfinished file (no partial output stays), then exits 1. */
static _Noreturn __attribute__((format(printf, 2, 3))) void rollouts_fail(cli_rollouts *r, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    vks_outfile_abort(&r->out);
    cli_die(1, "%s", msg);
}

void cli_rollouts_finish(cli_rollouts *r, const vks_sequence *seqs, int n, uint32_t seq_base) {
    if (r->builder && vks_toploc_builder_finish(r->builder)) cli_die(1, "toploc: %s", vks_last_error());
    if (vks_outfile_open(&r->out, r->path, 0666)) cli_die(1, "%s", vks_last_error());
    if (vks_rollout_write_header(r->out.f, &r->header)) rollouts_fail(r, "%s: %s", r->path, vks_last_error());
    for (int i = 0; i < n && i < r->n_seqs; i++) {
        char id[64];
        snprintf(id, sizeof id, "%llu-%d", (unsigned long long)r->sp.seed, i);
        vks_rollout_sample s = {.id = id, .seed = r->sp.seed, .seq = seq_base + (uint32_t)i,
                                .temperature = r->sp.temperature, .top_k = r->sp.top_k, .top_p = r->sp.top_p,
                                .max_steps = r->sp.steps, .prompt_ids = seqs[i].ids, .n_prompt = seqs[i].n_prompt};
        memcpy(s.model_hash, r->header.model_hash, 32);
        s.output_ids = output_ids(&seqs[i], &s.n_output);
        if (r->builder) {
            s.proofs = (uint8_t *)vks_toploc_builder_proofs(r->builder, i, &s.proof_bytes);
            if (vks_toploc_builder_rows(r->builder, i) != s.n_output)
                rollouts_fail(r, "toploc: sequence %d has %d committed rows for %d output tokens", i,
                        vks_toploc_builder_rows(r->builder, i), s.n_output);
        } else if (seqs[i].proofs) { /* made elsewhere: the pipeline's last stage */
            s.proofs = seqs[i].proofs;
            s.proof_bytes = seqs[i].proof_bytes;
        }
        if (vks_rollout_write_sample(r->out.f, &s)) rollouts_fail(r, "%s: %s", r->path, vks_last_error());
        free(s.output_ids);
    }
    if (vks_outfile_commit(&r->out)) cli_die(1, "%s", vks_last_error());
    vks_toploc_builder_destroy(r->builder);
    free(r);
}
