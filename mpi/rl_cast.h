/* rl_cast.h: the RL run's weights through Shardcast (mpi/rl_cast.c). Internal
 * to mpi/.
 *
 * Every rank of the run joins one vks_bcast at start-up: the trainer is its
 * origin (broadcast rank 0), the config's relays are broadcast ranks 1..R in
 * config order, inference and verifier ranks follow in rank order and receive
 * into their version store OUT/weights-rankR/. The trainer makes a fresh
 * Ed25519 key pair per run and announces the public key at start-up (a
 * bounded all-gather over the world, vks_mpi_exchange), where every receiver
 * also says which version its store holds, so that the run's versions start
 * above anything a former run (--resume) left there: version = base + 1 + the
 * number of versions sent before. The file is the WEIGHTS message (header +
 * f32 block) of the step, so a receiver checks it as it checked the message.
 *
 * LoRA (config lora.rank > 0): the file is the step's adapter as a GGUF LoRA
 * file (vks_lora_save_gguf: F32 A and B, alpha, the base's architecture and
 * vkswarm.base_model_hash), and the signed manifest's model hash is the base's
 * (vks_model_hash), its step the adapter's version (the policy step). Every
 * stage loads the base once; a receiver checks the file fully as vks_lora_load
 * does (every tensor's shape against the base, finite values, the base hash)
 * and swaps it in with vks_engine_set_lora.
 *
 * A receiver checks each file (the weights message, or the adapter against
 * its own base) inside the broadcast, before it tells the trainer it is done
 * (vks_bcast_options.accept): a version counts as delivered only when the
 * receiver took it, and one it refuses reaches the trainer with the reason
 * (vks_rl_cast_why). */
#ifndef VKS_RL_CAST_H
#define VKS_RL_CAST_H
#include "vkswarm/vks_broadcast.h"
#include "vkswarm/vks_lora.h"
#include "vkswarm/vks_rl.h"
#include "vkswarm/vks_rl_mpi.h"
#include "rl_wire.h"

typedef struct {
    vks_bcast *b;
    int me, trainer, n_world;
    int *bc_of;               /* world rank -> broadcast rank */
    int *world_of;            /* broadcast rank -> world rank */
    uint8_t *gone;            /* origin: broadcast ranks dropped (vks_rl_cast_drop) */
    uint64_t version_base;    /* the largest version any store held at start-up */
    uint64_t sent;            /* origin: versions sent so far */
    uint8_t sk[VKS_SECRET_KEY_BYTES];
    char store[4200];         /* receivers: their version store ("" on the trainer and relays) */
    size_t n_values;          /* floats of the parameter block */
    int64_t newest;           /* receivers: newest step taken, -1: none */
    const vks_model *lora_base; /* LoRA: the base the adapters are for; NULL: full weights */
    uint8_t base_hash[32];    /* LoRA: its vks_model_hash (what the manifests name) */
    size_t max_file;          /* the largest file a broadcast carries */
    float *taken_weights;     /* receivers: the checked file of the broadcast in progress */
    vks_lora_adapter *taken_adapter; /* LoRA receivers: the checked adapter instead */
    int64_t taken_step;
} vks_rl_cast;

/* Collective over the world (every rank of the run, in the same order as its
 * other start-up exchanges), bounded by start_s. beat (inference and verifier
 * ranks; NULL elsewhere): the rank's beat to the orchestrator, kept going
 * inside every broadcast, so that a broadcast held up by a dead rank does not
 * make the live ones look silent to the orchestrator. */
int vks_rl_cast_open(vks_rl_cast *s, const vks_rl_run_options *o, const vks_rl_mpi_options *mo, size_t n_values,
                     double start_s, vks_rl_beat *beat);
void vks_rl_cast_close(vks_rl_cast *s);

/* Trainer: broadcasts `file` (bytes; the WEIGHTS message of `step`). An
 * error with rep->version == 0: nothing went out (the run should fail);
 * otherwise the ranks that did not finish are named by vks_rl_cast_failed. */
int vks_rl_cast_send(vks_rl_cast *s, const void *file, size_t bytes, int64_t step, vks_bcast_report *rep);
/* Trainer: after a send, the next world rank (from *from on, a broadcast
 * rank) that did not finish it and is not dropped yet; -1: none. */
int vks_rl_cast_failed(const vks_rl_cast *s, int *from);
/* Trainer: why world rank `rank` refused the last send, as it said ("...:
 * the adapter is for base model ..."; escaped), "" when it did not refuse it
 * (took it, failed to receive it, silent, dropped before). */
const char *vks_rl_cast_why(const vks_rl_cast *s, int rank);
/* Trainer: leaves world rank `rank` out of every later broadcast. */
void vks_rl_cast_drop(vks_rl_cast *s, int rank);

/* Nodes: a broadcast waits (poll it from the main loop and the waits). */
bool vks_rl_cast_waiting(vks_rl_cast *s);
/* Nodes: takes part in the waiting broadcast. Receivers: *msg (malloc'd) is
 * the checked weights file, *step its step; relays: *msg = NULL. */
int vks_rl_cast_receive(vks_rl_cast *s, float **msg, int64_t *step);
/* LoRA: the trainer's adapter of `step` (owned from here; its base recorded) as a file to broadcast (malloc'd). */
int vks_rl_cast_adapter_file(const vks_rl_cast *s, const char *out_dir, vks_lora_adapter *a, uint8_t **file, size_t *bytes);
/* LoRA receivers: takes part in the waiting broadcast; *a (NULL on relays)
 * is the checked adapter, *step its version. */
int vks_rl_cast_receive_adapter(vks_rl_cast *s, vks_lora_adapter **a, int64_t *step);
/* The largest file a broadcast of this run carries (full weights or an adapter). */
size_t vks_rl_cast_max_file(const vks_rl_config *c, const vks_model *m, size_t n_values);
#endif
