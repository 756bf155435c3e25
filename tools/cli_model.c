/* cli_model.c: the model, tokenizer, device and engine options every command shares, and loading them. */
#include "cli_model.h"
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include "cli_util.h"
#include "vkswarm/vks_quant.h"

bool cli_model_option(cli_model_args *a, const char *opt, const char *val) {
    if (!strcmp(opt, "model")) a->model_path = val;
    else if (!strcmp(opt, "tokenizer")) a->tokenizer_path = val;
    else if (!strcmp(opt, "random-model")) a->random_spec = val;
    else if (!strcmp(opt, "arch")) a->random_arch = val;
    else if (!strcmp(opt, "device")) a->device = (int)cli_parse_long("--device", val, 0, 64);
    else if (!strcmp(opt, "profile")) a->profile = true;
    else if (!strcmp(opt, "kv-type")) { /* llama.cpp's --cache-type-k/-v, one type for both */
        if (strcmp(val, "f16") && strcmp(val, "f32")) cli_die(EXIT_BAD_INPUT, "--kv-type: '%s' is not f16 or f32", val);
        a->engine.kv_f16 = !strcmp(val, "f16");
        a->kv_type_given = true;
    }
    else if (!strcmp(opt, "lora")) a->lora_path = val;
    else if (!strcmp(opt, "dtype")) {
        a->dtype_given = true;
        /* "file": every matrix keeps its file's type (quantized GGUF tensors stay quantized) */
        a->engine.keep_file_dtype = !strcmp(val, "file");
        if (!a->engine.keep_file_dtype && (vks_dtype_parse(val, &a->engine.dtype) || a->engine.dtype == VKS_DTYPE_Q6_K))
            cli_die(EXIT_BAD_INPUT, "--dtype: '%s' is not f32, f16, bf16, q8_0, q4_0, q4_k or file", val);
    } else return false;
    return true;
}

void cli_no_kv_type(const cli_model_args *a, const char *cmd) {
    if (a->kv_type_given) cli_usage_error(cmd, "--kv-type: this command keeps the f32 KV cache");
}

/* "dim,hidden,layers,heads,kv_heads,vocab[,seq_len[,head_dim]]" of architecture arch (NULL: llama) */
void cli_parse_random_spec(const char *spec, const char *arch, vks_model_config *out) {
    long v[8] = {0, 0, 0, 0, 0, 0, 2048, 0};
    int n = 0;
    const char *s = spec;
    while (n < 8 && *s) {
        char *end;
        v[n++] = strtol(s, &end, 10);
        if (end == s || (*end && *end != ',')) n = 99;
        if (n == 99) break;
        s = *end ? end + 1 : end;
    }
    if (n < 6 || n > 8 || *s)
        cli_die(EXIT_BAD_INPUT, "--random-model: '%s' is not dim,hidden,layers,heads,kv_heads,vocab[,seq_len[,head_dim]]",
                spec);
    for (int i = 0; i < 8; i++)
        if ((v[i] <= 0 && i < n) || v[i] < 0 || v[i] > (1 << 22))
            cli_die(EXIT_BAD_INPUT, "--random-model: value %ld out of range", v[i]);
    vks_model_config c = {.dim = (int)v[0], .hidden_dim = (int)v[1], .n_layers = (int)v[2], .n_heads = (int)v[3],
                          .n_kv_heads = (int)v[4], .vocab_size = (int)v[5], .seq_len = (int)v[6], .head_dim = (int)v[7],
                          .norm_eps = 1e-5f, .shared_classifier = false};
    if (!arch && c.head_dim == 0 && c.n_heads > 0 && c.dim % c.n_heads == 0) { /* the model of earlier versions */
        c.head_dim = c.dim / c.n_heads;
        c.kv_dim = c.head_dim * c.n_kv_heads;
        c.rope_theta = 10000.0f;
    }
    *out = c;
}

static vks_model *random_model(const char *spec, const char *arch) {
    vks_model_config c;
    cli_parse_random_spec(spec, arch, &c);
    vks_model *m = NULL;
    int rc = arch ? vks_model_random_arch(&c, arch, 1234, &m) : vks_model_random(&c, 1234, &m);
    if (rc) cli_die(EXIT_BAD_INPUT, "--random-model: %s", vks_last_error());
    return m;
}

static vks_model *cli_load_model_file(const cli_model_args *a);
static void resolve_dtype(cli_model_args *a, const vks_model *m) {
    if (!a->dtype_given && vks_engine_keeps_file_types(m)) {
        a->engine.keep_file_dtype = true;
        if (cli_rank_speaks(a->speaker)) /* the same on every rank: said once */
            fprintf(stderr, "vkswarm: quantized model: weights keep their file types (--dtype to override)\n");
    }
}

/* The adapter of --lora for m (exit 2 with the loader's one line on bad input).
 * A final norm trained beside it (modules_to_save ["norm"]) replaces m's, so
 * every path that runs m with the adapter (GPU, CPU, verifier) uses it. */
static vks_lora_adapter *load_lora(const char *path, vks_model *m, int speaker) {
    vks_lora_adapter *l = NULL;
    if (vks_lora_load(path, m, &l)) cli_die(EXIT_BAD_INPUT, "%s", vks_last_error());
    if (vks_lora_apply_norm(m, l)) cli_die(1, "%s", vks_last_error());
    if (cli_rank_speaks(speaker)) /* the same on every rank: said once */
        cli_note("LoRA adapter %s: rank %d, alpha %g%s", path, vks_lora_adapter_config(l)->rank,
                 vks_lora_adapter_config(l)->alpha, vks_lora_adapter_norm(l) ? ", with its final norm (modules_to_save)" : "");
    return l;
}

vks_model *cli_load_model(cli_model_args *a) {
    vks_model *m = cli_load_model_file(a);
    resolve_dtype(a, m);
    if (a->lora_path) a->lora = load_lora(a->lora_path, m, a->speaker);
    return m;
}

void cli_model_hash(const cli_model_args *a, const vks_model *m, uint8_t out[32]) {
    if (vks_lora_model_hash(m, a->lora, out)) cli_die(EXIT_BAD_INPUT, "model hash: %s", vks_last_error());
}

void cli_engine_lora(const cli_model_args *a, vks_engine *e) {
    if (a->lora && vks_engine_set_lora(e, a->lora)) cli_die(1, "%s", vks_last_error());
}

void cli_free_model(cli_model_args *a, vks_model *m) {
    vks_lora_adapter_free(a->lora);
    a->lora = NULL;
    vks_model_free(m);
}

static vks_model *cli_load_model_file(const cli_model_args *a) {
    if (a->random_arch && !a->random_spec) cli_die(EXIT_BAD_INPUT, "--arch goes with --random-model");
    if (a->random_spec) return random_model(a->random_spec, a->random_arch);
    if (!a->model_path) cli_die(EXIT_BAD_INPUT, "--model is required (or --random-model)");
    vks_model *m = NULL;
    int rc = vks_model_load(a->model_path, &m);
    if (rc) cli_die(EXIT_BAD_INPUT, "%s", vks_last_error());
    return m;
}

vks_tokenizer *cli_load_tokenizer(const cli_model_args *a, const vks_model *m) {
    bool model_has_one = m && (m->gguf || m->dir[0]);
    if (!a->tokenizer_path && !model_has_one) return NULL; /* random / llama2.c models: ids only */
    vks_tokenizer *t = NULL;
    if (vks_tokenizer_load_auto(a->tokenizer_path, m, &t)) cli_die(EXIT_BAD_INPUT, "%s", vks_last_error());
    return t;
}

static int open_gpu(const cli_model_args *a, vks_gpu **g) {
    const char *val = getenv("VKSWARM_VALIDATION");
    vks_gpu_options o = {.device_index = a->device, .validation = val && *val && strcmp(val, "0"),
                         .profile = a->profile};
    *g = NULL;
    return vks_gpu_create(&o, g);
}

vks_gpu *cli_try_open_gpu(const cli_model_args *a) {
    vks_gpu *g = NULL;
    if (open_gpu(a, &g)) return NULL;
    const vks_device_info *d = vks_gpu_info(g);
    fprintf(stderr, "vkswarm: device %d: %s (%s, %s)\n", d->index, d->name, vks_vendor_name(d->vendor),
            vks_device_type_name(d->type));
    return g;
}

vks_gpu *cli_open_gpu(const cli_model_args *a) {
    vks_gpu *g = NULL;
    int rc = open_gpu(a, &g);
    if (rc) cli_die(rc == VKS_ERR_ARG ? EXIT_BAD_INPUT : 1, "%s", vks_last_error());
    const vks_device_info *d = vks_gpu_info(g);
    fprintf(stderr, "vkswarm: device %d: %s (%s, %s)\n", d->index, d->name, vks_vendor_name(d->vendor),
            vks_device_type_name(d->type));
    return g;
}

vks_engine *cli_create_engine(vks_gpu *g, const vks_model *m, const vks_engine_options *o) {
    vks_engine *e = NULL;
    int rc = vks_engine_create(g, m, o, &e);
    if (rc) cli_die(rc == VKS_ERR_NOMEM || rc == VKS_ERR_ARG ? EXIT_BAD_INPUT : 1, "%s", vks_last_error());
    return e;
}

static int by_time_desc(const void *a, const void *b) {
    double x = ((const vks_profile_entry *)a)->ms, y = ((const vks_profile_entry *)b)->ms;
    return x < y ? 1 : x > y ? -1 : 0;
}

void cli_print_profile(vks_gpu *g) {
    vks_profile_entry e[64];
    int n = vks_gpu_profile(g, e, 64);
    if (n == 0) return;
    qsort(e, (size_t)n, sizeof e[0], by_time_desc);
    double total = 0;
    for (int i = 0; i < n; i++) total += e[i].ms;
    fprintf(stderr, "%-24s %10s %10s %8s %6s\n", "kernel", "total ms", "calls", "us/call", "%");
    for (int i = 0; i < n; i++)
        fprintf(stderr, "%-24s %10.3f %10llu %8.1f %6.1f\n", e[i].label, e[i].ms, (unsigned long long)e[i].calls,
                1000.0 * e[i].ms / (double)e[i].calls, 100.0 * e[i].ms / (total > 0 ? total : 1));
}

int cli_finish_gpu(vks_gpu *g) {
    int msgs = vks_gpu_validation_messages(g);
    vks_gpu_destroy(g);
    if (msgs) fprintf(stderr, "vkswarm: %d Vulkan validation message(s)\n", msgs);
    return msgs ? 1 : 0;
}
