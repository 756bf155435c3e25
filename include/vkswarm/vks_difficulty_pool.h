/* vks_difficulty_pool.h: prime-rl's difficulty pools over a task file (config "buffer", type
 * difficulty_pool; vks_rl_buffer says the rule). Each task is in one pool by its latest group's solve
 * rate; each batch slot (a group's task_index) gets its task drawn once, with the pools as they are
 * then, from a draw keyed by the seed and the slot. Safe to share between threads. */
#ifndef VKS_DIFFICULTY_POOL_H
#define VKS_DIFFICULTY_POOL_H
#include <stdint.h>
#include "vks_rl_config.h"

enum { VKS_POOL_EASY = 0, VKS_POOL_NORMAL = 1, VKS_POOL_HARD = 2, VKS_POOL_COUNT = 3 };
/* How many slots back a slot's task is remembered: older ones are refused (the report and the checks
 * ask only for the batches in flight and the step's). */
#define VKS_POOL_SLOTS (1 << 16)

typedef struct vks_difficulty_pool vks_difficulty_pool;

/* A pool over tasks 0..n_tasks-1, every one in the normal pool. */
int vks_difficulty_pool_create(int64_t n_tasks, const vks_rl_buffer *b, uint64_t seed, vks_difficulty_pool **out);
void vks_difficulty_pool_free(vks_difficulty_pool *p);
/* The task of slot `slot` (>= 0): drawn the first time it is asked for, the same afterwards;
 * VKS_ERR_ARG for a slot older than the last VKS_POOL_SLOTS drawn. */
int vks_difficulty_pool_task(vks_difficulty_pool *p, int64_t slot, int64_t *task);
/* Task `task`'s latest solve rate (its group's mean task reward, in [0, 1]) moves it to its pool. */
int vks_difficulty_pool_record(vks_difficulty_pool *p, int64_t task, double solve_rate);
/* The pools' sizes now, indexed by VKS_POOL_*. */
void vks_difficulty_pool_sizes(vks_difficulty_pool *p, int64_t sizes[VKS_POOL_COUNT]);
/* The pool a solve rate puts a task in (the rule, for tests and docs). */
int vks_difficulty_pool_of(const vks_rl_buffer *b, double solve_rate);

#endif
