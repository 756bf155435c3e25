/* `vkswarm convert`: between llama2.c .bin, GGUF and Hugging Face safetensors. */
#include <dirent.h>
#include <getopt.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>
#include <unistd.h>
#include "cli_model.h"
#include "cli_util.h"
#include "vkswarm/vks_gguf.h"
#include "vkswarm/vks_lora.h"
#include "vkswarm/vks_model.h"
#include "vkswarm/vks_quant.h"
#include "vkswarm/vks_tokenizer.h"

static const char convert_usage[] =
    "usage: vkswarm convert (--in MODEL |\n"
    "                        --random-model dim,hidden,layers,heads,kv,vocab[,seq[,head_dim]]\n"
    "                        [--arch llama|llama3|qwen2|qwen3] | --init tiny [--seed S]) --out PATH\n"
    "                       [--type f32|f16|bf16|q8_0|q4_0|q4_k|q6_k [--strict]] [--tokenizer T]\n"
    "                       [--lora ADAPTER]\n"
    "Converts a model. The input format is detected by content (GGUF, safetensors file or directory\n"
    "with config.json, llama2.c). The output format follows PATH: *.gguf is GGUF, *.bin is llama2.c\n"
    "(f32 only), anything else is a Hugging Face directory (config.json + model.safetensors; f32,\n"
    "f16 or bf16). q/k rows are permuted for each format's RoPE order, so logits do not change.\n"
    "--type sets the dtype of weight matrices (default f32; norms and biases stay f32). A matrix whose\n"
    "rows are not whole blocks of the type (q4_k, q6_k: 256 elements; q8_0, q4_0: 32) is written in\n"
    "the nearest type whose blocks fit, as llama.cpp's quantize does: q4_k -> q4_0, q6_k -> q8_0,\n"
    "else f32; stderr names each such matrix and the type used, and every convert says the size it\n"
    "wrote. --strict refuses such a matrix instead (exit 2, naming it).\n"
    "--tokenizer T (a llama2.c tokenizer.bin, a GGUF vocabulary or model, a tokenizer.json or a\n"
    "directory holding one) is written with the model: as tokenizer.ggml.* metadata in GGUF, in a\n"
    "Hugging Face directory as tokenizer.json (byte-level BPE), tokenizer.gguf (SentencePiece) or\n"
    "tokenizer.bin (llama2.c). Without it the source's own tokenizer goes along where the output\n"
    "can hold it (a llama2.c file holds none).\n"
    "--random-model writes a model of random weights; --arch makes it a Llama (the default), a Llama 3.1\n"
    "(RoPE scaling), a Qwen2 (q/k/v biases) or a Qwen3 (per-head q/k norms; head_dim may differ from\n"
    "dim / heads).\n"
    "--init tiny writes the built-in tiny model (dim 128, 4 layers, byte-level vocabulary of 259\n"
    "tokens, 0.82M parameters) initialised from --seed (default 0), with its tokenizer, as GGUF or\n"
    "a Hugging Face directory; the same seed gives the same file.\n"
    "--lora ADAPTER merges a LoRA adapter made for the input model (a PEFT directory with\n"
    "adapter_config.json and adapter_model.safetensors, or a llama.cpp GGUF adapter) into it:\n"
    "W + (lora_alpha / r) B A for every targeted matrix, computed in double from the input's\n"
    "decoded weights, then written with --type (default f32). An adapter for another model (shape\n"
    "or base hash), of a bad rank or target, or holding NaN/Inf is refused (exit 2).\n";

typedef enum { OUT_GGUF, OUT_LLAMA2C, OUT_HF } out_format;

typedef struct {
    cli_model_args m;
    const char *out, *type_name, *init, *lora;
    vks_dtype type;
    uint64_t seed;
    bool strict;
} convert_args;

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static void parse_convert(int argc, char **argv, convert_args *a) {
    static const struct option opts[] = {{"in", required_argument, 0, 0},       {"out", required_argument, 0, 0},
                                         {"type", required_argument, 0, 0},     {"tokenizer", required_argument, 0, 0},
                                         {"random-model", required_argument, 0, 0}, {"init", required_argument, 0, 0},
                                         {"seed", required_argument, 0, 0},         {"help", no_argument, 0, 'h'},
                                         {"arch", required_argument, 0, 0},         {"lora", required_argument, 0, 0},
                                         {"strict", no_argument, 0, 0},             {0, 0, 0, 0}};
    int c, idx;
    a->type = VKS_DTYPE_F32;
    while ((c = cli_getopt(argc, argv, "h", opts, &idx)) != -1) {
        if (c == 'h') {
            fputs(convert_usage, stdout);
            exit(0);
        }
        const char *name = opts[idx].name;
        if (!strcmp(name, "in")) a->m.model_path = optarg;
        else if (!strcmp(name, "out")) a->out = optarg;
        else if (!strcmp(name, "tokenizer")) a->m.tokenizer_path = optarg;
        else if (!strcmp(name, "random-model")) a->m.random_spec = optarg;
        else if (!strcmp(name, "arch")) a->m.random_arch = optarg;
        else if (!strcmp(name, "type")) a->type_name = optarg;
        else if (!strcmp(name, "init")) a->init = optarg;
        else if (!strcmp(name, "lora")) a->lora = optarg;
        else if (!strcmp(name, "seed")) a->seed = cli_parse_u64("--seed", optarg);
        else if (!strcmp(name, "strict")) a->strict = true;
    }
    if (optind < argc) cli_usage_error("convert", "unexpected argument '%s'", argv[optind]);
    if (!a->out) cli_usage_error("convert", "--out is required");
    if (!!a->m.model_path + !!a->m.random_spec + !!a->init != 1)
        cli_die(EXIT_BAD_INPUT, "convert: give exactly one of --in, --random-model and --init");
    if (a->init && strcmp(a->init, "tiny")) cli_die(EXIT_BAD_INPUT, "convert: --init '%s' is not 'tiny'", a->init);
    if (a->init && a->m.tokenizer_path) cli_die(EXIT_BAD_INPUT, "convert: --init tiny has its own tokenizer");
    if (a->type_name && vks_dtype_parse(a->type_name, &a->type))
        cli_die(EXIT_BAD_INPUT, "convert: --type '%s' is not f32, f16, bf16, q8_0, q4_0, q4_k or q6_k", a->type_name);
}

static out_format output_format(const char *out) {
    if (ends_with(out, ".gguf")) return OUT_GGUF;
    if (ends_with(out, ".bin")) return OUT_LLAMA2C;
    return OUT_HF;
}

/* Whether the tokenizer can be written in the target format (a dry run). */
static int probe_gguf(const vks_tokenizer *t) {
    vks_gguf_writer *w = NULL;
    int rc = vks_gguf_writer_create(&w);
    if (rc == VKS_OK) rc = vks_tokenizer_save_gguf(t, w);
    vks_gguf_writer_free(w);
    return rc;
}

/* The source directory's tokenizer file, or NULL when it has none. */
static const char *dir_tokenizer_file(const vks_model *m, char *path, size_t cap) {
    const char *names[3] = {VKS_TOKENIZER_JSON, VKS_TOKENIZER_GGUF, VKS_TOKENIZER_BIN};
    for (int i = 0; i < 3; i++)
        if ((size_t)snprintf(path, cap, "%s/%s", m->dir, names[i]) < cap && access(path, F_OK) == 0) return path;
    return NULL;
}

/* Where the tokenizer of the output comes from: o->tokenizer (a loaded one,
 * *owned to free) or o->tokenizer_path (a llama2.c tokenizer.bin into GGUF,
 * embedded from its file), or neither. --tokenizer must load (exit 2); a
 * source's own tokenizer that cannot be read or held is noted and left out.
 * A GGUF source into GGUF copies its keys as they are (neither is set). */
static void output_tokenizer(const char *tok_path, const vks_model *m, out_format fmt, vks_model_save_options *o,
                             vks_tokenizer **owned, char *buf, size_t cap) {
    *owned = NULL;
    bool from_gguf = m->gguf != NULL, from_hf = m->dir[0] != '\0';
    if (!tok_path) {
        if (fmt == OUT_LLAMA2C || (fmt == OUT_GGUF && from_gguf)) return;
        if (from_gguf && vks_gguf_find_key(m->gguf, "tokenizer.ggml.model") < 0) return;
        if (!from_gguf && !(from_hf && dir_tokenizer_file(m, buf, cap))) return;
    }
    vks_tokenizer *t = NULL;
    int rc = vks_tokenizer_load_auto(tok_path, m, &t);
    if (rc != VKS_OK && tok_path) cli_die(EXIT_BAD_INPUT, "%s", vks_last_error());
    bool embed_file = rc == VKS_OK && fmt == OUT_GGUF && !strcmp(vks_tokenizer_kind(t), "llama2c");
    if (embed_file) { /* the GGUF writer maps a tokenizer.bin to SentencePiece metadata */
        o->tokenizer_path = tok_path ? tok_path : dir_tokenizer_file(m, buf, cap);
        vks_tokenizer_free(t);
        return;
    }
    if (rc == VKS_OK) rc = fmt == OUT_HF ? vks_tokenizer_check_dir_files(t) : probe_gguf(t);
    if (rc == VKS_OK) {
        o->tokenizer = *owned = t;
        return;
    }
    if (tok_path) cli_die(EXIT_BAD_INPUT, "%s", vks_last_error());
    cli_note("the tokenizer is not written: %s", vks_last_error());
    vks_tokenizer_free(t);
}

/* Merges the adapter at path into m (exit 2 for an adapter that does not fit m). */
static void merge_lora(vks_model *m, const char *path) {
    vks_lora_adapter *ad = NULL;
    int rc = vks_lora_load(path, m, &ad);
    if (rc != VKS_OK) cli_die(rc == VKS_ERR_NOMEM ? 1 : EXIT_BAD_INPUT, "%s", vks_last_error());
    const vks_lora_config *lc = vks_lora_adapter_config(ad);
    cli_note("merging LoRA adapter %s (rank %d, alpha %g) into %s", path, lc->rank, lc->alpha, m->path);
    rc = vks_lora_merge(m, ad);
    vks_lora_adapter_free(ad);
    if (rc != VKS_OK) cli_die(rc == VKS_ERR_NOMEM ? 1 : EXIT_BAD_INPUT, "%s", vks_last_error());
}

/* The matrices written in another type than --type, grouped by (columns,
 * type used) in the order met: one line per group after the file is written. */
#define MAX_FALLBACK_GROUPS 16
#define NAMES_SHOWN 4
typedef struct { int64_t cols; vks_dtype used; int n; char names[NAMES_SHOWN][64]; } fallback_group;
typedef struct {
    fallback_group g[MAX_FALLBACK_GROUPS];
    int n_groups, n_other; /* n_other: matrices of groups past the last (not named) */
} fallbacks;

static void on_fallback(void *ctx, const char *tensor, int64_t cols, vks_dtype used) {
    fallbacks *f = ctx;
    int i = 0;
    while (i < f->n_groups && (f->g[i].cols != cols || f->g[i].used != used)) i++;
    if (i == MAX_FALLBACK_GROUPS) { f->n_other++; return; }
    if (i == f->n_groups) f->g[f->n_groups++] = (fallback_group){.cols = cols, .used = used};
    if (f->g[i].n < NAMES_SHOWN) snprintf(f->g[i].names[f->g[i].n], sizeof f->g[i].names[0], "%s", tensor);
    f->g[i].n++;
}

/* "convert: N matrices of C columns written as USED, not TYPE (rows are not whole B-element TYPE blocks): names" */
static void say_fallbacks(const fallbacks *f, vks_dtype want) {
    for (int i = 0; i < f->n_groups; i++) {
        char names[NAMES_SHOWN * 66 + 32] = "";
        for (int k = 0; k < f->g[i].n && k < NAMES_SHOWN; k++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k ? ", " : "", f->g[i].names[k]);
        if (f->g[i].n > NAMES_SHOWN)
            snprintf(names + strlen(names), sizeof names - strlen(names), " and %d more", f->g[i].n - NAMES_SHOWN);
        cli_note("convert: %d %s of %lld columns written as %s, not %s (rows are not whole %zu-element %s blocks; "
                 "--strict refuses): %s", f->g[i].n, f->g[i].n == 1 ? "matrix" : "matrices", (long long)f->g[i].cols,
                 vks_dtype_name(f->g[i].used), vks_dtype_name(want), vks_dtype_block_elems(want), vks_dtype_name(want),
                 names);
    }
    if (f->n_other) cli_note("convert: %d more matrices written in another type than %s", f->n_other, vks_dtype_name(want));
}

/* The bytes written at path: a file's size, or a directory's files together. */
static long long bytes_written(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) return (long long)st.st_size;
    DIR *d = opendir(path);
    if (!d) return -1;
    long long total = 0;
    char p[4200];
    for (struct dirent *e; (e = readdir(d));)
        if ((size_t)snprintf(p, sizeof p, "%s/%s", path, e->d_name) < sizeof p && stat(p, &st) == 0 && S_ISREG(st.st_mode))
            total += (long long)st.st_size;
    closedir(d);
    return total;
}

static vks_model *tiny_model(uint64_t seed, vks_tokenizer **tok) {
    vks_model *m = NULL;
    if (vks_model_init_tiny(seed, &m, tok)) cli_die(1, "%s", vks_last_error());
    return m;
}

int cmd_convert(int argc, char **argv) {
    convert_args a = {0};
    parse_convert(argc, argv, &a);
    out_format fmt = output_format(a.out);
    if (fmt == OUT_LLAMA2C && a.type != VKS_DTYPE_F32) cli_die(EXIT_BAD_INPUT, "convert: llama2.c files hold f32 only");
    if (fmt == OUT_LLAMA2C && a.init)
        cli_die(EXIT_BAD_INPUT, "convert: a llama2.c file cannot hold the tiny model's byte-level tokenizer; write "
                "GGUF or a Hugging Face directory");
    if (fmt == OUT_HF && vks_dtype_size(a.type) == 0)
        cli_die(EXIT_BAD_INPUT, "convert: safetensors output holds f32, f16 or bf16, not %s", vks_dtype_name(a.type));
    if (fmt == OUT_LLAMA2C && a.m.tokenizer_path)
        cli_die(EXIT_BAD_INPUT, "convert: a llama2.c file holds no tokenizer; write GGUF or a Hugging Face directory");
    const char *tok_path = a.m.tokenizer_path;
    a.m.tokenizer_path = NULL; /* not for cli_load_model */
    vks_tokenizer *tok = NULL;
    vks_model *m = a.init ? tiny_model(a.seed, &tok) : cli_load_model(&a.m);
    fallbacks fb = {0};
    vks_model_save_options o = {.dtype = a.type, .tokenizer = tok, .strict = a.strict, .on_fallback = on_fallback,
                                .fallback_ctx = &fb};
    char buf[1100];
    if (!a.init) output_tokenizer(tok_path, m, fmt, &o, &tok, buf, sizeof buf);
    if (a.lora) merge_lora(m, a.lora);
    cli_note("converting %s (%s, %lld parameters) to %s", m->path, m->arch, (long long)vks_model_param_count(m), a.out);
    int rc = VKS_OK;
    if (fmt == OUT_GGUF) rc = vks_model_save_gguf(m, a.out, &o);
    else if (fmt == OUT_HF) rc = vks_model_save_safetensors(m, a.out, &o);
    else rc = vks_model_save_llama2c(m, a.out);
    vks_tokenizer_free(tok);
    vks_model_free(m);
    if (rc != VKS_OK && a.strict && rc == VKS_ERR_ARG) cli_die(EXIT_BAD_INPUT, "convert: --strict: %s", vks_last_error());
    if (rc != VKS_OK) cli_die(rc == VKS_ERR_IO ? 1 : EXIT_BAD_INPUT, "%s", vks_last_error());
    say_fallbacks(&fb, a.type);
    long long bytes = bytes_written(a.out);
    if (bytes >= 0) cli_note("convert: wrote %s: %lld bytes (%.2f MB)", a.out, bytes, bytes / 1e6);
    return 0;
}
