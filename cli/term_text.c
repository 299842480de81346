/* SPDX-License-Identifier: Apache-2.0 */
/* A comment's stored Markdown made readable in a terminal (`diverge local thread`): what a
 * person would see on the PR page, not the source. Comment bodies are anyone's text, so
 * control characters (terminal escape sequences) never reach the terminal. */
#include <stdbool.h>
#include <string.h>

#include "cli/cli_int.h"
#include "common/buf.h"

static const struct {
    const char *from, *to;
} g_entities[] = {{"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&#39;", "'"}, {"&amp;", "&"}};

/* Bytes at S that are dropped whole: the zero-width space and joiner the renderer puts
 * in bare URLs and mentions, and the HTML the renderer wraps text in. 0: none. */
static size_t dropped(const char *s)
{
    static const char *const drop[] = {"\xE2\x80\x8B", "\xE2\x80\x8D", "<sub>",
                                       "</sub>",       "<br>",         "<details>",
                                       "</details>",   "<summary>",    "</summary>"};

    for (size_t i = 0; i < ARRAY_LEN(drop); i++) {
        if (strncmp(s, drop[i], strlen(drop[i])) == 0) {
            return strlen(drop[i]);
        }
    }
    if (strncmp(s, "<!--", 4) == 0) {
        const char *end = strstr(s + 4, "-->");
        return end != NULL ? (size_t)(end + 3 - s) : strlen(s);
    }
    return 0;
}

/* At S, a Markdown link "[text](url)": writes "text (url)" to B and returns the bytes
 * read; 0 when S is not one (nested brackets are not links here). */
static size_t link(struct buf *b, const char *s)
{
    const char *close = strchr(s + 1, ']'), *end;

    if (close == NULL || close[1] != '(' || memchr(s + 1, '[', (size_t)(close - s - 1)) != NULL ||
        memchr(s + 1, '\n', (size_t)(close - s - 1)) != NULL) {
        return 0;
    }
    end = strchr(close + 2, ')');
    if (end == NULL || memchr(close + 2, '\n', (size_t)(end - close - 2)) != NULL) {
        return 0;
    }
    buf_append(b, s + 1, (size_t)(close - s - 1));
    buf_puts(b, " (");
    buf_append(b, close + 2, (size_t)(end - close - 2));
    buf_puts(b, ")");
    return (size_t)(end + 1 - s);
}

/* One step at S: what it writes to B and how many bytes it reads (at least 1). */
static size_t step(struct buf *b, const char *s)
{
    size_t n = dropped(s);

    if (n > 0) {
        return n;
    }
    for (size_t i = 0; i < ARRAY_LEN(g_entities); i++) {
        if (strncmp(s, g_entities[i].from, strlen(g_entities[i].from)) == 0) {
            buf_puts(b, g_entities[i].to);
            return strlen(g_entities[i].from);
        }
    }
    if (s[0] == '[' && (n = link(b, s)) > 0) {
        return n;
    }
    if (s[0] == '\\' && s[1] != '\0' && strchr("\\`*_{}[]()#+-.!|<>~", s[1]) != NULL) {
        buf_append(b, s + 1, 1);
        return 2;
    }
    if (((unsigned char)s[0] < 0x20 && s[0] != '\n' && s[0] != '\t') || s[0] == 0x7f) {
        return 1; /* a control character: never to the terminal */
    }
    buf_append(b, s, 1);
    return 1;
}

char *cli_term_text(const char *markdown)
{
    struct buf b, out;
    const char *s = markdown != NULL ? markdown : "";
    size_t newlines = 0;

    buf_init(&b, 0);
    while (*s != '\0') {
        s += step(&b, s);
    }
    /* The markers stood on lines of their own: at most one empty line where they were,
     * none at the start. */
    buf_init(&out, 0);
    for (size_t i = 0; i < b.len; i++) {
        if (b.data[i] == '\n') {
            if (out.len == 0 || newlines >= 2) {
                continue;
            }
            newlines++;
        } else {
            newlines = 0;
        }
        buf_append(&out, &b.data[i], 1);
    }
    buf_cleanup(&b);
    while (out.len > 0 && out.data[out.len - 1] == '\n') {
        out.len--;
    }
    buf_append(&out, "", 1); /* the NUL */
    return buf_take(&out);
}
