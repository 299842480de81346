/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: GitLab Note Hook payloads. The parser must never crash; a parsed note
 * must carry every field the bot relies on, with an MR iid, a project path, a username and
 * branches GitLab allows, and an extra object head_of() can read; the Standard Webhooks
 * and token checks must survive any header bytes; note fitting keeps bodies in bounds. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "scm/gitlab/gitlab.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool http_url_or_null(const char *u)
{
    return u == NULL || strncmp(u, "https://", 8) == 0 || strncmp(u, "http://", 7) == 0;
}

static void check_note(const struct inbox_entry *e)
{
    json_t *x;

    ASSERT(e->project != NULL && e->comment_id != NULL && e->author != NULL && e->body != NULL);
    ASSERT(e->number >= 1 && e->number <= INT32_MAX);
    ASSERT(strcmp(e->provider, "gitlab") == 0);
    ASSERT(gitlab_valid_project_path(e->project));
    ASSERT(gitlab_valid_username(e->author));
    ASSERT(strstr(e->project, "..") == NULL);
    x = json_loads(e->extra != NULL ? e->extra : "", 0, NULL);
    ASSERT(x != NULL);
    ASSERT(gitlab_valid_branch(json_string_value(json_object_get(x, "head_ref"))));
    ASSERT(gitlab_valid_branch(json_string_value(json_object_get(x, "base_ref"))));
    /* No clone URL when the payload names no source project (deleted: the bot asks the
     * API); never one that is not http(s). */
    ASSERT(http_url_or_null(json_string_value(json_object_get(x, "clone_url"))));
    ASSERT(http_url_or_null(json_string_value(json_object_get(x, "base_url"))));
    json_decref(x);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *body = (const char *)data;
    enum gitlab_event ev;
    struct inbox_entry e;
    const char *why = NULL;

    if (gitlab_webhook_parse(&ev, &e, &why, "Note Hook", "d", "u", body, size, NULL) == E_OK &&
        ev == GITLAB_EVENT_NOTE) {
        check_note(&e);
        inbox_entry_cleanup(&e);
    }
    ASSERT(why != NULL);
    {
        /* Headers are NUL-terminated strings: fuzz them as such. */
        char *h = xstrndup(body, size < 200 ? size : 200);
        char *fit;
        (void)gitlab_token_verify("a,b", h, NULL);
        (void)gitlab_sig_verify("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg", "1614265330", h,
                                body, size, 1614265330, NULL);
        (void)gitlab_sig_precheck(h, h, h, 0, NULL);
        (void)gitlab_sig_secrets_valid(h);
        (void)gitlab_valid_project_path(h);
        (void)gitlab_valid_branch(h);
        fit = gitlab_note_fit(h, 64);
        ASSERT(strlen(fit) <= 64 || gitlab_note_is_award(h));
        ASSERT(!gitlab_note_is_award(fit));
        free(fit);
        free(h);
    }
    return 0;
}
