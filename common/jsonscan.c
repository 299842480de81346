/* SPDX-License-Identifier: Apache-2.0 */
/* jsonscan_check: an iterative RFC 8259 validator (explicit stack, no recursion). */
#include "common/jsonscan.h"

#include <stdbool.h>
#include <stdint.h>

struct scan {
    const unsigned char *p;
    const unsigned char *end;
};

static void skip_ws(struct scan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r')) {
        s->p++;
    }
}

static bool is_hex(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* One UTF-8 sequence starting at s->p (first byte >= 0x80); advances past it. */
static bool utf8(struct scan *s)
{
    unsigned char c = *s->p;
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;

    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        lo = c == 0xE0 ? 0xA0 : 0x80;
        hi = c == 0xED ? 0x9F : 0xBF; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        lo = c == 0xF0 ? 0x90 : 0x80;
        hi = c == 0xF4 ? 0x8F : 0xBF;
    } else {
        return false;
    }
    if ((size_t)(s->end - s->p) <= need) {
        return false;
    }
    for (size_t i = 1; i <= need; i++) {
        unsigned char b = s->p[i];
        if (b < (i == 1 ? lo : 0x80) || b > (i == 1 ? hi : 0xBF)) {
            return false;
        }
    }
    s->p += need + 1;
    return true;
}

static bool string(struct scan *s)
{
    s->p++; /* the opening quote */
    while (s->p < s->end) {
        unsigned char c = *s->p;
        if (c == '"') {
            s->p++;
            return true;
        }
        if (c < 0x20) {
            return false;
        }
        if (c == '\\') {
            if (s->end - s->p < 2) {
                return false;
            }
            c = s->p[1];
            if (c == 'u') {
                if (s->end - s->p < 6 || !is_hex(s->p[2]) || !is_hex(s->p[3]) ||
                    !is_hex(s->p[4]) || !is_hex(s->p[5])) {
                    return false;
                }
                s->p += 6;
                continue;
            }
            if (c != '"' && c != '\\' && c != '/' && c != 'b' && c != 'f' && c != 'n' &&
                c != 'r' && c != 't') {
                return false;
            }
            s->p += 2;
            continue;
        }
        if (c >= 0x80) {
            if (!utf8(s)) {
                return false;
            }
            continue;
        }
        s->p++;
    }
    return false;
}

static bool digits(struct scan *s)
{
    const unsigned char *start = s->p;

    while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
        s->p++;
    }
    return s->p > start;
}

static bool number(struct scan *s)
{
    if (*s->p == '-') {
        s->p++;
    }
    if (s->p < s->end && *s->p == '0') {
        s->p++;
    } else if (!digits(s)) {
        return false;
    }
    if (s->p < s->end && *s->p == '.') {
        s->p++;
        if (!digits(s)) {
            return false;
        }
    }
    if (s->p < s->end && (*s->p == 'e' || *s->p == 'E')) {
        s->p++;
        if (s->p < s->end && (*s->p == '+' || *s->p == '-')) {
            s->p++;
        }
        if (!digits(s)) {
            return false;
        }
    }
    return true;
}

static bool literal(struct scan *s, const char *word, size_t n)
{
    if ((size_t)(s->end - s->p) < n) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (s->p[i] != (unsigned char)word[i]) {
            return false;
        }
    }
    s->p += n;
    return true;
}

/* A scalar, or the opening of a container (pushed on STACK). */
static bool value_start(struct scan *s, char *stack, size_t *depth, bool *opened)
{
    *opened = false;
    if (s->p >= s->end) {
        return false;
    }
    switch (*s->p) {
    case '{':
    case '[':
        if (*depth >= JSONSCAN_MAX_DEPTH) {
            return false;
        }
        stack[(*depth)++] = (char)*s->p;
        s->p++;
        *opened = true;
        return true;
    case '"':
        return string(s);
    case 't':
        return literal(s, "true", 4);
    case 'f':
        return literal(s, "false", 5);
    case 'n':
        return literal(s, "null", 4);
    default:
        return (*s->p == '-' || (*s->p >= '0' && *s->p <= '9')) && number(s);
    }
}

int jsonscan_check(const char *str, size_t n, struct err *err)
{
    struct scan s = {(const unsigned char *)str, (const unsigned char *)str + n};
    char stack[JSONSCAN_MAX_DEPTH];
    size_t depth = 0;
    bool opened, need_value = true;

    skip_ws(&s);
    for (;;) {
        if (need_value) {
            if (!value_start(&s, stack, &depth, &opened)) {
                goto bad;
            }
            need_value = false;
            skip_ws(&s);
            if (opened) {
                /* Empty container, or the first member/element. */
                char close = stack[depth - 1] == '{' ? '}' : ']';
                if (s.p < s.end && *s.p == close) {
                    s.p++;
                    depth--;
                    skip_ws(&s);
                } else if (stack[depth - 1] == '{') {
                    if (s.p >= s.end || *s.p != '"' || !string(&s)) {
                        goto bad;
                    }
                    skip_ws(&s);
                    if (s.p >= s.end || *s.p != ':') {
                        goto bad;
                    }
                    s.p++;
                    skip_ws(&s);
                    need_value = true;
                    continue;
                } else {
                    need_value = true;
                    continue;
                }
            }
        }
        if (depth == 0) {
            break;
        }
        /* After a value inside a container: ',' or the close. */
        if (s.p >= s.end) {
            goto bad;
        }
        if (*s.p == (stack[depth - 1] == '{' ? '}' : ']')) {
            s.p++;
            depth--;
            skip_ws(&s);
            continue;
        }
        if (*s.p != ',') {
            goto bad;
        }
        s.p++;
        skip_ws(&s);
        if (stack[depth - 1] == '{') {
            if (s.p >= s.end || *s.p != '"' || !string(&s)) {
                goto bad;
            }
            skip_ws(&s);
            if (s.p >= s.end || *s.p != ':') {
                goto bad;
            }
            s.p++;
            skip_ws(&s);
        }
        need_value = true;
    }
    if (s.p == s.end) {
        return E_OK;
    }
bad:
    return err_set(err, E_INVALID, "invalid JSON near byte %zu",
                   (size_t)(s.p - (const unsigned char *)str));
}
