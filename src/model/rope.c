/* rope.c: the RoPE frequencies of a model (vks_model.h), the one place the
 * formula is written. */
#include "vkswarm/vks_model.h"

#include <math.h>
#include <stdlib.h>

void vks_rope_freqs(const vks_model_config *c, double *freqs) {
    int half = c->head_dim / 2;
    for (int i = 0; i < half; i++) freqs[i] = pow((double)c->rope_theta, -2.0 * i / c->head_dim);
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
