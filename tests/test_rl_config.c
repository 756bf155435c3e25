/* test_rl_config: the RL run's configuration (vks_rl_config.h): defaults,
 * the JSON file, KEY=VALUE, and every refusal the issue names. */
#include "test_util.h"
#include "vkswarm/vks_lora.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vkswarm/vks_rl_config.h"
#include "vkswarm/vks_tasks.h"
#include "vkswarm/vks_rl_bans.h"

static int load_bytes(vks_rl_config *c, const char *json, size_t len) {
    char path[1024];
    snprintf(path, sizeof path, "%s/run.json", tu_tmpdir());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(json, 1, len, f), len);
    fclose(f);
    return vks_rl_config_load(c, path);
}

static int load_text(vks_rl_config *c, const char *json) { return load_bytes(c, json, strlen(json)); }

static void test_defaults_one_rank(void **state) {
    (void)state;
    vks_rl_config c;
    vks_rl_config_defaults(&c);
    assert_int_equal(vks_rl_config_check(&c, 1), VKS_OK);
    assert_int_equal(vks_rl_config_roles_of(&c, 0), VKS_RL_ROLE_ORCHESTRATOR | VKS_RL_ROLE_TRAINER | VKS_RL_ROLE_INFERENCE);
    assert_int_equal(c.async_level, 2);
    assert_int_equal(c.max_off_policy_steps, 8); /* prime-rl's */
    assert_int_equal(vks_rl_config_check(&c, 2), VKS_ERR_FORMAT); /* two ranks need roles */
}

static void test_file_and_set(void **state) {
    (void)state;
    vks_rl_config c;
    vks_rl_config_defaults(&c);
    assert_int_equal(load_text(&c, "{\"task\": \"countdown\", \"steps\": 7, \"lr\": 2e-4, \"seed\": 9,"
                                   " \"length_targets\": [64, 128], \"max_new_tokens\": 128,"
                                   " \"roles\": {\"trainer\": 0, \"orchestrator\": 0, \"inference\": [[1], [2, 3]],"
                                   " \"verifiers\": [4], \"relays\": [5]}}"), VKS_OK);
    assert_int_equal(vks_rl_config_set(&c, "group_size=4"), VKS_OK);
    assert_int_equal(vks_rl_config_set(&c, "roles.verifiers=4,6"), VKS_OK);
    assert_true(c.save_every == 10 && c.keep == 3 && c.warmup == 0 && c.entropy_coef == 0.0); /* the defaults */
    assert_int_equal(vks_rl_config_set(&c, "entropy_coef=0.01"), VKS_OK);
    assert_true(c.entropy_coef == 0.01);
    assert_int_equal(vks_rl_config_set(&c, "entropy_coef=-0.01"), VKS_ERR_FORMAT); /* a bonus, not a penalty */
    assert_int_equal(vks_rl_config_set(&c, "entropy_coef=nan"), VKS_ERR_FORMAT);
    assert_true(c.entropy_coef == 0.01);
    assert_int_equal(vks_rl_config_set(&c, "save_every=5"), VKS_OK);
    assert_int_equal(vks_rl_config_set(&c, "warmup=4"), VKS_OK);
    assert_int_equal(vks_rl_config_set(&c, "keep=-1"), VKS_ERR_FORMAT);
    assert_true(c.save_every == 5 && c.warmup == 4 && c.keep == 3);
    assert_int_equal(vks_rl_config_set(&c, "max_off_policy_steps=0"), VKS_OK); /* on-policy only */
    assert_int_equal(c.max_off_policy_steps, 0);
    assert_int_equal(vks_rl_config_set(&c, "max_off_policy_steps=-1"), VKS_ERR_FORMAT);
    assert_int_equal(vks_rl_config_set(&c, "max_off_policy_steps=2.5"), VKS_ERR_FORMAT);
    assert_int_equal(c.max_off_policy_steps, 0);
    assert_int_equal(c.probation_batches, 8); /* a joined key's first batches replayed whole */
    assert_int_equal(vks_rl_config_set(&c, "probation_batches=0"), VKS_OK);
    assert_int_equal(c.probation_batches, 0);
    assert_int_equal(vks_rl_config_set(&c, "probation_batches=-1"), VKS_ERR_FORMAT);
    assert_int_equal(vks_rl_config_set(&c, "probation_batches=1.5"), VKS_ERR_FORMAT);
    assert_int_equal(vks_rl_config_check(&c, 7), VKS_OK);
    assert_string_equal(c.task, "countdown");
    assert_int_equal(c.steps, 7);
    assert_int_equal(c.group_size, 4);
    assert_int_equal(c.n_groups, 2);
    assert_int_equal(c.groups[1].n, 2);
    assert_int_equal(c.inference_ranks[c.groups[1].first + 1], 3);
    assert_int_equal(c.n_length_targets, 2);
    assert_int_equal(vks_rl_config_roles_of(&c, 6), VKS_RL_ROLE_VERIFIER);
    assert_int_equal(vks_rl_config_roles_of(&c, 5), VKS_RL_ROLE_RELAY);
    assert_int_equal(vks_rl_config_set(&c, "roles.inference=1;2,3;"), VKS_OK);
    assert_int_equal(c.n_groups, 2);
    /* the orchestrator on a rank of its own */
    vks_rl_config_defaults(&c);
    assert_int_equal(load_text(&c, "{\"roles\": {\"orchestrator\": 0, \"trainer\": 1, \"inference\": [[2], [3]]}}"), VKS_OK);
    assert_int_equal(vks_rl_config_check(&c, 4), VKS_OK);
    assert_int_equal(vks_rl_config_roles_of(&c, 0), VKS_RL_ROLE_ORCHESTRATOR);
    assert_int_equal(vks_rl_config_roles_of(&c, 1), VKS_RL_ROLE_TRAINER);
}

static void expect_refused(const char *json, int n_ranks, const char *needle) {
    vks_rl_config c;
    vks_rl_config_defaults(&c);
    int rc = load_text(&c, json);
    if (!rc) rc = vks_rl_config_check(&c, n_ranks);
    assert_int_equal(rc, VKS_ERR_FORMAT);
    if (!strstr(vks_last_error(), needle)) fprintf(stderr, "message: %s (wanted '%s')\n", vks_last_error(), needle);
    assert_non_null(strstr(vks_last_error(), needle));
}

static void test_refusals(void **state) {
    (void)state;
    expect_refused("{\"roles\": {\"inference\": [[1]]}}", 2, "no trainer");
    expect_refused("{\"roles\": {\"trainer\": 1, \"inference\": [[1]]}}", 2, "rank 1 is both trainer and inference");
    expect_refused("{\"roles\": {\"trainer\": 0, \"inference\": [[1], [1]]}}", 2, "listed twice");
    expect_refused("{\"roles\": {\"trainer\": 0, \"inference\": [[1, 5]]}}", 3, "rank 5 named but only 3 ranks");
    expect_refused("{\"roles\": {\"trainer\": 0, \"inference\": [[1]]}}", 3, "rank 2 has no role");
    { /* a trainer alone: its pool is all joiners (the CLI refuses it without --join: vks_rl_mpi_check_roles) */
        vks_rl_config alone;
        vks_rl_config_defaults(&alone);
        assert_int_equal(load_text(&alone, "{\"roles\": {\"trainer\": 0, \"inference\": []}}"), VKS_OK);
        assert_int_equal(vks_rl_config_check(&alone, 1), VKS_OK);
        assert_int_equal(alone.n_groups, 0);
    }
    /* the orchestrator: the trainer's rank or one of its own, nothing else */
    expect_refused("{\"roles\": {\"orchestrator\": 1, \"trainer\": 0, \"inference\": [[1]]}}", 2,
                   "rank 1 is both orchestrator and inference");
    expect_refused("{\"roles\": {\"orchestrator\": 2, \"trainer\": 0, \"inference\": [[1]], \"verifiers\": [2]}}", 3,
                   "rank 2 is both orchestrator and verifier");
    expect_refused("{\"roles\": {\"orchestrator\": 2, \"trainer\": 0, \"inference\": [[1]], \"relays\": [2]}}", 3,
                   "rank 2 is both orchestrator and relay");
    expect_refused("{\"roles\": {\"trainer\": 1, \"inference\": [[0]]}}", 2, "rank 0 is both orchestrator and inference");
    expect_refused("{\"stepz\": 3}", 1, "unknown key 'stepz'");
    expect_refused("{\"roles\": {\"trainers\": 0}}", 1, "unknown key roles.trainers");
    expect_refused("{\"steps\": 0}", 1, "steps must be an integer in");
    expect_refused("{\"group_size\": 2.5}", 1, "group_size");
    expect_refused("{\"task\": 3}", 1, "task must be a string");
    expect_refused("{\"steps\": 1, \"steps\": 2}", 1, "line");
    expect_refused("[1, 2]", 1, "not a JSON object");
    expect_refused("{\"init\": \"huge\"}", 1, "init must be");
    expect_refused("{\"entropy_coef\": 11}", 1, "entropy_coef must be a number in");
    /* own tasks: a task file by its shape; a split of a built-in task, a held-out set that is no file */
    expect_refused("{\"task\": \"words\"}", 1, "unknown task 'words': neither a built-in task");
    expect_refused("{\"task\": \"add:2\", \"eval_split\": 0.1}", 1, "eval_split holds out part of a task file");
    /* the built-in environment: episodes are trained on by a run on one process, and across ranks without
     * pipeline groups (verifier ranks replay every turn) */
    expect_refused("{\"task\": \"calc:2\", \"roles\": {\"trainer\": 0, \"inference\": [[1, 2]]}}", 3,
                   "task calc: a multi-turn environment; rl trains on its episodes on one process, or across ranks "
                   "without pipeline groups");
    {
        vks_rl_config ok;
        vks_rl_config_defaults(&ok);
        assert_int_equal(load_text(&ok, "{\"task\": \"calc:2\", \"roles\": {\"trainer\": 0, \"inference\": [[1]], "
                                        "\"verifiers\": [2]}}"), VKS_OK);
        assert_int_equal(vks_rl_config_check(&ok, 3), VKS_OK);
        assert_true(vks_rl_config_episodes_across_ranks(&ok));
    }
    expect_refused("{\"task\": \"w.jsonl\", \"eval_split\": 1}", 1, "eval_split must be a number in");
    expect_refused("{\"task\": \"w.jsonl\", \"eval_tasks\": \"add\"}", 1, "eval_tasks 'add' is not a task file");
    vks_rl_config c;
    vks_rl_config_defaults(&c);
    assert_int_equal(load_text(&c, "{\"task\": \"calc:2\"}"), VKS_OK);
    assert_int_equal(vks_rl_config_check(&c, 1), VKS_OK); /* one process: episodes */
    vks_rl_config_defaults(&c);
    assert_int_equal(load_text(&c, "{\"task\": \"calc:2\", \"roles\": {\"trainer\": 0, \"inference\": [[1], [2]]}}"), VKS_OK);
    assert_int_equal(vks_rl_config_check(&c, 3), VKS_OK);
    assert_true(vks_rl_config_episodes_across_ranks(&c));
    vks_rl_config_defaults(&c);
    assert_int_equal(load_text(&c, "{\"task\": \"w.jsonl\", \"eval_split\": 0.1, \"eval_tasks\": \"dir/held\"}"), VKS_OK);
    assert_int_equal(vks_rl_config_check(&c, 1), VKS_OK);
    assert_true(c.eval_split == 0.1);
    assert_string_equal(c.eval_tasks, "dir/held");
    assert_int_equal(vks_rl_config_set(&c, "task=file:words"), VKS_OK);
    assert_int_equal(vks_rl_config_check(&c, 1), VKS_OK);
    vks_rl_config_defaults(&c);
    assert_int_equal(vks_rl_config_set(&c, "nonsense=1"), VKS_ERR_FORMAT);
    assert_int_equal(vks_rl_config_set(&c, "steps"), VKS_ERR_FORMAT);
    assert_int_equal(vks_rl_config_set(&c, "steps=ten"), VKS_ERR_FORMAT);
    assert_int_equal(vks_rl_config_set(&c, "roles.trainer=-1"), VKS_ERR_FORMAT);
    assert_int_equal(vks_rl_config_set(&c, "seed=-3"), VKS_ERR_FORMAT);
}

/* The message names the key and the problem, and says nothing of ranks for
 * values that are not ranks. */
static void expect_message(int rc, const char *needle) {
    assert_int_equal(rc, VKS_ERR_FORMAT);
    if (!strstr(vks_last_error(), needle) || strstr(vks_last_error(), "rank"))
        fail_msg("message: '%s' (wanted '%s', no 'rank')", vks_last_error(), needle);
}

static void test_values_named(void **state) {
    (void)state;
    vks_rl_config c;
    vks_rl_config_defaults(&c);
    /* token_budget: 0 (automatic) or a token count; 1e-300 is no divisor (it failed at step 1, naming no key) */
    expect_message(vks_rl_config_set(&c, "token_budget=1e-300"), "--set: token_budget must be 0 or a number in [1, 1e+12]");
    expect_message(vks_rl_config_set(&c, "token_budget=0.5"), "token_budget must be 0 or a number in [1,");
    expect_message(vks_rl_config_set(&c, "token_budget=-0.0001"), "token_budget");
    expect_message(load_text(&c, "{\"token_budget\": 1e-300}"), "run.json: token_budget must be 0 or");
    assert_int_equal(vks_rl_config_set(&c, "token_budget=64"), VKS_OK);
    assert_true(c.token_budget == 64);
    assert_int_equal(vks_rl_config_set(&c, "token_budget=0"), VKS_OK);
    assert_true(c.token_budget == 0);
    /* task=file: with no name: refused by the check (exit 2), naming the key */
    assert_int_equal(vks_rl_config_set(&c, "task=file:"), VKS_OK);
    expect_message(vks_rl_config_check(&c, 1), "config: task: \"file:\" names no file");
    vks_rl_config_defaults(&c);
    /* length_targets are token counts, not ranks */
    expect_message(vks_rl_config_set(&c, "length_targets=64,0"), "--set: length_targets: 0 is not a token count in [1, 1048576]");
    expect_message(vks_rl_config_set(&c, "length_targets=64,x"), "--set: length_targets: 'x' is not a list of token counts");
    expect_message(vks_rl_config_set(&c, "length_targets=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17"),
                   "length_targets: more than 16 values");
    expect_message(load_text(&c, "{\"length_targets\": [64, -1]}"), "run.json: length_targets: -1 is not a token count");
    expect_message(load_text(&c, "{\"length_targets\": [64, 1.5]}"), "run.json: length_targets[1] is not an integer");
    expect_message(load_text(&c, "{\"length_targets\": 64}"), "run.json: length_targets must be an array of token counts");
    assert_int_equal(vks_rl_config_set(&c, "length_targets=64,5000"), VKS_OK); /* 5000 was "rank out of range" */
    assert_true(c.n_length_targets == 2 && c.length_targets[1] == 5000);
    assert_int_equal(load_text(&c, "{\"length_targets\": [4096, 100000]}"), VKS_OK);
    assert_true(c.n_length_targets == 2 && c.length_targets[1] == 100000);
    assert_int_equal(vks_rl_config_set(&c, "length_targets="), VKS_OK); /* off */
    assert_int_equal(c.n_length_targets, 0);
    /* a NUL byte: named with its offset (jansson read '{"steps": 1\0}' as a whole object, others as "end of file") */
    vks_rl_config_defaults(&c);
    expect_message(load_bytes(&c, "{\"steps\": 7\0}", 13), "run.json: a NUL byte at offset 11");
    assert_int_equal(c.steps, 50);
    expect_message(load_bytes(&c, "{\"steps\": 7}\0", 13), "run.json: a NUL byte at offset 12");
    expect_message(load_bytes(&c, "\0{}", 3), "a NUL byte at offset 0");
}

/* The prompt block: the JSON object, --set prompt.KEY=VALUE, and refusals
 * naming the key (issue 26); length targets a completion cannot reach. */
static void test_prompt_block(void **state) {
    (void)state;
    vks_rl_config c;
    vks_rl_config_defaults(&c);
    assert_true(vks_prompt_is_raw(&c.prompt));
    assert_int_equal(load_text(&c, "{\"prompt\": {\"chat_template\": \"qwen3\", \"system\": \"Be brief.\", "
                                   "\"user_template\": \"Q: {prompt}\", \"think_template\": \"({n} tokens)\", "
                                   "\"think\": false}}"), VKS_OK);
    assert_int_equal(vks_rl_config_check(&c, 1), VKS_OK);
    assert_string_equal(c.prompt.chat_template, "qwen3");
    assert_string_equal(c.prompt.system, "Be brief.");
    assert_string_equal(c.prompt.user_template, "Q: {prompt}");
    assert_string_equal(c.prompt.think_template, "({n} tokens)");
    assert_true(c.prompt.no_think);
    assert_int_equal(vks_rl_config_set(&c, "prompt.think=true"), VKS_OK);
    assert_false(c.prompt.no_think);
    assert_int_equal(vks_rl_config_set(&c, "prompt.chat_template=llama3"), VKS_OK);
    assert_int_equal(vks_rl_config_set(&c, "prompt.user_template={prompt} (answer: N)"), VKS_OK);
    assert_string_equal(c.prompt.user_template, "{prompt} (answer: N)");
    assert_int_equal(vks_rl_config_check(&c, 1), VKS_OK);
    expect_message(vks_rl_config_set(&c, "prompt.chat_template=mistral"), "--set: prompt.chat_template: unknown chat template 'mistral'");
    expect_message(vks_rl_config_set(&c, "prompt.user_template=Q:"), "--set: prompt.user_template must contain {prompt}");
    expect_message(vks_rl_config_set(&c, "prompt.think_template=Think."), "--set: prompt.think_template must contain {n}");
    expect_message(vks_rl_config_set(&c, "prompt.think=maybe"), "--set: prompt.think must be true or false");
    expect_message(vks_rl_config_set(&c, "prompt.colour=red"), "--set: unknown key 'prompt.colour'");
    expect_message(load_text(&c, "{\"prompt\": \"qwen3\"}"), "run.json: prompt must be an object");
    expect_message(load_text(&c, "{\"prompt\": {\"think\": \"no\"}}"), "run.json: prompt.think must be true or false");
    expect_message(load_text(&c, "{\"prompt\": {\"system\": 7}}"), "run.json: prompt.system must be a string");
    expect_message(load_text(&c, "{\"prompt\": {\"colour\": \"red\"}}"), "run.json: unknown key 'prompt.colour'");
    expect_message(load_text(&c, "{\"prompt\": {\"user_template\": \"{promt}\"}}"),
                   "run.json: prompt.user_template must contain {prompt}");
    char big[VKS_PROMPT_MAX_TEXT + 64];
    snprintf(big, sizeof big, "prompt.system=");
    memset(big + strlen(big), 's', VKS_PROMPT_MAX_TEXT);
    big[strlen("prompt.system=") + VKS_PROMPT_MAX_TEXT] = 0;
    expect_message(vks_rl_config_set(&c, big), "--set: prompt.system is longer than 2047 bytes");
    assert_string_equal(c.prompt.chat_template, "llama3"); /* refused values change nothing */
    /* keys together, at the check */
    vks_rl_config_defaults(&c);
    assert_int_equal(vks_rl_config_set(&c, "prompt.system=Be brief."), VKS_OK);
    expect_message(vks_rl_config_check(&c, 1), "config: prompt.system needs a chat template");
    vks_rl_config_defaults(&c);
    assert_int_equal(vks_rl_config_set(&c, "prompt.chat_template=chatml"), VKS_OK);
    assert_int_equal(vks_rl_config_set(&c, "prompt.think=false"), VKS_OK);
    expect_message(vks_rl_config_check(&c, 1), "config: prompt.think = false: chat template chatml has no thinking switch");
    /* a length target beyond max_new_tokens: no completion can reach it */
    vks_rl_config_defaults(&c);
    assert_int_equal(vks_rl_config_set(&c, "max_new_tokens=24"), VKS_OK);
    assert_int_equal(vks_rl_config_set(&c, "length_targets=8,24"), VKS_OK);
    assert_int_equal(vks_rl_config_check(&c, 1), VKS_OK);
    assert_int_equal(vks_rl_config_set(&c, "length_targets=8,25"), VKS_OK);
    expect_message(vks_rl_config_check(&c, 1), "config: length_targets: 25 exceeds max_new_tokens 24");
}

/* "lora": rank (0: off, the default), alpha, targets, from a file or
 * --set lora.KEY=V; bad values named; stored only when rank > 0 (full
 * fine-tuning's stored config is as before), and round-tripped exactly. */
static void test_lora_block(void **state) {
    (void)state;
    vks_rl_config c, back;
    vks_rl_config_defaults(&c);
    assert_int_equal(c.lora_rank, 0);
    char *text = vks_rl_config_to_json(&c);
    assert_null(strstr(text, "lora"));
    free(text);
    assert_int_equal(load_text(&c, "{\"lora\": {\"rank\": 8, \"alpha\": 16, \"targets\": \"q,v_proj,down\"}}"), VKS_OK);
    assert_int_equal(c.lora_rank, 8);
    assert_true(c.lora_alpha == 16.0);
    assert_int_equal(c.lora_targets, (1u << VKS_LORA_Q) | (1u << VKS_LORA_V) | (1u << VKS_LORA_DOWN));
    assert_true(vks_rl_config_given(&c, "lora"));
    assert_int_equal(vks_rl_config_set(&c, "lora.alpha=32"), VKS_OK);
    assert_int_equal(vks_rl_config_set(&c, "lora.targets=all"), VKS_OK);
    assert_int_equal(c.lora_targets, VKS_LORA_ALL_TARGETS);
    text = vks_rl_config_to_json(&c);
    assert_non_null(strstr(text, "\"lora\""));
    vks_rl_config_defaults(&back);
    assert_int_equal(vks_rl_config_parse(&back, text, "stored"), VKS_OK);
    free(text);
    assert_true(back.lora_rank == 8 && back.lora_alpha == 32.0 && back.lora_targets == VKS_LORA_ALL_TARGETS);
    /* (expect_message refuses "rank" in a message: these are about the LoRA rank) */
    assert_int_equal(vks_rl_config_set(&c, "lora.rank=-1"), VKS_ERR_FORMAT);
    assert_non_null(strstr(vks_last_error(), "--set: lora.rank must be an integer in [0, 1048576]"));
    assert_int_equal(vks_rl_config_set(&c, "lora.rank=2.5"), VKS_ERR_FORMAT);
    assert_non_null(strstr(vks_last_error(), "--set: lora.rank must be an integer"));
    expect_message(vks_rl_config_set(&c, "lora.alpha=0"), "--set: lora.alpha must be in (0, 1e6]");
    expect_message(vks_rl_config_set(&c, "lora.targets=q,lm_head"), "unknown LoRA target 'lm_head'");
    expect_message(vks_rl_config_set(&c, "lora.dropout=0.1"), "--set: unknown key 'lora.dropout'");
    expect_message(load_text(&c, "{\"lora\": 8}"), "run.json: lora must be an object");
    assert_int_equal(load_text(&c, "{\"lora\": {\"rank\": \"8\"}}"), VKS_ERR_FORMAT);
    assert_non_null(strstr(vks_last_error(), "run.json: lora.rank must be a number"));
    expect_message(load_text(&c, "{\"lora\": {\"targets\": 3}}"), "run.json: lora.targets must be a string");
    assert_int_equal(c.lora_rank, 8); /* refused values change nothing */
    /* across ranks: a trainer and inference ranks of one rank each (Shardcast carries the adapter) */
    assert_int_equal(vks_rl_config_set(&c, "roles.inference=1"), VKS_OK);
    assert_int_equal(vks_rl_config_set(&c, "roles.trainer=0"), VKS_OK);
    assert_int_equal(vks_rl_config_check(&c, 2), VKS_OK);
    assert_int_equal(vks_rl_config_set(&c, "roles.verifiers=2"), VKS_OK);
    assert_int_equal(vks_rl_config_check(&c, 3), VKS_OK);
    assert_int_equal(vks_rl_config_set(&c, "roles.orchestrator=3"), VKS_OK);
    assert_int_equal(vks_rl_config_check(&c, 4), VKS_OK);
}

/* A resume of a default config with `set` given: refused, its message holding
 * `refused` and the way out; allowed with --override, the change listed as
 * `listed`. Returns the merged config (the caller checks it and frees it). */
static vks_rl_config *resume_with(const char *set, const char *refused, const char *listed) {
    vks_rl_config *stored = malloc(sizeof *stored), *now = malloc(sizeof *now);
    assert_true(stored && now);
    vks_rl_config_defaults(stored);
    vks_rl_config_defaults(now);
    assert_int_equal(vks_rl_config_set(now, set), VKS_OK);
    char changed[512];
    assert_int_equal(vks_rl_config_resume(now, stored, "OUT/step-000000002", false, changed, sizeof changed), VKS_ERR_ARG);
    assert_non_null(strstr(vks_last_error(), refused));
    assert_non_null(strstr(vks_last_error(), "(--override to allow)"));
    assert_int_equal(vks_rl_config_resume(now, stored, "OUT/step-000000002", true, changed, sizeof changed), VKS_OK);
    if (!strstr(changed, listed)) fail_msg("changed: '%s' (wanted '%s')", changed, listed);
    free(stored);
    return now;
}

/* "loss" and "advantage": the type and knobs from a file or --set; bad values
 * named; stored only when not the default (intellect2 runs' stored configs are
 * as before) and round-tripped exactly; the loss's own checks at
 * vks_rl_config_check; the trainer's parameters (ipo's threshold is both masks);
 * a resume with another loss needs --override. */
static void test_loss_block(void **state) {
    (void)state;
    vks_rl_config c, back;
    vks_rl_config_defaults(&c);
    char *text = vks_rl_config_to_json(&c);
    assert_null(strstr(text, "loss"));
    assert_null(strstr(text, "advantage"));
    free(text);
    vks_grpo_loss_params h;
    vks_rl_loss_params(&c, 100, &h);
    assert_true(h.type == VKS_LOSS_INTELLECT2 && h.delta == 4 && h.eps == 0.2 && h.token_budget == 100);
    assert_int_equal(load_text(&c, "{\"loss\": {\"type\": \"dppo_kl\", \"kl_tau\": 0.002}, "
                                   "\"advantage\": {\"type\": \"group_mean\"}}"), VKS_OK);
    assert_true(c.loss.type == VKS_LOSS_DPPO_KL && c.loss.kl_tau == 0.002 && c.advantage == VKS_ADVANTAGE_GROUP_MEAN);
    assert_true(vks_rl_config_given(&c, "loss") && vks_rl_config_given(&c, "advantage"));
    assert_int_equal(vks_rl_config_set(&c, "loss.dppo_mask_high=0.28"), VKS_OK);
    vks_rl_loss_params(&c, 10, &h);
    assert_true(h.type == VKS_LOSS_DPPO_KL && h.mask_low == 0.2 && h.mask_high == 0.28 && h.kl_tau == 0.002 &&
                h.adv_tau == 1.0);
    assert_int_equal(vks_rl_config_check(&c, 1), VKS_OK);
    text = vks_rl_config_to_json(&c);
    assert_non_null(strstr(text, "\"loss\":{\"type\":\"dppo_kl\""));
    assert_non_null(strstr(text, "\"advantage\":{\"type\":\"group_mean\"}"));
    vks_rl_config_defaults(&back);
    assert_int_equal(vks_rl_config_parse(&back, text, "stored"), VKS_OK);
    free(text);
    assert_memory_equal(&back.loss, &c.loss, sizeof c.loss);
    assert_int_equal(back.advantage, VKS_ADVANTAGE_GROUP_MEAN);
    assert_int_equal(vks_rl_config_set(&c, "loss.normalize=sequence"), VKS_OK);
    assert_int_equal(c.loss.normalize, VKS_NORMALIZE_SEQUENCE);
    text = vks_rl_config_to_json(&c);
    assert_non_null(strstr(text, "\"normalize\":\"sequence\""));
    vks_rl_config_defaults(&back);
    assert_int_equal(vks_rl_config_parse(&back, text, "stored"), VKS_OK);
    free(text);
    assert_int_equal(back.loss.normalize, VKS_NORMALIZE_SEQUENCE);
    assert_int_equal(vks_rl_config_set(&c, "token_budget=4096"), VKS_OK); /* a budget is not this normaliser's */
    expect_message(vks_rl_config_check(&c, 1), "config: token_budget is the divisor of loss.normalize \"budget\"");
    assert_int_equal(vks_rl_config_set(&c, "token_budget=0"), VKS_OK);
    expect_message(vks_rl_config_set(&c, "loss.normalize=batch"), "--set: loss.normalize 'batch' is not budget, tokens or sequence");
    expect_message(load_text(&c, "{\"loss\": {\"normalize\": 1}}"), "run.json: loss.normalize must be a string");
    assert_int_equal(vks_rl_config_set(&c, "loss.type=ipo"), VKS_OK);
    assert_int_equal(vks_rl_config_set(&c, "loss.ipo_threshold=0.05"), VKS_OK);
    vks_rl_loss_params(&c, 10, &h);
    assert_true(h.type == VKS_LOSS_IPO && h.mask_low == 0.05 && h.mask_high == 0.05);
    assert_int_equal(vks_rl_config_set(&c, "loss.type=gspo"), VKS_OK); /* its own clip range */
    vks_rl_loss_params(&c, 10, &h);
    assert_true(h.type == VKS_LOSS_GSPO && h.eps_low == 3e-4 && h.eps_high == 4e-4);
    /* decoupled_ppo: PPO's eps, the behaviour weight's cap and what happens above it */
    assert_int_equal(vks_rl_config_set(&c, "loss.type=decoupled_ppo"), VKS_OK);
    vks_rl_loss_params(&c, 10, &h);
    assert_true(h.type == VKS_LOSS_DECOUPLED_PPO && h.behav_cap == 5.0 && !h.behav_truncate && h.eps == 0.2);
    assert_int_equal(vks_rl_config_set(&c, "loss.behav_cap=3"), VKS_OK);
    assert_int_equal(vks_rl_config_set(&c, "loss.behav_weight=truncate"), VKS_OK);
    vks_rl_loss_params(&c, 10, &h);
    assert_true(h.behav_cap == 3.0 && h.behav_truncate);
    {
        char *text = vks_rl_config_to_json(&c);
        assert_non_null(text);
        assert_non_null(strstr(text, "\"type\":\"decoupled_ppo\""));
        assert_non_null(strstr(text, "\"behav_weight\":\"truncate\""));
        vks_rl_config back;
        vks_rl_config_defaults(&back);
        assert_int_equal(vks_rl_config_parse(&back, text, "stored"), VKS_OK);
        assert_true(back.loss.behav_truncate && back.loss.behav_cap == 3.0 && back.loss.type == VKS_LOSS_DECOUPLED_PPO);
        free(text);
    }
    expect_message(vks_rl_config_set(&c, "loss.behav_weight=clip"), "--set: loss.behav_weight 'clip' is not mask or truncate");
    expect_message(vks_rl_config_set(&c, "loss.behav_cap=0.5"), "--set: loss.behav_cap must be a number in [1, 1e+06]");
    expect_message(load_text(&c, "{\"loss\": {\"behav_weight\": true}}"), "run.json: loss.behav_weight must be a string");
    assert_int_equal(vks_rl_config_set(&c, "loss.behav_weight=mask"), VKS_OK);
    assert_false(c.loss.behav_truncate);
    assert_int_equal(vks_rl_config_set(&c, "loss.type=ipo"), VKS_OK);
    for (int t = 0; t < VKS_LOSS_TYPE_COUNT; t++) { /* every type's defaults pass the loss's own check */
        char set[64];
        vks_rl_config d;
        vks_rl_config_defaults(&d);
        snprintf(set, sizeof set, "loss.type=%s", vks_loss_type_name((vks_loss_type)t));
        assert_int_equal(vks_rl_config_set(&d, set), VKS_OK);
        assert_int_equal(vks_rl_config_check(&d, 1), VKS_OK);
    }
    expect_message(vks_rl_config_set(&c, "loss.type=ppo"), "--set: loss.type 'ppo' is not intellect2, dppo_kl, ipo, cispo, dapo, gspo or "
                   "decoupled_ppo");
    expect_message(vks_rl_config_set(&c, "loss.kl_tau=-1"), "--set: loss.kl_tau must be a number in [0, 1e+06]");
    expect_message(vks_rl_config_set(&c, "loss.dppo_mask_low=x"), "--set: loss.dppo_mask_low must be a number");
    expect_message(vks_rl_config_set(&c, "loss.clip=0.2"), "--set: unknown key 'loss.clip'");
    expect_message(vks_rl_config_set(&c, "advantage.type=rloo"), "--set: advantage.type 'rloo' is not group_std or group_mean");
    expect_message(vks_rl_config_set(&c, "advantage.norm=1"), "--set: unknown key 'advantage.norm'");
    expect_message(load_text(&c, "{\"loss\": \"dppo_kl\"}"), "run.json: loss must be an object");
    expect_message(load_text(&c, "{\"loss\": {\"type\": 1}}"), "run.json: loss.type must be a string");
    expect_message(load_text(&c, "{\"loss\": {\"kl_tau\": \"1\"}}"), "run.json: loss.kl_tau must be a number");
    expect_message(load_text(&c, "{\"advantage\": {\"type\": \"x\"}}"), "run.json: advantage.type 'x' is not");
    assert_true(c.loss.type == VKS_LOSS_IPO && c.loss.ipo_threshold == 0.05); /* refused values change nothing */
    vks_rl_config_defaults(&c); /* intellect2's own rule: delta >= 1 + eps */
    assert_int_equal(vks_rl_config_set(&c, "loss.delta=1.1"), VKS_OK);
    expect_message(vks_rl_config_check(&c, 1), "config: loss: intellect2: delta must be >= 1 + eps");
    /* a resume with another loss: refused, unless --override */
    vks_rl_config *now = resume_with("loss.type=cispo", "resume: loss was {\"type\":\"intellect2\"",
                                     "loss {\"type\":\"intellect2\"");
    assert_int_equal(now->loss.type, VKS_LOSS_CISPO);
    free(now);
}

/* "buffer": simple (the default, not stored) or difficulty_pool with its thresholds and weights, from
 * --set and a file, round-tripped; refused naming the key and the reason: a built-in task, thresholds out
 * of order, every weight 0, more than one rank. */
static void test_buffer_block(void **state) {
    (void)state;
    vks_rl_config c, back;
    vks_rl_config_defaults(&c);
    char *text = vks_rl_config_to_json(&c);
    assert_null(strstr(text, "buffer"));
    free(text);
    assert_int_equal(vks_rl_config_set(&c, "buffer.type=difficulty_pool"), VKS_OK);
    assert_int_equal(load_text(&c, "{\"buffer\": {\"type\": \"difficulty_pool\", \"easy_threshold\": 0.8, "
                                   "\"hard_weight\": 0.5}}"), VKS_OK);
    assert_true(c.buffer.difficulty_pool && c.buffer.easy_threshold == 0.8 && c.buffer.hard_threshold == 0.25 &&
                c.buffer.hard_weight == 0.5 && c.buffer.normal_weight == 1.0 && c.buffer.easy_weight == 0.2);
    assert_true(vks_rl_config_given(&c, "buffer"));
    text = vks_rl_config_to_json(&c);
    assert_non_null(strstr(text, "\"buffer\":{\"type\":\"difficulty_pool\",\"easy_threshold\":0.8"));
    vks_rl_config_defaults(&back);
    assert_int_equal(vks_rl_config_parse(&back, text, "stored"), VKS_OK);
    free(text);
    assert_true(back.buffer.difficulty_pool && back.buffer.easy_threshold == 0.8 && back.buffer.hard_weight == 0.5);
    expect_message(vks_rl_config_check(&c, 1), "config: buffer.type difficulty_pool needs a task file (task add:2 is built in");
    snprintf(c.task, sizeof c.task, "file:/x/tasks.jsonl");
    assert_int_equal(vks_rl_config_check(&c, 1), VKS_OK);
    assert_int_equal(vks_rl_config_check(&c, 3), VKS_ERR_FORMAT);
    assert_non_null(strstr(vks_last_error(), "config: buffer.type difficulty_pool runs on one process for now"));
    assert_int_equal(vks_rl_config_set(&c, "buffer.hard_threshold=0.9"), VKS_OK);
    expect_message(vks_rl_config_check(&c, 1), "config: buffer.hard_threshold 0.9 is above buffer.easy_threshold 0.8");
    assert_int_equal(vks_rl_config_set(&c, "buffer.hard_threshold=0.1"), VKS_OK);
    assert_int_equal(vks_rl_config_set(&c, "buffer.easy_weight=0") | vks_rl_config_set(&c, "buffer.normal_weight=0") |
                     vks_rl_config_set(&c, "buffer.hard_weight=0"), VKS_OK);
    expect_message(vks_rl_config_check(&c, 1), "config: buffer weights are all 0");
    expect_message(vks_rl_config_set(&c, "buffer.type=priority"), "--set: buffer.type 'priority' is not simple or difficulty_pool");
    expect_message(vks_rl_config_set(&c, "buffer.easy_threshold=1.5"), "--set: buffer.easy_threshold must be a number in [0, 1]");
    expect_message(vks_rl_config_set(&c, "buffer.size=3"), "--set: unknown key 'buffer.size'");
    expect_message(load_text(&c, "{\"buffer\": {\"easy_weight\": \"1\"}}"), "run.json: buffer.easy_weight must be a number");
}

/* "reward": reward programs for every task, from a file (program or rubric)
 * or --set (program, sandbox, timeout_s); checked as a task line's, refused
 * naming the key; stored only when given, round-tripped; a resume that
 * changes it needs --override. */
static void test_reward_block(void **state) {
    (void)state;
    vks_rl_config c, back;
    vks_rl_config_defaults(&c);
    char *text = vks_rl_config_to_json(&c);
    assert_null(strstr(text, "reward\""));
    free(text);
    assert_int_equal(load_text(&c, "{\"reward\": {\"rubric\": [{\"program\": \"python3 a.py\", \"weight\": 3}, "
                                   "{\"program\": \"python3 b.py\"}], \"timeout_s\": 5}}"), VKS_OK);
    assert_true(vks_rl_config_given(&c, "reward"));
    text = vks_rl_config_to_json(&c);
    assert_non_null(strstr(text, "\"reward\":{\"rubric\":[{\"program\":\"python3 a.py\",\"weight\":3},"
                                 "{\"program\":\"python3 b.py\"}],\"timeout_s\":5}"));
    vks_rl_config_defaults(&back);
    assert_int_equal(vks_rl_config_parse(&back, text, "stored"), VKS_OK);
    free(text);
    assert_string_equal(back.reward, c.reward);
    vks_task_program *p = NULL;
    assert_int_equal(vks_task_program_parse(c.reward, "/d", &p), VKS_OK);
    assert_true(p->n == 2 && p->weights[0] == 0.75 && p->weights[1] == 0.25 && p->timeout_s == 5 && p->sandboxed);
    assert_string_equal(p->commands[1], "python3 b.py");
    assert_string_equal(p->dir, "/d");
    free(p);
    /* --set: a program replaces the rubric; the options stay */
    assert_int_equal(vks_rl_config_set(&c, "reward.program=python3 r.py"), VKS_OK);
    assert_int_equal(vks_rl_config_set(&c, "reward.sandbox=false"), VKS_OK);
    assert_string_equal(c.reward, "{\"timeout_s\":5,\"program\":\"python3 r.py\",\"sandbox\":false}");
    expect_message(vks_rl_config_set(&c, "reward.rubric=x"), "--set: unknown key 'reward.rubric' (--set takes program");
    expect_message(vks_rl_config_set(&c, "reward.sandbox=no"), "--set: reward.sandbox must be true or false");
    expect_message(vks_rl_config_set(&c, "reward.timeout_s=0"), "--set: reward: \"timeout_s\" is not a number above 0");
    expect_message(load_text(&c, "{\"reward\": \"python3 r.py\"}"), "run.json: reward must be an object");
    expect_message(load_text(&c, "{\"reward\": {\"program\": \"a\", \"weights\": 1}}"), "run.json: unknown key 'reward.weights'");
    expect_message(load_text(&c, "{\"reward\": {\"rubric\": [{\"program\": \"a\", \"weight\": -1}]}}"),
                   "run.json: reward: rubric entry 1: \"weight\" is not a number above 0");
    expect_message(load_text(&c, "{\"reward\": {}}"), "run.json: reward: a program task needs \"program\"");
    assert_string_equal(c.reward, "{\"timeout_s\":5,\"program\":\"python3 r.py\",\"sandbox\":false}"); /* unchanged */
    /* a resume with another reward: refused, unless --override */
    vks_rl_config *now = resume_with("reward.program=python3 r.py", "resume: reward was none", "reward none");
    assert_string_equal(now->reward, "{\"program\":\"python3 r.py\"}");
    free(now);
}

/* Resuming (issue 26): the stored config round-trips through JSON exactly;
 * keys not given take the stored values; a given key that differs is refused
 * naming it, its old and new value, unless it may change (out, steps,
 * save_every, keep) or override (then listed); task and prompts_per_step
 * never. */
static void test_resume_merge(void **state) {
    (void)state;
    vks_rl_config *stored = malloc(sizeof *stored), *c = malloc(sizeof *c), *back = malloc(sizeof *back);
    assert_true(stored && c && back);
    vks_rl_config_defaults(stored);
    assert_int_equal(vks_rl_config_set(stored, "group_size=4"), VKS_OK);
    assert_int_equal(vks_rl_config_set(stored, "lr=3e-4"), VKS_OK);
    assert_int_equal(vks_rl_config_set(stored, "length_targets=4,12"), VKS_OK);
    assert_int_equal(vks_rl_config_set(stored, "task=mul:3"), VKS_OK);
    assert_int_equal(vks_rl_config_set(stored, "seed=18446744073709"), VKS_OK);
    assert_int_equal(vks_rl_config_set(stored, "prompt.chat_template=qwen3"), VKS_OK);
    assert_int_equal(vks_rl_config_set(stored, "prompt.think=false"), VKS_OK);
    char *json = vks_rl_config_to_json(stored);
    assert_non_null(json);
    vks_rl_config_defaults(back);
    assert_int_equal(vks_rl_config_parse(back, json, "stored"), VKS_OK);
    back->given = stored->given; /* the only field the JSON leaves out */
    assert_memory_equal(back, stored, sizeof *back);
    free(json);
    stored->given = 0;
    char changed[512];
    /* nothing given: the stored config whole */
    vks_rl_config_defaults(c);
    assert_int_equal(vks_rl_config_resume(c, stored, "OUT/step-000000003", false, changed, sizeof changed), VKS_OK);
    assert_int_equal(c->group_size, 4);
    assert_true(c->lr == 3e-4);
    assert_int_equal(c->n_length_targets, 2);
    assert_string_equal(c->task, "mul:3");
    assert_string_equal(c->prompt.chat_template, "qwen3");
    assert_true(c->prompt.no_think);
    assert_string_equal(changed, "");
    /* the same value given, and keys that may change */
    vks_rl_config_defaults(c);
    assert_int_equal(vks_rl_config_set(c, "group_size=4"), VKS_OK);
    assert_int_equal(vks_rl_config_set(c, "steps=80"), VKS_OK);
    assert_int_equal(vks_rl_config_set(c, "out=elsewhere"), VKS_OK);
    assert_int_equal(vks_rl_config_resume(c, stored, "OUT/step-000000003", false, changed, sizeof changed), VKS_OK);
    assert_int_equal(c->steps, 80);
    assert_string_equal(c->out, "elsewhere");
    assert_string_equal(c->task, "mul:3");
    /* a changed key: refused naming it, then allowed with override */
    vks_rl_config_defaults(c);
    assert_int_equal(vks_rl_config_set(c, "group_size=8"), VKS_OK);
    assert_int_equal(vks_rl_config_set(c, "lr=1e-3"), VKS_OK);
    assert_int_equal(vks_rl_config_resume(c, stored, "OUT/step-000000003", false, changed, sizeof changed), VKS_ERR_ARG);
    assert_string_equal(vks_last_error(), "resume: group_size was 4 in OUT/step-000000003, now 8 (--override to allow)");
    vks_rl_config_defaults(c);
    assert_int_equal(vks_rl_config_set(c, "length_targets="), VKS_OK);
    assert_int_equal(vks_rl_config_resume(c, stored, "D", false, changed, sizeof changed), VKS_ERR_ARG);
    assert_string_equal(vks_last_error(), "resume: length_targets was [4,12] in D, now [] (--override to allow)");
    vks_rl_config_defaults(c);
    assert_int_equal(vks_rl_config_set(c, "group_size=8"), VKS_OK);
    assert_int_equal(vks_rl_config_set(c, "lr=1e-3"), VKS_OK);
    assert_int_equal(vks_rl_config_resume(c, stored, "D", true, changed, sizeof changed), VKS_OK);
    assert_string_equal(changed, "group_size 4 -> 8, lr 0.0003 -> 0.001");
    assert_int_equal(c->group_size, 8);
    assert_true(c->lr == 1e-3);
    assert_int_equal(c->n_length_targets, 2); /* not given: stored */
    /* the prompt format is one key: a changed part is refused naming it */
    vks_rl_config_defaults(c);
    assert_int_equal(vks_rl_config_set(c, "prompt.system=Be brief."), VKS_OK);
    assert_int_equal(vks_rl_config_resume(c, stored, "D", false, changed, sizeof changed), VKS_ERR_ARG);
    if (!strstr(vks_last_error(), "resume: prompt was {\"chat_template\":\"qwen3\",\"system\":\"\",") ||
        !strstr(vks_last_error(), "now {\"chat_template\":\"none\",\"system\":\"Be brief.\","))
        fail_msg("'%s'", vks_last_error());
    /* task and prompts_per_step: never */
    vks_rl_config_defaults(c);
    assert_int_equal(vks_rl_config_set(c, "task=add:2"), VKS_OK);
    assert_int_equal(vks_rl_config_resume(c, stored, "D", true, changed, sizeof changed), VKS_ERR_ARG);
    if (!strstr(vks_last_error(), "resume: task was \"mul:3\" in D, now \"add:2\" (the rollout position"))
        fail_msg("'%s'", vks_last_error());
    free(stored), free(c), free(back);
}

/* OUT/bans.jsonl (issue 37: a banned key stays banned across --resume): a
 * round trip, a missing file, and each malformed line refused by number. */
static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    fclose(f);
}

static void test_bans_file(void **state) {
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/bans.jsonl", tu_tmpdir());
    remove(path);
    vks_rl_ban *b = (vks_rl_ban *)1;
    int n = -1;
    assert_int_equal(vks_rl_bans_load(path, &b, &n), VKS_OK); /* missing: none */
    assert_null(b);
    assert_int_equal(n, 0);
    vks_rl_ban in[2] = {{.step = 7}, {.step = 0}};
    for (int i = 0; i < 32; i++) in[0].key[i] = (uint8_t)i, in[1].key[i] = (uint8_t)(255 - i);
    snprintf(in[0].reason, sizeof in[0].reason, "batch 3: token 999 outside the vocabulary");
    snprintf(in[1].reason, sizeof in[1].reason, "a \"quoted\" reason \\ with a backslash");
    assert_int_equal(vks_rl_bans_save(path, in, 2), VKS_OK);
    assert_int_equal(vks_rl_bans_load(path, &b, &n), VKS_OK);
    assert_int_equal(n, 2);
    for (int i = 0; i < 2; i++) {
        assert_memory_equal(b[i].key, in[i].key, 32);
        assert_int_equal(b[i].step, in[i].step);
        assert_string_equal(b[i].reason, in[i].reason);
    }
    free(b);
    /* a control character in a reason is escaped on reading */
    const char *key = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    char text[1024];
    snprintf(text, sizeof text, "\n{\"key\": \"%s\", \"step\": 2, \"reason\": \"bad\\u001b[2Jtext\"}\n", key);
    write_text(path, text);
    assert_int_equal(vks_rl_bans_load(path, &b, &n), VKS_OK);
    assert_int_equal(n, 1);
    assert_string_equal(b[0].reason, "bad\\x1b[2Jtext");
    free(b);
    struct { const char *line, *says; } bad[] = {
        {"[1, 2]", "line 2: not a JSON object"},
        {"{\"key\": \"00\", \"step\": 1, \"reason\": \"x\"}", "line 2: \"key\" is not 64 hex digits"},
        {"{\"key\": \"KEY\", \"step\": -1, \"reason\": \"x\"}", "line 2: \"step\" is negative"},
        {"{\"key\": \"KEY\", \"step\": 1}", "line 2: want exactly"},
        {"{\"key\": \"KEY\", \"step\": 1, \"reason\": \"x\", \"more\": 1}", "line 2: want exactly"},
        {"{\"key\": \"KEY\", \"step\": \"1\", \"reason\": \"x\"}", "line 2: want exactly"},
        {"{\"key\": \"zz0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\", \"step\": 1, \"reason\": \"x\"}",
         "line 2: \"key\" is not 64 hex digits"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char line[512], *at = strstr(bad[i].line, "KEY");
        if (at) snprintf(line, sizeof line, "%.*s%s%s", (int)(at - bad[i].line), bad[i].line, key, at + 3);
        else snprintf(line, sizeof line, "%s", bad[i].line);
        snprintf(text, sizeof text, "{\"key\": \"%s\", \"step\": 1, \"reason\": \"ok\"}\n%s\n", key, line);
        write_text(path, text);
        b = (vks_rl_ban *)1;
        assert_int_equal(vks_rl_bans_load(path, &b, &n), VKS_ERR_FORMAT);
        assert_null(b);
        assert_non_null(strstr(vks_last_error(), path));
        if (!strstr(vks_last_error(), bad[i].says)) fail_msg("%zu: %s", i, vks_last_error());
    }
    /* a line longer than any ban is refused, not read in pieces */
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "{\"key\": \"%s\", \"step\": 1, \"reason\": \"", key);
    for (int i = 0; i < 4000; i++) fputc('x', f);
    fprintf(f, "\"}\n");
    fclose(f);
    assert_int_equal(vks_rl_bans_load(path, &b, &n), VKS_ERR_FORMAT);
    assert_non_null(strstr(vks_last_error(), "line 1: longer than"));
    remove(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_one_rank),
        cmocka_unit_test(test_file_and_set),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_values_named),
        cmocka_unit_test(test_prompt_block),
        cmocka_unit_test(test_lora_block),
        cmocka_unit_test(test_loss_block), cmocka_unit_test(test_buffer_block),
        cmocka_unit_test(test_reward_block),
        cmocka_unit_test(test_resume_merge),
        cmocka_unit_test(test_bans_file),
    };
    return cmocka_run_group_tests_name("rl_config", tests, NULL, NULL);
}
