/* SPDX-License-Identifier: Apache-2.0 */
/* Capped growable buffer. */
#include "common/buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void buf_init(struct buf *b, size_t max)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    b->max = max;
}

void buf_cleanup(struct buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
}

void buf_reserve(struct buf *b, size_t n)
{
    if (b->max != 0 && n > b->max) {
        n = b->max;
    }
    if (n + 1 > b->cap) {
        b->data = xrealloc(b->data, n + 1);
        b->cap = n + 1;
        b->data[b->len] = '\0';
    }
}

int buf_append(struct buf *b, const void *data, size_t n)
{
    if (b->max != 0 && (n > b->max || b->len > b->max - n)) {
        return E_TOOBIG;
    }
    if (b->len + n + 1 > b->cap) {
        size_t ncap = b->cap == 0 ? 256 : b->cap;
        while (ncap < b->len + n + 1) {
            ncap *= 2;
        }
        b->data = xrealloc(b->data, ncap);
        b->cap = ncap;
    }
    if (n > 0) {
        memcpy(b->data + b->len, data, n);
    }
    b->len += n;
    b->data[b->len] = '\0';
    return E_OK;
}

int buf_puts(struct buf *b, const char *s)
{
    return buf_append(b, s, strlen(s));
}

int buf_printf(struct buf *b, const char *fmt, ...)
{
    va_list ap;
    char small[512];
    char *big;
    int n, rc;

    va_start(ap, fmt);
    n = vsnprintf(small, sizeof(small), fmt, ap);
    va_end(ap);
    ASSERT(n >= 0);
    if ((size_t)n < sizeof(small)) {
        return buf_append(b, small, (size_t)n);
    }
    big = xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    rc = buf_append(b, big, (size_t)n);
    free(big);
    return rc;
}

char *buf_take(struct buf *b)
{
    char *d = b->data;

    if (d == NULL) {
        d = xstrdup("");
    }
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    return d;
}
