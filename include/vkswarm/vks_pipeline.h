/* vks_pipeline.h: pipeline-parallel generation across MPI ranks. Rank s holds
 * layers [first[s], first[s+1]); rank 0 also the embedding and the schedule,
 * the last rank the head and the sampler. K micro-batches circulate in a ring
 * (the last stage sends sampled tokens back to rank 0). MPI calls happen on
 * the calling (main) thread only; the GPU runs on a worker thread, so
 * transfers progress while it computes. */
#ifndef VKS_PIPELINE_H
#define VKS_PIPELINE_H
#include <mpi.h>
#include "vks_link.h"
#include "vks_engine.h"

/* Tags of the start-up and finish exchanges (vks_mpi_exchange, bounded by
 * --timeout-s); the command's own (seed and prompt count, measurements) too. */
/* (100 is vks_mpi_check_ranks' tag, VKS_MPI_TAG_CHECK_RANKS.) */
enum { VKS_TAG_SHARED = 101, VKS_TAG_MEASURE = 102, VKS_TAG_ENGINE = 103,
       VKS_TAG_READY = 104, VKS_TAG_FINISH = 105 };
/* How activations cross a link. */
enum { VKS_WIRE_F32 = 0, VKS_WIRE_F16 = 1 };

typedef struct {
    int micro_batches;       /* K */
    int batch;               /* sequences per micro-batch */
    int chunk;               /* rows per prefill step */
    vks_sched_params sched;  /* steps, sampling, stop tokens */
    int wire;                /* VKS_WIRE_F32 or VKS_WIRE_F16 */
    vks_link_options link;   /* emulated latency / bandwidth */
    double timeout_s;        /* silence after which a rank counts as lost; bounds every wait */
    const int *first;        /* partition: first[s], first[size] = n_layers */
    vks_engine_options engine; /* weight types and math: .dtype, .keep_file_dtype, .f32_math (rollouts:
                                verifiers recompute in f32); the layer range and sizes are the pipeline's */
    bool toploc;             /* the last stage builds TOPLOC proofs and sends them to rank 0 */
    /* With toploc: every other stage commits the activations it hands on (TOPLOC
     * chunk proofs of its output rows at the sampling positions, as sent), and
     * rank 0's sequences get them in vks_sequence.stage_proofs, one per stage
     * 0..S-2, named stage_ranks[s] (NULL: the stage's rank in comm). Messages
     * name stage s as rank stage_ranks[s] too (a world rank; S entries). */
    bool stage_proofs;
    const int *stage_ranks;
    /* This rank's engine, made by the caller with vks_pipeline_engine_options
     * (or larger sizes) and kept across runs (weights and pipelines are not
     * made again per run); NULL: the run makes its own and destroys it. */
    vks_engine *keep_engine;
    /* A LoRA adapter for the model (NULL: none): an engine the run makes gets
     * the adapter's matrices of its own layers (vks_engine_set_lora); a kept
     * engine holds whatever its caller set. */
    const vks_lora_adapter *lora;
    bool record_logp;        /* the last stage records each sampled token's log-probability (as
                                vks_generate_options.record_logp: temperature 1, before top-k/top-p);
                                rank 0's sequences get them in vks_sequence.logp */
} vks_pipeline_options;

typedef struct {
    long steps;              /* forward passes run by this rank */
    double wall_s, gpu_busy_s;
    double commit_s;         /* of gpu_busy_s: handing the sent rows to the stage-commitment builder */
    double commit_build_s;   /* the stage-commitment builder thread's time making proofs */
    uint64_t bytes_sent;
    bool ended_together;     /* after an error: every rank failed at the same point (an engine could not be
                                created), so the job can end with MPI_Finalize rather than MPI_Abort */
} vks_pipeline_stats;

/* Runs the whole job. Every rank passes the number of prompts; rank 0 also the
 * prompts, and gets the finished sequences back in place (with their proofs
 * when o->toploc); other ranks pass NULL. Errors are returned, never acted on:
 * the message starts with this rank ("rank R: ..."), and the code says what
 * happened: VKS_ERR_TIMEOUT a rank went silent (named), VKS_ERR_FORMAT another
 * rank sent a bad message or a prompt was refused, others a local failure.
 * Everything the run allocated is freed; unless stats->ended_together, other
 * ranks may still be waiting on this one, so the caller must end the job
 * (MPI_Abort) rather than MPI_Finalize. */
int vks_pipeline_run(MPI_Comm comm, vks_gpu *g, const vks_model *m, const vks_pipeline_options *o,
                     vks_sequence *prompts, int n_prompts, vks_pipeline_stats *stats);

/* The engine options a run with o needs on stage `rank` (its layer range and
 * sizes; kv_len = o->sched.steps). */
vks_engine_options vks_pipeline_engine_options(const vks_pipeline_options *o, int rank);

/* What rank 0 tells every rank before the run: the sampling seed, the
 * number of prompts and the stop tokens (rank 0 knows the tokenizer). */
typedef struct {
    uint64_t seed;
    int n_prompts;
    int stop_token_a, stop_token_b; /* -1: none */
} vks_pipeline_job;
/* Every rank calls it; rank 0's *job reaches all (bounded by timeout_s:
 * VKS_ERR_TIMEOUT names a silent rank, and the caller must end the job).
 * A count or token outside int range from rank 0 is VKS_ERR_FORMAT. */
int vks_pipeline_share_job(MPI_Comm comm, vks_pipeline_job *job, double timeout_s);

#endif
