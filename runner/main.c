/* SPDX-License-Identifier: Apache-2.0 */
/* diverge-agent-runner: reads its environment (SPEC §9) and runs the task; the exit
 * code says how it ended (runner.h, docs/runner.md). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static const char g_usage[] =
    "Usage: diverge-agent-runner\n"
    "\n"
    "The loop that runs inside a task's sandbox: clones DIVERGE_REPO_URL, runs\n"
    "DIVERGE_AGENT_CMD and DIVERGE_VERIFY_CMD each iteration, meters the agent's usage\n"
    "lines with the task's token, then commits and pushes the working branch. It takes no\n"
    "arguments: the server's sandbox providers start it with DIVERGE_* environment\n"
    "variables (DIVERGE_TASK_NAME, DIVERGE_REPO_URL and DIVERGE_AGENT_CMD are required;\n"
    "the token in DIVERGE_MACAROON_TOKEN or DIVERGE_TOKEN_FILE; the meter at\n"
    "DIVERGE_METER_SOCKET or DIVERGE_METER_URL). docs/runner.md lists them all.\n"
    "\n"
    "Exit codes: 0 pushed, or stopped by the budget (task paused); 1 every iteration\n"
    "failed; 2 bad environment; 3 model not allowed (403); 4 token revoked (401);\n"
    "5 meter unreachable; 6 a git step failed; 7 unexpected meter answer.\n";

static const char *env_get(const char *name, void *userdata)
{
    (void)userdata;
    return getenv(name);
}

int main(int argc, char **argv)
{
    struct runner_config cfg;
    struct err err = {0};
    bool slot;
    int ex;

    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        fputs(g_usage, stdout);
        return RUNNER_EXIT_OK;
    }
    if (argc > 1) {
        fprintf(stderr, "usage: %s (no arguments: see %s --help)\n", argv[0], argv[0]);
        return RUNNER_EXIT_CONFIG;
    }
    /* A warm slot loads libcurl while it waits for its task's environment. */
    slot = getenv("DIVERGE_START_GATE_ENV") != NULL;
    if (slot) {
        runner_curl_preload();
        if (runner_gate_env(runner_curl_wait, &err) != E_OK) {
            fprintf(stderr, "diverge-agent-runner: %s\n", err.msg);
            runner_curl_settle();
            return RUNNER_EXIT_CONFIG;
        }
    }
    if (runner_config_load(&cfg, env_get, NULL, &err) != E_OK) {
        fprintf(stderr, "diverge-agent-runner: %s\n", err.msg);
        runner_config_cleanup(&cfg);
        runner_curl_settle();
        return RUNNER_EXIT_CONFIG;
    }
    if (!slot) {
        runner_curl_preload(); /* while the runner waits at its gate and checks out */
    }
    ex = (int)runner_run(&cfg);
    runner_curl_settle();
    runner_relays_stop();
    printf("diverge-agent-runner: exit %d\n", ex);
    runner_config_cleanup(&cfg);
    return ex;
}
