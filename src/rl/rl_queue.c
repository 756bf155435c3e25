/* rl_queue.c: the groups on their way to the RL trainer, one type for both
 * hand-overs (the inference thread's, src/rl/rl_rollouts.c, and the MPI
 * trainer's, mpi/rl_roles.c). The async window lives here: the group queued
 * as number `pushed` is consumed by trainer step pushed / P + 1, whose weights
 * are step pushed / P; a group made with policy s may be at most w steps older
 * than that (w = min(k, max_off_policy)), so it is queued only while
 * pushed < (s + w + 1) * P. The consuming step is fixed at push (first in,
 * first out), so the age a group is trained at is known there: the check at
 * push covers the groups in flight and those in the queue alike. Without
 * in-flight weight updates a group's oldest policy is its only one. */
#include <stdlib.h>
#include <string.h>
#include "rl_internal.h"
#include "vkswarm/vks_common.h"

int vks_rl_queue_init(vks_rl_queue *q, int prompts_per_step, int async_level, int max_off_policy) {
    memset(q, 0, sizeof *q);
    if (prompts_per_step < 1 || async_level < 0 || async_level > 1000 || max_off_policy < 0)
        return vks_set_error(VKS_ERR_ARG, "rl queue: %d prompts per step, async level %d, max_off_policy_steps %d",
                             prompts_per_step, async_level, max_off_policy);
    q->prompts_per_step = prompts_per_step, q->async_level = async_level, q->max_off_policy = max_off_policy;
    q->cap = prompts_per_step * (async_level + 2);
    q->ring = calloc((size_t)q->cap, sizeof *q->ring);
    if (!q->ring) return vks_set_error(VKS_ERR_NOMEM, "rl: out of host memory");
    return VKS_OK;
}

void vks_rl_queue_free(vks_rl_queue *q) {
    for (int i = 0; q->ring && i < q->len; i++) vks_rl_group_free(&q->ring[(q->head + i) % q->cap]);
    free(q->ring);
    q->ring = NULL;
    q->len = 0;
}

/* The window: the most steps a queued group's policy may be behind the weights
 * of the step that consumes it. */
static int window(const vks_rl_queue *q) { return q->async_level < q->max_off_policy ? q->async_level : q->max_off_policy; }

/* How many steps older than the weights of the step that would consume it a
 * group made with policy `policy` is, queued now. */
static int64_t age_at_consumption(const vks_rl_queue *q, int64_t policy) {
    return q->pushed / q->prompts_per_step - policy;
}

int64_t vks_rl_queue_room(const vks_rl_queue *q, int64_t policy) {
    int64_t room = (policy + window(q) + 1) * q->prompts_per_step - q->pushed;
    return room > 0 ? room : 0;
}

bool vks_rl_queue_has_room(const vks_rl_queue *q, int64_t policy) { return vks_rl_queue_room(q, policy) > 0; }

int64_t vks_rl_queue_batches_to_grant(const vks_rl_queue *q, int64_t policy, int64_t out) {
    int64_t P = q->prompts_per_step, room = vks_rl_queue_room(q, policy) - out * P;
    return room > 0 ? (room + P - 1) / P : 0;
}

int vks_rl_queue_push(vks_rl_queue *q, int64_t policy, vks_rl_batch_group *groups, int n_groups,
                      const vks_rl_gen_counts *cnt, int max_empty_batches) {
    int useful = 0;
    if (n_groups < 0 || n_groups > q->prompts_per_step)
        return vks_set_error(VKS_ERR_ARG, "rl queue: a batch of %d groups (at most %d)", n_groups, q->prompts_per_step);
    for (int p = 0; p < n_groups; p++) {
        vks_rl_batch_group *g = &groups[p];
        useful += g->n > 0;
        if (!g->n) q->counters.filtered++;
        else if (age_at_consumption(q, policy) > q->max_off_policy) q->counters.off_policy++, vks_rl_group_free(g);
        else if (!vks_rl_queue_has_room(q, policy) || q->len == q->cap) q->counters.stale++, vks_rl_group_free(g);
        else {
            q->ring[(q->head + q->len) % q->cap] = *g;
            memset(g, 0, sizeof *g);
            q->len++, q->pushed++;
        }
    }
    q->counters.rollouts += cnt->rollouts, q->counters.checked += cnt->checked, q->counters.accepted += cnt->accepted;
    q->counters.rejected += cnt->checked - cnt->accepted;
    q->counters.task_reward_sum += cnt->task_reward_sum;
    /* counted in prompts: batches may be partial (the window's room) */
    q->empty_prompts = useful ? 0 : q->empty_prompts + n_groups;
    int most = max_empty_batches ? max_empty_batches : VKS_RL_MAX_EMPTY_BATCHES;
    if (q->empty_prompts >= (int64_t)most * q->prompts_per_step)
        return vks_set_error(VKS_ERR_ARG, "%lld prompts in a row (%d batches' worth) without a group whose rewards "
                             "differ: the task is too hard (or too easy) for this policy; warm it up first (train "
                             "sft) or choose another task", (long long)q->empty_prompts, most);
    return VKS_OK;
}

int vks_rl_queue_pop(vks_rl_queue *q, int n, vks_rl_batch_group *out) {
    if (n < 0 || n > q->len) return vks_set_error(VKS_ERR_ARG, "rl queue: %d of %d groups taken", n, q->len);
    for (int i = 0; i < n; i++) {
        out[i] = q->ring[q->head];
        memset(&q->ring[q->head], 0, sizeof q->ring[q->head]);
        q->head = (q->head + 1) % q->cap;
        q->len--;
    }
    return VKS_OK;
}
