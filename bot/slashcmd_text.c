/* SPDX-License-Identifier: Apache-2.0 */
/* Byte-level helpers of the slash-command grammar: ASCII case folding, UTF-8 checks,
 * argument splitting, and safe quoting of user text in replies. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bot/bot_int.h"
#include "common/err.h"

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\v' || c == '\f' || c == '\r';
}

char slashcmd_lower(char c)
{
    return (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
}

/* S[0..n) equals the lower-case NAME, ignoring ASCII case. */
bool slashcmd_ieq(const char *s, size_t n, const char *name)
{
    if (n != strlen(name)) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (slashcmd_lower(s[i]) != name[i]) {
            return false;
        }
    }
    return true;
}

/* How many continuation bytes lead byte C needs (0: C cannot start a sequence); narrows
 * [*lo, *hi], the range of the first continuation byte, against overlong forms, surrogates
 * and code points over U+10FFFF. */
static size_t utf8_need(unsigned char c, unsigned char *lo, unsigned char *hi)
{
    if (c >= 0xC2 && c <= 0xDF) {
        return 1;
    }
    if (c == 0xE0) {
        *lo = 0xA0;
    } else if (c == 0xED) {
        *hi = 0x9F;
    } else if (c == 0xF0) {
        *lo = 0x90;
        return 3;
    } else if (c == 0xF4) {
        *hi = 0x8F;
        return 3;
    }
    if (c >= 0xE0 && c <= 0xEF) {
        return 2;
    }
    return (c >= 0xF1 && c <= 0xF3) ? 3 : 0;
}

/* Length of the valid UTF-8 sequence at P (N > 0 bytes left), or 0 when it is invalid. */
static size_t utf8_len(const unsigned char *p, size_t n)
{
    unsigned char lo = 0x80, hi = 0xBF;
    size_t need;

    if (p[0] < 0x80) {
        return 1;
    }
    need = utf8_need(p[0], &lo, &hi);
    if (need == 0 || n <= need || p[1] < lo || p[1] > hi) {
        return 0;
    }
    for (size_t i = 2; i <= need; i++) {
        if ((p[i] & 0xC0) != 0x80) {
            return 0;
        }
    }
    return need + 1;
}

#define ZWJ "\xE2\x80\x8D"         /* U+200D after "@": "@\u200Dteam" pings nobody */
#define ELLIPSIS "\xE2\x80\xA6"    /* U+2026 */
#define REPLACEMENT "\xEF\xBF\xBD" /* U+FFFD */

/* The escape of the ASCII or invalid byte C inside a quote; returns its length (<= 4). */
static size_t quote_byte(char out[4], unsigned char c, bool valid)
{
    static const char hex[] = "0123456789abcdef";
    static const struct {
        unsigned char c;
        const char *s;
    } subst[] = {
        {'@', "@" ZWJ}, {'<', "\xEF\xBC\x9C"}, {'>', "\xEF\xBC\x9E"}, {'&', "\xEF\xBC\x86"}};

    if (valid && c >= 0x20 && c < 0x7F) {
        for (size_t i = 0; i < ARRAY_LEN(subst); i++) {
            if (subst[i].c == c) {
                memcpy(out, subst[i].s, strlen(subst[i].s));
                return strlen(subst[i].s);
            }
        }
        out[0] = (char)c;
        return 1;
    }
    out[0] = '\\';
    out[1] = 'x';
    out[2] = hex[c >> 4];
    out[3] = hex[c & 0xF];
    return 4;
}

/* Whether the 3-byte sequence at P is a line/paragraph separator or a bidi control
 * (U+2028..U+202E, U+2066..U+2069), which could break the line or reorder the reply. */
static bool is_layout_char(const unsigned char *p)
{
    return p[0] == 0xE2 && ((p[1] == 0x80 && p[2] >= 0xA8 && p[2] <= 0xAE) ||
                            (p[1] == 0x81 && p[2] >= 0xA6 && p[2] <= 0xA9));
}

void slashcmd_quote(char *out, size_t size, const char *s, size_t n, size_t max_chars)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, len = 0, chars = 0, run = 0, longest = 0, o = 0;
    char *body = xmalloc(max_chars * 4 + sizeof(ELLIPSIS));
    const char *pad;

    ASSERT(size >= SLASHCMD_QUOTE_SIZE(max_chars));
    while (i < n && chars < max_chars) {
        size_t k = utf8_len(p + i, n - i);

        if (k == 3 && is_layout_char(p + i)) {
            memcpy(body + len, REPLACEMENT, strlen(REPLACEMENT));
            len += strlen(REPLACEMENT);
            i += k;
        } else if (k > 1) {
            memcpy(body + len, p + i, k);
            len += k;
            i += k;
        } else {
            len += quote_byte(body + len, p[i], k == 1);
            i++;
        }
        chars++;
    }
    if (i < n) {
        memcpy(body + len, ELLIPSIS, strlen(ELLIPSIS));
        len += strlen(ELLIPSIS);
    }
    for (size_t k = 0; k < len; k++) {
        run = body[k] == '`' ? run + 1 : 0;
        longest = run > longest ? run : longest;
    }
    /* Markdown strips one space on each side when both are there: with a backtick at an
     * edge the padding keeps it from joining the fence; an empty argument shows as "` `". */
    pad = (len == 0 || body[0] == '`' || body[len - 1] == '`') ? " " : "";
    ASSERT(2 * (longest + 1) + 2 * strlen(pad) + len < size);
    memset(out + o, '`', longest + 1);
    o += longest + 1;
    o += (size_t)snprintf(out + o, size - o, "%s%.*s%s", pad, (int)len, body, pad);
    memset(out + o, '`', longest + 1);
    o += longest + 1;
    out[o] = '\0';
    free(body);
}

void slashcmd_show_arg(char out[SHOW_MAX], const char *s, size_t n)
{
    slashcmd_quote(out, SHOW_MAX, s, n, SHOW_CHARS);
}

/* Objectives and hints end up in JSON, YAML and Markdown: valid UTF-8, and no control
 * characters but tab. */
bool slashcmd_text_ok(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;

    while (i < n) {
        size_t k = utf8_len(p + i, n - i);

        if (k == 0 || (k == 1 && ((p[i] < 0x20 && p[i] != '\t') || p[i] == 0x7F))) {
            return false;
        }
        i += k;
    }
    return true;
}

void slashcmd_trim(const char **s, size_t *n)
{
    while (*n > 0 && is_ws((*s)[0])) {
        (*s)++;
        (*n)--;
    }
    while (*n > 0 && is_ws((*s)[*n - 1])) {
        (*n)--;
    }
}

/* Splits the next whitespace-separated token off *S[0..*n); false when none is left. */
bool slashcmd_next_token(const char **tok_out, size_t *tlen_out, const char **s, size_t *n)
{
    size_t t = 0;

    while (*n > 0 && is_ws((*s)[0])) {
        (*s)++;
        (*n)--;
    }
    while (t < *n && !is_ws((*s)[t])) {
        t++;
    }
    *tok_out = *s;
    *tlen_out = t;
    *s += t;
    *n -= t;
    return t > 0;
}
