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

static bool project_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_' || c == '.' || c == '/';
}

static bool project_valid(const char *p)
{
    const char *slash = p != NULL ? strchr(p, '/') : NULL;

    if (slash == NULL || slash == p || slash[1] == '\0' || strlen(p) > 200) {
        return false;
    }
    for (; *p != '\0'; p++) {
        if (!project_char(*p)) {
            return false;
        }
    }
    return true;
}

/* The fields of a POST /api/v1/local/comments body (borrowed from it). */
struct local_comment {
    const char *project, *text, *author;
    json_int_t number;
    enum scm_level level; /* the author's permission: admin unless given */
};

/* Reads and checks BODY into C; NULL when fine, else what is wrong (a 422). */
static const char *read_comment(struct local_comment *c, const json_t *body)
{
    const char *perm = json_string_value(json_object_get(body, "permission"));

    c->project = json_string_value(json_object_get(body, "project"));
    c->text = json_string_value(json_object_get(body, "body"));
    c->author = json_string_value(json_object_get(body, "author"));
    c->number = json_integer_value(json_object_get(body, "number"));
    c->level = SCM_LEVEL_ADMIN;
    if (!project_valid(c->project)) {
        return "project must look like OWNER/REPO";
    }
    if (c->number < 1) {
        return "number must be a positive integer";
    }
    if (c->text == NULL || c->text[0] == '\0') {
        return "body is required";
    }
    if (c->author == NULL || c->author[0] == '\0' || strcmp(c->author, SCM_LOCAL_BOT) == 0) {
        return "author is required (and not the bot)";
    }
    if (perm != NULL && scm_level_parse(&c->level, perm) != E_OK) {
        return "permission must be none, read, triage, write, maintain or admin";
    }
    return NULL;
}

/* Feeds comment ID to the inbox as a webhook would. */
static int to_inbox(struct request *r, const struct local_comment *c, int64_t id, struct err *err)
{
    struct inbox_entry e;
    bool dup = false;
    int rc;

    memset(&e, 0, sizeof(e));
    snprintf(e.provider, sizeof(e.provider), "local");
    e.project = (char *)(uintptr_t)c->project;
    e.number = c->number;
    e.comment_id = xasprintf("%lld", (long long)id);
    e.author = (char *)(uintptr_t)c->author;
    e.body = (char *)(uintptr_t)c->text;
    rc = task_store_inbox_add(&dup, r->srv->store, &e, err);
    free(e.comment_id);
    return rc;
}

int api_local_comment(struct request *r)
{
    json_t *body;
    struct local_comment c;
    const char *bad;
    int64_t id = 0;
    bool command = false;
    struct err err = {0};
    int ret;

    body = http_body_json(r, &ret);
    if (body == NULL) {
        return ret;
    }
    bad = read_comment(&c, body);
    if (bad != NULL) {
        ret = http_send_error(r, 422, NULL, NULL, "%s", bad);
        json_decref(body);
        return ret;
    }
    if (task_store_local_permission_set(r->srv->store, c.project, c.author, (int)c.level, &err) !=
            E_OK ||
        task_store_local_add(&id, r->srv->store, c.project, c.number, c.author, c.text, &err) !=
            E_OK) {
        json_decref(body);
        return http_send_err(r, &err);
    }
    command = slashcmd_mentions(c.text, strlen(c.text));
    if (command && to_inbox(r, &c, id, &err) != E_OK) {
        json_decref(body);
        return http_send_err(r, &err);
    }
    json_decref(body);
    return http_send_json(r, 202,
                          json_pack("{s:I, s:b}", "id", (json_int_t)id, "command", command));
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
    ret = http_send_json(r, 200,
                         json_pack("{s:s, s:I, s:o}", "project", project, "number",
                                   (json_int_t)number, "comments", comments));
    free(project);
    return ret;
}
