/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer harness for the runner's usage-line parser (the agent writes those lines:
 * untrusted): any bytes parse or fail cleanly, what parses is within the caps, a plain
 * decimal costUSD agrees with money_parse, and the offset state round-trips. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/money.h"
#include "runner/runner.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(c_)                                                                             \
    do {                                                                                           \
        if (!(c_)) {                                                                               \
            assert_fail(#c_, __FILE__, __LINE__);                                                  \
        }                                                                                          \
    } while (0)

static void check_cost(const char *s, size_t n)
{
    int64_t v = -1, m = -1;

    if (runner_cost_parse(&v, s, n) != E_OK) {
        FUZZ_CHECK(v == 0);
        return;
    }
    FUZZ_CHECK(v >= 0 && v <= RUNNER_COST_MAX_MICROS);
    if (memchr(s, 'e', n) == NULL && memchr(s, 'E', n) == NULL) {
        /* money_parse refuses trailing zeros past 6 decimals; where it accepts, agree. */
        if (money_parse_n(&m, NULL, s, n, NULL) == E_OK) {
            FUZZ_CHECK(m == v);
        }
    }
}

static void check_state(const char *s, size_t n)
{
    struct runner_state st, back;
    char text[RUNNER_STATE_MAX + 8];
    size_t len;

    if (runner_state_parse(&st, s, n) != E_OK) {
        return;
    }
    len = runner_state_format(text, sizeof(text), &st);
    FUZZ_CHECK(runner_state_parse(&back, text, len) == E_OK);
    FUZZ_CHECK(back.offset == st.offset && strcmp(back.model, st.model) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *s = (const char *)data;
    struct runner_usage u;
    int rc = runner_usage_parse(&u, s, size, NULL);

    if (rc != E_OK) {
        FUZZ_CHECK(rc == E_INVALID);
        FUZZ_CHECK(u.tokens == 0 && u.cost_micros == 0 && !u.has_model);
    } else {
        FUZZ_CHECK(size <= RUNNER_USAGE_LINE_MAX);
        FUZZ_CHECK(u.tokens >= 0 && u.tokens <= RUNNER_TOKENS_MAX);
        FUZZ_CHECK(u.cost_micros >= 0 && u.cost_micros <= RUNNER_COST_MAX_MICROS);
        if (u.has_model) {
            size_t n = strlen(u.model);
            FUZZ_CHECK(n > 0 && n <= RUNNER_MODEL_MAX);
            for (size_t i = 0; i < n; i++) {
                FUZZ_CHECK((unsigned char)u.model[i] >= 0x20 && u.model[i] != 0x7f);
            }
        }
    }
    check_cost(s, size);
    check_state(s, size);
    return 0;
}
