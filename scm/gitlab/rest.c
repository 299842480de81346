/* SPDX-License-Identifier: Apache-2.0 */
/* The GitLab REST provider (API v4, PRIVATE-TOKEN): award emoji, notes (all pages),
 * member access levels, merge request heads and raw files, paced to GitLab.com's note
 * creation limit, with 429s turned into retry hints and X-Gitlab-Event-UUID sent back on
 * the calls made for a delivery. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/clock.h"
#include "common/httpc.h"
#include "common/log.h"
#include "common/secret.h"

#include "scm/gitlab/gitlab_int.h"

const char *gitlab_token_from_env(bool notifier_fallback)
{
    static const char *const names[] = {"DIVERGE_GITLAB_TOKEN", "GITLAB_TOKEN",
                                        "DIVERGE_NOTIFIER_TOKEN"};

    return secret_env_first(names, ARRAY_LEN(names) - (notifier_fallback ? 0 : 1));
}

/* --- deliveries and pacing -------------------------------------------------------------- */

void gitlab_provider_note_delivery(struct scm_provider *p, const char *project, int64_t iid,
                                   const char *note_id, const char *event_uuid)
{
    struct gitlab *gl;
    struct memo *m;

    if (p == NULL || project == NULL || note_id == NULL || event_uuid == NULL ||
        strcmp(p->ops->name, "gitlab") != 0 || strlen(event_uuid) > GITLAB_UUID_MAX ||
        strlen(project) >= sizeof(m->project) || strlen(note_id) >= sizeof(m->note_id)) {
        return;
    }
    gl = to_gitlab(p);
    pthread_mutex_lock(&gl->mu);
    m = &gl->memo[gl->memo_next];
    gl->memo_next = (gl->memo_next + 1) % GITLAB_MEMO_MAX;
    snprintf(m->project, sizeof(m->project), "%s", project);
    m->iid = iid;
    snprintf(m->note_id, sizeof(m->note_id), "%s", note_id);
    snprintf(m->uuid, sizeof(m->uuid), "%s", event_uuid);
    pthread_mutex_unlock(&gl->mu);
}

/* The X-Gitlab-Event-UUID line for a call about REF (and NOTE_ID when not NULL): the
 * newest remembered delivery of that note, else of that MR; NULL when none. New string. */
char *gitlab_uuid_header(struct gitlab *gl, const struct scm_ref *ref, const char *note_id)
{
    char *line = NULL;

    pthread_mutex_lock(&gl->mu);
    for (size_t k = 0; k < GITLAB_MEMO_MAX && line == NULL; k++) {
        size_t at = (gl->memo_next + GITLAB_MEMO_MAX - 1 - k) % GITLAB_MEMO_MAX;
        const struct memo *m = &gl->memo[at];
        if (m->uuid[0] != '\0' && m->iid == ref->number && strcmp(m->project, ref->project) == 0 &&
            (note_id == NULL || strcmp(m->note_id, note_id) == 0)) {
            line = xasprintf("X-Gitlab-Event-UUID: %s", m->uuid);
        }
    }
    pthread_mutex_unlock(&gl->mu);
    return line;
}

/* Milliseconds before one more note may be created on PROJECT (0: now, and it is counted). */
int64_t gitlab_pace_take(struct gitlab *gl, const char *project)
{
    int64_t now = clock_now_ms(clock_system()), wait;
    struct pace *slot = NULL;

    pthread_mutex_lock(&gl->mu);
    for (size_t i = 0; i < GITLAB_PACE_MAX && slot == NULL; i++) {
        slot = strcmp(gl->pace[i].project, project) == 0 ? &gl->pace[i] : NULL;
    }
    if (slot == NULL) {
        slot = &gl->pace[gl->pace_next];
        gl->pace_next = (gl->pace_next + 1) % GITLAB_PACE_MAX;
        memset(slot, 0, sizeof(*slot));
        snprintf(slot->project, sizeof(slot->project), "%s", project);
    }
    wait = scm_rate_wait(&slot->rate, gl->notes_per_minute, now);
    if (wait == 0) {
        scm_rate_note(&slot->rate, now);
    }
    pthread_mutex_unlock(&gl->mu);
    return wait;
}

/* --- one call ---------------------------------------------------------------------------- */

static int classify(struct scm_result *res, const struct httpc_response *r, const char *what,
                    struct err *err)
{
    const char *retry = httpc_response_header(r, "retry-after");
    const char *reset = httpc_response_header(r, "ratelimit-reset");
    long st = r->status;

    res->status = (int)st;
    if (st >= 200 && st < 300) {
        return E_OK;
    }
    if (st == 429) {
        /* Retry-After, else RateLimit-Reset (epoch seconds); with neither, the outbox's
         * exponential backoff. */
        if (retry != NULL && strtoll(retry, NULL, 10) > 0) {
            res->retry_after_ms = strtoll(retry, NULL, 10) * 1000;
            res->rate_limited = true;
        } else if (reset != NULL && strtoll(reset, NULL, 10) > 0) {
            int64_t wait = strtoll(reset, NULL, 10) * 1000 - clock_now_ms(clock_system());
            res->retry_after_ms = wait > 0 ? wait : 1000;
            res->rate_limited = true;
        }
        return err_set(err, E_AGAIN, "%s: rate limited (HTTP 429)", what);
    }
    if (st >= 500) {
        return err_set(err, E_AGAIN, "%s: GitLab answered %ld", what, st);
    }
    if (st == 404) {
        return err_set(err, E_NOTFOUND, "%s: not found", what);
    }
    if (st == 401 || st == 403) {
        return err_set(err, E_DENIED, "%s: GitLab answered %ld", what, st);
    }
    if (st == 400 || st == 422) {
        return err_set(err, E_INVALID, "%s: GitLab refused it (%ld)", what, st);
    }
    return err_set(err, E_FAIL, "%s: GitLab answered %ld", what, st);
}

void gitlab_answer_cleanup(struct answer *a)
{
    json_decref(a->json);
    free(a->raw);
    memset(a, 0, sizeof(*a));
}

/* Whether R is a 4xx answer saying the thing "has already been taken". */
static bool already_taken(const struct httpc_response *r)
{
    return r->status >= 400 && r->status < 500 && r->body.data != NULL &&
           strstr(r->body.data, "already been taken") != NULL;
}

/* Fills ANS from the successful answer R: the raw body when WANT_RAW, else its JSON (when
 * there is a body), and the next page number. */
static int take_answer(struct answer *ans, const struct httpc_response *r, bool want_raw,
                       const char *method, struct err *err)
{
    const char *np;
    long v;

    if (want_raw) {
        ans->raw = xstrndup(r->body.data != NULL ? r->body.data : "", r->body.len);
        ans->raw_len = r->body.len;
    } else if (r->body.len > 0) {
        ans->json = json_loadb(r->body.data, r->body.len, 0, NULL);
        if (ans->json == NULL) {
            return err_set(err, E_FAIL, "%s: the answer is not JSON", method);
        }
    }
    np = httpc_response_header(r, "x-next-page");
    v = np != NULL ? strtol(np, NULL, 10) : 0;
    ans->next_page = v > 0 && v <= GITLAB_MAX_PAGES ? v : 0;
    return E_OK;
}

/* One REST call. UUID_LINE (may be NULL) is an X-Gitlab-Event-UUID header line. */
int gitlab_call(struct answer *ans, struct gitlab *gl, const char *method, const char *url,
                const json_t *body, const char *uuid_line, bool want_raw, struct scm_result *res,
                struct err *err)
{
    struct httpc_request req = HTTPC_REQUEST_DEFAULTS;
    struct httpc_response r;
    struct scm_result local = {0};
    char *tok = NULL, *text = NULL;
    const char *headers[5] = {"Accept: application/json", "Content-Type: application/json", NULL,
                              NULL, NULL};
    int rc;

    res = res != NULL ? res : &local;
    memset(res, 0, sizeof(*res));
    memset(ans, 0, sizeof(*ans));
    if (gl->token == NULL) {
        return err_set(err, E_DENIED, "no GitLab token (DIVERGE_GITLAB_TOKEN or GITLAB_TOKEN)");
    }
    tok = xasprintf("PRIVATE-TOKEN: %s", gl->token);
    headers[2] = tok;
    headers[3] = uuid_line;
    text = body != NULL ? json_dumps(body, JSON_COMPACT) : NULL;
    req.method = method;
    req.url = url;
    req.headers = headers;
    req.body = text;
    req.body_len = text != NULL ? strlen(text) : 0;
    rc = httpc_request(&r, &req, err);
    if (rc == E_OK) {
        rc = classify(res, &r, method, err);
        ans->taken = already_taken(&r);
    } else {
        rc = E_AGAIN;
    }
    if (rc == E_OK) {
        rc = take_answer(ans, &r, want_raw, method, err);
    }
    httpc_response_cleanup(&r);
    secret_wipe(tok, strlen(tok));
    free(tok);
    free(text);
    return rc;
}

/* "<api>/projects/<id as one encoded segment><TAIL>": a new string. */
char *gitlab_project_url(struct gitlab *gl, const char *project, const char *tail)
{
    char *id = scm_path_escape(project, false);
    char *url = xasprintf("%s/projects/%s%s", gl->api, id, tail);

    free(id);
    return url;
}

char *gitlab_notes_url(struct gitlab *gl, const struct scm_ref *ref, const char *note_id,
                       const char *suffix)
{
    char *enote = note_id != NULL ? scm_path_escape(note_id, false) : NULL;
    char *tail = xasprintf("/merge_requests/%lld/notes%s%s%s", (long long)ref->number,
                           enote != NULL ? "/" : "", enote != NULL ? enote : "", suffix);
    char *url = gitlab_project_url(gl, ref->project, tail);

    free(enote);
    free(tail);
    return url;
}

/* USER's numeric id from GET /users?username= (for payloads without one); 0 when none. */
static int user_id_of(int64_t *out, struct gitlab *gl, const char *user, struct scm_result *res,
                      struct err *err)
{
    char *e = httpc_escape(user);
    char *url = xasprintf("%s/users?username=%s", gl->api, e);
    struct answer ans;
    int rc = gitlab_call(&ans, gl, "GET", url, NULL, NULL, false, res, err);
    const json_t *first = json_array_get(ans.json, 0);

    *out = 0;
    if (rc == E_OK && json_is_integer(json_object_get(first, "id"))) {
        const char *name = json_string_value(json_object_get(first, "username"));
        *out = name != NULL && strcasecmp(name, user) == 0
                   ? json_integer_value(json_object_get(first, "id"))
                   : 0;
    }
    gitlab_answer_cleanup(&ans);
    free(url);
    free(e);
    return rc;
}

static int gl_permission_of(enum scm_level *out, struct scm_provider *p, const struct scm_ref *ref,
                            const char *user, int64_t user_id, struct scm_result *res,
                            struct err *err)
{
    struct gitlab *gl = to_gitlab(p);
    char *tail, *url, *uuid;
    struct answer ans;
    int rc = E_OK;

    *out = SCM_LEVEL_NONE;
    if (user_id <= 0) {
        rc = user_id_of(&user_id, gl, user, res, err);
        if (rc != E_OK || user_id <= 0) {
            return rc == E_NOTFOUND ? E_OK : rc;
        }
    }
    tail = xasprintf("/members/all/%lld", (long long)user_id);
    url = gitlab_project_url(gl, ref->project, tail);
    uuid = gitlab_uuid_header(gl, ref, NULL);
    rc = gitlab_call(&ans, gl, "GET", url, NULL, uuid, false, res, err);
    if (rc == E_NOTFOUND) {
        rc = E_OK; /* not a member */
    } else if (rc == E_OK) {
        const json_t *lvl = json_object_get(ans.json, "access_level");
        const char *state = json_string_value(json_object_get(ans.json, "state"));
        int64_t v = json_is_integer(lvl) ? json_integer_value(lvl) : 0;
        /* A blocked or pending member commands nothing. */
        if (state == NULL || strcmp(state, "active") == 0) {
            *out = v >= SCM_LEVEL_ADMIN ? SCM_LEVEL_ADMIN
                   : v > 0              ? (enum scm_level)(v - v % 10)
                                        : SCM_LEVEL_NONE;
        }
    }
    gitlab_answer_cleanup(&ans);
    free(uuid);
    free(url);
    free(tail);
    return rc;
}

/* The clone URL (http_url_to_repo) of the project at PURL (a project API URL): *out is a
 * new string, or NULL when the answer has none. E_NOTFOUND when the project does not exist. */
static int project_clone(char **out, struct gitlab *gl, const char *purl, struct scm_result *res,
                         struct err *err)
{
    struct answer proj;
    int rc = gitlab_call(&proj, gl, "GET", purl, NULL, NULL, false, res, err);
    const char *clone = json_string_value(json_object_get(proj.json, "http_url_to_repo"));

    *out = rc == E_OK && clone != NULL ? xstrdup(clone) : NULL;
    gitlab_answer_cleanup(&proj);
    return rc;
}

/* The source project's clone URL of MR into OUT: head_gone when the MR has no source
 * project (deleted) or it answers 404. Never the target project in its place. */
static int source_of(struct scm_pull *out, struct gitlab *gl, const json_t *mr,
                     struct scm_result *res, struct err *err)
{
    const json_t *spid = json_object_get(mr, "source_project_id");
    char *purl;
    int rc;

    if (!json_is_integer(spid)) {
        out->head_gone = true;
        return E_OK;
    }
    purl = xasprintf("%s/projects/%lld", gl->api, (long long)json_integer_value(spid));
    rc = project_clone(&out->clone_url, gl, purl, res, err);
    free(purl);
    if (rc == E_NOTFOUND) {
        out->head_gone = true;
        return E_OK;
    }
    return rc;
}

/* The target project's clone URL of MR (the project REF names) into out->base_url. */
static int target_of(struct scm_pull *out, struct gitlab *gl, const struct scm_ref *ref,
                     const json_t *mr, struct scm_result *res, struct err *err)
{
    const json_t *spid = json_object_get(mr, "source_project_id");
    const json_t *tpid = json_object_get(mr, "target_project_id");
    char *purl;
    int rc;

    if (out->clone_url != NULL && json_is_integer(spid) && json_is_integer(tpid) &&
        json_integer_value(spid) == json_integer_value(tpid)) {
        out->base_url = xstrdup(out->clone_url);
        return E_OK;
    }
    purl = gitlab_project_url(gl, ref->project, "");
    rc = project_clone(&out->base_url, gl, purl, res, err);
    free(purl);
    return rc;
}

static int gl_pull_info(struct scm_pull *out, struct scm_provider *p, const struct scm_ref *ref,
                        struct scm_result *res, struct err *err)
{
    struct gitlab *gl = to_gitlab(p);
    char *tail = xasprintf("/merge_requests/%lld", (long long)ref->number);
    char *url = gitlab_project_url(gl, ref->project, tail);
    struct answer mr;
    int rc = gitlab_call(&mr, gl, "GET", url, NULL, NULL, false, res, err);
    const char *src = NULL, *dst = NULL, *web = NULL;

    memset(out, 0, sizeof(*out));
    if (rc == E_OK) {
        src = json_string_value(json_object_get(mr.json, "source_branch"));
        dst = json_string_value(json_object_get(mr.json, "target_branch"));
        web = json_string_value(json_object_get(mr.json, "web_url"));
        if (src == NULL || !gitlab_valid_branch(src) ||
            (dst != NULL && !gitlab_valid_branch(dst))) {
            rc = err_set(err, E_FAIL, "merge request %s!%lld has no usable source", ref->project,
                         (long long)ref->number);
        }
    }
    if (rc == E_OK) {
        rc = source_of(out, gl, mr.json, res, err);
    }
    if (rc == E_OK && !out->head_gone && out->clone_url == NULL) {
        rc = err_set(err, E_FAIL, "merge request %s!%lld has no usable source", ref->project,
                     (long long)ref->number);
    }
    if (rc == E_OK) {
        rc = target_of(out, gl, ref, mr.json, res, err);
    }
    if (rc == E_OK) {
        out->head_ref = xstrdup(src);
        out->base_ref = dst != NULL ? xstrdup(dst) : NULL;
        out->html_url = web != NULL ? xstrdup(web) : NULL;
    } else {
        scm_pull_cleanup(out);
    }
    gitlab_answer_cleanup(&mr);
    free(tail);
    free(url);
    return rc;
}

static int gl_file_at(char **out, size_t *len_out, struct scm_provider *p,
                      const struct scm_ref *ref, const char *git_ref, const char *path,
                      struct scm_result *res, struct err *err)
{
    struct gitlab *gl = to_gitlab(p);
    char *epath = scm_path_escape(path, false); /* the file path is one encoded segment */
    char *eref = httpc_escape(git_ref);
    char *tail = xasprintf("/repository/files/%s/raw?ref=%s", epath, eref);
    char *url = gitlab_project_url(gl, ref->project, tail);
    char *uuid = gitlab_uuid_header(gl, ref, NULL);
    struct answer ans;
    int rc = gitlab_call(&ans, gl, "GET", url, NULL, uuid, true, res, err);

    *out = NULL;
    *len_out = 0;
    if (rc == E_OK) {
        *out = ans.raw;
        *len_out = ans.raw_len;
        ans.raw = NULL;
    }
    gitlab_answer_cleanup(&ans);
    free(uuid);
    free(url);
    free(tail);
    free(eref);
    free(epath);
    return rc;
}

static const char *gl_bot_login(struct scm_provider *p)
{
    struct gitlab *gl = to_gitlab(p);
    int64_t now = clock_now_ms(clock_system());
    const char *login;

    pthread_mutex_lock(&gl->mu);
    if (gl->bot_login == NULL && now >= gl->login_next_ms) {
        struct err err = {0};
        char *url = xasprintf("%s/user", gl->api);
        struct answer ans;
        int rc;
        const char *name;

        /* Unlocked for the call would let two threads ask at once; asking is rare. */
        rc = gitlab_call(&ans, gl, "GET", url, NULL, NULL, false, NULL, &err);
        name = json_string_value(json_object_get(ans.json, "username"));
        if (rc == E_OK && name != NULL && gitlab_valid_username(name)) {
            gl->bot_login = xstrdup(name);
            log_kv(LOG_INFO, "gitlab_bot_login", "login", name, NULL);
        } else {
            int64_t delay = GITLAB_LOGIN_RETRY_MIN_MS;
            for (int i = 0; i < gl->login_failures && delay < GITLAB_LOGIN_RETRY_MAX_MS; i++) {
                delay *= 2;
            }
            delay = delay < GITLAB_LOGIN_RETRY_MAX_MS ? delay : GITLAB_LOGIN_RETRY_MAX_MS;
            gl->login_failures++;
            gl->login_next_ms = now + delay;
            log_kv(LOG_WARN, "gitlab_bot_login_unknown", "error",
                   rc != E_OK ? err.msg : "GET /user names no username", NULL);
        }
        gitlab_answer_cleanup(&ans);
        free(url);
    }
    login = gl->bot_login;
    pthread_mutex_unlock(&gl->mu);
    return login;
}

static void gl_free(struct scm_provider *p)
{
    struct gitlab *gl = to_gitlab(p);

    if (gl->token != NULL) {
        secret_wipe(gl->token, strlen(gl->token));
    }
    free(gl->token);
    free(gl->api);
    free(gl->bot_login);
    pthread_mutex_destroy(&gl->mu);
    free(gl);
}

static const struct scm_provider_ops gitlab_ops = {
    .name = "gitlab",
    .react = gitlab_op_react,
    .post_comment = gitlab_op_post_comment,
    .update_comment = gitlab_op_update_comment,
    .delete_comment = gitlab_op_delete_comment,
    .list_comments = gitlab_op_list_comments,
    .permission_of = gl_permission_of,
    .pull_info = gl_pull_info,
    .file_at = gl_file_at,
    .bot_login = gl_bot_login,
    .free = gl_free,
};

int gitlab_provider_new(struct scm_provider **out, const struct gitlab_config *cfg, struct err *err)
{
    struct gitlab *gl;
    size_t n;

    *out = NULL;
    if (cfg->url == NULL ||
        (strncmp(cfg->url, "https://", 8) != 0 && strncmp(cfg->url, "http://", 7) != 0)) {
        return err_set(err, E_INVALID, "the GitLab url must be http(s)");
    }
    gl = xcalloc(1, sizeof(*gl));
    gl->base.ops = &gitlab_ops;
    n = strlen(cfg->url);
    while (n > 0 && cfg->url[n - 1] == '/') {
        n--;
    }
    gl->api = xasprintf("%.*s/api/v4", (int)n, cfg->url);
    gl->token = cfg->token != NULL && cfg->token[0] != '\0' ? xstrdup(cfg->token) : NULL;
    gl->bot_login =
        cfg->bot_login != NULL && cfg->bot_login[0] != '\0' ? xstrdup(cfg->bot_login) : NULL;
    gl->notes_per_minute = cfg->notes_per_minute > 0 && cfg->notes_per_minute < SCM_RATE_SLOTS
                               ? cfg->notes_per_minute
                               : GITLAB_NOTES_PER_MINUTE;
    pthread_mutex_init(&gl->mu, NULL);
    *out = &gl->base;
    return E_OK;
}
