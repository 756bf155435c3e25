/* vkswarm keygen / broadcast: Shardcast from the command line (issue 6). */
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "cli_util.h"
#include "commands.h"
#include "vks_broadcast.h"
#include "vks_mpi.h"
#include "vkswarm/vks_shard.h"

static const char keygen_usage[] =
    "usage: vkswarm keygen --out DIR\n"
    "Writes an Ed25519 key pair for signed weight broadcast: DIR/shardcast.key (secret, mode 0600,\n"
    "for the trainer) and DIR/shardcast.pub (for every receiver). Existing files are not overwritten.\n";

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
    "  --timeout-s T         parent silence before turning to the origin (default 30)\n"
    "environment: VKSWARM_FAULT=corrupt:RANK[:SHARD] | short:RANK | die:RANK | badsig (tests only).\n"
    "Hidden benchmark mode: --baseline p2p|mpi-bcast --bytes N prints the seconds of one transfer.\n";

typedef struct {
    const char *file, *key, *pub, *out, *model_id, *base, *baseline;
    int relays, fanout, keep;
    bool shared_uplink;
    double shard_mb, chunk_kb, latency_ms, mbps, timeout_s;
    uint64_t version, step, base_version, bytes;
    vks_delta_mode delta;
} bcast_args;

static bool takes_value(const char *o) {
    static const char *const names[] = {"--file", "--key", "--pub", "--out", "--model-id", "--base", "--baseline",
                                        "--relays", "--fanout", "--keep", "--shard-mb", "--chunk-kb",
                                        "--link-latency-ms", "--link-mbps", "--timeout-s", "--weights-version",
                                        "--step", "--base-version", "--bytes", "--delta"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(o, names[i])) return true;
    return false;
}

static void parse_args(int argc, char **argv, bcast_args *a) {
    *a = (bcast_args){.model_id = "default", .relays = -1, .fanout = 2, .keep = 2, .shard_mb = 32, .chunk_kb = 1024,
                      .timeout_s = 30, .version = 1};
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            fputs(broadcast_usage, stdout);
            exit(0);
        }
        if (!strcmp(o, "--shared-uplink")) {
            a->shared_uplink = true;
            continue;
        }
        if (o[0] != '-') cli_usage_error("broadcast", "unexpected argument '%s'", o);
        if (!takes_value(o)) cli_usage_error("broadcast", "unknown option '%s'", o);
        if (i + 1 >= argc) cli_usage_error("broadcast", "option '%s' needs a value", o);
        const char *v = argv[++i];
        if (!strcmp(o, "--file")) a->file = v;
        else if (!strcmp(o, "--key")) a->key = v;
        else if (!strcmp(o, "--pub")) a->pub = v;
        else if (!strcmp(o, "--out")) a->out = v;
        else if (!strcmp(o, "--model-id")) a->model_id = v;
        else if (!strcmp(o, "--base")) a->base = v;
        else if (!strcmp(o, "--baseline")) a->baseline = v;
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
        } else cli_usage_error("broadcast", "unknown option '%s'", o);
    }
    if (a->version == 0) cli_die(EXIT_BAD_INPUT, "--weights-version: must be at least 1");
    if (a->delta && !a->base) cli_die(EXIT_BAD_INPUT, "broadcast: --delta needs --base FILE");
    if (a->delta && !a->base_version) a->base_version = a->version - 1;
}

static uint8_t *read_whole(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) cli_die(EXIT_BAD_INPUT, "%s: cannot open", path);
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || st.st_size <= 0) cli_die(EXIT_BAD_INPUT, "%s: empty or unreadable", path);
    *len = (size_t)st.st_size;
    uint8_t *b = malloc(*len);
    if (!b) cli_die(1, "%s: out of host memory for %zu bytes", path, *len);
    if (fread(b, 1, *len, f) != *len) cli_die(1, "%s: read failed", path);
    fclose(f);
    return b;
}

typedef struct {
    cli_progress p;
    char what[32];
} progress_ctx;

static void on_progress(void *ctx, uint64_t done, uint64_t total) {
    progress_ctx *c = ctx;
    cli_progress_update(&c->p, (long)(done >> 10), (long)(total >> 10), "KiB");
}

/* Rank 0: build, sign and send. */
static int run_origin(vks_bcast *b, const bcast_args *a, const uint8_t sk[VKS_SECRET_KEY_BYTES], int *lost) {
    size_t len = 0, base_len = 0;
    uint8_t *data = read_whole(a->file, &len), *base = a->base ? read_whole(a->base, &base_len) : NULL;
    vks_manifest_params p = {.version = a->version, .step = a->step, .delta = a->delta,
                             .base_version = a->base_version, .shard_size = (uint32_t)(a->shard_mb * 1048576.0)};
    vks_model_id_hash(a->model_id, p.model_hash);
    vks_manifest m;
    uint8_t *wire = NULL, *blob = NULL;
    size_t blob_len = 0;
    if (vks_manifest_build(data, len, base, base_len, &p, &m, &wire)) cli_die(EXIT_BAD_INPUT, "%s", vks_last_error());
    if (vks_manifest_sign(&m, sk, &blob, &blob_len)) cli_die(1, "%s", vks_last_error());
    const char *fault = getenv("VKSWARM_FAULT");
    if (fault && !strcmp(fault, "badsig")) blob[20] ^= 1; /* tamper after signing */
    fprintf(stderr, "broadcast: version %llu, %zu bytes in %u shards, %llu bytes on the wire", (unsigned long long)a->version,
            len, m.n_shards, (unsigned long long)m.wire_size);
    if (a->delta) fprintf(stderr, " (delta saves %llu bytes)", (unsigned long long)(len - m.wire_size));
    fputc('\n', stderr);
    vks_bcast_report r;
    int rc = vks_bcast_send(b, blob, blob_len, wire, m.wire_size, &r);
    fprintf(stderr, "broadcast: %d ranks ok, %d failed, %.2fs", r.ranks_ok, r.ranks_failed, r.seconds);
    if (r.ranks_ok > 0 && r.seconds > 0) /* a rate only for bytes that arrived somewhere */
        fprintf(stderr, ", %.1f MB/s per receiver", (double)r.wire_bytes / r.seconds / 1e6);
    fputc('\n', stderr);
    if (rc) fprintf(stderr, "vkswarm: %s\n", vks_last_error());
    *lost = r.ranks_lost;
    vks_manifest_free(&m);
    free(blob);
    free(data);
    free(base);
    /* wire stays allocated: sends to a dead rank may still reference it */
    if (!rc) free(wire);
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

int cmd_broadcast(int argc, char **argv) {
    bcast_args a;
    parse_args(argc, argv, &a);
    int rank = 0, size = 1;
    vks_mpi_start(false, &rank, &size);
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
                           .manifest_timeout_s = 600, .link = {.latency_ms = a.latency_ms, .mbps = a.mbps},
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
    vks_bcast *b;
    if (vks_bcast_create(vks_mpi_world(), &o, &b)) cli_die(EXIT_BAD_INPUT, "%s", vks_last_error());
    int rc, lost = 0;
    if (rank == 0) {
        rc = run_origin(b, &a, sk, &lost);
    } else {
        vks_bcast_report r;
        rc = vks_bcast_receive(b, &r);
        lost = r.ranks_lost;
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
    if (lost > 0) {
        /* Open MPI cannot finalize (nor always end mpirun) once a rank died:
         * every survivor was told, reports its own status and leaves now. */
        fprintf(stderr, "broadcast: rank %d: %d rank(s) lost, leaving without MPI_Finalize\n", rank, lost);
        cli_exit_now(rc); /* _exit, after checking that stdout took the result */
    }
    vks_bcast_destroy(b);
    vks_mpi_stop();
    return rc;
}
