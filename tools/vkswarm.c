/* vkswarm: the command-line entry point. stdout carries results only; logs,
 * progress and errors go to stderr. Exit status 2 means bad input. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli_util.h"
#include "vkswarm/vks_gpu.h"

#include "commands.h"

static const char usage[] =
    "usage: vkswarm <command> [options]   (vkswarm <command> --help for details)\n"
    "commands:\n"
    "  devices    list Vulkan devices\n"
    "  generate   generate text from a prompt or a file of prompts\n"
    "  logits     write the logits of a sequence of ids\n"
    "  bench      measure prefill/decode speed against the device's bandwidth and matmul rate\n"
    "  tokenize   text on stdin to token ids        detokenize  ids on stdin to text\n"
    "  convert    convert between llama2.c, GGUF and safetensors\n"
    "  pipeline   pipeline-parallel generation across MPI ranks (under mpirun)\n"
    "  verify     check rollouts with TOPLOC proofs and sampler replay\n"
    "  train sft  supervised fine-tuning on the GPU      eval   a model's loss and accuracy on JSONL data or a task\n"
    "  tasks      built-in task data for SFT (tasks sft), difficulty filter of task files (tasks filter)\n"
    "  rl         the asynchronous RL run (GRPO): inference, verifier and trainer on this machine\n"
    "  join       join a running rl run (rl --join) from this machine as one more inference rank\n"
    "  mpirun     run mpirun with Ctrl-C as a clean stop (every rank told; the trainer saves its step)\n"
    "  keygen     write an Ed25519 key pair         broadcast   signed sharded weight broadcast (mpirun)\n"
    "  version    print the version\n"
    "environment: VKSWARM_DEVICE=N picks a device; VKSWARM_VALIDATION=1 turns on the Khronos validation layer.\n";

static int cmd_devices(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        puts("usage: vkswarm devices\nLists every Vulkan device: index, name, vendor, type, device-local memory,\n"
             "fp16 and int8 arithmetic, subgroup size, the subgroup size kernels require where the device\n"
             "offers subgroup size control (with its min-max; \"no\": the driver chooses), max shared memory,\n"
             "max storage-buffer range.\n"
             "The default device (*) is the discrete GPU with the most memory, else an integrated one, else the CPU driver.");
        return 0;
    }
    if (argc > 1) cli_usage_error("devices", "%s '%s'", argv[1][0] == '-' ? "unknown option" : "unexpected argument", argv[1]);
    vks_device_info d[16];
    int n = 0;
    if (vks_gpu_list(d, 16, &n)) cli_die(1, "%s", vks_last_error());
    int def = vks_gpu_default_index(d, n < 16 ? n : 16);
    printf("%-3s %-40s %-8s %-10s %10s %5s %5s %8s %-12s %10s %12s\n", "idx", "name", "vendor", "type", "memory",
           "fp16", "int8", "subgroup", "required", "shared", "max-binding");
    for (int i = 0; i < n && i < 16; i++) {
        /* the subgroup size pipelines require (and the device's range), or "no" */
        char req[32] = "no";
        if (d[i].subgroup_required)
            snprintf(req, sizeof req, "%u (%u-%u)", d[i].subgroup_required, d[i].subgroup_min, d[i].subgroup_max);
        printf("%d%s  %-40.40s %-8s %-10s %7.1fGiB %5s %5s %8u %-12s %8uKiB %9lluMiB\n", i, i == def ? "*" : " ",
               d[i].name, vks_vendor_name(d[i].vendor), vks_device_type_name(d[i].type),
               d[i].device_local_bytes / 1073741824.0, d[i].fp16_arith ? "yes" : "no", d[i].int8_arith ? "yes" : "no",
               d[i].subgroup_size, req, d[i].max_shared_bytes / 1024, (unsigned long long)(d[i].max_storage_range >> 20));
    }
    return 0;
}

int main(int argc, char **argv) {
    cli_guard_stdout();
    cli_set_program(argv[0]);
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? EXIT_BAD_INPUT : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "devices")) return cmd_devices(argc - 1, argv + 1);
    if (!strcmp(cmd, "generate")) return cmd_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "logits")) return cmd_logits(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc - 1, argv + 1);
    static const struct { const char *name; int (*fn)(int, char **); } more[] = {
        {"tokenize", cmd_tokenize}, {"detokenize", cmd_detokenize}, {"convert", cmd_convert},
        {"pipeline", cmd_pipeline}, {"train", cmd_train}, {"eval", cmd_eval}, {"tasks", cmd_tasks}, {"rl", cmd_rl}, {"join", cmd_join}, {"mpirun", cmd_mpirun}, {"verify", cmd_verify}, {"keygen", cmd_keygen}, {"broadcast", cmd_broadcast},
    };
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++)
        if (!strcmp(cmd, more[i].name)) return more[i].fn(argc - 1, argv + 1);
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) { puts("vkswarm " VKS_VERSION); return 0; }
    cli_die(EXIT_BAD_INPUT, "unknown command '%s' (see vkswarm --help)", cmd);
}
