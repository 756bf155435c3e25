/* rl_group.c: an RL inference group of S > 1 ranks, a pipeline (rl_group.h). */
#include "rl_group.h"
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "rl_cast.h"
#include "rl_join.h"
#include "vkswarm/vks_pipeline.h"

enum { TAG_GROUP_HELLO = 7105, TAG_GROUP_REFORM = 7107, TAG_GROUP_WEIGHTS = 7109 };
enum { GROUP_RUN = 1, GROUP_STOP = 2, GROUP_REFORM = 3 };

/* RUN, STOP or REFORM, first stage -> the other stages. */
typedef struct {
    uint32_t magic, type;
    int64_t batch, step;        /* RUN: the batch, the policy step to run with */
    int32_t n, steps, stop_a, stop_b, toploc, lost; /* lost: STOP after the run lost ranks */
    uint32_t top_k, pad;
    uint64_t seed;
    float temperature, top_p;
    uint64_t out;               /* REFORM: the configured stages left out (bit s) */
} group_msg;

void vks_rl_group_find(const vks_rl_config *c, int rank, int *index, int *stage) {
    *index = -1, *stage = 0;
    for (int i = 0; i < c->n_groups; i++)
        for (int s = 0; c->groups[i].n > 1 && s < c->groups[i].n; s++)
            if (c->inference_ranks[c->groups[i].first + s] == rank) *index = i, *stage = s;
}

/* How messages name stage s: its world rank, or a joined group's number. */
static int stage_name(const vks_rl_pipe_group *g, int s) { return g->names ? g->names[s] : g->ranks[s]; }

/* The group's ranks in one line ("1 2 3"), for messages. */
static void rank_list(const vks_rl_pipe_group *g, char *out, size_t cap) {
    size_t at = 0;
    out[0] = 0;
    if (g->joined) {
        snprintf(out, cap, "%d, joined, %d stages", g->joined, g->n);
        return;
    }
    for (int s = 0; s < g->n && at < cap; s++)
        at += (size_t)snprintf(out + at, cap - at, "%s%d", s ? " " : "", g->ranks[s]);
}

/* Whether configured stage cs is in mask m (stages past the mask's bits never are). */
static bool in_mask(uint64_t m, int cs) { return cs >= 0 && cs < VKS_RL_GROUP_MAX_REFORM && (m >> cs & 1); }

/* The group's ranks now as "[1, 3]". */
static void rank_brackets(const vks_rl_pipe_group *g, char *out, size_t cap) {
    size_t at = (size_t)snprintf(out, cap, "[");
    for (int s = 0; s < g->n && at < cap; s++) at += (size_t)snprintf(out + at, cap - at, "%s%d", s ? ", " : "", g->ranks[s]);
    if (at < cap) snprintf(out + at, cap - at, "]");
}

/* An error of the group's pipeline (its messages name the stages by world rank: stage_ranks). */
static int group_error(const vks_rl_pipe_group *g, int rc, const char *what) {
    char ranks[256];
    rank_list(g, ranks, sizeof ranks);
    return vks_set_error(rc, "inference group %d (ranks %s): %s: %s", g->index, ranks, what, vks_last_error());
}

/* Every stage answers the first one (and it them) within timeout_s, so that
 * the blocking MPI_Comm_create_group only starts once all are there. */
static int hello(vks_rl_pipe_group *g, MPI_Comm world) {
    int mine[2] = {g->index, g->n}, peers = g->stage ? 1 : g->n - 1;
    if (peers < 1) return vks_set_error(VKS_ERR_ARG, "a group of %d ranks", g->n);
    int(*theirs)[2] = calloc((size_t)peers, sizeof *theirs);
    MPI_Request *reqs = malloc(sizeof *reqs * 2 * (size_t)peers);
    int *peer = malloc(sizeof *peer * 2 * (size_t)peers);
    if (!theirs || !reqs || !peer) {
        free(theirs), free(reqs), free(peer);
        return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    }
    for (int k = 0; k < peers; k++) {
        int r = g->stage ? g->ranks[0] : g->ranks[k + 1];
        peer[2 * k] = peer[2 * k + 1] = stage_name(g, g->stage ? 0 : k + 1); /* in messages */
        MPI_Irecv(theirs[k], 2, MPI_INT, r, TAG_GROUP_HELLO, world, &reqs[2 * k]);
        MPI_Isend(mine, 2, MPI_INT, r, TAG_GROUP_HELLO, world, &reqs[2 * k + 1]);
    }
    int rc = vks_mpi_wait_within(world, reqs, peer, 2 * peers, g->mo->timeout_s, "forming its inference group");
    if (rc) return rc; /* the requests stay MPI's: the rank ends */
    for (int k = 0; !rc && k < peers; k++)
        if (theirs[k][0] != g->index || theirs[k][1] != g->n)
            rc = vks_set_error(VKS_ERR_FORMAT, "rank %d says it is in inference group %d of %d ranks, not %d of %d "
                               "(different configs?)", peer[2 * k], theirs[k][0], theirs[k][1], g->index, g->n);
    free(theirs), free(reqs), free(peer);
    return rc;
}

/* Forms the group of n ranks `ranks` of `world`: the hello, then its communicators. */
static int open_over(vks_rl_pipe_group *g, MPI_Comm world, const int *ranks, int n) {
    int L = g->o->model->cfg.n_layers;
    if (n > L) return vks_set_error(VKS_ERR_ARG, "inference group %d has %d ranks for the model's %d layers", g->index, n, L);
    g->first = malloc(sizeof *g->first * (size_t)(n + 1));
    g->own_ranks = malloc(sizeof *g->own_ranks * (size_t)n);
    g->retired = malloc(sizeof *g->retired * 2 * (size_t)n);
    if (!g->first || !g->own_ranks || !g->retired) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    memcpy(g->own_ranks, ranks, sizeof *g->own_ranks * (size_t)n);
    g->ranks = g->own_ranks;
    for (int s = 0; s <= n; s++) g->first[s] = (int)((int64_t)s * L / n); /* even: no stage without layers */
    int rc = hello(g, world);
    if (rc) return rc;
    MPI_Group all, mine;
    MPI_Comm_group(world, &all);
    MPI_Group_incl(all, n, g->ranks, &mine);
    if (MPI_Comm_create_group(world, mine, TAG_GROUP_HELLO, &g->pipe) != MPI_SUCCESS ||
        MPI_Comm_dup(g->pipe, &g->ctl) != MPI_SUCCESS)
        rc = vks_set_error(VKS_ERR_IO, "inference group %d: its communicators could not be made", g->index);
    MPI_Group_free(&mine);
    MPI_Group_free(&all);
    if (!rc) MPI_Comm_set_errhandler(g->pipe, MPI_ERRORS_RETURN), MPI_Comm_set_errhandler(g->ctl, MPI_ERRORS_RETURN);
    return rc;
}

int vks_rl_group_open(vks_rl_pipe_group *g, const vks_rl_run_options *o, const vks_rl_mpi_options *mo, int index, int stage) {
    const vks_rl_config *c = o->config;
    *g = (vks_rl_pipe_group){.pipe = MPI_COMM_NULL, .ctl = MPI_COMM_NULL, .index = index, .n = c->groups[index].n,
                             .stage = stage, .cfg_ranks = c->inference_ranks + c->groups[index].first,
                             .cfg_n = c->groups[index].n, .cfg_stage = stage, .o = o, .mo = mo, .engine_step = -1};
    atomic_init(&g->want_out, 0);
    return open_over(g, vks_mpi_world(), g->cfg_ranks, g->n);
}

int vks_rl_group_open_joined(vks_rl_pipe_group *g, const vks_rl_run_options *o, const vks_rl_mpi_options *mo,
                             int number) {
    MPI_Comm world = vks_mpi_world();
    int n = 0, stage = 0;
    MPI_Comm_size(world, &n), MPI_Comm_rank(world, &stage);
    *g = (vks_rl_pipe_group){.pipe = MPI_COMM_NULL, .ctl = MPI_COMM_NULL, .index = -1, .n = n, .stage = stage,
                             .cfg_n = n, .cfg_stage = stage, .o = o, .mo = mo, .engine_step = -1, .joined = number};
    atomic_init(&g->want_out, 0);
    if (n < 2 || number < 1) return vks_set_error(VKS_ERR_ARG, "a joined group of %d ranks (number %d)", n, number);
    int *ranks = malloc(sizeof *ranks * (size_t)n);
    g->names = malloc(sizeof *g->names * (size_t)n);
    if (!ranks || !g->names) {
        free(ranks);
        return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    }
    for (int s = 0; s < n; s++) ranks[s] = s, g->names[s] = number; /* the stage number tells them apart */
    int rc = open_over(g, world, ranks, n);
    g->cfg_ranks = g->own_ranks; /* a joined group is not re-formed (a refusal is the whole group's) */
    free(ranks);
    return rc;
}

void vks_rl_group_close(vks_rl_pipe_group *g, bool finalize) {
    if (finalize && g->ctl != MPI_COMM_NULL) MPI_Comm_free(&g->ctl);
    if (finalize && g->pipe != MPI_COMM_NULL) MPI_Comm_free(&g->pipe);
    for (int i = 0; finalize && i < g->n_retired; i++) MPI_Comm_free(&g->retired[i]);
    g->n_retired = 0;
    free(g->first), free(g->own_ranks), free(g->retired), free(g->names);
    g->first = g->own_ranks = g->names = NULL, g->ranks = NULL, g->retired = NULL;
    vks_engine_destroy(g->engine);
    g->engine = NULL;
}

/* The pipeline of a batch: the same on every stage, sized for the largest
 * batch (prompts_per_step x group_size sequences), so that one engine per
 * policy serves every batch. */
static vks_pipeline_options pipe_options(const vks_rl_pipe_group *g, const vks_sched_params *sp, bool toploc) {
    const vks_rl_config *c = g->o->config;
    int most = c->prompts_per_step * c->group_size;
    int K = most >= 2 ? 2 : 1; /* two micro-batches: one stage computes while the other's rows travel */
    /* f32 weights and math, f32 on the wire: the tokens, proofs and log-probabilities are one rank's
     * (verifiers recompute in f32; the trainer compares the log-probabilities). Every stage but the
     * last commits what it hands on, named by its world rank, so that a verifier names a cheating stage. */
    return (vks_pipeline_options){.micro_batches = K, .batch = (most + K - 1) / K, .chunk = 256, .sched = *sp,
                                  .wire = VKS_WIRE_F32, .timeout_s = g->mo->timeout_s, .first = g->first,
                                  .engine = {.dtype = VKS_DTYPE_F32, .f32_math = true}, .toploc = toploc,
                                  .record_logp = true, .stage_proofs = toploc, .stage_ranks = g->names ? g->names : g->ranks};
}

/* This stage's engine for the policy of step `step`, made once per policy
 * (room for any batch's positions: the model's context). LoRA (lora not
 * NULL): made once for the base; a new step only swaps the adapter in (the
 * engine takes the matrices of its own layers). */
static int stage_engine(vks_rl_pipe_group *g, const vks_model *policy, const vks_lora_adapter *lora, int64_t step,
                        vks_pipeline_options *po) {
    if (!g->engine || g->engine_step != step) {
        if (!lora || !g->engine) {
            vks_engine_destroy(g->engine);
            g->engine = NULL, g->engine_step = -1;
            vks_engine_options eo = vks_pipeline_engine_options(po, g->stage);
            eo.kv_len = policy->cfg.seq_len;
            int rc = vks_engine_create(g->o->infer_gpu, policy, &eo, &g->engine);
            if (rc) return rc;
        }
        int rc = lora ? vks_engine_set_lora(g->engine, lora) : VKS_OK;
        if (rc) return rc;
        g->engine_step = step;
    }
    po->keep_engine = g->engine;
    return VKS_OK;
}

/* Sends `bytes` of buf to every other stage under tag on ctl, bounded (each
 * stage s its own part, buf + (s - 1) * step; step 0: the same). On a timeout the
 * buffer stays MPI's: *leak is set and the caller must not free it. */
static int send_each(vks_rl_pipe_group *g, const void *buf, size_t bytes, size_t step, int tag, const char *what,
                     bool *leak) {
    *leak = false;
    if (bytes > INT_MAX) return vks_set_error(VKS_ERR_ARG, "a message of %zu bytes", bytes);
    MPI_Request *reqs = malloc(sizeof *reqs * (size_t)g->n);
    int *peer = malloc(sizeof *peer * (size_t)g->n);
    if (!reqs || !peer) {
        free(reqs), free(peer);
        return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    }
    for (int s = 1; s < g->n; s++) {
        peer[s - 1] = stage_name(g, s); /* named in a message only */
        MPI_Isend((const char *)buf + (size_t)(s - 1) * step, (int)bytes, MPI_BYTE, s, tag, g->ctl, &reqs[s - 1]);
    }
    int rc = vks_mpi_wait_within(g->ctl, reqs, peer, g->n - 1, g->mo->timeout_s, what);
    *leak = rc != VKS_OK;
    if (!*leak) free(reqs); /* else MPI still holds the requests */
    free(peer);
    return rc;
}

static int send_stages(vks_rl_pipe_group *g, const void *buf, size_t bytes, int tag, const char *what, bool *leak) {
    return send_each(g, buf, bytes, 0, tag, what, leak);
}

int vks_rl_group_relay_weights(vks_rl_pipe_group *g, const void *stream, size_t bytes, bool *leak) {
    *leak = false;
    if (!g->joined) return vks_set_error(VKS_ERR_ARG, "weights relayed in a group that did not join");
    /* every chunk to every stage at once: MPI moves them while this waits (bounded per chunk) */
    for (size_t at = 0; at < bytes; at += VKS_RL_JOIN_CHUNK) {
        size_t n = bytes - at < VKS_RL_JOIN_CHUNK ? bytes - at : VKS_RL_JOIN_CHUNK;
        int rc = send_stages(g, (const char *)stream + at, n, TAG_GROUP_WEIGHTS, "a stage taking the weights", leak);
        if (rc) return group_error(g, rc, "passing the weights on");
    }
    return VKS_OK;
}

/* The group without the configured stages in `want` (a superset of g->out,
 * never this rank's): new communicators of the stages left (collective over
 * them only), their ranks, an even layer partition, no engine (the next
 * batch makes one for this stage's new layers). */
static int apply_reform(vks_rl_pipe_group *g, uint64_t want) {
    int excl[VKS_RL_GROUP_MAX_REFORM], n_excl = 0, now = 0;
    for (int cs = 0; cs < g->cfg_n; cs++) {
        if (in_mask(g->out, cs)) continue;
        if (in_mask(want, cs)) excl[n_excl++] = now;
        now++;
    }
    MPI_Group old, left;
    MPI_Comm pipe = MPI_COMM_NULL, ctl = MPI_COMM_NULL;
    MPI_Comm_group(g->pipe, &old);
    MPI_Group_excl(old, n_excl, excl, &left);
    int rc = MPI_Comm_create_group(g->pipe, left, TAG_GROUP_REFORM, &pipe) != MPI_SUCCESS ||
                     MPI_Comm_dup(pipe, &ctl) != MPI_SUCCESS
                 ? vks_set_error(VKS_ERR_IO, "inference group %d: the communicators of its new form could not be made",
                                 g->index)
                 : VKS_OK;
    MPI_Group_free(&left);
    MPI_Group_free(&old);
    if (rc) return rc;
    MPI_Comm_set_errhandler(pipe, MPI_ERRORS_RETURN), MPI_Comm_set_errhandler(ctl, MPI_ERRORS_RETURN);
    g->retired[g->n_retired++] = g->pipe, g->retired[g->n_retired++] = g->ctl; /* a peer may still hold them */
    g->pipe = pipe, g->ctl = ctl;
    int n = 0;
    for (int cs = 0; cs < g->cfg_n; cs++) {
        if (in_mask(want, cs)) continue;
        if (cs == g->cfg_stage) g->stage = n;
        g->own_ranks[n++] = g->cfg_ranks[cs];
    }
    g->n = n, g->out = want;
    int L = g->o->model->cfg.n_layers;
    for (int s = 0; s <= n; s++) g->first[s] = (int)((int64_t)s * L / n);
    vks_engine_destroy(g->engine);
    g->engine = NULL, g->engine_step = -1;
    return VKS_OK;
}

int vks_rl_group_exclude(vks_rl_pipe_group *g, int rank) {
    uint64_t want = atomic_load(&g->want_out);
    int cs = 1, left = 0;
    while (cs < g->cfg_n && g->cfg_ranks[cs] != rank) cs++;
    for (int k = 0; k < g->cfg_n; k++) left += !in_mask(want, k);
    if (cs >= g->cfg_n || cs >= VKS_RL_GROUP_MAX_REFORM || in_mask(want, cs) || left - 1 < 2)
        return vks_set_error(VKS_ERR_FORMAT, "a REFORM leaving out rank %d, not a later stage still in group %d (or "
                             "fewer than two stages would be left)", rank, g->index);
    atomic_store(&g->want_out, want | (uint64_t)1 << cs);
    return VKS_OK;
}

/* The first stage, before a batch: the stages left out are told STOP, the
 * others REFORM, and the group re-forms without them. */
static int reform_first(vks_rl_pipe_group *g, uint64_t want) {
    group_msg *m = calloc((size_t)g->n, sizeof *m);
    if (!m) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    char before[256], gone[128] = "";
    rank_brackets(g, before, sizeof before);
    for (int cs = 0, s = 0; cs < g->cfg_n; cs++) { /* configured stage cs is stage s now when not left out */
        if (in_mask(g->out, cs)) continue;
        if (s++ == 0) continue; /* the first stage: this one */
        bool stop = in_mask(want, cs);
        m[s - 2] = (group_msg){.magic = VKS_RL_MAGIC, .type = stop ? GROUP_STOP : GROUP_REFORM, .out = want};
        if (stop) snprintf(gone + strlen(gone), sizeof gone - strlen(gone), "%s%d", gone[0] ? ", " : "", g->cfg_ranks[cs]);
    }
    bool leak = false;
    int rc = send_each(g, m, sizeof *m, sizeof *m, TAG_CTL, "a stage taking the re-forming", &leak);
    if (!leak) free(m);
    if (!rc) rc = apply_reform(g, want);
    if (rc) return group_error(g, rc, "re-forming without a refused stage");
    char after[256], layers[256] = "";
    rank_brackets(g, after, sizeof after);
    for (int s = 0; s < g->n; s++)
        snprintf(layers + strlen(layers), sizeof layers - strlen(layers), "%s[%d,%d)", s ? " " : "", g->first[s],
                 g->first[s + 1]);
    fprintf(stderr, "vkswarm: rl: inference group %s: re-formed without rank %s as %s (layers %s)\n", before, gone, after,
            layers);
    return VKS_OK;
}

int vks_rl_group_generate(void *ctx, const vks_rl_gen *gen, const vks_sched_params *sp, vks_sequence *seqs, int n,
                          bool toploc) {
    vks_rl_pipe_group *g = ctx;
    bool leak = false;
    uint64_t want = atomic_load(&g->want_out);
    int rc = want != g->out ? reform_first(g, want) : VKS_OK;
    if (rc) return rc;
    group_msg *m = malloc(sizeof *m);
    if (!m) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    *m = (group_msg){.magic = VKS_RL_MAGIC, .type = GROUP_RUN, .batch = gen->batch, .step = gen->policy_step, .n = n,
                     .steps = sp->steps, .stop_a = sp->stop_token_a, .stop_b = sp->stop_token_b, .toploc = toploc,
                     .top_k = sp->top_k, .seed = sp->seed, .temperature = sp->temperature, .top_p = sp->top_p};
    rc = send_stages(g, m, sizeof *m, TAG_CTL, "a stage taking the batch", &leak);
    if (!leak) free(m); /* else MPI may still read it: left (the rank is ending) */
    if (rc) return group_error(g, rc, "handing out the batch");
    vks_pipeline_options po = pipe_options(g, sp, toploc);
    vks_pipeline_stats st;
    rc = stage_engine(g, gen->model, gen->adapter, gen->policy_step, &po);
    if (!rc) rc = vks_pipeline_run(g->pipe, g->o->infer_gpu, gen->model, &po, seqs, n, &st);
    return rc ? group_error(g, rc, "the pipeline") : VKS_OK;
}

void vks_rl_group_stop(vks_rl_pipe_group *g, bool lost) {
    group_msg *stop = malloc(sizeof *stop);
    bool leak = false;
    if (stop) *stop = (group_msg){.magic = VKS_RL_MAGIC, .type = GROUP_STOP, .lost = lost};
    if (!stop || send_stages(g, stop, sizeof *stop, TAG_CTL, "a stage taking the stop", &leak))
        fprintf(stderr, "vkswarm: rl: inference group %d: the stop did not reach every stage: %s\n", g->index,
                stop ? vks_last_error() : "out of host memory");
    if (!leak) free(stop); /* else MPI may still read it: left */
}

/* ---- the other stages ---- */

/* A RUN message's sampler and sizes, checked against the model. */
static int check_run(const vks_rl_pipe_group *g, const group_msg *m, const vks_model *policy, int64_t held,
                     vks_sched_params *sp) {
    const vks_model_config *cf = &g->o->model->cfg;
    const vks_rl_config *c = g->o->config;
    if (m->n < 1 || m->n > c->prompts_per_step * c->group_size || m->steps < 1 || m->steps > cf->seq_len || m->stop_a < -1 ||
        m->stop_a >= cf->vocab_size || m->stop_b < -1 || m->stop_b >= cf->vocab_size || m->top_k > (uint32_t)cf->vocab_size ||
        !(m->temperature >= 0 && m->temperature <= 100) || !(m->top_p > 0 && m->top_p <= 1) || (uint32_t)m->toploc > 1)
        return vks_set_error(VKS_ERR_FORMAT, "rank %d (the group's first stage) sent a malformed run (batch %lld)",
                             stage_name(g, 0), (long long)m->batch);
    if (!policy || m->step != held)
        return vks_set_error(VKS_ERR_FORMAT, "rank %d (the group's first stage) asked for policy step %lld; this stage "
                             "holds %lld", stage_name(g, 0), (long long)m->step, (long long)held);
    *sp = (vks_sched_params){.steps = m->steps, .temperature = m->temperature, .top_p = m->top_p, .top_k = m->top_k,
                             .seed = m->seed, .stop_token_a = m->stop_a, .stop_token_b = m->stop_b};
    return VKS_OK;
}

/* A batch a stage runs on its own thread, so that its main thread can take
 * part in weight broadcasts meanwhile. */
typedef struct {
    vks_rl_pipe_group *g;
    const vks_model *policy;
    const vks_lora_adapter *lora;
    int64_t step;
    vks_pipeline_options po;
    int n;
} stage_run;

static int stage_run_job(void *arg) {
    stage_run *r = arg;
    vks_pipeline_stats st;
    int rc = stage_engine(r->g, r->policy, r->lora, r->step, &r->po);
    if (!rc) rc = vks_pipeline_run(r->g->pipe, r->g->o->infer_gpu, r->policy, &r->po, NULL, r->n, &st);
    return rc;
}

typedef struct {
    vks_rl_pipe_group *g;
    vks_rl_cast cast;
    const vks_param_layout *layout;
    vks_model *policy;       /* the newest weights (not replaced while a batch runs; LoRA: the base, borrowed) */
    vks_lora_adapter *adapter; /* LoRA: the newest adapter (not replaced while a batch runs) */
    int64_t held;
    float *pending;          /* weights received while a batch ran */
    vks_lora_adapter *pending_adapter; /* LoRA: the adapter instead */
    int64_t pending_step;
    bool lost;               /* a joined group's relay failed within a message: no MPI_Finalize */
} stage_state;

/* A joined group's stage: the next chunk of the first stage's relay, of at
 * most `most` bytes, into buf (bounded: a first stage that dies within it
 * leaves a receive waiting; then the buffer stays MPI's: *leak). */
static int relay_chunk(stage_state *s, char *buf, size_t most, size_t *got, bool *leak) {
    vks_rl_pipe_group *g = s->g;
    vks_mpi_clock clock = {0};
    double t0 = vks_mpi_deadline_tick(&clock, g->mo->timeout_s);
    int flag = 0, count = 0, from = stage_name(g, 0);
    MPI_Status st;
    while (!flag) {
        if (MPI_Iprobe(0, TAG_GROUP_WEIGHTS, g->ctl, &flag, &st) != MPI_SUCCESS)
            return vks_set_error(VKS_ERR_IO, "the connection to the group's first stage failed");
        if (!flag && vks_mpi_deadline_tick(&clock, g->mo->timeout_s) - t0 > g->mo->timeout_s)
            return vks_set_error(VKS_ERR_TIMEOUT, "the group's first stage stopped within the weights (%.1f s)",
                                 g->mo->timeout_s);
        if (!flag) usleep(500);
    }
    MPI_Get_count(&st, MPI_BYTE, &count);
    if (count <= 0 || (size_t)count > most || (size_t)count > VKS_RL_JOIN_CHUNK)
        return vks_set_error(VKS_ERR_FORMAT, "the group's first stage sent a weights chunk of %d bytes (at most %zu)", count,
                             most);
    MPI_Request req;
    if (MPI_Irecv(buf, count, MPI_BYTE, 0, TAG_GROUP_WEIGHTS, g->ctl, &req) != MPI_SUCCESS)
        return vks_set_error(VKS_ERR_IO, "the connection to the group's first stage failed");
    if (vks_mpi_wait_within(g->ctl, &req, &from, 1, g->mo->timeout_s, "the weights")) {
        *leak = true;
        return VKS_ERR_TIMEOUT;
    }
    *got = (size_t)count;
    return VKS_OK;
}

/* A joined group's stage: the WEIGHTS stream the first stage passes on,
 * whole and checked, becomes the pending weights. Any failure ends the
 * stage (the first stage sent it something wrong, or is gone). */
static int relay_receive(stage_state *s) {
    size_t want = sizeof(vks_rl_msg) + sizeof(float) * s->layout->n_values, at = 0;
    char *buf = malloc(want);
    if (!buf) return vks_set_error(VKS_ERR_NOMEM, "out of host memory for the weights");
    bool leak = false;
    int rc = VKS_OK;
    while (!rc && at < want) {
        size_t got = 0;
        rc = relay_chunk(s, buf + at, want - at, &got, &leak);
        at += got;
    }
    int64_t step = 0;
    if (!rc) { /* its header as the first stage checked it (that stage held it to the step announced) */
        vks_rl_msg h;
        memcpy(&h, buf, sizeof h);
        rc = vks_rl_wire_check_weights(buf, want, s->layout->n_values, s->pending_step, h.step, &step);
        if (rc) rc = vks_error_prefix(rc, "the group's first stage passed on");
    }
    if (rc) {
        s->lost = true;
        if (!leak) free(buf); /* else MPI may still write it: left (the stage ends) */
        return group_error(s->g, rc, "the weights from the first stage");
    }
    free(s->pending);
    s->pending = (float *)(void *)buf, s->pending_step = step;
    return VKS_OK;
}

/* Weights on their way to this stage: a broadcast waiting, or a joined group's relay. */
static bool weights_waiting(stage_state *s) {
    if (!s->g->joined) return vks_rl_cast_waiting(&s->cast);
    int flag = 0;
    return MPI_Iprobe(0, TAG_GROUP_WEIGHTS, s->g->ctl, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag;
}

/* Takes part in the waiting broadcast (or takes the relay); the weights
 * become pending. A failed broadcast is logged, not fatal (the trainer drops
 * a rank that missed weights); a failed relay ends the stage. */
static int stage_broadcast(stage_state *s) {
    if (s->g->joined) return relay_receive(s);
    float *msg = NULL;
    vks_lora_adapter *a = NULL;
    int64_t step = 0;
    int rc = s->cast.lora_base ? vks_rl_cast_receive_adapter(&s->cast, &a, &step) : vks_rl_cast_receive(&s->cast, &msg, &step);
    if (rc) {
        fprintf(stderr, "vkswarm: rl: inference rank %d (a stage of group %d): the weights broadcast failed: %s\n",
                s->cast.me, s->g->index, vks_last_error());
        return VKS_OK;
    }
    free(s->pending);
    vks_lora_adapter_free(s->pending_adapter);
    s->pending = msg, s->pending_adapter = a, s->pending_step = step;
    return VKS_OK;
}

/* The pending weights become the policy (never while a batch runs). */
static int stage_take_weights(stage_state *s) {
    if (s->pending_adapter) { /* LoRA: the base stays */
        vks_lora_adapter_free(s->adapter);
        s->adapter = s->pending_adapter, s->pending_adapter = NULL;
        s->policy = (vks_model *)(uintptr_t)s->g->o->model;
        s->held = s->pending_step;
        return VKS_OK;
    }
    if (!s->pending) return VKS_OK;
    vks_model *m = NULL;
    int rc = vks_rl_wire_model_from_block(s->g->o->model, s->layout, s->pending, &m);
    free(s->pending);
    s->pending = NULL;
    if (rc) return rc;
    vks_model_free(s->policy);
    s->policy = m, s->held = s->pending_step;
    return VKS_OK;
}

/* A RUN for policy step `step`: the broadcast of that step may still be on
 * its way here (the first stage took its part sooner); waits for it, bounded. */
static int stage_wait_policy(stage_state *s, int64_t step) {
    vks_mpi_clock clock = {0};
    double t0 = vks_mpi_deadline_tick(&clock, s->g->mo->timeout_s);
    for (;;) {
        int rc = stage_take_weights(s);
        if (rc || s->held >= step) return rc;
        if (vks_mpi_deadline_tick(&clock, s->g->mo->timeout_s) - t0 > s->g->mo->timeout_s)
            return vks_set_error(VKS_ERR_TIMEOUT, "the weights of policy step %lld did not arrive within %.1f s (this "
                                 "stage holds %lld)", (long long)step, s->g->mo->timeout_s, (long long)s->held);
        if (weights_waiting(s)) {
            if ((rc = stage_broadcast(s))) return rc;
        } else usleep(1000);
    }
}

/* While a batch runs: joins a waiting broadcast. */
static int stage_meanwhile(void *ctx) {
    stage_state *s = ctx;
    return weights_waiting(s) ? stage_broadcast(s) : VKS_OK;
}

typedef struct {
    vks_rl_pipe_group *g;
    uint64_t want;
} stage_reform_arg;

/* Runs batch m on a thread while the main thread joins broadcasts. */
static int stage_run_batch(stage_state *s, const group_msg *m, bool *no_finalize) {
    vks_sched_params sp;
    int rc = stage_wait_policy(s, m->step);
    if (!rc) rc = check_run(s->g, m, s->policy, s->held, &sp);
    if (rc) return rc;
    stage_run r = {.g = s->g, .policy = s->policy, .lora = s->adapter, .step = s->held, .po = pipe_options(s->g, &sp, m->toploc != 0),
                   .n = m->n};
    rc = vks_mpi_run_beside(stage_run_job, &r, stage_meanwhile, s, "the pipeline");
    if (!rc) return VKS_OK;
    *no_finalize = true; /* the others may still wait on this stage */
    return group_error(s->g, rc, "the pipeline");
}

static int reform_job(void *arg) {
    stage_reform_arg *a = arg;
    return apply_reform(a->g, a->want);
}

/* REFORM: the group goes on without the stages in m->out (checked: stages
 * after the first, a superset of those left out before, not this one, at
 * least two left), re-formed on a thread while broadcasts go on. */
static int stage_reform(stage_state *s, const group_msg *m, bool *no_finalize) {
    vks_rl_pipe_group *g = s->g;
    uint64_t all = g->cfg_n >= VKS_RL_GROUP_MAX_REFORM ? ~(uint64_t)0 : ((uint64_t)1 << g->cfg_n) - 1;
    int left = 0;
    for (int cs = 0; cs < g->cfg_n; cs++) left += !in_mask(m->out, cs);
    if ((m->out & 1) || (m->out & ~all) || (m->out & g->out) != g->out || m->out == g->out ||
        in_mask(m->out, g->cfg_stage) || left < 2)
        return vks_set_error(VKS_ERR_FORMAT, "rank %d (the group's first stage) sent a malformed re-forming (%#llx)",
                             stage_name(g, 0), (unsigned long long)m->out);
    stage_reform_arg a = {.g = g, .want = m->out};
    int rc = vks_mpi_run_beside(reform_job, &a, stage_meanwhile, s, "re-forming the group");
    if (rc) {
        *no_finalize = true;
        return group_error(g, rc, "re-forming without a refused stage");
    }
    return VKS_OK;
}

/* One control message from the first stage (probed: st): a run, stop or re-forming. */
static int stage_message(stage_state *s, const MPI_Status *st, bool *stop, bool *no_finalize) {
    vks_rl_pipe_group *g = s->g;
    int count = 0;
    MPI_Get_count(st, MPI_BYTE, &count);
    group_msg m;
    if (st->MPI_TAG != TAG_CTL || count != (int)sizeof m)
        return vks_set_error(VKS_ERR_FORMAT, "rank %d (the group's first stage) sent %d bytes under tag %d", stage_name(g, 0),
                             count, st->MPI_TAG);
    MPI_Recv(&m, sizeof m, MPI_BYTE, 0, TAG_CTL, g->ctl, MPI_STATUS_IGNORE);
    if (m.magic != VKS_RL_MAGIC || (m.type != GROUP_RUN && m.type != GROUP_STOP && m.type != GROUP_REFORM))
        return vks_set_error(VKS_ERR_FORMAT, "rank %d (the group's first stage) sent a malformed message", stage_name(g, 0));
    if (m.type == GROUP_STOP) {
        *stop = true, *no_finalize = m.lost != 0;
        return VKS_OK;
    }
    if (m.type == GROUP_REFORM) return stage_reform(s, &m, no_finalize);
    return stage_run_batch(s, &m, no_finalize);
}

int vks_rl_group_stage(vks_rl_pipe_group *g, bool *no_finalize) {
    *no_finalize = false;
    vks_param_layout *layout = NULL;
    stage_state s = {.g = g, .held = -1, .pending_step = -1};
    bool stop = false;
    /* the first stage says nothing while the trainer trains a step: the same bound as its own */
    double bound = g->mo->trainer_timeout_s > g->mo->timeout_s ? g->mo->trainer_timeout_s : g->mo->timeout_s;
    int rc = vks_param_layout_create(&g->o->model->cfg, vks_model_has_bias(g->o->model), &layout);
    s.layout = layout;
    const char *out = g->o->config->out; /* where the weight store goes (OUT/weights-rankR) */
    if (!rc && mkdir(out, 0777) && errno != EEXIST) rc = vks_set_error(VKS_ERR_IO, "%s: cannot create the directory", out);
    if (!rc && !g->joined) rc = vks_rl_cast_open(&s.cast, g->o, g->mo, layout->n_values, bound, NULL);
    vks_mpi_clock clock = {0};
    double heard = vks_mpi_deadline_tick(&clock, bound);
    while (!rc && !stop) {
        if (weights_waiting(&s)) {
            rc = stage_broadcast(&s);
            heard = vks_mpi_deadline_tick(&clock, bound);
            continue;
        }
        int flag = 0;
        MPI_Status st;
        if (MPI_Iprobe(0, TAG_CTL, g->ctl, &flag, &st) != MPI_SUCCESS) flag = 0;
        double now = vks_mpi_deadline_tick(&clock, bound);
        if (flag) {
            rc = stage_message(&s, &st, &stop, no_finalize);
            heard = vks_mpi_deadline_tick(&clock, bound);
        } else if (now - heard > bound) {
            rc = vks_set_error(VKS_ERR_TIMEOUT, "rank %d (the group's first stage) did not answer within %.1f s",
                               stage_name(g, 0), bound);
            *no_finalize = true;
        } else {
            usleep(1000);
        }
    }
    if (s.lost) *no_finalize = true;
    vks_rl_cast_close(&s.cast);
    free(s.pending);
    vks_lora_adapter_free(s.pending_adapter);
    if (!s.adapter) vks_model_free(s.policy); /* LoRA: the base, borrowed */
    vks_lora_adapter_free(s.adapter);
    vks_param_layout_free(layout);
    return rc;
}
