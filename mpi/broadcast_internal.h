/* Internals shared by mpi/broadcast.c (roles) and mpi/broadcast_tree.c
 * (tree, chunk layout, streaming to children). */
#ifndef VKS_BROADCAST_INTERNAL_H
#define VKS_BROADCAST_INTERNAL_H
#include "vkswarm/vks_broadcast.h"

enum { TAG_MANIFEST = 601, TAG_ACK, TAG_PLAN, TAG_CHUNK, TAG_REQ, TAG_REPAIR, TAG_DONE, TAG_FINISH, TAG_LOST,
       TAG_BEAT, TAG_BYE, TAG_GO };

#define BEAT_S 1.0
/* DONE (node -> origin): int32 status (0 delivered; 1 the transfer or the
 * store failed; 2 the receiver's accept check refused the file), then, when
 * not 0, the reason as text (at most WHY_BYTES - 1 bytes, no NUL). */
#define WHY_BYTES 256
enum { DONE_OK = 0, DONE_FAILED = 1, DONE_REFUSED = 2 }; /* heartbeat period: origin -> every rank, every rank -> origin */

/* What the origin knows of each rank after a broadcast (the status file). */
typedef enum { OUTCOME_PENDING, OUTCOME_OK, OUTCOME_FAILED, OUTCOME_REFUSED, OUTCOME_SILENT } rank_outcome;

#define REPAIR_HEADER 16 /* u32 shard, u32 0, u64 version */
#define SEND_WINDOW 8    /* chunks queued per child */
#define RECV_WINDOW 16   /* chunk receives posted from the parent */

typedef enum { FAULT_NONE, FAULT_CORRUPT, FAULT_SHORT, FAULT_DIE, FAULT_STOP } fault_kind;
typedef struct {
    fault_kind kind;
    int rank;
    uint32_t shard;
} bcast_fault;

/* The wire stream cut into chunks that never cross a shard boundary. */
typedef struct {
    size_t n;
    uint32_t n_shards;
    uint64_t *off;
    uint32_t *len, *shard;
    size_t *first_of_shard; /* n_shards + 1 entries */
} chunk_layout;

int vks_bc_layout_build(const vks_manifest *m, size_t chunk_bytes, chunk_layout *c);
void vks_bc_layout_free(chunk_layout *c);

/* Tree over the participating ranks (plan[r] != 0), rank order, fanout children. */
int vks_bc_tree_parent(const uint8_t *plan, int size, int rank, int fanout);
int vks_bc_tree_children(const uint8_t *plan, int size, int rank, int fanout, int *out, int cap);

/* Streams the chunks a node has (have[i] != 0) to its children in order,
 * SEND_WINDOW chunks in flight per child. */
typedef struct {
    vks_link *link;
    int n_children;
    int children[64];
    size_t next[64];                      /* next chunk to queue per child */
    size_t done_upto[64];                 /* chunks whose send completed per child */
    vks_link_send *inflight[64][SEND_WINDOW];
    const chunk_layout *layout;
    const uint8_t *wire;
    uint8_t *damaged;                     /* fault: the damaged copy of one chunk */
    size_t damaged_chunk;
    bool short_first;                     /* fault: first chunk one byte short */
    size_t hold_at;                       /* fault die/stop: chunks from here on are never queued */
} forwarder;

int vks_bc_forwarder_init(forwarder *f, vks_link *link, const int *children, int n, const chunk_layout *c, const uint8_t *wire,
                   const bcast_fault *fault, int rank);
/* Queues what it can; returns <0 on error. */
int vks_bc_forwarder_pump(forwarder *f, const uint8_t *have);
/* Chunks queued to the slowest child (for the `die` fault). */
size_t vks_bc_forwarder_min_queued(const forwarder *f);
bool vks_bc_forwarder_all_done(forwarder *f);
void vks_bc_forwarder_free(forwarder *f);
#define MAX_KEEP 8

struct vks_bcast {
    MPI_Comm comm;
    int rank, size;
    vks_bcast_options opt;
    vks_link *link;
    bcast_fault fault;
    uint64_t latest;                            /* newest version this rank holds */
    int n_cached;                               /* relays: last versions in memory */
    struct { uint64_t version; uint8_t *wire; } cache[MAX_KEEP];
    /* Liveness: when each rank was last heard from (nodes use [0], the
     * origin), when this rank last sent heartbeats. */
    double *last_heard;
    double last_beat;
    bool origin_silent;                         /* nodes: the origin fell silent (no close handshake) */
    int32_t bye;                                /* TAG_BYE (nodes) / TAG_GO (origin) payload, valid while sent */
    vks_link_send *bye_send;
    /* Origin: each rank's outcome of the last send, for the status file. */
    uint8_t *outcome;
    char (*why)[WHY_BYTES];                     /* origin: why each rank refused the last send (DONE_REFUSED; "": it did not) */
    uint8_t *gone;                              /* origin: ranks left out of every later send (vks_bcast_drop) */
    uint64_t status_version;
    double status_seconds;
};


double vks_bc_now_s(void);
void vks_bc_idle(void);
/* Waits a little in a progress loop: yields while things move, naps when not. */
void vks_bc_pace(double *last_progress, bool progressed);
/* Waits for a message (src, tag) while driving the link; false on timeout
 * (timeout <= 0 waits forever). */
bool vks_bc_wait_probe(vks_bcast *b, int src, int tag, double timeout, MPI_Status *st);
/* Receives the probed message *st of `tag` as one int32 into *v; a message of
 * any other size is consumed, *v left as it was, and false returned. */
bool vks_bc_recv_i32(vks_bcast *b, const MPI_Status *st, int tag, int32_t *v);
/* Sends a small buffer through the link and waits for it (bounded). */
void vks_bc_send_small(vks_bcast *b, const void *buf, size_t len, int dest, int tag);
/* Heartbeats: sends them when due (origin: to every rank; others: to the
 * origin) and takes those waiting, noting who was heard. */
void vks_bc_beat(vks_bcast *b);
void vks_bc_heard(vks_bcast *b, int rank);
/* Seconds since `rank` was last heard from. */
double vks_bc_silent_for(const vks_bcast *b, int rank);
/* Test hook (die:/stop:RANK): the faulty rank passes on (forwarders: queues to each
 * child; leaves: receives) the first half of the chunks, never more, and then dies or
 * stops: called with its progress (forwarders: vks_bc_forwarder_min_queued; leaves:
 * chunks received) and f->hold_at, it fires once progress reaches hold_at. So the
 * fault lands at the same chunk on a fast machine, a slow one and a loaded one. */
void vks_bc_fault_point(vks_bcast *b, size_t progress, size_t hold_at);
/* Origin: writes the status file (opt.status_out), if any. */
int vks_bc_write_status(vks_bcast *b, bool complete);
uint64_t vks_bc_get_u64(const uint8_t *p);
void vks_bc_put_u64(uint8_t *p, uint64_t v);
#endif
