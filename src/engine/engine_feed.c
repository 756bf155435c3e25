/* engine_feed.c: feed ids, collect logits: sequences' tokens packed into
 * forwards (several sequences per forward, only chosen rows giving logits),
 * the one loop behind the logits command, the verifier and the tests. */
#include <stdlib.h>
#include <string.h>
#include "vkswarm/vks_engine.h"

/* One forward's inputs and, unless the caller's arrays take them, its outputs. */
typedef struct {
    int32_t *tokens;
    uint32_t *slot, *pos, *out_rows; /* [max_rows], out_rows [max_out] */
    int *out_seq, *out_pos;          /* [max_out] */
    float *logits, *hidden;          /* [max_out, vocab], [max_out, dim] or NULL */
    float *taps;                     /* [n_taps, max_out, dim] or NULL */
    vks_feed_rows rows;
} feed_buffer;

struct vks_feed {
    vks_engine *e;
    vks_feed_seq *seqs;
    int n_seqs;
    vks_feed_options opt;
    int max_rows, max_out;
    int seq, pos;     /* the next row to feed */
    size_t out_done;  /* output rows so far (row index into all_logits/all_hidden) */
    int cur;          /* the buffer the next forward fills */
    feed_buffer buf[2];
};

static void buffer_free(feed_buffer *b) {
    free(b->tokens); free(b->slot); free(b->pos); free(b->out_rows);
    free(b->out_seq); free(b->out_pos); free(b->logits); free(b->hidden); free(b->taps);
}

static int buffer_alloc(feed_buffer *b, const vks_feed *f) {
    const vks_model_config *c = vks_engine_config(f->e);
    size_t R = (size_t)f->max_rows, O = (size_t)f->max_out;
    b->tokens = malloc(R * sizeof *b->tokens);
    b->slot = malloc(R * sizeof *b->slot);
    b->pos = malloc(R * sizeof *b->pos);
    b->out_rows = malloc(O * sizeof *b->out_rows);
    b->out_seq = malloc(O * sizeof *b->out_seq);
    b->out_pos = malloc(O * sizeof *b->out_pos);
    bool own_logits = !f->opt.all_logits, own_hidden = f->opt.want_hidden && !f->opt.all_hidden;
    if (own_logits) b->logits = malloc(O * (size_t)c->vocab_size * sizeof(float));
    if (own_hidden) b->hidden = malloc(O * (size_t)c->dim * sizeof(float));
    if (f->opt.n_taps > 0 && !(b->taps = malloc((size_t)f->opt.n_taps * O * (size_t)c->dim * sizeof(float))))
        return vks_set_error(VKS_ERR_NOMEM, "feed: out of host memory");
    if (!b->tokens || !b->slot || !b->pos || !b->out_rows || !b->out_seq || !b->out_pos ||
        (own_logits && !b->logits) || (own_hidden && !b->hidden))
        return vks_set_error(VKS_ERR_NOMEM, "feed: out of host memory");
    return VKS_OK;
}

static bool seqs_ok(const vks_feed_seq *seqs, int n) {
    if (n < 0 || (n > 0 && !seqs)) return false;
    for (int i = 0; i < n; i++)
        if (seqs[i].begin < 0 || seqs[i].end < seqs[i].begin || (seqs[i].end > seqs[i].begin && !seqs[i].ids))
            return false;
    return true;
}

int vks_feed_create(vks_engine *e, const vks_feed_seq *seqs, int n_seqs, const vks_feed_options *opt,
                    vks_feed **out) {
    if (out) *out = NULL;
    if (!e || !opt || !out || !seqs_ok(seqs, n_seqs) || opt->max_rows < 0 || (opt->all_hidden && !opt->want_hidden) ||
        opt->n_taps < 0 || (opt->n_taps > 0 && !opt->tap_layers))
        return vks_set_error(VKS_ERR_ARG, "vks_feed_create: bad argument");
    if (!vks_engine_has_embed(e) || !vks_engine_has_head(e))
        return vks_set_error(VKS_ERR_ARG, "feeding ids needs an engine holding every layer");
    vks_feed *f = calloc(1, sizeof *f);
    if (!f) return vks_set_error(VKS_ERR_NOMEM, "feed: out of host memory");
    *f = (vks_feed){.e = e, .n_seqs = n_seqs, .opt = *opt, .max_rows = vks_engine_max_rows(e),
                    .max_out = vks_engine_max_out_rows(e), .pos = n_seqs > 0 ? seqs[0].begin : 0};
    if (opt->max_rows > 0 && opt->max_rows < f->max_rows) f->max_rows = opt->max_rows;
    f->seqs = malloc(sizeof *f->seqs * (size_t)(n_seqs + 1));
    int rc = f->seqs ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "feed: out of host memory");
    if (rc == VKS_OK && n_seqs > 0) memcpy(f->seqs, seqs, sizeof *seqs * (size_t)n_seqs);
    for (int i = 0; i < 2 && rc == VKS_OK; i++) rc = buffer_alloc(&f->buf[i], f);
    if (rc) {
        vks_feed_destroy(f);
        return rc;
    }
    *out = f;
    return VKS_OK;
}

void vks_feed_destroy(vks_feed *f) {
    if (!f) return;
    buffer_free(&f->buf[0]);
    buffer_free(&f->buf[1]);
    free(f->seqs);
    free(f);
}

/* Takes the next rows in feeding order: up to max_rows, and up to max_out of
 * them output rows (a row that would exceed that waits for the next forward).
 * Returns the number of rows; b->rows.n gets the output rows. */
static int fill_buffer(vks_feed *f, feed_buffer *b) {
    int n_rows = 0, n_out = 0;
    while (f->seq < f->n_seqs && n_rows < f->max_rows) {
        const vks_feed_seq *s = &f->seqs[f->seq];
        if (f->pos >= s->end) {
            if (++f->seq < f->n_seqs) f->pos = f->seqs[f->seq].begin;
            continue;
        }
        bool out = f->pos >= s->out_begin;
        if (out && n_out == f->max_out) break;
        b->tokens[n_rows] = s->ids[f->pos];
        b->slot[n_rows] = s->slot;
        b->pos[n_rows] = (uint32_t)f->pos;
        if (out) {
            b->out_rows[n_out] = (uint32_t)n_rows;
            b->out_seq[n_out] = f->seq;
            b->out_pos[n_out] = f->pos;
            n_out++;
        }
        n_rows++;
        f->pos++;
    }
    b->rows.n = n_out;
    return n_rows;
}

int vks_feed_next(vks_feed *f, const vks_feed_rows **rows) {
    if (!f || !rows) return vks_set_error(VKS_ERR_ARG, "vks_feed_next: bad argument");
    *rows = NULL;
    feed_buffer *b = &f->buf[f->cur];
    int n_rows = fill_buffer(f, b);
    if (n_rows == 0) return VKS_OK;
    const vks_model_config *c = vks_engine_config(f->e);
    float *logits = f->opt.all_logits ? f->opt.all_logits + f->out_done * (size_t)c->vocab_size : b->logits;
    float *hidden = !f->opt.want_hidden ? NULL
                    : f->opt.all_hidden ? f->opt.all_hidden + f->out_done * (size_t)c->dim
                                        : b->hidden;
    vks_forward_batch fb = {.n_rows = n_rows, .tokens = b->tokens, .slot = b->slot, .pos = b->pos,
                            .n_out = b->rows.n, .out_rows = b->out_rows, .logits = logits, .hidden = hidden};
    vks_layer_taps taps = {.n = f->opt.n_taps, .layers = f->opt.tap_layers, .out = b->taps};
    if (taps.n > 0) fb.taps = &taps;
    int rc = vks_engine_forward(f->e, &fb);
    if (rc) return rc;
    b->rows = (vks_feed_rows){.n = fb.n_out, .seq = b->out_seq, .pos = b->out_pos, .logits = logits, .hidden = hidden,
                              .taps = taps.n > 0 ? b->taps : NULL};
    f->out_done += (size_t)fb.n_out;
    f->cur ^= 1;
    *rows = &b->rows;
    return VKS_OK;
}

int vks_engine_logits(vks_engine *e, uint32_t slot, const int32_t *ids, int first, int end, int chunk, float *logits,
                      float *hidden) {
    if (!e || !ids || !logits || first < 0 || end < first)
        return vks_set_error(VKS_ERR_ARG, "vks_engine_logits: bad argument");
    if (!vks_engine_has_embed(e) || !vks_engine_has_head(e))
        return vks_set_error(VKS_ERR_ARG, "vks_engine_logits needs an engine holding every layer");
    /* every row is an output row: a forward takes at most max_out_rows */
    int most = vks_engine_max_out_rows(e);
    vks_feed_seq s = {.slot = slot, .ids = ids, .begin = first, .end = end, .out_begin = first};
    vks_feed_options o = {.max_rows = chunk <= 0 || chunk > most ? most : chunk, .want_hidden = hidden != NULL,
                          .all_logits = logits + (size_t)first * (size_t)vks_engine_config(e)->vocab_size,
                          .all_hidden = hidden ? hidden + (size_t)first * (size_t)vks_engine_config(e)->dim : NULL};
    vks_feed *f = NULL;
    int rc = vks_feed_create(e, &s, 1, &o, &f);
    const vks_feed_rows *rows = NULL;
    while (rc == VKS_OK && (rc = vks_feed_next(f, &rows)) == VKS_OK && rows) {
        /* the rows are in logits (and hidden) already */
    }
    vks_feed_destroy(f);
    return rc;
}
