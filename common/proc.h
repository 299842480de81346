/* SPDX-License-Identifier: Apache-2.0 */
/* Running a helper program (git) from an argv array, never a shell: stdin /dev/null, a
 * small environment, output captured with a cap. Used where the server or the CLI needs
 * git outside the controller (the `local` SCM's file reads, `diverge local demo`). */
#ifndef DIVERGE_COMMON_PROC_H
#define DIVERGE_COMMON_PROC_H

#include <stdbool.h>

#include "common/buf.h"
#include "common/err.h"

/* Runs ARGV (ARGV[0] looked up in PATH) and waits for it. The environment is PATH and
 * HOME of ours plus GIT_TERMINAL_PROMPT=0, GIT_CONFIG_NOSYSTEM=1 and LC_ALL=C (nothing
 * asks for input, no system git config). Its stdout (and its stderr too when
 * WITH_STDERR, else stderr goes to /dev/null) is appended to OUT (may be NULL: dropped);
 * bytes past OUT's cap are read and dropped, and *truncated_out (may be NULL) says so.
 * *status_out: the exit status, or 128+signal. E_FAIL when it cannot be started. */
int proc_run(int *status_out, struct buf *out, bool *truncated_out, bool with_stderr,
             const char *const argv[], struct err *err);

#endif
