/* rl_join.h: machines that join a running RL run (issue 37), over MPI's
 * dynamic processes: the trainer opens a port (MPI_Open_port) that Open
 * MPI's ompi-server makes reachable from other mpirun invocations and
 * singletons, writes "PORT@SERVER-URI" to OUT/join.uri, and accepts
 * connections on a thread of its own (MPI_Comm_accept blocks and cannot be
 * cancelled; a thread blocked there does not hold MPI_Finalize: measured).
 * Each connection is an intercommunicator with the joiner as its rank 0; the
 * trainer sees the joiner as one more inference rank (inf_rank.comm).
 *
 * The handshake (every message starts with vks_rl_msg):
 *   TAG_JOIN  trainer -> joiner  WELCOME: step = 1 when inference ranks verify their own
 *                                batches (vks_rl_run_options.verify), batch = bytes of the task
 *                                file that follow the config (0: a built-in task), n = bytes
 *                                of the config (JSON, the checkpoint's form)
 *   TAG_JOIN  trainer -> joiner  NONCE: n = its rank number in the run (after the world's),
 *                                batch and step: 16 random bytes
 *   TAG_UP    joiner -> trainer  HELLO: n = 128, then the hash of the model it loaded, its
 *                                identity's Ed25519 public key and its signature of
 *                                VKS_RL_JOIN_DOMAIN || nonce || model hash
 *   TAG_JOIN  trainer -> joiner  ADMIT: n = its rank number in the run (after the world's),
 *                                step = the newest policy step; or NOT_ADMITTED: the reason
 *                                (text; batch = 1: refused, 0: dropped; also when an admitted
 *                                rank leaves the run)
 *   TAG_JOIN_WEIGHTS  trainer -> joiner  the WEIGHTS file (the header, then the floats, as
 *                                Shardcast's) of the newest step past 0, then of later steps,
 *                                as a stream of chunks of at most VKS_RL_JOIN_CHUNK bytes
 *   TAG_UP    joiner -> trainer  BYE: it leaves (a clean stop), batch = the batch it had been
 *                                granted and did not send (-1: none), to be granted again
 * After ADMIT the joiner is an inference rank (rl_roles.c's messages); each
 * GROUPS message it sends carries its identity's signature of the message
 * (VKS_SIGNATURE_BYTES) after it. */
#ifndef VKS_RL_JOIN_H
#define VKS_RL_JOIN_H
#include <stdbool.h>
#include "vkswarm/vks_mpi.h"
#include "vkswarm/vks_rl_mpi.h"

#define VKS_RL_JOIN_MAX_CONFIG (1u << 20) /* bytes of a WELCOME's config */
#define VKS_RL_JOIN_DOMAIN "vkswarm join hello v1" /* what a HELLO's signature is of, first */
#define VKS_RL_JOIN_HELLO_BYTES (32 + 32 + 64) /* model hash, public key, signature */

/* The bytes a HELLO signs: the domain, the nonce (16 bytes), the model hash. */
void vks_rl_join_hello_text(const uint8_t nonce[16], const uint8_t hash[32], uint8_t *out, size_t *len);
#define VKS_RL_JOIN_MAX_TASKS (256u << 20) /* bytes of a WELCOME's task file */
#define VKS_RL_JOIN_CHUNK ((size_t)8 << 20) /* bytes of a weights chunk to a joiner */

typedef struct vks_rl_join_point vks_rl_join_point;
/* Opens the port, writes OUT/join.uri (out_dir/join.uri) and starts accepting. */
int vks_rl_join_open(vks_rl_join_point **out, const char *server_uri, const char *out_dir);
/* A connection accepted since the last call: true, *ic set. */
bool vks_rl_join_take(vks_rl_join_point *p, MPI_Comm *ic);
/* Stops taking connections (the accepting thread ends with the process). */
void vks_rl_join_close(vks_rl_join_point *p);

/* rl_inference.c: the inference rank over a joined connection (ic: the trainer is its rank 0). */
int vks_rl_inference_joined(const vks_rl_run_options *o, const vks_rl_mpi_options *mo, MPI_Comm ic, int number,
                            bool *no_finalize);
#endif
