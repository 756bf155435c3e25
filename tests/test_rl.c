/* The RL run end to end on one machine (vks_rl.h), with the built-in tiny
 * model and short user tasks: rollouts flow from the inference thread through
 * the verifier to the trainer, the async window holds (k = 0: every step on
 * the newest weights, the sampler's log-probabilities equal the trainer's;
 * k = 1: at most one step old), losses are finite, a cheating inference
 * worker's completions are rejected and never trained on, the timeline shows
 * the synchronous trainer waiting while inference generates, and a run whose
 * groups never carry signal ends with an error instead of waiting forever. */
#include "test_util.h"
#include "vkswarm/vks_lora.h"
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "vkswarm/vks_checkpoint.h"
#include "vkswarm/vks_difficulty_pool.h"
#include "vkswarm/vks_gpu.h"
#include "vkswarm/vks_metrics.h"
#include "vkswarm/vks_model.h"
#include "vkswarm/vks_rl.h"
#include "vkswarm/vks_rollout.h"
#include "vkswarm/vks_sft.h"
#include "vkswarm/vks_tasks.h"
#include "vkswarm/vks_tokenizer.h"
#include "../src/rl/rl_internal.h" /* the run directory lock (internal to src/rl) */

#define assert_near(a, b, tol) assert_true(fabs((double)(a) - (double)(b)) <= (tol))

static vks_gpu *gpu_a, *gpu_b;
static vks_model *tiny;
static vks_tokenizer *tok;
static char tasks_path[400];

static int setup(void **state) {
    (void)state;
    if (!(gpu_a = tu_gpu_open()) || !(gpu_b = tu_gpu_open())) return -1;
    if (vks_model_init_tiny(1, &tiny, &tok)) return -1;
    snprintf(tasks_path, sizeof tasks_path, "%s/tasks.jsonl", tu_tmpdir());
    FILE *f = fopen(tasks_path, "w");
    if (!f) return -1;
    for (int i = 0; i < 8; i++) fprintf(f, "{\"prompt\": \"%d+%d=\", \"answer\": \"%d\", \"task_type\": \"numeric\"}\n", i, i + 1, 2 * i + 1);
    return fclose(f);
}

static int teardown(void **state) {
    (void)state;
    vks_model_free(tiny);
    vks_tokenizer_free(tok);
    vks_gpu_destroy(gpu_a);
    vks_gpu_destroy(gpu_b);
    return 0;
}

typedef struct {
    int n;
    vks_rl_progress p[16];
} progress_log;

/* test_synchronous_run's directory and last loss, for test_resume */
static char k0_out[600];
static double k0_last_loss = NAN;

/* The entropy of the uniform distribution over the vocabulary: the largest. */
static double max_entropy(void) { return log((double)tiny->cfg.vocab_size) + 1e-6; }

static void on_progress(void *ctx, const vks_rl_progress *p) {
    progress_log *l = ctx;
    if (l->n < 16) l->p[l->n++] = *p;
}

static int resume_calls;
static int64_t resume_step;
static char resume_dir[4096];

static void on_resume(void *ctx, const char *checkpoint, int64_t step) {
    (void)ctx;
    resume_calls++;
    resume_step = step;
    snprintf(resume_dir, sizeof resume_dir, "%s", checkpoint ? checkpoint : "(none)");
}

/* An untrained tiny model solves nothing; the thinking budget (targets 4
 * and 12 tokens) still makes rewards differ within a group. */
static void small_config(vks_rl_config *c, const char *out, int steps, int k) {
    vks_rl_config_defaults(c);
    snprintf(c->task, sizeof c->task, "file:%s", tasks_path);
    snprintf(c->out, sizeof c->out, "%s", out);
    c->steps = steps, c->prompts_per_step = 2, c->group_size = 4, c->async_level = k, c->max_new_tokens = 12;
    c->length_targets[0] = 4, c->length_targets[1] = 12, c->n_length_targets = 2;
    c->lr = 1e-3;
    assert_int_equal(vks_rl_config_check(c, 1), VKS_OK);
}

static vks_rl_run_options options(const vks_rl_config *c, progress_log *log) {
    return (vks_rl_run_options){.config = c, .model = tiny, .tok = tok, .train_gpu = gpu_a, .infer_gpu = gpu_b,
                                .verify = true, .progress = on_progress, .progress_ctx = log};
}

/* OUT/timeline.svg of a synchronous run: an SVG with both rows; the trainer
 * waited while the inference thread generated and verified (k = 0: it has
 * nothing else to wait for), and inference waited while the trainer trained. */
static void check_timeline(const vks_rl_result *r, int steps) {
    size_t len;
    char *svg = (char *)tu_read_file(r->timeline_path, &len);
    assert_non_null(svg);
    const char *root = svg;
    if (!strncmp(svg, "<?xml", 5)) { /* after the XML declaration */
        root = strstr(svg, "?>\n");
        assert_non_null(root);
        root += 3;
    }
    assert_true(!strncmp(root, "<svg", 4));
    assert_true(len > 8 && !strcmp(svg + len - 7, "</svg>\n"));
    assert_non_null(strstr(svg, ">trainer</text>"));
    assert_non_null(strstr(svg, ">inference</text>"));
    assert_non_null(strstr(svg, ">step 1</text>"));
    free(svg);
    const vks_rl_timeline_summary *t = &r->timeline;
    fprintf(stderr,
            "timeline, steps %lld-%lld (%.2f-%.2f s): trainer wait %.3f (on inference %.3f), train %.3f, publish %.3f; "
            "inference wait %.3f (on the trainer %.3f), load %.3f, generate %.3f, verify %.3f\n",
            (long long)t->first_step, (long long)t->last_step, t->start, t->end, t->trainer_wait,
            t->trainer_wait_on_inference, t->trainer_train, t->trainer_publish, t->inference_wait,
            t->inference_wait_on_trainer, t->inference_load, t->inference_generate, t->inference_verify);
    assert_true(t->first_step == 1 && t->last_step == steps); /* fewer steps than shown: the whole run */
    assert_true(t->trainer_wait > 0 && t->trainer_train > 0 && t->inference_generate > 0 && t->inference_verify > 0);
    assert_true(t->trainer_wait_on_inference >= 0.8 * t->trainer_wait);
    assert_true(t->inference_wait_on_trainer >= 0.8 * t->trainer_train);
}

static void test_synchronous_run(void **state) {
    (void)state;
    vks_rl_config c;
    char out[600];
    snprintf(out, sizeof out, "%s/rl-k0", tu_tmpdir());
    snprintf(k0_out, sizeof k0_out, "%s", out);
    int steps = 2;
    small_config(&c, out, steps, 0);
    c.save_every = 1, c.keep = 0; /* step-1 for test_resume */
    progress_log log = {0};
    vks_rl_run_options o = options(&c, &log);
    vks_rl_result r;
    int rc = vks_rl_run(&o, &r);
    if (rc) fail_msg("%s", vks_last_error());
    assert_int_equal(log.n, steps);
    for (int i = 0; i < log.n; i++) {
        const vks_rl_progress *p = &log.p[i];
        fprintf(stderr, "k=0 step %lld: lag %.2f, loss %.5f, mismatch %.2g, length %.1f, idle %.2f, entropy %.4f\n",
                (long long)p->step, p->policy_lag, p->loss, p->logp_mismatch, p->length, p->trainer_idle, p->entropy);
        /* the mean entropy is reported with the bonus off: a distribution's, 0 < H <= log V */
        assert_true(p->entropy > 0 && p->entropy <= max_entropy());
        assert_int_equal(p->step, i + 1);
        assert_true(p->policy_lag == 0.0); /* k = 0: every group made by the newest weights */
        assert_true(isfinite(p->loss) && isfinite(p->grad_norm) && p->grad_norm > 0);
        /* same weights: the sampler's log-probabilities are the trainer's (f32 rounding only) */
        assert_true(p->logp_mismatch < 1e-4);
        assert_true(p->mismatch_kl >= 0 && p->mismatch_kl < 1e-8); /* ~x^2 / 2 */
        assert_true(p->length > 0 && p->length <= 13);
        assert_true(p->accept_rate == 1.0); /* honest work passes the verifier */
        /* the untrained model solves none of the tasks: the task reward of every completion is 0 */
        assert_true(p->reward == 0.0 && p->trained_reward == 0.0);
    }
    assert_true(r.rollouts >= steps * 8 && r.accepted == r.rollouts && r.rejected == 0);
    assert_int_equal(r.groups_stale, 0);
    assert_int_equal(r.resumed_from, -1);
    k0_last_loss = log.p[steps - 1].loss;
    vks_model *m = NULL;
    assert_int_equal(vks_model_load(r.final_checkpoint, &m), VKS_OK);
    assert_int_equal(m->cfg.dim, tiny->cfg.dim);
    vks_model_free(m);
    size_t len;
    char *metrics = (char *)tu_read_file(r.metrics_path, &len);
    assert_non_null(metrics);
    assert_non_null(strstr(metrics, "\"policy_lag\""));
    assert_non_null(strstr(metrics, "\"entropy\":"));
    assert_non_null(strstr(metrics, "\"mismatch_kl\":"));
    free(metrics);
    check_timeline(&r, steps);
    assert_int_equal(vks_gpu_validation_messages(gpu_a) + vks_gpu_validation_messages(gpu_b), 0);
}

/* metrics.jsonl of a fresh run evaluated at the start and the end (1 step):
 * a step-0 line with the start's held-out accuracy, greedy and sampled, each
 * with its standard error (binomial) and the n instances, then step 1's with
 * the same fields. */
static void check_eval_lines(const char *path, int n) {
    char *text = (char *)tu_read_file(path, NULL);
    assert_non_null(text);
    int lines = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"), lines++) {
        json_t *o = json_loads(line, 0, NULL);
        assert_true(json_is_object(o));
        assert_int_equal(json_integer_value(json_object_get(o, "step")), lines);
        const char *acc[2][3] = {{"accuracy", "accuracy_se", "accuracy_n"},
                                 {"accuracy_sampled", "accuracy_sampled_se", "accuracy_sampled_n"}};
        for (int k = 0; k < 2; k++) {
            json_t *a = json_object_get(o, acc[k][0]), *se = json_object_get(o, acc[k][1]), *m = json_object_get(o, acc[k][2]);
            if (!json_is_number(a) || !json_is_number(se) || !json_is_number(m)) fail_msg("%s: line %d: %s", path, lines, line);
            double p = json_number_value(a);
            assert_true(p >= 0 && p <= 1);
            assert_int_equal((int)json_number_value(m), n);
            assert_near(json_number_value(se), sqrt(p * (1 - p) / n), 1e-12);
        }
        json_decref(o);
    }
    assert_int_equal(lines, 2);
    free(text);
}

/* OUT/report.html's sample table: each completion's task by index and line of
 * the task file, and its expected answer (tasks.jsonl: line L's is 2L - 1). */
static void check_report_samples(const char *out) {
    char p[700];
    snprintf(p, sizeof p, "%s/report.html", out);
    char *page = (char *)tu_read_file(p, NULL);
    assert_non_null(page);
    const char *q = strstr(page, "<table id=\"samples\">");
    assert_non_null(q);
    int rows = 0;
    long long index, line, policy, answer;
    while ((q = strstr(q, "<tr><td>1</td><td>"))) {
        q += strlen("<tr><td>1</td><td>");
        if (sscanf(q, "%lld (line %lld)</td><td>%lld</td>", &index, &line, &policy) != 3) fail_msg("a sample row: %.200s", q);
        const char *e = strstr(q, "<td class=\"text expected\">");
        assert_non_null(e);
        if (sscanf(e + strlen("<td class=\"text expected\">"), "%lld</td>", &answer) != 1) fail_msg("expected: %.80s", e);
        assert_true(line >= 1 && line <= 8);
        assert_int_equal(answer, 2 * line - 1);
        rows++;
    }
    assert_in_range(rows, 1, 4);
    free(page);
}

/* A task file with eval_split: the held-out tasks go to OUT/heldout.jsonl as
 * they were, and held-out accuracy is measured on them (0 for the untrained
 * model, not NaN); without a held-out set a task file is not evaluated. */
static void test_heldout_accuracy(void **state) {
    (void)state;
    vks_rl_config c;
    char out[600], path[700];
    snprintf(out, sizeof out, "%s/rl-heldout", tu_tmpdir());
    small_config(&c, out, 1, 0);
    c.eval_split = 0.25; /* 2 of the 8 tasks */
    assert_int_equal(vks_rl_config_check(&c, 1), VKS_OK);
    progress_log log = {0};
    vks_rl_run_options o = options(&c, &log);
    o.eval_n = 5;
    vks_rl_result *r = malloc(sizeof *r);
    if (vks_rl_run(&o, r)) fail_msg("%s", vks_last_error());
    assert_true(r->start_accuracy == 0.0 && r->final_accuracy == 0.0);
    assert_true(log.p[0].accuracy == 0.0);
    assert_int_equal(r->eval_tasks, 2);
    check_eval_lines(r->metrics_path, 2);
    check_report_samples(out);
    snprintf(path, sizeof path, "%s/heldout.jsonl", out);
    assert_string_equal(r->heldout_path, path);
    assert_non_null(strstr(r->eval_set, "2 of the 8 tasks of "));
    char *held = (char *)tu_read_file(path, NULL), *all = (char *)tu_read_file(tasks_path, NULL);
    assert_non_null(held);
    int lines = 0;
    for (char *line = strtok(held, "\n"); line; line = strtok(NULL, "\n"), lines++)
        assert_non_null(strstr(all, line)); /* a line of the task file, as it was */
    assert_int_equal(lines, 2);
    free(held), free(all);
    /* the same file as eval_tasks, no split: all 8 evaluated (eval_n 5 of them) */
    snprintf(out, sizeof out, "%s/rl-evaltasks", tu_tmpdir());
    small_config(&c, out, 1, 0);
    snprintf(c.eval_tasks, sizeof c.eval_tasks, "%s", tasks_path);
    assert_int_equal(vks_rl_config_check(&c, 1), VKS_OK);
    if (vks_rl_run(&o, r)) fail_msg("%s", vks_last_error());
    assert_int_equal(r->eval_tasks, 8);
    assert_true(r->start_accuracy == 0.0);
    assert_string_equal(r->heldout_path, "");
    /* neither: not evaluated */
    snprintf(out, sizeof out, "%s/rl-noeval", tu_tmpdir());
    small_config(&c, out, 1, 0);
    if (vks_rl_run(&o, r)) fail_msg("%s", vks_last_error());
    assert_true(isnan(r->start_accuracy));
    assert_int_equal(r->eval_tasks, 0);
    free(r);
}

/* `vkswarm verify --cpu` (no --stop-ids) on the run's rollout files against
 * the step-1 checkpoint: the batches that policy made are accepted (the tiny
 * model's EOS, 257, is trusted as the checkpoint declares it); the others are
 * refused only for naming another model. Issue 36: each file and each of its
 * records names the policy step that made it and where its weights are (the
 * run saves every step: OUT/step-N; step 0: the start model), and verify with
 * the wrong weights says both hashes and that step, status 2. */
static void verify_with_cli(const char *out) {
    int accepted = 0, other = 0, wrong = 0;
    for (int b = 0; b < 64; b++) {
        char path[800], cmd[2400], *text = NULL, where[700], hex[65], want[1600];
        snprintf(path, sizeof path, "%s/rollouts/batch-%06d.jsonl", out, b);
        vks_rollout_file rf;
        if (access(path, F_OK)) continue;
        assert_int_equal(vks_rollout_read(path, &rf), VKS_OK);
        assert_true(rf.header.has_policy);
        int64_t step = rf.header.policy_step;
        assert_true(step >= 0 && step <= 2);
        if (step) snprintf(where, sizeof where, "%s/step-%09lld", out, (long long)step);
        else snprintf(where, sizeof where, "the start model (vkswarm rl --model)");
        assert_string_equal(rf.header.policy_weights, where);
        for (int i = 0; i < rf.n_samples; i++) assert_true(rf.samples[i].has_policy && rf.samples[i].policy_step == step);
        vks_hash_hex(rf.header.model_hash, hex);
        vks_rollout_file_free(&rf);
        snprintf(cmd, sizeof cmd, "'%s' verify --model '%s/step-000000001' --rollouts '%s' --cpu --jsonl 2>&1",
                 tu_bin(), out, path);
        int rc = tu_run(cmd, &text);
        assert_non_null(text);
        snprintf(want, sizeof want, "vkswarm: verify: wrong weights: %s was made by model_hash %s, --model has "
                 "model_hash ", path, hex);
        bool said = false;
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
            if (strstr(line, "\"accepted\":true")) accepted++;
            else if (!strncmp(line, want, strlen(want))) {
                char tail[800];
                snprintf(tail, sizeof tail, "; it needs the weights of policy step %lld: %s", (long long)step, where);
                if (!strstr(line, tail)) fail_msg("'%s' lacks '%s'", line, tail);
                said = true;
            } else if (!strstr(line, "another model") && strncmp(line, "verified ", 9) && strncmp(line, "verify: ", 8))
                other++, fprintf(stderr, "verify: %s\n", line); /* (stderr's summary and progress lines skipped) */
        }
        free(text);
        assert_int_equal(rc, step == 1 ? 0 : 2);
        assert_true(said == (step != 1));
        wrong += said;
    }
    fprintf(stderr, "vkswarm verify of the rollouts against step 1: %d accepted, %d files of other steps refused "
            "naming their step, %d lines refused for another reason\n", accepted, wrong, other);
    assert_true(accepted >= 8); /* step 2's groups, at least one batch of 2 x 4 */
    assert_true(wrong >= 1);
    assert_int_equal(other, 0);
}

/* The synchronous run above, its last step lost (its checkpoint removed) and
 * resumed: at k = 0 the resumed step trains on the same rollouts with the same
 * weights and moments, so its loss is the straight run's, bit for bit. */
static void test_resume(void **state) {
    (void)state;
    assert_false(isnan(k0_last_loss)); /* test_synchronous_run ran */
    vks_rl_config c;
    char cmd[2000];
    const char *out = k0_out;
    small_config(&c, out, 2, 0);
    /* save_every may change on --resume: at 2 the step resumed from (1) is not one the rule saves,
     * yet its checkpoint is there, and the rollout files its policy makes name it (verify_with_cli) */
    c.save_every = 2, c.keep = 0;
    snprintf(cmd, sizeof cmd, "rm -r '%s/step-000000002'", out);
    assert_int_equal(tu_run(cmd, NULL), 0);
    progress_log log = {0};
    vks_rl_run_options o = options(&c, &log);
    o.resume = true;
    o.on_resume = on_resume; /* said before training (issue 23, point 17: --model was replaced without a word) */
    resume_calls = 0;
    vks_rl_result r;
    int rc = vks_rl_run(&o, &r);
    if (rc) fail_msg("%s", vks_last_error());
    assert_int_equal(resume_calls, 1);
    assert_int_equal(resume_step, 1);
    char want[700];
    snprintf(want, sizeof want, "%s/step-000000001", out);
    assert_string_equal(resume_dir, want);
    assert_int_equal(r.resumed_from, 1);
    assert_int_equal(log.n, 1);
    assert_int_equal(log.p[0].step, 2);
    assert_true(log.p[0].policy_lag == 0.0);
    fprintf(stderr, "resumed step 2: loss %.9g, straight %.9g\n", log.p[0].loss, k0_last_loss);
    assert_true(log.p[0].loss == k0_last_loss);
    /* metrics.jsonl: step 1 from before, step 2 once (the lost run's line dropped) */
    size_t len;
    char *metrics = (char *)tu_read_file(r.metrics_path, &len);
    assert_non_null(metrics);
    int lines = 0;
    for (size_t i = 0; i < len; i++) lines += metrics[i] == '\n';
    assert_int_equal(lines, 2);
    free(metrics);
    verify_with_cli(out);
    /* a resume with another task is refused, nothing trained */
    snprintf(c.task, sizeof c.task, "add:1");
    log.n = 0;
    assert_int_equal(vks_rl_run(&o, &r), VKS_ERR_ARG);
    if (!strstr(vks_last_error(), "resume: task was \"file:") || !strstr(vks_last_error(), "now \"add:1\""))
        fail_msg("another task: '%s'", vks_last_error()); /* names the key and both values (issue 26) */
    assert_int_equal(log.n, 0);
    /* a bad rl_next_batch is named as such (it was "not an RL run's checkpoint") */
    small_config(&c, out, 2, 0); /* the task again */
    c.save_every = 1, c.keep = 0;
    snprintf(cmd, sizeof cmd, "sed -i 's/\"rl_next_batch\": *[0-9]*/\"rl_next_batch\": -5/' '%s/step-000000002/state.json' && "
             "grep -q '\"rl_next_batch\": -5' '%s/step-000000002/state.json'", out, out);
    assert_int_equal(tu_run(cmd, NULL), 0);
    assert_int_equal(vks_rl_run(&o, &r), VKS_ERR_FORMAT);
    if (!strstr(vks_last_error(), "step-000000002/state.json: rl_next_batch is not an integer in [0, 2^40]"))
        fail_msg("bad rl_next_batch: '%s'", vks_last_error());
    assert_int_equal(log.n, 0);
}

/* lora.rank > 0 (k = 0, 3 steps, checkpoints every step): only the adapter
 * trains; the inference thread applies each step's adapter to the frozen
 * base (the sampler's log-probabilities are the trainer's), the verifier
 * replays with it and accepts every completion; checkpoints are PEFT
 * adapter directories; a resume from step 2 gives step 3's loss bit for bit;
 * a changed lora key is refused on resume, nothing trained. */
static void test_lora_run(void **state) {
    (void)state;
    char out[600];
    snprintf(out, sizeof out, "%s/rl-lora", tu_tmpdir());
    vks_rl_config c;
    small_config(&c, out, 3, 0);
    c.save_every = 1, c.keep = 0, c.lr = 1e-2;
    assert_int_equal(vks_rl_config_set(&c, "lora.rank=4"), VKS_OK);
    assert_int_equal(vks_rl_config_set(&c, "lora.targets=q,v,down"), VKS_OK);
    progress_log log = {0};
    vks_rl_run_options o = options(&c, &log);
    vks_rl_result r;
    if (vks_rl_run(&o, &r)) fail_msg("%s", vks_last_error());
    assert_int_equal(log.n, 3);
    for (int i = 0; i < log.n; i++) {
        const vks_rl_progress *p = &log.p[i];
        fprintf(stderr, "lora step %lld: loss %.6f, mismatch %.2g, grad norm %.3g\n", (long long)p->step, p->loss,
                p->logp_mismatch, p->grad_norm);
        assert_true(p->policy_lag == 0.0 && p->logp_mismatch < 1e-4 && p->accept_rate == 1.0);
        assert_true(isfinite(p->loss) && isfinite(p->grad_norm));
    }
    assert_true(r.rollouts >= 3 * 8 && r.accepted == r.rollouts && r.rejected == 0);
    double straight = log.p[2].loss;
    char path[800];
    snprintf(path, sizeof path, "%s/step-000000003/adapter_config.json", out);
    char *cfg = (char *)tu_read_file(path, NULL);
    assert_non_null(cfg);
    assert_non_null(strstr(cfg, "\"r\": 4"));
    free(cfg);
    vks_lora_adapter *a = NULL;
    snprintf(path, sizeof path, "%s/step-000000003", out);
    if (vks_lora_load(path, tiny, &a)) fail_msg("%s", vks_last_error());
    const float *B = vks_lora_adapter_B(a, 0, VKS_LORA_V); /* trained: no longer PEFT's zero */
    double sum = 0;
    for (int i = 0; i < 4 * tiny->cfg.kv_dim; i++) sum += fabs(B[i]);
    assert_true(sum > 0);
    vks_lora_adapter_free(a);
    /* resume from step 2 */
    char cmd[1800];
    snprintf(cmd, sizeof cmd, "rm -r '%s/step-000000003'", out);
    assert_int_equal(tu_run(cmd, NULL), 0);
    log.n = 0;
    o.resume = true;
    if (vks_rl_run(&o, &r)) fail_msg("%s", vks_last_error());
    assert_int_equal(r.resumed_from, 2);
    assert_int_equal(log.n, 1);
    fprintf(stderr, "lora resumed step 3: loss %.9g, straight %.9g\n", log.p[0].loss, straight);
    assert_true(log.p[0].loss == straight);
    /* another rank on resume: refused naming the key, nothing trained */
    log.n = 0;
    c.steps = 4;
    assert_int_equal(vks_rl_config_set(&c, "lora.rank=8"), VKS_OK);
    assert_int_equal(vks_rl_run(&o, &r), VKS_ERR_ARG);
    if (!strstr(vks_last_error(), "holds a LoRA adapter of rank 4")) fail_msg("another rank: '%s'", vks_last_error());
    assert_int_equal(log.n, 0);
    assert_int_equal(vks_gpu_validation_messages(gpu_a) + vks_gpu_validation_messages(gpu_b), 0);
}

/* OUT/rollouts/rejected.jsonl: one object per rejected completion, with the
 * verifier's reason (the cheat fails the sampling replay: a gap above the
 * margin) and the numbers it measured; batch/sample name its rollout line. */
static void check_rejections(const vks_rl_result *r) {
    char path[4300];
    snprintf(path, sizeof path, "%s/rejected.jsonl", r->rollouts_dir);
    size_t len;
    char *text = (char *)tu_read_file(path, &len);
    assert_non_null(text);
    assert_true(len > 0 && text[len - 1] == '\n');
    int lines = 0;
    for (char *line = text, *end; *line; line = end + 1) {
        end = strchr(line, '\n');
        assert_non_null(end);
        json_t *o = json_loadb(line, (size_t)(end - line), JSON_REJECT_DUPLICATES, NULL);
        assert_true(json_is_object(o));
        const char *reason = json_string_value(json_object_get(o, "reason"));
        assert_true(reason && reason[0]);
        if (!lines) fprintf(stderr, "first rejection: %.*s\n", (int)(end - line), line);
        assert_non_null(strstr(reason, "is not the seeded sampler's draw")); /* what the cheat breaks */
        json_t *b = json_object_get(o, "batch"), *i = json_object_get(o, "sample"), *gap = json_object_get(o, "max_gap");
        assert_true(json_is_integer(b) && json_integer_value(b) >= 0 && json_integer_value(b) < r->next_batch);
        assert_true(json_is_integer(i) && json_integer_value(i) >= 0 && json_integer_value(i) < 8);
        /* the cheat shifts sample i of every batch where (8 batch + i + 1) % 4 == 0 */
        assert_int_equal((8 * json_integer_value(b) + json_integer_value(i) + 1) % 4, 0);
        assert_true(json_is_number(gap) && json_number_value(gap) > json_number_value(json_object_get(o, "logit_margin")));
        assert_true(json_is_string(json_object_get(o, "id")));
        json_decref(o);
        lines++;
    }
    free(text);
    assert_int_equal(lines, r->rejected);
}

static void test_async_run_rejects_cheater(void **state) {
    (void)state;
    vks_rl_config c;
    char out[600];
    snprintf(out, sizeof out, "%s/rl-k1", tu_tmpdir());
    int steps = tu_test_short() ? 1 : 2;
    small_config(&c, out, steps, 1);
    progress_log log = {0};
    vks_rl_run_options o = options(&c, &log);
    o.cheat_every = 4; /* every fourth completion carries a token its sampler did not draw */
    c.entropy_coef = 0.05; /* the entropy bonus on, through the run's trainer */
    /* an earlier run's rejections in the same place: a fresh run is refused before it writes anything
     * (issue 23, point 10: it used to overwrite them), and runs once they are gone */
    char cmd[1600], path[700];
    const char *old = "{\"batch\":0,\"reason\":\"old\"}\n{\"batch\":99,\"reason\":\"old\"}\nnot json\n";
    snprintf(cmd, sizeof cmd, "mkdir -p '%s/rollouts' && printf '%%s' '%s' > '%s/rollouts/rejected.jsonl'", out, old, out);
    assert_int_equal(tu_run(cmd, NULL), 0);
    vks_rl_result r;
    assert_int_equal(vks_rl_run(&o, &r), VKS_ERR_ARG);
    assert_non_null(strstr(vks_last_error(), "rl-k1: holds rollouts from an earlier run"));
    assert_int_equal(log.n, 0);
    snprintf(path, sizeof path, "%s/rollouts/rejected.jsonl", out);
    char *text = (char *)tu_read_file(path, NULL);
    assert_non_null(text);
    assert_string_equal(text, old);
    free(text);
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    assert_int_not_equal(access(path, F_OK), 0);
    snprintf(cmd, sizeof cmd, "rm -r '%s/rollouts'", out);
    assert_int_equal(tu_run(cmd, NULL), 0);
    int rc = vks_rl_run(&o, &r);
    if (rc) fail_msg("%s", vks_last_error());
    assert_int_equal(log.n, steps);
    for (int i = 0; i < log.n; i++) {
        fprintf(stderr, "k=1 step %lld: lag %.2f, accepted %.3f, loss %.5f, entropy %.4f\n", (long long)log.p[i].step,
                log.p[i].policy_lag, log.p[i].accept_rate, log.p[i].loss, log.p[i].entropy);
        assert_true(log.p[i].entropy > 0 && log.p[i].entropy <= max_entropy());
        assert_true(log.p[i].policy_lag >= 0 && log.p[i].policy_lag <= 1.0);
        assert_true(isfinite(log.p[i].loss));
    }
    fprintf(stderr, "cheater: %lld rollouts, %lld rejected, %lld trained\n", (long long)r.rollouts,
            (long long)r.rejected, (long long)r.trained);
    /* every cheated completion (a quarter of them, less those that stopped at once) is caught */
    assert_true(r.rejected >= r.rollouts / 4 - r.rollouts / 16 && r.rejected <= r.rollouts / 4);
    assert_int_equal(r.accepted + r.rejected, r.rollouts);
    assert_int_equal(r.trained_rejected, 0); /* the trainer saw none of them */
    check_rejections(&r);
    /* inference generates only as many prompts as the window has room for: no group goes stale */
    fprintf(stderr, "k=1: %lld groups stale\n", (long long)r.groups_stale);
    assert_int_equal(r.groups_stale, 0);
    assert_true(r.trained > 0 && r.trained <= r.accepted);
}

/* Issue 40, item 1: at async levels 1, 2 and 4 with lr 1e-2 on the built-in
 * add task, a policy with sharper logits than the tiny model's (its final
 * norm x2.5) moves some token's log-probability by more than 5 nats in one
 * step, so a completion one or more steps old is far from the trainer's
 * current weights. It is honest and checked against the weights that sampled
 * it: nothing is left out (before: 14 to 16 of a step's 16, loss 0), and the
 * sampler's record is what those weights give (f32 rounding only). The same
 * with a LoRA adapter at level 2 (the trainer keeps adapter versions). */
static void test_off_policy_kept(void **state) {
    (void)state;
    static const int levels[] = {1, 2, 4, 2};
    int steps = 3;
    double most_lag = 0;
    vks_model *sharp = NULL;
    vks_tokenizer *sharp_tok = NULL;
    assert_int_equal(vks_model_init_tiny(1, &sharp, &sharp_tok), VKS_OK);
    float *norm = (float *)(uintptr_t)sharp->final_norm.data;
    for (int i = 0; i < sharp->cfg.dim; i++) norm[i] *= 2.5f; /* logits 2.5x: a step moves some token > 5 nats */
    for (int li = 0; li < 4; li++) {
        bool lora = li == 3;
        if (tu_test_short() && (li == 1 || li == 2)) continue; /* the ASan build: levels 1 and 2 (LoRA) */
        vks_rl_config c;
        char out[600];
        snprintf(out, sizeof out, "%s/rl-offpolicy-k%d%s", tu_tmpdir(), levels[li], lora ? "-lora" : "");
        small_config(&c, out, steps, levels[li]);
        snprintf(c.task, sizeof c.task, "add");
        c.lr = 1e-2;
        c.group_size = 8, c.max_new_tokens = c.length_targets[1] = 24;
        if (lora) assert_int_equal(vks_rl_config_set(&c, "lora.rank=4"), VKS_OK);
        assert_int_equal(vks_rl_config_check(&c, 1), VKS_OK);
        progress_log log = {0};
        vks_rl_run_options o = options(&c, &log);
        o.model = sharp;
        vks_rl_result r;
        if (vks_rl_run(&o, &r)) fail_msg("%s", vks_last_error());
        assert_int_equal(log.n, steps);
        for (int i = 0; i < log.n; i++) {
            const vks_rl_progress *p = &log.p[i];
            fprintf(stderr, "k=%d%s step %lld: lag %.2f, loss %.5f, mismatch %.3g (to the sampling weights: %.3g), "
                    "excluded %lld\n", levels[li], lora ? " lora" : "", (long long)p->step, p->policy_lag, p->loss,
                    p->logp_mismatch, p->logp_sampler_max, (long long)p->logp_excluded);
            assert_true(isfinite(p->loss) && p->policy_lag <= levels[li]);
            assert_int_equal(p->logp_excluded, 0);
            assert_true(p->logp_sampler_max < 1e-3); /* the verifier's tolerance (rl_verifier.c) */
            /* exp(x) - x - 1 >= 0; at lag > 0 the policy has moved since sampling */
            assert_true(p->mismatch_kl >= 0 && (p->policy_lag == 0 || p->mismatch_kl > 1e-9));
            if (p->policy_lag > most_lag) most_lag = p->policy_lag;
        }
    }
    assert_true(most_lag > 0); /* the premise: some step trained on an older policy's completions */
    vks_model_free(sharp);
    vks_tokenizer_free(sharp_tok);
}

/* The configured loss and advantage reach the trainer: one synchronous step
 * over the same rollouts (same seed; k = 0, so logp_old is the trainer's own
 * up to f32 rounding and every ratio is 1). There dppo_kl and dapo give
 * intellect2's loss, -sum w A / budget (dppo_kl's kl_tau x^2 is ~1e-12);
 * cispo's is -sum w A logp / budget, another value; group_mean's advantages
 * are not divided by the group's std, so its loss is another too. The
 * normalisers: "tokens" divides by the step's completion tokens (8
 * completions, all trained at k = 0, of the reported mean length) instead of
 * the budget 2 x 4 x 12; "sequence" averages each completion's tokens first,
 * so at ratio 1 the loss is -sum A / 8, and a group's advantages sum to 0.
 * gspo (its sequence ratios from a forward pass of their own) is intellect2's
 * too at ratio 1, and decoupled_ppo (behaviour weights 1, under the cap) with its
 * mask or truncation. metrics.jsonl names clip_fraction masked_fraction or
 * truncated_fraction too where the loss masks or truncates. */
static void test_loss_types_run(void **state) {
    (void)state;
    static const char *const sets[][2] = {{"loss.type=intellect2", NULL}, {"loss.type=dppo_kl", NULL},
                                          {"loss.type=dapo", NULL},       {"loss.type=cispo", NULL},
                                          {"loss.type=intellect2", "advantage.type=group_mean"},
                                          {"loss.normalize=tokens", NULL},  {"loss.normalize=sequence", NULL},
                                          {"loss.type=gspo", NULL},         {"loss.type=decoupled_ppo", NULL},
                                          {"loss.type=decoupled_ppo", "loss.behav_weight=truncate"}};
    /* the name clip_fraction also goes by in metrics.jsonl (NULL: none) */
    static const char *const trust_names[] = {NULL, "masked_fraction", NULL, NULL, NULL, NULL, NULL, NULL,
                                              "masked_fraction", "truncated_fraction"};
    double loss[10], length[10];
    for (int i = 0; i < 10; i++) {
        vks_rl_config c;
        char out[600];
        snprintf(out, sizeof out, "%s/rl-loss-%d", tu_tmpdir(), i);
        small_config(&c, out, 1, 0);
        assert_int_equal(vks_rl_config_set(&c, sets[i][0]), VKS_OK);
        if (sets[i][1]) assert_int_equal(vks_rl_config_set(&c, sets[i][1]), VKS_OK);
        assert_int_equal(vks_rl_config_check(&c, 1), VKS_OK);
        progress_log log = {0};
        vks_rl_run_options o = options(&c, &log);
        vks_rl_result r;
        if (vks_rl_run(&o, &r)) fail_msg("%s", vks_last_error());
        assert_int_equal(log.n, 1);
        loss[i] = log.p[0].loss, length[i] = log.p[0].length;
        fprintf(stderr, "%s%s%s: step 1 loss %.9g, clipped or masked %.3f\n", sets[i][0], sets[i][1] ? " " : "",
                sets[i][1] ? sets[i][1] : "", loss[i], log.p[0].clip_fraction);
        assert_true(isfinite(loss[i]) && log.p[0].clip_fraction == 0.0); /* ratio 1: inside every trust region */
        size_t len;
        char *metrics = (char *)tu_read_file(r.metrics_path, &len);
        assert_non_null(metrics);
        static const char *const all_names[] = {"\"masked_fraction\"", "\"truncated_fraction\""};
        for (int k = 0; k < 2; k++) {
            bool want = trust_names[i] && !strncmp(all_names[k] + 1, trust_names[i], strlen(trust_names[i]));
            assert_true(!strstr(metrics, all_names[k]) == !want);
        }
        free(metrics);
    }
    double scale = fabs(loss[0]) + 1e-9;
    assert_true(scale > 1e-6); /* the premise: a loss to compare */
    assert_true(fabs(loss[1] - loss[0]) <= 1e-5 * scale && fabs(loss[2] - loss[0]) <= 1e-5 * scale);
    assert_true(fabs(loss[3] - loss[0]) > 0.1 * scale && fabs(loss[4] - loss[0]) > 0.01 * scale);
    assert_true(length[5] == length[0] && length[0] > 0); /* the same rollouts */
    assert_near(loss[5], loss[0] * (2 * 4 * 12) / (8 * length[0]), 1e-5 * scale);
    assert_true(fabs(loss[6]) < 1e-6 * scale);
    assert_true(fabs(loss[7] - loss[0]) <= 1e-5 * scale); /* gspo: every sequence's ratio 1, its extra forward */
    /* decoupled_ppo: behaviour weights 1 (k = 0), under the cap: -sum w A, intellect2's */
    assert_true(fabs(loss[8] - loss[0]) <= 1e-5 * scale && fabs(loss[9] - loss[0]) <= 1e-5 * scale);
}

/* The trainer's last versions (src/rl/rl_versions.c): the newest cap are
 * held, a new one takes an empty slot or the oldest version's, a version
 * put again keeps its block, a forgotten one is not held; cap 0 holds none. */
static void test_versions_ring(void **state) {
    (void)state;
    vks_rl_versions v;
    assert_int_equal(vks_rl_versions_init(&v, 3, 2), VKS_OK);
    float *b[5];
    for (int s = 0; s < 3; s++) {
        assert_non_null(b[s] = vks_rl_versions_put(&v, s));
        b[s][0] = (float)s, b[s][1] = -(float)s;
    }
    assert_true(b[0] != b[1] && b[1] != b[2] && b[0] != b[2]);
    for (int s = 0; s < 3; s++) assert_ptr_equal(vks_rl_versions_get(&v, s), b[s]);
    assert_ptr_equal(vks_rl_versions_put(&v, 2), b[2]); /* held: its own block */
    assert_true(vks_rl_versions_get(&v, 2)[1] == -2.0f);
    assert_ptr_equal(b[3] = vks_rl_versions_put(&v, 3), b[0]); /* the oldest (0) gives way */
    assert_null(vks_rl_versions_get(&v, 0));
    assert_null(vks_rl_versions_get(&v, -1));
    assert_null(vks_rl_versions_get(&v, 4));
    vks_rl_versions_forget(&v, 2);
    assert_null(vks_rl_versions_get(&v, 2));
    assert_ptr_equal(b[4] = vks_rl_versions_put(&v, 4), b[2]); /* the empty slot, not version 1's */
    assert_ptr_equal(vks_rl_versions_get(&v, 1), b[1]);
    assert_null(vks_rl_versions_put(&v, -1));
    vks_rl_versions_free(&v);
    assert_int_equal(vks_rl_versions_init(&v, 0, 0), VKS_OK); /* async level 0: nothing kept */
    assert_null(vks_rl_versions_put(&v, 0));
    assert_null(vks_rl_versions_get(&v, 0));
    vks_rl_versions_free(&v);
    assert_int_equal(vks_rl_versions_init(&v, 2, 0), VKS_ERR_ARG);
    assert_int_equal(vks_rl_versions_init(&v, -1, 4), VKS_ERR_ARG);
}

/* The status lines said while the trainer waits (vks_rl_run_options.status). */
enum { STATUS_LINES = 256 };
static char status_lines[STATUS_LINES][1024];
static int n_status_lines;
static void on_status(void *ctx, const char *line) {
    (void)ctx;
    if (n_status_lines < STATUS_LINES) snprintf(status_lines[n_status_lines++], sizeof status_lines[0], "%s", line);
}

/* Every status line of a run whose every group has no signal (P prompts a
 * batch): step 1 of steps, generated = discarded, a multiple of P, at most
 * batches x P, kept 0/P; returns how many lines said a whole batch or more. */
static int check_status_lines(int steps, int P, int batches) {
    int after_batch = 0;
    for (int i = 0; i < n_status_lines; i++) {
        long long made = -1, dropped = -2, s = 0, of = 0;
        int kept = -1, want_p = -1;
        double secs = -1;
        if (sscanf(status_lines[i], "rl: step %lld/%lld, %lf s without a step: generated %lld groups, discarded %lld "
                   "(no signal), kept %d/%d", &s, &of, &secs, &made, &dropped, &kept, &want_p) != 7)
            fail_msg("status line %d: '%s'", i, status_lines[i]);
        assert_int_equal(s, 1);
        assert_int_equal(of, steps);
        assert_true(secs >= 0);
        assert_int_equal(made, dropped);
        assert_int_equal(made % P, 0);
        assert_true(made <= (long long)batches * P);
        assert_int_equal(kept, 0);
        assert_int_equal(want_p, P);
        assert_non_null(strstr(status_lines[i], "; in flight: the inference thread's batch"));
        after_batch += made >= P;
    }
    return after_batch;
}

/* Also --resume where OUT holds no checkpoint: a fresh run, said through
 * on_resume (issue 23, point 17: it was silent). And the status line (issue
 * 36): with a short silence (10 ms; a batch takes far longer here) the trainer,
 * waiting for groups none of which has signal, says what it counted. */
static void test_no_signal_fails(void **state) {
    (void)state;
    vks_rl_config c;
    char out[600];
    snprintf(out, sizeof out, "%s/rl-nosignal", tu_tmpdir());
    small_config(&c, out, 2, 0);
    c.n_length_targets = 0; /* the untrained model solves nothing: every reward 0 */
    progress_log log = {0};
    vks_rl_run_options o = options(&c, &log);
    o.max_empty_batches = 2;
    o.verify = false;
    o.resume = true;
    o.on_resume = on_resume;
    o.status = on_status, o.status_interval_s = 0.01;
    n_status_lines = 0;
    resume_calls = 0;
    vks_rl_result r;
    assert_int_equal(vks_rl_run(&o, &r), VKS_ERR_ARG);
    assert_non_null(strstr(vks_last_error(), "warm it up"));
    assert_true(n_status_lines > 0);
    assert_true(check_status_lines(2, c.prompts_per_step, 2) > 0); /* one said while the second batch was made */
    assert_int_equal(log.n, 0);
    assert_int_equal(resume_calls, 1);
    assert_int_equal(resume_step, -1);
    assert_string_equal(resume_dir, "(none)");
}

/* One run at a time in an OUT: a second is refused naming the first's pid
 * and host, before it writes anything (issue 23, point 9: both ran and the
 * checkpoints held one run's weights, the metrics the other's). The lock
 * ends with its holder. */
static void test_out_locked(void **state) {
    (void)state;
    vks_rl_config c;
    char out[600], path[700], want[400], host[256] = "";
    snprintf(out, sizeof out, "%s/rl-locked", tu_tmpdir());
    small_config(&c, out, 1, 0);
    vks_rl_out_dir first = {.fd = -1};
    assert_int_equal(vks_rl_out_lock(&first, out), VKS_OK); /* as another run holding it */
    progress_log log = {0};
    vks_rl_run_options o = options(&c, &log);
    vks_rl_result r;
    assert_int_equal(vks_rl_run(&o, &r), VKS_ERR_ARG);
    gethostname(host, sizeof host - 1);
    snprintf(want, sizeof want, "rl-locked: another run is writing there (pid %ld on host %s)", (long)getpid(), host);
    if (!strstr(vks_last_error(), want)) fail_msg("'%s' lacks '%s'", vks_last_error(), want);
    assert_int_equal(log.n, 0);
    DIR *d = opendir(out);
    assert_non_null(d);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)) != NULL) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    assert_int_equal(n, 1); /* the lock alone */
    vks_rl_out_unlock(&first);
    snprintf(path, sizeof path, "%s/vkswarm.lock", out);
    assert_int_not_equal(access(path, F_OK), 0);
    /* a run killed while holding it leaves the file; its lock ended with it */
    pid_t child = fork();
    if (child == 0) {
        vks_rl_out_dir held = {.fd = -1};
        _exit(vks_rl_out_lock(&held, out) == VKS_OK ? 0 : 1);
    }
    int status = -1;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(access(path, F_OK), 0);
    vks_rl_out_dir again = {.fd = -1};
    if (vks_rl_out_lock(&again, out) != VKS_OK) fail_msg("%s", vks_last_error());
    vks_rl_out_unlock(&again);
}

/* A checkpoint of step 1 in out: the tiny model's weights, zero moments,
 * the given data hash ("" for none), extra and betas. */
static void write_checkpoint(const char *out, const char *data_hash, const char *extra, double beta1) {
    vks_param_layout *l = NULL;
    assert_int_equal(vks_param_layout_create(&tiny->cfg, false, &l), VKS_OK);
    float *w = malloc(sizeof *w * l->n_values), *zero = calloc(l->n_values, sizeof *zero);
    assert_true(w && zero);
    assert_int_equal(vks_param_layout_gather(l, tiny, w), VKS_OK);
    vks_checkpoint_data d = {.layout = l, .weights = w, .adam_m = zero, .adam_v = zero, .arch = "llama", .bos_id = -1,
                             .eos_id = -1};
    d.state.step = 1;
    d.state.adam = (vks_adamw_params){.lr = 1e-3, .beta1 = beta1, .beta2 = 0.95, .eps = 1e-8};
    d.state.schedule.lr = 1e-3;
    snprintf(d.state.data_hash, sizeof d.state.data_hash, "%s", data_hash);
    d.state.extra_json = extra;
    char dir[700];
    assert_int_equal(vks_checkpoint_step_dir(out, 1, dir, sizeof dir), VKS_OK);
    if (vks_checkpoint_save(dir, &d)) fail_msg("%s", vks_last_error());
    free(w), free(zero);
    vks_param_layout_free(l);
}

/* rl --resume refuses train sft's checkpoint naming the kind (issue 23,
 * point 7, the other way round), and moments made with other betas. */
static void test_resume_refuses_other_runs(void **state) {
    (void)state;
    vks_rl_config c;
    char out[600];
    snprintf(out, sizeof out, "%s/rl-sft", tu_tmpdir());
    small_config(&c, out, 2, 0);
    assert_int_equal(mkdir(out, 0777), 0);
    write_checkpoint(out, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", NULL, 0.9);
    progress_log log = {0};
    vks_rl_run_options o = options(&c, &log);
    o.resume = true;
    vks_rl_result r;
    assert_int_equal(vks_rl_run(&o, &r), VKS_ERR_ARG);
    if (!strstr(vks_last_error(), "step-000000001 is a train sft checkpoint, not an RL run's")) fail_msg("%s", vks_last_error());
    snprintf(out, sizeof out, "%s/rl-betas", tu_tmpdir());
    snprintf(c.out, sizeof c.out, "%s", out);
    assert_int_equal(mkdir(out, 0777), 0);
    char extra[800];
    snprintf(extra, sizeof extra, "{\"rl_task\": \"%s\", \"rl_prompts_per_step\": 2, \"rl_next_batch\": 1}", c.task);
    write_checkpoint(out, "", extra, 0.8);
    assert_int_equal(vks_rl_run(&o, &r), VKS_ERR_ARG);
    if (!strstr(vks_last_error(), "was trained with Adam betas 0.8, 0.95, this run uses 0.9, 0.95")) fail_msg("%s", vks_last_error());
    assert_int_equal(log.n, 0);
}

/* A group of n completions (n = 0: one without signal) of task `task`. */
static vks_rl_batch_group fake_group(int n, int64_t task) {
    vks_rl_batch_group g = {.n = n, .task_index = task};
    g.samples = n ? calloc((size_t)n, sizeof *g.samples) : NULL;
    for (int i = 0; i < n; i++) {
        g.samples[i].tokens = calloc(4, sizeof(int32_t));
        g.samples[i].logp = calloc(2, sizeof(float));
        g.samples[i].prompt_len = 2, g.samples[i].completion_len = 2;
    }
    return g;
}

/* The queue both hand-overs use: the async window, the filtered and stale
 * counts, first in first out, the empty-batch limit. */
static void test_group_queue(void **state) {
    (void)state;
    vks_rl_queue q;
    assert_int_equal(vks_rl_queue_init(&q, 2, 1, 8), VKS_OK); /* P = 2, k = 1: groups 0..3 from policy 0 */
    assert_true(vks_rl_queue_has_room(&q, 0));
    /* batches to hand out (MPI trainer): the window takes 4 groups = 2 batches of policy 0 */
    assert_int_equal(vks_rl_queue_batches_to_grant(&q, 0, 0), 2);
    assert_int_equal(vks_rl_queue_batches_to_grant(&q, 0, 1), 1);
    assert_int_equal(vks_rl_queue_batches_to_grant(&q, 0, 2), 0);
    vks_rl_gen_counts cnt = {.rollouts = 8, .checked = 8, .accepted = 7, .task_reward_sum = 2.5};
    vks_rl_batch_group b[2] = {fake_group(2, 0), fake_group(0, 1)};
    assert_int_equal(vks_rl_queue_push(&q, 0, b, 2, &cnt, 3), VKS_OK);
    assert_int_equal(q.len, 1);
    assert_null(b[0].samples); /* moved into the ring */
    b[0] = fake_group(3, 2), b[1] = fake_group(2, 3);
    assert_int_equal(vks_rl_queue_push(&q, 0, b, 2, &cnt, 3), VKS_OK);
    b[0] = fake_group(2, 4), b[1] = fake_group(2, 5);
    assert_int_equal(vks_rl_queue_push(&q, 0, b, 2, &cnt, 3), VKS_OK); /* task 5 would be consumed by step 3: stale */
    assert_int_equal(q.len, 4);
    assert_int_equal(q.pushed, 4);
    assert_null(b[1].samples); /* freed */
    assert_false(vks_rl_queue_has_room(&q, 0));
    assert_true(vks_rl_queue_has_room(&q, 1));
    assert_int_equal(vks_rl_queue_batches_to_grant(&q, 0, 0), 0);
    assert_int_equal(vks_rl_queue_batches_to_grant(&q, 1, 0), 1); /* room for 2 more groups */
    vks_rl_counters c = q.counters;
    assert_true(c.filtered == 1 && c.stale == 1 && c.rollouts == 24 && c.checked == 24 && c.accepted == 21 && c.rejected == 3);
    assert_true(c.task_reward_sum == 7.5); /* every rollout's reward, filtered and stale groups included */
    vks_rl_batch_group out[3];
    assert_int_equal(vks_rl_queue_pop(&q, 2, out), VKS_OK);
    assert_true(out[0].task_index == 0 && out[0].n == 2 && out[1].task_index == 2 && out[1].n == 3);
    vks_rl_group_free(&out[0]), vks_rl_group_free(&out[1]);
    assert_int_equal(vks_rl_queue_pop(&q, 3, out), VKS_ERR_ARG); /* only 2 left */
    assert_int_equal(q.len, 2);
    /* three batches in a row without signal: the third fails */
    for (int i = 0; i < 3; i++) {
        b[0] = fake_group(0, 6 + 2 * i), b[1] = fake_group(0, 7 + 2 * i);
        assert_int_equal(vks_rl_queue_push(&q, 1, b, 2, &cnt, 3), i < 2 ? VKS_OK : VKS_ERR_ARG);
    }
    assert_non_null(strstr(vks_last_error(), "6 prompts in a row (3 batches' worth)"));
    /* a partial batch (the window's room): only its groups count */
    int64_t filtered = q.counters.filtered;
    b[0] = fake_group(0, 12);
    assert_int_equal(vks_rl_queue_push(&q, 2, b, 1, &cnt, 9), VKS_OK);
    assert_true(q.counters.filtered == filtered + 1);
    assert_int_equal(vks_rl_queue_push(&q, 2, b, 3, &cnt, 9), VKS_ERR_ARG); /* more groups than a batch holds */
    vks_rl_queue_free(&q); /* frees the groups still queued (ASan: no leak) */
    assert_int_equal(vks_rl_queue_init(&q, 0, 1, 8), VKS_ERR_ARG);
    assert_int_equal(vks_rl_queue_init(&q, 2, 1, -1), VKS_ERR_ARG);
}

/* max_off_policy_steps m below the async level k: the window is m steps (room
 * and grants), and a group that arrives later than its window (a slow rank's
 * batch) is dropped as off_policy, not stale; with m >= k the window is k's. */
static void test_group_queue_off_policy(void **state) {
    (void)state;
    vks_rl_queue q;
    assert_int_equal(vks_rl_queue_init(&q, 2, 4, 2), VKS_OK); /* P = 2, k = 4, m = 2: groups 0..5 from policy 0 */
    assert_int_equal(vks_rl_queue_room(&q, 0), 6);
    assert_int_equal(vks_rl_queue_batches_to_grant(&q, 0, 0), 3);
    vks_rl_gen_counts cnt = {.rollouts = 8, .checked = 8, .accepted = 8, .task_reward_sum = 1};
    vks_rl_batch_group b[2];
    for (int i = 0; i < 3; i++) { /* consumed by steps 1, 2, 3: weights 0, 1, 2 */
        b[0] = fake_group(2, 2 * i), b[1] = fake_group(2, 2 * i + 1);
        assert_int_equal(vks_rl_queue_push(&q, 0, b, 2, &cnt, 3), VKS_OK);
    }
    assert_int_equal(q.pushed, 6);
    assert_false(vks_rl_queue_has_room(&q, 0));
    /* a late batch of policy 0 would be trained by step 4 (weights 3): 3 steps old */
    b[0] = fake_group(2, 6), b[1] = fake_group(2, 7);
    assert_int_equal(vks_rl_queue_push(&q, 0, b, 2, &cnt, 3), VKS_OK);
    assert_true(q.counters.off_policy == 2 && q.counters.stale == 0 && q.pushed == 6);
    assert_true(!b[0].samples && !b[1].samples); /* freed */
    /* policy 1's groups are 2 steps old there: queued */
    assert_int_equal(vks_rl_queue_room(&q, 1), 2);
    b[0] = fake_group(2, 8), b[1] = fake_group(2, 9);
    assert_int_equal(vks_rl_queue_push(&q, 1, b, 2, &cnt, 3), VKS_OK);
    assert_true(q.counters.off_policy == 2 && q.pushed == 8 && q.len == 8);
    vks_rl_queue_free(&q);
    /* m >= k: the async window rules, and what is past it is stale */
    assert_int_equal(vks_rl_queue_init(&q, 2, 1, 8), VKS_OK);
    assert_int_equal(vks_rl_queue_room(&q, 0), 4);
    for (int i = 0; i < 3; i++) {
        b[0] = fake_group(2, 2 * i), b[1] = fake_group(2, 2 * i + 1);
        assert_int_equal(vks_rl_queue_push(&q, 0, b, 2, &cnt, 3), VKS_OK);
    }
    assert_true(q.counters.stale == 2 && q.counters.off_policy == 0 && q.pushed == 4);
    vks_rl_queue_free(&q);
}

/* The stop hook of test_max_off_policy_run: at the first ask (step 1 trained,
 * its weights not yet out) it holds the trainer until the inference thread,
 * still on the start's weights, has filled the window and stopped (its count
 * of rollout files unchanged for 1.5 s), so that the next steps train groups
 * of the start's policy; it never asks to stop. */
typedef struct {
    const char *rollouts_dir;
    int calls, files;
} fill_ctl;

static int count_batch_files(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += !strncmp(e->d_name, "batch-", 6);
    if (d) closedir(d);
    return n;
}

static bool hold_until_window_full(void *ctx) {
    fill_ctl *f = ctx;
    if (f->calls++) return false;
    int last = -1;
    double since = vks_seconds_now(), t0 = since;
    while (vks_seconds_now() - t0 < 120) {
        int n = count_batch_files(f->rollouts_dir);
        if (n != last) last = n, since = vks_seconds_now();
        else if (n >= 3 && vks_seconds_now() - since > 1.5) break;
        usleep(50 * 1000);
    }
    f->files = last;
    return false;
}

/* Issue 39: at k = 4 with max_off_policy_steps = 2 nothing older than 2
 * steps is trained. The trainer is held after step 1 until inference has
 * filled its window with the start's policy; steps 2 and 3 train those
 * groups (lags 1 and 2), and no step trains an older one (at m = 8 the window
 * is k's: step 4 would train a group 3 steps old, step 5 one 4 steps old). */
static void test_max_off_policy_run(void **state) {
    (void)state;
    vks_rl_config c;
    char out[600], dir[700];
    snprintf(out, sizeof out, "%s/rl-max-off-policy", tu_tmpdir());
    small_config(&c, out, 5, 4);
    assert_int_equal(vks_rl_config_set(&c, "max_off_policy_steps=2"), VKS_OK);
    assert_int_equal(vks_rl_config_check(&c, 1), VKS_OK);
    snprintf(dir, sizeof dir, "%s/rollouts", out);
    fill_ctl f = {.rollouts_dir = dir};
    progress_log log = {0};
    vks_rl_run_options o = options(&c, &log);
    o.stop_requested = hold_until_window_full, o.stop_ctx = &f;
    vks_rl_result r;
    if (vks_rl_run(&o, &r)) fail_msg("%s", vks_last_error());
    assert_int_equal(log.n, 5);
    int64_t most = 0;
    for (int i = 0; i < log.n; i++) {
        fprintf(stderr, "k=4 m=2 step %lld: lag %.2f, oldest %lld (%d batch files at the hold)\n",
                (long long)log.p[i].step, log.p[i].policy_lag, (long long)log.p[i].policy_lag_max, f.files);
        assert_true(log.p[i].policy_lag_max <= 2 && log.p[i].policy_lag <= log.p[i].policy_lag_max);
        if (log.p[i].policy_lag_max > most) most = log.p[i].policy_lag_max;
    }
    assert_int_equal(most, 2); /* the premise: the window was used to its end */
    assert_int_equal(r.off_policy_dropped, 0); /* one process makes no group its window cannot take */
    size_t len;
    char *metrics = (char *)tu_read_file(r.metrics_path, &len);
    assert_non_null(metrics);
    assert_non_null(strstr(metrics, "\"policy_lag_max\":2"));
    assert_non_null(strstr(metrics, "\"off_policy_dropped\":0"));
    free(metrics);
}

/* A clean stop (issue 26): stop_requested asked after a step's training
 * (the third ask: step 2, before its weights go out) or after its progress
 * (step 1, its weights out already: the rollout position is the one at the
 * hand-over). Either way the run ends at that step with its checkpoint,
 * metrics and plots, rc VKS_OK and stopped_at_step; the checkpoint holds the
 * config; at k = 0 the resumed run trains exactly what the straight run did
 * (the same losses bit for bit) and metrics.jsonl holds each step once. */
typedef struct {
    const progress_log *log;
    int calls, stop_at_call, stop_after_steps;
} stop_ctl;

static bool stop_requested(void *ctx) {
    stop_ctl *s = ctx;
    s->calls++;
    return (s->stop_at_call && s->calls >= s->stop_at_call) || (s->stop_after_steps && s->log->n >= s->stop_after_steps);
}

static void check_metrics_steps(const char *path, int steps) {
    char *text = (char *)tu_read_file(path, NULL);
    assert_non_null(text);
    int n = 0;
    for (char *line = text; *line; n++) {
        char want[32];
        snprintf(want, sizeof want, "{\"step\":%d,", n + 1);
        if (strncmp(line, want, strlen(want))) fail_msg("%s: line %d is '%.40s'", path, n + 1, line);
        char *end = strchr(line, '\n');
        assert_non_null(end);
        line = end + 1;
    }
    assert_int_equal(n, steps);
    free(text);
}

static void stop_and_resume(const vks_rl_progress *straight, int steps, stop_ctl *ctl, int stop_at, const char *name) {
    vks_rl_config c;
    char out[600], path[700];
    snprintf(out, sizeof out, "%s/%s", tu_tmpdir(), name);
    small_config(&c, out, steps, 0);
    progress_log log = {0};
    ctl->log = &log;
    vks_rl_run_options o = options(&c, &log);
    o.stop_requested = stop_requested, o.stop_ctx = ctl;
    vks_rl_result r;
    if (vks_rl_run(&o, &r)) fail_msg("%s", vks_last_error());
    assert_int_equal(r.stopped_at_step, stop_at);
    assert_int_equal(log.n, stop_at);
    snprintf(path, sizeof path, "%s/step-%09d", out, stop_at);
    assert_string_equal(r.final_checkpoint, path);
    for (int i = 0; i < stop_at; i++) assert_true(log.p[i].loss == straight[i].loss);
    struct stat st;
    assert_int_equal(stat(r.plot_path, &st), 0);
    assert_int_equal(stat(r.timeline_path, &st), 0);
    check_metrics_steps(r.metrics_path, stop_at);
    /* the checkpoint holds the config and the evaluation options */
    vks_rl_stored *stored = malloc(sizeof *stored);
    assert_non_null(stored);
    bool found = false;
    assert_int_equal(vks_rl_stored_read(out, stored, &found), VKS_OK);
    assert_true(found && stored->has_config);
    assert_string_equal(stored->checkpoint, path);
    assert_int_equal(stored->step, stop_at);
    assert_string_equal(stored->config.task, c.task);
    assert_int_equal(stored->config.group_size, 4);
    assert_int_equal(stored->config.n_length_targets, 2);
    assert_true(stored->config.lr == 1e-3 && stored->verify && stored->eval_n == 0);
    free(stored);
    /* resumed: the straight run's steps, each once in metrics.jsonl */
    log.n = 0;
    o.resume = true, o.stop_requested = NULL;
    double called = vks_seconds_now();
    if (vks_rl_run(&o, &r)) fail_msg("%s", vks_last_error());
    called = vks_seconds_now() - called;
    /* the clock goes on from the checkpoint's: longer than this call alone */
    fprintf(stderr, "%s: resumed run: elapsed %.3f s, its call %.3f s\n", name, r.elapsed_s, called);
    assert_true(r.elapsed_s > called && log.p[0].elapsed_s > 0);
    /* and the report marks the stop */
    snprintf(path, sizeof path, "%s/report.html", out);
    char *page = (char *)tu_read_file(path, NULL), want[160];
    assert_non_null(page);
    assert_non_null(strstr(page, "<dd id=\"resumed\">resumed run: stopped 1 time; last resumed from step "));
    snprintf(want, sizeof want, "<tr class=\"resume\"><td>%d</td>", stop_at);
    assert_non_null(strstr(page, want));
    free(page);
    assert_int_equal(r.resumed_from, stop_at);
    assert_int_equal(r.stopped_at_step, -1);
    assert_true(r.start_accuracy_stored); /* NaN here (eval_n 0), as the run's start recorded it */
    assert_int_equal(log.n, steps - stop_at);
    for (int i = 0; i < log.n; i++) {
        assert_int_equal(log.p[i].step, stop_at + 1 + i);
        fprintf(stderr, "%s: resumed step %lld: loss %.9g, straight %.9g\n", name, (long long)log.p[i].step,
                log.p[i].loss, straight[stop_at + i].loss);
        assert_true(log.p[i].loss == straight[stop_at + i].loss);
        assert_true(log.p[i].policy_lag == 0.0);
    }
    check_metrics_steps(r.metrics_path, steps);
}

static void test_clean_stop(void **state) {
    (void)state;
    vks_rl_config c;
    char out[600];
    const int steps = 3;
    snprintf(out, sizeof out, "%s/stop-straight", tu_tmpdir());
    small_config(&c, out, steps, 0);
    progress_log straight = {0};
    vks_rl_run_options o = options(&c, &straight);
    vks_rl_result r;
    if (vks_rl_run(&o, &r)) fail_msg("%s", vks_last_error());
    assert_int_equal(straight.n, steps);
    assert_int_equal(r.stopped_at_step, -1);
    stop_ctl before_publish = {.stop_at_call = 3};
    stop_and_resume(straight.p, steps, &before_publish, 2, "stop-2");
    stop_ctl after_progress = {.stop_after_steps = 1};
    stop_and_resume(straight.p, steps, &after_progress, 1, "stop-1");
}

/* The run report (report.c) treats every string as hostile: a completion's
 * and a prompt's bytes (tags, a quote, an escape byte, invalid UTF-8), a
 * rank's reason and a verifier's reason from rejected.jsonl come out as text
 * (\xHH, entities): the page holds no tag but its own. The page names the
 * dropped rank by its world rank, the samples newest first, and the curves. */
static void test_report_escapes(void **state) {
    (void)state;
    char dir[512], p[700];
    snprintf(dir, sizeof dir, "%s/report", tu_tmpdir());
    assert_int_equal(mkdir(dir, 0777), 0);
    vks_metrics *m = NULL;
    assert_int_equal(vks_metrics_open(dir, -1, &m), VKS_OK);
    for (int s = 1; s <= 3; s++) {
        vks_metric v[] = {{"reward", 0.1 * s}, {"loss", 1.0 / s}, {"accuracy", 0.5}, {"accuracy_n", 8}};
        assert_int_equal(vks_metrics_log(m, s, v, s == 2 ? 4 : 2), VKS_OK);
    }
    assert_int_equal(vks_metrics_close(m), VKS_OK);
    snprintf(p, sizeof p, "%s/rollouts-rank3", dir);
    assert_int_equal(mkdir(p, 0777), 0);
    snprintf(p, sizeof p, "%s/rollouts-rank3/rejected.jsonl", dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("{\"batch\":4,\"sample\":2,\"task_index\":9,\"policy_step\":1,\"reason\":\"<img src=x onerror=alert(1)>\\u001b\"}\n"
          "not json <script>\n", f);
    fclose(f);
    /* one group of two completions: prompt and completions with hostile bytes (byte-level tokenizer: id = byte) */
    const char *text[2] = {"<script>alert('x')</script>\x1b\xff", "plain"};
    vks_rl_sample smp[2];
    int32_t toks[2][64];
    for (int k = 0; k < 2; k++) {
        int n = 0;
        toks[k][n++] = tiny->bos_id;
        const char *prompt = "Q: <b>\"1\"</b>";
        for (const char *q = prompt; *q; q++) toks[k][n++] = (unsigned char)*q;
        int plen = n;
        for (const char *q = text[k]; *q; q++) toks[k][n++] = (unsigned char)*q;
        smp[k] = (vks_rl_sample){.tokens = toks[k], .prompt_len = plen, .completion_len = n - plen, .task_reward = k,
                                 .reward = k, .advantage = k ? 1 : -1, .accepted = true};
    }
    vks_rl_batch_group g = {.samples = smp, .n = 2, .policy_step = 1, .task_index = 5};
    vks_rl_report_samples samples = {0};
    assert_int_equal(vks_rl_report_capture(&samples, tok, NULL, 3, &g, 1), VKS_OK);
    assert_int_equal(samples.len, 2);
    vks_rl_rank_status ranks[2] = {{.rank = 1, .batches = 3, .rollouts = 24, .at_step = -1},
                                   {.rank = 4, .state = VKS_RL_RANK_DROPPED, .batches = 1, .rollouts = 8, .at_step = 2}};
    snprintf(ranks[1].why, sizeof ranks[1].why, "rank 4 went silent </td><script>x</script>\x01");
    char metrics[700];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", dir);
    vks_rl_report rep = {.task = "t<&>.jsonl", .step = 3, .steps = 3, .final = true, .elapsed_s = 8, .metrics_path = metrics,
                         .samples = &samples, .ranks = ranks, .n_ranks = 2, .across_ranks = true};
    assert_int_equal(vks_rl_report_write(dir, &rep), VKS_OK);
    vks_rl_report_samples_free(&samples);
    snprintf(p, sizeof p, "%s/report.html", dir);
    char *page = (char *)tu_read_file(p, NULL);
    assert_non_null(page);
    int scripts = 0;
    for (const char *q = page; (q = strstr(q, "<script")); q++) scripts++;
    assert_int_equal(scripts, 2); /* the page's own two */
    assert_null(strstr(page, "<img"));
    assert_null(strstr(page, "<b>"));
    assert_null(strstr(page, "\x1b"));
    assert_null(strstr(page, "\x01"));
    assert_non_null(strstr(page, "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;\\x1b\\xff"));
    assert_non_null(strstr(page, "Q: &lt;b&gt;&quot;1&quot;&lt;/b&gt;"));
    assert_non_null(strstr(page, "<h1>vkswarm RL run: t&lt;&amp;&gt;.jsonl</h1>"));
    assert_non_null(strstr(page, "<tr class=\"dropped\"><td>4</td><td>inference</td><td>dropped</td><td>1</td><td>8</td>"
                                 "<td>1.00</td><td>0</td><td>rank 4 went silent &lt;/td&gt;&lt;script&gt;x&lt;/script&gt;\\x01</td>"));
    assert_non_null(strstr(page, "<td>rollouts-rank3</td><td>4</td><td>2</td><td>9</td><td>1</td><td class=\"text\">"
                                 "&lt;img src=x onerror=alert(1)&gt;\\x1b</td>"));
    /* newest first: the higher-reward completion (plain) was kept first, so the hostile one comes first */
    const char *plain = strstr(page, "\"text\">plain"), *hostile = strstr(page, "&lt;script&gt;alert");
    assert_true(plain && hostile && hostile < plain);
    int figures = 0;
    for (const char *q = page; (q = strstr(q, "<figure class=\"curve\"")); q++) figures++;
    assert_int_equal(figures, 11); /* report.c curves[] */
    assert_null(strstr(page, "<section id=\"timeline\">"));
    free(page);
    /* a missing metrics file: an error naming it, and no page replaced */
    rep.metrics_path = "/nonexistent/metrics.jsonl";
    assert_int_equal(vks_rl_report_write(dir, &rep), VKS_ERR_IO);
    assert_non_null(strstr(vks_last_error(), "/nonexistent/metrics.jsonl"));
}

/* Headless Chromium's DOM of dir/report.html after its scripts ran (malloc'd);
 * NULL, saying so, without chromium. The page must log nothing on the console. */
static char *browser_dom(const char *dir) {
    if (tu_run("command -v chromium >/dev/null 2>&1", NULL)) {
        fprintf(stderr, "test_report_in_browser: SKIPPED the browser check: no chromium (tools/install-deps installs it)\n");
        return NULL;
    }
    char cmd[4096], p[700];
    snprintf(cmd, sizeof cmd, "cd '%s' && HOME='%s' timeout 120 chromium --headless --no-sandbox --disable-gpu "
             "--user-data-dir='%s/chromium' --enable-logging=stderr --v=0 --dump-dom 'file://%s/report.html' > dom.html "
             "2> chromium.txt", dir, dir, dir, dir);
    if (tu_run(cmd, NULL)) fail_msg("chromium failed: %s", cmd);
    snprintf(p, sizeof p, "%s/chromium.txt", dir);
    char *log = (char *)tu_read_file(p, NULL);
    assert_non_null(log);
    if (strstr(log, "CONSOLE") || strstr(log, "Uncaught")) fail_msg("the page logged on the console: %s", log);
    free(log);
    snprintf(p, sizeof p, "%s/dom.html", dir);
    char *dom = (char *)tu_read_file(p, NULL);
    assert_non_null(dom);
    assert_non_null(strstr(dom, "data-ready=\"1\""));
    return dom;
}

/* A report from a crafted metrics.jsonl: evaluations at steps 0, 2 and 4 of
 * greedy accuracy a0 -> a1 -> a2 and sampled s0 -> s2, n = 100 (greedy) and
 * 12 (sampled), written as the run writes them. */
static void crafted_report(const char *dir, double a0, double a2, double s0, double s2, const vks_rl_report *base) {
    assert_int_equal(mkdir(dir, 0777), 0);
    vks_metrics *m = NULL;
    assert_int_equal(vks_metrics_open(dir, -1, &m), VKS_OK);
    for (int step = 0; step <= 4; step++) {
        double a = step == 0 ? a0 : step == 4 ? a2 : (a0 + a2) / 2, sm = step == 0 ? s0 : step == 4 ? s2 : (s0 + s2) / 2;
        vks_metric v[] = {{"accuracy", a}, {"accuracy_se", vks_binomial_se(a, 100)}, {"accuracy_n", 100},
                          {"accuracy_sampled", sm}, {"accuracy_sampled_se", vks_binomial_se(sm, 12)},
                          {"accuracy_sampled_n", 12}, {"loss", 1.0 / (step + 1)}, {"reward", 0.1 * step}};
        assert_int_equal(vks_metrics_log(m, step, step % 2 ? v + 6 : v, step % 2 ? 2 : 8), VKS_OK);
    }
    assert_int_equal(vks_metrics_close(m), VKS_OK);
    char metrics[700];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", dir);
    vks_rl_report_samples samples = {0};
    vks_rl_report rep = *base;
    rep.metrics_path = metrics, rep.samples = &samples;
    assert_int_equal(vks_rl_report_write(dir, &rep), VKS_OK);
}

/* The report answers "did it help?" in a browser (issue 36): its first lines
 * say held-out accuracy start -> final with the change and twice the standard
 * error of the difference, and whether the change is beyond that noise; a
 * falling accuracy is shown as falling (the word and the class that colours
 * it), also within the noise (0.167 -> 0.083 on 12 tasks, the case the issue
 * saw); the config table lists every key with the defaults marked; a resumed
 * run is marked with its stop and resume. */
static void test_report_in_browser(void **state) {
    (void)state;
    vks_rl_accuracy_change c = vks_rl_accuracy_compare(0.5, 0.05, 0.3, 0.05);
    assert_near(c.change, -0.2, 1e-12);
    assert_near(c.noise2, 2 * sqrt(0.005), 1e-12);
    assert_int_equal(c.verdict, -1);
    assert_int_equal(vks_rl_accuracy_compare(0.167, 0.108, 0.083, 0.080).verdict, 0);
    assert_int_equal(vks_rl_accuracy_compare(0.2, 0.04, 0.6, 0.049).verdict, 1);
    assert_true(isnan(vks_rl_accuracy_compare(NAN, 0, 0.5, 0.1).change));
    vks_rl_config cfg;
    vks_rl_config_defaults(&cfg);
    cfg.steps = 4, cfg.lr = 3e-4;
    assert_int_equal(vks_rl_config_check(&cfg, 1), VKS_OK);
    vks_rl_resume stop = {.step = 2, .stopped_unix = 1.7e9, .resumed_unix = 1.7e9 + 3600, .elapsed_s = 40};
    vks_rl_report base = {.task = "add:2", .step = 4, .steps = 4, .final = true, .elapsed_s = 75, .config = &cfg,
                          .model = "", .model_hash = "ab12", .task_set = "built-in task add:2", .resumes = &stop,
                          .n_resumes = 1};
    char up[600], down[600];
    snprintf(up, sizeof up, "%s/report-up", tu_tmpdir());
    snprintf(down, sizeof down, "%s/report-down", tu_tmpdir());
    crafted_report(up, 0.2, 0.6, 0.1, 0.3, &base);
    base.n_resumes = 0;
    crafted_report(down, 0.5, 0.3, 0.167, 0.083, &base);
    char *dom = browser_dom(up);
    if (!dom) return;
    /* rising, beyond the noise: the first lines after the title */
    const char *h1 = strstr(dom, "</h1>"), *line = strstr(dom, "<p class=\"headline rising beyond-noise\" id=\"accuracy-greedy\">");
    assert_true(h1 && line && line > h1 && line - h1 < 64);
    assert_non_null(strstr(line, "Held-out accuracy (greedy): 0.200 → 0.600 (change +0.400, ±0.126 = 2 SE of the "
                                 "difference): <strong>rose</strong>, by more than the noise."));
    assert_non_null(strstr(dom, "<p class=\"headline rising within-noise\" id=\"accuracy-sampled\">"));
    assert_non_null(strstr(dom, "n = 100"));
    /* the config: every key, the defaults marked */
    assert_non_null(strstr(dom, "<tr class=\"set\"><td>steps</td><td class=\"text\">4</td><td>set</td></tr>"));
    assert_non_null(strstr(dom, "<tr class=\"set\"><td>lr</td><td class=\"text\">0.0003</td><td>set</td></tr>"));
    assert_non_null(strstr(dom, "<tr class=\"default\"><td>group_size</td><td class=\"text\">8</td><td>default</td></tr>"));
    assert_non_null(strstr(dom, "<tr class=\"default\"><td>prompt.chat_template</td><td class=\"text\">\"none\"</td>"));
    assert_non_null(strstr(dom, "<tr class=\"default\"><td>lora.rank</td><td class=\"text\">0</td>"));
    assert_non_null(strstr(dom, "<tr class=\"default\"><td>roles.trainer</td><td class=\"text\">0</td>"));
    assert_non_null(strstr(dom, "<tr><td>0</td><td>orchestrator, trainer, inference"));
    /* resumed: marked, with its stop */
    assert_non_null(strstr(dom, "<dd id=\"resumed\">resumed run: stopped 1 time; last resumed from step 2 at "
                                "2023-11-14 23:13:20 UTC</dd>"));
    assert_non_null(strstr(dom, "<tr class=\"resume\"><td>2</td><td>2023-11-14 22:13:20 UTC</td><td>40 s</td>"));
    assert_non_null(strstr(dom, "<dd id=\"elapsed\">75 s (across its stops)</dd>"));
    free(dom);
    dom = browser_dom(down);
    assert_non_null(dom);
    line = strstr(dom, "<p class=\"headline falling beyond-noise\" id=\"accuracy-greedy\">");
    assert_non_null(line);
    assert_non_null(strstr(line, "0.500 → 0.300 (change -0.200, ±0.136 = 2 SE of the difference): "
                                 "<strong>fell</strong>, by more than the noise."));
    line = strstr(dom, "<p class=\"headline falling within-noise\" id=\"accuracy-sampled\">");
    assert_non_null(line);
    assert_non_null(strstr(line, "0.167 → 0.083 (change -0.084, ±0.268 = 2 SE of the difference): "
                                 "<strong>fell</strong>, within the noise"));
    assert_null(strstr(dom, "id=\"resumed\""));
    free(dom);
}

/* train sft's "loss A -> B": means over the first and the last 10% of the
 * steps (at least 1, at most 20), not one minibatch each. */
static void test_sft_loss_window(void **state) {
    (void)state;
    vks_sft_loss_window w = {0};
    int window;
    double a, b;
    vks_sft_loss_window_means(&w, &window, &a, &b);
    assert_int_equal(window, 0);
    assert_true(isnan(a) && isnan(b));
    vks_sft_loss_window_add(&w, 5);
    vks_sft_loss_window_means(&w, &window, &a, &b);
    assert_true(window == 1 && a == 5 && b == 5);
    for (int i = 1; i < 50; i++) vks_sft_loss_window_add(&w, 5 - 0.1 * i); /* 50 steps: 5.0 .. 0.1 */
    vks_sft_loss_window_means(&w, &window, &a, &b);
    assert_int_equal(window, 5);
    assert_near(a, 5 - 0.1 * 2, 1e-12); /* 5.0 .. 4.6 */
    assert_near(b, 0.1 + 0.1 * 2, 1e-12); /* 0.5 .. 0.1 */
    memset(&w, 0, sizeof w);
    for (int i = 0; i < 1000; i++) vks_sft_loss_window_add(&w, i % 2 ? 1.0 : 3.0 + (i < 500)); /* noisy */
    vks_sft_loss_window_means(&w, &window, &a, &b);
    assert_int_equal(window, 20);
    assert_near(a, 2.5, 1e-12); /* (4 + 1 + 4 + 1 ...) / 20: the noise averaged out */
    assert_near(b, 2.0, 1e-12);
}

/* A run of config c (checked first) evaluating eval_n held-out tasks; fails the test on an error. */
static vks_rl_result *run_checked(vks_rl_config *c, progress_log *log, int eval_n) {
    assert_int_equal(vks_rl_config_check(c, 1), VKS_OK);
    vks_rl_run_options o = options(c, log);
    o.eval_n = eval_n;
    vks_rl_result *r = malloc(sizeof *r);
    assert_non_null(r);
    if (vks_rl_run(&o, r)) fail_msg("%s", vks_last_error());
    return r;
}

/* Difficulty pools (config "buffer"): the rule at its thresholds; a slot's task is drawn once and the same
 * for the same seed; with the pools at 10 tasks each the draws follow the weights (0.2 / 1.0 / 0.2 of
 * 1.4, each within 5 standard errors over 14000 slots) and are uniform within a pool; a pool weighted 0 is
 * never drawn from; a task moves back; a slot older than the kept ones and bad records are refused. */
static void test_difficulty_pool(void **state) {
    (void)state;
    vks_rl_buffer b = {.easy_threshold = 0.75, .hard_threshold = 0.25, .easy_weight = 0.2, .normal_weight = 1.0,
                       .hard_weight = 0.2};
    const double rates[] = {0, 0.25, 0.26, 0.75, 0.76, 1};
    const int pools[] = {VKS_POOL_HARD, VKS_POOL_HARD, VKS_POOL_NORMAL, VKS_POOL_NORMAL, VKS_POOL_EASY, VKS_POOL_EASY};
    for (int i = 0; i < 6; i++) assert_int_equal(vks_difficulty_pool_of(&b, rates[i]), pools[i]);
    vks_difficulty_pool *p = NULL, *q = NULL, *only = NULL;
    assert_int_equal(vks_difficulty_pool_create(30, &b, 7, &p) | vks_difficulty_pool_create(30, &b, 7, &q), VKS_OK);
    int64_t size[VKS_POOL_COUNT], a, c;
    vks_difficulty_pool_sizes(p, size);
    assert_true(size[VKS_POOL_EASY] == 0 && size[VKS_POOL_NORMAL] == 30 && size[VKS_POOL_HARD] == 0);
    for (int64_t slot = 0; slot < 100; slot++) {
        assert_int_equal(vks_difficulty_pool_task(p, slot, &a) | vks_difficulty_pool_task(q, slot, &c), VKS_OK);
        assert_true(a == c && a >= 0 && a < 30);
        assert_int_equal(vks_difficulty_pool_task(p, slot, &c), VKS_OK);
        assert_int_equal(a, c);
    }
    for (int64_t t = 0; t < 30; t++) assert_int_equal(vks_difficulty_pool_record(p, t, t < 10 ? 1.0 : t < 20 ? 0.0 : 0.5), VKS_OK);
    vks_difficulty_pool_sizes(p, size);
    assert_true(size[VKS_POOL_EASY] == 10 && size[VKS_POOL_NORMAL] == 10 && size[VKS_POOL_HARD] == 10);
    enum { N = 14000 };
    int per_task[30] = {0};
    for (int64_t slot = 1000; slot < 1000 + N; slot++) {
        assert_int_equal(vks_difficulty_pool_task(p, slot, &a), VKS_OK);
        per_task[a]++;
    }
    const double want[3] = {0.2 / 1.4, 1.0 / 1.4, 0.2 / 1.4}; /* tasks 0-9 easy, 10-19 hard, 20-29 normal */
    const int first[3] = {0, 20, 10};
    for (int k = 0; k < 3; k++) {
        int n = 0;
        for (int t = first[k]; t < first[k] + 10; t++) n += per_task[t];
        double f = (double)n / N, se = sqrt(want[k] * (1 - want[k]) / N);
        if (fabs(f - want[k]) > 5 * se) fail_msg("pool %d: %.4f of the draws, want %.4f +- %.4f", k, f, want[k], 5 * se);
        for (int t = first[k]; t < first[k] + 10; t++) { /* uniform within the pool */
            double ft = (double)per_task[t] / n, set = sqrt(0.1 * 0.9 / n);
            if (fabs(ft - 0.1) > 5 * set) fail_msg("task %d: %.4f of its pool's draws", t, ft);
        }
    }
    assert_int_equal(vks_difficulty_pool_record(p, 0, 0.5), VKS_OK); /* back to normal */
    vks_difficulty_pool_sizes(p, size);
    assert_true(size[VKS_POOL_EASY] == 9 && size[VKS_POOL_NORMAL] == 11 && size[VKS_POOL_HARD] == 10);
    assert_int_equal(vks_difficulty_pool_task(p, 1000 + N + VKS_POOL_SLOTS + 5, &a), VKS_OK);
    assert_int_equal(vks_difficulty_pool_task(p, 1005, &a), VKS_ERR_ARG); /* older than the kept slots */
    assert_int_equal(vks_difficulty_pool_record(p, 30, 0.5), VKS_ERR_ARG);
    assert_int_equal(vks_difficulty_pool_record(p, 1, NAN), VKS_ERR_ARG);
    assert_int_equal(vks_difficulty_pool_record(p, 1, 1.5), VKS_ERR_ARG);
    b.easy_weight = b.hard_weight = 0; /* the normal pool only */
    assert_int_equal(vks_difficulty_pool_create(30, &b, 7, &only), VKS_OK);
    for (int64_t t = 0; t < 20; t++) assert_int_equal(vks_difficulty_pool_record(only, t, t < 10 ? 1.0 : 0.0), VKS_OK);
    for (int64_t slot = 0; slot < 500; slot++) {
        assert_int_equal(vks_difficulty_pool_task(only, slot, &a), VKS_OK);
        assert_true(a >= 20 && a < 30);
    }
    vks_difficulty_pool_free(p), vks_difficulty_pool_free(q), vks_difficulty_pool_free(only);
}

/* A run drawing its tasks from difficulty pools: every step's metrics hold the pools' sizes, adding up to the
 * task file's 8 tasks; the tiny model solves nothing, so each task its batches drew went to the hard pool
 * (at least the first batch's 2 by step 1); the verifier, which rebuilds each prompt from the slot's task,
 * rejects nothing. */
static void test_difficulty_pool_run(void **state) {
    (void)state;
    char out[600], path[700];
    vks_rl_config c;
    snprintf(out, sizeof out, "%s/rl-pool", tu_tmpdir());
    small_config(&c, out, 2, 1);
    assert_int_equal(vks_rl_config_set(&c, "buffer.type=difficulty_pool"), VKS_OK);
    progress_log log = {0};
    vks_rl_result *r = run_checked(&c, &log, 0);
    assert_int_equal(log.n, 2);
    assert_int_equal(r->rejected, 0);
    free(r);
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[16384];
    int steps = 0;
    while (fgets(line, sizeof line, f)) {
        json_error_t err;
        json_t *o = json_loads(line, 0, &err), *step = json_object_get(o, "step"), *easy = json_object_get(o, "pool_easy");
        assert_non_null(o);
        if (!easy || !json_integer_value(step)) { json_decref(o); continue; } /* the start's evaluation line */
        double e = json_number_value(easy), n = json_number_value(json_object_get(o, "pool_normal")),
               h = json_number_value(json_object_get(o, "pool_hard"));
        fprintf(stderr, "step %lld: pools easy %g normal %g hard %g\n", (long long)json_integer_value(step), e, n, h);
        assert_true(e + n + h == 8 && h >= 2 && e == 0);
        steps++;
        json_decref(o);
    }
    fclose(f);
    assert_int_equal(steps, 2);
}

/* A code task file (issue 38) trains and is evaluated like any other: the
 * tiny model writes no code block (task reward 0, the thinking budget gives
 * the groups their signal) and its held-out set is scored through the
 * sandbox's code path. */
static void test_code_task_run(void **state) {
    (void)state;
    char path[400], out[600];
    snprintf(path, sizeof path, "%s/code.jsonl", tu_tmpdir());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < 8; i++)
        fprintf(f, "{\"prompt\": \"print %d\", \"task_type\": \"code\", \"tests\": [{\"input\": \"\", \"output\": \"%d\"}]}\n",
                i, i);
    assert_int_equal(fclose(f), 0);
    vks_rl_config c;
    snprintf(out, sizeof out, "%s/rl-code", tu_tmpdir());
    small_config(&c, out, 1, 0);
    snprintf(c.task, sizeof c.task, "file:%s", path);
    c.eval_split = 0.25;
    progress_log log = {0};
    vks_rl_result *r = run_checked(&c, &log, 2);
    assert_int_equal(r->eval_tasks, 2);
    assert_true(r->start_accuracy == 0.0 && r->final_accuracy == 0.0);
    assert_int_equal(log.n, 1);
    assert_true(isfinite(log.p[0].loss));
    free(r);
}

/* Reward program tasks (issue 38) in a run: the program's rewards (a fraction of the completion's
 * length here) give the groups their signal; held-out accuracy counts completions of reward 1. */
/* Writes program `name` (text) and task file `tasks` (8 lines {"prompt": "say I", FIELDS}) into a fresh
 * directory; path gets the task file's. */
static void write_program_tasks(const char *name, const char *text, const char *tasks, const char *fields, char *path,
                                size_t cap) {
    char dir[300];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir()); /* each call makes a directory */
    snprintf(path, cap, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
    snprintf(path, cap, "%s/%s", dir, tasks);
    f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < 8; i++) fprintf(f, "{\"prompt\": \"say %d\", %s}\n", i, fields);
    assert_int_equal(fclose(f), 0);
}

static void test_program_task_run(void **state) {
    (void)state;
    char path[400], out[600];
    write_program_tasks("len.py",
                        "import json, sys\nfor line in sys.stdin:\n    c = json.loads(line)['completion']\n"
                        "    print(json.dumps({'reward': min(len(c), 40) / 40}), flush=True)\n",
                        "prog.jsonl", "\"task_type\": \"program\", \"program\": \"python3 len.py\"", path, sizeof path);
    vks_rl_config c;
    snprintf(out, sizeof out, "%s/rl-program", tu_tmpdir());
    small_config(&c, out, 1, 0);
    snprintf(c.task, sizeof c.task, "file:%s", path);
    snprintf(c.eval_tasks, sizeof c.eval_tasks, "%s", path); /* the run's own copy of the file's tasks */
    c.n_length_targets = 0; /* the program's reward alone */
    progress_log log = {0};
    vks_rl_result *r = run_checked(&c, &log, 2);
    assert_int_equal(r->eval_tasks, 8);
    /* accuracy counts completions of reward 1: at most 12 tokens of text earn at most 12 / 40 here */
    assert_true(r->start_accuracy == 0.0 && r->final_accuracy == 0.0);
    assert_int_equal(log.n, 1);
    assert_true(log.p[0].reward > 0 && isfinite(log.p[0].loss));
    free(r);
    vks_task_programs_stop();
}

/* A slow reward never stalls generation (issue 38): one process, k = 1, a reward program whose first answer
 * (batch 0's first completion) waits for batch 1's rollout file, which only the generation of batch 1 writes.
 * Scored beside the next batch's generation, it sees the file at once; scored in place, as before, it would
 * wait out its 30 s bound and say "stalled". Rewards still reach the trainer in order (two steps, each loss
 * finite). */
static void test_slow_reward_beside_generation(void **state) {
    (void)state;
    char path[400], out[600], verdict[700];
    snprintf(out, sizeof out, "%s/rl-slow-reward", tu_tmpdir());
    char program[2600];
    snprintf(program, sizeof program,
             "import json, os, sys, time\nfirst = True\nfor line in sys.stdin:\n    c = json.loads(line)['completion']\n"
             "    if first:\n        first = False\n        t = time.time()\n"
             "        while not os.path.exists('%s/rollouts/batch-000001.jsonl') and time.time() - t < 30:\n"
             "            time.sleep(0.05)\n"
             "        seen = os.path.exists('%s/rollouts/batch-000001.jsonl')\n"
             "        open('verdict.txt', 'w').write('overlapped' if seen else 'stalled')\n"
             "    print(json.dumps({'reward': min(len(c), 40) / 40}), flush=True)\n",
             out, out);
    write_program_tasks("slow.py", program, "slow.jsonl",
                        "\"task_type\": \"program\", \"program\": \"python3 slow.py\", \"sandbox\": false, \"timeout_s\": 60",
                        path, sizeof path);
    vks_rl_config c;
    small_config(&c, out, 2, 1);
    snprintf(c.task, sizeof c.task, "file:%s", path);
    c.n_length_targets = 0;
    progress_log log = {0};
    vks_rl_result *r = run_checked(&c, &log, 0);
    assert_int_equal(log.n, 2);
    for (int i = 0; i < log.n; i++) assert_true(isfinite(log.p[i].loss));
    snprintf(verdict, sizeof verdict, "%.*s/verdict.txt", (int)(strrchr(path, '/') - path), path);
    size_t len = 0;
    char *v = (char *)tu_read_file(verdict, &len);
    assert_non_null(v);
    assert_true(len == 10 && !memcmp(v, "overlapped", 10));
    free(v);
    free(r);
    vks_task_programs_stop();
}

/* Multi-turn environments (issue 38): an environment program of two turns (a tool message after the first,
 * then done with a reward from the length of what the model wrote) trains on one process with the verifier.
 * Honest: every episode is accepted (each turn's rollout file verified, the environment replayed from the
 * recorded turns), and the mismatch between the sampler's and the trainer's log-probabilities stays at f32
 * rounding with no completion left out for it: only the assistant's tokens are live rows, each with its own
 * turn's record (an environment token trained with logp_old 0, or a turn's record off by one token, would be
 * nats off: without the mask every episode with a reply is left out). A worker that writes its own tool
 * results (TEST ONLY cheat_every: a reply's token changed) has those episodes rejected, named in
 * rejected.jsonl, and never trained on. Held-out episodes are evaluated. */
static void test_environment_run(void **state) {
    (void)state;
    char path[400], out[600], file[700];
    write_program_tasks("two.py",
                        "import json, sys\nsaid = {}\nfor line in sys.stdin:\n    r = json.loads(line)\n    e = r['episode']\n"
                        "    if r['type'] == 'reset':\n        said[e] = ''\n"
                        "        print(json.dumps({'messages': [{'role': 'user', 'content': r['task']['prompt']}]}), flush=True)\n"
                        "        continue\n"
                        "    said[e] += r['completion']\n"
                        "    if len(said[e]) == len(r['completion']):\n"
                        "        print(json.dumps({'messages': [{'role': 'tool', 'content': 'once more, please'}], 'done': False}),"
                        " flush=True)\n"
                        "    else:\n"
                        "        print(json.dumps({'messages': [], 'done': True, 'reward': min(len(said[e]), 40) / 40}), flush=True)\n",
                        "env.jsonl", "\"task_type\": \"environment\", \"environment\": \"python3 two.py\"", path,
                        sizeof path);
    vks_rl_config c;
    snprintf(out, sizeof out, "%s/rl-environment", tu_tmpdir());
    small_config(&c, out, 2, 0);
    snprintf(c.task, sizeof c.task, "file:%s", path);
    snprintf(c.eval_tasks, sizeof c.eval_tasks, "%s", path);
    c.max_new_tokens = 40;
    /* a tiny model that ends its turns: the stop token's classifier row scaled (shared with its embedding) */
    vks_model *m = NULL;
    vks_tokenizer *t = NULL;
    assert_int_equal(vks_model_init_tiny(1, &m, &t), VKS_OK);
    assert_true(m->classifier.dtype == VKS_DTYPE_F32);
    float *eos = (float *)m->classifier.data + (size_t)m->eos_id * (size_t)m->classifier.cols;
    for (int64_t k = 0; k < m->classifier.cols; k++) eos[k] *= 6.0f;
    progress_log log = {0};
    vks_rl_run_options o = options(&c, &log);
    o.model = m, o.eval_n = 2;
    vks_rl_result *r = malloc(sizeof *r);
    assert_non_null(r);
    if (vks_rl_run(&o, r)) fail_msg("%s", vks_last_error());
    assert_int_equal(r->eval_tasks, 8);
    assert_int_equal(log.n, 2);
    snprintf(file, sizeof file, "%s/rollouts/batch-000000-turn-2.jsonl", out); /* the second turns' proofs */
    assert_int_equal(access(file, F_OK), 0);
    assert_true(log.p[0].reward + log.p[1].reward > 0); /* some episodes went through both turns: a reply inside */
    for (int i = 0; i < log.n; i++) {
        const vks_rl_progress *p = &log.p[i];
        fprintf(stderr, "episodes, step %lld: reward %.3f, length %.1f, loss %.5f, mismatch %.2g\n", (long long)p->step,
                p->reward, p->length, p->loss, p->logp_mismatch);
        assert_true(isfinite(p->loss) && p->grad_norm > 0);
        assert_true(p->logp_mismatch < 1e-4 && p->logp_excluded == 0);
        assert_true(p->accept_rate == 1.0 && p->rejected == 0);
    }
    /* the cheat: one step, every second episode's first reply forged */
    snprintf(out, sizeof out, "%s/rl-environment-cheat", tu_tmpdir());
    snprintf(c.out, sizeof c.out, "%s", out);
    c.steps = 1;
    log.n = 0;
    o.cheat_every = 2, o.eval_n = 0;
    if (vks_rl_run(&o, r)) fail_msg("%s", vks_last_error());
    fprintf(stderr, "episodes with forged replies: %lld rejected, accept rate %.3f\n", (long long)log.p[0].rejected,
            log.p[0].accept_rate);
    assert_true(log.p[0].rejected > 0 && log.p[0].accept_rate < 1.0);
    assert_int_equal(r->trained_rejected, 0);
    snprintf(file, sizeof file, "%s/rollouts/rejected.jsonl", out);
    size_t len;
    char *text = (char *)tu_read_file(file, &len);
    assert_non_null(text);
    assert_non_null(strstr(text, "\"reason\":\"turn 2: its conversation is not what the environment gave (a forged reply)\""));
    free(text);
    free(r);
    vks_model_free(m);
    vks_tokenizer_free(t);
    vks_task_programs_stop();
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_synchronous_run), cmocka_unit_test(test_resume), cmocka_unit_test(test_async_run_rejects_cheater),
                                       cmocka_unit_test(test_no_signal_fails), cmocka_unit_test(test_out_locked),
                                       cmocka_unit_test(test_resume_refuses_other_runs),
                                       cmocka_unit_test(test_group_queue), cmocka_unit_test(test_group_queue_off_policy),
                                       cmocka_unit_test(test_max_off_policy_run), cmocka_unit_test(test_heldout_accuracy),
                                       cmocka_unit_test(test_clean_stop), cmocka_unit_test(test_report_escapes),
                                       cmocka_unit_test(test_lora_run), cmocka_unit_test(test_off_policy_kept),
                                       cmocka_unit_test(test_loss_types_run),
                                       cmocka_unit_test(test_versions_ring), cmocka_unit_test(test_report_in_browser),
                                       cmocka_unit_test(test_sft_loss_window), cmocka_unit_test(test_code_task_run), cmocka_unit_test(test_difficulty_pool), cmocka_unit_test(test_difficulty_pool_run),
                                       cmocka_unit_test(test_program_task_run), cmocka_unit_test(test_slow_reward_beside_generation),
                                       cmocka_unit_test(test_environment_run)};
    if (getenv("VKSWARM_TEST_FILTER")) cmocka_set_test_filter(getenv("VKSWARM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
