/* rl_wire.c: the RL run's messages between ranks (rl_wire.h). */
#include "rl_wire.h"
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "vkswarm/vks_grpo.h"

/* ---- wire format of a batch's groups ---- */

size_t vks_rl_wire_max_groups_bytes(const vks_rl_config *c, int seq_len) {
    size_t per_sample = sizeof(wire_sample) + sizeof(int32_t) * (size_t)seq_len +
                        (sizeof(float) + 1) * (size_t)c->max_new_tokens; /* logp and the mask */
    return sizeof(vks_rl_msg) + 3 * sizeof(int64_t) + sizeof(double) +
           (size_t)c->prompts_per_step * (sizeof(wire_group) + (size_t)c->group_size * per_sample);
}

/* Per completion: its ids as JSON text (at most 12 bytes each), TOPLOC proofs
 * (a few hundred bytes per 32 positions, in hex) and the fields: far above
 * what a real file holds, far below a worrying allocation. */
size_t vks_rl_wire_max_rollout_bytes(const vks_rl_config *c, int seq_len) {
    size_t stages = 1; /* a pipeline group's stage commitments: base64 of 258 bytes per 32 positions each */
    for (int i = 0; i < c->n_groups; i++) stages = (size_t)c->groups[i].n > stages ? (size_t)c->groups[i].n : stages;
    return 65536 + (size_t)c->prompts_per_step * (size_t)c->group_size *
                       (65536 + (64 + 16 * (stages - 1)) * (size_t)seq_len);
}

size_t vks_rl_wire_max_verify_files_bytes(const vks_rl_config *c, int seq_len, bool episodes) {
    size_t one = vks_rl_wire_max_rollout_bytes(c, seq_len);
    return episodes ? sizeof(uint32_t) + (size_t)VKS_ENV_MAX_TURNS * (sizeof(uint64_t) + one) : one;
}

int vks_rl_wire_pack_turn_files(char *const *files, const size_t *lens, int turns, char **out, size_t *bytes) {
    *out = NULL, *bytes = 0;
    if (turns < 1 || turns > VKS_ENV_MAX_TURNS) return vks_set_error(VKS_ERR_ARG, "%d turn files", turns);
    size_t n = sizeof(uint32_t) + sizeof(uint64_t) * (size_t)turns;
    for (int t = 0; t < turns; t++) n += lens[t];
    char *b = malloc(n);
    if (!b) return vks_set_error(VKS_ERR_NOMEM, "out of host memory for %zu bytes of turn files", n);
    uint32_t k = (uint32_t)turns;
    memcpy(b, &k, sizeof k);
    size_t at = sizeof k + sizeof(uint64_t) * (size_t)turns;
    for (int t = 0; t < turns; t++) {
        uint64_t len = lens[t];
        memcpy(b + sizeof k + sizeof len * (size_t)t, &len, sizeof len);
        memcpy(b + at, files[t], lens[t]);
        at += lens[t];
    }
    *out = b, *bytes = n;
    return VKS_OK;
}

int vks_rl_wire_unpack_turn_files(const char *buf, size_t bytes, size_t most_each, const char **files, size_t *lens,
                                  int *turns) {
    uint32_t k = 0;
    *turns = 0;
    if (bytes < sizeof k) return vks_set_error(VKS_ERR_FORMAT, "no turn files");
    memcpy(&k, buf, sizeof k);
    if (k < 1 || k > VKS_ENV_MAX_TURNS || bytes < sizeof k + sizeof(uint64_t) * (size_t)k)
        return vks_set_error(VKS_ERR_FORMAT, "%u turn files (1 to %d) in %zu bytes", k, VKS_ENV_MAX_TURNS, bytes);
    size_t at = sizeof k + sizeof(uint64_t) * (size_t)k;
    for (uint32_t t = 0; t < k; t++) {
        uint64_t len;
        memcpy(&len, buf + sizeof k + sizeof len * (size_t)t, sizeof len);
        if (len > most_each || len > bytes - at)
            return vks_set_error(VKS_ERR_FORMAT, "turn file %u: %llu bytes (%zu left, at most %zu)", t + 1,
                                 (unsigned long long)len, bytes - at, most_each);
        files[t] = buf + at, lens[t] = (size_t)len;
        at += (size_t)len;
    }
    if (at != bytes) return vks_set_error(VKS_ERR_FORMAT, "%zu bytes after the turn files", bytes - at);
    *turns = (int)k;
    return VKS_OK;
}

void *vks_rl_wire_pack_groups(const vks_rl_batch_group *groups, int P, int64_t batch, int64_t step,
                         const vks_rl_gen_counts *cnt, size_t *bytes) {
    size_t n = sizeof(vks_rl_msg) + 3 * sizeof(int64_t) + sizeof(double);
    for (int p = 0; p < P; p++) {
        n += sizeof(wire_group);
        for (int i = 0; i < groups[p].n; i++) {
            const vks_rl_sample *s = &groups[p].samples[i];
            n += sizeof(wire_sample) + sizeof(int32_t) * (size_t)(s->prompt_len + s->completion_len) +
                 sizeof(float) * (size_t)s->completion_len + (s->trained ? (size_t)s->completion_len : 0);
        }
    }
    char *buf = malloc(n), *q = buf;
    if (!buf) return NULL;
    vks_rl_msg h = {.magic = VKS_RL_MAGIC, .type = MSG_GROUPS, .batch = batch, .step = step, .n = n};
    memcpy(q, &h, sizeof h), q += sizeof h;
    int64_t c3[3] = {cnt->rollouts, cnt->checked, cnt->accepted};
    memcpy(q, c3, sizeof c3), q += sizeof c3;
    memcpy(q, &cnt->task_reward_sum, sizeof(double)), q += sizeof(double);
    for (int p = 0; p < P; p++) {
        wire_group wg = {.n = groups[p].n, .task_index = groups[p].task_index};
        memcpy(q, &wg, sizeof wg), q += sizeof wg;
        for (int i = 0; i < groups[p].n; i++) {
            const vks_rl_sample *s = &groups[p].samples[i];
            wire_sample ws = {.prompt_len = s->prompt_len, .completion_len = s->completion_len, .accepted = s->accepted,
                              .has_mask = s->trained != NULL, .task_reward = s->task_reward, .reward = s->reward,
                              .advantage = s->advantage, .episode_seed = s->episode_seed};
            memcpy(q, &ws, sizeof ws), q += sizeof ws;
            size_t nt = sizeof(int32_t) * (size_t)(s->prompt_len + s->completion_len);
            memcpy(q, s->tokens, nt), q += nt;
            memcpy(q, s->logp, sizeof(float) * (size_t)s->completion_len), q += sizeof(float) * (size_t)s->completion_len;
            if (s->trained) memcpy(q, s->trained, (size_t)s->completion_len), q += s->completion_len;
        }
    }
    *bytes = n;
    return buf;
}

typedef struct {
    const char *p, *end;
} cursor;

static bool take_bytes(cursor *c, void *dst, size_t n) {
    if ((size_t)(c->end - c->p) < n) return false;
    memcpy(dst, c->p, n);
    c->p += n;
    return true;
}

/* Checks and unpacks a GROUPS message of `bytes` from an inference rank that
 * was granted batch `batch` with policy step at least `min_step`, the trainer
 * having published up to `newest`. Any failure: err says why, nothing kept. */
int vks_rl_wire_unpack_groups(const void *buf, size_t bytes, const vks_rl_gen *gen, const vks_rl_config *c,
                              const vks_model_config *mc, int64_t batch, int64_t min_step, int64_t newest,
                              bool unverified, vks_rl_batch_group *groups, int64_t *policy, vks_rl_gen_counts *cnt,
                              char *err, size_t cap) {
    int P = c->prompts_per_step, G = c->group_size;
    cursor cu = {buf, (const char *)buf + bytes};
    vks_rl_msg h;
    int64_t c3[3] = {0, 0, 0};
    memset(groups, 0, sizeof *groups * (size_t)P);
#define BAD(...) do { snprintf(err, cap, __VA_ARGS__); goto fail; } while (0)
    if (!take_bytes(&cu, &h, sizeof h) || h.magic != VKS_RL_MAGIC || h.type != MSG_GROUPS || h.n != bytes)
        BAD("a malformed message of %zu bytes", bytes);
    if (h.batch != batch) BAD("batch %lld, but it was granted batch %lld", (long long)h.batch, (long long)batch);
    if (h.step < min_step || h.step > newest)
        BAD("policy step %lld outside [%lld, %lld]", (long long)h.step, (long long)min_step, (long long)newest);
    if (!take_bytes(&cu, c3, sizeof c3) || c3[0] != (int64_t)P * G || c3[1] < 0 || c3[1] > c3[0] || c3[2] < 0 ||
        c3[2] > c3[1])
        BAD("counts %lld/%lld/%lld for a batch of %d", (long long)c3[0], (long long)c3[1], (long long)c3[2], P * G);
    double reward_sum = 0; /* bounded here; against the groups: vks_rl_wire_check_counts */
    if (!take_bytes(&cu, &reward_sum, sizeof reward_sum) || !(reward_sum >= 0 && reward_sum <= (double)c3[0]))
        BAD("a task reward sum of %g for %lld rollouts", reward_sum, (long long)c3[0]);
    *cnt = (vks_rl_gen_counts){c3[0], c3[1], c3[2], reward_sum};
    *policy = h.step;
    for (int p = 0; p < P; p++) {
        wire_group wg;
        if (!take_bytes(&cu, &wg, sizeof wg)) BAD("truncated at group %d", p);
        if (wg.n < 0 || wg.n > G || wg.n == 1) BAD("group %d has %d completions (0 or 2..%d)", p, wg.n, G);
        if (wg.task_index != batch * P + p) BAD("group %d is task %lld, not %lld", p, (long long)wg.task_index, (long long)(batch * P + p));
        vks_rl_batch_group *g = &groups[p];
        g->policy_step = h.step, g->task_index = wg.task_index;
        if (!wg.n) continue;
        g->samples = calloc((size_t)wg.n, sizeof *g->samples);
        if (!g->samples) BAD("out of host memory");
        double rewards[VKS_RL_MAX_GROUP], adv[VKS_RL_MAX_GROUP];
        for (int i = 0; i < wg.n; i++) {
            wire_sample ws;
            if (!take_bytes(&cu, &ws, sizeof ws)) BAD("truncated at group %d, completion %d", p, i);
            if (ws.prompt_len < 1 || ws.completion_len < 0 || ws.completion_len > c->max_new_tokens ||
                ws.prompt_len > mc->seq_len - c->max_new_tokens)
                BAD("group %d, completion %d: lengths %d + %d (prompt at most %d, completion at most %d)", p, i,
                    ws.prompt_len, ws.completion_len, mc->seq_len - c->max_new_tokens, c->max_new_tokens);
            if (ws.has_mask != gen->episodes || (!ws.has_mask && ws.episode_seed))
                BAD("group %d, completion %d: %s", p, i, gen->episodes ? "an episode without its mask" : "a mask or "
                    "seed of an episode, but the run's tasks are not environments");
            if (unverified ? ws.accepted != 0 : ws.accepted != 1)
                BAD("group %d, completion %d: %s", p, i, unverified ? "a verdict before any verifier saw it"
                                                                      : "not accepted by its verifier");
            if (!(ws.task_reward >= 0 && ws.task_reward <= 1) || !isfinite(ws.reward) || !isfinite(ws.advantage))
                BAD("group %d, completion %d: reward %g / %g, advantage %g", p, i, ws.task_reward, ws.reward, ws.advantage);
            vks_rl_sample *s = &g->samples[g->n++];
            *s = (vks_rl_sample){.prompt_len = ws.prompt_len, .completion_len = ws.completion_len, .accepted = !unverified,
                                 .task_reward = ws.task_reward, .reward = ws.reward, .advantage = ws.advantage,
                                 .episode_seed = ws.episode_seed};
            int len = ws.prompt_len + ws.completion_len;
            s->tokens = malloc(sizeof(int32_t) * (size_t)len);
            s->logp = malloc(sizeof(float) * (size_t)(ws.completion_len ? ws.completion_len : 1));
            if (!s->tokens || !s->logp) BAD("out of host memory");
            if (ws.has_mask && !(s->trained = malloc((size_t)(ws.completion_len ? ws.completion_len : 1))))
                BAD("out of host memory");
            if (!take_bytes(&cu, s->tokens, sizeof(int32_t) * (size_t)len) ||
                !take_bytes(&cu, s->logp, sizeof(float) * (size_t)ws.completion_len) ||
                (ws.has_mask && !take_bytes(&cu, s->trained, (size_t)ws.completion_len)))
                BAD("truncated at group %d, completion %d", p, i);
            for (int k = 0; k < len; k++)
                if (s->tokens[k] < 0 || s->tokens[k] >= mc->vocab_size)
                    BAD("group %d, completion %d: token %d outside the vocabulary of %d", p, i, s->tokens[k], mc->vocab_size);
            for (int k = 0; k < ws.completion_len; k++)
                if (!isfinite(s->logp[k]) || s->logp[k] > 0)
                    BAD("group %d, completion %d: log-probability %g", p, i, (double)s->logp[k]);
            rewards[i] = ws.reward;
        }
        /* every completion scored again here (a code task's tests: the group's at once, in parallel sandboxes) */
        char why[200];
        int bad = 0;
        if (vks_rl_check_samples(gen, wg.task_index, g->samples, g->n, &bad, why, sizeof why))
            BAD("group %d, completion %d: %s", p, bad, why);
        /* the advantages must be the group's own (a rank cannot inflate them) */
        /* (a verifier rank filters what is left after its verdicts) */
        if (!unverified && !vks_grpo_group_has_signal(rewards, wg.n)) BAD("group %d has no signal", p);
        if (vks_grpo_advantages(rewards, 1, wg.n, c->advantage, adv)) BAD("group %d: %s", p, vks_last_error());
        for (int i = 0; i < wg.n; i++)
            if (fabs(adv[i] - g->samples[i].advantage) > 1e-9 * (1 + fabs(adv[i])))
                BAD("group %d, completion %d: advantage %g, its rewards give %g", p, i, g->samples[i].advantage, adv[i]);
    }
    if (cu.p != cu.end) BAD("%zu bytes past the last group", (size_t)(cu.end - cu.p));
#undef BAD
    return VKS_OK;
fail:
    for (int p = 0; p < P; p++) vks_rl_group_free(&groups[p]);
    return VKS_ERR_FORMAT;
}

int vks_rl_wire_check_counts(const vks_rl_gen_counts *cnt, const vks_rl_batch_group *groups, int P, bool verified,
                             char *err, size_t cap) {
    int64_t sent = 0;
    double sent_sum = 0;
    for (int p = 0; p < P; p++)
        for (int i = 0; i < groups[p].n; i++) sent++, sent_sum += groups[p].samples[i].task_reward;
    bool checks = verified ? cnt->checked == cnt->rollouts && cnt->accepted >= sent : cnt->checked == 0 && cnt->accepted == 0;
    if (!checks) {
        snprintf(err, cap, "counts of %lld checked and %lld accepted for %lld rollouts, %lld completions sent (%s)",
                 (long long)cnt->checked, (long long)cnt->accepted, (long long)cnt->rollouts, (long long)sent,
                 verified ? "every rollout is checked" : "none is checked there");
        return VKS_ERR_FORMAT;
    }
    double slack = 1e-9 * (1 + sent_sum), most = sent_sum + (double)(cnt->rollouts - sent);
    if (!(cnt->task_reward_sum >= sent_sum - slack && cnt->task_reward_sum <= most + slack)) {
        snprintf(err, cap, "a task reward sum of %g, the completions sent give %g (at most %g with those not sent)",
                 cnt->task_reward_sum, sent_sum, most);
        return VKS_ERR_FORMAT;
    }
    return VKS_OK;
}

int vks_rl_wire_send(MPI_Comm comm, int rank, int tag, void *buf, size_t bytes, double timeout_s, const char *what,
                     bool *freeable) {
    *freeable = true;
    if (bytes > INT_MAX) return vks_set_error(VKS_ERR_ARG, "%s: %zu bytes", what, bytes);
    MPI_Request req;
    if (MPI_Isend(buf, (int)bytes, MPI_BYTE, rank, tag, comm, &req) != MPI_SUCCESS)
        return vks_set_error(VKS_ERR_IO, "rank %d: %s could not be sent", rank, what);
    int rc = vks_mpi_wait_within(comm, &req, &rank, 1, timeout_s, what);
    *freeable = rc == VKS_OK;
    return rc;
}

int vks_rl_wire_send_small(MPI_Comm comm, int rank, int tag, const vks_rl_msg *m, double timeout_s, const char *what) {
    vks_rl_msg *buf = malloc(sizeof *buf);
    if (!buf) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    *buf = *m;
    bool freeable;
    int rc = vks_rl_wire_send(comm, rank, tag, buf, sizeof *buf, timeout_s, what, &freeable);
    if (freeable) free(buf);
    return rc;
}

const char *vks_rl_wire_granter(const vks_rl_config *c) {
    return c->orchestrator != c->trainer ? "the orchestrator" : "the trainer";
}

void vks_rl_wire_beat_cb(void *beat) { vks_rl_wire_beat(beat); }

void vks_rl_wire_beat(vks_rl_beat *b) {
    double now = vks_seconds_now();
    if (now - b->last < 1.0) return;
    if (b->req != MPI_REQUEST_NULL) {
        int flag = 0;
        MPI_Test(&b->req, &flag, MPI_STATUS_IGNORE);
        if (!flag) return;
    }
    b->msg = (vks_rl_msg){.magic = VKS_RL_MAGIC, .type = MSG_BEAT};
    MPI_Isend(&b->msg, sizeof b->msg, MPI_BYTE, b->trainer, b->tag ? b->tag : TAG_UP, b->comm, &b->req);
    b->last = now;
}

int vks_rl_wire_check_weights(const void *file, size_t len, size_t n_values, int64_t newest, int64_t announced,
                              int64_t *step) {
    size_t want = sizeof(vks_rl_msg) + sizeof(float) * n_values;
    if (len != want) return vks_set_error(VKS_ERR_FORMAT, "weights of %zu bytes, %zu expected", len, want);
    vks_rl_msg h;
    memcpy(&h, file, sizeof h);
    if (h.magic != VKS_RL_MAGIC || h.type != MSG_WEIGHTS || h.n != n_values)
        return vks_set_error(VKS_ERR_FORMAT, "a malformed weights file");
    if (h.step != announced || h.step <= newest)
        return vks_set_error(VKS_ERR_FORMAT, "weights of step %lld, the manifest announced step %lld (newest held %lld)",
                             (long long)h.step, (long long)announced, (long long)newest);
    *step = h.step;
    return VKS_OK;
}

int vks_rl_wire_model_from_block(const vks_model *start, const vks_param_layout *layout, const float *msg,
                                 vks_model **out) {
    vks_model *m = NULL;
    int rc = vks_model_create_f32(&start->cfg, vks_model_has_bias(start), &m);
    if (!rc) rc = vks_param_layout_scatter(layout, msg + sizeof(vks_rl_msg) / sizeof(float), m);
    if (rc) {
        vks_model_free(m);
        return rc;
    }
    m->bos_id = start->bos_id, m->eos_id = start->eos_id;
    memcpy(m->arch, start->arch, sizeof m->arch);
    *out = m;
    return VKS_OK;
}
