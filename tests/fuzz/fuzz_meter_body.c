/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: meter request bodies. A body either parses into a request with a
 * well-formed id and non-negative amounts, or is refused with a message; the decision over
 * the parsed request must keep totals monotonic and never below the previous ones. A body
 * the plain reader takes must read the same through jansson (meter_int.h). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "meter/meter.h"
#include "meter/meter_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The plain reader accepts only what the general path accepts, with the same values. */
static void same_as_json(const uint8_t *data, size_t size)
{
    struct meter_request a, b;
    struct err err = {0};

    if (meter_request_parse_plain(&a, (const char *)data, size)) {
        ASSERT(meter_request_parse_json(&b, (const char *)data, size, &err) == E_OK);
        ASSERT(strcmp(a.request_id, b.request_id) == 0);
        ASSERT((a.model == NULL) == (b.model == NULL));
        ASSERT(a.model == NULL || strcmp(a.model, b.model) == 0);
        ASSERT(a.has_iteration == b.has_iteration && a.iteration == b.iteration);
        ASSERT(a.tokens_used == b.tokens_used && a.cost_micros == b.cost_micros);
        meter_request_cleanup(&b);
    }
    meter_request_cleanup(&a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct meter_request r;
    struct meter_state st;
    struct meter_decision d;
    struct err err = {0};
    int rc;

    same_as_json(data, size);
    rc = meter_request_parse(&r, (const char *)data, size, &err);

    if (rc != E_OK) {
        ASSERT(rc == E_INVALID && err.msg[0] != '\0');
        meter_request_cleanup(&r);
        return 0;
    }
    ASSERT(r.request_id != NULL && r.request_id[0] != '\0');
    /* Bounded, no C0 control or DEL byte, not only spaces (SPEC §7 step 2). */
    ASSERT(strlen(r.request_id) <= METER_REQUEST_ID_MAX);
    ASSERT(r.request_id[strspn(r.request_id, " ")] != '\0');
    for (const unsigned char *p = (const unsigned char *)r.request_id; *p != '\0'; p++) {
        ASSERT(*p >= 0x20 && *p != 0x7f);
    }
    ASSERT(r.tokens_used >= 0 && r.cost_micros >= 0 && r.iteration >= 0);
    memset(&st, 0, sizeof(st));
    st.task_found = st.token_current = st.caveats_ok = st.body_ok = st.model_ok = true;
    st.phase = TASK_ACTIVE;
    st.spec_budget_usd = 5000000;
    st.tokens_consumed = 10;
    st.cost_micros = 20;
    meter_decide(&d, &st, &r);
    ASSERT(d.status == 200 || d.status == 429);
    ASSERT(d.total_tokens >= st.tokens_consumed && d.total_cost_micros >= st.cost_micros);
    meter_request_cleanup(&r);
    return 0;
}
