/* Helpers shared by the cmocka suites. */
#ifndef VKS_TEST_UTIL_H
#define VKS_TEST_UTIL_H
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdbool.h>
#include <cmocka.h>
#include "vkswarm/vks_common.h"

/* Path of ../shared/models/<rel> or NULL (and a printed skip reason) when absent.
 * Uses $VKSWARM_SHARED, else ../shared relative to the source tree. Static buffer. */
const char *tu_shared_path(const char *rel);
/* Reads a whole file; returns malloc'd bytes (NUL-terminated) and *len; NULL if missing. */
unsigned char *tu_read_file(const char *path, size_t *len);
/* Normalized mean squared error: sum((a-b)^2) / max(sum(b^2), tiny). */
double tu_nmse(const float *a, const float *ref, size_t n);
/* True if any element is NaN or Inf. */
bool tu_has_nonfinite(const float *a, size_t n);
/* Deterministic uniform floats in [lo, hi). */
void tu_fill_uniform(float *x, size_t n, uint64_t seed, float lo, float hi);
/* The default Vulkan device, with the validation layer when VKSWARM_VALIDATION
 * is set; NULL (and the reason on stderr) when it cannot be opened. */
struct vks_gpu *tu_gpu_open(void);
/* Weights [rows, cols] in dtype's GPU layout (vks_op_pack_weights; f16/bf16
 * two per word): returns the malloc'd bytes and their count in *bytes, and
 * rounds w in place to the values the GPU decodes (block types:
 * quantize then vks_dequantize), so w is the reference. Fails the test on
 * error. */
void *tu_pack_weights(float *w, size_t rows, size_t cols, vks_dtype t, size_t *bytes);
/* VKSWARM_TEST_SHORT set (and not "0"): the slowest cases take fewer steps.
 * tools/test sets it for the ASan run only, where the code paths matter and
 * the normal build has already run the full cases. */
bool tu_test_short(void);
/* VKSWARM_TEST_SKIP: comma-separated shell patterns (fnmatch) of case names
 * that a table-driven suite leaves out, saying so on stderr. The wide-lane
 * copies of the kernel suites use it (tests/meson.build says which and why). */
bool tu_case_skipped(const char *name);
/* RoPE frequencies of theta and head_dim <= 512 (vks_rope_freqs, no scaling);
 * static buffers overwritten by the next call: doubles, and the same as f32. */
const double *tu_rope_freqs(double theta, int head_dim);
/* The GPU kernels' RoPE table (vks_rope_table) of theta, head_dim and n_pos
 * positions: malloc'd n_pos * head_dim floats. */
float *tu_rope_table(double theta, int head_dim, int n_pos);
/* Makes a fresh temporary directory; returns static path. */
const char *tu_tmpdir(void);
/* The vkswarm binary under test: $VKSWARM_BIN, else the build's (its path is
 * compiled in: tests/meson.build), so a suite runs from any directory. */
const char *tu_bin(void);
/* The source tree: $VKSWARM_SOURCE, else the one this build came from. */
const char *tu_source(void);
/* Runs a shell command and reads its stdout: into *out (malloc'd,
 * NUL-terminated) when out is not NULL, else discarded. Returns the exit
 * status, or 128 when the command did not exit normally. */
int tu_run(const char *cmd, char **out);
#endif
