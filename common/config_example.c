/* SPDX-License-Identifier: Apache-2.0 */
/* The example `.diverge/agent.yaml` that `diverge task init` writes, and the writer that
 * never overwrites an existing file unless asked to. The unit tests load the example, so
 * it always satisfies the loader in config.c. */
#include "common/config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char example[] =
    "# Diverge agent configuration (the keys: docs/configuration.md in the Diverge\n"
    "# repository). `diverge task create` and tasks made from PR/MR comments take their\n"
    "# defaults from this file; flags and commands override.\n"
    "version: \"1\"\n"
    "agent:\n"
    "  # Models the agent may use: exact names, or a prefix wildcard such as claude-*.\n"
    "  capabilities:\n"
    "    - claude-3-7-sonnet\n"
    "    - gemini-2.5-pro\n"
    "  # Tools the agent may run inside its sandbox.\n"
    "  allowedTools:\n"
    "    - git\n"
    "    - go\n"
    "  # Spend limits: USD as a decimal string, tokens as a whole number.\n"
    "  budgetUSD: \"5.00\"\n"
    "  budgetTokens: 200000\n"
    "  maxIterations: 8\n"
    "  baseBranch: main\n"
    "  # What the runner runs in /workspace each iteration, and the check that must pass\n"
    "  # (the server's --agent-cmd / --verify-cmd when absent). Keep scripts in the\n"
    "  # repository: the sandbox sees only the clone and the system's /usr.\n"
    "  # command: sh .diverge/agent.sh\n"
    "  # verifyCommand: make test\n"
    "sandbox:\n"
    "  # local (bubblewrap), process (development only), none, or agent-sandbox (Kubernetes).\n"
    "  provider: local\n"
    "  timeoutSeconds: 1800\n"
    "  # none: loopback only; proxy: egress through the server's allowlisting proxy.\n"
    "  network: none\n"
    "  # Hosts proxy mode may reach: host, *.suffix or IP literal, optionally :port (443).\n"
    "  # allowedHosts:\n"
    "  #   - api.anthropic.com\n";

const char *config_agent_example(void)
{
    return example;
}

static int make_parent_dir(const char *path, struct err *err)
{
    const char *slash = strrchr(path, '/');
    char *dir;
    int rc = E_OK;

    if (slash == NULL || slash == path) {
        return E_OK;
    }
    dir = xstrndup(path, (size_t)(slash - path));
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        rc = err_set(err, E_FAIL, "%s: %s", dir, strerror(errno));
    }
    free(dir);
    return rc;
}

int config_agent_write_example(const char *path, bool force, struct err *err)
{
    size_t len = sizeof(example) - 1, off = 0;
    int fd, rc;

    rc = make_parent_dir(path, err);
    if (rc != E_OK) {
        return rc;
    }
    fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | (force ? O_TRUNC : O_EXCL), 0644);
    if (fd < 0) {
        if (errno == EEXIST) {
            return err_set(err, E_CONFLICT, "%s already exists", path);
        }
        return err_set(err, E_FAIL, "%s: %s", path, strerror(errno));
    }
    while (off < len) {
        ssize_t n = write(fd, example + off, len - off);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            rc = err_set(err, E_FAIL, "%s: write failed: %s", path, strerror(errno));
            break;
        }
        off += (size_t)n;
    }
    if (close(fd) != 0 && rc == E_OK) {
        rc = err_set(err, E_FAIL, "%s: %s", path, strerror(errno));
    }
    return rc;
}
