/* SPDX-License-Identifier: Apache-2.0 */
/* The ready agent.yaml fragments of examples/agents/ (Claude Code, Codex CLI, Gemini CLI,
 * opencode) load as .diverge/agent.yaml, and each command uses what the runner gives the
 * agent (SPEC §13): its base URL variable, never a provider key of its own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "tests/t_check.h"

static void check_fragment(const char *file, const char *uses)
{
    const char *src = getenv("DIVERGE_SOURCE_DIR");
    char path[4096];
    struct config_agent *cfg = NULL;
    struct err err = {0};

    snprintf(path, sizeof(path), "%s/examples/agents/%s", src != NULL ? src : ".", file);
    if (config_agent_load_file(&cfg, path, &err) != E_OK) {
        t_fail(__FILE__, __LINE__, "%s: %s", file, err.msg);
        return;
    }
    CHECK(cfg->command != NULL && strstr(cfg->command, uses) != NULL);
    CHECK(cfg->command != NULL && strstr(cfg->command, "DIVERGE_LAST_FAILURE") != NULL);
    CHECK(cfg->command != NULL && strstr(cfg->command, "sk-") == NULL);
    CHECK(cfg->has_capabilities && cfg->n_capabilities > 0);
    CHECK(cfg->sandbox_network != NULL && strcmp(cfg->sandbox_network, "none") == 0);
    config_agent_free(cfg);
}

TEST(fragments_load)
{
    check_fragment("claude-code.agent.yaml", "DISABLE_TELEMETRY=1");
    check_fragment("codex.agent.yaml", "base_url=\\\"$OPENAI_BASE_URL\\\"");
    check_fragment("gemini-cli.agent.yaml", "\"selectedType\":\"gemini-api-key\"");
    check_fragment("opencode.agent.yaml", "{env:OPENAI_BASE_URL}");
}

T_MAIN
