/* vks_partition.h: how a model's layers are cut into pipeline stages. Pure
 * logic in libvks_mpi (mpi/partition.c, no MPI calls); the measurements come
 * from each rank (vks_engine_measure_stage). */
#ifndef VKS_PARTITION_H
#define VKS_PARTITION_H
#include "vks_engine.h"

/* first[s] = first layer of stage s; first[n_stages] = n_layers. */
int vks_partition_even(int n_layers, int n_stages, int *first);
/* Parses "n1,n2,...": layer counts per stage, summing to n_layers. */
int vks_partition_parse(const char *spec, int n_layers, int n_stages, int *first);

/* vks_stage_measure (a rank's speed and memory): vks_engine.h. */

/* Gives each stage layers in proportion to its speed, within its memory:
 * layer_bytes per layer (weights + KV), embed_bytes on stage 0 and head_bytes
 * on the last stage count against memory, and their time (embed_seconds,
 * head_seconds, in units of the stage's own seconds_per_layer) against speed,
 * so stages holding a large embedding or classifier get fewer layers. Every
 * stage gets at least one layer. Fails, naming the stage, when the model does
 * not fit. */
int vks_partition_auto(int n_layers, int n_stages, const vks_stage_measure *m, uint64_t layer_bytes,
                       uint64_t embed_bytes, uint64_t head_bytes, double embed_layers, double head_layers,
                       int *first);
/* "[0,3) [3,5)" style description into buf. */
void vks_partition_describe(const int *first, int n_stages, char *buf, size_t len);
#endif
