/* vks_verify_group.h: group-level verdicts (TOPLOC v2 style): the rollouts of
 * one generation batch are accepted or rejected together after verifying a
 * sampled subset of them (src/toploc/verify_group.c).
 *
 * Groups: the samples sharing a sampler seed (one generate or pipeline run,
 * one RL batch of one worker), or the whole file (whole_file). Each group's
 * checked subset is m = min(count, n) samples, or ceil(fraction * n) (at
 * least 1) without count, drawn without replacement (a partial Fisher-Yates
 * shuffle on Philox draws) keyed by BLAKE2b(secret, hash of the group's
 * samples): a worker that does not know the secret cannot tell which of its
 * samples will be checked, and a subset seen in one output says nothing about
 * the next file's. A group is accepted iff every checked sample is; then its
 * unchecked samples are accepted unverified. Otherwise every sample of the
 * group is rejected (the checked failures with their own reason).
 *
 * The false-acceptance bound: if k of a group's n samples are bad and m are
 * checked, the group passes only when none of the k is drawn:
 *   P(pass) = C(n - k, m) / C(n, m) = prod_{i<m} (n - k - i) / (n - i) <= (1 - k/n)^m.
 * pass_bound is that value at k = ceil(bad_fraction * n) (at least 1): a
 * group with at least that share of bad samples passes with at most this
 * probability (P falls as k grows). */
#ifndef VKS_VERIFY_GROUP_H
#define VKS_VERIFY_GROUP_H
#include "vks_toploc.h"

typedef struct {
    double fraction;     /* share of each group to check, in (0, 1] (used when count is 0) */
    int count;           /* samples to check per group (0: use fraction) */
    uint64_t secret;     /* the verifier's secret: keep it from the workers */
    double bad_fraction; /* the share of bad samples the stated bound is for, in (0, 1] */
    bool whole_file;     /* one group for all samples instead of one per seed */
} vks_group_sampling;

typedef struct {
    uint64_t seed;       /* the samples' sampler seed (0 for a whole-file group) */
    int n;               /* samples in the group */
    int n_checked;       /* of them verified */
    int n_failed;        /* checked samples rejected */
    int first_failed;    /* index (in the file) of the first of them; -1 when none */
    bool accepted;
    double pass_bound;   /* see above */
} vks_group_verdict;

/* The grouping and the checked subset; arrays owned by the plan. */
typedef struct {
    int n_samples, n_groups;
    int *group_of;              /* [n_samples]: the sample's group, groups in order of first appearance */
    bool *checked;              /* [n_samples] */
    vks_group_verdict *groups;  /* [n_groups] */
} vks_group_plan;

/* Verifies samples[0..n) into out[n] (fn's verdicts, or the group's). */
typedef int (*vks_verify_samples_fn)(void *ctx, const vks_rollout_sample *samples, int n, vks_verdict *out);

/* Defaults: fraction 1 (every sample), bad_fraction 0.1, secret 0 (set one). */
void vks_group_sampling_default(vks_group_sampling *gs);
/* A fresh secret from the OS (libsodium's randombytes). */
int vks_group_secret_random(uint64_t *out);
/* Checks the ranges above; returns NULL or the problem. */
const char *vks_group_sampling_problem(const vks_group_sampling *gs);
/* m for a group of n (0 for n = 0). */
int vks_group_checked_count(const vks_group_sampling *gs, int n);
/* C(n - k, m) / C(n, m), k = ceil(bad_fraction * n) clamped to 1..n (1 when n = 0). */
double vks_group_pass_bound(int n, int m, double bad_fraction);

/* Forms the groups and draws each one's checked subset (no verification yet). */
int vks_group_plan_make(const vks_rollout_sample *samples, int n, const vks_group_sampling *gs, vks_group_plan *out);
void vks_group_plan_free(vks_group_plan *p);

/* The whole job: the plan, then fn over the checked samples (in file order,
 * one call, also when none is checked), then the group verdicts; out[i] is the final verdict of sample i
 * (an unchecked sample of an accepted group: accepted, reason ""). plan is
 * filled (free it with vks_group_plan_free, also after an error). */
int vks_verify_groups(const vks_rollout_sample *samples, int n, const vks_group_sampling *gs,
                      vks_verify_samples_fn fn, void *ctx, vks_verdict *out, vks_group_plan *plan);
#endif
