/* vkswarm keygen / broadcast: Shardcast from the command line (issue 6). */
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "cli_mpi.h"
#include "cli_util.h"
#include "commands.h"
#include "vkswarm/vks_broadcast.h"
#include "vkswarm/vks_mpi.h"
#include "vkswarm/vks_shard.h"

static const char keygen_usage[] =
    "usage: vkswarm keygen --out DIR\n"
    "Writes an Ed25519 key pair for signed weight broadcast: DIR/shardcast.key (secret, mode 0600,\n"
    "for the trainer) and DIR/shardcast.pub (for every receiver). Existing files are not overwritten.\n"
    "The same pair is a machine's identity when it joins a run (vkswarm join --key DIR; the run's\n"
    "rl --join-allow FILE lists the DIR/shardcast.pub lines it admits).\n";

int cmd_keygen(int argc, char **argv) {
    const char *out = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(keygen_usage, stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--out")) cli_usage_error("keygen", "option '--out' needs a value");
        else if (argv[i][0] == '-') cli_usage_error("keygen", "unknown option '%s'", argv[i]);
        else cli_usage_error("keygen", "unexpected argument '%s'", argv[i]);
    }
    if (!out) cli_usage_error("keygen", "--out DIR is required");
    if (vks_keygen(out)) cli_die(1, "%s", vks_last_error());
    printf("%s/shardcast.pub\n%s/shardcast.key\n", out, out);
    return 0;
}

static const char broadcast_usage[] =
    "usage: mpirun -np N vkswarm broadcast --file F --key SECRET_KEY --pub PUBLIC_KEY --out DIR [options]\n"
    "Signed, sharded weight broadcast. Rank 0 (the origin) cuts F into shards, signs the manifest with\n"
    "SECRET_KEY and sends it down a tree: ranks 1..R are relays, the rest receivers. Every rank checks\n"
    "the signature against PUBLIC_KEY and each shard's BLAKE2b-256; receivers switch DIR/rank-N/current\n"
    "to the verified file atomically and print 'rank N version V HASH' on stdout.\n"
    "options:\n"
    "  --relays R            relay ranks (default: (N-1)/3)\n"
    "  --fanout F            children per tree node (default 2)\n"
    "  --shard-mb S          shard size in MiB, fractions allowed (default 32)\n"
    "  --chunk-kb K          pipelining unit in KiB (default 1024)\n"
    "  --link-latency-ms L   emulated one-way latency per link (default 0)\n"
    "  --link-mbps M         emulated bandwidth per link in Mbit/s (default 0 = unlimited)\n"
    "  --shared-uplink       emulation: each rank has one uplink of M Mbit/s shared by all the ranks\n"
    "                        it sends to (a home connection), not one link per destination\n"
    "  --weights-version V   version number (> the receivers' current one; default 1)\n"
    "  --step S              training step recorded in the manifest (default 0)\n"
    "  --model-id ID         model identity hashed into the manifest (default 'default')\n"
    "  --delta xor|sub       send shards as zstd'd deltas against --base when smaller\n"
    "  --base FILE           the previous version's file (the receivers' current one)\n"
    "  --base-version B      its version number (default V-1)\n"
    "  --keep K              versions kept by relays and receivers (default 2)\n"
    "  --timeout-s T         silence of a parent, of the origin or of any rank before it counts as gone\n"
    "                        (default 30); bounds every wait, start-up and the end included\n"
    "  --status-out FILE     origin: JSON outcome per rank, written atomically (\"complete\": false until\n"
    "                        the end; removed at start, so a missing file means the origin failed).\n"
    "                        Read it: with --enable-recovery mpirun exits 0 whatever happened\n"
    "environment: VKSWARM_FAULT=corrupt:RANK[:SHARD] | short:RANK | die:RANK | stop:RANK | badsig (tests only).\n"
    "Hidden benchmark mode: --baseline p2p|mpi-bcast --bytes N prints the seconds of one transfer.\n";

typedef struct {
    const char *file, *key, *pub, *out, *model_id, *base, *baseline, *status_out;
    int relays, fanout, keep;
    bool shared_uplink;
    double shard_mb, chunk_kb, latency_ms, mbps, timeout_s;
    uint64_t version, step, base_version, bytes;
    vks_delta_mode delta;
} bcast_args;

static void parse_args(int argc, char **argv, bcast_args *a) {
    static const struct option opts[] = {
        {"file", required_argument, 0, 0}, {"key", required_argument, 0, 0}, {"pub", required_argument, 0, 0},
        {"out", required_argument, 0, 0}, {"model-id", required_argument, 0, 0}, {"base", required_argument, 0, 0},
        {"baseline", required_argument, 0, 0}, {"status-out", required_argument, 0, 0},
        {"relays", required_argument, 0, 0}, {"fanout", required_argument, 0, 0}, {"keep", required_argument, 0, 0},
        {"shard-mb", required_argument, 0, 0}, {"chunk-kb", required_argument, 0, 0},
        {"link-latency-ms", required_argument, 0, 0}, {"link-mbps", required_argument, 0, 0},
        {"timeout-s", required_argument, 0, 0}, {"weights-version", required_argument, 0, 0},
        {"step", required_argument, 0, 0}, {"base-version", required_argument, 0, 0},
        {"bytes", required_argument, 0, 0}, {"delta", required_argument, 0, 0},
        {"shared-uplink", no_argument, 0, 0}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    *a = (bcast_args){.model_id = "default", .relays = -1, .fanout = 2, .keep = 2, .shard_mb = 32, .chunk_kb = 1024,
                      .timeout_s = 30, .version = 1};
    int c, idx;
    while ((c = cli_getopt(argc, argv, "h", opts, &idx)) != -1) {
        if (c == 'h') {
            fputs(broadcast_usage, stdout);
            exit(0);
        }
        char o[32]; /* "--name", as the messages name it */
        snprintf(o, sizeof o, "--%s", opts[idx].name);
        const char *v = optarg;
        if (!strcmp(o, "--shared-uplink")) a->shared_uplink = true;
        else if (!strcmp(o, "--file")) a->file = v;
        else if (!strcmp(o, "--key")) a->key = v;
        else if (!strcmp(o, "--pub")) a->pub = v;
        else if (!strcmp(o, "--out")) a->out = v;
        else if (!strcmp(o, "--model-id")) a->model_id = v;
        else if (!strcmp(o, "--base")) a->base = v;
        else if (!strcmp(o, "--baseline")) a->baseline = v;
        else if (!strcmp(o, "--status-out")) a->status_out = v;
        else if (!strcmp(o, "--relays")) a->relays = (int)cli_parse_long(o, v, 0, 1 << 20);
        else if (!strcmp(o, "--fanout")) a->fanout = (int)cli_parse_long(o, v, 1, 64);
        else if (!strcmp(o, "--keep")) a->keep = (int)cli_parse_long(o, v, 1, 8);
        else if (!strcmp(o, "--shard-mb")) a->shard_mb = cli_parse_double(o, v, 4096.0 / 1048576, 1024);
        else if (!strcmp(o, "--chunk-kb")) a->chunk_kb = cli_parse_double(o, v, 1, 1 << 20);
        else if (!strcmp(o, "--link-latency-ms")) a->latency_ms = cli_parse_double(o, v, 0, 1e5);
        else if (!strcmp(o, "--link-mbps")) a->mbps = cli_parse_double(o, v, 0, 1e7);
        else if (!strcmp(o, "--timeout-s")) a->timeout_s = cli_parse_double(o, v, 0.1, 1e5);
        else if (!strcmp(o, "--weights-version")) a->version = cli_parse_u64(o, v);
        else if (!strcmp(o, "--step")) a->step = cli_parse_u64(o, v);
        else if (!strcmp(o, "--base-version")) a->base_version = cli_parse_u64(o, v);
        else if (!strcmp(o, "--bytes")) a->bytes = cli_parse_u64(o, v);
        else if (!strcmp(o, "--delta")) {
            if (!strcmp(v, "xor")) a->delta = VKS_DELTA_XOR;
            else if (!strcmp(v, "sub")) a->delta = VKS_DELTA_SUB;
            else cli_die(EXIT_BAD_INPUT, "--delta: '%s' is not xor or sub", v);
        }
    }
    if (optind < argc) cli_usage_error("broadcast", "unexpected argument '%s'", argv[optind]);
    if (a->version == 0) cli_die(EXIT_BAD_INPUT, "--weights-version: must be at least 1");
    if (a->delta && !a->base) cli_die(EXIT_BAD_INPUT, "broadcast: --delta needs --base FILE");
    if (a->delta && !a->base_version) a->base_version = a->version - 1;
}

static int read_whole(const char *path, uint8_t **out, size_t *len) {
    *out = NULL;
    FILE *f = NULL;
    if (vks_fopen_regular(path, &f)) return VKS_ERR_ARG; /* a FIFO must not block */
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || st.st_size <= 0) {
        fclose(f);
        return vks_set_error(VKS_ERR_ARG, "%s: empty or unreadable", path);
    }
    *len = (size_t)st.st_size;
    *out = malloc(*len);
    bool ok = *out && fread(*out, 1, *len, f) == *len;
    fclose(f);
    if (!ok) return vks_set_error(*out ? VKS_ERR_IO : VKS_ERR_NOMEM, "%s: cannot read %zu bytes", path, *len);
    return VKS_OK;
}

typedef struct {
    cli_progress p;
    char what[32];
} progress_ctx;

static void on_progress(void *ctx, uint64_t done, uint64_t total) {
    progress_ctx *c = ctx;
    cli_progress_update(&c->p, (long)(done >> 10), (long)(total >> 10), "KiB");
}

/* The origin's manifest, built on a thread while the main thread keeps the
 * heartbeats going (hashing a large file takes longer than --timeout-s). */
typedef struct {
    const bcast_args *a;
    const uint8_t *sk;
    uint8_t *data, *base, *wire, *blob;
    size_t len, base_len, blob_len;
    vks_manifest m;
    int rc;
    char err[1024];
    atomic_bool done;
} origin_prep;

static void *prepare(void *arg) {
    origin_prep *p = arg;
    const bcast_args *a = p->a;
    vks_manifest_params mp = {.version = a->version, .step = a->step, .delta = a->delta,
                              .base_version = a->base_version, .shard_size = (uint32_t)(a->shard_mb * 1048576.0)};
    vks_model_id_hash(a->model_id, mp.model_hash);
    p->rc = read_whole(a->file, &p->data, &p->len);
    if (!p->rc && a->base) p->rc = read_whole(a->base, &p->base, &p->base_len);
    if (!p->rc) p->rc = vks_manifest_build(p->data, p->len, p->base, p->base_len, &mp, &p->m, &p->wire);
    if (!p->rc && vks_manifest_sign(&p->m, p->sk, &p->blob, &p->blob_len)) {
        vks_manifest_free(&p->m);
        p->rc = VKS_ERR_IO;
    }
    if (p->rc) snprintf(p->err, sizeof p->err, "%s", vks_last_error());
    atomic_store(&p->done, true);
    return NULL;
}

static int prepare_origin(vks_bcast *b, origin_prep *p) {
    pthread_t t;
    if (pthread_create(&t, NULL, prepare, p) != 0) cli_die(1, "broadcast: cannot start a thread");
    while (!atomic_load(&p->done)) {
        vks_bcast_keepalive(b);
        usleep(10000);
    }
    pthread_join(t, NULL);
    if (!p->rc) return 0;
    fprintf(stderr, "vkswarm: %s\n", p->err);
    free(p->data);
    free(p->base);
    vks_bcast_cancel(b);
    return p->rc == VKS_ERR_ARG || p->rc == VKS_ERR_FORMAT ? EXIT_BAD_INPUT : 1;
}

/* Rank 0: build, sign and send. */
static int run_origin(vks_bcast *b, const bcast_args *a, const uint8_t sk[VKS_SECRET_KEY_BYTES]) {
    origin_prep p = {.a = a, .sk = sk};
    int status = prepare_origin(b, &p);
    if (status) return status;
    const char *fault = getenv("VKSWARM_FAULT");
    if (fault && !strcmp(fault, "badsig")) p.blob[20] ^= 1; /* tamper after signing */
    fprintf(stderr, "broadcast: version %llu, %zu bytes in %u shards, %llu bytes on the wire", (unsigned long long)a->version,
            p.len, p.m.n_shards, (unsigned long long)p.m.wire_size);
    if (a->delta) fprintf(stderr, " (delta saves %llu bytes)", (unsigned long long)(p.len - p.m.wire_size));
    fputc('\n', stderr);
    vks_bcast_report r;
    int rc = vks_bcast_send(b, p.blob, p.blob_len, p.wire, p.m.wire_size, &r);
    fprintf(stderr, "broadcast: %d ranks ok, %d failed, %.2fs", r.ranks_ok, r.ranks_failed, r.seconds);
    if (r.ranks_ok > 0 && r.seconds > 0) /* a rate only for bytes that arrived somewhere */
        fprintf(stderr, ", %.1f MB/s per receiver", (double)r.wire_bytes / r.seconds / 1e6);
    fputc('\n', stderr);
    if (rc) fprintf(stderr, "vkswarm: %s\n", vks_last_error());
    vks_manifest_free(&p.m);
    free(p.blob);
    free(p.data);
    free(p.base);
    /* wire stays allocated: sends to a dead rank may still reference it */
    if (!rc) free(p.wire);
    return rc == VKS_ERR_FORMAT ? EXIT_BAD_INPUT : rc ? 1 : 0;
}

static int run_baseline(const bcast_args *a, int rank) {
    if (!a->bytes) cli_die(EXIT_BAD_INPUT, "--baseline needs --bytes N");
    vks_link_options lo = {.latency_ms = a->latency_ms, .mbps = a->mbps};
    double s = 0;
    if (vks_bcast_baseline(vks_mpi_world(), a->baseline, (size_t)a->bytes, &lo, a->shared_uplink,
                           (size_t)(a->chunk_kb * 1024), &s))
        cli_die(EXIT_BAD_INPUT, "%s", vks_last_error());
    if (rank == 0) printf("%s %llu bytes %.3f s\n", a->baseline, (unsigned long long)a->bytes, s);
    return 0;
}

/* ---- ending the job ----
 * A blocking MPI call cannot time out and Open MPI cannot finalize once a
 * rank is gone (with --enable-recovery; without it mpirun ends the job).
 * Start-up and MPI_Finalize run under a watchdog; the closing handshake
 * (vks_bcast_close) is bounded by --timeout-s and tells each rank whether
 * every rank is still there. */

/* The status a stuck MPI_Init (1) or MPI_Finalize (the job's own) ends with. */
static int stuck_status = 1;

static void on_stuck(const char *message) {
    fprintf(stderr, "vkswarm: broadcast: %s\n", message);
    fflush(stdout);
    fflush(stderr);
    _exit(stuck_status);
}

/* Leaves without MPI_Finalize. `end_all`: abort the job, which is what ends a
 * rank that is stopped rather than dead (needed under --enable-recovery). */
_Noreturn static void leave_job(int status, bool end_all) {
    if (!end_all) cli_exit_now(status); /* _exit, after checking that stdout took the result */
    cli_stdout_ok(); /* says so when the results did not reach stdout */
    cli_mpi_abort(status ? status : 1);
}

_Noreturn static void end_job(vks_bcast *b, int rank, int rc, double timeout_s) {
    int lost = 0;
    if (vks_bcast_close(b, rc, &lost)) {
        fprintf(stderr, "vkswarm: %s\n", vks_last_error());
        if (!rc) rc = 1;
        if (rank != 0) leave_job(rc, true); /* the origin is silent: nobody else will end the job */
    }
    if (lost > 0) {
        fprintf(stderr, "broadcast: rank %d: %d rank(s) silent, %s\n", rank, lost,
                rank == 0 ? "aborting the job (which ends a stopped rank too)" : "leaving without MPI_Finalize");
        if (rank == 0 && !rc) rc = 1;
        leave_job(rc, rank == 0); /* the origin last: every other rank has had its say */
    }
    vks_bcast_destroy(b);
    stuck_status = rc;
    vks_mpi_stop_within(timeout_s, on_stuck);
    exit(rc); /* the stdout check at exit (cli_guard_stdout) still runs */
}

int cmd_broadcast(int argc, char **argv) {
    bcast_args a;
    parse_args(argc, argv, &a);
    int rank = 0, size = 1;
    /* MPI_Init waits for every rank: bounded (it takes seconds on its own) */
    vks_mpi_start_within(VKS_MPI_THREADS_FUNNELED, a.timeout_s > 10 ? a.timeout_s : 10, on_stuck, &rank, &size);
    if (a.baseline) {
        int rc = run_baseline(&a, rank);
        vks_mpi_stop();
        return rc;
    }
    if (size < 2) cli_die(EXIT_BAD_INPUT, "broadcast: run under mpirun with 2 ranks or more");
    if (!a.pub || !a.out || (rank == 0 && (!a.file || !a.key)))
        cli_usage_error("broadcast", "--file, --key (origin), --pub and --out are required");
    if (sodium_init() < 0) cli_die(1, "libsodium failed to initialize");
    vks_bcast_options o = {.relays = a.relays >= 0 ? a.relays : (size - 1) / 3, .fanout = a.fanout,
                           .chunk_bytes = (size_t)(a.chunk_kb * 1024), .timeout_s = a.timeout_s,
                           .manifest_timeout_s = a.timeout_s, .status_out = rank == 0 ? a.status_out : NULL, .link = {.latency_ms = a.latency_ms, .mbps = a.mbps},
                           .shared_uplink = a.shared_uplink,
                           .keep_versions = a.keep, .progress = on_progress};
    const char *fault = getenv("VKSWARM_FAULT");
    if (fault && strcmp(fault, "badsig")) o.fault = fault;
    if (o.relays >= size) cli_die(EXIT_BAD_INPUT, "--relays: %d relays need more than %d ranks", o.relays, size);
    uint8_t sk[VKS_SECRET_KEY_BYTES];
    if (rank == 0) {
        /* the origin trusts its own key; the others only --pub */
        if (vks_key_load_secret(a.key, sk)) cli_die(EXIT_BAD_INPUT, "%s", vks_last_error());
        crypto_sign_ed25519_sk_to_pk(o.public_key, sk);
    } else if (vks_key_load_public(a.pub, o.public_key)) {
        cli_die(EXIT_BAD_INPUT, "%s", vks_last_error());
    }
    char store[4096];
    if (snprintf(store, sizeof store, "%s/rank-%d", a.out, rank) >= (int)sizeof store)
        cli_die(EXIT_BAD_INPUT, "--out: path too long");
    if (rank > o.relays) {
        if (mkdir(a.out, 0755) != 0 && access(a.out, W_OK) != 0) cli_die(EXIT_BAD_INPUT, "%s: cannot create", a.out);
        o.store_dir = store;
    }
    progress_ctx pc;
    snprintf(pc.what, sizeof pc.what, "rank %d", rank);
    cli_progress_start(&pc.p, pc.what);
    o.progress_ctx = &pc;
    if (rank == 0 && a.status_out && unlink(a.status_out) != 0 && errno != ENOENT)
        cli_die(EXIT_BAD_INPUT, "%s: cannot remove the previous status (%s)", a.status_out, strerror(errno));
    vks_bcast *b;
    if (vks_bcast_create(vks_mpi_world(), &o, &b)) {
        fprintf(stderr, "vkswarm: %s\n", vks_last_error());
        leave_job(1, true);
    }
    int rc;
    if (rank == 0) {
        rc = run_origin(b, &a, sk);
    } else {
        vks_bcast_report r;
        rc = vks_bcast_receive(b, &r);
        if (rc) {
            fprintf(stderr, "vkswarm: %s\n", vks_last_error());
            rc = rc == VKS_ERR_FORMAT ? EXIT_BAD_INPUT : 1;
        } else {
            fprintf(stderr, "broadcast: rank %d: version %llu in %.2fs, %d shards repaired%s\n", rank,
                    (unsigned long long)r.version, r.seconds, r.repaired_shards,
                    r.failovers ? ", parent failed over to the origin" : "");
            if (rank > o.relays) {
                char hex[2 * VKS_HASH_BYTES + 1];
                vks_shard_hash_hex(r.file_hash, hex);
                printf("rank %d version %llu %s\n", rank, (unsigned long long)r.version, hex);
                fflush(stdout);
            }
        }
    }
    sodium_memzero(sk, sizeof sk);
    end_job(b, rank, rc, a.timeout_s);
}
