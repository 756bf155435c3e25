/* rl_ckpt.c: a trainer's state as a checkpoint (rl_internal.h), shared by the
 * SFT run and the RL run. */
#include <stdlib.h>
#include "rl_internal.h"

int vks_rl_move_set(vks_trainer *t, const vks_param_layout *l, vks_param_kind set, float *block, bool to_block) {
    for (int i = 0; i < l->n_tensors; i++) {
        const vks_param_info *p = &l->tensors[i];
        int ti = vks_trainer_find_tensor(t, p->name);
        if (ti < 0) return vks_set_error(VKS_ERR_FORMAT, "checkpoint: its tensor %s is not the model's", p->name);
        int rc = to_block ? vks_trainer_read(t, set, ti, block + p->offset) : vks_trainer_write(t, set, ti, block + p->offset);
        if (rc) return rc;
    }
    return VKS_OK;
}

int vks_rl_save_trainer(vks_trainer *t, const vks_param_layout *l, const vks_model *m,
                        const struct vks_tokenizer *tok, const vks_ckpt_state *state, const char *out_dir, int keep,
                        char *dir, size_t cap) {
    size_t n = l->n_values;
    float *w = malloc(sizeof *w * n), *mo = malloc(sizeof *mo * n), *v = malloc(sizeof *v * n);
    int rc = w && mo && v ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "checkpoint: out of host memory");
    if (!rc) rc = vks_rl_move_set(t, l, VKS_SET_PARAMS, w, true);
    if (!rc) rc = vks_rl_move_set(t, l, VKS_SET_ADAM_M, mo, true);
    if (!rc) rc = vks_rl_move_set(t, l, VKS_SET_ADAM_V, v, true);
    vks_model_save_options save = {.dtype = VKS_DTYPE_F32, .tokenizer = tok};
    vks_checkpoint_data c = {.layout = l, .weights = w, .adam_m = mo, .adam_v = v, .arch = m->arch,
                             .bos_id = m->bos_id, .eos_id = m->eos_id, .save = &save, .state = *state};
    if (!rc) rc = vks_checkpoint_step_dir(out_dir, state->step, dir, cap);
    if (!rc) rc = vks_checkpoint_save(dir, &c);
    if (!rc && keep > 0) rc = vks_checkpoint_prune(out_dir, keep, NULL);
    free(w);
    free(mo);
    free(v);
    return rc;
}
