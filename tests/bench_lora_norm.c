/* bench_lora_norm MODEL DATA.jsonl STEPS LR [norm]: LoRA (rank 8, alpha 16,
 * every target, PEFT init from seed 1) on a byte-vocabulary model (the tiny
 * model: ids = bytes, BOS 256, EOS 257) over {"prompt", "completion"} lines,
 * as train sft trains it (8 samples a step drawn with a fixed LCG, loss the
 * mean over completion tokens and EOS, AdamW betas 0.9/0.95, weight decay
 * 0.1, clip 1, constant lr); with "norm" the final norm is trained beside the
 * adapter (vks_trainer_options.lora_save_norm, PEFT modules_to_save ["norm"]),
 * which train sft cannot do yet. Prints the loss every 10 steps (issue 40).
 * bench_lora_norm MODEL floor: the lowest loss any model with MODEL's final
 * norm and tied classifier E frozen can give each target of the reverse
 * task (logits = E diag(g) u, |u| = sqrt(dim); relaxed to |u| <= sqrt(dim),
 * a convex problem: projected gradient descent finds its minimum). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vkswarm/vks_gpu.h"
#include "vkswarm/vks_lora.h"
#include "vkswarm/vks_model.h"
#include "vkswarm/vks_train.h"

enum { MAX_SAMPLES = 4096, MAX_LEN = 64, BATCH = 8 };

typedef struct {
    int32_t tok[MAX_LEN];
    int len, prompt; /* tokens; BOS + prompt bytes */
} sample;

/* The string value of "key" in a JSON line without escapes (this bench's data). */
static int field(const char *line, const char *key, char *out, int cap) {
    char pat[32];
    snprintf(pat, sizeof pat, "\"%s\": \"", key);
    const char *p = strstr(line, pat), *e;
    if (!p || !(e = strchr(p += strlen(pat), '"')) || e - p >= cap) return -1;
    memcpy(out, p, (size_t)(e - p));
    out[e - p] = 0;
    return (int)(e - p);
}

static int load(const char *path, sample *s) {
    FILE *f = fopen(path, "r");
    char line[512], a[128], b[128];
    int n = 0;
    while (f && n < MAX_SAMPLES && fgets(line, sizeof line, f)) {
        int na = field(line, "prompt", a, sizeof a), nb = field(line, "completion", b, sizeof b);
        if (na < 0 || nb < 0 || na + nb + 2 > MAX_LEN) continue;
        sample *x = &s[n++];
        x->len = 0;
        x->tok[x->len++] = 256;
        for (int i = 0; i < na; i++) x->tok[x->len++] = (unsigned char)a[i];
        x->prompt = x->len;
        for (int i = 0; i < nb; i++) x->tok[x->len++] = (unsigned char)b[i];
        x->tok[x->len++] = 257;
    }
    if (f) fclose(f);
    return n;
}

static int V, D;
static double *E; /* [V, D]: the classifier's rows times the final norm */

/* The mean over targets ts[0..nt) of cross-entropy(E u, t); its gradient into gu. */
static double ce(const double *u, const int *ts, int nt, double *gu, double *z) {
    double mx = -INFINITY, sum = 0, loss = 0;
    for (int v = 0; v < V; v++) {
        z[v] = 0;
        for (int d = 0; d < D; d++) z[v] += E[(size_t)v * D + d] * u[d];
        if (z[v] > mx) mx = z[v];
    }
    for (int v = 0; v < V; v++) sum += exp(z[v] - mx);
    double lse = mx + log(sum);
    memset(gu, 0, (size_t)D * sizeof *gu);
    for (int v = 0; v < V; v++)
        for (int d = 0; d < D; d++) gu[d] += exp(z[v] - lse) * E[(size_t)v * D + d];
    for (int i = 0; i < nt; i++) {
        loss += (lse - z[ts[i]]) / nt;
        for (int d = 0; d < D; d++) gu[d] -= E[(size_t)ts[i] * D + d] / nt;
    }
    return loss;
}

static double best(const int *ts, int nt) {
    double *u = calloc((size_t)D, sizeof *u), *g = malloc((size_t)D * sizeof *g), *z = malloc((size_t)V * sizeof *z);
    double r = sqrt((double)D), loss = 0;
    for (int it = 0; it < 5000; it++) {
        loss = ce(u, ts, nt, g, z);
        double n = 0;
        for (int d = 0; d < D; d++) u[d] -= 2.0 * g[d], n += u[d] * u[d];
        for (int d = 0; n > r * r && d < D; d++) u[d] *= r / sqrt(n);
    }
    free(u), free(g), free(z);
    return loss;
}

static int floors(const vks_model *m) {
    V = m->cfg.vocab_size, D = m->cfg.dim;
    E = malloc((size_t)V * D * sizeof *E);
    float *row = malloc((size_t)D * sizeof *row), *g = malloc((size_t)D * sizeof *g);
    vks_tensor_row_f32(&m->final_norm, 0, g);
    for (int v = 0; v < V; v++) {
        vks_tensor_row_f32(&m->classifier, v, row);
        for (int d = 0; d < D; d++) E[(size_t)v * D + d] = (double)row[d] * g[d];
    }
    int sp = ' ', dot = '.', eos = 257, letters[8];
    double known = 0;
    for (int i = 0; i < 8; i++) letters[i] = 'a' + i, known += best(&letters[i], 1) / 8;
    double l8 = best(letters, 8), rest = best(&sp, 1) + best(&dot, 1) + best(&eos, 1);
    printf("a letter known: mean floor %.3f; one of a-h, unknown which: floor %.3f (ln 8 = %.3f)\n", known, l8, log(8.0));
    printf("' xxxxx.' + EOS: floor %.3f with every letter known, %.3f with none\n", (rest + 5 * known) / 8,
           (rest + 5 * l8) / 8);
    free(E), free(row), free(g);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[2], "floor")) {
        vks_model *m = NULL;
        if (vks_model_load(argv[1], &m)) return fprintf(stderr, "bench_lora_norm: %s\n", vks_last_error()), 1;
        int rc = floors(m);
        vks_model_free(m);
        return rc;
    }
    if (argc < 5) return fprintf(stderr, "usage: bench_lora_norm MODEL DATA STEPS LR [norm]\n"), 2;
    int steps = atoi(argv[3]);
    double lr = atof(argv[4]);
    bool norm = argc > 5 && !strcmp(argv[5], "norm");
    static sample data[MAX_SAMPLES];
    int n = load(argv[2], data);
    vks_model *m = NULL;
    vks_gpu *g = NULL;
    vks_gpu_options go = {.device_index = -1};
    if (n < BATCH || vks_model_load(argv[1], &m) || vks_gpu_create(&go, &g))
        return fprintf(stderr, "bench_lora_norm: %s\n", n < BATCH ? "too few samples" : vks_last_error()), 1;
    vks_lora_config lc = {.rank = 8, .alpha = 16, .targets = VKS_LORA_ALL_TARGETS};
    vks_lora_adapter *a = NULL;
    vks_trainer *t = NULL;
    vks_trainer_options o = {.max_tokens = BATCH * MAX_LEN, .lora_save_norm = norm};
    if (vks_lora_adapter_create(&m->cfg, &lc, &a) || vks_lora_adapter_init(a, 1) || (o.lora = a, 0) ||
        vks_trainer_create(g, m, &o, &t))
        return fprintf(stderr, "bench_lora_norm: %s\n", vks_last_error()), 1;
    vks_adamw_params h = {.lr = lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    static int32_t tok[BATCH * MAX_LEN];
    static float w[BATCH * MAX_LEN];
    int lens[BATCH];
    uint64_t rng = 7;
    for (int s = 0; s < steps; s++) {
        int T = 0, loss_rows = 0;
        for (int q = 0; q < BATCH; q++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            const sample *x = &data[(rng >> 33) % (uint64_t)n];
            for (int i = 0; i < x->len; i++) {
                tok[T + i] = x->tok[i];
                w[T + i] = i + 1 >= x->prompt && i + 1 < x->len;
                loss_rows += w[T + i] != 0;
            }
            lens[q] = x->len;
            T += x->len;
        }
        for (int i = 0; i < T; i++) w[i] /= (float)loss_rows;
        vks_train_batch b = {.tokens = tok, .n_tokens = T, .seq_lens = lens, .n_seqs = BATCH, .weight = w};
        double loss, gn;
        if (vks_trainer_accumulate(t, &b, &loss, NULL) || vks_trainer_step(t, &h, 1.0, &gn))
            return fprintf(stderr, "bench_lora_norm: %s\n", vks_last_error()), 1;
        if (s % 10 == 0 || s == steps - 1)
            printf("step %d loss %.4f grad_norm %.4f\n", s + 1, loss, gn);
    }
    vks_trainer_destroy(t);
    vks_lora_adapter_free(a);
    vks_model_free(m);
    vks_gpu_destroy(g);
    return 0;
}
