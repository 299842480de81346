/* SPDX-License-Identifier: Apache-2.0 */
/* diverge-agent-runner: reads its environment (SPEC §9) and runs the task; the exit
 * code says how it ended (runner.h, README-runner.md). */
#include <stdio.h>
#include <stdlib.h>

#include "runner/runner.h"

#if defined(__SANITIZE_ADDRESS__)
#define RUNNER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RUNNER_ASAN 1
#endif
#endif

#ifdef RUNNER_ASAN
/* Sanitizer builds (tests): inside the local sandbox the seccomp filter denies ptrace,
 * which LeakSanitizer needs, and the sandbox environment carries no ASAN_OPTIONS; there
 * leak checking is off so the runner's exit status stays its own. ASAN_OPTIONS set in
 * the environment (the runner's own tests outside a sandbox) still wins. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "detect_leaks=0";
}
#endif

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
    runner_relays_stop();
    printf("diverge-agent-runner: exit %d\n", ex);
    runner_config_cleanup(&cfg);
    return ex;
}
