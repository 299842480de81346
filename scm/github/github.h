/* SPDX-License-Identifier: Apache-2.0 */
/* GitHub: webhook signature verification and payload parsing (SPEC §5), and the REST
 * provider behind the scm_provider interface. */
#ifndef DIVERGE_SCM_GITHUB_GITHUB_H
#define DIVERGE_SCM_GITHUB_GITHUB_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"
#include "scm/github/github_auth.h"
#include "scm/scm.h"
#include "store/store.h"

/* Checks SIG_HEADER ("sha256=<hex>") against HMAC-SHA256 of BODY[0..len) under each of
 * the comma-separated SECRETS, in constant time per secret, before anything parses the
 * body. E_DENIED when missing, malformed or matching no secret. */
int github_webhook_verify(const char *secrets, const char *sig_header, const char *body, size_t len,
                          struct err *err);

/* The same check computed as the body streams in, so the server never keeps a second
 * pass over a 25 MiB delivery: github_webhook_mac_new parses SIG_HEADER (E_DENIED when
 * missing or malformed, *out stays NULL) and starts one HMAC per secret;
 * github_webhook_mac_update feeds body bytes; github_webhook_mac_check ends it (E_DENIED
 * when no secret matches; call it once). Free with github_webhook_mac_free (NULL is a
 * no-op). */
struct github_webhook_mac;
int github_webhook_mac_new(struct github_webhook_mac **out, const char *secrets,
                           const char *sig_header, struct err *err);
void github_webhook_mac_update(struct github_webhook_mac *m, const void *data, size_t len);
int github_webhook_mac_check(struct github_webhook_mac *m, struct err *err);
void github_webhook_mac_free(struct github_webhook_mac *m);

enum github_event {
    GITHUB_EVENT_PING,    /* answer 200 */
    GITHUB_EVENT_COMMENT, /* a new comment on a pull request: *entry_out is filled */
    GITHUB_EVENT_IGNORED, /* anything else: answer 204 */
};

/* GitHub's naming rules: a login is 1 to 39 of [A-Za-z0-9-] not starting with '-' (with
 * ALLOW_BOT, an App's "<slug>[bot]" too); a repository name 1 to 100 of [A-Za-z0-9._-],
 * not "." or "..". */
bool github_valid_login(const char *s, bool allow_bot);
bool github_valid_repo_name(const char *s);

/* Parses a delivery of EVENT (the X-GitHub-Event header) with id DELIVERY (may be NULL).
 * For a created issue_comment on a PR fills *entry_out (caller cleans it up with
 * inbox_entry_cleanup). *why_out (static text) says why an event is ignored. E_INVALID
 * (HTTP 400) for malformed JSON, missing fields, an issue.number outside 1..INT32_MAX, or
 * names GitHub does not allow (repository owner, name, full_name = owner/name, comment
 * author): nothing else the bot stores or calls can then carry a path or markup. */
int github_webhook_parse(enum github_event *event_out, struct inbox_entry *entry_out,
                         const char **why_out, const char *event, const char *delivery,
                         const char *body, size_t len, struct err *err);
/* As github_webhook_parse, the same answers, but keeps nothing: for a delivery that holds
 * no command (the comment's body is checked to be a string, never copied). */
int github_webhook_check(enum github_event *event_out, const char **why_out, const char *event,
                         const char *body, size_t len, struct err *err);

struct github_config {
    const char *api_url; /* REST base, e.g. https://api.github.com */
    /* The bot's login, or NULL: asked from the API (GET /user; App mode GET /app, giving
     * <slug>[bot]), again with backoff after a failure, until known. */
    const char *bot_login;
};

/* The installation of the GitHub App A that covers PROJECT ("owner/repo"), asked with the
 * app JWT at GET {API_URL}/repos/{owner}/{repo}/installation, in *id_out. Errors as
 * github_rest_call (E_NOTFOUND: the app is not installed there). */
int github_repo_installation(int64_t *id_out, struct github_auth *a, const char *api_url,
                             const char *project, struct err *err);

/* The password git sends for PROJECT ("owner/repo") on the GitHub web host, with the user
 * name "x-access-token" (SPEC §9): with an App the installation access token of
 * INSTALLATION_ID (0: the installation github_repo_installation() finds), exchanged again
 * once it is inside GITHUB_AUTH_REFRESH_MARGIN_MS of its expiry; with a PAT the PAT.
 * *token_out is a new secret string (caller wipes and frees it). Errors as
 * github_auth_header() and github_repo_installation(). */
int github_git_token(char **token_out, struct github_auth *a, const char *api_url,
                     const char *project, int64_t installation_id, struct err *err);

/* --- the one-click GitHub App (manifest.c) --- */

#define GITHUB_MANIFEST_CODE_MAX 128

/* Whether CODE (GitHub's redirect parameter) is 1 to GITHUB_MANIFEST_CODE_MAX of
 * [A-Za-z0-9_-]: only such a code goes into a URL. */
bool github_manifest_code_valid(const char *code);

/* What the App manifest says besides the fixed permissions (issues, pull requests and
 * contents write, metadata read) and events (issue_comment, pull_request_review_comment);
 * all borrowed. */
struct github_manifest {
    const char *name;         /* the App's name, unique on GitHub */
    const char *description;  /* shown on the App's page */
    const char *url;          /* its homepage: the server's public URL */
    const char *hook_url;     /* where GitHub delivers webhooks */
    const char *redirect_url; /* where GitHub sends the browser back with the code */
};

/* The manifest as compact JSON text (caller frees). Not public, webhook active. */
char *github_manifest_json(const struct github_manifest *m);

/* What GitHub answers for a manifest code, checked. */
struct github_app_grant {
    char *id;             /* owned: the App id, decimal */
    char *slug;           /* owned, or NULL when GitHub sent none or a malformed one */
    char *html_url;       /* owned: the App's page, http(s) without quotes or spaces, or NULL */
    char *pem;            /* owned secret: the RSA private key (checked to load) */
    char *webhook_secret; /* owned secret: visible ASCII, no ',' */
};

/* Exchanges CODE at POST {API_URL}/app-manifests/{code}/conversions (no credentials: the
 * code is one). On E_OK *out holds the new App (caller calls github_app_grant_cleanup,
 * which wipes the secrets). Errors: E_INVALID CODE is not valid; E_NOTFOUND GitHub knows
 * no such code (used, or expired); E_DENIED GitHub refused it otherwise; E_AGAIN
 * unreachable, 5xx or 429; E_FAIL a malformed answer (no id, no loadable key, no secret). */
int github_manifest_convert(struct github_app_grant *out, const char *api_url, const char *code,
                            struct err *err);
/* Wipes the secrets of G and frees what it holds; G is zeroed. */
void github_app_grant_cleanup(struct github_app_grant *g);

/* Creates the REST provider; takes ownership of AUTH (one reference). */
int github_provider_new(struct scm_provider **out, const struct github_config *cfg,
                        struct github_auth *auth, struct err *err);

#endif
