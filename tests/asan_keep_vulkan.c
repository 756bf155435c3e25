/* Linked into every executable of an AddressSanitizer build, and only there
 * (meson.build): the Vulkan loader's dlclose() of a driver or layer leaves it
 * mapped until exit.
 *
 * Why: the loader unloads the ICD (and the layers) in vkDestroyInstance, long
 * before LeakSanitizer runs at exit. LSan then no longer scans the driver's
 * globals, so memory the driver keeps in them for the life of the process reads
 * as a direct leak, with its frames in "<unknown module>" (no module name left,
 * so no suppression can match it). Mesa's lavapipe does this on AMD Zen CPUs
 * only: util_cpu_detect() keeps the L3-cache affinity masks (a realloc of 128
 * bytes per L3 cache) in its util_cpu_caps global and never frees them; on
 * other CPUs it allocates nothing there, so the suites passed on the machine
 * they were written on. Kept mapped, that memory is reachable and not reported,
 * and whatever a driver really leaks is reported with its module's name, for
 * tests/lsan.supp to match by name.
 *
 * Only calls made from the Vulkan loader are kept; every other dlclose()
 * (Open MPI's components) goes on to the real one. vkswarm never calls
 * dlclose itself. tests/asan_canary.c checks both sides: opening and closing a
 * device leaks nothing, and a leak in vkswarm code still fails the run. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdbool.h>
#include <string.h>

typedef int (*dlclose_fn)(void *);

static bool called_from_vulkan_loader(const void *return_address) {
    Dl_info caller;
    if (!dladdr(return_address, &caller) || !caller.dli_fname) return false;
    const char *base = strrchr(caller.dli_fname, '/');
    base = base ? base + 1 : caller.dli_fname;
    return strncmp(base, "libvulkan.so", strlen("libvulkan.so")) == 0;
}

int dlclose(void *handle) {
    if (called_from_vulkan_loader(__builtin_return_address(0))) return 0;
    dlclose_fn next = (dlclose_fn)dlsym(RTLD_NEXT, "dlclose");
    return next ? next(handle) : -1;
}
