/* SPDX-License-Identifier: Apache-2.0 */
/* GitHub credentials: App JWTs (signed by auth_key.c), the installation-token exchange
 * and its per-installation cache, or a plain PAT, or none yet. The credentials may turn
 * into an App while the server runs (the one-click setup); they are read and replaced
 * under the object's mutex. Invariant: at most one exchange per installation is in
 * flight, a token exchanged with replaced credentials is never cached, and every secret
 * this file allocates is wiped before it is freed. */
#include <inttypes.h>
#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/httpc.h"
#include "scm/github/github_auth.h"
#include "scm/github/github_int.h"

#define APP_ID_MAX 128
#define API_URL_MAX 2048
#define TOKEN_MAX 4096
#define EXCHANGE_MAX_BODY (64u * 1024u)
#define EXCHANGE_TIMEOUT_MS 15000
#define GH_MESSAGE_MAX 160

/* The cached token of one installation. Lives in github_auth.inst; guarded by mu. */
struct gh_install {
    int64_t id;                 /* installation id, > 0 */
    char *token;                /* owned secret, wiped when dropped; NULL when none */
    int64_t refresh_at_ms;      /* epoch ms after which the token is exchanged again */
    bool in_flight;             /* one caller is exchanging now (without mu held) */
    unsigned waiters;           /* callers holding a pointer to this entry */
    uint64_t gen;               /* exchanges completed, to tell waiters one finished */
    int last_rc;                /* result of the last exchange, E_OK or negative */
    char last_msg[ERR_MSG_MAX]; /* its error message, shared with the waiters */
};

struct github_auth {
    atomic_uint refs;          /* references; the last github_auth_free frees */
    pthread_mutex_t mu;        /* guards every field below */
    char *pat;                 /* owned secret; set for a PAT, NULL for an app or none */
    char *api_url;             /* owned; no trailing '/'; NULL unless an app */
    char *app_id;              /* owned; the JWT's iss; NULL unless an app */
    EVP_PKEY *key;             /* owned RSA private key; NULL unless an app */
    const struct clock *clock; /* borrowed; NULL unless an app */
    uint64_t cred_gen;         /* bumped when the credentials are replaced */
    pthread_cond_t cv;         /* broadcast when an exchange finishes */
    struct gh_install **inst;  /* owned array of owned entries */
    size_t n_inst;             /* entries in use */
    size_t cap_inst;           /* entries allocated */
};

static void free_secret(char *s)
{
    if (s != NULL) {
        OPENSSL_cleanse(s, strlen(s));
        free(s);
    }
}

static char *bearer(const char *token)
{
    return xasprintf("Bearer %s", token);
}

/* Bytes that may go in an HTTP header value unquoted: visible ASCII only. */
static bool header_safe(const char *s)
{
    for (; *s != '\0'; s++) {
        if (*s < 0x21 || *s > 0x7e) {
            return false;
        }
    }
    return true;
}

/* ---- construction ---- */

static struct github_auth *auth_alloc(void)
{
    struct github_auth *a = xcalloc(1, sizeof(*a));

    atomic_init(&a->refs, 1);
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    return a;
}

void github_auth_new_none(struct github_auth **out)
{
    *out = auth_alloc();
}

struct github_auth *github_auth_ref(struct github_auth *a)
{
    atomic_fetch_add(&a->refs, 1);
    return a;
}

int github_auth_new_token(struct github_auth **out, const char *token, struct err *err)
{
    struct github_auth *a;

    *out = NULL;
    if (token == NULL || token[0] == '\0' || strlen(token) > TOKEN_MAX) {
        return err_set(err, E_INVALID, "github token is empty or too long");
    }
    if (!header_safe(token)) {
        return err_set(err, E_INVALID, "github token holds spaces or control characters");
    }
    a = auth_alloc();
    a->pat = xstrdup(token);
    *out = a;
    return E_OK;
}

static int check_app_id(const char *id, struct err *err)
{
    size_t len = id != NULL ? strlen(id) : 0;

    if (len == 0 || len > APP_ID_MAX) {
        return err_set(err, E_INVALID, "github app id is empty or too long");
    }
    /* It goes into the JWT's JSON as is, so keep to the characters ids and client ids use. */
    if (strspn(id, "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz._-") != len) {
        return err_set(err, E_INVALID, "github app id %s: only letters, digits, '.', '_', '-'", id);
    }
    return E_OK;
}

static int dup_api_url(char **out, const char *url, struct err *err)
{
    size_t len;

    *out = NULL;
    if (url == NULL || url[0] == '\0') {
        url = GITHUB_AUTH_DEFAULT_API_URL;
    }
    len = strlen(url);
    if ((strncmp(url, "https://", 8) != 0 && strncmp(url, "http://", 7) != 0) ||
        len > API_URL_MAX || !header_safe(url)) {
        return err_set(err, E_INVALID, "github api url must be an http(s) url");
    }
    while (len > 0 && url[len - 1] == '/') {
        len--;
    }
    *out = xstrndup(url, len);
    return E_OK;
}

/* Drops every cached installation token (under a->mu): they belong to the credentials
 * being replaced. An exchange in flight sees cred_gen change and caches nothing. */
static void install_drop_all(struct github_auth *a);

int github_auth_use_app(struct github_auth *a, const char *api_url, const char *app_id,
                        const char *key_file, const struct clock *clock, struct err *err)
{
    char *url = NULL, *id = NULL, *pat;
    EVP_PKEY *key = NULL, *old_key;
    int rc;

    ASSERT(clock != NULL);
    rc = check_app_id(app_id, err);
    if (rc == E_OK) {
        rc = dup_api_url(&url, api_url, err);
    }
    if (rc == E_OK) {
        rc = github_key_load(&key, key_file, err);
    }
    if (rc != E_OK) {
        free(url);
        return rc;
    }
    id = xstrdup(app_id);
    pthread_mutex_lock(&a->mu);
    pat = a->pat;
    old_key = a->key;
    free(a->api_url);
    free(a->app_id);
    a->pat = NULL;
    a->api_url = url;
    a->app_id = id;
    a->key = key;
    a->clock = clock;
    a->cred_gen++;
    install_drop_all(a);
    pthread_mutex_unlock(&a->mu);
    free_secret(pat);
    EVP_PKEY_free(old_key); /* a JWT being signed holds its own reference */
    return E_OK;
}

int github_auth_new_app(struct github_auth **out, const char *api_url, const char *app_id,
                        const char *key_file, const struct clock *clock, struct err *err)
{
    struct github_auth *a = auth_alloc();
    int rc = github_auth_use_app(a, api_url, app_id, key_file, clock, err);

    *out = NULL;
    if (rc != E_OK) {
        github_auth_free(a);
        return rc;
    }
    *out = a;
    return E_OK;
}

/* VALUE of the first non-empty of FLAG and the environment variable ENV, or NULL. */
static const char *flag_or_env(const char *flag, const char *env)
{
    const char *v = flag != NULL && flag[0] != '\0' ? flag : getenv(env);

    return v != NULL && v[0] != '\0' ? v : NULL;
}

int github_auth_from_config(struct github_auth **out, const char *api_url, const char *app_id,
                            const char *key_file, const struct clock *clock, struct err *err)
{
    const char *id = flag_or_env(app_id, "DIVERGE_GITHUB_APP_ID");
    const char *key = flag_or_env(key_file, "DIVERGE_GITHUB_APP_KEY_FILE");
    const char *token;

    *out = NULL;
    if (id != NULL && key != NULL) {
        return github_auth_new_app(out, api_url, id, key, clock, err);
    }
    if (id != NULL || key != NULL) {
        return err_set(err, E_INVALID, "%s without %s",
                       id != NULL ? "--github-app-id" : "--github-app-key-file",
                       id != NULL ? "--github-app-key-file" : "--github-app-id");
    }
    token = flag_or_env(NULL, "DIVERGE_NOTIFIER_TOKEN");
    if (token == NULL) {
        token = flag_or_env(NULL, "GITHUB_TOKEN");
    }
    if (token == NULL) {
        return err_set(err, E_NOTFOUND, "no github credentials: neither an app nor a token");
    }
    return github_auth_new_token(out, token, err);
}

bool github_auth_is_app(struct github_auth *a)
{
    bool app;

    pthread_mutex_lock(&a->mu);
    app = a->key != NULL;
    pthread_mutex_unlock(&a->mu);
    return app;
}

bool github_auth_has_credentials(struct github_auth *a)
{
    bool any;

    pthread_mutex_lock(&a->mu);
    any = a->key != NULL || a->pat != NULL;
    pthread_mutex_unlock(&a->mu);
    return any;
}

void github_auth_free(struct github_auth *a)
{
    if (a == NULL || atomic_fetch_sub(&a->refs, 1) != 1) {
        return;
    }
    for (size_t i = 0; i < a->n_inst; i++) {
        ASSERT(!a->inst[i]->in_flight && a->inst[i]->waiters == 0);
        free_secret(a->inst[i]->token);
        free(a->inst[i]);
    }
    free(a->inst);
    free_secret(a->pat);
    free(a->api_url);
    free(a->app_id);
    EVP_PKEY_free(a->key); /* libcrypto clears the key's numbers when freeing them */
    pthread_cond_destroy(&a->cv);
    pthread_mutex_destroy(&a->mu);
    free(a);
}

/* ---- the app JWT ---- */

int github_auth_app_jwt(char **jwt_out, struct github_auth *a, struct err *err)
{
    char claims[APP_ID_MAX + 96];
    EVP_PKEY *key;
    int64_t now_s;
    int rc;

    *jwt_out = NULL;
    /* The key and id are taken together under the lock; signing happens outside it, with
     * a reference of our own to the key in case the credentials are replaced meanwhile. */
    pthread_mutex_lock(&a->mu);
    key = a->key;
    if (key != NULL) {
        EVP_PKEY_up_ref(key);
        now_s = clock_now_ms(a->clock) / 1000;
        snprintf(claims, sizeof(claims), "{\"iat\":%" PRId64 ",\"exp\":%" PRId64 ",\"iss\":\"%s\"}",
                 now_s - GITHUB_AUTH_JWT_BACKDATE_S, now_s + GITHUB_AUTH_JWT_LIFETIME_S, a->app_id);
    }
    pthread_mutex_unlock(&a->mu);
    if (key == NULL) {
        return err_set(err, E_INVALID, "github credentials are not an app");
    }
    rc = github_jwt_rs256(jwt_out, key, claims, err);
    EVP_PKEY_free(key);
    return rc;
}

/* ---- the installation token exchange ---- */

/* GitHub's "message" of an error answer, made one printable line, into MSG. */
static void gh_message(char msg[GH_MESSAGE_MAX], const struct buf *body)
{
    json_t *root = json_loadb(body->data != NULL ? body->data : "", body->len, 0, NULL);
    const char *m = json_string_value(json_object_get(root, "message"));
    size_t i = 0;

    for (; m != NULL && m[i] != '\0' && i + 1 < GH_MESSAGE_MAX; i++) {
        msg[i] = m[i] >= 0x20 && m[i] < 0x7f ? m[i] : ' ';
    }
    msg[i] = '\0';
    json_decref(root);
}

static int status_error(const struct httpc_response *resp, int64_t id, struct err *err)
{
    char msg[GH_MESSAGE_MAX];
    long st = resp->status;
    int code = E_FAIL;

    if (st == 401 || st == 403 || st == 404) {
        code = E_DENIED;
    } else if (st == 429 || st >= 500) {
        code = E_AGAIN;
    }
    gh_message(msg, &resp->body);
    return err_set(err, code, "github installation %" PRId64 " token exchange: http %ld%s%s", id,
                   st, msg[0] != '\0' ? ": " : "", msg);
}

/* Takes token and expires_at out of a 201 answer. Jansson frees without wiping, so its
 * copy of the token is wiped in place here; the caller wipes BODY. */
static int parse_grant(char **token_out, int64_t *expires_ms_out, struct buf *body, int64_t id,
                       struct err *err)
{
    json_t *root = json_loadb(body->data != NULL ? body->data : "", body->len, 0, NULL);
    json_t *tok = json_object_get(root, "token");
    const char *t = json_string_value(tok);
    const char *exp = json_string_value(json_object_get(root, "expires_at"));
    int rc = E_OK;

    *token_out = NULL;
    if (t == NULL || t[0] == '\0' || strlen(t) > TOKEN_MAX || !header_safe(t)) {
        rc = err_set(err, E_FAIL, "github installation %" PRId64 ": answer has no token", id);
        goto out;
    }
    if (exp == NULL || clock_parse_rfc3339(expires_ms_out, exp) != E_OK) {
        rc = err_set(err, E_FAIL, "github installation %" PRId64 ": answer has no expires_at", id);
        goto out;
    }
    *token_out = xstrdup(t);
out:
    if (t != NULL) {
        OPENSSL_cleanse((void *)(uintptr_t)t, json_string_length(tok));
    }
    json_decref(root);
    return rc;
}

/* POST URL (the installation's access_tokens endpoint) with the app JWT. */
static int exchange(char **token_out, int64_t *expires_ms_out, struct github_auth *a, int64_t id,
                    const char *url, struct err *err)
{
    struct httpc_request req = HTTPC_REQUEST_DEFAULTS;
    struct httpc_response resp;
    char *jwt = NULL, *auth = NULL;
    const char *headers[5] = {NULL};
    int rc;

    *token_out = NULL;
    httpc_response_init(&resp);
    rc = github_auth_app_jwt(&jwt, a, err);
    if (rc != E_OK) {
        goto out;
    }
    auth = xasprintf("Authorization: Bearer %s", jwt);
    headers[0] = auth;
    headers[1] = "Accept: application/vnd.github+json";
    headers[2] = "X-GitHub-Api-Version: 2022-11-28";
    headers[3] = "User-Agent: " HTTPC_USER_AGENT;
    req.method = "POST";
    req.url = url;
    req.headers = headers;
    req.timeout_ms = EXCHANGE_TIMEOUT_MS;
    req.max_body = EXCHANGE_MAX_BODY;
    rc = httpc_request(&resp, &req, err);
    if (rc != E_OK) {
        goto out;
    }
    if (resp.status != 201 && resp.status != 200) {
        rc = status_error(&resp, id, err);
        goto out;
    }
    rc = parse_grant(token_out, expires_ms_out, &resp.body, id, err);
out:
    if (resp.body.data != NULL) {
        OPENSSL_cleanse(resp.body.data, resp.body.cap);
    }
    httpc_response_cleanup(&resp);
    free_secret(auth);
    free_secret(jwt);
    return rc;
}

/* ---- the per-installation cache (callers hold a->mu) ---- */

static void install_drop_token(struct gh_install *in)
{
    free_secret(in->token);
    in->token = NULL;
    in->refresh_at_ms = 0;
}

static void install_drop_all(struct github_auth *a)
{
    for (size_t i = 0; i < a->n_inst; i++) {
        install_drop_token(a->inst[i]);
    }
}

static struct gh_install *install_find(struct github_auth *a, int64_t id)
{
    for (size_t i = 0; i < a->n_inst; i++) {
        if (a->inst[i]->id == id) {
            return a->inst[i];
        }
    }
    return NULL;
}

/* Drops entries nobody uses whose token is stale or missing, so the cache holds only
 * installations in active use. */
static void install_sweep(struct github_auth *a, int64_t now_ms)
{
    size_t keep = 0;

    for (size_t i = 0; i < a->n_inst; i++) {
        struct gh_install *in = a->inst[i];
        if (!in->in_flight && in->waiters == 0 && in->refresh_at_ms <= now_ms) {
            install_drop_token(in);
            free(in);
        } else {
            a->inst[keep++] = in;
        }
    }
    a->n_inst = keep;
}

static struct gh_install *install_get(struct github_auth *a, int64_t id, int64_t now_ms)
{
    struct gh_install *in = install_find(a, id);

    if (in != NULL) {
        return in;
    }
    install_sweep(a, now_ms);
    if (a->n_inst == a->cap_inst) {
        a->cap_inst = a->cap_inst == 0 ? 4 : 2 * a->cap_inst;
        a->inst = xrealloc(a->inst, a->cap_inst * sizeof(*a->inst));
    }
    in = xcalloc(1, sizeof(*in));
    in->id = id;
    a->inst[a->n_inst++] = in;
    return in;
}

/* Runs one exchange for IN with a->mu released, then records its outcome for the
 * waiters. Called and returns with a->mu held, the credentials an app. */
static int install_refresh(char **header_out, struct github_auth *a, struct gh_install *in,
                           struct err *err)
{
    struct err local = {0};
    char *token = NULL;
    char *url = xasprintf("%s/app/installations/%" PRId64 "/access_tokens", a->api_url, in->id);
    uint64_t cred_gen = a->cred_gen;
    int64_t expires_ms = 0;
    int rc;

    in->in_flight = true;
    pthread_mutex_unlock(&a->mu);
    rc = exchange(&token, &expires_ms, a, in->id, url, &local);
    free(url);
    pthread_mutex_lock(&a->mu);
    in->in_flight = false;
    in->gen++;
    in->last_rc = rc;
    memcpy(in->last_msg, local.msg, sizeof(in->last_msg));
    if (rc == E_OK) {
        /* A token already inside the margin is still handed out once, never cached; so is
         * one exchanged with credentials replaced meanwhile. */
        *header_out = bearer(token);
        if (cred_gen == a->cred_gen) {
            install_drop_token(in);
            in->token = token;
            in->refresh_at_ms = expires_ms - GITHUB_AUTH_REFRESH_MARGIN_MS;
        } else {
            free_secret(token);
        }
    }
    pthread_cond_broadcast(&a->cv);
    return rc == E_OK ? E_OK : err_set(err, rc, "%s", local.msg);
}

static int install_header(char **header_out, struct github_auth *a, int64_t id, struct err *err)
{
    struct gh_install *in;
    uint64_t gen;
    int rc;

    pthread_mutex_lock(&a->mu);
    in = install_get(a, id, clock_now_ms(a->clock));
    in->waiters++;
    gen = in->gen;
    while (in->in_flight) {
        pthread_cond_wait(&a->cv, &a->mu);
    }
    if (in->token != NULL && clock_now_ms(a->clock) < in->refresh_at_ms) {
        *header_out = bearer(in->token);
        rc = E_OK;
    } else if (in->gen != gen && in->last_rc == E_OK && in->token != NULL) {
        /* Another caller's exchange just brought a token already inside the margin. */
        *header_out = bearer(in->token);
        rc = E_OK;
    } else if (in->gen != gen && in->last_rc != E_OK) {
        /* We waited for another caller's exchange and it failed: share its answer
         * rather than queueing up one more request to a GitHub that just refused. */
        rc = err_set(err, in->last_rc, "%s", in->last_msg);
    } else {
        rc = install_refresh(header_out, a, in, err);
    }
    in->waiters--;
    pthread_mutex_unlock(&a->mu);
    return rc;
}

int github_auth_header(char **header_out, struct github_auth *a, int64_t installation_id,
                       struct err *err)
{
    char *jwt = NULL;
    bool app;
    int rc;

    *header_out = NULL;
    pthread_mutex_lock(&a->mu);
    if (a->pat != NULL) {
        *header_out = bearer(a->pat);
    }
    app = a->key != NULL;
    pthread_mutex_unlock(&a->mu);
    if (*header_out != NULL) {
        return E_OK;
    }
    if (!app) {
        return err_set(err, E_DENIED, "no github credentials: neither an app nor a token");
    }
    if (installation_id < 0) {
        return err_set(err, E_INVALID, "github installation id %" PRId64 " is negative",
                       installation_id);
    }
    if (installation_id > 0) {
        return install_header(header_out, a, installation_id, err);
    }
    rc = github_auth_app_jwt(&jwt, a, err);
    if (rc == E_OK) {
        *header_out = bearer(jwt);
    }
    free_secret(jwt);
    return rc;
}

void github_auth_invalidate(struct github_auth *a, int64_t installation_id)
{
    struct gh_install *in;

    pthread_mutex_lock(&a->mu);
    in = install_find(a, installation_id);
    if (in != NULL) {
        install_drop_token(in);
    }
    pthread_mutex_unlock(&a->mu);
}
