/* rl_roles.c: the RL run across MPI ranks (vks_rl_mpi.h), the trainer's
 * side. The trainer rank runs vks_rl_run_source with a source whose groups
 * come from inference ranks (rl_inference.c: the world's, a pipeline group's
 * first stage, and joined machines alike), and takes joins (rl_join.c).
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

int vks_rl_mpi_check_roles(const vks_rl_config *c, bool joins) {
    if (!c->roles_given) return vks_set_error(VKS_ERR_ARG, "rl across ranks: the config gives no roles");
    if (c->orchestrator != c->trainer && vks_rl_config_roles_of(c, c->orchestrator) != VKS_RL_ROLE_ORCHESTRATOR)
        return vks_set_error(VKS_ERR_ARG, "rl across ranks: the orchestrator (rank %d) shares a rank only with the "
                             "trainer (rank %d)", c->orchestrator, c->trainer);
    if (c->n_inference_ranks < 1 && !joins)
        return vks_set_error(VKS_ERR_ARG, "rl across ranks: no inference ranks (name some in roles.inference, or open the "
                             "run to joins: --join)");
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
void vks_rl_orch_leave(trainer_src *t, inf_rank *r, int state, const char *why_given, bool gone) {
    char why[sizeof r->why]; /* why_given may be vks_last_error()'s text, which telling the joiner rewrites */
    snprintf(why, sizeof why, "%s", why_given);
    if (r->joined && r->state == RANK_LIVE && state == RANK_REFUSED) vks_rl_orch_ban(t, r, why); /* it sent something wrong */
    if (r->admitted && r->state == RANK_LIVE) {
        t->leaves++;
        if (state == RANK_REFUSED && r->ident >= 0) t->idents[r->ident].rejected++;
    }
    if (r->joined && (r->state == RANK_LIVE || r->state == RANK_JOINING)) vks_rl_orch_tell_joined(t, r, state, why);
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
    vks_rl_orch_leave(t, r, state, why, state == RANK_DROPPED);
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
            vks_rl_orch_leave(t, f, said[0] ? RANK_REFUSED : RANK_DROPPED, stage_why, true); /* with its stages */
            stop_now(t, first); /* it passes the stop on to its stages */
        }
        t->lost = true;
        vks_rl_orch_cast_drop(t, rank);
        return;
    }
    inf_rank *r = find_rank(t, rank);
    if (r && r->state == RANK_LIVE) {
        vks_rl_orch_leave(t, r, said[0] ? RANK_REFUSED : RANK_DROPPED, why, true);
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


static int publish_mpi(void *ctx, vks_model *m, int64_t step) {
    trainer_src *t = ctx;
    int rc = vks_rl_orch_cast_weights(t, m, step);
    if (!rc) rc = failed_ranks(t, step);
    return rc ? rc : vks_rl_orch_joined_weights(t); /* the new weights start out to joined ranks */
}

/* LoRA: the adapter of `step` (a GGUF LoRA file, rl_cast.h) to every inference and verifier rank. */
int vks_rl_orch_cast_adapter(trainer_src *t, vks_lora_adapter *a, int64_t step) {
    uint8_t *file = NULL;
    size_t bytes = 0;
    int rc = vks_rl_cast_adapter_file(&t->cast, t->c->out, a, &file, &bytes);
    vks_lora_adapter_free(a);
    vks_bcast_report rep;
    if (!rc) rc = vks_rl_cast_send(&t->cast, file, bytes, step, &rep);
    if (rc && (bytes == 0 || rep.version == 0)) {
        free(file);
        return vks_error_prefix(rc, "trainer: broadcasting the adapter of step %lld", (long long)step);
    }
    free(t->adapter_file); /* the file stays for joined ranks (vks_rl_orch_joined_weights) */
    t->adapter_file = file, t->adapter_bytes = bytes;
    t->cast_bytes = rep.wire_bytes;
    t->newest = step, t->published = true;
    fprintf(stderr, "vkswarm: rl: shardcast: step %lld (version %llu): adapter, %llu bytes to %d of %d ranks in %.3f s\n",
            (long long)step, (unsigned long long)rep.version, (unsigned long long)rep.wire_bytes, rep.ranks_ok,
            t->cast.n_world - 1 - (t->orch >= 0), rep.seconds);
    return VKS_OK;
}

static int publish_adapter_mpi(void *ctx, vks_lora_adapter *a, int64_t step) {
    trainer_src *t = ctx;
    int rc = vks_rl_orch_cast_adapter(t, a, step);
    if (!rc) rc = failed_ranks(t, step);
    return rc ? rc : vks_rl_orch_joined_weights(t); /* the new adapter starts out to joined ranks */
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
    if (!r->joined || !r->admitted || r->ident < 0) return;
    int64_t n = ++t->idents[r->ident].accepted;
    if (t->c->n_verifiers && n == t->c->probation_batches) {
        char who[17];
        sodium_bin2hex(who, sizeof who, r->key, 8);
        fprintf(stderr, "vkswarm: rl: key %s (rank %d): probation over, %lld batches accepted with every group "
                "replayed; its batches are checked as the run's are now\n", who, r->rank, (long long)n);
    }
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
    if (r->joined && cnt.accepted < cnt.checked) {
        /* a machine that joined is trusted with nothing a verifier rejected (the run's own ranks may
         * differ from the replay now and then: their rejected completions are only left out) */
        for (int p = 0; p < t->c->prompts_per_step; p++) vks_rl_group_free(&scratch[p]);
        char why[320];
        snprintf(why, sizeof why, "batch %lld: verifier rank %d rejected %lld of its %lld completions checked%s "
                 "(rejected.jsonl in the verifier's OUT says why)", (long long)e.batch, v->rank,
                 (long long)(cnt.checked - cnt.accepted), (long long)cnt.checked,
                 r->ident >= 0 && t->idents[r->ident].accepted < t->c->probation_batches ? ", on probation" : "");
        push_redo(t, e.batch);
        drop_rank(t, r, RANK_REFUSED, why);
        return VKS_OK;
    }
    count_batch(t, r, &cnt, cnt.rollouts);
    count_batch(t, v, &cnt, cnt.checked);
    int rc = vks_rl_queue_push(&t->queue, policy, scratch, t->c->prompts_per_step, &cnt, t->o->max_empty_batches);
    for (int p = 0; p < t->c->prompts_per_step; p++) vks_rl_group_free(&scratch[p]);
    return rc;
}

/* The most bytes an honest message from r under tag can have: a GROUPS
 * message (a verifier's VERIFIED wraps one; REFUSE carries a reason of at
 * most VKS_RL_REASON_MAX), signed by a joined rank; a joined rank's batch for
 * its verifier adds its rollout file (episodes: its turn files). */
static size_t most_bytes(const trainer_src *t, const inf_rank *r, int tag) {
    int seq_len = t->o->model->cfg.seq_len;
    size_t most = sizeof(vks_rl_msg) + vks_rl_wire_max_groups_bytes(t->c, seq_len) + (r && r->joined ? crypto_sign_BYTES : 0);
    return tag == TAG_VERIFY ? most + vks_rl_wire_max_verify_files_bytes(t->c, seq_len, t->gen.episodes) : most;
}

/* Whether buf (*bytes, its signature last) is signed by joined rank r's key;
 * *bytes then leaves the signature out. */
static bool signed_by(const inf_rank *r, const char *buf, size_t *bytes) {
    if (*bytes < crypto_sign_BYTES) return false;
    *bytes -= crypto_sign_BYTES;
    return !crypto_sign_verify_detached((const uint8_t *)buf + *bytes, (const uint8_t *)buf, *bytes, r->key);
}

/* What an inference or verifier rank sent under TAG_UP (count bytes in buf;
 * mrc: how its receive ended; r: the rank it is from, NULL: none the run knows). */
static int up_message(trainer_src *t, inf_rank *r, char *buf, int count, int mrc, vks_rl_batch_group *scratch,
                      const vks_model_config *mc) {
    size_t most = most_bytes(t, r, TAG_UP);
    bool big = count > (int)sizeof(vks_rl_msg) && (size_t)count <= most;
    int rc = VKS_OK;
    if (r && r->joined && r->state == RANK_LIVE && big && mrc == MPI_SUCCESS) { /* signed by its key: checked, cut off */
        size_t bytes = (size_t)count;
        if (!signed_by(r, buf, &bytes) || bytes < sizeof(vks_rl_msg)) {
            drop_rank(t, r, RANK_REFUSED, "a batch its key did not sign");
            return VKS_OK;
        }
        count = (int)bytes;
        big = count > (int)sizeof(vks_rl_msg);
    }
    if (r && r->state == RANK_JOINING && mrc == MPI_SUCCESS) {
        vks_rl_orch_admit(t, r, buf, (size_t)count);
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
            vks_rl_orch_leave(t, r, RANK_DROPPED, "it left (a clean stop)", true); /* tells it: its last word */
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
    return rc;
}

/* Receives one message from a rank of the world (probed: st, on comm; r: the
 * rank it is from, NULL: none the run knows). */
static int receive_up(trainer_src *t, inf_rank *r, MPI_Comm comm, const MPI_Status *st, vks_rl_batch_group *scratch,
                      const vks_model_config *mc) {
    int count = 0;
    MPI_Get_count(st, MPI_BYTE, &count);
    char small[sizeof(vks_rl_msg)];
    bool big = count > (int)sizeof small && (size_t)count <= most_bytes(t, r, TAG_UP);
    char *buf = big ? malloc((size_t)count) : small;
    if (!buf) return vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    /* a message too big to be honest is received into nothing (truncation error) and refused */
    int mrc = MPI_Recv(buf, big ? count : (int)sizeof small, MPI_BYTE, st->MPI_SOURCE, TAG_UP, comm, MPI_STATUS_IGNORE);
    int rc = up_message(t, r, buf, count, mrc, scratch, mc); /* count: what was sent (refused when not taken whole) */
    if (big) free(buf);
    return rc;
}

/* A joined rank's batch for its verifier (buf + front: count bytes, received
 * over its connection: it cannot reach the verifier ranks itself): its
 * signature checked, and passed on to the verifier rank its grant named in a
 * FORWARD (batch, n = its rank number, step = 1: replay every group, its key
 * being on probation) written in front of it. buf is owned from here. */
static int forward_to_verifier(trainer_src *t, inf_rank *r, char *buf, size_t front, int count) {
    char why[160] = "";
    size_t bytes = (size_t)count;
    vks_rl_msg h = {0};
    if (!signed_by(r, buf + front, &bytes) || bytes < sizeof h) snprintf(why, sizeof why, "a batch its key did not sign");
    else memcpy(&h, buf + front, sizeof h);
    int at = why[0] ? -1 : find_pending(t, h.batch, r->rank);
    if (!why[0] && (h.magic != VKS_RL_MAGIC || h.type != MSG_TO_VERIFY || at < 0))
        snprintf(why, sizeof why, "a batch for verification it was not granted (batch %lld)", (long long)h.batch);
    if (why[0]) {
        free(buf);
        drop_rank(t, r, RANK_REFUSED, why);
        return VKS_OK;
    }
    r->last_seen = vks_seconds_now();
    bool every = r->ident >= 0 && t->idents[r->ident].accepted < t->c->probation_batches;
    vks_rl_msg fw = {.magic = VKS_RL_MAGIC, .type = MSG_FORWARD, .batch = h.batch, .step = every, .n = (uint64_t)r->rank};
    memcpy(buf, &fw, sizeof fw);
    /* not waited for: the verifier takes it when it is done with the batch in hand (a wait here
     * held the whole run for the replays of probation, measured); forwards_progress frees it */
    if (t->n_fwd == t->cap_fwd) {
        int cap = t->cap_fwd ? 2 * t->cap_fwd : 8;
        struct forwarded *more = realloc(t->fwd, sizeof *more * (size_t)cap);
        if (!more) {
            free(buf);
            return vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
        }
        t->fwd = more, t->cap_fwd = cap;
    }
    MPI_Request req;
    if (MPI_Isend(buf, (int)(front + bytes), MPI_BYTE, t->pend[at].verifier, TAG_VERIFY, t->comm, &req) != MPI_SUCCESS) {
        free(buf); /* the verifier is gone: its silence drops it and its batches go out again */
        return VKS_OK;
    }
    t->fwd[t->n_fwd++] = (struct forwarded){.req = req, .buf = buf};
    return VKS_OK;
}

/* A joined rank: starts receiving the message probed (st) under tag into a
 * buffer of its own (for TAG_VERIFY with room for a FORWARD in front); one
 * too big (or too small) to be honest is refused at once, unread. */
static int joined_receive_start(trainer_src *t, inf_rank *r, const MPI_Status *st, int tag) {
    int count = 0;
    MPI_Get_count(st, MPI_BYTE, &count);
    size_t most = most_bytes(t, r, tag), front = tag == TAG_VERIFY ? sizeof(vks_rl_msg) : 0;
    size_t least = sizeof(vks_rl_msg) + (tag == TAG_VERIFY ? crypto_sign_BYTES : 0);
    if (count < (int)least || (size_t)count > most) {
        char why[160];
        snprintf(why, sizeof why, "a %s of %d bytes (at most %zu)", tag == TAG_VERIFY ? "batch for its verifier" : "message",
                 count, most);
        drop_rank(t, r, RANK_REFUSED, why);
        return VKS_OK;
    }
    char *buf = malloc(front + (size_t)count);
    if (!buf) return vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    if (MPI_Irecv(buf + front, count, MPI_BYTE, 0, tag, r->comm, &r->rreq) != MPI_SUCCESS) {
        free(buf);
        drop_rank(t, r, RANK_DROPPED, "its connection failed");
        return VKS_OK;
    }
    r->rbuf = buf, r->rcount = count, r->rtag = tag, r->rfront = front, r->rsince = vks_seconds_now(), r->rnewest = t->newest;
    return VKS_OK;
}

/* A joined rank's message on its way in: taken when complete (*done). One not
 * complete within timeout_s drops the rank (it died within it, or its link is
 * too slow): the buffer is left to MPI. */
static int joined_receive_progress(trainer_src *t, inf_rank *r, vks_rl_batch_group *scratch, const vks_model_config *mc,
                                   bool *done) {
    int flag = 0;
    *done = false;
    if (MPI_Test(&r->rreq, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) flag = 0;
    if (!flag) {
        if (vks_seconds_now() - r->rsince <= t->mo->timeout_s) return VKS_OK;
        char why[128];
        snprintf(why, sizeof why, "it stopped within a message of %d bytes (%.0f s)", r->rcount, t->mo->timeout_s);
        r->rbuf = NULL, r->rreq = MPI_REQUEST_NULL; /* MPI's */
        if (r->state == RANK_LIVE || r->state == RANK_JOINING) vks_rl_orch_leave(t, r, RANK_DROPPED, why, true);
        return VKS_OK;
    }
    *done = true;
    char *buf = r->rbuf;
    r->rbuf = NULL;
    double took = vks_seconds_now() - r->rsince;
    if (took > 1.0) /* a contributor on a slow link: the run did not wait for it */
        fprintf(stderr, "vkswarm: rl: joined rank %d: a message of %d bytes took %.1f s to arrive; the run published %lld "
                "steps meanwhile\n", r->rank, r->rcount, took, (long long)(t->newest - r->rnewest));
    if (r->rtag == TAG_VERIFY)
        return r->state == RANK_LIVE ? forward_to_verifier(t, r, buf, r->rfront, r->rcount) : (free(buf), VKS_OK);
    int rc = up_message(t, r, buf, r->rcount, MPI_SUCCESS, scratch, mc);
    free(buf);
    return rc;
}

/* A joined rank's messages, over its own connection: the one on its way
 * first; then each new one is started and taken when it is complete (a
 * small one at once; a large one over a slow link in a later round). */
static int joined_messages(trainer_src *t, inf_rank *r, vks_rl_batch_group *scratch, const vks_model_config *mc) {
    for (;;) {
        if (r->rbuf) {
            bool done = false;
            int rc = joined_receive_progress(t, r, scratch, mc, &done);
            if (rc || !done) return rc;
        }
        bool live = r->state == RANK_LIVE;
        if (!live && r->state != RANK_JOINING) return VKS_OK;
        int flag = 0, tag = TAG_UP;
        MPI_Status st;
        if (MPI_Iprobe(0, TAG_UP, r->comm, &flag, &st) != MPI_SUCCESS) flag = 0;
        if (!flag && live && t->c->n_verifiers) {
            tag = TAG_VERIFY;
            if (MPI_Iprobe(0, TAG_VERIFY, r->comm, &flag, &st) != MPI_SUCCESS) flag = 0;
        }
        if (!flag) return VKS_OK;
        int rc = joined_receive_start(t, r, &st, tag);
        if (rc || !r->rbuf) return rc;
    }
}

/* Frees the forwarded batches a verifier has taken. One a dead verifier never
 * takes stays with MPI (a started send cannot be cancelled). */
static void forwards_progress(trainer_src *t) {
    for (int i = 0; i < t->n_fwd;) {
        int done = 0;
        if (MPI_Test(&t->fwd[i].req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) done = 0;
        if (!done) {
            i++;
            continue;
        }
        free(t->fwd[i].buf);
        t->fwd[i] = t->fwd[--t->n_fwd];
    }
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
    int rc = vks_rl_orch_take_joins(t);
    if (!rc) rc = vks_rl_orch_joined_weights(t);
    forwards_progress(t);
    if (rc) return rc;
    for (;;) { /* every queued word first: silence is judged only after them */
        int flag = 0;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_UP, t->comm, &flag, &st) != MPI_SUCCESS || !flag) break;
        if ((rc = receive_up(t, find_rank(t, st.MPI_SOURCE), t->comm, &st, scratch, mc))) return rc;
    }
    for (int i = 0; i < t->n_ranks; i++) /* joined ranks, each over its own connection */
        if (t->ranks[i].joined && (rc = joined_messages(t, &t->ranks[i], scratch, mc))) return rc;
    double wall = vks_seconds_now();
    int live = 0;
    for (int i = 0; i < t->n_ranks; i++) {
        inf_rank *r = &t->ranks[i];
        if (r->state == RANK_JOINING && wall - r->last_seen > t->mo->timeout_s) {
            vks_rl_orch_leave(t, r, RANK_DROPPED, "it did not say hello after it connected", true);
            continue;
        }
        if (r->state != RANK_LIVE) continue;
        if (wall - r->last_seen > t->mo->timeout_s && !r->rbuf) { /* a message on its way has a bound of its own */
            char why[96];
            snprintf(why, sizeof why, "rank %d went silent (%.1f s)", r->rank, wall - r->last_seen);
            drop_rank(t, r, RANK_DROPPED, why);
        } else live += !r->verifier;
    }
    if (!live && t->join) { /* open to joins: the pool may grow again (a machine rebooting joins back) */
        double bound = t->mo->trainer_timeout_s > t->mo->timeout_s ? t->mo->trainer_timeout_s : t->mo->timeout_s;
        const char *none = t->had_inference ? "no inference rank is left" : "no inference rank yet"; /* yet: a trainer alone */
        if (!t->alone_since) {
            t->alone_since = wall;
            fprintf(stderr, "vkswarm: rl: %s: waiting up to %.0f s for one to join\n", none, bound);
        }
        if (wall - t->alone_since <= bound) return VKS_OK;
        return vks_set_error(VKS_ERR_TIMEOUT, "trainer: %s, and none joined within %.0f s", none, bound);
    }
    t->had_inference = t->had_inference || live > 0;
    if (!live) return vks_set_error(VKS_ERR_TIMEOUT, "%s: no inference rank is left", t->remote ? "orchestrator" : "trainer");
    if (t->alone_since) fprintf(stderr, "vkswarm: rl: an inference rank again after %.0f s without one\n", wall - t->alone_since);
    t->alone_since = 0;
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

static int ranks_mpi(void *ctx, vks_rl_rank_status *out, int cap) { return vks_rl_orch_ranks(ctx, out, cap); }
/* The trainer checks every completion it takes (vks_rl_check_samples scores it again): its programs' metrics. */
static vks_task_metrics *program_metrics_mpi(void *ctx) { return ((trainer_src *)ctx)->gen.program_metrics; }
static int64_t position_mpi(void *ctx) { return ((trainer_src *)ctx)->next_batch; }
static double broadcast_bytes_mpi(void *ctx) { return (double)((trainer_src *)ctx)->cast_bytes; }
static void resume_mpi(void *ctx, int64_t step, int64_t next_batch) {
    trainer_src *t = ctx;
    t->next_batch = next_batch;
    t->queue.pushed = step * t->c->prompts_per_step;
}

/* Says stop to every rank still there (every broadcast has ended by now). */
static void stop_ranks(trainer_src *t) {
    vks_rl_join_close(t->join); /* no more joiners */
    vks_rl_orch_finish_joined_sends(t);
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
                                 .welcome = MPI_REQUEST_NULL, .wreq = MPI_REQUEST_NULL, .rreq = MPI_REQUEST_NULL};
        t->ranks[i].peer = t->ranks[i].rank;
    }
    t->cap_ranks = t->n_ranks;
    if (!rc) rc = vks_param_layout_create(&o->model->cfg, vks_model_has_bias(o->model), &t->layout);
    t->gen.o = o;
    t->gen.model = (vks_model *)(uintptr_t)o->model; /* read only: its shape */
    t->gen.episodes_allowed = vks_rl_config_episodes_across_ranks(c); /* replayed here: vks_rl_check_samples */
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
    if (!rc && mo->join_server && origin && t->orch < 0) rc = vks_rl_orch_open_joins(t);
    return rc;
}

void vks_rl_orch_close(trainer_src *t) {
    vks_rl_queue_free(&t->queue);
    vks_rl_cast_close(&t->cast);
    vks_rl_orch_close_joins(t);
    forwards_progress(t); /* those still on their way are MPI's */
    free(t->fwd);
    for (int i = 0; t->ranks && i < t->n_ranks; i++) { /* a joined rank's message taken whole and not yet read */
        int done = 0;
        inf_rank *r = &t->ranks[i];
        if (r->rbuf && MPI_Test(&r->rreq, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) free(r->rbuf);
    }
    free(t->weights), free(t->adapter_file), free(t->ranks), free(t->redo), free(t->pend), free(t->drops);
    vks_param_layout_free(t->layout);
    t->gen.model = NULL;
    vks_rl_gen_close(&t->gen);
}

int vks_rl_mpi_trainer(const vks_rl_run_options *o, const vks_rl_mpi_options *mo, vks_rl_result *res, bool *lost) {
    *lost = false;
    if (!o || !o->config || !o->model || !mo || !(mo->timeout_s > 0)) return vks_set_error(VKS_ERR_ARG, "rl: bad options");
    int rc = vks_rl_mpi_check_roles(o->config, mo->join_server != NULL);
    if (rc) return rc;
    if (o->config->orchestrator != o->config->trainer) return vks_rl_orch_trainer(o, mo, res, lost);
    trainer_src t;
    rc = vks_rl_orch_open(&t, o, mo, true);
    vks_rl_source src = {.ctx = &t, .publish = publish_mpi, .take = take_mpi, .counters = counters_mpi,
                         .position = position_mpi, .resume = resume_mpi, .broadcast_bytes = broadcast_bytes_mpi,
                         .ranks = ranks_mpi, .pool = vks_rl_orch_pool, .publish_adapter = publish_adapter_mpi,
                         .program_metrics = program_metrics_mpi};
    if (!rc) rc = vks_rl_run_source(o, &src, res);
    char err[1024];
    snprintf(err, sizeof err, "%s", rc ? vks_last_error() : "");
    vks_rl_orch_stop_ranks(&t);
    *lost = t.lost;
    vks_rl_orch_close(&t);
    if (rc) return vks_set_error(rc, "%s", err);
    return VKS_OK;
}
