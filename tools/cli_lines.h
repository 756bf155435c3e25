/* Line-by-line reading of input files (prompts, ids) with the rules every
 * reader shares: "\n" and "\r\n" both end a line and are not part of it, a
 * NUL byte is bad input (it would silently cut the line short), and a line
 * longer than the reader's limit is bad input. Errors name the file and line
 * and exit with status 2. */
#ifndef VKS_CLI_LINES_H
#define VKS_CLI_LINES_H
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* Reads the next line of f into buf (room for max + 2 bytes), NUL-terminated,
 * its length in *len. Returns false at the end of the file. `path` and
 * `line_no` (1-based) name the line in errors. */
bool cli_read_line(FILE *f, const char *path, int line_no, char *buf, size_t max, size_t *len);
#endif
