/* SPDX-License-Identifier: Apache-2.0 */
/* The start gate: the local provider may start a sandbox while the server still fetches
 * the mirror and makes the workspace from it (controller/prelaunch.c), so that starting
 * bubblewrap and this runner overlaps that work. The runner then waits here, before it
 * touches the workspace or meters anything, for the server's "g" on an inherited pipe; or
 * for its "c" (the workspace is made: check it out) and then "g" (the task is Active, its
 * token current: meter and run the agent). A warm slot's runner, started before any task
 * was known, first reads its task's environment from the same gate (runner_gate_env). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runner/runner_int.h"

/* One byte from the gate: 'g', 'c', or 0 when the server closed its end (-1: error). */
static int gate_byte(int fd, struct err *err)
{
    char b = 0;
    ssize_t n;

    do {
        n = read(fd, &b, 1);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        err_set(err, E_FAIL, "start gate (descriptor %d): %s", fd, strerror(errno));
        return -1;
    }
    return n == 0 ? 0 : (unsigned char)b;
}

/* Closes the gate FD after its last byte B: E_OK for a "g", else the start was called off
 * (or the read failed, ERR set already). */
static int gate_end(int fd, int b, struct err *err)
{
    close(fd); /* the agent never inherits it */
    if (b < 0) {
        return E_FAIL;
    }
    return b == 'g' ? E_OK
                    : err_set(err, E_FAIL, "the server called this start off before it began");
}

int runner_gate_wait(const struct runner_config *cfg, bool *later, struct err *err)
{
    int fd = (int)cfg->gate_fd, b;

    *later = false;
    if (cfg->gate_fd < 0) {
        return E_OK;
    }
    (void)fcntl(fd, F_SETFD, FD_CLOEXEC); /* no git the runner starts holds it */
    b = gate_byte(fd, err);
    if (b == 'c') {
        *later = true; /* the workspace is there; the token is not current yet */
        return E_OK;
    }
    return gate_end(fd, b, err);
}

int runner_gate_go(const struct runner_config *cfg, struct err *err)
{
    int fd = (int)cfg->gate_fd;

    return gate_end(fd, gate_byte(fd, err), err);
}

/* Reads exactly LEN bytes of FD into BUF; false on an error or an early end of file. */
static bool read_all(int fd, char *buf, size_t len)
{
    size_t got = 0;

    while (got < len) {
        ssize_t n = read(fd, buf + got, len - got);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return false;
        }
        got += (size_t)n;
    }
    return true;
}

/* Splits BLOCK[0..len) (entries each ended by a NUL) into ENTRIES; how many, or -1 when
 * it is malformed (no final NUL, an entry without a name and "=", too many). */
static int env_split(char *block, size_t len, char **entries)
{
    int n = 0;

    if (len == 0 || block[len - 1] != '\0') {
        return -1;
    }
    for (size_t i = 0; i < len;) {
        char *e = block + i;
        char *eq = strchr(e, '=');
        if (eq == NULL || eq == e || n == RUNNER_GATE_ENV_ENTRIES) {
            return -1;
        }
        entries[n++] = e;
        i += strlen(e) + 1;
    }
    return n;
}

/* The message after the gate's "e": its length, then the block (new memory in *OUT). */
static int env_message(int fd, char **out, size_t *len_out, struct err *err)
{
    unsigned char head[5];
    size_t len;

    if (!read_all(fd, (char *)head, sizeof(head))) {
        return err_set(err, E_FAIL, "the server called this start off before it began");
    }
    len = (size_t)head[1] << 24 | (size_t)head[2] << 16 | (size_t)head[3] << 8 | head[4];
    if (head[0] != 'e' || len == 0 || len > RUNNER_GATE_ENV_MAX) {
        return err_set(err, E_FAIL, "start gate: not an environment (%zu bytes)", len);
    }
    *out = xmalloc(len);
    if (!read_all(fd, *out, len)) {
        free(*out);
        *out = NULL;
        return err_set(err, E_FAIL, "the server called this start off before it began");
    }
    *len_out = len;
    return E_OK;
}

/* What the environment points into from runner_gate_env on (kept for good). */
static char *g_env_block, *g_env_gate;

int runner_gate_env(void (*before_set)(void), struct err *err)
{
    const char *v = getenv("DIVERGE_START_GATE_FD");
    char *block = NULL, *entries[RUNNER_GATE_ENV_ENTRIES], *end = NULL, *gate;
    long fd = v != NULL ? strtol(v, &end, 10) : -1;
    size_t len = 0;
    int n;

    if (getenv("DIVERGE_START_GATE_ENV") == NULL) {
        return E_OK;
    }
    if (end == NULL || *end != '\0' || fd < 3 || fd > 65535) {
        return err_set(err, E_INVALID, "DIVERGE_START_GATE_ENV needs DIVERGE_START_GATE_FD");
    }
    (void)fcntl((int)fd, F_SETFD, FD_CLOEXEC); /* no process the runner starts holds it */
    if (env_message((int)fd, &block, &len, err) != E_OK) {
        return E_FAIL;
    }
    n = env_split(block, len, entries);
    if (n < 0) {
        free(block);
        return err_set(err, E_FAIL, "start gate: a malformed environment");
    }
    if (before_set != NULL) {
        before_set(); /* no other thread reads the environment while it changes */
    }
    gate = xasprintf("DIVERGE_START_GATE_FD=%ld", fd);
    clearenv();
    free(g_env_block); /* a second call (the tests): nothing points into the first's now */
    free(g_env_gate);
    g_env_block = block;
    g_env_gate = gate;
    for (int i = 0; i < n; i++) {
        if (strncmp(entries[i], "DIVERGE_START_GATE_", 19) != 0) {
            putenv(entries[i]);
        }
    }
    putenv(gate);
    return E_OK;
}
