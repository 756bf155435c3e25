/* metrics.c: per-step metrics appended to DIR/metrics.jsonl (vks_metrics.h),
 * read back as series, a small SVG line-plot writer for them, and an SVG
 * timeline (Gantt chart) writer. */
#include "vkswarm/vks_metrics.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_LINE_BYTES ((size_t)1 << 20)

struct vks_metrics {
    FILE *f;
    char *path;
};

/* ---- lines ---- */

/* Reads one line (without its LF) into *buf; a line over MAX_LINE_BYTES sets
 * *too_long and is consumed. Returns false at EOF (or when out of memory:
 * then !feof). */
static bool read_line(FILE *f, char **buf, size_t *cap, size_t *len, bool *too_long) {
    *len = 0;
    *too_long = false;
    int ch;
    bool any = false;
    while ((ch = getc(f)) != EOF) {
        any = true;
        if (ch == '\n') break;
        if (*len >= MAX_LINE_BYTES) {
            *too_long = true;
            continue;
        }
        if (*len + 1 >= *cap) {
            size_t n = *cap ? *cap * 2 : 1024;
            char *p = realloc(*buf, n);
            if (!p) return false;
            *buf = p;
            *cap = n;
        }
        (*buf)[(*len)++] = (char)ch;
    }
    return any;
}

/* The line's object when it is one with an integer "step" (else NULL). */
static json_t *step_object(const char *line, size_t len, int64_t *step) {
    json_t *o = json_loadb(line, len, JSON_REJECT_DUPLICATES, NULL);
    json_t *s = json_object_get(o, "step");
    if (!json_is_object(o) || !json_is_integer(s)) {
        json_decref(o);
        return NULL;
    }
    *step = json_integer_value(s);
    return o;
}

/* ---- writing ---- */

static int make_dir(const char *dir) {
    if (mkdir(dir, 0777) == 0 || errno == EEXIST) return VKS_OK;
    return vks_set_error(VKS_ERR_IO, "%s: cannot create directory: %s", dir, strerror(errno));
}

/* Rewrites path with the old lines whose step is at most keep_through
 * (none when keep_through < 0 or the file is missing). */
static int rewrite(const char *path, int64_t keep_through) {
    vks_outfile o;
    int rc = vks_outfile_open(&o, path, 0666);
    if (rc != VKS_OK) return rc;
    FILE *in = keep_through >= 0 ? fopen(path, "rb") : NULL;
    if (keep_through >= 0 && !in && errno != ENOENT) {
        int e = errno;
        vks_outfile_abort(&o);
        return vks_set_error(VKS_ERR_IO, "%s: cannot read the previous metrics: %s", path, strerror(e));
    }
    char *buf = NULL;
    size_t cap = 0, len = 0;
    bool too_long, ok = true;
    while (in && ok && read_line(in, &buf, &cap, &len, &too_long)) {
        int64_t step = 0;
        json_t *obj = too_long ? NULL : step_object(buf, len, &step);
        if (obj && step <= keep_through) ok = fwrite(buf, 1, len, o.f) == len && putc('\n', o.f) != EOF;
        json_decref(obj);
    }
    bool read_failed = in && (ferror(in) || !feof(in));
    if (in) fclose(in);
    free(buf);
    if (read_failed) {
        vks_outfile_abort(&o);
        return vks_set_error(VKS_ERR_IO, "%s: cannot read the previous metrics", path);
    }
    return vks_outfile_finish(&o, ok);
}

int vks_metrics_open(const char *dir, int64_t resume_step, vks_metrics **out) {
    if (!dir || !out) return vks_set_error(VKS_ERR_ARG, "vks_metrics_open: NULL argument");
    *out = NULL;
    int rc = make_dir(dir);
    if (rc != VKS_OK) return rc;
    vks_metrics *m = calloc(1, sizeof *m);
    size_t n = strlen(dir) + sizeof "/metrics.jsonl";
    if (m) m->path = malloc(n);
    if (!m || !m->path) {
        free(m);
        return vks_set_error(VKS_ERR_NOMEM, "out of memory");
    }
    snprintf(m->path, n, "%s/metrics.jsonl", dir);
    rc = rewrite(m->path, resume_step);
    if (rc == VKS_OK) {
        m->f = fopen(m->path, "ab");
        if (!m->f) rc = vks_set_error(VKS_ERR_IO, "%s: cannot open: %s", m->path, strerror(errno));
    }
    if (rc != VKS_OK) {
        free(m->path);
        free(m);
        return rc;
    }
    *out = m;
    return VKS_OK;
}

static json_t *metric_value(double v) {
    if (!isfinite(v)) return json_null();
    if (v == floor(v) && fabs(v) < 9007199254740992.0) return json_integer((json_int_t)v);
    return json_real(v);
}

static int check_names(const vks_metric *v, int n) {
    for (int i = 0; i < n; i++) {
        if (!v[i].name || !v[i].name[0] || !strcmp(v[i].name, "step"))
            return vks_set_error(VKS_ERR_ARG, "metrics: metric %d has no name or is called \"step\"", i);
        for (int j = 0; j < i; j++)
            if (!strcmp(v[i].name, v[j].name)) return vks_set_error(VKS_ERR_ARG, "metrics: \"%s\" twice", v[i].name);
    }
    return VKS_OK;
}

int vks_metrics_log(vks_metrics *m, int64_t step, const vks_metric *values, int n) {
    if (!m || !m->f || (n && !values) || n < 0) return vks_set_error(VKS_ERR_ARG, "vks_metrics_log: bad argument");
    int rc = check_names(values, n);
    if (rc != VKS_OK) return rc;
    json_t *o = json_object();
    bool ok = o && json_object_set_new(o, "step", json_integer((json_int_t)step)) == 0;
    for (int i = 0; i < n && ok; i++) ok = json_object_set_new(o, values[i].name, metric_value(values[i].value)) == 0;
    char *line = ok ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(o);
    if (!line) return vks_set_error(VKS_ERR_NOMEM, "%s: cannot format a line", m->path);
    size_t len = strlen(line);
    line[len] = '\n'; /* json_dumps' terminator becomes the newline: the line goes out in one write */
    ok = fwrite(line, 1, len + 1, m->f) == len + 1 && fflush(m->f) == 0;
    int e = errno;
    free(line);
    return ok ? VKS_OK : vks_set_error(VKS_ERR_IO, "%s: write failed: %s", m->path, strerror(e ? e : EIO));
}

const char *vks_metrics_path(const vks_metrics *m) { return m ? m->path : NULL; }

double vks_binomial_se(double p, double n) {
    if (!(p >= 0 && p <= 1 && n >= 1 && isfinite(n))) return NAN;
    return sqrt(p * (1 - p) / n);
}

int vks_metrics_close(vks_metrics *m) {
    if (!m) return VKS_OK;
    int rc = VKS_OK;
    if (m->f) {
        bool failed = ferror(m->f) != 0;
        failed = fclose(m->f) != 0 || failed;
        if (failed) rc = vks_set_error(VKS_ERR_IO, "%s: write failed: %s", m->path, strerror(errno ? errno : EIO));
    }
    free(m->path);
    free(m);
    return rc;
}

/* ---- reading series ---- */

static int series_grow(vks_metric_series *s, int64_t *cap) {
    if (s->n < *cap) return VKS_OK;
    int64_t n = *cap ? 2 * *cap : 256;
    double *x = realloc(s->x, (size_t)n * sizeof *x);
    if (x) s->x = x;
    for (int k = 0; k < s->n_keys && x; k++) {
        double *y = realloc(s->y[k], (size_t)n * sizeof *y);
        if (!y) x = NULL;
        else s->y[k] = y;
    }
    if (!x) return vks_set_error(VKS_ERR_NOMEM, "metrics: out of memory");
    *cap = n;
    return VKS_OK;
}

static double read_value(json_t *v) { return json_is_number(v) ? json_number_value(v) : NAN; }

/* Calls fn(ctx, o, step) for each step line of the metrics file at path
 * (lines that are not objects with an integer "step" skipped); a line longer
 * than 1 MiB, a failed read or fn's error stops it. */
static int each_step_line(const char *path, int (*fn)(void *ctx, json_t *o, int64_t step), void *ctx) {
    FILE *f = fopen(path, "rb");
    if (!f) return vks_set_error(VKS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t cap = 0, len = 0;
    bool too_long;
    int rc = VKS_OK;
    while (rc == VKS_OK && read_line(f, &buf, &cap, &len, &too_long)) {
        if (too_long) {
            rc = vks_set_error(VKS_ERR_FORMAT, "%s: a line longer than 1 MiB", path);
            break;
        }
        int64_t step = 0;
        json_t *o = step_object(buf, len, &step);
        if (o) rc = fn(ctx, o, step);
        json_decref(o);
    }
    if (rc == VKS_OK && (ferror(f) || !feof(f))) rc = vks_set_error(VKS_ERR_IO, "%s: read failed", path);
    free(buf);
    fclose(f);
    return rc;
}

typedef struct {
    const char *const *keys;
    vks_metric_series *s;
    int64_t n_cap;
} series_reader;

/* One step line into the series: its step, and each key's value. */
static int series_line(void *ctx, json_t *o, int64_t step) {
    series_reader *r = ctx;
    vks_metric_series *s = r->s;
    int rc = series_grow(s, &r->n_cap);
    if (rc) return rc;
    s->x[s->n] = (double)step;
    for (int k = 0; k < s->n_keys; k++) s->y[k][s->n] = read_value(json_object_get(o, r->keys[k]));
    s->n++;
    return VKS_OK;
}

int vks_metrics_read(const char *path, const char *const *keys, int n_keys, vks_metric_series **out) {
    if (!path || !out || n_keys < 0 || (n_keys && !keys)) return vks_set_error(VKS_ERR_ARG, "vks_metrics_read: bad argument");
    *out = NULL;
    vks_metric_series *s = calloc(1, sizeof *s);
    if (s) s->y = calloc((size_t)n_keys + 1, sizeof *s->y);
    int rc = s && s->y ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "out of memory");
    series_reader r = {.keys = keys, .s = s};
    if (rc == VKS_OK) {
        s->n_keys = n_keys;
        rc = each_step_line(path, series_line, &r);
    }
    if (rc != VKS_OK) {
        vks_metric_series_free(s);
        return rc;
    }
    *out = s;
    return VKS_OK;
}

typedef struct {
    const char *prefix;
    char (*names)[VKS_METRIC_KEY];
    int cap, *n;
} key_lister;

/* One step line's keys with the prefix, each new one listed (while there is room). */
static int keys_line(void *ctx, json_t *o, int64_t step) {
    (void)step;
    key_lister *l = ctx;
    size_t pl = strlen(l->prefix);
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        if (strncmp(k, l->prefix, pl) || strlen(k) >= VKS_METRIC_KEY) continue;
        int i = 0;
        while (i < *l->n && strcmp(l->names[i], k)) i++;
        if (i == *l->n && *l->n < l->cap) snprintf(l->names[(*l->n)++], VKS_METRIC_KEY, "%s", k);
    }
    return VKS_OK;
}

int vks_metrics_keys(const char *path, const char *prefix, char (*names)[VKS_METRIC_KEY], int cap, int *n) {
    *n = 0;
    if (!path || !prefix || cap < 0 || (cap && !names)) return vks_set_error(VKS_ERR_ARG, "vks_metrics_keys: bad argument");
    key_lister l = {.prefix = prefix, .names = names, .cap = cap, .n = n};
    return each_step_line(path, keys_line, &l);
}

void vks_metric_series_free(vks_metric_series *s) {
    if (!s) return;
    for (int k = 0; s->y && k < s->n_keys; k++) free(s->y[k]);
    free(s->y);
    free(s->x);
    free(s);
}

/* ---- SVG ---- */

typedef struct {
    double lo, hi, step; /* axis range and tick spacing */
} axis;

#define PLOT_LIMIT 1e300 /* larger magnitudes are gaps: every difference of two values stays finite */

static bool plottable(double x, double y) { return fabs(x) <= PLOT_LIMIT && fabs(y) <= PLOT_LIMIT; }

typedef struct {
    FILE *f;
    int w, h;
    double left, right, top, bottom; /* plot area in pixels */
    axis ax, ay;
    bool any;
} svg_ctx;

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

/* 1, 2 or 5 times a power of ten, at least raw. */
static double nice_step(double raw) {
    double p = pow(10.0, floor(log10(raw)));
    double f = raw / p;
    return (f <= 1.0 ? 1.0 : f <= 2.0 ? 2.0 : f <= 5.0 ? 5.0 : 10.0) * p;
}

/* Range [lo, hi] of the finite values widened to whole ticks (about 5). */
static axis make_axis(double lo, double hi, bool any) {
    if (!any) lo = 0.0, hi = 1.0;
    if (hi - lo <= fabs(hi) * 1e-12 || !(hi - lo > 1e-300)) { /* one value: a unit band around it */
        double pad = fabs(lo) > 0 ? fabs(lo) * 0.5 : 1.0;
        lo -= pad;
        hi += pad;
    }
    double step = nice_step((hi - lo) / 5.0);
    axis a = {floor(lo / step) * step, ceil(hi / step) * step, step};
    if (!isfinite(a.lo) || !isfinite(a.hi) || !(a.hi > a.lo)) a = (axis){lo, hi, (hi - lo) / 5.0};
    return a;
}

static void find_ranges(const vks_plot *p, svg_ctx *c) {
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (int s = 0; s < p->n_series; s++)
        for (int64_t i = 0; i < p->series[s].n; i++) {
            double x = p->series[s].x[i], y = p->series[s].y[i];
            if (!plottable(x, y)) continue;
            double e = p->series[s].err && isfinite(p->series[s].err[i]) ? fabs(p->series[s].err[i]) : 0;
            if (!(e <= PLOT_LIMIT)) e = 0;
            x0 = fmin(x0, x), x1 = fmax(x1, x), y0 = fmin(y0, y - e), y1 = fmax(y1, y + e);
            c->any = true;
        }
    c->ax = make_axis(x0, x1, c->any);
    c->ay = make_axis(y0, y1, c->any);
}

static double px(const svg_ctx *c, double x) {
    return c->left + (x - c->ax.lo) / (c->ax.hi - c->ax.lo) * (c->right - c->left);
}

static double py(const svg_ctx *c, double y) {
    return c->bottom - (y - c->ay.lo) / (c->ay.hi - c->ay.lo) * (c->bottom - c->top);
}

/* Text as XML character data: control bytes and invalid UTF-8 as \xHH
 * (vks_escape), then & < > " ' as entities. */
static void put_text(FILE *f, const char *s) {
    char esc[512];
    vks_escape(s, strlen(s), esc, sizeof esc);
    for (const char *q = esc; *q; q++) {
        switch (*q) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default: putc(*q, f);
        }
    }
}

/* A tick label: as many decimals as the step needs, no "-0". */
static void tick_label(char *out, size_t cap, double v, double step) {
    if (fabs(v) < step * 1e-9) v = 0.0;
    double mag = fmax(fabs(v), step);
    if (mag >= 1e6 || mag < 1e-4) {
        snprintf(out, cap, "%.3g", v);
        return;
    }
    int decimals = step >= 1.0 ? 0 : (int)ceil(-log10(step) - 1e-9);
    snprintf(out, cap, "%.*f", decimals, v);
}

static void text_at(FILE *f, double x, double y, const char *anchor, const char *extra, const char *s) {
    fprintf(f, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"%s\"%s>", x, y, anchor, extra);
    put_text(f, s);
    fputs("</text>\n", f);
}

static void draw_axes(const svg_ctx *c, const vks_plot *p) {
    FILE *f = c->f;
    fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"none\" stroke=\"#000\"/>\n", c->left,
            c->top, c->right - c->left, c->bottom - c->top);
    char label[64];
    for (int axis_y = 0; axis_y < 2; axis_y++) {
        const axis *a = axis_y ? &c->ay : &c->ax;
        double ticks = floor((a->hi - a->lo) / a->step + 1e-6);
        int n = ticks >= 0 && ticks <= 100 ? (int)ticks : -1; /* about 5; none when the range is degenerate */
        for (int i = 0; i <= n; i++) {
            double v = a->lo + i * a->step;
            tick_label(label, sizeof label, v, a->step);
            if (axis_y) {
                double y = py(c, v);
                fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#ddd\"/>\n", c->left, y, c->right, y);
                text_at(f, c->left - 6, y + 4, "end", "", label);
            } else {
                double x = px(c, v);
                fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#ddd\"/>\n", x, c->top, x, c->bottom);
                text_at(f, x, c->bottom + 16, "middle", "", label);
            }
        }
    }
    if (p->title) text_at(f, c->w / 2.0, 22, "middle", " font-size=\"16\"", p->title);
    if (p->x_label) text_at(f, (c->left + c->right) / 2, c->h - 8, "middle", "", p->x_label);
    if (p->y_label) {
        char rot[96];
        snprintf(rot, sizeof rot, " transform=\"rotate(-90 16 %.2f)\"", (c->top + c->bottom) / 2);
        text_at(f, 16, (c->top + c->bottom) / 2, "middle", rot, p->y_label);
    }
    if (!c->any) text_at(f, (c->left + c->right) / 2, (c->top + c->bottom) / 2, "middle", "", "no data");
}

static const char *series_color(const vks_plot *p, int s) {
    return p->series[s].color ? p->series[s].color : palette[s % (int)(sizeof palette / sizeof palette[0])];
}

/* Error bars: a vertical line from y - err to y + err at each point. */
static void draw_err(const svg_ctx *c, const vks_plot_series *s, const char *color) {
    for (int64_t i = 0; s->err && i < s->n; i++) {
        double e = fabs(s->err[i]);
        if (!plottable(s->x[i], s->y[i]) || !(e <= PLOT_LIMIT)) continue;
        fprintf(c->f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"%s\"/>\n", px(c, s->x[i]),
                py(c, s->y[i] - e), px(c, s->x[i]), py(c, s->y[i] + e), color);
    }
}

/* One series: a path with a new subpath after every gap; lone points as dots. */
static void draw_series(const svg_ctx *c, const vks_plot_series *s, const char *color) {
    FILE *f = c->f;
    char alpha[48] = "";
    if (s->opacity > 0 && s->opacity < 1) snprintf(alpha, sizeof alpha, " opacity=\"%.3f\"", s->opacity);
    fprintf(f, "<path fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"%s d=\"", color, alpha);
    bool open = false;
    for (int64_t i = 0; i < s->n; i++) {
        bool ok = plottable(s->x[i], s->y[i]);
        if (ok) fprintf(f, "%s%.2f %.2f ", open ? "L" : "M", px(c, s->x[i]), py(c, s->y[i]));
        open = ok;
    }
    fputs("\"/>\n", f);
    for (int64_t i = 0; i < s->n; i++) {
        bool ok = plottable(s->x[i], s->y[i]);
        bool prev = i > 0 && plottable(s->x[i - 1], s->y[i - 1]);
        bool next = i + 1 < s->n && plottable(s->x[i + 1], s->y[i + 1]);
        if (ok && !prev && !next)
            fprintf(f, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"2\" fill=\"%s\"%s/>\n", px(c, s->x[i]), py(c, s->y[i]), color,
                    alpha);
    }
    draw_err(c, s, color);
}

/* The named series, one line each. */
static void draw_legend(const svg_ctx *c, const vks_plot *p) {
    int named = 0;
    for (int s = 0; s < p->n_series; s++) named += p->series[s].name != NULL;
    if (named > 0) /* a backing so that lines under the legend do not cross its text */
        fprintf(c->f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"146\" height=\"%d\" fill=\"#fff\" fill-opacity=\"0.85\"/>\n",
                c->right - 154, c->top + 2, 16 * named + 4);
    for (int s = 0, k = 0; s < p->n_series; s++) {
        if (!p->series[s].name) continue;
        double y = c->top + 14 + 16 * k++, x = c->right - 150;
        fprintf(c->f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"%s\" stroke-width=\"2\"/>\n", x,
                y - 4, x + 20, y - 4, series_color(p, s));
        text_at(c->f, x + 26, y, "start", "", p->series[s].name);
    }
}

/* An SVG root of w x h pixels with a white background; standalone: after
 * the XML declaration (a file), else an element inside an HTML page. */
static void svg_open(FILE *f, int w, int h, bool standalone) {
    /* HTML puts an <svg> element in the SVG namespace itself */
    fputs(standalone ? "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\"" : "<svg", f);
    fprintf(f, " width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"sans-serif\" font-size=\"12\">\n"
               "<rect width=\"%d\" height=\"%d\" fill=\"#fff\"/>\n",
            w, h, w, h, w, h);
}

/* Opens path's temporary file (vks_outfile) and writes an SVG document's start. */
static int svg_begin(vks_outfile *o, const char *path, int w, int h) {
    int rc = vks_outfile_open(o, path, 0666);
    if (rc == VKS_OK) svg_open(o->f, w, h, true);
    return rc;
}

/* Closes the document and renames it into place when every write succeeded. */
static int svg_end(vks_outfile *o) {
    fputs("</svg>\n", o->f);
    return vks_outfile_finish(o, !ferror(o->f));
}

static int check_plot(const vks_plot *p) {
    if (!p || p->n_series < 0 || (p->n_series && !p->series) || p->width < 0 || p->height < 0)
        return vks_set_error(VKS_ERR_ARG, "vks_plot_svg: bad argument");
    for (int s = 0; s < p->n_series; s++)
        if (p->series[s].n < 0 || (p->series[s].n && (!p->series[s].x || !p->series[s].y)))
            return vks_set_error(VKS_ERR_ARG, "vks_plot_svg: series %d has no points", s);
    return VKS_OK;
}

static svg_ctx plot_ctx(const vks_plot *p) {
    svg_ctx c = {.w = p->width ? p->width : 800, .h = p->height ? p->height : 480};
    if (c.w < 200) c.w = 200;
    if (c.h < 150) c.h = 150;
    c.left = 70, c.right = c.w - 20, c.top = 36, c.bottom = c.h - 44;
    find_ranges(p, &c);
    return c;
}

static void plot_body(svg_ctx *c, const vks_plot *p) {
    draw_axes(c, p);
    for (int s = 0; s < p->n_series; s++) draw_series(c, &p->series[s], series_color(p, s));
    draw_legend(c, p);
}

int vks_plot_svg(const char *path, const vks_plot *p) {
    int rc = path ? check_plot(p) : vks_set_error(VKS_ERR_ARG, "vks_plot_svg: bad argument");
    if (rc != VKS_OK) return rc;
    svg_ctx c = plot_ctx(p);
    vks_outfile o;
    if ((rc = svg_begin(&o, path, c.w, c.h)) != VKS_OK) return rc;
    c.f = o.f;
    plot_body(&c, p);
    return svg_end(&o);
}

int vks_plot_svg_to(FILE *f, const vks_plot *p) {
    int rc = f ? check_plot(p) : vks_set_error(VKS_ERR_ARG, "vks_plot_svg: bad argument");
    if (rc != VKS_OK) return rc;
    svg_ctx c = plot_ctx(p);
    c.f = f;
    svg_open(f, c.w, c.h, false);
    plot_body(&c, p);
    fputs("</svg>\n", f);
    return VKS_OK;
}

int vks_metrics_plot(const char *metrics_path, const char *const *keys, int n_keys, const char *title,
                     const char *svg_path) {
    vks_metric_series *s = NULL;
    int rc = vks_metrics_read(metrics_path, keys, n_keys, &s);
    if (rc != VKS_OK) return rc;
    vks_plot_series *ps = calloc((size_t)n_keys + 1, sizeof *ps);
    if (!ps) rc = vks_set_error(VKS_ERR_NOMEM, "out of memory");
    for (int k = 0; k < n_keys && ps; k++) ps[k] = (vks_plot_series){.name = keys[k], .x = s->x, .y = s->y[k], .n = s->n};
    vks_plot p = {.title = title, .x_label = "step", .y_label = n_keys == 1 ? keys[0] : NULL, .series = ps,
                  .n_series = n_keys};
    if (rc == VKS_OK) rc = vks_plot_svg(svg_path, &p);
    free(ps);
    vks_metric_series_free(s);
    return rc;
}

/* ---- SVG timelines ---- */

#define TL_ROW_H 28
#define TL_ROW_GAP 14
#define TL_TOP 56 /* below the title and the marks' labels */

typedef struct {
    FILE *f;
    double left, right, top, rows_bottom; /* pixels */
    double t0, t1;                        /* seconds shown */
} tl_ctx;

static double tl_x(const tl_ctx *c, double t) { return c->left + (t - c->t0) / (c->t1 - c->t0) * (c->right - c->left); }

static int check_timeline(const vks_timeline *t) {
    if (!t || t->n_rows < 0 || (t->n_rows && !t->rows) || t->n_kinds < 0 || (t->n_kinds && !t->kinds) ||
        t->n_marks < 0 || (t->n_marks && !t->marks) || t->width < 0)
        return vks_set_error(VKS_ERR_ARG, "vks_timeline_svg: bad argument");
    for (int k = 0; k < t->n_kinds; k++)
        if (!t->kinds[k].name || t->kinds[k].rgb > 0xffffffu)
            return vks_set_error(VKS_ERR_ARG, "vks_timeline_svg: kind %d has no name or a bad color", k);
    for (int r = 0; r < t->n_rows; r++) {
        const vks_timeline_row *row = &t->rows[r];
        if (!row->name || row->n < 0 || (row->n && !row->bars))
            return vks_set_error(VKS_ERR_ARG, "vks_timeline_svg: row %d has no name or no bars", r);
        for (int i = 0; i < row->n; i++)
            if (row->bars[i].kind < 0 || row->bars[i].kind >= t->n_kinds)
                return vks_set_error(VKS_ERR_ARG, "vks_timeline_svg: row %d, bar %d: kind %d unknown", r, i, row->bars[i].kind);
    }
    return VKS_OK;
}

/* Grid lines and tick labels at 1-2-5 steps (about 8) across [t0, t1]. */
static void tl_axis(const tl_ctx *c) {
    FILE *f = c->f;
    double step = nice_step((c->t1 - c->t0) / 8.0), first = ceil(c->t0 / step) * step, base = c->rows_bottom + 8;
    double ticks = floor((c->t1 - first) / step + 1e-6);
    int n = ticks >= 0 && ticks <= 100 ? (int)ticks : -1;
    char label[64];
    for (int i = 0; i <= n; i++) {
        double v = first + i * step, x = tl_x(c, v);
        fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#ddd\"/>\n", x, c->top, x, base + 4);
        tick_label(label, sizeof label, v, step);
        text_at(f, x, base + 18, "middle", "", label);
    }
    fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#000\"/>\n", c->left, base, c->right, base);
    text_at(f, (c->left + c->right) / 2, base + 36, "middle", "", "seconds");
}

/* One row's label and light band, under the grid. */
static void tl_band(const tl_ctx *c, const vks_timeline_row *row, double y) {
    text_at(c->f, c->left - 8, y + TL_ROW_H / 2.0 + 4, "end", "", row->name);
    fprintf(c->f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%d\" fill=\"#f4f4f4\"/>\n", c->left, y,
            c->right - c->left, TL_ROW_H);
}

/* One row's bars, clipped to [t0, t1], each with a tooltip. */
static void tl_bars(const tl_ctx *c, const vks_timeline *t, const vks_timeline_row *row, double y) {
    FILE *f = c->f;
    for (int i = 0; i < row->n; i++) {
        const vks_timeline_bar *b = &row->bars[i];
        if (!isfinite(b->start) || !isfinite(b->end)) continue;
        double s = fmax(b->start, c->t0), e = fmin(b->end, c->t1);
        if (!(e > s)) continue; /* nothing of it shown */
        double x = tl_x(c, s), w = fmax(tl_x(c, e) - x, 0.5);
        const vks_timeline_kind *k = &t->kinds[b->kind];
        fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%d\" fill=\"#%06x\"><title>", x, y, w, TL_ROW_H,
                (unsigned)k->rgb);
        put_text(f, k->name);
        fprintf(f, " %.3f s</title></rect>\n", b->end - b->start);
    }
}

/* Dashed lines across the rows, labelled above them. */
static void tl_marks(const tl_ctx *c, const vks_timeline *t) {
    char label[160];
    for (int i = 0; i < t->n_marks; i++) {
        double m = t->marks[i].t;
        if (!(m >= c->t0 && m <= c->t1)) continue;
        double x = tl_x(c, m);
        fprintf(c->f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#333\" stroke-dasharray=\"4 3\"/>\n",
                x, c->top - 14, x, c->rows_bottom + 8);
        snprintf(label, sizeof label, "%s%s%lld", t->mark_label ? t->mark_label : "", t->mark_label ? " " : "",
                 (long long)t->marks[i].number);
        text_at(c->f, x + 3, c->top - 6, "start", " font-size=\"11\"", label);
    }
}

/* The kinds some bar uses, side by side under the axis. */
static void tl_legend(const tl_ctx *c, const vks_timeline *t, double y) {
    double x = c->left;
    for (int k = 0; k < t->n_kinds; k++) {
        bool used = false;
        for (int r = 0; r < t->n_rows && !used; r++)
            for (int i = 0; i < t->rows[r].n && !used; i++) used = t->rows[r].bars[i].kind == k;
        if (!used) continue;
        fprintf(c->f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"12\" height=\"12\" fill=\"#%06x\"/>\n", x, y - 10,
                (unsigned)t->kinds[k].rgb);
        text_at(c->f, x + 16, y, "start", "", t->kinds[k].name);
        x += 16 + 7.0 * (double)strlen(t->kinds[k].name) + 18; /* about 7 pixels a character */
    }
}

static tl_ctx timeline_ctx(const vks_timeline *t, int *w, int *h) {
    *w = t->width ? t->width : 900;
    if (*w < 300) *w = 300;
    tl_ctx c = {.left = 90, .right = *w - 20, .top = TL_TOP, .t0 = t->t0, .t1 = t->t1};
    if (!isfinite(c.t0)) c.t0 = 0;
    if (!isfinite(c.t1) || !(c.t1 > c.t0) || !isfinite(c.t1 - c.t0)) c.t1 = c.t0 + 1;
    c.rows_bottom = c.top + t->n_rows * (TL_ROW_H + TL_ROW_GAP) - (t->n_rows ? TL_ROW_GAP : 0);
    *h = (int)c.rows_bottom + 84;
    return c;
}

static void timeline_body(tl_ctx *c, const vks_timeline *t, int w) {
    if (t->title) text_at(c->f, w / 2.0, 22, "middle", " font-size=\"16\"", t->title);
    for (int r = 0; r < t->n_rows; r++) tl_band(c, &t->rows[r], c->top + r * (TL_ROW_H + TL_ROW_GAP));
    tl_axis(c);
    for (int r = 0; r < t->n_rows; r++) tl_bars(c, t, &t->rows[r], c->top + r * (TL_ROW_H + TL_ROW_GAP));
    tl_marks(c, t);
    tl_legend(c, t, c->rows_bottom + 72);
}

int vks_timeline_svg(const char *path, const vks_timeline *t) {
    int rc = path ? check_timeline(t) : vks_set_error(VKS_ERR_ARG, "vks_timeline_svg: bad argument");
    if (rc != VKS_OK) return rc;
    int w, h;
    tl_ctx c = timeline_ctx(t, &w, &h);
    vks_outfile o;
    if ((rc = svg_begin(&o, path, w, h)) != VKS_OK) return rc;
    c.f = o.f;
    timeline_body(&c, t, w);
    return svg_end(&o);
}

int vks_timeline_svg_to(FILE *f, const vks_timeline *t) {
    int rc = f ? check_timeline(t) : vks_set_error(VKS_ERR_ARG, "vks_timeline_svg: bad argument");
    if (rc != VKS_OK) return rc;
    int w, h;
    tl_ctx c = timeline_ctx(t, &w, &h);
    c.f = f;
    svg_open(f, w, h, false);
    timeline_body(&c, t, w);
    fputs("</svg>\n", f);
    return VKS_OK;
}
