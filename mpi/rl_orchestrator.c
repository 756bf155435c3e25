/* rl_orchestrator.c: the orchestrator on a rank of its own (roles.orchestrator
 * != roles.trainer), and the trainer's source of groups that talks to it.
 *
 * Design. The orchestration is the code the trainer runs when it orchestrates
 * (rl_roles.c, state trainer_src in rl_orch.h: grants within the async
 * window, every TAG_UP message checked, the queue, liveness, batches granted
 * again, verifier routing, STOP at the end); the orchestrator rank runs the
 * same functions (vks_rl_orch_round) in its own loop, so inference, verifier
 * and relay ranks talk to it exactly as they talk to a trainer that
 * orchestrates (TAG_CTL / TAG_UP to roles.orchestrator). The trainer stays the
 * Shardcast origin; the orchestrator joins the broadcast's start-up (it is
 * collective over the world) and the trainer leaves it out of every send at
 * once. The orchestrator sees no weights, only the step numbers.
 *
 * Between them, on TAG_ORCH (every message starts with vks_rl_msg; every send
 * is bounded, every message is checked for size and fields, a bad one ends
 * the run naming the rank):
 *   trainer -> orch  RESUME: step, batch = the next generation batch (a resumed run, before
 *                    the first PUBLISHED)
 *                    PUBLISHED: step, n = the ranks that did not take its weights, then n int32
 *                    (already left out of later broadcasts by the trainer; the orchestrator
 *                    drops them as the trainer would). Grants start after the first one.
 *                    TAKE: step (= the newest published): the groups trainer step step + 1 uses
 *                    FINISH: the run is over (n = 1: the trainer failed); the orchestrator says
 *                    STOP to every rank (n = ranks were lost, as before), answers FINISHED
 *                    (n = ranks were lost) and returns
 *   orch -> trainer  BEAT every second (a dead orchestrator: the trainer's take ends after
 *                    2 x timeout_s + 2 s of silence with a line naming it)
 *                    TAKEN: step, batch = the next generation batch (the rollout position),
 *                    then orch_info (the counters, lost, drops, groups, ranks), the ranks the
 *                    trainer must leave out of later broadcasts (int32 each), then per group a
 *                    u64 size and a GROUPS message (rl_wire.c) of one batch slot holding the
 *                    group: the trainer unpacks each with the checks it gives an inference
 *                    rank's batch (sizes, counts, token ids, logp, rewards re-scored, advantages,
 *                    policy step in [step - async_level, newest]); then n_ranks
 *                    vks_rl_rank_status, what the orchestrator counted per rank (checked: world
 *                    ranks, states, counts; the reason cut and escaped where shown)
 *                    FAILED: the orchestrator's error (text), after which it STOPs every rank
 * The combined case (orchestrator == trainer) never comes here: same code path as before. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "rl_orch.h"
#include "vkswarm/vks_rl_config.h"

typedef struct {
    vks_rl_counters counters;
    int64_t lost;
    int32_t n_drops, n_groups, n_ranks, pad;
} orch_info;

/* A header-only message on TAG_ORCH under a bounded wait (vks_rl_wire_send_small). */
static int send_orch_small(MPI_Comm comm, int rank, uint32_t type, int64_t batch, int64_t step, uint64_t n, double timeout_s,
                           const char *what) {
    vks_rl_msg m = {.magic = VKS_RL_MAGIC, .type = type, .batch = batch, .step = step, .n = n};
    return vks_rl_wire_send_small(comm, rank, TAG_ORCH, &m, timeout_s, what);
}

/* ---- the orchestrator rank ---- */

typedef struct {
    trainer_src t;
    int trainer;
    bool started, finish, trainer_failed, trainer_gone;
    int64_t want;             /* the step of a TAKE not answered yet, -1: none */
    double heard;             /* the trainer's last word */
    vks_rl_beat beat;         /* to the trainer, on TAG_ORCH */
    vks_rl_batch_group *scratch, *out;
    vks_rl_status status;     /* the line after a silence, while the trainer waits for a TAKE */
} orch_rank;

/* The ranks of a PUBLISHED message (n int32 after the header), each dropped. */
static int on_published(orch_rank *s, const vks_rl_msg *h, const char *buf, int count) {
    trainer_src *t = &s->t;
    if (h->n > (uint64_t)t->n_world || (size_t)count != sizeof *h + sizeof(int32_t) * h->n ||
        h->step < (s->started ? t->newest + 1 : 0))
        return vks_set_error(VKS_ERR_FORMAT, "the trainer (rank %d): a malformed PUBLISHED (step %lld, %d bytes)", s->trainer,
                             (long long)h->step, count);
    for (uint64_t i = 0; i < h->n; i++) {
        int32_t r;
        memcpy(&r, buf + sizeof *h + sizeof r * i, sizeof r);
        if (r < 0 || r >= t->n_world || r == s->trainer || r == t->c->orchestrator)
            return vks_set_error(VKS_ERR_FORMAT, "the trainer (rank %d): PUBLISHED names rank %d", s->trainer, (int)r);
        vks_rl_orch_failed_rank(t, r, h->step);
    }
    t->newest = h->step;
    s->started = true;
    return VKS_OK;
}

/* One message from the trainer (received: buf, count bytes). */
static int on_trainer(orch_rank *s, const char *buf, int count) {
    trainer_src *t = &s->t;
    vks_rl_msg h;
    memcpy(&h, buf, sizeof h);
    bool small = count == (int)sizeof h;
    if (h.magic != VKS_RL_MAGIC) return vks_set_error(VKS_ERR_FORMAT, "the trainer (rank %d): a malformed message", s->trainer);
    if (h.type == MSG_PUBLISHED) return on_published(s, &h, buf, count);
    if (h.type == MSG_RESUME && small && !s->started && h.step >= 0 && h.batch >= 0 && h.step < INT64_MAX / 4096) {
        t->next_batch = h.batch;
        t->queue.pushed = h.step * t->c->prompts_per_step;
    } else if (h.type == MSG_TAKE && small && s->started && s->want < 0 && h.step == t->newest) {
        s->want = h.step;
        vks_rl_status_begin(&s->status, h.step + 1, t->c->steps, vks_seconds_now());
        vks_rl_status_said(&s->status, vks_seconds_now()); /* the trainer's step line: silence from here */
        vks_rl_status_poll(&s->status, &t->queue, NULL);   /* the counts go from here */
    } else if (h.type == MSG_FINISH && small) {
        s->finish = true, s->trainer_failed = h.n != 0;
    } else return vks_set_error(VKS_ERR_FORMAT, "the trainer (rank %d): an unexpected message (type %u, %d bytes)",
                                s->trainer, h.type, count);
    return VKS_OK;
}

/* Receives what the trainer sent (its messages are small: at most a PUBLISHED naming every rank). */
static int poll_trainer(orch_rank *s) {
    size_t most = sizeof(vks_rl_msg) + sizeof(int32_t) * (size_t)s->t.n_world;
    for (;;) {
        int flag = 0, count = 0;
        MPI_Status st;
        if (MPI_Iprobe(s->trainer, TAG_ORCH, s->t.comm, &flag, &st) != MPI_SUCCESS || !flag) return VKS_OK;
        MPI_Get_count(&st, MPI_BYTE, &count);
        bool fits = count >= (int)sizeof(vks_rl_msg) && (size_t)count <= most;
        char small[sizeof(vks_rl_msg)], *buf = fits ? malloc((size_t)count) : small;
        if (!buf) return vks_set_error(VKS_ERR_NOMEM, "orchestrator: out of host memory");
        int mrc = MPI_Recv(buf, fits ? count : 0, MPI_BYTE, s->trainer, TAG_ORCH, s->t.comm, MPI_STATUS_IGNORE);
        s->heard = vks_seconds_now();
        int rc = fits && mrc == MPI_SUCCESS ? on_trainer(s, buf, count)
                 : vks_set_error(VKS_ERR_FORMAT, "the trainer (rank %d): a message of %d bytes (at most %zu)", s->trainer,
                                 count, most);
        if (fits) free(buf);
        if (rc || s->finish) return rc;
    }
}

/* TAKEN for step s->want: the P oldest queued groups, each as a GROUPS message of its batch slot. */
static void *pack_taken(orch_rank *s, size_t *bytes) {
    trainer_src *t = &s->t;
    int P = t->c->prompts_per_step, G = t->c->group_size;
    if (vks_rl_queue_pop(&t->queue, P, s->out)) return NULL;
    void *part[VKS_RL_MAX_BATCH];
    size_t len[VKS_RL_MAX_BATCH], n = sizeof(vks_rl_msg) + sizeof(orch_info) + sizeof(int32_t) * (size_t)t->n_drops;
    bool ok = P <= VKS_RL_MAX_BATCH;
    for (int i = 0; ok && i < P; i++) {
        const vks_rl_batch_group *g = &s->out[i];
        int64_t batch = g->task_index / P;
        for (int p = 0; p < P; p++) s->scratch[p] = (vks_rl_batch_group){.task_index = batch * P + p};
        s->scratch[g->task_index % P] = *g; /* shared, not owned: only read */
        vks_rl_gen_counts cnt = {.rollouts = (int64_t)P * G};
        part[i] = vks_rl_wire_pack_groups(s->scratch, P, batch, g->policy_step, &cnt, &len[i]);
        memset(s->scratch, 0, sizeof *s->scratch * (size_t)P);
        ok = part[i] != NULL;
        n += ok ? sizeof(uint64_t) + len[i] : 0;
        if (!ok) P = i; /* only those packed are freed below */
    }
    int n_ranks = t->n_ranks < VKS_RL_MAX_RANK_STATUS ? t->n_ranks : VKS_RL_MAX_RANK_STATUS;
    n += sizeof(vks_rl_rank_status) * (size_t)n_ranks;
    char *buf = ok ? malloc(n) : NULL, *q = buf;
    if (buf) {
        vks_rl_msg h = {.magic = VKS_RL_MAGIC, .type = MSG_TAKEN, .batch = t->next_batch, .step = s->want, .n = n};
        orch_info info = {.counters = t->queue.counters, .lost = t->lost, .n_drops = t->n_drops, .n_groups = P,
                          .n_ranks = n_ranks};
        memcpy(q, &h, sizeof h), q += sizeof h;
        memcpy(q, &info, sizeof info), q += sizeof info;
        for (int i = 0; i < t->n_drops; i++, q += sizeof(int32_t)) memcpy(q, &(int32_t){t->drops[i]}, sizeof(int32_t));
        for (int i = 0; i < P; i++) {
            uint64_t l = len[i];
            memcpy(q, &l, sizeof l), q += sizeof l;
            memcpy(q, part[i], len[i]), q += len[i];
        }
        vks_rl_rank_status *st = calloc((size_t)n_ranks + 1, sizeof *st); /* zeroed: no stray bytes on the wire */
        if (st) vks_rl_orch_ranks(t, st, n_ranks);
        if (st) memcpy(q, st, sizeof *st * (size_t)n_ranks);
        else memset(q, 0, sizeof *st * (size_t)n_ranks); /* out of memory: rank 0 counted nothing, the run goes on */
        free(st);
        t->n_drops = 0;
        *bytes = n;
    }
    for (int i = 0; i < P; i++) free(part[i]);
    for (int i = 0; i < t->c->prompts_per_step; i++) vks_rl_group_free(&s->out[i]);
    return buf;
}

static int answer_take(orch_rank *s) {
    size_t bytes = 0;
    void *buf = pack_taken(s, &bytes);
    if (!buf) return vks_set_error(VKS_ERR_NOMEM, "orchestrator: out of host memory");
    bool kept;
    int rc = vks_rl_wire_send(s->t.comm, s->trainer, TAG_ORCH, buf, bytes, s->t.mo->timeout_s,
                              "the trainer taking its groups", &kept);
    if (kept) free(buf);
    s->want = -1;
    return rc;
}

/* The loop: the trainer's messages, orchestration rounds once it has
 * published, the groups when it asks, until it says FINISH or goes silent. */
static int orchestrate(orch_rank *s) {
    const vks_rl_mpi_options *mo = s->t.mo;
    double bound = mo->trainer_timeout_s > mo->timeout_s ? mo->trainer_timeout_s : mo->timeout_s;
    int rc = VKS_OK;
    while (!rc && !s->finish) {
        vks_rl_wire_beat(&s->beat);
        if ((rc = poll_trainer(s)) || s->finish) break;
        if (s->started) rc = vks_rl_orch_round(&s->t, s->scratch);
        if (!rc && s->want >= 0 && s->t.queue.len < s->t.c->prompts_per_step && vks_rl_status_due_in(&s->status) <= 0) {
            char flight[512];
            vks_rl_orch_in_flight(&s->t, flight, sizeof flight);
            vks_rl_status_poll(&s->status, &s->t.queue, flight);
        }
        if (!rc && s->want >= 0 && s->t.queue.len >= s->t.c->prompts_per_step) rc = answer_take(s);
        if (!rc && vks_seconds_now() - s->heard > bound) {
            s->trainer_gone = true;
            rc = vks_set_error(VKS_ERR_TIMEOUT, "rank %d did not answer within %.1f s (the trainer)", s->trainer, bound);
        }
        usleep(500);
    }
    return rc;
}

/* Tells the trainer this rank's error (FAILED, the text escaped). */
static void tell_failed(orch_rank *s, const char *err) {
    struct {
        vks_rl_msg h;
        char text[VKS_RL_REASON_MAX];
    } *m = calloc(1, sizeof *m);
    if (!m) return;
    size_t len = strnlen(err, sizeof m->text - 1); /* cut to the reason's bound */
    memcpy(m->text, err, len);
    size_t n = sizeof m->h + strlen(m->text) + 1;
    m->h = (vks_rl_msg){.magic = VKS_RL_MAGIC, .type = MSG_FAILED, .n = n};
    bool kept;
    vks_rl_wire_send(s->t.comm, s->trainer, TAG_ORCH, m, n, s->t.mo->timeout_s,
                     "the trainer taking the orchestrator's error", &kept);
    if (kept) free(m);
}

int vks_rl_mpi_orchestrator(const vks_rl_run_options *o, const vks_rl_mpi_options *mo, bool *no_finalize) {
    *no_finalize = false;
    if (!o || !o->config || !o->model || !o->tok || !mo || !(mo->timeout_s > 0))
        return vks_set_error(VKS_ERR_ARG, "rl: bad options");
    int rc = vks_rl_mpi_check_roles(o->config, mo->join_server != NULL);
    if (rc) return rc;
    const vks_rl_config *c = o->config;
    orch_rank s = {.trainer = c->trainer, .want = -1, .heard = vks_seconds_now()};
    rc = vks_rl_orch_open(&s.t, o, mo, false);
    s.scratch = calloc((size_t)c->prompts_per_step, sizeof *s.scratch);
    s.out = calloc((size_t)c->prompts_per_step, sizeof *s.out);
    if (!rc && (!s.scratch || !s.out)) rc = vks_set_error(VKS_ERR_NOMEM, "orchestrator: out of host memory");
    s.beat = (vks_rl_beat){.comm = s.t.comm, .trainer = s.trainer, .tag = TAG_ORCH, .req = MPI_REQUEST_NULL};
    s.heard = vks_seconds_now(); /* the start-up may have waited for slow ranks */
    s.status = (vks_rl_status){.say = o->status, .ctx = o->progress_ctx, .last = s.heard,
                               .interval_s = o->status_interval_s > 0 ? o->status_interval_s : VKS_RL_STATUS_INTERVAL_S};
    if (!rc) rc = orchestrate(&s);
    char err[1024];
    snprintf(err, sizeof err, "%s", rc ? vks_last_error() : "");
    if (rc && !s.trainer_gone) tell_failed(&s, err);
    s.t.lost = s.t.lost || s.trainer_gone || s.trainer_failed; /* a failed trainer aborts: nobody finalizes */
    vks_rl_orch_stop_ranks(&s.t);
    if (!rc) rc = send_orch_small(s.t.comm, s.trainer, MSG_FINISHED, 0, s.t.newest, s.t.lost, mo->timeout_s,
                                  "the trainer taking FINISHED");
    else vks_set_error(rc, "%s", err);
    *no_finalize = s.t.lost || rc != VKS_OK;
    free(s.scratch), free(s.out);
    vks_rl_orch_close(&s.t);
    return rc;
}

/* ---- the trainer, with the orchestrator elsewhere ---- */

typedef struct {
    trainer_src t;            /* the layout, weights, broadcast and tasks (to re-check the groups) */
    int orch;
    double heard;             /* the orchestrator's last word */
    bool gone;                /* it failed or went silent: no FINISH */
    vks_rl_counters counters; /* from its last TAKEN */
    int64_t next_batch;
    int resume_rc;            /* a RESUME that could not be sent: the first publish fails */
    vks_rl_rank_status ranks[VKS_RL_MAX_RANK_STATUS]; /* from its last TAKEN */
    int n_ranks;
    char resume_err[512];
} remote_src;

static int orch_error(remote_src *r, int rc, const char *what) {
    r->gone = true;
    return vks_set_error(rc, "the orchestrator (rank %d): %s; the run ends (the last checkpoint stays)", r->orch, what);
}

static void resume_remote(void *ctx, int64_t step, int64_t next_batch) {
    remote_src *r = ctx;
    r->next_batch = next_batch;
    r->resume_rc = send_orch_small(r->t.comm, r->orch, MSG_RESUME, next_batch, step, 0, r->t.mo->timeout_s,
                                   "the orchestrator taking RESUME");
    if (r->resume_rc) snprintf(r->resume_err, sizeof r->resume_err, "%s", vks_last_error());
}

/* After the weights (or adapter) of `step` went through Shardcast as when the
 * trainer orchestrates: the ranks that did not take them leave later
 * broadcasts here and go to the orchestrator in PUBLISHED (it drops them). */
static int published(remote_src *r, int64_t step) {
    trainer_src *t = &r->t;
    vks_rl_msg *msg = malloc(sizeof *msg + sizeof(int32_t) * (size_t)t->n_world);
    if (!msg) return vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    int32_t n = 0;
    for (int from = 1, rank; (rank = vks_rl_cast_failed(&t->cast, &from)) >= 0;) {
        int rc = vks_rl_orch_refused(t, rank, step);
        if (rc) {
            free(msg);
            return rc;
        }
        const char *said = vks_rl_cast_why(&t->cast, rank);
        if (said[0]) fprintf(stderr, "vkswarm: rl: rank %d refused the %s of step %lld: %s; the run goes on without it\n",
                             rank, t->c->lora_rank > 0 ? "adapter" : "weights", (long long)step, said);
        vks_rl_cast_drop(&t->cast, rank);
        memcpy((char *)(msg + 1) + sizeof n * (size_t)n, &(int32_t){rank}, sizeof n);
        n++;
        t->lost = true; /* maybe dead: this rank does not wait for it in MPI_Finalize */
    }
    *msg = (vks_rl_msg){.magic = VKS_RL_MAGIC, .type = MSG_PUBLISHED, .step = step, .n = (uint64_t)n};
    bool kept;
    int rc = vks_rl_wire_send(t->comm, r->orch, TAG_ORCH, msg, sizeof *msg + sizeof n * (size_t)n, t->mo->timeout_s,
                          "the orchestrator taking PUBLISHED", &kept);
    if (kept) free(msg);
    return rc ? orch_error(r, rc, vks_last_error()) : VKS_OK;
}

static int publish_remote(void *ctx, vks_model *m, int64_t step) {
    remote_src *r = ctx;
    if (r->resume_rc) {
        vks_model_free(m);
        return orch_error(r, r->resume_rc, r->resume_err);
    }
    int rc = vks_rl_orch_cast_weights(&r->t, m, step);
    return rc ? rc : published(r, step);
}

/* LoRA: the adapter instead of the weights. */
static int publish_adapter_remote(void *ctx, vks_lora_adapter *a, int64_t step) {
    remote_src *r = ctx;
    if (r->resume_rc) {
        vks_lora_adapter_free(a);
        return orch_error(r, r->resume_rc, r->resume_err);
    }
    int rc = vks_rl_orch_cast_adapter(&r->t, a, step);
    return rc ? rc : published(r, step);
}

/* One group of a TAKEN message (at *at, left bytes): unpacked with the checks
 * an inference rank's batch gets; its one non-empty slot goes to *out. */
static int unpack_one(remote_src *r, const char **at, size_t *left, int64_t step, vks_rl_batch_group *scratch,
                      vks_rl_batch_group *out, char *err, size_t cap) {
    trainer_src *t = &r->t;
    const vks_rl_config *c = t->c;
    uint64_t len = 0;
    vks_rl_msg h;
    if (*left < sizeof len) return snprintf(err, cap, "truncated"), VKS_ERR_FORMAT;
    memcpy(&len, *at, sizeof len);
    *at += sizeof len, *left -= sizeof len;
    if (len > *left || len > vks_rl_wire_max_groups_bytes(c, t->o->model->cfg.seq_len) || len < sizeof h)
        return snprintf(err, cap, "a group of %llu bytes", (unsigned long long)len), VKS_ERR_FORMAT;
    memcpy(&h, *at, sizeof h);
    if (h.batch < 0 || h.batch >= r->next_batch)
        return snprintf(err, cap, "batch %lld (%lld granted)", (long long)h.batch, (long long)r->next_batch), VKS_ERR_FORMAT;
    int64_t policy = 0, min_step = step - c->async_level > 0 ? step - c->async_level : 0;
    vks_rl_gen_counts cnt;
    if (vks_rl_wire_unpack_groups(*at, (size_t)len, &t->gen, c, &t->o->model->cfg, h.batch, min_step, t->newest, false,
                                  scratch, &policy, &cnt, err, cap))
        return VKS_ERR_FORMAT;
    *at += len, *left -= (size_t)len;
    int found = 0;
    for (int p = 0; p < c->prompts_per_step; p++) {
        if (scratch[p].n && !found++) *out = scratch[p], memset(&scratch[p], 0, sizeof scratch[p]);
        vks_rl_group_free(&scratch[p]);
    }
    if (found != 1) {
        vks_rl_group_free(out);
        return snprintf(err, cap, "%d groups in one slot message", found), VKS_ERR_FORMAT;
    }
    return VKS_OK;
}

/* The rank counts at the end of a TAKEN (n of them): world ranks, states and
 * counts in range, the reason NUL-terminated; kept for the report. */
static bool unpack_ranks(remote_src *r, const char *at, int n) {
    vks_rl_rank_status st[VKS_RL_MAX_RANK_STATUS];
    for (int i = 0; i < n; i++) {
        memcpy(&st[i], at + sizeof st[i] * (size_t)i, sizeof st[i]);
        st[i].verifier = false; /* set from its byte below */
        const vks_rl_rank_status *k = &st[i];
        if (k->rank < 0 || k->rank >= r->t.n_world || k->state < VKS_RL_RANK_LIVE || k->state > VKS_RL_RANK_REFUSED ||
            k->batches < 0 || k->rollouts < 0 || k->rejected < 0 || k->at_step < -1)
            return false;
        unsigned char v; /* a bool on the wire: 0 or 1 (read as a byte: any other value is no bool) */
        memcpy(&v, at + sizeof st[i] * (size_t)i + offsetof(vks_rl_rank_status, verifier), 1);
        if (v > 1) return false;
        st[i].verifier = v;
        st[i].why[sizeof st[i].why - 1] = 0;
    }
    memcpy(r->ranks, st, sizeof st[0] * (size_t)n);
    r->n_ranks = n;
    return true;
}

/* A TAKEN message of `bytes` for `step`: the counters, drops, P groups, the rank counts. */
static int unpack_taken(remote_src *r, const char *buf, size_t bytes, int64_t step, vks_rl_batch_group *groups) {
    trainer_src *t = &r->t;
    int P = t->c->prompts_per_step;
    vks_rl_msg h;
    orch_info info;
    char err[320] = "";
    if (bytes < sizeof h + sizeof info) return orch_error(r, VKS_ERR_FORMAT, "a TAKEN of too few bytes");
    memcpy(&h, buf, sizeof h), memcpy(&info, buf + sizeof h, sizeof info);
    const vks_rl_counters *k = &info.counters;
    bool counts = k->rollouts >= 0 && k->checked >= 0 && k->accepted >= 0 && k->rejected >= 0 && k->filtered >= 0 &&
                  k->stale >= 0 && k->off_policy >= 0 && isfinite(k->task_reward_sum) && k->task_reward_sum >= 0;
    if (h.n != bytes || h.step != step || h.batch < r->next_batch || !counts || info.n_groups != P || info.n_drops < 0 ||
        info.n_drops > t->n_world || (info.lost != 0 && info.lost != 1) || info.n_ranks < 0 ||
        info.n_ranks > VKS_RL_MAX_RANK_STATUS || info.n_ranks > t->n_world ||
        bytes - sizeof h - sizeof info < sizeof(int32_t) * (size_t)info.n_drops)
        return orch_error(r, VKS_ERR_FORMAT, "a malformed TAKEN");
    const char *at = buf + sizeof h + sizeof info;
    size_t left = bytes - sizeof h - sizeof info - sizeof(int32_t) * (size_t)info.n_drops;
    for (int i = 0; i < info.n_drops; i++) {
        int32_t d;
        memcpy(&d, at + sizeof d * (size_t)i, sizeof d);
        if (d < 0 || d >= t->n_world || d == t->c->trainer) return orch_error(r, VKS_ERR_FORMAT, "TAKEN drops a bad rank");
        vks_rl_cast_drop(&t->cast, d);
    }
    at += sizeof(int32_t) * (size_t)info.n_drops;
    r->next_batch = h.batch; /* the groups' batches were granted before it */
    vks_rl_batch_group *scratch = calloc((size_t)P, sizeof *scratch);
    int rc = scratch ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    int i = 0;
    for (; !rc && i < P; i++) rc = unpack_one(r, &at, &left, step, scratch, &groups[i], err, sizeof err);
    size_t ranks_bytes = sizeof(vks_rl_rank_status) * (size_t)info.n_ranks;
    if (!rc && left != ranks_bytes)
        snprintf(err, sizeof err, "%zu bytes past the last group (%zu of rank counts)", left, ranks_bytes), rc = VKS_ERR_FORMAT;
    if (!rc && !unpack_ranks(r, at, info.n_ranks))
        snprintf(err, sizeof err, "bad rank counts"), rc = VKS_ERR_FORMAT;
    free(scratch);
    if (rc == VKS_ERR_FORMAT) {
        for (int j = 0; j < i; j++) vks_rl_group_free(&groups[j]);
        char why[400];
        snprintf(why, sizeof why, "group %d of step %lld: %s", i - 1, (long long)step, err);
        return orch_error(r, rc, why);
    }
    if (rc) return rc;
    r->counters = info.counters;
    t->lost = t->lost || info.lost;
    return VKS_OK;
}

/* The orchestrator's answer to what this rank asked (TAKEN or FINISHED:
 * `type`); beats meanwhile; silence past `bound` ends it. *buf: malloc'd. */
static int wait_orch(remote_src *r, uint32_t type, size_t most, double bound, char **buf, size_t *bytes) {
    for (;;) {
        int flag = 0, count = 0;
        MPI_Status st;
        if (MPI_Iprobe(r->orch, TAG_ORCH, r->t.comm, &flag, &st) != MPI_SUCCESS)
            return orch_error(r, VKS_ERR_IO, "MPI_Iprobe failed");
        if (!flag) {
            double quiet = vks_seconds_now() - r->heard;
            if (quiet > bound) {
                char why[96];
                snprintf(why, sizeof why, "went silent (%.1f s)", quiet);
                return orch_error(r, VKS_ERR_TIMEOUT, why);
            }
            usleep(500);
            continue;
        }
        MPI_Get_count(&st, MPI_BYTE, &count);
        bool fits = count >= (int)sizeof(vks_rl_msg) && (size_t)count <= most;
        char *b = malloc(fits ? (size_t)count : 1);
        if (!b) return vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
        int mrc = MPI_Recv(b, fits ? count : 0, MPI_BYTE, r->orch, TAG_ORCH, r->t.comm, MPI_STATUS_IGNORE);
        r->heard = vks_seconds_now();
        vks_rl_msg h = {0};
        if (fits && mrc == MPI_SUCCESS) memcpy(&h, b, sizeof h);
        if (fits && mrc == MPI_SUCCESS && h.magic == VKS_RL_MAGIC && h.type == MSG_BEAT && count == (int)sizeof h) {
            free(b);
            continue;
        }
        if (fits && mrc == MPI_SUCCESS && h.magic == VKS_RL_MAGIC && h.type == type) {
            *buf = b, *bytes = (size_t)count;
            return VKS_OK;
        }
        char why[4 * VKS_RL_REASON_MAX + 64];
        if (fits && h.magic == VKS_RL_MAGIC && h.type == MSG_FAILED) {
            char text[4 * VKS_RL_REASON_MAX + 1];
            size_t n = (size_t)count - sizeof h;
            vks_escape(b + sizeof h, strnlen(b + sizeof h, n < VKS_RL_REASON_MAX ? n : VKS_RL_REASON_MAX), text, sizeof text);
            snprintf(why, sizeof why, "failed: %s", text);
        } else snprintf(why, sizeof why, "a message of %d bytes (type %u)", count, h.type);
        free(b);
        return orch_error(r, VKS_ERR_FORMAT, why);
    }
}

/* The status lines come from the orchestrator's rank, which holds the queue. */
static int take_remote(void *ctx, int64_t step, vks_rl_batch_group *groups, vks_rl_status *status) {
    remote_src *r = ctx;
    (void)status;
    trainer_src *t = &r->t;
    const vks_rl_config *c = t->c;
    int rc = send_orch_small(t->comm, r->orch, MSG_TAKE, 0, step, 0, t->mo->timeout_s, "the orchestrator taking TAKE");
    if (rc) return orch_error(r, rc, vks_last_error());
    size_t most = sizeof(vks_rl_msg) + sizeof(orch_info) + sizeof(int32_t) * (size_t)t->n_world +
                  (size_t)c->prompts_per_step * (sizeof(uint64_t) + vks_rl_wire_max_groups_bytes(c, t->o->model->cfg.seq_len)) +
                  sizeof(vks_rl_rank_status) * VKS_RL_MAX_RANK_STATUS;
    char *buf = NULL;
    size_t bytes = 0;
    /* the orchestrator beats every second; a send of its to a dead rank may hold it up to timeout_s */
    rc = wait_orch(r, MSG_TAKEN, most, 2 * t->mo->timeout_s + 2, &buf, &bytes);
    if (!rc) rc = unpack_taken(r, buf, bytes, step, groups);
    free(buf);
    return rc;
}

static void counters_remote(void *ctx, vks_rl_counters *c) { *c = ((remote_src *)ctx)->counters; }
static int ranks_remote(void *ctx, vks_rl_rank_status *out, int cap) {
    const remote_src *r = ctx;
    int n = r->n_ranks < cap ? r->n_ranks : cap;
    memcpy(out, r->ranks, sizeof *out * (size_t)n);
    return n;
}
static int64_t position_remote(void *ctx) { return ((remote_src *)ctx)->next_batch; }
static double broadcast_bytes_remote(void *ctx) { return (double)((remote_src *)ctx)->t.cast_bytes; }

/* FINISH (n = the run failed) and the orchestrator's FINISHED (n = ranks
 * were lost), bounded: it says STOP to every rank first, each send bounded. */
static void finish(remote_src *r, bool failed) {
    trainer_src *t = &r->t;
    if (r->gone) {
        t->lost = true;
        return;
    }
    int rc = send_orch_small(t->comm, r->orch, MSG_FINISH, 0, t->newest, failed, t->mo->timeout_s,
                             "the orchestrator taking FINISH");
    char *buf = NULL;
    size_t bytes = 0;
    if (!rc) rc = wait_orch(r, MSG_FINISHED, sizeof(vks_rl_msg), t->mo->timeout_s * (t->n_world + 1), &buf, &bytes);
    vks_rl_msg h = {0};
    if (!rc) memcpy(&h, buf, sizeof h);
    free(buf);
    if (rc) fprintf(stderr, "vkswarm: rl: the end of the run: %s\n", vks_last_error());
    t->lost = t->lost || rc != VKS_OK || h.n != 0;
}

int vks_rl_orch_trainer(const vks_rl_run_options *o, const vks_rl_mpi_options *mo, vks_rl_result *res, bool *lost) {
    remote_src r = {.orch = o->config->orchestrator};
    int rc = vks_rl_orch_open(&r.t, o, mo, true);
    if (!rc) vks_rl_cast_drop(&r.t.cast, r.orch); /* it takes no weights */
    r.heard = vks_seconds_now();
    vks_rl_source src = {.ctx = &r, .publish = publish_remote, .take = take_remote, .counters = counters_remote,
                         .position = position_remote, .resume = resume_remote, .broadcast_bytes = broadcast_bytes_remote,
                         .ranks = ranks_remote, .publish_adapter = publish_adapter_remote};
    if (!rc) rc = vks_rl_run_source(o, &src, res);
    char err[1024];
    snprintf(err, sizeof err, "%s", rc ? vks_last_error() : "");
    finish(&r, rc != VKS_OK);
    *lost = r.t.lost;
    vks_rl_orch_close(&r.t);
    if (rc) return vks_set_error(rc, "%s", err);
    return VKS_OK;
}
