/* SPDX-License-Identifier: Apache-2.0 */
/* Random bytes from the kernel and 0600 secret files (refused when another user could
 * have planted or read them). */
#include "common/secret.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

void secret_random(void *out, size_t n)
{
    unsigned char *p = out;

    while (n > 0) {
        ssize_t got = getrandom(p, n, 0);
        if (got < 0 && errno == EINTR) {
            continue;
        }
        ASSERT(got > 0);
        p += got;
        n -= (size_t)got;
    }
}

void secret_hex(char *out, const unsigned char *in, size_t n)
{
    static const char digits[] = "0123456789abcdef";

    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 0x0f];
    }
    out[2 * n] = '\0';
}

int secret_hex_digit(char c)
{
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

int secret_unhex(unsigned char *out, size_t n, const char *in)
{
    if (strlen(in) != 2 * n) {
        return E_INVALID;
    }
    for (size_t i = 0; i < n; i++) {
        int hi = secret_hex_digit(in[2 * i]), lo = secret_hex_digit(in[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            return E_INVALID;
        }
        out[i] = (unsigned char)(hi << 4 | lo);
    }
    return E_OK;
}

void secret_wipe(void *p, size_t n)
{
    volatile unsigned char *v = p;

    while (n-- > 0) {
        *v++ = 0;
    }
}

int secret_file_write(const char *path, const void *data, size_t len, struct err *err)
{
    unsigned char nonce[8];
    char nonce_hex[2 * sizeof(nonce) + 1];
    char *tmp;
    int fd, rc = E_OK;

    secret_random(nonce, sizeof(nonce));
    secret_hex(nonce_hex, nonce, sizeof(nonce));
    tmp = xasprintf("%s.tmp-%s", path, nonce_hex);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        rc = err_set(err, E_FAIL, "create %s: %s", tmp, strerror(errno));
        goto out;
    }
    if (write(fd, data, len) != (ssize_t)len || fsync(fd) != 0) {
        rc = err_set(err, E_FAIL, "write %s: %s", tmp, strerror(errno));
    }
    close(fd);
    if (rc == E_OK && link(tmp, path) != 0) {
        rc = errno == EEXIST ? E_AGAIN
                             : err_set(err, E_FAIL, "create %s: %s", path, strerror(errno));
    }
    unlink(tmp);
out:
    free(tmp);
    return rc;
}

/* Creates PATH holding NBYTES random bytes as hex (secret_file_write: E_AGAIN when someone
 * else created it first). */
static int create_secret(const char *path, size_t nbytes, struct err *err)
{
    unsigned char *raw = xmalloc(nbytes);
    char *hex = xmalloc(2 * nbytes + 2);
    size_t len;
    int rc;

    secret_random(raw, nbytes);
    secret_hex(hex, raw, nbytes);
    len = strlen(hex);
    hex[len++] = '\n';
    rc = secret_file_write(path, hex, len, err);
    secret_wipe(raw, nbytes);
    secret_wipe(hex, 2 * nbytes + 2);
    free(raw);
    free(hex);
    return rc;
}

/* Opens the existing secret file PATH for reading, refusing anything another user could
 * have planted or read: a symbolic link, a non-regular file (a FIFO would block: hence
 * O_NONBLOCK), a file of another owner, or one with any group or other permission bit.
 * ENOENT is returned as E_NOTFOUND without a message. */
static int open_secret(int *fd_out, const char *path, struct err *err)
{
    struct stat st;
    unsigned uid = (unsigned)geteuid();
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    int rc = E_OK;

    *fd_out = -1;
    if (fd < 0) {
        if (errno == ENOENT) {
            return E_NOTFOUND;
        }
        if (errno == ELOOP) {
            return err_set(err, E_DENIED,
                           "secret file %s is a symbolic link: replace it with a regular file "
                           "(mode 600) or remove it to have one generated",
                           path);
        }
        return err_set(err, E_FAIL, "open %s: %s", path, strerror(errno));
    }
    if (fstat(fd, &st) != 0) {
        rc = err_set(err, E_FAIL, "stat %s: %s", path, strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        rc = err_set(err, E_DENIED, "secret file %s is not a regular file", path);
    } else if ((unsigned)st.st_uid != uid) {
        rc = err_set(err, E_DENIED,
                     "secret file %s belongs to uid %u, not to the server's user: chown %u %s",
                     path, (unsigned)st.st_uid, uid, path);
    } else if ((st.st_mode & 077) != 0) {
        rc = err_set(err, E_DENIED, "secret file %s is accessible by others: chmod 600 %s", path,
                     path);
    }
    if (rc != E_OK) {
        close(fd);
        return rc;
    }
    *fd_out = fd;
    return E_OK;
}

/* Reads FD into BUF (CAP bytes, NUL-terminated, at most CAP - 1 of them kept); *N_OUT is
 * the length. */
static int read_secret(char *buf, size_t cap, size_t *n_out, int fd, const char *path,
                       struct err *err)
{
    size_t n = 0;
    ssize_t got;
    int rc = E_OK;

    while (n < cap - 1 && (got = read(fd, buf + n, cap - 1 - n)) != 0) {
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got < 0) {
            rc = err_set(err, E_FAIL, "read %s: %s", path, strerror(errno));
            break;
        }
        n += (size_t)got;
    }
    buf[n] = '\0';
    *n_out = n;
    return rc;
}

/* *OUT: a copy of BUF (N bytes) without surrounding blanks and newlines; E_INVALID when
 * nothing is left. BUF is trimmed in place. */
static int trimmed_dup(char **out, char *buf, size_t n, const char *path, struct err *err)
{
    size_t start = 0;

    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) {
        buf[--n] = '\0';
    }
    while (buf[start] == ' ' || buf[start] == '\n') {
        start++;
    }
    if (buf[start] == '\0') {
        return err_set(err, E_INVALID, "%s is empty", path);
    }
    *out = xstrdup(buf + start);
    return E_OK;
}

int secret_file_load_or_create(char **out, bool *created_out, const char *path, size_t nbytes,
                               struct err *err)
{
    char buf[1024];
    size_t n = 0;
    int fd = -1, rc;

    *out = NULL;
    if (created_out != NULL) {
        *created_out = false;
    }
    rc = open_secret(&fd, path, err);
    if (rc == E_NOTFOUND) {
        rc = create_secret(path, nbytes, err);
        if (rc != E_OK && rc != E_AGAIN) { /* E_AGAIN: someone else created it first */
            return rc;
        }
        if (rc == E_OK && created_out != NULL) {
            *created_out = true;
        }
        rc = open_secret(&fd, path, err);
        if (rc == E_NOTFOUND) {
            return err_set(err, E_FAIL, "open %s: %s", path, strerror(ENOENT));
        }
    }
    if (rc != E_OK) {
        return rc;
    }
    rc = read_secret(buf, sizeof(buf), &n, fd, path, err);
    close(fd);
    if (rc == E_OK) {
        rc = trimmed_dup(out, buf, n, path, err);
    }
    secret_wipe(buf, sizeof(buf));
    return rc;
}

int secret_file_read(char **out, size_t *len_out, const char *path, size_t max, struct err *err)
{
    char *buf = xmalloc(max + 1);
    size_t n = 0;
    int fd = -1, rc;

    *out = NULL;
    *len_out = 0;
    rc = open_secret(&fd, path, err);
    if (rc == E_OK) {
        rc = read_secret(buf, max + 1, &n, fd, path, err);
        close(fd);
    }
    if (rc == E_OK && n == max) {
        rc = err_set(err, E_TOOBIG, "%s is not smaller than %zu bytes", path, max);
    }
    if (rc != E_OK) {
        secret_wipe(buf, max + 1);
        free(buf);
        return rc;
    }
    *out = buf;
    *len_out = n;
    return E_OK;
}

const char *secret_env_first(const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const char *v = getenv(names[i]);
        if (v != NULL && v[0] != '\0') {
            return v;
        }
    }
    return NULL;
}
