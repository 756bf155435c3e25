/* dead_receiver: the Shardcast origin outlives a receiver that died while the
 * origin made no MPI call (3 ranks: origin 0, receivers 1 and 2, no relay).
 * Version 1 goes to both, so every connection is up. Rank 2 then kills
 * itself (SIGKILL) while the origin makes no MPI call, as the RL trainer does
 * while it trains: the origin waits, outside MPI, until rank 2's process is
 * dead (its sockets closed), not for a fixed time, so the premise holds on a
 * fast machine, a slow one and a loaded one. Its transport has not read that
 * connection's end when it sends version 2, so the manifest and the beat
 * after it are written to the closed connection: the second write raises
 * SIGPIPE, which ended the origin without a word until vks_mpi_start ignored
 * it. Expected: rank 0 prints "rank 0: version 2: rank 1 ok, rank 2 not" and
 * rank 1 "rank 1: version 2 ok", each within the broadcast's bounds
 * (timeout_s 2); rank 0 leaves once rank 1 has printed (DIR/rank-1.done).
 * Usage: mpirun --enable-recovery -np 3 dead_receiver DIR (receivers' stores
 * go to DIR/rank-R). Every rank leaves without MPI_Finalize (a rank is dead). */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "vkswarm/vks_broadcast.h"
#include "vkswarm/vks_common.h"
#include "vkswarm/vks_mpi.h"

#define FILE_BYTES (600u << 10)
#define WAIT_S 30.0 /* bound on each wait for another process (test premise) */

static void say(int rank, const char *what) {
    printf("rank %d: %s\n", rank, what);
    fflush(stdout);
}

/* Origin: version `version` of a made-up file to every rank not dropped. */
static int send_version(vks_bcast *b, const uint8_t *sk, uint64_t version, uint8_t *data) {
    memset(data, (int)version, FILE_BYTES);
    vks_manifest_params p = {.version = version, .step = version, .shard_size = VKS_SHARD_MIN_BYTES};
    vks_model_id_hash("dead-receiver-test", p.model_hash);
    vks_manifest m = {0};
    uint8_t *wire = NULL, *blob = NULL;
    size_t blob_len = 0;
    vks_bcast_report rep;
    int rc = vks_manifest_build(data, FILE_BYTES, NULL, 0, &p, &m, &wire);
    if (!rc) rc = vks_manifest_sign(&m, sk, &blob, &blob_len);
    if (!rc) rc = vks_bcast_send(b, blob, blob_len, wire, m.wire_size, &rep);
    free(blob), free(wire);
    vks_manifest_free(&m);
    return rc;
}

/* Whether process `pid` has ended (gone, or a zombie: its files, sockets
 * included, are closed by then). */
static bool process_ended(long pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return true;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* "pid (comm) STATE ..." */
    return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

/* Waits (no MPI call) until `done` says so, at most WAIT_S; false then. */
static bool wait_for(bool (*done)(const void *), const void *arg) {
    double until = vks_seconds_now() + WAIT_S;
    while (!done(arg))
        if (vks_seconds_now() > until) return false;
        else usleep(1000);
    return true;
}

static bool pid_ended(const void *pid) { return process_ended(*(const long *)pid); }
static bool file_exists(const void *path) { return access((const char *)path, F_OK) == 0; }

/* Nodes: the next broadcast (bounded by the manifest timeout). */
static int receive_one(vks_bcast *b) {
    double until = vks_seconds_now() + 20;
    while (!vks_bcast_waiting(b))
        if (vks_seconds_now() > until) return vks_set_error(VKS_ERR_TIMEOUT, "no manifest within 20 s");
        else usleep(1000);
    vks_bcast_report rep;
    return vks_bcast_receive(b, &rep);
}

int main(int argc, char **argv) {
    int rank, size;
    vks_mpi_start(VKS_MPI_THREADS_SINGLE, &rank, &size);
    if (size != 3 || argc != 2) {
        fprintf(stderr, "dead_receiver: run with 3 ranks and a directory\n");
        _exit(2);
    }
    uint8_t pk[VKS_PUBLIC_KEY_BYTES] = {0}, sk[VKS_SECRET_KEY_BYTES] = {0};
    if (rank == 0 && vks_keypair_new(pk, sk)) _exit(2);
    MPI_Bcast(pk, sizeof pk, MPI_BYTE, 0, MPI_COMM_WORLD);
    long pid = (long)getpid(), pids[3] = {0};
    MPI_Gather(&pid, 1, MPI_LONG, pids, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    char store[4096], rank1_done[4096];
    snprintf(store, sizeof store, "%s/rank-%d", argv[1], rank);
    snprintf(rank1_done, sizeof rank1_done, "%s/rank-1.done", argv[1]);
    vks_bcast_options o = {.relays = 0, .fanout = 2, .chunk_bytes = 64u << 10, .timeout_s = 2, .manifest_timeout_s = 20,
                           .store_dir = rank ? store : NULL};
    memcpy(o.public_key, pk, sizeof pk);
    vks_bcast *b = NULL;
    char line[600];
    if (vks_bcast_create(MPI_COMM_WORLD, &o, &b)) {
        snprintf(line, sizeof line, "start-up: %s", vks_last_error());
        say(rank, line);
        _exit(1);
    }
    if (rank == 0) {
        uint8_t *data = malloc(FILE_BYTES);
        if (!data) _exit(2);
        int rc = send_version(b, sk, 1, data);
        say(rank, rc ? vks_last_error() : "version 1 ok");
        if (!wait_for(pid_ended, &pids[2])) { /* no MPI call while rank 2 dies */
            say(rank, "rank 2 did not end within 30 s (test premise)");
            _exit(1);
        }
        double t0 = vks_seconds_now();
        rc = send_version(b, sk, 2, data);
        snprintf(line, sizeof line, "version 2: rank 1 %s, rank 2 %s in %.1f s (%s)", vks_bcast_rank_ok(b, 1) ? "ok" : "not",
                 vks_bcast_rank_ok(b, 2) ? "ok" : "not", vks_seconds_now() - t0, rc ? vks_last_error() : "no error");
        say(rank, line);
        if (!wait_for(file_exists, rank1_done)) /* a leaving rank may end the job: rank 1 first */
            say(rank, "rank 1 did not say it printed within 30 s");
        free(data);
    } else {
        int rc = receive_one(b);
        if (rank == 2) raise(SIGKILL); /* right after version 1 (the origin is asleep) */
        say(rank, rc ? vks_last_error() : "version 1 ok");
        rc = receive_one(b);
        say(rank, rc ? vks_last_error() : "version 2 ok");
        FILE *f = fopen(rank1_done, "w"); /* rank 0 may leave now */
        if (f) fclose(f);
    }
    _exit(0);
}
