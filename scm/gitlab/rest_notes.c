/* SPDX-License-Identifier: Apache-2.0 */
/* GitLab notes and award emoji: create (paced per project), edit with PUT, delete, list
 * every page oldest first, award thumbsup; bodies made safe by gitlab_note_fit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scm/gitlab/gitlab_int.h"

static const char *award_name(const char *content)
{
    static const struct {
        const char *github, *gitlab;
    } map[] = {{"+1", "thumbsup"},   {"-1", "thumbsdown"},     {"laugh", "laughing"},
               {"hooray", "tada"},   {"confused", "confused"}, {"heart", "heart"},
               {"rocket", "rocket"}, {"eyes", "eyes"}};

    for (size_t i = 0; i < ARRAY_LEN(map); i++) {
        if (strcmp(map[i].github, content) == 0) {
            return map[i].gitlab;
        }
    }
    return content;
}

int gitlab_op_react(struct scm_provider *p, const struct scm_ref *ref, const char *comment_id,
                    const char *content, struct scm_result *res, struct err *err)
{
    struct gitlab *gl = to_gitlab(p);
    char *url = gitlab_notes_url(gl, ref, comment_id, "/award_emoji");
    char *uuid = gitlab_uuid_header(gl, ref, comment_id);
    json_t *body = json_pack("{s:s}", "name", award_name(content));
    struct answer ans;
    int rc = gitlab_call(&ans, gl, "POST", url, body, uuid, false, res, err);

    if (rc != E_OK && ans.taken) {
        rc = E_OK; /* awarded before (a retry after a lost answer) */
    }
    gitlab_answer_cleanup(&ans);
    json_decref(body);
    free(uuid);
    free(url);
    return rc;
}

int gitlab_op_post_comment(char **id_out, struct scm_provider *p, const struct scm_ref *ref,
                           const char *text, struct scm_result *res, struct err *err)
{
    struct gitlab *gl = to_gitlab(p);
    int64_t wait = gitlab_pace_take(gl, ref->project);
    char *url, *uuid, *fit;
    json_t *body;
    struct answer ans;
    int rc;

    *id_out = NULL;
    if (wait > 0) {
        /* Not sent: GitLab.com allows so many note creations per minute and project. */
        memset(res, 0, sizeof(*res));
        res->retry_after_ms = wait;
        res->rate_limited = true;
        return err_set(err, E_AGAIN, "paced: %d notes per minute on %s", gl->notes_per_minute,
                       ref->project);
    }
    url = gitlab_notes_url(gl, ref, NULL, "");
    uuid = gitlab_uuid_header(gl, ref, NULL);
    fit = gitlab_note_fit(text, GITLAB_NOTE_MAX);
    body = json_pack("{s:s}", "body", fit);
    rc = gitlab_call(&ans, gl, "POST", url, body, uuid, false, res, err);
    if (rc == E_OK) {
        const json_t *id = json_object_get(ans.json, "id");
        if (json_is_integer(id)) {
            *id_out = xasprintf("%lld", (long long)json_integer_value(id));
        } else {
            rc = err_set(err, E_FAIL, "created note has no id");
        }
    }
    gitlab_answer_cleanup(&ans);
    json_decref(body);
    free(fit);
    free(uuid);
    free(url);
    return rc;
}

int gitlab_op_update_comment(struct scm_provider *p, const struct scm_ref *ref,
                             const char *comment_id, const char *text, struct scm_result *res,
                             struct err *err)
{
    struct gitlab *gl = to_gitlab(p);
    char *url = gitlab_notes_url(gl, ref, comment_id, "");
    char *uuid = gitlab_uuid_header(gl, ref, NULL);
    char *fit = gitlab_note_fit(text, GITLAB_NOTE_MAX);
    json_t *body = json_pack("{s:s}", "body", fit);
    struct answer ans;
    int rc = gitlab_call(&ans, gl, "PUT", url, body, uuid, false, res, err);

    gitlab_answer_cleanup(&ans);
    json_decref(body);
    free(fit);
    free(uuid);
    free(url);
    return rc;
}

int gitlab_op_delete_comment(struct scm_provider *p, const struct scm_ref *ref,
                             const char *comment_id, struct scm_result *res, struct err *err)
{
    struct gitlab *gl = to_gitlab(p);
    char *url = gitlab_notes_url(gl, ref, comment_id, "");
    char *uuid = gitlab_uuid_header(gl, ref, NULL);
    struct answer ans;
    int rc = gitlab_call(&ans, gl, "DELETE", url, NULL, uuid, false, res, err);

    gitlab_answer_cleanup(&ans);
    free(uuid);
    free(url);
    return rc;
}

static void add_note(struct scm_comment **list, size_t *n, size_t *cap, const json_t *c)
{
    const json_t *author = json_object_get(c, "author");
    const char *login = json_string_value(json_object_get(author, "username"));
    const char *body = json_string_value(json_object_get(c, "body"));
    struct scm_comment *sc;

    if (!json_is_integer(json_object_get(c, "id"))) {
        return;
    }
    if (*n == *cap) {
        *cap = *cap == 0 ? 64 : *cap * 2;
        *list = xrealloc(*list, *cap * sizeof(**list));
    }
    sc = &(*list)[(*n)++];
    sc->id = xasprintf("%lld", (long long)json_integer_value(json_object_get(c, "id")));
    sc->author = xstrdup(login != NULL ? login : "");
    sc->by_bot = json_is_true(json_object_get(json_object_get(c, "author"), "bot"));
    sc->body = xstrdup(body != NULL ? body : "");
}

int gitlab_op_list_comments(struct scm_comment **out, size_t *n_out, struct scm_provider *p,
                            const struct scm_ref *ref, struct scm_result *res, struct err *err)
{
    struct gitlab *gl = to_gitlab(p);
    size_t cap = 0;
    long page = 1;
    int rc = E_OK;

    *out = NULL;
    *n_out = 0;
    /* Every page, oldest first, following x-next-page: URLs are built here from the
     * configured base, never taken from an answer, so the token goes nowhere else. */
    for (int k = 0; page > 0 && k < GITLAB_MAX_PAGES && rc == E_OK; k++) {
        char *suffix =
            xasprintf("?sort=asc&order_by=created_at&per_page=%d&page=%ld", GITLAB_PAGE_SIZE, page);
        char *url = gitlab_notes_url(gl, ref, NULL, suffix);
        struct answer ans;
        size_t i;
        json_t *c;

        rc = gitlab_call(&ans, gl, "GET", url, NULL, NULL, false, res, err);
        if (rc == E_OK && !json_is_array(ans.json)) {
            rc = err_set(err, E_FAIL, "notes of %s!%lld: the answer is not a list", ref->project,
                         (long long)ref->number);
        }
        if (rc == E_OK) {
            json_array_foreach(ans.json, i, c)
            {
                add_note(out, n_out, &cap, c);
            }
            page = ans.next_page > page ? ans.next_page : 0;
        }
        gitlab_answer_cleanup(&ans);
        free(url);
        free(suffix);
    }
    if (rc != E_OK) {
        scm_comments_free(*out, *n_out);
        *out = NULL;
        *n_out = 0;
    }
    return rc;
}
