/* rl_orch.h: the orchestration state of the RL run across ranks (grants,
 * the checks of what comes back, the queue and async window, liveness, the
 * batches to grant again, the STOPs at the end), shared by the trainer rank
 * when it orchestrates (rl_roles.c) and by an orchestrator on a rank of its
 * own (rl_orchestrator.c). Internal to mpi/. */
#ifndef VKS_RL_ORCH_H
#define VKS_RL_ORCH_H
#include <stdbool.h>
#include <stdint.h>
#include "vkswarm/vks_rl_roles.h"
#include "vkswarm/vks_rl_bans.h"
#include "vkswarm/vks_rl_mpi.h"
#include "rl_cast.h"
#include "rl_wire.h"

enum { RANK_LIVE = VKS_RL_RANK_LIVE, RANK_DROPPED = VKS_RL_RANK_DROPPED, RANK_REFUSED = VKS_RL_RANK_REFUSED,
       RANK_JOINING = 3 /* connected through the join point, its HELLO not yet checked */ };

/* An inference or verifier rank, as the trainer sees it. */
typedef struct {
    int rank, state;      /* rank: its world rank; a joined rank: numbered after the world's */
    bool verifier;
    bool joined;          /* it came through the join point (rl_join.h): reached over its own connection */
    MPI_Comm comm;        /* where it is reached: the world, or its connection (there it is rank 0) */
    int peer;             /* its rank in comm */
    MPI_Request welcome;  /* joined: the WELCOME on its way */
    struct joined_weights *sending; /* joined: the weights on their way to it, wat bytes of them sent; the
                          * chunk in stage (wreq) since wsince */
    size_t wat;
    char *stage;
    MPI_Request wreq;
    double wsince;
    MPI_Request rreq;     /* joined: a message on its way in (TAG_UP or TAG_VERIFY: rtag) since rsince, into
                          * rbuf (after rfront bytes of room), rcount bytes. Taken in the round it completes:
                          * a slow uplink never holds the trainer */
    char *rbuf;
    int rcount, rtag;
    size_t rfront;
    double rsince;
    int64_t rnewest;      /* the newest published step when it started */
    double connected_at;  /* joined: when its connection was taken */
    int64_t wstep;        /* joined: the newest step it was sent (or is being sent); -1: none */
    uint8_t nonce[16];    /* joined: what its hello must sign */
    uint8_t key[32];      /* joined: its identity (Ed25519 public key), from its hello */
    bool banned;          /* joined: refused for what it sent: its key may not join again */
    bool admitted;        /* joined: its hello was accepted */
    int ident;            /* joined and admitted: its key's entry in trainer_src.idents */
    int64_t batch;        /* inference: the batch it generates, -1: idle */
    int64_t min_step;     /* its policy step at least */
    double last_seen;
    uint64_t out;         /* a pipeline group's first rank: its configured stages refused (bit s) */
    int64_t form;         /* how often that group was re-formed (grants made since carry it) */
    /* what the report and the summary show (vks_rl_rank_status) */
    int64_t batches, rollouts, rejected; /* inference: its batches queued; verifier: batches it verified */
    int64_t at_step;      /* dropped or refused: the newest published step then */
    char why[320];        /* dropped or refused: why */
} inf_rank;

/* A key admitted to the run (vkswarm join), over all its joins: its batches taken and refused. */
struct joined_identity {
    uint8_t key[32];
    int64_t accepted, rejected;
};

/* With verifier ranks: a batch granted and not yet back from its verifier. */
typedef struct {
    int64_t batch, min_step;
    int origin, verifier; /* ranks */
    int64_t form;         /* the origin's form when granted */
} pending_batch;

typedef struct {
    MPI_Comm comm;
    const vks_rl_run_options *o;
    const vks_rl_mpi_options *mo;
    const vks_rl_config *c;
    vks_param_layout *layout;
    inf_rank *ranks;      /* the inference ranks, then the verifier ranks */
    int n_ranks;
    int64_t next_batch, newest;
    bool published;            /* the trainer: weights of step `newest` are in t->weights (LoRA: its adapter in
                                * t->adapter_file; step 0 included) */
    int grant_from;       /* the rank (index) the next grant looks at first: round robin */
    int verifier_from;    /* the same for choosing a verifier */
    int64_t *redo;        /* batches of dropped ranks, to grant again */
    int n_redo, cap_redo;
    pending_batch *pend;  /* with verifier ranks: batches out (generating or being verified) */
    int n_pend, cap_pend;
    struct forwarded { MPI_Request req; char *buf; } *fwd; /* joined ranks' batches on their way to a verifier */
    int n_fwd, cap_fwd;
    vks_rl_queue queue;
    vks_rl_cast cast;     /* the weights go out through Shardcast */
    float *weights;       /* the WEIGHTS file of the step being published */
    uint8_t *adapter_file; /* LoRA: the GGUF adapter of step `newest`, kept for joined ranks (NULL: none yet) */
    size_t adapter_bytes;
    uint64_t cast_bytes;  /* wire bytes of the last publish */
    MPI_Request *stop_req; /* per world rank: STOP to a rank dropped for a failed broadcast (stop_now) */
    vks_rl_msg *stop_msg;  /* their buffers (MPI may read them until the send completes) */
    int n_world;
    bool lost;
    vks_rl_gen gen;       /* the tasks, to check prompts and rewards (model: the start policy, not owned) */
    /* the orchestrator on a rank of its own (rl_orchestrator.c) */
    int orch;             /* on the trainer: the orchestrator's rank; -1: the trainer orchestrates */
    bool remote;          /* on the orchestrator: the trainer is elsewhere (it owns the broadcasts) */
    int *drops;           /* remote: ranks to leave out of later broadcasts, for the trainer's next reply */
    int n_drops, cap_drops;
    /* joins (rl_join.h): the join point, what every joiner is sent first, ranks joined so far */
    struct vks_rl_join_point *join;
    struct joined_weights *jw; /* the newest weights for joined ranks (refcounted: sends share it) */
    char *welcome;
    size_t welcome_bytes;
    int n_joined, cap_ranks;
    bool stopping;           /* the run ends: no more weights to joined ranks */
    vks_rl_ban *bans; /* keys refused for what they sent, with why */
    int n_bans;
    struct joined_identity *idents; /* every key admitted so far: its batches (vks_rl_pool) */
    int n_idents, cap_idents;
    int64_t joins, leaves, banned; /* since this process started */
    double alone_since;      /* joins open and no inference rank left: since when (0: there is one) */
    bool had_inference;      /* an inference rank was live once (a trainer alone has none until the first joins) */
} trainer_src;

/* Opens the orchestration state for this rank's role: the ranks, the queue,
 * the parameter layout, the tasks, and the weights broadcast (collective over
 * the world); `origin`: this rank is the trainer (it gets the buffer of the
 * WEIGHTS file). On failure *t is still closable. */
int vks_rl_orch_open(trainer_src *t, const vks_rl_run_options *o, const vks_rl_mpi_options *mo, bool origin);
void vks_rl_orch_close(trainer_src *t);
/* One round of orchestration: every queued TAG_UP message received and
 * checked, silent ranks dropped, idle ranks granted (scratch: prompts_per_step
 * groups). An error: no inference rank left, or the queue's own error. */
int vks_rl_orch_round(trainer_src *t, vks_rl_batch_group *scratch);
/* World rank `rank` did not take the weights of `step`: dropped (with its
 * pipeline group; refused, with its reason, when it refused them), told to
 * stop when alive, left out of later broadcasts. */
void vks_rl_orch_failed_rank(trainer_src *t, int rank, int64_t step);
/* Trainer, after a broadcast: VKS_ERR_PEER when world rank `rank` refused
 * the weights (or adapter) of `step` and mpirun has no --enable-recovery
 * (the rank would leave without MPI_Finalize, and mpirun end the job
 * unasked): the run stops, naming the rank and its reason. */
int vks_rl_orch_refused(const trainer_src *t, int rank, int64_t step);
/* Leaves `rank` out of later broadcasts (remote: noted for the trainer). */
void vks_rl_orch_cast_drop(trainer_src *t, int rank);
/* Trainer: the weights of `step` through Shardcast (m is freed); failed ranks
 * are left to the caller (vks_rl_cast_failed). */
int vks_rl_orch_cast_weights(trainer_src *t, vks_model *m, int64_t step);
/* LoRA: the same with the adapter of `step` (a is freed). */
int vks_rl_orch_cast_adapter(trainer_src *t, vks_lora_adapter *a, int64_t step);
/* The inference and verifier ranks as counted (at most cap into out); how many. */
int vks_rl_orch_ranks(const trainer_src *t, vks_rl_rank_status *out, int cap);
/* For the status line (vks_rl_status_poll): "in flight: rank 1 1 batch, rank 2
 * 0 batches; waiting for verifier rank 3 (1 batch)". */
void vks_rl_orch_in_flight(const trainer_src *t, char *out, size_t cap);
/* Says STOP to every rank still there (n = t->lost) and frees the STOPs sent early. */
void vks_rl_orch_stop_ranks(trainer_src *t);
/* Leaves rank r out of the run (state: RANK_DROPPED or RANK_REFUSED, with
 * why); a joined one is told why, and one refused for what it sent is
 * banned; gone: it leaves without MPI_Finalize. */
void vks_rl_orch_leave(trainer_src *t, inf_rank *r, int state, const char *why, bool gone);

/* ---- joins, the trainer's side (rl_trainer_join.c) ---- */
/* The join point and the WELCOME (the config, the task file; a resumed run's bans loaded). */
int vks_rl_orch_open_joins(trainer_src *t);
/* Connections taken at the join point become joining ranks (sent WELCOME and NONCE). */
int vks_rl_orch_take_joins(trainer_src *t);
/* A joining rank's HELLO: admitted (ADMIT, then the newest weights) or refused, told why. */
void vks_rl_orch_admit(trainer_src *t, inf_rank *r, const char *buf, size_t bytes);
/* Moves the weights on their way to joined ranks along (a chunk at a time;
 * one not taken within timeout_s drops its rank) and starts the newest. */
int vks_rl_orch_joined_weights(trainer_src *t);
/* Before the STOPs: the chunks in flight arrive (bounded by timeout_s); no new ones go out. */
void vks_rl_orch_finish_joined_sends(trainer_src *t);
/* Tells joined rank r why it leaves (NOT_ADMITTED; a bounded send). */
void vks_rl_orch_tell_joined(trainer_src *t, inf_rank *r, int state, const char *why);
/* Bans r's key for the run (kept in OUT/bans.jsonl). */
void vks_rl_orch_ban(trainer_src *t, inf_rank *r, const char *why);
/* vks_rl_source.pool: the joins so far, per identity. */
bool vks_rl_orch_pool(void *ctx, vks_rl_pool *out);
/* Frees what the joins hold (but buffers MPI may still read). */
void vks_rl_orch_close_joins(trainer_src *t);

/* "the trainer", or "the orchestrator" when it has a rank of its own: whom
 * inference, verifier and relay ranks hear from (grants, STOP). */
const char *vks_rl_mpi_peer_name(const vks_rl_config *c);
/* The trainer when the orchestrator is on another rank (rl_orchestrator.c). */
int vks_rl_orch_trainer(const vks_rl_run_options *o, const vks_rl_mpi_options *mo, vks_rl_result *res, bool *lost);
#endif
