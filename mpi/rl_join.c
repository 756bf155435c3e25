/* rl_join.c: the join point of a running RL run and the joiner's side of
 * the handshake (rl_join.h says what travels). */
#define _POSIX_C_SOURCE 200809L
#include "rl_join.h"
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "vkswarm/vks_common.h"
#include "vkswarm/vks_shard.h"
#include "rl_wire.h"

/* ---- the run's side: the port and the thread that accepts ---- */

struct vks_rl_join_point {
    char port[MPI_MAX_PORT_NAME];
    MPI_Comm self;          /* MPI_COMM_SELF's duplicate: the accepting thread's own communicator */
    pthread_t thread;
    pthread_mutex_t lock;
    MPI_Comm *taken;        /* accepted, not yet taken (under lock) */
    int n_taken, cap_taken;
    bool closing;           /* under lock */
    char path[4200];        /* OUT/join.uri, removed at the close */
};

static void *accept_loop(void *arg) {
    vks_rl_join_point *p = arg;
    for (;;) {
        MPI_Comm ic = MPI_COMM_NULL;
        if (MPI_Comm_accept(p->port, MPI_INFO_NULL, 0, p->self, &ic) != MPI_SUCCESS) {
            usleep(100000); /* a failed handshake (the joiner died in it): the next one */
            continue;
        }
        pthread_mutex_lock(&p->lock);
        bool keep = !p->closing;
        if (keep && p->n_taken == p->cap_taken) {
            int cap = p->cap_taken ? 2 * p->cap_taken : 4;
            MPI_Comm *t = realloc(p->taken, sizeof *t * (size_t)cap);
            if (t) p->taken = t, p->cap_taken = cap;
            else keep = false; /* out of memory: this joiner times out and may try again */
        }
        if (keep) p->taken[p->n_taken++] = ic;
        pthread_mutex_unlock(&p->lock);
        if (!keep) MPI_Comm_free(&ic);
    }
    return NULL;
}

int vks_rl_join_open(vks_rl_join_point **out, const char *server_uri, const char *out_dir) {
    *out = NULL;
    if (!server_uri || !server_uri[0] || strchr(server_uri, '\n'))
        return vks_set_error(VKS_ERR_ARG, "join point: no ompi-server URI");
    if (!vks_mpi_threads_multiple())
        return vks_set_error(VKS_ERR_ARG, "join point: MPI did not grant MPI_THREAD_MULTIPLE (the port is served by a thread)");
    vks_rl_join_point *p = calloc(1, sizeof *p);
    if (!p) return vks_set_error(VKS_ERR_NOMEM, "join point: out of host memory");
    /* OUT may not exist yet: a trainer alone opens joins before anything else writes there */
    if (mkdir(out_dir, 0755) && errno != EEXIST) {
        free(p);
        return vks_set_error(VKS_ERR_IO, "join point: %s: %s", out_dir, strerror(errno));
    }
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    if (MPI_Open_port(MPI_INFO_NULL, p->port) != MPI_SUCCESS || MPI_Comm_dup(MPI_COMM_SELF, &p->self) != MPI_SUCCESS) {
        free(p);
        return vks_set_error(VKS_ERR_IO, "join point: MPI_Open_port failed");
    }
    MPI_Comm_set_errhandler(p->self, MPI_ERRORS_RETURN);
    char *path = p->path;
    snprintf(p->path, sizeof p->path, "%s/join.uri", out_dir);
    vks_outfile f;
    int rc = vks_outfile_open(&f, path, 0644);
    if (!rc) {
        bool ok = fprintf(f.f, "%s@%s\n", p->port, server_uri) > 0;
        rc = vks_outfile_finish(&f, ok);
    }
    if (rc) {
        MPI_Close_port(p->port);
        free(p);
        return rc;
    }
    pthread_mutex_init(&p->lock, NULL);
    if (pthread_create(&p->thread, NULL, accept_loop, p)) {
        MPI_Close_port(p->port);
        free(p);
        return vks_set_error(VKS_ERR_IO, "join point: cannot start its thread");
    }
    fprintf(stderr, "vkswarm: rl: joins: open at %s (vkswarm join --run %s)\n", path, path);
    *out = p;
    return VKS_OK;
}

bool vks_rl_join_take(vks_rl_join_point *p, MPI_Comm *ic) {
    if (!p) return false;
    pthread_mutex_lock(&p->lock);
    bool got = p->n_taken > 0;
    if (got) {
        *ic = p->taken[0];
        memmove(p->taken, p->taken + 1, sizeof *p->taken * (size_t)--p->n_taken);
    }
    pthread_mutex_unlock(&p->lock);
    return got;
}

/* The thread stays in MPI_Comm_accept (nothing cancels it; it ends with the
 * process, and does not hold MPI_Finalize), so p stays allocated: it reads it. */
void vks_rl_join_close(vks_rl_join_point *p) {
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    p->closing = true;
    for (int i = 0; i < p->n_taken; i++) MPI_Comm_free(&p->taken[i]);
    p->n_taken = 0;
    pthread_mutex_unlock(&p->lock);
    unlink(p->path); /* the run takes no more joiners: nobody should try */
}

void vks_rl_join_hello_text(const uint8_t nonce[16], const uint8_t hash[32], uint8_t *out, size_t *len) {
    size_t d = strlen(VKS_RL_JOIN_DOMAIN);
    memcpy(out, VKS_RL_JOIN_DOMAIN, d);
    memcpy(out + d, nonce, 16);
    memcpy(out + d + 16, hash, 32);
    *len = d + 48;
}

/* ---- the joiner's side ---- */

struct vks_rl_joiner {
    MPI_Comm ic;
    char *config;     /* NUL-terminated JSON */
    char *tasks;      /* the task file's bytes (NULL: a built-in task) */
    size_t task_bytes;
    bool verify;
    uint8_t nonce[16];
    int number;       /* the rank number the run gave this connection */
};

typedef struct {
    const char *port;
    MPI_Comm ic;
    int rc;
    bool done, abandoned;
    pthread_mutex_t lock;
} connect_job;

/* MPI_Comm_connect on a thread: it may hang (a dead run, a dead ompi-server). */
static void *connect_main(void *arg) {
    connect_job *j = arg;
    MPI_Comm ic = MPI_COMM_NULL;
    int rc = MPI_Comm_connect((char *)j->port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &ic);
    pthread_mutex_lock(&j->lock);
    bool abandoned = j->abandoned;
    j->ic = ic, j->rc = rc, j->done = true;
    pthread_mutex_unlock(&j->lock);
    if (abandoned) free(j); /* the caller gave up: nobody else frees it */
    return NULL;
}

static int connect_within(const char *port, double timeout_s, MPI_Comm *ic) {
    connect_job *j = calloc(1, sizeof *j);
    if (!j) return vks_set_error(VKS_ERR_NOMEM, "join: out of host memory");
    j->port = port;
    pthread_mutex_init(&j->lock, NULL);
    pthread_t th;
    if (pthread_create(&th, NULL, connect_main, j)) {
        free(j);
        return vks_set_error(VKS_ERR_IO, "join: cannot start a thread");
    }
    pthread_detach(th);
    double until = vks_seconds_now() + timeout_s;
    for (;;) {
        pthread_mutex_lock(&j->lock);
        bool done = j->done;
        if (!done && vks_seconds_now() > until) j->abandoned = true;
        bool gave_up = j->abandoned;
        pthread_mutex_unlock(&j->lock);
        if (gave_up) /* the port string is the caller's: copied below before returning would race; it lives on */
            return vks_set_error(VKS_ERR_TIMEOUT, "join: no connection to the run within %.0f s (is it running, and "
                                 "its ompi-server?)", timeout_s);
        if (done) break;
        usleep(2000);
    }
    int rc = j->rc;
    *ic = j->ic;
    free(j);
    if (rc != MPI_SUCCESS) return vks_set_error(VKS_ERR_IO, "join: MPI_Comm_connect failed (is the run still open to joins?)");
    MPI_Comm_set_errhandler(*ic, MPI_ERRORS_RETURN);
    return VKS_OK;
}

/* Receives the next message under tag from the trainer (rank 0 of ic) within
 * timeout_s, of at most `most` bytes (malloc'd into *buf). */
static int receive_within(MPI_Comm ic, int tag, size_t most, double timeout_s, char **buf, size_t *bytes) {
    double until = vks_seconds_now() + timeout_s;
    for (;;) {
        int flag = 0;
        MPI_Status st;
        if (MPI_Iprobe(0, tag, ic, &flag, &st) != MPI_SUCCESS) return vks_set_error(VKS_ERR_IO, "join: the connection failed");
        if (flag) {
            int count = 0;
            MPI_Get_count(&st, MPI_BYTE, &count);
            if (count < (int)sizeof(vks_rl_msg) || (size_t)count > most) {
                char dummy[sizeof(vks_rl_msg)];
                MPI_Recv(dummy, sizeof dummy, MPI_BYTE, 0, tag, ic, MPI_STATUS_IGNORE); /* truncated: refused */
                return vks_set_error(VKS_ERR_FORMAT, "join: the run sent a message of %d bytes (at most %zu)", count, most);
            }
            *buf = malloc((size_t)count + 1);
            if (!*buf) return vks_set_error(VKS_ERR_NOMEM, "join: out of host memory");
            if (MPI_Recv(*buf, count, MPI_BYTE, 0, tag, ic, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
                free(*buf);
                return vks_set_error(VKS_ERR_IO, "join: the connection failed");
            }
            (*buf)[count] = 0;
            *bytes = (size_t)count;
            return VKS_OK;
        }
        if (vks_seconds_now() > until) return vks_set_error(VKS_ERR_TIMEOUT, "join: the run said nothing for %.0f s", timeout_s);
        usleep(1000);
    }
}

/* ---- a joining pipeline group (mpirun -np S vkswarm join): its first rank
 * talks to the run and passes on what the others need, over its own world ---- */

enum { TAG_GROUP_SHARE = 7110, TAG_GROUP_HASH = 7111 };

/* What the first rank passes on: status 0 and the body (a: config bytes, b:
 * task bytes; or a: 0 and number, step: the admission), or status 1 and the
 * body a: why it failed (text). */
typedef struct {
    int32_t status, number;
    int64_t step;
    uint64_t a, b;
} share_head;

static int world_size(void) {
    int n = 1;
    MPI_Comm_size(vks_mpi_world(), &n);
    return n;
}

static int world_rank(void) {
    int r = 0;
    MPI_Comm_rank(vks_mpi_world(), &r);
    return r;
}

/* The first rank: head and body to every other rank of the world, bounded. */
static int share_send(const share_head *head, const char *body, double timeout_s) {
    MPI_Comm w = vks_mpi_world();
    int n = world_size(), k = 0;
    uint64_t bytes = head->a + head->b;
    if (bytes > INT_MAX) return vks_set_error(VKS_ERR_ARG, "join: %llu bytes to pass on", (unsigned long long)bytes);
    MPI_Request *reqs = malloc(sizeof *reqs * 2 * (size_t)n);
    int *peer = malloc(sizeof *peer * 2 * (size_t)n);
    if (!reqs || !peer) {
        free(reqs), free(peer);
        return vks_set_error(VKS_ERR_NOMEM, "join: out of host memory");
    }
    for (int r = 1; r < n; r++) {
        peer[k] = r;
        MPI_Isend(head, sizeof *head, MPI_BYTE, r, TAG_GROUP_SHARE, w, &reqs[k++]);
        if (bytes) peer[k] = r, MPI_Isend(body, (int)bytes, MPI_BYTE, r, TAG_GROUP_SHARE, w, &reqs[k++]);
    }
    int rc = vks_mpi_wait_within(w, reqs, peer, k, timeout_s, "a stage of this group taking what the run sent");
    if (!rc) free(reqs); /* else MPI still holds them: the process ends */
    free(peer);
    return rc;
}

/* Any other rank: the first rank's head and body (at most `most` bytes,
 * malloc'd, NUL-terminated), within timeout_s. status 1: VKS_ERR_ARG with its text. */
static int share_receive(share_head *head, char **body, size_t most, double timeout_s) {
    MPI_Comm w = vks_mpi_world();
    int first = 0;
    MPI_Request req;
    *body = NULL;
    MPI_Irecv(head, sizeof *head, MPI_BYTE, 0, TAG_GROUP_SHARE, w, &req);
    int rc = vks_mpi_wait_within(w, &req, &first, 1, timeout_s, "the group's first stage joining the run");
    if (rc) return rc;
    uint64_t bytes = head->a + head->b;
    if (head->a > most || head->b > most || bytes > most || (uint32_t)head->status > 1)
        return vks_set_error(VKS_ERR_FORMAT, "join: the group's first stage passed on a malformed message");
    if (!(*body = malloc(bytes + 1))) return vks_set_error(VKS_ERR_NOMEM, "join: out of host memory");
    (*body)[bytes] = 0;
    if (bytes) {
        MPI_Irecv(*body, (int)bytes, MPI_BYTE, 0, TAG_GROUP_SHARE, w, &req);
        if ((rc = vks_mpi_wait_within(w, &req, &first, 1, timeout_s, "the group's first stage joining the run"))) {
            *body = NULL; /* MPI's */
            return rc;
        }
    }
    if (head->status) {
        char shown[4 * VKS_RL_REASON_MAX + 1];
        vks_escape(*body, strnlen(*body, bytes), shown, sizeof shown);
        free(*body);
        *body = NULL;
        return vks_set_error(VKS_ERR_ARG, "the group's first stage: %s", shown);
    }
    return VKS_OK;
}

/* The first rank: its failure to the others (best effort: they end anyway). */
static void share_failure(double timeout_s) {
    if (world_size() < 2) return;
    char why[VKS_RL_REASON_MAX];
    snprintf(why, sizeof why, "%s", vks_last_error());
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", vks_last_error());
    share_head h = {.status = 1, .a = strlen(why)};
    share_send(&h, why, timeout_s);
    vks_set_error(VKS_ERR_ARG, "%s", saved);
}

/* The first (or only) rank: the connection, the WELCOME and the NONCE. */
static int connect_first(const char *port, double timeout_s, vks_rl_joiner *j) {
    int rc = connect_within(port, timeout_s, &j->ic);
    char *buf = NULL;
    size_t bytes = 0;
    if (!rc) rc = receive_within(j->ic, TAG_JOIN, sizeof(vks_rl_msg) + VKS_RL_JOIN_MAX_CONFIG + VKS_RL_JOIN_MAX_TASKS,
                                 timeout_s, &buf, &bytes);
    vks_rl_msg h;
    if (!rc) {
        memcpy(&h, buf, sizeof h);
        size_t body = bytes - sizeof h;
        if (h.magic != VKS_RL_MAGIC || h.type != MSG_WELCOME || h.n == 0 || h.n > VKS_RL_JOIN_MAX_CONFIG ||
            h.batch < 0 || (uint64_t)h.batch > VKS_RL_JOIN_MAX_TASKS || h.n + (uint64_t)h.batch != body || h.step < 0 || h.step > 1)
            rc = vks_set_error(VKS_ERR_FORMAT, "join: the run's welcome is malformed");
    }
    if (!rc) {
        j->config = malloc(h.n + 1);
        j->task_bytes = (size_t)h.batch;
        j->tasks = j->task_bytes ? malloc(j->task_bytes) : NULL;
        if (!j->config || (j->task_bytes && !j->tasks)) rc = vks_set_error(VKS_ERR_NOMEM, "join: out of host memory");
    }
    if (!rc) {
        memcpy(j->config, buf + sizeof h, h.n);
        j->config[h.n] = 0;
        if (strlen(j->config) != h.n) rc = vks_set_error(VKS_ERR_FORMAT, "join: the run's config holds a NUL byte");
        if (j->task_bytes) memcpy(j->tasks, buf + sizeof h + h.n, j->task_bytes);
        j->verify = h.step & 1;
    }
    free(buf);
    buf = NULL;
    if (!rc) rc = receive_within(j->ic, TAG_JOIN, sizeof(vks_rl_msg), timeout_s, &buf, &bytes);
    if (!rc) {
        memcpy(&h, buf, sizeof h);
        if (h.magic != VKS_RL_MAGIC || h.type != MSG_NONCE || h.n < 1 || h.n > INT_MAX)
            rc = vks_set_error(VKS_ERR_FORMAT, "join: the run's nonce is malformed");
        memcpy(j->nonce, &h.batch, 8), memcpy(j->nonce + 8, &h.step, 8);
        j->number = (int)h.n;
    }
    free(buf);
    return rc;
}

/* Another rank of a joining group: the config and task file from the first. */
static int follow_first(double timeout_s, vks_rl_joiner *j) {
    share_head h;
    char *body = NULL;
    /* the first rank may take timeout_s to connect, then as long for the welcome */
    int rc = share_receive(&h, &body, VKS_RL_JOIN_MAX_CONFIG + VKS_RL_JOIN_MAX_TASKS, 2 * timeout_s + 5);
    if (!rc && (h.a == 0 || h.a > VKS_RL_JOIN_MAX_CONFIG || h.b > VKS_RL_JOIN_MAX_TASKS || (uint32_t)h.step > 1 ||
                strnlen(body, h.a) != h.a))
        rc = vks_set_error(VKS_ERR_FORMAT, "join: the group's first stage passed on a malformed config");
    if (!rc && h.b && !(j->tasks = malloc(h.b))) rc = vks_set_error(VKS_ERR_NOMEM, "join: out of host memory");
    if (!rc) {
        if (h.b) memcpy(j->tasks, body + h.a, h.b);
        j->task_bytes = h.b, j->verify = h.step & 1;
        body[h.a] = 0;
        j->config = body, body = NULL;
    }
    free(body);
    return rc;
}

int vks_rl_join_connect(const char *port, double timeout_s, vks_rl_joiner **out) {
    *out = NULL;
    bool first = world_rank() == 0;
    if ((first && (!port || !port[0] || strlen(port) >= MPI_MAX_PORT_NAME)) || !(timeout_s > 0))
        return vks_set_error(VKS_ERR_ARG, "join: bad port or timeout");
    vks_rl_joiner *j = calloc(1, sizeof *j);
    if (!j) return vks_set_error(VKS_ERR_NOMEM, "join: out of host memory");
    j->ic = MPI_COMM_NULL;
    int rc = first ? connect_first(port, timeout_s, j) : follow_first(timeout_s, j);
    if (first && world_size() > 1) { /* the others wait for the config, or why there is none */
        if (rc) share_failure(timeout_s);
        else {
            size_t c = strlen(j->config);
            char *body = malloc(c + j->task_bytes + 1);
            share_head h = {.step = j->verify, .a = c, .b = j->task_bytes};
            if (!body) rc = vks_set_error(VKS_ERR_NOMEM, "join: out of host memory");
            else {
                memcpy(body, j->config, c);
                if (j->task_bytes) memcpy(body + c, j->tasks, j->task_bytes);
                rc = share_send(&h, body, timeout_s);
                if (!rc) free(body); /* else MPI's: the process ends */
            }
        }
    }
    if (rc) {
        vks_rl_joiner_free(j);
        return rc;
    }
    *out = j;
    return VKS_OK;
}

const char *vks_rl_joiner_config(const vks_rl_joiner *j) { return j->config; }
const void *vks_rl_joiner_tasks(const vks_rl_joiner *j, size_t *bytes) {
    *bytes = j->task_bytes;
    return j->tasks;
}
bool vks_rl_joiner_verify(const vks_rl_joiner *j) { return j->verify; }

/* The first (or only) rank: the signed HELLO, and the run's answer (*number, *step). */
static int hello_and_answer(vks_rl_joiner *j, const vks_rl_mpi_options *mo, const uint8_t hash[32], int *number,
                            int64_t *step) {
    char hello[sizeof(vks_rl_msg) + VKS_RL_JOIN_HELLO_BYTES];
    vks_rl_msg h = {.magic = VKS_RL_MAGIC, .type = MSG_HELLO, .n = VKS_RL_JOIN_HELLO_BYTES};
    memcpy(hello, &h, sizeof h);
    memcpy(hello + sizeof h, hash, 32);
    memcpy(hello + sizeof h + 32, mo->join_secret_key + 32, 32); /* libsodium's secret key ends with the public key */
    uint8_t text[64 + 48];
    size_t len = 0;
    vks_rl_join_hello_text(j->nonce, hash, text, &len);
    crypto_sign_detached((uint8_t *)hello + sizeof h + 64, NULL, text, len, mo->join_secret_key);
    bool freeable = true;
    int rc = vks_rl_wire_send(j->ic, 0, TAG_UP, hello, sizeof hello, mo->timeout_s, "the trainer taking the hello",
                              &freeable);
    if (rc) return rc; /* hello is on this stack: the process ends now (the CLI exits) */
    char *buf = NULL;
    size_t bytes = 0;
    rc = receive_within(j->ic, TAG_JOIN, sizeof(vks_rl_msg) + VKS_RL_REASON_MAX, mo->timeout_s, &buf, &bytes);
    if (rc) return rc;
    memcpy(&h, buf, sizeof h);
    if (h.magic == VKS_RL_MAGIC && h.type == MSG_NOT_ADMITTED) {
        char reason[4 * VKS_RL_REASON_MAX + 1];
        vks_escape(buf + sizeof h, strnlen(buf + sizeof h, bytes - sizeof h), reason, sizeof reason);
        free(buf);
        return vks_set_error(VKS_ERR_ARG, "the run did not admit this machine: %s", reason);
    }
    free(buf);
    if (h.magic != VKS_RL_MAGIC || h.type != MSG_ADMIT || bytes != sizeof h || h.n < 1 || h.n > INT_MAX)
        return vks_set_error(VKS_ERR_FORMAT, "join: the run's answer is malformed");
    *number = (int)h.n, *step = h.step;
    return VKS_OK;
}

/* A group: every stage loaded the same model (each from its own disk). */
static int same_models(const uint8_t hash[32], double timeout_s) {
    int n = world_size();
    uint8_t *all = malloc((size_t)32 * (size_t)n);
    if (!all) return vks_set_error(VKS_ERR_NOMEM, "join: out of host memory");
    int rc = vks_mpi_exchange(vks_mpi_world(), hash, all, 32, TAG_GROUP_HASH, timeout_s, "the group's stages naming their models");
    for (int s = 1; !rc && s < n; s++)
        if (memcmp(all + 32 * (size_t)s, all, 32)) {
            char mine[65], first[65];
            vks_hash_hex(all + 32 * (size_t)s, mine), vks_hash_hex(all, first);
            rc = vks_set_error(VKS_ERR_ARG, "join: stage %d of this group loaded model %s, stage 0 model %s: every stage "
                               "loads the same base model", s, mine, first);
        }
    free(all);
    return rc;
}

int vks_rl_join_run(vks_rl_joiner *j, const vks_rl_run_options *o, const vks_rl_mpi_options *mo, const uint8_t hash[32],
                    bool *no_finalize) {
    *no_finalize = true; /* until the trainer says otherwise */
    if (!j || !o || !mo || !hash || !(mo->timeout_s > 0) || !mo->join_secret_key)
        return vks_set_error(VKS_ERR_ARG, "join: bad options");
    int n = world_size(), me = world_rank(), number = 0;
    int64_t step = 0;
    if (n > 1 && o->config && o->config->lora_rank > 0) /* its stages would each need the adapter relayed */
        return vks_set_error(VKS_ERR_ARG, "join: a pipeline group cannot join a LoRA run yet (join with one process)");
    int rc = n > 1 ? same_models(hash, mo->timeout_s) : VKS_OK;
    if (rc) return rc;
    if (me == 0) {
        rc = hello_and_answer(j, mo, hash, &number, &step);
        if (n > 1) {
            share_head h = {.number = number, .step = step};
            if (rc) share_failure(mo->timeout_s);
            else rc = share_send(&h, "", mo->timeout_s);
        }
    } else {
        share_head h = {0};
        char *body = NULL;
        rc = share_receive(&h, &body, VKS_RL_REASON_MAX, 2 * mo->timeout_s + 5);
        if (!rc && (h.a || h.b || h.number < 1)) rc = vks_set_error(VKS_ERR_FORMAT, "join: a malformed admission from the group's first stage");
        free(body);
        number = h.number, step = h.step;
    }
    if (rc) return rc;
    if (n > 1)
        fprintf(stderr, "vkswarm: join: admitted as rank %d of the run, stage %d of its %d (policy step %lld)\n", number, me,
                n, (long long)step);
    else fprintf(stderr, "vkswarm: join: admitted as rank %d of the run (policy step %lld)\n", number, (long long)step);
    rc = vks_rl_inference_joined(o, mo, me == 0 ? j->ic : MPI_COMM_NULL, number, no_finalize);
    if (me == 0 && !*no_finalize && MPI_Comm_disconnect(&j->ic) == MPI_SUCCESS) j->ic = MPI_COMM_NULL;
    return rc;
}

void vks_rl_joiner_free(vks_rl_joiner *j) {
    if (!j) return;
    free(j->config), free(j->tasks);
    free(j);
}
