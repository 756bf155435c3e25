/* vkswarm join: this machine joins a running RL run as an inference rank
 * (mpi/rl_join.h; docs/joining.md). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "cli_model.h"
#include "cli_mpi.h"
#include "cli_util.h"
#include "commands.h"
#include "vkswarm/vks_rl.h"
#include "vkswarm/vks_rl_config.h"
#include "vkswarm/vks_rl_mpi.h"
#include "vkswarm/vks_shard.h"
#include "vkswarm/vks_tokenizer.h"

static const char join_usage[] =
    "usage: vkswarm join --run URI|FILE [--key DIR] [--model M] [--tokenizer T] [--out DIR] [--device N]\n"
    "                    [--timeout-s S] [--trainer-timeout-s S]\n"
    "Joins a running `vkswarm rl --join` as one more inference rank. --run takes the run's DIR/join.uri\n"
    "(copied to this machine) or the line in it (PORT@SERVER: the run's port and its ompi-server). This\n"
    "machine connects (run it alone: it starts MPI as a singleton pointed at that ompi-server), is sent\n"
    "the run's config and task file (written to DIR/tasks.jsonl), loads the base model from its own disk\n"
    "(--model, else the config's model path, else the built-in tiny model of the config's seed), and the\n"
    "run admits it only when its model hash is the run's (else both hashes are named, exit 2). It then\n"
    "takes the run's newest weights and generates the batches the trainer grants, verifying its own, until\n"
    "the run ends; its rollout files go to DIR/rollouts-rankN (default DIR: join-out; N: the rank number\n"
    "the run gave it, after the world's). A machine that was dropped (killed, rebooted, cut off) runs the\n"
    "same command again and is a new rank. Ctrl-C (SIGINT, SIGTERM) leaves cleanly after the batch in hand:\n"
    "the run is told goodbye and grants a batch not begun to another rank; exit 130. --key DIR: this machine's identity, an Ed25519 key pair from\n"
    "`vkswarm keygen --out DIR` (DIR/shardcast.key); it signs the hello and every batch, a run started\n"
    "with --join-allow admits only the keys listed, and a key whose rank sent something wrong is banned\n"
    "for the run (its rejoin refused, naming why). Without --key a key is made for this process (said on\n"
    "stderr). In a run with verifier ranks this machine's batches reach them through the trainer, and\n"
    "every group of its key's first probation_batches (the run's config, default 8) accepted batches is\n"
    "replayed. A pipeline group of S machines (or GPUs) joins as one rank: `vkswarm mpirun --join-run FILE\n"
    "-np S vkswarm join --run FILE` (each stage loads the model from its own disk; the first stage talks\n"
    "to the run and passes the weights on; the layers are split evenly). Not yet: LoRA runs (refused,\n"
    "saying so). Exit status: 0 when the run ended\n"
    "normally, 2 not admitted or bad input, 3 the run went silent (--trainer-timeout-s while idle,\n"
    "default 600; --timeout-s for sends and the handshake, default 120). See docs \"Joining a run\".\n";

typedef struct {
    cli_model_args m;
    const char *run, *out, *key;
    double timeout_s, trainer_timeout_s;
    bool test_garbage;
    int test_cheat_every;
} join_args;

static void parse_join(int argc, char **argv, join_args *a) {
    static const struct option opts[] = {CLI_MODEL_LONG_OPTIONS, {"run", required_argument, 0, 0},
                                         {"out", required_argument, 0, 0}, {"timeout-s", required_argument, 0, 0},
                                         {"trainer-timeout-s", required_argument, 0, 0}, {"key", required_argument, 0, 0},
                                         {"test-garbage", no_argument, 0, 0}, {"test-cheat-every", required_argument, 0, 0},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    a->m.device = -1;
    a->out = "join-out";
    a->timeout_s = 120, a->trainer_timeout_s = 600;
    int c, idx;
    while ((c = cli_getopt(argc, argv, "h", opts, &idx)) != -1) {
        if (c == 'h') { fputs(join_usage, stdout); exit(0); }
        const char *name = opts[idx].name;
        if (cli_model_option(&a->m, name, optarg)) continue;
        if (!strcmp(name, "run")) a->run = optarg;
        else if (!strcmp(name, "out")) a->out = optarg;
        else if (!strcmp(name, "key")) a->key = optarg;
        else if (!strcmp(name, "test-garbage")) a->test_garbage = true; /* TEST ONLY: a token outside the vocabulary */
        else if (!strcmp(name, "test-cheat-every")) /* TEST ONLY: as rl's: a token the sampler did not draw */
            a->test_cheat_every = (int)cli_parse_long("--test-cheat-every", optarg, 0, 1 << 30);
        else if (!strcmp(name, "timeout-s")) a->timeout_s = cli_parse_double("--timeout-s", optarg, 0.5, 1e6);
        else if (!strcmp(name, "trainer-timeout-s"))
            a->trainer_timeout_s = cli_parse_double("--trainer-timeout-s", optarg, 0.5, 1e6);
    }
    if (optind < argc) cli_usage_error("join", "unexpected argument '%s'", argv[optind]);
    if (!a->run) cli_usage_error("join", "--run URI|FILE is required (the run's DIR/join.uri)");
    if (a->m.random_spec || a->m.lora_path) cli_usage_error("join", "the model is the run's base: --model only");
    cli_no_kv_type(&a->m, "join");
    const char *np = getenv("OMPI_COMM_WORLD_SIZE");
    if (np && !getenv("OMPI_MCA_pmix_server_uri"))
        cli_usage_error("join", "under mpirun, mpirun must know the run's ompi-server: vkswarm mpirun --join-run %s -np "
                        "%s vkswarm join --run %s", a->run, np, a->run);
}

/* The run's task file, written where this machine keeps the run's files; c->task then names it. */
static void place_tasks(vks_rl_config *c, const char *out, const void *tasks, size_t bytes) {
    char path[1200];
    snprintf(path, sizeof path, "%s/tasks.jsonl", out);
    vks_outfile f;
    if (vks_outfile_open(&f, path, 0644)) cli_die(EXIT_BAD_INPUT, "join: %s", vks_last_error());
    bool ok = fwrite(tasks, 1, bytes, f.f) == bytes;
    if (vks_outfile_finish(&f, ok)) cli_die(1, "join: %s", vks_last_error());
    if ((size_t)snprintf(c->task, sizeof c->task, "file:%s", path) >= sizeof c->task)
        cli_die(EXIT_BAD_INPUT, "join: --out %s is too long a path", out);
}

int cmd_join(int argc, char **argv) {
    join_args a = {0};
    parse_join(argc, argv, &a);
    char port[1024], server[1024];
    cli_read_join_line("join", "--run", a.run, port, sizeof port, server, sizeof server);
    /* a singleton finds the run there; under mpirun (a group), mpirun was given it (--join-run) */
    if (!getenv("OMPI_COMM_WORLD_SIZE")) setenv("OMPI_MCA_pmix_server_uri", server, 1);
    if (mkdir(a.out, 0755) && errno != EEXIST) cli_die(EXIT_BAD_INPUT, "join: --out %s: %s", a.out, strerror(errno));
    static uint8_t sk[VKS_SECRET_KEY_BYTES]; /* read before MPI starts: a bad --key costs nothing */
    char key_path[1100];
    if (a.key) {
        snprintf(key_path, sizeof key_path, "%s/shardcast.key", a.key);
        if (vks_key_load_secret(key_path, sk)) cli_die(EXIT_BAD_INPUT, "join: --key: %s", vks_last_error());
    } else {
        uint8_t pk[VKS_PUBLIC_KEY_BYTES];
        if (vks_keypair_new(pk, sk)) cli_die(1, "join: %s", vks_last_error());
        fprintf(stderr, "vkswarm: join: a key made for this process is its identity (--key DIR keeps one across joins)\n");
    }
    cli_stop_install();
    int rank = 0, size = 0;
    vks_mpi_start_within(VKS_MPI_THREADS_MULTIPLE, a.timeout_s, cli_mpi_stuck, &rank, &size);
    vks_rl_joiner *j = NULL;
    int crc = vks_rl_join_connect(port, a.timeout_s, &j);
    if (crc) {
        cli_note("join: %s", vks_last_error());
        cli_exit_now(cli_mpi_status(crc));
    }
    vks_rl_config c;
    vks_rl_config_defaults(&c);
    if (vks_rl_config_parse(&c, vks_rl_joiner_config(j), "the run's config")) cli_die(EXIT_BAD_INPUT, "join: %s", vks_last_error());
    if ((size_t)snprintf(c.out, sizeof c.out, "%s", a.out) >= sizeof c.out) cli_die(EXIT_BAD_INPUT, "join: --out is too long");
    size_t task_bytes = 0;
    const void *tasks = vks_rl_joiner_tasks(j, &task_bytes);
    if (task_bytes) place_tasks(&c, a.out, tasks, task_bytes);
    vks_tokenizer *tok = NULL;
    vks_model *m = NULL;
    if (!a.m.model_path && c.model[0]) a.m.model_path = c.model;
    if (a.m.model_path) {
        m = cli_load_model(&a.m);
        if (vks_tokenizer_load_auto(a.m.tokenizer_path, m, &tok))
            cli_die(EXIT_BAD_INPUT, "join: %s (RL needs the model's tokenizer: --tokenizer)", vks_last_error());
    } else if (vks_model_init_tiny(c.seed, &m, &tok)) cli_die(1, "join: %s", vks_last_error());
    vks_rl_mpi_options mo = {.timeout_s = a.timeout_s, .trainer_timeout_s = a.trainer_timeout_s, .join_secret_key = sk,
                             .test_garbage = a.test_garbage};
    uint8_t hash[32];
    cli_model_hash(&a.m, m, hash);
    vks_gpu *gpu = cli_open_gpu(&a.m);
    vks_rl_run_options o = {.config = &c, .model = m, .tok = tok, .infer_gpu = gpu, .train_gpu = gpu,
                            .verify = vks_rl_joiner_verify(j), .stop_requested = cli_stop_requested,
                            .cheat_every = a.test_cheat_every};
    bool no_finalize = false;
    int rc = vks_rl_join_run(j, &o, &mo, hash, &no_finalize);
    int status = rc ? cli_mpi_status(rc) : 0;
    if (rc) cli_note("join: %s", vks_last_error());
    else if (cli_stop_requested(NULL)) {
        fprintf(stderr, "vkswarm: join: stopped: this machine said goodbye (its unsent batch goes to another rank); "
                "join again with the same command\n");
        status = EXIT_STOPPED;
    } else fprintf(stderr, "vkswarm: join: the run said stop; leaving\n");
    int grc = cli_finish_gpu(gpu);
    if (!status && grc) status = grc;
    vks_rl_joiner_free(j);
    vks_tokenizer_free(tok);
    vks_model_free(m);
    if (no_finalize || status) cli_exit_now(status);
    vks_mpi_stop_within(a.timeout_s, cli_mpi_stuck);
    return 0;
}
