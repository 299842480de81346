/* SPDX-License-Identifier: Apache-2.0 */
/* Declarations shared inside scm/github only: the App key and JWT (auth_key.c) for the
 * credential cache (auth.c), and one REST call (rest_call.c) for the provider (rest.c).
 * Nothing outside scm/github includes this. */
#ifndef DIVERGE_SCM_GITHUB_GITHUB_INT_H
#define DIVERGE_SCM_GITHUB_GITHUB_INT_H

#include <jansson.h>
#include <openssl/evp.h>
#include <stdint.h>

#include "common/err.h"
#include "scm/github/github_auth.h"
#include "scm/scm.h"

/* Loads the unencrypted PEM RSA private key (PKCS#1 or PKCS#8, at least 2048 bits) of
 * PATH into *OUT (caller frees with EVP_PKEY_free). E_NOTFOUND: no such file; E_TOOBIG:
 * over GITHUB_AUTH_KEY_FILE_MAX; E_INVALID: not such a key; E_FAIL: unreadable. */
int github_key_load(EVP_PKEY **out, const char *path, struct err *err);

/* The same check on the PEM text PEM[0..len) (WHAT names it in messages): E_INVALID when
 * it is not such a key, E_FAIL when libcrypto fails. */
int github_key_parse(EVP_PKEY **out, const char *pem, size_t len, const char *what,
                     struct err *err);

/* *JWT_OUT: a new RS256 JWT of the JSON CLAIMS signed with KEY (caller frees; it is a
 * credential: wipe it first). E_FAIL when signing fails. */
int github_jwt_rs256(char **jwt_out, EVP_PKEY *key, const char *claims, struct err *err);

/* One REST call of METHOD to URL with the credentials of INSTALLATION (0: the app's or the
 * PAT's own) and the JSON BODY (may be NULL). RES (may be NULL) gets the status and retry
 * hints. On E_OK, *json_out (may be NULL) gets the parsed answer (NULL for an empty body)
 * and *next_out (may be NULL) the rel="next" URL of a Link header (caller frees both).
 * E_AGAIN: rate limited or GitHub failed; E_NOTFOUND, E_DENIED, E_INVALID (422), E_FAIL. */
int github_rest_call(json_t **json_out, char **next_out, struct github_auth *auth,
                     const char *method, const char *url, int64_t installation, const json_t *body,
                     struct scm_result *res, struct err *err);

#endif
