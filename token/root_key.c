/* SPDX-License-Identifier: Apache-2.0 */
/* The server's macaroon root key file: 64 hex characters, created once with mode 0600.
 * Creation is atomic (write a private temporary file, then link(2) it into place), so a
 * reader never sees a half-written key and concurrent creators agree on one key. */
#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "token/token.h"
#include "token/token_int.h"

#define KEY_HEX_LEN (2 * TOKEN_ROOT_KEY_LEN)
#define KEY_FILE_MAX (KEY_HEX_LEN + 8) /* the hex plus a little trailing whitespace */

int token_root_key_parse(unsigned char key_out[TOKEN_ROOT_KEY_LEN], const char *hex,
                         struct err *err)
{
    if (token_hex_decode(key_out, TOKEN_ROOT_KEY_LEN, hex, strlen(hex)) != E_OK) {
        OPENSSL_cleanse(key_out, TOKEN_ROOT_KEY_LEN);
        return err_set(err, E_INVALID, "root key is not %d hex characters", KEY_HEX_LEN);
    }
    return E_OK;
}

/* Reads the whole (small) file into BUF as a string; E_NOTFOUND when it does not exist. */
static int read_small(char *buf, size_t size, const char *path, struct err *err)
{
    size_t len = 0;
    int fd, rc = E_OK;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return errno == ENOENT ? E_NOTFOUND
                               : err_set(err, E_FAIL, "open %s: %s", path, strerror(errno));
    }
    for (;;) {
        ssize_t n = read(fd, buf + len, size - 1 - len);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            rc = err_set(err, E_FAIL, "read %s: %s", path, strerror(errno));
            break;
        }
        if (n == 0) {
            break;
        }
        len += (size_t)n;
        if (len == size - 1) {
            rc = err_set(err, E_INVALID, "root key file %s is too long", path);
            break;
        }
    }
    buf[len] = '\0';
    close(fd);
    return rc;
}

static int load(unsigned char key_out[TOKEN_ROOT_KEY_LEN], const char *path, struct err *err)
{
    char text[KEY_FILE_MAX + 2];
    size_t len;
    int rc;

    rc = read_small(text, sizeof(text), path, err);
    if (rc == E_OK) {
        len = strlen(text);
        while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r')) {
            text[--len] = '\0';
        }
        rc = token_root_key_parse(key_out, text, NULL);
        if (rc != E_OK) {
            rc = err_set(err, E_INVALID, "root key file %s is not %d hex characters", path,
                         KEY_HEX_LEN);
        }
    }
    OPENSSL_cleanse(text, sizeof(text));
    return rc;
}

static int write_all(int fd, const char *data, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, data, len);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return E_FAIL;
        }
        data += n;
        len -= (size_t)n;
    }
    return E_OK;
}

/* Creates PATH holding a new random key. E_CONFLICT when PATH appeared meanwhile. */
static int create(unsigned char key_out[TOKEN_ROOT_KEY_LEN], const char *path, struct err *err)
{
    unsigned char key[TOKEN_ROOT_KEY_LEN], nonce[8];
    char text[KEY_HEX_LEN + 2], nonce_hex[2 * sizeof(nonce) + 1];
    char *tmp = NULL;
    int fd = -1, rc = E_OK;

    if (RAND_bytes(key, sizeof(key)) != 1 || RAND_bytes(nonce, sizeof(nonce)) != 1) {
        return err_set(err, E_FAIL, "no randomness for the root key");
    }
    token_hex_encode(text, key, sizeof(key));
    text[KEY_HEX_LEN] = '\n';
    text[KEY_HEX_LEN + 1] = '\0';
    token_hex_encode(nonce_hex, nonce, sizeof(nonce));
    tmp = xasprintf("%s.tmp-%s", path, nonce_hex);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        rc = err_set(err, E_FAIL, "create %s: %s", tmp, strerror(errno));
        goto out;
    }
    if (write_all(fd, text, KEY_HEX_LEN + 1) != E_OK || fsync(fd) != 0) {
        rc = err_set(err, E_FAIL, "write %s: %s", tmp, strerror(errno));
        goto out;
    }
    /* link(2) fails with EEXIST instead of replacing: the first creator wins. */
    if (link(tmp, path) != 0) {
        rc = errno == EEXIST ? E_CONFLICT
                             : err_set(err, E_FAIL, "link %s: %s", path, strerror(errno));
        goto out;
    }
    memcpy(key_out, key, sizeof(key));
out:
    if (fd >= 0) {
        close(fd);
        unlink(tmp);
    }
    free(tmp);
    OPENSSL_cleanse(key, sizeof(key));
    OPENSSL_cleanse(text, sizeof(text));
    return rc;
}

int token_root_key_load_or_create(unsigned char key_out[TOKEN_ROOT_KEY_LEN], const char *path,
                                  struct err *err)
{
    int rc;

    rc = load(key_out, path, err);
    if (rc != E_NOTFOUND) {
        return rc;
    }
    rc = create(key_out, path, err);
    if (rc == E_CONFLICT) {
        rc = load(key_out, path, err); /* another process created it first */
    }
    if (rc == E_NOTFOUND) {
        rc = err_set(err, E_FAIL, "root key file %s vanished", path);
    }
    return rc;
}
