/* rl_cast.c: the RL run's weights through Shardcast (rl_cast.h), and the
 * relay rank's role (vks_rl_mpi_relay). */
#include "rl_cast.h"
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "rl_orch.h"
#include "rl_wire.h"
#include "vkswarm/vks_mpi.h"
#include "vkswarm/vks_rl_config.h"

#define HELLO_BYTES (8 + VKS_PUBLIC_KEY_BYTES) /* u64 store version | the trainer's public key */
#define MAX_BASE_VERSION (1ull << 48)          /* a store version above this is not a former run's */
#define CHUNK_BYTES (256u << 10)

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* Broadcast ranks: the trainer 0, relays 1..R in config order, the others in world order. */
static void order_ranks(vks_rl_cast *s, const vks_rl_config *c) {
    int next = 0;
    s->bc_of[c->trainer] = next++;
    for (int i = 0; i < c->n_relays; i++) s->bc_of[c->relays[i]] = next++;
    for (int r = 0; r < s->n_world; r++) {
        bool placed = r == c->trainer;
        for (int i = 0; i < c->n_relays; i++) placed = placed || c->relays[i] == r;
        if (!placed) s->bc_of[r] = next++;
    }
    for (int r = 0; r < s->n_world; r++) s->world_of[s->bc_of[r]] = r;
}

/* A configured key directory (vkswarm keygen): the trainer's secret key,
 * everybody's public key. */
static int load_keys(vks_rl_cast *s, const char *dir, uint8_t pk[VKS_PUBLIC_KEY_BYTES]) {
    char path[sizeof ((vks_rl_config *)0)->shardcast_key + 32];
    snprintf(path, sizeof path, "%s/shardcast.pub", dir);
    int rc = vks_key_load_public(path, pk);
    if (!rc && s->me == s->trainer) {
        snprintf(path, sizeof path, "%s/shardcast.key", dir);
        rc = vks_key_load_secret(path, s->sk);
        /* an Ed25519 secret key ends with its public key: the pair must match */
        if (!rc && memcmp(s->sk + VKS_SECRET_KEY_BYTES - VKS_PUBLIC_KEY_BYTES, pk, VKS_PUBLIC_KEY_BYTES))
            rc = vks_set_error(VKS_ERR_FORMAT, "%s: shardcast.key and shardcast.pub are not one key pair", dir);
    }
    return rc;
}

/* The trainer says on stderr which key signs the run's weights. */
static void say_key(const char *key_dir) {
    if (!key_dir[0]) {
        fprintf(stderr, "vkswarm: rl: shardcast: the weights are signed with a key made for this run (its public key "
                "goes to every rank over MPI at start-up; config shardcast_key DIR signs with yours)\n");
        return;
    }
    char dir[4 * sizeof ((vks_rl_config *)0)->shardcast_key];
    vks_escape(key_dir, strlen(key_dir), dir, sizeof dir);
    fprintf(stderr, "vkswarm: rl: shardcast: the weights are signed with your key %s/shardcast.key (the other ranks "
            "check them with %s/shardcast.pub)\n", dir, dir);
}

/* This rank's part of the start-up exchange (a failure: *mine stays zero). */
static int accept_version(void *ctx, const char *path, const vks_bcast_report *rep);

static int hello_part(vks_rl_cast *s, const char *key_dir, uint8_t mine[HELLO_BYTES], uint8_t pk[VKS_PUBLIC_KEY_BYTES]) {
    int rc = key_dir[0] ? load_keys(s, key_dir, pk) : VKS_OK;
    if (rc) return rc;
    if (s->me == s->trainer) {
        if (key_dir[0]) memcpy(mine + 8, pk, VKS_PUBLIC_KEY_BYTES);
        else rc = vks_keypair_new(mine + 8, s->sk);
        say_key(key_dir);
    } else if (s->store[0]) {
        uint64_t have = 0;
        rc = vks_store_current(s->store, &have);
        put_u64(mine, have);
    }
    return rc;
}

/* What every rank said: the version base, the trainer's key (with a
 * configured key, the announcement must be that key). */
static int hello_read(vks_rl_cast *s, const char *key_dir, const uint8_t *all, uint8_t pk[VKS_PUBLIC_KEY_BYTES]) {
    for (int r = 0; r < s->n_world; r++) {
        uint64_t v = get_u64(all + (size_t)r * HELLO_BYTES);
        if (v > MAX_BASE_VERSION)
            return vks_set_error(VKS_ERR_FORMAT, "rank %d: says its weight store holds version %llu (at most %llu)", r,
                                 (unsigned long long)v, (unsigned long long)MAX_BASE_VERSION);
        if (v > s->version_base) s->version_base = v;
    }
    const uint8_t *announced = all + (size_t)s->trainer * HELLO_BYTES + 8;
    if (key_dir[0] && memcmp(announced, pk, VKS_PUBLIC_KEY_BYTES))
        return vks_set_error(VKS_ERR_FORMAT, "rank %d (the trainer) announces a key other than %s/shardcast.pub",
                             s->trainer, key_dir);
    memcpy(pk, announced, VKS_PUBLIC_KEY_BYTES);
    return VKS_OK;
}

/* The start-up exchange: the trainer's public key, every store's version.
 * Returns the exchange's error (the others may not have answered: no split
 * then); *local: this rank's own failure, found before or after it (the
 * rank still takes part, so that nobody waits for it in the split). */
static int hello(vks_rl_cast *s, const char *key_dir, double start_s, uint8_t pk[VKS_PUBLIC_KEY_BYTES], int *local) {
    uint8_t mine[HELLO_BYTES] = {0};
    *local = hello_part(s, key_dir, mine, pk);
    char err[512];
    snprintf(err, sizeof err, "%s", *local ? vks_last_error() : "");
    uint8_t *all = malloc((size_t)s->n_world * HELLO_BYTES);
    if (!all) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    int rc = vks_mpi_exchange(vks_mpi_world(), mine, all, HELLO_BYTES, TAG_CAST_HELLO, start_s,
                              "the weights broadcast's start-up");
    if (!rc && !*local) *local = hello_read(s, key_dir, all, pk);
    else if (!rc) vks_set_error(*local, "%s", err);
    free(all);
    return rc;
}

int vks_rl_cast_open(vks_rl_cast *s, const vks_rl_run_options *o, const vks_rl_mpi_options *mo, size_t n_values,
                     double start_s, vks_rl_beat *beat) {
    const vks_rl_config *c = o->config;
    memset(s, 0, sizeof *s);
    s->newest = -1, s->n_values = n_values, s->trainer = c->trainer;
    MPI_Comm world = vks_mpi_world();
    MPI_Comm_rank(world, &s->me);
    MPI_Comm_size(world, &s->n_world);
    s->bc_of = malloc(sizeof *s->bc_of * (size_t)s->n_world);
    s->world_of = malloc(sizeof *s->world_of * (size_t)s->n_world);
    s->gone = calloc((size_t)s->n_world, 1);
    if (!s->bc_of || !s->world_of || !s->gone) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    order_ranks(s, c);
    int roles = vks_rl_config_roles_of(c, s->me);
    bool receiver = roles & (VKS_RL_ROLE_INFERENCE | VKS_RL_ROLE_VERIFIER);
    if (receiver && snprintf(s->store, sizeof s->store, "%s/weights-rank%d", c->out, s->me) >= (int)sizeof s->store)
        return vks_set_error(VKS_ERR_ARG, "%s: path too long", c->out);
    uint8_t pk[VKS_PUBLIC_KEY_BYTES];
    int local = VKS_OK, rc = hello(s, c->shardcast_key, start_s, pk, &local);
    if (rc) return rc;
    /* every rank has just answered: the blocking split cannot wait long */
    MPI_Comm sub;
    if (MPI_Comm_split(world, 0, s->bc_of[s->me], &sub) != MPI_SUCCESS)
        return vks_set_error(VKS_ERR_IO, "rank %d: MPI_Comm_split for the weights broadcast failed", s->me);
    if (local) { /* the others find out in vks_bcast_create's bounded start-up */
        MPI_Comm_free(&sub);
        return local;
    }
    size_t file = s->max_file = vks_rl_cast_max_file(c, o->model, n_values);
    if (c->lora_rank > 0) { /* every rank hashes the base once: the manifests name it */
        s->lora_base = o->model;
        if ((rc = vks_model_hash(o->model, s->base_hash))) {
            MPI_Comm_free(&sub);
            return rc;
        }
    }
    vks_bcast_options bo = {.relays = c->n_relays, .fanout = 2, .chunk_bytes = CHUNK_BYTES, .timeout_s = mo->timeout_s,
                            .manifest_timeout_s = mo->timeout_s, .store_dir = receiver ? s->store : NULL,
                            .keep_versions = 2, .max_file_bytes = file, .beat = beat ? vks_rl_wire_beat_cb : NULL,
                            .beat_ctx = beat, .accept = receiver ? accept_version : NULL, .accept_ctx = s};
    memcpy(bo.public_key, pk, sizeof pk);
    rc = vks_bcast_create(sub, &bo, &s->b);
    if (!rc) MPI_Comm_free(&sub); /* else a pending dup may still use it */
    return rc;
}

void vks_rl_cast_close(vks_rl_cast *s) {
    vks_bcast_destroy(s->b);
    free(s->taken_weights);
    vks_lora_adapter_free(s->taken_adapter);
    s->taken_weights = NULL, s->taken_adapter = NULL;
    s->b = NULL;
    sodium_memzero(s->sk, sizeof s->sk);
    free(s->bc_of), free(s->world_of), free(s->gone);
    s->bc_of = s->world_of = NULL, s->gone = NULL;
}

/* About 8 shards for a small model (each at least the format's minimum),
 * the default size for a large one. */
static uint32_t shard_size_for(size_t bytes) {
    size_t s = (bytes / 8 + VKS_SHARD_MIN_BYTES - 1) / VKS_SHARD_MIN_BYTES * VKS_SHARD_MIN_BYTES;
    if (s < VKS_SHARD_MIN_BYTES) s = VKS_SHARD_MIN_BYTES;
    return s > VKS_SHARD_DEFAULT_BYTES ? VKS_SHARD_DEFAULT_BYTES : (uint32_t)s;
}

int vks_rl_cast_send(vks_rl_cast *s, const void *file, size_t bytes, int64_t step, vks_bcast_report *rep) {
    memset(rep, 0, sizeof *rep);
    vks_manifest_params p = {.version = s->version_base + 1 + s->sent, .step = (uint64_t)step,
                             .shard_size = shard_size_for(bytes)};
    if (s->lora_base) memcpy(p.model_hash, s->base_hash, sizeof p.model_hash);
    else vks_model_id_hash("vkswarm-rl-weights", p.model_hash);
    vks_manifest m = {0};
    uint8_t *wire = NULL, *blob = NULL;
    size_t blob_len = 0;
    int rc = vks_manifest_build(file, bytes, NULL, 0, &p, &m, &wire);
    if (!rc) rc = vks_manifest_sign(&m, s->sk, &blob, &blob_len);
    if (!rc) {
        s->sent++; /* a version number is never used twice, even when its send fails */
        rc = vks_bcast_send(s->b, blob, blob_len, wire, m.wire_size, rep);
    }
    free(blob), free(wire);
    vks_manifest_free(&m);
    return rc;
}

int vks_rl_cast_failed(const vks_rl_cast *s, int *from) {
    for (int r = *from < 1 ? 1 : *from; r < s->n_world; r++)
        if (!s->gone[r] && !vks_bcast_rank_ok(s->b, r)) {
            *from = r + 1;
            return s->world_of[r];
        }
    *from = s->n_world;
    return -1;
}

void vks_rl_cast_drop(vks_rl_cast *s, int rank) {
    if (!s->b || rank < 0 || rank >= s->n_world) return;
    s->gone[s->bc_of[rank]] = 1;
    vks_bcast_drop(s->b, s->bc_of[rank]);
}

bool vks_rl_cast_waiting(vks_rl_cast *s) { return s->b && vks_bcast_waiting(s->b); }

/* Receivers: the weights file of a version (rl_cast.h), checked before it
 * counts as delivered; kept for vks_rl_cast_receive. */
static int accept_weights(vks_rl_cast *s, const char *path, const vks_bcast_report *rep) {
    char *data = NULL;
    size_t len = 0;
    int64_t step = 0;
    int rc = vks_file_read_all(path, s->max_file, &data, &len);
    if (!rc) rc = vks_rl_wire_check_weights(data, len, s->n_values, s->newest, (int64_t)rep->step, &step);
    if (rc) {
        free(data);
        return rc;
    }
    s->newest = s->taken_step = step;
    s->taken_weights = (float *)(void *)data;
    return VKS_OK;
}

/* Receivers, LoRA: the adapter of a version. The signed manifest names the
 * base; the GGUF reader checks every tensor against this rank's base, the
 * values, and the base hash the file names. Kept for vks_rl_cast_receive_adapter. */
static int accept_adapter(vks_rl_cast *s, const char *path, const vks_bcast_report *rep) {
    if (memcmp(rep->model_hash, s->base_hash, sizeof s->base_hash)) {
        char theirs[65], mine[65];
        vks_hash_hex(rep->model_hash, theirs);
        vks_hash_hex(s->base_hash, mine);
        return vks_set_error(VKS_ERR_FORMAT, "the adapter is for base model %s, this rank loaded %s", theirs, mine);
    }
    if ((int64_t)rep->step <= s->newest)
        return vks_set_error(VKS_ERR_FORMAT, "adapter of step %llu after step %lld", (unsigned long long)rep->step,
                             (long long)s->newest);
    vks_lora_adapter *a = NULL;
    int rc = vks_lora_load(path, s->lora_base, &a);
    if (rc) return rc;
    s->newest = s->taken_step = (int64_t)rep->step;
    s->taken_adapter = a;
    return VKS_OK;
}

/* vks_bcast_options.accept (vks_rl_cast_open): what a receiver checks before it tells the
 * trainer it took a version; a refusal goes to the trainer with its reason. */
static int accept_version(void *ctx, const char *path, const vks_bcast_report *rep) {
    vks_rl_cast *s = ctx;
    int rc = s->lora_base ? accept_adapter(s, path, rep) : accept_weights(s, path, rep);
    return rc ? vks_error_prefix(rc, "%s: version %llu", s->store, (unsigned long long)rep->version) : VKS_OK;
}

int vks_rl_cast_receive(vks_rl_cast *s, float **msg, int64_t *step) {
    *msg = NULL;
    if (s->lora_base && s->store[0]) return vks_set_error(VKS_ERR_ARG, "rl: a LoRA run's broadcasts carry adapters");
    vks_bcast_report rep;
    int rc = vks_bcast_receive(s->b, &rep);
    if (rc || !s->store[0]) return rc;
    *msg = s->taken_weights, *step = s->taken_step;
    s->taken_weights = NULL;
    return *msg ? VKS_OK : vks_set_error(VKS_ERR_ARG, "%s: version %llu was not checked", s->store, (unsigned long long)rep.version);
}

size_t vks_rl_cast_max_file(const vks_rl_config *c, const vks_model *m, size_t n_values) {
    if (c->lora_rank <= 0) return sizeof(vks_rl_msg) + sizeof(float) * n_values;
    int64_t n = vks_lora_param_count(&m->cfg, c->lora_rank, c->lora_targets);
    size_t tensors = 2 * (size_t)m->cfg.n_layers * VKS_LORA_TARGET_COUNT;
    /* the F32 matrices, then per tensor its name, shape and alignment, and the metadata */
    return (n > 0 ? sizeof(float) * (size_t)n : 0) + 256 * tensors + (64u << 10);
}

int vks_rl_cast_adapter_file(const vks_rl_cast *s, const char *out_dir, vks_lora_adapter *a, uint8_t **file,
                             size_t *bytes) {
    *file = NULL, *bytes = 0;
    char path[4200];
    if (snprintf(path, sizeof path, "%s/shardcast-adapter-rank%d.gguf", out_dir, s->me) >= (int)sizeof path)
        return vks_set_error(VKS_ERR_ARG, "%s: path too long", out_dir);
    int rc = vks_lora_adapter_set_base(a, s->lora_base);
    if (!rc) rc = vks_lora_save_gguf(path, a);
    char *buf = NULL;
    if (!rc) rc = vks_file_read_all(path, s->max_file, &buf, bytes);
    remove(path);
    *file = (uint8_t *)buf;
    return rc;
}

int vks_rl_cast_receive_adapter(vks_rl_cast *s, vks_lora_adapter **a, int64_t *step) {
    *a = NULL;
    if (!s->lora_base) return vks_set_error(VKS_ERR_ARG, "rl: a full fine-tuning run's broadcasts carry weights");
    vks_bcast_report rep;
    int rc = vks_bcast_receive(s->b, &rep);
    if (rc || !s->store[0]) return rc;
    *a = s->taken_adapter, *step = s->taken_step;
    s->taken_adapter = NULL;
    return *a ? VKS_OK : vks_set_error(VKS_ERR_ARG, "%s: version %llu was not checked", s->store, (unsigned long long)rep.version);
}

const char *vks_rl_cast_why(const vks_rl_cast *s, int rank) {
    return rank >= 0 && rank < s->n_world ? vks_bcast_rank_why(s->b, s->bc_of[rank]) : "";
}

/* ---- a relay rank ---- */

typedef struct {
    vks_rl_cast cast;
    int trainer;
    double last_heard;
    bool stop, no_finalize;
} relay_state;

/* The trainer's control messages: only STOP comes to a relay. */
static int relay_poll_trainer(relay_state *r) {
    for (;;) {
        int flag = 0, count = 0;
        MPI_Status st;
        if (MPI_Iprobe(r->trainer, MPI_ANY_TAG, vks_mpi_world(), &flag, &st) != MPI_SUCCESS || !flag) return VKS_OK;
        MPI_Get_count(&st, MPI_BYTE, &count);
        if (st.MPI_TAG != TAG_CTL || count != (int)sizeof(vks_rl_msg))
            return vks_set_error(VKS_ERR_FORMAT, "a message of %d bytes under tag %d from the trainer", count, st.MPI_TAG);
        vks_rl_msg h;
        MPI_Recv(&h, sizeof h, MPI_BYTE, r->trainer, TAG_CTL, vks_mpi_world(), MPI_STATUS_IGNORE);
        if (h.magic != VKS_RL_MAGIC || h.type != MSG_STOP)
            return vks_set_error(VKS_ERR_FORMAT, "a control message of type %u from the trainer", h.type);
        r->stop = true, r->no_finalize = h.n != 0;
        r->last_heard = vks_seconds_now();
    }
}

int vks_rl_mpi_relay(const vks_rl_run_options *o, const vks_rl_mpi_options *mo, bool *no_finalize) {
    *no_finalize = false;
    if (!o || !o->config || !o->model || !mo || !(mo->timeout_s > 0)) return vks_set_error(VKS_ERR_ARG, "rl: bad options");
    int rc = vks_rl_mpi_check_roles(o->config, mo->join_server != NULL);
    if (rc) return rc;
    relay_state r = {.trainer = o->config->orchestrator}; /* STOP comes from the orchestrator */
    vks_param_layout *layout = NULL;
    double bound = mo->trainer_timeout_s > mo->timeout_s ? mo->trainer_timeout_s : mo->timeout_s;
    MPI_Comm_set_errhandler(vks_mpi_world(), MPI_ERRORS_RETURN);
    rc = vks_param_layout_create(&o->model->cfg, vks_model_has_bias(o->model), &layout);
    if (!rc) rc = vks_rl_cast_open(&r.cast, o, mo, layout->n_values, bound, NULL);
    r.last_heard = vks_seconds_now();
    while (!rc && !r.stop) {
        if ((rc = relay_poll_trainer(&r)) || r.stop) break;
        if (vks_rl_cast_waiting(&r.cast)) {
            float *none = NULL;
            int64_t step = 0;
            if (vks_rl_cast_receive(&r.cast, &none, &step))
                fprintf(stderr, "vkswarm: rl: relay rank %d: %s\n", r.cast.me, vks_last_error());
            else r.last_heard = vks_seconds_now();
            continue;
        }
        if (vks_seconds_now() - r.last_heard > bound) {
            rc = vks_set_error(VKS_ERR_TIMEOUT, "rank %d did not answer within %.1f s (%s)", r.trainer, bound,
                               vks_rl_mpi_peer_name(o->config));
            r.no_finalize = true;
        }
        usleep(1000);
    }
    *no_finalize = r.no_finalize;
    vks_rl_cast_close(&r.cast);
    vks_param_layout_free(layout);
    return rc;
}
