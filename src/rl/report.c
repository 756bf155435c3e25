/* report.c: the RL run's report, OUT/report.html (rl_internal.h): one
 * self-contained page (inline CSS, SVG and a few lines of script; nothing
 * loaded from anywhere) rebuilt after every trainer step and at the end of a
 * run. First whether the run helped: held-out accuracy (greedy and sampled)
 * start -> final with the change against twice the standard error of the
 * difference, a fall shown as one (word, class, colour). Then the run
 * (model and hash, tasks, ranks and roles, stops and resumes, every config
 * key with defaults marked), the curves of metrics.jsonl (raw points faint,
 * an exponential moving average over them; held-out accuracy with its
 * standard error), the timeline, every inference and verifier rank (throughput, state, why it was
 * dropped), sample completions per step and the verifier's rejections (the
 * rejected.jsonl files of OUT/rollouts*). Every string from a file, a task or
 * the model is escaped: control bytes and invalid UTF-8 as \xHH, then the
 * HTML metacharacters as entities. */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "rl_internal.h"
#include "vkswarm/vks_metrics.h"
#include "vkswarm/vks_tokenizer.h"

#define REPORT_TEXT_BYTES 2048      /* of a prompt or completion shown (cut: marked) */
#define REPORT_REJECTED_BYTES (1 << 20) /* read of the end of each rejected.jsonl */
#define REPORT_REJECTED_ROWS 20     /* newest rejections shown per file */
#define REPORT_EMA 0.8              /* the smoothed line: s = 0.8 s + 0.2 x, bias-corrected */

/* ---- escaping ---- */

/* Text as HTML character data or attribute value: newlines and tabs kept,
 * other control bytes and invalid UTF-8 as \xHH, & < > " ' as entities. */
static void put_html(FILE *f, const char *s, size_t len) {
    for (size_t i = 0; i < len;) {
        unsigned char ch = (unsigned char)s[i];
        uint32_t cp = 0;
        size_t n = ch == '\n' || ch == '\t' ? 1 : vks_utf8_decode(s + i, len - i, &cp);
        if (ch != '\n' && ch != '\t' && (n == 0 || cp < 0x20 || (cp >= 0x7f && cp < 0xa0))) {
            fprintf(f, "\\x%02x", ch);
            i++;
            continue;
        }
        switch (ch) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&#39;", f); break;
        default: fwrite(s + i, 1, n, f);
        }
        i += n;
    }
}

static void put_str(FILE *f, const char *s) { put_html(f, s ? s : "", s ? strlen(s) : 0); }

/* ---- sample completions ---- */

void vks_rl_report_samples_free(vks_rl_report_samples *s) {
    for (int i = 0; s->ring && i < VKS_RL_REPORT_SAMPLES; i++)
        free(s->ring[i].prompt), free(s->ring[i].completion), free(s->ring[i].answer);
    free(s->ring);
    *s = (vks_rl_report_samples){0};
}

/* ids decoded (control tokens shown), cut to REPORT_TEXT_BYTES; NULL when that fails. */
static char *decode(const struct vks_tokenizer *tok, const int32_t *ids, int n) {
    char *text = NULL;
    size_t len = 0;
    if (n < 0 || vks_tokenizer_detokenize(tok, ids, n, true, &text, &len)) return NULL;
    if (len > REPORT_TEXT_BYTES) memcpy(text + REPORT_TEXT_BYTES - 8, " [...]", 7); /* put_html shows a cut character as \xHH */
    return text;
}

/* task: its expected answer and (user tasks, line > 0) its line; NULL: not known. */
static int keep_sample(vks_rl_report_samples *s, const struct vks_tokenizer *tok, const char *answer, int64_t line,
                       int64_t step, const vks_rl_batch_group *g, const vks_rl_sample *x) {
    if (!s->ring && !(s->ring = calloc(VKS_RL_REPORT_SAMPLES, sizeof *s->ring)))
        return vks_set_error(VKS_ERR_NOMEM, "rl: report: out of host memory");
    vks_rl_report_sample *e = &s->ring[s->next];
    free(e->prompt), free(e->completion), free(e->answer);
    *e = (vks_rl_report_sample){.step = step, .task_index = g->task_index, .policy_step = g->policy_step,
                                .line = line,
                                .task_reward = x->task_reward, .reward = x->reward, .advantage = x->advantage,
                                .status = !x->accepted ? VKS_RL_SAMPLE_REJECTED
                                          : x->logp_far ? VKS_RL_SAMPLE_LOGP_FAR : VKS_RL_SAMPLE_TRAINED};
    e->prompt = decode(tok, x->tokens, x->prompt_len);
    e->completion = decode(tok, x->tokens + x->prompt_len, x->completion_len);
    e->answer = answer ? strdup(answer) : NULL;
    s->next = (s->next + 1) % VKS_RL_REPORT_SAMPLES;
    if (s->len < VKS_RL_REPORT_SAMPLES) s->len++;
    return VKS_OK;
}

int vks_rl_report_capture(vks_rl_report_samples *s, const struct vks_tokenizer *tok, const vks_rl_gen *gen,
                          int64_t step, const vks_rl_batch_group *groups, int n_groups) {
    int rc = VKS_OK;
    for (int gi = 0, kept = 0; !rc && gi < n_groups && kept < 2; gi++) {
        const vks_rl_batch_group *g = &groups[gi];
        if (g->n < 1) continue;
        vks_task t;
        bool known = gen && vks_rl_gen_task(gen, g->task_index, &t) == VKS_OK;
        const char *answer = known ? t.answer : NULL;
        int64_t line = known && gen->tasks ? t.line : 0;
        int best = 0, worst = 0;
        for (int i = 1; i < g->n; i++) {
            if (g->samples[i].reward > g->samples[best].reward) best = i;
            if (g->samples[i].reward < g->samples[worst].reward) worst = i;
        }
        rc = keep_sample(s, tok, answer, line, step, g, &g->samples[best]);
        if (!rc && worst != best) rc = keep_sample(s, tok, answer, line, step, g, &g->samples[worst]);
        kept++;
    }
    return rc;
}

/* ---- curves ---- */

typedef struct {
    const char *key, *title;
} curve;

static const curve curves[] = {
    {"reward", "reward (mean task reward of the step's rollouts)"},
    {"accuracy", "held-out accuracy (greedy), +/- one standard error"},
    {"loss", "loss"},
    {"length", "completion length (tokens)"},
    {"entropy", "entropy (nats)"},
    {"clip_fraction", "clip fraction (tokens clipped, masked or truncated by the loss)"},
    {"logp_mismatch", "logp mismatch (sampler vs trainer)"},
    {"mismatch_kl", "mismatch KL (sampler vs trainer, exp(x) - x - 1)"},
    {"trainer_idle", "trainer idle (fraction of the step)"},
    {"rollouts_per_s", "rollouts/s"},
    {"accept_rate", "verifier accept rate"},
};
#define N_CURVES ((int)(sizeof curves / sizeof curves[0]))

/* metrics.jsonl's keys the report reads: the curves', then these. */
enum { K_N = N_CURVES, K_SE, K_SAMPLED, K_SAMPLED_SE, K_SAMPLED_N, N_KEYS };
static const char *const extra_keys[] = {"accuracy_n", "accuracy_se", "accuracy_sampled", "accuracy_sampled_se",
                                         "accuracy_sampled_n"};

/* An accuracy's standard error at row i: as logged, else from its n (older metrics files). */
static double row_se(const vks_metric_series *s, int value, int se, int n, int64_t i) {
    double e = s->y[se][i];
    return isfinite(e) ? e : vks_binomial_se(s->y[value][i], s->y[n][i]);
}

/* One curve: the finite points faint, the bias-corrected EMA over them; the
 * accuracy (greedy, and sampled when measured) as points with error bars of
 * one standard error instead. */
static int put_curve(FILE *f, const curve *cv, const vks_metric_series *s, int k) {
    int64_t n = s->n;
    size_t sz = sizeof(double) * (size_t)(n + 1);
    double *x = malloc(sz), *raw = malloc(sz), *ema = malloc(sz), *err = malloc(sz);
    double *xs = malloc(sz), *ys = malloc(sz), *es = malloc(sz);
    int rc = VKS_OK;
    if (!x || !raw || !ema || !err || !xs || !ys || !es) rc = vks_set_error(VKS_ERR_NOMEM, "rl: report: out of host memory");
    int64_t m = 0, ms = 0;
    double sm = 0, w = 0;
    bool accuracy = !strcmp(cv->key, "accuracy"); /* with the sampled accuracy's keys in s */
    for (int64_t i = 0; !rc && i < n; i++) {
        double y = s->y[k][i], ysam = accuracy ? s->y[K_SAMPLED][i] : NAN;
        if (isfinite(ysam) && isfinite(s->x[i])) {
            xs[ms] = s->x[i], ys[ms] = ysam;
            es[ms] = row_se(s, K_SAMPLED, K_SAMPLED_SE, K_SAMPLED_N, i);
            if (!isfinite(es[ms])) es[ms] = vks_binomial_se(ysam, s->y[K_N][i]);
            if (!isfinite(es[ms])) es[ms] = 0;
            ms++;
        }
        if (!isfinite(y) || !isfinite(s->x[i])) continue;
        x[m] = s->x[i], raw[m] = y;
        sm = REPORT_EMA * sm + (1 - REPORT_EMA) * y, w = REPORT_EMA * w + (1 - REPORT_EMA);
        ema[m] = sm / w;
        err[m] = accuracy ? row_se(s, 1, K_SE, K_N, i) : 0;
        if (!isfinite(err[m])) err[m] = 0;
        m++;
    }
    vks_plot_series ps[2];
    int n_ps = 0;
    if (accuracy) {
        ps[n_ps++] = (vks_plot_series){.name = "greedy", .x = x, .y = raw, .n = m, .err = err, .color = "#9467bd"};
        if (ms) ps[n_ps++] = (vks_plot_series){.name = "sampled", .x = xs, .y = ys, .n = ms, .err = es, .color = "#ff7f0e"};
    } else {
        ps[n_ps++] = (vks_plot_series){.x = x, .y = raw, .n = m, .color = "#1f77b4", .opacity = 0.3};
        ps[n_ps++] = (vks_plot_series){.name = "EMA 0.8", .x = x, .y = ema, .n = m, .color = "#1f77b4"};
    }
    vks_plot p = {.title = cv->title, .x_label = "step", .series = ps, .n_series = n_ps, .width = 440, .height = 260};
    if (!rc) {
        fprintf(f, "<figure class=\"curve\" data-key=\"%s\">\n", cv->key);
        rc = vks_plot_svg_to(f, &p);
        fputs("</figure>\n", f);
    }
    free(x), free(raw), free(ema), free(err), free(xs), free(ys), free(es);
    return rc;
}

/* The reward programs' metrics (program.NAME, vks_task_metrics), one curve each. */
static int put_program_curves(FILE *f, const char *metrics_path) {
    char names[VKS_TASK_MAX_METRICS][VKS_METRIC_KEY];
    int n = 0;
    int rc = vks_metrics_keys(metrics_path, "program.", names, VKS_TASK_MAX_METRICS, &n);
    if (rc || !n) return rc;
    const char *keys[VKS_TASK_MAX_METRICS];
    int kept = 0;
    for (int k = 0; k < n; k++) /* the file may be anyone's: only names the runs write go into the page */
        if (strspn(names[k], "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") == strlen(names[k]))
            keys[kept++] = names[k];
    if (!(n = kept)) return VKS_OK;
    vks_metric_series *s = NULL;
    if ((rc = vks_metrics_read(metrics_path, keys, n, &s))) return rc;
    for (int k = 0; !rc && k < n; k++) {
        char title[160];
        snprintf(title, sizeof title, "%s (reward programs' metric, step mean)", keys[k] + strlen("program."));
        curve cv = {.key = keys[k], .title = title};
        rc = put_curve(f, &cv, s, k);
    }
    vks_metric_series_free(s);
    return rc;
}

static int put_curves(FILE *f, const vks_metric_series *s, const char *metrics_path) {
    fputs("<section id=\"curves\"><h2>Curves</h2>\n<p class=\"note\">Faint: the value at each step; line: its "
          "exponential moving average (0.8). Source: metrics.jsonl.</p>\n",
          f);
    int rc = VKS_OK;
    for (int k = 0; !rc && k < N_CURVES; k++) rc = put_curve(f, &curves[k], s, k);
    if (!rc) rc = put_program_curves(f, metrics_path);
    fputs("</section>\n", f);
    return rc;
}

/* ---- did it help: held-out accuracy, start -> final ---- */

vks_rl_accuracy_change vks_rl_accuracy_compare(double a0, double se0, double a1, double se1) {
    vks_rl_accuracy_change c = {.change = a1 - a0, .noise2 = 2 * sqrt(se0 * se0 + se1 * se1)};
    if (!isfinite(c.change) || !isfinite(c.noise2)) return (vks_rl_accuracy_change){NAN, NAN, 0};
    c.verdict = c.change > c.noise2 ? 1 : c.change < -c.noise2 ? -1 : 0;
    return c;
}

/* One line: the first and the last evaluation of `value` (with its standard
 * error and n), the change, 2 SE of the difference, and the words. */
static void put_accuracy_line(FILE *f, const vks_metric_series *s, const char *what, int value, int se, int nk, bool final) {
    int64_t first = -1, last = -1;
    for (int64_t i = 0; i < s->n; i++)
        if (isfinite(s->y[value][i])) last = i, first = first < 0 ? i : first;
    fprintf(f, "<p class=\"headline");
    if (first < 0) {
        fprintf(f, " unmeasured\" id=\"accuracy-%s\">Held-out accuracy (%s): not measured (eval_n 0, or a task file "
                "without a held-out set: eval_split or eval_tasks).</p>\n", what, what);
        return;
    }
    double a0 = s->y[value][first], a1 = s->y[value][last];
    double e0 = row_se(s, value, se, nk, first), e1 = row_se(s, value, se, nk, last);
    double n0 = isfinite(s->y[nk][first]) ? s->y[nk][first] : s->y[K_N][first];
    double n1 = isfinite(s->y[nk][last]) ? s->y[nk][last] : s->y[K_N][last];
    if (last == first) {
        fprintf(f, " unmeasured\" id=\"accuracy-%s\">Held-out accuracy (%s): %.3f &plusmn; %.3f (SE, n = %.0f) at step "
                "%.0f; not measured since.</p>\n", what, what, a0, e0, n0, s->x[first]);
        return;
    }
    vks_rl_accuracy_change c = vks_rl_accuracy_compare(a0, e0, a1, e1);
    const char *dir = c.change > 0 ? "rising" : c.change < 0 ? "falling" : "unchanged";
    const char *word = c.change > 0 ? "rose" : c.change < 0 ? "fell" : "did not change";
    bool beyond = c.verdict != 0;
    fprintf(f, " %s %s\" id=\"accuracy-%s\">Held-out accuracy (%s): %.3f &rarr; %.3f (change %+.3f, &plusmn;%.3f = 2 SE "
            "of the difference): <strong>%s</strong>, %s.<br><span class=\"note\">start: step %.0f, %.3f &plusmn; "
            "%.3f (SE, n = %.0f); %s: step %.0f, %.3f &plusmn; %.3f (SE, n = %.0f).</span></p>\n",
            dir, beyond ? "beyond-noise" : "within-noise", what, what, a0, a1, c.change, c.noise2, word,
            beyond ? "by more than the noise" : "within the noise (not a measured change)", s->x[first], a0, e0, n0,
            final ? "final" : "latest", s->x[last], a1, e1, n1);
}

static void put_headline(FILE *f, const vks_metric_series *s, bool final) {
    fputs("<section id=\"headline\">\n", f);
    put_accuracy_line(f, s, "greedy", 1, K_SE, K_N, final);
    bool sampled = false;
    for (int64_t i = 0; i < s->n && !sampled; i++) sampled = isfinite(s->y[K_SAMPLED][i]);
    if (sampled) put_accuracy_line(f, s, "sampled", K_SAMPLED, K_SAMPLED_SE, K_SAMPLED_N, final);
    fputs("</section>\n", f);
}

/* ---- the run: model, tasks, ranks and roles, stops, config ---- */

static void put_config_key(void *ctx, const char *key, const char *value, bool is_default) {
    FILE *f = ctx;
    fprintf(f, "<tr class=\"%s\"><td>", is_default ? "default" : "set");
    put_str(f, key);
    fputs("</td><td class=\"text\">", f);
    put_str(f, value);
    fprintf(f, "</td><td>%s</td></tr>\n", is_default ? "default" : "set");
}

static void put_roles(FILE *f, const vks_rl_config *c) {
    fputs("<table id=\"roles\"><thead><tr><th>rank</th><th>roles</th></tr></thead><tbody>\n", f);
    static const struct {
        int bit;
        const char *name;
    } names[] = {{VKS_RL_ROLE_ORCHESTRATOR, "orchestrator"}, {VKS_RL_ROLE_TRAINER, "trainer"},
                 {VKS_RL_ROLE_INFERENCE, "inference"}, {VKS_RL_ROLE_VERIFIER, "verifier"}, {VKS_RL_ROLE_RELAY, "relay"}};
    int n = vks_rl_config_ranks_named(c);
    for (int r = 0; r < n && r < VKS_RL_MAX_RANK_STATUS; r++) {
        int roles = vks_rl_config_roles_of(c, r);
        fprintf(f, "<tr><td>%d</td><td>", r);
        for (int i = 0, any = 0; i < 5; i++)
            if (roles & names[i].bit) fprintf(f, "%s%s", any++ ? ", " : "", names[i].name);
        fputs(c->roles_given ? "" : " (one process: inference on a thread of its own)", f);
        fputs("</td></tr>\n", f);
    }
    fputs("</tbody></table>\n", f);
}

static void utc(double unix_s, char *out, size_t cap) {
    time_t t = (time_t)unix_s;
    struct tm tm;
    out[0] = 0;
    if (isfinite(unix_s) && gmtime_r(&t, &tm)) strftime(out, cap, "%Y-%m-%d %H:%M:%S UTC", &tm);
}

static void put_resumes(FILE *f, const vks_rl_report *rep) {
    if (!rep->n_resumes) return;
    fputs("<h3>Stops and resumes</h3>\n<table id=\"resumes\"><thead><tr><th>stopped after step</th><th>checkpoint saved"
          "</th><th>elapsed then</th><th>resumed</th></tr></thead><tbody>\n",
          f);
    for (int i = 0; i < rep->n_resumes; i++) {
        const vks_rl_resume *x = &rep->resumes[i];
        char a[64], b[64];
        utc(x->stopped_unix, a, sizeof a), utc(x->resumed_unix, b, sizeof b);
        fprintf(f, "<tr class=\"resume\"><td>%lld</td><td>%s</td><td>%.0f s</td><td>%s</td></tr>\n", (long long)x->step, a,
                x->elapsed_s, b);
    }
    fputs("</tbody></table>\n<p class=\"note\">Elapsed time goes on across a stop: the time between a stop and its "
          "resume is not counted.</p>\n",
          f);
}

static void put_run(FILE *f, const vks_rl_report *rep) {
    fputs("<section id=\"run\"><h2>The run</h2>\n<dl class=\"summary\"><dt>model</dt><dd id=\"model\">", f);
    put_str(f, rep->model && rep->model[0] ? rep->model : "--init tiny (made from the seed)");
    fputs("</dd><dt>model hash</dt><dd id=\"model-hash\">", f);
    put_str(f, rep->model_hash && rep->model_hash[0] ? rep->model_hash : "(not known)");
    fputs("</dd><dt>tasks</dt><dd id=\"task-set\">", f);
    put_str(f, rep->task_set ? rep->task_set : rep->task);
    fputs("</dd></dl>\n", f);
    if (rep->config) {
        fputs("<h3>Ranks and roles</h3>\n", f);
        put_roles(f, rep->config);
    }
    put_resumes(f, rep);
    if (rep->config) fputs("<p class=\"note\">Its config: <a href=\"#config-section\">at the end</a>.</p>\n", f);
    fputs("</section>\n", f);
}

static int put_config(FILE *f, const vks_rl_report *rep) {
    if (!rep->config) return VKS_OK;
    fputs("<section id=\"config-section\"><h2>Config</h2>\n<p class=\"note\">Every key; those at their default value "
          "are marked <em>default</em> (greyed).</p>\n<table id=\"config\"><thead><tr><th>key</th><th>value</th><th></th>"
          "</tr></thead><tbody>\n",
          f);
    int rc = vks_rl_config_each(rep->config, put_config_key, f);
    fputs("</tbody></table></section>\n", f);
    return rc;
}

/* ---- ranks ---- */

static const char *state_name(int state) {
    return state == VKS_RL_RANK_DROPPED ? "dropped" : state == VKS_RL_RANK_REFUSED ? "refused" : "live";
}

static void put_ranks(FILE *f, const vks_rl_report *rep) {
    fputs("<section id=\"ranks\"><h2>Ranks</h2>\n<table><thead><tr><th>rank</th><th>role</th><th>state</th>"
          "<th>batches</th><th>rollouts</th><th>rollouts/s</th><th>rejected</th><th>why</th></tr></thead><tbody>\n",
          f);
    if (!rep->n_ranks) fputs("<tr><td colspan=\"8\">not counted on this rank (the orchestrator's rank counts them)</td></tr>\n", f);
    for (int i = 0; i < rep->n_ranks; i++) {
        const vks_rl_rank_status *r = &rep->ranks[i];
        fputs("<tr class=\"", f);
        fputs(state_name(r->state), f);
        fputs("\"><td>", f);
        if (r->rank >= 0) fprintf(f, "%d", r->rank);
        else fputs("this process", f);
        fprintf(f, "</td><td>%s%s%s</td><td>%s%s</td><td>%lld</td><td>%lld</td><td>%.2f</td><td>%lld</td><td>",
                r->verifier ? "verifier" : r->rank >= 0 ? "inference" : "inference thread",
                r->joined ? ", joined, key " : "", r->joined ? r->identity : "", state_name(r->state),
                r->banned ? ", banned" : "",
                (long long)r->batches, (long long)r->rollouts,
                rep->elapsed_s > 0 ? (double)r->rollouts / rep->elapsed_s : 0.0, (long long)r->rejected);
        put_html(f, r->why, strnlen(r->why, sizeof r->why));
        fputs("</td></tr>\n", f);
    }
    fputs("</tbody></table></section>\n", f);
}

/* ---- samples ---- */

static const char *sample_status(int status) {
    return status == VKS_RL_SAMPLE_REJECTED ? "rejected by the verifier"
           : status == VKS_RL_SAMPLE_LOGP_FAR ? "accepted; not trained (its log-probabilities are far from its sampling weights')"
                                              : "accepted, trained";
}

static void put_samples(FILE *f, const vks_rl_report_samples *s) {
    fputs("<section id=\"samples-section\"><h2>Sample completions</h2>\n<p class=\"note\">Per step the highest and lowest "
          "reward completion of its first two groups (the newest steps; text escaped, control bytes as \\xHH). "
          "<label>Filter: <input id=\"sample-filter\" type=\"search\"></label></p>\n"
          "<table id=\"samples\"><thead><tr><th>step</th><th>task</th><th>policy</th><th>prompt</th><th>completion</th>"
          "<th>expected</th><th>reward</th><th>advantage</th><th>status</th></tr></thead><tbody>\n",
          f);
    for (int k = 0; s->ring && k < s->len; k++) { /* newest first */
        const vks_rl_report_sample *e = &s->ring[(s->next - 1 - k + 2 * VKS_RL_REPORT_SAMPLES) % VKS_RL_REPORT_SAMPLES];
        fprintf(f, "<tr><td>%lld</td><td>%lld", (long long)e->step, (long long)e->task_index);
        if (e->line > 0) fprintf(f, " (line %lld)", (long long)e->line);
        fprintf(f, "</td><td>%lld</td><td class=\"text\">", (long long)e->policy_step);
        put_str(f, e->prompt ? e->prompt : "(not decodable)");
        fputs("</td><td class=\"text\">", f);
        put_str(f, e->completion ? e->completion : "(not decodable)");
        fputs("</td><td class=\"text expected\">", f);
        put_str(f, e->answer ? e->answer : "(not known)");
        fprintf(f, "</td><td>%.3f (task %.3f)</td><td>%.3f</td><td>%s</td></tr>\n", e->reward, e->task_reward,
                e->advantage, sample_status(e->status));
    }
    fputs("</tbody></table></section>\n", f);
}

/* ---- rejections ---- */

/* The last REPORT_REJECTED_ROWS lines of dir/rejected.jsonl (at most its last
 * REPORT_REJECTED_BYTES), newest first; nothing when it is missing. */
static void put_rejected_file(FILE *f, const char *out_dir, const char *sub, int *rows) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s/%s", out_dir, sub, VKS_RL_REJECTED_FILE);
    FILE *in = fopen(path, "rb");
    if (!in) return;
    char *buf = malloc(REPORT_REJECTED_BYTES + 1);
    long size = fseek(in, 0, SEEK_END) == 0 ? ftell(in) : -1;
    long from = size > REPORT_REJECTED_BYTES ? size - REPORT_REJECTED_BYTES : 0;
    size_t n = buf && size >= 0 && fseek(in, from, SEEK_SET) == 0 ? fread(buf, 1, REPORT_REJECTED_BYTES, in) : 0;
    fclose(in);
    if (!buf) return;
    buf[n] = 0;
    char *lines[REPORT_REJECTED_ROWS];
    int got = 0;
    size_t end = n;
    while (end > 0 && got < REPORT_REJECTED_ROWS) { /* from the end, whole lines only */
        if (buf[end - 1] == '\n') buf[--end] = 0;
        size_t start = end;
        while (start > 0 && buf[start - 1] != '\n') start--;
        if (start == 0 && from > 0) break; /* a cut line */
        if (end > start) lines[got++] = buf + start;
        end = start;
    }
    for (int i = 0; i < got; i++) {
        json_t *o = json_loads(lines[i], JSON_REJECT_DUPLICATES, NULL);
        json_t *b = json_object_get(o, "batch"), *q = json_object_get(o, "sample"), *t = json_object_get(o, "task_index");
        json_t *p = json_object_get(o, "policy_step");
        const char *reason = json_string_value(json_object_get(o, "reason"));
        if (json_is_object(o)) {
            fputs("<tr><td>", f);
            put_str(f, sub);
            fprintf(f, "</td><td>%lld</td><td>%lld</td><td>%lld</td><td>%lld</td><td class=\"text\">",
                    (long long)json_integer_value(b), (long long)json_integer_value(q), (long long)json_integer_value(t),
                    (long long)json_integer_value(p));
            put_str(f, reason ? reason : "(none)");
            fputs("</td></tr>\n", f);
            ++*rows;
        }
        json_decref(o);
    }
    free(buf);
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void put_rejected(FILE *f, const char *out_dir) {
    fputs("<section id=\"rejections\"><h2>Rejected by the verifier</h2>\n<table><thead><tr><th>from</th><th>batch</th>"
          "<th>sample</th><th>task</th><th>policy</th><th>the verifier's reason</th></tr></thead><tbody>\n",
          f);
    int rows = 0;
    DIR *d = opendir(out_dir);
    char *names[256];
    int n = 0;
    for (struct dirent *e; d && n < 256 && (e = readdir(d));)
        if (!strcmp(e->d_name, "rollouts") || !strncmp(e->d_name, "rollouts-rank", 13)) names[n] = strdup(e->d_name), n += names[n] != NULL;
    if (d) closedir(d);
    qsort(names, (size_t)n, sizeof *names, by_name);
    for (int i = 0; i < n; i++) put_rejected_file(f, out_dir, names[i], &rows), free(names[i]);
    fputs("</tbody></table>\n", f);
    if (!rows) fputs("<p class=\"note\">None.</p>\n", f);
    fputs("</section>\n", f);
}

/* ---- the page ---- */

static const char page_head[] =
    "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>vkswarm RL run</title>\n"
    "<script>window.addEventListener('error', function (e) { var el = document.getElementById('js-errors');"
    " if (el) { el.textContent += String(e.message) + '\\n'; el.hidden = false; } });</script>\n"
    "<style>\nbody{font-family:sans-serif;margin:1em 2em;color:#222}\n"
    "h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.5em;border-bottom:1px solid #ccc}\n"
    ".note{color:#555;font-size:.9em}\nfigure.curve{display:inline-block;margin:4px}\n"
    "table{border-collapse:collapse;font-size:.85em}td,th{border:1px solid #ccc;padding:2px 6px;vertical-align:top}\n"
    "th{background:#f0f0f0}td.text{white-space:pre-wrap;font-family:monospace;max-width:40em;"
    "max-height:12em;overflow:auto}\n"
    "tr.dropped td,tr.refused td{background:#fde8e8}\n#js-errors{color:#b00;white-space:pre-wrap}\n"
    "dl.summary{display:grid;grid-template-columns:max-content auto;gap:2px 12px}dl.summary dd{margin:0}\n"
    "p.headline{font-size:1.1em;padding:4px 8px;border-left:6px solid #999;margin:4px 0}\n"
    "p.headline.rising.beyond-noise{border-color:#2ca02c;background:#eaf6ea}\n"
    "p.headline.falling{border-color:#d62728;color:#8b0000}p.headline.falling.beyond-noise{background:#fde8e8}\n"
    "tr.default td{color:#888}tr.resume td{background:#fff6df}\n"
    "</style></head>\n";

static void put_summary(FILE *f, const vks_rl_report *rep, const vks_metric_series *s) {
    char when[64] = "";
    utc((double)time(NULL), when, sizeof when);
    fputs("<body>\n<pre id=\"js-errors\" hidden></pre>\n<h1>vkswarm RL run: ", f);
    put_str(f, rep->task);
    fputs("</h1>\n", f);
    put_headline(f, s, rep->final);
    fputs("<dl class=\"summary\"><dt>task</dt><dd>", f);
    put_str(f, rep->task);
    fprintf(f, "</dd><dt>step</dt><dd id=\"step\">%lld of %lld%s</dd><dt>elapsed</dt><dd id=\"elapsed\">%.0f s%s</dd>",
            (long long)rep->step, (long long)rep->steps,
            rep->final ? " (the run ended)" : " (in progress: rebuilt at each step)", rep->elapsed_s,
            rep->n_resumes ? " (across its stops)" : "");
    if (rep->n_resumes) {
        const vks_rl_resume *x = &rep->resumes[rep->n_resumes - 1];
        char b[64];
        utc(x->resumed_unix, b, sizeof b);
        fprintf(f, "<dt>resumed</dt><dd id=\"resumed\">resumed run: stopped %d time%s; last resumed from step %lld at %s"
                "</dd>", rep->n_resumes, rep->n_resumes > 1 ? "s" : "", (long long)x->step, b);
    }
    fprintf(f, "<dt>rollouts</dt><dd>%lld generated, %lld checked by a verifier: %lld accepted, %lld rejected</dd>",
            (long long)rep->totals.rollouts, (long long)rep->totals.checked, (long long)rep->totals.accepted,
            (long long)rep->totals.rejected);
    fprintf(f, "<dt>groups left out</dt><dd>%lld without signal, %lld stale, %lld off-policy (max_off_policy_steps)</dd>"
            "<dt>written</dt><dd>%s</dd></dl>\n", (long long)rep->totals.filtered, (long long)rep->totals.stale,
            (long long)rep->totals.off_policy, when);
}

static const char page_tail[] =
    "<script>\n(function () {\n"
    "  var input = document.getElementById('sample-filter');\n"
    "  var rows = document.querySelectorAll('#samples tbody tr');\n"
    "  input.addEventListener('input', function () {\n"
    "    var q = input.value.toLowerCase();\n"
    "    for (var i = 0; i < rows.length; i++) rows[i].hidden = q !== '' && rows[i].textContent.toLowerCase().indexOf(q) < 0;\n"
    "  });\n"
    "  document.getElementById('curve-count').textContent = String(document.querySelectorAll('#curves svg').length);\n"
    "  document.getElementById('sample-count').textContent = String(rows.length);\n"
    "  document.body.setAttribute('data-ready', '1');\n"
    "})();\n</script>\n</body></html>\n";

static int write_page(FILE *f, const char *out_dir, const vks_rl_report *rep) {
    const char *keys[N_KEYS];
    for (int k = 0; k < N_CURVES; k++) keys[k] = curves[k].key;
    for (int k = N_CURVES; k < N_KEYS; k++) keys[k] = extra_keys[k - N_CURVES];
    vks_metric_series *s = NULL;
    int rc = vks_metrics_read(rep->metrics_path, keys, N_KEYS, &s);
    if (rc) return rc;
    fputs(page_head, f);
    put_summary(f, rep, s);
    fputs("<p class=\"note\"><span id=\"curve-count\"></span> curves, <span id=\"sample-count\"></span> sample "
          "completions shown.</p>\n",
          f);
    put_run(f, rep);
    rc = put_curves(f, s, rep->metrics_path);
    vks_metric_series_free(s);
    if (!rc && rep->trainer) {
        fputs("<section id=\"timeline\"><h2>Timeline</h2>\n", f);
        if (rep->across_ranks) fputs("<p class=\"note\">The trainer's row (inference runs on other ranks).</p>\n", f);
        else if (!rep->inference)
            fputs("<p class=\"note\">The trainer's row (the inference thread's is added at the end of the run).</p>\n", f);
        rc = vks_rl_timeline_write_to(f, rep->trainer, rep->inference, rep->last_n);
        fputs("</section>\n", f);
    }
    if (rc) return rc;
    put_ranks(f, rep);
    put_samples(f, rep->samples);
    put_rejected(f, out_dir);
    rc = put_config(f, rep);
    fputs(page_tail, f);
    return rc;
}

int vks_rl_report_write(const char *out_dir, const vks_rl_report *rep) {
    if (!out_dir || !rep || !rep->metrics_path || !rep->samples || rep->n_ranks < 0 || (rep->n_ranks && !rep->ranks))
        return vks_set_error(VKS_ERR_ARG, "vks_rl_report_write: bad argument");
    char path[4200];
    snprintf(path, sizeof path, "%s/report.html", out_dir);
    vks_outfile o;
    int rc = vks_outfile_open(&o, path, 0666);
    if (rc) return vks_error_prefix(rc, "rl: report");
    rc = write_page(o.f, out_dir, rep);
    if (rc) {
        vks_outfile_abort(&o);
        return vks_error_prefix(rc, "rl: report %s", path);
    }
    return vks_outfile_finish(&o, !ferror(o.f));
}
