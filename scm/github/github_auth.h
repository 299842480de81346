/* SPDX-License-Identifier: Apache-2.0 */
/* Credentials for outbound GitHub REST calls: a GitHub App (RS256 JWT exchanged for
 * per-installation access tokens, cached until shortly before they expire) or a personal
 * access token, or none yet; they may become an App while in use (the one-click setup).
 * Secrets never reach a log line or an error message. */
#ifndef DIVERGE_SCM_GITHUB_AUTH_H
#define DIVERGE_SCM_GITHUB_AUTH_H

#include <stdbool.h>
#include <stdint.h>

#include "common/clock.h"
#include "common/err.h"

#define GITHUB_AUTH_DEFAULT_API_URL "https://api.github.com"
/* JWT claims: iat this far in the past (clock drift), exp this far in the future. */
#define GITHUB_AUTH_JWT_BACKDATE_S 60
#define GITHUB_AUTH_JWT_LIFETIME_S (9 * 60)
/* An installation token is exchanged again this long before its expires_at. */
#define GITHUB_AUTH_REFRESH_MARGIN_MS (5 * 60 * 1000)
/* Key files larger than this are refused (E_TOOBIG); a 4096-bit PEM is about 3.3 KiB. */
#define GITHUB_AUTH_KEY_FILE_MAX (64u * 1024u)

/* Opaque and reference-counted. All functions below may be called from any thread at the
 * same time, except the github_auth_free() that drops the last reference, which must be
 * the last call. */
struct github_auth;

/* No credentials (yet): github_auth_header() fails with E_DENIED until
 * github_auth_use_app() gives it an App. Free with github_auth_free(). */
void github_auth_new_none(struct github_auth **out);

/* Takes one more reference to A and returns A: it stays alive until github_auth_free()
 * has been called once per reference. */
struct github_auth *github_auth_ref(struct github_auth *a);

/* Makes A (whatever it held: none, a PAT, an App) the GitHub App APP_ID with the key in
 * KEY_FILE, at once for every holder of a reference; arguments and errors as
 * github_auth_new_app(), and on error A is unchanged. Cached installation tokens are
 * dropped; an exchange in flight finishes but its token is not cached. */
int github_auth_use_app(struct github_auth *a, const char *api_url, const char *app_id,
                        const char *key_file, const struct clock *clock, struct err *err);

/* A GitHub App as the credential source. API_URL is the REST base without a trailing
 * path ("https://api.github.com", "https://HOST/api/v3", or a fake on loopback; NULL
 * means GITHUB_AUTH_DEFAULT_API_URL; a trailing '/' is dropped). APP_ID is the app's id
 * (or client id), used as the JWT's iss. KEY_FILE is a PEM RSA private key of at least
 * 2048 bits, PKCS#1 ("BEGIN RSA PRIVATE KEY") or unencrypted PKCS#8 ("BEGIN PRIVATE
 * KEY"). CLOCK (borrowed, must outlive the object) gives the time for JWTs and token
 * expiry. On success *out is a new object the caller frees with github_auth_free().
 * Errors:
 *   E_NOTFOUND  KEY_FILE does not exist;
 *   E_INVALID   the file is not such a key, or APP_ID or API_URL is malformed;
 *   E_FAIL      KEY_FILE cannot be read (E_TOOBIG when over GITHUB_AUTH_KEY_FILE_MAX). */
int github_auth_new_app(struct github_auth **out, const char *api_url, const char *app_id,
                        const char *key_file, const struct clock *clock, struct err *err);

/* A personal access token (or any bearer token) as the credential source; TOKEN is
 * copied. On success *out is a new object the caller frees with github_auth_free().
 * E_INVALID when TOKEN is empty or holds bytes that cannot go in an HTTP header. */
int github_auth_new_token(struct github_auth **out, const char *token, struct err *err);

/* Picks the source the way SPEC §2 says. APP_ID and KEY_FILE are the values of
 * --github-app-id and --github-app-key-file (NULL or "" when not given); each falls back
 * to DIVERGE_GITHUB_APP_ID / DIVERGE_GITHUB_APP_KEY_FILE. When both are set the app
 * wins (as github_auth_new_app()); else the token in DIVERGE_NOTIFIER_TOKEN, else
 * GITHUB_TOKEN (empty variables count as unset). Errors:
 *   E_NOTFOUND  no credentials configured at all (the caller may run without GitHub
 *               calls), or the key file does not exist;
 *   E_INVALID   only one of the app id and the key file is set, or as the constructors. */
int github_auth_from_config(struct github_auth **out, const char *api_url, const char *app_id,
                            const char *key_file, const struct clock *clock, struct err *err);

/* Whether A is a GitHub App (else a PAT or none): an app learns its login from GET /app,
 * as "<slug>[bot]", since GET /user refuses app and installation tokens. */
bool github_auth_is_app(struct github_auth *a);

/* Whether A holds any credentials (an App or a PAT). */
bool github_auth_has_credentials(struct github_auth *a);

/* Drops one reference; the last one wipes every key and token A holds and frees it. NULL
 * is a no-op. */
void github_auth_free(struct github_auth *a);

/* Sets *header_out to the value of the Authorization header ("Bearer <token>") for
 * calls about INSTALLATION_ID. The caller frees it with free() after OPENSSL_cleanse()
 * or secret_wipe() over its length. With a PAT the id is ignored. With an app, 0 means
 * the app JWT itself (GET /app, listing installations); any other id is exchanged at
 * POST {api}/app/installations/{id}/access_tokens and the token is cached until
 * GITHUB_AUTH_REFRESH_MARGIN_MS before its expires_at. Concurrent callers for one
 * installation share one exchange, and its failure. Blocks for up to about 20 s while
 * GitHub is slow. Errors:
 *   E_AGAIN   GitHub unreachable, 5xx or 429: retry later;
 *   E_DENIED  401, 403 or 404 from GitHub: wrong key or app id, or the app is not
 *             installed there; or A holds no credentials;
 *   E_INVALID INSTALLATION_ID is negative;
 *   E_FAIL    anything else (unexpected status, malformed answer; E_TOOBIG when the
 *             answer is over 64 KiB). */
int github_auth_header(char **header_out, struct github_auth *a, int64_t installation_id,
                       struct err *err);

/* Sets *jwt_out to a new app JWT minted at the clock's current time (caller frees as
 * above). E_INVALID when A is not an app, E_FAIL when signing fails. */
int github_auth_app_jwt(char **jwt_out, struct github_auth *a, struct err *err);

/* Forgets the cached token of INSTALLATION_ID (call it after a 401 on a request made
 * with it), so the next github_auth_header() exchanges again. No-op for a PAT. */
void github_auth_invalidate(struct github_auth *a, int64_t installation_id);

#endif
