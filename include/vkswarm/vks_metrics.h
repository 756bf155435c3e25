/* vks_metrics.h: per-step training metrics as JSON lines, line plots of them
 * as SVG, and Gantt-style timelines as SVG (src/rl/metrics.c).
 *
 * DIR/metrics.jsonl holds one object per step, {"step": N, "<name>": value,
 * ...} in the order given, each line written whole and flushed: a reader
 * (`tail -f`, a plot) sees complete lines, and a crash loses at most the
 * line being written. Integral values below 2^53 are written as integers,
 * others with 17 significant digits (they read back exactly); NaN and
 * infinities, which JSON cannot hold, are written as null. */
#ifndef VKS_METRICS_H
#define VKS_METRICS_H
#include <stdio.h>
#include "vks_common.h"

typedef struct {
    const char *name;
    double value;
} vks_metric;

typedef struct vks_metrics vks_metrics;

/* Opens DIR/metrics.jsonl (DIR is created when missing). resume_step < 0
 * starts a new file (an old one is replaced); resume_step >= 0 continues a
 * resumed run: the old file's lines with a step above resume_step (written
 * after the checkpoint being resumed) and any line that is not a complete
 * object with a "step" are dropped first, in an atomic rewrite. */
int vks_metrics_open(const char *dir, int64_t resume_step, vks_metrics **out);
/* Appends {"step": step, names: values...} and flushes it. Names must be
 * distinct and not "step". */
int vks_metrics_log(vks_metrics *m, int64_t step, const vks_metric *values, int n);
/* Path of the metrics file. */
const char *vks_metrics_path(const vks_metrics *m);
/* The standard error of an accuracy p measured on n instances (binomial:
 * sqrt(p (1 - p) / n)); NaN unless 0 <= p <= 1 and n >= 1. */
double vks_binomial_se(double p, double n);
/* Closes; an error when a buffered write failed. NULL is fine. */
int vks_metrics_close(vks_metrics *m);

/* Series read back from a metrics file: x[i] = the "step" of line i, and for
 * each key k, y[k][i] its value (NaN where the line lacks it or holds null).
 * Lines that are not objects with an integer "step" are skipped; a line
 * longer than 1 MiB is an error. */
typedef struct {
    int64_t n;
    double *x;
    double **y; /* [n_keys][n] */
    int n_keys;
} vks_metric_series;
int vks_metrics_read(const char *path, const char *const *keys, int n_keys, vks_metric_series **out);
void vks_metric_series_free(vks_metric_series *s);
/* The distinct keys of the file's step lines that start with `prefix`, in
 * the order first seen, at most cap of them (*n), each shorter than
 * VKS_METRIC_KEY (longer ones are left out). */
#define VKS_METRIC_KEY 64
int vks_metrics_keys(const char *path, const char *prefix, char (*names)[VKS_METRIC_KEY], int cap, int *n);

/* ---- SVG line plots ---- */
typedef struct {
    const char *name;     /* legend entry (any bytes: escaped) */
    const double *x, *y;  /* n points; a point with x or y non-finite or beyond 1e300 in magnitude is a gap */
    int64_t n;
    const double *err;    /* NULL, or n half-widths: a bar from y - err to y + err at each point (in the range) */
    const char *color;    /* NULL: the palette's by position; else an SVG color (#rrggbb; not escaped: no input) */
    double opacity;       /* 0: opaque; else in (0, 1]: raw points drawn faintly under a smoothed line */
} vks_plot_series;

typedef struct {
    const char *title, *x_label, *y_label; /* NULL: none */
    const vks_plot_series *series;
    int n_series;
    int width, height; /* pixels; 0: 800 x 480 (at least 200 x 150) */
} vks_plot;

/* Writes the plot as a standalone SVG file, atomically (vks_outfile):
 * axes with ticks at 1-2-5 steps over the finite points' range, tick labels,
 * title and axis labels, one polyline per series and stretch between gaps
 * (a stretch of one point is a dot), a legend. Without a finite point the
 * axes span [0, 1] and the plot says "no data". */
int vks_plot_svg(const char *path, const vks_plot *p);
/* The same plot as an <svg> element (no XML declaration) written to f, for
 * embedding in an HTML page; the caller checks f's errors. */
int vks_plot_svg_to(FILE *f, const vks_plot *p);
/* Plots keys of DIR/metrics.jsonl against the step into svg_path. */
int vks_metrics_plot(const char *metrics_path, const char *const *keys, int n_keys, const char *title,
                     const char *svg_path);

/* ---- SVG timelines (Gantt charts) ---- */
typedef struct {
    const char *name;  /* legend entry (escaped) */
    uint32_t rgb;      /* bar color, 0xRRGGBB */
} vks_timeline_kind;

typedef struct {
    double start, end; /* seconds; a bar with either non-finite is left out */
    int kind;          /* index into the chart's kinds */
} vks_timeline_bar;

typedef struct {
    const char *name;  /* row label (escaped) */
    const vks_timeline_bar *bars;
    int n;
} vks_timeline_row;

typedef struct {
    double t;          /* seconds */
    int64_t number;    /* labelled "<mark_label> number" */
} vks_timeline_mark;

typedef struct {
    const char *title, *mark_label;     /* NULL: none */
    double t0, t1;                      /* the time shown (seconds); bars are clipped to it */
    const vks_timeline_row *rows;
    int n_rows;
    const vks_timeline_kind *kinds;
    int n_kinds;
    const vks_timeline_mark *marks;     /* dashed vertical lines across the rows */
    int n_marks;
    int width;                          /* pixels; 0: 900 (at least 300) */
} vks_timeline;

/* Writes the timeline as a standalone SVG file, atomically (vks_outfile):
 * one labelled row of bars per row (a bar at least half a pixel wide, with a
 * tooltip giving its kind and length; one with nothing within [t0, t1] left
 * out), the marks, a time axis in seconds with ticks at 1-2-5 steps, and a
 * legend of the kinds some bar uses. When t1 <= t0 (or either is not finite)
 * the axis spans [t0, t0 + 1]. */
int vks_timeline_svg(const char *path, const vks_timeline *t);
/* The same chart as an <svg> element written to f (as vks_plot_svg_to). */
int vks_timeline_svg_to(FILE *f, const vks_timeline *t);
#endif
