/* SPDX-License-Identifier: Apache-2.0 */
/* The per-task log (SPEC §9): <data-dir>/logs/<ns>/<task>.log, one line per event, each
 * prefixed by an RFC 3339 time; what the sandbox printed also by "[sandbox] ", so no
 * output of task code reads like the server's own lines ("[diverge] pushed ...", egress
 * lines). When a write would take the file past its cap, the oldest
 * part is dropped (the newest half is kept, from a line start) and a line says so. One
 * process-wide lock orders writers, so lines never interleave and the cap holds. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "sandbox/sandbox.h"

static pthread_mutex_t g_log_lock = PTHREAD_MUTEX_INITIALIZER;

char *sandbox_log_path(const char *data_dir, const char *ns, const char *name)
{
    return xasprintf("%s/logs/%s/%s.log", data_dir, ns, name);
}

int sandbox_mkdirs(const char *path, bool last)
{
    char *p = xstrdup(path);
    int rc = 0;

    for (char *s = p + 1; *s != '\0' && rc == 0; s++) {
        if (*s == '/') {
            *s = '\0';
            if (mkdir(p, 0700) != 0 && errno != EEXIST) {
                rc = -1;
            }
            *s = '/';
        }
    }
    if (rc == 0 && last && mkdir(p, 0700) != 0 && errno != EEXIST) {
        rc = -1;
    }
    free(p);
    return rc;
}

/* Keeps the newest half of the file at FD (from a line start) in a new file that replaces
 * PATH, with a line saying how much was dropped. Returns the new descriptor or -1. */
static int drop_oldest(int fd, const char *path, size_t cap, off_t size)
{
    size_t keep = cap / 2;
    off_t from = size > (off_t)keep ? size - (off_t)keep : 0;
    char *buf = xmalloc(keep + 1), *nl, *tmp = xasprintf("%s.cut", path);
    char ts[CLOCK_RFC3339_MAX], head[160];
    ssize_t got = pread(fd, buf, keep, from);
    size_t start = 0;
    int out = -1;

    if (got > 0) {
        nl = memchr(buf, '\n', (size_t)got);
        start = nl != NULL ? (size_t)(nl - buf) + 1 : 0;
        out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    }
    if (out >= 0) {
        clock_rfc3339(ts, clock_now_ms(clock_system()));
        int n = snprintf(head, sizeof(head), "%s [log] %lld older bytes dropped (log cap %zu)\n",
                         ts, (long long)(from + (off_t)start), cap);
        if (write(out, head, (size_t)n) != n ||
            write(out, buf + start, (size_t)got - start) != (ssize_t)((size_t)got - start) ||
            rename(tmp, path) != 0) {
            close(out);
            out = -1;
            unlink(tmp);
        }
    }
    free(buf);
    free(tmp);
    if (out >= 0) {
        close(out);
        out = open(path, O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW);
    }
    return out;
}

/* Replaces control characters (other than tab) so a sandbox cannot forge line breaks or
 * terminal escapes in the log. */
static void clean(char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if ((ch < 0x20 && ch != '\t') || ch == 0x7f) {
            s[i] = '?';
        }
    }
}

/* Appends "<time> MARK TEXT" as one line (MARK "" for the server's own lines). */
static void write_line(const char *path, size_t cap, const char *mark, const char *text, size_t len)
{
    char ts[CLOCK_RFC3339_MAX];
    struct stat st;
    char *line;
    size_t n, head;
    int fd;

    if (cap == 0) {
        cap = SANDBOX_LOG_CAP;
    }
    clock_rfc3339(ts, clock_now_ms(clock_system()));
    head = strlen(ts) + 1 + strlen(mark);
    n = head + len + 1;
    line = xmalloc(n + 1);
    snprintf(line, n + 1, "%s %s%.*s\n", ts, mark, (int)len, text);
    clean(line + head, len);
    pthread_mutex_lock(&g_log_lock);
    fd = open(path, O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 && errno == ENOENT && sandbox_mkdirs(path, false) == 0) {
        fd = open(path, O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    }
    if (fd >= 0 && fstat(fd, &st) == 0 && (size_t)st.st_size + n > cap) {
        int cut = drop_oldest(fd, path, cap, st.st_size);
        close(fd);
        fd = cut;
    }
    if (fd >= 0) {
        (void)!write(fd, line, n);
        close(fd);
    }
    pthread_mutex_unlock(&g_log_lock);
    free(line);
}

void sandbox_log_write(const char *path, size_t cap, const char *text, size_t len)
{
    write_line(path, cap, "", text, len);
}

void sandbox_log_output(const char *path, size_t cap, const char *text, size_t len)
{
    write_line(path, cap, SANDBOX_LOG_MARK, text, len);
}

void sandbox_log_event(const char *path, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (n < 0) {
        return;
    }
    sandbox_log_write(path, 0, msg, strlen(msg));
}
