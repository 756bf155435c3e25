/* Options every model-running subcommand shares, and loading them. */
#ifndef VKS_CLI_MODEL_H
#define VKS_CLI_MODEL_H
#include "vkswarm/vks_engine.h"
#include "vkswarm/vks_tokenizer.h"

typedef struct {
    const char *model_path, *tokenizer_path, *random_spec;
    const char *random_arch; /* --arch of --random-model: llama, llama3, qwen2, qwen3 (NULL: llama) */
    vks_engine_options engine; /* what the user chose: .dtype, .keep_file_dtype (--dtype);
                                  each command adds the sizes and the math it needs */
    bool dtype_given;     /* --dtype was on the command line */
    bool kv_type_given;   /* --kv-type was (engine.kv_f16 holds it) */
    int device;      /* -1: default */
    bool profile;
    const char *lora_path;   /* --lora (commands that list CLI_LORA_LONG_OPTION) */
    vks_lora_adapter *lora;  /* loaded by cli_load_model from lora_path; NULL: none */
    int speaker;     /* under mpirun, the world rank that says the loading notes (default 0; rl: the trainer) */
} cli_model_args;

/* Handles --model, --tokenizer, --random-model, --arch, --dtype, --device, --profile.
 * Returns true if `opt` (a getopt_long name) was one of them. */
bool cli_model_option(cli_model_args *a, const char *opt, const char *val);
/* Commands whose engines keep the f32 KV cache (rl, train, eval) refuse --kv-type. */
void cli_no_kv_type(const cli_model_args *a, const char *cmd);
#define CLI_MODEL_LONG_OPTIONS                                                              \
    {"model", required_argument, 0, 0}, {"tokenizer", required_argument, 0, 0},            \
        {"random-model", required_argument, 0, 0}, {"dtype", required_argument, 0, 0},     \
        {"device", required_argument, 0, 0}, {"profile", no_argument, 0, 0}, {"arch", required_argument, 0, 0}, \
        {"kv-type", required_argument, 0, 0}

/* --lora PATH: a LoRA adapter (PEFT directory or GGUF LoRA file) for the model;
 * generate, eval, verify, logits and pipeline take it. */
#define CLI_LORA_LONG_OPTION {"lora", required_argument, 0, 0}
#define CLI_LORA_HELP "--lora PATH: apply a LoRA adapter (PEFT directory or GGUF LoRA file) to the model\n"

/* The config of --random-model's "dim,hidden,layers,heads,kv_heads,vocab[,seq_len]"
 * (seq_len 2048 when left out; exit 2 on a malformed spec). */
void cli_parse_random_spec(const char *spec, const char *arch, vks_model_config *out);
/* Loads the model (exit 2 naming the file on bad input), or builds the random one. */
/* Without --dtype, a model stored in block formats (a quantized GGUF) keeps
 * its file's types; anything else runs in f32. cli_load_model records that
 * choice in a->engine.keep_file_dtype. */
vks_model *cli_load_model(cli_model_args *a);
/* The identity of the model with its adapter (vks_lora_model_hash); exit 2 on failure. */
void cli_model_hash(const cli_model_args *a, const vks_model *m, uint8_t out[32]);
/* The adapter (if any) onto the engine; exit 1 on failure. */
void cli_engine_lora(const cli_model_args *a, vks_engine *e);
/* Frees the adapter and the model. */
void cli_free_model(cli_model_args *a, vks_model *m);
/* Loads the tokenizer if a path was given (exit 2 on bad input); NULL otherwise. */
vks_tokenizer *cli_load_tokenizer(const cli_model_args *a, const vks_model *m);
/* Opens the GPU (VKSWARM_VALIDATION=1 turns the validation layer on). */
vks_gpu *cli_open_gpu(const cli_model_args *a);
/* The same, but NULL (vks_last_error() says why) when no device opens. */
vks_gpu *cli_try_open_gpu(const cli_model_args *a);
/* Creates an engine; a model that does not fit exits 2 with the bytes. */
vks_engine *cli_create_engine(vks_gpu *g, const vks_model *m, const vks_engine_options *o);
/* Prints per-kernel times (after --profile) on stderr. */
void cli_print_profile(vks_gpu *g);
/* Checks for validation messages at exit (fails the command under tests). */
int cli_finish_gpu(vks_gpu *g);
#endif
