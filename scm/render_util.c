/* SPDX-License-Identifier: Apache-2.0 */
/* The renderer's helpers that work on text around a sticky comment rather than on a task:
 * the task tag line, the body hash that ignores the update time, the Exit Preview URL. */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/hash.h"
#include "scm/render.h"
#include "scm/render_int.h"

/* Copies at most 63 bytes of S into OUT, with characters outside [A-Za-z0-9._-] as '_'. */
static void tag_part(char out[64], const char *s)
{
    size_t i;

    for (i = 0; i < 63 && s != NULL && s[i] != '\0'; i++) {
        unsigned char c = (unsigned char)s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
        out[i] = ok ? (char)c : '_';
    }
    out[i] = '\0';
}

void scm_render_task_tag(char *out, size_t n, const char *ns, const char *name)
{
    char a[64], b[64];
    int len;

    if (n == 0) {
        return;
    }
    tag_part(a, ns);
    tag_part(b, name);
    len = snprintf(out, n, "<!-- diverge-task: %s/%s -->", a, b);
    if (len < 0 || (size_t)len >= n) {
        out[0] = '\0'; /* never a cut line: it would leave an HTML comment open */
    }
}

void scm_render_hash(char out[17], const char *body)
{
    uint64_t h = HASH_FNV1A_INIT;
    const char *line = body;

    while (*line != '\0') {
        const char *nl = strchr(line, '\n');
        size_t len = nl != NULL ? (size_t)(nl - line) + 1 : strlen(line);

        if (strncmp(line, UPDATED_PREFIX, strlen(UPDATED_PREFIX)) != 0) {
            h = hash_fnv1a(h, line, len);
        }
        line += len;
    }
    snprintf(out, 17, "%016" PRIx64, h);
}

/* Appends the query parameter P[0..len) to B unless it is empty or a repeated
 * _diverge_env; the first _diverge_env is set to "clear". *SEEN: whether one came. */
static void exit_param(struct buf *b, const char *p, size_t len, bool *first, bool *seen)
{
    const char *eq = memchr(p, '=', len);
    size_t klen = eq != NULL ? (size_t)(eq - p) : len;
    bool is_env = klen == strlen(DIVERGE_ENV) && memcmp(p, DIVERGE_ENV, klen) == 0;

    if (len == 0 || (is_env && *seen)) {
        return;
    }
    (void)buf_puts(b, *first ? "" : "&");
    *first = false;
    if (is_env) {
        *seen = true;
        (void)buf_puts(b, DIVERGE_ENV "=clear");
    } else {
        (void)buf_append(b, p, len);
    }
}

char *scm_render_exit_url(const char *preview)
{
    size_t end = strcspn(preview, "#");
    const char *q = memchr(preview, '?', end), *p, *stop = preview + end;
    bool first = true, seen = false;
    struct buf b;

    buf_init(&b, 0); /* uncapped: it never fails, hence the (void)s */
    if (q == NULL) {
        (void)buf_append(&b, preview, end);
        (void)buf_puts(&b, "?" DIVERGE_ENV "=clear");
    } else {
        (void)buf_append(&b, preview, (size_t)(q - preview) + 1);
        for (p = q + 1; p <= stop;) {
            const char *amp = memchr(p, '&', (size_t)(stop - p));
            const char *pend = amp != NULL ? amp : stop;
            exit_param(&b, p, (size_t)(pend - p), &first, &seen);
            p = pend + 1;
        }
        if (!seen) {
            (void)buf_puts(&b, first ? DIVERGE_ENV "=clear" : "&" DIVERGE_ENV "=clear");
        }
    }
    (void)buf_puts(&b, preview + end);
    return buf_take(&b);
}
