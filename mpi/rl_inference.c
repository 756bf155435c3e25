/* rl_inference.c: an inference rank of the RL run across MPI ranks
 * (vks_rl_mpi.h): a rank of the world's (vks_rl_mpi_inference), a pipeline
 * group's first stage, or a machine that joined the running run
 * (vks_rl_inference_joined): one code path. It runs vks_rl_gen_batch (the
 * single-process code) on a thread while its main thread keeps MPI moving
 * and beats; the messages it exchanges with the trainer and verifier ranks
 * are listed in rl_roles.c. */
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
#include "vkswarm/vks_checkpoint.h"
#include "vkswarm/vks_grpo.h"
#include "vkswarm/vks_mpi.h"

#include "rl_cast.h"
#include "rl_group.h"
#include "rl_join.h"
#include "rl_orch.h"
#include "rl_wire.h"

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
    size_t stream_at, stream_want; /* stream_want: the stream's length, read from its header */
} inf_state;

/* A joined rank of a LoRA run: the adapter file the stream held (want bytes, its header's step), loaded on
 * the base as the pending adapter. The file is checked as a broadcast one is (vks_lora_load: the base's hash
 * it names, every tensor's shape). */
static int take_joined_adapter(inf_state *s, size_t want, int64_t step) {
    if (step <= s->pending_step)
        return vks_set_error(VKS_ERR_FORMAT, "an adapter of step %lld after step %lld", (long long)step,
                             (long long)s->pending_step);
    char path[4200];
    if ((size_t)snprintf(path, sizeof path, "%s/joined-adapter.gguf", s->o->config->out) >= sizeof path)
        return vks_set_error(VKS_ERR_ARG, "%s: path too long", s->o->config->out);
    vks_outfile f;
    int rc = vks_outfile_open(&f, path, 0644);
    if (!rc) {
        size_t n = want - sizeof(vks_rl_msg);
        rc = vks_outfile_finish(&f, fwrite((char *)s->stream + sizeof(vks_rl_msg), 1, n, f.f) == n);
    }
    vks_lora_adapter *a = NULL;
    if (!rc) rc = vks_lora_load(path, s->o->model, &a);
    remove(path);
    if (rc) return vks_error_prefix(rc, "the adapter of step %lld", (long long)step);
    vks_lora_adapter_free(s->pending_adapter);
    s->pending_adapter = a, s->pending_step = step;
    return VKS_OK;
}

/* A joined rank: the next chunk of the trainer's WEIGHTS stream
 * (TAG_JOIN_WEIGHTS, probed: st). The first starts with the WEIGHTS header
 * (the stream's length follows from it); each is bounded by what is left;
 * the whole, checked, becomes the pending weights. */
static int take_joined_chunk(inf_state *s, const MPI_Status *st) {
    int count = 0;
    MPI_Get_count(st, MPI_BYTE, &count);
    const vks_rl_config *c = s->o->config;
    bool lora = c->lora_rank > 0; /* LoRA: the stream is the adapter file, its length in the header */
    size_t most = lora ? sizeof(vks_rl_msg) + vks_rl_cast_max_file(c, s->o->model, s->layout->n_values)
                       : sizeof(vks_rl_msg) + sizeof(float) * s->layout->n_values;
    size_t want = s->stream_at ? s->stream_want : most;
    if (!s->stream && !(s->stream = malloc(most)))
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
    if (s->stream_at == 0) { /* the header: the stream is the WEIGHTS of this model (or its adapter), or nothing */
        vks_rl_msg h;
        memcpy(&h, s->stream, sizeof h);
        if (h.magic != VKS_RL_MAGIC || h.type != MSG_WEIGHTS ||
            (lora ? h.n < 1 || h.n > most - sizeof h : h.n != s->layout->n_values))
            return vks_set_error(VKS_ERR_FORMAT, "a malformed weights header");
        s->stream_want = want = sizeof h + (lora ? (size_t)h.n : sizeof(float) * s->layout->n_values);
        if ((size_t)count > want) return vks_set_error(VKS_ERR_FORMAT, "a weights chunk past the stream's end");
    }
    s->stream_at += (size_t)count;
    vks_test_point("weights"); /* tests kill a joiner at a chunk of its choosing */
    if (s->stream_at < want) return VKS_OK;
    s->stream_at = 0;
    vks_rl_msg h;
    memcpy(&h, s->stream, sizeof h);
    int64_t step = 0;
    if (lora) return take_joined_adapter(s, want, h.step);
    int rc = vks_rl_wire_check_weights(s->stream, want, s->layout->n_values, s->pending_step, h.step, &step);
    if (rc) return rc;
    bool leak = false; /* a joined group: its other stages take the weights from this one */
    if (s->group && (rc = vks_rl_group_relay_weights(s->group, s->stream, want, &leak))) {
        if (leak) s->stream = NULL, s->no_finalize = true; /* MPI's */
        return rc;
    }
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
                int ranks = INT_MAX; /* joined: the verifier is the run's rank, reached through the trainer */
                if (!s->joined) MPI_Comm_size(s->comm, &ranks);
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

/* What a verifier is sent of batch `batch` besides its groups: its rollout file, or for episodes its turn
 * files (vks_rl_wire_pack_turn_files). */
static int batch_files(inf_state *s, vks_rl_gen *g, int64_t batch, char **out, size_t *bytes) {
    size_t most = vks_rl_wire_max_rollout_bytes(s->o->config, s->o->model->cfg.seq_len);
    char path[4200];
    vks_rl_batch_path(g, batch, path, sizeof path);
    if (!g->episodes) return vks_file_read_all(path, most, out, bytes);
    char *files[VKS_ENV_MAX_TURNS] = {0};
    size_t lens[VKS_ENV_MAX_TURNS] = {0};
    int rc = g->turns >= 1 && g->turns <= VKS_ENV_MAX_TURNS ? VKS_OK
                                                             : vks_set_error(VKS_ERR_ARG, "batch %lld: %d turn files", (long long)batch, g->turns);
    for (int t = 0; !rc && t < g->turns; t++) {
        vks_rl_turn_path(g, batch, t, path, sizeof path);
        rc = vks_file_read_all(path, most, &files[t], &lens[t]);
    }
    if (!rc) rc = vks_rl_wire_pack_turn_files(files, lens, g->turns, out, bytes);
    for (int t = 0; t < VKS_ENV_MAX_TURNS; t++) free(files[t]);
    return rc;
}

/* With verifier ranks: the batch's GROUPS message (every completion,
 * unverified; `groups` is owned from here) and its rollout file (episodes:
 * its turn files) go to the verifier named in the grant, then DONE to the
 * trainer. */
static int send_to_verifier(inf_state *s, vks_rl_gen *g, int64_t batch, void *groups, size_t groups_bytes) {
    char *file = NULL;
    size_t file_bytes = 0;
    int rc = batch_files(s, g, batch, &file, &file_bytes);
    /* a joined rank reaches the verifier through the trainer, which checks its signature and says
     * whose batch it is (rl_trainer_join.c) */
    size_t total = sizeof(vks_rl_msg) + groups_bytes + file_bytes + (s->joined ? crypto_sign_BYTES : 0);
    int to = s->joined ? s->trainer : s->verifier;
    char *msg = rc ? NULL : malloc(total);
    if (!rc && !msg) rc = vks_set_error(VKS_ERR_NOMEM, "inference: out of host memory");
    if (!rc && total > INT_MAX) rc = vks_set_error(VKS_ERR_ARG, "a batch of %zu bytes", total);
    if (!rc) {
        vks_rl_msg h = {.magic = VKS_RL_MAGIC, .type = MSG_TO_VERIFY, .batch = batch, .step = g->policy_step, .n = groups_bytes};
        memcpy(msg, &h, sizeof h);
        memcpy(msg + sizeof h, groups, groups_bytes);
        memcpy(msg + sizeof h + groups_bytes, file, file_bytes);
        if (s->joined)
            crypto_sign_detached((uint8_t *)msg + total - crypto_sign_BYTES, NULL, (const uint8_t *)msg,
                                 total - crypto_sign_BYTES, s->mo->join_secret_key);
        MPI_Request req;
        MPI_Isend(msg, (int)total, MPI_BYTE, to, TAG_VERIFY, s->comm, &req);
        if (vks_mpi_wait_within_doing(s->comm, &req, &to, 1, s->mo->timeout_s, "the verifier taking a batch",
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
    if (!rc && s->joined && s->verifier < 0) { /* its identity signs what it sends (rl_join.h; to a verifier: below) */
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
    int rc = vks_rl_mpi_check_roles(o->config, mo->join_server != NULL);
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
    int size = 1, me = 0;
    MPI_Comm_size(vks_mpi_world(), &size), MPI_Comm_rank(vks_mpi_world(), &me);
    if (!o || !o->config || !o->model || !o->tok || !o->infer_gpu || !mo || !(mo->timeout_s > 0) || number < 1 ||
        (me == 0) != (ic != MPI_COMM_NULL))
        return vks_set_error(VKS_ERR_ARG, "rl: bad options");
    inf_state s = {.comm = ic, .trainer = 0, .o = o, .mo = mo, .assigned = -1, .pending_step = -1, .verifier = -1,
                   .joined = number};
    s.beat = (vks_rl_beat){.comm = ic, .trainer = 0, .req = MPI_REQUEST_NULL};
    /* a group (mpirun -np S vkswarm join): its world's rank 0 is the first stage, the trainer's peer */
    return size > 1 ? pipeline_group_rank(&s, -1, me, no_finalize) : inference_rank(&s, no_finalize);
}

/* A rank of a pipeline group (group: its index in the config, -1: a group
 * that joined the run as rank number s->joined): the first stage runs as an
 * inference rank whose batches the group generates; the others serve it
 * (rl_group.h). */
static int pipeline_group_rank(inf_state *s, int group, int stage, bool *no_finalize) {
    if (!vks_mpi_threads_multiple())
        return vks_set_error(VKS_ERR_ARG, "inference group %d: pipeline groups need MPI_THREAD_MULTIPLE, which this MPI "
                             "did not grant", group);
    vks_rl_pipe_group grp = {0};
    int rc = group >= 0 ? vks_rl_group_open(&grp, s->o, s->mo, group, stage)
                        : vks_rl_group_open_joined(&grp, s->o, s->mo, s->joined);
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
    g.episodes_allowed = vks_rl_config_episodes_across_ranks(o->config);
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
