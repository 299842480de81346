/* SPDX-License-Identifier: Apache-2.0 */
/* The `local` SCM provider's endpoints (SPEC §3, §10): POST /api/v1/local/comments adds a
 * comment to a local PR thread and feeds it to the same inbox as a webhook would;
 * GET /api/v1/local/threads/{owner}/{repo}/{number} shows the thread, bot replies and the
 * sticky comment included; PUT/GET /api/v1/local/pulls/{owner}/{repo}/{number} binds a local
 * PR to a git repository, head and base branch (`diverge local pr open`), which the
 * `local` provider then answers pull_info and file_at from. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bot/slashcmd.h"
#include "server/api/api_int.h"

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
    api_comment_hint(r->srv, c.text);
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

/* --- local PRs bound to a repository (`diverge local pr open`, SPEC §10) ------------- */

/* A branch name git accepts and no git command can take for an option: [A-Za-z0-9._/-],
 * not starting with '-', '/' or '.', no "..", "//" or "/.", not ending with '/', '.' or
 * ".lock", at most 200 bytes. */
static bool branch_valid(const char *b)
{
    size_t n = b != NULL ? strlen(b) : 0;

    if (n == 0 || n > 200 || strchr("-/.", b[0]) != NULL || strchr("/.", b[n - 1]) != NULL) {
        return false;
    }
    if (strstr(b, "..") != NULL || strstr(b, "//") != NULL || strstr(b, "/.") != NULL ||
        (n >= 5 && strcmp(b + n - 5, ".lock") == 0)) {
        return false;
    }
    return strspn(b, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._/-") == n;
}

/* Whether URL has a byte a URL handed to git must not have: space, quote, backslash,
 * control character. */
static bool url_has_bad_byte(const char *url)
{
    for (const char *p = url; *p != '\0'; p++) {
        if ((unsigned char)*p <= 0x20 || *p == 0x7f || *p == '"' || *p == '\'' || *p == '\\') {
            return true;
        }
    }
    return false;
}

/* file:///absolute/path (an existing directory) or https://host/...; no spaces, quotes,
 * backslashes or control characters. NULL when fine, else what is wrong. */
static const char *repo_url_problem(const char *url)
{
    struct stat sb;

    if (url == NULL || url[0] == '\0') {
        return "repository is required";
    }
    if (strlen(url) > 2048) {
        return "repository: longer than 2048 bytes";
    }
    if (url_has_bad_byte(url)) {
        return "repository: must not contain spaces, quotes or control characters";
    }
    if (strncmp(url, "https://", 8) == 0) {
        return url[8] != '\0' && url[8] != '/' ? NULL : "repository: https URL without a host";
    }
    if (strncmp(url, "file:///", 8) != 0) {
        return "repository must be a file:///absolute/path or an https:// URL";
    }
    if (stat(url + 7, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        return "repository: no git repository at that file:// path";
    }
    return NULL;
}

/* The project and number of a /api/v1/local/pulls/{owner}/{repo}/{number} request; a
 * 400/422 has been sent when false. */
static bool pull_target(char **project_out, long long *number_out, struct request *r, int *ret)
{
    char *end = NULL;

    *project_out = NULL;
    *number_out = strtoll(r->params[2], &end, 10);
    if (*end != '\0' || *number_out < 1) {
        *ret = http_send_error(r, 400, NULL, NULL,
                               "the pull request number must be a positive "
                               "integer");
        return false;
    }
    *project_out = xasprintf("%s/%s", r->params[0], r->params[1]);
    if (!project_valid(*project_out)) {
        free(*project_out);
        *project_out = NULL;
        *ret = http_send_error(r, 422, NULL, NULL, "project must look like OWNER/REPO");
        return false;
    }
    return true;
}

/* Checks a PUT body; NULL when fine, else what is wrong (a 422). */
static const char *pull_problem(const char *url, const char *head, const char *base)
{
    const char *bad = repo_url_problem(url);

    if (bad != NULL) {
        return bad;
    }
    if (!branch_valid(head)) {
        return "head must be a branch name (letters, digits, '.', '_', '/', '-')";
    }
    if (!branch_valid(base)) {
        return "base must be a branch name (letters, digits, '.', '_', '/', '-')";
    }
    if (strcmp(head, base) == 0) {
        return "head and base must be different branches";
    }
    return NULL;
}

int api_local_pull_put(struct request *r)
{
    char *project = NULL;
    long long number;
    json_t *body, *pr = NULL;
    const char *url, *head, *base, *bad;
    bool created = false;
    struct err err = {0};
    int ret;

    if (!pull_target(&project, &number, r, &ret)) {
        return ret;
    }
    body = http_body_json(r, &ret);
    if (body == NULL) {
        free(project);
        return ret;
    }
    url = json_string_value(json_object_get(body, "repository"));
    head = json_string_value(json_object_get(body, "head"));
    base = json_string_value(json_object_get(body, "base"));
    if (base == NULL && json_object_get(body, "base") == NULL) {
        base = "main";
    }
    bad = pull_problem(url, head, base);
    if (bad == NULL && controller_url_in_data_dir(r->srv->cfg.data_dir, url)) {
        /* Its tasks would clone another project's mirror or a task's staging repository. */
        bad = "repository: a file:// repository inside the server's data directory is refused";
    }
    if (bad != NULL) {
        ret = http_send_error(r, 422, NULL, NULL, "%s", bad);
    } else if (task_store_local_pull_set(&created, r->srv->store, project, number, url, head, base,
                                         &err) != E_OK ||
               task_store_local_pull_get(&pr, r->srv->store, project, number, &err) != E_OK) {
        ret = http_send_err(r, &err);
    } else {
        json_object_set_new(pr, "created", json_boolean(created));
        ret = http_send_json(r, created ? 201 : 200, pr);
    }
    json_decref(body);
    free(project);
    return ret;
}

int api_local_pull_get(struct request *r)
{
    char *project = NULL;
    long long number;
    json_t *pr = NULL;
    struct err err = {0};
    int ret;

    if (!pull_target(&project, &number, r, &ret)) {
        return ret;
    }
    if (task_store_local_pull_get(&pr, r->srv->store, project, number, &err) != E_OK) {
        ret = http_send_err(r, &err);
    } else {
        ret = http_send_json(r, 200, pr);
    }
    free(project);
    return ret;
}
