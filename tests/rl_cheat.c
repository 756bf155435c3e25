/* rl_cheat.c: TEST ONLY. Dishonest inference ranks for tests/mpi/test_rl.sh,
 * linked into the test build's vkswarm_cheat (tests/meson.build: the CLI
 * compiled with -DVKS_TEST_CHEAT), never into vkswarm. VKSWARM_TEST_CHEAT =
 * "RANK:KIND[,RANK:KIND]...": inference rank RANK spoils every batch it sends
 * (vks_rl_mpi_options.test_tamper) the way KIND says:
 *   hide    sends the groups that carry signal without their completions (as
 *           if they had none): it would choose what the policy learns from
 *   logp    claims a log-probability of -3e38 for every completion token (it
 *           would set the importance ratios)
 *   counts  claims 0 completions checked and 0 accepted
 *   sum     claims a task reward sum one higher than its rollouts give (at
 *           most one per rollout)
 *   reply   writes its own tool results: the first token of each episode's first
 *           environment reply (multi-turn tasks) moved by one
 *   base    loads another base model than the others once the start-up check
 *           passed (its final norm's first weight + 1; --init tiny): it
 *           refuses every adapter the trainer broadcasts, through the check
 *           an honest rank with another model file would fail */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "vkswarm/vks_rl_roles.h"
#include "vkswarm/vks_model.h"
#include "vkswarm/vks_rl_mpi.h"

enum { CHEAT_HIDE = 1, CHEAT_LOGP, CHEAT_COUNTS, CHEAT_SUM, CHEAT_BASE, CHEAT_REPLY };
static int cheat_kind;
static int cheat_prompts; /* groups per batch */

static void tamper(void *ctx, void *groups_, void *counts_) {
    (void)ctx;
    vks_rl_batch_group *groups = groups_;
    vks_rl_gen_counts *cnt = counts_;
    for (int p = 0; p < cheat_prompts; p++) {
        vks_rl_batch_group *g = &groups[p];
        if (cheat_kind == CHEAT_HIDE) vks_rl_group_free(g); /* n = 0: "no signal" */
        for (int i = 0; cheat_kind == CHEAT_LOGP && i < g->n; i++)
            for (int k = 0; k < g->samples[i].completion_len; k++) g->samples[i].logp[k] = -3e38f;
        for (int i = 0; cheat_kind == CHEAT_REPLY && i < g->n; i++) {
            vks_rl_sample *s = &g->samples[i];
            int k = 0;
            while (s->trained && k < s->completion_len && s->trained[k]) k++;
            int32_t *t = &s->tokens[s->prompt_len + k];
            if (s->trained && k < s->completion_len) *t = *t > 0 ? *t - 1 : *t + 1; /* stays in the vocabulary */
        }
    }
    if (cheat_kind == CHEAT_COUNTS) cnt->checked = cnt->accepted = 0;
    if (cheat_kind == CHEAT_SUM)
        cnt->task_reward_sum = cnt->task_reward_sum + 1 <= (double)cnt->rollouts ? cnt->task_reward_sum + 1
                                                                                   : cnt->task_reward_sum - 1;
}

/* Sets mo's hook (base: changes m) when `spec` names `rank`; -1 on a
 * malformed spec, or base on a model whose weights are not f32 in memory. */
int vks_test_cheat_setup(const char *spec, int rank, int prompts_per_step, vks_rl_mpi_options *mo, vks_model *m);
int vks_test_cheat_setup(const char *spec, int rank, int prompts_per_step, vks_rl_mpi_options *mo, vks_model *m) {
    static const char *const kinds[] = {"", "hide", "logp", "counts", "sum", "base", "reply"};
    for (const char *at = spec; at && *at;) {
        char kind[16] = "";
        int r = -1, used = 0;
        if (sscanf(at, "%d:%15[a-z]%n", &r, kind, &used) != 2) return -1;
        int k = 0;
        for (int i = 1; i < 7; i++)
            if (!strcmp(kind, kinds[i])) k = i;
        if (!k) return -1;
        if (r == rank && k == CHEAT_BASE) {
            if (m->map || m->final_norm.dtype != VKS_DTYPE_F32 || !m->final_norm.data) return -1; /* --init tiny's */
            ((float *)m->final_norm.data)[0] += 1.0f;
            fprintf(stderr, "vkswarm: rl: TEST: rank %d changes its base model after the start-up check\n", rank);
        } else if (r == rank) {
            cheat_kind = k, cheat_prompts = prompts_per_step;
            mo->test_tamper = tamper;
            fprintf(stderr, "vkswarm: rl: TEST: inference rank %d cheats (%s)\n", rank, kind);
        }
        at += used;
        if (*at == ',') at++;
        else if (*at) return -1;
    }
    return 0;
}
