/* SPDX-License-Identifier: Apache-2.0 */
/* Byte-level helpers of the slash-command grammar: ASCII case folding, UTF-8 checks,
 * argument splitting, and safe echoing of bad arguments in error replies. */
#include <stdio.h>
#include <string.h>

#include "bot/bot_int.h"

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

static bool is_plain_ascii(unsigned char c)
{
    return c >= 0x20 && c < 0x7F && c != '"' && c != '\\';
}

/* Writes S[0..n) into OUT for a message: valid UTF-8 is kept, '"' and '\' are escaped,
 * control and invalid bytes become \xNN, and a long argument is cut with "...". */
void slashcmd_show_arg(char out[SHOW_MAX], const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, o = 0, lim = n < SHOW_IN_MAX ? n : SHOW_IN_MAX;

    while (i < lim) {
        size_t k = utf8_len(p + i, n - i);

        if (k > 1) {
            if (i + k > lim) {
                break; /* a character straddling the cut */
            }
            memcpy(out + o, p + i, k);
            o += k;
            i += k;
            continue;
        }
        if (is_plain_ascii(p[i])) {
            out[o++] = (char)p[i];
        } else if (p[i] == '"' || p[i] == '\\') {
            out[o++] = '\\';
            out[o++] = (char)p[i];
        } else {
            out[o++] = '\\';
            out[o++] = 'x';
            out[o++] = hex[p[i] >> 4];
            out[o++] = hex[p[i] & 0xF];
        }
        i++;
    }
    if (i < n) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o] = '\0';
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
