/* vks_link.h: point-to-point messages between ranks with optional emulated
 * link latency and bandwidth (--link-latency-ms, --link-mbps), so that one
 * machine shows how schedules behave over home internet links. Used by the
 * pipeline (mpi/pipeline.c) and the broadcast (mpi/broadcast.c).
 *
 * Semantics: a send to rank d is handed to MPI only at its due time,
 * due = max(now, previous due on the link to d) + bytes*8/(mbps*1e6), plus the
 * one-way latency (the latency overlaps between messages, the bandwidth term
 * serializes them per link). Without emulation sends go to MPI at once.
 * By default each (sender, destination) pair has its own wire, so a sender
 * fanning out to k ranks gets k times the bandwidth; with a shared uplink
 * (vks_link_set_shared_uplink) all of a sender's messages, whatever their
 * destination, queue on one wire of `mbps`, like a home connection's uplink.
 * Nothing here blocks: callers drive vks_link_progress() from their progress
 * loop or communication thread. */
#ifndef VKS_LINK_H
#define VKS_LINK_H
#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct vks_link vks_link;
typedef struct vks_link_send vks_link_send;

typedef struct {
    double latency_ms; /* one way; 0 = none */
    double mbps;       /* 0 = unlimited */
} vks_link_options;

int vks_link_create(MPI_Comm comm, const vks_link_options *opt, vks_link **out);
void vks_link_destroy(vks_link *l);
/* One emulated wire per sender shared by all destinations (default: one per
 * destination). Set it before the first send. */
int vks_link_set_shared_uplink(vks_link *l, bool shared);
/* Queues a send; buf must stay valid until vks_link_send_done() is true. */
int vks_link_isend(vks_link *l, const void *buf, size_t bytes, int dest, int tag, vks_link_send **out);
/* Starts sends whose due time has come and tests in-flight ones. */
int vks_link_progress(vks_link *l);
/* True once the send has completed (then the handle is freed: do not reuse). */
bool vks_link_send_done(vks_link *l, vks_link_send *s);
/* Seconds until the next queued send is due (0 if one is due, -1 if none queued). */
double vks_link_next_due(const vks_link *l);
#endif
