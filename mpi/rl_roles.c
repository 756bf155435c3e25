/* rl_roles.c: the RL run across MPI ranks (vks_rl_mpi.h). The trainer rank
 * runs vks_rl_run_source with a source whose groups come from inference ranks;
 * inference ranks run vks_rl_gen_batch (the single-process code) on a thread
 * while their main thread keeps MPI moving and beats.
 *
 * Messages (every one starts with rl_msg):
 *   TAG_WEIGHTS trainer -> inference  WEIGHTS: step, n = floats, then the f32 parameter block
 *   TAG_CTL     trainer -> inference  ASSIGN: batch, step = the policy step to use at least
 *                                     STOP: n = 1 when ranks were lost (no MPI_Finalize)
 *   TAG_UP      inference -> trainer  BEAT (every second), GROUPS: batch, step = the policy
 *                                     step used, then the serialized groups (see pack_groups) */
#include "vkswarm/vks_rl_mpi.h"
#include <limits.h>
#include <stdint.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "rl/rl_internal.h"
#include "vkswarm/vks_checkpoint.h"
#include "vkswarm/vks_grpo.h"
#include "vkswarm/vks_mpi.h"

#define RL_MAGIC 0x4c52534bu /* "KSRL" */
enum { TAG_WEIGHTS = 7101, TAG_CTL = 7102, TAG_UP = 7103 };
enum { MSG_WEIGHTS = 1, MSG_ASSIGN = 2, MSG_STOP = 3, MSG_BEAT = 4, MSG_GROUPS = 5 };

typedef struct {
    uint32_t magic, type;
    int64_t batch, step;
    uint64_t n;
} rl_msg;

/* What a group's sample looks like on the wire, before its tokens and logp. */
typedef struct {
    int32_t prompt_len, completion_len, accepted, pad;
    double task_reward, reward, advantage;
} wire_sample;
typedef struct {
    int32_t n, pad;
    int64_t task_index;
} wire_group;

int vks_rl_mpi_check_roles(const vks_rl_config *c) {
    if (!c->roles_given) return vks_set_error(VKS_ERR_ARG, "rl across ranks: the config gives no roles");
    if (c->orchestrator != c->trainer)
        return vks_set_error(VKS_ERR_ARG, "rl across ranks: the orchestrator (rank %d) must be the trainer's rank (%d) "
                             "for now", c->orchestrator, c->trainer);
    for (int i = 0; i < c->n_groups; i++)
        if (c->groups[i].n != 1)
            return vks_set_error(VKS_ERR_ARG, "rl across ranks: inference group %d has %d ranks: pipeline groups "
                                 "(S > 1) are not run yet, give each inference rank its own group", i, c->groups[i].n);
    if (c->n_relays) return vks_set_error(VKS_ERR_ARG, "rl across ranks: relays are not run yet (weights go point to point)");
    if (c->n_verifiers)
        return vks_set_error(VKS_ERR_ARG, "rl across ranks: verifier ranks are not run yet (each inference rank "
                             "verifies its own batches); leave roles.verifiers empty");
    if (c->n_inference_ranks < 1) return vks_set_error(VKS_ERR_ARG, "rl across ranks: no inference ranks");
    return VKS_OK;
}

/* ---- wire format of a batch's groups ---- */

static size_t max_groups_bytes(const vks_rl_config *c, int seq_len) {
    size_t per_sample = sizeof(wire_sample) + sizeof(int32_t) * (size_t)seq_len + sizeof(float) * (size_t)c->max_new_tokens;
    return sizeof(rl_msg) + 3 * sizeof(int64_t) + sizeof(double) +
           (size_t)c->prompts_per_step * (sizeof(wire_group) + (size_t)c->group_size * per_sample);
}

static void *pack_groups(const vks_rl_batch_group *groups, int P, int64_t batch, int64_t step,
                         const vks_rl_gen_counts *cnt, size_t *bytes) {
    size_t n = sizeof(rl_msg) + 3 * sizeof(int64_t) + sizeof(double);
    for (int p = 0; p < P; p++) {
        n += sizeof(wire_group);
        for (int i = 0; i < groups[p].n; i++) {
            const vks_rl_sample *s = &groups[p].samples[i];
            n += sizeof(wire_sample) + sizeof(int32_t) * (size_t)(s->prompt_len + s->completion_len) +
                 sizeof(float) * (size_t)s->completion_len;
        }
    }
    char *buf = malloc(n), *q = buf;
    if (!buf) return NULL;
    rl_msg h = {.magic = RL_MAGIC, .type = MSG_GROUPS, .batch = batch, .step = step, .n = n};
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
                              .task_reward = s->task_reward, .reward = s->reward, .advantage = s->advantage};
            memcpy(q, &ws, sizeof ws), q += sizeof ws;
            size_t nt = sizeof(int32_t) * (size_t)(s->prompt_len + s->completion_len);
            memcpy(q, s->tokens, nt), q += nt;
            memcpy(q, s->logp, sizeof(float) * (size_t)s->completion_len), q += sizeof(float) * (size_t)s->completion_len;
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
static int unpack_groups(const void *buf, size_t bytes, const vks_rl_gen *gen, const vks_rl_config *c,
                         const vks_model_config *mc, int64_t batch,
                         int64_t min_step, int64_t newest, vks_rl_batch_group *groups, int64_t *policy,
                         vks_rl_gen_counts *cnt, char *err, size_t cap) {
    int P = c->prompts_per_step, G = c->group_size;
    cursor cu = {buf, (const char *)buf + bytes};
    rl_msg h;
    int64_t c3[3] = {0, 0, 0};
    memset(groups, 0, sizeof *groups * (size_t)P);
#define BAD(...) do { snprintf(err, cap, __VA_ARGS__); goto fail; } while (0)
    if (!take_bytes(&cu, &h, sizeof h) || h.magic != RL_MAGIC || h.type != MSG_GROUPS || h.n != bytes)
        BAD("a malformed message of %zu bytes", bytes);
    if (h.batch != batch) BAD("batch %lld, but it was granted batch %lld", (long long)h.batch, (long long)batch);
    if (h.step < min_step || h.step > newest)
        BAD("policy step %lld outside [%lld, %lld]", (long long)h.step, (long long)min_step, (long long)newest);
    if (!take_bytes(&cu, c3, sizeof c3) || c3[0] != (int64_t)P * G || c3[1] < 0 || c3[1] > c3[0] || c3[2] < 0 ||
        c3[2] > c3[1])
        BAD("counts %lld/%lld/%lld for a batch of %d", (long long)c3[0], (long long)c3[1], (long long)c3[2], P * G);
    double reward_sum = 0; /* only a metric: bounded, not checkable (filtered groups are not sent) */
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
            if (ws.accepted != 1) BAD("group %d, completion %d: not accepted by its verifier", p, i);
            if (!(ws.task_reward >= 0 && ws.task_reward <= 1) || !isfinite(ws.reward) || !isfinite(ws.advantage))
                BAD("group %d, completion %d: reward %g / %g, advantage %g", p, i, ws.task_reward, ws.reward, ws.advantage);
            vks_rl_sample *s = &g->samples[g->n++];
            *s = (vks_rl_sample){.prompt_len = ws.prompt_len, .completion_len = ws.completion_len, .accepted = true,
                                 .task_reward = ws.task_reward, .reward = ws.reward, .advantage = ws.advantage};
            int len = ws.prompt_len + ws.completion_len;
            s->tokens = malloc(sizeof(int32_t) * (size_t)len);
            s->logp = malloc(sizeof(float) * (size_t)(ws.completion_len ? ws.completion_len : 1));
            if (!s->tokens || !s->logp) BAD("out of host memory");
            if (!take_bytes(&cu, s->tokens, sizeof(int32_t) * (size_t)len) ||
                !take_bytes(&cu, s->logp, sizeof(float) * (size_t)ws.completion_len))
                BAD("truncated at group %d, completion %d", p, i);
            for (int k = 0; k < len; k++)
                if (s->tokens[k] < 0 || s->tokens[k] >= mc->vocab_size)
                    BAD("group %d, completion %d: token %d outside the vocabulary of %d", p, i, s->tokens[k], mc->vocab_size);
            for (int k = 0; k < ws.completion_len; k++)
                if (!isfinite(s->logp[k]) || s->logp[k] > 0)
                    BAD("group %d, completion %d: log-probability %g", p, i, (double)s->logp[k]);
            char why[200];
            if (vks_rl_check_sample(gen, wg.task_index, s, why, sizeof why)) BAD("group %d, completion %d: %s", p, i, why);
            rewards[i] = ws.reward;
        }
        /* the advantages must be the group's own (a rank cannot inflate them) */
        if (!vks_grpo_group_has_signal(rewards, wg.n)) BAD("group %d has no signal", p);
        if (vks_grpo_advantages(rewards, 1, wg.n, adv)) BAD("group %d: %s", p, vks_last_error());
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

/* ---- the trainer's side ---- */

enum { RANK_LIVE = 0, RANK_DROPPED = 1, RANK_REFUSED = 2 };

typedef struct {
    int rank, state;
    int64_t batch;        /* granted batch, -1: idle */
    int64_t min_step;     /* its policy step at least */
    double last_seen;
} inf_rank;

typedef struct {
    float *buf;
    MPI_Request *reqs;    /* one per inference rank */
} weights_send;

typedef struct {
    MPI_Comm comm;
    const vks_rl_run_options *o;
    const vks_rl_mpi_options *mo;
    const vks_rl_config *c;
    vks_param_layout *layout;
    inf_rank *ranks;
    int n_ranks;
    int64_t next_batch, newest;
    int grant_from;       /* the rank (index) the next grant looks at first: round robin */
    int64_t *redo;        /* batches of dropped ranks, to grant again */
    int n_redo;
    vks_rl_queue queue;
    weights_send *sends;
    int n_sends, cap_sends;
    bool lost;
    vks_rl_gen gen;       /* the tasks, to check prompts and rewards (model: the start policy, not owned) */
} trainer_src;

/* A small message under a bounded wait (a blocking send to a dead rank never
 * returns); after a timeout MPI may still hold the buffer, so it is left. */
static int send_small(MPI_Comm comm, int rank, int tag, const rl_msg *m, double timeout_s, const char *what) {
    rl_msg *buf = malloc(sizeof *buf);
    if (!buf) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    *buf = *m;
    MPI_Request req;
    if (MPI_Isend(buf, sizeof *buf, MPI_BYTE, rank, tag, comm, &req) != MPI_SUCCESS) {
        free(buf);
        return vks_set_error(VKS_ERR_IO, "rank %d: %s could not be sent", rank, what);
    }
    int rc = vks_mpi_wait_within(comm, &req, &rank, 1, timeout_s, what);
    if (!rc) free(buf);
    return rc;
}

static int send_ctl(trainer_src *t, int rank, uint32_t type, int64_t batch, int64_t step, uint64_t n) {
    rl_msg m = {.magic = RL_MAGIC, .type = type, .batch = batch, .step = step, .n = n};
    return send_small(t->comm, rank, TAG_CTL, &m, t->mo->timeout_s, type == MSG_STOP ? "the stop" : "a grant");
}

static void drop_rank(trainer_src *t, inf_rank *r, int state, const char *why) {
    fprintf(stderr, "vkswarm: rl: inference rank %d %s: %s; the run goes on without it\n", r->rank,
            state == RANK_REFUSED ? "refused" : "dropped", why);
    r->state = state;
    t->lost = t->lost || state == RANK_DROPPED; /* a refused rank is alive: it can still finalize */
    if (r->batch >= 0) t->redo[t->n_redo++] = r->batch;
    r->batch = -1;
}

static int publish_mpi(void *ctx, vks_model *m, int64_t step) {
    trainer_src *t = ctx;
    int rc = VKS_OK;
    if (t->n_sends == t->cap_sends) {
        int cap = t->cap_sends ? 2 * t->cap_sends : 8;
        weights_send *s = realloc(t->sends, sizeof *s * (size_t)cap);
        if (!s) rc = vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
        else t->sends = s, t->cap_sends = cap;
    }
    size_t n = t->layout->n_values;
    weights_send *w = rc ? NULL : &t->sends[t->n_sends];
    if (w) {
        w->buf = malloc(sizeof(rl_msg) + sizeof(float) * n);
        w->reqs = malloc(sizeof *w->reqs * (size_t)t->n_ranks);
        if (!w->buf || !w->reqs) {
            free(w->buf), free(w->reqs);
            rc = vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
        } else {
            for (int i = 0; i < t->n_ranks; i++) w->reqs[i] = MPI_REQUEST_NULL;
            t->n_sends++;
        }
    }
    if (!rc) rc = vks_param_layout_gather(t->layout, m, w->buf + sizeof(rl_msg) / sizeof(float));
    vks_model_free(m);
    if (rc) return rc;
    rl_msg h = {.magic = RL_MAGIC, .type = MSG_WEIGHTS, .step = step, .n = n};
    memcpy(w->buf, &h, sizeof h);
    size_t bytes = sizeof h + sizeof(float) * n;
    for (int i = 0; i < t->n_ranks; i++) {
        if (t->ranks[i].state != RANK_LIVE) continue;
        /* buffers stay until the end: a dead rank's send never completes */
        if (MPI_Isend(w->buf, (int)bytes, MPI_BYTE, t->ranks[i].rank, TAG_WEIGHTS, t->comm, &w->reqs[i]) != MPI_SUCCESS)
            drop_rank(t, &t->ranks[i], RANK_DROPPED, "the weights could not be sent");
    }
    t->newest = step;
    return VKS_OK;
}

/* Keeps the weight sends moving (Open MPI's TCP moves bytes inside MPI calls). */
static void test_sends(trainer_src *t) {
    for (int s = 0; s < t->n_sends; s++)
        for (int i = 0; i < t->n_ranks; i++)
            if (t->sends[s].reqs[i] != MPI_REQUEST_NULL && t->ranks[i].state == RANK_LIVE) {
                int flag = 0;
                if (MPI_Test(&t->sends[s].reqs[i], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS)
                    drop_rank(t, &t->ranks[i], RANK_DROPPED, "sending it the weights failed");
            }
}

static inf_rank *find_rank(trainer_src *t, int rank) {
    for (int i = 0; i < t->n_ranks; i++)
        if (t->ranks[i].rank == rank) return &t->ranks[i];
    return NULL;
}

/* Receives one message from an inference rank (probed: st). */
static int receive_up(trainer_src *t, const MPI_Status *st, vks_rl_batch_group *scratch, int seq_len,
                      const vks_model_config *mc) {
    int count = 0;
    MPI_Get_count(st, MPI_BYTE, &count);
    inf_rank *r = find_rank(t, st->MPI_SOURCE);
    size_t most = max_groups_bytes(t->c, seq_len);
    char small[sizeof(rl_msg)];
    bool big = count > (int)sizeof small && (size_t)count <= most;
    char *buf = big ? malloc((size_t)count) : small;
    if (!buf) return vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    /* a message too big to be honest is received into nothing (truncation error) and refused */
    int mrc = MPI_Recv(buf, big ? count : (int)sizeof small, MPI_BYTE, st->MPI_SOURCE, TAG_UP, t->comm, MPI_STATUS_IGNORE);
    int rc = VKS_OK;
    if (!r || r->state != RANK_LIVE) { /* late words of a dropped rank: ignored */
    } else if (mrc != MPI_SUCCESS || (!big && count != (int)sizeof(rl_msg))) {
        char why[96];
        snprintf(why, sizeof why, "a message of %d bytes (at most %zu)", count, most);
        drop_rank(t, r, RANK_REFUSED, why);
    } else {
        rl_msg h;
        memcpy(&h, buf, sizeof h);
        r->last_seen = vks_seconds_now();
        if (h.magic == RL_MAGIC && h.type == MSG_BEAT && !big) {
        } else if (r->batch < 0) {
            drop_rank(t, r, RANK_REFUSED, "groups it was not asked for");
        } else {
            char err[256];
            int64_t policy = 0;
            vks_rl_gen_counts cnt;
            if (unpack_groups(buf, (size_t)count, &t->gen, t->c, mc, r->batch, r->min_step, t->newest, scratch, &policy, &cnt, err,
                              sizeof err)) {
                char why[320];
                snprintf(why, sizeof why, "batch %lld: %s", (long long)r->batch, err);
                drop_rank(t, r, RANK_REFUSED, why);
            } else {
                r->batch = -1;
                rc = vks_rl_queue_push(&t->queue, policy, scratch, t->c->prompts_per_step, &cnt, t->o->max_empty_batches);
                for (int p = 0; p < t->c->prompts_per_step; p++) vks_rl_group_free(&scratch[p]);
            }
        }
    }
    if (big) free(buf);
    return rc;
}

/* Grants batches to idle live ranks while the window has room for their
 * groups (vks_rl_queue_batches_to_grant), round robin. */
static int grant(trainer_src *t) {
    int64_t out = 0;
    for (int i = 0; i < t->n_ranks; i++) out += t->ranks[i].state == RANK_LIVE && t->ranks[i].batch >= 0;
    for (int k = 0; k < t->n_ranks; k++) { /* round robin from after the last rank granted */
        int i = (t->grant_from + k) % t->n_ranks;
        inf_rank *r = &t->ranks[i];
        if (r->state != RANK_LIVE || r->batch >= 0) continue;
        if (vks_rl_queue_batches_to_grant(&t->queue, t->newest, out) < 1) break;
        int64_t b = t->n_redo ? t->redo[--t->n_redo] : t->next_batch++;
        r->batch = b, r->min_step = t->newest;
        t->grant_from = (i + 1) % t->n_ranks;
        if (send_ctl(t, r->rank, MSG_ASSIGN, b, t->newest, 0)) drop_rank(t, r, RANK_DROPPED, vks_last_error());
        else out++;
    }
    return VKS_OK;
}

static int take_mpi(void *ctx, int64_t step, vks_rl_batch_group *groups) {
    trainer_src *t = ctx;
    int P = t->c->prompts_per_step, rc = VKS_OK;
    const vks_model_config *mc = &t->o->model->cfg;
    vks_rl_batch_group *scratch = calloc((size_t)P, sizeof *scratch);
    if (!scratch) return vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    (void)step;
    while (!rc && t->queue.len < P) {
        test_sends(t);
        /* every queued word first: silence is judged only after them */
        for (;;) {
            int flag = 0;
            MPI_Status st;
            if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_UP, t->comm, &flag, &st) != MPI_SUCCESS || !flag) break;
            if ((rc = receive_up(t, &st, scratch, mc->seq_len, mc))) break;
        }
        if (rc) break;
        double wall = vks_seconds_now();
        int live = 0;
        for (int i = 0; i < t->n_ranks; i++) {
            inf_rank *r = &t->ranks[i];
            if (r->state != RANK_LIVE) continue;
            if (wall - r->last_seen > t->mo->timeout_s) {
                char why[96];
                snprintf(why, sizeof why, "rank %d went silent (%.1f s)", r->rank, wall - r->last_seen);
                drop_rank(t, r, RANK_DROPPED, why);
            } else live++;
        }
        if (!live) {
            rc = vks_set_error(VKS_ERR_TIMEOUT, "trainer: no inference rank is left");
            break;
        }
        grant(t);
        if (t->queue.len < P) usleep(500);
    }
    if (!rc) rc = vks_rl_queue_pop(&t->queue, P, groups);
    free(scratch);
    return rc;
}

static void counters_mpi(void *ctx, vks_rl_counters *c) { *c = ((trainer_src *)ctx)->queue.counters; }
static int64_t position_mpi(void *ctx) { return ((trainer_src *)ctx)->next_batch; }
static void resume_mpi(void *ctx, int64_t step, int64_t next_batch) {
    trainer_src *t = ctx;
    t->next_batch = next_batch;
    t->queue.pushed = step * t->c->prompts_per_step;
}

/* Waits (bounded) until the live ranks have every weight message, then says stop. */
static void stop_ranks(trainer_src *t) {
    vks_mpi_clock clock = {0};
    double start = vks_mpi_deadline_tick(&clock, t->mo->timeout_s);
    for (;;) {
        test_sends(t);
        bool pending = false;
        for (int s = 0; s < t->n_sends; s++)
            for (int i = 0; i < t->n_ranks; i++)
                if (t->ranks[i].state == RANK_LIVE && t->sends[s].reqs[i] != MPI_REQUEST_NULL) pending = true;
        /* drain beats so that nobody's sends stall */
        for (;;) {
            int flag = 0;
            MPI_Status st;
            if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_UP, t->comm, &flag, &st) != MPI_SUCCESS || !flag) break;
            int count = 0;
            MPI_Get_count(&st, MPI_BYTE, &count);
            char *b = malloc(count > 0 ? (size_t)count : 1);
            MPI_Recv(b, count, MPI_BYTE, st.MPI_SOURCE, TAG_UP, t->comm, MPI_STATUS_IGNORE);
            free(b);
        }
        if (!pending) break;
        if (vks_mpi_deadline_tick(&clock, t->mo->timeout_s) - start > t->mo->timeout_s) {
            for (int i = 0; i < t->n_ranks; i++)
                for (int s = 0; s < t->n_sends; s++)
                    if (t->ranks[i].state == RANK_LIVE && t->sends[s].reqs[i] != MPI_REQUEST_NULL)
                        drop_rank(t, &t->ranks[i], RANK_DROPPED, "it did not take the weights at the end");
            break;
        }
        usleep(500);
    }
    for (int i = 0; i < t->n_ranks; i++)
        if (t->ranks[i].state == RANK_LIVE) send_ctl(t, t->ranks[i].rank, MSG_STOP, 0, t->newest, t->lost);
    /* refused ranks are told too: they stop instead of waiting for the trainer */
    for (int i = 0; i < t->n_ranks; i++)
        if (t->ranks[i].state == RANK_REFUSED) send_ctl(t, t->ranks[i].rank, MSG_STOP, 0, t->newest, t->lost);
}

int vks_rl_mpi_trainer(const vks_rl_run_options *o, const vks_rl_mpi_options *mo, vks_rl_result *res, bool *lost) {
    *lost = false;
    if (!o || !o->config || !o->model || !mo || !(mo->timeout_s > 0)) return vks_set_error(VKS_ERR_ARG, "rl: bad options");
    int rc = vks_rl_mpi_check_roles(o->config);
    if (rc) return rc;
    const vks_rl_config *c = o->config;
    trainer_src t = {.comm = vks_mpi_world(), .o = o, .mo = mo, .c = c, .n_ranks = c->n_inference_ranks};
    MPI_Comm_set_errhandler(t.comm, MPI_ERRORS_RETURN);
    t.ranks = calloc((size_t)t.n_ranks, sizeof *t.ranks);
    t.redo = calloc((size_t)t.n_ranks, sizeof *t.redo);
    if (!t.ranks || !t.redo) rc = vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    if (!rc) rc = vks_rl_queue_init(&t.queue, c->prompts_per_step, c->async_level);
    double now = vks_seconds_now();
    for (int i = 0; !rc && i < t.n_ranks; i++) t.ranks[i] = (inf_rank){.rank = c->inference_ranks[i], .batch = -1, .last_seen = now};
    if (!rc) rc = vks_param_layout_create(&o->model->cfg, o->model->layers[0].bq.data != NULL, &t.layout);
    t.gen.o = o;
    t.gen.model = (vks_model *)(uintptr_t)o->model; /* read only: its shape */
    if (!rc) rc = vks_rl_gen_open_tasks(&t.gen);
    if (!rc && sizeof(rl_msg) + sizeof(float) * t.layout->n_values > INT_MAX)
        rc = vks_set_error(VKS_ERR_ARG, "rl across ranks: the model's %zu weights do not fit one message", t.layout->n_values);
    vks_rl_source src = {.ctx = &t, .publish = publish_mpi, .take = take_mpi, .counters = counters_mpi,
                         .position = position_mpi, .resume = resume_mpi};
    if (!rc) rc = vks_rl_run_source(o, &src, res);
    char err[1024];
    snprintf(err, sizeof err, "%s", rc ? vks_last_error() : "");
    stop_ranks(&t);
    *lost = t.lost;
    vks_rl_queue_free(&t.queue);
    /* the buffers of sends not known complete (dropped or refused ranks) stay: MPI may still hold them */
    for (int s = 0; s < t.n_sends; s++) {
        bool done = true;
        for (int i = 0; i < t.n_ranks; i++) done = done && t.sends[s].reqs[i] == MPI_REQUEST_NULL;
        if (done) free(t.sends[s].buf), free(t.sends[s].reqs);
    }
    free(t.sends), free(t.ranks), free(t.redo);
    vks_param_layout_free(t.layout);
    t.gen.model = NULL;
    vks_rl_gen_close(&t.gen);
    if (rc) return vks_set_error(rc, "%s", err);
    return VKS_OK;
}

/* ---- an inference rank ---- */

typedef struct {
    vks_rl_gen *g;
    int64_t batch;
    vks_rl_batch_group *groups;
    vks_rl_gen_counts cnt;
    int rc;
    char err[1024];
    pthread_mutex_t mu;
    bool done;
} gen_job;

static void *gen_thread(void *arg) {
    gen_job *j = arg;
    int rc = vks_rl_gen_batch(j->g, j->batch, j->g->o->config->prompts_per_step, j->groups, &j->cnt);
    if (rc) snprintf(j->err, sizeof j->err, "%s", vks_last_error());
    pthread_mutex_lock(&j->mu);
    j->rc = rc;
    j->done = true;
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

typedef struct {
    MPI_Comm comm;
    int trainer;
    const vks_rl_run_options *o;
    const vks_rl_mpi_options *mo;
    vks_param_layout *layout;
    float *pending;        /* newest weights received and not yet in use */
    int64_t pending_step;
    double last_heard, last_beat;
    bool stop, no_finalize;
    int64_t assigned, min_step;
    rl_msg beat_msg;
    MPI_Request beat_req;
} inf_state;

/* A beat every second; none while the last one is still on its way (a dead
 * trainer: the rank's own silence bound ends it). */
static void beat(inf_state *s) {
    double now = vks_seconds_now();
    if (now - s->last_beat < 1.0) return;
    if (s->beat_req != MPI_REQUEST_NULL) {
        int flag = 0;
        MPI_Test(&s->beat_req, &flag, MPI_STATUS_IGNORE);
        if (!flag) return;
    }
    s->beat_msg = (rl_msg){.magic = RL_MAGIC, .type = MSG_BEAT};
    MPI_Isend(&s->beat_msg, sizeof s->beat_msg, MPI_BYTE, s->trainer, TAG_UP, s->comm, &s->beat_req);
    s->last_beat = now;
}

/* Receives what the trainer sent (weights, a grant, stop). */
static int poll_trainer(inf_state *s) {
    for (;;) {
        int flag = 0;
        MPI_Status st;
        if (MPI_Iprobe(s->trainer, MPI_ANY_TAG, s->comm, &flag, &st) != MPI_SUCCESS || !flag) return VKS_OK;
        int count = 0;
        MPI_Get_count(&st, MPI_BYTE, &count);
        size_t want = sizeof(rl_msg) + sizeof(float) * s->layout->n_values;
        if (st.MPI_TAG == TAG_WEIGHTS) {
            if ((size_t)count != want) return vks_set_error(VKS_ERR_FORMAT, "weights of %d bytes, %zu expected", count, want);
            float *buf = malloc(want);
            if (!buf) return vks_set_error(VKS_ERR_NOMEM, "inference: out of host memory");
            MPI_Recv(buf, count, MPI_BYTE, s->trainer, TAG_WEIGHTS, s->comm, MPI_STATUS_IGNORE);
            rl_msg h;
            memcpy(&h, buf, sizeof h);
            if (h.magic != RL_MAGIC || h.type != MSG_WEIGHTS || h.n != s->layout->n_values || h.step < s->pending_step) {
                free(buf);
                return vks_set_error(VKS_ERR_FORMAT, "a malformed weights message");
            }
            free(s->pending);
            s->pending = buf, s->pending_step = h.step;
        } else if (st.MPI_TAG == TAG_CTL && count == (int)sizeof(rl_msg)) {
            rl_msg h;
            MPI_Recv(&h, sizeof h, MPI_BYTE, s->trainer, TAG_CTL, s->comm, MPI_STATUS_IGNORE);
            if (h.magic != RL_MAGIC) return vks_set_error(VKS_ERR_FORMAT, "a malformed control message");
            if (h.type == MSG_STOP) s->stop = true, s->no_finalize = h.n != 0;
            else if (h.type == MSG_ASSIGN) s->assigned = h.batch, s->min_step = h.step;
            else return vks_set_error(VKS_ERR_FORMAT, "control message of type %u", h.type);
        } else return vks_set_error(VKS_ERR_FORMAT, "a message of %d bytes under tag %d", count, st.MPI_TAG);
        s->last_heard = vks_seconds_now();
    }
}

/* Makes the pending weights the policy. */
static int take_weights(inf_state *s, vks_rl_gen *g) {
    if (!s->pending) return VKS_OK;
    const vks_model *start = s->o->model;
    vks_model *m = NULL;
    int rc = vks_model_create_f32(&start->cfg, start->layers[0].bq.data != NULL, &m);
    if (!rc) rc = vks_param_layout_scatter(s->layout, s->pending + sizeof(rl_msg) / sizeof(float), m);
    if (!rc) {
        m->bos_id = start->bos_id, m->eos_id = start->eos_id;
        memcpy(m->arch, start->arch, sizeof m->arch);
        rc = vks_rl_gen_set_policy(g, m, s->pending_step);
    } else vks_model_free(m);
    free(s->pending);
    s->pending = NULL;
    return rc;
}

static int run_job(inf_state *s, vks_rl_gen *g) {
    int P = s->o->config->prompts_per_step, rc = VKS_OK;
    gen_job j = {.g = g, .batch = s->assigned};
    j.groups = calloc((size_t)P, sizeof *j.groups);
    if (!j.groups) return vks_set_error(VKS_ERR_NOMEM, "inference: out of host memory");
    pthread_mutex_init(&j.mu, NULL);
    pthread_t th;
    if (pthread_create(&th, NULL, gen_thread, &j)) {
        pthread_mutex_destroy(&j.mu);
        free(j.groups);
        return vks_set_error(VKS_ERR_NOMEM, "inference: cannot start the generation thread");
    }
    for (;;) { /* MPI keeps moving while the batch is generated */
        pthread_mutex_lock(&j.mu);
        bool done = j.done;
        pthread_mutex_unlock(&j.mu);
        if (done) break;
        beat(s);
        if (!rc) rc = poll_trainer(s);
        usleep(1000);
    }
    pthread_join(th, NULL);
    pthread_mutex_destroy(&j.mu);
    if (!rc && j.rc) rc = vks_set_error(j.rc, "batch %lld: %s", (long long)j.batch, j.err);
    for (int p = 0; !rc && s->mo->test_garbage && p < P; p++)
        if (j.groups[p].n) {
            vks_rl_sample *x = &j.groups[p].samples[0];
            if (s->mo->test_garbage == 1) x->tokens[0] = s->o->model->cfg.vocab_size;
            else x->task_reward = 1, x->reward = 1; /* a reward the completion did not earn */
            break;
        }
    size_t bytes = 0;
    void *buf = rc ? NULL : pack_groups(j.groups, P, j.batch, g->policy_step, &j.cnt, &bytes);
    if (!rc && !buf) rc = vks_set_error(VKS_ERR_NOMEM, "inference: out of host memory");
    if (!rc && bytes > INT_MAX) rc = vks_set_error(VKS_ERR_ARG, "a batch of %zu bytes", bytes);
    if (!rc) {
        MPI_Request req;
        MPI_Isend(buf, (int)bytes, MPI_BYTE, s->trainer, TAG_UP, s->comm, &req);
        rc = vks_mpi_wait_within(s->comm, &req, &s->trainer, 1, s->mo->timeout_s, "the trainer taking a batch");
        if (rc) buf = NULL; /* MPI may still read it: left, the rank gives up */
    }
    free(buf);
    for (int p = 0; p < P; p++) vks_rl_group_free(&j.groups[p]);
    free(j.groups);
    s->assigned = -1;
    return rc;
}

static int make_dir(const char *path) {
    struct stat st;
    return mkdir(path, 0777) && !(!stat(path, &st) && S_ISDIR(st.st_mode));
}

int vks_rl_mpi_inference(const vks_rl_run_options *o, const vks_rl_mpi_options *mo, bool *no_finalize) {
    *no_finalize = false;
    if (!o || !o->config || !o->model || !o->tok || !o->infer_gpu || !mo || !(mo->timeout_s > 0))
        return vks_set_error(VKS_ERR_ARG, "rl: bad options");
    int rc = vks_rl_mpi_check_roles(o->config);
    if (rc) return rc;
    inf_state s = {.comm = vks_mpi_world(), .trainer = o->config->trainer, .o = o, .mo = mo, .assigned = -1,
                   .pending_step = -1, .beat_req = MPI_REQUEST_NULL};
    MPI_Comm_set_errhandler(s.comm, MPI_ERRORS_RETURN);
    vks_rl_gen g = {.o = o, .policy_step = -1, .keep_flat_groups = mo->test_garbage != 0};
    rc = vks_param_layout_create(&o->model->cfg, o->model->layers[0].bq.data != NULL, &s.layout);
    if (!rc) rc = vks_rl_gen_open_tasks(&g);
    int me = 0;
    MPI_Comm_rank(s.comm, &me);
    snprintf(g.rollouts_dir, sizeof g.rollouts_dir, "%s/rollouts-rank%d", o->config->out, me);
    if (!rc && (make_dir(o->config->out) || make_dir(g.rollouts_dir)))
        rc = vks_set_error(VKS_ERR_IO, "%s: cannot create the directory", g.rollouts_dir);
    s.last_heard = vks_seconds_now();
    vks_mpi_clock clock = {0};
    double tb = mo->trainer_timeout_s > mo->timeout_s ? mo->trainer_timeout_s : mo->timeout_s;
    double idle_from = vks_mpi_deadline_tick(&clock, tb);
    while (!rc && !s.stop) {
        beat(&s);
        if ((rc = poll_trainer(&s)) || s.stop) break;
        if (s.pending && s.assigned < 0) rc = take_weights(&s, &g);
        if (!rc && s.assigned >= 0) {
            if (s.pending) rc = take_weights(&s, &g);
            if (!rc && g.policy_step >= s.min_step) {
                rc = run_job(&s, &g);
                idle_from = vks_mpi_deadline_tick(&clock, tb);
                s.last_heard = vks_seconds_now();
                continue;
            }
        }
        double now = vks_mpi_deadline_tick(&clock, tb);
        double bound = mo->trainer_timeout_s > mo->timeout_s ? mo->trainer_timeout_s : mo->timeout_s;
        if (now - idle_from > bound && vks_seconds_now() - s.last_heard > bound) {
            rc = vks_set_error(VKS_ERR_TIMEOUT, "rank %d did not answer within %.1f s (the trainer)", s.trainer, bound);
            s.no_finalize = true;
        }
        usleep(1000);
    }
    *no_finalize = s.no_finalize;
    free(s.pending);
    vks_rl_gen_close(&g);
    vks_param_layout_free(s.layout);
    return rc;
}
