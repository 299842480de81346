/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: the AgentTask JSON codec. Arbitrary bytes are parsed as JSON, then
 * normalized as a create body; a normalized object must re-validate, survive encode/decode
 * unchanged, and accept an arbitrary merge patch without crashing. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "store/store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *split = memchr(data, '\0', size);
    size_t n1 = split != NULL ? (size_t)(split - data) : size;
    json_t *in = json_loadb((const char *)data, n1, JSON_REJECT_DUPLICATES, NULL);
    json_t *obj = NULL, *again, *patch = NULL;
    char *text;

    if (in == NULL) {
        return 0;
    }
    if (task_normalize_new(&obj, in, "default", NULL) == E_OK) {
        ASSERT(task_validate(obj, NULL) == E_OK);
        text = json_dumps(obj, JSON_COMPACT);
        again = json_loads(text, 0, NULL);
        ASSERT(again != NULL && json_equal(again, obj));
        free(text);
        json_decref(again);
        if (split != NULL) {
            patch = json_loadb((const char *)split + 1, size - n1 - 1, 0, NULL);
        }
        if (patch != NULL) {
            (void)task_apply_merge_patch(obj, patch, TASK_PATCH_MAIN, NULL);
            (void)task_apply_merge_patch(obj, patch, TASK_PATCH_STATUS, NULL);
            json_decref(patch);
        }
        json_decref(obj);
    }
    json_decref(in);
    return 0;
}
