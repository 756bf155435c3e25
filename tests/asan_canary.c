/* The leak check's canary (ASan builds only; tests/meson.build).
 *
 *   asan_canary          opens the default Vulkan device (validation layer on
 *                        with VKSWARM_VALIDATION) and closes it, then makes and
 *                        frees a vkswarm object: LeakSanitizer must stay quiet.
 *   asan_canary --leak   the same, but the vkswarm object is never freed:
 *                        LeakSanitizer must report it (tests/asan_leak.sh).
 *
 * The first fails where the driver's memory reads as leaked after the Vulkan
 * loader unloads it (tests/asan_keep_vulkan.c); the second fails where the
 * suppressions or options hide a leak of vkswarm's own code. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "vkswarm/vks_common.h"
#include "vkswarm/vks_gguf.h"
#include "vkswarm/vks_gpu.h"

static int open_and_close_device(void) {
    vks_gpu_options opt = {.device_index = -1, .validation = getenv("VKSWARM_VALIDATION") != NULL};
    vks_gpu *g = NULL;
    if (vks_gpu_create(&opt, &g) != VKS_OK) {
        fprintf(stderr, "asan_canary: vks_gpu_create: %s\n", vks_last_error());
        return 1;
    }
    vks_gpu_destroy(g);
    return 0;
}

int main(int argc, char **argv) {
    bool leak = argc == 2 && strcmp(argv[1], "--leak") == 0;
    if (argc > 2 || (argc == 2 && !leak)) {
        fprintf(stderr, "usage: asan_canary [--leak]\n");
        return 2;
    }
    if (open_and_close_device() != 0) return 1;
    vks_gguf_writer *w = NULL;
    if (vks_gguf_writer_create(&w) != VKS_OK) {
        fprintf(stderr, "asan_canary: vks_gguf_writer_create: %s\n", vks_last_error());
        return 1;
    }
    if (!leak) vks_gguf_writer_free(w);
    w = NULL; /* no pointer to it left anywhere */
    return 0;
}
