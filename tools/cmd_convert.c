/* `vkswarm convert`: between llama2.c .bin, GGUF and Hugging Face safetensors. */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include "cli_model.h"
#include "cli_util.h"
#include "vkswarm/vks_model.h"

static const char convert_usage[] =
    "usage: vkswarm convert (--in MODEL | --random-model dim,hidden,layers,heads,kv,vocab[,seq]) --out PATH\n"
    "                       [--type f32|f16|bf16|q8_0|q4_0|q4_k|q6_k] [--tokenizer tokenizer.bin]\n"
    "Converts a model. The input format is detected by content (GGUF, safetensors file or directory\n"
    "with config.json, llama2.c). The output format follows PATH: *.gguf is GGUF, *.bin is llama2.c\n"
    "(f32 only), anything else is a Hugging Face directory (config.json + model.safetensors; f32,\n"
    "f16 or bf16). q/k rows are permuted for each format's RoPE order, so logits do not change.\n"
    "--type sets the dtype of weight matrices (default f32; norms and biases stay f32); block types\n"
    "apply to matrices whose rows are whole blocks, others stay f32.\n"
    "--tokenizer embeds a llama2.c tokenizer.bin as tokenizer.ggml.* metadata (GGUF only); without\n"
    "it a GGUF source's tokenizer metadata is copied.\n";

typedef enum { OUT_GGUF, OUT_LLAMA2C, OUT_HF } out_format;

typedef struct {
    cli_model_args m;
    const char *out, *type_name;
    vks_dtype type;
} convert_args;

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static void parse_convert(int argc, char **argv, convert_args *a) {
    static const struct option opts[] = {{"in", required_argument, 0, 0},       {"out", required_argument, 0, 0},
                                         {"type", required_argument, 0, 0},     {"tokenizer", required_argument, 0, 0},
                                         {"random-model", required_argument, 0, 0}, {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
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
        else if (!strcmp(name, "type")) a->type_name = optarg;
    }
    if (optind < argc) cli_usage_error("convert", "unexpected argument '%s'", argv[optind]);
    if (!a->out) cli_usage_error("convert", "--out is required");
    if (!a->m.model_path == !a->m.random_spec) cli_die(EXIT_BAD_INPUT, "convert: give exactly one of --in and --random-model");
    if (a->type_name && vks_dtype_parse(a->type_name, &a->type))
        cli_die(EXIT_BAD_INPUT, "convert: --type '%s' is not f32, f16, bf16, q8_0, q4_0, q4_k or q6_k", a->type_name);
}

static out_format output_format(const char *out) {
    if (ends_with(out, ".gguf")) return OUT_GGUF;
    if (ends_with(out, ".bin")) return OUT_LLAMA2C;
    return OUT_HF;
}

int cmd_convert(int argc, char **argv) {
    convert_args a = {0};
    parse_convert(argc, argv, &a);
    out_format fmt = output_format(a.out);
    if (fmt == OUT_LLAMA2C && a.type != VKS_DTYPE_F32) cli_die(EXIT_BAD_INPUT, "convert: llama2.c files hold f32 only");
    if (fmt == OUT_HF && vks_dtype_size(a.type) == 0)
        cli_die(EXIT_BAD_INPUT, "convert: safetensors output holds f32, f16 or bf16, not %s", vks_dtype_name(a.type));
    if (fmt != OUT_GGUF && a.m.tokenizer_path)
        cli_die(EXIT_BAD_INPUT, "convert: --tokenizer is only embedded in GGUF output");
    const char *tok = a.m.tokenizer_path;
    a.m.tokenizer_path = NULL; /* not for cli_load_model */
    vks_model *m = cli_load_model(&a.m);
    cli_note("converting %s (%s, %lld parameters) to %s", m->path, m->arch, (long long)vks_model_param_count(m), a.out);
    vks_model_save_options o = {.dtype = a.type, .tokenizer_path = tok};
    int rc = VKS_OK;
    if (fmt == OUT_GGUF) rc = vks_model_save_gguf(m, a.out, &o);
    else if (fmt == OUT_HF) rc = vks_model_save_safetensors(m, a.out, &o);
    else rc = vks_model_save_llama2c(m, a.out);
    vks_model_free(m);
    if (rc != VKS_OK) cli_die(rc == VKS_ERR_IO ? 1 : EXIT_BAD_INPUT, "%s", vks_last_error());
    return 0;
}
