/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer harness for the watch-stream parser (bytes from the API server): the first byte
 * picks the chunk size; any stream ends cleanly, and every event handed to the callback
 * carries an object whose resourceVersion is the one kept for resuming. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kube/kube_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(c_)                                                                             \
    do {                                                                                           \
        if (!(c_)) {                                                                               \
            assert_fail(#c_, __FILE__, __LINE__);                                                  \
        }                                                                                          \
    } while (0)

static int on_event(enum kube_event type, const json_t *obj, void *userdata)
{
    const char *rv =
        json_string_value(json_object_get(json_object_get(obj, "metadata"), "resourceVersion"));

    FUZZ_CHECK(type <= KUBE_EVENT_BOOKMARK);
    FUZZ_CHECK(json_is_object(obj) && kube_rv_ok(rv));
    FUZZ_CHECK(strcmp(rv, (const char *)userdata) == 0);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    enum kube_watch_end end = KUBE_WATCH_STOPPED;
    char rv[KUBE_RV_MAX] = "";
    struct err err = {0};
    size_t piece;
    int rc;

    if (size < 1) {
        return 0;
    }
    piece = (size_t)data[0] + 1;
    rc = kube_watch_feed(&end, rv, (const char *)data + 1, size - 1, piece, on_event, rv, &err);
    FUZZ_CHECK(rc <= 0);
    FUZZ_CHECK(rc != E_OK || end == KUBE_WATCH_CLOSED || end == KUBE_WATCH_GONE);
    FUZZ_CHECK(rc == E_OK || err.msg[0] != '\0');
    return 0;
}
