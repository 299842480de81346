/* SPDX-License-Identifier: Apache-2.0 */
/* The TLS listener's certificate: given PEM files, or a self-signed one generated once
 * into the data dir with OpenSSL (ECDSA P-256, SAN 127.0.0.1, ::1, localhost). */
#include "common/tlscert.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/secret.h"

#define VALID_DAYS 3650L

/* Reads PATH (following symbolic links) into a NUL-terminated buffer, at most
 * TLSCERT_PEM_MAX bytes. E_NOTFOUND (no message) when it does not exist. */
static int read_file(char **out, const char *path, struct err *err)
{
    char *buf = xmalloc(TLSCERT_PEM_MAX + 1);
    size_t n = 0;
    ssize_t got;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);

    *out = NULL;
    if (fd < 0) {
        int e = errno;
        free(buf);
        return e == ENOENT ? E_NOTFOUND : err_set(err, E_FAIL, "open %s: %s", path, strerror(e));
    }
    while (n < TLSCERT_PEM_MAX && (got = read(fd, buf + n, TLSCERT_PEM_MAX - n)) != 0) {
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got < 0) {
            int e = errno;
            close(fd);
            secret_wipe(buf, TLSCERT_PEM_MAX + 1);
            free(buf);
            return err_set(err, E_FAIL, "read %s: %s", path, strerror(e));
        }
        n += (size_t)got;
    }
    close(fd);
    buf[n] = '\0';
    *out = buf;
    return E_OK;
}

/* The PEM text of what WRITE puts into a memory BIO; NULL on failure. */
static char *bio_text(BIO *b)
{
    char *data = NULL;
    long n = BIO_get_mem_data(b, &data);
    char *s;

    if (n <= 0 || data == NULL) {
        return NULL;
    }
    s = xmalloc((size_t)n + 1);
    memcpy(s, data, (size_t)n);
    s[n] = '\0';
    return s;
}

static bool add_ext(X509 *x, int nid, const char *value)
{
    X509V3_CTX ctx;
    X509_EXTENSION *ext;
    bool ok;

    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, x, x, NULL, NULL, 0);
    ext = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
    if (ext == NULL) {
        return false;
    }
    ok = X509_add_ext(x, ext, -1) == 1;
    X509_EXTENSION_free(ext);
    return ok;
}

/* Serial, validity, key and names of the self-signed certificate. */
static bool fill_fields(X509 *x, EVP_PKEY *key)
{
    X509_NAME *name = X509_get_subject_name(x);
    BIGNUM *serial = BN_new();
    bool ok = serial != NULL && BN_rand(serial, 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) == 1 &&
              BN_to_ASN1_INTEGER(serial, X509_get_serialNumber(x)) != NULL;

    BN_free(serial);
    ok = ok && X509_set_version(x, 2) == 1 &&
         X509_gmtime_adj(X509_getm_notBefore(x), -3600) != NULL &&
         X509_gmtime_adj(X509_getm_notAfter(x), VALID_DAYS * 24 * 3600) != NULL &&
         X509_set_pubkey(x, key) == 1;
    ok = ok &&
         X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, (const unsigned char *)"diverge", -1,
                                    -1, 0) == 1 &&
         X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                                    (const unsigned char *)"diverge self-signed (localhost)", -1,
                                    -1, 0) == 1;
    return ok && X509_set_issuer_name(x, name) == 1;
}

/* The extensions, then the signature. */
static bool fill_cert(X509 *x, EVP_PKEY *key)
{
    bool ok = fill_fields(x, key) && add_ext(x, NID_basic_constraints, "critical,CA:TRUE") &&
              add_ext(x, NID_key_usage, "critical,digitalSignature,keyCertSign") &&
              add_ext(x, NID_ext_key_usage, "serverAuth") &&
              add_ext(x, NID_subject_key_identifier, "hash");

    ok = ok && add_ext(x, NID_authority_key_identifier, "keyid:always") &&
         add_ext(x, NID_subject_alt_name, "IP:127.0.0.1,IP:::1,DNS:localhost");
    return ok && X509_sign(x, key, EVP_sha256()) > 0;
}

/* *out: the PEM of a new self-signed certificate for KEY. */
static int make_cert(char **out, EVP_PKEY *key, struct err *err)
{
    X509 *x = X509_new();
    BIO *b = BIO_new(BIO_s_mem());
    int rc = E_OK;

    *out = NULL;
    if (x == NULL || b == NULL || !fill_cert(x, key) || PEM_write_bio_X509(b, x) != 1 ||
        (*out = bio_text(b)) == NULL) {
        rc = err_set(err, E_FAIL, "cannot build the self-signed TLS certificate");
    }
    BIO_free(b);
    X509_free(x);
    return rc;
}

/* *out: the PEM (PKCS#8) of a new P-256 key. */
static int make_key(char **out, struct err *err)
{
    EVP_PKEY *key = EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
    BIO *b = BIO_new(BIO_s_mem());
    int rc = E_OK;

    *out = NULL;
    if (key == NULL || b == NULL ||
        PEM_write_bio_PrivateKey(b, key, NULL, NULL, 0, NULL, NULL) != 1 ||
        (*out = bio_text(b)) == NULL) {
        rc = err_set(err, E_FAIL, "cannot generate the TLS key");
    }
    if (b != NULL) {
        char *data = NULL;
        long n = BIO_get_mem_data(b, &data);
        if (n > 0 && data != NULL) {
            OPENSSL_cleanse(data, (size_t)n);
        }
    }
    BIO_free(b);
    EVP_PKEY_free(key);
    return rc;
}

static EVP_PKEY *parse_key(const char *pem)
{
    BIO *b = BIO_new_mem_buf(pem, -1);
    EVP_PKEY *key = b != NULL ? PEM_read_bio_PrivateKey(b, NULL, NULL, NULL) : NULL;

    BIO_free(b);
    return key;
}

/* The generated key: loaded (as a secret file) or created. */
static int key_load_or_create(char **pem_out, bool *created, const char *path, struct err *err)
{
    size_t len = 0;
    char *pem = NULL;
    int rc = secret_file_read(pem_out, &len, path, TLSCERT_PEM_MAX, err);

    if (rc != E_NOTFOUND) {
        return rc;
    }
    rc = make_key(&pem, err);
    if (rc == E_OK) {
        rc = secret_file_write(path, pem, strlen(pem), err);
        *created = *created || rc == E_OK;
        if (rc == E_AGAIN) {
            rc = E_OK; /* someone else created it first: use theirs */
        }
    }
    if (pem != NULL) {
        secret_wipe(pem, strlen(pem));
    }
    free(pem);
    return rc == E_OK ? secret_file_read(pem_out, &len, path, TLSCERT_PEM_MAX, err) : rc;
}

/* The generated certificate: loaded or made for the key KEY_PEM. */
static int cert_load_or_create(char **pem_out, bool *created, const char *path, const char *key_pem,
                               struct err *err)
{
    EVP_PKEY *key;
    char *pem = NULL;
    int rc = read_file(pem_out, path, err);

    if (rc != E_NOTFOUND) {
        return rc;
    }
    key = parse_key(key_pem);
    if (key == NULL) {
        return err_set(err, E_INVALID, "the TLS key in the data dir is not a PEM private key");
    }
    rc = make_cert(&pem, key, err);
    EVP_PKEY_free(key);
    if (rc == E_OK) {
        rc = secret_file_write(path, pem, strlen(pem), err);
        *created = *created || rc == E_OK;
    }
    free(pem);
    if (rc != E_OK && rc != E_AGAIN) {
        return rc;
    }
    return read_file(pem_out, path, err);
}

int tlscert_load_or_create(struct tlscert *out, bool *created_out, const char *dir, struct err *err)
{
    char *key_path = xasprintf("%s/%s", dir, TLSCERT_KEY_FILE);
    char *cert_path = xasprintf("%s/%s", dir, TLSCERT_CERT_FILE);
    bool created = false;
    int rc;

    memset(out, 0, sizeof(*out));
    rc = key_load_or_create(&out->key_pem, &created, key_path, err);
    if (rc == E_OK) {
        rc = cert_load_or_create(&out->cert_pem, &created, cert_path, out->key_pem, err);
        if (rc == E_NOTFOUND) {
            rc = err_set(err, E_FAIL, "%s vanished", cert_path);
        }
    }
    if (rc != E_OK) {
        tlscert_cleanup(out);
    }
    if (created_out != NULL) {
        *created_out = created;
    }
    free(key_path);
    free(cert_path);
    return rc;
}

int tlscert_read_pem(char **out, const char *path, const char *what, struct err *err)
{
    int rc = read_file(out, path, err);

    if (rc == E_NOTFOUND) {
        return err_set(err, E_FAIL, "%s %s: no such file", what, path);
    }
    if (rc == E_OK && strstr(*out, "-----BEGIN ") == NULL) {
        free(*out);
        *out = NULL;
        return err_set(err, E_INVALID, "%s %s holds no PEM block", what, path);
    }
    return rc;
}

int tlscert_load_files(struct tlscert *out, const char *cert_path, const char *key_path,
                       struct err *err)
{
    int rc;

    memset(out, 0, sizeof(*out));
    rc = tlscert_read_pem(&out->cert_pem, cert_path, "--tls-cert-file", err);
    if (rc == E_OK) {
        rc = tlscert_read_pem(&out->key_pem, key_path, "--tls-key-file", err);
    }
    if (rc != E_OK) {
        tlscert_cleanup(out);
    }
    return rc;
}

void tlscert_cleanup(struct tlscert *c)
{
    if (c->key_pem != NULL) {
        secret_wipe(c->key_pem, strlen(c->key_pem));
    }
    free(c->key_pem);
    free(c->cert_pem);
    c->key_pem = NULL;
    c->cert_pem = NULL;
}

char *tlscert_base64(const void *data, size_t len)
{
    char *out = xmalloc(4 * ((len + 2) / 3) + 1);

    (void)EVP_EncodeBlock((unsigned char *)out, data, (int)len);
    return out;
}
