/* rl_verifier.c: a verifier rank of the RL run across MPI ranks (vks_rl_mpi.h).
 *
 * Inference ranks send it each batch (TO_VERIFY: the GROUPS message with every
 * completion unverified, then the batch's rollout file); it keeps the newest
 * async_level + 3 policies the trainer published, checks that the groups are
 * the file's completions (prompt, tokens, the batch's sampler seed, stream
 * index, temperature), replays them with TOPLOC and the sampling check on the
 * CPU forward of the policy the batch names (vks_verify_batch_cpu), and sends
 * the trainer the accepted completions regrouped (VERIFIED), with the
 * advantages of what is left; each rejected completion is logged with its
 * reason. A batch that is malformed or does not match its rollout file is
 * refused (REFUSE, with the reason), and the trainer refuses its rank. */
#include "vkswarm/vks_rl_mpi.h"
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "rl_cast.h"
#include "rl_orch.h"
#include "rl_wire.h"
#include "vkswarm/vks_grpo.h"
#include "vkswarm/vks_tokenizer.h"
#include "vkswarm/vks_toploc.h"
#include "vkswarm/vks_verify_group.h"

typedef struct {
    int64_t step;        /* -1: empty */
    float *msg;          /* the weights file (the WEIGHTS message layout) */
    vks_lora_adapter *adapter; /* LoRA: the step's adapter instead */
} kept_weights;

typedef struct {
    MPI_Comm comm;
    int me, trainer;
    const vks_rl_run_options *o;
    const vks_rl_mpi_options *mo;
    vks_param_layout *layout;
    kept_weights *kept;
    int n_keep;
    int64_t newest;      /* newest step received, -1: none */
    vks_model *model;    /* the policy of model_step, built when a batch needs it (LoRA: the base, borrowed) */
    const vks_lora_adapter *lora; /* LoRA: model_step's adapter (its kept slot is never replaced while in use) */
    int64_t model_step;
    uint8_t model_hash[32];
    vks_rl_gen gen;      /* the tasks (gen.model: the start model, its shape; not owned) */
    vks_rl_beat beat;
    vks_rl_cast cast;    /* the weights arrive through Shardcast */
    double last_heard;
    bool stop, no_finalize;
    bool every_group;    /* the batch in hand: replay every group whatever verify_sample says (a joined
                          * key on probation: the trainer's FORWARD says so) */
} ver_state;

static kept_weights *find_kept(ver_state *v, int64_t step) {
    for (int i = 0; i < v->n_keep; i++)
        if ((v->kept[i].msg || v->kept[i].adapter) && v->kept[i].step == step) return &v->kept[i];
    return NULL;
}

/* Keeps a WEIGHTS message (or LoRA: an adapter) in place of the oldest one
 * kept, never the adapter in use. */
static void keep_weights(ver_state *v, float *msg, vks_lora_adapter *a, int64_t step) {
    kept_weights *slot = NULL;
    for (int i = 0; i < v->n_keep; i++) {
        kept_weights *k = &v->kept[i];
        if (k->adapter && k->adapter == v->lora) continue;
        if (!k->msg && !k->adapter) { slot = k; break; }
        if (!slot || k->step < slot->step) slot = k;
    }
    free(slot->msg);
    vks_lora_adapter_free(slot->adapter);
    slot->msg = msg, slot->adapter = a, slot->step = step;
    v->newest = step;
}

/* Takes part in the weights broadcast that waits and keeps what it
 * delivered. A failed broadcast is logged, not fatal (as on inference ranks). */
static void take_broadcast(ver_state *v) {
    float *msg = NULL;
    vks_lora_adapter *a = NULL;
    int64_t step = 0;
    int rc = v->cast.lora_base ? vks_rl_cast_receive_adapter(&v->cast, &a, &step) : vks_rl_cast_receive(&v->cast, &msg, &step);
    if (rc) {
        fprintf(stderr, "vkswarm: rl: verifier rank %d: the weights broadcast failed: %s\n", v->me, vks_last_error());
        return;
    }
    keep_weights(v, msg, a, step);
    v->last_heard = vks_seconds_now();
}

/* While a send waits on a peer: beat, and join a weights broadcast. */
static void beat_and_cast(void *ctx) {
    ver_state *v = ctx;
    vks_rl_wire_beat(&v->beat);
    if (vks_rl_cast_waiting(&v->cast)) take_broadcast(v);
}

/* Receives what the trainer sent (stop). */
static int poll_trainer(ver_state *v) {
    for (;;) {
        int flag = 0, count = 0;
        MPI_Status st;
        if (MPI_Iprobe(v->trainer, MPI_ANY_TAG, v->comm, &flag, &st) != MPI_SUCCESS || !flag) return VKS_OK;
        MPI_Get_count(&st, MPI_BYTE, &count);
        if (st.MPI_TAG == TAG_CTL && count == (int)sizeof(vks_rl_msg)) {
            vks_rl_msg h;
            MPI_Recv(&h, sizeof h, MPI_BYTE, v->trainer, TAG_CTL, v->comm, MPI_STATUS_IGNORE);
            if (h.magic != VKS_RL_MAGIC || h.type != MSG_STOP)
                return vks_set_error(VKS_ERR_FORMAT, "a control message of type %u from the trainer", h.type);
            v->stop = true, v->no_finalize = h.n != 0;
        } else if (st.MPI_TAG != TAG_VERIFY) {
            return vks_set_error(VKS_ERR_FORMAT, "a message of %d bytes under tag %d from the trainer", count, st.MPI_TAG);
        } else return VKS_OK; /* the trainer sends no batches: handled (refused) as any sender's */
        v->last_heard = vks_seconds_now();
    }
}

/* Makes the policy of `step` the model to verify with; waits (bounded) for
 * weights the trainer has published but that have not arrived yet. */
static int use_policy(ver_state *v, int64_t step, char *why, size_t cap) {
    if (v->model && v->model_step == step) return VKS_OK;
    double since = vks_seconds_now();
    while (!find_kept(v, step) && step > v->newest && vks_seconds_now() - since < v->mo->timeout_s) {
        int rc = poll_trainer(v);
        if (rc) return rc;
        beat_and_cast(v);
        usleep(1000);
    }
    kept_weights *k = find_kept(v, step);
    if (!k) {
        snprintf(why, cap, "policy step %lld is not among the %d the verifier keeps (newest %lld)", (long long)step,
                 v->n_keep, (long long)v->newest);
        return VKS_ERR_ARG;
    }
    if (k->adapter) { /* LoRA: the base stays; the proofs name base + adapter */
        v->model = (vks_model *)(uintptr_t)v->o->model;
        v->lora = k->adapter;
        int rc = vks_lora_model_hash(v->model, v->lora, v->model_hash);
        v->model_step = rc ? -1 : step;
        return rc;
    }
    vks_model_free(v->model);
    v->model = NULL;
    int rc = vks_rl_wire_model_from_block(v->o->model, v->layout, k->msg, &v->model);
    if (!rc) rc = vks_model_hash(v->model, v->model_hash);
    if (!rc) v->model_step = step;
    return rc;
}

/* The file must be the batch's sampler streams (every record, also those of
 * groups sent without completions), and the groups the file's completions
 * (all group_size of a group, in order). */
static bool matches_file(const ver_state *v, const vks_rollout_file *f, const vks_rl_batch_group *groups, int64_t batch,
                         char *why, size_t cap) {
    const vks_rl_config *c = v->o->config;
    int P = c->prompts_per_step, G = c->group_size;
    if (f->n_samples != P * G) {
        snprintf(why, cap, "its rollout file has %d completions, the batch %d", f->n_samples, P * G);
        return false;
    }
    uint64_t seed = vks_rl_batch_seed(c, batch);
    for (int q = 0; q < P * G; q++) {
        const vks_rollout_sample *r = &f->samples[q];
        if (r->seq != (uint32_t)q || r->seed != seed || r->temperature != (float)c->temperature || r->top_p != 1.0f ||
            r->top_k != 0) {
            snprintf(why, cap, "completion %d: its record is not the batch's sampler stream %d", q, q);
            return false;
        }
    }
    for (int p = 0; p < P; p++) {
        if (groups[p].n && groups[p].n != G) {
            snprintf(why, cap, "group %d has %d completions, not all %d", p, groups[p].n, G);
            return false;
        }
        for (int i = 0; i < groups[p].n; i++) {
            const vks_rl_sample *s = &groups[p].samples[i];
            const vks_rollout_sample *r = &f->samples[p * G + i];
            if (r->n_prompt != s->prompt_len || memcmp(r->prompt_ids, s->tokens, sizeof(int32_t) * (size_t)s->prompt_len) ||
                s->completion_len > r->n_output ||
                memcmp(r->output_ids, s->tokens + s->prompt_len, sizeof(int32_t) * (size_t)s->completion_len)) {
                snprintf(why, cap, "completion %d: not the tokens of its rollout record", p * G + i);
                return false;
            }
        }
    }
    return true;
}

/* verify_sample > 0: the batch is one group (one worker's), a fraction of it
 * checked with a fresh secret per batch; accepted or rejected whole. */
typedef struct {
    const vks_model *m;
    const vks_verify_options *vo; /* its logp_out for the whole file */
    const vks_group_plan *plan;   /* filled before verify_on_cpu is called */
} cpu_verifier;

/* The checked subset s[0..n): its log-probabilities go where the file's do. */
static int verify_on_cpu(void *ctx, const vks_rollout_sample *s, int n, vks_verdict *out) {
    const cpu_verifier *c = ctx;
    if (!n) return VKS_OK;
    float **logp = calloc((size_t)n, sizeof *logp);
    if (!logp) return vks_set_error(VKS_ERR_NOMEM, "verifier: out of host memory");
    for (int i = 0, j = 0; i < c->plan->n_samples && j < n; i++)
        if (c->plan->checked[i]) logp[j++] = c->vo->logp_out ? c->vo->logp_out[i] : NULL;
    vks_verify_options vo = *c->vo;
    vo.logp_out = logp;
    int rc = vks_verify_batch_cpu(c->m, &vo, s, n, out);
    free(logp);
    return rc;
}

static int verify_sampled(ver_state *v, const vks_verify_options *vo, const vks_rollout_sample *s, int n, vks_verdict *out,
                          bool *replayed) {
    vks_group_sampling gs;
    vks_group_sampling_default(&gs);
    gs.fraction = v->o->config->verify_sample, gs.whole_file = true;
    int rc = vks_group_secret_random(&gs.secret);
    vks_group_plan plan = {0};
    cpu_verifier c = {.m = v->model, .vo = vo, .plan = &plan};
    if (!rc) rc = vks_verify_groups(s, n, &gs, verify_on_cpu, &c, out, &plan);
    for (int i = 0; !rc && i < n; i++) replayed[i] = plan.checked[i];
    if (!rc && plan.n_groups == 1) {
        const vks_group_verdict *g = &plan.groups[0];
        fprintf(stderr, "vkswarm: rl: verifier rank %d: batch %s: %d of %d completions checked (%d failed); a batch with "
                ">= 10%% bad completions passes with probability <= %.4g\n", v->me, g->accepted ? "accepted" : "rejected",
                g->n_checked, g->n, g->n_failed, g->pass_bound);
    }
    vks_group_plan_free(&plan);
    return rc;
}

/* The log-probabilities an inference rank sends must be its sampler's: the
 * replay recomputes them from the verifier's logits (f32 on the CPU against
 * the generator's f32, logits within ~4e-5 of each other, so an honest
 * log-probability within ~1e-4), and this is 10 times that. */
#define LOGP_TOLERANCE 1e-3

/* The completions of every group sent without any (the inference rank found
 * no signal in it), rebuilt from their rollout records as the inference side
 * cuts them (at most max_new_tokens, a stop token kept) and re-scored:
 * flat[q] for file completion q of such a group (its tokens owned). Their
 * rewards must carry no signal, else the rank left out a group the policy
 * would learn from. VKS_ERR_FORMAT: why says what is wrong. */
static int rebuild_flat(const ver_state *v, const vks_rollout_file *f, const vks_rl_batch_group *groups, int64_t batch,
                        vks_rl_sample *flat, char *why, size_t cap) {
    const vks_rl_config *c = v->o->config;
    const vks_model_config *mc = &v->o->model->cfg;
    int P = c->prompts_per_step, G = c->group_size;
    for (int p = 0; p < P; p++) {
        if (groups[p].n) continue;
        double r[VKS_RL_MAX_GROUP];
        for (int i = 0; i < G; i++) {
            int q = p * G + i;
            const vks_rollout_sample *rec = &f->samples[q];
            int n_out = rec->n_output < c->max_new_tokens ? rec->n_output : c->max_new_tokens;
            if (rec->n_prompt < 1 || rec->n_prompt > mc->seq_len - c->max_new_tokens || n_out < 0)
                return snprintf(why, cap, "completion %d: a record of %d + %d tokens", q, rec->n_prompt, rec->n_output),
                       VKS_ERR_FORMAT;
            for (int k = 0; k < rec->n_prompt + n_out; k++) {
                int32_t id = k < rec->n_prompt ? rec->prompt_ids[k] : rec->output_ids[k - rec->n_prompt];
                if (id < 0 || id >= mc->vocab_size)
                    return snprintf(why, cap, "completion %d: token %d outside the vocabulary", q, id), VKS_ERR_FORMAT;
            }
            vks_rl_sample *s = &flat[q];
            s->tokens = malloc(sizeof(int32_t) * (size_t)(rec->n_prompt + n_out));
            if (!s->tokens) return vks_set_error(VKS_ERR_NOMEM, "verifier: out of host memory");
            memcpy(s->tokens, rec->prompt_ids, sizeof(int32_t) * (size_t)rec->n_prompt);
            memcpy(s->tokens + rec->n_prompt, rec->output_ids, sizeof(int32_t) * (size_t)n_out);
            s->prompt_len = rec->n_prompt, s->completion_len = n_out;
        }
        /* the group scored at once (a code task's tests in parallel sandboxes) */
        double task_r[VKS_RL_MAX_GROUP];
        char err[200];
        int bad = 0;
        if (vks_rl_score_samples(&v->gen, batch * P + p, &flat[p * G], G, task_r, r, &bad, err, sizeof err))
            return snprintf(why, cap, "completion %d: %s", p * G + bad, err), VKS_ERR_FORMAT;
        for (int i = 0; i < G; i++) flat[p * G + i].task_reward = task_r[i], flat[p * G + i].reward = r[i];
        if (vks_grpo_group_has_signal(r, G)) {
            double lo = r[0], hi = r[0];
            for (int i = 1; i < G; i++) lo = r[i] < lo ? r[i] : lo, hi = r[i] > hi ? r[i] : hi;
            return snprintf(why, cap, "group %d came without its completions, but its rollout records carry signal "
                            "(rewards from %g to %g)", p, lo, hi), VKS_ERR_FORMAT;
        }
    }
    return VKS_OK;
}

/* The sum of the task rewards of every completion of the batch: the groups'
 * (re-scored when unpacked), the rebuilt ones' of the others. */
static double task_reward_sum(const ver_state *v, const vks_rl_batch_group *groups, const vks_rl_sample *flat) {
    const vks_rl_config *c = v->o->config;
    int P = c->prompts_per_step, G = c->group_size;
    double sum = 0;
    for (int q = 0; q < P * G; q++)
        sum += groups[q / G].n ? groups[q / G].samples[q % G].task_reward : flat[q].task_reward;
    return sum;
}

/* Replays every completion of the file (those of groups sent without any
 * too: they vouch for the rank's "no signal"): verdicts[q] for file
 * completion q, logp[q] (n_output floats) the log-probabilities the replay
 * gives its tokens; *checked and *accepted counted. With verify_sample
 * only a drawn share is replayed (replayed[q]); the rest share its verdict. */
static int replay(ver_state *v, const vks_rollout_file *f, const vks_rl_batch_group *groups, const vks_rl_sample *flat,
                  vks_verdict *verdicts, float *const *logp, bool *replayed, int64_t *checked, int64_t *accepted) {
    const vks_rl_config *c = v->o->config;
    int P = c->prompts_per_step, G = c->group_size, n = P * G;
    const int32_t **prompts = calloc((size_t)n, sizeof *prompts);
    int *lens = calloc((size_t)n, sizeof *lens);
    int rc = prompts && lens ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "verifier: out of host memory");
    for (int q = 0; q < n; q++) replayed[q] = true;
    for (int q = 0; !rc && q < n; q++) { /* the prompts were checked against the tasks (unpack, rebuild_flat) */
        const vks_rl_sample *s = groups[q / G].n ? &groups[q / G].samples[q % G] : &flat[q];
        prompts[q] = s->tokens, lens[q] = s->prompt_len;
    }
    vks_verify_options vo;
    vks_verify_options_default(&vo);
    memcpy(vo.model_hash, v->model_hash, 32);
    vo.lora = v->lora; /* LoRA: the replay applies the adapter */
    vo.n_stop = 1, vo.stop_ids[0] = vks_tokenizer_eos(v->o->tok); /* trusted: the model's own, not the file's */
    vo.task_prompts = prompts, vo.task_prompt_lens = lens, vo.n_task_prompts = n;
    vo.cpu_threads = 1;
    vo.logp_out = logp;
    const char *header = rc ? NULL : vks_verify_header_problem(&f->header, v->model_hash, vo.stop_ids, vo.n_stop);
    if (!rc && header) /* another model or untrusted stops: every completion is rejected */
        for (int q = 0; q < n; q++)
            verdicts[q] = (vks_verdict){.accepted = false}, snprintf(verdicts[q].reason, sizeof verdicts[q].reason, "%s", header);
    else if (!rc && c->verify_sample > 0 && !v->every_group) rc = verify_sampled(v, &vo, f->samples, n, verdicts, replayed);
    else if (!rc) rc = vks_verify_batch_cpu(v->model, &vo, f->samples, n, verdicts);
    for (int q = 0; !rc && q < n; q++) ++*checked, *accepted += verdicts[q].accepted;
    if (!rc && *accepted < *checked) rc = vks_rl_record_rejections(&v->gen, f->samples, verdicts, n, &vo);
    free(prompts), free(lens);
    return rc;
}

/* After the replay: no completion may fail a pipeline stage's commitment (the
 * group handed on what the model does not compute there): the batch is
 * refused naming that stage's world rank (*blamed), so that the trainer can
 * refuse the stage and not the group's first rank. */
static bool stages_hold(const ver_state *v, const vks_verdict *verdicts, char *why, size_t cap, int *blamed) {
    const vks_rl_config *c = v->o->config;
    int n = c->prompts_per_step * c->group_size, world = 0;
    MPI_Comm_size(v->comm, &world);
    for (int q = 0; q < n; q++) {
        const vks_verdict *vd = &verdicts[q];
        if (vd->accepted || vd->blamed_rank < 0) continue;
        char reason[4 * sizeof vd->reason];
        vks_escape(vd->reason, strnlen(vd->reason, sizeof vd->reason), reason, sizeof reason);
        snprintf(why, cap, "completion %d is rejected: %.300s", q, reason);
        /* the rank is the file's claim: only a world rank is passed on (the trainer checks it is a stage of the group) */
        *blamed = vd->blamed_rank < world ? vd->blamed_rank : -1;
        return false;
    }
    return true;
}

/* After the replay: every completion of a group sent without any must pass
 * (else its "no signal" is not the sampler's), and every accepted completion
 * of a group must carry the log-probabilities the replay gives. */
static bool replay_agrees(const ver_state *v, const vks_rl_batch_group *groups, const vks_verdict *verdicts,
                          float *const *logp, const bool *replayed, char *why, size_t cap) {
    const vks_rl_config *c = v->o->config;
    int P = c->prompts_per_step, G = c->group_size;
    for (int q = 0; q < P * G; q++) {
        const vks_rl_batch_group *g = &groups[q / G];
        if (!g->n && !verdicts[q].accepted) {
            char reason[4 * sizeof verdicts[q].reason];
            vks_escape(verdicts[q].reason, strnlen(verdicts[q].reason, sizeof verdicts[q].reason), reason, sizeof reason);
            snprintf(why, cap, "group %d came without its completions, but its completion %d is rejected: %.200s", q / G,
                     q, reason);
            return false;
        }
        if (!g->n || !verdicts[q].accepted || !replayed[q]) continue;
        const vks_rl_sample *s = &g->samples[q % G];
        for (int k = 0; k < s->completion_len; k++)
            if (!(fabs((double)s->logp[k] - (double)logp[q][k]) <= LOGP_TOLERANCE)) {
                snprintf(why, cap, "group %d, completion %d: log-probability %g of output %d, the replay gives %g", q / G,
                         q % G, (double)s->logp[k], k, (double)logp[q][k]);
                return false;
            }
    }
    return true;
}

/* Keeps the accepted completions of each group, with the advantages of what
 * is left (none: fewer than two or no signal); logs each rejection. */
static int regroup(ver_state *v, int origin, int64_t batch, vks_rl_batch_group *groups, const vks_verdict *verdicts) {
    const vks_rl_config *c = v->o->config;
    int P = c->prompts_per_step, G = c->group_size;
    for (int p = 0; p < P; p++) {
        vks_rl_batch_group *g = &groups[p];
        int kept = 0;
        for (int i = 0; i < g->n; i++) {
            const vks_verdict *vd = &verdicts[p * G + i];
            if (!vd->accepted) {
                char reason[4 * sizeof vd->reason];
                vks_escape(vd->reason, strnlen(vd->reason, sizeof vd->reason), reason, sizeof reason);
                fprintf(stderr, "vkswarm: rl: verifier rank %d: batch %lld of rank %d: completion %d rejected: %s\n", v->me,
                        (long long)batch, origin, p * G + i, reason);
                free(g->samples[i].tokens), free(g->samples[i].logp);
                continue;
            }
            g->samples[kept] = g->samples[i];
            g->samples[kept++].accepted = true;
        }
        g->n = kept;
        double r[VKS_RL_MAX_GROUP], adv[VKS_RL_MAX_GROUP];
        for (int i = 0; i < kept; i++) r[i] = g->samples[i].reward;
        if (kept < 2 || !vks_grpo_group_has_signal(r, kept)) {
            vks_rl_group_free(g);
            continue;
        }
        int rc = vks_grpo_advantages(r, 1, kept, v->o->config->advantage, adv);
        if (rc) return rc;
        for (int i = 0; i < kept; i++) g->samples[i].advantage = adv[i];
    }
    return VKS_OK;
}

/* Sends the trainer `body` (bytes) after a header (owned from here). */
static int send_up(ver_state *v, const vks_rl_msg *h, void *body, size_t bytes, const char *what) {
    size_t total = sizeof *h + bytes;
    char *msg = total <= INT_MAX ? malloc(total) : NULL;
    int rc = msg ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "verifier: a message of %zu bytes", total);
    if (!rc) {
        memcpy(msg, h, sizeof *h);
        if (bytes) memcpy(msg + sizeof *h, body, bytes);
        MPI_Request req;
        MPI_Isend(msg, (int)total, MPI_BYTE, v->trainer, TAG_UP, v->comm, &req);
        rc = vks_mpi_wait_within_doing(v->comm, &req, &v->trainer, 1, v->mo->timeout_s, what, beat_and_cast, v);
        if (rc) msg = NULL; /* MPI may still read it: left, the rank gives up */
    }
    free(msg), free(body);
    return rc;
}

/* A REFUSE of `origin`'s batch; blamed: the world rank of the pipeline stage
 * whose commitment failed (in the message's step), -1: the sender. */
static int refuse(ver_state *v, int origin, int64_t batch, const char *why, int blamed) {
    if (blamed >= 0) /* the stage is to blame, not the rank that sent the batch */
        fprintf(stderr, "vkswarm: rl: verifier rank %d: batch %lld from rank %d: stage rank %d refused: %s\n", v->me,
                (long long)batch, origin, blamed, why);
    else
        fprintf(stderr, "vkswarm: rl: verifier rank %d: batch %lld of rank %d refused: %s\n", v->me, (long long)batch, origin,
                why);
    char *text = calloc(1, VKS_RL_REASON_MAX);
    if (!text) return vks_set_error(VKS_ERR_NOMEM, "verifier: out of host memory");
    snprintf(text, VKS_RL_REASON_MAX, "%s", why);
    vks_rl_msg h = {.magic = VKS_RL_MAGIC, .type = MSG_REFUSE, .batch = batch, .step = blamed, .n = (uint64_t)origin};
    char what[64];
    snprintf(what, sizeof what, "%s taking a refusal", vks_rl_wire_granter(v->o->config));
    return send_up(v, &h, text, strlen(text) + 1, what);
}

/* Episodes: the groups must be the episodes the turn files give (checks[q] for completion q): each sent
 * completion the rebuilt episode's tokens and mask, its own tokens' log-probabilities the replay's; a
 * group sent without completions must have every episode accepted and no signal in the rewards they
 * earn (scored here: the environment's reward, the thinking budget). VKS_ERR_FORMAT: why says what. */
static int episodes_agree(ver_state *v, int64_t batch, const vks_rl_batch_group *groups, vks_rl_episode_check *checks,
                          vks_verdict *verdicts, char *why, size_t cap) {
    const vks_rl_config *c = v->o->config;
    int P = c->prompts_per_step, G = c->group_size;
    for (int p = 0; p < P; p++) {
        const vks_rl_batch_group *g = &groups[p];
        if (g->n && g->n != G)
            return snprintf(why, cap, "group %d has %d completions, not all %d", p, g->n, G), VKS_ERR_FORMAT;
        for (int i = 0; i < g->n; i++) {
            const vks_rl_sample *s = &g->samples[i];
            const vks_rl_episode_check *e = &checks[p * G + i];
            if (s->prompt_len != e->n_prompt || s->prompt_len + s->completion_len != e->n_ids ||
                memcmp(s->tokens, e->ids, sizeof(int32_t) * (size_t)e->n_ids) || !s->trained ||
                memcmp(s->trained, e->trained, (size_t)s->completion_len)) {
                if (verdicts[p * G + i].accepted) {
                    verdicts[p * G + i].accepted = false;
                    snprintf(verdicts[p * G + i].reason, sizeof verdicts[p * G + i].reason,
                             "not the episode its turn files give");
                }
                continue;
            }
            for (int k = 0; verdicts[p * G + i].accepted && k < s->completion_len; k++)
                if (s->trained[k] && !(fabs((double)s->logp[k] - (double)e->logp[k]) <= LOGP_TOLERANCE))
                    return snprintf(why, cap, "group %d, completion %d: log-probability %g of output %d, the replay "
                                    "gives %g", p, i, (double)s->logp[k], k, (double)e->logp[k]), VKS_ERR_FORMAT;
        }
        if (g->n) continue;
        vks_rl_sample flat[VKS_RL_MAX_GROUP];
        double task_r[VKS_RL_MAX_GROUP], r[VKS_RL_MAX_GROUP];
        for (int i = 0; i < G; i++) {
            const vks_rl_episode_check *e = &checks[p * G + i];
            if (!verdicts[p * G + i].accepted)
                return snprintf(why, cap, "group %d came without its completions, but its completion %d is rejected: "
                                "%.200s", p, p * G + i, verdicts[p * G + i].reason), VKS_ERR_FORMAT;
            flat[i] = (vks_rl_sample){.tokens = e->ids, .prompt_len = e->n_prompt, .completion_len = e->n_ids - e->n_prompt,
                                      .trained = e->trained,
                                      .episode_seed = (uint64_t)(batch * P + p) * (uint64_t)G + (uint64_t)i};
        }
        char err[200];
        int bad = 0;
        if (vks_rl_score_samples(&v->gen, batch * P + p, flat, G, task_r, r, &bad, err, sizeof err))
            return snprintf(why, cap, "completion %d: %s", p * G + bad, err), VKS_ERR_FORMAT;
        if (vks_grpo_group_has_signal(r, G))
            return snprintf(why, cap, "group %d came without its completions, but its episodes carry signal", p),
                   VKS_ERR_FORMAT;
    }
    return VKS_OK;
}

/* A TO_VERIFY message of episodes (its groups at body, then its turn files): every episode rebuilt from its
 * environment and every turn replayed (verify_sample does not apply: each turn is checked), then the groups
 * held against them (episodes_agree). *bad: refused, why says why. */
static int verify_episode_batch(ver_state *v, const vks_rl_msg *h, const char *files_buf, size_t files_bytes,
                                vks_rl_batch_group *groups, vks_rl_gen_counts *cnt, vks_verdict *verdicts, bool *bad,
                                char *why, size_t cap) {
    const vks_rl_config *c = v->o->config;
    int P = c->prompts_per_step, n_all = P * c->group_size, turns = 0;
    const char *raw[VKS_ENV_MAX_TURNS];
    size_t lens[VKS_ENV_MAX_TURNS];
    vks_rollout_file files[VKS_ENV_MAX_TURNS];
    memset(files, 0, sizeof files);
    size_t most = vks_rl_wire_max_rollout_bytes(c, v->o->model->cfg.seq_len);
    if (vks_rl_wire_unpack_turn_files(files_buf, files_bytes, most, raw, lens, &turns))
        return snprintf(why, cap, "%s", vks_last_error()), *bad = true, VKS_OK;
    vks_verify_options vo;
    vks_verify_options_default(&vo);
    memcpy(vo.model_hash, v->model_hash, 32);
    vo.lora = v->lora;
    vo.n_stop = 1, vo.stop_ids[0] = vks_tokenizer_eos(v->o->tok); /* trusted: the model's own, not the file's */
    vo.cpu_threads = 1;
    int read = 0, rc = VKS_OK;
    for (; !*bad && read < turns; read++) {
        char name[96];
        snprintf(name, sizeof name, "batch %lld turn %d", (long long)h->batch, read + 1);
        const char *problem = NULL;
        if (vks_rollout_read_mem(raw[read], lens[read], name, &files[read])) problem = vks_last_error();
        else problem = vks_verify_header_problem(&files[read].header, v->model_hash, vo.stop_ids, vo.n_stop);
        if (problem) snprintf(why, cap, "turn %d: %s", read + 1, problem), *bad = true;
    }
    if (!*bad && files[0].n_samples != n_all)
        snprintf(why, cap, "its first turn's file has %d episodes, the batch %d", files[0].n_samples, n_all), *bad = true;
    vks_rl_episode_check *checks = *bad ? NULL : calloc((size_t)n_all, sizeof *checks);
    if (!*bad && !checks) rc = vks_set_error(VKS_ERR_NOMEM, "verifier: out of host memory");
    if (!*bad && !rc) {
        rc = vks_rl_verify_episodes(&v->gen, v->model, &vo, h->batch, P, files, turns, true, checks);
        if (rc == VKS_ERR_FORMAT) snprintf(why, cap, "%s", vks_last_error()), *bad = true, rc = VKS_OK;
        else if (rc) checks = (free(checks), NULL);
    }
    bool made = !*bad && !rc;
    double sum = 0;
    for (int q = 0; made && q < n_all; q++) verdicts[q] = checks[q].verdict, sum += checks[q].task_reward;
    if (made && !(fabs(sum - cnt->task_reward_sum) <= 1e-9 * (1 + fabs(sum))))
        snprintf(why, cap, "a task reward sum of %g, its episodes give %g", cnt->task_reward_sum, sum), *bad = true;
    if (made && !*bad && episodes_agree(v, h->batch, groups, checks, verdicts, why, cap)) *bad = true;
    cnt->checked = cnt->accepted = 0;
    cnt->task_reward_sum = sum; /* the verifier's own */
    for (int q = 0; made && !*bad && q < n_all; q++) cnt->checked++, cnt->accepted += verdicts[q].accepted;
    if (made && !*bad)
        fprintf(stderr, "vkswarm: rl: verifier rank %d: batch %lld: %d episodes, %d turn files replayed, %lld accepted\n",
                v->me, (long long)h->batch, n_all, turns, (long long)cnt->accepted);
    v->gen.batch = h->batch, v->gen.policy_step = h->step; /* for the record of rejections */
    if (made && !*bad && cnt->accepted < cnt->checked) rc = vks_rl_record_rejections(&v->gen, files[0].samples, verdicts, n_all, &vo);
    if (checks) vks_rl_episode_checks_free(checks, n_all);
    free(checks);
    for (int t = 0; t < read; t++) vks_rollout_file_free(&files[t]);
    return rc;
}

/* A TO_VERIFY message of single-turn completions (its groups unpacked, its rollout file at files_buf):
 * the file must be the batch's sampler streams, groups sent without completions carry no signal, the
 * reward sum is the completions', every completion (or a drawn share) is replayed, no pipeline stage's
 * commitment fails (*blamed: the stage), and the groups carry the replay's log-probabilities. Arrays of
 * the batch's size, owned by the caller: flat, logp, replayed, and f (the file read). *bad: refused. */
static int verify_file_batch(ver_state *v, int origin, const vks_rl_msg *h, const char *files_buf, size_t files_bytes,
                             vks_rl_batch_group *groups, vks_rl_gen_counts *cnt, vks_verdict *verdicts,
                             vks_rl_sample *flat, float **logp, bool *replayed, vks_rollout_file *f, bool *bad,
                             int *blamed, char *why, size_t cap) {
    const vks_rl_config *c = v->o->config;
    int n_all = c->prompts_per_step * c->group_size, rc = VKS_OK;
    char name[64];
    snprintf(name, sizeof name, "rank %d batch %lld", origin, (long long)h->batch);
    *bad = vks_rollout_read_mem(files_buf, files_bytes, name, f) != VKS_OK;
    if (*bad) snprintf(why, cap, "%s", vks_last_error());
    if (!*bad) *bad = !matches_file(v, f, groups, h->batch, why, cap);
    if (!*bad && (rc = rebuild_flat(v, f, groups, h->batch, flat, why, cap)) == VKS_ERR_FORMAT) *bad = true, rc = VKS_OK;
    double sum = *bad || rc ? 0 : task_reward_sum(v, groups, flat);
    if (!*bad && !rc && !(fabs(sum - cnt->task_reward_sum) <= 1e-9 * (1 + sum))) {
        snprintf(why, cap, "a task reward sum of %g, its completions give %g", cnt->task_reward_sum, sum);
        *bad = true;
    }
    for (int q = 0; !*bad && !rc && q < n_all; q++)
        if (groups[q / c->group_size].n && !(logp[q] = malloc(sizeof(float) * (size_t)(f->samples[q].n_output + 1))))
            rc = vks_set_error(VKS_ERR_NOMEM, "verifier: out of host memory");
    cnt->checked = cnt->accepted = 0;
    cnt->task_reward_sum = sum; /* the verifier's own */
    v->gen.batch = h->batch, v->gen.policy_step = h->step; /* for the record of rejections */
    if (!*bad && !rc) rc = replay(v, f, groups, flat, verdicts, logp, replayed, &cnt->checked, &cnt->accepted);
    if (!*bad && !rc) *bad = !stages_hold(v, verdicts, why, cap, blamed);
    if (!*bad && !rc) *bad = !replay_agrees(v, groups, verdicts, logp, replayed, why, cap);
    return rc;
}

/* One TO_VERIFY message of `bytes` from inference rank `origin`. */
static int verify_message(ver_state *v, int origin, const char *buf, size_t bytes) {
    const vks_rl_config *c = v->o->config;
    int P = c->prompts_per_step;
    vks_rl_msg h;
    memcpy(&h, buf, sizeof h);
    if (h.magic != VKS_RL_MAGIC || h.type != MSG_TO_VERIFY || h.n > bytes - sizeof h)
        return refuse(v, origin, h.batch, "a malformed batch for verification", -1);
    char why[512] = "";
    int rc = use_policy(v, h.step, why, sizeof why);
    if (rc == VKS_ERR_ARG) return refuse(v, origin, h.batch, why, -1);
    if (rc) return rc;
    int n_all = P * c->group_size;
    vks_rl_batch_group *groups = calloc((size_t)P, sizeof *groups);
    vks_verdict *verdicts = calloc((size_t)n_all, sizeof *verdicts);
    vks_rl_sample *flat = calloc((size_t)n_all, sizeof *flat);
    float **logp = calloc((size_t)n_all, sizeof *logp);
    bool *replayed = calloc((size_t)n_all, sizeof *replayed);
    if (!groups || !verdicts || !flat || !logp || !replayed) {
        free(groups), free(verdicts), free(flat), free(logp), free(replayed);
        return vks_set_error(VKS_ERR_NOMEM, "verifier: out of host memory");
    }
    int64_t policy = 0;
    vks_rl_gen_counts cnt;
    vks_rollout_file f = {0};
    bool bad = vks_rl_wire_unpack_groups(buf + sizeof h, h.n, &v->gen, c, &v->o->model->cfg, h.batch, h.step, h.step,
                                         true, groups, &policy, &cnt, why, sizeof why) != VKS_OK;
    if (!bad) bad = vks_rl_wire_check_counts(&cnt, groups, P, false, why, sizeof why) != VKS_OK;
    const char *files = buf + sizeof h + h.n;
    size_t files_bytes = bytes - sizeof h - h.n;
    int blamed = -1;
    if (!bad && v->gen.episodes) /* every turn and every episode checked */
        rc = verify_episode_batch(v, &h, files, files_bytes, groups, &cnt, verdicts, &bad, why, sizeof why);
    else if (!bad)
        rc = verify_file_batch(v, origin, &h, files, files_bytes, groups, &cnt, verdicts, flat, logp, replayed, &f, &bad,
                               &blamed, why, sizeof why);
    if (!bad && !rc) rc = regroup(v, origin, h.batch, groups, verdicts);
    size_t n = 0;
    void *packed = bad || rc ? NULL : vks_rl_wire_pack_groups(groups, P, h.batch, h.step, &cnt, &n);
    if (!bad && !rc && !packed) rc = vks_set_error(VKS_ERR_NOMEM, "verifier: out of host memory");
    for (int p = 0; p < P; p++) vks_rl_group_free(&groups[p]);
    for (int q = 0; q < n_all; q++) free(flat[q].tokens), free(logp[q]);
    free(groups), free(verdicts), free(flat), free(logp), free(replayed);
    vks_rollout_file_free(&f);
    if (rc) return rc;
    if (bad) return refuse(v, origin, h.batch, why, blamed);
    vks_rl_msg up = {.magic = VKS_RL_MAGIC, .type = MSG_VERIFIED, .batch = h.batch, .step = h.step, .n = (uint64_t)origin};
    char what[64];
    snprintf(what, sizeof what, "%s taking verdicts", vks_rl_wire_granter(v->o->config));
    return send_up(v, &up, packed, n, what);
}

/* Whether rank is the first of an inference group (the rank that sends a group's batches). */
static bool is_inference_rank(const vks_rl_config *c, int rank) {
    for (int i = 0; i < c->n_groups; i++)
        if (c->inference_ranks[c->groups[i].first] == rank) return true;
    return false;
}

/* A joined rank's batch, passed on by the trainer (the only rank that reaches
 * it): FORWARD (n: its rank number, step: 1 to replay every group) in front
 * of its TO_VERIFY message. */
static int verify_forwarded(ver_state *v, const char *buf, size_t bytes) {
    vks_rl_msg fw;
    memcpy(&fw, buf, sizeof fw);
    int world = 0;
    MPI_Comm_size(v->comm, &world);
    if (bytes < 2 * sizeof fw || fw.magic != VKS_RL_MAGIC || fw.type != MSG_FORWARD || fw.n < (uint64_t)world ||
        fw.n > INT_MAX || (fw.step != 0 && fw.step != 1))
        return vks_set_error(VKS_ERR_FORMAT, "verifier rank %d: a malformed batch from the trainer", v->me);
    v->every_group = fw.step == 1;
    if (v->every_group && v->o->config->verify_sample > 0)
        fprintf(stderr, "vkswarm: rl: verifier rank %d: batch %lld of joined rank %d: its key is on probation, every "
                "completion replayed\n", v->me, (long long)fw.batch, (int)fw.n);
    int rc = verify_message(v, (int)fw.n, buf + sizeof fw, bytes - sizeof fw);
    v->every_group = false;
    return rc;
}

/* Receives a probed TAG_VERIFY message; one too big to be honest is received
 * into nothing (a truncation error) and refused. */
static int receive_batch(ver_state *v, const MPI_Status *st) {
    const vks_rl_config *c = v->o->config;
    int count = 0, seq_len = v->o->model->cfg.seq_len;
    MPI_Get_count(st, MPI_BYTE, &count);
    bool forwarded = st->MPI_SOURCE == v->trainer; /* a joined rank's (verify_forwarded) */
    size_t most = sizeof(vks_rl_msg) * (forwarded ? 2 : 1) + vks_rl_wire_max_groups_bytes(c, seq_len) +
                  vks_rl_wire_max_verify_files_bytes(c, seq_len, v->gen.episodes);
    bool fits = count >= (int)sizeof(vks_rl_msg) && (size_t)count <= most;
    char small[sizeof(vks_rl_msg)];
    char *buf = fits ? malloc((size_t)count) : small;
    if (!buf) return vks_set_error(VKS_ERR_NOMEM, "verifier: out of host memory");
    int mrc = MPI_Recv(buf, fits ? count : (int)sizeof small, MPI_BYTE, st->MPI_SOURCE, TAG_VERIFY, v->comm, MPI_STATUS_IGNORE);
    int rc = VKS_OK;
    if (forwarded && fits && mrc == MPI_SUCCESS) {
        rc = verify_forwarded(v, buf, (size_t)count);
    } else if (forwarded) {
        rc = vks_set_error(VKS_ERR_FORMAT, "verifier rank %d: a batch of %d bytes from the trainer", v->me, count);
    } else if (!is_inference_rank(c, st->MPI_SOURCE)) { /* only inference ranks send batches: ignored */
    } else if (!fits || mrc != MPI_SUCCESS) {
        char why[96];
        snprintf(why, sizeof why, "a batch of %d bytes (at most %zu)", count, most);
        rc = refuse(v, st->MPI_SOURCE, -1, why, -1); /* which batch it is cannot be read */
    } else rc = verify_message(v, st->MPI_SOURCE, buf, (size_t)count);
    if (fits) free(buf);
    return rc;
}

int vks_rl_mpi_verifier(const vks_rl_run_options *o, const vks_rl_mpi_options *mo, bool *no_finalize) {
    *no_finalize = false;
    if (!o || !o->config || !o->model || !o->tok || !mo || !(mo->timeout_s > 0))
        return vks_set_error(VKS_ERR_ARG, "rl: bad options");
    int rc = vks_rl_mpi_check_roles(o->config, mo->join_server != NULL);
    if (rc) return rc;
    ver_state v = {.comm = vks_mpi_world(), .trainer = o->config->orchestrator, /* grants, STOP, verdicts: the orchestrator */ .o = o, .mo = mo, .newest = -1,
                   .model_step = -1, .n_keep = o->config->async_level + 3};
    MPI_Comm_set_errhandler(v.comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(v.comm, &v.me);
    v.beat = (vks_rl_beat){.comm = v.comm, .trainer = v.trainer, .req = MPI_REQUEST_NULL};
    v.kept = calloc((size_t)v.n_keep, sizeof *v.kept);
    if (!v.kept) rc = vks_set_error(VKS_ERR_NOMEM, "verifier: out of host memory");
    if (!rc) rc = vks_param_layout_create(&o->model->cfg, vks_model_has_bias(o->model), &v.layout);
    v.gen.o = o;
    v.gen.model = (vks_model *)(uintptr_t)o->model; /* read only: its shape */
    v.gen.episodes_allowed = vks_rl_config_episodes_across_ranks(o->config); /* rebuilt here: verify_episode_batch */
    if (!rc) rc = vks_rl_gen_open_tasks(&v.gen);
    /* rejections are recorded in OUT/verifier-rankV/rejected.jsonl */
    char sub[32];
    snprintf(sub, sizeof sub, "verifier-rank%d", v.me);
    if (!rc) rc = vks_rl_gen_make_dirs(&v.gen, sub);
    double bound = mo->trainer_timeout_s > mo->timeout_s ? mo->trainer_timeout_s : mo->timeout_s;
    if (!rc) rc = vks_rl_cast_open(&v.cast, o, mo, v.layout->n_values, bound, &v.beat);
    v.last_heard = vks_seconds_now();
    while (!rc && !v.stop) {
        beat_and_cast(&v);
        if ((rc = poll_trainer(&v)) || v.stop) break;
        int flag = 0;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_VERIFY, v.comm, &flag, &st) == MPI_SUCCESS && flag) {
            rc = receive_batch(&v, &st);
            continue;
        }
        if (vks_seconds_now() - v.last_heard > bound) {
            rc = vks_set_error(VKS_ERR_TIMEOUT, "rank %d did not answer within %.1f s (%s)", v.trainer, bound,
                               vks_rl_mpi_peer_name(o->config));
            v.no_finalize = true;
        }
        usleep(1000);
    }
    *no_finalize = v.no_finalize;
    vks_rl_cast_close(&v.cast);
    for (int i = 0; v.kept && i < v.n_keep; i++) free(v.kept[i].msg), vks_lora_adapter_free(v.kept[i].adapter);
    free(v.kept);
    if (!v.lora) vks_model_free(v.model); /* LoRA: the base, borrowed */
    v.gen.model = NULL;
    vks_rl_gen_close(&v.gen);
    vks_param_layout_free(v.layout);
    return rc;
}
