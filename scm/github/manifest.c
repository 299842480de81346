/* SPDX-License-Identifier: Apache-2.0 */
/* The one-click GitHub App (GitHub's App manifest flow): the manifest the setup page posts
 * to GitHub, and the exchange of the code GitHub hands back for the new App's id, private
 * key and webhook secret. Every field of GitHub's answer is checked before anything keeps
 * it; the key and the secret are wiped wherever this file held them. */
#include <inttypes.h>
#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/httpc.h"
#include "scm/github/github.h"
#include "scm/github/github_int.h"

#define CONVERT_TIMEOUT_MS 20000
#define CONVERT_MAX_BODY (64u * 1024u)
#define PEM_MAX (16u * 1024u)
#define SECRET_MAX 256
#define SLUG_MAX 100
#define URL_MAX 2048
#define MESSAGE_MAX 160

bool github_manifest_code_valid(const char *code)
{
    size_t n = code != NULL ? strlen(code) : 0;

    return n > 0 && n <= GITHUB_MANIFEST_CODE_MAX &&
           strspn(code, "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_-") == n;
}

char *github_manifest_json(const struct github_manifest *m)
{
    json_t *doc = json_pack(
        "{s:s, s:s, s:s, s:{s:s, s:b}, s:s, s:b, s:{s:s, s:s, s:s, s:s}, s:[s, s]}", "name",
        m->name, "url", m->url, "description", m->description, "hook_attributes", "url",
        m->hook_url, "active", 1, "redirect_url", m->redirect_url, "public", 0,
        "default_permissions", "issues", "write", "pull_requests", "write", "contents", "write",
        "metadata", "read", "default_events", "issue_comment", "pull_request_review_comment");
    char *text;

    ASSERT(doc != NULL);
    text = json_dumps(doc, JSON_COMPACT | JSON_SORT_KEYS);
    ASSERT(text != NULL);
    json_decref(doc);
    return text;
}

void github_app_grant_cleanup(struct github_app_grant *g)
{
    if (g->pem != NULL) {
        OPENSSL_cleanse(g->pem, strlen(g->pem));
    }
    if (g->webhook_secret != NULL) {
        OPENSSL_cleanse(g->webhook_secret, strlen(g->webhook_secret));
    }
    free(g->id);
    free(g->slug);
    free(g->html_url);
    free(g->pem);
    free(g->webhook_secret);
    memset(g, 0, sizeof(*g));
}

/* GitHub's "message" of an error answer, one printable line, into MSG. */
static void answer_message(char msg[MESSAGE_MAX], const struct buf *body)
{
    json_t *root = json_loadb(body->data != NULL ? body->data : "", body->len, 0, NULL);
    const char *m = json_string_value(json_object_get(root, "message"));
    size_t i = 0;

    for (; m != NULL && m[i] != '\0' && i + 1 < MESSAGE_MAX; i++) {
        msg[i] = m[i] >= 0x20 && m[i] < 0x7f ? m[i] : ' ';
    }
    msg[i] = '\0';
    json_decref(root);
}

/* Visible ASCII only (no space, no control byte), 1..MAX bytes, none of REJECT. */
static bool plain_token(const char *s, size_t max, const char *reject)
{
    size_t n = s != NULL ? strlen(s) : 0;

    if (n == 0 || n > max) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] < 0x21 || s[i] > 0x7e || strchr(reject, s[i]) != NULL) {
            return false;
        }
    }
    return true;
}

/* The key and secret of ROOT, checked, into G. Jansson frees without wiping, so its
 * copies are wiped in place. */
static int take_secrets(struct github_app_grant *g, json_t *root, struct err *err)
{
    json_t *pem = json_object_get(root, "pem"), *sec = json_object_get(root, "webhook_secret");
    const char *p = json_string_value(pem), *w = json_string_value(sec);
    EVP_PKEY *key = NULL;
    int rc = E_OK;

    if (p == NULL || strlen(p) > PEM_MAX) {
        rc = err_set(err, E_FAIL, "github's answer has no private key (pem)");
    } else if (github_key_parse(&key, p, strlen(p), "(from github)", err) != E_OK) {
        rc = E_FAIL;
    } else if (!plain_token(w, SECRET_MAX, ",")) {
        /* ',' separates secrets for rotation: one inside would split this one. */
        rc = err_set(err, E_FAIL, "github's answer has no usable webhook_secret");
    } else {
        g->pem = xstrdup(p);
        g->webhook_secret = xstrdup(w);
    }
    EVP_PKEY_free(key);
    if (p != NULL) {
        OPENSSL_cleanse((void *)(uintptr_t)p, json_string_length(pem));
    }
    if (w != NULL) {
        OPENSSL_cleanse((void *)(uintptr_t)w, json_string_length(sec));
    }
    return rc;
}

static int parse_grant(struct github_app_grant *g, const struct buf *body, struct err *err)
{
    json_t *root = json_loadb(body->data != NULL ? body->data : "", body->len, 0, NULL);
    json_t *id = json_object_get(root, "id");
    const char *slug = json_string_value(json_object_get(root, "slug"));
    const char *html = json_string_value(json_object_get(root, "html_url"));
    int rc;

    if (!json_is_integer(id) || json_integer_value(id) <= 0) {
        json_decref(root);
        return err_set(err, E_FAIL, "github's answer has no app id");
    }
    rc = take_secrets(g, root, err);
    if (rc == E_OK) {
        g->id = xasprintf("%" PRId64, (int64_t)json_integer_value(id));
        /* Shown on the page (escaped): kept only when they look like what GitHub sends. */
        if (slug != NULL && strlen(slug) <= SLUG_MAX && github_valid_login(slug, false)) {
            g->slug = xstrdup(slug);
        }
        if (html != NULL && plain_token(html, URL_MAX, "\"'<>\\`") &&
            (strncmp(html, "https://", 8) == 0 || strncmp(html, "http://", 7) == 0)) {
            g->html_url = xstrdup(html);
        }
    }
    json_decref(root);
    return rc;
}

/* Our code for a non-201 answer of the conversion. */
static int convert_status(const struct httpc_response *resp, struct err *err)
{
    char msg[MESSAGE_MAX];
    long st = resp->status;

    answer_message(msg, &resp->body);
    if (st == 404) {
        return err_set(err, E_NOTFOUND,
                       "github knows no such code (used already, or older "
                       "than an hour)");
    }
    return err_set(err, st == 429 || st >= 500 ? E_AGAIN : E_DENIED,
                   "github refused the code: http %ld%s%s", st, msg[0] != '\0' ? ": " : "", msg);
}

int github_manifest_convert(struct github_app_grant *out, const char *api_url, const char *code,
                            struct err *err)
{
    struct httpc_request req = HTTPC_REQUEST_DEFAULTS;
    struct httpc_response resp;
    const char *headers[] = {"Accept: application/vnd.github+json",
                             "X-GitHub-Api-Version: 2022-11-28", NULL};
    size_t n = strlen(api_url);
    char *url;
    int rc;

    memset(out, 0, sizeof(*out));
    if (!github_manifest_code_valid(code)) {
        return err_set(err, E_INVALID, "the code is not one GitHub makes");
    }
    while (n > 0 && api_url[n - 1] == '/') {
        n--;
    }
    url = xasprintf("%.*s/app-manifests/%s/conversions", (int)n, api_url, code);
    httpc_response_init(&resp);
    req.method = "POST";
    req.url = url;
    req.headers = headers;
    req.timeout_ms = CONVERT_TIMEOUT_MS;
    req.max_body = CONVERT_MAX_BODY;
    rc = httpc_request(&resp, &req, err);
    if (rc == E_OK && resp.status != 201 && resp.status != 200) {
        rc = convert_status(&resp, err);
    } else if (rc == E_OK) {
        rc = parse_grant(out, &resp.body, err);
    }
    if (resp.body.data != NULL) {
        OPENSSL_cleanse(resp.body.data, resp.body.cap);
    }
    httpc_response_cleanup(&resp);
    free(url);
    if (rc != E_OK) {
        github_app_grant_cleanup(out);
    }
    return rc;
}
