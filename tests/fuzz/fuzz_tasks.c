/* libFuzzer target: user task files (JSONL, code tasks' tests included) through
 * vks_task_file_load, which reads a path: each input goes to one temporary file. */
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
    return 0;
}
