/* SPDX-License-Identifier: Apache-2.0 */
/* The start gate: the local provider may start a sandbox while the server still fetches
 * the mirror and makes the workspace from it (controller/prelaunch.c), so that starting
 * bubblewrap and this runner overlaps that work. The runner then waits here, before it
 * touches the workspace or meters anything, for the server's "g" on an inherited pipe; or
 * for its "c" (the workspace is made: check it out) and then "g" (the task is Active, its
 * token current: meter and run the agent). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
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
