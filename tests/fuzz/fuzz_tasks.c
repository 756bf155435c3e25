/* libFuzzer target: user task files (JSONL, code tasks' tests included) through
 * vks_task_file_load, which reads a path: each input goes to one temporary file;
 * and the input as turns of a built-in calculator episode (its calc: parser). */
#include "vkswarm/vks_tasks.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char path[64];
    if (!path[0]) snprintf(path, sizeof path, "/tmp/vks-fuzz-tasks-%d.jsonl", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    size_t wrote = fwrite(data, 1, size, f);
    if (fclose(f) != 0 || wrote != size) return 0;
    vks_task *tasks = NULL;
    int64_t n = 0;
    if (vks_task_file_load(path, &tasks, &n) == VKS_OK) {
        (void)vks_task_first_code(tasks, n);
        vks_task_free(tasks, n);
    }
    static const char line[] = "{\"task_type\": \"calc\", \"prompt\": \"2*3?\", \"answer\": 6}\n";
    static vks_task *calc;
    static int64_t n_calc;
    if (!calc) {
        FILE *c = fopen(path, "wb");
        if (!c || fputs(line, c) < 0 || fclose(c) != 0 || vks_task_file_load(path, &calc, &n_calc)) abort();
    }
    const char *turns[2] = {(const char *)data, (const char *)data + size / 2};
    size_t lens[2] = {size, size - size / 2};
    double reward;
    char why[VKS_TASK_MAX_WHY];
    if (vks_env_replay(&calc[0], 0, turns, lens, 2, &reward, why, sizeof why, NULL)) abort(); /* never an error */
    return 0;
}
