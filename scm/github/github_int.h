/* SPDX-License-Identifier: Apache-2.0 */
/* Declarations shared inside scm/github only: the App key and JWT (auth_key.c) for the
 * credential cache (auth.c). Nothing outside scm/github includes this. */
#ifndef DIVERGE_SCM_GITHUB_GITHUB_INT_H
#define DIVERGE_SCM_GITHUB_GITHUB_INT_H

#include <openssl/evp.h>

#include "common/err.h"

/* Loads the unencrypted PEM RSA private key (PKCS#1 or PKCS#8, at least 2048 bits) of
 * PATH into *OUT (caller frees with EVP_PKEY_free). E_NOTFOUND: no such file; E_TOOBIG:
 * over GITHUB_AUTH_KEY_FILE_MAX; E_INVALID: not such a key; E_FAIL: unreadable. */
int github_key_load(EVP_PKEY **out, const char *path, struct err *err);

/* *JWT_OUT: a new RS256 JWT of the JSON CLAIMS signed with KEY (caller frees; it is a
 * credential: wipe it first). E_FAIL when signing fails. */
int github_jwt_rs256(char **jwt_out, EVP_PKEY *key, const char *claims, struct err *err);

#endif
