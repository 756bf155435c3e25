/* vks_rl_mpi.h: the RL run across MPI ranks (mpi/rl_roles.c, rl_verifier.c,
 * rl_cast.c).
 *
 * The trainer rank (also the orchestrator, unless roles.orchestrator names a
 * rank of its own: below) trains as vks_rl_run does, but its
 * groups come from inference groups (one rank, or a pipeline of S ranks whose
 * first rank is the one the trainer sees: mpi/rl_group.h): it
 * grants each idle inference rank a batch (index b, the policy step it must
 * use at least) only while the async window has room, broadcasts the f32
 * weights after each step through Shardcast (vks_broadcast.h: the trainer is
 * the origin and signs each version with a key pair made for the run, whose
 * public key every rank learns at start-up; the config's relays relay;
 * inference and verifier ranks receive into OUT/weights-rankR/ and check that
 * the file is the step the signed manifest announced), and checks every group
 * it receives against the config (lengths, token ids, log-probabilities,
 * batch, policy step), the task (prompt tokens, rewards re-scored) and its own
 * advantages before it is queued. An inference rank that sends something
 * malformed is named and refused; one silent for timeout_s (it beats every
 * second, also while generating) or that does not finish a broadcast is
 * dropped (later broadcasts leave it out) and its batch goes to another rank.
 * The trainer dying ends the run: inference ranks give up after
 * trainer_timeout_s without a word from it while idle (a broadcast it does
 * not finish ends after timeout_s). */
#ifndef VKS_RL_MPI_H
#define VKS_RL_MPI_H
#include "vks_rl.h"

typedef struct {
    double timeout_s;       /* an inference rank silent this long is gone; also bounds every send and
                             * every wait of a weights broadcast */
    double trainer_timeout_s; /* an idle inference rank gives up after this long without a word from the
                               * trainer, which says nothing while it trains a step: it must exceed a
                               * step's time (below timeout_s: timeout_s) */
    int test_garbage;       /* TEST ONLY: this inference rank sends a token id outside the vocabulary (1)
                             * or a reward of 1 its completion did not earn (2) */
    /* TEST ONLY: NULL in vkswarm. The test build's vkswarm_cheat (tests/rl_cheat.c) sets it on
     * an inference rank told to cheat: called with each batch's groups (prompts_per_step
     * vks_rl_batch_group) and counts (vks_rl_gen_counts) before they are sent. */
    void (*test_tamper)(void *ctx, void *groups, void *counts);
    void *test_tamper_ctx;
    /* The trainer: open a join point (docs "Joining a run") reachable through the ompi-server
     * of this URI (mpirun --ompi-server), written with the port to OUT/join.uri; NULL: none.
     * A joiner must hold the model of model_hash (the hash vks_mpi_check_ranks compares). */
    const char *join_server;
    uint8_t model_hash[32];
    /* The trainer: the public keys that may join (n_join_allow; 0: anyone). */
    const uint8_t (*join_allow)[32];
    int n_join_allow;
    /* A joiner: its identity's Ed25519 secret key (libsodium's 64 bytes: it signs its hello and
     * every batch it sends). */
    const uint8_t *join_secret_key;
} vks_rl_mpi_options;

/* Refuses roles this cut does not run (no roles, no inference rank in a run
 * closed to joins, an orchestrator sharing a rank with anything but the
 * trainer), naming them. joins: the run takes joiners (mo->join_server), so
 * its pool may start empty: a trainer alone waits for the first. */
int vks_rl_mpi_check_roles(const vks_rl_config *c, bool joins);
/* The trainer rank (and the orchestrator, when it shares the rank; else the
 * trainer asks the orchestrator's rank for each step's groups and re-checks
 * them, and a silent orchestrator ends the run naming it). *lost: inference
 * ranks were dropped or refused (under Open MPI 4.1 the survivors must then
 * not call MPI_Finalize). */
int vks_rl_mpi_trainer(const vks_rl_run_options *o, const vks_rl_mpi_options *mo, vks_rl_result *r, bool *lost);
/* An inference rank: generates the batches the trainer grants until it says
 * stop; in a pipeline group the first stage does that across the group and
 * the others serve it. *no_finalize: the trainer said ranks were lost (or it
 * went silent). */
int vks_rl_mpi_inference(const vks_rl_run_options *o, const vks_rl_mpi_options *mo, bool *no_finalize);
/* A verifier rank: checks the batches inference ranks send it (their groups
 * against their rollout files, then TOPLOC and the sampling replay on the CPU
 * with the policy each batch names) and sends the trainer the accepted
 * completions, or a refusal naming what was wrong, until the trainer says
 * stop. *no_finalize as for an inference rank. */
int vks_rl_mpi_verifier(const vks_rl_run_options *o, const vks_rl_mpi_options *mo, bool *no_finalize);
/* The orchestrator on a rank of its own (roles.orchestrator != roles.trainer,
 * mpi/rl_orchestrator.c): grants, checks and queues batches as a trainer that
 * orchestrates does, hands the trainer the groups of each step when it asks
 * (the trainer re-checks them) with the counters, and says STOP to every rank
 * when the trainer says the run is over. *no_finalize: ranks were lost, or
 * the trainer went silent for trainer_timeout_s (then it tells every rank to
 * stop). */
int vks_rl_mpi_orchestrator(const vks_rl_run_options *o, const vks_rl_mpi_options *mo, bool *no_finalize);
/* A relay rank: relays every weights broadcast down the tree (keeping the
 * last versions in memory, nothing on disk) until the trainer says stop.
 * *no_finalize as for an inference rank. */
int vks_rl_mpi_relay(const vks_rl_run_options *o, const vks_rl_mpi_options *mo, bool *no_finalize);

/* ---- joining a running run (mpi/rl_join.c) ---- */
typedef struct vks_rl_joiner vks_rl_joiner;
/* Connects to a run's join point (the PORT of its OUT/join.uri "PORT@SERVER";
 * MPI must have been started with that ompi-server: OMPI_MCA_pmix_server_uri)
 * and receives its config and task file, within timeout_s. */
int vks_rl_join_connect(const char *port, double timeout_s, vks_rl_joiner **out);
/* The run's config (JSON, as a checkpoint holds it); its task file's bytes
 * (*bytes = 0: a built-in task); whether its inference ranks verify their
 * own batches (vks_rl_run_options.verify). */
const char *vks_rl_joiner_config(const vks_rl_joiner *j);
const void *vks_rl_joiner_tasks(const vks_rl_joiner *j, size_t *bytes);
bool vks_rl_joiner_verify(const vks_rl_joiner *j);
/* Says which model this process loaded (hash); admitted, runs as an
 * inference rank of the run until it says stop (o: the run's config with
 * this machine's out directory, model, tokenizer and GPU). Not admitted:
 * VKS_ERR_ARG with the run's reason. */
int vks_rl_join_run(vks_rl_joiner *j, const vks_rl_run_options *o, const vks_rl_mpi_options *mo, const uint8_t hash[32],
                    bool *no_finalize);
void vks_rl_joiner_free(vks_rl_joiner *j);
#endif
