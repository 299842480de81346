/* SPDX-License-Identifier: Apache-2.0 */
/* The GitHub App's private key (read from a file once, never prompting for a passphrase,
 * RSA of at least KEY_MIN_BITS) and the RS256 JWT it signs. */
#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "scm/github/github_auth.h"
#include "scm/github/github_int.h"

#define KEY_MIN_BITS 2048

static const char JWT_HEADER[] = "{\"alg\":\"RS256\",\"typ\":\"JWT\"}";

/* Reads PATH whole into one allocation (never grown, so no stray copy of the key is
 * left in freed memory): *out is NUL-terminated, *len_out its length; caller wipes
 * and frees. */
static int read_key_file(char **out, size_t *len_out, const char *path, struct err *err)
{
    struct stat st;
    char *data = NULL;
    size_t size, len = 0;
    ssize_t n = 1;
    int fd, rc = E_OK;

    *out = NULL;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) != 0) {
        rc = err_set(err, errno == ENOENT ? E_NOTFOUND : E_FAIL, "github app key file %s: %s", path,
                     strerror(errno));
        goto out;
    }
    if (st.st_size < 0 || (uint64_t)st.st_size > GITHUB_AUTH_KEY_FILE_MAX) {
        rc = err_set(err, E_TOOBIG, "github app key file %s: over %u bytes", path,
                     GITHUB_AUTH_KEY_FILE_MAX);
        goto out;
    }
    size = (size_t)st.st_size;
    data = xmalloc(size + 1);
    while (len < size && n != 0) {
        n = read(fd, data + len, size - len);
        if (n < 0 && errno != EINTR) {
            rc = err_set(err, E_FAIL, "github app key file %s: %s", path, strerror(errno));
            goto out;
        }
        len += n > 0 ? (size_t)n : 0;
    }
    data[len] = '\0';
    *out = data;
    *len_out = len;
    data = NULL;
out:
    if (data != NULL) {
        OPENSSL_cleanse(data, size + 1);
        free(data);
    }
    if (fd >= 0) {
        close(fd);
    }
    return rc;
}

/* Never prompts: an encrypted key is refused instead of blocking on a terminal. */
static int no_passphrase(char *buf, int size, int rwflag, void *userdata)
{
    (void)buf;
    (void)size;
    (void)rwflag;
    (void)userdata;
    return 0;
}

int github_key_parse(EVP_PKEY **out, const char *pem, size_t len, const char *path, struct err *err)
{
    EVP_PKEY *key = NULL;
    BIO *bio = NULL;
    int rc = E_OK;

    *out = NULL;
    bio = BIO_new_mem_buf(pem, (int)len);
    if (bio == NULL) {
        rc = err_set(err, E_FAIL, "github app key: cannot allocate a bio");
        goto out;
    }
    /* PEM_read_bio_PrivateKey takes PKCS#1 and PKCS#8 alike. */
    key = PEM_read_bio_PrivateKey(bio, NULL, no_passphrase, NULL);
    if (key == NULL) {
        rc = err_set(err, E_INVALID, "github app key file %s: not an unencrypted pem private key",
                     path);
        goto out;
    }
    if (EVP_PKEY_get_base_id(key) != EVP_PKEY_RSA) {
        rc = err_set(err, E_INVALID, "github app key file %s: not an rsa key", path);
        goto out;
    }
    if (EVP_PKEY_get_bits(key) < KEY_MIN_BITS) {
        rc = err_set(err, E_INVALID, "github app key file %s: rsa key under %d bits", path,
                     KEY_MIN_BITS);
        goto out;
    }
    *out = key;
    key = NULL;
out:
    ERR_clear_error(); /* leave nothing in this thread's OpenSSL error queue */
    EVP_PKEY_free(key);
    BIO_free(bio);
    return rc;
}

int github_key_load(EVP_PKEY **out, const char *path, struct err *err)
{
    char *pem = NULL;
    size_t len = 0;
    int rc;

    *out = NULL;
    if (path == NULL || path[0] == '\0') {
        return err_set(err, E_INVALID, "github app key file not set");
    }
    rc = read_key_file(&pem, &len, path, err);
    if (rc == E_OK) {
        rc = github_key_parse(out, pem, len, path, err);
        OPENSSL_cleanse(pem, len);
    }
    free(pem);
    return rc;
}

/* Bytes the unpadded base64url form of N bytes takes, plus room for EVP_EncodeBlock's
 * padding and NUL. */
static size_t b64url_room(size_t n)
{
    return 4 * ((n + 2) / 3) + 1;
}

/* Writes the unpadded base64url form of D[0..n) at DST (b64url_room(N) bytes) and
 * returns its length; DST is NUL-terminated. */
static size_t b64url(char *dst, const void *d, size_t n)
{
    unsigned char *u = (unsigned char *)dst;
    int len = EVP_EncodeBlock(u, d, (int)n);

    while (len > 0 && u[len - 1] == '=') {
        len--;
    }
    u[len] = '\0';
    for (int i = 0; i < len; i++) {
        u[i] = u[i] == '+' ? '-' : u[i] == '/' ? '_' : u[i];
    }
    return (size_t)len;
}

static int rs256_sign(unsigned char **sig_out, size_t *len_out, EVP_PKEY *key, const void *data,
                      size_t len, struct err *err)
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned char *sig = NULL;
    size_t sig_len = 0;
    int rc = E_OK;

    *sig_out = NULL;
    /* RSA keys sign with PKCS#1 v1.5 padding unless told otherwise: RS256 exactly. */
    if (ctx == NULL || EVP_DigestSignInit(ctx, NULL, EVP_sha256(), NULL, key) != 1 ||
        EVP_DigestSign(ctx, NULL, &sig_len, data, len) != 1) {
        rc = err_set(err, E_FAIL, "github app jwt: rs256 signing setup failed");
        goto out;
    }
    sig = xmalloc(sig_len);
    if (EVP_DigestSign(ctx, sig, &sig_len, data, len) != 1) {
        rc = err_set(err, E_FAIL, "github app jwt: rs256 signing failed");
        goto out;
    }
    *sig_out = sig;
    *len_out = sig_len;
    sig = NULL;
out:
    ERR_clear_error();
    free(sig);
    EVP_MD_CTX_free(ctx);
    return rc;
}

int github_jwt_rs256(char **jwt_out, EVP_PKEY *key, const char *claims, struct err *err)
{
    unsigned char *sig = NULL;
    size_t sig_len = 0, room, len;
    char *jwt = NULL;
    int rc;

    *jwt_out = NULL;
    /* One allocation of the final size: the signature is at most EVP_PKEY_get_size(). */
    room = b64url_room(strlen(JWT_HEADER)) + b64url_room(strlen(claims)) +
           b64url_room((size_t)EVP_PKEY_get_size(key));
    jwt = xmalloc(room);
    len = b64url(jwt, JWT_HEADER, strlen(JWT_HEADER));
    jwt[len++] = '.';
    len += b64url(jwt + len, claims, strlen(claims));
    rc = rs256_sign(&sig, &sig_len, key, jwt, len, err);
    if (rc != E_OK) {
        goto out;
    }
    ASSERT(sig_len <= (size_t)EVP_PKEY_get_size(key));
    jwt[len++] = '.';
    b64url(jwt + len, sig, sig_len);
    *jwt_out = jwt;
    jwt = NULL;
out:
    free(sig);
    if (jwt != NULL) {
        OPENSSL_cleanse(jwt, room);
        free(jwt);
    }
    return rc;
}
