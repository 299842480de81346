/* SPDX-License-Identifier: Apache-2.0 */
/* The start gate: the local provider may start a sandbox while the server still fetches
 * the mirror and makes the workspace from it (controller/prelaunch.c), so that starting
 * bubblewrap and this runner overlaps that work. The runner then waits here, before it
 * touches the workspace or meters anything, for the server's "g" on an inherited pipe. */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "runner/runner_int.h"

int runner_gate_wait(const struct runner_config *cfg, struct err *err)
{
    int fd = (int)cfg->gate_fd;
    char b = 0;
    ssize_t n;

    if (cfg->gate_fd < 0) {
        return E_OK;
    }
    do {
        n = read(fd, &b, 1);
    } while (n < 0 && errno == EINTR);
    close(fd); /* the agent never inherits it */
    if (n < 0) {
        return err_set(err, E_FAIL, "start gate (descriptor %d): %s", fd, strerror(errno));
    }
    if (n == 0 || b != 'g') {
        return err_set(err, E_FAIL, "the server called this start off before it began");
    }
    return E_OK;
}
