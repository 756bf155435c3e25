/* task_internal.h: the bounded JSONL line reader shared by task_file.c and task_run.c. */
#ifndef VKS_TASK_INTERNAL_H
#define VKS_TASK_INTERNAL_H
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* Reads one line (without LF; a final CR dropped) of at most max bytes into
 * buf[max + 1]; a longer line is consumed and flagged. False at EOF. */
bool vks_task_read_line(FILE *f, char *buf, size_t max, size_t *len, bool *too_long);
bool vks_task_blank(const char *s, size_t n);
#endif
