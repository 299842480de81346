/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer harness for money_parse_n (amounts come from comments, flags and YAML): any
 * bytes parse or fail cleanly, and what parses formats back to the same amount. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/money.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(c_)                                                                             \
    do {                                                                                           \
        if (!(c_)) {                                                                               \
            assert_fail(#c_, __FILE__, __LINE__);                                                  \
        }                                                                                          \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int64_t v = -1, again = -1;
    bool plus = false;
    char out[MONEY_STR_MAX];
    int rc = money_parse_n(&v, &plus, (const char *)data, size, NULL);

    if (rc != E_OK) {
        FUZZ_CHECK(rc == E_INVALID || rc == E_TOOBIG);
        return 0;
    }
    FUZZ_CHECK(v >= 0);
    FUZZ_CHECK(!plus || (size > 0 && data[0] == '+'));
    money_format(out, v);
    FUZZ_CHECK(money_parse(&again, NULL, out, NULL) == E_OK);
    FUZZ_CHECK(again == v);
    return 0;
}
