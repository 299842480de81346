/* SPDX-License-Identifier: Apache-2.0 */
/* The pure parsers of git smart HTTP requests (api_git.h): the repository path segment,
 * the Authorization header and the ref updates of a receive-pack request. Every input is
 * untrusted; no message echoes a request byte. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/secret.h"
#include "server/api/git/api_git.h"
#include "server/api/api_int.h"

#define TOKEN_TEXT_MAX 8192 /* bytes of a token in a header */

bool api_git_name_ok(const char *name)
{
    size_t n = strlen(name);

    if (n == 0 || n > API_GIT_NAME_MAX || name[0] == '.' || name[0] == '-') {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.')) {
            return false;
        }
    }
    return strstr(name, "..") == NULL;
}

int api_git_repo_name(char *out, const char *seg, struct err *err)
{
    size_t n = strlen(seg);

    out[0] = '\0';
    if (n <= 4 || n - 4 > API_GIT_NAME_MAX || strcmp(seg + n - 4, ".git") != 0) {
        return err_set(err, E_INVALID, "expected <task>.git in the path");
    }
    memcpy(out, seg, n - 4);
    out[n - 4] = '\0';
    if (!api_git_name_ok(out)) {
        out[0] = '\0';
        return err_set(err, E_INVALID, "not a task name in the path");
    }
    return E_OK;
}

static int b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z') {
        return c - 'A';
    }
    if (c >= 'a' && c <= 'z') {
        return c - 'a' + 26;
    }
    if (c >= '0' && c <= '9') {
        return c - '0' + 52;
    }
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* Standard base64 (padding optional) of S into a new NUL-terminated string; NULL when
 * malformed or decoding to a NUL byte. */
static char *b64_decode(const char *s)
{
    size_t n = strlen(s), o = 0;
    char *out;
    uint32_t acc = 0;
    int bits = 0;

    while (n > 0 && s[n - 1] == '=') {
        n--;
    }
    if (n == 0 || n > TOKEN_TEXT_MAX * 2) {
        return NULL;
    }
    out = xmalloc(n + 1);
    for (size_t i = 0; i < n; i++) {
        int v = b64_value((unsigned char)s[i]);
        if (v < 0) {
            secret_wipe(out, o);
            free(out);
            return NULL;
        }
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o] = (char)((acc >> bits) & 0xff);
            if (out[o] == '\0') {
                secret_wipe(out, o);
                free(out);
                return NULL;
            }
            o++;
        }
    }
    out[o] = '\0';
    return out;
}

static bool token_chars_ok(const char *t)
{
    size_t n = strlen(t);

    if (n == 0 || n > TOKEN_TEXT_MAX) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)t[i];
        if (c <= ' ' || c >= 0x7f) {
            return false;
        }
    }
    return true;
}

char *api_git_auth_token(const char *h)
{
    char *tok = NULL;

    if (h == NULL) {
        return NULL;
    }
    if (strncasecmp(h, "Bearer ", 7) == 0) {
        tok = xstrdup(h + 7);
    } else if (strncasecmp(h, "Basic ", 6) == 0) {
        char *plain = b64_decode(h + 6);
        char *colon = plain != NULL ? strchr(plain, ':') : NULL;
        if (colon != NULL) {
            tok = xstrdup(colon + 1);
        }
        if (plain != NULL) {
            secret_wipe(plain, strlen(plain));
            free(plain);
        }
    }
    if (tok != NULL && !token_chars_ok(tok)) {
        secret_wipe(tok, strlen(tok));
        free(tok);
        tok = NULL;
    }
    return tok;
}

static bool all_hex(const char *s, size_t n, bool *zero)
{
    *zero = true;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
            return false;
        }
        *zero = *zero && c == '0';
    }
    return true;
}

/* The length of the pkt-line at P (LEFT bytes available): 0 for a flush packet, -1 when
 * malformed or truncated. */
static long pkt_len(const char *p, size_t left)
{
    long v = 0;

    if (left < 4) {
        return -1;
    }
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        if (c >= '0' && c <= '9') {
            v = v * 16 + (c - '0');
        } else if (c >= 'a' && c <= 'f') {
            v = v * 16 + (c - 'a' + 10);
        } else {
            return -1;
        }
    }
    if (v == 0) {
        return 0;
    }
    if (v <= 4 || (size_t)v > left) {
        return -1;
    }
    return v;
}

/* The object ids of "<old> <new> " at P (N bytes): their length (40 or 64) and whether
 * the new one is all zeros; 0 when malformed. */
static size_t command_ids(const char *p, size_t n, bool *zero_new)
{
    size_t hex = n > 81 && p[40] == ' ' && p[81] == ' ' ? 40 : 64;
    bool zero_old;

    if (n < 2 * hex + 2 || p[hex] != ' ' || p[2 * hex + 1] != ' ' || !all_hex(p, hex, &zero_old) ||
        !all_hex(p + hex + 1, hex, zero_new)) {
        return 0;
    }
    return hex;
}

/* One command "<old> <new> <ref>[NUL caps][LF]" of LEN bytes at P. */
static int check_command(const char *p, size_t len, const char *working, struct err *err)
{
    const char *nul = memchr(p, '\0', len);
    size_t n = nul != NULL ? (size_t)(nul - p) : len;
    size_t hex, want = strlen("refs/heads/") + strlen(working);
    bool zero_new = false;

    if (nul == NULL && n > 0 && p[n - 1] == '\n') {
        n--;
    }
    hex = command_ids(p, n, &zero_new);
    if (hex == 0) {
        return err_set(err, E_INVALID, "malformed ref update in the push");
    }
    if (n - (2 * hex + 2) != want || memcmp(p + 2 * hex + 2, "refs/heads/", 11) != 0 ||
        memcmp(p + 2 * hex + 2 + 11, working, strlen(working)) != 0) {
        return err_set(err, E_DENIED, "only the task's working branch can be pushed");
    }
    if (zero_new) {
        return err_set(err, E_DENIED, "deleting the working branch is not allowed");
    }
    return E_OK;
}

int api_git_check_push(const char *body, size_t len, const char *working, struct err *err)
{
    size_t off = 0, commands = 0;

    if (working == NULL || working[0] == '\0') {
        return err_set(err, E_DENIED, "the task has no working branch");
    }
    for (;;) {
        long n = pkt_len(body + off, len - off);
        const char *p = body + off + 4;
        int rc;

        if (n < 0) {
            return err_set(err, E_INVALID, "malformed push request");
        }
        if (n == 0) {
            break;
        }
        if ((size_t)n - 4 >= 8 && memcmp(p, "shallow ", 8) == 0) {
            return err_set(err, E_DENIED, "shallow pushes are not accepted");
        }
        if ((size_t)n - 4 >= 9 && memcmp(p, "push-cert", 9) == 0) {
            return err_set(err, E_DENIED, "signed pushes are not accepted");
        }
        rc = check_command(p, (size_t)n - 4, working, err);
        if (rc != E_OK) {
            return rc;
        }
        commands++;
        off += (size_t)n;
    }
    return commands > 0 ? E_OK : err_set(err, E_INVALID, "the push updates no ref");
}
