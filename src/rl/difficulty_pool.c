/* difficulty_pool.c: prime-rl's difficulty pools (vks_difficulty_pool.h). Each pool is an array of its
 * tasks with each task's place in it, so that a move is O(1); a ring remembers the task of the last
 * VKS_POOL_SLOTS slots drawn. */
#include "vkswarm/vks_difficulty_pool.h"
#include <pthread.h>
#include <stdlib.h>
#include "vkswarm/vks_common.h"
#include "vkswarm/vks_philox.h"

#define POOL_STREAM 0xd1f7u /* the draws' Philox stream (the batch sampler's is 0x5a3d) */

typedef struct {
    int64_t slot, task;
} slot_entry;

struct vks_difficulty_pool {
    pthread_mutex_t mu;
    vks_rl_buffer rule;
    uint64_t seed;
    int64_t n_tasks;
    uint8_t *pool_of;          /* [n_tasks] */
    int64_t *members[VKS_POOL_COUNT], size[VKS_POOL_COUNT]; /* members[k][0 .. size[k]) */
    int64_t *place;            /* [n_tasks]: the task's index in members[pool_of[task]] */
    slot_entry *ring;          /* [VKS_POOL_SLOTS], slot -1: empty */
    int64_t newest;            /* the highest slot drawn (-1: none) */
};

int vks_difficulty_pool_of(const vks_rl_buffer *b, double solve_rate) {
    if (solve_rate > b->easy_threshold) return VKS_POOL_EASY;
    if (solve_rate <= b->hard_threshold) return VKS_POOL_HARD;
    return VKS_POOL_NORMAL;
}

int vks_difficulty_pool_create(int64_t n_tasks, const vks_rl_buffer *b, uint64_t seed, vks_difficulty_pool **out) {
    if (!b || !out || n_tasks < 1 || n_tasks > ((int64_t)1 << 40))
        return vks_set_error(VKS_ERR_ARG, "difficulty pool: bad arguments (%lld tasks)", (long long)n_tasks);
    *out = NULL;
    vks_difficulty_pool *p = calloc(1, sizeof *p);
    if (!p) return vks_set_error(VKS_ERR_NOMEM, "difficulty pool: out of host memory");
    p->rule = *b, p->seed = seed, p->n_tasks = n_tasks, p->newest = -1;
    p->pool_of = malloc((size_t)n_tasks);
    p->place = malloc(sizeof *p->place * (size_t)n_tasks);
    p->ring = malloc(sizeof *p->ring * VKS_POOL_SLOTS);
    bool ok = p->pool_of && p->place && p->ring;
    for (int k = 0; k < VKS_POOL_COUNT; k++) ok = ok && (p->members[k] = malloc(sizeof(int64_t) * (size_t)n_tasks));
    if (!ok) {
        vks_difficulty_pool_free(p);
        return vks_set_error(VKS_ERR_NOMEM, "difficulty pool: out of host memory (%lld tasks)", (long long)n_tasks);
    }
    for (int64_t t = 0; t < n_tasks; t++)
        p->pool_of[t] = VKS_POOL_NORMAL, p->place[t] = t, p->members[VKS_POOL_NORMAL][t] = t;
    p->size[VKS_POOL_NORMAL] = n_tasks;
    for (int i = 0; i < VKS_POOL_SLOTS; i++) p->ring[i].slot = -1;
    pthread_mutex_init(&p->mu, NULL);
    *out = p;
    return VKS_OK;
}

void vks_difficulty_pool_free(vks_difficulty_pool *p) {
    if (!p) return;
    if (p->ring) pthread_mutex_destroy(&p->mu); /* made last: the mutex was made only after every allocation */
    free(p->pool_of), free(p->place), free(p->ring);
    for (int k = 0; k < VKS_POOL_COUNT; k++) free(p->members[k]);
    free(p);
}

/* Slot `slot`'s draw: a pool by the weights of the non-empty ones, then a task uniformly in it. */
static int64_t draw(const vks_difficulty_pool *p, int64_t slot) {
    uint32_t w[4];
    vks_philox4_u32(p->seed, (uint32_t)slot, POOL_STREAM, (uint32_t)((uint64_t)slot >> 32), w);
    const double weight[VKS_POOL_COUNT] = {p->rule.easy_weight, p->rule.normal_weight, p->rule.hard_weight};
    double total = 0;
    for (int k = 0; k < VKS_POOL_COUNT; k++) total += p->size[k] ? weight[k] : 0;
    int pool = -1;
    double u = vks_rng_uniform(w[0]) * total; /* in (0, total) */
    for (int k = 0; k < VKS_POOL_COUNT; k++) {
        double wk = p->size[k] ? weight[k] : 0;
        if (wk <= 0) continue;
        pool = k; /* the last weighted pool, should rounding run past the end */
        if (u < wk) break;
        u -= wk;
    }
    /* every non-empty pool weighted 0 (the config refuses only all weights 0): the largest pool */
    for (int k = 0; pool < 0 && k < VKS_POOL_COUNT; k++)
        if (p->size[k] >= p->size[(k + 1) % VKS_POOL_COUNT] && p->size[k] >= p->size[(k + 2) % VKS_POOL_COUNT]) pool = k;
    uint64_t r = ((uint64_t)w[1] << 32) | w[2];
    return p->members[pool][r % (uint64_t)p->size[pool]];
}

int vks_difficulty_pool_task(vks_difficulty_pool *p, int64_t slot, int64_t *task) {
    if (!p || !task || slot < 0) return vks_set_error(VKS_ERR_ARG, "difficulty pool: bad slot");
    pthread_mutex_lock(&p->mu);
    slot_entry *e = &p->ring[slot % VKS_POOL_SLOTS];
    int rc = VKS_OK;
    if (p->newest >= VKS_POOL_SLOTS && slot <= p->newest - VKS_POOL_SLOTS) {
        rc = vks_set_error(VKS_ERR_ARG, "difficulty pool: slot %lld is older than the %d kept", (long long)slot,
                           VKS_POOL_SLOTS);
    } else if (e->slot == slot) {
        *task = e->task;
    } else {
        *e = (slot_entry){slot, draw(p, slot)};
        *task = e->task;
        if (slot > p->newest) p->newest = slot;
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int vks_difficulty_pool_record(vks_difficulty_pool *p, int64_t task, double solve_rate) {
    if (!p || task < 0 || task >= p->n_tasks || !(solve_rate >= 0 && solve_rate <= 1))
        return vks_set_error(VKS_ERR_ARG, "difficulty pool: task %lld, solve rate %g", (long long)task, solve_rate);
    pthread_mutex_lock(&p->mu);
    int from = p->pool_of[task], to = vks_difficulty_pool_of(&p->rule, solve_rate);
    if (from != to) {
        int64_t at = p->place[task], last = p->members[from][--p->size[from]];
        p->members[from][at] = last, p->place[last] = at; /* the last member fills the gap */
        p->members[to][p->size[to]] = task, p->place[task] = p->size[to]++;
        p->pool_of[task] = (uint8_t)to;
    }
    pthread_mutex_unlock(&p->mu);
    return VKS_OK;
}

void vks_difficulty_pool_sizes(vks_difficulty_pool *p, int64_t sizes[VKS_POOL_COUNT]) {
    pthread_mutex_lock(&p->mu);
    for (int k = 0; k < VKS_POOL_COUNT; k++) sizes[k] = p->size[k];
    pthread_mutex_unlock(&p->mu);
}
