/* tokenizer_merge.c: the bigram merge loop shared by the SPM and BPE
 * tokenizers, as llama.cpp runs it: a priority queue of neighbour pairs,
 * best first (ties: leftmost), entries invalidated lazily when a neighbour
 * has changed since the pair was queued. O(n log n) per word. */
#include <stdlib.h>

#include "tokenizer_internal.h"

int vks_tok_ids_push(tok_ids *ids, int32_t id) {
    if (ids->n == ids->cap) {
        size_t cap = ids->cap ? ids->cap * 2 : 64;
        if (cap > (size_t)INT32_MAX) return vks_set_error(VKS_ERR_NOMEM, "tokenize: too many tokens");
        int32_t *v = realloc(ids->v, cap * sizeof *v);
        if (!v) return vks_set_error(VKS_ERR_NOMEM, "tokenize: out of memory");
        ids->v = v;
        ids->cap = cap;
    }
    ids->v[ids->n++] = id;
    return VKS_OK;
}

typedef struct {
    double priority;
    int32_t left, right, id;
    uint32_t left_ver, right_ver;
} pair_cand;

typedef struct {
    const vks_tokenizer *t;
    void *ctx;
    tok_sym *sym;
    tok_pair_fn pair;
    int32_t *next, *prev;
    uint32_t *ver;
    pair_cand *heap;
    size_t heap_n;
} merge_state;

static bool cand_before(const pair_cand *a, const pair_cand *b) {
    return a->priority < b->priority || (a->priority == b->priority && a->left < b->left);
}

static void heap_push(merge_state *s, pair_cand c) {
    size_t i = s->heap_n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!cand_before(&c, &s->heap[parent])) break;
        s->heap[i] = s->heap[parent];
        i = parent;
    }
    s->heap[i] = c;
}

static pair_cand heap_pop(merge_state *s) {
    pair_cand top = s->heap[0], last = s->heap[--s->heap_n];
    size_t i = 0, n = s->heap_n;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && cand_before(&s->heap[child + 1], &s->heap[child])) child++;
        if (!cand_before(&s->heap[child], &last)) break;
        s->heap[i] = s->heap[child];
        i = child;
    }
    if (n > 0) s->heap[i] = last;
    return top;
}

static void push_pair(merge_state *s, int32_t a, int32_t b) {
    if (a < 0 || b < 0) return;
    pair_cand c = {.left = a, .right = b, .left_ver = s->ver[a], .right_ver = s->ver[b]};
    if (s->pair(s->t, s->ctx, &s->sym[a], &s->sym[b], &c.priority, &c.id)) heap_push(s, c);
}

static bool cand_current(const merge_state *s, const pair_cand *c) {
    return s->next[c->left] == c->right && s->ver[c->left] == c->left_ver && s->ver[c->right] == c->right_ver;
}

static void run_merges(merge_state *s, size_t n) {
    for (size_t i = 0; i + 1 < n; i++) push_pair(s, (int32_t)i, (int32_t)i + 1);
    while (s->heap_n > 0) {
        pair_cand c = heap_pop(s);
        if (!cand_current(s, &c)) continue;
        int32_t after = s->next[c.right];
        s->sym[c.left].len += s->sym[c.right].len;
        s->sym[c.left].id = c.id;
        s->ver[c.left]++;
        s->ver[c.right]++;
        s->next[c.right] = -1;
        s->next[c.left] = after;
        if (after >= 0) s->prev[after] = c.left;
        push_pair(s, s->prev[c.left], c.left);
        push_pair(s, c.left, after);
    }
}

int vks_tok_merge(const vks_tokenizer *t, void *ctx, tok_sym *syms, size_t *n_io, tok_pair_fn pair) {
    size_t n = *n_io;
    if (n < 2) return VKS_OK;
    if (n > (size_t)INT32_MAX / 4) return vks_set_error(VKS_ERR_NOMEM, "tokenize: word of %zu symbols", n);
    merge_state s = {.t = t, .ctx = ctx, .sym = syms, .pair = pair};
    s.next = malloc(n * sizeof *s.next);
    s.prev = malloc(n * sizeof *s.prev);
    s.ver = calloc(n, sizeof *s.ver);
    s.heap = malloc(3 * n * sizeof *s.heap); /* n-1 initial + 2 per merge */
    int rc = VKS_OK;
    if (s.next && s.prev && s.ver && s.heap) {
        for (size_t i = 0; i < n; i++) {
            s.next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
            s.prev[i] = (int32_t)i - 1;
        }
        run_merges(&s, n);
        size_t count = 0; /* symbol 0 is never removed: compact the list in place */
        for (int32_t i = 0; i >= 0; i = s.next[i]) syms[count++] = syms[i];
        *n_io = count;
    } else {
        rc = vks_set_error(VKS_ERR_NOMEM, "tokenize: out of memory");
    }
    free(s.next);
    free(s.prev);
    free(s.ver);
    free(s.heap);
    return rc;
}
