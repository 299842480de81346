/* SPDX-License-Identifier: Apache-2.0 */
/* GitHub deliveries: the signature is checked on the raw bytes before anything parses
 * them; then only what the bot needs is taken from the payload. */
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonscan.h"
#include "common/secret.h"
#include "scm/github/github.h"

#define SIG_PREFIX "sha256="

struct github_webhook_mac {
    EVP_MAC_CTX **ctx;      /* owned; one HMAC-SHA256 per configured secret */
    size_t n;               /* entries in ctx */
    unsigned char want[32]; /* the signature the sender claims */
};

/* One HMAC implementation fetched for the process (a provider lookup per delivery costs
 * more than hashing a small payload); EVP_MAC objects may be shared between threads. */
static EVP_MAC *g_hmac;
static pthread_once_t g_hmac_once = PTHREAD_ONCE_INIT;

static void fetch_hmac(void)
{
    g_hmac = EVP_MAC_fetch(NULL, "HMAC", NULL);
}

/* The HMAC contexts keyed with the secrets last seen, one per non-empty secret: keying
 * one (two SHA-256 blocks and a digest fetched by name) cost more than hashing a whole
 * 8 KB delivery, so a delivery copies these instead. Rebuilt when the secrets change (the
 * GitHub App setup may set them while the server runs). */
static pthread_mutex_t g_keyed_mu = PTHREAD_MUTEX_INITIALIZER;
static char *g_keyed_secrets; /* owned; the secrets G_KEYED was keyed with */
static EVP_MAC_CTX **g_keyed; /* owned */
static size_t g_keyed_n;      /* entries in g_keyed */

static void keyed_reset(void)
{
    for (size_t i = 0; i < g_keyed_n; i++) {
        EVP_MAC_CTX_free(g_keyed[i]); /* wipes the key schedule */
    }
    free(g_keyed);
    g_keyed = NULL;
    g_keyed_n = 0;
    if (g_keyed_secrets != NULL) {
        secret_wipe(g_keyed_secrets, strlen(g_keyed_secrets));
        free(g_keyed_secrets);
        g_keyed_secrets = NULL;
    }
}

/* Keys one context per comma-separated secret of SECRETS into g_keyed. Caller holds
 * g_keyed_mu. */
static void keyed_build(const char *secrets)
{
    OSSL_PARAM params[2];
    const char *p = secrets;
    size_t count = 1;

    keyed_reset();
    g_keyed_secrets = xstrdup(secrets);
    for (const char *c = secrets; *c != '\0'; c++) {
        count += *c == ',';
    }
    g_keyed = xcalloc(count, sizeof(*g_keyed));
    pthread_once(&g_hmac_once, fetch_hmac);
    params[0] =
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)(uintptr_t) "SHA256", 0);
    params[1] = OSSL_PARAM_construct_end();
    while (g_hmac != NULL && p != NULL && *p != '\0') {
        const char *comma = strchr(p, ',');
        size_t n = comma != NULL ? (size_t)(comma - p) : strlen(p);
        EVP_MAC_CTX *ctx = n > 0 ? EVP_MAC_CTX_new(g_hmac) : NULL;

        if (ctx != NULL && EVP_MAC_init(ctx, (const unsigned char *)p, n, params) == 1) {
            g_keyed[g_keyed_n++] = ctx;
        } else {
            EVP_MAC_CTX_free(ctx);
        }
        p = comma != NULL ? comma + 1 : NULL;
    }
}

/* Copies into M one keyed context per secret of SECRETS. */
static void keyed_copy(struct github_webhook_mac *m, const char *secrets)
{
    pthread_mutex_lock(&g_keyed_mu);
    if (g_keyed_secrets == NULL || strcmp(g_keyed_secrets, secrets) != 0) {
        keyed_build(secrets);
    }
    m->ctx = xcalloc(g_keyed_n > 0 ? g_keyed_n : 1, sizeof(*m->ctx));
    for (size_t i = 0; i < g_keyed_n; i++) {
        EVP_MAC_CTX *ctx = EVP_MAC_CTX_dup(g_keyed[i]);
        if (ctx != NULL) {
            m->ctx[m->n++] = ctx;
        }
    }
    pthread_mutex_unlock(&g_keyed_mu);
}

int github_webhook_mac_new(struct github_webhook_mac **out, const char *secrets,
                           const char *sig_header, struct err *err)
{
    struct github_webhook_mac *m;

    *out = NULL;
    if (sig_header == NULL || strncmp(sig_header, SIG_PREFIX, strlen(SIG_PREFIX)) != 0) {
        return err_set(err, E_DENIED, "missing or malformed X-Hub-Signature-256");
    }
    m = xcalloc(1, sizeof(*m));
    if (secret_unhex(m->want, sizeof(m->want), sig_header + strlen(SIG_PREFIX)) != E_OK) {
        free(m);
        return err_set(err, E_DENIED, "missing or malformed X-Hub-Signature-256");
    }
    keyed_copy(m, secrets != NULL ? secrets : "");
    *out = m;
    return E_OK;
}

void github_webhook_mac_update(struct github_webhook_mac *m, const void *data, size_t len)
{
    for (size_t i = 0; i < m->n; i++) {
        (void)EVP_MAC_update(m->ctx[i], data, len);
    }
}

int github_webhook_mac_check(struct github_webhook_mac *m, struct err *err)
{
    unsigned char got[EVP_MAX_MD_SIZE];
    bool ok = false;

    for (size_t i = 0; i < m->n; i++) {
        size_t got_len = 0;
        if (EVP_MAC_final(m->ctx[i], got, &got_len, sizeof(got)) == 1) {
            /* CRYPTO_memcmp, not memcmp: no early exit telling how much of a forgery was
             * right. Every secret is tried, so timing does not tell which one matched. */
            ok |= got_len == sizeof(m->want) && CRYPTO_memcmp(got, m->want, sizeof(m->want)) == 0;
        }
    }
    OPENSSL_cleanse(got, sizeof(got));
    return ok ? E_OK : err_set(err, E_DENIED, "signature does not match any configured secret");
}

void github_webhook_mac_free(struct github_webhook_mac *m)
{
    if (m == NULL) {
        return;
    }
    for (size_t i = 0; i < m->n; i++) {
        EVP_MAC_CTX_free(m->ctx[i]); /* wipes the key schedule */
    }
    free(m->ctx);
    free(m);
}

int github_webhook_verify(const char *secrets, const char *sig_header, const char *body, size_t len,
                          struct err *err)
{
    struct github_webhook_mac *m = NULL;
    int rc = github_webhook_mac_new(&m, secrets, sig_header, err);

    if (rc != E_OK) {
        return rc;
    }
    github_webhook_mac_update(m, body, len);
    rc = github_webhook_mac_check(m, err);
    github_webhook_mac_free(m);
    return rc;
}

/* The fields the bot reads, picked in one pass over the delivery (no tree is built: most
 * of an 8 KB payload is never looked at). */
enum field {
    F_ACTION,
    F_ISSUE,
    F_NUMBER,
    F_PULL,
    F_COMMENT,
    F_COMMENT_ID,
    F_BODY,
    F_LOGIN,
    F_USER_TYPE,
    F_USER_ID,
    F_ASSOCIATION,
    F_PROJECT,
    F_OWNER,
    F_REPO_NAME,
    F_INSTALLATION,
    F_COUNT,
};

static const struct jsonscan_path g_fields[F_COUNT] = {
    [F_ACTION] = {"action"},
    [F_ISSUE] = {"issue"},
    [F_NUMBER] = {"issue.number"},
    [F_PULL] = {"issue.pull_request"},
    [F_COMMENT] = {"comment"},
    [F_COMMENT_ID] = {"comment.id"},
    [F_BODY] = {"comment.body"},
    [F_LOGIN] = {"comment.user.login"},
    [F_USER_TYPE] = {"comment.user.type"},
    [F_USER_ID] = {"comment.user.id"},
    [F_ASSOCIATION] = {"comment.author_association"},
    [F_PROJECT] = {"repository.full_name"},
    [F_OWNER] = {"repository.owner.login"},
    [F_REPO_NAME] = {"repository.name"},
    [F_INSTALLATION] = {"installation.id"},
};

static int missing(struct err *err, const char *field)
{
    return err_set(err, E_INVALID, "payload field %s is missing or has the wrong type", field);
}

static bool is_object(const struct jsonscan_value *v)
{
    return v->present && v->start[0] == '{';
}

/* GitHub's rules for names, checked before anything is stored: these strings become paths
 * of API calls, task annotations, namespaces and @mentions in replies. */
#define LOGIN_MAX 39
#define REPO_NAME_MAX 100
#define BOT_SUFFIX "[bot]"

static bool is_alnum(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

/* An account login: 1 to 39 of [A-Za-z0-9-], not starting with '-'; with ALLOW_BOT an
 * App's login may end in "[bot]". */
bool github_valid_login(const char *s, bool allow_bot)
{
    size_t n = strlen(s), sl = strlen(BOT_SUFFIX);

    if (allow_bot && n > sl && strcmp(s + n - sl, BOT_SUFFIX) == 0) {
        n -= sl;
    }
    if (n == 0 || n > LOGIN_MAX || s[0] == '-') {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (!is_alnum(s[i]) && s[i] != '-') {
            return false;
        }
    }
    return true;
}

/* A repository name: 1 to 100 of [A-Za-z0-9._-], not "." or "..". */
bool github_valid_repo_name(const char *s)
{
    size_t n = strlen(s);

    if (n == 0 || n > REPO_NAME_MAX || strcmp(s, ".") == 0 || strcmp(s, "..") == 0) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (!is_alnum(s[i]) && s[i] != '-' && s[i] != '_' && s[i] != '.') {
            return false;
        }
    }
    return true;
}

/* repository.full_name must be exactly owner.login "/" name, each valid. */
static int check_repository(const char *full, const struct jsonscan_value *f, struct err *err)
{
    char *owner = jsonscan_string(&f[F_OWNER]);
    char *name = jsonscan_string(&f[F_REPO_NAME]);
    int rc = E_OK;

    if (owner == NULL || name == NULL) {
        rc = missing(err, owner == NULL ? "repository.owner.login" : "repository.name");
    } else if (!github_valid_login(owner, false)) {
        rc = err_set(err, E_INVALID, "repository.owner.login is not a valid GitHub login");
    } else if (!github_valid_repo_name(name)) {
        rc = err_set(err, E_INVALID, "repository.name is not a valid GitHub repository name");
    } else if (strlen(full) != strlen(owner) + 1 + strlen(name) ||
               strncmp(full, owner, strlen(owner)) != 0 || full[strlen(owner)] != '/' ||
               strcmp(full + strlen(owner) + 1, name) != 0) {
        rc = err_set(err, E_INVALID, "repository.full_name is not repository.owner.login/name");
    }
    free(owner);
    free(name);
    return rc;
}

/* Whether V is a JSON string (what jsonscan_string would read, without reading it). */
static bool is_string(const struct jsonscan_value *v)
{
    return v->present && v->len >= 2 && v->start[0] == '"';
}

/* The comment's fields into E; its body only WITH_BODY (else only checked to be there). */
static int parse_comment(struct inbox_entry *e, const struct jsonscan_value *f,
                         const char *delivery, bool with_body, struct err *err)
{
    int64_t number = 0, id = 0, uid = 0, inst = 0;
    int rc;

    if (jsonscan_int(&number, &f[F_NUMBER]) != E_OK) {
        return missing(err, "issue.number");
    }
    /* A PR number is positive and GitHub's are 32-bit; a negative one would give task
     * names like "fix-pr--7" and API paths GitHub never serves. */
    if (number < 1 || number > INT32_MAX) {
        return err_set(err, E_INVALID, "issue.number is not a pull request number");
    }
    if (jsonscan_int(&id, &f[F_COMMENT_ID]) != E_OK) {
        return missing(err, "comment.id");
    }
    snprintf(e->provider, sizeof(e->provider), "github");
    e->project = jsonscan_string(&f[F_PROJECT]);
    e->body = with_body ? jsonscan_string(&f[F_BODY]) : NULL;
    e->author = jsonscan_string(&f[F_LOGIN]);
    if (e->project == NULL) {
        return missing(err, "repository.full_name");
    }
    if (with_body ? e->body == NULL : !is_string(&f[F_BODY])) {
        return missing(err, "comment.body");
    }
    if (e->author == NULL) {
        return missing(err, "comment.user.login");
    }
    rc = check_repository(e->project, f, err);
    if (rc != E_OK) {
        return rc;
    }
    if (!github_valid_login(e->author, true)) {
        return err_set(err, E_INVALID, "comment.user.login is not a valid GitHub login");
    }
    e->delivery_id = delivery != NULL ? xstrdup(delivery) : NULL;
    e->number = number;
    e->comment_id = xasprintf("%lld", (long long)id);
    e->author_id = jsonscan_int(&uid, &f[F_USER_ID]) == E_OK ? uid : 0;
    e->author_association = jsonscan_string(&f[F_ASSOCIATION]);
    e->installation_id = jsonscan_int(&inst, &f[F_INSTALLATION]) == E_OK ? inst : 0;
    return E_OK;
}

/* Extracts the fields of BODY (LEN bytes) into F; BODY must be a JSON object. Duplicate keys
 * are tolerated like GitHub's own consumers do: the last one wins. */
static int scan_payload(struct jsonscan_value *f, const char *body, size_t len, struct err *err)
{
    struct err jerr = {0};
    size_t i = 0;

    while (i < len && (body[i] == ' ' || body[i] == '\t' || body[i] == '\n' || body[i] == '\r')) {
        i++;
    }
    if (jsonscan_extract(f, body, len, g_fields, F_COUNT, &jerr) != E_OK || i >= len ||
        body[i] != '{') {
        return err_set(err, E_INVALID, "payload is not a JSON object: %s",
                       jerr.msg[0] != '\0' ? jerr.msg : "wrong type");
    }
    return E_OK;
}

/* For a created comment: sets *WHY_OUT when it is not a command (not on a pull request, or
 * by a bot); E_INVALID when the issue or comment object is missing. */
static int comment_filter(const char **why_out, const struct jsonscan_value *f, struct err *err)
{
    char *type;
    bool bot;

    if (!is_object(&f[F_ISSUE]) || !is_object(&f[F_COMMENT])) {
        return missing(err, is_object(&f[F_ISSUE]) ? "comment" : "issue");
    }
    if (!f[F_PULL].present || jsonscan_is_null(&f[F_PULL])) {
        *why_out = "comment on an issue, not a pull request";
        return E_OK;
    }
    type = jsonscan_string(&f[F_USER_TYPE]);
    bot = type != NULL && strcmp(type, "Bot") == 0;
    free(type);
    if (bot) {
        *why_out = "comment by a bot";
    }
    return E_OK;
}

static int parse_delivery(enum github_event *event_out, struct inbox_entry *entry_out,
                          const char **why_out, const char *event, const char *delivery,
                          const char *body, size_t len, bool with_body, struct err *err)
{
    struct jsonscan_value f[F_COUNT];
    char *action = NULL;
    int rc;

    *event_out = GITHUB_EVENT_IGNORED;
    *why_out = "";
    memset(entry_out, 0, sizeof(*entry_out));
    if (event == NULL) {
        return err_set(err, E_INVALID, "missing X-GitHub-Event header");
    }
    rc = scan_payload(f, body, len, err);
    if (rc != E_OK) {
        return rc;
    }
    if (strcmp(event, "ping") == 0) {
        *event_out = GITHUB_EVENT_PING;
        return E_OK;
    }
    if (strcmp(event, "issue_comment") != 0) {
        *why_out = "event not handled";
        return E_OK;
    }
    action = jsonscan_string(&f[F_ACTION]);
    if (action == NULL) {
        return missing(err, "action");
    }
    if (strcmp(action, "created") != 0) {
        *why_out = "only created comments are commands";
    } else {
        rc = comment_filter(why_out, f, err);
    }
    free(action);
    if (rc != E_OK || (*why_out)[0] != '\0') {
        return rc;
    }
    rc = parse_comment(entry_out, f, delivery, with_body, err);
    if (rc == E_OK) {
        *event_out = GITHUB_EVENT_COMMENT;
    } else {
        inbox_entry_cleanup(entry_out);
    }
    return rc;
}

int github_webhook_parse(enum github_event *event_out, struct inbox_entry *entry_out,
                         const char **why_out, const char *event, const char *delivery,
                         const char *body, size_t len, struct err *err)
{
    return parse_delivery(event_out, entry_out, why_out, event, delivery, body, len, true, err);
}

int github_webhook_check(enum github_event *event_out, const char **why_out, const char *event,
                         const char *body, size_t len, struct err *err)
{
    struct inbox_entry e;
    int rc = parse_delivery(event_out, &e, why_out, event, NULL, body, len, false, err);

    inbox_entry_cleanup(&e);
    return rc;
}
