/* verify_group.c: group-level verdicts on a sampled subset of each group's
 * rollouts (see vks_verify_group.h). Per-sample verification is the caller's
 * function (vks_verify_batch, vks_verify_batch_cpu, verifier ranks). */
#include "vkswarm/vks_verify_group.h"
#include "vkswarm/vks_philox.h"

#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SELECT_STREAM = 0x67727076u }; /* Philox stream of the subset draws */
static const double ROUND_SLACK = 1e-9; /* 0.1 * 30 is 3.0000000000000004 in double: not 4 */

void vks_group_sampling_default(vks_group_sampling *gs) {
    if (!gs) return;
    *gs = (vks_group_sampling){.fraction = 1.0, .bad_fraction = 0.1};
}

int vks_group_secret_random(uint64_t *out) {
    if (!out) return vks_set_error(VKS_ERR_ARG, "vks_group_secret_random: bad arguments");
    if (sodium_init() < 0) return vks_set_error(VKS_ERR_NOMEM, "verify groups: libsodium did not start");
    randombytes_buf(out, sizeof *out);
    return VKS_OK;
}

const char *vks_group_sampling_problem(const vks_group_sampling *gs) {
    if (!gs) return "no group sampling options";
    if (gs->count < 0) return "the samples to check per group must be at least 1";
    if (gs->count == 0 && !(gs->fraction > 0 && gs->fraction <= 1)) return "the sample fraction must be in (0, 1]";
    if (!(gs->bad_fraction > 0 && gs->bad_fraction <= 1)) return "the bad fraction of the bound must be in (0, 1]";
    return NULL;
}

int vks_group_checked_count(const vks_group_sampling *gs, int n) {
    if (n <= 0) return 0;
    double m = gs->count > 0 ? (double)gs->count : ceil(gs->fraction * n - ROUND_SLACK);
    return m < 1 ? 1 : m > n ? n : (int)m;
}

double vks_group_pass_bound(int n, int m, double bad_fraction) {
    if (n <= 0) return 1.0;
    double kd = ceil(bad_fraction * n - ROUND_SLACK);
    int k = kd < 1 ? 1 : kd > n ? n : (int)kd;
    double p = 1.0;
    for (int i = 0; i < m && p > 0; i++) p *= n - k - i <= 0 ? 0.0 : (double)(n - k - i) / (double)(n - i);
    return p;
}

/* ---- grouping ---- */

typedef struct {
    uint64_t seed;
    int index;
} seed_index;

static int by_seed_then_index(const void *a, const void *b) {
    const seed_index *x = a, *y = b;
    if (x->seed != y->seed) return x->seed < y->seed ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

typedef struct {
    int first;  /* the group's first sample in the file */
    int begin;  /* its run in the sorted order */
} group_run;

static int by_first(const void *a, const void *b) {
    const group_run *x = a, *y = b;
    return (x->first > y->first) - (x->first < y->first);
}

/* Sorts by (seed, index) so each seed's samples are one run in file order;
 * the groups are then numbered by their first sample. */
static int form_groups(const vks_rollout_sample *s, int n, bool whole_file, seed_index *order, vks_group_plan *p) {
    for (int i = 0; i < n; i++) order[i] = (seed_index){.seed = whole_file ? 0 : s[i].seed, .index = i};
    qsort(order, (size_t)n, sizeof *order, by_seed_then_index);
    group_run *runs = malloc(sizeof *runs * (size_t)(n + 1));
    if (!runs) return vks_set_error(VKS_ERR_NOMEM, "verify groups: out of host memory");
    int n_groups = 0;
    for (int i = 0; i < n; i++)
        if (i == 0 || order[i].seed != order[i - 1].seed) runs[n_groups++] = (group_run){.first = order[i].index, .begin = i};
    qsort(runs, (size_t)n_groups, sizeof *runs, by_first);
    p->groups = calloc((size_t)n_groups + 1, sizeof *p->groups);
    if (!p->groups) {
        free(runs);
        return vks_set_error(VKS_ERR_NOMEM, "verify groups: out of host memory");
    }
    p->n_groups = n_groups;
    for (int g = 0; g < n_groups; g++) {
        vks_group_verdict *v = &p->groups[g];
        *v = (vks_group_verdict){.seed = order[runs[g].begin].seed, .first_failed = -1, .accepted = true};
        for (int i = runs[g].begin; i < n && order[i].seed == v->seed; i++, v->n++) p->group_of[order[i].index] = g;
    }
    free(runs);
    return VKS_OK;
}

/* ---- the checked subset ---- */

static void hash_bytes(crypto_generichash_state *h, const void *data, size_t len) {
    uint64_t n = len; /* length-prefixed: no two field sequences hash alike */
    crypto_generichash_update(h, (const unsigned char *)&n, sizeof n);
    if (len) crypto_generichash_update(h, data, len);
}

/* Everything a sample says: a changed byte anywhere changes the draw. */
static void hash_sample(crypto_generichash_state *h, const vks_rollout_sample *s) {
    hash_bytes(h, s->id, s->id ? strlen(s->id) : 0);
    hash_bytes(h, s->prompt_ids, sizeof(int32_t) * (size_t)s->n_prompt);
    hash_bytes(h, s->output_ids, sizeof(int32_t) * (size_t)s->n_output);
    uint32_t t, p;
    memcpy(&t, &s->temperature, 4), memcpy(&p, &s->top_p, 4);
    uint64_t f[6] = {s->seed, s->seq, s->top_k, t, p, (uint64_t)(int64_t)s->max_steps}; /* no padding bytes */
    hash_bytes(h, f, sizeof f);
    hash_bytes(h, s->model_hash, 32);
    hash_bytes(h, s->proofs, s->proof_bytes);
    for (int k = 0; k < s->n_stage_proofs; k++) { /* a pipeline's commitments: the worker's output too */
        const vks_stage_proof *p = &s->stage_proofs[k];
        int64_t where[3] = {p->rank, p->layer_begin, p->layer_end};
        hash_bytes(h, where, sizeof where);
        hash_bytes(h, p->proofs, p->proof_bytes);
    }
}

/* The group's Philox key: BLAKE2b(secret, its samples in file order). */
static uint64_t group_key(const vks_rollout_sample *s, const int *members, int n, uint64_t secret) {
    crypto_generichash_state h;
    uint8_t out[32];
    crypto_generichash_init(&h, NULL, 0, sizeof out);
    hash_bytes(&h, &secret, sizeof secret);
    for (int i = 0; i < n; i++) hash_sample(&h, &s[members[i]]);
    crypto_generichash_final(&h, out, sizeof out);
    uint64_t key = 0;
    for (int i = 0; i < 8; i++) key |= (uint64_t)out[i] << (8 * i);
    return key;
}

/* Uniform in [0, bound) from Philox draws (rejection: no modulo bias). */
static uint32_t uniform_below(uint64_t key, uint32_t pos, uint32_t *draw, uint32_t bound) {
    uint32_t limit = (uint32_t)(-bound) % bound; /* 2^32 mod bound: the low values drawn once too often */
    for (;;) {
        uint32_t r = vks_philox_u32(key, SELECT_STREAM, pos, (*draw)++);
        if (r >= limit) return r % bound;
    }
}

/* The first m of a partial Fisher-Yates shuffle of members are checked. */
static void draw_subset(const vks_rollout_sample *s, int *members, int n, int m, uint64_t secret, bool *checked) {
    uint64_t key = group_key(s, members, n, secret);
    for (int i = 0; i < m; i++) {
        uint32_t draw = 0;
        int j = i + (int)uniform_below(key, (uint32_t)i, &draw, (uint32_t)(n - i));
        int t = members[i];
        members[i] = members[j], members[j] = t;
        checked[members[i]] = true;
    }
}

static int draw_all(const vks_rollout_sample *s, int n, const vks_group_sampling *gs, vks_group_plan *p) {
    int *members = malloc(sizeof(int) * (size_t)(n + 1)), *fill = calloc((size_t)p->n_groups + 1, sizeof(int));
    int *start = malloc(sizeof(int) * (size_t)(p->n_groups + 1));
    int rc = members && fill && start ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "verify groups: out of host memory");
    for (int g = 0, at = 0; rc == VKS_OK && g < p->n_groups; g++) start[g] = at, at += p->groups[g].n;
    for (int i = 0; rc == VKS_OK && i < n; i++) members[start[p->group_of[i]] + fill[p->group_of[i]]++] = i;
    for (int g = 0; rc == VKS_OK && g < p->n_groups; g++) {
        vks_group_verdict *v = &p->groups[g];
        v->n_checked = vks_group_checked_count(gs, v->n);
        v->pass_bound = vks_group_pass_bound(v->n, v->n_checked, gs->bad_fraction);
        draw_subset(s, members + start[g], v->n, v->n_checked, gs->secret, p->checked);
    }
    free(members), free(fill), free(start);
    return rc;
}

void vks_group_plan_free(vks_group_plan *p) {
    if (!p) return;
    free(p->group_of);
    free(p->checked);
    free(p->groups);
    memset(p, 0, sizeof *p);
}

int vks_group_plan_make(const vks_rollout_sample *samples, int n, const vks_group_sampling *gs, vks_group_plan *out) {
    if (!out) return vks_set_error(VKS_ERR_ARG, "vks_group_plan_make: bad arguments");
    memset(out, 0, sizeof *out);
    if (n < 0 || (n > 0 && !samples)) return vks_set_error(VKS_ERR_ARG, "vks_group_plan_make: bad arguments");
    const char *problem = vks_group_sampling_problem(gs);
    if (problem) return vks_set_error(VKS_ERR_ARG, "verify groups: %s", problem);
    if (sodium_init() < 0) return vks_set_error(VKS_ERR_NOMEM, "verify groups: libsodium did not start");
    out->n_samples = n;
    out->group_of = malloc(sizeof(int) * (size_t)(n + 1));
    out->checked = calloc((size_t)n + 1, sizeof(bool));
    seed_index *order = malloc(sizeof *order * (size_t)(n + 1));
    int rc = out->group_of && out->checked && order ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "verify groups: out of host memory");
    if (rc == VKS_OK) rc = form_groups(samples, n, gs->whole_file, order, out);
    free(order);
    if (rc == VKS_OK) rc = draw_all(samples, n, gs, out);
    return rc;
}

/* ---- verdicts ---- */

/* fn over the checked samples only, its verdicts put back at their places. */
static int verify_checked(const vks_rollout_sample *samples, int n, const vks_group_plan *p, vks_verify_samples_fn fn,
                          void *ctx, vks_verdict *out) {
    int n_checked = 0;
    for (int i = 0; i < n; i++) n_checked += p->checked[i];
    vks_rollout_sample *subset = malloc(sizeof *subset * (size_t)(n_checked + 1)); /* shallow copies */
    vks_verdict *verdicts = calloc((size_t)n_checked + 1, sizeof *verdicts);
    int rc = subset && verdicts ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "verify groups: out of host memory");
    for (int i = 0, j = 0; rc == VKS_OK && i < n; i++)
        if (p->checked[i]) subset[j++] = samples[i];
    if (rc == VKS_OK) rc = fn(ctx, subset, n_checked, verdicts); /* also with none: verifier ranks wait for the end */
    for (int i = 0, j = 0; rc == VKS_OK && i < n; i++)
        if (p->checked[i]) out[i] = verdicts[j++];
    free(subset);
    free(verdicts);
    return rc;
}

static void decide(const vks_rollout_sample *samples, int n, vks_group_plan *p, vks_verdict *out) {
    for (int i = 0; i < n; i++) {
        vks_group_verdict *g = &p->groups[p->group_of[i]];
        if (!p->checked[i] || out[i].accepted) continue;
        if (g->n_failed++ == 0) g->first_failed = i;
        g->accepted = false;
    }
    for (int i = 0; i < n; i++) {
        const vks_group_verdict *g = &p->groups[p->group_of[i]];
        if (!p->checked[i]) out[i] = (vks_verdict){.accepted = true, .blamed_rank = -1};
        if (g->accepted || (p->checked[i] && !out[i].accepted)) continue;
        out[i] = (vks_verdict){.accepted = false, .blamed_rank = out[g->first_failed].blamed_rank};
        snprintf(out[i].reason, sizeof out[i].reason, "%s; group rejected: %d of %d checked samples failed, the first %s",
                 p->checked[i] ? "checked and passed" : "not checked", g->n_failed, g->n_checked,
                 samples[g->first_failed].id ? samples[g->first_failed].id : "");
    }
}

int vks_verify_groups(const vks_rollout_sample *samples, int n, const vks_group_sampling *gs,
                      vks_verify_samples_fn fn, void *ctx, vks_verdict *out, vks_group_plan *plan) {
    if (!fn || !out || !plan) return vks_set_error(VKS_ERR_ARG, "vks_verify_groups: bad arguments");
    int rc = vks_group_plan_make(samples, n, gs, plan);
    if (rc == VKS_OK) rc = verify_checked(samples, n, plan, fn, ctx, out);
    if (rc == VKS_OK) decide(samples, n, plan, out);
    return rc;
}
