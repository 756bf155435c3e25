/* Verifiable tasks (vks_tasks.h): generators against golden instances, every
 * verifier on right, wrong, malformed and hostile completions, user task files
 * with their line numbers, the thinking-budget reward, and a tiny model scored
 * by generation (the same greedy results whatever the batch size). */
#include "test_util.h"
#include "vkswarm/vks_gpu.h"
#include "vkswarm/vks_model.h"
#include "vkswarm/vks_tasks.h"
#include "vkswarm/vks_tokenizer.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static vks_task make(const char *name, uint64_t seed, uint32_t index) {
    vks_task_spec s;
    assert_int_equal(vks_task_parse(name, &s), VKS_OK);
    vks_task t;
    assert_int_equal(vks_task_generate(&s, seed, index, &t), VKS_OK);
    return t;
}

static double score(const vks_task *t, const char *completion) { return vks_task_score(t, completion, strlen(completion)); }

/* Golden instances: a change of the generators (or of Philox) shows here. */
static void test_generators_golden(void **state) {
    (void)state;
    static const struct { const char *name; uint32_t index; const char *prompt, *answer; } golden[] = {
        {"add", 0, "What is 395 + 452? End with the line answer: N\n", "847"},
        {"add", 2, "What is 476 + 810? End with the line answer: N\n", "1286"},
        {"mul:3", 1, "What is 818 * 342? End with the line answer: N\n", "279756"},
        {"mul:1", 0, "What is 7 * 9? End with the line answer: N\n", "63"},
        {"countdown", 1, "Make 8 from 17 11 10 2 with + - * / (each number at most once). End with the line answer: EXPR\n",
         "(17+10-11)/2"},
        {"sort", 0, "Sort ascending: 33 4 5 61 51. End with the line answer: LIST\n", "4 5 33 51 61"},
        {"reverse:3", 1, "Reverse: 84 39 47. End with the line answer: LIST\n", "47 39 84"},
        /* the terse style: the same instances */
        {"add:3:short", 2, "476+810=\n", "1286"},
        {"mul:1:short", 0, "7*9=\n", "63"},
        {"countdown:short", 1, "make 8 from 17 11 10 2\n", "(17+10-11)/2"},
        {"sort:short", 0, "sort 33 4 5 61 51\n", "4 5 33 51 61"},
        {"reverse:3:short", 1, "reverse 84 39 47\n", "47 39 84"},
    };
    for (size_t i = 0; i < sizeof golden / sizeof golden[0]; i++) {
        vks_task t = make(golden[i].name, 42, golden[i].index);
        assert_string_equal(t.prompt, golden[i].prompt);
        assert_string_equal(t.answer, golden[i].answer);
    }
    vks_task c = make("countdown", 42, 1);
    assert_int_equal(c.n_numbers, 4);
    assert_int_equal(c.target, 8);
    /* a pure function of (seed, index): again the same, another seed differs */
    vks_task a = make("add", 42, 0), b = make("add", 43, 0);
    assert_string_equal(a.prompt, make("add", 42, 0).prompt);
    assert_string_not_equal(a.prompt, b.prompt);
}

/* Every generated instance is solvable: its worked completion scores 1, and
 * countdown targets are reachable with the given numbers. */
static void test_worked_completions_solve(void **state) {
    (void)state;
    const char *names[] = {"add:1", "add:9", "mul:2", "mul:9", "countdown:2", "countdown", "countdown:6", "sort:16", "reverse:2",
                           "add:2:short", "mul:3:short", "countdown:short", "sort:short"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        for (uint32_t i = 0; i < 2000; i++) {
            vks_task t = make(names[k], 7, i);
            char c[1024];
            assert_int_equal(vks_task_worked_completion(&t, c, sizeof c), VKS_OK);
            if (score(&t, c) != 1.0) fail_msg("%s %u: %s -> %s", names[k], i, t.prompt, c);
            if (t.verify == VKS_VERIFY_COUNTDOWN) assert_true(t.target >= 1 && t.target < 1000);
        }
    vks_task_spec s;
    assert_int_equal(vks_task_parse("mul:10", &s), VKS_ERR_ARG);
    assert_int_equal(vks_task_parse("add:", &s), VKS_ERR_ARG);
    assert_int_equal(vks_task_parse("divide", &s), VKS_ERR_ARG);
    assert_int_equal(vks_task_parse("sort:3x", &s), VKS_ERR_ARG);
    assert_int_equal(vks_task_parse("sort:3:shortx", &s), VKS_ERR_ARG);
    assert_int_equal(vks_task_parse("sort:short:3", &s), VKS_ERR_ARG);
    assert_int_equal(vks_task_parse("add:short", &s), VKS_OK);
    assert_true(s.short_prompt && s.size == 3);
    char name[32];
    vks_task_spec_name(&s, name, sizeof name);
    assert_string_equal(name, "add:3:short");
}

/* The built-in calculator environment: golden instances (their answers checked by hand), then
 * episodes stepped turn by turn: a calc: line answered exactly (fractions, errors), an answer line
 * ending it, a turn with neither ending it with 0, nothing after the end or past max_turns; replays
 * of recorded turns with their reasons; eval and rl refuse it (no multi-turn generation yet). */
static void test_calc_environment(void **state) {
    (void)state;
    static const struct { const char *name; uint32_t index; const char *prompt, *answer; } golden[] = {
        {"calc", 0, "What is 50*75+21? You may use the calculator: a line calc: EXPR gets its value back. End with "
                    "the line answer: N\n", "3771"},
        {"calc:2:short", 1, "calc 13*64\n", "832"},
        {"calc:4", 0, "What is 89*94*81*84? You may use the calculator: a line calc: EXPR gets its value back. End "
                      "with the line answer: N\n", "56922264"},
        {"calc:4", 1, "What is 10*24+47*76? You may use the calculator: a line calc: EXPR gets its value back. End "
                      "with the line answer: N\n", "3812"},
    };
    for (size_t i = 0; i < sizeof golden / sizeof golden[0]; i++) {
        vks_task t = make(golden[i].name, 42, golden[i].index);
        assert_string_equal(t.prompt, golden[i].prompt);
        assert_string_equal(t.answer, golden[i].answer);
        assert_int_equal(t.verify, VKS_VERIFY_ENVIRONMENT);
        assert_null(t.program);
    }
    vks_task t = make("calc", 42, 0);
    vks_env_episode ep;
    assert_int_equal(vks_env_reset(&t, 0, &ep), VKS_OK);
    assert_int_equal(ep.n, 1);
    assert_string_equal(ep.m[0].role, "user");
    assert_string_equal(ep.m[0].content, t.prompt);
    static const struct { const char *turn, *tool; } calls[] = {
        {"First the product.\nCALC: 50 * 75\n", "= 3750"},
        {"calc: 1\ncalc: (7 - 10) / 6", "= -1/2"},
        {"calc: 1/0", "error: not an expression of integers, + - * / and parentheses"},
    };
    for (int i = 0; i < 3; i++) {
        assert_int_equal(vks_env_step(&t, &ep, calls[i].turn, strlen(calls[i].turn)), VKS_OK);
        assert_false(ep.done);
        assert_int_equal(ep.turns, i + 1);
        assert_int_equal(ep.n, 3 + 2 * i);
        assert_string_equal(ep.m[ep.n - 2].role, "assistant");
        assert_string_equal(ep.m[ep.n - 2].content, calls[i].turn);
        assert_string_equal(ep.m[ep.n - 1].role, "tool");
        assert_string_equal(ep.m[ep.n - 1].content, calls[i].tool);
    }
    assert_int_equal(vks_env_step(&t, &ep, "calc: 3750+21\nanswer: 3,771", 27), VKS_OK); /* the answer wins */
    assert_true(ep.done && ep.reward == 1.0 && ep.n == 8);
    assert_int_equal(vks_env_step(&t, &ep, "more", 4), VKS_ERR_ARG); /* over */
    vks_env_episode_free(&ep);
    /* max_turns (4 for the calculator): a fifth turn is refused */
    assert_int_equal(vks_env_reset(&t, 0, &ep), VKS_OK);
    for (int i = 0; i < VKS_ENV_DEFAULT_TURNS; i++) assert_int_equal(vks_env_step(&t, &ep, "calc: 2", 7), VKS_OK);
    assert_false(ep.done);
    assert_int_equal(vks_env_step(&t, &ep, "answer: 3771", 12), VKS_ERR_ARG);
    vks_env_episode_free(&ep);
    static const struct { int n; const char *turns[5]; double reward; const char *why; } replays[] = {
        {2, {"calc: 50*75+21", "answer: 3771"}, 1, "environment: done after 2 turns, reward 1; answer '3771' matches, "
                                                   "expected '3771'"},
        {1, {"answer: 3770"}, 0, "environment: done after 1 turn, reward 0; answer '3770', expected '3771'"},
        {1, {"I think it is large."}, 0, "environment: done after 1 turn, reward 0; a turn with neither an answer line "
                                         "nor a calc: line"},
        {2, {"answer: 3771", "answer: 3771"}, 0, "the environment ended after turn 1 of 2"},
        {2, {"calc: 1", "calc: 2"}, 0, "not done after 2 turns"},
        {4, {"calc: 1", "calc: 2", "calc: 3", "calc: 4"}, 0, "not done after 4 turns (max_turns)"},
        {5, {"calc: 1", "calc: 2", "calc: 3", "calc: 4", "answer: 3771"}, 0, "5 turns, more than max_turns 4"},
    };
    for (size_t i = 0; i < sizeof replays / sizeof replays[0]; i++) {
        size_t lens[5];
        for (int k = 0; k < replays[i].n; k++) lens[k] = strlen(replays[i].turns[k]);
        double r = -1;
        char why[VKS_TASK_MAX_WHY];
        assert_int_equal(vks_env_replay(&t, 0, replays[i].turns, lens, replays[i].n, &r, why, sizeof why, NULL), VKS_OK);
        assert_true(r == replays[i].reward);
        assert_string_equal(why, replays[i].why);
    }
    /* a completion of an environment task scores as its first turn */
    assert_true(score(&t, "answer: 3771") == 1.0 && score(&t, "calc: 1") == 0.0);
    /* no one-completion worked answer; eval and rl refuse it, naming it */
    char c[256];
    assert_int_equal(vks_task_worked_completion(&t, c, sizeof c), VKS_ERR_ARG);
    vks_task_spec spec;
    assert_int_equal(vks_task_parse("calc:2", &spec), VKS_OK);
    assert_int_equal(vks_task_refuse_environments(&spec, NULL, 0), VKS_ERR_FORMAT);
    assert_non_null(strstr(vks_last_error(), "task calc: a multi-turn environment"));
    vks_task both[2] = {make("add", 1, 0), t};
    both[1].line = 7;
    assert_int_equal(vks_task_refuse_environments(NULL, both, 1), VKS_OK);
    assert_int_equal(vks_task_refuse_environments(NULL, both, 2), VKS_ERR_FORMAT);
    assert_non_null(strstr(vks_last_error(), "task line 7: a multi-turn environment"));
    assert_int_equal(vks_task_parse("calc:5", &spec), VKS_ERR_ARG);
}

static void test_extract_answer(void **state) {
    (void)state;
    char a[VKS_TASK_MAX_ANSWER];
    const char *c = "answer: 1\nthinking... answer: 2\n  Answer:  3  \nmore";
    assert_true(vks_task_extract_answer(c, strlen(c), a, sizeof a));
    assert_string_equal(a, "3"); /* the last line starting with answer: */
    c = "answer: 1\nso \\boxed{4{}}\n";
    assert_true(vks_task_extract_answer(c, strlen(c), a, sizeof a));
    assert_string_equal(a, "4{}"); /* the boxed one comes last */
    c = "\\boxed{4}\nanswer: 5";
    assert_true(vks_task_extract_answer(c, strlen(c), a, sizeof a));
    assert_string_equal(a, "5");
    assert_false(vks_task_extract_answer("the answer is 5", 15, a, sizeof a));
    assert_false(vks_task_extract_answer("answer:   \n", 11, a, sizeof a));
    assert_false(vks_task_extract_answer("\\boxed{5", 8, a, sizeof a));
    char nul[] = "answer: 5\0 6";
    assert_false(vks_task_extract_answer(nul, sizeof nul - 1, a, sizeof a));
    char *huge = malloc(100000);
    assert_non_null(huge);
    if (!huge) return; /* tells the compiler too (ASan builds warn otherwise) */
    memcpy(huge, "answer: ", 8);
    memset(huge + 8, '9', 100000 - 9);
    huge[99999] = 0;
    assert_false(vks_task_extract_answer(huge, strlen(huge), a, sizeof a)); /* longer than the answer bound */
    free(huge);
}

static void test_numeric_and_list(void **state) {
    (void)state;
    vks_task t = make("add", 42, 2); /* 1286 */
    assert_true(score(&t, "476+810\nanswer: 1286") == 1.0);
    assert_true(score(&t, "answer: 1,286") == 1.0);
    assert_true(score(&t, "answer: +01286.000") == 1.0);
    assert_true(score(&t, "\\boxed{1286}") == 1.0);
    assert_true(score(&t, "answer: 1287") == 0.0);
    assert_true(score(&t, "answer: 1286 apples") == 0.0);
    assert_true(score(&t, "answer: 1286.") == 0.0);
    assert_true(score(&t, "answer: -1286") == 0.0);
    assert_true(score(&t, "answer: 12,86,") == 0.0);
    assert_true(score(&t, "1286") == 0.0); /* no answer line */
    assert_true(score(&t, "answer: 1286\nanswer: 7") == 0.0); /* the last one counts */
    assert_true(score(&t, "answer: 99999999999999999999999999999999999999999999") == 0.0);
    vks_task s = make("sort", 42, 0); /* 4 5 33 51 61 */
    assert_true(score(&s, "answer: 4 5 33 51 61") == 1.0);
    assert_true(score(&s, "answer: [4, 5, 33, 51, 61]") == 1.0);
    assert_true(score(&s, "answer: 4,5,33,51,61") == 1.0);
    assert_true(score(&s, "answer: 4 5 33 51") == 0.0);
    assert_true(score(&s, "answer: 4 5 33 51 61 61") == 0.0);
    assert_true(score(&s, "answer: 5 4 33 51 61") == 0.0);
    assert_true(score(&s, "answer: 4 5 33 51 x") == 0.0);
    vks_task e = {.verify = VKS_VERIFY_EXACT};
    strcpy(e.answer, "Paris  France");
    assert_true(score(&e, "answer:  Paris France ") == 1.0);
    assert_true(score(&e, "answer: paris France") == 0.0);
}

static void test_countdown_verifier(void **state) {
    (void)state;
    const int64_t nums[] = {17, 11, 10, 2};
    assert_true(vks_task_countdown_ok("(17+10-11)/2", nums, 4, 8));
    assert_true(vks_task_countdown_ok(" ( 17 + 10 - 11 ) / 2 = 8", nums, 4, 8));
    assert_true(vks_task_countdown_ok("10-2", nums, 4, 8));           /* not every number needed */
    assert_true(vks_task_countdown_ok("((17-11)*2-10)*(0+0+10)", nums, 4, 20) == false); /* 0 is not given */
    assert_false(vks_task_countdown_ok("10-2 = 9", nums, 4, 8));      /* a wrong stated result */
    assert_false(vks_task_countdown_ok("2+2+2+2", nums, 4, 8));       /* reused number */
    assert_false(vks_task_countdown_ok("17/2", nums, 4, 8));          /* 8.5 */
    assert_false(vks_task_countdown_ok("(17+11)/(10-10)", nums, 4, 8));
    assert_false(vks_task_countdown_ok("17/(11-11)", nums, 4, 8));
    const int64_t two[] = {2, 2, 10};
    assert_true(vks_task_countdown_ok("10-2", two, 3, 8));
    assert_true(vks_task_countdown_ok("10/(2/2)/2*2-2", two, 3, 8) == false); /* a third 2 */
    assert_true(vks_task_countdown_ok("(10+2)/2", two, 3, 6));
    const int64_t z[] = {5, 5, 3};
    assert_false(vks_task_countdown_ok("3/(5-5)", z, 3, 0));           /* division by zero */
    assert_true(vks_task_countdown_ok("(5-5)/3", z, 3, 0));
    const int64_t w[] = {5, 3, 3};
    assert_true(vks_task_countdown_ok("5/3*3", w, 3, 5)); /* exact rationals: 5/3*3 = 5 */
    assert_false(vks_task_countdown_ok("5/3*3", z, 3, 5)); /* one 3 only */
    /* malformed */
    const char *bad[] = {"", "17+", "+17", "-2+10", "(10-2", "10-2)", "10--2", "10 2", "10-2x", "1e1-2", "10.0-2",
                         "()", "10**2", "(10)(2)"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (vks_task_countdown_ok(bad[i], nums, 4, 8)) fail_msg("accepted '%s'", bad[i]);
    /* hostile: huge literals, deep nesting, long chains, overflow */
    assert_false(vks_task_countdown_ok("99999999999999999999999999-2", nums, 4, 8));
    char deep[VKS_TASK_MAX_ANSWER];
    int at = 0;
    for (int i = 0; i < 100; i++) deep[at++] = '(';
    at += sprintf(deep + at, "10-2");
    for (int i = 0; i < 100; i++) deep[at++] = ')';
    deep[at] = 0;
    assert_false(vks_task_countdown_ok(deep, nums, 4, 8));
    at = 0;
    for (int i = 0; i < 20; i++) deep[at++] = '(';
    at += sprintf(deep + at, "10-2");
    for (int i = 0; i < 20; i++) deep[at++] = ')';
    deep[at] = 0;
    assert_true(vks_task_countdown_ok(deep, nums, 4, 8)); /* nesting below the bound is fine */
    const int64_t big[] = {2147483647, 2147483647, 2147483647, 2147483647, 2147483647, 2147483647, 1, 2};
    assert_false(vks_task_countdown_ok("2147483647*2147483647*2147483647*2147483647", big, 8, 1));
    assert_false(vks_task_countdown_ok("1/2147483647/2147483647/2147483647-2", big, 8, 1));
    assert_false(vks_task_countdown_ok("2147483648", big, 8, 2147483647));
    /* through a task: the answer line */
    vks_task t = make("countdown", 42, 1);
    assert_true(score(&t, "I try (17+10-11)/2\nanswer: (17+10-11)/2") == 1.0);
    assert_true(score(&t, "answer: 10-2") == 1.0);
    assert_true(score(&t, "answer: 10+2") == 0.0);
    assert_true(score(&t, "answer: 8") == 0.0); /* 8 is not a given number */
}

static void test_length_reward(void **state) {
    (void)state;
    assert_true(fabs(vks_task_length_reward(1.0, 128, 100, VKS_TASK_LENGTH_LAMBDA) - (1.0 - 28 * 3e-4)) < 1e-12);
    assert_true(fabs(vks_task_length_reward(0.0, 64, 100, VKS_TASK_LENGTH_LAMBDA) - (-36 * 3e-4)) < 1e-12);
    assert_true(vks_task_length_reward(1.0, 64, 64, 0.5) == 1.0);
}

/* The prompt text of f for `prompt` (think: the budget, 0 none); fails the test on an error. */
static char *render(const vks_prompt_format *f, const char *prompt, int think) {
    char *out = NULL;
    size_t len = 0;
    if (vks_prompt_text(f, NULL, prompt, think, &out, &len)) fail_msg("%s", vks_last_error());
    assert_int_equal(strlen(out), len);
    return out;
}

static void expect_render(const vks_prompt_format *f, const char *prompt, int think, const char *want) {
    char *got = render(f, prompt, think);
    assert_string_equal(got, want);
    free(got);
}

/* The think sentence: after a space (issue 26: it was glued on, "\boxed{}.Think"), none after whitespace. */
static void test_prompt_think_sentence(void **state) {
    (void)state;
    vks_prompt_format f;
    vks_prompt_format_default(&f);
    assert_true(vks_prompt_is_raw(&f));
    vks_task t = make("add", 42, 0);
    expect_render(&f, t.prompt, 128, "What is 395 + 452? End with the line answer: N\nThink for 128 tokens.\n");
    expect_render(&f, "Capital of France? Put it in \\boxed{}.", 16,
                  "Capital of France? Put it in \\boxed{}. Think for 16 tokens.\n");
    expect_render(&f, "39+39=", 0, "39+39=");
    expect_render(&f, "a\t", 5, "a\tThink for 5 tokens.\n");
    assert_int_equal(vks_prompt_set(&f, "think_template", "(budget: {n} tokens, {n} at most)", NULL), VKS_OK);
    assert_int_equal(vks_prompt_set(&f, "user_template", "Q: {prompt}\nA: {prompt}", NULL), VKS_OK);
    assert_false(vks_prompt_is_raw(&f));
    expect_render(&f, "2+3=", 7, "Q: 2+3= (budget: 7 tokens, 7 at most)\nA: 2+3= (budget: 7 tokens, 7 at most)");
    /* a 4 KiB task and a million-token budget still render */
    vks_prompt_format_default(&f);
    char big[VKS_TASK_MAX_PROMPT + 1];
    memset(big, 'p', VKS_TASK_MAX_PROMPT);
    big[VKS_TASK_MAX_PROMPT] = 0;
    char *out = render(&f, big, 1 << 20);
    assert_string_equal(out + VKS_TASK_MAX_PROMPT - 2, "pp Think for 1048576 tokens.\n");
    free(out);
    assert_int_equal(vks_prompt_text(&f, NULL, "x", -1, &out, &(size_t){0}), VKS_ERR_ARG);
}

/* Each named template, byte for byte, with a system prompt and a user
 * template, as the models' own templates print them (without the BOS the
 * tokenizer adds: Llama 3's <|begin_of_text|>, Llama 2's <s>). */
static void test_prompt_chat_templates(void **state) {
    (void)state;
    static const struct { const char *name, *want; } cases[] = {
        {"chatml", "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nSolve: 2+3=<|im_end|>\n"
                   "<|im_start|>assistant\n"},
        {"qwen3", "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nSolve: 2+3=<|im_end|>\n"
                  "<|im_start|>assistant\n"},
        {"llama3", "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user"
                   "<|end_header_id|>\n\nSolve: 2+3=<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
        {"llama3.1", "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
                     "Today Date: 26 Jul 2024\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
                     "Solve: 2+3=<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
        {"llama2", "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nSolve: 2+3= [/INST]"},
        {"phi3", "<|system|>\nBe brief.<|end|>\n<|user|>\nSolve: 2+3=<|end|>\n<|assistant|>\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        vks_prompt_format f;
        vks_prompt_format_default(&f);
        assert_int_equal(vks_prompt_set(&f, "chat_template", cases[i].name, NULL), VKS_OK);
        assert_int_equal(vks_prompt_set(&f, "system", "Be brief.", NULL), VKS_OK);
        assert_int_equal(vks_prompt_set(&f, "user_template", "Solve: {prompt}", NULL), VKS_OK);
        expect_render(&f, "2+3=", 0, cases[i].want);
    }
    /* Qwen3 with thinking off: its empty think block; with a budget, the sentence inside the user turn */
    vks_prompt_format f;
    vks_prompt_format_default(&f);
    assert_int_equal(vks_prompt_set(&f, "chat_template", "qwen3", NULL), VKS_OK);
    assert_int_equal(vks_prompt_set(&f, "think", "false", NULL), VKS_OK);
    expect_render(&f, "Put it in \\boxed{}.", 16,
                  "<|im_start|>user\nPut it in \\boxed{}. Think for 16 tokens.\n<|im_end|>\n"
                  "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    /* "model": the tokenizer's template, by its family */
    assert_int_equal(vks_prompt_set(&f, "chat_template", "model", NULL), VKS_OK);
    char *out = NULL;
    size_t len = 0;
    assert_int_equal(vks_prompt_text(&f, "{%- if enable_thinking is defined %}<|im_start|>", "hi", 0, &out, &len), VKS_OK);
    assert_string_equal(out, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    free(out);
    assert_int_equal(vks_prompt_text(&f, "{{ '<|im_start|>' + m.role }}", "hi", 0, &out, &len), VKS_ERR_FORMAT);
    assert_non_null(strstr(vks_last_error(), "prompt.think = false: the model's chat template (chatml)"));
    assert_int_equal(vks_prompt_text(&f, NULL, "hi", 0, &out, &len), VKS_ERR_FORMAT);
    assert_non_null(strstr(vks_last_error(), "the tokenizer has no chat template"));
    assert_null(out);
}

/* A Llama 3 style vocabulary (tokenizer.json + tokenizer_config.json): the
 * printable ASCII bytes, space and newline (GPT-2's byte spelling, no
 * merges), <|begin_of_text|> as BOS (add_bos_token) and the header / turn
 * markers as special tokens; its chat template is Llama 3's by its markers. */
static vks_tokenizer *llama3_like_tokenizer(void) {
    const char *dir = tu_tmpdir();
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "{\"added_tokens\": [{\"id\": 200, \"content\": \"<|begin_of_text|>\", \"special\": true}, "
               "{\"id\": 201, \"content\": \"<|start_header_id|>\", \"special\": true}, "
               "{\"id\": 202, \"content\": \"<|end_header_id|>\", \"special\": true}, "
               "{\"id\": 203, \"content\": \"<|eot_id|>\", \"special\": true}], "
               "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}, "
               "\"model\": {\"type\": \"BPE\", \"merges\": [], \"vocab\": {\"\\u0120\": 0, \"\\u010a\": 1");
    for (int c = 33; c < 127; c++) fprintf(f, ", \"%s%c\": %d", c == '"' || c == '\\' ? "\\" : "", c, c);
    fprintf(f, ", \"<|begin_of_text|>\": 200, \"<|start_header_id|>\": 201, \"<|end_header_id|>\": 202, "
               "\"<|eot_id|>\": 203}}}\n");
    fclose(f);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "{\"bos_token\": \"<|begin_of_text|>\", \"eos_token\": \"<|eot_id|>\", \"add_bos_token\": true, "
               "\"chat_template\": \"{{ bos_token }}{%% for m in messages %%}<|start_header_id|>{{ m.role }}"
               "<|end_header_id|>\\n\\n{{ m.content | trim }}<|eot_id|>{%% endfor %%}\"}\n");
    fclose(f);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    vks_tokenizer *t = NULL;
    if (vks_tokenizer_load_hf_json(path, &t)) fail_msg("%s", vks_last_error());
    return t;
}

/* Episodes in a chat template: the start's tokens, a turn as sampled (its text's tokens and the stop token),
 * then the reply's tokens are, together, the template's rendering of the whole conversation up to the next
 * assistant prompt, token for token (llama3's markers as special tokens; a system message of the format's
 * own first); a template whose turns do not end with the tokenizer's stop token is refused by name. */
static void test_prompt_episodes(void **state) {
    (void)state;
    vks_tokenizer *tok = llama3_like_tokenizer();
    vks_prompt_format f;
    vks_prompt_format_default(&f);
    assert_int_equal(vks_prompt_set(&f, "chat_template", "llama3", NULL), VKS_OK);
    assert_int_equal(vks_prompt_set(&f, "system", "Be brief.", NULL), VKS_OK);
    const char *roles[] = {"user", "assistant", "tool", "user", "assistant", "tool"};
    const char *contents[] = {"What is 2*3?", "calc: 2*3", "= 6", "go on", "calc: 6+1", "= 7"};
    int32_t *start = NULL, *reply = NULL, *reply2 = NULL, *turn = NULL, *turn2 = NULL, *whole = NULL;
    int n_start = 0, n_reply = 0, n_reply2 = 0, n_turn = 0, n_turn2 = 0, n_whole = 0;
    assert_int_equal(vks_prompt_episode_start(&f, tok, roles, contents, 1, &start, &n_start), VKS_OK);
    vks_tokenize_options plain = {.add_bos = false, .parse_special = false};
    assert_int_equal(vks_tokenizer_tokenize(tok, contents[1], strlen(contents[1]), &plain, &turn, &n_turn), VKS_OK);
    assert_int_equal(vks_tokenizer_tokenize(tok, contents[4], strlen(contents[4]), &plain, &turn2, &n_turn2), VKS_OK);
    int32_t stop = vks_tokenizer_eos(tok);
    assert_int_equal(stop, 203);
    assert_int_equal(vks_prompt_episode_reply(&f, tok, roles, contents, 4, stop, &reply, &n_reply), VKS_OK);
    assert_int_equal(vks_prompt_episode_reply(&f, tok, roles, contents, 6, stop, &reply2, &n_reply2), VKS_OK);
    vks_chat_message msgs[7] = {{"system", "Be brief."}};
    for (int i = 0; i < 6; i++) msgs[1 + i] = (vks_chat_message){roles[i], contents[i]};
    char *text = NULL;
    assert_int_equal(vks_chat_format("llama3", msgs, 7, true, &text), VKS_OK);
    vks_tokenize_options special = {.add_bos = true, .parse_special = true};
    assert_int_equal(vks_tokenizer_tokenize(tok, text, strlen(text), &special, &whole, &n_whole), VKS_OK);
    int32_t joined[1024];
    int k = 0;
    for (int i = 0; i < n_start; i++) joined[k++] = start[i];
    for (int i = 0; i < n_turn; i++) joined[k++] = turn[i];
    joined[k++] = stop;
    for (int i = 0; i < n_reply; i++) joined[k++] = reply[i];
    for (int i = 0; i < n_turn2; i++) joined[k++] = turn2[i];
    joined[k++] = stop;
    for (int i = 0; i < n_reply2; i++) joined[k++] = reply2[i];
    assert_int_equal(k, n_whole);
    for (int i = 0; i < k; i++) assert_int_equal(joined[i], whole[i]);
    assert_int_equal(whole[0], 200); /* BOS once */
    free(start), free(reply), free(reply2), free(turn), free(turn2), free(whole), free(text);
    /* chatml's turns end with <|im_end|>: not this tokenizer's stop token */
    assert_int_equal(vks_prompt_set(&f, "chat_template", "chatml", NULL), VKS_OK);
    assert_int_equal(vks_prompt_episode_reply(&f, tok, roles, contents, 3, stop, &reply, &n_reply), VKS_ERR_FORMAT);
    assert_non_null(strstr(vks_last_error(), "chat template chatml: an assistant turn is not followed by its stop token"));
    /* llama3.1 has no tool turns: named */
    assert_int_equal(vks_prompt_set(&f, "chat_template", "llama3.1", NULL), VKS_OK);
    assert_int_not_equal(vks_prompt_episode_reply(&f, tok, roles, contents, 3, stop, &reply, &n_reply), VKS_OK);
    assert_non_null(strstr(vks_last_error(), "llama3.1's 'tool' turns are not supported"));
    vks_tokenizer_free(tok);
}

/* Llama 3 as its template prints it: <|begin_of_text|> once (the
 * tokenizer's BOS, the template text has none), the markers as single
 * special tokens; the raw format parses none of them. */
static void test_prompt_llama3_bos(void **state) {
    (void)state;
    vks_tokenizer *tok = llama3_like_tokenizer();
    assert_int_equal(vks_tokenizer_bos(tok), 200);
    vks_prompt_format f;
    vks_prompt_format_default(&f);
    assert_int_equal(vks_prompt_set(&f, "chat_template", "model", NULL), VKS_OK);
    assert_int_equal(vks_prompt_set(&f, "system", "Be brief.", NULL), VKS_OK);
    assert_int_equal(vks_prompt_set(&f, "user_template", "Solve: {prompt}", NULL), VKS_OK);
    int32_t *ids = NULL;
    int n = 0;
    if (vks_prompt_tokenize(&f, tok, "2+3=", 0, &ids, &n)) fail_msg("%s", vks_last_error());
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(vks_tokenizer_detokenize(tok, ids, n, true, &text, &len), VKS_OK);
    assert_string_equal(text, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                              "<|start_header_id|>user<|end_header_id|>\n\nSolve: 2+3=<|eot_id|>"
                              "<|start_header_id|>assistant<|end_header_id|>\n\n");
    int counts[4] = {0};
    for (int i = 0; i < n; i++)
        if (ids[i] >= 200) counts[ids[i] - 200]++;
    assert_int_equal(ids[0], 200);
    assert_int_equal(counts[0], 1); /* BOS once */
    assert_int_equal(counts[1], 3);
    assert_int_equal(counts[2], 3);
    assert_int_equal(counts[3], 2);
    free(text);
    free(ids);
    /* raw: BOS + the text, markers in it stay bytes */
    vks_prompt_format_default(&f);
    assert_int_equal(vks_prompt_tokenize(&f, tok, "a<|eot_id|>", 0, &ids, &n), VKS_OK);
    assert_int_equal(ids[0], 200);
    for (int i = 1; i < n; i++) assert_true(ids[i] < 200);
    free(ids);
    vks_tokenizer_free(tok);
}

/* Values and keys refused with one line naming the key. */
static void test_prompt_errors(void **state) {
    (void)state;
    vks_prompt_format f;
    vks_prompt_format_default(&f);
    static const struct { const char *key, *value, *want; } bad[] = {
        {"chat_template", "mistral", "prompt.chat_template: unknown chat template 'mistral'"},
        {"chat_template", "<|im_start|>", "prompt.chat_template: unknown chat template"}, /* a name, not Jinja */
        {"chat_template", "", "prompt.chat_template: unknown chat template ''"},
        {"user_template", "Q: {promp}", "prompt.user_template must contain {prompt}"},
        {"think_template", "Think hard.", "prompt.think_template must contain {n}"},
        {"think", "no", "prompt.think must be true or false"},
        {"colour", "red", "unknown key 'prompt.colour'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(vks_prompt_set(&f, bad[i].key, bad[i].value, NULL), VKS_ERR_FORMAT);
        if (!strstr(vks_last_error(), bad[i].want)) fail_msg("%s: %s", bad[i].key, vks_last_error());
    }
    char big[VKS_PROMPT_MAX_TEXT + 1];
    memset(big, 's', sizeof big - 1);
    big[sizeof big - 1] = 0;
    assert_int_equal(vks_prompt_set(&f, "system", big, NULL), VKS_ERR_FORMAT);
    assert_string_equal(vks_last_error(), "prompt.system is longer than 2047 bytes");
    assert_int_equal(vks_prompt_set(&f, "system", big + 1, "--system"), VKS_OK);
    assert_int_equal(vks_prompt_set(&f, "user_template", "x", "--user-template"), VKS_ERR_FORMAT);
    assert_string_equal(vks_last_error(), "--user-template must contain {prompt}");
    vks_prompt_format_default(&f); /* nothing above changed it but the system prompt */
    /* keys together */
    assert_int_equal(vks_prompt_set(&f, "system", "Be brief.", NULL), VKS_OK);
    assert_int_equal(vks_prompt_check(&f), VKS_ERR_FORMAT);
    assert_non_null(strstr(vks_last_error(), "prompt.system needs a chat template"));
    vks_prompt_format_default(&f);
    assert_int_equal(vks_prompt_set(&f, "think", "false", NULL), VKS_OK);
    assert_int_equal(vks_prompt_check(&f), VKS_ERR_FORMAT);
    assert_int_equal(vks_prompt_set(&f, "chat_template", "llama3", NULL), VKS_OK);
    assert_int_equal(vks_prompt_check(&f), VKS_ERR_FORMAT);
    assert_non_null(strstr(vks_last_error(), "chat template llama3 has no thinking switch"));
    char *out = NULL;
    assert_int_equal(vks_prompt_text(&f, NULL, "x", 0, &out, &(size_t){0}), VKS_ERR_FORMAT); /* rendering checks too */
    assert_int_equal(vks_prompt_set(&f, "chat_template", "qwen3", NULL), VKS_OK);
    assert_int_equal(vks_prompt_check(&f), VKS_OK);
}

/* Token ids on the byte-level vocabulary (ids = bytes, BOS 256): the raw
 * format is BOS + the text as before; a chat template's text gets BOS once
 * (the vocabulary asks for it), its markers as bytes (they are not tokens there). */
static void test_prompt_tokenize(void **state) {
    (void)state;
    vks_tokenizer *tok = NULL;
    assert_int_equal(vks_tokenizer_byte_level(&tok), VKS_OK);
    vks_prompt_format f;
    vks_prompt_format_default(&f);
    int32_t *ids = NULL;
    int n = 0;
    assert_int_equal(vks_prompt_tokenize(&f, tok, "2+3=", 0, &ids, &n), VKS_OK);
    int32_t raw[] = {VKS_BYTE_VOCAB_BOS, '2', '+', '3', '='};
    assert_int_equal(n, 5);
    assert_memory_equal(ids, raw, sizeof raw);
    free(ids);
    assert_int_equal(vks_prompt_set(&f, "chat_template", "chatml", NULL), VKS_OK);
    assert_int_equal(vks_prompt_tokenize(&f, tok, "2+3=", 4, &ids, &n), VKS_OK);
    const char *want = "<|im_start|>user\n2+3= Think for 4 tokens.\n<|im_end|>\n<|im_start|>assistant\n";
    assert_int_equal(n, 1 + (int)strlen(want));
    assert_int_equal(ids[0], VKS_BYTE_VOCAB_BOS);
    for (int i = 1; i < n; i++) assert_int_equal(ids[i], (unsigned char)want[i - 1]);
    free(ids);
    assert_int_equal(vks_prompt_set(&f, "chat_template", "model", NULL), VKS_OK); /* the byte vocabulary has none */
    assert_int_equal(vks_prompt_tokenize(&f, tok, "2+3=", 0, &ids, &n), VKS_ERR_FORMAT);
    assert_non_null(strstr(vks_last_error(), "prompt.chat_template model: the tokenizer has no chat template"));
    vks_tokenizer_free(tok);
}

static char *write_tmp(const char *name, const char *text) {
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s", tu_tmpdir(), name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static void expect_load_error(const char *text, const char *needle) {
    char *path = write_tmp("bad.jsonl", text);
    vks_task *tasks = (vks_task *)1;
    int64_t n = -1;
    if (vks_task_file_load(path, &tasks, &n) != VKS_ERR_FORMAT) fail_msg("loaded: %s", text);
    assert_null(tasks);
    assert_int_equal(n, 0);
    if (!strstr(vks_last_error(), needle)) fail_msg("'%s' lacks '%s'", vks_last_error(), needle);
}

static void test_task_file(void **state) {
    (void)state;
    const char *good =
        "{\"prompt\": \"2+2?\", \"answer\": \"4\", \"task_type\": \"numeric\", \"id\": 7}\n"
        "\n"
        "{\"prompt\": \"Capital?\", \"answer\": \"Paris\", \"task_type\": \"boxed\"}\r\n"
        "{\"prompt\": \"Make 8\", \"task_type\": \"countdown\", \"numbers\": [2, 10], \"target\": 8}\n"
        "{\"prompt\": \"Sort 3 1\", \"answer\": 13, \"task_type\": \"list\"}";
    char *path = write_tmp("good.jsonl", good);
    vks_task *tasks = NULL;
    int64_t n = 0;
    if (vks_task_file_load(path, &tasks, &n)) fail_msg("%s", vks_last_error());
    assert_int_equal(n, 4);
    assert_int_equal(tasks[0].line, 1);
    assert_int_equal(tasks[1].line, 3);
    assert_int_equal(tasks[3].line, 5);
    assert_true(score(&tasks[0], "answer: 4.0") == 1.0);
    assert_true(score(&tasks[1], "so \\boxed{Paris}") == 1.0);
    assert_true(score(&tasks[1], "so \\boxed{London}") == 0.0);
    assert_true(score(&tasks[2], "answer: 10-2") == 1.0);
    assert_true(score(&tasks[2], "answer: 10-2-2+2") == 0.0);
    assert_true(score(&tasks[3], "answer: 13") == 1.0);
    free(tasks);
    expect_load_error("{\"prompt\": \"a\", \"answer\": \"b\", \"task_type\": \"exact\"}\n{\"prompt\": \"a\"", ": line 2: bad JSON");
    expect_load_error("\n\n[1]\n", "bad.jsonl: line 3: not a JSON object");
    expect_load_error("{\"prompt\": \"a\", \"answer\": \"b\"}\n", "line 1: missing \"task_type\"");
    expect_load_error("{\"prompt\": \"a\", \"answer\": \"b\", \"task_type\": \"vibes\"}\n", "line 1: unknown \"task_type\"");
    expect_load_error("{\"prompt\": 3, \"answer\": \"b\", \"task_type\": \"exact\"}\n", "line 1: \"prompt\" is not a string");
    expect_load_error("{\"prompt\": \"a\", \"task_type\": \"exact\"}\n", "line 1: missing \"answer\"");
    expect_load_error("{\"prompt\": \"a\", \"answer\": \"\", \"task_type\": \"exact\"}\n", "line 1: \"answer\" is empty");
    expect_load_error("{\"prompt\": \"a\", \"task_type\": \"countdown\", \"numbers\": [1], \"target\": 1, \"answer\": 1, "
                      "\"answer\": 2}\n", "line 1: bad JSON");
    expect_load_error("{\"prompt\": \"a\", \"task_type\": \"countdown\", \"target\": 1}\n", "line 1: countdown needs \"numbers\"");
    expect_load_error("{\"prompt\": \"a\", \"task_type\": \"countdown\", \"numbers\": [1,2,3,4,5,6,7,8,9], \"target\": 1}\n",
                      "line 1: \"numbers\" holds 9 entries");
    expect_load_error("{\"prompt\": \"a\", \"task_type\": \"countdown\", \"numbers\": [1, -2], \"target\": 1}\n",
                      "line 1: \"numbers\"[1] is not an integer");
    expect_load_error("{\"prompt\": \"a\\u0000b\", \"answer\": \"b\", \"task_type\": \"exact\"}\n", "line 1: bad JSON");
    expect_load_error("", "no tasks");
    /* bounded: a prompt over the limit, and a line over the limit */
    size_t big = VKS_TASK_MAX_LINE + 100;
    char *text = malloc(big + 64);
    int at = sprintf(text, "{\"prompt\": \"a\", \"answer\": \"b\", \"task_type\": \"exact\"}\n{\"prompt\": \"");
    memset(text + at, 'x', VKS_TASK_MAX_PROMPT + 10);
    at += VKS_TASK_MAX_PROMPT + 10;
    at += sprintf(text + at, "\", \"answer\": \"b\", \"task_type\": \"exact\"}\n");
    expect_load_error(text, "line 2: \"prompt\" is longer than 4096 bytes");
    memset(text, ' ', big);
    text[big] = 0;
    expect_load_error(text, "line 1: longer than 65536 bytes");
    free(text);
}

/* A prompt of 4 KiB (README) loads; one byte more is named. Numeric and list
 * answers nothing could match (nan, inf, 1e999) are refused naming file and
 * line, as is a NUL byte (with its place), and a line without end (/dev/zero)
 * fails at the limit instead of being read forever. */
static void test_task_file_limits(void **state) {
    (void)state;
    char *text = malloc(VKS_TASK_MAX_PROMPT + 128);
    int at = sprintf(text, "{\"prompt\": \"");
    memset(text + at, 'p', VKS_TASK_MAX_PROMPT);
    at += VKS_TASK_MAX_PROMPT;
    sprintf(text + at, "\", \"answer\": \"b\", \"task_type\": \"exact\"}\n");
    char *path = write_tmp("prompt4k.jsonl", text);
    vks_task *tasks = NULL;
    int64_t n = 0;
    if (vks_task_file_load(path, &tasks, &n)) fail_msg("a 4096-byte prompt: %s", vks_last_error());
    assert_int_equal(n, 1);
    assert_int_equal(strlen(tasks[0].prompt), VKS_TASK_MAX_PROMPT);
    free(tasks);
    memmove(text + at + 1, text + at, strlen(text + at) + 1);
    text[at] = 'p';
    expect_load_error(text, "bad.jsonl: line 1: \"prompt\" is longer than 4096 bytes");
    free(text);
    const char *numeric[] = {"nan", "inf", "-inf", "1e999", "1e3", "0x10", "12 apples"};
    char line[256], want[128];
    for (int i = 0; i < 7; i++) {
        snprintf(line, sizeof line, "{\"prompt\": \"a\", \"answer\": \"4\", \"task_type\": \"numeric\"}\n"
                 "{\"prompt\": \"a\", \"answer\": \"%s\", \"task_type\": \"numeric\"}\n", numeric[i]);
        snprintf(want, sizeof want, "bad.jsonl: line 2: \"answer\" '%s' is not a decimal number", numeric[i]);
        expect_load_error(line, want);
    }
    expect_load_error("{\"prompt\": \"a\", \"answer\": \"1 2 nan\", \"task_type\": \"list\"}\n",
                      "line 1: \"answer\" '1 2 nan' is not a list of decimal numbers");
    expect_load_error("{\"prompt\": \"a\", \"answer\": \"4\", \"task_type\": \"mul\"}\n"
                      "{\"prompt\": \"a\", \"answer\": \"[1, inf]\", \"task_type\": \"sort\"}\n",
                      "line 2: \"answer\" '[1, inf]' is not a list");
    /* the good forms stay good */
    path = write_tmp("num.jsonl", "{\"prompt\": \"a\", \"answer\": \"-1,286.50\", \"task_type\": \"numeric\"}\n"
                                  "{\"prompt\": \"a\", \"answer\": \"[1, 2, 3]\", \"task_type\": \"list\"}\n"
                                  "{\"prompt\": \"a\", \"answer\": \"nan\", \"task_type\": \"exact\"}\n");
    if (vks_task_file_load(path, &tasks, &n)) fail_msg("good answers: %s", vks_last_error());
    assert_int_equal(n, 3);
    free(tasks);
    /* a raw NUL byte (jansson read it as the end of the text) */
    static const char nul_line[] = "{\"prompt\": \"a\", \"answer\": \"4\", \"task_type\": \"exact\"}\n"
                                   "{\"prompt\": \"a\", \"answer\": \"4\", \"task_type\": \"exact\"\0}\n";
    path = write_tmp("bad.jsonl", "");
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fwrite(nul_line, 1, sizeof nul_line - 1, f);
    fclose(f);
    assert_int_equal(vks_task_file_load(path, &tasks, &n), VKS_ERR_FORMAT);
    if (!strstr(vks_last_error(), "bad.jsonl: line 2: a NUL byte at byte 52")) fail_msg("NUL: '%s'", vks_last_error());
    /* no end of line: fails at the limit (an alarm turns reading forever into a failure) */
    alarm(60);
    assert_int_equal(vks_task_file_load("/dev/zero", &tasks, &n), VKS_ERR_FORMAT);
    alarm(0);
    if (!strstr(vks_last_error(), "/dev/zero: line 1: longer than 65536 bytes")) fail_msg("/dev/zero: '%s'", vks_last_error());
}

static void test_sft_file(void **state) {
    (void)state;
    vks_task_spec s;
    assert_int_equal(vks_task_parse("mul:2", &s), VKS_OK);
    char path[1024];
    snprintf(path, sizeof path, "%s/sft.jsonl", tu_tmpdir());
    assert_int_equal(vks_task_write_sft(&s, 42, 3, path), VKS_OK);
    char *text = (char *)tu_read_file(path, NULL);
    assert_non_null(text);
    int lines = 0;
    for (char *p = text; (p = strchr(p, '\n')); p++) lines++;
    assert_int_equal(lines, 3);
    vks_task t = make("mul:2", 42, 0);
    char c[1024], want[4096];
    vks_task_worked_completion(&t, c, sizeof c);
    assert_true(score(&t, c) == 1.0);
    assert_non_null(strstr(text, "\"prompt\":\"What is "));
    snprintf(want, sizeof want, "\\nanswer: %s\"}\n", t.answer);
    assert_non_null(strstr(text, want));
    free(text);
}

/* --task names: built-in, a task file by its shape, an existing file, file:PATH. */
static void test_resolve(void **state) {
    (void)state;
    vks_task_spec s;
    const char *path = (const char *)1;
    assert_int_equal(vks_task_resolve("mul:3", &s, &path), VKS_OK);
    assert_null(path);
    assert_int_equal(s.kind, VKS_TASK_MUL);
    assert_int_equal(s.size, 3);
    assert_int_equal(vks_task_resolve("word.jsonl", &s, &path), VKS_OK); /* need not exist yet: opened later */
    assert_string_equal(path, "word.jsonl");
    assert_int_equal(vks_task_resolve("data/word", &s, &path), VKS_OK);
    assert_string_equal(path, "data/word");
    assert_int_equal(vks_task_resolve("file:add", &s, &path), VKS_OK);
    assert_string_equal(path, "add");
    assert_int_equal(vks_task_resolve("file:", &s, &path), VKS_ERR_ARG);
    assert_int_equal(vks_task_resolve("mul:12", &s, &path), VKS_ERR_ARG); /* a built-in's bad size, not a file */
    assert_non_null(strstr(vks_last_error(), "must be 1 to 9"));
    assert_int_equal(vks_task_resolve("words", &s, &path), VKS_ERR_ARG);
    assert_non_null(strstr(vks_last_error(), "unknown task 'words': neither a built-in task"));
    assert_non_null(strstr(vks_last_error(), "PATH.jsonl"));
    /* an existing file without '/' or .jsonl: a task file (the built-in names stay built-in) */
    char name[64];
    snprintf(name, sizeof name, "own-tasks-%d.txt", (int)getpid());
    FILE *f = fopen(name, "w");
    assert_non_null(f);
    fclose(f);
    int rc = vks_task_resolve(name, &s, &path);
    remove(name);
    assert_int_equal(rc, VKS_OK);
    assert_string_equal(path, name);
}

static vks_task numbered(int64_t line) {
    vks_task t = {.line = line, .verify = VKS_VERIFY_EXACT};
    snprintf(t.prompt, sizeof t.prompt, "task %lld", (long long)line);
    snprintf(t.answer, sizeof t.answer, "%lld", (long long)line);
    return t;
}

/* The held-out split: the right count, disjoint, covering, in file order, a
 * function of the line numbers only (golden, so a change shows), bounded. */
static void test_split(void **state) {
    (void)state;
    vks_task tasks[20], held_first[20];
    int64_t n = 20, n_held = 0;
    for (int i = 0; i < 20; i++) tasks[i] = numbered(i + 1);
    vks_task *held = NULL;
    assert_int_equal(vks_task_split(tasks, &n, 0.25, &held, &n_held), VKS_OK);
    assert_int_equal(n_held, 5);
    assert_int_equal(n, 15);
    bool seen[21] = {0};
    for (int64_t i = 0; i < n_held; i++) seen[held[i].line] = true, held_first[i] = held[i];
    for (int64_t i = 0; i < n; i++) assert_false(seen[tasks[i].line]), seen[tasks[i].line] = true;
    for (int i = 1; i <= 20; i++) assert_true(seen[i]);
    for (int64_t i = 1; i < n_held; i++) assert_true(held[i - 1].line < held[i].line);
    for (int64_t i = 1; i < n; i++) assert_true(tasks[i - 1].line < tasks[i].line);
    char want[32];
    snprintf(want, sizeof want, "task %lld", (long long)held[0].line);
    assert_string_equal(held[0].prompt, want); /* the task itself moved, not just its number */
    static const int64_t golden[5] = {1, 4, 12, 17, 20};
    for (int i = 0; i < 5; i++) assert_int_equal(held[i].line, golden[i]);
    free(held);
    /* the same lines in another order: the same tasks held out */
    for (int i = 0; i < 20; i++) tasks[i] = numbered(20 - i);
    n = 20;
    assert_int_equal(vks_task_split(tasks, &n, 0.25, &held, &n_held), VKS_OK);
    assert_int_equal(n_held, 5);
    for (int64_t i = 0; i < n_held; i++) assert_int_equal(held[n_held - 1 - i].line, held_first[i].line);
    free(held);
    /* at least one held out, at least one kept */
    n = 20;
    assert_int_equal(vks_task_split(tasks, &n, 0.001, &held, &n_held), VKS_OK);
    assert_int_equal(n_held, 1);
    free(held);
    n = 3;
    assert_int_equal(vks_task_split(tasks, &n, 0.99, &held, &n_held), VKS_OK);
    assert_int_equal(n_held, 2);
    assert_int_equal(n, 1);
    free(held);
    n = 1;
    assert_int_equal(vks_task_split(tasks, &n, 0.5, &held, &n_held), VKS_ERR_ARG);
    assert_null(held);
    n = 5;
    assert_int_equal(vks_task_split(tasks, &n, 1.0, &held, &n_held), VKS_ERR_ARG);
    assert_int_equal(vks_task_split(tasks, &n, 0.0, &held, &n_held), VKS_ERR_ARG);
}

static double choose(int n, int k) {
    if (k < 0 || k > n) return 0;
    double c = 1;
    for (int i = 1; i <= k; i++) c = c * (n - k + i) / i;
    return c;
}

/* pass@k against 1 - C(n-c, k) / C(n, k) computed from the binomials. */
static void test_pass_at_k(void **state) {
    (void)state;
    assert_true(fabs(vks_task_pass_at_k(5, 2, 1) - 0.4) < 1e-12);
    assert_true(fabs(vks_task_pass_at_k(5, 2, 2) - 0.7) < 1e-12); /* 1 - 3/10 */
    assert_true(vks_task_pass_at_k(5, 2, 4) == 1.0);
    assert_true(vks_task_pass_at_k(8, 0, 8) == 0.0);
    assert_true(vks_task_pass_at_k(8, 8, 1) == 1.0);
    for (int n = 1; n <= 24; n++)
        for (int c = 0; c <= n; c++)
            for (int k = 1; k <= n; k++) {
                double want = 1.0 - choose(n - c, k) / choose(n, k);
                if (fabs(vks_task_pass_at_k(n, c, k) - want) > 1e-9) fail_msg("pass@%d n %d c %d", k, n, c);
            }
    assert_true(isnan(vks_task_pass_at_k(4, 5, 1)));
    assert_true(isnan(vks_task_pass_at_k(4, 1, 5)));
    assert_true(isnan(vks_task_pass_at_k(4, 1, 0)));
    assert_true(isnan(vks_task_pass_at_k(0, 0, 1)));
}

/* eval's arithmetic on known rewards: accuracy, solved, pass@k, per kind. */
static void test_eval_score(void **state) {
    (void)state;
    vks_task tasks[3] = {numbered(1), numbered(2), numbered(3)};
    snprintf(tasks[0].kind, sizeof tasks[0].kind, "word");
    snprintf(tasks[1].kind, sizeof tasks[1].kind, "math");
    snprintf(tasks[2].kind, sizeof tasks[2].kind, "word");
    /* 4 samples: task 1 solved 1 of 4, task 2 none, task 3 all */
    double rewards[12] = {0, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1};
    int lengths[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    vks_task_eval_result *r = malloc(sizeof *r);
    assert_int_equal(vks_task_eval_score(tasks, 3, 4, rewards, lengths, r), VKS_OK);
    assert_int_equal(r->n, 3);
    assert_int_equal(r->samples, 4);
    assert_int_equal(r->solved, 2);
    assert_true(fabs(r->accuracy - 5.0 / 12) < 1e-12);
    assert_true(fabs(r->mean_length - 6.5) < 1e-12);
    assert_int_equal(r->n_pass, 3);
    assert_int_equal(r->pass_k[0], 1), assert_int_equal(r->pass_k[1], 2), assert_int_equal(r->pass_k[2], 4);
    assert_true(fabs(r->pass_at[0] - 5.0 / 12) < 1e-12);               /* pass@1 = accuracy */
    assert_true(fabs(r->pass_at[1] - (0.5 + 0 + 1) / 3) < 1e-12);      /* task 1: 1 - C(3,2)/C(4,2) = 0.5 */
    assert_true(fabs(r->pass_at[2] - 2.0 / 3) < 1e-12);
    assert_int_equal(r->n_kinds, 2);
    assert_string_equal(r->kinds[0].kind, "word");
    assert_int_equal(r->kinds[0].n, 2);
    assert_true(fabs(r->kinds[0].accuracy - 5.0 / 8) < 1e-12);
    assert_string_equal(r->kinds[1].kind, "math");
    assert_int_equal(r->kinds[1].n, 1);
    assert_true(r->kinds[1].accuracy == 0.0);
    /* 6 samples: k = 1, 2, 4, 6 */
    double r6[6] = {1, 0, 0, 0, 0, 0};
    assert_int_equal(vks_task_eval_score(tasks, 1, 6, r6, lengths, r), VKS_OK);
    assert_int_equal(r->n_pass, 4);
    assert_int_equal(r->pass_k[3], 6);
    assert_true(fabs(r->pass_at[2] - 4.0 / 6) < 1e-12);
    /* more kinds than reported: refused */
    int64_t many = VKS_TASK_MAX_KINDS + 1;
    vks_task *m = calloc((size_t)many, sizeof *m);
    double *mr = calloc((size_t)many, sizeof *mr);
    int *ml = calloc((size_t)many, sizeof *ml);
    for (int64_t i = 0; i < many; i++) m[i] = numbered(i + 1), snprintf(m[i].kind, sizeof m[i].kind, "k%lld", (long long)i);
    assert_int_equal(vks_task_eval_score(m, many, 1, mr, ml, r), VKS_ERR_FORMAT);
    assert_non_null(strstr(vks_last_error(), "task 257: more than 256 task kinds"));
    free(m), free(mr), free(ml), free(r);
}

/* The filter's counts: hard below min, easy above max, the bounds kept. */
static void test_filter_classify(void **state) {
    (void)state;
    double rewards[20] = {0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1};
    double rates[5];
    bool keep[5];
    vks_task_filter_counts c;
    vks_task_filter_classify(rewards, 5, 4, 0.25, 0.75, rates, keep, &c);
    assert_true(rates[0] == 0 && rates[1] == 0.25 && rates[2] == 0.75 && rates[3] == 1 && rates[4] == 0.75);
    assert_false(keep[0]), assert_true(keep[1]), assert_true(keep[2]), assert_false(keep[3]), assert_true(keep[4]);
    assert_int_equal(c.total, 5);
    assert_int_equal(c.hard, 1);
    assert_int_equal(c.kept, 3);
    assert_int_equal(c.easy, 1);
}

/* "kind" in a task file, and vks_task_file_copy: the chosen lines as they were. */
static void test_task_file_kind_and_copy(void **state) {
    (void)state;
    const char *text = "{\"prompt\": \"a\", \"answer\": \"1\", \"task_type\": \"numeric\", \"kind\": \"word problems\"}\n"
                       "\n"
                       "{\"prompt\": \"b\",   \"answer\": \"2\", \"task_type\": \"exact\"}\r\n"
                       "{\"prompt\": \"c\", \"answer\": \"3\", \"task_type\": \"add\"}\n";
    char *path = write_tmp("kinds.jsonl", text);
    char in[1024], out[1100];
    snprintf(in, sizeof in, "%s", path);
    vks_task *tasks = NULL;
    int64_t n = 0;
    if (vks_task_file_load(in, &tasks, &n)) fail_msg("%s", vks_last_error());
    assert_int_equal(n, 3);
    assert_string_equal(tasks[0].kind, "word problems");
    assert_string_equal(tasks[1].kind, "exact");
    assert_string_equal(tasks[2].kind, "add");
    vks_task pick[2] = {tasks[1], tasks[2]};
    snprintf(out, sizeof out, "%s.copy", in);
    assert_int_equal(vks_task_file_copy(in, pick, 2, out), VKS_OK);
    char *copied = (char *)tu_read_file(out, NULL);
    assert_string_equal(copied, "{\"prompt\": \"b\",   \"answer\": \"2\", \"task_type\": \"exact\"}\n"
                                "{\"prompt\": \"c\", \"answer\": \"3\", \"task_type\": \"add\"}\n");
    free(copied);
    free(tasks);
    vks_task t = make("add:2", 1, 0);
    assert_string_equal(t.kind, "add:2");
    expect_load_error("{\"prompt\": \"a\", \"answer\": \"b\", \"task_type\": \"exact\", \"kind\": 3}\n",
                      "line 1: \"kind\" is not a string");
    expect_load_error("{\"prompt\": \"a\", \"answer\": \"b\", \"task_type\": \"exact\", \"kind\": \"\"}\n",
                      "line 1: \"kind\" is empty");
    expect_load_error("{\"prompt\": \"a\", \"answer\": \"b\", \"task_type\": \"exact\", "
                      "\"kind\": \"0123456789012345678901234567890123\"}\n", "line 1: \"kind\" is longer than 31 bytes");
}

/* A tiny model scored by generation: accuracy is a fraction, lengths are
 * bounded, and greedy results do not depend on the batch size. */
static void test_run_tiny_model(void **state) {
    (void)state;
    vks_gpu *g = tu_gpu_open();
    if (!g) skip();
    vks_model *m = NULL;
    vks_tokenizer *tok = NULL;
    assert_int_equal(vks_model_init_tiny(3, &m, &tok), VKS_OK);
    vks_task tasks[5];
    for (uint32_t i = 0; i < 5; i++) tasks[i] = make("reverse:2", 9, i);
    vks_task_run_options o = {.samples = 2, .max_new_tokens = 12, .batch = 3, .seed = 1};
    double r1[10], r2[10];
    int l1[10], l2[10];
    memset(r1, 0xff, sizeof r1);
    memset(l1, 0xff, sizeof l1);
    assert_int_equal(vks_task_run(g, m, tok, tasks, 5, &o, r1, l1), VKS_OK);
    o.batch = 10;
    assert_int_equal(vks_task_run(g, m, tok, tasks, 5, &o, r2, l2), VKS_OK);
    for (int i = 0; i < 10; i++) {
        assert_true(r1[i] == 0.0 || r1[i] == 1.0);
        assert_true(l1[i] >= 0 && l1[i] <= 12);
        assert_true(r1[i] == r2[i]);
        assert_int_equal(l1[i], l2[i]);
    }
    assert_int_equal(l1[0], l1[1]); /* greedy: both samples of a task alike */
    vks_task_spec s;
    vks_task_parse("add:1", &s);
    vks_task_eval_result er;
    o.max_new_tokens = 4;
    assert_int_equal(vks_task_eval(g, m, tok, &s, 5, 6, &o, &er), VKS_OK);
    assert_int_equal(er.n, 6);
    assert_true(er.accuracy >= 0 && er.accuracy <= 1);
    assert_true(er.mean_length >= 0 && er.mean_length <= 4);
    vks_model_free(m);
    vks_tokenizer_free(tok);
    vks_gpu_destroy(g);
}

typedef struct {
    char text[64][512];
    int n;
} seen_texts;

static char shown[256]; /* the first prompt as eval shows it (vks_task_run_options.show_prompt) */
static void keep_shown(void *ctx, const char *text, size_t len) {
    (void)ctx;
    snprintf(shown, sizeof shown, "%.*s", (int)len, text);
}

static void keep_text(void *ctx, const vks_task *task, int64_t completion, const char *text, size_t len, int tokens,
                      double reward) {
    (void)task, (void)tokens, (void)reward;
    seen_texts *s = ctx;
    assert_true(completion >= 0 && completion < 64);
    snprintf(s->text[completion], sizeof s->text[completion], "%.*s", (int)len, text);
    s->n++;
}

/* Episodes generated by eval (vks_task_run on environment tasks): a tiny model's turns (random text, ended by
 * EOS now and then) stepped through a program that answers "ok" and ends the episode after its second turn
 * with reward 1. Each episode's turns are sampled with its own sequence index: the same rewards, lengths and
 * conversations whatever the batch size (the episodes still going differ); a two-turn episode's text holds the
 * reply between its turns; a budget too small for a turn cuts every episode (reward 0); a set mixing
 * environment tasks with others, or a chat template, is refused before anything runs. */
static void test_run_episodes(void **state) {
    (void)state;
    vks_gpu *g = tu_gpu_open();
    if (!g) skip();
    vks_model *m = NULL;
    vks_tokenizer *tok = NULL;
    assert_int_equal(vks_model_init_tiny(3, &m, &tok), VKS_OK);
    char *py = write_tmp("two.py", "import json, sys\n"
                        "turns = {}\n"
                        "for line in sys.stdin:\n"
                        "    q = json.loads(line)\n"
                        "    if q['type'] == 'reset':\n"
                        "        turns[q['episode']] = 0\n"
                        "        a = {'messages': [{'role': 'user', 'content': 'say'}]}\n"
                        "    else:\n"
                        "        turns[q['episode']] += 1\n"
                        "        done = turns[q['episode']] == 2\n"
                        "        a = {'messages': [] if done else [{'role': 'tool', 'content': 'ok'}], 'done': done, "
                        "'reward': 1.0, 'metrics': {'turns': turns[q['episode']], 'bad name!': 1}}\n"
                        "    print(json.dumps(a), flush=True)\n");
    char lines[3000]; /* the program by its path (each write_tmp is in a directory of its own) */
    snprintf(lines, sizeof lines,
             "{\"task_type\": \"environment\", \"environment\": \"python3 %s\", \"sandbox\": false}\n"
             "{\"task_type\": \"environment\", \"environment\": \"python3 %s\", \"sandbox\": false, \"max_turns\": 1}\n",
             py, py);
    char *path = write_tmp("episodes.jsonl", lines);
    vks_task *tasks = NULL;
    int64_t n = 0;
    assert_int_equal(vks_task_file_load(path, &tasks, &n), VKS_OK);
    static seen_texts a, b;
    memset(&a, 0, sizeof a), memset(&b, 0, sizeof b);
    vks_task_run_options o = {.samples = 32, .max_new_tokens = 160, .batch = 5, .seed = 3, .temperature = 1.0f,
                              .on_completion = keep_text, .completion_ctx = &a, .show_prompt = keep_shown};
    double r1[64], r2[64];
    int l1[64], l2[64];
    shown[0] = 0;
    if (vks_task_run(g, m, tok, tasks, 2, &o, r1, l1) != VKS_OK) fail_msg("%s", vks_last_error());
    assert_string_equal(shown, "say"); /* the environment's start, not the task line's (absent) prompt */
    o.show_prompt = NULL;
    o.batch = 64, o.completion_ctx = &b;
    assert_int_equal(vks_task_run(g, m, tok, tasks, 2, &o, r2, l2), VKS_OK);
    assert_int_equal(a.n, 64);
    int two_turns = 0;
    for (int i = 0; i < 64; i++) {
        assert_true(r1[i] == r2[i]);
        assert_int_equal(l1[i], l2[i]);
        assert_string_equal(a.text[i], b.text[i]);
        assert_true(l1[i] >= 0 && l1[i] <= 160);
        if (i >= 32) assert_true(r1[i] == 0.0); /* max_turns 1: never done */
        if (r1[i] == 1.0) {
            two_turns++;
            const char *reply = strstr(a.text[i], "\nok\n");
            assert_non_null(reply);
            assert_null(strstr(reply + 1, "\nok\n")); /* one reply: between the two turns */
        }
    }
    if (two_turns < 2) fail_msg("only %d of 32 episodes reached a second turn", two_turns);
    /* eval's metrics: those of the episodes that ended (here after two turns), a name metrics cannot carry left out */
    vks_task_eval_result er;
    o.on_completion = NULL;
    assert_int_equal(vks_task_eval_tasks(g, m, tok, tasks, 2, &o, &er), VKS_OK);
    assert_true(er.accuracy == two_turns / 64.0);
    assert_int_equal(er.n_metrics, 1);
    assert_string_equal(er.metric_names[0], "turns");
    assert_true(er.metric_means[0] == 2.0);
    o.max_new_tokens = 1, o.batch = 8; /* no turn ends in time: every episode cut */
    assert_int_equal(vks_task_run(g, m, tok, tasks, 2, &o, r1, l1), VKS_OK);
    for (int i = 0; i < 64; i++) assert_true(r1[i] == 0.0 && l1[i] <= 1);
    vks_task mixed[2] = {tasks[0], make("add:1", 1, 0)};
    assert_int_equal(vks_task_run(g, m, tok, mixed, 2, &o, r1, l1), VKS_ERR_FORMAT);
    assert_non_null(strstr(vks_last_error(), "a set of tasks with episodes runs environment tasks only"));
    /* chatml's turns end with <|im_end|>, the tiny tokenizer's with its EOS: no turn could be continued */
    vks_prompt_format chat;
    vks_prompt_format_default(&chat);
    assert_int_equal(vks_prompt_set(&chat, "chat_template", "chatml", NULL), VKS_OK);
    o.prompt = &chat, o.max_new_tokens = 160;
    assert_int_equal(vks_task_run(g, m, tok, tasks, 2, &o, r1, l1), VKS_ERR_FORMAT);
    assert_non_null(strstr(vks_last_error(), "chat template chatml: an assistant turn is not followed by its stop token"));
    assert_int_equal(vks_prompt_set(&chat, "user_template", "Q: {prompt}", NULL), VKS_OK);
    assert_int_equal(vks_task_run(g, m, tok, tasks, 2, &o, r1, l1), VKS_ERR_FORMAT);
    assert_non_null(strstr(vks_last_error(), "a user template and a think sentence do not apply"));
    vks_task_programs_stop();
    vks_task_free(tasks, n);
    vks_model_free(m);
    vks_tokenizer_free(tok);
    vks_gpu_destroy(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generators_golden), cmocka_unit_test(test_worked_completions_solve),
        cmocka_unit_test(test_extract_answer),    cmocka_unit_test(test_numeric_and_list),
        cmocka_unit_test(test_countdown_verifier), cmocka_unit_test(test_length_reward),
        cmocka_unit_test(test_prompt_think_sentence), cmocka_unit_test(test_prompt_chat_templates),
        cmocka_unit_test(test_prompt_errors),     cmocka_unit_test(test_prompt_tokenize),
        cmocka_unit_test(test_prompt_llama3_bos),
        cmocka_unit_test(test_task_file),         cmocka_unit_test(test_sft_file),
        cmocka_unit_test(test_task_file_limits),
        cmocka_unit_test(test_resolve),           cmocka_unit_test(test_split),
        cmocka_unit_test(test_pass_at_k),         cmocka_unit_test(test_eval_score),
        cmocka_unit_test(test_filter_classify),   cmocka_unit_test(test_task_file_kind_and_copy),
        cmocka_unit_test(test_run_tiny_model),    cmocka_unit_test(test_calc_environment),
        cmocka_unit_test(test_run_episodes),      cmocka_unit_test(test_prompt_episodes),
    };
    if (getenv("VKSWARM_TEST_FILTER")) cmocka_set_test_filter(getenv("VKSWARM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
