/* Table of embedded SPIR-V kernels (generated source: shaders/spirv_table.c.in). */
#ifndef VKS_SPIRV_TABLE_H
#define VKS_SPIRV_TABLE_H
#include <stddef.h>
#include <stdint.h>
typedef struct { const char *name; const uint32_t *code; size_t bytes; } vks_spirv_blob;
extern const vks_spirv_blob vks_spirv_table[]; /* terminated by name == NULL */
#endif
