/* SPDX-License-Identifier: Apache-2.0 */
/* Error codes, the caller-owned error detail, allocation that aborts on OOM, and ASSERT.
 * Every fallible function returns 0 (E_OK) or a negative enum err_code. */
#ifndef DIVERGE_COMMON_ERR_H
#define DIVERGE_COMMON_ERR_H

#include <stdarg.h>
#include <stddef.h>

enum err_code {
    E_OK = 0,
    E_FAIL = -1,     /* internal or I/O failure */
    E_INVALID = -2,  /* bad input */
    E_NOTFOUND = -3, /* no such object */
    E_CONFLICT = -4, /* exists already, or stale version */
    E_DENIED = -5,   /* not allowed */
    E_TOOBIG = -6,   /* over a size or value cap */
    E_AGAIN = -7,    /* try again later */
};

#define ERR_MSG_MAX 512

struct err {
    int code;              /* the code last set, E_OK when none */
    char msg[ERR_MSG_MAX]; /* lower-case one-line message, no secrets */
    char field[128];       /* optional field path (e.g. "spec.budgetUSD"), empty when none */
};

/* Records CODE and a printf-style message in ERR (which may be NULL); returns CODE. The
 * stored message is always valid UTF-8: bytes that are not (say, a percent-decoded request
 * path) become U+FFFD, and a message longer than ERR_MSG_MAX - 1 bytes is cut on a
 * character boundary, so it can always go into a JSON body or a log line. */
int err_set(struct err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* As err_set, also recording the field path FIELD the message is about. */
int err_set_field(struct err *err, int code, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Length (1 to 4) of the well-formed UTF-8 character at S, of which N bytes are
 * available; 0 when the bytes there are not one (stray continuation byte, overlong form,
 * surrogate, beyond U+10FFFF, or cut short by N). */
size_t err_utf8_char_len(const char *s, size_t n);

/* Copies LEN bytes of SRC into DST (CAP bytes, CAP > 0) as valid UTF-8: every byte that
 * does not start a well-formed character becomes U+FFFD, and when DST is full the copy
 * stops before the first character that does not fit. DST is always NUL-terminated.
 * Returns the bytes written, without the NUL. */
size_t err_utf8_copy(char *dst, size_t cap, const char *src, size_t len);

/* Formats FMT/AP into MSG as valid UTF-8 of at most ERR_MSG_MAX - 1 bytes, cut on a
 * character boundary (as err_set stores its message); building it cannot fail. */
void err_vformat(char msg[ERR_MSG_MAX], const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));

/* Clears ERR (may be NULL). */
void err_clear(struct err *err);

/* Short name of CODE ("invalid", "not found", ...). Never NULL. */
const char *err_code_name(int code);

/* Allocation: abort the process when memory runs out. */
void *xmalloc(size_t n);
void *xcalloc(size_t count, size_t n);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xstrndup(const char *s, size_t n);
/* Returns a newly allocated formatted string; caller frees with free(). */
char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Invariant check that stays in release builds: logs file and line, then aborts. */
void assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));
#define ASSERT(expr_) ((expr_) ? (void)0 : assert_fail(#expr_, __FILE__, __LINE__))

#ifndef container_of
#define container_of(ptr_, type_, member_)                                                         \
    ((type_ *)(void *)((char *)(ptr_)-offsetof(type_, member_)))
#endif

#define ARRAY_LEN(a_) (sizeof(a_) / sizeof((a_)[0]))

#endif
