/* rl_status.c: the trainer's status line after a silence (vks_rl_roles.h:
 * vks_rl_status). The counts are the queue's, since the step waited for began. */
#include <stdio.h>
#include <string.h>
#include "rl_internal.h"
#include "vkswarm/vks_common.h"

void vks_rl_status_begin(vks_rl_status *s, int64_t step, int64_t steps, double now) {
    s->step = step, s->steps = steps, s->step_start = now;
    s->have_base = false;
    if (s->last == 0) s->last = now;
}

void vks_rl_status_said(vks_rl_status *s, double now) { s->last = now; }

double vks_rl_status_due_in(const vks_rl_status *s) {
    if (!s) return VKS_RL_STATUS_INTERVAL_S;
    if (!s->say || !(s->interval_s > 0)) return s->interval_s > 0 ? s->interval_s : VKS_RL_STATUS_INTERVAL_S;
    double left = s->last + s->interval_s - vks_seconds_now();
    return left > 0 ? left : 0;
}

void vks_rl_status_poll(vks_rl_status *s, const vks_rl_queue *q, const char *in_flight) {
    if (!s || !s->say || !(s->interval_s > 0)) return;
    if (!s->have_base) { /* the first poll of the step: counts go from here */
        s->base = q->counters, s->base_pushed = q->pushed;
        s->have_base = true;
    }
    double now = vks_seconds_now();
    if (now - s->last < s->interval_s) return;
    int64_t filtered = q->counters.filtered - s->base.filtered, stale = q->counters.stale - s->base.stale;
    int64_t off = q->counters.off_policy - s->base.off_policy;
    int64_t made = filtered + stale + off + (q->pushed - s->base_pushed);
    char line[1024], more[96] = "";
    if (stale) snprintf(more, sizeof more, ", %lld stale", (long long)stale);
    if (off) snprintf(more + strlen(more), sizeof more - strlen(more), ", %lld off-policy", (long long)off);
    int n = snprintf(line, sizeof line, "rl: step %lld/%lld, %.0f s without a step: generated %lld groups, discarded %lld "
                     "(no signal)%s, kept %d/%d", (long long)s->step, (long long)s->steps, now - s->step_start,
                     (long long)made, (long long)filtered, more, q->len < q->prompts_per_step ? q->len : q->prompts_per_step,
                     q->prompts_per_step);
    if (in_flight && in_flight[0] && n > 0 && (size_t)n < sizeof line)
        snprintf(line + n, sizeof line - (size_t)n, "; %s", in_flight);
    s->say(s->ctx, line);
    s->last = now;
}
