/* SPDX-License-Identifier: Apache-2.0 */
/* One GitHub REST call: credentials from github_auth (wiped after use), the answer's status
 * mapped to our codes with GitHub's rate-limit signals turned into retry hints, the JSON
 * body parsed and the Link header's next page found. */
#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/httpc.h"
#include "scm/github/github_auth.h"
#include "scm/github/github_int.h"

/* Whether an answer with status ST is GitHub's rate limit: 429, or a 403 that says so. */
static bool is_rate_limited(long st, const char *retry, const char *remaining,
                            const struct httpc_response *r)
{
    if (st == 429) {
        return true;
    }
    return st == 403 && (retry != NULL || (remaining != NULL && strcmp(remaining, "0") == 0) ||
                         (r->body.data != NULL && strstr(r->body.data, "rate limit") != NULL));
}

/* Our code for a non-2xx, non-rate-limit status ST. */
static int status_error(long st, const char *what, struct err *err)
{
    if (st >= 500) {
        return err_set(err, E_AGAIN, "%s: GitHub answered %ld", what, st);
    }
    if (st == 404) {
        return err_set(err, E_NOTFOUND, "%s: not found", what);
    }
    if (st == 401 || st == 403) {
        return err_set(err, E_DENIED, "%s: GitHub answered %ld", what, st);
    }
    if (st == 422) {
        return err_set(err, E_INVALID, "%s: GitHub refused it (422)", what);
    }
    return err_set(err, E_FAIL, "%s: GitHub answered %ld", what, st);
}

/* Fills RES from the answer and maps it to our codes. */
static int classify(struct scm_result *res, const struct httpc_response *r, const char *what,
                    struct err *err)
{
    const char *retry = httpc_response_header(r, "retry-after");
    const char *remaining = httpc_response_header(r, "x-ratelimit-remaining");
    const char *reset = httpc_response_header(r, "x-ratelimit-reset");
    long st = r->status;

    res->status = (int)st;
    res->retry_after_ms = retry != NULL ? strtoll(retry, NULL, 10) * 1000 : 0;
    if (st >= 200 && st < 300) {
        return E_OK;
    }
    if (res->retry_after_ms == 0 && remaining != NULL && strcmp(remaining, "0") == 0 &&
        reset != NULL) {
        int64_t wait = strtoll(reset, NULL, 10) * 1000 - clock_now_ms(clock_system());
        res->retry_after_ms = wait > 0 ? wait : 1000;
    }
    if (is_rate_limited(st, retry, remaining, r)) {
        res->rate_limited = true;
        return err_set(err, E_AGAIN, "%s: rate limited (HTTP %ld)", what, st);
    }
    return status_error(st, what, err);
}

/* The rel="next" URL of R's Link header as a new string, or NULL. */
static char *next_link(const struct httpc_response *r)
{
    const char *link = httpc_response_header(r, "link");
    const char *rel = link != NULL ? strstr(link, "rel=\"next\"") : NULL;
    const char *end = rel, *start;

    if (rel == NULL) {
        return NULL;
    }
    /* <url>; rel="next": the URL is the <...> just before. */
    while (end > link && *end != '>') {
        end--;
    }
    start = end;
    while (start > link && *start != '<') {
        start--;
    }
    if (*start == '<' && end > start) {
        return xstrndup(start + 1, (size_t)(end - start - 1));
    }
    return NULL;
}

/* Frees a string that held a credential, wiping it first. */
static void free_wiped(char *s)
{
    if (s != NULL) {
        memset(s, 0, strlen(s));
    }
    free(s);
}

/* Sends METHOD URL with the installation's credentials and the JSON text BODY (may be
 * NULL); *R is the answer, classified into RES. */
static int send_request(struct httpc_response *r, struct github_auth *gh_auth, const char *method,
                        const char *url, int64_t installation, const char *body,
                        struct scm_result *res, struct err *err)
{
    struct httpc_request req = HTTPC_REQUEST_DEFAULTS;
    char *auth = NULL, *authz;
    const char *headers[6] = {"Accept: application/vnd.github+json",
                              "X-GitHub-Api-Version: 2022-11-28",
                              "Content-Type: application/json",
                              NULL,
                              NULL,
                              NULL};
    int rc;

    rc = github_auth_header(&auth, gh_auth, installation, err);
    if (rc != E_OK) {
        return rc;
    }
    authz = xasprintf("Authorization: %s", auth);
    headers[3] = authz;
    req.method = method;
    req.url = url;
    req.headers = headers;
    req.body = body;
    req.body_len = body != NULL ? strlen(body) : 0;
    rc = httpc_request(r, &req, err);
    if (rc == E_OK) {
        rc = classify(res, r, method, err);
        if (r->status == 401) {
            github_auth_invalidate(gh_auth, installation);
        }
    }
    free_wiped(auth);
    free_wiped(authz);
    return rc;
}

int github_rest_call(json_t **json_out, char **next_out, struct github_auth *auth,
                     const char *method, const char *url, int64_t installation, const json_t *body,
                     struct scm_result *res, struct err *err)
{
    struct httpc_response r = {0}; /* stays empty when no request was sent */
    struct scm_result local = {0};
    char *text = NULL;
    int rc;

    if (res == NULL) {
        res = &local;
    }
    memset(res, 0, sizeof(*res));
    if (json_out != NULL) {
        *json_out = NULL;
    }
    if (next_out != NULL) {
        *next_out = NULL;
    }
    if (body != NULL) {
        text = json_dumps(body, JSON_COMPACT);
    }
    rc = send_request(&r, auth, method, url, installation, text, res, err);
    if (rc == E_OK && json_out != NULL && r.body.len > 0) {
        *json_out = json_loadb(r.body.data, r.body.len, 0, NULL);
        if (*json_out == NULL) {
            rc = err_set(err, E_FAIL, "%s %s: the answer is not JSON", method, url);
        }
    }
    if (rc == E_OK && next_out != NULL) {
        *next_out = next_link(&r);
    }
    httpc_response_cleanup(&r);
    free(text);
    return rc;
}
