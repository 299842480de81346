/* SPDX-License-Identifier: Apache-2.0 */
/* err_set and friends; allocation wrappers that abort on out-of-memory. */
#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((format(printf, 4, 0))) static void err_vset(struct err *err, int code,
                                                           const char *field, const char *fmt,
                                                           va_list ap)
{
    err->code = code;
    vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    snprintf(err->field, sizeof(err->field), "%s", field != NULL ? field : "");
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
