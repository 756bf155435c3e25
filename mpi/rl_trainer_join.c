/* rl_trainer_join.c: the trainer's side of joins (rl_join.h: the join
 * point and the joiner's side): connections taken, hellos checked
 * (signature, bans, join.allow, model hash), admissions, the newest weights
 * streamed to each joined rank in chunks, bans (OUT/bans.jsonl), the counts
 * per identity, and the WELCOME every joiner is sent first. The rest of the
 * trainer (grants, receives, liveness) treats a joined rank as any other
 * (rl_roles.c), reaching it through its own connection. */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sodium.h>
#include <sys/mman.h>
#include "vkswarm/vks_rl_bans.h"
#include "vkswarm/vks_rl_mpi.h"
#include "vkswarm/vks_rl_roles.h"
#include "vkswarm/vks_mpi.h"

#include "rl_join.h"
#include "rl_orch.h"
#include "rl_wire.h"

/* A joined rank leaving the run is told why (NOT_ADMITTED on its
 * connection, batch = 1: refused, 0: dropped), so that a live one ends now
 * instead of waiting out its trainer timeout. Not waited for beyond a small
 * message's eager send (it may be dead). */
void vks_rl_orch_tell_joined(trainer_src *t, inf_rank *r, int state, const char *why) {
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
int vks_rl_orch_take_joins(trainer_src *t) {
    MPI_Comm ic;
    while (vks_rl_join_take(t->join, &ic)) {
        int rc = grow_ranks(t);
        if (rc) return rc;
        MPI_Comm_set_errhandler(ic, MPI_ERRORS_RETURN);
        inf_rank *r = &t->ranks[t->n_ranks++];
        *r = (inf_rank){.rank = t->n_world + t->n_joined++, .state = RANK_JOINING, .joined = true, .ident = -1, .comm = ic, .peer = 0,
                        .welcome = MPI_REQUEST_NULL, .wreq = MPI_REQUEST_NULL, .rreq = MPI_REQUEST_NULL, .batch = -1,
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

void vks_rl_orch_ban(trainer_src *t, inf_rank *r, const char *why) {
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
    vks_rl_orch_leave(t, r, RANK_REFUSED, why, true); /* tells it (leave_rank: tell_joined) */
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

/* The newest weights as t->jw (made from t->weights when a newer step was published; LoRA: a WEIGHTS
 * header whose n is the adapter file's length, then the GGUF adapter file). */
static int newest_joined_weights(trainer_src *t) {
    if (!t->published || (t->jw && t->jw->step == t->newest)) return VKS_OK;
    bool lora = t->c->lora_rank > 0;
    if (lora && !t->adapter_file) return VKS_OK;
    size_t bytes = sizeof(vks_rl_msg) + (lora ? t->adapter_bytes : sizeof(float) * t->layout->n_values);
    /* mapped, as the staging buffers are: one copy per step while joiners come and go, freed back whole
     * (malloc'd, they fragmented the heap under MALLOC_PERTURB_: 12 MB of RSS over 25 joins in tools/test) */
    struct joined_weights *w = mmap(NULL, sizeof *w + bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (w == MAP_FAILED) return vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory for the joiners' weights");
    *w = (struct joined_weights){.refs = 1, .step = t->newest, .bytes = bytes};
    if (lora) {
        vks_rl_msg h = {.magic = VKS_RL_MAGIC, .type = MSG_WEIGHTS, .step = t->newest, .n = t->adapter_bytes};
        memcpy(w->data, &h, sizeof h);
        memcpy((char *)w->data + sizeof h, t->adapter_file, t->adapter_bytes);
    } else {
        memcpy(w->data, t->weights, bytes);
    }
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
        vks_rl_orch_leave(t, r, RANK_DROPPED, "the weights could not be sent to it", true);
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
int vks_rl_orch_joined_weights(trainer_src *t) {
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
            vks_rl_orch_leave(t, r, RANK_DROPPED, why, true);
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
void vks_rl_orch_admit(trainer_src *t, inf_rank *r, const char *buf, size_t bytes) {
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
    vks_rl_msg a = {.magic = VKS_RL_MAGIC, .type = MSG_ADMIT, .step = t->newest, .n = (uint64_t)r->rank};
    if (vks_rl_wire_send_small(r->comm, 0, TAG_JOIN, &a, t->mo->timeout_s, "the joiner taking its admission")) {
        vks_rl_orch_leave(t, r, RANK_DROPPED, vks_last_error(), true);
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

static int by_batches(const void *a, const void *b) {
    const vks_rl_identity *x = a, *y = b;
    int64_t u = x->batches_accepted + x->batches_rejected, v = y->batches_accepted + y->batches_rejected;
    return (u < v) - (u > v);
}

bool vks_rl_orch_pool(void *ctx, vks_rl_pool *out) {
    const trainer_src *t = ctx;
    *out = (vks_rl_pool){.joins = t->joins, .leaves = t->leaves, .bans = t->banned};
    if (!t->join) return false;
    /* the busiest VKS_RL_MAX_IDENTITIES: all sorted, in a copy (ranks hold indices into t->idents) */
    int n = t->n_idents, shown = n < VKS_RL_MAX_IDENTITIES ? n : VKS_RL_MAX_IDENTITIES;
    vks_rl_identity *all = malloc(sizeof *all * (size_t)(n > 0 ? n : 1));
    vks_rl_identity *to = all ? all : out->identities; /* out of memory: the first ones, unsorted */
    for (int i = 0; i < (all ? n : shown); i++) {
        to[i] = (vks_rl_identity){.batches_accepted = t->idents[i].accepted, .batches_rejected = t->idents[i].rejected};
        sodium_bin2hex(to[i].identity, sizeof to[i].identity, t->idents[i].key, 8);
    }
    if (all) {
        qsort(all, (size_t)n, sizeof *all, by_batches);
        memcpy(out->identities, all, sizeof *all * (size_t)shown);
        free(all);
    }
    out->n_identities = shown;
    out->identities_left_out = n - shown;
    return true;
}

/* Before the STOPs: the chunks on their way to joined ranks arrive (no new
 * ones go out), bounded by timeout_s; a send left pending at the end would
 * fail the joiner's receive instead of letting it read its STOP. */
void vks_rl_orch_finish_joined_sends(trainer_src *t) {
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

/* The join point, and the WELCOME every joiner gets: the config, then the task file's bytes. */
int vks_rl_orch_open_joins(trainer_src *t) {
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

/* What the joins left at the end: the staging buffers and weights copies,
 * but a chunk still on its way (its staging buffer is MPI's), and the
 * WELCOME (kept when MPI still reads it). */
void vks_rl_orch_close_joins(trainer_src *t) {
    bool welcomes_out = false;
    for (int i = 0; i < t->n_ranks; i++) {
        int flag = 1;
        if (t->ranks[i].joined && t->ranks[i].welcome != MPI_REQUEST_NULL) MPI_Test(&t->ranks[i].welcome, &flag, MPI_STATUS_IGNORE);
        welcomes_out = welcomes_out || !flag;
    }
    if (!welcomes_out) free(t->welcome);
    for (int i = 0; i < t->n_ranks; i++) {
        inf_rank *r = &t->ranks[i];
        if (!r->joined) continue;
        int flag = 1;
        if (r->wreq != MPI_REQUEST_NULL && MPI_Test(&r->wreq, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) flag = 0;
        release_weights(r->sending);
        if (flag) free_stage(r);
    }
    release_weights(t->jw);
    free(t->bans), free(t->idents);
}
