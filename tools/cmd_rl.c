/* `vkswarm rl`: argument parsing around vks_rl_run (the asynchronous RL run). */
#include <ctype.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sodium.h>
#include "cli_model.h"
#include "cli_mpi.h"
#include "cli_util.h"
#include "commands.h"
#include "vkswarm/vks_rl.h"
#include "vkswarm/vks_rl_config.h"
#include "vkswarm/vks_rl_mpi.h"
#include "vkswarm/vks_shard.h"
#include "vkswarm/vks_tasks.h"
#include "vkswarm/vks_tokenizer.h"

static const char rl_usage[] =
    "usage: vkswarm rl [--config FILE.json] [--set KEY=VALUE]... [--model M | --init tiny] [--task T]\n"
    "                  [--steps N] [--async-level K] [--out DIR] [--eval-every N] [--eval-n N]\n"
    "                  [--eval-seed S] [--eval-tasks FILE.jsonl] [--eval-split F] [--no-verify] [--timeout-s S] [--trainer-timeout-s S]\n"
    "                  [--save-every N] [--keep N] [--resume [--override]] [--device N] [--tokenizer T]\n"
    "                  [--chat-template NAME] [--system TEXT] [--user-template TEXT] [--think-template TEXT]\n"
    "                  [--no-think] [--join [--join-allow FILE]]\n"
    "Asynchronous RL (INTELLECT-2's GRPO) on this machine: an inference thread generates groups of\n"
    "completions of the task with the newest policy the async level allows (weights at most K steps\n"
    "old), the verifier checks them (TOPLOC proofs and the sampling replay), group advantages and the\n"
    "online filter pick what the trainer trains on; the trainer hands each step's weights back.\n"
    "The config (docs \"The RL config\") gives every key; --set KEY=VALUE and the named flags override\n"
    "it. docs \"Asynchronous RL: vkswarm rl\" starts from a task file of your own.\n"
    "The loss (docs \"RL losses\"): INTELLECT-2's GRPO unless --set loss.type=dppo_kl|ipo|cispo|dapo|gspo|\n"
    "decoupled_ppo\n"
    "(each with its knobs under loss.); --set advantage.type=group_mean for r - mean advantages,\n"
    "--set loss.normalize=tokens|sequence for the step's divisor; --set max_off_policy_steps=M (default 8)\n"
    "never trains a group more than M steps older than the weights it trains (below K: the window).\n"
    "--model starts from a checkpoint (train sft's), --init tiny from the built-in tiny model.\n"
    "--task T: a built-in task (add, mul, countdown, sort, reverse, code, optionally :SIZE and :short)\n"
    "or a task file (PATH.jsonl, a path with '/', or file:PATH; docs \"Your own tasks\"), its tasks in turn.\n"
    "Prompts (docs \"Prompts\"; config \"prompt\", --set prompt.KEY=V): BOS + the task's text by default;\n"
    "--chat-template none|model|chatml|qwen3|llama2|llama3|llama3.1|phi3 with --system TEXT, --user-template\n"
    "TEXT (holds {prompt}), --think-template TEXT (holds {n}: the length_targets sentence, default \"Think\n"
    "for {n} tokens.\"), --no-think (qwen3: enable_thinking=false). The first prompt is shown on stderr.\n"
    "Give eval --task the same flags.\n"
    "Held-out accuracy (greedy) is measured at the start, every --eval-every steps (default 5) and at\n"
    "the end on --eval-n (default 64) tasks: fresh instances of a built-in task from --eval-seed\n"
    "(default 999983, not the run's seed), or the first N of the held-out set: --eval-tasks FILE, and/or\n"
    "--eval-split F, which holds out the fraction F of the task file (the same tasks for the same file,\n"
    "never trained on, written to DIR/heldout.jsonl). A task file without either is not evaluated.\n"
    "One line per step on stderr (step, policy lag, reward, accuracy, length, verifier accept rate,\n"
    "rollouts/s, trainer idle, broadcast time); after 30 s without one (VKSWARM_STATUS_INTERVAL_S), a\n"
    "status line: the step waited for, groups generated / discarded / kept, batches in flight per rank; DIR (default from the config, rl-out) gets\n"
    "metrics.jsonl, rl.svg, timeline.svg (what the trainer and the inference thread did when over the\n"
    "last 4 steps: who waited for whom), report.html (one self-contained page: curves, timeline, ranks,\n"
    "sample completions, rejections; rebuilt at every checkpoint), rollouts/batch-N.jsonl and\n"
    "checkpoints DIR/step-N (weights,\n"
    "optimizer state, the rollout position) every --save-every steps (default 10) and at the end, the\n"
    "newest --keep (default 3). Each checkpoint holds the run's whole config (and the --eval-* and\n"
    "--no-verify choices): `vkswarm rl --out DIR --resume` alone continues from the newest one with\n"
    "them (the rollouts of batches started after it are not reused; said on stderr before the first\n"
    "step, as is a DIR without one: a fresh run). A key given with --resume (flag, --set, --config)\n"
    "that differs from the stored one is refused, exit 2, naming the key, old and new value, unless\n"
    "--override (then said on stderr); --out, --steps, --save-every and --keep may change; task and\n"
    "prompts_per_step never. One run at a time writes DIR; a fresh run refuses a DIR holding an\n"
    "earlier run's files.\n"
    "Ctrl-C (SIGINT), SIGTERM or SIGUSR1 stops cleanly: the current step finishes, its checkpoint is saved\n"
    "(whatever --save-every says), metrics and plots are written, stdout as below, and the run exits\n"
    "130 with one line: 'vkswarm: rl: stopped at step N; checkpoint DIR/step-N; continue with:\n"
    "PROGRAM rl --out DIR --resume' (PROGRAM: the path this command was run by). A second signal stops at once.\n"
    "Under mpirun, the same signal to the trainer's process stops it after the step, with a checkpoint,\n"
    "and it tells every rank to stop ('continue with the same mpirun command and --resume'). Ctrl-C\n"
    "to `vkswarm mpirun ARGS` (mpirun, with Ctrl-C made SIGUSR1 to every rank) is that stop; Open MPI\n"
    "4.1's own mpirun takes Ctrl-C as an abort (every rank killed within 2 s). At the end stderr says 'N rollouts; C checked by a verifier: A\n"
    "accepted, R rejected; ...' and, across ranks, one line per rank dropped or refused (world rank, step,\n"
    "why). stdout gets (paths escaped):\n"
    "  task: NAME\n  metrics: PATH\n  plot: PATH\n  timeline: PATH\n  report: PATH\n  final checkpoint: PATH\n"
    "  held-out: WHAT (with a held-out set)\n  accuracy: START -> FINAL (resumed: START is the run's, step 0)\n"
    "  trainer idle: FRACTION\n"
    "Under mpirun with more than one rank the config's roles run across ranks (docs \"RL across ranks\";\n"
    "on one machine: mpirun --oversubscribe --mca btl tcp,self -np N vkswarm rl --config run.json): the\n"
    "trainer rank (by default also the orchestrator) grants batches to inference groups (one rank, or a\n"
    "pipeline of several: the first takes the grants, the group generates across its stages)\n"
    "within the async window, broadcasts the weights after each step through Shardcast (signed,\n"
    "hashed shards; the config's relays (roles.relays) relay them; inference and verifier ranks keep\n"
    "them in DIR/weights-rankR/; a line per step on stderr: 'shardcast: step N ...') and checks every group it\n"
    "receives; a rank that sends garbage is refused, one silent for --timeout-s (default 120) is\n"
    "dropped and its batch granted again (under mpirun --enable-recovery the run goes on). Idle\n"
    "inference ranks give up after --trainer-timeout-s (default 600; more than a trainer step)\n"
    "without a word from the trainer. With verifier ranks (roles.verifiers) each grant names one:\n"
    "the inference rank sends it the batch and its rollout file, it checks them (TOPLOC, the\n"
    "sampling replay) and hands the trainer only the accepted completions; without them each\n"
    "inference rank verifies its own batches. roles.orchestrator may name a rank of its own (not\n"
    "shared with inference, verifier or relay ranks): it then grants, checks and queues the batches,\n"
    "the others talk to it, and the trainer asks it for each step's groups (and re-checks them) while\n"
    "it still broadcasts the weights; a dead orchestrator ends the run after 2 x --timeout-s + 2 s of\n"
    "silence. Every rank must be started with the same model: compared at start (the model hash, as\n"
    "pipeline does), a rank with another is refused naming it and both hashes (exit 2). A broadcast\n"
    "counts only the ranks that acknowledge it after checking the file; a rank that refuses the\n"
    "weights or an adapter is named with its reason, and the run goes on without it under\n"
    "--enable-recovery or stops with exit status 3.\n"
    "--join (under mpirun --ompi-server, or `vkswarm mpirun --join`) opens the run to machines that join it\n"
    "while it runs: the trainer writes DIR/join.uri, and `vkswarm join --run DIR/join.uri` on another\n"
    "machine connects, is sent the config and the task file, checks that it holds the run's model and\n"
    "generates batches as one more inference rank (docs \"Joining a run\"). --join-allow FILE admits only\n"
    "the identities listed (one public key per line, 64 hex digits as DIR/shardcast.pub holds; text after\n"
    "it and lines starting with # are ignored); without it any machine with the run's join line may join.\n"
    "A joined rank refused for what it sent has its key banned for the run.\n";

typedef struct {
    cli_model_args m;
    vks_rl_config c;
    vks_rl_run_options o;
    const char *init;
    int n_set, n_ranks;
    bool across; /* a run across MPI ranks: more than one, or a trainer alone under mpirun open to joins */
    double timeout_s, trainer_timeout_s;
    int test_garbage_rank, test_garbage_kind;
    bool eval_n_given, eval_every_given, eval_seed_given, verify_given, override, join;
    char join_server[1024]; /* --join: the ompi-server's URI */
    const char *join_allow_path;
    uint8_t (*join_allow)[32];
    int n_join_allow;
} rl_args;

static void set_key(vks_rl_config *c, const char *key, const char *val) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s=%s", key, val);
    if (vks_rl_config_set(c, buf)) cli_usage_error("rl", "%s", vks_last_error());
}

/* Whether the run's task is a task file (the config is checked). */
static bool task_is_file(const vks_rl_config *c) {
    vks_task_spec spec;
    const char *path = NULL;
    return vks_task_resolve(c->task, &spec, &path) == VKS_OK && path;
}

/* A task file is evaluated only on a held-out set: said before the run, never silently. */
static void check_eval(const rl_args *a) {
    if (!task_is_file(&a->c) || a->c.eval_tasks[0] || a->c.eval_split > 0 || !a->o.eval_n) return;
    if (a->eval_n_given)
        cli_usage_error("rl", "--eval-n %d: a task file is evaluated on held-out tasks: give --eval-tasks FILE or "
                        "--eval-split F (or --eval-n 0)", a->o.eval_n);
    if (cli_rank_speaks(a->c.trainer)) /* said once, by the trainer */
        fprintf(stderr, "vkswarm: rl: no held-out accuracy: task file without --eval-tasks or --eval-split\n");
}

/* config shardcast_key DIR across ranks: every rank reads DIR/shardcast.pub,
 * the trainer also DIR/shardcast.key. A missing or bad file is the user's
 * mistake: one line naming it, exit 2, before any rank starts MPI. */
static void check_keys(const rl_args *a) {
    char path[sizeof a->c.shardcast_key + 32];
    uint8_t pk[VKS_PUBLIC_KEY_BYTES], sk[VKS_SECRET_KEY_BYTES];
    snprintf(path, sizeof path, "%s/shardcast.pub", a->c.shardcast_key);
    if (vks_key_load_public(path, pk)) cli_die(EXIT_BAD_INPUT, "rl: shardcast_key: %s", vks_last_error());
    if (cli_world_rank() != a->c.trainer) return;
    snprintf(path, sizeof path, "%s/shardcast.key", a->c.shardcast_key);
    if (sodium_init() < 0) cli_die(1, "libsodium failed to initialize");
    int rc = vks_key_load_secret(path, sk);
    sodium_memzero(sk, sizeof sk);
    if (rc) cli_die(rc == VKS_ERR_NOMEM ? 1 : EXIT_BAD_INPUT, "rl: shardcast_key: %s", vks_last_error());
}

/* One run option against what the checkpoint stored: a given one that
 * differs is refused without --override (then listed in changed); one not
 * given takes the stored value. */
static void resume_option(const rl_args *a, const char *ckpt, const char *key, bool given, uint64_t was, uint64_t *now,
                          char *changed, size_t cap) {
    if (!given || was == *now) {
        *now = was;
        return;
    }
    if (!a->override)
        cli_die(EXIT_BAD_INPUT, "rl: resume: %s was %llu in %s, now %llu (--override to allow)", key,
                (unsigned long long)was, ckpt, (unsigned long long)*now);
    size_t at = strlen(changed);
    if (at < cap)
        snprintf(changed + at, cap - at, "%s%s %llu -> %llu", at ? ", " : "", key, (unsigned long long)was,
                 (unsigned long long)*now);
}

/* rl --resume in one process: the newest checkpoint in OUT gives the run's
 * config and evaluation options; what the command line gives must be the
 * same (out, steps, save_every and keep may change), or --override. */
static void resume_config(rl_args *a) {
    vks_rl_stored *st = malloc(sizeof *st);
    if (!st) cli_die(1, "out of memory");
    bool found = false;
    if (vks_rl_stored_read(a->c.out, st, &found)) cli_die(EXIT_BAD_INPUT, "rl: %s", vks_last_error());
    if (!found || !st->has_config) { /* a fresh run, or a checkpoint that stored no config: the command line's */
        free(st);
        return;
    }
    char changed[4096];
    if (vks_rl_config_resume(&a->c, &st->config, st->checkpoint, a->override, changed, sizeof changed))
        cli_die(EXIT_BAD_INPUT, "rl: %s", vks_last_error());
    uint64_t v[4] = {(uint64_t)a->o.eval_every, (uint64_t)a->o.eval_n, a->o.eval_seed, a->o.verify};
    resume_option(a, st->checkpoint, "eval_every", a->eval_every_given, (uint64_t)st->eval_every, &v[0], changed, sizeof changed);
    resume_option(a, st->checkpoint, "eval_n", a->eval_n_given, (uint64_t)st->eval_n, &v[1], changed, sizeof changed);
    resume_option(a, st->checkpoint, "eval_seed", a->eval_seed_given, st->eval_seed, &v[2], changed, sizeof changed);
    resume_option(a, st->checkpoint, "verify", a->verify_given, st->verify, &v[3], changed, sizeof changed);
    a->o.eval_every = (int)v[0], a->o.eval_n = (int)v[1], a->o.eval_seed = v[2], a->o.verify = v[3] != 0;
    if (changed[0]) cli_note("rl: --override: resuming %s with %s", st->checkpoint, changed);
    free(st);
}

/* The config's roles name more ranks than were started (typically: no
 * mpirun): one line saying which mpirun line starts them on one machine. */
_Noreturn static void need_ranks(int named, int started, int argc, char **argv) {
    fflush(stdout);
    fprintf(stderr, "vkswarm: rl: the config's roles name %d ranks but %d %s started; on one machine run: ", named,
            started, started == 1 ? "was" : "were");
    cli_put_mpirun(stderr, named);
    for (int i = 0; i < argc; i++) {
        fputc(' ', stderr);
        cli_put_shell_word(stderr, argv[i]);
    }
    fputc('\n', stderr);
    exit(EXIT_BAD_INPUT);
}

/* --join-allow FILE: one public key per line (64 hex digits, then anything); blank lines and
 * lines starting with # left out. Any other line: exit 2 naming it. */
static void read_join_allow(rl_args *a) {
    char *text = NULL;
    size_t len = 0;
    if (vks_file_read_all(a->join_allow_path, 16u << 20, &text, &len)) cli_die(EXIT_BAD_INPUT, "rl: --join-allow: %s", vks_last_error());
    int lines = 1;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    a->join_allow = calloc((size_t)lines, sizeof *a->join_allow);
    if (!a->join_allow) cli_die(1, "rl: out of memory");
    int line = 0;
    for (char *p = text, *end = text + len; p < end; line++) {
        char *nl = memchr(p, '\n', (size_t)(end - p)), *stop = nl ? nl : end;
        size_t n = (size_t)(stop - p), hex = 0;
        while (n && (p[0] == ' ' || p[0] == '\t')) p++, n--;
        while (hex < n && isxdigit((unsigned char)p[hex])) hex++;
        bool blank = n == 0 || p[0] == '#' || p[0] == '\r';
        bool end_ok = hex == n || p[hex] == ' ' || p[hex] == '\t' || p[hex] == '\r';
        if (!blank && (hex != 64 || !end_ok || sodium_hex2bin(a->join_allow[a->n_join_allow], 32, p, 64, NULL, NULL, NULL)))
            cli_die(EXIT_BAD_INPUT, "rl: --join-allow %s:%d: not a public key (64 hex digits, as DIR/shardcast.pub "
                    "holds)", a->join_allow_path, line + 1);
        a->n_join_allow += !blank;
        p = stop + 1;
    }
    free(text);
    if (!a->n_join_allow) cli_die(EXIT_BAD_INPUT, "rl: --join-allow %s: no key in it", a->join_allow_path);
}

/* --join: a run across ranks whose trainer orchestrates, under an mpirun that was given an
 * ompi-server (its URI, for DIR/join.uri, is in the environment mpirun gives every rank). */
static void check_join(rl_args *a) {
    if (!getenv("OMPI_COMM_WORLD_SIZE"))
        cli_usage_error("rl", "--join opens a run across ranks to more of them: start it under mpirun (vkswarm mpirun --join)");
    if (a->c.orchestrator != a->c.trainer)
        cli_usage_error("rl", "--join: joins go to the trainer's rank; roles.orchestrator names another (not built yet)");
    const char *uri = getenv("OMPI_MCA_pmix_server_uri");
    if (!uri || !uri[0])
        cli_usage_error("rl", "--join: mpirun was given no ompi-server (start the run with `vkswarm mpirun --join ...`, or "
                        "start ompi-server --report-uri FILE and give mpirun --ompi-server file:FILE)");
    if (!strncmp(uri, "file:", 5)) {
        char *text = NULL;
        size_t len = 0;
        if (vks_file_read_all(uri + 5, 4096, &text, &len)) cli_die(EXIT_BAD_INPUT, "rl --join: %s", vks_last_error());
        len = strcspn(text, "\r\n");
        snprintf(a->join_server, sizeof a->join_server, "%.*s", (int)len, text);
        free(text);
    } else snprintf(a->join_server, sizeof a->join_server, "%s", uri);
    if (!a->join_server[0] || strchr(a->join_server, '@'))
        cli_die(EXIT_BAD_INPUT, "rl --join: the ompi-server URI '%s' is not one", a->join_server);
    if (a->join_allow_path) read_join_allow(a);
}

static void parse_rl(int argc, char **argv, rl_args *a) {
    static const struct option opts[] = {
        CLI_MODEL_LONG_OPTIONS, {"config", required_argument, 0, 0}, {"set", required_argument, 0, 0},
        {"init", required_argument, 0, 0}, {"task", required_argument, 0, 0}, {"steps", required_argument, 0, 0},
        {"async-level", required_argument, 0, 0}, {"out", required_argument, 0, 0},
        {"eval-every", required_argument, 0, 0}, {"eval-n", required_argument, 0, 0},
        {"eval-seed", required_argument, 0, 0}, {"eval-tasks", required_argument, 0, 0},
        {"eval-split", required_argument, 0, 0}, {"no-verify", no_argument, 0, 0},
        {"test-cheat-every", required_argument, 0, 0},
        {"timeout-s", required_argument, 0, 0}, {"trainer-timeout-s", required_argument, 0, 0}, {"test-garbage-rank", required_argument, 0, 0},
        {"test-garbage-reward", no_argument, 0, 0}, {"save-every", required_argument, 0, 0},
        {"keep", required_argument, 0, 0}, {"resume", no_argument, 0, 0}, {"override", no_argument, 0, 0},
        {"join", no_argument, 0, 0}, {"join-allow", required_argument, 0, 0},
        CLI_PROMPT_LONG_OPTIONS,
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    vks_rl_config_defaults(&a->c);
    a->o = (vks_rl_run_options){.config = &a->c, .eval_every = 5, .eval_n = 64, .eval_seed = 999983, .verify = true};
    a->m.device = -1;
    a->timeout_s = 120;
    a->trainer_timeout_s = 600;
    a->test_garbage_rank = -1;
    /* the config file first, so that flags override it wherever they stand */
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--config") && vks_rl_config_load(&a->c, argv[i + 1]))
            cli_die(EXIT_BAD_INPUT, "%s", vks_last_error());
    int c, idx;
    while ((c = cli_getopt(argc, argv, "h", opts, &idx)) != -1) {
        if (c == 'h') { fputs(rl_usage, stdout); exit(0); }
        const char *name = opts[idx].name;
        if (cli_model_option(&a->m, name, optarg)) continue;
        if (cli_prompt_option(&a->c.prompt, "rl", name, optarg)) {
            vks_rl_config_mark_given(&a->c, "prompt"); /* a resume compares the stored prompt format */
            continue;
        }
        if (!strcmp(name, "think-tokens")) cli_usage_error("rl", "--think-tokens goes with eval and tasks filter; an RL run's budgets are length_targets");
        if (!strcmp(name, "config")) continue;
        else if (!strcmp(name, "set")) { if (vks_rl_config_set(&a->c, optarg)) cli_usage_error("rl", "%s", vks_last_error()); }
        else if (!strcmp(name, "init")) a->init = optarg, set_key(&a->c, "init", optarg);
        else if (!strcmp(name, "task")) set_key(&a->c, "task", optarg);
        else if (!strcmp(name, "steps")) set_key(&a->c, "steps", optarg);
        else if (!strcmp(name, "async-level")) set_key(&a->c, "async_level", optarg);
        else if (!strcmp(name, "out")) set_key(&a->c, "out", optarg);
        else if (!strcmp(name, "eval-every"))
            a->o.eval_every = (int)cli_parse_long("--eval-every", optarg, 0, 1 << 30), a->eval_every_given = true;
        else if (!strcmp(name, "eval-n")) a->o.eval_n = (int)cli_parse_long("--eval-n", optarg, 0, 1 << 20), a->eval_n_given = true;
        else if (!strcmp(name, "eval-tasks")) set_key(&a->c, "eval_tasks", optarg);
        else if (!strcmp(name, "eval-split")) set_key(&a->c, "eval_split", optarg);
        else if (!strcmp(name, "eval-seed")) a->o.eval_seed = cli_parse_u64("--eval-seed", optarg), a->eval_seed_given = true;
        else if (!strcmp(name, "no-verify")) a->o.verify = false, a->verify_given = true;
        else if (!strcmp(name, "save-every")) set_key(&a->c, "save_every", optarg);
        else if (!strcmp(name, "keep")) set_key(&a->c, "keep", optarg);
        else if (!strcmp(name, "resume")) a->o.resume = true;
        else if (!strcmp(name, "override")) a->override = true;
        else if (!strcmp(name, "join")) a->join = true;
        else if (!strcmp(name, "join-allow")) a->join_allow_path = optarg;
        else if (!strcmp(name, "timeout-s")) a->timeout_s = cli_parse_double("--timeout-s", optarg, 0.5, 1e6);
        else if (!strcmp(name, "trainer-timeout-s"))
            a->trainer_timeout_s = cli_parse_double("--trainer-timeout-s", optarg, 0.5, 1e6);
        else if (!strcmp(name, "test-garbage-reward")) a->test_garbage_kind = 2;
        else if (!strcmp(name, "test-garbage-rank")) a->test_garbage_rank = (int)cli_parse_long("--test-garbage-rank", optarg, 0, 1 << 20);
        else if (!strcmp(name, "test-cheat-every")) a->o.cheat_every = (int)cli_parse_long("--test-cheat-every", optarg, 0, 1 << 30);
    }
    if (optind < argc) cli_usage_error("rl", "unexpected argument '%s'", argv[optind]);
    cli_no_kv_type(&a->m, "rl"); /* its verifiers replay rollouts in f32 */
    if (a->m.model_path) set_key(&a->c, "model", a->m.model_path);
    if (a->m.random_spec) cli_usage_error("rl", "--random-model has no tokenizer: use --init tiny or --model");
    if (a->override && !a->o.resume) cli_usage_error("rl", "--override applies to --resume only");
    const char *np = getenv("OMPI_COMM_WORLD_SIZE");
    a->n_ranks = np && atoi(np) > 1 ? atoi(np) : 1;
    a->across = a->n_ranks > 1 || (a->join && np); /* -np 1 --join: a trainer alone, its inference ranks all joiners */
    if (a->o.resume && !a->across) resume_config(a);
    int named = vks_rl_config_ranks_named(&a->c);
    if (named > a->n_ranks) need_ranks(named, a->n_ranks, argc, argv);
    if (vks_rl_config_check(&a->c, a->n_ranks)) cli_die(EXIT_BAD_INPUT, "%s", vks_last_error());
    check_eval(a);
    if (a->across && a->c.shardcast_key[0]) check_keys(a);
    if ((a->across || (a->c.roles_given && a->c.n_groups == 0)) && vks_rl_mpi_check_roles(&a->c, a->join))
        cli_die(EXIT_BAD_INPUT, "%s", vks_last_error());
    if (a->join_allow_path && !a->join) cli_usage_error("rl", "--join-allow goes with --join");
    if (a->join) check_join(a);
}

static void on_progress(void *ctx, const vks_rl_progress *p) {
    (void)ctx;
    char acc[32] = "-", reward[32] = "-";
    if (!isnan(p->accuracy)) snprintf(acc, sizeof acc, "%.3f", p->accuracy);
    if (!isnan(p->reward)) snprintf(reward, sizeof reward, "%.3f", p->reward);
    fprintf(stderr,
            "rl: step %lld/%lld: lag %.1f, reward %s, accuracy %s, length %.1f, accepted %.3f, %.1f rollouts/s, "
            "trainer idle %.0f%%, broadcast %.3f s, loss %.4f, clipped %.3f, logp mismatch %.2g, entropy %.3f (%.0f s)\n",
            (long long)p->step, (long long)p->steps, p->policy_lag, reward, acc, p->length, p->accept_rate,
            p->rollouts_per_s, 100 * p->trainer_idle, p->broadcast_s, p->loss, p->clip_fraction, p->logp_mismatch,
            p->entropy, p->elapsed_s);
}

static void on_status(void *ctx, const char *line) {
    (void)ctx;
    fprintf(stderr, "%s\n", line);
}

/* The status line's silence: VKS_RL_STATUS_INTERVAL_S, or VKSWARM_STATUS_INTERVAL_S
 * seconds (tests: a short one; > 0, at most a day). */
static void set_status(vks_rl_run_options *o) {
    o->status = on_status;
    const char *v = getenv("VKSWARM_STATUS_INTERVAL_S");
    if (!v || !v[0]) return;
    char *end = NULL;
    double s = strtod(v, &end);
    if (*end || !(s > 0) || s > 86400)
        cli_die(EXIT_BAD_INPUT, "VKSWARM_STATUS_INTERVAL_S: '%s' is not a number of seconds in (0, 86400]", v);
    o->status_interval_s = s;
}

static void print_result(const rl_args *a, const vks_rl_result *r) {
    fprintf(stderr, "vkswarm: rl: %lld rollouts; %lld checked by a verifier: %lld accepted, %lld rejected; %lld groups "
            "without signal, %lld stale, %lld off-policy; %.0f s\n", (long long)r->rollouts, (long long)r->checked,
            (long long)r->accepted, (long long)r->rejected, (long long)r->groups_filtered, (long long)r->groups_stale,
            (long long)r->off_policy_dropped, r->elapsed_s);
    for (int i = 0; i < r->n_ranks; i++) { /* the ranks the run lost, by their world rank; the ranks that joined */
        const vks_rl_rank_status *k = &r->ranks[i];
        if (k->joined)
            fprintf(stderr, "vkswarm: rl: joined rank %d (key %s): %lld batches, %lld rollouts, %lld rejected%s%s", k->rank,
                    k->identity, (long long)k->batches, (long long)k->rollouts, (long long)k->rejected,
                    k->banned ? ", banned" : "", k->state == VKS_RL_RANK_LIVE ? "\n" : "; ");
        if (k->state == VKS_RL_RANK_LIVE) continue;
        if (!k->joined) fprintf(stderr, "vkswarm: rl: %s rank %d ", k->verifier ? "verifier" : "inference", k->rank);
        fprintf(stderr, "%s at step %lld: ", k->state == VKS_RL_RANK_DROPPED ? "dropped" : "refused", (long long)k->at_step);
        cli_put_escaped(stderr, k->why, strnlen(k->why, sizeof k->why));
        fputc('\n', stderr);
    }
    printf("task: ");
    cli_put_escaped(stdout, a->c.task, strlen(a->c.task));
    putchar('\n');
    cli_put_path_line("metrics", r->metrics_path);
    cli_put_path_line("plot", r->plot_path);
    cli_put_path_line("timeline", r->timeline_path);
    cli_put_path_line("report", r->report_path);
    cli_put_path_line("final checkpoint", r->final_checkpoint);
    if (r->eval_set[0]) {
        printf("held-out: ");
        cli_put_escaped(stdout, r->eval_set, strlen(r->eval_set));
        printf("\n");
    }
    if (isnan(r->start_accuracy))
        printf("accuracy: not measured (%s)\n", !a->o.eval_n ? "--eval-n 0" : "a task file without --eval-tasks or --eval-split");
    else if (isnan(r->final_accuracy) && r->resumed_from >= 0) /* stopped before an evaluation */
        printf("accuracy: %.3f -> not measured since the resume at step %lld\n", r->start_accuracy,
               (long long)r->resumed_from);
    else if (isnan(r->final_accuracy)) printf("accuracy: %.3f -> not measured since the start\n", r->start_accuracy);
    else printf("accuracy: %.3f -> %.3f%s\n", r->start_accuracy, r->final_accuracy,
                r->start_accuracy_stored ? " (from the run's start, step 0)" : "");
    printf("trainer idle: %.3f\n", r->trainer_idle);
}

/* Every rank must hold the same model (under LoRA the base every adapter is
 * for): compared at start, as `vkswarm pipeline` does; a mismatch ends every
 * rank with status 2 before any broadcast, the trainer naming the rank and
 * both hashes. */
static void check_ranks(const rl_args *a, const vks_model *m, int rank) {
    uint8_t hash[32];
    cli_model_hash(&a->m, m, hash);
    int rc = vks_mpi_check_ranks(vks_mpi_world(), hash, a->timeout_s);
    if (rc == VKS_ERR_TIMEOUT) {
        fprintf(stderr, "vkswarm: rl: rank %d: %s\n", rank, vks_last_error());
        cli_mpi_abort(3);
    }
    if (!rc) return;
    if (rank == a->c.trainer) fprintf(stderr, "vkswarm: rl: %s\n", vks_last_error());
    vks_mpi_stop_within(a->timeout_s, cli_mpi_stuck);
    cli_exit_now(EXIT_BAD_INPUT);
}

/* One rank of an RL run across MPI ranks: the trainer or an inference rank. */
static int rl_mpi(rl_args *a, vks_model *m, vks_tokenizer *tok) {
    int rank = 0, size = 0;
    bool pipelines = false; /* a group's first stage runs its pipeline on its generation thread */
    for (int i = 0; i < a->c.n_groups; i++) pipelines = pipelines || a->c.groups[i].n > 1;
    /* the join point's thread accepts while the main thread works */
    vks_mpi_start_within(pipelines || a->join ? VKS_MPI_THREADS_MULTIPLE : VKS_MPI_THREADS_FUNNELED, a->timeout_s,
                         cli_mpi_stuck, &rank, &size);
    if (size != a->n_ranks) cli_mpi_abort(EXIT_BAD_INPUT);
    check_ranks(a, m, rank);
    int roles = vks_rl_config_roles_of(&a->c, rank);
    if (!(roles & VKS_RL_ROLE_TRAINER)) cli_stop_quiet();
    vks_rl_mpi_options mo = {.timeout_s = a->timeout_s, .trainer_timeout_s = a->trainer_timeout_s, .test_garbage = rank != a->test_garbage_rank ? 0
                                                                         : a->test_garbage_kind ? a->test_garbage_kind : 1,
                           .join_server = a->join ? a->join_server : NULL,
                           .join_allow = (const uint8_t(*)[32])a->join_allow, .n_join_allow = a->n_join_allow};
    cli_model_hash(&a->m, m, mo.model_hash);
#ifdef VKS_TEST_CHEAT /* the test build's vkswarm_cheat only: dishonest inference ranks (tests/rl_cheat.c) */
    int vks_test_cheat_setup(const char *spec, int rank, int prompts_per_step, vks_rl_mpi_options *mo, vks_model *m);
    if (vks_test_cheat_setup(getenv("VKSWARM_TEST_CHEAT"), rank, a->c.prompts_per_step, &mo, m))
        cli_die(EXIT_BAD_INPUT, "VKSWARM_TEST_CHEAT: RANK:KIND[,RANK:KIND]... (hide, logp, counts, sum, base)");
#endif
    /* a relay only moves bytes; an orchestrator of its own checks groups on the CPU */
    vks_gpu *gpu = roles & VKS_RL_ROLE_RELAY || roles == VKS_RL_ROLE_ORCHESTRATOR ? NULL : cli_open_gpu(&a->m);
    a->o.model = m, a->o.tok = tok, a->o.train_gpu = gpu, a->o.infer_gpu = gpu;
    set_status(&a->o);
    int rc, status = 0;
    bool no_finalize = false, stopped = false;
    if (roles & VKS_RL_ROLE_TRAINER) {
        a->o.progress = on_progress;
        a->o.on_resume = cli_on_resume_rl;
        a->o.show_prompt = cli_show_prompt, a->o.progress_ctx = "rl";
        a->o.stop_requested = cli_stop_requested;
        vks_rl_result r;
        rc = vks_rl_mpi_trainer(&a->o, &mo, &r, &no_finalize);
        if (rc) {
            cli_note("rl: %s", vks_last_error());
            cli_mpi_abort(cli_mpi_status(rc));
        }
        print_result(a, &r);
        if (r.stopped_at_step >= 0) { /* every rank was told to stop: exit 130 after MPI_Finalize */
            stopped = true;
            fflush(stdout);
            fprintf(stderr, "vkswarm: rl: stopped at step %lld; checkpoint ", (long long)r.stopped_at_step);
            cli_put_escaped(stderr, r.final_checkpoint, strlen(r.final_checkpoint));
            fputs("; continue with the same mpirun command and --resume\n", stderr);
        }
    } else if (roles & VKS_RL_ROLE_ORCHESTRATOR) { /* on a rank of its own */
        rc = vks_rl_mpi_orchestrator(&a->o, &mo, &no_finalize);
        if (rc) cli_note("rl: orchestrator rank %d: %s", rank, vks_last_error()), status = cli_mpi_status(rc);
    } else if (roles & VKS_RL_ROLE_INFERENCE) {
        rc = vks_rl_mpi_inference(&a->o, &mo, &no_finalize);
        if (rc) cli_note("rl: inference rank %d: %s", rank, vks_last_error()), status = cli_mpi_status(rc);
    } else if (roles & VKS_RL_ROLE_VERIFIER) {
        rc = vks_rl_mpi_verifier(&a->o, &mo, &no_finalize);
        if (rc) cli_note("rl: verifier rank %d: %s", rank, vks_last_error()), status = cli_mpi_status(rc);
    } else if (roles & VKS_RL_ROLE_RELAY) {
        rc = vks_rl_mpi_relay(&a->o, &mo, &no_finalize);
        if (rc) cli_note("rl: relay rank %d: %s", rank, vks_last_error()), status = cli_mpi_status(rc);
    } else {
        cli_note("rl: rank %d has no role this cut runs", rank);
        status = EXIT_BAD_INPUT;
    }
    fflush(stdout);
    int grc = gpu ? cli_finish_gpu(gpu) : 0;
    if (!status && grc) status = grc;
    if (no_finalize || status) cli_exit_now(status); /* a lost rank would hold MPI_Finalize */
    vks_mpi_stop_within(a->timeout_s, cli_mpi_stuck);
    return stopped ? EXIT_STOPPED : status;
}

int cmd_rl(int argc, char **argv) {
    rl_args a = {0};
    parse_rl(argc, argv, &a);
    /* Across ranks too: a signal to the trainer's process stops it after the step with a checkpoint,
     * and it tells the other ranks to stop (they ignore their own first signal and wait for that) */
    cli_stop_install();
    vks_tokenizer *tok = NULL;
    vks_model *m = NULL;
    if (a.c.model[0]) {
        a.m.model_path = a.c.model;
        a.m.speaker = a.c.trainer;
        m = cli_load_model(&a.m);
        if (vks_tokenizer_load_auto(a.m.tokenizer_path, m, &tok))
            cli_die(EXIT_BAD_INPUT, "%s (RL needs the model's tokenizer: --tokenizer)", vks_last_error());
    } else if (vks_model_init_tiny(a.c.seed, &m, &tok)) cli_die(1, "%s", vks_last_error());
    cli_check_prompt("rl", &a.c.prompt, tok, a.m.speaker);
    if (vks_tokenizer_check_dir_files(tok)) /* checkpoints hold it: refused now, not at the first save */
        cli_die(EXIT_BAD_INPUT, "%s (checkpoints could not hold the tokenizer)", vks_last_error());
    if (a.across) {
        int status = rl_mpi(&a, m, tok);
        vks_tokenizer_free(tok);
        vks_model_free(m);
        return status;
    }
    vks_gpu *train_gpu = cli_open_gpu(&a.m), *infer_gpu = cli_open_gpu(&a.m);
    a.o.model = m, a.o.tok = tok, a.o.train_gpu = train_gpu, a.o.infer_gpu = infer_gpu;
    a.o.progress = on_progress;
    set_status(&a.o);
    a.o.on_resume = cli_on_resume_rl;
    a.o.show_prompt = cli_show_prompt, a.o.progress_ctx = "rl";
    a.o.stop_requested = cli_stop_requested; /* handlers installed before the model loads */
    vks_rl_result r;
    int rc = vks_rl_run(&a.o, &r);
    if (rc) cli_die(rc == VKS_ERR_FORMAT || rc == VKS_ERR_ARG ? EXIT_BAD_INPUT : 1, "%s", vks_last_error());
    print_result(&a, &r);
    if (r.stopped_at_step >= 0) { /* the config is in the checkpoint: OUT and --resume continue it */
        const char *args[8] = {"rl", "--out", a.c.out, "--resume"};
        int n = 4;
        if (a.m.tokenizer_path) args[n++] = "--tokenizer", args[n++] = a.m.tokenizer_path;
        char dev[32];
        if (a.m.device >= 0) snprintf(dev, sizeof dev, "%d", a.m.device), args[n++] = "--device", args[n++] = dev;
        cli_stop_line("rl", r.stopped_at_step, r.final_checkpoint, n, args);
    }
    if (a.m.profile) cli_print_profile(train_gpu);
    rc = cli_finish_gpu(infer_gpu);
    int rc2 = cli_finish_gpu(train_gpu);
    vks_tokenizer_free(tok);
    vks_model_free(m);
    return rc ? rc : rc2 ? rc2 : r.stopped_at_step >= 0 ? EXIT_STOPPED : 0;
}
