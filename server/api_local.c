/* SPDX-License-Identifier: Apache-2.0 */
/* The `local` SCM provider's endpoints (SPEC §3, §10): POST /api/v1/local/comments adds a
 * comment to a local PR thread and feeds it to the same inbox as a webhook would;
 * GET /api/v1/local/threads/{owner}/{repo}/{number} shows the thread, bot replies and the
 * sticky comment included. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bot/slashcmd.h"
#include "server/server_int.h"

static bool project_valid(const char *p)
{
    const char *slash = p != NULL ? strchr(p, '/') : NULL;

    if (slash == NULL || slash == p || slash[1] == '\0' || strlen(p) > 200) {
        return false;
    }
    for (; *p != '\0'; p++) {
        char c = *p;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.' || c == '/')) {
            return false;
        }
    }
    return true;
}

int api_local_comment(struct request *r)
{
    json_t *body;
    const char *project, *text, *author, *perm;
    json_int_t number;
    enum scm_level level = SCM_LEVEL_ADMIN;
    struct inbox_entry e;
    int64_t id = 0;
    bool dup = false, command;
    struct err err = {0};
    int ret;

    body = http_body_json(r, &ret);
    if (body == NULL) {
        return ret;
    }
    project = json_string_value(json_object_get(body, "project"));
    text = json_string_value(json_object_get(body, "body"));
    author = json_string_value(json_object_get(body, "author"));
    perm = json_string_value(json_object_get(body, "permission"));
    number = json_integer_value(json_object_get(body, "number"));
    if (!project_valid(project)) {
        ret = http_send_error(r, 422, NULL, NULL, "project must look like OWNER/REPO");
    } else if (number < 1) {
        ret = http_send_error(r, 422, NULL, NULL, "number must be a positive integer");
    } else if (text == NULL || text[0] == '\0') {
        ret = http_send_error(r, 422, NULL, NULL, "body is required");
    } else if (author == NULL || author[0] == '\0' || strcmp(author, SCM_LOCAL_BOT) == 0) {
        ret = http_send_error(r, 422, NULL, NULL, "author is required (and not the bot)");
    } else if (perm != NULL && scm_level_parse(&level, perm) != E_OK) {
        ret = http_send_error(r, 422, NULL, NULL,
                              "permission must be none, read, triage, write, maintain or admin");
    } else {
        ret = -1;
    }
    if (ret != -1) {
        json_decref(body);
        return ret;
    }
    if (task_store_local_permission_set(r->srv->store, project, author, (int)level, &err) != E_OK ||
        task_store_local_add(&id, r->srv->store, project, number, author, text, &err) != E_OK) {
        json_decref(body);
        return http_send_err(r, &err);
    }
    command = slashcmd_mentions(text, strlen(text));
    if (command) {
        memset(&e, 0, sizeof(e));
        snprintf(e.provider, sizeof(e.provider), "local");
        e.project = (char *)(uintptr_t)project;
        e.number = number;
        e.comment_id = xasprintf("%lld", (long long)id);
        e.author = (char *)(uintptr_t)author;
        e.body = (char *)(uintptr_t)text;
        if (task_store_inbox_add(&dup, r->srv->store, &e, &err) != E_OK) {
            free(e.comment_id);
            json_decref(body);
            return http_send_err(r, &err);
        }
        free(e.comment_id);
    }
    json_decref(body);
    return http_send_json(r, 202, json_pack("{s:I, s:b}", "id", (json_int_t)id, "command",
                                            command));
}

int api_local_thread(struct request *r)
{
    char *project = xasprintf("%s/%s", r->params[0], r->params[1]);
    char *end = NULL;
    long long number = strtoll(r->params[2], &end, 10);
    json_t *comments = NULL;
    struct err err = {0};
    int ret;

    if (*end != '\0' || number < 1) {
        free(project);
        return http_send_error(r, 400, NULL, NULL, "the thread number must be a positive integer");
    }
    if (task_store_local_thread(&comments, r->srv->store, project, number, &err) != E_OK) {
        free(project);
        json_decref(comments);
        return http_send_err(r, &err);
    }
    ret = http_send_json(r, 200, json_pack("{s:s, s:I, s:o}", "project", project, "number",
                                           (json_int_t)number, "comments", comments));
    free(project);
    return ret;
}
