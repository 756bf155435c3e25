/* Point-to-point sends with optional emulated latency and bandwidth: a queued
 * send is handed to MPI at its due time (see vks_link.h). */
#include "vkswarm/vks_link.h"
#include <limits.h>
#include <stdlib.h>
#include "vkswarm/vks_common.h"

struct vks_link_send {
    struct vks_link_send *next;
    const void *buf;
    int bytes, dest, tag;
    double due;
    bool started, done;
    MPI_Request req;
};

struct vks_link {
    MPI_Comm comm;
    vks_link_options opt;
    int n_ranks;
    double *link_free_at; /* per destination: when its emulated wire is free */
    bool shared_uplink;   /* one wire for all destinations (vks_link_set_shared_uplink) */
    double uplink_free_at;
    struct vks_link_send *queue;
};

static bool emulated(const vks_link *l) { return l->opt.latency_ms > 0 || l->opt.mbps > 0; }

int vks_link_create(MPI_Comm comm, const vks_link_options *opt, vks_link **out) {
    if (!opt || !out || opt->latency_ms < 0 || opt->mbps < 0 || opt->latency_ms > 1e6)
        return vks_set_error(VKS_ERR_ARG, "link: bad emulation options");
    vks_link *l = calloc(1, sizeof *l);
    if (!l) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    l->comm = comm;
    l->opt = *opt;
    MPI_Comm_size(comm, &l->n_ranks);
    l->link_free_at = calloc((size_t)l->n_ranks, sizeof(double));
    if (!l->link_free_at) {
        free(l);
        return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    }
    *out = l;
    return VKS_OK;
}

int vks_link_set_shared_uplink(vks_link *l, bool shared) {
    if (!l) return vks_set_error(VKS_ERR_ARG, "link: null argument");
    l->shared_uplink = shared;
    return VKS_OK;
}

void vks_link_destroy(vks_link *l) {
    if (!l) return;
    /* Sends still queued are cancelled: the caller is shutting down. */
    while (l->queue) {
        struct vks_link_send *s = l->queue;
        l->queue = s->next;
        if (s->started && !s->done) {
            MPI_Cancel(&s->req);
            MPI_Request_free(&s->req);
        }
        free(s);
    }
    free(l->link_free_at);
    free(l);
}

static int start_send(vks_link *l, struct vks_link_send *s) {
    int rc = MPI_Isend(s->buf, s->bytes, MPI_BYTE, s->dest, s->tag, l->comm, &s->req);
    if (rc != MPI_SUCCESS) return vks_set_error(VKS_ERR_IO, "link: MPI_Isend to rank %d failed", s->dest);
    s->started = true;
    return VKS_OK;
}

int vks_link_isend(vks_link *l, const void *buf, size_t bytes, int dest, int tag, vks_link_send **out) {
    if (!l || !out || (bytes && !buf) || bytes > INT_MAX || dest < 0 || dest >= l->n_ranks || tag < 0)
        return vks_set_error(VKS_ERR_ARG, "link: bad send (rank %d, %zu bytes, tag %d)", dest, bytes, tag);
    struct vks_link_send *s = calloc(1, sizeof *s);
    if (!s) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    *s = (struct vks_link_send){.buf = buf, .bytes = (int)bytes, .dest = dest, .tag = tag};
    double now = MPI_Wtime();
    if (emulated(l)) {
        double wire = l->opt.mbps > 0 ? (double)bytes * 8.0 / (l->opt.mbps * 1e6) : 0.0;
        double *free_at = l->shared_uplink ? &l->uplink_free_at : &l->link_free_at[dest];
        double start = now > *free_at ? now : *free_at;
        *free_at = start + wire;
        s->due = start + wire + l->opt.latency_ms * 1e-3;
    } else {
        s->due = now;
    }
    /* append: sends to one destination stay in order */
    struct vks_link_send **tail = &l->queue;
    while (*tail) tail = &(*tail)->next;
    *tail = s;
    *out = s;
    return s->due <= now ? start_send(l, s) : VKS_OK;
}

int vks_link_progress(vks_link *l) {
    if (!l) return VKS_ERR_ARG;
    double now = MPI_Wtime();
    for (struct vks_link_send *s = l->queue; s; s = s->next) {
        if (!s->started && s->due <= now) {
            int rc = start_send(l, s);
            if (rc) return rc;
        }
        if (s->started && !s->done) {
            int flag = 0;
            if (MPI_Test(&s->req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS)
                return vks_set_error(VKS_ERR_IO, "link: send to rank %d failed", s->dest);
            s->done = flag != 0;
        }
    }
    return VKS_OK;
}

bool vks_link_send_done(vks_link *l, vks_link_send *s) {
    if (!l || !s) return false;
    if (!s->done) vks_link_progress(l);
    if (!s->done) return false;
    for (struct vks_link_send **p = &l->queue; *p; p = &(*p)->next) {
        if (*p == s) {
            *p = s->next;
            break;
        }
    }
    free(s);
    return true;
}

double vks_link_next_due(const vks_link *l) {
    if (!l) return -1;
    double now = MPI_Wtime(), next = -1;
    for (const struct vks_link_send *s = l->queue; s; s = s->next) {
        if (s->started) continue;
        double wait = s->due > now ? s->due - now : 0;
        if (next < 0 || wait < next) next = wait;
    }
    return next;
}
