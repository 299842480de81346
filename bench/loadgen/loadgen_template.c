/* SPDX-License-Identifier: Apache-2.0 */
/* loadgen's request bodies: the template split at its placeholders, the HMAC-SHA256 midstate
 * over the key block and the constant prefix, and each request built and signed in place. */
#include "loadgen_int.h"

#include <errno.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum seg_kind { SEG_LIT, SEG_ID, SEG_BODY };
struct seg {
    enum seg_kind kind;
    const char *p;
    size_t n;
};
static struct seg *segs;
static size_t nsegs;
char *tmpl;
static size_t tmpl_len;
size_t const_prefix;
static char body_json[512]; /* the comment text, JSON-escaped */
static size_t body_json_len;
size_t body_max;
static uint8_t key_block[64];
static SHA256_CTX inner_mid, outer_mid; /* after K^ipad (+ aligned prefix), after K^opad */
size_t mid_aligned;
char hdr_const[1024];
size_t hdr_const_len;
char raw_req[2600];
size_t raw_req_len;
uint32_t nonce32;
uint16_t nonce16;

static const char hexd[] = "0123456789abcdef";

void hex32(char out[64], const uint8_t d[32])
{
    for (int i = 0; i < 32; i++) {
        out[2 * i] = hexd[d[i] >> 4];
        out[2 * i + 1] = hexd[d[i] & 15];
    }
}

void json_escape(const char *s)
{
    size_t o = 0;
    for (; *s != '\0'; s++) {
        unsigned char c = (unsigned char)*s;
        if (o + 7 >= sizeof(body_json))
            die("--body is too long");
        if (c == '"' || c == '\\') {
            body_json[o++] = '\\';
            body_json[o++] = (char)c;
        } else if (c == '\n') {
            body_json[o++] = '\\';
            body_json[o++] = 'n';
        } else if (c < 0x20) {
            o += (size_t)snprintf(body_json + o, 7, "\\u%04x", c);
        } else {
            body_json[o++] = (char)c;
        }
    }
    body_json[o] = '\0';
    body_json_len = o;
}

/* Reads opt.template_path into tmpl without trailing newlines. */
static void read_template(void)
{
    FILE *f = fopen(opt.template_path, "rb");
    long n;
    if (f == NULL)
        die("cannot open %s: %s", opt.template_path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0)
        die("cannot size %s", opt.template_path);
    tmpl = malloc((size_t)n + 1);
    if (tmpl == NULL || fread(tmpl, 1, (size_t)n, f) != (size_t)n)
        die("cannot read %s", opt.template_path);
    fclose(f);
    tmpl_len = (size_t)n;
    while (tmpl_len > 0 && (tmpl[tmpl_len - 1] == '\n' || tmpl[tmpl_len - 1] == '\r'))
        tmpl_len--;
    tmpl[tmpl_len] = '\0';
}

/* The first placeholder in [p, end), or NULL; *kind and *len say which it is. */
static const char *next_placeholder(const char *p, const char *end, enum seg_kind *kind,
                                    size_t *len)
{
    const char *a = memmem(p, (size_t)(end - p), "__COMMENT_ID__", 14);
    const char *b = memmem(p, (size_t)(end - p), "__BODY__", 8);
    if (b != NULL && (a == NULL || b < a)) {
        *kind = SEG_BODY;
        *len = 8;
        return b;
    }
    *kind = SEG_ID;
    *len = 14;
    return a;
}

static void add_seg(enum seg_kind k, const char *p, size_t n)
{
    segs[nsegs++] = (struct seg){k, p, n};
    body_max += k == SEG_LIT ? n : k == SEG_ID ? 20 : body_json_len;
}

void load_template(void)
{
    read_template();
    segs = calloc(tmpl_len + 1, sizeof(*segs));
    const char *p = tmpl, *end = tmpl + tmpl_len;
    bool have_id = false;
    const_prefix = SIZE_MAX;
    body_max = 0;
    while (p < end) {
        enum seg_kind k;
        size_t plen;
        const char *q = next_placeholder(p, end, &k, &plen);
        if (q == NULL) {
            add_seg(SEG_LIT, p, (size_t)(end - p));
            break;
        }
        if (q > p)
            add_seg(SEG_LIT, p, (size_t)(q - p));
        if (const_prefix == SIZE_MAX)
            const_prefix = (size_t)(q - tmpl);
        add_seg(k, NULL, 0);
        have_id |= k == SEG_ID;
        p = q + plen;
    }
    if (!have_id)
        die("template %s has no __COMMENT_ID__ placeholder: requests would not be unique",
            opt.template_path);
    if (const_prefix == SIZE_MAX)
        const_prefix = tmpl_len;
}

void hmac_setup(void)
{
    uint8_t pad[64];
    size_t klen = strlen(opt.secret);
    memset(key_block, 0, sizeof(key_block));
    if (klen > 64) {
        SHA256((const uint8_t *)opt.secret, klen, key_block);
    } else {
        memcpy(key_block, opt.secret, klen);
    }
    for (int i = 0; i < 64; i++)
        pad[i] = key_block[i] ^ 0x36;
    SHA256_Init(&inner_mid);
    SHA256_Update(&inner_mid, pad, 64);
    mid_aligned = opt.full_hmac ? 0 : const_prefix & ~(size_t)63;
    SHA256_Update(&inner_mid, tmpl, mid_aligned); /* the body starts with these bytes */
    for (int i = 0; i < 64; i++)
        pad[i] = key_block[i] ^ 0x5c;
    SHA256_Init(&outer_mid);
    SHA256_Update(&outer_mid, pad, 64);
}

static void sign_body(char out_hex[64], const char *body, size_t len)
{
    uint8_t d[32];
    if (opt.full_hmac) {
        unsigned int dl = 32;
        HMAC(EVP_sha256(), opt.secret, (int)strlen(opt.secret), (const uint8_t *)body, len, d, &dl);
    } else {
        SHA256_CTX c = inner_mid;
        SHA256_Update(&c, body + mid_aligned, len - mid_aligned);
        SHA256_Final(d, &c);
        c = outer_mid;
        SHA256_Update(&c, d, 32);
        SHA256_Final(d, &c);
    }
    hex32(out_hex, d);
}

/* Writes the body for comment ID after the constant prefix already at BODY; returns its length. */
static size_t fill_body(char *body, uint64_t id)
{
    char *o = body + const_prefix; /* the constant prefix is already in place */
    for (size_t i = 0; i < nsegs; i++) {
        const struct seg *s = &segs[i];
        if (s->kind == SEG_LIT) {
            if (s->p + s->n <= tmpl + const_prefix)
                continue; /* part of the prefix */
            memcpy(o, s->p, s->n);
            o += s->n;
        } else if (s->kind == SEG_ID) {
            char num[24];
            int k = snprintf(num, sizeof(num), "%" PRIu64, id);
            memcpy(o, num, (size_t)k);
            o += k;
        } else {
            memcpy(o, body_json, body_json_len);
            o += body_json_len;
        }
    }
    return (size_t)(o - body);
}

/* --gitlab: X-Gitlab-Token (the secret; with --bad-signature a wrong one) and a unique
 * X-Gitlab-Event-UUID instead of a signature. */
static bool gitlab_headers(struct conn *c, char *body, size_t blen, uint64_t seq)
{
    struct worker *w = c->w;
    char h[HDR_ROOM];
    int hl = snprintf(h, sizeof(h),
                      "%.*sX-Gitlab-Event-UUID: %08" PRIx32 "-%04" PRIx16 "-4%03x-8%03" PRIx64
                      "-%012" PRIx64 "\r\nX-Gitlab-Token: %s%s\r\nContent-Length: %zu\r\n\r\n",
                      (int)hdr_const_len, hdr_const, nonce32, nonce16, (unsigned)(w->idx & 0xfff),
                      (uint64_t)((seq >> 48) & 0xfff), (uint64_t)(seq & 0xffffffffffffULL),
                      opt.secret, opt.bad_signature ? "x" : "", blen);
    if (hl <= 0 || (size_t)hl >= sizeof(h))
        die("request headers too long");
    memcpy(body - hl, h, (size_t)hl);
    c->wp = body - hl;
    c->wleft = (size_t)hl + blen;
    return true;
}

bool build_request(struct conn *c)
{
    struct worker *w = c->w;
    if (w->limit != 0 && w->seq >= w->limit)
        return false;
    uint64_t seq = w->seq++;
    c->seq = seq;
    if (opt.raw_get) {
        c->wp = raw_req;
        c->wleft = raw_req_len;
        return true;
    }
    /* unique in this run: thread index + per-thread counter; across runs: id_base */
    uint64_t uniq = seq * (uint64_t)opt.threads + (uint64_t)w->idx;
    char *body = c->buf + HDR_ROOM;
    size_t blen = fill_body(body, opt.id_base + uniq);
    if (opt.gitlab) {
        return gitlab_headers(c, body, blen, seq);
    }
    char sig[65];
    sign_body(sig, body, blen);
    if (opt.bad_signature)
        sig[0] = sig[0] == '0' ? '1' : '0';
    sig[64] = '\0';
    char h[HDR_ROOM];
    int hl =
        snprintf(h, sizeof(h),
                 "%.*sX-GitHub-Delivery: %08" PRIx32 "-%04" PRIx16 "-4%03x-8%03" PRIx64
                 "-%012" PRIx64 "\r\nX-Hub-Signature-256: sha256=%s\r\n"
                 "Content-Length: %zu\r\n\r\n",
                 (int)hdr_const_len, hdr_const, nonce32, nonce16, (unsigned)(w->idx & 0xfff),
                 (uint64_t)((seq >> 48) & 0xfff), (uint64_t)(seq & 0xffffffffffffULL), sig, blen);
    if (hl <= 0 || (size_t)hl >= sizeof(h))
        die("request headers too long");
    memcpy(body - hl, h, (size_t)hl);
    c->wp = body - hl;
    c->wleft = (size_t)hl + blen;
    return true;
}
