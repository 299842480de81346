/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: `diverge mcp` messages. The input is split into lines as the stdio
 * transport does; every line gets no reply or exactly one line of JSON-RPC 2.0 (an
 * object, or a non-empty batch array), and nothing crashes or leaks. Tool calls meet a
 * server that refuses connections (127.0.0.1:1), so they end as isError results. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli/mcp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_reply(const char *text)
{
    json_t *j = json_loads(text, 0, NULL);

    ASSERT(j != NULL);
    ASSERT(strchr(text, '\n') == NULL);
    if (json_is_array(j)) {
        ASSERT(json_array_size(j) > 0);
        for (size_t i = 0; i < json_array_size(j); i++) {
            ASSERT(json_is_object(json_array_get(j, i)));
        }
    } else {
        ASSERT(json_is_object(j));
        ASSERT(strcmp(json_string_value(json_object_get(j, "jsonrpc")), "2.0") == 0);
        ASSERT((json_object_get(j, "result") != NULL) != (json_object_get(j, "error") != NULL));
    }
    json_decref(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct cli_ctx ctx;
    struct cli_mcp m;
    const char *p = (const char *)data, *end = p + size;

    memset(&ctx, 0, sizeof(ctx));
    ctx.server = xstrdup("http://127.0.0.1:1");
    ctx.ns = "default";
    cli_mcp_init(&m, &ctx);
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = (size_t)((nl != NULL ? nl : end) - p);
        char *reply = cli_mcp_handle(&m, p, len);

        if (reply != NULL) {
            check_reply(reply);
            free(reply);
        }
        p += len + 1;
    }
    cli_ctx_cleanup(&ctx);
    return 0;
}
