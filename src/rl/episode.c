/* episode.c: multi-turn episodes of environment tasks (vks_tasks.h) on one engine, for eval and tasks filter
 * (task_run.c) and RL (rl_rollouts.c): each episode started from its environment's reset, then turned
 * together with the others still going (one vks_generate per turn, each episode with its own sampler
 * sequence index), each turn stepped through its environment and the reply appended as input tokens. */
#include "vkswarm/vks_tasks.h"
#include "vkswarm/vks_tokenizer.h"
#include "task_internal.h"

#include <stdlib.h>
#include <string.h>

void vks_episode_free(vks_episode *x) {
    vks_env_episode_free(&x->ep);
    free(x->ids), free(x->logp), free(x->trained);
    free(x->partial);
    memset(x, 0, sizeof *x);
}

/* Appends n tokens: the assistant's (trained, with their sampler log-probabilities logp, NULL: 0) or input. */
static int append_ids(vks_episode *x, const int32_t *ids, const float *logp, bool trained, int n) {
    size_t cap = (size_t)(x->n_ids + n + 1);
    int32_t *v = realloc(x->ids, sizeof *v * cap);
    if (v) x->ids = v;
    float *l = v ? realloc(x->logp, sizeof *l * cap) : NULL;
    if (l) x->logp = l;
    uint8_t *t = l ? realloc(x->trained, cap) : NULL;
    if (!t) return vks_set_error(VKS_ERR_NOMEM, "tasks: out of memory");
    x->trained = t;
    memcpy(v + x->n_ids, ids, sizeof *v * (size_t)n);
    for (int k = 0; k < n; k++) l[x->n_ids + k] = logp ? logp[k] : 0.0f, t[x->n_ids + k] = trained;
    x->n_ids += n;
    return VKS_OK;
}

/* Messages [0, n) of ep as the roles and contents vks_prompt_episode_* take (malloc'd arrays). */
static int episode_messages(const vks_env_episode *ep, int n, const char ***roles, const char ***contents) {
    *roles = malloc(sizeof **roles * (size_t)(n ? n : 1));
    *contents = malloc(sizeof **contents * (size_t)(n ? n : 1));
    if (!*roles || !*contents) return vks_set_error(VKS_ERR_NOMEM, "tasks: out of memory");
    for (int i = 0; i < n; i++) (*roles)[i] = ep->m[i].role, (*contents)[i] = ep->m[i].content;
    return VKS_OK;
}

/* The start's tokens: raw, the start text as a task's prompt; in a chat template, its messages. */
static int start_tokens(const vks_prompt_format *f, const struct vks_tokenizer *tok, const vks_env_episode *ep,
                        int think, int32_t **ids, int *n) {
    char *text = NULL;
    size_t len = 0;
    const char **roles = NULL, **contents = NULL;
    int rc;
    if (!strcmp(f->chat_template, "none")) {
        rc = vks_env_start_text(ep, &text, &len);
        if (!rc) rc = vks_prompt_tokenize(f, tok, text, think, ids, n);
    } else if (think > 0 || strcmp(f->user_template, "{prompt}")) {
        rc = vks_set_error(VKS_ERR_FORMAT, "episodes in a chat template take the environment's messages as they are: "
                           "a user template and a think sentence do not apply");
    } else {
        int start = 0;
        while (start < ep->n && strcmp(ep->m[start].role, "assistant")) start++;
        rc = episode_messages(ep, start, &roles, &contents);
        if (!rc) rc = vks_prompt_episode_start(f, tok, roles, contents, start, ids, n);
    }
    free(text), free(roles), free(contents);
    return rc;
}

/* The tokens of the environment's reply: messages [from, ep->n) after the turn at from - 1 (ended by stop). */
static int reply_tokens(const vks_prompt_format *f, const struct vks_tokenizer *tok, const vks_env_episode *ep,
                        int from, int32_t stop, int32_t **ids, int *n) {
    char *text = NULL;
    size_t len = 0;
    const char **roles = NULL, **contents = NULL;
    int rc;
    if (!strcmp(f->chat_template, "none")) {
        vks_tokenize_options to = {.add_bos = false, .parse_special = false};
        rc = vks_env_reply_text(ep, from, ep->n, &text, &len);
        if (!rc) rc = vks_tokenizer_tokenize(tok, text, len, &to, ids, n);
    } else {
        rc = episode_messages(ep, ep->n, &roles, &contents);
        if (!rc) rc = vks_prompt_episode_reply(f, tok, roles, contents, ep->n, stop, ids, n);
    }
    free(text), free(roles), free(contents);
    return rc;
}

/* Episode of sample `sample` (its global index, also its environment seed): reset, its start as a prompt. */
int vks_episode_start(const vks_prompt_format *f, const struct vks_tokenizer *tok, int vocab, int context,
                      const vks_task *t, uint64_t seed, int think, vks_episode *x) {
    memset(x, 0, sizeof *x);
    int32_t *ids = NULL;
    int n = 0, rc = vks_env_reset(t, seed, &x->ep);
    if (!rc) rc = start_tokens(f, tok, &x->ep, think, &ids, &n);
    for (int k = 0; !rc && k < n; k++)
        if (ids[k] < 0 || ids[k] >= vocab)
            rc = vks_set_error(VKS_ERR_FORMAT, "token %d outside the model's vocabulary", (int)ids[k]);
    if (!rc && n >= context)
        rc = vks_set_error(VKS_ERR_FORMAT, "the start's %d tokens leave no room in the context of %d", n, context);
    if (!rc) rc = append_ids(x, ids, NULL, false, n);
    free(ids);
    x->n_start = x->n_ids;
    return rc ? vks_error_prefix(rc, "task %lld", (long long)t->line) : VKS_OK;
}

int vks_episode_start_text(const vks_prompt_format *f, const struct vks_tokenizer *tok, int vocab, int context,
                           const vks_task *t, uint64_t seed, int think, char **text, size_t *len) {
    vks_episode x;
    *text = NULL, *len = 0;
    int rc = vks_episode_start(f, tok, vocab, context, t, seed, think, &x);
    int skip = !rc && x.n_ids > 0 && x.ids[0] == vks_tokenizer_bos(tok);
    if (!rc) rc = vks_tokenizer_detokenize(tok, x.ids + skip, x.n_ids - skip, true, text, len);
    vks_episode_free(&x);
    return rc;
}

int vks_episode_take_turn(const vks_prompt_format *f, const struct vks_tokenizer *tok, const vks_task *t, int max_new,
                          int context, vks_episode *x, const vks_sequence *s) {
    int n_new = s->n_ids - s->n_prompt, stopped = s->stop_token >= 0, room = max_new - (x->n_ids - x->n_start);
    bool cut = !stopped || n_new + stopped > room;
    if (cut && n_new > room) n_new = room; /* what the budget holds */
    char *text = NULL;
    size_t len = 0;
    x->generated += n_new + (cut ? 0 : stopped);
    int rc = vks_tokenizer_detokenize(tok, s->ids + s->n_prompt, n_new, false, &text, &len);
    if (!rc) rc = append_ids(x, s->ids + s->n_prompt, s->logp, true, n_new);
    if (rc || cut) { /* inside the turn: never stepped */
        if (rc) free(text);
        else x->partial = text, x->over = true;
        return rc;
    }
    int before = x->ep.n;
    rc = vks_env_step(t, &x->ep, text, len);
    free(text);
    if (!rc) rc = append_ids(x, &s->stop_token, s->logp ? s->logp + n_new : NULL, true, 1);
    if (rc || (x->over = x->ep.done)) return rc;
    int32_t *ids = NULL;
    int n = 0;
    rc = reply_tokens(f, tok, &x->ep, before + 1, s->stop_token, &ids, &n);
    for (int k = 0; !rc && k < n; k++)
        if (ids[k] < 0 || ids[k] >= vks_tokenizer_vocab_size(tok)) rc = vks_set_error(VKS_ERR_FORMAT, "a reply's token");
    if (!rc && (x->n_ids + n - x->n_start >= max_new || x->n_ids + n >= context)) x->over = true; /* no room to answer */
    else if (!rc) rc = append_ids(x, ids, NULL, false, n);
    if (!rc && x->ep.turns >= vks_env_max_turns(t)) x->over = true;
    free(ids);
    return rc;
}

int vks_episode_replay_turn(const vks_prompt_format *f, const struct vks_tokenizer *tok, const vks_task *t, int max_new,
                            int context, vks_episode *x, const int32_t *turn, int n) {
    int32_t stop = vks_tokenizer_eos(tok);
    int stopped = n > 0 && turn[n - 1] == stop;
    vks_sequence q = {.n_prompt = x->n_ids, .n_ids = x->n_ids + n - stopped, .stop_token = stopped ? stop : -1};
    if (n < 0 || !(q.ids = malloc(sizeof(int32_t) * (size_t)(x->n_ids + n + 1))))
        return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    memcpy(q.ids, x->ids, sizeof(int32_t) * (size_t)x->n_ids);
    memcpy(q.ids + x->n_ids, turn, sizeof(int32_t) * (size_t)n);
    int rc = vks_episode_take_turn(f, tok, t, max_new, context, x, &q);
    free(q.ids);
    return rc;
}

int vks_episode_text(const vks_episode *x, char **out, size_t *len) {
    int from = 0;
    while (from < x->ep.n && strcmp(x->ep.m[from].role, "assistant")) from++;
    size_t n = x->partial ? strlen(x->partial) : 0;
    for (int i = from; i < x->ep.n; i++) n += x->ep.m[i].len + 1;
    char *t = malloc(n + 1), *at = t;
    if (!t) return vks_set_error(VKS_ERR_NOMEM, "tasks: out of memory");
    for (int i = from; i < x->ep.n; i++) {
        memcpy(at, x->ep.m[i].content, x->ep.m[i].len), at += x->ep.m[i].len;
        *at++ = '\n';
    }
    if (x->partial) memcpy(at, x->partial, strlen(x->partial)), at += strlen(x->partial);
    *at = 0;
    *out = t, *len = (size_t)(at - t);
    return VKS_OK;
}

/* One turn of every episode still going, generated together (each with its own sampler sequence index: results
 * do not depend on which others are still going, nor on the batch size). */
static int episode_turn(vks_engine *e, const vks_generate_options *go, const vks_prompt_format *f,
                        const struct vks_tokenizer *tok, const vks_task *const *tasks, const uint32_t *seq_index,
                        int count, int max_new, int context, const vks_episode_hooks *hooks, int turn,
                        vks_episode *xs, vks_sequence *seqs, uint32_t *index, int *which) {
    int k = 0, rc = VKS_OK;
    for (int b = 0; b < count && !rc; b++) {
        if (xs[b].over) continue;
        if (xs[b].n_ids >= context - 1) { /* the context is full */
            xs[b].over = true;
            continue;
        }
        seqs[k] = (vks_sequence){.n_prompt = xs[b].n_ids, .n_ids = xs[b].n_ids, .stop_token = -1};
        seqs[k].ids = malloc(sizeof(int32_t) * (size_t)xs[b].n_ids);
        if (!seqs[k].ids) rc = vks_set_error(VKS_ERR_NOMEM, "tasks: out of memory");
        else memcpy(seqs[k].ids, xs[b].ids, sizeof(int32_t) * (size_t)xs[b].n_ids);
        index[k] = seq_index[b], which[k++] = b;
    }
    vks_generate_options g = *go;
    g.seq_index = index;
    int last = 0; /* the furthest position a turn may reach: the budget of the episode that started latest */
    for (int i = 0; i < k; i++)
        if (xs[which[i]].n_start + max_new - 1 > last) last = xs[which[i]].n_start + max_new - 1;
    g.sched.steps = last < context ? last : context;
    if (!rc && k && hooks && hooks->before) rc = hooks->before(hooks->ctx, turn, &g, k);
    if (!rc && k) rc = vks_generate(e, &g, seqs, k, 0);
    if (!rc && k && hooks && hooks->generated) rc = hooks->generated(hooks->ctx, turn, seqs, index, which, k);
    for (int i = 0; !rc && i < k; i++)
        rc = vks_episode_take_turn(f, tok, tasks[which[i]], max_new, context, &xs[which[i]], &seqs[i]);
    if (!rc && k && hooks && hooks->stepped) hooks->stepped(hooks->ctx, turn, xs, count);
    for (int i = 0; i < k; i++) vks_sequence_free(&seqs[i]);
    return rc;
}

int vks_episodes_run(vks_engine *e, const vks_generate_options *go, const vks_prompt_format *f,
                     const struct vks_tokenizer *tok, const vks_task *const *tasks, const uint32_t *seq_index,
                     int count, int max_new, const vks_episode_hooks *hooks, vks_episode *xs) {
    vks_sequence *seqs = calloc((size_t)count, sizeof *seqs);
    uint32_t *index = calloc((size_t)count, sizeof *index);
    int *which = calloc((size_t)count, sizeof *which);
    int rc = seqs && index && which ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "tasks: out of memory");
    for (int turn = 0; turn <= VKS_ENV_MAX_TURNS && !rc; turn++) /* each turn ends some: at most max_turns */
        rc = episode_turn(e, go, f, tok, tasks, seq_index, count, max_new, go->sched.steps, hooks, turn, xs, seqs,
                          index, which);
    free(seqs), free(index), free(which);
    return rc;
}
