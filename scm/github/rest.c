/* SPDX-License-Identifier: Apache-2.0 */
/* The GitHub REST provider: reactions, comments (all pages), permissions, pull heads and
 * file contents. Each request goes through github_rest_call() (rest_call.c), which turns
 * GitHub's rate-limit signals into retry hints. */
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/clock.h"
#include "common/httpc.h"
#include "common/log.h"
#include "scm/github/github.h"
#include "scm/github/github_int.h"

#define PAGE_SIZE 100
#define MAX_PAGES 200 /* 20,000 comments: far past any real thread */
/* Asking for the bot's login again after a failure: 1 s, doubled up to 5 min. */
#define LOGIN_RETRY_MIN_MS 1000
#define LOGIN_RETRY_MAX_MS 300000

struct github {
    struct scm_provider base; /* must be first */
    char *api_url;            /* owned, without a trailing '/' */
    struct github_auth *auth; /* owned */
    pthread_mutex_t mu;       /* guards the fields below */
    char *bot_login;          /* owned; configured, or learnt (again once an App) */
    bool login_configured;    /* bot_login came from the configuration */
    bool login_app;           /* bot_login was learnt with App credentials */
    char **retired;           /* owned: logins learnt before the credentials became an
                               * App, kept alive for callers that still hold them */
    size_t n_retired;
    int login_failures;    /* failed attempts to learn it so far */
    int64_t login_next_ms; /* epoch ms before which it is not asked again */
    char *inst_project;    /* owned: the project of inst_id (App mode), or NULL */
    int64_t inst_id;       /* its installation, asked from GitHub */
};

static struct github *to_github(struct scm_provider *p)
{
    return container_of(p, struct github, base);
}

static char *repo_url(struct github *gh, const char *project, const char *tail)
{
    return scm_repo_url(gh->api_url, project, tail);
}

/* PREFIX, the percent-encoded ID (one path segment), SUFFIX: a new string. */
static char *tail_with(const char *prefix, const char *id, const char *suffix)
{
    char *e = scm_path_escape(id, false);
    char *t = xasprintf("%s%s%s", prefix, e, suffix);

    free(e);
    return t;
}

/* The installation to call about REF as: the one its delivery named, else (an App with
 * no id at hand, e.g. a task made through the API) GitHub's answer to
 * GET /repos/{owner}/{repo}/installation, remembered for the last project asked. The app
 * JWT alone may not touch a repository. A PAT ignores the id. */
static int64_t installation_of(struct github *gh, const struct scm_ref *ref)
{
    int64_t id = 0;

    if (ref->installation_id != 0 || !github_auth_is_app(gh->auth)) {
        return ref->installation_id;
    }
    pthread_mutex_lock(&gh->mu);
    if (gh->inst_project != NULL && strcmp(gh->inst_project, ref->project) == 0) {
        id = gh->inst_id;
    } else if (github_repo_installation(&id, gh->auth, gh->api_url, ref->project, NULL) == E_OK) {
        free(gh->inst_project);
        gh->inst_project = xstrdup(ref->project);
        gh->inst_id = id;
    }
    pthread_mutex_unlock(&gh->mu);
    return id;
}

static int gh_react(struct scm_provider *p, const struct scm_ref *ref, const char *comment_id,
                    const char *content, struct scm_result *res, struct err *err)
{
    struct github *gh = to_github(p);
    char *tail = tail_with("/issues/comments/", comment_id, "/reactions");
    char *url = repo_url(gh, ref->project, tail);
    json_t *body = json_pack("{s:s}", "content", content);
    int rc = github_rest_call(NULL, NULL, gh->auth, "POST", url, installation_of(gh, ref), body,
                              res, err);

    json_decref(body);
    free(tail);
    free(url);
    return rc;
}

static int gh_post_comment(char **id_out, struct scm_provider *p, const struct scm_ref *ref,
                           const char *text, struct scm_result *res, struct err *err)
{
    struct github *gh = to_github(p);
    char *tail = xasprintf("/issues/%lld/comments", (long long)ref->number);
    char *url = repo_url(gh, ref->project, tail);
    json_t *body = json_pack("{s:s}", "body", text), *ans = NULL;
    int rc = github_rest_call(&ans, NULL, gh->auth, "POST", url, installation_of(gh, ref), body,
                              res, err);

    *id_out = NULL;
    if (rc == E_OK) {
        const json_t *id = json_object_get(ans, "id");
        if (json_is_integer(id)) {
            *id_out = xasprintf("%lld", (long long)json_integer_value(id));
        } else {
            rc = err_set(err, E_FAIL, "created comment has no id");
        }
    }
    json_decref(ans);
    json_decref(body);
    free(tail);
    free(url);
    return rc;
}

static int gh_update_comment(struct scm_provider *p, const struct scm_ref *ref,
                             const char *comment_id, const char *text, struct scm_result *res,
                             struct err *err)
{
    struct github *gh = to_github(p);
    char *tail = tail_with("/issues/comments/", comment_id, "");
    char *url = repo_url(gh, ref->project, tail);
    json_t *body = json_pack("{s:s}", "body", text);
    int rc = github_rest_call(NULL, NULL, gh->auth, "PATCH", url, installation_of(gh, ref), body,
                              res, err);

    json_decref(body);
    free(tail);
    free(url);
    return rc;
}

static int gh_delete_comment(struct scm_provider *p, const struct scm_ref *ref,
                             const char *comment_id, struct scm_result *res, struct err *err)
{
    struct github *gh = to_github(p);
    char *tail = tail_with("/issues/comments/", comment_id, "");
    char *url = repo_url(gh, ref->project, tail);
    int rc = github_rest_call(NULL, NULL, gh->auth, "DELETE", url, installation_of(gh, ref), NULL,
                              res, err);

    free(tail);
    free(url);
    return rc;
}

static void add_comment(struct scm_comment **list, size_t *n, size_t *cap, const json_t *c)
{
    const json_t *user = json_object_get(c, "user");
    const char *type = json_string_value(json_object_get(user, "type"));
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
    sc->author = xstrdup(json_string_value(json_object_get(user, "login")) != NULL
                             ? json_string_value(json_object_get(user, "login"))
                             : "");
    sc->by_bot = type != NULL && strcmp(type, "Bot") == 0;
    sc->body = xstrdup(json_string_value(json_object_get(c, "body")) != NULL
                           ? json_string_value(json_object_get(c, "body"))
                           : "");
}

static int gh_list_comments(struct scm_comment **out, size_t *n_out, struct scm_provider *p,
                            const struct scm_ref *ref, struct scm_result *res, struct err *err)
{
    struct github *gh = to_github(p);
    char *tail = xasprintf("/issues/%lld/comments?per_page=%d", (long long)ref->number, PAGE_SIZE);
    char *url = repo_url(gh, ref->project, tail);
    size_t cap = 0;
    int rc = E_OK;

    *out = NULL;
    *n_out = 0;
    free(tail);
    /* Every page, following Link: rel="next" (bots that read only page 1 post duplicates
     * once a thread passes 30 comments). */
    for (int page = 0; url != NULL && page < MAX_PAGES; page++) {
        json_t *arr = NULL, *c;
        char *next = NULL;
        size_t i;
        rc = github_rest_call(&arr, &next, gh->auth, "GET", url, installation_of(gh, ref), NULL,
                              res, err);
        free(url);
        url = next;
        if (rc == E_OK && url != NULL && !scm_url_under(gh->api_url, url)) {
            /* Our token goes to the configured API only, never where a Link points. */
            log_kv(LOG_ERROR, "github_link_refused", "project", ref->project, "why",
                   "rel=next leaves the configured api base", NULL);
            rc = err_set(err, E_FAIL, "comments of %s#%lld: next page link leaves the api base",
                         ref->project, (long long)ref->number);
        }
        if (rc != E_OK) {
            json_decref(arr);
            break;
        }
        json_array_foreach(arr, i, c)
        {
            add_comment(out, n_out, &cap, c);
        }
        json_decref(arr);
    }
    free(url);
    if (rc != E_OK) {
        scm_comments_free(*out, *n_out);
        *out = NULL;
        *n_out = 0;
    }
    return rc;
}

static int gh_permission_of(enum scm_level *out, struct scm_provider *p, const struct scm_ref *ref,
                            const char *user, int64_t user_id, struct scm_result *res,
                            struct err *err)
{
    struct github *gh = to_github(p);
    char *tail = tail_with("/collaborators/", user, "/permission");
    char *url = repo_url(gh, ref->project, tail);
    json_t *ans = NULL;
    int rc = github_rest_call(&ans, NULL, gh->auth, "GET", url, installation_of(gh, ref), NULL, res,
                              err);
    const char *role, *perm;

    (void)user_id;
    *out = SCM_LEVEL_NONE;
    if (rc == E_NOTFOUND) {
        rc = E_OK; /* not a collaborator */
    } else if (rc == E_OK) {
        /* role_name tells maintain and triage apart; permission folds them. */
        role = json_string_value(json_object_get(ans, "role_name"));
        perm = json_string_value(json_object_get(ans, "permission"));
        if ((role == NULL || scm_level_parse(out, role) != E_OK) &&
            (perm == NULL || scm_level_parse(out, perm) != E_OK)) {
            *out = SCM_LEVEL_NONE;
        }
    }
    json_decref(ans);
    free(tail);
    free(url);
    return rc;
}

static int gh_pull_info(struct scm_pull *out, struct scm_provider *p, const struct scm_ref *ref,
                        struct scm_result *res, struct err *err)
{
    struct github *gh = to_github(p);
    char *tail = xasprintf("/pulls/%lld", (long long)ref->number);
    char *url = repo_url(gh, ref->project, tail);
    json_t *ans = NULL;
    int rc = github_rest_call(&ans, NULL, gh->auth, "GET", url, installation_of(gh, ref), NULL, res,
                              err);

    memset(out, 0, sizeof(*out));
    if (rc == E_OK) {
        const json_t *head = json_object_get(ans, "head");
        const json_t *hrepo = json_object_get(head, "repo");
        const json_t *base = json_object_get(ans, "base");
        const char *hr = json_string_value(json_object_get(head, "ref"));
        const char *clone = json_string_value(json_object_get(hrepo, "clone_url"));
        const char *html = json_string_value(json_object_get(ans, "html_url"));
        const char *br = json_string_value(json_object_get(base, "ref"));
        const char *bclone =
            json_string_value(json_object_get(json_object_get(base, "repo"), "clone_url"));
        /* head.repo is null once the PR's fork is deleted. Never the base repository in
         * its place: that pushes the fork's branch name into the base repository. */
        bool gone = hrepo == NULL || json_is_null(hrepo);
        if (hr == NULL || (clone == NULL && !gone)) {
            rc = err_set(err, E_FAIL, "pull request %s#%lld has no head", ref->project,
                         (long long)ref->number);
        } else {
            out->head_ref = xstrdup(hr);
            out->head_gone = gone;
            out->clone_url = gone ? NULL : xstrdup(clone);
            out->html_url = html != NULL ? xstrdup(html) : NULL;
            out->base_ref = br != NULL ? xstrdup(br) : NULL;
            out->base_url = bclone != NULL ? xstrdup(bclone) : NULL;
        }
    }
    json_decref(ans);
    free(tail);
    free(url);
    return rc;
}

/* Decodes GitHub's base64 (with newlines every 60 characters). */
static int b64_decode(char **out, size_t *len_out, const char *in)
{
    size_t n = strlen(in);
    unsigned char *buf = xmalloc(n / 4 * 3 + 4);
    EVP_ENCODE_CTX *ctx = EVP_ENCODE_CTX_new();
    int a = 0, b = 0, ok;

    ASSERT(ctx != NULL);
    EVP_DecodeInit(ctx);
    ok = EVP_DecodeUpdate(ctx, buf, &a, (const unsigned char *)in, (int)n) >= 0 &&
         EVP_DecodeFinal(ctx, buf + a, &b) == 1;
    EVP_ENCODE_CTX_free(ctx);
    if (!ok) {
        free(buf);
        return E_INVALID;
    }
    buf[a + b] = '\0';
    *out = (char *)buf;
    *len_out = (size_t)(a + b);
    return E_OK;
}

static int gh_file_at(char **out, size_t *len_out, struct scm_provider *p,
                      const struct scm_ref *ref, const char *git_ref, const char *path,
                      struct scm_result *res, struct err *err)
{
    struct github *gh = to_github(p);
    char *eref = httpc_escape(git_ref);
    char *epath = scm_path_escape(path, true); /* the contents API keeps '/' in the path */
    char *tail = xasprintf("/contents/%s?ref=%s", epath, eref);
    char *url = repo_url(gh, ref->project, tail);
    json_t *ans = NULL;
    int rc = github_rest_call(&ans, NULL, gh->auth, "GET", url, installation_of(gh, ref), NULL, res,
                              err);

    *out = NULL;
    *len_out = 0;
    if (rc == E_OK) {
        const char *content = json_string_value(json_object_get(ans, "content"));
        const char *enc = json_string_value(json_object_get(ans, "encoding"));
        if (content == NULL || enc == NULL || strcmp(enc, "base64") != 0 ||
            b64_decode(out, len_out, content) != E_OK) {
            rc = err_set(err, E_FAIL, "%s at %s: not a base64 file", path, git_ref);
        }
    }
    json_decref(ans);
    free(eref);
    free(epath);
    free(tail);
    free(url);
    return rc;
}

/* The web URL of the open pull request of PROJECT from OWNER:HEAD, or NULL. */
static char *find_pull(struct github *gh, const struct scm_ref *ref, const char *head,
                       struct scm_result *res, struct err *err)
{
    size_t olen = strcspn(ref->project, "/");
    char *label = xasprintf("%.*s:%s", (int)olen, ref->project, head);
    char *elabel = httpc_escape(label);
    char *tail = xasprintf("/pulls?state=open&head=%s", elabel);
    char *url = repo_url(gh, ref->project, tail), *found = NULL;
    json_t *ans = NULL;
    int rc = github_rest_call(&ans, NULL, gh->auth, "GET", url, installation_of(gh, ref), NULL, res,
                              err);

    if (rc == E_OK && json_is_array(ans) && json_array_size(ans) > 0) {
        const char *html = json_string_value(json_object_get(json_array_get(ans, 0), "html_url"));
        found = html != NULL ? xstrdup(html) : NULL;
    }
    json_decref(ans);
    free(label);
    free(elabel);
    free(tail);
    free(url);
    return found;
}

/* POST /repos/{o}/{r}/pulls; a 422 (the PR exists, e.g. a retry after a crash) links the
 * one that is there instead of failing. */
static int gh_open_pull(char **url_out, struct scm_provider *p, const struct scm_ref *ref,
                        const struct scm_new_pull *pr, struct scm_result *res, struct err *err)
{
    struct github *gh = to_github(p);
    char *url = repo_url(gh, ref->project, "/pulls");
    json_t *body = json_pack("{s:s, s:s, s:s, s:s, s:b}", "title", pr->title, "head", pr->head,
                             "base", pr->base, "body", pr->body, "draft", pr->draft),
           *ans = NULL;
    int rc = github_rest_call(&ans, NULL, gh->auth, "POST", url, installation_of(gh, ref), body,
                              res, err);
    const char *html = json_string_value(json_object_get(ans, "html_url"));

    *url_out = NULL;
    if (rc == E_OK) {
        *url_out = html != NULL ? xstrdup(html) : NULL;
        rc = html != NULL ? E_OK : err_set(err, E_FAIL, "the created pull request has no html_url");
    } else if (rc == E_INVALID) {
        struct err ferr = {0};
        *url_out = find_pull(gh, ref, pr->head, res, &ferr);
        if (*url_out != NULL) {
            log_kv(LOG_INFO, "github_pull_exists", "project", ref->project, "url", *url_out, NULL);
            rc = E_OK;
        }
    }
    json_decref(ans);
    json_decref(body);
    free(url);
    return rc;
}

/* Asks GitHub who we are: GET /user with a PAT, GET /app with the app JWT for an app
 * (whose comments are by "<slug>[bot]"). *out: new string. */
static int ask_login(char **out, struct github *gh, bool app, struct err *err)
{
    char *url = xasprintf("%s/%s", gh->api_url, app ? "app" : "user");
    json_t *ans = NULL;
    const char *name;
    int rc = github_rest_call(&ans, NULL, gh->auth, "GET", url, 0, NULL, NULL, err);

    *out = NULL;
    name = json_string_value(json_object_get(ans, app ? "slug" : "login"));
    if (rc == E_OK && (name == NULL || name[0] == '\0')) {
        rc = err_set(err, E_FAIL, "GET /%s: the answer names no %s", app ? "app" : "user",
                     app ? "slug" : "login");
    }
    if (rc == E_OK) {
        *out = app ? xasprintf("%s[bot]", name) : xstrdup(name);
    }
    json_decref(ans);
    free(url);
    return rc;
}

/* A login learnt as a PAT's user no longer names the bot once the credentials became an
 * App (the one-click setup): it is learnt again from GET /app. Under gh->mu. */
static void retire_login(struct github *gh, bool app)
{
    if (gh->login_configured || gh->bot_login == NULL || gh->login_app == app) {
        return;
    }
    gh->retired = xrealloc(gh->retired, (gh->n_retired + 1) * sizeof(*gh->retired));
    gh->retired[gh->n_retired++] = gh->bot_login;
    gh->bot_login = NULL;
    gh->login_failures = 0;
    gh->login_next_ms = 0;
}

static const char *gh_bot_login(struct scm_provider *p)
{
    struct github *gh = to_github(p);
    int64_t now = clock_now_ms(clock_system());
    bool app = github_auth_is_app(gh->auth);
    const char *login;

    pthread_mutex_lock(&gh->mu);
    retire_login(gh, app);
    if (gh->bot_login == NULL && now >= gh->login_next_ms) {
        struct err err = {0};
        char *got = NULL;
        if (ask_login(&got, gh, app, &err) == E_OK) {
            gh->bot_login = got;
            gh->login_app = app;
            log_kv(LOG_INFO, "github_bot_login", "login", got, NULL);
        } else {
            /* Unknown until asked again: meanwhile the notifier adopts and folds nothing. */
            int64_t delay = LOGIN_RETRY_MIN_MS;
            char d[32];
            for (int i = 0; i < gh->login_failures && delay < LOGIN_RETRY_MAX_MS; i++) {
                delay *= 2;
            }
            delay = delay < LOGIN_RETRY_MAX_MS ? delay : LOGIN_RETRY_MAX_MS;
            gh->login_failures++;
            gh->login_next_ms = now + delay;
            snprintf(d, sizeof(d), "%lld", (long long)delay);
            log_kv(LOG_WARN, "github_bot_login_unknown", "retry_ms", d, "error", err.msg, NULL);
        }
    }
    login = gh->bot_login;
    pthread_mutex_unlock(&gh->mu);
    return login;
}

static void gh_free(struct scm_provider *p)
{
    struct github *gh = to_github(p);

    github_auth_free(gh->auth);
    free(gh->api_url);
    free(gh->bot_login);
    for (size_t i = 0; i < gh->n_retired; i++) {
        free(gh->retired[i]);
    }
    free(gh->retired);
    free(gh->inst_project);
    pthread_mutex_destroy(&gh->mu);
    free(gh);
}

static const struct scm_provider_ops github_ops = {
    .name = "github",
    .react = gh_react,
    .post_comment = gh_post_comment,
    .update_comment = gh_update_comment,
    .delete_comment = gh_delete_comment,
    .list_comments = gh_list_comments,
    .permission_of = gh_permission_of,
    .pull_info = gh_pull_info,
    .file_at = gh_file_at,
    .open_pull = gh_open_pull,
    .bot_login = gh_bot_login,
    .free = gh_free,
};

int github_provider_new(struct scm_provider **out, const struct github_config *cfg,
                        struct github_auth *auth, struct err *err)
{
    struct github *gh = xcalloc(1, sizeof(*gh));
    size_t n;

    (void)err;
    gh->base.ops = &github_ops;
    gh->api_url = xstrdup(cfg->api_url);
    n = strlen(gh->api_url);
    if (n > 0 && gh->api_url[n - 1] == '/') {
        gh->api_url[n - 1] = '\0';
    }
    gh->auth = auth;
    gh->login_configured = cfg->bot_login != NULL && cfg->bot_login[0] != '\0';
    gh->bot_login = gh->login_configured ? xstrdup(cfg->bot_login) : NULL;
    pthread_mutex_init(&gh->mu, NULL);
    *out = &gh->base;
    return E_OK;
}
