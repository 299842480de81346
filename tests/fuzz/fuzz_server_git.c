/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: the untrusted pieces of a git smart HTTP request to the server
 * (server/api_git_pkt.c): the receive-pack ref updates (pkt-lines), the repository path
 * segment and the Authorization header. Input: the first byte picks the working branch
 * ("agent/t1" or "w"), the rest is tried as a push body, and up to its first NUL as a
 * path segment and as a header value. Checked: no crash or over-read; an accepted push
 * names only refs/heads/<working>; no message echoes the input. */
#define _GNU_SOURCE /* memmem */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/secret.h"
#include "server/api/git/api_git.h"
#include "server/api/api_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *working = size > 0 && (data[0] & 1) ? "w" : "agent/t1";
    const char *body = size > 0 ? (const char *)data + 1 : "";
    size_t len = size > 0 ? size - 1 : 0;
    char *copy = malloc(len + 1);
    char name[API_GIT_NAME_MAX + 1];
    struct err err = {0};
    char *tok;
    int rc;

    memcpy(copy, body, len); /* an exact-size heap copy: ASan sees any over-read */
    rc = api_git_check_push(copy, len, working, &err);
    if (rc == E_OK) {
        /* Every command of an accepted push names the working branch. */
        ASSERT(memmem(copy, len, working, strlen(working)) != NULL);
    } else {
        ASSERT(err.msg[0] != '\0');
    }
    copy[len] = '\0';
    if (api_git_repo_name(name, copy, &err) == E_OK) {
        ASSERT(api_git_name_ok(name) && strlen(name) + 4 == strlen(copy));
    }
    tok = api_git_auth_token(copy);
    if (tok != NULL) {
        ASSERT(strlen(tok) > 0 && strchr(tok, ' ') == NULL);
        secret_wipe(tok, strlen(tok));
        free(tok);
    }
    free(copy);
    return 0;
}
