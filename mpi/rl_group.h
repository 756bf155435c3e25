/* rl_group.h: an RL inference group of S > 1 ranks, a pipeline (mpi/rl_group.c).
 * Internal to mpi/.
 *
 * The group's first rank (stage 0) is the one the trainer sees: it takes
 * grants, beats, scores and sends the groups, exactly as an inference rank of
 * its own (rl_inference.c). Only its generation differs: its generation thread
 * asks the other stages to run the batch and runs vks_pipeline_run with them
 * (layers split evenly, TOPLOC proofs and the sampled tokens'
 * log-probabilities made on the last stage). Every stage receives the
 * weights through Shardcast (rl_cast.h) as any inference rank does; otherwise
 * the other stages hear only from the first one, on the group's own
 * communicator:
 *   TAG_CTL      RUN (batch, policy step, sampler parameters, sequences) or
 *                STOP (lost = 1: the run lost ranks, no MPI_Finalize)
 *   TAG_GROUP_WEIGHTS  a group that joined the run (mpirun -np S vkswarm join):
 *                the trainer streams the weights to its first stage only,
 *                which passes each whole WEIGHTS stream on (header and
 *                floats, in chunks of at most VKS_RL_JOIN_CHUNK bytes)
 * A stage runs each batch on a thread while its main thread takes part in
 * broadcasts (a broadcast must not wait for a batch to end).
 * A stage that dies fails the first stage's pipeline run (bounded by
 * timeout_s), which ends that rank: the trainer drops the whole group for
 * its silence and grants its batch again. A stage a verifier names (its
 * commitment failed) is refused by the trainer, which tells the first rank
 * to leave it out (REFORM): before its next batch the first stage says STOP
 * to that stage and REFORM to the others, and the rest make new
 * communicators without it (MPI_Comm_create_group over the old pipeline
 * communicator: collective over the remaining ranks only) and split the
 * layers evenly again; every stage holds the whole model's weights, so no
 * weights move. MPI must be MPI_THREAD_MULTIPLE
 * (the first stage's main thread beats while its generation thread runs the
 * pipeline). */
#ifndef VKS_RL_GROUP_H
#define VKS_RL_GROUP_H
#include <stdatomic.h>
#include "rl_wire.h"
#include "vkswarm/vks_rl_mpi.h"

enum { VKS_RL_GROUP_MAX_REFORM = 64 }; /* stages of a config group a re-forming can leave out (bits of a mask) */

typedef struct {
    MPI_Comm pipe, ctl;     /* the pipeline's communicator (stage s = rank s) and the RUN/STOP one */
    int index, n, stage;    /* the group in config->groups, its ranks S now, this rank's stage now */
    const int *ranks;       /* the stages' world ranks now, in order (own_ranks) */
    int *first;             /* the layer partition: first[s], first[n] = n_layers */
    const int *cfg_ranks;   /* the group as configured: cfg_n world ranks; this rank is cfg_stage */
    int cfg_n, cfg_stage;
    int *own_ranks;         /* ranks' storage */
    uint64_t out;           /* configured stages left out (bit s), applied */
    _Atomic uint64_t want_out; /* the first stage: what the trainer asked to leave out (set by its main thread) */
    MPI_Comm *retired;      /* communicators of earlier forms (freed with the group) */
    int n_retired;
    const vks_rl_run_options *o;
    const vks_rl_mpi_options *mo;
    vks_engine *engine;     /* this stage's, for the policy of engine_step (kept across its batches) */
    int64_t engine_step;
    int joined;             /* > 0: a group that joined the run (rl_join.h) as this rank number: its comms are
                             * over its own mpirun's world, every stage is named by that number, and the
                             * other stages take the weights from the first (relay) instead of Shardcast */
    int *names;             /* joined: each stage's name in proofs and messages (the rank number) */
} vks_rl_pipe_group;

/* This rank's group of more than one rank: *index and *stage, or *index = -1. */
void vks_rl_group_find(const vks_rl_config *c, int rank, int *index, int *stage);
/* Forms group `index`'s communicators; every stage must answer within
 * timeout_s (MPI_Comm_create_group blocks: it only starts once all have). */
int vks_rl_group_open(vks_rl_pipe_group *g, const vks_rl_run_options *o, const vks_rl_mpi_options *mo, int index, int stage);
/* A group that joined the run as rank number `number`: the S ranks of this
 * process's own MPI world (its mpirun -np S), stage = its world rank. */
int vks_rl_group_open_joined(vks_rl_pipe_group *g, const vks_rl_run_options *o, const vks_rl_mpi_options *mo,
                             int number);
/* A joined group's first stage: the WEIGHTS stream it received whole from the
 * trainer (header and floats, `bytes`) goes on to the other stages, in
 * chunks, bounded. On a timeout *leak is set: the buffer stays MPI's. */
int vks_rl_group_relay_weights(vks_rl_pipe_group *g, const void *stream, size_t bytes, bool *leak);
/* Frees what open made; the communicators only when finalize (after a
 * failure a peer may still use them). */
void vks_rl_group_close(vks_rl_pipe_group *g, bool finalize);
/* The first stage's main thread, on the trainer's REFORM: world rank `rank`
 * (a later stage of the group, still in it) is to be left out from the next
 * batch on. VKS_ERR_FORMAT: not such a rank, or fewer than two would be left. */
int vks_rl_group_exclude(vks_rl_pipe_group *g, int rank);
/* vks_rl_gen.generate for the first stage (ctx: the vks_rl_pipe_group); it
 * re-forms the group first when stages were left out since the last batch. */
int vks_rl_group_generate(void *ctx, const vks_rl_gen *gen, const vks_sched_params *sp, vks_sequence *seqs, int n,
                          bool toploc);
/* The first stage: tells the other stages to stop (bounded; lost: no MPI_Finalize). */
void vks_rl_group_stop(vks_rl_pipe_group *g, bool lost);
/* Any other stage: joins the run's weights broadcast and runs what the first
 * stage asks until it says stop. *no_finalize: it said ranks were lost, or
 * this stage failed or gave up. */
int vks_rl_group_stage(vks_rl_pipe_group *g, bool *no_finalize);
#endif
