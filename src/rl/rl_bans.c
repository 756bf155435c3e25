/* rl_bans.c: a run's bans on disk (vks_rl_bans.h). */
#include "vkswarm/vks_rl_bans.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include <sodium.h>
#include "vkswarm/vks_common.h"

/* A line is a key, a step and a reason of at most VKS_RL_BAN_REASON_MAX
 * bytes, escaped at most 4 times over, with the JSON around them. */
#define LINE_MAX_BYTES (4 * VKS_RL_BAN_REASON_MAX + 256)

static int parse_line(const char *path, int line, const char *text, size_t len, vks_rl_ban *b) {
    json_error_t je;
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    const char *problem = NULL;
    json_t *key = json_object_get(o, "key"), *step = json_object_get(o, "step"), *reason = json_object_get(o, "reason");
    size_t bin_len = 0;
    if (!o || !json_is_object(o)) problem = "not a JSON object";
    else if (json_object_size(o) != 3 || !json_is_string(key) || !json_is_integer(step) || !json_is_string(reason))
        problem = "want exactly \"key\" (a string), \"step\" (an integer) and \"reason\" (a string)";
    else if (json_string_length(key) != 64 || sodium_hex2bin(b->key, 32, json_string_value(key), 64, NULL, &bin_len, NULL) ||
             bin_len != 32)
        problem = "\"key\" is not 64 hex digits";
    else if (json_integer_value(step) < 0) problem = "\"step\" is negative";
    if (!problem) {
        b->step = json_integer_value(step);
        vks_escape(json_string_value(reason), json_string_length(reason), b->reason, sizeof b->reason);
    }
    json_decref(o);
    return problem ? vks_set_error(VKS_ERR_FORMAT, "%s: line %d: %s", path, line, problem) : VKS_OK;
}

int vks_rl_bans_load(const char *path, vks_rl_ban **bans, int *n) {
    if (!path || !bans || !n) return vks_set_error(VKS_ERR_ARG, "bans: NULL argument");
    *bans = NULL, *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return errno == ENOENT ? VKS_OK : vks_set_error(VKS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *line = malloc(LINE_MAX_BYTES + 2);
    vks_rl_ban *out = NULL;
    int count = 0, cap = 0, number = 0, rc = line ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    while (!rc && fgets(line, LINE_MAX_BYTES + 2, f)) {
        number++;
        size_t len = strlen(line);
        if (len > LINE_MAX_BYTES || (len == LINE_MAX_BYTES && line[len - 1] != '\n')) {
            rc = vks_set_error(VKS_ERR_FORMAT, "%s: line %d: longer than %d bytes", path, number, LINE_MAX_BYTES);
            break;
        }
        if (strspn(line, " \t\r\n") == len) continue; /* blank */
        if (count == VKS_RL_BANS_MAX) {
            rc = vks_set_error(VKS_ERR_FORMAT, "%s: more than %d bans", path, VKS_RL_BANS_MAX);
            break;
        }
        if (count == cap) {
            cap = cap ? 2 * cap : 16;
            vks_rl_ban *more = realloc(out, sizeof *more * (size_t)cap);
            if (!more) {
                rc = vks_set_error(VKS_ERR_NOMEM, "out of host memory");
                break;
            }
            out = more;
        }
        rc = parse_line(path, number, line, len, &out[count]);
        count += !rc;
    }
    if (!rc && ferror(f)) rc = vks_set_error(VKS_ERR_IO, "%s: read failed", path);
    fclose(f);
    free(line);
    if (rc) {
        free(out);
        return rc;
    }
    *bans = out, *n = count;
    return VKS_OK;
}

int vks_rl_bans_save(const char *path, const vks_rl_ban *bans, int n) {
    if (!path || (n && !bans) || n < 0) return vks_set_error(VKS_ERR_ARG, "bans: bad arguments");
    vks_outfile o;
    int rc = vks_outfile_open(&o, path, 0644);
    if (rc) return rc;
    bool ok = true;
    for (int i = 0; ok && i < n; i++) {
        char hex[65];
        sodium_bin2hex(hex, sizeof hex, bans[i].key, 32);
        json_t *j = json_pack("{s:s, s:I, s:s}", "key", hex, "step", (json_int_t)bans[i].step, "reason",
                              bans[i].reason);
        char *text = j ? json_dumps(j, JSON_PRESERVE_ORDER | JSON_COMPACT) : NULL;
        ok = text && fprintf(o.f, "%s\n", text) > 0;
        if (!text) errno = ENOMEM;
        free(text), json_decref(j);
    }
    return vks_outfile_finish(&o, ok);
}
