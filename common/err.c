/* SPDX-License-Identifier: Apache-2.0 */
/* err_set and friends; allocation wrappers that abort on out-of-memory. */
#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define UTF8_REPLACEMENT "\xef\xbf\xbd" /* U+FFFD */

/* Well-formed lead bytes of multi-byte UTF-8 (Unicode Table 3-7): the range of the second
 * byte excludes overlongs (E0, F0), surrogates (ED) and code points past U+10FFFF (F4). */
static const struct utf8_lead {
    unsigned char first, last; /* lead byte range */
    unsigned char len;         /* sequence length */
    unsigned char lo, hi;      /* allowed range of the second byte */
} utf8_leads[] = {
    {0xc2, 0xdf, 2, 0x80, 0xbf}, {0xe0, 0xe0, 3, 0xa0, 0xbf}, {0xe1, 0xec, 3, 0x80, 0xbf},
    {0xed, 0xed, 3, 0x80, 0x9f}, {0xee, 0xef, 3, 0x80, 0xbf}, {0xf0, 0xf0, 4, 0x90, 0xbf},
    {0xf1, 0xf3, 4, 0x80, 0xbf}, {0xf4, 0xf4, 4, 0x80, 0x8f},
};

static const struct utf8_lead *utf8_lead_of(unsigned char c)
{
    for (size_t i = 0; i < sizeof(utf8_leads) / sizeof(utf8_leads[0]); i++) {
        if (c >= utf8_leads[i].first && c <= utf8_leads[i].last) {
            return &utf8_leads[i];
        }
    }
    return NULL;
}

size_t err_utf8_char_len(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    const struct utf8_lead *lead;

    if (n == 0) {
        return 0;
    }
    if (u[0] < 0x80) {
        return 1;
    }
    lead = utf8_lead_of(u[0]);
    if (lead == NULL || n < lead->len || u[1] < lead->lo || u[1] > lead->hi) {
        return 0;
    }
    for (size_t i = 2; i < lead->len; i++) {
        if (u[i] < 0x80 || u[i] > 0xbf) {
            return 0;
        }
    }
    return lead->len;
}

size_t err_utf8_copy(char *dst, size_t cap, const char *src, size_t len)
{
    size_t out = 0, i = 0;

    ASSERT(cap > 0);
    while (i < len) {
        size_t n = err_utf8_char_len(src + i, len - i);
        const char *from = n > 0 ? src + i : UTF8_REPLACEMENT;
        size_t width = n > 0 ? n : strlen(UTF8_REPLACEMENT);

        if (out + width > cap - 1) {
            break;
        }
        memcpy(dst + out, from, width);
        out += width;
        i += n > 0 ? n : 1;
    }
    dst[out] = '\0';
    return out;
}

void err_vformat(char msg[ERR_MSG_MAX], const char *fmt, va_list ap)
{
    /* Twice the room: every source byte yields at least one output byte, so the copy
     * below stops long before a character vsnprintf may have cut at the end of TMP. */
    char tmp[2 * ERR_MSG_MAX];
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);

    if (n < 0) {
        tmp[0] = '\0';
        n = 0;
    }
    err_utf8_copy(msg, ERR_MSG_MAX, tmp, (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

__attribute__((format(printf, 4, 0))) static void
err_vset(struct err *err, int code, const char *field, const char *fmt, va_list ap)
{
    err->code = code;
    err_vformat(err->msg, fmt, ap);
    err_utf8_copy(err->field, sizeof(err->field), field != NULL ? field : "",
                  field != NULL ? strlen(field) : 0);
}

int err_set(struct err *err, int code, const char *fmt, ...)
{
    va_list ap;

    if (err == NULL) {
        return code;
    }
    va_start(ap, fmt);
    err_vset(err, code, NULL, fmt, ap);
    va_end(ap);
    return code;
}

int err_set_field(struct err *err, int code, const char *field, const char *fmt, ...)
{
    va_list ap;

    if (err == NULL) {
        return code;
    }
    va_start(ap, fmt);
    err_vset(err, code, field, fmt, ap);
    va_end(ap);
    return code;
}

void err_clear(struct err *err)
{
    if (err != NULL) {
        memset(err, 0, sizeof(*err));
    }
}

const char *err_code_name(int code)
{
    switch (code) {
    case E_OK:
        return "ok";
    case E_INVALID:
        return "invalid";
    case E_NOTFOUND:
        return "not found";
    case E_CONFLICT:
        return "conflict";
    case E_DENIED:
        return "denied";
    case E_TOOBIG:
        return "too big";
    case E_AGAIN:
        return "again";
    default:
        return "failed";
    }
}

static void *check_alloc(void *p)
{
    if (p == NULL) {
        fputs("diverge: out of memory\n", stderr);
        abort();
    }
    return p;
}

void *xmalloc(size_t n)
{
    return check_alloc(malloc(n == 0 ? 1 : n));
}

void *xcalloc(size_t count, size_t n)
{
    return check_alloc(calloc(count == 0 ? 1 : count, n == 0 ? 1 : n));
}

void *xrealloc(void *p, size_t n)
{
    return check_alloc(realloc(p, n == 0 ? 1 : n));
}

char *xstrdup(const char *s)
{
    return check_alloc(strdup(s));
}

char *xstrndup(const char *s, size_t n)
{
    return check_alloc(strndup(s, n));
}

char *xasprintf(const char *fmt, ...)
{
    va_list ap;
    int n;
    char *s;

    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    ASSERT(n >= 0);
    s = xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

void assert_fail(const char *expr, const char *file, int line)
{
    fprintf(stderr, "diverge: assertion failed: %s at %s:%d\n", expr, file, line);
    abort();
}
