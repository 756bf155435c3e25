/* Pipeline placement: cutting layers into stages (see vks_partition.h). Pure logic, no MPI calls. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "vkswarm/vks_partition.h"

static int check_counts(int n_layers, int n_stages) {
    if (n_stages < 1 || n_stages > 1024 || n_layers < n_stages)
        return vks_set_error(VKS_ERR_ARG, "cannot cut %d layers into %d stages (each stage needs a layer)", n_layers,
                             n_stages);
    return VKS_OK;
}

int vks_partition_even(int n_layers, int n_stages, int *first) {
    int rc = check_counts(n_layers, n_stages);
    if (rc) return rc;
    for (int s = 0; s <= n_stages; s++) first[s] = (int)((long)n_layers * s / n_stages);
    return VKS_OK;
}

int vks_partition_parse(const char *spec, int n_layers, int n_stages, int *first) {
    int rc = check_counts(n_layers, n_stages);
    if (rc) return rc;
    const char *p = spec;
    first[0] = 0;
    for (int s = 0; s < n_stages; s++) {
        char *end;
        long n = strtol(p, &end, 10);
        if (end == p || n < 1 || n > n_layers || (s + 1 < n_stages ? *end != ',' : *end != 0))
            return vks_set_error(VKS_ERR_ARG, "--partition %s: want %d positive layer counts separated by commas",
                                 spec, n_stages);
        first[s + 1] = first[s] + (int)n;
        if (first[s + 1] > n_layers) break;
        p = end + 1;
    }
    if (first[n_stages] != n_layers)
        return vks_set_error(VKS_ERR_ARG, "--partition %s: the counts must sum to the model's %d layers", spec, n_layers);
    return VKS_OK;
}

/* Max layers stage s can hold in memory. */
static int memory_cap(const vks_stage_measure *m, int s, int n_stages, uint64_t layer_bytes, uint64_t embed_bytes,
                      uint64_t head_bytes) {
    uint64_t fixed = (s == 0 ? embed_bytes : 0) + (s == n_stages - 1 ? head_bytes : 0);
    if (m[s].free_bytes <= fixed || layer_bytes == 0) return m[s].free_bytes > fixed ? 1 << 20 : 0;
    uint64_t cap = (m[s].free_bytes - fixed) / layer_bytes;
    return cap > (1u << 20) ? 1 << 20 : (int)cap;
}

int vks_partition_auto(int n_layers, int n_stages, const vks_stage_measure *m, uint64_t layer_bytes,
                       uint64_t embed_bytes, uint64_t head_bytes, double embed_layers, double head_layers,
                       int *first) {
    int rc = check_counts(n_layers, n_stages);
    if (rc) return rc;
    int *count = calloc((size_t)n_stages, sizeof(int)), *cap = calloc((size_t)n_stages, sizeof(int));
    if (!count || !cap) { free(count); free(cap); return vks_set_error(VKS_ERR_NOMEM, "out of host memory"); }
    for (int s = 0; s < n_stages; s++) {
        cap[s] = memory_cap(m, s, n_stages, layer_bytes, embed_bytes, head_bytes);
        if (cap[s] < 1) {
            free(count); free(cap);
            return vks_set_error(VKS_ERR_NOMEM, "stage %d: not enough device memory for one layer (%llu bytes free)", s,
                                 (unsigned long long)m[s].free_bytes);
        }
        count[s] = 1;
    }
    /* Greedy: each further layer goes where the stage's step time after adding
     * it is smallest (the slowest stage bounds the pipeline). */
    for (int l = n_stages; l < n_layers; l++) {
        int best = -1;
        double best_t = INFINITY;
        for (int s = 0; s < n_stages; s++) {
            if (count[s] >= cap[s]) continue;
            double extra = (s == 0 ? embed_layers : 0) + (s == n_stages - 1 ? head_layers : 0);
            double t = (count[s] + 1 + extra) * m[s].seconds_per_layer;
            if (t < best_t) { best_t = t; best = s; }
        }
        if (best < 0) {
            free(count); free(cap);
            return vks_set_error(VKS_ERR_NOMEM, "the %d stages together hold only %d of %d layers", n_stages, l, n_layers);
        }
        count[best]++;
    }
    first[0] = 0;
    for (int s = 0; s < n_stages; s++) first[s + 1] = first[s] + count[s];
    free(count);
    free(cap);
    return VKS_OK;
}

void vks_partition_describe(const int *first, int n_stages, char *buf, size_t len) {
    size_t used = 0;
    buf[0] = 0;
    for (int s = 0; s < n_stages && used < len; s++)
        used += (size_t)snprintf(buf + used, len - used, "%sstage %d: layers [%d,%d)", s ? ", " : "", s, first[s],
                                 first[s + 1]);
}
