/* SPDX-License-Identifier: Apache-2.0 */
/* The server's macaroon root key file: 64 hex characters, created once with mode 0600
 * (atomically, by common/secret). */
#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>

#include "common/secret.h"
#include "token/token.h"
#include "token/token_int.h"

#define KEY_HEX_LEN (2 * TOKEN_ROOT_KEY_LEN)

int token_root_key_parse(unsigned char key_out[TOKEN_ROOT_KEY_LEN], const char *hex,
                         struct err *err)
{
    if (secret_unhex(key_out, TOKEN_ROOT_KEY_LEN, hex) != E_OK) {
        OPENSSL_cleanse(key_out, TOKEN_ROOT_KEY_LEN);
        return err_set(err, E_INVALID, "root key is not %d hex characters", KEY_HEX_LEN);
    }
    return E_OK;
}

int token_root_key_load_or_create(unsigned char key_out[TOKEN_ROOT_KEY_LEN], const char *path,
                                  struct err *err)
{
    char *hex = NULL;
    int rc = secret_file_load_or_create(&hex, NULL, path, TOKEN_ROOT_KEY_LEN, err);

    if (rc != E_OK) {
        return rc == E_INVALID ? err_set(err, E_INVALID, "root key file %s is empty", path) : rc;
    }
    if (token_root_key_parse(key_out, hex, NULL) != E_OK) {
        rc =
            err_set(err, E_INVALID, "root key file %s is not %d hex characters", path, KEY_HEX_LEN);
    }
    OPENSSL_cleanse(hex, strlen(hex));
    free(hex);
    return rc;
}
