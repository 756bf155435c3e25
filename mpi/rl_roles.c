/* rl_roles.c: the RL run across MPI ranks (vks_rl_mpi.h). The trainer rank
 * runs vks_rl_run_source with a source whose groups come from inference ranks;
 * inference ranks run vks_rl_gen_batch (the single-process code) on a thread
 * while their main thread keeps MPI moving and beats.
 *
 * Verifier ranks (rl_verifier.c), when the config names any, check every
 * batch before the trainer sees it. An inference group of several ranks
 * (rl_group.c) is seen through its first rank: the others hear only from it.
 *
 * The orchestration (trainer_src, rl_orch.h: grants, checks, queue, liveness)
 * is shared with an orchestrator on a rank of its own (rl_orchestrator.c);
 * then every "trainer" below on TAG_CTL / TAG_UP is roles.orchestrator.
 *
 * The weights go through Shardcast (rl_cast.c): after each step the trainer
 * broadcasts the WEIGHTS file (vks_rl_msg with step, n = floats, then the f32
 * parameter block) to every inference and verifier rank, through the relays
 * (LoRA: the step's adapter instead; rl_cast.h).
 *
 * Messages (every one starts with vks_rl_msg; rl_wire.c packs the groups):
 *   TAG_CTL     trainer -> inference  ASSIGN: batch, step = the policy step to use at least,
 *                                     n = the verifier rank + 1 (0: verify it yourself)
 *               trainer -> all        STOP: n = 1 when ranks were lost (no MPI_Finalize)
 *               trainer -> a group's  REFORM: n = the world rank of a later stage refused (a
 *                          first rank    verifier named it): the group goes on without it
 *   TAG_UP      inference -> trainer  BEAT (every second); without verifier ranks GROUPS: batch,
 *                                     step = the policy step used, then the groups (accepted
 *                                     completions); with them DONE: batch, n = the verifier
 *   TAG_VERIFY  inference -> verifier TO_VERIFY: batch, step, n = bytes of the GROUPS message
 *                                     that follows (every completion, unverified), then the
 *                                     batch's rollout file
 *   TAG_UP      verifier -> trainer   BEAT; VERIFIED: batch, step, n = the inference rank, then
 *                                     the GROUPS message of the accepted completions; REFUSE:
 *                                     batch, n = the inference rank, step = the world rank of
 *                                     the pipeline stage to blame (-1: the inference rank), then
 *                                     the reason (text) */
#include "vkswarm/vks_rl_mpi.h"
#include <limits.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sodium.h>
#include <sys/mman.h>
#include "vkswarm/vks_rl_roles.h"
#include "vkswarm/vks_rl_bans.h"
#include "vkswarm/vks_checkpoint.h"
#include "vkswarm/vks_grpo.h"
#include "vkswarm/vks_mpi.h"

#include "rl_cast.h"
#include "rl_group.h"
#include "rl_join.h"
#include "rl_orch.h"
#include "rl_wire.h"

const char *vks_rl_mpi_peer_name(const vks_rl_config *c) {
    return c->orchestrator == c->trainer ? "the trainer" : "the orchestrator";
}

int vks_rl_mpi_check_roles(const vks_rl_config *c) {
    if (!c->roles_given) return vks_set_error(VKS_ERR_ARG, "rl across ranks: the config gives no roles");
    if (c->orchestrator != c->trainer && vks_rl_config_roles_of(c, c->orchestrator) != VKS_RL_ROLE_ORCHESTRATOR)
        return vks_set_error(VKS_ERR_ARG, "rl across ranks: the orchestrator (rank %d) shares a rank only with the "
                             "trainer (rank %d)", c->orchestrator, c->trainer);
    if (c->n_inference_ranks < 1) return vks_set_error(VKS_ERR_ARG, "rl across ranks: no inference ranks");
    return VKS_OK;
}

/* ---- the trainer's side (also an orchestrator's on its own rank: rl_orch.h) ---- */

static int send_ctl(trainer_src *t, int rank, uint32_t type, int64_t batch, int64_t step, uint64_t n) {
    vks_rl_msg m = {.magic = VKS_RL_MAGIC, .type = type, .batch = batch, .step = step, .n = n};
    return vks_rl_wire_send_small(t->comm, rank, TAG_CTL, &m, t->mo->timeout_s, type == MSG_STOP ? "the stop" : "a grant");
}

/* The same to an inference or verifier rank, wherever it is reached (a joined one over its connection). */
static int send_ctl_to(trainer_src *t, const inf_rank *r, uint32_t type, int64_t batch, int64_t step, uint64_t n) {
    vks_rl_msg m = {.magic = VKS_RL_MAGIC, .type = type, .batch = batch, .step = step, .n = n};
    /* a joined rank's: 1 s (a small message leaves at once unless the peer is gone; the trainer never waits
     * on a joiner for long); a dead one is dropped for it, and its silence would drop it anyway */
    return vks_rl_wire_send_small(r->comm, r->peer, TAG_CTL, &m, r->joined ? 1.0 : t->mo->timeout_s,
                                  type == MSG_STOP ? "the stop" : "a grant");
}

static void push_redo(trainer_src *t, int64_t batch) {
    if (t->n_redo == t->cap_redo) {
        int cap = t->cap_redo ? 2 * t->cap_redo : 8;
        int64_t *r = realloc(t->redo, sizeof *r * (size_t)cap);
        if (!r) return; /* out of memory: the batch is skipped (fresh tasks follow) */
        t->redo = r, t->cap_redo = cap;
    }
    t->redo[t->n_redo++] = batch;
}

static void remove_pending(trainer_src *t, int i) { t->pend[i] = t->pend[--t->n_pend]; }

static int find_pending(const trainer_src *t, int64_t batch, int origin) {
    for (int i = 0; i < t->n_pend; i++)
        if (t->pend[i].batch == batch && t->pend[i].origin == origin) return i;
    return -1;
}

/* The group of more than one rank whose first rank is `rank` (-1: none). */
static int pipeline_group_of(const vks_rl_config *c, int rank) {
    for (int i = 0; i < c->n_groups; i++)
        if (c->groups[i].n > 1 && c->inference_ranks[c->groups[i].first] == rank) return i;
    return -1;
}

/* The first rank of the pipeline group in which `rank` is a later stage (-1: none). */
static int first_stage_of(const vks_rl_config *c, int rank) {
    for (int i = 0; i < c->n_groups; i++)
        for (int s = 1; s < c->groups[i].n; s++)
            if (c->inference_ranks[c->groups[i].first + s] == rank) return c->inference_ranks[c->groups[i].first];
    return -1;
}

/* Leaves rank r out of the run (state: RANK_DROPPED or RANK_REFUSED, as the
 * summary says); gone: it leaves without MPI_Finalize (dropped, or told to
 * stop now), so later broadcasts do not wait for it and nobody finalizes. */
static void ban_key(trainer_src *t, inf_rank *r, const char *why);

/* A joined rank leaving the run is told why (NOT_ADMITTED on its
 * connection, batch = 1: refused, 0: dropped), so that a live one ends now
 * instead of waiting out its trainer timeout. Not waited for beyond a small
 * message's eager send (it may be dead). */
static void tell_joined(trainer_src *t, inf_rank *r, int state, const char *why) {
    size_t n = strnlen(why, VKS_RL_REASON_MAX - 1) + 1;
    char *msg = calloc(1, sizeof(vks_rl_msg) + n);
    if (!msg) return;
    vks_rl_msg h = {.magic = VKS_RL_MAGIC, .type = MSG_NOT_ADMITTED, .batch = state == RANK_REFUSED, .step = t->newest,
                    .n = n};
    memcpy(msg, &h, sizeof h);
    memcpy(msg + sizeof h, why, n - 1);
    bool freeable = true;
    vks_rl_wire_send(r->comm, 0, TAG_JOIN, msg, sizeof h + n, r->state == RANK_LIVE ? 1.0 : t->mo->timeout_s,
                     "the joiner taking why it left", &freeable);
    if (freeable) free(msg); /* else MPI may still read it: left */
}

static void leave_rank(trainer_src *t, inf_rank *r, int state, const char *why_given, bool gone) {
    char why[sizeof r->why]; /* why_given may be vks_last_error()'s text, which telling the joiner rewrites */
    snprintf(why, sizeof why, "%s", why_given);
    if (r->joined && r->state == RANK_LIVE && state == RANK_REFUSED) ban_key(t, r, why); /* it sent something wrong */
    if (r->admitted && r->state == RANK_LIVE) {
        t->leaves++;
        if (state == RANK_REFUSED && r->ident >= 0) t->idents[r->ident].rejected++;
    }
    if (r->joined && (r->state == RANK_LIVE || r->state == RANK_JOINING)) tell_joined(t, r, state, why);
    fprintf(stderr, "vkswarm: rl: %s rank %d %s: %s; the run goes on without it\n", r->verifier ? "verifier" : "inference",
            r->rank, state == RANK_REFUSED ? "refused" : "dropped", why);
    r->state = state;
    r->at_step = t->newest;
    snprintf(r->why, sizeof r->why, "%s", why);
    t->lost = t->lost || (gone && !r->joined); /* a refused rank left running is alive: it can still finalize */
    if (gone && !r->joined) { /* later broadcasts do not wait for it, nor for its group's other stages */
        vks_rl_orch_cast_drop(t, r->rank);
        int g = r->verifier ? -1 : pipeline_group_of(t->c, r->rank);
        for (int k = 1; g >= 0 && k < t->c->groups[g].n; k++)
            vks_rl_orch_cast_drop(t, t->c->inference_ranks[t->c->groups[g].first + k]);
    }
    if (t->c->n_verifiers) { /* its batches, generating or at a verifier, go out again */
        for (int i = t->n_pend - 1; i >= 0; i--)
            if (t->pend[i].origin == r->rank || t->pend[i].verifier == r->rank) {
                push_redo(t, t->pend[i].batch);
                remove_pending(t, i);
            }
    } else if (r->batch >= 0) push_redo(t, r->batch);
    r->batch = -1;
}

static void drop_rank(trainer_src *t, inf_rank *r, int state, const char *why) {
    leave_rank(t, r, state, why, state == RANK_DROPPED);
}

static inf_rank *find_rank(trainer_src *t, int rank) {
    for (int i = 0; i < t->n_ranks; i++)
        if (t->ranks[i].rank == rank) return &t->ranks[i];
    return NULL;
}

/* Tells a rank dropped for a failed broadcast to stop now (n = 1: ranks were
 * lost, no MPI_Finalize): it may be alive, and would otherwise wait for the
 * trainer until its trainer timeout. Not waited for, as the rank may be dead:
 * a live one takes it at its next poll, long before the run ends. */
static void stop_now(trainer_src *t, int rank) {
    if (!t->stop_req || rank < 0 || rank >= t->n_world || t->stop_req[rank] != MPI_REQUEST_NULL) return;
    t->stop_msg[rank] = (vks_rl_msg){.magic = VKS_RL_MAGIC, .type = MSG_STOP, .step = t->newest, .n = 1};
    if (MPI_Isend(&t->stop_msg[rank], sizeof t->stop_msg[rank], MPI_BYTE, rank, TAG_CTL, t->comm, &t->stop_req[rank]) !=
        MPI_SUCCESS)
        t->stop_req[rank] = MPI_REQUEST_NULL;
}

void vks_rl_orch_cast_drop(trainer_src *t, int rank) {
    vks_rl_cast_drop(&t->cast, rank); /* on the orchestrator's own rank: only marks it gone (stop_ranks reads that) */
    if (!t->remote) return;
    for (int i = 0; i < t->n_drops; i++)
        if (t->drops[i] == rank) return;
    if (t->n_drops == t->cap_drops) {
        int cap = t->cap_drops ? 2 * t->cap_drops : 8;
        int *d = realloc(t->drops, sizeof *d * (size_t)cap);
        if (!d) return; /* out of memory: later broadcasts wait for it, fail, and report it again */
        t->drops = d, t->cap_drops = cap;
    }
    t->drops[t->n_drops++] = rank;
}

/* After a broadcast, for every rank that did not finish it: dropped from the
 * run (inference and verifier ranks) or from later broadcasts (relays, and
 * ranks already refused); the dropped ones are told to stop. A rank that
 * refused the file is named with its reason (it said why: vks_rl_cast_why). */
void vks_rl_orch_failed_rank(trainer_src *t, int rank, int64_t step) {
    char why[320];
    const char *said = vks_rl_cast_why(&t->cast, rank), *what = t->c->lora_rank > 0 ? "adapter" : "weights";
    if (said[0]) snprintf(why, sizeof why, "it refused the %s of step %lld: %s", what, (long long)step, said);
    else snprintf(why, sizeof why, "it did not take the %s of step %lld (Shardcast)", what, (long long)step);
    int first = first_stage_of(t->c, rank);
    if (first >= 0) { /* a later stage of a pipeline group: the group cannot generate without it */
        inf_rank *f = find_rank(t, first);
        if (f && f->state == RANK_LIVE) {
            char stage_why[320 + 32];
            snprintf(stage_why, sizeof stage_why, "its stage rank %d: %s", rank, why); /* r->why keeps 319 bytes */
            leave_rank(t, f, said[0] ? RANK_REFUSED : RANK_DROPPED, stage_why, true); /* with its stages */
            stop_now(t, first); /* it passes the stop on to its stages */
        }
        t->lost = true;
        vks_rl_orch_cast_drop(t, rank);
        return;
    }
    inf_rank *r = find_rank(t, rank);
    if (r && r->state == RANK_LIVE) {
        leave_rank(t, r, said[0] ? RANK_REFUSED : RANK_DROPPED, why, true);
        stop_now(t, rank);
        return;
    }
    if (!r) {
        fprintf(stderr, "vkswarm: rl: relay rank %d dropped: %s; its part of the tree goes to the others\n", rank, why);
        stop_now(t, rank);
    }
    t->lost = true; /* a relay, or a refused rank: maybe dead, so nobody waits for it in MPI_Finalize */
    vks_rl_orch_cast_drop(t, rank);
}

int vks_rl_orch_refused(const trainer_src *t, int rank, int64_t step) {
    const char *said = vks_rl_cast_why(&t->cast, rank);
    if (!said[0] || vks_mpi_recovery_enabled()) return VKS_OK;
    return vks_set_error(VKS_ERR_PEER, "rank %d refused the %s of step %lld: %s; the run stops (under mpirun "
                         "--enable-recovery it would go on without that rank)", rank,
                         t->c->lora_rank > 0 ? "adapter" : "weights", (long long)step, said);
}

/* After a broadcast of `step`: every rank that did not take it (a refusal
 * without --enable-recovery ends the run). */
static int failed_ranks(trainer_src *t, int64_t step) {
    for (int from = 1, rank; (rank = vks_rl_cast_failed(&t->cast, &from)) >= 0;) {
        int rc = vks_rl_orch_refused(t, rank, step);
        if (rc) return rc;
        vks_rl_orch_failed_rank(t, rank, step);
    }
    return VKS_OK;
}

/* The weights of `step` to every inference and verifier rank through
 * Shardcast (the trainer is the origin). A rank that does not take them is
 * dropped; the run fails only when nothing could be sent. */
int vks_rl_orch_cast_weights(trainer_src *t, vks_model *m, int64_t step) {
    size_t n = t->layout->n_values, bytes = sizeof(vks_rl_msg) + sizeof(float) * n;
    int rc = vks_param_layout_gather(t->layout, m, t->weights + sizeof(vks_rl_msg) / sizeof(float));
    vks_model_free(m);
    if (rc) return rc;
    vks_rl_msg h = {.magic = VKS_RL_MAGIC, .type = MSG_WEIGHTS, .step = step, .n = n};
    memcpy(t->weights, &h, sizeof h);
    vks_bcast_report rep;
    rc = vks_rl_cast_send(&t->cast, t->weights, bytes, step, &rep);
    if (rc && rep.version == 0) return vks_error_prefix(rc, "trainer: broadcasting the weights of step %lld", (long long)step);
    t->cast_bytes = rep.wire_bytes;
    t->newest = step, t->published = true;
    /* an orchestrator on its own rank is no receiver */
    fprintf(stderr, "vkswarm: rl: shardcast: step %lld (version %llu): %llu bytes to %d of %d ranks through %d relay(s) "
            "in %.3f s\n", (long long)step, (unsigned long long)rep.version, (unsigned long long)rep.wire_bytes,
            rep.ranks_ok, t->cast.n_world - 1 - (t->orch >= 0), t->c->n_relays, rep.seconds);
    return VKS_OK;
}

static int joined_weights_progress(trainer_src *t);

static int publish_mpi(void *ctx, vks_model *m, int64_t step) {
    trainer_src *t = ctx;
    int rc = vks_rl_orch_cast_weights(t, m, step);
    if (!rc) rc = failed_ranks(t, step);
    return rc ? rc : joined_weights_progress(t); /* the new weights start out to joined ranks */
}

/* LoRA: the adapter of `step` (a GGUF LoRA file, rl_cast.h) to every inference and verifier rank. */
int vks_rl_orch_cast_adapter(trainer_src *t, vks_lora_adapter *a, int64_t step) {
    uint8_t *file = NULL;
    size_t bytes = 0;
    int rc = vks_rl_cast_adapter_file(&t->cast, t->c->out, a, &file, &bytes);
    vks_lora_adapter_free(a);
    vks_bcast_report rep;
    if (!rc) rc = vks_rl_cast_send(&t->cast, file, bytes, step, &rep);
    free(file);
    if (rc && (bytes == 0 || rep.version == 0))
        return vks_error_prefix(rc, "trainer: broadcasting the adapter of step %lld", (long long)step);
    t->cast_bytes = rep.wire_bytes;
    t->newest = step;
    fprintf(stderr, "vkswarm: rl: shardcast: step %lld (version %llu): adapter, %llu bytes to %d of %d ranks in %.3f s\n",
            (long long)step, (unsigned long long)rep.version, (unsigned long long)rep.wire_bytes, rep.ranks_ok,
            t->cast.n_world - 1 - (t->orch >= 0), rep.seconds);
    return VKS_OK;
}

static int publish_adapter_mpi(void *ctx, vks_lora_adapter *a, int64_t step) {
    trainer_src *t = ctx;
    int rc = vks_rl_orch_cast_adapter(t, a, step);
    return rc ? rc : failed_ranks(t, step);
}

/* With verifier ranks an inference rank only says DONE (its batch went to the verifier). */
static void from_inference_done(trainer_src *t, inf_rank *r, const vks_rl_msg *h, bool big) {
    if (big || h->magic != VKS_RL_MAGIC || h->type != MSG_DONE) {
        drop_rank(t, r, RANK_REFUSED, "a message other than DONE (its batches go to verifier ranks)");
        return;
    }
    /* the verifier may have answered first: then the batch is no longer the rank's */
    if (h->batch == r->batch) r->batch = -1;
}

/* Verifier v's REFUSE about batch `batch` (-1: unreadable) as text: its
 * reason (the text after the header), escaped. */
static void refusal_text(const inf_rank *v, int64_t batch, const char *buf, size_t bytes, char *why, size_t cap) {
    size_t n = bytes - sizeof(vks_rl_msg);
    if (n > VKS_RL_REASON_MAX) n = VKS_RL_REASON_MAX;
    const char *text = buf + sizeof(vks_rl_msg);
    char reason[4 * VKS_RL_REASON_MAX + 1], which[48] = "";
    vks_escape(text, strnlen(text, n), reason, sizeof reason);
    if (batch >= 0) snprintf(which, sizeof which, "batch %lld: ", (long long)batch);
    snprintf(why, cap, "verifier rank %d: %s%s", v->rank, which, reason);
}

/* Refuses inference rank r on verifier v's REFUSE about batch `batch` (-1:
 * unreadable), giving its reason. */
static void refuse_through(trainer_src *t, const inf_rank *v, inf_rank *r, int64_t batch, const char *buf, size_t bytes) {
    char why[4 * VKS_RL_REASON_MAX + 96];
    refusal_text(v, batch, buf, bytes, why, sizeof why);
    drop_rank(t, r, RANK_REFUSED, why);
}

/* A REFUSE of batch e that blames world rank `blamed` (the message's step):
 * when that is a later stage of r's pipeline group, the stage is refused and
 * not r: r is told to re-form the group without it (REFORM), later
 * broadcasts leave it out, and the batch goes out again. A batch made before
 * the stage was left out is only granted again. False: the refusal is r's
 * (no group, no stage named, r itself, a rank not in its group, a stage left
 * out before the batch was granted, or fewer than two ranks would be left). */
static bool refuse_stage(trainer_src *t, const inf_rank *v, inf_rank *r, const pending_batch *e, int64_t blamed,
                         const char *buf, size_t bytes) {
    int g = pipeline_group_of(t->c, r->rank);
    if (g < 0 || blamed < 0 || blamed > INT_MAX) return false;
    const int *ranks = t->c->inference_ranks + t->c->groups[g].first;
    int n = t->c->groups[g].n, cs = 1;
    while (cs < n && ranks[cs] != (int)blamed) cs++;
    if (cs >= n || cs >= 64) return false; /* not a later stage: the group's first answers for what it sent */
    char group[256];
    size_t at = (size_t)snprintf(group, sizeof group, "[");
    for (int k = 0; k < n && at < sizeof group; k++) at += (size_t)snprintf(group + at, sizeof group - at, "%s%d", k ? ", " : "", ranks[k]);
    if (at < sizeof group) snprintf(group + at, sizeof group - at, "]");
    if (r->out >> cs & 1) {
        if (e->form == r->form) return false; /* granted after the stage was left out: r names a stage not in it */
        fprintf(stderr, "vkswarm: rl: inference group %s: batch %lld, made before stage rank %d was refused, refused by "
                "verifier rank %d: granted again\n", group, (long long)e->batch, (int)blamed, v->rank);
        return true;
    }
    int left = 0;
    for (int k = 0; k < n; k++) left += k >= 64 || !(r->out >> k & 1);
    if (left - 1 < 2) return false; /* a pipeline of one rank is not formed: the group ends (named by its first) */
    char why[4 * VKS_RL_REASON_MAX + 96], after[256];
    refusal_text(v, e->batch, buf, bytes, why, sizeof why);
    r->out |= (uint64_t)1 << cs, r->form++;
    at = (size_t)snprintf(after, sizeof after, "[");
    for (int k = 0, m = 0; k < n && at < sizeof after; k++)
        if (k >= 64 || !(r->out >> k & 1)) at += (size_t)snprintf(after + at, sizeof after - at, "%s%d", m++ ? ", " : "", ranks[k]);
    if (at < sizeof after) snprintf(after + at, sizeof after - at, "]");
    fprintf(stderr, "vkswarm: rl: inference group %s: stage rank %d refused: %s; the group goes on as %s\n", group,
            (int)blamed, why, after);
    vks_rl_orch_cast_drop(t, (int)blamed); /* later broadcasts do not wait for it; its group's first stops it */
    if (send_ctl(t, r->rank, MSG_REFORM, -1, t->newest, (uint64_t)blamed)) drop_rank(t, r, RANK_DROPPED, vks_last_error());
    return true;
}

/* A batch taken in, for the report: rollouts of it on r's count (an inference
 * rank: generated; a verifier: checked), and the verifier's rejections; a
 * joined rank's on its identity's too. */
static void count_batch(trainer_src *t, inf_rank *r, const vks_rl_gen_counts *cnt, int64_t rollouts) {
    r->batches++;
    r->rollouts += rollouts;
    r->rejected += cnt->checked - cnt->accepted;
    if (r->joined && r->admitted && r->ident >= 0) t->idents[r->ident].accepted++;
}

/* VERIFIED or REFUSE from verifier rank v about a batch of inference rank h.n. */
static int from_verifier(trainer_src *t, inf_rank *v, const char *buf, size_t bytes, vks_rl_batch_group *scratch,
                         const vks_model_config *mc) {
    vks_rl_msg h;
    memcpy(&h, buf, sizeof h);
    int origin = h.n <= INT_MAX ? (int)h.n : -1;
    inf_rank *r = origin >= 0 ? find_rank(t, origin) : NULL;
    int at = r && !r->verifier ? find_pending(t, h.batch, origin) : -1;
    if (h.magic != VKS_RL_MAGIC || (h.type != MSG_VERIFIED && h.type != MSG_REFUSE)) {
        drop_rank(t, v, RANK_REFUSED, "a malformed message");
        return VKS_OK;
    }
    if (at < 0 && h.type == MSG_REFUSE && h.batch == -1 && r && !r->verifier && r->state == RANK_LIVE) {
        refuse_through(t, v, r, -1, buf, bytes); /* a message it could not read at all */
        return VKS_OK;
    }
    if (at < 0 || t->pend[at].verifier != v->rank) {
        /* a batch of a rank dropped meanwhile (its batches went out again): late, ignored */
        if (r && !r->verifier && r->state != RANK_LIVE) return VKS_OK;
        char why[128];
        snprintf(why, sizeof why, "a verdict on batch %lld of rank %d, which it was not given", (long long)h.batch, origin);
        drop_rank(t, v, RANK_REFUSED, why);
        return VKS_OK;
    }
    pending_batch e = t->pend[at];
    remove_pending(t, at);
    if (r->batch == e.batch) r->batch = -1;
    if (h.type == MSG_REFUSE) {
        push_redo(t, e.batch);
        if (!refuse_stage(t, v, r, &e, h.step, buf, bytes)) refuse_through(t, v, r, e.batch, buf, bytes);
        return VKS_OK;
    }
    char err[256];
    int64_t policy = 0;
    vks_rl_gen_counts cnt;
    if (vks_rl_wire_unpack_groups(buf + sizeof h, bytes - sizeof h, &t->gen, t->c, mc, e.batch, e.min_step, t->newest,
                                  false, scratch, &policy, &cnt, err, sizeof err) ||
        vks_rl_wire_check_counts(&cnt, scratch, t->c->prompts_per_step, true, err, sizeof err)) {
        for (int p = 0; p < t->c->prompts_per_step; p++) vks_rl_group_free(&scratch[p]);
        char why[320];
        snprintf(why, sizeof why, "batch %lld of rank %d: %s", (long long)e.batch, origin, err);
        push_redo(t, e.batch);
        drop_rank(t, v, RANK_REFUSED, why);
        return VKS_OK;
    }
    count_batch(t, r, &cnt, cnt.rollouts);
    count_batch(t, v, &cnt, cnt.checked);
    int rc = vks_rl_queue_push(&t->queue, policy, scratch, t->c->prompts_per_step, &cnt, t->o->max_empty_batches);
    for (int p = 0; p < t->c->prompts_per_step; p++) vks_rl_group_free(&scratch[p]);
    return rc;
}

static void admit(trainer_src *t, inf_rank *r, const char *buf, size_t bytes);


/* Receives one message from an inference or verifier rank (probed: st, on
 * comm; r: the rank it is from, NULL: none the run knows). */
static int receive_up(trainer_src *t, inf_rank *r, MPI_Comm comm, const MPI_Status *st, vks_rl_batch_group *scratch,
                      int seq_len, const vks_model_config *mc) {
    int count = 0;
    MPI_Get_count(st, MPI_BYTE, &count);
    /* a verifier's VERIFIED wraps a GROUPS message; REFUSE carries a reason of at most VKS_RL_REASON_MAX */
    size_t most = sizeof(vks_rl_msg) + vks_rl_wire_max_groups_bytes(t->c, seq_len) + (r && r->joined ? 64 : 0);
    char small[sizeof(vks_rl_msg)];
    bool big = count > (int)sizeof small && (size_t)count <= most;
    bool owned = big || (r && r->joined); /* a joined rank's: on the heap, as a timed-out receive leaves it to MPI */
    char *buf = owned ? malloc(big ? (size_t)count : sizeof small) : small;
    if (!buf) return vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    /* a message too big to be honest is received into nothing (truncation error) and refused */
    int mrc;
    if (r && r->joined) { /* bounded: a joiner that dies within a message leaves a blocking receive waiting forever */
        MPI_Request req;
        int peer = st->MPI_SOURCE;
        mrc = MPI_Irecv(buf, big ? count : (int)sizeof small, MPI_BYTE, peer, TAG_UP, comm, &req);
        if (mrc == MPI_SUCCESS && vks_mpi_wait_within(comm, &req, &peer, 1, t->mo->timeout_s, "a message")) {
            char why[96];
            snprintf(why, sizeof why, "it stopped within a message of %d bytes", count);
            leave_rank(t, r, RANK_DROPPED, why, true);
            return VKS_OK; /* buf is left to MPI */
        }
    } else mrc = MPI_Recv(buf, big ? count : (int)sizeof small, MPI_BYTE, st->MPI_SOURCE, TAG_UP, comm, MPI_STATUS_IGNORE);
    int rc = VKS_OK;
    if (r && r->joined && r->state == RANK_LIVE && big && mrc == MPI_SUCCESS) { /* signed by its key: checked, cut off */
        count -= crypto_sign_BYTES;
        if (count < (int)sizeof(vks_rl_msg) ||
            crypto_sign_verify_detached((const uint8_t *)buf + count, (const uint8_t *)buf, (size_t)count, r->key)) {
            drop_rank(t, r, RANK_REFUSED, "a batch its key did not sign");
            free(buf);
            return VKS_OK;
        }
        big = count > (int)sizeof small;
    }
    if (r && r->state == RANK_JOINING && mrc == MPI_SUCCESS) {
        admit(t, r, buf, (size_t)count);
    } else if (!r || r->state != RANK_LIVE) { /* late words of a dropped rank: ignored */
    } else if (mrc != MPI_SUCCESS || (!big && count != (int)sizeof(vks_rl_msg))) {
        char why[96];
        snprintf(why, sizeof why, "a message of %d bytes (at most %zu)", count, most);
        drop_rank(t, r, RANK_REFUSED, why);
    } else {
        vks_rl_msg h;
        memcpy(&h, buf, sizeof h);
        r->last_seen = vks_seconds_now();
        if (h.magic == VKS_RL_MAGIC && h.type == MSG_BEAT && !big) {
        } else if (h.magic == VKS_RL_MAGIC && h.type == MSG_BYE && !big && r->joined) { /* its batch goes out again */
            leave_rank(t, r, RANK_DROPPED, "it left (a clean stop)", true); /* tells it: its last word */
        } else if (r->verifier) {
            rc = from_verifier(t, r, buf, (size_t)count, scratch, mc);
        } else if (t->c->n_verifiers) {
            from_inference_done(t, r, &h, big);
        } else if (r->batch < 0) {
            drop_rank(t, r, RANK_REFUSED, "groups it was not asked for");
        } else {
            char err[256];
            int64_t policy = 0;
            vks_rl_gen_counts cnt;
            if (vks_rl_wire_unpack_groups(buf, (size_t)count, &t->gen, t->c, mc, r->batch, r->min_step, t->newest, false, scratch, &policy, &cnt, err,
                              sizeof err) ||
                vks_rl_wire_check_counts(&cnt, scratch, t->c->prompts_per_step, t->o->verify, err, sizeof err)) {
                for (int p = 0; p < t->c->prompts_per_step; p++) vks_rl_group_free(&scratch[p]);
                char why[320];
                snprintf(why, sizeof why, "batch %lld: %s", (long long)r->batch, err);
                drop_rank(t, r, RANK_REFUSED, why);
            } else {
                r->batch = -1;
                count_batch(t, r, &cnt, cnt.rollouts);
                if (r->joined && r->batches == 1)
                    fprintf(stderr, "vkswarm: rl: joined rank %d: its first batch accepted, %.1f s after it connected\n",
                            r->rank, vks_seconds_now() - r->connected_at);
                rc = vks_rl_queue_push(&t->queue, policy, scratch, t->c->prompts_per_step, &cnt, t->o->max_empty_batches);
                for (int p = 0; p < t->c->prompts_per_step; p++) vks_rl_group_free(&scratch[p]);
            }
        }
    }
    if (owned) free(buf);
    return rc;
}

/* ---- joins (rl_join.h) ---- */

/* Room for one more rank in t->ranks. */
static int grow_ranks(trainer_src *t) {
    if (t->n_ranks < t->cap_ranks) return VKS_OK;
    int cap = 2 * t->cap_ranks + 4;
    inf_rank *r = realloc(t->ranks, sizeof *r * (size_t)cap);
    if (!r) return vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    t->ranks = r, t->cap_ranks = cap;
    return VKS_OK;
}

/* Every connection the join point accepted becomes a rank that is joining:
 * it is sent the WELCOME (not waited for) and has timeout_s to say hello. */
static int take_joins(trainer_src *t) {
    MPI_Comm ic;
    while (vks_rl_join_take(t->join, &ic)) {
        int rc = grow_ranks(t);
        if (rc) return rc;
        MPI_Comm_set_errhandler(ic, MPI_ERRORS_RETURN);
        inf_rank *r = &t->ranks[t->n_ranks++];
        *r = (inf_rank){.rank = t->n_world + t->n_joined++, .state = RANK_JOINING, .joined = true, .ident = -1, .comm = ic, .peer = 0,
                        .welcome = MPI_REQUEST_NULL, .wreq = MPI_REQUEST_NULL, .batch = -1,
                        .last_seen = vks_seconds_now(), .connected_at = vks_seconds_now(), .at_step = -1};
        if (MPI_Isend(t->welcome, (int)t->welcome_bytes, MPI_BYTE, 0, TAG_JOIN, ic, &r->welcome) != MPI_SUCCESS)
            r->welcome = MPI_REQUEST_NULL; /* it hears nothing and gives up; its hello never comes */
        randombytes_buf(r->nonce, sizeof r->nonce);
        vks_rl_msg nonce = {.magic = VKS_RL_MAGIC, .type = MSG_NONCE, .n = (uint64_t)r->rank};
        memcpy(&nonce.batch, r->nonce, 8), memcpy(&nonce.step, r->nonce + 8, 8);
        /* a small message: sent at once (eagerly), whoever reads it */
        if (vks_rl_wire_send_small(ic, 0, TAG_JOIN, &nonce, t->mo->timeout_s, "the joiner taking its nonce"))
            r->last_seen = 0; /* dropped in this round: it never says hello */
        fprintf(stderr, "vkswarm: rl: rank %d connected through the join point\n", r->rank);
    }
    return VKS_OK;
}

static void hex32(const uint8_t *h, char out[65]) { sodium_bin2hex(out, 65, h, 32); }

/* A key refused for what its rank sent: it may not join again this run,
 * resumed or not (OUT/bans.jsonl, vks_rl_bans.h). */
static const vks_rl_ban *find_ban(const trainer_src *t, const uint8_t key[32]) {
    for (int i = 0; i < t->n_bans; i++)
        if (!memcmp(t->bans[i].key, key, 32)) return &t->bans[i];
    return NULL;
}

static void bans_path(const trainer_src *t, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s", t->c->out, VKS_RL_BANS_FILE);
}

static void ban_key(trainer_src *t, inf_rank *r, const char *why) {
    t->banned += !r->banned;
    r->banned = true;
    if (find_ban(t, r->key)) return;
    vks_rl_ban *b = realloc(t->bans, sizeof *b * (size_t)(t->n_bans + 1));
    if (!b) return; /* out of memory: the rank is refused all the same, its key not remembered */
    t->bans = b;
    b[t->n_bans].step = t->newest;
    memcpy(b[t->n_bans].key, r->key, 32);
    vks_escape(why, strlen(why), b[t->n_bans].reason, sizeof b[t->n_bans].reason);
    t->n_bans++;
    char who[65], path[4200];
    hex32(r->key, who);
    fprintf(stderr, "vkswarm: rl: key %.16s (rank %d) banned for the rest of the run\n", who, r->rank);
    bans_path(t, path, sizeof path);
    if (vks_rl_bans_save(path, t->bans, t->n_bans))
        fprintf(stderr, "vkswarm: rl: %s; the ban holds until this process ends, not after a resume\n", vks_last_error());
}

/* The entry of key in t->idents, added when new (-1: out of memory; the rank is not counted per identity). */
static int identity_of(trainer_src *t, const uint8_t key[32]) {
    for (int i = 0; i < t->n_idents; i++)
        if (!memcmp(t->idents[i].key, key, 32)) return i;
    if (t->n_idents == t->cap_idents) {
        int cap = t->cap_idents ? 2 * t->cap_idents : 8;
        struct joined_identity *more = realloc(t->idents, sizeof *more * (size_t)cap);
        if (!more) return -1;
        t->idents = more, t->cap_idents = cap;
    }
    t->idents[t->n_idents] = (struct joined_identity){0};
    memcpy(t->idents[t->n_idents].key, key, 32);
    return t->n_idents++;
}

/* Joined rank r is not admitted: it is told why (a bounded send) and refused. */
static void not_admitted(trainer_src *t, inf_rank *r, const char *why) {
    leave_rank(t, r, RANK_REFUSED, why, true); /* tells it (leave_rank: tell_joined) */
}

/* The weights joined ranks are sent: a copy of a step's WEIGHTS file,
 * shared by the sends in flight (t->weights is rewritten at the next step
 * while a slow joiner may still be reading this one). */
struct joined_weights {
    int refs;
    int64_t step;
    size_t bytes;
    float data[];
};

static void release_weights(struct joined_weights *w) {
    if (w && --w->refs == 0) munmap(w, sizeof *w + w->bytes);
}

/* The newest weights as t->jw (made from t->weights when a newer step was published). */
static int newest_joined_weights(trainer_src *t) {
    if (!t->published || (t->jw && t->jw->step == t->newest)) return VKS_OK;
    size_t bytes = sizeof(vks_rl_msg) + sizeof(float) * t->layout->n_values;
    /* mapped, as the staging buffers are: one copy per step while joiners come and go, freed back whole
     * (malloc'd, they fragmented the heap under MALLOC_PERTURB_: 12 MB of RSS over 25 joins in tools/test) */
    struct joined_weights *w = mmap(NULL, sizeof *w + bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (w == MAP_FAILED) return vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory for the joiners' weights");
    *w = (struct joined_weights){.refs = 1, .step = t->newest, .bytes = bytes};
    memcpy(w->data, t->weights, bytes);
    release_weights(t->jw);
    t->jw = w;
    return VKS_OK;
}

/* A joined rank's staging buffer is mapped and unmapped, not malloc'd: 8 MiB
 * blocks freed as joiners come and go fragmented the heap (10.6 MB of RSS
 * over 25 joins, measured; 1.6 MB mapped). */
static void free_stage(inf_rank *r) {
    if (r->stage) munmap(r->stage, VKS_RL_JOIN_CHUNK);
    r->stage = NULL;
}

/* The next chunk of r's weights (from r->wat) into its staging buffer, sent. */
static int send_chunk(trainer_src *t, inf_rank *r, double now) {
    size_t n = r->sending->bytes - r->wat < VKS_RL_JOIN_CHUNK ? r->sending->bytes - r->wat : VKS_RL_JOIN_CHUNK;
    if (!r->stage) {
        void *m = mmap(NULL, VKS_RL_JOIN_CHUNK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory for the joiners' weights");
        r->stage = m;
    }
    memcpy(r->stage, (const char *)r->sending->data + r->wat, n);
    if (MPI_Isend(r->stage, (int)n, MPI_BYTE, 0, TAG_JOIN_WEIGHTS, r->comm, &r->wreq) != MPI_SUCCESS) {
        release_weights(r->sending);
        r->sending = NULL;
        leave_rank(t, r, RANK_DROPPED, "the weights could not be sent to it", true);
        return VKS_OK;
    }
    r->wat += n, r->wsince = now;
    return VKS_OK;
}

/* Moves the weights to joined ranks along without waiting for them (the
 * trainer never waits for a joiner): in chunks of VKS_RL_JOIN_CHUNK bytes,
 * each copied to the rank's staging buffer (the shared copy is released as
 * soon as the rank leaves: a send to a dead rank never completes and keeps
 * only its chunk); a live rank behind the newest step is sent it (one stream
 * at a time: a joiner on a slow link skips the steps published meanwhile); a
 * chunk pending longer than timeout_s drops the rank. */
static int joined_weights_progress(trainer_src *t) {
    double now = vks_seconds_now();
    for (int i = 0; i < t->n_ranks; i++) {
        inf_rank *r = &t->ranks[i];
        if (!r->joined) continue;
        if (r->wreq == MPI_REQUEST_NULL) { /* nothing on its way: a rank gone frees what it held */
            if (r->state != RANK_LIVE && (r->sending || r->stage)) {
                release_weights(r->sending);
                free_stage(r);
                r->sending = NULL;
            }
            continue;
        }
        int done = 0;
        if (MPI_Test(&r->wreq, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) done = 0;
        if (!done && r->state == RANK_LIVE && now - r->wsince > t->mo->timeout_s) {
            char why[320];
            snprintf(why, sizeof why, "it did not take the weights of step %lld within %.1f s (%zu of %zu bytes)",
                     (long long)r->wstep, t->mo->timeout_s, r->wat, r->sending ? r->sending->bytes : 0);
            leave_rank(t, r, RANK_DROPPED, why, true);
        }
        if (!done && r->state != RANK_LIVE && r->sending) { /* gone: its chunk stays with MPI, the weights go */
            release_weights(r->sending);
            r->sending = NULL;
        }
        if (!done) continue;
        if (r->sending && r->wat < r->sending->bytes && r->state == RANK_LIVE && !t->stopping) {
            int rc = send_chunk(t, r, now);
            if (rc) return rc;
            continue;
        }
        release_weights(r->sending);
        r->sending = NULL;
        if (r->state != RANK_LIVE) free_stage(r);
    }
    bool behind = false;
    for (int i = 0; !t->stopping && i < t->n_ranks; i++)
        behind = behind || (t->ranks[i].joined && t->ranks[i].state == RANK_LIVE && !t->ranks[i].sending &&
                            t->ranks[i].wstep < t->newest && t->published);
    if (!behind) return VKS_OK;
    int rc = newest_joined_weights(t);
    if (rc) return rc;
    for (int i = 0; !rc && i < t->n_ranks; i++) {
        inf_rank *r = &t->ranks[i];
        if (!r->joined || r->state != RANK_LIVE || r->sending || r->wstep >= t->jw->step) continue;
        r->sending = t->jw, r->sending->refs++;
        r->wstep = t->jw->step, r->wat = 0;
        rc = send_chunk(t, r, now);
    }
    return rc;
}

/* A joining rank's HELLO: admitted (ADMIT, then the newest weights, step 0's
 * too: a joiner has only a model, no policy, until it takes some) when it
 * holds the run's model and the run can take it; else refused. */
static void admit(trainer_src *t, inf_rank *r, const char *buf, size_t bytes) {
    vks_rl_msg h;
    memcpy(&h, buf, sizeof h < bytes ? sizeof h : bytes);
    if (bytes != sizeof h + VKS_RL_JOIN_HELLO_BYTES || h.magic != VKS_RL_MAGIC || h.type != MSG_HELLO ||
        h.n != VKS_RL_JOIN_HELLO_BYTES) {
        not_admitted(t, r, "a malformed hello");
        return;
    }
    const uint8_t *hash = (const uint8_t *)buf + sizeof h, *key = hash + 32, *sig = key + 32;
    uint8_t text[64 + 48];
    size_t len = 0;
    vks_rl_join_hello_text(r->nonce, hash, text, &len);
    if (crypto_sign_verify_detached(sig, text, len, key)) {
        not_admitted(t, r, "its hello is not signed by the key it names");
        return;
    }
    memcpy(r->key, key, 32);
    char why[320], mine[65], theirs[65], who[65];
    hex32(key, who);
    const vks_rl_ban *ban = find_ban(t, key);
    if (ban) {
        snprintf(why, sizeof why, "key %.16s was banned at step %lld: %.200s", who, (long long)ban->step, ban->reason);
        not_admitted(t, r, why);
        return;
    }
    bool allowed = t->mo->n_join_allow == 0;
    for (int i = 0; !allowed && i < t->mo->n_join_allow; i++) allowed = !memcmp(t->mo->join_allow[i], key, 32);
    if (!allowed) {
        snprintf(why, sizeof why, "key %.64s is not in the run's join.allow", who);
        not_admitted(t, r, why);
        return;
    }
    hex32(t->mo->model_hash, mine);
    hex32((const uint8_t *)buf + sizeof h, theirs);
    if (strcmp(mine, theirs)) {
        snprintf(why, sizeof why, "another model: its hash %.64s, the run's %.64s", theirs, mine);
        not_admitted(t, r, why);
        return;
    }
    if (t->c->n_verifiers || t->c->lora_rank > 0) {
        snprintf(why, sizeof why, "joins into a run with %s are not built yet",
                 t->c->n_verifiers ? "verifier ranks" : "LoRA");
        not_admitted(t, r, why);
        return;
    }
    vks_rl_msg a = {.magic = VKS_RL_MAGIC, .type = MSG_ADMIT, .step = t->newest, .n = (uint64_t)r->rank};
    if (vks_rl_wire_send_small(r->comm, 0, TAG_JOIN, &a, t->mo->timeout_s, "the joiner taking its admission")) {
        leave_rank(t, r, RANK_DROPPED, vks_last_error(), true);
        return;
    }
    r->state = RANK_LIVE, r->admitted = true;
    r->ident = identity_of(t, key);
    t->joins++;
    r->last_seen = vks_seconds_now();
    fprintf(stderr, "vkswarm: rl: inference rank %d joined (key %.16s, policy step %lld)\n", r->rank, who,
            (long long)t->newest);
    r->wstep = -1; /* the newest weights follow (joined_weights_progress) */
}

/* The next live verifier rank, round robin (-1: none). */
static int pick_verifier(trainer_src *t) {
    for (int k = 0; k < t->n_ranks; k++) {
        int i = (t->verifier_from + k) % t->n_ranks;
        if (t->ranks[i].verifier && t->ranks[i].state == RANK_LIVE) {
            t->verifier_from = (i + 1) % t->n_ranks;
            return t->ranks[i].rank;
        }
    }
    return -1;
}

static int grow_pending(trainer_src *t) {
    if (t->n_pend < t->cap_pend) return VKS_OK;
    int cap = t->cap_pend ? 2 * t->cap_pend : 8;
    pending_batch *p = realloc(t->pend, sizeof *p * (size_t)cap);
    if (!p) return vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    t->pend = p, t->cap_pend = cap;
    return VKS_OK;
}

/* Grants batches to idle live inference ranks while the window has room for
 * their groups (vks_rl_queue_batches_to_grant), round robin; with verifier
 * ranks each grant names the verifier (round robin too), and batches at a
 * verifier count as out. */
static int grant(trainer_src *t) {
    bool verifiers = t->c->n_verifiers > 0;
    int64_t out = verifiers ? t->n_pend : 0;
    for (int i = 0; !verifiers && i < t->n_ranks; i++) out += t->ranks[i].state == RANK_LIVE && t->ranks[i].batch >= 0;
    for (int k = 0; k < t->n_ranks; k++) { /* round robin from after the last rank granted */
        int i = (t->grant_from + k) % t->n_ranks;
        inf_rank *r = &t->ranks[i];
        if (r->verifier || r->state != RANK_LIVE || r->batch >= 0) continue;
        if (vks_rl_queue_batches_to_grant(&t->queue, t->newest, out) < 1) break;
        int v = verifiers ? pick_verifier(t) : -1;
        if (verifiers && v < 0) return vks_set_error(VKS_ERR_TIMEOUT, "trainer: no verifier rank is left");
        int rc = verifiers ? grow_pending(t) : VKS_OK;
        if (rc) return rc;
        int64_t b = t->n_redo ? t->redo[--t->n_redo] : t->next_batch++;
        r->batch = b, r->min_step = t->newest;
        t->grant_from = (i + 1) % t->n_ranks;
        if (verifiers)
            t->pend[t->n_pend++] = (pending_batch){.batch = b, .min_step = t->newest, .origin = r->rank, .verifier = v,
                                                   .form = r->form};
        if (send_ctl_to(t, r, MSG_ASSIGN, b, t->newest, (uint64_t)(v + 1))) drop_rank(t, r, RANK_DROPPED, vks_last_error());
        else out++;
    }
    return VKS_OK;
}

int vks_rl_orch_round(trainer_src *t, vks_rl_batch_group *scratch) {
    const vks_model_config *mc = &t->o->model->cfg;
    int rc = take_joins(t);
    if (!rc) rc = joined_weights_progress(t);
    if (rc) return rc;
    for (;;) { /* every queued word first: silence is judged only after them */
        int flag = 0;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_UP, t->comm, &flag, &st) != MPI_SUCCESS || !flag) break;
        if ((rc = receive_up(t, find_rank(t, st.MPI_SOURCE), t->comm, &st, scratch, mc->seq_len, mc))) return rc;
    }
    for (int i = 0; i < t->n_ranks; i++) { /* joined ranks, each over its own connection */
        inf_rank *r = &t->ranks[i];
        for (int flag = 1; flag && r->joined && (r->state == RANK_LIVE || r->state == RANK_JOINING);) {
            MPI_Status st;
            if (MPI_Iprobe(0, TAG_UP, r->comm, &flag, &st) != MPI_SUCCESS) flag = 0;
            if (flag && (rc = receive_up(t, r, r->comm, &st, scratch, mc->seq_len, mc))) return rc;
        }
    }
    double wall = vks_seconds_now();
    int live = 0;
    for (int i = 0; i < t->n_ranks; i++) {
        inf_rank *r = &t->ranks[i];
        if (r->state == RANK_JOINING && wall - r->last_seen > t->mo->timeout_s) {
            leave_rank(t, r, RANK_DROPPED, "it did not say hello after it connected", true);
            continue;
        }
        if (r->state != RANK_LIVE) continue;
        if (wall - r->last_seen > t->mo->timeout_s) {
            char why[96];
            snprintf(why, sizeof why, "rank %d went silent (%.1f s)", r->rank, wall - r->last_seen);
            drop_rank(t, r, RANK_DROPPED, why);
        } else live += !r->verifier;
    }
    if (!live) return vks_set_error(VKS_ERR_TIMEOUT, "%s: no inference rank is left", t->remote ? "orchestrator" : "trainer");
    return grant(t);
}

/* For the status line: the batches each live inference rank generates and
 * those done there and waiting for their verifier rank. */
void vks_rl_orch_in_flight(const trainer_src *t, char *out, size_t cap) {
    size_t at = 0;
    out[0] = 0;
    for (int i = 0; i < t->n_ranks && at < cap; i++) {
        const inf_rank *r = &t->ranks[i];
        if (r->verifier || r->state != RANK_LIVE) continue;
        int n = snprintf(out + at, cap - at, "%s rank %d %d batch%s", at ? "," : "in flight:", r->rank, r->batch >= 0,
                         r->batch >= 0 ? "" : "es");
        at += n > 0 ? (size_t)n : 0;
    }
    for (int i = 0; i < t->n_ranks && at < cap; i++) {
        const inf_rank *v = &t->ranks[i];
        int n = 0;
        for (int k = 0; v->verifier && v->state == RANK_LIVE && k < t->n_pend; k++) {
            const inf_rank *o = find_rank((trainer_src *)t, t->pend[k].origin);
            n += t->pend[k].verifier == v->rank && (!o || o->batch != t->pend[k].batch); /* generated, not verified */
        }
        int w = n ? snprintf(out + at, cap - at, "; waiting for verifier rank %d (%d batch%s)", v->rank, n,
                             n == 1 ? "" : "es")
                  : 0;
        at += w > 0 ? (size_t)w : 0;
    }
}

static int take_mpi(void *ctx, int64_t step, vks_rl_batch_group *groups, vks_rl_status *status) {
    trainer_src *t = ctx;
    int P = t->c->prompts_per_step, rc = VKS_OK;
    vks_rl_batch_group *scratch = calloc((size_t)P, sizeof *scratch);
    if (!scratch) return vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    (void)step;
    char flight[512];
    while (!rc && t->queue.len < P) {
        rc = vks_rl_orch_round(t, scratch);
        bool due = status && vks_rl_status_due_in(status) <= 0;
        if (!rc && due) vks_rl_orch_in_flight(t, flight, sizeof flight);
        if (!rc) vks_rl_status_poll(status, &t->queue, due ? flight : NULL);
        if (!rc && t->queue.len < P) usleep(500);
    }
    if (!rc) rc = vks_rl_queue_pop(&t->queue, P, groups);
    free(scratch);
    return rc;
}

static void counters_mpi(void *ctx, vks_rl_counters *c) { *c = ((trainer_src *)ctx)->queue.counters; }

static void rank_status(const inf_rank *r, vks_rl_rank_status *out) {
    *out = (vks_rl_rank_status){.rank = r->rank, .verifier = r->verifier, .joined = r->joined, .state = r->state,
                                .batches = r->batches, .rollouts = r->rollouts, .rejected = r->rejected,
                                .at_step = r->state == RANK_LIVE ? -1 : r->at_step};
    snprintf(out->why, sizeof out->why, "%s", r->state == RANK_LIVE ? "" : r->why);
    out->banned = r->banned, out->admitted = r->admitted;
    if (r->joined) sodium_bin2hex(out->identity, sizeof out->identity, r->key, 8);
}

static int by_rank(const void *a, const void *b) {
    int x = ((const vks_rl_rank_status *)a)->rank, y = ((const vks_rl_rank_status *)b)->rank;
    return (x > y) - (x < y);
}

/* Where more ranks than cap have been part of the run (joiners come and go),
 * the world's own and the live ones come first, then the newest of the
 * joined ranks that left; the list is ordered by rank. */
int vks_rl_orch_ranks(const trainer_src *t, vks_rl_rank_status *out, int cap) {
    int n = 0;
    for (int i = 0; i < t->n_ranks && n < cap; i++) {
        const inf_rank *r = &t->ranks[i];
        if (r->state == RANK_JOINING || (r->joined && r->state != RANK_LIVE)) continue;
        rank_status(r, &out[n++]);
    }
    for (int i = t->n_ranks - 1; i >= 0 && n < cap; i--) {
        const inf_rank *r = &t->ranks[i];
        if (r->joined && r->state != RANK_LIVE && r->state != RANK_JOINING) rank_status(r, &out[n++]);
    }
    qsort(out, (size_t)n, sizeof *out, by_rank);
    return n;
}

static int by_batches(const void *a, const void *b) {
    const vks_rl_identity *x = a, *y = b;
    int64_t u = x->batches_accepted + x->batches_rejected, v = y->batches_accepted + y->batches_rejected;
    return (u < v) - (u > v);
}

static bool pool_mpi(void *ctx, vks_rl_pool *out) {
    const trainer_src *t = ctx;
    *out = (vks_rl_pool){.joins = t->joins, .leaves = t->leaves, .bans = t->banned};
    if (!t->join) return false;
    /* the busiest VKS_RL_MAX_IDENTITIES: keep a running top list (the table may be long) */
    for (int i = 0; i < t->n_idents; i++) {
        vks_rl_identity id = {.batches_accepted = t->idents[i].accepted, .batches_rejected = t->idents[i].rejected};
        sodium_bin2hex(id.identity, sizeof id.identity, t->idents[i].key, 8);
        if (out->n_identities < VKS_RL_MAX_IDENTITIES) {
            out->identities[out->n_identities++] = id;
            if (out->n_identities == VKS_RL_MAX_IDENTITIES)
                qsort(out->identities, VKS_RL_MAX_IDENTITIES, sizeof id, by_batches);
            continue;
        }
        out->identities_left_out++;
        vks_rl_identity *last = &out->identities[VKS_RL_MAX_IDENTITIES - 1];
        if (by_batches(&id, last) < 0) {
            *last = id;
            qsort(out->identities, VKS_RL_MAX_IDENTITIES, sizeof id, by_batches);
        }
    }
    if (out->n_identities < VKS_RL_MAX_IDENTITIES) qsort(out->identities, (size_t)out->n_identities, sizeof *out->identities, by_batches);
    return true;
}

static int ranks_mpi(void *ctx, vks_rl_rank_status *out, int cap) { return vks_rl_orch_ranks(ctx, out, cap); }
static int64_t position_mpi(void *ctx) { return ((trainer_src *)ctx)->next_batch; }
static double broadcast_bytes_mpi(void *ctx) { return (double)((trainer_src *)ctx)->cast_bytes; }
static void resume_mpi(void *ctx, int64_t step, int64_t next_batch) {
    trainer_src *t = ctx;
    t->next_batch = next_batch;
    t->queue.pushed = step * t->c->prompts_per_step;
}

/* Before the STOPs: the chunks on their way to joined ranks arrive (no new
 * ones go out), bounded by timeout_s; a send left pending at the end would
 * fail the joiner's receive instead of letting it read its STOP. */
static void finish_joined_sends(trainer_src *t) {
    t->stopping = true;
    double until = vks_seconds_now() + t->mo->timeout_s;
    for (bool pending = true; pending && vks_seconds_now() < until;) {
        pending = false;
        for (int i = 0; i < t->n_ranks; i++) {
            inf_rank *r = &t->ranks[i];
            int done = 1;
            if (r->joined && r->state == RANK_LIVE && r->wreq != MPI_REQUEST_NULL &&
                MPI_Test(&r->wreq, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
                done = 1;
            pending = pending || !done;
        }
        if (pending) usleep(1000);
    }
}

/* Says stop to every rank still there (every broadcast has ended by now). */
static void stop_ranks(trainer_src *t) {
    vks_rl_join_close(t->join); /* no more joiners */
    finish_joined_sends(t);
    for (int i = 0; i < t->n_ranks; i++)
        if (t->ranks[i].state == RANK_LIVE) send_ctl_to(t, &t->ranks[i], MSG_STOP, 0, t->newest, t->lost);
    /* refused ranks are told too: they stop instead of waiting for the trainer (a joined one was told) */
    for (int i = 0; i < t->n_ranks; i++)
        if (t->ranks[i].state == RANK_REFUSED && !t->ranks[i].joined)
            send_ctl(t, t->ranks[i].rank, MSG_STOP, 0, t->newest, t->lost);
    for (int i = 0; i < t->c->n_relays; i++)
        if (!t->cast.gone || !t->cast.gone[t->cast.bc_of[t->c->relays[i]]])
            send_ctl(t, t->c->relays[i], MSG_STOP, 0, t->newest, t->lost);
}

/* The STOPs of stop_now: those to live ranks went out long ago; one still
 * pending goes to a dead rank and is left (with its buffer: MPI may still
 * read it; the trainer leaves without MPI_Finalize, as ranks were lost). */
static void free_stops(trainer_src *t) {
    bool pending = false;
    for (int r = 0; t->stop_req && r < t->n_world; r++) {
        int flag = 1;
        if (t->stop_req[r] != MPI_REQUEST_NULL) MPI_Test(&t->stop_req[r], &flag, MPI_STATUS_IGNORE);
        pending = pending || !flag;
    }
    if (pending) return;
    free(t->stop_req), free(t->stop_msg);
    t->stop_req = NULL, t->stop_msg = NULL;
}

void vks_rl_orch_stop_ranks(trainer_src *t) {
    stop_ranks(t);
    free_stops(t);
}

/* The join point, and the WELCOME every joiner gets: the config, then the task file's bytes. */
static int open_joins(trainer_src *t) {
    char *json = vks_rl_config_to_json(t->c), *tasks = NULL;
    if (!json) return vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    size_t json_bytes = strlen(json), task_bytes = 0;
    vks_task_spec spec;
    const char *path = NULL;
    int rc = vks_task_resolve(t->c->task, &spec, &path);
    if (!rc && path) rc = vks_file_read_all(path, VKS_RL_JOIN_MAX_TASKS, &tasks, &task_bytes);
    if (!rc && json_bytes > VKS_RL_JOIN_MAX_CONFIG) rc = vks_set_error(VKS_ERR_ARG, "joins: a config of %zu bytes", json_bytes);
    t->welcome_bytes = sizeof(vks_rl_msg) + json_bytes + task_bytes;
    if (!rc && t->welcome_bytes > INT_MAX) rc = vks_set_error(VKS_ERR_ARG, "joins: a task file of %zu bytes", task_bytes);
    if (!rc && !(t->welcome = malloc(t->welcome_bytes))) rc = vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    if (!rc) {
        vks_rl_msg h = {.magic = VKS_RL_MAGIC, .type = MSG_WELCOME, .step = t->o->verify, .batch = (int64_t)task_bytes,
                        .n = json_bytes};
        memcpy(t->welcome, &h, sizeof h);
        memcpy(t->welcome + sizeof h, json, json_bytes);
        if (task_bytes) memcpy(t->welcome + sizeof h + json_bytes, tasks, task_bytes);
    }
    free(json), free(tasks);
    if (!rc && t->o->resume) { /* the keys this run banned before it stopped */
        char path[4200];
        bans_path(t, path, sizeof path);
        rc = vks_rl_bans_load(path, &t->bans, &t->n_bans);
        if (!rc && t->n_bans)
            fprintf(stderr, "vkswarm: rl: joins: %d key%s banned earlier in this run (%s)\n", t->n_bans,
                    t->n_bans == 1 ? "" : "s", path);
    }
    if (!rc) rc = vks_rl_join_open(&t->join, t->mo->join_server, t->c->out);
    return rc;
}

int vks_rl_orch_open(trainer_src *t, const vks_rl_run_options *o, const vks_rl_mpi_options *mo, bool origin) {
    const vks_rl_config *c = o->config;
    /* one rank per inference group: its first (a pipeline's other stages hear only from it) */
    *t = (trainer_src){.comm = vks_mpi_world(), .o = o, .mo = mo, .c = c, .n_ranks = c->n_groups + c->n_verifiers,
                       .orch = origin && c->orchestrator != c->trainer ? c->orchestrator : -1, .remote = !origin};
    MPI_Comm_set_errhandler(t->comm, MPI_ERRORS_RETURN);
    int rc = VKS_OK;
    t->ranks = calloc((size_t)t->n_ranks, sizeof *t->ranks);
    if (!t->ranks) rc = vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    if (!rc) rc = vks_rl_queue_init(&t->queue, c->prompts_per_step, c->async_level, c->max_off_policy_steps);
    double now = vks_seconds_now();
    for (int i = 0; !rc && i < t->n_ranks; i++) {
        bool v = i >= c->n_groups;
        t->ranks[i] = (inf_rank){.rank = v ? c->verifiers[i - c->n_groups] : c->inference_ranks[c->groups[i].first],
                                 .verifier = v, .batch = -1, .last_seen = now, .at_step = -1, .comm = t->comm,
                                 .welcome = MPI_REQUEST_NULL, .wreq = MPI_REQUEST_NULL};
        t->ranks[i].peer = t->ranks[i].rank;
    }
    t->cap_ranks = t->n_ranks;
    if (!rc) rc = vks_param_layout_create(&o->model->cfg, vks_model_has_bias(o->model), &t->layout);
    t->gen.o = o;
    t->gen.model = (vks_model *)(uintptr_t)o->model; /* read only: its shape */
    if (!rc) rc = vks_rl_gen_open_tasks(&t->gen);
    if (!rc && !origin) rc = vks_rl_gen_show_prompt(&t->gen); /* the trainer shows it in vks_rl_run_source */
    if (!rc && origin) t->weights = malloc(sizeof(vks_rl_msg) + sizeof(float) * t->layout->n_values);
    if (!rc && origin && !t->weights) rc = vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory for the weights");
    double start_s = mo->trainer_timeout_s > mo->timeout_s ? mo->trainer_timeout_s : mo->timeout_s;
    if (!rc) rc = vks_rl_cast_open(&t->cast, o, mo, t->layout->n_values, start_s, NULL);
    MPI_Comm_size(t->comm, &t->n_world);
    t->stop_req = malloc(sizeof *t->stop_req * (size_t)t->n_world);
    t->stop_msg = malloc(sizeof *t->stop_msg * (size_t)t->n_world);
    if (!rc && (!t->stop_req || !t->stop_msg)) rc = vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    for (int r = 0; t->stop_req && r < t->n_world; r++) t->stop_req[r] = MPI_REQUEST_NULL;
    if (!rc && mo->join_server && origin && t->orch < 0) rc = open_joins(t);
    return rc;
}

void vks_rl_orch_close(trainer_src *t) {
    vks_rl_queue_free(&t->queue);
    vks_rl_cast_close(&t->cast);
    bool welcomes_out = false; /* a WELCOME MPI still reads: its buffer is left */
    for (int i = 0; i < t->n_ranks; i++) {
        int flag = 1;
        if (t->ranks[i].joined && t->ranks[i].welcome != MPI_REQUEST_NULL) MPI_Test(&t->ranks[i].welcome, &flag, MPI_STATUS_IGNORE);
        welcomes_out = welcomes_out || !flag;
    }
    if (!welcomes_out) free(t->welcome);
    for (int i = 0; i < t->n_ranks; i++) { /* a chunk still on its way: its staging buffer is left to MPI */
        inf_rank *r = &t->ranks[i];
        if (!r->joined) continue;
        int flag = 1;
        if (r->wreq != MPI_REQUEST_NULL && MPI_Test(&r->wreq, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) flag = 0;
        release_weights(r->sending);
        if (flag) free_stage(r);
    }
    release_weights(t->jw);
    free(t->weights), free(t->ranks), free(t->redo), free(t->pend), free(t->drops), free(t->bans), free(t->idents);
    vks_param_layout_free(t->layout);
    t->gen.model = NULL;
    vks_rl_gen_close(&t->gen);
}

int vks_rl_mpi_trainer(const vks_rl_run_options *o, const vks_rl_mpi_options *mo, vks_rl_result *res, bool *lost) {
    *lost = false;
    if (!o || !o->config || !o->model || !mo || !(mo->timeout_s > 0)) return vks_set_error(VKS_ERR_ARG, "rl: bad options");
    int rc = vks_rl_mpi_check_roles(o->config);
    if (rc) return rc;
    if (o->config->orchestrator != o->config->trainer) return vks_rl_orch_trainer(o, mo, res, lost);
    trainer_src t;
    rc = vks_rl_orch_open(&t, o, mo, true);
    vks_rl_source src = {.ctx = &t, .publish = publish_mpi, .take = take_mpi, .counters = counters_mpi,
                         .position = position_mpi, .resume = resume_mpi, .broadcast_bytes = broadcast_bytes_mpi,
                         .ranks = ranks_mpi, .pool = pool_mpi, .publish_adapter = publish_adapter_mpi};
    if (!rc) rc = vks_rl_run_source(o, &src, res);
    char err[1024];
    snprintf(err, sizeof err, "%s", rc ? vks_last_error() : "");
    vks_rl_orch_stop_ranks(&t);
    *lost = t.lost;
    vks_rl_orch_close(&t);
    if (rc) return vks_set_error(rc, "%s", err);
    return VKS_OK;
}

/* ---- an inference rank ---- */

typedef struct {
    vks_rl_gen *g;
    int64_t batch;
    vks_rl_batch_group *groups;
    vks_rl_gen_counts cnt;
} gen_job;

static int gen_job_run(void *arg) {
    gen_job *j = arg;
    return vks_rl_gen_batch(j->g, j->batch, j->g->o->config->prompts_per_step, j->groups, &j->cnt);
}

typedef struct {
    MPI_Comm comm;
    int trainer;
    const vks_rl_run_options *o;
    const vks_rl_mpi_options *mo;
    vks_param_layout *layout;
    float *pending;        /* newest weights received and not yet in use */
    vks_lora_adapter *pending_adapter; /* LoRA: the newest adapter instead */
    int64_t pending_step;
    double last_heard;
    bool stop, no_finalize;
    int64_t assigned, min_step;
    int verifier;          /* the verifier rank of the assigned batch, -1: none (verify here) */
    vks_rl_beat beat;
    vks_rl_pipe_group *group; /* the first rank of a pipeline group: its other stages, else NULL */
    vks_rl_cast cast;      /* the weights arrive through Shardcast */
    int joined;            /* > 0: this rank joined the run (rl_join.h) as this rank number; comm is its
                            * connection, where the weights come too (TAG_JOIN) */
    bool left;             /* joined: it stopped (stop_requested) and said goodbye */
    float *stream;         /* joined: the weights being received in chunks, stream_at bytes so far */
    size_t stream_at;
} inf_state;

/* A joined rank: the next chunk of the trainer's WEIGHTS stream
 * (TAG_JOIN_WEIGHTS, probed: st). The first starts with the WEIGHTS header
 * (the stream's length follows from it); each is bounded by what is left;
 * the whole, checked, becomes the pending weights. */
static int take_joined_chunk(inf_state *s, const MPI_Status *st) {
    int count = 0;
    MPI_Get_count(st, MPI_BYTE, &count);
    size_t want = sizeof(vks_rl_msg) + sizeof(float) * s->layout->n_values;
    if (!s->stream && !(s->stream = malloc(want)))
        return vks_set_error(VKS_ERR_NOMEM, "inference: out of host memory for the weights");
    size_t left = want - s->stream_at;
    bool fits = count > 0 && (size_t)count <= left && count <= (int)VKS_RL_JOIN_CHUNK &&
                (s->stream_at > 0 || count >= (int)sizeof(vks_rl_msg));
    static char dummy[1]; /* a truncated receive: refused (static: left to MPI should the wait fail) */
    MPI_Request req;
    int mrc = MPI_Irecv(fits ? (char *)s->stream + s->stream_at : dummy, fits ? count : 0, MPI_BYTE, s->trainer,
                        TAG_JOIN_WEIGHTS, s->comm, &req);
    /* bounded: a trainer that dies within a chunk leaves a blocking receive waiting forever */
    /* the trainer moves a chunk only inside MPI calls, and makes none while it trains a step: its bound */
    double bound = s->mo->trainer_timeout_s > s->mo->timeout_s ? s->mo->trainer_timeout_s : s->mo->timeout_s;
    if (mrc == MPI_SUCCESS && vks_mpi_wait_within(s->comm, &req, &s->trainer, 1, bound, "the weights")) {
        s->stream = NULL, s->stream_at = 0; /* left to MPI */
        s->no_finalize = true;
        return vks_set_error(VKS_ERR_TIMEOUT, "the run stopped within a weights chunk (%d bytes, %.1f s)", count, bound);
    }
    if (!fits || mrc != MPI_SUCCESS)
        return vks_set_error(VKS_ERR_FORMAT, "a weights chunk of %d bytes at byte %zu of %zu", count, s->stream_at, want);
    if (s->stream_at == 0) { /* the header: the stream is the WEIGHTS of this model, or nothing */
        vks_rl_msg h;
        memcpy(&h, s->stream, sizeof h);
        if (h.magic != VKS_RL_MAGIC || h.type != MSG_WEIGHTS || h.n != s->layout->n_values)
            return vks_set_error(VKS_ERR_FORMAT, "a malformed weights header");
    }
    s->stream_at += (size_t)count;
    vks_test_point("weights"); /* tests kill a joiner at a chunk of its choosing */
    if (s->stream_at < want) return VKS_OK;
    s->stream_at = 0;
    vks_rl_msg h;
    memcpy(&h, s->stream, sizeof h);
    int64_t step = 0;
    int rc = vks_rl_wire_check_weights(s->stream, want, s->layout->n_values, s->pending_step, h.step, &step);
    if (rc) return rc;
    free(s->pending);
    s->pending = s->stream, s->pending_step = step;
    s->stream = NULL;
    return VKS_OK;
}

/* Takes part in the weights broadcast that waits; what it delivered becomes
 * the pending weights. A failed broadcast is logged, not fatal: the trainer
 * drops this rank if it missed the weights, or is gone (then the idle bound
 * ends this rank). */
static void take_broadcast(inf_state *s) {
    float *msg = NULL;
    int64_t step = 0;
    if (s->cast.lora_base) {
        vks_lora_adapter *a = NULL;
        if (vks_rl_cast_receive_adapter(&s->cast, &a, &step)) {
            fprintf(stderr, "vkswarm: rl: inference rank %d: the adapter broadcast failed: %s\n", s->cast.me,
                    vks_last_error());
            return;
        }
        vks_lora_adapter_free(s->pending_adapter);
        s->pending_adapter = a, s->pending_step = step;
        s->last_heard = vks_seconds_now();
        return;
    }
    if (vks_rl_cast_receive(&s->cast, &msg, &step)) {
        fprintf(stderr, "vkswarm: rl: inference rank %d: the weights broadcast failed: %s\n", s->cast.me, vks_last_error());
        return;
    }
    free(s->pending);
    s->pending = msg, s->pending_step = step;
    s->last_heard = vks_seconds_now();
}

/* While a send waits on a peer: beat, and join a weights broadcast (the
 * trainer or a verifier may be in one, waiting for this rank). */
static void beat_and_cast(void *ctx) {
    inf_state *s = ctx;
    vks_rl_wire_beat(&s->beat);
    if (vks_rl_cast_waiting(&s->cast)) take_broadcast(s);
}

/* Receives what the trainer sent (a grant, stop). */
static int poll_trainer(inf_state *s) {
    for (;;) {
        int flag = 0;
        MPI_Status st;
        if (MPI_Iprobe(s->trainer, MPI_ANY_TAG, s->comm, &flag, &st) != MPI_SUCCESS || !flag) return VKS_OK;
        int count = 0;
        MPI_Get_count(&st, MPI_BYTE, &count);
        if (s->joined && st.MPI_TAG == TAG_JOIN && (size_t)count <= sizeof(vks_rl_msg) + VKS_RL_REASON_MAX) {
            char why[sizeof(vks_rl_msg) + VKS_RL_REASON_MAX + 1] = {0}, shown[4 * VKS_RL_REASON_MAX + 1];
            MPI_Recv(why, count, MPI_BYTE, s->trainer, TAG_JOIN, s->comm, MPI_STATUS_IGNORE);
            vks_rl_msg h;
            memcpy(&h, why, sizeof h);
            if (count < (int)sizeof h || h.magic != VKS_RL_MAGIC || h.type != MSG_NOT_ADMITTED)
                return vks_set_error(VKS_ERR_FORMAT, "a malformed message of %d bytes from the run", count);
            vks_escape(why + sizeof h, strnlen(why + sizeof h, (size_t)count - sizeof h), shown, sizeof shown);
            s->stop = true;
            return vks_set_error(h.batch ? VKS_ERR_ARG : VKS_ERR_TIMEOUT, "the run %s this machine: %s",
                                 h.batch ? "refused" : "dropped", shown);
        } else if (s->joined && st.MPI_TAG == TAG_JOIN_WEIGHTS) {
            int rc = take_joined_chunk(s, &st);
            if (rc) return rc;
        } else if (st.MPI_TAG == TAG_CTL && count == (int)sizeof(vks_rl_msg)) {
            vks_rl_msg h;
            MPI_Recv(&h, sizeof h, MPI_BYTE, s->trainer, TAG_CTL, s->comm, MPI_STATUS_IGNORE);
            if (h.magic != VKS_RL_MAGIC) return vks_set_error(VKS_ERR_FORMAT, "a malformed control message");
            if (h.type == MSG_STOP) s->stop = true, s->no_finalize = h.n != 0;
            else if (h.type == MSG_ASSIGN) {
                int ranks = 0;
                MPI_Comm_size(s->comm, &ranks);
                if (h.batch < 0 || h.n > (uint64_t)ranks || (h.n == 0) != (s->o->config->n_verifiers == 0))
                    return vks_set_error(VKS_ERR_FORMAT, "a malformed grant");
                s->assigned = h.batch, s->min_step = h.step, s->verifier = (int)h.n - 1;
            } else if (h.type == MSG_REFORM) { /* a stage of this rank's group was refused: checked there */
                if (!s->group || h.n > INT_MAX)
                    return vks_set_error(VKS_ERR_FORMAT, "a REFORM leaving out rank %llu%s", (unsigned long long)h.n,
                                         s->group ? "" : " (this rank has no pipeline group)");
                int rc = vks_rl_group_exclude(s->group, (int)h.n);
                if (rc) return rc;
            }
            else return vks_set_error(VKS_ERR_FORMAT, "control message of type %u", h.type);
        } else return vks_set_error(VKS_ERR_FORMAT, "a message of %d bytes under tag %d", count, st.MPI_TAG);
        s->last_heard = vks_seconds_now();
    }
}

/* After its goodbye a joined rank takes what is still on its way to it
 * (weights: the trainer's send must complete, or its buffer stays) until
 * the trainer's answer, the last word (bounded by timeout_s). */
static void drain_joined(inf_state *s) {
    double until = vks_seconds_now() + s->mo->timeout_s;
    while (vks_seconds_now() < until) {
        int rc = poll_trainer(s);
        if (rc || s->stop) return; /* the answer (an error by design), the end of the run, a broken connection */
        usleep(1000);
    }
}

/* Makes the pending weights the policy (its rollout files name the Shardcast step). */
static int take_weights(inf_state *s, vks_rl_gen *g) {
    if (s->pending_adapter || s->pending)
        snprintf(g->policy_weights, sizeof g->policy_weights, "shardcast step %lld (the trainer's checkpoint %.300s/step-N "
                 "when it saved that step)", (long long)s->pending_step, s->o->config->out);
    if (s->pending_adapter) { /* LoRA: the base stays, the adapter is swapped in */
        vks_lora_adapter *a = s->pending_adapter;
        s->pending_adapter = NULL;
        return vks_rl_gen_set_adapter(g, a, s->pending_step);
    }
    if (!s->pending) return VKS_OK;
    vks_model *m = NULL;
    int rc = vks_rl_wire_model_from_block(s->o->model, s->layout, s->pending, &m);
    if (!rc) rc = vks_rl_gen_set_policy(g, m, s->pending_step);
    free(s->pending);
    s->pending = NULL;
    return rc;
}

/* With verifier ranks: the batch's GROUPS message (every completion,
 * unverified; `groups` is owned from here) and its rollout file go to the
 * verifier named in the grant, then DONE to the trainer. */
static int send_to_verifier(inf_state *s, vks_rl_gen *g, int64_t batch, void *groups, size_t groups_bytes) {
    const vks_rl_config *c = s->o->config;
    char path[4200], *file = NULL;
    size_t file_bytes = 0;
    vks_rl_batch_path(g, batch, path, sizeof path);
    int rc = vks_file_read_all(path, vks_rl_wire_max_rollout_bytes(c, s->o->model->cfg.seq_len), &file, &file_bytes);
    size_t total = sizeof(vks_rl_msg) + groups_bytes + file_bytes;
    char *msg = rc ? NULL : malloc(total);
    if (!rc && !msg) rc = vks_set_error(VKS_ERR_NOMEM, "inference: out of host memory");
    if (!rc && total > INT_MAX) rc = vks_set_error(VKS_ERR_ARG, "a batch of %zu bytes", total);
    if (!rc) {
        vks_rl_msg h = {.magic = VKS_RL_MAGIC, .type = MSG_TO_VERIFY, .batch = batch, .step = g->policy_step, .n = groups_bytes};
        memcpy(msg, &h, sizeof h);
        memcpy(msg + sizeof h, groups, groups_bytes);
        memcpy(msg + sizeof h + groups_bytes, file, file_bytes);
        MPI_Request req;
        MPI_Isend(msg, (int)total, MPI_BYTE, s->verifier, TAG_VERIFY, s->comm, &req);
        if (vks_mpi_wait_within_doing(s->comm, &req, &s->verifier, 1, s->mo->timeout_s, "the verifier taking a batch",
                                      beat_and_cast, s)) {
            /* a dead verifier: the trainer drops it and grants the batch again; this rank goes on */
            fprintf(stderr, "vkswarm: rl: inference rank: batch %lld not sent to verifier rank %d: %s\n", (long long)batch,
                    s->verifier, vks_last_error());
            msg = NULL; /* MPI may still read it: left */
        }
    }
    free(msg), free(file), free(groups);
    if (!rc) {
        vks_rl_msg done = {.magic = VKS_RL_MAGIC, .type = MSG_DONE, .batch = batch, .step = g->policy_step,
                           .n = (uint64_t)s->verifier};
        char what[64];
        snprintf(what, sizeof what, "%s taking DONE", vks_rl_wire_granter(s->o->config));
        rc = vks_rl_wire_send_small(s->comm, s->trainer, TAG_UP, &done, s->mo->timeout_s, what);
    }
    return rc;
}

/* While a batch is generated: beat, join broadcasts, take control messages. */
static int beat_and_poll(void *ctx) {
    beat_and_cast(ctx);
    return poll_trainer(ctx);
}

static int run_job(inf_state *s, vks_rl_gen *g) {
    int P = s->o->config->prompts_per_step, rc = VKS_OK;
    gen_job j = {.g = g, .batch = s->assigned};
    j.groups = calloc((size_t)P, sizeof *j.groups);
    if (!j.groups) return vks_set_error(VKS_ERR_NOMEM, "inference: out of host memory");
    rc = vks_mpi_run_beside(gen_job_run, &j, beat_and_poll, s, "the generation");
    if (rc) rc = vks_set_error(rc, "batch %lld: %s", (long long)j.batch, vks_last_error());
    for (int p = 0; !rc && s->mo->test_garbage && p < P; p++)
        if (j.groups[p].n) {
            vks_rl_sample *x = &j.groups[p].samples[0];
            if (s->mo->test_garbage == 1) x->tokens[0] = s->o->model->cfg.vocab_size;
            else x->task_reward = 1, x->reward = 1; /* a reward the completion did not earn */
            break;
        }
    if (!rc && s->mo->test_tamper) s->mo->test_tamper(s->mo->test_tamper_ctx, j.groups, &j.cnt); /* TEST ONLY */
    size_t bytes = 0;
    void *buf = rc ? NULL : vks_rl_wire_pack_groups(j.groups, P, j.batch, g->policy_step, &j.cnt, &bytes);
    if (!rc && !buf) rc = vks_set_error(VKS_ERR_NOMEM, "inference: out of host memory");
    if (!rc && s->joined) { /* its identity signs what it sends (rl_join.h) */
        void *signed_buf = realloc(buf, bytes + crypto_sign_BYTES);
        if (!signed_buf) rc = vks_set_error(VKS_ERR_NOMEM, "inference: out of host memory");
        else buf = signed_buf, crypto_sign_detached((uint8_t *)buf + bytes, NULL, buf, bytes, s->mo->join_secret_key);
        bytes += rc ? 0 : crypto_sign_BYTES;
    }
    if (!rc && s->verifier >= 0) {
        rc = send_to_verifier(s, g, j.batch, buf, bytes);
        buf = NULL; /* owned by send_to_verifier */
    } else if (!rc && bytes > INT_MAX) rc = vks_set_error(VKS_ERR_ARG, "a batch of %zu bytes", bytes);
    else if (!rc) {
        MPI_Request req;
        MPI_Isend(buf, (int)bytes, MPI_BYTE, s->trainer, TAG_UP, s->comm, &req);
        char what[64];
        snprintf(what, sizeof what, "%s taking a batch", vks_rl_wire_granter(s->o->config));
        rc = vks_mpi_wait_within_doing(s->comm, &req, &s->trainer, 1, s->mo->timeout_s, what, beat_and_cast, s);
        if (rc) buf = NULL; /* MPI may still read it: left, the rank gives up */
    }
    free(buf);
    for (int p = 0; p < P; p++) vks_rl_group_free(&j.groups[p]);
    free(j.groups);
    s->assigned = -1;
    return rc;
}

static int pipeline_group_rank(inf_state *s, int group, int stage, bool *no_finalize);
static int inference_rank(inf_state *s, bool *no_finalize);

int vks_rl_mpi_inference(const vks_rl_run_options *o, const vks_rl_mpi_options *mo, bool *no_finalize) {
    *no_finalize = false;
    if (!o || !o->config || !o->model || !o->tok || !o->infer_gpu || !mo || !(mo->timeout_s > 0))
        return vks_set_error(VKS_ERR_ARG, "rl: bad options");
    int rc = vks_rl_mpi_check_roles(o->config);
    if (rc) return rc;
    /* grants and STOP come from the orchestrator (the trainer's rank, or one of its own); beats go there */
    inf_state s = {.comm = vks_mpi_world(), .trainer = o->config->orchestrator, .o = o, .mo = mo, .assigned = -1,
                   .pending_step = -1, .verifier = -1};
    s.beat = (vks_rl_beat){.comm = s.comm, .trainer = s.trainer, .req = MPI_REQUEST_NULL};
    MPI_Comm_set_errhandler(s.comm, MPI_ERRORS_RETURN);
    int me = 0, group = -1, stage = 0;
    MPI_Comm_rank(s.comm, &me);
    vks_rl_group_find(o->config, me, &group, &stage);
    if (group >= 0) return pipeline_group_rank(&s, group, stage, no_finalize);
    return inference_rank(&s, no_finalize);
}

int vks_rl_inference_joined(const vks_rl_run_options *o, const vks_rl_mpi_options *mo, MPI_Comm ic, int number,
                            bool *no_finalize) {
    *no_finalize = false;
    if (!o || !o->config || !o->model || !o->tok || !o->infer_gpu || !mo || !(mo->timeout_s > 0) || number < 1)
        return vks_set_error(VKS_ERR_ARG, "rl: bad options");
    inf_state s = {.comm = ic, .trainer = 0, .o = o, .mo = mo, .assigned = -1, .pending_step = -1, .verifier = -1,
                   .joined = number};
    s.beat = (vks_rl_beat){.comm = ic, .trainer = 0, .req = MPI_REQUEST_NULL};
    return inference_rank(&s, no_finalize);
}

/* A rank of a pipeline group: the first stage runs as an inference rank whose
 * batches the group generates; the others serve it (rl_group.h). */
static int pipeline_group_rank(inf_state *s, int group, int stage, bool *no_finalize) {
    if (!vks_mpi_threads_multiple())
        return vks_set_error(VKS_ERR_ARG, "inference group %d: pipeline groups need MPI_THREAD_MULTIPLE, which this MPI "
                             "did not grant", group);
    vks_rl_pipe_group grp = {0};
    int rc = vks_rl_group_open(&grp, s->o, s->mo, group, stage);
    if (rc) {
        *no_finalize = true; /* the group's peers may be waiting on this rank */
        vks_rl_group_close(&grp, false);
        return rc;
    }
    if (stage > 0) rc = vks_rl_group_stage(&grp, no_finalize);
    else {
        s->group = &grp;
        rc = inference_rank(s, no_finalize);
        char err[1024];
        snprintf(err, sizeof err, "%s", rc ? vks_last_error() : "");
        vks_rl_group_stop(&grp, rc != VKS_OK || *no_finalize);
        if (rc) vks_set_error(rc, "%s", err); /* the stop's own failure was printed: this rank's error stays */
    }
    vks_rl_group_close(&grp, !rc && !*no_finalize);
    return rc;
}

/* An inference rank (or a pipeline group's first stage): takes grants and
 * weights from the trainer and generates until it says stop. */
static int inference_rank(inf_state *sp, bool *no_finalize) {
    inf_state s = *sp;
    const vks_rl_run_options *o = s.o;
    const vks_rl_mpi_options *mo = s.mo;
    int rc;
    /* TEST ONLY: a rank told to send garbage, or to cheat under verifier ranks, keeps groups
     * without signal too, so that what it spoils always reaches the trainer or verifier */
    bool defer = o->config->n_verifiers > 0;
    vks_rl_gen g = {.o = o, .policy_step = -1, .keep_flat_groups = mo->test_garbage != 0 || (defer && o->cheat_every > 0),
                    .defer_verify = defer, .generate = s.group ? vks_rl_group_generate : NULL, .generate_ctx = s.group};
    if (o->config->lora_rank > 0) { /* LoRA: the base, loaded once, stays; adapters are swapped in */
        g.model = (vks_model *)(uintptr_t)o->model; /* borrowed: never written nor freed */
        g.model_borrowed = true;
    }
    rc = vks_param_layout_create(&o->model->cfg, vks_model_has_bias(o->model), &s.layout);
    if (!rc) rc = vks_rl_gen_open_tasks(&g);
    int me = s.joined;
    if (!s.joined) MPI_Comm_rank(s.comm, &me);
    char sub[32];
    snprintf(sub, sizeof sub, "rollouts-rank%d", me);
    if (!rc) rc = vks_rl_gen_make_dirs(&g, sub);
    double tb = mo->trainer_timeout_s > mo->timeout_s ? mo->trainer_timeout_s : mo->timeout_s;
    if (!rc && !s.joined) rc = vks_rl_cast_open(&s.cast, o, mo, s.layout->n_values, tb, &s.beat);
    s.last_heard = vks_seconds_now();
    vks_mpi_clock clock = {0};
    double idle_from = vks_mpi_deadline_tick(&clock, tb);
    while (!rc && !s.stop) {
        beat_and_cast(&s);
        if ((rc = poll_trainer(&s)) || s.stop) break;
        if (s.joined && o->stop_requested && o->stop_requested(o->stop_ctx)) { /* a clean stop: say goodbye */
            vks_rl_msg bye = {.magic = VKS_RL_MAGIC, .type = MSG_BYE, .batch = s.assigned};
            rc = vks_rl_wire_send_small(s.comm, s.trainer, TAG_UP, &bye, mo->timeout_s, "the trainer taking the goodbye");
            s.left = rc == VKS_OK;
            if (s.left) drain_joined(&s);
            break;
        }
        bool pending = s.pending || s.pending_adapter;
        if (pending && s.assigned < 0) rc = take_weights(&s, &g);
        if (!rc && s.assigned >= 0) {
            if (s.pending || s.pending_adapter) rc = take_weights(&s, &g);
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
            rc = vks_set_error(VKS_ERR_TIMEOUT, "rank %d did not answer within %.1f s (%s)", s.trainer, bound,
                               vks_rl_mpi_peer_name(o->config));
            s.no_finalize = true;
        }
        usleep(1000);
    }
    *no_finalize = s.no_finalize || s.left; /* gone from the run: nobody to finalize with */
    vks_rl_cast_close(&s.cast);
    free(s.pending), free(s.stream);
    vks_lora_adapter_free(s.pending_adapter);
    vks_rl_gen_close(&g);
    vks_param_layout_free(s.layout);
    return rc;
}
