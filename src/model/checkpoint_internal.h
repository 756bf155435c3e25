/* checkpoint_internal.h: what checkpoint.c and checkpoint_dir.c share. Not a
 * public API. */
#ifndef VKS_CHECKPOINT_INTERNAL_H
#define VKS_CHECKPOINT_INTERNAL_H
#include "vkswarm/vks_checkpoint.h"

/* A file name a checkpoint directory holds (model.safetensors, config.json,
 * tokenizer.json, tokenizer_config.json, optimizer.safetensors, state.json). */
bool vks_ckpt_known_file(const char *name);
/* Whether name is a checkpoint directory's (step-<9 or more digits>), and its step. */
bool vks_ckpt_step_name(const char *name, int64_t *step);
/* 1 when dir holds nothing but checkpoint files and vks_outfile temporaries
 * of them (regular files), 0 when it holds anything else, < 0 on error. */
int vks_ckpt_only_our_files(const char *dir);
/* Removes dir and its files when vks_ckpt_only_our_files says it may: 1
 * removed, 0 left alone, < 0 error (message set). */
int vks_ckpt_remove_dir(const char *dir);
/* fsync of a directory, and of the directory holding path. */
int vks_ckpt_sync_dir(const char *dir);
int vks_ckpt_sync_parent(const char *path);
/* K of vks_checkpoint_load's bound |m| <= K sqrt(v) after state->step Adam
 * updates (infinite when the betas allow no bound), and the floor added to it. */
double vks_ckpt_moment_bound(const vks_ckpt_state *s);
#define VKS_CKPT_MOMENT_FLOOR 1e-15

/* checkpoint_lora.c: a LoRA checkpoint's files beside state.json. */
int vks_ckpt_lora_check(const char *dir, const vks_checkpoint_data *c);
int vks_ckpt_lora_write(const char *tmp, const vks_checkpoint_data *c);
/* The adapter (from dir, for base) and, when has_optimizer, the moments, into c. */
int vks_ckpt_lora_load(vks_checkpoint *c, const char *dir, const vks_model *base, bool has_optimizer);
#endif
