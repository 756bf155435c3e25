/* Commands whose issue has not landed yet. Each owner deletes its stub here
 * when adding its own tools/cmd_*.c. */
#include <stdio.h>
#include "commands.h"
#include "cli_util.h"

#define STUB(name, text)                                                         \
    int cmd_##name(int argc, char **argv) {                                      \
        (void)argc;                                                              \
        (void)argv;                                                              \
        fprintf(stderr, "vkswarm: " #name ": not implemented yet (" text ")\n"); \
        return 1;                                                                \
    }
