/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: the gateway's removal of provider-run tools from a request body
 * (llm_drop_hosted_tools), in every dialect, on hostile JSON. The first byte picks the
 * dialect, the second the size of the names buffer (1..64, so the cut is exercised). The
 * names written are one NUL-terminated line of [A-Za-z0-9_.-?,] within the buffer; a second
 * pass over the result removes nothing (nothing provider-run is left); the body stays an
 * object that jansson can write out. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "server/api/llm/llm_call.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool name_char(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '_' || ch == '-' || ch == '.' || ch == '?' || ch == ',';
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const enum llm_dialect dialects[] = {LLM_DIALECT_ANTHROPIC, LLM_DIALECT_RESPONSES,
                                                LLM_DIALECT_CHAT, LLM_DIALECT_GEMINI};
    char names[64];
    size_t cap, len;
    json_t *body;
    char *out;

    if (size < 2) {
        return 0;
    }
    cap = 1 + data[1] % sizeof(names);
    body = json_loadb((const char *)data + 2, size - 2, 0, NULL);
    if (!json_is_object(body)) {
        json_decref(body);
        return 0;
    }
    memset(names, 'X', sizeof(names));
    (void)llm_drop_hosted_tools(body, dialects[data[0] % 4], names, cap);
    len = strnlen(names, cap);
    ASSERT(len < cap);
    for (size_t i = 0; i < len; i++) {
        ASSERT(name_char(names[i]));
    }
    ASSERT(llm_drop_hosted_tools(body, dialects[data[0] % 4], names, sizeof(names)) == 0);
    ASSERT(names[0] == '\0');
    out = json_dumps(body, JSON_COMPACT);
    ASSERT(out != NULL);
    free(out);
    json_decref(body);
    return 0;
}
