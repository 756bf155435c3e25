/* rope.c: the RoPE frequencies of a model (vks_model.h), the one place the
 * formula is written. */
#include "vkswarm/vks_model.h"

#include <math.h>
#include <stdlib.h>

/* Llama 3.1's scaling (transformers' _compute_llama3_parameters): wavelengths
 * above original/low_freq_factor divided by factor, below
 * original/high_freq_factor kept, the band between interpolated. */
static double llama3_scaled(const vks_rope_scaling *s, double f) {
    double low_wavelen = s->original_context / (double)s->low_freq_factor;
    double high_wavelen = s->original_context / (double)s->high_freq_factor;
    double wavelen = 2.0 * M_PI / f;
    if (wavelen < high_wavelen) return f;
    if (wavelen > low_wavelen) return f / s->factor;
    double smooth = (s->original_context / wavelen - s->low_freq_factor) / (s->high_freq_factor - s->low_freq_factor);
    return (1.0 - smooth) * f / s->factor + smooth * f;
}

void vks_rope_freqs(const vks_model_config *c, double *freqs) {
    int half = c->head_dim / 2;
    for (int i = 0; i < half; i++) {
        freqs[i] = pow((double)c->rope_theta, -2.0 * i / c->head_dim);
        if (c->rope_scaling.type == VKS_ROPE_SCALING_LLAMA3) freqs[i] = llama3_scaled(&c->rope_scaling, freqs[i]);
    }
}

bool vks_rope_table(const vks_model_config *c, int n_pos, float *table) {
    int half = c->head_dim / 2;
    double *freqs = malloc((size_t)(half + 1) * sizeof *freqs);
    if (!freqs) return false;
    vks_rope_freqs(c, freqs);
    for (int p = 0; p < n_pos; p++)
        for (int i = 0; i < half; i++) {
            double angle = (double)p * freqs[i];
            table[2 * ((size_t)p * half + i)] = (float)cos(angle);
            table[2 * ((size_t)p * half + i) + 1] = (float)sin(angle);
        }
    free(freqs);
    return true;
}
