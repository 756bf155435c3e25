/* vks_broadcast.h: Shardcast over MPI. Rank 0 of the communicator
 * is the origin, ranks 1..relays are relays, the others receivers. The origin
 * sends a signed manifest to every rank; those that accept it (signature,
 * version newer than theirs, delta base present) form a tree with `fanout`
 * children per node, in rank order, and the wire stream flows down it chunk
 * by chunk: a node forwards chunk i while chunk i+1 arrives. Every node hashes
 * each chunk as it arrives and checks each shard's hash when its last chunk is
 * in; a bad shard is asked again from the origin, and a node whose parent
 * falls silent for timeout_s tells the origin and asks it for everything it
 * misses. Receivers write chunks to an invisible staging file as they arrive
 * (deltas: decode at the end), then fsync and switch their version store
 * (vks_shard.h) atomically; relays keep the last keep_versions in memory.
 * Waiting: ranks with transfers in flight stay in MPI calls (Open MPI's TCP
 * transport only moves bytes there) and yield the core; idle ranks nap.
 * Liveness: the origin sends every rank a heartbeat each second and every
 * rank sends the origin one; a rank not heard from for timeout_s is silent
 * (the origin names it; the others give up when the origin is), so every
 * wait is bounded by timeout_s, start-up and the closing handshake included.
 *
 * The same calls serve the CLI (vkswarm broadcast) and the RL run across
 * ranks (mpi/rl_cast.c): create a vks_bcast once per rank, then call
 * vks_bcast_send (origin) or vks_bcast_receive (others) once per new version;
 * a node with other work polls vks_bcast_waiting, and the origin drops ranks
 * it knows are gone (vks_bcast_drop) so that later sends do not wait for them. */
#ifndef VKS_BROADCAST_H
#define VKS_BROADCAST_H
#include <mpi.h>
#include "vks_link.h"
#include "vks_shard.h"

typedef enum { VKS_BCAST_ORIGIN, VKS_BCAST_RELAY, VKS_BCAST_RECEIVER } vks_bcast_role;
struct vks_bcast_report;

typedef struct {
    int relays;                  /* ranks 1..relays are relays */
    int fanout;                  /* children per tree node (>= 1; default 2) */
    size_t chunk_bytes;          /* pipelining unit (default 1 MiB) */
    double timeout_s;            /* silence of a parent, of the origin or of a rank before it counts as
                                  * gone (default 30); also bounds start-up (the communicator's dup) */
    double manifest_timeout_s;   /* how long non-origin ranks wait for a manifest without word from the
                                  * origin (heartbeats count; 0 = forever) */
    const char *status_out;      /* origin: JSON status file, written atomically when a send starts
                                  * ("complete": false), when it ends and at vks_bcast_close */
    vks_link_options link;       /* emulated latency / bandwidth per link */
    bool shared_uplink;          /* emulation: one uplink per sender shared by its children (vks_link.h) */
    const char *store_dir;       /* receivers: version store (required for receivers) */
    int keep_versions;           /* versions kept by relays (memory) and receivers (disk); default 2 */
    uint64_t max_file_bytes;     /* nodes refuse a manifest of a larger file, before anything is
                                  * allocated for it (0: no bound but the format's) */
    uint8_t public_key[VKS_PUBLIC_KEY_BYTES]; /* the trainer's key: the only signer accepted */
    /* Test hook: "corrupt:RANK[:SHARD]" (RANK sends SHARD damaged to its children),
     * "short:RANK[:SHARD]" (sends its first chunk one byte short), "die:RANK"
     * (RANK kills itself half way through forwarding). NULL = none. */
    const char *fault;
    void (*progress)(void *ctx, uint64_t done, uint64_t total); /* bytes of wire received */
    void *progress_ctx;
    /* Called with beat_ctx each time this rank beats (about once a second, in
     * every wait of a send or receive): a caller whose peers watch its
     * liveness on another channel beats there too (NULL: none). */
    void (*beat)(void *ctx);
    void *beat_ctx;
    /* Receivers: called once a version is verified and switched to, before
     * this rank tells the origin it is done, with the store path of the file
     * and the report: the caller's own check (its model, its format). The
     * file counts as delivered only when it returns VKS_OK; else this rank
     * refuses it: the origin counts it among the ranks that did not receive
     * the version and learns the error text (vks_bcast_rank_why), and
     * vks_bcast_receive returns that error. NULL: every verified file is taken. */
    int (*accept)(void *ctx, const char *path, const struct vks_bcast_report *rep);
    void *accept_ctx;
} vks_bcast_options;

typedef struct vks_bcast_report {
    uint64_t version, step;
    uint64_t file_bytes, wire_bytes; /* wire < file when deltas saved bytes */
    double seconds;
    int repaired_shards;             /* this rank: shards asked again from the origin */
    int failovers;                   /* this rank: 1 if its parent fell silent */
    int ranks_ok, ranks_failed;      /* origin: non-origin ranks that finished / did not */
    int ranks_lost;                  /* ranks that fell silent (origin: counted; others: told in FINISH).
                                      * Processes that end after the broadcast learn it again,
                                      * final, from vks_bcast_close. */
    uint8_t file_hash[VKS_HASH_BYTES];
    uint8_t model_hash[VKS_HASH_BYTES]; /* the signed manifest's model hash */
} vks_bcast_report;

typedef struct vks_bcast vks_bcast;

vks_bcast_role vks_bcast_role_of(int rank, int relays);
/* Duplicates comm (collective over comm, nonblocking: fails when not every
 * rank joins within timeout_s; the caller should then abort the job). */
int vks_bcast_create(MPI_Comm comm, const vks_bcast_options *opt, vks_bcast **out);
void vks_bcast_destroy(vks_bcast *b);
/* Origin: broadcasts the signed manifest and its wire stream (vks_manifest_build
 * + vks_manifest_sign). Fails if any rank not dropped refused or did not finish
 * (vks_bcast_rank_ok says which; the report is filled once the manifest went out). */
int vks_bcast_send(vks_bcast *b, const uint8_t *manifest, size_t manifest_len, const uint8_t *wire, size_t wire_len,
                   vks_bcast_report *rep);
/* Relays and receivers: take part in one broadcast. VKS_ERR_FORMAT when the
 * manifest was refused, VKS_ERR_IO when the transfer failed; nothing is
 * switched to in either case. */
int vks_bcast_receive(vks_bcast *b, vks_bcast_report *rep);
/* Nodes: true when a manifest (or the origin's cancel) waits, so that a rank
 * with other work polls for it and calls vks_bcast_receive only then. Does
 * not block. */
bool vks_bcast_waiting(vks_bcast *b);
/* Origin: whether `rank` finished the last vks_bcast_send (false for the
 * origin, unknown ranks and ranks dropped). */
bool vks_bcast_rank_ok(const vks_bcast *b, int rank);
/* Origin: why `rank` refused the last send (its accept check failed), as it
 * said (escaped); "" when it did not refuse it (took it, failed otherwise,
 * silent, dropped). */
const char *vks_bcast_rank_why(const vks_bcast *b, int rank);
/* Origin: leaves `rank` (gone, or no longer trusted) out of every later
 * send, beat and close: no manifest, nothing waited for; a dropped relay's
 * place in the tree goes to the others. */
void vks_bcast_drop(vks_bcast *b, int rank);
/* Origin: tells every rank waiting for a manifest that none will come (it
 * failed to prepare one); they end their vks_bcast_receive with an error. */
void vks_bcast_cancel(vks_bcast *b);
/* Origin: heartbeats while it prepares a manifest (call at least every
 * second from the thread that made the MPI calls). */
void vks_bcast_keepalive(vks_bcast *b);
/* Closing handshake for processes that end after a broadcast (collective in
 * effect, bounded by timeout_s): every rank reports its final status
 * (`status`, 0 = ok) to the origin, which records it in the status file and
 * answers with the number of ranks that fell silent. *lost is that number
 * (0: every rank can MPI_Finalize). An error (VKS_ERR_IO) when the origin
 * is silent. After *lost > 0 or an error, MPI_Finalize would hang: nodes
 * leave without it, the origin (or a node that found the origin silent)
 * aborts the job, which is what ends a rank that is stopped rather than dead. */
int vks_bcast_close(vks_bcast *b, int status, int *lost);

/* Benchmark baselines over the same communicator: "p2p" (rank 0 sends bytes
 * to rank 1 through vks_link in chunk_bytes messages) or "mpi-bcast"
 * (MPI_Bcast of bytes from rank 0, no emulation). Collective; *seconds on
 * every rank is the slowest rank's time. */
int vks_bcast_baseline(MPI_Comm comm, const char *kind, size_t bytes, const vks_link_options *link,
                       bool shared_uplink, size_t chunk_bytes, double *seconds);
#endif
