/* timeline.c: what the RL run's roles did when (rl_internal.h): a bounded
 * ring of intervals per role (trainer: wait, train, publish, evaluate;
 * inference thread: wait, load weights, generate, verify), drawn at the end
 * of the run as OUT/timeline.svg over the trainer's last few steps, with the
 * seconds per kind and who waited for whom in that window. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "rl_internal.h"
#include "vkswarm/vks_metrics.h"

/* Legend names and colors, indexed by vks_rl_work. */
static const vks_timeline_kind work_kinds[VKS_RL_WORK_KINDS] = {
    [VKS_RL_WORK_WAIT] = {"wait", 0xc7c7c7},         [VKS_RL_WORK_TRAIN] = {"train", 0x1f77b4},
    [VKS_RL_WORK_PUBLISH] = {"publish weights", 0xff7f0e}, [VKS_RL_WORK_EVAL] = {"evaluate", 0x9467bd},
    [VKS_RL_WORK_LOAD] = {"load weights", 0x8c564b}, [VKS_RL_WORK_GENERATE] = {"generate", 0x2ca02c},
    [VKS_RL_WORK_VERIFY] = {"verify", 0xd62728}};

int vks_rl_timeline_init(vks_rl_timeline *t, double t0) {
    *t = (vks_rl_timeline){.t0 = t0};
    t->spans = malloc(sizeof *t->spans * VKS_RL_TIMELINE_SPANS);
    return t->spans ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "rl: out of host memory");
}

void vks_rl_timeline_free(vks_rl_timeline *t) {
    free(t->spans);
    t->spans = NULL;
    t->next = t->len = 0;
}

void vks_rl_timeline_add(vks_rl_timeline *t, vks_rl_work kind, int64_t step, double start, double end) {
    if (!t || !t->spans) return;
    t->spans[t->next] = (vks_rl_span){.start = start - t->t0, .end = end - t->t0, .step = step, .kind = kind};
    t->next = (t->next + 1) % VKS_RL_TIMELINE_SPANS;
    if (t->len < VKS_RL_TIMELINE_SPANS) t->len++;
}

void vks_rl_timeline_note(vks_rl_timeline *t, vks_rl_work kind, int64_t step, double *since) {
    double now = vks_seconds_now();
    vks_rl_timeline_add(t, kind, step, *since, now);
    *since = now;
}

/* The i-th kept interval, oldest first. */
static const vks_rl_span *span_at(const vks_rl_timeline *t, int i) {
    return &t->spans[(t->next - t->len + i + VKS_RL_TIMELINE_SPANS) % VKS_RL_TIMELINE_SPANS];
}

/* What the chart shows: the trainer's intervals of steps >= from, and the
 * inference thread's within [start, end] (seconds since the run's start). */
typedef struct {
    int64_t from;
    double start, end;
} window;

/* The trainer's last last_n steps (from step 0, the start's evaluation, when
 * that reaches step 1): the window, and the steps in *sum. */
static window find_window(const vks_rl_timeline *tr, int last_n, vks_rl_timeline_summary *sum) {
    int64_t last = 0;
    for (int i = 0; i < tr->len; i++)
        if (span_at(tr, i)->step > last) last = span_at(tr, i)->step;
    int64_t first = last - last_n + 1 > 1 ? last - last_n + 1 : 1;
    window w = {.from = first > 1 ? first : 0, .start = INFINITY, .end = -INFINITY};
    sum->first_step = last, sum->last_step = last;
    for (int i = 0; i < tr->len; i++) {
        const vks_rl_span *s = span_at(tr, i);
        if (s->step < w.from) continue;
        /* the first step shown (later than `first` when the ring lost its start) */
        if (s->step >= first && s->step < sum->first_step) sum->first_step = s->step;
        w.start = fmin(w.start, s->start), w.end = fmax(w.end, s->end);
    }
    if (w.start > w.end) w.start = w.end = 0; /* nothing recorded */
    sum->start = w.start, sum->end = w.end;
    return w;
}

/* Seconds of [a0, a1] within [b0, b1]. */
static double overlap(double a0, double a1, double b0, double b1) {
    double d = fmin(a1, b1) - fmax(a0, b0);
    return d > 0 ? d : 0;
}

/* A role's interval as shown: the trainer's whole (steps from w.from), the
 * inference thread's clipped to the window; false when not shown. */
static bool shown(const vks_rl_span *s, const window *w, bool trainer, double *s0, double *s1) {
    *s0 = trainer ? s->start : fmax(s->start, w->start);
    *s1 = trainer ? s->end : fmin(s->end, w->end);
    return trainer ? s->step >= w->from : *s1 > *s0;
}

typedef struct {
    const vks_rl_timeline *t;
    bool trainer;
} role;

/* Seconds in which a's intervals of kind `waiting` overlap b's of kinds busy1 or busy2. */
static double waited_on(role a, vks_rl_work waiting, role b, vks_rl_work busy1, vks_rl_work busy2, const window *w) {
    double total = 0, a0, a1, b0, b1;
    for (int i = 0; i < a.t->len; i++) {
        const vks_rl_span *s = span_at(a.t, i);
        if (s->kind != waiting || !shown(s, w, a.trainer, &a0, &a1)) continue;
        for (int j = 0; j < b.t->len; j++) {
            const vks_rl_span *o = span_at(b.t, j);
            if ((o->kind == busy1 || o->kind == busy2) && shown(o, w, b.trainer, &b0, &b1))
                total += overlap(a0, a1, b0, b1); /* a role's own intervals never overlap */
        }
    }
    return total;
}

/* Seconds a role spent per kind within the window. */
static void seconds_per_kind(role r, const window *w, double *seconds) {
    double s0, s1;
    for (int i = 0; r.t && i < r.t->len; i++)
        if (shown(span_at(r.t, i), w, r.trainer, &s0, &s1)) seconds[span_at(r.t, i)->kind] += s1 - s0;
}

static void summarize(role tr, role inf, const window *w, vks_rl_timeline_summary *sum) {
    double tr_s[VKS_RL_WORK_KINDS] = {0}, inf_s[VKS_RL_WORK_KINDS] = {0};
    seconds_per_kind(tr, w, tr_s);
    seconds_per_kind(inf, w, inf_s);
    sum->trainer_wait = tr_s[VKS_RL_WORK_WAIT], sum->trainer_train = tr_s[VKS_RL_WORK_TRAIN];
    sum->trainer_publish = tr_s[VKS_RL_WORK_PUBLISH], sum->trainer_eval = tr_s[VKS_RL_WORK_EVAL];
    sum->inference_wait = inf_s[VKS_RL_WORK_WAIT], sum->inference_load = inf_s[VKS_RL_WORK_LOAD];
    sum->inference_generate = inf_s[VKS_RL_WORK_GENERATE], sum->inference_verify = inf_s[VKS_RL_WORK_VERIFY];
    if (!inf.t) return;
    sum->trainer_wait_on_inference = waited_on(tr, VKS_RL_WORK_WAIT, inf, VKS_RL_WORK_GENERATE, VKS_RL_WORK_VERIFY, w);
    sum->inference_wait_on_trainer = waited_on(inf, VKS_RL_WORK_WAIT, tr, VKS_RL_WORK_TRAIN, VKS_RL_WORK_PUBLISH, w);
}

/* The role's intervals in the window as bars (the writer clips them); marks at
 * the starts of the trainer's steps (each begins with its wait). */
static int make_bars(role r, const window *w, vks_timeline_bar *bars, vks_timeline_mark *marks, int *n_marks) {
    int n = 0;
    double s0, s1;
    for (int i = 0; i < r.t->len; i++) {
        const vks_rl_span *s = span_at(r.t, i);
        if (!shown(s, w, r.trainer, &s0, &s1)) continue;
        bars[n++] = (vks_timeline_bar){.start = s->start, .end = s->end, .kind = (int)s->kind};
        if (r.trainer && s->kind == VKS_RL_WORK_WAIT && s->step >= 1)
            marks[(*n_marks)++] = (vks_timeline_mark){.t = s->start, .number = s->step};
    }
    return n;
}

/* The chart into path (a file of its own) or f (an element of the run report). */
static int write_chart(const vks_rl_timeline *trainer, const vks_rl_timeline *inference, int last_n, const char *path,
                       FILE *f, vks_rl_timeline_summary *sum) {
    *sum = (vks_rl_timeline_summary){0};
    if (!trainer->spans || last_n < 1) return vks_set_error(VKS_ERR_ARG, "rl: no timeline to write");
    if (inference && !inference->spans) inference = NULL;
    window w = find_window(trainer, last_n, sum);
    role tr = {trainer, true}, inf = {inference, false};
    summarize(tr, inf, &w, sum);
    vks_timeline_bar *bars = malloc(sizeof *bars * 2 * VKS_RL_TIMELINE_SPANS);
    vks_timeline_mark *marks = malloc(sizeof *marks * VKS_RL_TIMELINE_SPANS);
    if (!bars || !marks) {
        free(bars), free(marks);
        return vks_set_error(VKS_ERR_NOMEM, "rl: out of host memory");
    }
    int n_marks = 0;
    vks_timeline_row rows[2] = {{.name = "trainer", .bars = bars}, {.name = "inference", .bars = bars + VKS_RL_TIMELINE_SPANS}};
    rows[0].n = make_bars(tr, &w, bars, marks, &n_marks);
    if (inference) rows[1].n = make_bars(inf, &w, bars + VKS_RL_TIMELINE_SPANS, marks, &n_marks);
    char title[160];
    if (w.from == 0)
        snprintf(title, sizeof title, "RL run: what each role did, the whole run (%lld steps)", (long long)sum->last_step);
    else
        snprintf(title, sizeof title, "RL run: what each role did, steps %lld to %lld", (long long)sum->first_step,
                 (long long)sum->last_step);
    vks_timeline chart = {.title = title, .mark_label = "step", .t0 = sum->start, .t1 = sum->end, .rows = rows,
                          .n_rows = inference ? 2 : 1, .kinds = work_kinds, .n_kinds = VKS_RL_WORK_KINDS,
                          .marks = marks, .n_marks = n_marks};
    int rc = f ? vks_timeline_svg_to(f, &chart) : vks_timeline_svg(path, &chart);
    free(bars), free(marks);
    return rc;
}

int vks_rl_timeline_write(const vks_rl_timeline *trainer, const vks_rl_timeline *inference, int last_n,
                          const char *path, vks_rl_timeline_summary *sum) {
    return write_chart(trainer, inference, last_n, path, NULL, sum);
}

int vks_rl_timeline_write_to(FILE *f, const vks_rl_timeline *trainer, const vks_rl_timeline *inference, int last_n) {
    vks_rl_timeline_summary sum;
    return write_chart(trainer, inference, last_n, NULL, f, &sum);
}
