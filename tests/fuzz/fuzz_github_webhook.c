/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: GitHub webhook payloads. The parser must never crash, a parsed
 * comment must carry every field the bot relies on, with a PR number and names GitHub
 * allows, github_webhook_check must answer as the parser does, and the no-allocation
 * syntax scanner
 * (common/jsonscan) must accept whatever jansson accepts. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonscan.h"
#include "scm/github/github.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *body = (const char *)data;
    enum github_event ev, ev2;
    struct inbox_entry e;
    const char *why = NULL, *why2 = NULL;
    json_t *j;
    int rc = github_webhook_parse(&ev, &e, &why, "issue_comment", "d", body, size, NULL);

    /* The check that keeps nothing (deliveries without a command) answers the same. */
    ASSERT(github_webhook_check(&ev2, &why2, "issue_comment", body, size, NULL) == rc);
    ASSERT(rc != E_OK || (ev2 == ev && strcmp(why2, why) == 0));
    if (rc == E_OK && ev == GITHUB_EVENT_COMMENT) {
        const char *slash;
        char *owner;

        ASSERT(e.project != NULL && e.comment_id != NULL && e.author != NULL && e.body != NULL);
        /* Only names GitHub allows get through: they become API paths and mentions. */
        ASSERT(e.number >= 1 && e.number <= INT32_MAX);
        ASSERT(github_valid_login(e.author, true));
        slash = strchr(e.project, '/');
        ASSERT(slash != NULL && github_valid_repo_name(slash + 1));
        owner = xstrndup(e.project, (size_t)(slash - e.project));
        ASSERT(github_valid_login(owner, false));
        free(owner);
    }
    inbox_entry_cleanup(&e);
    {
        /* Headers are NUL-terminated strings: fuzz the signature header as one too. */
        char *sig = xstrndup(body, size < 200 ? size : 200);
        (void)github_webhook_verify("a,b", sig, body, size, NULL);
        free(sig);
    }
    j = json_loadb(body, size, JSON_DECODE_ANY, NULL);
    if (j != NULL && memchr(body, '\0', size) == NULL) {
        ASSERT(jsonscan_check(body, size, NULL) == E_OK);
    }
    json_decref(j);
    return 0;
}
