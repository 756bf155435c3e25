/* Line reading shared by the input-file readers (see cli_lines.h). */
#include "cli_lines.h"

#include "cli_util.h"
#include <errno.h>
#include <string.h>

bool cli_read_line(FILE *f, const char *path, int line_no, char *buf, size_t max, size_t *len) {
    size_t n = 0;
    int c;
    while ((c = getc(f)) != EOF && c != '\n') {
        if (c == '\0') cli_die(EXIT_BAD_INPUT, "%s: line %d holds a NUL byte", path, line_no);
        if (n == max + 1) cli_die(EXIT_BAD_INPUT, "%s: line %d is longer than %zu bytes", path, line_no, max);
        buf[n++] = (char)c; /* max + 1 bytes fit: a final '\r' may follow max bytes */
    }
    if (ferror(f)) /* a directory, say: name the reason */
        cli_die(EXIT_BAD_INPUT, "%s: cannot read: %s (line %d)", path, strerror(errno), line_no);
    if (c == EOF && n == 0) return false;
    if (c == '\n' && n > 0 && buf[n - 1] == '\r') n--;
    if (n > max) cli_die(EXIT_BAD_INPUT, "%s: line %d is longer than %zu bytes", path, line_no, max);
    buf[n] = '\0';
    *len = n;
    return true;
}
