/* vks_common.h: error codes, dtypes and small helpers shared by every module. */
#ifndef VKS_COMMON_H
#define VKS_COMMON_H
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <stdbool.h>

/* Return codes. Functions return VKS_OK (0) or a negative code and fill an
 * error message retrievable with vks_last_error(). */
enum {
    VKS_OK = 0,
    VKS_ERR_IO = -1,        /* file could not be opened / read / mapped */
    VKS_ERR_FORMAT = -2,    /* hostile or malformed input */
    VKS_ERR_NOMEM = -3,     /* host or device allocation failed / does not fit */
    VKS_ERR_GPU = -4,       /* Vulkan call failed */
    VKS_ERR_ARG = -5,       /* caller passed an invalid argument */
    VKS_ERR_TIMEOUT = -6,   /* a peer (MPI rank) stayed silent past the timeout */
    VKS_ERR_PEER = -7,      /* a peer (MPI rank) the job needs refused its part (the CLI: status 3, as silence) */
};

/* Weight element types. Numbering is stable (stored in files later). */
typedef enum {
    VKS_DTYPE_F32 = 0,
    VKS_DTYPE_F16 = 1,
    VKS_DTYPE_BF16 = 2,
    /* llama.cpp block formats: see include/vkswarm/vks_quant.h */
    VKS_DTYPE_Q8_0 = 3, /* 32 elements: f16 d, int8 q[32]                 (34 bytes)  */
    VKS_DTYPE_Q4_0 = 4, /* 32 elements: f16 d, uint8 nibbles[16]          (18 bytes)  */
    VKS_DTYPE_Q4_K = 5, /* 256 elements: f16 d, f16 dmin, scales[12], q[128] (144 bytes) */
    VKS_DTYPE_Q6_K = 6, /* 256 elements: ql[128], qh[64], int8 scales[16], f16 d (210 bytes) */
    VKS_DTYPE_COUNT
} vks_dtype;

/* RoPE pairings (model configs, the rope kernel and its reference). */
enum { VKS_ROPE_ADJACENT = 0, /* (2i, 2i+1) as llama2.c / GGUF */
       VKS_ROPE_HALF = 1 };   /* (i, i + head_dim/2) as Hugging Face */

const char *vks_dtype_name(vks_dtype t);
/* Parses "f32", "f16", "bf16"; returns 0 and sets *out, or -1. */
int vks_dtype_parse(const char *s, vks_dtype *out);
size_t vks_dtype_size(vks_dtype t); /* bytes per element; 0 for block formats */

/* Thread-local last error message (one line, no trailing newline). */
const char *vks_last_error(void);
/* Sets the last error (printf-style) and returns code. The arguments may
 * point into the current message (vks_last_error()). Bytes a terminal could
 * act on (control characters, invalid UTF-8) are escaped as \xHH, so strings
 * from files can be passed as they are. */
int vks_set_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Puts "<context>: " in front of the current message and returns code:
 * vks_error_prefix(rc, "%s", path) after a call that failed. */
int vks_error_prefix(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Copies `in` (len bytes) to out (cap bytes, always NUL-terminated when
 * cap > 0), escaping C0/C1 control characters, DEL, NUL and invalid UTF-8
 * as \xHH; valid printable UTF-8 passes unchanged and backslashes are kept,
 * so escaping twice changes nothing. Output that does not fit is cut at a
 * character boundary and ends in "...". Returns strlen(out). */
size_t vks_escape(const char *in, size_t len, char *out, size_t cap);

/* Decodes the UTF-8 character at s[0..len): returns its length (1-4) and sets
 * *cp (when not NULL), or 0 for an invalid, overlong or truncated sequence,
 * a surrogate or a code point beyond U+10FFFF. */
size_t vks_utf8_decode(const char *s, size_t len, uint32_t *cp);

/* ---- files written whole or not at all ----
 * A writer opens a temporary file beside `path` (same directory, so the
 * rename is atomic), writes, and commits: flush, fsync, rename over `path`,
 * fsync the directory. Until the commit `path` is untouched (an input being
 * read from `path`, even mapped, stays intact); abort removes the temporary.
 * mode is the new file's permission (before umask), e.g. 0644 or 0600.
 * A `path` that names a device or FIFO (/dev/null, /dev/stdout) is written
 * in place (it cannot be replaced); a symbolic link is replaced, not followed. */
typedef struct vks_outfile {
    FILE *f;    /* write here (stdio), or to fileno(f) with write(2): not both */
    char *path; /* final name */
    char *tmp;  /* temporary name */
} vks_outfile;
int vks_outfile_open(vks_outfile *o, const char *path, unsigned mode);
/* Checks every earlier write (ferror), then flush, fsync, rename. On failure
 * the temporary is removed, `path` is left as it was, and a message naming
 * `path` is set. Always releases o. */
int vks_outfile_commit(vks_outfile *o);
/* Commits n files as a set: every one is checked, flushed and synced before
 * any is renamed, so a failure (full disk) leaves every path as it was.
 * noreplace: a path that exists is refused ("exists") instead of replaced,
 * and the set's files already placed are removed again. Always releases o[]. */
int vks_outfile_commit_all(vks_outfile *o, size_t n, bool noreplace);
/* Ends a write: commits when ok; else (a write failed, errno tells why)
 * drops the temporary and sets "<path>: write failed: <reason>". */
int vks_outfile_finish(vks_outfile *o, bool ok);
/* Drops the temporary; safe on a zeroed or already released o. */
void vks_outfile_abort(vks_outfile *o);

/* Reads the whole file at path into *out (malloc'd, *len bytes, the caller
 * frees it). Errors name the file: VKS_ERR_IO when it cannot be opened or
 * read (a directory: "cannot read: Is a directory"), VKS_ERR_NOMEM when it
 * holds more than `most` bytes or memory runs out ("too large to read"). */
int vks_file_read_all(const char *path, size_t most, char **out, size_t *len);

/* Opens path read-only (flags adds e.g. O_NOFOLLOW) without blocking on a
 * FIFO or device: O_NONBLOCK, dropped again once fstat shows a regular file.
 * Returns the descriptor (the caller still checks fstat: a FIFO or device
 * comes back open, non-blocking) or -1 with errno set. */
int vks_open_read(const char *path, int flags);
/* fopen(path, "rb") of a file that must be regular (a model's, tokenizer's
 * or checkpoint's file): a FIFO, device or directory is refused without
 * blocking. Errors: VKS_ERR_IO "PATH: cannot open: <reason>" (errno kept),
 * VKS_ERR_FORMAT "PATH: not a regular file". */
int vks_fopen_regular(const char *path, FILE **out);

/* Scalar conversions (round to nearest even; NaN stays NaN). */
float vks_f16_to_f32(uint16_t h);
uint16_t vks_f32_to_f16(float f);
float vks_bf16_to_f32(uint16_t h);
uint16_t vks_f32_to_bf16(float f);

/* Seconds on the monotonic clock (for intervals and deadlines). */
double vks_seconds_now(void);

/* Lower-case hex of a 32-byte hash (BLAKE2b-256) into out[65]. */
void vks_hash_hex(const uint8_t hash[32], char out[65]);
/* The 32 bytes of a 64-digit hex string (either case); -1 on anything else. */
int vks_hash_parse_hex(const char *s, uint8_t out[32]);

/* Overflow-checked size arithmetic: return false on overflow. */
static inline bool vks_mul_size(size_t a, size_t b, size_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool vks_add_size(size_t a, size_t b, size_t *out) {
    return !__builtin_add_overflow(a, b, out);
}

#endif
