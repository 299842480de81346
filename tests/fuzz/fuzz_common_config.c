/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer harness for the agent.yaml loader (it reads files from pull requests): any
 * bytes load or fail cleanly, failures name the file and a line, successes are sane. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(c_)                                                                             \
    do {                                                                                           \
        if (!(c_)) {                                                                               \
            assert_fail(#c_, __FILE__, __LINE__);                                                  \
        }                                                                                          \
    } while (0)

static void check_strings(char *const *items, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        FUZZ_CHECK(items[i] != NULL && items[i][0] != '\0');
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct config_agent *cfg = (struct config_agent *)(uintptr_t)1;
    struct err err = {0};
    int rc = config_agent_load_mem(&cfg, "f.yaml", (const char *)data, size, &err);

    if (rc != E_OK) {
        FUZZ_CHECK(cfg == NULL);
        FUZZ_CHECK(rc == E_INVALID || rc == E_TOOBIG || rc == E_FAIL);
        FUZZ_CHECK(strncmp(err.msg, "f.yaml", 6) == 0);
        FUZZ_CHECK(strchr(err.msg, '\n') == NULL);
        return 0;
    }
    FUZZ_CHECK(cfg != NULL);
    check_strings(cfg->capabilities, cfg->n_capabilities);
    check_strings(cfg->allowed_tools, cfg->n_allowed_tools);
    FUZZ_CHECK(cfg->budget_usd_micros >= 0 && cfg->budget_tokens >= 0);
    FUZZ_CHECK(cfg->max_iterations >= 0 && cfg->max_iterations <= INT32_MAX);
    FUZZ_CHECK(cfg->sandbox_timeout_s >= 0 && cfg->sandbox_timeout_s <= INT32_MAX);
    FUZZ_CHECK(cfg->base_branch == NULL || cfg->base_branch[0] != '\0');
    FUZZ_CHECK(cfg->sandbox_provider == NULL || cfg->sandbox_provider[0] != '\0');
    config_agent_free(cfg);
    return 0;
}
