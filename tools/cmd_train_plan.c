/* `vkswarm train plan`: argument parsing around vks_train_plan_make, and the plan printed. */
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include "cli_model.h"
#include "cli_util.h"
#include "commands.h"
#include "vkswarm/vks_train.h"

static const char plan_usage[] =
    "usage: vkswarm train plan (--model M | --random-model dim,hidden,layers,heads,kv_heads,vocab[,seq[,head_dim]]\n"
    "                          [--arch llama|llama3|qwen2|qwen3]) [--type T] [--lora-rank R] [--tokens N] [--recompute]\n"
    "The device memory a training run needs, computed without a device: base weights, adapter, gradients,\n"
    "optimizer (AdamW's two f32 moments), activations, logits and scratch, as the trainer allocates them\n"
    "for micro-batches of N tokens (default: the model's context, at most 16384). --lora-rank R > 0:\n"
    "LoRA adapters of rank R on every linear layer of every block (q, k, v, o, gate, up, down) over a\n"
    "frozen base stored as T (f32, f16, bf16, q8_0, q4_0, q4_k; default: the model's file types, as\n"
    "train sft --lora-rank keeps them; --random-model: f32); R = 0 (the default): full fine-tuning with f32 master weights. --recompute keeps only\n"
    "each layer's input and recomputes the rest in the backward. Prints one line per part, then one\n"
    "JSON object with the same numbers in bytes (base_bytes ... total_bytes).\n";

typedef struct {
    cli_model_args m;
    const char *type;
    vks_train_plan_options o;
    bool tokens_given;
} plan_args;

static void parse_plan(int argc, char **argv, plan_args *a) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 0}, {"random-model", required_argument, 0, 0},
        {"arch", required_argument, 0, 0}, {"type", required_argument, 0, 0}, {"lora-rank", required_argument, 0, 0},
        {"tokens", required_argument, 0, 0}, {"recompute", no_argument, 0, 0}, {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    int c, idx;
    while ((c = cli_getopt(argc, argv, "h", opts, &idx)) != -1) {
        if (c == 'h') { fputs(plan_usage, stdout); exit(0); }
        const char *name = opts[idx].name;
        if (!strcmp(name, "model")) a->m.model_path = optarg;
        else if (!strcmp(name, "random-model")) a->m.random_spec = optarg;
        else if (!strcmp(name, "arch")) a->m.random_arch = optarg;
        else if (!strcmp(name, "type")) a->type = optarg;
        else if (!strcmp(name, "lora-rank")) a->o.lora_rank = (int)cli_parse_long("--lora-rank", optarg, 0, 1 << 20);
        else if (!strcmp(name, "tokens"))
            a->o.tokens = (int)cli_parse_long("--tokens", optarg, 1, 16384), a->tokens_given = true;
        else if (!strcmp(name, "recompute")) a->o.recompute = true;
    }
    if (optind < argc) cli_usage_error("train", "unexpected argument '%s'", argv[optind]);
    if (!!a->m.model_path + !!a->m.random_spec != 1) cli_usage_error("train", "plan: give one of --model and --random-model");
    if (a->type && !a->o.lora_rank)
        cli_usage_error("train", "plan: --type is the frozen base of --lora-rank R > 0 (full fine-tuning trains f32)");
    if (a->type && (vks_dtype_parse(a->type, &a->o.base_dtype) || a->o.base_dtype == VKS_DTYPE_Q6_K))
        cli_usage_error("train", "plan: --type '%s' is not f32, f16, bf16, q8_0, q4_0 or q4_k", a->type);
}

static void put_line(const char *part, uint64_t bytes, const char *what) {
    bool gib = bytes >= (1u << 30);
    printf("  %-12s %10.3f %s  %s\n", part, (double)bytes / (gib ? 1024.0 * 1024 * 1024 : 1024.0 * 1024),
           gib ? "GiB" : "MiB", what);
}

static void print_plan(const vks_model_config *c, const plan_args *a, const char *base_type, const vks_train_plan *p) {
    const vks_train_plan_options *o = &a->o;
    printf("model: dim %d, hidden %d, %d layers, %d/%d heads, vocab %d: %" PRId64 " parameters\n", c->dim,
           c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size, p->params);
    if (o->lora_rank)
        printf("LoRA rank %d on q, k, v, o, gate, up, down of every layer: %" PRId64 " trainable; frozen base %s\n",
               o->lora_rank, p->trainable, base_type);
    else printf("full fine-tuning: %" PRId64 " trainable, f32 masters\n", p->trainable);
    printf("%d tokens per micro-batch, recompute %s\n", o->tokens, o->recompute ? "on" : "off");
    put_line("base", p->base, o->lora_rank ? "frozen weights on the device" : "f32 master weights");
    put_line("adapter", p->adapter, "LoRA A and B, f32");
    put_line("gradients", p->gradients, "f32 per trainable parameter");
    put_line("optimizer", p->optimizer, "AdamW m and v, f32 per trainable parameter");
    put_line("activations", p->activations, o->recompute ? "layer inputs + one layer's set" : "every layer's set");
    put_line("logits", p->logits, "[tokens, vocab] f32 and log-probabilities");
    put_line("scratch", p->scratch, "the backward's activation gradients and op scratch");
    put_line("total", p->total, "(pipelines and the driver's own memory not counted)");
    printf("{\"params\": %" PRId64 ", \"trainable\": %" PRId64 ", \"lora_rank\": %d, \"base_type\": \"%s\", "
           "\"tokens\": %d, \"recompute\": %s, \"base_bytes\": %" PRIu64 ", \"adapter_bytes\": %" PRIu64
           ", \"gradient_bytes\": %" PRIu64 ", \"optimizer_bytes\": %" PRIu64 ", \"activation_bytes\": %" PRIu64
           ", \"logit_bytes\": %" PRIu64 ", \"scratch_bytes\": %" PRIu64 ", \"total_bytes\": %" PRIu64 "}\n",
           p->params, p->trainable, o->lora_rank, base_type, o->tokens, o->recompute ? "true" : "false", p->base,
           p->adapter, p->gradients, p->optimizer, p->activations, p->logits, p->scratch, p->total);
}

int cmd_train_plan(int argc, char **argv) {
    plan_args a = {.m.device = -1};
    parse_plan(argc, argv, &a);
    vks_model shape = {0}, *m = &shape, *loaded = NULL;
    if (a.m.random_arch && !a.m.random_spec) cli_die(EXIT_BAD_INPUT, "--arch goes with --random-model");
    if (a.m.random_spec) { /* shapes only: no weights made */
        cli_parse_random_spec(a.m.random_spec, a.m.random_arch, &shape.cfg);
        const char *arch = a.m.random_arch ? a.m.random_arch : "llama";
        if (vks_model_arch_config(&shape.cfg, arch, NULL)) cli_die(EXIT_BAD_INPUT, "--arch: %s", vks_last_error());
        snprintf(shape.arch, sizeof shape.arch, "%s", strcmp(arch, "llama3") ? arch : "llama");
    }
    else m = loaded = cli_load_model(&a.m);
    const char *base_type = a.type ? a.type : "f32";
    if (!a.type && a.o.lora_rank && loaded) /* the trainer keeps the file's types */
        a.o.keep_file_dtype = true, base_type = "file";
    if (!a.o.lora_rank) base_type = "f32";
    if (!a.tokens_given) a.o.tokens = m->cfg.seq_len < 16384 ? m->cfg.seq_len : 16384;
    vks_train_plan p;
    if (vks_train_plan_make(m, &a.o, &p)) cli_die(EXIT_BAD_INPUT, "train plan: %s", vks_last_error());
    print_plan(&m->cfg, &a, base_type, &p);
    vks_model_free(loaded);
    return 0;
}
