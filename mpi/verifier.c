/* Verifier ranks (see vks_verifier.h). A batch travels as its samples' JSON
 * lines, so a verifier parses exactly what `vkswarm verify` would read. */
#include "vks_verifier.h"
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { TAG_BATCH = 11, TAG_VERDICTS = 12, TAG_STOP = 13 };
#define VERIFY_MAGIC 0x46524556u /* "VERF" */
#define MAX_BATCH_BYTES (256u << 20)

typedef struct { uint32_t magic, batch_id, n, pad; } batch_header;
typedef struct { uint32_t accepted; char reason[252]; } wire_verdict;

/* ---- batches: header, lengths[n], lines ---- */

static void *pack_batch(const vks_rollout_sample *s, int n, uint32_t id, size_t *bytes) {
    char *text = NULL;
    size_t text_len = 0;
    FILE *f = open_memstream(&text, &text_len);
    uint32_t *lens = malloc(sizeof(uint32_t) * (size_t)n);
    long prev = 0;
    for (int i = 0; f && lens && i < n; i++) {
        if (vks_rollout_write_sample(f, &s[i])) { fclose(f); f = NULL; break; }
        fflush(f);
        lens[i] = (uint32_t)(ftell(f) - prev);
        prev = ftell(f);
    }
    if (!f || !lens) { free(lens); free(text); return NULL; }
    fclose(f);
    *bytes = sizeof(batch_header) + 4 * (size_t)n + text_len;
    char *buf = malloc(*bytes);
    if (buf) {
        batch_header h = {VERIFY_MAGIC, id, (uint32_t)n, 0};
        memcpy(buf, &h, sizeof h);
        memcpy(buf + sizeof h, lens, 4 * (size_t)n);
        memcpy(buf + sizeof h + 4 * (size_t)n, text, text_len);
    }
    free(lens);
    free(text);
    return buf;
}

/* Parses a received batch into samples; on failure a one-line reason. */
static int unpack_batch(const char *buf, size_t bytes, int max_batch, vks_rollout_sample **out, int *n_out,
                        uint32_t *id, char *err, size_t err_len) {
    batch_header h;
    if (bytes < sizeof h) return snprintf(err, err_len, "batch shorter than its header"), VKS_ERR_FORMAT;
    memcpy(&h, buf, sizeof h);
    if (h.magic != VERIFY_MAGIC || h.n == 0 || h.n > (uint32_t)max_batch || bytes < sizeof h + 4 * (size_t)h.n)
        return snprintf(err, err_len, "batch header: %u samples (1..%d allowed)", h.n, max_batch), VKS_ERR_FORMAT;
    vks_rollout_sample *s = calloc(h.n, sizeof *s);
    if (!s) return snprintf(err, err_len, "out of host memory"), VKS_ERR_NOMEM;
    size_t at = sizeof h + 4 * (size_t)h.n;
    for (uint32_t i = 0; i < h.n; i++) {
        uint32_t len;
        memcpy(&len, buf + sizeof h + 4 * (size_t)i, 4);
        if (len > bytes - at || vks_rollout_parse_sample(buf + at, len, &s[i])) {
            snprintf(err, err_len, "sample %u of batch %u: %s", i, h.batch_id,
                     len > bytes - at ? "length past the message" : vks_last_error());
            for (uint32_t j = 0; j < i; j++) vks_rollout_sample_free(&s[j]);
            free(s);
            return VKS_ERR_FORMAT;
        }
        at += len;
    }
    if (at != bytes) {
        for (uint32_t j = 0; j < h.n; j++) vks_rollout_sample_free(&s[j]);
        free(s);
        return snprintf(err, err_len, "batch %u has %zu stray bytes", h.batch_id, bytes - at), VKS_ERR_FORMAT;
    }
    *out = s;
    *n_out = (int)h.n;
    *id = h.batch_id;
    return VKS_OK;
}

/* ---- verifier side ---- */

static int serve_one(MPI_Comm comm, const MPI_Status *st, int max_batch, vks_verify_fn fn, void *ctx) {
    int bytes;
    MPI_Get_count(st, MPI_BYTE, &bytes);
    if (bytes < 0 || (unsigned)bytes > MAX_BATCH_BYTES)
        return vks_set_error(VKS_ERR_FORMAT, "rank %d sent a batch of %d bytes", st->MPI_SOURCE, bytes);
    char *buf = malloc((size_t)bytes + 1);
    if (!buf) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    MPI_Recv(buf, bytes, MPI_BYTE, st->MPI_SOURCE, TAG_BATCH, comm, MPI_STATUS_IGNORE);
    vks_rollout_sample *s = NULL;
    int n = 0;
    uint32_t id = 0;
    char err[200];
    int rc = unpack_batch(buf, (size_t)bytes, max_batch, &s, &n, &id, err, sizeof err);
    free(buf);
    if (rc) return vks_set_error(rc, "bad batch from rank %d: %s", st->MPI_SOURCE, err);
    vks_verdict *v = calloc((size_t)n, sizeof *v);
    size_t reply_bytes = sizeof(batch_header) + sizeof(wire_verdict) * (size_t)n;
    char *reply = malloc(reply_bytes);
    rc = v && reply ? fn(ctx, s, n, v) : vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    if (rc == VKS_OK) {
        batch_header h = {VERIFY_MAGIC, id, (uint32_t)n, 0};
        memcpy(reply, &h, sizeof h);
        for (int i = 0; i < n; i++) {
            wire_verdict w = {.accepted = v[i].accepted};
            snprintf(w.reason, sizeof w.reason, "%.*s", (int)sizeof w.reason - 1, v[i].reason);
            memcpy(reply + sizeof h + sizeof w * (size_t)i, &w, sizeof w);
        }
        MPI_Send(reply, (int)reply_bytes, MPI_BYTE, st->MPI_SOURCE, TAG_VERDICTS, comm);
    }
    for (int i = 0; i < n; i++) vks_rollout_sample_free(&s[i]);
    free(s);
    free(v);
    free(reply);
    return rc;
}

int vks_verifier_serve(MPI_Comm comm, int dispatcher, int max_batch, vks_verify_fn fn, void *ctx) {
    if (!fn || max_batch < 1) return vks_set_error(VKS_ERR_ARG, "verifier: bad arguments");
    for (;;) {
        MPI_Status st;
        MPI_Probe(dispatcher, MPI_ANY_TAG, comm, &st);
        if (st.MPI_TAG == TAG_STOP) {
            MPI_Recv(NULL, 0, MPI_BYTE, dispatcher, TAG_STOP, comm, MPI_STATUS_IGNORE);
            return VKS_OK;
        }
        if (st.MPI_TAG != TAG_BATCH)
            return vks_set_error(VKS_ERR_FORMAT, "rank %d sent a message with unknown tag %d", dispatcher, st.MPI_TAG);
        int rc = serve_one(comm, &st, max_batch, fn, ctx);
        if (rc) return rc;
    }
}

/* ---- dispatcher side ---- */

typedef struct { int batch_start, batch_n; double since; } busy_rank;

static int take_verdicts(MPI_Comm comm, const MPI_Status *st, busy_rank *b, vks_verdict *out) {
    int bytes;
    MPI_Get_count(st, MPI_BYTE, &bytes);
    size_t want = sizeof(batch_header) + sizeof(wire_verdict) * (size_t)b->batch_n;
    if (bytes < 0 || (size_t)bytes != want)
        return vks_set_error(VKS_ERR_FORMAT, "rank %d sent verdicts of %d bytes, %zu expected", st->MPI_SOURCE, bytes, want);
    char *buf = malloc(want);
    if (!buf) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    MPI_Recv(buf, bytes, MPI_BYTE, st->MPI_SOURCE, TAG_VERDICTS, comm, MPI_STATUS_IGNORE);
    batch_header h;
    memcpy(&h, buf, sizeof h);
    int rc = VKS_OK;
    if (h.magic != VERIFY_MAGIC || h.n != (uint32_t)b->batch_n || h.batch_id != (uint32_t)b->batch_start)
        rc = vks_set_error(VKS_ERR_FORMAT, "rank %d answered for another batch", st->MPI_SOURCE);
    for (int i = 0; rc == VKS_OK && i < b->batch_n; i++) {
        wire_verdict w;
        memcpy(&w, buf + sizeof h + sizeof w * (size_t)i, sizeof w);
        w.reason[sizeof w.reason - 1] = 0;
        vks_verdict *v = &out[b->batch_start + i];
        memset(v, 0, sizeof *v);
        v->accepted = w.accepted == 1;
        snprintf(v->reason, sizeof v->reason, "%s", w.reason);
    }
    free(buf);
    b->batch_n = 0;
    return rc;
}

static int send_batch(MPI_Comm comm, int rank, const vks_rollout_sample *s, int start, int n, busy_rank *b) {
    size_t bytes;
    void *msg = pack_batch(s + start, n, (uint32_t)start, &bytes);
    if (!msg || bytes > MAX_BATCH_BYTES) {
        free(msg);
        return vks_set_error(VKS_ERR_NOMEM, "cannot pack a batch of %d samples", n);
    }
    MPI_Send(msg, (int)bytes, MPI_BYTE, rank, TAG_BATCH, comm);
    free(msg);
    *b = (busy_rank){start, n, MPI_Wtime()};
    return VKS_OK;
}

static void stop_verifiers(MPI_Comm comm, int first, int size) {
    for (int r = first; r < size; r++) MPI_Send(NULL, 0, MPI_BYTE, r, TAG_STOP, comm);
}

int vks_verifier_dispatch(MPI_Comm comm, int first_verifier, const vks_rollout_sample *samples, int n, int batch,
                          double timeout_s, vks_verify_fn fn, void *ctx, vks_verdict *out) {
    int size;
    MPI_Comm_size(comm, &size);
    if (!samples || !out || n < 0 || batch < 1 || first_verifier < 1 || timeout_s <= 0)
        return vks_set_error(VKS_ERR_ARG, "verifier dispatch: bad arguments");
    if (first_verifier >= size) return fn(ctx, samples, n, out); /* nobody else: verify here */
    busy_rank *busy = calloc((size_t)size, sizeof *busy);
    if (!busy) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    int next = 0, pending = 0, rc = VKS_OK;
    while (rc == VKS_OK && (next < n || pending > 0)) {
        for (int r = first_verifier; rc == VKS_OK && r < size && next < n; r++) {
            if (busy[r].batch_n) continue;
            int k = n - next < batch ? n - next : batch;
            rc = send_batch(comm, r, samples, next, k, &busy[r]);
            next += k;
            pending++;
        }
        int flag;
        MPI_Status st;
        MPI_Iprobe(MPI_ANY_SOURCE, TAG_VERDICTS, comm, &flag, &st);
        if (rc == VKS_OK && flag) {
            if (st.MPI_SOURCE < first_verifier || !busy[st.MPI_SOURCE].batch_n)
                rc = vks_set_error(VKS_ERR_FORMAT, "rank %d sent verdicts nobody asked for", st.MPI_SOURCE);
            else if ((rc = take_verdicts(comm, &st, &busy[st.MPI_SOURCE], out)) == VKS_OK)
                pending--;
            continue;
        }
        for (int r = first_verifier; rc == VKS_OK && r < size; r++)
            if (busy[r].batch_n && MPI_Wtime() - busy[r].since > timeout_s)
                rc = vks_set_error(VKS_ERR_IO, "verifier rank %d did not answer within %.0f s", r, timeout_s);
        if (rc == VKS_OK) usleep(500);
    }
    if (rc == VKS_OK) stop_verifiers(comm, first_verifier, size);
    free(busy);
    return rc;
}
