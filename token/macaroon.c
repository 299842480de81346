/* SPDX-License-Identifier: Apache-2.0 */
/* Macaroon core: mint, attenuate, V2 binary (de)serialization and the signature chain
 * (libmacaroons construction). Invariant: a struct token's fields never hold NUL bytes,
 * so they are plain C strings, and a decoded token has first-party caveats only. */
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/secret.h"
#include "token/token.h"
#include "token/token_int.h"

#define TOKEN_V2 2
/* V2 field types (libmacaroons/pymacaroons). */
#define FIELD_EOS 0
#define FIELD_LOCATION 1
#define FIELD_IDENTIFIER 2
#define FIELD_VID 4
#define FIELD_SIGNATURE 6

static const char KEY_GENERATOR[] = "macaroons-key-generator";

struct token {
    char *location;                   /* owned; NULL when absent */
    char *identifier;                 /* owned; never empty */
    char **caveats;                   /* owned array of n_caveats owned predicates */
    size_t n_caveats;                 /* caveats in use */
    unsigned char sig[TOKEN_SIG_LEN]; /* the chained HMAC-SHA256 */
};

static int hmac(unsigned char out[TOKEN_SIG_LEN], const unsigned char *key, size_t key_len,
                const void *data, size_t len, struct err *err)
{
    unsigned int out_len = 0;

    if (HMAC(EVP_sha256(), key, (int)key_len, data, len, out, &out_len) == NULL ||
        out_len != TOKEN_SIG_LEN) {
        return err_set(err, E_FAIL, "hmac-sha256 failed");
    }
    return E_OK;
}

/* A string field is non-empty, capped and free of NUL bytes (checked by the caller
 * for decoded bytes; strlen() guarantees it for C strings). */
static int check_field(const char *s, const char *what, struct err *err)
{
    size_t len = s != NULL ? strlen(s) : 0;

    if (len == 0) {
        return err_set(err, E_INVALID, "empty %s", what);
    }
    if (len > TOKEN_FIELD_MAX) {
        return err_set(err, E_INVALID, "%s longer than %d bytes", what, TOKEN_FIELD_MAX);
    }
    return E_OK;
}

void token_free(struct token *t)
{
    if (t == NULL) {
        return;
    }
    for (size_t i = 0; i < t->n_caveats; i++) {
        free(t->caveats[i]);
    }
    free(t->caveats);
    free(t->location);
    free(t->identifier);
    OPENSSL_cleanse(t->sig, sizeof(t->sig));
    free(t);
}

int token_mint(struct token **out, const unsigned char root_key[TOKEN_ROOT_KEY_LEN],
               const char *location, const char *identifier, struct err *err)
{
    unsigned char derived[TOKEN_SIG_LEN];
    struct token *t = NULL;
    int rc;

    *out = NULL;
    rc = check_field(identifier, "identifier", err);
    if (rc == E_OK && location != NULL) {
        rc = check_field(location, "location", err);
    }
    if (rc != E_OK) {
        return rc;
    }
    t = xcalloc(1, sizeof(*t));
    t->identifier = xstrdup(identifier);
    t->location = location != NULL ? xstrdup(location) : NULL;
    rc = hmac(derived, (const unsigned char *)KEY_GENERATOR, strlen(KEY_GENERATOR), root_key,
              TOKEN_ROOT_KEY_LEN, err);
    if (rc != E_OK) {
        goto out;
    }
    rc = hmac(t->sig, derived, sizeof(derived), identifier, strlen(identifier), err);
    if (rc != E_OK) {
        goto out;
    }
    *out = t;
    t = NULL;
out:
    OPENSSL_cleanse(derived, sizeof(derived));
    token_free(t);
    return rc;
}

/* Appends an owned predicate without touching the signature (decoding). */
static int push_caveat(struct token *t, char *predicate, struct err *err)
{
    if (t->n_caveats >= TOKEN_CAVEATS_MAX) {
        free(predicate);
        return err_set(err, E_TOOBIG, "more than %d caveats", TOKEN_CAVEATS_MAX);
    }
    if (t->n_caveats == 0) {
        t->caveats = xcalloc(TOKEN_CAVEATS_MAX, sizeof(*t->caveats));
    }
    t->caveats[t->n_caveats++] = predicate;
    return E_OK;
}

int token_add_caveat(struct token *t, const char *predicate, struct err *err)
{
    unsigned char next[TOKEN_SIG_LEN];
    int rc;

    rc = check_field(predicate, "caveat", err);
    if (rc != E_OK) {
        return rc;
    }
    if (t->n_caveats >= TOKEN_CAVEATS_MAX) {
        return err_set(err, E_TOOBIG, "more than %d caveats", TOKEN_CAVEATS_MAX);
    }
    rc = hmac(next, t->sig, sizeof(t->sig), predicate, strlen(predicate), err);
    if (rc != E_OK) {
        return rc;
    }
    rc = push_caveat(t, xstrdup(predicate), err);
    if (rc == E_OK) {
        memcpy(t->sig, next, sizeof(next));
    }
    OPENSSL_cleanse(next, sizeof(next));
    return rc;
}

const char *token_location(const struct token *t)
{
    return t->location;
}

const char *token_identifier(const struct token *t)
{
    return t->identifier;
}

size_t token_caveat_count(const struct token *t)
{
    return t->n_caveats;
}

const char *token_caveat(const struct token *t, size_t index)
{
    ASSERT(index < t->n_caveats);
    return t->caveats[index];
}

void token_signature(unsigned char out[TOKEN_SIG_LEN], const struct token *t)
{
    memcpy(out, t->sig, TOKEN_SIG_LEN);
}

int token_verify_signature(const struct token *t, const unsigned char root_key[TOKEN_ROOT_KEY_LEN],
                           struct err *err)
{
    unsigned char sig[TOKEN_SIG_LEN], next[TOKEN_SIG_LEN];
    struct token *fresh = NULL;
    int rc;

    /* Re-derive the chain from the root key; token_mint() checks the identifier. */
    rc = token_mint(&fresh, root_key, NULL, t->identifier, err);
    if (rc != E_OK) {
        return rc == E_INVALID ? err_set(err, E_DENIED, "invalid identifier") : rc;
    }
    memcpy(sig, fresh->sig, sizeof(sig));
    for (size_t i = 0; i < t->n_caveats; i++) {
        rc = hmac(next, sig, sizeof(sig), t->caveats[i], strlen(t->caveats[i]), err);
        if (rc != E_OK) {
            goto out;
        }
        memcpy(sig, next, sizeof(sig));
    }
    /* CRYPTO_memcmp: an early exit would tell a forger how many leading bytes match. */
    if (CRYPTO_memcmp(sig, t->sig, sizeof(sig)) != 0) {
        rc = err_set(err, E_DENIED, "signature mismatch");
    }
out:
    OPENSSL_cleanse(sig, sizeof(sig));
    OPENSSL_cleanse(next, sizeof(next));
    token_free(fresh);
    return rc;
}

/* ---- V2 binary encoding ---- */

/* The buffer has no cap, so appending cannot fail (allocation failure aborts). */
static void append(struct buf *b, const void *data, size_t n)
{
    int rc = buf_append(b, data, n);

    ASSERT(rc == E_OK);
}

static void put_varint(struct buf *b, uint64_t v)
{
    unsigned char tmp[10];
    size_t n = 0;

    while (v >= 0x80) {
        tmp[n++] = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    tmp[n++] = (unsigned char)v;
    append(b, tmp, n);
}

static void put_field(struct buf *b, unsigned type, const void *data, size_t len)
{
    put_varint(b, type);
    put_varint(b, len);
    append(b, data, len);
}

static void put_eos(struct buf *b)
{
    put_varint(b, FIELD_EOS);
}

void token_encode(char **out, const struct token *t)
{
    struct buf b;
    unsigned char version = TOKEN_V2;

    buf_init(&b, 0);
    append(&b, &version, 1);
    if (t->location != NULL) {
        put_field(&b, FIELD_LOCATION, t->location, strlen(t->location));
    }
    put_field(&b, FIELD_IDENTIFIER, t->identifier, strlen(t->identifier));
    put_eos(&b);
    for (size_t i = 0; i < t->n_caveats; i++) {
        put_field(&b, FIELD_IDENTIFIER, t->caveats[i], strlen(t->caveats[i]));
        put_eos(&b);
    }
    put_eos(&b);
    put_field(&b, FIELD_SIGNATURE, t->sig, sizeof(t->sig));
    token_b64_encode(out, (const unsigned char *)b.data, b.len);
    buf_cleanup(&b);
}

/* ---- V2 binary decoding ---- */

struct reader {
    const unsigned char *p; /* next unread byte (borrowed) */
    size_t left;            /* bytes left */
};

/* A minimal varint of at most 4 bytes (every length here is far below 2^28). */
static int get_varint(uint64_t *out, struct reader *r)
{
    uint64_t v = 0;

    for (unsigned shift = 0; shift < 28; shift += 7) {
        unsigned char c;
        if (r->left == 0) {
            return E_INVALID;
        }
        c = *r->p++;
        r->left--;
        v |= (uint64_t)(c & 0x7f) << shift;
        if ((c & 0x80) == 0) {
            /* A zero final byte after a continuation is a non-minimal encoding. */
            if (c == 0 && shift > 0) {
                return E_INVALID;
            }
            *out = v;
            return E_OK;
        }
    }
    return E_INVALID;
}

/* Reads the next field's type; for anything but EOS also its payload, which must fit. */
static int get_field(uint64_t *type_out, const unsigned char **data_out, size_t *len_out,
                     struct reader *r)
{
    uint64_t len;

    *data_out = NULL;
    *len_out = 0;
    if (get_varint(type_out, r) != E_OK) {
        return E_INVALID;
    }
    if (*type_out == FIELD_EOS) {
        return E_OK;
    }
    if (get_varint(&len, r) != E_OK || len > r->left) {
        return E_INVALID;
    }
    *data_out = r->p;
    *len_out = (size_t)len;
    r->p += len;
    r->left -= (size_t)len;
    return E_OK;
}

/* Copies a string payload: non-empty, capped, no NUL. NULL when it breaks a rule. */
static char *field_string(const unsigned char *data, size_t len)
{
    if (len == 0 || len > TOKEN_FIELD_MAX || memchr(data, '\0', len) != NULL) {
        return NULL;
    }
    return xstrndup((const char *)data, len);
}

/* Reads "[location] identifier EOS" of the header into T. */
static int decode_header(struct token *t, struct reader *r, struct err *err)
{
    const unsigned char *data;
    uint64_t type;
    size_t len;

    if (get_field(&type, &data, &len, r) != E_OK) {
        return err_set(err, E_INVALID, "truncated token header");
    }
    if (type == FIELD_LOCATION) {
        t->location = field_string(data, len);
        if (t->location == NULL) {
            return err_set(err, E_INVALID, "invalid token location");
        }
        if (get_field(&type, &data, &len, r) != E_OK) {
            return err_set(err, E_INVALID, "truncated token header");
        }
    }
    if (type != FIELD_IDENTIFIER) {
        return err_set(err, E_INVALID, "token identifier missing");
    }
    t->identifier = field_string(data, len);
    if (t->identifier == NULL) {
        return err_set(err, E_INVALID, "invalid token identifier");
    }
    if (get_field(&type, &data, &len, r) != E_OK || type != FIELD_EOS) {
        return err_set(err, E_INVALID, "unexpected field in token header");
    }
    return E_OK;
}

/* Reads caveat sections up to the empty section that ends them. */
static int decode_caveats(struct token *t, struct reader *r, struct err *err)
{
    for (;;) {
        const unsigned char *data;
        uint64_t type;
        size_t len;
        char *predicate;
        int rc;

        if (get_field(&type, &data, &len, r) != E_OK) {
            return err_set(err, E_INVALID, "truncated caveat");
        }
        if (type == FIELD_EOS) {
            return E_OK;
        }
        /* A caveat location or vid only exists on third-party caveats: unsupported. */
        if (type == FIELD_LOCATION) {
            return err_set(err, E_INVALID, "third-party caveats are not supported");
        }
        if (type != FIELD_IDENTIFIER) {
            return err_set(err, E_INVALID, "unsupported caveat field %llu",
                           (unsigned long long)type);
        }
        predicate = field_string(data, len);
        if (predicate == NULL) {
            return err_set(err, E_INVALID, "invalid caveat");
        }
        rc = push_caveat(t, predicate, err);
        if (rc != E_OK) {
            return rc;
        }
        if (get_field(&type, &data, &len, r) != E_OK) {
            return err_set(err, E_INVALID, "truncated caveat");
        }
        if (type == FIELD_VID) {
            return err_set(err, E_INVALID, "third-party caveats are not supported");
        }
        if (type != FIELD_EOS) {
            return err_set(err, E_INVALID, "unexpected field in caveat");
        }
    }
}

static int decode_binary(struct token *t, const unsigned char *bin, size_t bin_len, struct err *err)
{
    struct reader r = {.p = bin, .left = bin_len};
    const unsigned char *data;
    uint64_t type;
    size_t len;
    int rc;

    if (r.left == 0 || *r.p != TOKEN_V2) {
        return err_set(err, E_INVALID, "not a version 2 macaroon");
    }
    r.p++;
    r.left--;
    rc = decode_header(t, &r, err);
    if (rc == E_OK) {
        rc = decode_caveats(t, &r, err);
    }
    if (rc != E_OK) {
        return rc;
    }
    if (get_field(&type, &data, &len, &r) != E_OK || type != FIELD_SIGNATURE ||
        len != TOKEN_SIG_LEN) {
        return err_set(err, E_INVALID, "missing or malformed signature");
    }
    memcpy(t->sig, data, TOKEN_SIG_LEN);
    if (r.left != 0) {
        return err_set(err, E_INVALID, "trailing bytes after signature");
    }
    return E_OK;
}

int token_decode(struct token **out, const char *s, size_t len, struct err *err)
{
    unsigned char *bin = NULL;
    size_t bin_len = 0;
    struct token *t = NULL;
    int rc;

    *out = NULL;
    if (len > TOKEN_ENCODED_MAX) {
        return err_set(err, E_TOOBIG, "token longer than %d characters", TOKEN_ENCODED_MAX);
    }
    if (token_b64_decode(&bin, &bin_len, s, len) != E_OK) {
        return err_set(err, E_INVALID, "token is not base64");
    }
    t = xcalloc(1, sizeof(*t));
    rc = decode_binary(t, bin, bin_len, err);
    if (rc != E_OK) {
        goto out;
    }
    *out = t;
    t = NULL;
out:
    token_free(t);
    free(bin);
    return rc;
}

/* ---- printing ---- */

static void print_escaped(FILE *f, const char *label, const char *s)
{
    fprintf(f, "%s: ", label);
    for (const unsigned char *p = (const unsigned char *)s; *p != '\0'; p++) {
        if (*p >= 0x20 && *p < 0x7f && *p != '\\') {
            fputc(*p, f);
        } else {
            fprintf(f, "\\x%02x", *p);
        }
    }
    fputc('\n', f);
}

void token_fingerprint(char out[TOKEN_FINGERPRINT_MAX], const struct token *t)
{
    unsigned char digest[EVP_MAX_MD_SIZE];
    char hex[2 * TOKEN_FINGERPRINT_BYTES + 1];
    unsigned int n = 0;

    /* SHA-256 cannot fail on a fixed 32-byte input short of a broken libcrypto. */
    ASSERT(EVP_Digest(t->sig, sizeof(t->sig), digest, &n, EVP_sha256(), NULL) == 1 && n == 32);
    secret_hex(hex, digest, TOKEN_FINGERPRINT_BYTES);
    snprintf(out, TOKEN_FINGERPRINT_MAX, "sha256:%s", hex);
    OPENSSL_cleanse(digest, sizeof(digest));
}

void token_print(FILE *f, const struct token *t)
{
    char fp[TOKEN_FINGERPRINT_MAX];

    print_escaped(f, "location", t->location != NULL ? t->location : "");
    print_escaped(f, "identifier", t->identifier);
    for (size_t i = 0; i < t->n_caveats; i++) {
        print_escaped(f, "caveat", t->caveats[i]);
    }
    /* Never the signature itself: with the fields above it IS the token (SPEC §8). */
    token_fingerprint(fp, t);
    fprintf(f, "fingerprint: %s (a hash of the signature, not the signature)\n", fp);
}
