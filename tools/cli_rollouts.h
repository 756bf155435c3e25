/* Rollout files from generation (`generate` and `pipeline` --rollouts-out):
 * committed rows go to a TOPLOC builder thread as they come back from the
 * GPU; the file is written once generation ends. */
#ifndef VKS_CLI_ROLLOUTS_H
#define VKS_CLI_ROLLOUTS_H
#include "vkswarm/vks_engine.h"
#include "vkswarm/vks_sched.h"

typedef struct cli_rollouts cli_rollouts;

/* Checks that `path` can be created (exit 2 if not; it is written through a
 * temporary at the end, and on failure nothing stays) for n_seqs sequences generated
 * with `sp`; toploc false writes empty proofs (for measuring their cost). */
cli_rollouts *cli_rollouts_start(const char *path, const vks_model *m, const char *model_name,
                                 const vks_sched_params *sp, int n_seqs, bool toploc);
/* The vks_generate_options.on_hidden hook body: pushes each live row. */
void cli_rollouts_on_hidden(cli_rollouts *r, const vks_step *st, const vks_seq_state *states, const float *hidden);
/* Writes the header and one sample per sequence (output ids: the generated
 * ids, then the stop token when one ended it); seq index i + seq_base. Proofs
 * come from this writer's builder, else from seqs[i].proofs (pipeline). */
void cli_rollouts_finish(cli_rollouts *r, const vks_sequence *seqs, int n, uint32_t seq_base);
#endif
