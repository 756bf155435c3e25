/* rl_wire.h: the RL run's messages between ranks (mpi/rl_wire.c): their
 * header, the wire format of a batch's groups, and a bounded small send.
 * Shared by the trainer and inference ranks (rl_roles.c, rl_inference.c) and verifier ranks
 * (rl_verifier.c). Internal to mpi/. */
#ifndef VKS_RL_WIRE_H
#define VKS_RL_WIRE_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "vkswarm/vks_rl_roles.h"
#include "vkswarm/vks_checkpoint.h"
#include "vkswarm/vks_mpi.h"

#define VKS_RL_MAGIC 0x4c52534bu /* "KSRL" */
/* Tags: orchestrator -> others (control), others -> orchestrator, inference -> verifier, every rank at
 * start-up (rl_cast.c: the trainer's public key), trainer <-> an orchestrator on a rank of its own
 * (rl_orchestrator.c). The weights go through Shardcast (rl_cast.h). */
enum { TAG_CTL = 7102, TAG_UP = 7103, TAG_VERIFY = 7104, TAG_CAST_HELLO = 7105, TAG_ORCH = 7106, TAG_JOIN = 7107,
       TAG_JOIN_WEIGHTS = 7108 };
/* Message types (rl_roles.c's header comment says who sends which). */
enum { MSG_WEIGHTS = 1, MSG_ASSIGN = 2, MSG_STOP = 3, MSG_BEAT = 4, MSG_GROUPS = 5, MSG_DONE = 6, MSG_TO_VERIFY = 7,
       MSG_VERIFIED = 8, MSG_REFUSE = 9, MSG_REFORM = 10,
       /* a joined rank <-> the trainer, over the connection's intercommunicator (rl_join.h) */
       MSG_WELCOME = 11, MSG_HELLO = 12, MSG_ADMIT = 13, MSG_NOT_ADMITTED = 14, MSG_NONCE = 15,
       MSG_BYE = 16,
       /* trainer -> verifier: a joined rank's TO_VERIFY, passed on (rl_roles.c, forward_to_verifier) */
       MSG_FORWARD = 17,
       /* trainer <-> orchestrator (TAG_ORCH; rl_orchestrator.c says what each carries) */
       MSG_RESUME = 20, MSG_PUBLISHED = 21, MSG_TAKE = 22, MSG_TAKEN = 23, MSG_FINISH = 24, MSG_FINISHED = 25,
       MSG_FAILED = 26 };

#define VKS_RL_REASON_MAX 512 /* bytes of a REFUSE message's reason */

typedef struct {
    uint32_t magic, type;
    int64_t batch, step;
    uint64_t n;
} vks_rl_msg;

/* What a group's sample looks like on the wire, before its tokens, logp and (episodes: has_mask 1) the
 * completion's trained mask, one byte per token. */
typedef struct {
    int32_t prompt_len, completion_len, accepted, has_mask;
    double task_reward, reward, advantage;
    uint64_t episode_seed;
} wire_sample;
typedef struct {
    int32_t n, pad;
    int64_t task_index;
} wire_group;

/* The largest honest GROUPS message of a batch (prompts_per_step groups). */
size_t vks_rl_wire_max_groups_bytes(const vks_rl_config *c, int seq_len);
/* The largest rollout file of a batch accepted from an inference rank. */
size_t vks_rl_wire_max_rollout_bytes(const vks_rl_config *c, int seq_len);
/* The most bytes of files a TO_VERIFY message may carry after its groups: one rollout file, or for episodes
 * the framed turn files (VKS_ENV_MAX_TURNS of them at most). */
size_t vks_rl_wire_max_verify_files_bytes(const vks_rl_config *c, int seq_len, bool episodes);
/* Episodes: a batch's turn files, where a TO_VERIFY message holds its one rollout file: uint32 turns
 * (1 to VKS_ENV_MAX_TURNS), a uint64 length per turn, then the files' bytes in turn order. */
int vks_rl_wire_pack_turn_files(char *const *files, const size_t *lens, int turns, char **out, size_t *bytes);
/* The files of such a block (pointers into buf; each at most most_each bytes; every byte accounted for):
 * VKS_ERR_FORMAT naming what is wrong. */
int vks_rl_wire_unpack_turn_files(const char *buf, size_t bytes, size_t most_each, const char **files, size_t *lens,
                                  int *turns);
/* A GROUPS message (header batch, step; the batch's counts; the groups). NULL: out of memory. */
void *vks_rl_wire_pack_groups(const vks_rl_batch_group *groups, int P, int64_t batch, int64_t step,
                              const vks_rl_gen_counts *cnt, size_t *bytes);
/* Checks and unpacks a GROUPS message of `bytes` made for batch `batch` with a
 * policy step in [min_step, newest]. Every sample must be accepted by a
 * verifier and every group have signal, or (unverified: what an inference
 * rank sends a verifier rank) carry no verdict yet. Any failure: VKS_ERR_FORMAT, err says why, nothing kept. */
int vks_rl_wire_unpack_groups(const void *buf, size_t bytes, const vks_rl_gen *gen, const vks_rl_config *c,
                              const vks_model_config *mc, int64_t batch, int64_t min_step, int64_t newest,
                              bool unverified, vks_rl_batch_group *groups, int64_t *policy, vks_rl_gen_counts *cnt,
                              char *err, size_t cap);
/* A batch's counts against the groups it carries (as unpacked): with
 * `verified` (the rank or a verifier rank replayed the batch) every rollout
 * was checked and at least the completions sent were accepted, else nothing
 * was checked; the task reward sum is at least the sent completions' and at
 * most that plus one per completion not sent. VKS_ERR_FORMAT: err says why. */
int vks_rl_wire_check_counts(const vks_rl_gen_counts *cnt, const vks_rl_batch_group *groups, int P, bool verified,
                             char *err, size_t cap);
/* Sends `bytes` of buf to rank under a bounded wait (a blocking send to a
 * dead rank never returns). *freeable: whether the caller may free buf now
 * (false after a timeout or a failed wait: MPI may still read it). */
int vks_rl_wire_send(MPI_Comm comm, int rank, int tag, void *buf, size_t bytes, double timeout_s, const char *what,
                     bool *freeable);
/* A header-only message the same way, from a heap copy (left to MPI after a timeout). */
int vks_rl_wire_send_small(MPI_Comm comm, int rank, int tag, const vks_rl_msg *m, double timeout_s, const char *what);
/* The rank that grants batches, for messages: "the orchestrator" when it has
 * a rank of its own, else "the trainer". */
const char *vks_rl_wire_granter(const vks_rl_config *c);

/* A rank's beat to the orchestrator (the trainer's rank, or its own): one
 * every second, none while the last one is still on its way (a dead peer: the
 * rank's own silence bound ends it). */
typedef struct {
    MPI_Comm comm;
    int trainer;         /* the rank beaten to */
    int tag;             /* 0: TAG_UP */
    double last;
    vks_rl_msg msg;
    MPI_Request req;     /* MPI_REQUEST_NULL at the start */
} vks_rl_beat;
void vks_rl_wire_beat(vks_rl_beat *b);
/* vks_rl_wire_beat for vks_mpi_wait_within_doing (beat: a vks_rl_beat *), so
 * that a send to a dead peer does not make the waiting rank look dead too. */
void vks_rl_wire_beat_cb(void *beat);

/* Checks a weights file that Shardcast delivered (the WEIGHTS layout: the
 * header, then n_values floats): its size, header, and a step equal to the
 * one its signed manifest announced and newer than `newest`. */
int vks_rl_wire_check_weights(const void *file, size_t len, size_t n_values, int64_t newest, int64_t announced,
                              int64_t *step);
/* The f32 model of a WEIGHTS message (its parameter block in layout order)
 * with the start model's shape, BOS/EOS and architecture. */
int vks_rl_wire_model_from_block(const vks_model *start, const vks_param_layout *layout, const float *msg,
                                 vks_model **out);
#endif
