/* SPDX-License-Identifier: Apache-2.0 */
/* A growable byte buffer with a hard cap: appending past the cap is E_TOOBIG, never a
 * silent truncation. The data is always NUL-terminated for convenience. */
#ifndef DIVERGE_COMMON_BUF_H
#define DIVERGE_COMMON_BUF_H

#include <stddef.h>

#include "common/err.h"

struct buf {
    char *data; /* owned; NUL-terminated; NULL until the first append */
    size_t len; /* bytes used, excluding the NUL */
    size_t cap; /* bytes allocated */
    size_t max; /* cap on len; 0 means no cap */
};

/* Prepares B (caller storage) with the byte cap MAX (0: unlimited). */
void buf_init(struct buf *b, size_t max);
/* Releases B's memory; B may be reused after buf_init. */
void buf_cleanup(struct buf *b);
/* Makes room for N bytes in all (within the cap; more is ignored): one allocation when
 * the final size is known up front. */
void buf_reserve(struct buf *b, size_t n);
/* Appends N bytes; E_TOOBIG when the cap would be exceeded (B unchanged). */
int buf_append(struct buf *b, const void *data, size_t n);
/* Appends a NUL-terminated string. */
int buf_puts(struct buf *b, const char *s);
/* Appends formatted text. */
int buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Moves the data out: caller frees with free(). B is left empty. Never NULL. */
char *buf_take(struct buf *b);

#endif
