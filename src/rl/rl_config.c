/* rl_config.c: an RL run's configuration (vks_rl_config.h): one table of
 * keys used by the JSON reader and by KEY=VALUE, then the role checks. */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include "vkswarm/vks_lora.h"
#include "vkswarm/vks_rl_config.h"
#include "vkswarm/vks_tasks.h"

typedef enum { KEY_INT, KEY_DOUBLE, KEY_U64, KEY_STRING } key_type;

typedef struct {
    const char *name;
    key_type type;
    size_t offset, size; /* size: strings' capacity */
    double lo, hi;       /* numbers: the allowed range */
    bool zero_too;       /* numbers: 0 (automatic) allowed beside [lo, hi] */
} key_info;

#define MAX_TOKENS (1 << 20) /* max_new_tokens and length_targets */

#define INT_KEY(f, lo, hi) {#f, KEY_INT, offsetof(vks_rl_config, f), 0, lo, hi, false}
#define DBL_KEY(f, lo, hi) {#f, KEY_DOUBLE, offsetof(vks_rl_config, f), 0, lo, hi, false}
#define ZERO_OR_DBL_KEY(f, lo, hi) {#f, KEY_DOUBLE, offsetof(vks_rl_config, f), 0, lo, hi, true}
#define STR_KEY(f) {#f, KEY_STRING, offsetof(vks_rl_config, f), sizeof(((vks_rl_config *)0)->f), 0, 0, false}

static const key_info keys[] = {
    STR_KEY(task), STR_KEY(init), STR_KEY(model), STR_KEY(out), STR_KEY(shardcast_key), STR_KEY(eval_tasks),
    DBL_KEY(eval_split, 0, 0.99),
    INT_KEY(steps, 1, 1e8), INT_KEY(prompts_per_step, 1, 65536), INT_KEY(group_size, 2, 1024),
    INT_KEY(async_level, 0, 64), INT_KEY(max_new_tokens, 1, MAX_TOKENS), INT_KEY(save_every, 0, 1e8), INT_KEY(keep, 0, 1e6),
    INT_KEY(warmup, 0, 1e8), INT_KEY(max_off_policy_steps, 0, 1e6), INT_KEY(probation_batches, 0, 1e8),
    DBL_KEY(temperature, 0, 100), DBL_KEY(lr, 0, 10), DBL_KEY(length_penalty, 0, 1e3), ZERO_OR_DBL_KEY(token_budget, 1, 1e12), /* a token count: 1e-300 is no divisor */
    DBL_KEY(entropy_coef, 0, 10), DBL_KEY(verify_sample, 0, 1),
    {"seed", KEY_U64, offsetof(vks_rl_config, seed), 0, 0, 0, false},
};

static const vks_rl_loss default_loss = {VKS_LOSS_INTELLECT2, VKS_NORMALIZE_BUDGET, VKS_GRPO_DELTA, VKS_GRPO_EPS, VKS_DAPO_EPS_LOW,
                                         VKS_DAPO_EPS_HIGH, VKS_DPPO_MASK, VKS_DPPO_MASK, VKS_IPO_THRESHOLD, 1.0,
                                         VKS_DPPO_KL_TAU, VKS_GSPO_EPS_LOW, VKS_GSPO_EPS_HIGH, VKS_BEHAV_CAP, false};
static const vks_rl_buffer default_buffer = {.easy_threshold = 0.75, .hard_threshold = 0.25, .easy_weight = 0.2,
                                             .normal_weight = 1.0, .hard_weight = 0.2};

void vks_rl_config_defaults(vks_rl_config *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->task, sizeof c->task, "add:2");
    snprintf(c->init, sizeof c->init, "tiny");
    snprintf(c->out, sizeof c->out, "rl-out");
    c->steps = 50;
    c->prompts_per_step = 8;
    c->group_size = 8;
    c->async_level = 2;
    c->max_off_policy_steps = VKS_RL_MAX_OFF_POLICY_STEPS;
    c->probation_batches = VKS_RL_PROBATION_BATCHES;
    c->save_every = 10;
    c->keep = 3;
    c->max_new_tokens = 48;
    c->temperature = 1.0;
    c->lr = 1e-4;
    c->seed = 1;
    c->length_penalty = 3e-4;
    c->trainer = -1; /* required once roles are given */
    vks_prompt_format_default(&c->prompt);
    c->lora_alpha = VKS_LORA_DEFAULT_ALPHA;
    c->lora_targets = VKS_LORA_ALL_TARGETS;
    c->loss = default_loss;
    c->advantage = VKS_ADVANTAGE_GROUP_STD;
    c->buffer = default_buffer;
}

/* ---- "loss" and "advantage" ---- */

/* A block's number knobs ("loss", "buffer"): each a double of the block's struct at offset, in [lo, hi]. */
typedef struct { const char *name; size_t offset; double lo, hi; } knob_key;
typedef struct { const char *block; const knob_key *keys; size_t n; } knob_table;

static double knob(const knob_table *t, const void *base, size_t i) {
    return *(const double *)((const char *)base + t->keys[i].offset);
}

/* t->block.k = v (text), checked against its range; an unknown k is named. */
static int set_knob(const knob_table *t, void *base, const char *k, const char *v, const char *where) {
    for (size_t i = 0; i < t->n; i++) {
        if (strcmp(k, t->keys[i].name)) continue;
        char *end;
        errno = 0;
        double x = strtod(v, &end);
        if (end == v || *end || errno || !isfinite(x) || x < t->keys[i].lo || x > t->keys[i].hi)
            return vks_set_error(VKS_ERR_FORMAT, "%s: %s.%s must be a number in [%g, %g]", where, t->block, k,
                                 t->keys[i].lo, t->keys[i].hi);
        *(double *)((char *)base + t->keys[i].offset) = x;
        return VKS_OK;
    }
    return vks_set_error(VKS_ERR_FORMAT, "%s: unknown key '%s.%.40s'", where, t->block, k);
}

static bool knobs_equal(const knob_table *t, const void *a, const void *b) {
    for (size_t i = 0; i < t->n; i++)
        if (knob(t, a, i) != knob(t, b, i)) return false;
    return true;
}

static void put_knobs(json_t *o, const knob_table *t, const void *base) {
    for (size_t i = 0; o && i < t->n; i++) json_object_set_new(o, t->keys[i].name, json_real(knob(t, base, i)));
}

#define LOSS_KEY(f, lo, hi) {#f, offsetof(vks_rl_loss, f), lo, hi}
static const knob_key loss_keys[] = {
    LOSS_KEY(delta, 1, 1e6),        LOSS_KEY(eps, 0, 0.999),          LOSS_KEY(eps_low, 0, 1),
    LOSS_KEY(eps_high, 0, 1e6),     LOSS_KEY(dppo_mask_low, 0, 1),    LOSS_KEY(dppo_mask_high, 0, 1),
    LOSS_KEY(ipo_threshold, 0, 1),  LOSS_KEY(adv_tau, 0, 1e6),        LOSS_KEY(kl_tau, 0, 1e6),
    LOSS_KEY(gspo_eps_low, 0, 1),   LOSS_KEY(gspo_eps_high, 0, 1e6),  LOSS_KEY(behav_cap, 1, 1e6),
};
static const knob_table loss_knobs = {"loss", loss_keys, sizeof loss_keys / sizeof loss_keys[0]};

static const char *const advantage_names[] = {"group_std", "group_mean", NULL};
static const char *const normalize_names[] = {"budget", "tokens", "sequence", NULL};
static const char *const behav_weight_names[] = {"mask", "truncate", NULL};

const char *vks_loss_normalize_name(vks_loss_normalize n) {
    return (unsigned)n < 3 ? normalize_names[n] : NULL;
}

const char *vks_advantage_type_name(vks_advantage_type t) {
    return (unsigned)t < 2 ? advantage_names[t] : NULL;
}

/* The index of v among names (NULL-terminated); else an error naming the key and
 * listing them ("loss.normalize 'x' is not budget, tokens or sequence"). */
static int name_index(const char *const *names, const char *key, const char *v, const char *where, int *index) {
    char list[256] = "";
    for (int i = 0; names[i]; i++) {
        if (!strcmp(v, names[i])) {
            *index = i;
            return VKS_OK;
        }
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", !i ? "" : names[i + 1] ? ", " : " or ",
                 names[i]);
    }
    return vks_set_error(VKS_ERR_FORMAT, "%s: %s '%.40s' is not %s", where, key, v, list);
}

void vks_rl_loss_params(const vks_rl_config *c, double token_budget, vks_grpo_loss_params *h) {
    const vks_rl_loss *l = &c->loss;
    bool ipo = l->type == VKS_LOSS_IPO, gspo = l->type == VKS_LOSS_GSPO;
    *h = (vks_grpo_loss_params){.delta = l->delta, .eps = l->eps, .token_budget = token_budget,
                                .entropy_coef = c->entropy_coef, .type = l->type,
                                .eps_low = gspo ? l->gspo_eps_low : l->eps_low,
                                .eps_high = gspo ? l->gspo_eps_high : l->eps_high, .mask_low = ipo ? l->ipo_threshold : l->dppo_mask_low,
                                .mask_high = ipo ? l->ipo_threshold : l->dppo_mask_high, .adv_tau = l->adv_tau,
                                .kl_tau = l->kl_tau, .behav_cap = l->behav_cap, .behav_truncate = l->behav_truncate};
}

/* loss.KEY = text (--set, and the JSON reader's numbers as text). */
static int set_loss(vks_rl_config *c, const char *k, const char *v, const char *where) {
    int i = 0, rc = VKS_OK;
    if (!strcmp(k, "type")) {
        const char *types[VKS_LOSS_TYPE_COUNT + 1] = {NULL};
        for (int t = 0; t < VKS_LOSS_TYPE_COUNT; t++) types[t] = vks_loss_type_name((vks_loss_type)t);
        if (!(rc = name_index(types, "loss.type", v, where, &i))) c->loss.type = (vks_loss_type)i;
        return rc;
    }
    if (!strcmp(k, "normalize")) {
        if (!(rc = name_index(normalize_names, "loss.normalize", v, where, &i))) c->loss.normalize = (vks_loss_normalize)i;
        return rc;
    }
    if (!strcmp(k, "behav_weight")) {
        if (!(rc = name_index(behav_weight_names, "loss.behav_weight", v, where, &i))) c->loss.behav_truncate = i == 1;
        return rc;
    }
    return set_knob(&loss_knobs, &c->loss, k, v, where);
}

static int set_advantage(vks_rl_config *c, const char *k, const char *v, const char *where) {
    if (strcmp(k, "type")) return vks_set_error(VKS_ERR_FORMAT, "%s: unknown key 'advantage.%.40s'", where, k);
    int i = 0, rc = name_index(advantage_names, "advantage.type", v, where, &i);
    if (!rc) c->advantage = (vks_advantage_type)i;
    return rc;
}

/* buffer.KEY = text: type (simple or difficulty_pool), the thresholds (solve rates in [0, 1]) and the weights. */
#define BUFFER_KEY(f, lo, hi) {#f, offsetof(vks_rl_buffer, f), lo, hi}
static const knob_key buffer_keys[] = {
    BUFFER_KEY(easy_threshold, 0, 1), BUFFER_KEY(hard_threshold, 0, 1), BUFFER_KEY(easy_weight, 0, 1e6),
    BUFFER_KEY(normal_weight, 0, 1e6), BUFFER_KEY(hard_weight, 0, 1e6),
};
static const knob_table buffer_knobs = {"buffer", buffer_keys, sizeof buffer_keys / sizeof buffer_keys[0]};
static const char *const buffer_names[] = {"simple", "difficulty_pool", NULL};

static int set_buffer(vks_rl_config *c, const char *k, const char *v, const char *where) {
    int i = 0, rc = VKS_OK;
    if (!strcmp(k, "type")) {
        if (!(rc = name_index(buffer_names, "buffer.type", v, where, &i))) c->buffer.difficulty_pool = i == 1;
        return rc;
    }
    return set_knob(&buffer_knobs, &c->buffer, k, v, where);
}

static bool buffer_is_default(const vks_rl_config *c) {
    return c->buffer.difficulty_pool == default_buffer.difficulty_pool && knobs_equal(&buffer_knobs, &c->buffer, &default_buffer);
}

static json_t *buffer_object(const vks_rl_config *c) {
    json_t *o = json_pack("{s:s}", "type", buffer_names[c->buffer.difficulty_pool]);
    put_knobs(o, &buffer_knobs, &c->buffer);
    return o;
}

/* "loss": {...}, "advantage": {...} or "buffer": {...}: strings and numbers, each through its setter. */
static int json_block(vks_rl_config *c, const char *name, json_t *o, const char *path,
                      int (*set)(vks_rl_config *, const char *, const char *, const char *)) {
    if (!json_is_object(o)) return vks_set_error(VKS_ERR_FORMAT, "%s: %s must be an object", path, name);
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        char text[64];
        bool is_text = !strcmp(k, "type") || !strcmp(k, "normalize") || !strcmp(k, "behav_weight"); /* names */
        if (is_text ? !json_is_string(v) : !json_is_number(v))
            return vks_set_error(VKS_ERR_FORMAT, "%s: %s.%.40s must be %s", path, name, k, is_text ? "a string" : "a number");
        if (is_text && strlen(json_string_value(v)) != json_string_length(v))
            return vks_set_error(VKS_ERR_FORMAT, "%s: %s.%s holds a NUL character", path, name, k);
        if (!is_text) snprintf(text, sizeof text, "%.17g", json_number_value(v));
        int rc = set(c, k, is_text ? json_string_value(v) : text, path);
        if (rc) return rc;
    }
    return VKS_OK;
}

static bool loss_is_default(const vks_rl_config *c) {
    return c->loss.type == default_loss.type && c->loss.normalize == default_loss.normalize &&
           c->loss.behav_truncate == default_loss.behav_truncate && knobs_equal(&loss_knobs, &c->loss, &default_loss);
}

static json_t *loss_object(const vks_rl_config *c) {
    json_t *o = json_pack("{s:s, s:s, s:s}", "type", vks_loss_type_name(c->loss.type), "normalize",
                          vks_loss_normalize_name(c->loss.normalize), "behav_weight",
                          behav_weight_names[c->loss.behav_truncate]);
    put_knobs(o, &loss_knobs, &c->loss);
    return o;
}

#define N_KEYS (sizeof keys / sizeof keys[0])
/* ---- "reward": reward programs for every task ---- */

/* Stores the "reward" object o (checked as a program task line's program, rubric and options). */
static int put_reward(vks_rl_config *c, json_t *o, const char *where) {
    const char *k;
    json_t *v;
    if (!json_is_object(o)) return vks_set_error(VKS_ERR_FORMAT, "%s: reward must be an object", where);
    json_object_foreach(o, k, v)
        if (strcmp(k, "program") && strcmp(k, "rubric") && strcmp(k, "sandbox") && strcmp(k, "timeout_s"))
            return vks_set_error(VKS_ERR_FORMAT, "%s: unknown key 'reward.%.40s' (program, rubric, sandbox, timeout_s)",
                                 where, k);
    char *text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!text) return vks_set_error(VKS_ERR_NOMEM, "config: out of host memory");
    vks_task_program *p = NULL;
    int rc = vks_task_program_parse(text, "/", &p); /* checked as a task line's */
    free(p);
    if (rc) {
        free(text);
        return vks_error_prefix(rc, "%s: reward", where);
    }
    rc = strlen(text) < sizeof c->reward ? VKS_OK
                                         : vks_set_error(VKS_ERR_FORMAT, "%s: reward is longer than %d bytes as JSON",
                                                         where, VKS_RL_MAX_REWARD - 1);
    if (!rc) memcpy(c->reward, text, strlen(text) + 1);
    free(text);
    return rc;
}

/* reward.KEY = text (--set): program (replacing a rubric), sandbox (true or false), timeout_s. */
static int set_reward(vks_rl_config *c, const char *k, const char *v, const char *where) {
    json_error_t err;
    json_t *o = c->reward[0] ? json_loads(c->reward, 0, &err) : json_object();
    if (!o) return vks_set_error(VKS_ERR_NOMEM, "config: out of host memory");
    int rc = VKS_OK;
    if (!strcmp(k, "program")) {
        json_object_del(o, "rubric");
        json_object_set_new(o, "program", json_string(v));
    } else if (!strcmp(k, "sandbox")) {
        if (strcmp(v, "true") && strcmp(v, "false"))
            rc = vks_set_error(VKS_ERR_FORMAT, "%s: reward.sandbox must be true or false", where);
        else json_object_set_new(o, "sandbox", json_boolean(!strcmp(v, "true")));
    } else if (!strcmp(k, "timeout_s")) {
        char *end;
        double x = strtod(v, &end);
        if (end == v || *end) rc = vks_set_error(VKS_ERR_FORMAT, "%s: reward.timeout_s must be a number", where);
        else json_object_set_new(o, "timeout_s", json_real(x));
    } else {
        rc = vks_set_error(VKS_ERR_FORMAT, "%s: unknown key 'reward.%.40s' (--set takes program, sandbox, timeout_s; a "
                           "rubric goes in the config file)", where, k);
    }
    if (!rc) rc = put_reward(c, o, where);
    json_decref(o);
    return rc;
}

/* bits of vks_rl_config.given: keys[i] is bit i, then these */
#define GIVEN_LORA (1u << 31)
#define GIVEN_LOSS (1u << 27)
#define GIVEN_ADVANTAGE (1u << 26)
#define GIVEN_PROMPT (1u << 28)
#define GIVEN_TARGETS (1u << 29)
#define GIVEN_ROLES (1u << 30)
#define GIVEN_REWARD (1ull << 32)
#define GIVEN_BUFFER (1ull << 33)
_Static_assert(N_KEYS < 26, "vks_rl_config.given has a bit per key");

static const key_info *find_key(const char *name) {
    for (size_t i = 0; i < N_KEYS; i++)
        if (!strcmp(keys[i].name, name)) return &keys[i];
    return NULL;
}

static uint64_t key_bit(const char *name) {
    if (!strcmp(name, "length_targets")) return GIVEN_TARGETS;
    if (!strcmp(name, "prompt") || !strncmp(name, "prompt.", 7)) return GIVEN_PROMPT;
    if (!strcmp(name, "lora") || !strncmp(name, "lora.", 5)) return GIVEN_LORA;
    if (!strcmp(name, "roles") || !strncmp(name, "roles.", 6)) return GIVEN_ROLES;
    if (!strcmp(name, "loss") || !strncmp(name, "loss.", 5)) return GIVEN_LOSS;
    if (!strcmp(name, "advantage") || !strncmp(name, "advantage.", 10)) return GIVEN_ADVANTAGE;
    if (!strcmp(name, "reward") || !strncmp(name, "reward.", 7)) return GIVEN_REWARD;
    if (!strcmp(name, "buffer") || !strncmp(name, "buffer.", 7)) return GIVEN_BUFFER;
    const key_info *k = find_key(name);
    return k ? 1ull << (k - keys) : 0;
}

bool vks_rl_config_given(const vks_rl_config *c, const char *key) { return c && key && (c->given & key_bit(key)); }

void vks_rl_config_mark_given(vks_rl_config *c, const char *key) {
    if (c && key) c->given |= key_bit(key);
}

static int set_number(vks_rl_config *c, const key_info *k, double v, const char *where) {
    bool zero = k->zero_too && v == 0;
    if (!zero && (!isfinite(v) || v < k->lo || v > k->hi || (k->type == KEY_INT && v != floor(v))))
        return vks_set_error(VKS_ERR_FORMAT, "%s: %s must be %s%s in [%g, %g]", where, k->name, k->zero_too ? "0 or " : "",
                             k->type == KEY_INT ? "an integer" : "a number", k->lo, k->hi);
    char *p = (char *)c + k->offset;
    if (k->type == KEY_INT) *(int *)p = (int)v;
    else *(double *)p = v;
    return VKS_OK;
}

static int set_string(vks_rl_config *c, const key_info *k, const char *s, const char *where) {
    if (strlen(s) >= k->size) return vks_set_error(VKS_ERR_FORMAT, "%s: %s is longer than %zu bytes", where, k->name, k->size - 1);
    memcpy((char *)c + k->offset, s, strlen(s) + 1);
    return VKS_OK;
}

/* ---- rank lists ---- */

static int add_rank(int *list, int *n, long r, const char *what, const char *where) {
    if (r < 0 || r >= VKS_RL_MAX_RANKS) return vks_set_error(VKS_ERR_FORMAT, "%s: %s: rank %ld out of range", where, what, r);
    if (*n >= VKS_RL_MAX_RANKS) return vks_set_error(VKS_ERR_FORMAT, "%s: %s: too many ranks", where, what);
    list[(*n)++] = (int)r;
    return VKS_OK;
}

static int start_group(vks_rl_config *c, const char *where) {
    if (c->n_groups >= VKS_RL_MAX_GROUPS) return vks_set_error(VKS_ERR_FORMAT, "%s: more than %d inference groups", where, VKS_RL_MAX_GROUPS);
    c->groups[c->n_groups++] = (vks_rl_group){c->n_inference_ranks, 0};
    return VKS_OK;
}

static int add_inference_rank(vks_rl_config *c, long r, const char *where) {
    int rc = add_rank(c->inference_ranks, &c->n_inference_ranks, r, "roles.inference", where);
    if (!rc) c->groups[c->n_groups - 1].n++;
    return rc;
}

/* "1,2,3" */
static int parse_rank_list(const char *s, int *list, int *n, const char *what, const char *where) {
    *n = 0;
    while (*s) {
        char *end;
        errno = 0;
        long r = strtol(s, &end, 10);
        if (end == s || errno) return vks_set_error(VKS_ERR_FORMAT, "%s: %s: '%s' is not a list of ranks", where, what, s);
        int rc = add_rank(list, n, r, what, where);
        if (rc) return rc;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return vks_set_error(VKS_ERR_FORMAT, "%s: %s: unexpected '%c'", where, what, *end);
    }
    return VKS_OK;
}

/* "1;2,3": groups separated by ';' */
static int parse_groups(vks_rl_config *c, const char *s, const char *where) {
    c->n_groups = c->n_inference_ranks = 0;
    char buf[4096];
    if (strlen(s) >= sizeof buf) return vks_set_error(VKS_ERR_FORMAT, "%s: roles.inference too long", where);
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *g = strtok_r(buf, ";", &save); g; g = strtok_r(NULL, ";", &save)) {
        int ranks[VKS_RL_MAX_RANKS], n, rc;
        if ((rc = parse_rank_list(g, ranks, &n, "roles.inference", where)) || (rc = start_group(c, where))) return rc;
        for (int i = 0; i < n; i++)
            if ((rc = add_inference_rank(c, ranks[i], where))) return rc;
    }
    return VKS_OK;
}

static int parse_one_rank(const char *s, int *out, const char *what, const char *where) {
    int list[VKS_RL_MAX_RANKS], n;
    int rc = parse_rank_list(s, list, &n, what, where);
    if (!rc && n != 1) rc = vks_set_error(VKS_ERR_FORMAT, "%s: %s takes one rank", where, what);
    if (!rc) *out = list[0];
    return rc;
}

/* ---- length_targets: token counts (not ranks) ---- */

static int add_target(vks_rl_config *c, long long v, const char *where) {
    if (c->n_length_targets >= VKS_RL_MAX_LENGTH_TARGETS)
        return vks_set_error(VKS_ERR_FORMAT, "%s: length_targets: more than %d values", where, VKS_RL_MAX_LENGTH_TARGETS);
    if (v < 1 || v > MAX_TOKENS)
        return vks_set_error(VKS_ERR_FORMAT, "%s: length_targets: %lld is not a token count in [1, %d]", where, v, MAX_TOKENS);
    c->length_targets[c->n_length_targets++] = (int)v;
    return VKS_OK;
}

/* "64,128" ("": off) */
static int parse_targets(vks_rl_config *c, const char *s, const char *where) {
    c->n_length_targets = 0;
    while (*s) {
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (end == s || errno || (*end && *end != ','))
            return vks_set_error(VKS_ERR_FORMAT, "%s: length_targets: '%s' is not a list of token counts (like 64,128)", where, s);
        int rc = add_target(c, v, where);
        if (rc) return rc;
        s = *end ? end + 1 : end;
    }
    return VKS_OK;
}

static int json_targets(vks_rl_config *c, json_t *a, const char *path) {
    if (!json_is_array(a)) return vks_set_error(VKS_ERR_FORMAT, "%s: length_targets must be an array of token counts", path);
    c->n_length_targets = 0;
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) {
        if (!json_is_integer(v)) return vks_set_error(VKS_ERR_FORMAT, "%s: length_targets[%zu] is not an integer", path, i);
        int rc = add_target(c, (long long)json_integer_value(v), path);
        if (rc) return rc;
    }
    return VKS_OK;
}

/* lora.rank, lora.alpha, lora.targets from text. */
static int set_lora(vks_rl_config *c, const char *k, const char *v, const char *where) {
    char *end;
    errno = 0;
    if (!strcmp(k, "targets")) {
        int rc = vks_lora_parse_targets(v, &c->lora_targets, "lora.targets");
        return rc ? vks_error_prefix(VKS_ERR_FORMAT, "%s", where) : VKS_OK;
    }
    double x = strtod(v, &end);
    bool ok = end != v && !*end && !errno && isfinite(x);
    if (!strcmp(k, "rank")) {
        if (!ok || x < 0 || x > (1 << 20) || x != floor(x))
            return vks_set_error(VKS_ERR_FORMAT, "%s: lora.rank must be an integer in [0, 1048576]", where);
        c->lora_rank = (int)x;
        return VKS_OK;
    }
    if (!strcmp(k, "alpha")) {
        if (!ok || !(x > 0) || x > 1e6) return vks_set_error(VKS_ERR_FORMAT, "%s: lora.alpha must be in (0, 1e6]", where);
        c->lora_alpha = x;
        return VKS_OK;
    }
    return vks_set_error(VKS_ERR_FORMAT, "%s: unknown key 'lora.%.40s'", where, k);
}

/* "lora": {"rank": 8, "alpha": 32, "targets": "q,v"} */
static int json_lora(vks_rl_config *c, json_t *o, const char *path) {
    if (!json_is_object(o)) return vks_set_error(VKS_ERR_FORMAT, "%s: lora must be an object", path);
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        char text[64];
        if (json_is_string(v) && !strcmp(k, "targets")) {
            int rc = set_lora(c, k, json_string_value(v), path);
            if (rc) return rc;
            continue;
        }
        if (!json_is_number(v) || strcmp(k, "targets") == 0)
            return vks_set_error(VKS_ERR_FORMAT, "%s: lora.%.40s must be %s", path, k,
                                 strcmp(k, "targets") ? "a number" : "a string");
        snprintf(text, sizeof text, "%.17g", json_number_value(v));
        int rc = set_lora(c, k, text, path);
        if (rc) return rc;
    }
    return VKS_OK;
}

int vks_rl_config_set(vks_rl_config *c, const char *assignment) {
    const char *where = "--set";
    const char *eq = assignment ? strchr(assignment, '=') : NULL;
    if (!c || !eq || eq == assignment) return vks_set_error(VKS_ERR_FORMAT, "--set: '%s' is not KEY=VALUE", assignment ? assignment : "");
    char key[64];
    size_t kn = (size_t)(eq - assignment);
    if (kn >= sizeof key) return vks_set_error(VKS_ERR_FORMAT, "--set: unknown key '%.*s'", (int)kn, assignment);
    memcpy(key, assignment, kn);
    key[kn] = 0;
    c->given |= key_bit(key);
    const char *v = eq + 1;
    if (!strcmp(key, "length_targets")) return parse_targets(c, v, where);
    if (!strncmp(key, "prompt.", 7)) {
        int rc = vks_prompt_set(&c->prompt, key + 7, v, NULL);
        return rc ? vks_error_prefix(rc, "%s", where) : VKS_OK;
    }
    if (!strncmp(key, "lora.", 5)) return set_lora(c, key + 5, v, where);
    if (!strncmp(key, "loss.", 5)) return set_loss(c, key + 5, v, where);
    if (!strncmp(key, "advantage.", 10)) return set_advantage(c, key + 10, v, where);
    if (!strncmp(key, "reward.", 7)) return set_reward(c, key + 7, v, where);
    if (!strncmp(key, "buffer.", 7)) return set_buffer(c, key + 7, v, where);
    if (!strncmp(key, "roles.", 6)) {
        const char *r = key + 6;
        c->roles_given = true;
        if (!strcmp(r, "trainer")) return parse_one_rank(v, &c->trainer, key, where);
        if (!strcmp(r, "orchestrator")) return parse_one_rank(v, &c->orchestrator, key, where);
        if (!strcmp(r, "inference")) return parse_groups(c, v, where);
        if (!strcmp(r, "verifiers")) return parse_rank_list(v, c->verifiers, &c->n_verifiers, key, where);
        if (!strcmp(r, "relays")) return parse_rank_list(v, c->relays, &c->n_relays, key, where);
        return vks_set_error(VKS_ERR_FORMAT, "--set: unknown key '%s'", key);
    }
    const key_info *k = find_key(key);
    if (!k) return vks_set_error(VKS_ERR_FORMAT, "--set: unknown key '%s'", key);
    if (k->type == KEY_STRING) return set_string(c, k, v, where);
    char *end;
    errno = 0;
    if (k->type == KEY_U64) {
        unsigned long long u = strtoull(v, &end, 10);
        if (end == v || *end || errno || *v == '-') return vks_set_error(VKS_ERR_FORMAT, "--set: seed '%s' is not a number", v);
        c->seed = u;
        return VKS_OK;
    }
    double d = strtod(v, &end);
    if (end == v || *end || errno) return vks_set_error(VKS_ERR_FORMAT, "--set: %s: '%s' is not a number", key, v);
    return set_number(c, k, d, where);
}

/* ---- the JSON file ---- */

static int json_rank(json_t *v, long *r, const char *what, const char *path) {
    if (!json_is_integer(v)) return vks_set_error(VKS_ERR_FORMAT, "%s: %s: ranks are integers", path, what);
    *r = (long)json_integer_value(v) == json_integer_value(v) ? (long)json_integer_value(v) : -1;
    return VKS_OK;
}

static int json_rank_array(json_t *a, int *list, int *n, const char *what, const char *path) {
    if (!json_is_array(a)) return vks_set_error(VKS_ERR_FORMAT, "%s: %s must be an array of ranks", path, what);
    *n = 0;
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) {
        long r = -1;
        int rc = json_rank(v, &r, what, path);
        if (!rc) rc = add_rank(list, n, r, what, path);
        if (rc) return rc;
    }
    return VKS_OK;
}

static int json_groups(vks_rl_config *c, json_t *a, const char *path) {
    if (!json_is_array(a)) return vks_set_error(VKS_ERR_FORMAT, "%s: roles.inference must be an array of rank arrays", path);
    c->n_groups = c->n_inference_ranks = 0;
    size_t i, j;
    json_t *g, *v;
    json_array_foreach(a, i, g) {
        if (!json_is_array(g) || json_array_size(g) == 0)
            return vks_set_error(VKS_ERR_FORMAT, "%s: roles.inference[%zu] must be a non-empty array of ranks", path, i);
        int rc = start_group(c, path);
        json_array_foreach(g, j, v) {
            long r = -1;
            if (!rc) rc = json_rank(v, &r, "roles.inference", path);
            if (!rc) rc = add_inference_rank(c, r, path);
        }
        if (rc) return rc;
    }
    return VKS_OK;
}

static int json_roles(vks_rl_config *c, json_t *o, const char *path) {
    if (!json_is_object(o)) return vks_set_error(VKS_ERR_FORMAT, "%s: roles must be an object", path);
    c->roles_given = true;
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        long r = -1;
        int rc;
        if (!strcmp(k, "trainer") || !strcmp(k, "orchestrator")) {
            rc = json_rank(v, &r, k, path);
            if (!rc && (r < 0 || r >= VKS_RL_MAX_RANKS)) rc = vks_set_error(VKS_ERR_FORMAT, "%s: roles.%s: rank out of range", path, k);
            if (!rc) *(!strcmp(k, "trainer") ? &c->trainer : &c->orchestrator) = (int)r;
        } else if (!strcmp(k, "inference")) rc = json_groups(c, v, path);
        else if (!strcmp(k, "verifiers")) rc = json_rank_array(v, c->verifiers, &c->n_verifiers, "roles.verifiers", path);
        else if (!strcmp(k, "relays")) rc = json_rank_array(v, c->relays, &c->n_relays, "roles.relays", path);
        else rc = vks_set_error(VKS_ERR_FORMAT, "%s: unknown key roles.%s", path, k);
        if (rc) return rc;
    }
    return VKS_OK;
}

/* "prompt": {"chat_template": "qwen3", "system": "...", "think": false, ...} */
static int json_prompt(vks_rl_config *c, json_t *o, const char *path) {
    if (!json_is_object(o)) return vks_set_error(VKS_ERR_FORMAT, "%s: prompt must be an object", path);
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        int rc;
        if (!strcmp(k, "think")) {
            if (!json_is_boolean(v)) return vks_set_error(VKS_ERR_FORMAT, "%s: prompt.think must be true or false", path);
            rc = vks_prompt_set(&c->prompt, k, json_is_true(v) ? "true" : "false", NULL);
        } else if (!json_is_string(v)) {
            return vks_set_error(VKS_ERR_FORMAT, "%s: prompt.%.50s must be a string", path, k);
        } else if (strlen(json_string_value(v)) != json_string_length(v)) {
            return vks_set_error(VKS_ERR_FORMAT, "%s: prompt.%.50s holds a NUL character", path, k);
        } else {
            rc = vks_prompt_set(&c->prompt, k, json_string_value(v), NULL);
        }
        if (rc) return vks_error_prefix(rc, "%s", path);
    }
    return VKS_OK;
}

static int json_key(vks_rl_config *c, const char *k, json_t *v, const char *path) {
    c->given |= key_bit(k);
    if (!strcmp(k, "roles")) return json_roles(c, v, path);
    if (!strcmp(k, "prompt")) return json_prompt(c, v, path);
    if (!strcmp(k, "lora")) return json_lora(c, v, path);
    if (!strcmp(k, "loss")) return json_block(c, "loss", v, path, set_loss);
    if (!strcmp(k, "advantage")) return json_block(c, "advantage", v, path, set_advantage);
    if (!strcmp(k, "reward")) return put_reward(c, v, path);
    if (!strcmp(k, "buffer")) return json_block(c, "buffer", v, path, set_buffer);
    if (!strcmp(k, "length_targets")) return json_targets(c, v, path);
    const key_info *info = find_key(k);
    if (!info) return vks_set_error(VKS_ERR_FORMAT, "%s: unknown key '%s'", path, k);
    if (info->type == KEY_STRING) {
        if (!json_is_string(v)) return vks_set_error(VKS_ERR_FORMAT, "%s: %s must be a string", path, k);
        return set_string(c, info, json_string_value(v), path);
    }
    if (info->type == KEY_U64) {
        if (!json_is_integer(v) || json_integer_value(v) < 0) return vks_set_error(VKS_ERR_FORMAT, "%s: seed must be a non-negative integer", path);
        c->seed = (uint64_t)json_integer_value(v);
        return VKS_OK;
    }
    if (!json_is_number(v)) return vks_set_error(VKS_ERR_FORMAT, "%s: %s must be a number", path, k);
    return set_number(c, info, json_number_value(v), path);
}

static int parse_object(vks_rl_config *c, json_t *root, const char *path) {
    int rc = json_is_object(root) ? VKS_OK : vks_set_error(VKS_ERR_FORMAT, "%s: not a JSON object", path);
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        if (!rc) rc = json_key(c, k, v, path);
    }
    return rc;
}

int vks_rl_config_load(vks_rl_config *c, const char *path) {
    if (!c || !path) return vks_set_error(VKS_ERR_ARG, "vks_rl_config_load: NULL argument");
    char *text = NULL;
    size_t len = 0;
    int rc = vks_file_read_all(path, VKS_RL_MAX_CONFIG_BYTES, &text, &len);
    if (rc) return rc;
    /* jansson stops at a NUL byte: '{"steps": 1\0}' would pass, others read "end of file" */
    const char *nul = memchr(text, 0, len);
    size_t at = nul ? (size_t)(nul - text) : 0;
    if (nul) {
        free(text);
        return vks_set_error(VKS_ERR_FORMAT, "%s: a NUL byte at offset %zu", path, at);
    }
    json_error_t err;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    free(text);
    if (!root) return vks_set_error(VKS_ERR_FORMAT, "%s: line %d: %s", path, err.line, err.text);
    rc = parse_object(c, root, path);
    json_decref(root);
    return rc;
}

int vks_rl_config_parse(vks_rl_config *c, const char *json, const char *where) {
    if (!c || !json || !where) return vks_set_error(VKS_ERR_ARG, "vks_rl_config_parse: NULL argument");
    json_error_t err;
    json_t *root = json_loads(json, JSON_REJECT_DUPLICATES, &err);
    if (!root) return vks_set_error(VKS_ERR_FORMAT, "%s: line %d: %s", where, err.line, err.text);
    int rc = parse_object(c, root, where);
    json_decref(root);
    return rc;
}

/* ---- the configuration as JSON, and resuming ---- */

static json_t *rank_array(const int *list, int n) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) json_array_append_new(a, json_integer(list[i]));
    return a;
}

/* all: "loss" and "advantage" also at their defaults (listings, resume checks). */
static json_t *config_object(const vks_rl_config *c, bool all) {
    json_t *o = json_object();
    for (size_t i = 0; o && i < N_KEYS; i++) {
        const key_info *k = &keys[i];
        const char *p = (const char *)c + k->offset;
        json_t *v = k->type == KEY_STRING ? json_string(p)
                    : k->type == KEY_INT  ? json_integer(*(const int *)p)
                    : k->type == KEY_U64  ? json_integer((json_int_t)c->seed)
                                          : json_real(*(const double *)p);
        json_object_set_new(o, k->name, v);
    }
    if (o) json_object_set_new(o, "length_targets", rank_array(c->length_targets, c->n_length_targets));
    if (o)
        json_object_set_new(o, "prompt",
                            json_pack("{s:s, s:s, s:s, s:s, s:b}", "chat_template", c->prompt.chat_template, "system",
                                      c->prompt.system, "user_template", c->prompt.user_template, "think_template",
                                      c->prompt.think_template, "think", !c->prompt.no_think));
    if (o && c->lora_rank != 0) { /* only then: full fine-tuning's stored configs stay as they were (< 0: listed) */
        char targets[96] = "";
        for (int t = 0; t < VKS_LORA_TARGET_COUNT; t++)
            if (c->lora_targets & (1u << t))
                snprintf(targets + strlen(targets), sizeof targets - strlen(targets), "%s%s", targets[0] ? "," : "",
                         vks_lora_target_name((vks_lora_target)t));
        json_object_set_new(o, "lora", json_pack("{s:i, s:f, s:s}", "rank", c->lora_rank, "alpha", c->lora_alpha,
                                                 "targets", targets));
    }
    if (o && (all || !loss_is_default(c))) json_object_set_new(o, "loss", loss_object(c));
    if (o && (all || c->advantage != VKS_ADVANTAGE_GROUP_STD))
        json_object_set_new(o, "advantage", json_pack("{s:s}", "type", vks_advantage_type_name(c->advantage)));
    if (o && (all || !buffer_is_default(c))) json_object_set_new(o, "buffer", buffer_object(c));
    if (o && c->reward[0]) { /* only then: stored configs stay as they were */
        json_error_t err;
        json_t *r = json_loads(c->reward, JSON_DECODE_ANY, &err);
        if (r) json_object_set_new(o, "reward", r);
    }
    if (o && c->roles_given) {
        json_t *inf = json_array();
        for (int g = 0; inf && g < c->n_groups; g++)
            json_array_append_new(inf, rank_array(c->inference_ranks + c->groups[g].first, c->groups[g].n));
        json_object_set_new(o, "roles",
                            json_pack("{s:i, s:i, s:o*, s:o*, s:o*}", "orchestrator", c->orchestrator, "trainer",
                                      c->trainer, "inference", inf, "verifiers", rank_array(c->verifiers, c->n_verifiers),
                                      "relays", rank_array(c->relays, c->n_relays)));
    }
    return o;
}

static char *dump(const json_t *o) {
    return o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY | JSON_REAL_PRECISION(17)) : NULL;
}

/* One key for vks_rl_config_each: its value's JSON text and whether the default's is the same. */
static void value_text(const json_t *v, char *buf, size_t cap);

static int visit_key(const char *key, const json_t *v, const json_t *d, vks_rl_config_visit fn, void *ctx) {
    char text[4200];
    value_text(v, text, sizeof text);
    fn(ctx, key, text, d && json_equal(v, d));
    return VKS_OK;
}

int vks_rl_config_each(const vks_rl_config *c, vks_rl_config_visit fn, void *ctx) {
    if (!c || !fn) return vks_set_error(VKS_ERR_ARG, "vks_rl_config_each: NULL argument");
    vks_rl_config *d = malloc(sizeof *d), *full = malloc(sizeof *full);
    if (d) vks_rl_config_defaults(d);
    if (full) { /* lora's and the roles' keys listed too */
        *full = *c;
        full->lora_rank = c->lora_rank ? c->lora_rank : -1;
        full->roles_given = true;
    }
    json_t *mine = full ? config_object(full, true) : NULL, *def = NULL;
    if (d) d->lora_rank = -1, def = config_object(d, true);
    int rc = mine && def ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "config: out of host memory");
    json_t *lora = json_object_get(mine, "lora");
    if (lora && c->lora_rank == 0) json_object_set_new(lora, "rank", json_integer(0));
    json_t *dl = json_object_get(def, "lora");
    if (dl) json_object_set_new(dl, "rank", json_integer(0));
    const char *k;
    json_t *v;
    json_object_foreach(mine, k, v) {
        json_t *dv = json_object_get(def, k);
        if (rc || !json_is_object(v)) {
            if (!rc) rc = visit_key(k, v, dv, fn, ctx);
            continue;
        }
        const char *k2;
        json_t *v2;
        json_object_foreach(v, k2, v2) {
            char name[128];
            snprintf(name, sizeof name, "%s.%s", k, k2);
            /* roles: the default is every role on rank 0 (none given) */
            const json_t *d2 = !strcmp(k, "roles") ? (c->roles_given ? NULL : v2) : json_object_get(dv, k2);
            if (!rc) rc = visit_key(name, v2, d2, fn, ctx);
        }
    }
    json_decref(mine), json_decref(def);
    free(d), free(full);
    return rc;
}

char *vks_rl_config_to_json(const vks_rl_config *c) {
    if (!c) return NULL;
    json_t *o = config_object(c, false);
    char *s = dump(o);
    json_decref(o);
    return s;
}

/* A value for a message: JSON, reals as %.15g (NULL: "none"). */
static void value_text(const json_t *v, char *buf, size_t cap) {
    if (!v) {
        snprintf(buf, cap, "none");
        return;
    }
    if (json_is_real(v)) {
        snprintf(buf, cap, "%.15g", json_real_value(v));
        return;
    }
    char *s = dump(v);
    snprintf(buf, cap, "%s", s ? s : "?");
    free(s);
}

static const char *const resume_free_keys[] = {"out", "steps", "save_every", "keep", NULL};
static const char *const resume_fixed_keys[] = {"task", "prompts_per_step", NULL};

static bool listed(const char *const *list, const char *k) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], k)) return true;
    return false;
}

int vks_rl_config_resume(vks_rl_config *c, const vks_rl_config *stored, const char *where, bool override, char *changed,
                         size_t cap) {
    if (!c || !stored || !where || !changed || !cap) return vks_set_error(VKS_ERR_ARG, "vks_rl_config_resume: NULL argument");
    changed[0] = 0;
    json_t *mine = config_object(c, true), *old = config_object(stored, true);
    vks_rl_config *merged = malloc(sizeof *merged);
    int rc = mine && old && merged ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "resume: out of host memory");
    size_t at = 0;
    const char *names[N_KEYS + 8];
    for (size_t i = 0; i < N_KEYS; i++) names[i] = keys[i].name;
    names[N_KEYS] = "length_targets", names[N_KEYS + 1] = "roles", names[N_KEYS + 2] = "prompt";
    names[N_KEYS + 3] = "lora", names[N_KEYS + 4] = "loss", names[N_KEYS + 5] = "advantage", names[N_KEYS + 6] = "reward";
    names[N_KEYS + 7] = "buffer";
    for (size_t i = 0; !rc && i < N_KEYS + 8; i++) {
        const char *k = names[i];
        if (!vks_rl_config_given(c, k)) continue;
        json_t *now = json_object_get(mine, k), *was = json_object_get(old, k);
        if (json_equal(now, was) || (!now && !was)) continue;
        char a[300], b[300];
        value_text(was, a, sizeof a);
        value_text(now, b, sizeof b);
        if (now) json_object_set(old, k, now); /* releases was */
        else json_object_del(old, k);
        if (listed(resume_free_keys, k)) continue;
        if (!strcmp(k, "lora"))
            rc = vks_set_error(VKS_ERR_ARG, "resume: lora was %s in %s, now %s (the adapter's shape and scale stay: "
                               "start a new run from it with --model and another --out)", a, where, b);
        else if (listed(resume_fixed_keys, k))
            rc = vks_set_error(VKS_ERR_ARG, "resume: %s was %s in %s, now %s (the rollout position is in the terms of its "
                               "task and prompts_per_step: start a new run from it with --model and another --out)",
                               k, a, where, b);
        else if (!override)
            rc = vks_set_error(VKS_ERR_ARG, "resume: %s was %s in %s, now %s (--override to allow)", k, a, where, b);
        else if (at < cap)
            at += (size_t)snprintf(changed + at, cap - at, "%s%s %s -> %s", at ? ", " : "", k, a, b);
    }
    if (!rc) {
        vks_rl_config_defaults(merged);
        rc = parse_object(merged, old, where);
    }
    if (!rc) {
        merged->given = c->given;
        *c = *merged;
    }
    free(merged);
    json_decref(mine);
    json_decref(old);
    return rc;
}

/* ---- roles ---- */

int vks_rl_config_roles_of(const vks_rl_config *c, int rank) {
    int roles = 0;
    if (c->orchestrator == rank) roles |= VKS_RL_ROLE_ORCHESTRATOR;
    if (c->trainer == rank) roles |= VKS_RL_ROLE_TRAINER;
    for (int i = 0; i < c->n_inference_ranks; i++)
        if (c->inference_ranks[i] == rank) roles |= VKS_RL_ROLE_INFERENCE;
    for (int i = 0; i < c->n_verifiers; i++)
        if (c->verifiers[i] == rank) roles |= VKS_RL_ROLE_VERIFIER;
    for (int i = 0; i < c->n_relays; i++)
        if (c->relays[i] == rank) roles |= VKS_RL_ROLE_RELAY;
    return roles;
}

static const char *role_name(int bit) {
    switch (bit) {
    case VKS_RL_ROLE_TRAINER: return "trainer";
    case VKS_RL_ROLE_INFERENCE: return "inference";
    case VKS_RL_ROLE_VERIFIER: return "verifier";
    default: return "relay";
    }
}

/* Counts how often rank r is listed among the disjoint roles, naming the first clash. */
static int check_rank(const vks_rl_config *c, int r) {
    int seen = 0, first = 0;
    int counts[4] = {c->trainer == r, 0, 0, 0};
    for (int i = 0; i < c->n_inference_ranks; i++) counts[1] += c->inference_ranks[i] == r;
    for (int i = 0; i < c->n_verifiers; i++) counts[2] += c->verifiers[i] == r;
    for (int i = 0; i < c->n_relays; i++) counts[3] += c->relays[i] == r;
    static const int bits[4] = {VKS_RL_ROLE_TRAINER, VKS_RL_ROLE_INFERENCE, VKS_RL_ROLE_VERIFIER, VKS_RL_ROLE_RELAY};
    for (int i = 0; i < 4; i++) {
        if (counts[i] > 1) return vks_set_error(VKS_ERR_FORMAT, "roles: rank %d is listed twice as %s", r, role_name(bits[i]));
        if (counts[i] && seen) return vks_set_error(VKS_ERR_FORMAT, "roles: rank %d is both %s and %s", r, role_name(first), role_name(bits[i]));
        if (counts[i] && !seen) seen = 1, first = bits[i];
    }
    if (!seen && c->orchestrator != r) return vks_set_error(VKS_ERR_FORMAT, "roles: rank %d has no role", r);
    return VKS_OK;
}

static int check_values(const vks_rl_config *c) {
    if (!c->task[0]) return vks_set_error(VKS_ERR_FORMAT, "config: task is empty");
    vks_task_spec spec;
    const char *path = NULL;
    if (vks_task_resolve(c->task, &spec, &path)) return vks_error_prefix(VKS_ERR_FORMAT, "config: task");
    if (c->eval_split > 0 && !path)
        return vks_set_error(VKS_ERR_FORMAT, "config: eval_split holds out part of a task file, but task '%s' is built in "
                             "(its held-out accuracy is on fresh instances)", c->task);
    if (c->eval_tasks[0] && (vks_task_resolve(c->eval_tasks, &spec, &path) || !path))
        return vks_set_error(VKS_ERR_FORMAT, "config: eval_tasks '%s' is not a task file (PATH.jsonl, a path with '/', "
                             "or file:PATH)", c->eval_tasks);
    for (int i = 0; i < c->n_length_targets; i++)
        if (c->length_targets[i] > c->max_new_tokens)
            return vks_set_error(VKS_ERR_FORMAT, "config: length_targets: %d exceeds max_new_tokens %d (a completion "
                                 "cannot reach it)", c->length_targets[i], c->max_new_tokens);
    if (vks_prompt_check(&c->prompt)) return vks_error_prefix(VKS_ERR_FORMAT, "config");
    vks_grpo_loss_params h;
    char why[128];
    vks_rl_loss_params(c, 1.0, &h);
    if (!vks_grpo_loss_params_ok(&h, why, sizeof why)) return vks_set_error(VKS_ERR_FORMAT, "config: loss: %s", why);
    if (c->token_budget > 0 && c->loss.normalize != VKS_NORMALIZE_BUDGET)
        return vks_set_error(VKS_ERR_FORMAT, "config: token_budget is the divisor of loss.normalize \"budget\", not of "
                             "\"%s\"", vks_loss_normalize_name(c->loss.normalize));
    if (!c->model[0] && strcmp(c->init, "tiny")) /* model, when given, is the start */
        return vks_set_error(VKS_ERR_FORMAT, "config: init must be \"tiny\" (or give model: a checkpoint)");
    return VKS_OK;
}

int vks_rl_config_ranks_named(const vks_rl_config *c) {
    if (!c || !c->roles_given) return 1;
    int most = c->trainer > c->orchestrator ? c->trainer : c->orchestrator;
    const int *lists[3] = {c->inference_ranks, c->verifiers, c->relays};
    int counts[3] = {c->n_inference_ranks, c->n_verifiers, c->n_relays};
    for (int l = 0; l < 3; l++)
        for (int i = 0; i < counts[l]; i++)
            if (lists[l][i] > most) most = lists[l][i];
    return most + 1;
}

bool vks_rl_config_episodes_across_ranks(const vks_rl_config *c) {
    if (!c) return false;
    for (int i = 0; i < c->n_groups; i++)
        if (c->groups[i].n > 1) return false;
    return true;
}

/* buffer.type difficulty_pool: a task file (a built-in task's instances are new each time: no solve rate to
 * keep), thresholds in order, a weight somewhere, one process. */
static int check_difficulty_pool(const vks_rl_config *c, int n_ranks) {
    vks_task_spec spec;
    const char *path = NULL;
    const vks_rl_buffer *b = &c->buffer;
    if (!vks_task_resolve(c->task, &spec, &path) && !path)
        return vks_set_error(VKS_ERR_FORMAT, "config: buffer.type difficulty_pool needs a task file (task %s is built in: "
                             "each of its instances is new, so none has a solve rate to keep)", c->task);
    if (b->hard_threshold > b->easy_threshold)
        return vks_set_error(VKS_ERR_FORMAT, "config: buffer.hard_threshold %g is above buffer.easy_threshold %g",
                             b->hard_threshold, b->easy_threshold);
    if (b->easy_weight + b->normal_weight + b->hard_weight <= 0)
        return vks_set_error(VKS_ERR_FORMAT, "config: buffer weights are all 0: no pool could be drawn from");
    if (n_ranks > 1 || c->roles_given)
        return vks_set_error(VKS_ERR_FORMAT, "config: buffer.type difficulty_pool runs on one process for now (across ranks "
                             "the orchestrator would send each grant's tasks with it: not built)");
    return VKS_OK;
}

int vks_rl_config_check(vks_rl_config *c, int n_ranks) {
    if (!c || n_ranks < 1 || n_ranks > VKS_RL_MAX_RANKS) return vks_set_error(VKS_ERR_ARG, "config: %d ranks", n_ranks);
    int rc = check_values(c);
    if (rc) return rc;
    vks_task_spec spec;
    const char *path = NULL;
    if (c->buffer.difficulty_pool && (rc = check_difficulty_pool(c, n_ranks))) return rc;
    if (n_ranks > 1 && !vks_rl_config_episodes_across_ranks(c) && !vks_task_resolve(c->task, &spec, &path) && !path &&
        vks_task_refuse_environments(&spec, NULL, 0))
        return vks_error_prefix(VKS_ERR_FORMAT, "config");
    if (!c->roles_given) {
        c->trainer = c->orchestrator = 0;
        if (n_ranks != 1)
            return vks_set_error(VKS_ERR_FORMAT, "config: %d ranks started but no roles given (without roles every role runs on rank 0)", n_ranks);
        c->n_groups = 1;
        c->groups[0] = (vks_rl_group){0, 1};
        c->inference_ranks[0] = 0;
        c->n_inference_ranks = 1;
        return VKS_OK; /* one rank does everything: no overlap rules */
    }
    if (c->trainer < 0) return vks_set_error(VKS_ERR_FORMAT, "roles: no trainer (exactly one: roles.trainer)");
    /* no inference group: a trainer whose pool is all joiners (vks_rl_mpi_check_roles refuses it without joins) */
    int all[5] = {c->trainer, c->orchestrator};
    for (int i = 0; i < 2; i++)
        if (all[i] >= n_ranks) return vks_set_error(VKS_ERR_FORMAT, "roles: rank %d named but only %d ranks started", all[i], n_ranks);
    const int *lists[3] = {c->inference_ranks, c->verifiers, c->relays};
    int counts[3] = {c->n_inference_ranks, c->n_verifiers, c->n_relays};
    for (int l = 0; l < 3; l++)
        for (int i = 0; i < counts[l]; i++)
            if (lists[l][i] >= n_ranks)
                return vks_set_error(VKS_ERR_FORMAT, "roles: rank %d named but only %d ranks started", lists[l][i], n_ranks);
    for (int r = 0; r < n_ranks; r++)
        if ((rc = check_rank(c, r))) return rc;
    /* the orchestrator runs on the trainer's rank or on one of its own */
    int other = vks_rl_config_roles_of(c, c->orchestrator) & (VKS_RL_ROLE_INFERENCE | VKS_RL_ROLE_VERIFIER | VKS_RL_ROLE_RELAY);
    if (other)
        return vks_set_error(VKS_ERR_FORMAT, "roles: rank %d is both orchestrator and %s (the orchestrator shares a rank "
                             "only with the trainer)", c->orchestrator, role_name(other & -other));
    return VKS_OK;
}
