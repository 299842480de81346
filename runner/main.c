/* SPDX-License-Identifier: Apache-2.0 */
/* diverge-agent-runner: reads its environment (SPEC §9) and runs the task; the exit
 * code says how it ended (runner.h, README-runner.md). */
#include <stdio.h>
#include <stdlib.h>

#include "runner/runner.h"

static const char *env_get(const char *name, void *userdata)
{
    (void)userdata;
    return getenv(name);
}

int main(int argc, char **argv)
{
    struct runner_config cfg;
    struct err err = {0};
    int ex;

    if (argc > 1) {
        fprintf(stderr,
                "usage: %s (configured by DIVERGE_* environment variables; see "
                "README-runner.md)\n",
                argv[0]);
        return RUNNER_EXIT_CONFIG;
    }
    if (runner_config_load(&cfg, env_get, NULL, &err) != E_OK) {
        fprintf(stderr, "diverge-agent-runner: %s\n", err.msg);
        runner_config_cleanup(&cfg);
        return RUNNER_EXIT_CONFIG;
    }
    ex = (int)runner_run(&cfg);
    printf("diverge-agent-runner: exit %d\n", ex);
    runner_config_cleanup(&cfg);
    return ex;
}
