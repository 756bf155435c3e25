#ifndef VKS_RL_BANS_H
#define VKS_RL_BANS_H
/* A run's bans (issue 37): the identities (Ed25519 public keys) of joined
 * ranks refused for what they sent. The trainer keeps them in OUT/bans.jsonl,
 * rewritten whole at each ban, so that a resumed run (rl --resume) refuses
 * them too. One JSON object a line:
 *   {"key": "<64 hex digits>", "step": N, "reason": "..."}
 * The file is input like any other: at most VKS_RL_BANS_MAX lines, each
 * checked; a reason is kept escaped (vks_escape), cut to fit. */
#include <stdint.h>

#define VKS_RL_BANS_FILE "bans.jsonl"
#define VKS_RL_BANS_MAX 100000
#define VKS_RL_BAN_REASON_MAX 320 /* bytes with the NUL */

typedef struct {
    uint8_t key[32];
    int64_t step; /* the policy step when it was banned */
    char reason[VKS_RL_BAN_REASON_MAX];
} vks_rl_ban;

/* Reads path: *bans (malloc'd, the caller frees it; NULL when none) and *n.
 * A missing file holds no bans. A malformed one is refused naming the file
 * and the line. */
int vks_rl_bans_load(const char *path, vks_rl_ban **bans, int *n);
/* Writes bans[0..n) to path (a temporary, renamed when complete). */
int vks_rl_bans_save(const char *path, const vks_rl_ban *bans, int n);

#endif
