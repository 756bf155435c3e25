/* The GPU worker of a pipeline rank: a thread that runs forward passes for
 * jobs handed over by the MPI (main) thread and hands back outgoing messages.
 * It never calls MPI. */
#ifndef VKS_PIPELINE_WORKER_H
#define VKS_PIPELINE_WORKER_H
#include <pthread.h>
#include "protocol.h"
#include "vkswarm/vks_engine.h"
#include "vkswarm/vks_toploc.h"

typedef struct vks_job {
    struct vks_job *next;
    uint32_t mb;
    /* input: stage 0 uses step; other stages an ACT message (owned) */
    const vks_step *step;
    void *in;
    /* output: ACT for the next stage or TOKENS for rank 0 (owned, malloc'd) */
    void *out;
    size_t out_bytes;
    int rc;
    char err[256];
    double gpu_s;
} vks_job;

typedef struct {
    vks_engine *engine;
    const vks_sched_params *sched; /* sampling parameters (last stage) */
    int wire;
    bool first_stage, last_stage;
    vks_toploc_builder *builder; /* last stage with TOPLOC: committed rows go here */
    vks_toploc_builder *stage_builder; /* other stages with stage proofs: the sampling rows they send */
    double commit_s;             /* time spent handing rows to stage_builder (this thread) */
#ifdef VKS_TEST_FAULTS
    int fault;                   /* pipeline_fault.h: this stage cheats (test builds only) */
    uint64_t fault_rng;
    bool fault_one_layer;        /* the stage holds one layer */
#endif
    float *logp_by_pos;          /* last stage recording log-probabilities: [seqs, steps], else NULL */
    int logp_seqs, logp_steps;
    float *step_logp;            /* with logp_by_pos: the sampled tokens' logp (computed on the device) */
    /* scratch sized for the largest message */
    float *x_in, *x_out;
    uint32_t *slot, *pos, *out_rows;
    vks_gpu_sample_row *sample;
    int32_t *sampled;
    float *hidden;
    /* queues */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    vks_job *todo, *done;
    bool stop;
} vks_worker;

int vks_worker_start(vks_worker *w, vks_engine *e, const vks_sched_params *sched, int wire, bool first_stage,
                     bool last_stage);
void vks_worker_stop(vks_worker *w);
void vks_worker_submit(vks_worker *w, vks_job *j);
/* Returns a finished job or NULL. */
vks_job *vks_worker_take_done(vks_worker *w);
void vks_job_free(vks_job *j);
#endif
