/* SPDX-License-Identifier: Apache-2.0 */
/* jsonscan_check: an iterative RFC 8259 validator (explicit stack, no recursion). */
#include "common/jsonscan.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
    size_t len = err_utf8_char_len((const char *)s->p, (size_t)(s->end - s->p));

    s->p += len;
    return len > 0;
}

/* One escape sequence at s->p (a backslash); advances past it. */
static bool escape(struct scan *s)
{
    unsigned char c;

    if (s->end - s->p < 2) {
        return false;
    }
    c = s->p[1];
    if (c == 'u') {
        if (s->end - s->p < 6 || !is_hex(s->p[2]) || !is_hex(s->p[3]) || !is_hex(s->p[4]) ||
            !is_hex(s->p[5])) {
            return false;
        }
        s->p += 6;
        return true;
    }
    if (strchr("\"\\/bfnrt", c) == NULL || c == '\0') {
        return false;
    }
    s->p += 2;
    return true;
}

static bool string(struct scan *s)
{
    s->p++; /* the opening quote */
    while (s->p < s->end) {
        unsigned char c;
        uint64_t w;
        /* Eight plain ASCII bytes at a time, the usual case, then one byte at a time. */
        while (s->end - s->p >= 8) {
            memcpy(&w, s->p, sizeof(w));
            if (jsonscan_word_special(w)) {
                break;
            }
            s->p += 8;
        }
        if (s->p >= s->end) {
            break;
        }
        c = *s->p;
        if (c == '"') {
            s->p++;
            return true;
        }
        if (c < 0x20) {
            return false;
        }
        if (c == '\\') {
            if (!escape(s)) {
                return false;
            }
        } else if (c >= 0x80) {
            if (!utf8(s)) {
                return false;
            }
        } else {
            s->p++;
        }
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

/* The path of the value about to be scanned, for jsonscan_extract: object keys joined by
 * '.', array elements never match. */
struct pathing {
    const struct jsonscan_path *paths; /* borrowed; NULL when only checking */
    size_t npaths;
    size_t *plen;                       /* owned: strlen of each path, taken once */
    struct jsonscan_value *out;         /* one per path */
    char buf[JSONSCAN_PATH_MAX];        /* the current path */
    size_t len[JSONSCAN_MAX_DEPTH + 1]; /* path length of each open container; SIZE_MAX: none */
    size_t cur;                         /* length of the path of the next value; SIZE_MAX: none */
};

/* Sets the path of the next value: the container's path plus KEY[0..klen). */
static void path_key(struct pathing *pg, size_t depth, const unsigned char *key, size_t klen)
{
    size_t base = pg->len[depth];

    if (pg->paths == NULL) {
        return;
    }
    if (base == SIZE_MAX || base + 1 + klen >= sizeof(pg->buf)) {
        pg->cur = SIZE_MAX;
        return;
    }
    if (base > 0) {
        pg->buf[base++] = '.';
    }
    memcpy(pg->buf + base, key, klen);
    pg->cur = base + klen;
}

/* The index of the requested path the next value has, or -1. */
static int path_match(const struct pathing *pg)
{
    if (pg->paths == NULL || pg->cur == SIZE_MAX) {
        return -1;
    }
    for (size_t i = 0; i < pg->npaths; i++) {
        if (pg->plen[i] == pg->cur && memcmp(pg->paths[i].path, pg->buf, pg->cur) == 0) {
            return (int)i;
        }
    }
    return -1;
}

/* Scans one member name ("key":) of an object at DEPTH, setting the path of its value. */
static bool member_name(struct scan *s, struct pathing *pg, size_t depth)
{
    const unsigned char *start = s->p + 1;

    if (s->p >= s->end || *s->p != '"' || !string(s)) {
        return false;
    }
    path_key(pg, depth, start, (size_t)(s->p - 1 - start));
    skip_ws(s);
    if (s->p >= s->end || *s->p != ':') {
        return false;
    }
    s->p++;
    skip_ws(s);
    return true;
}

/* Sets up the next value inside the open container at DEPTH: an object member's name sets
 * its path; array elements have none. */
static bool next_slot(struct scan *s, struct pathing *pg, const char *stack, size_t depth)
{
    if (stack[depth - 1] == '{') {
        return member_name(s, pg, depth);
    }
    pg->cur = SIZE_MAX;
    return true;
}

/* Closes the container at *DEPTH when s->p is its closing bracket. */
static bool try_close(struct scan *s, const char *stack, size_t *depth)
{
    if (s->p < s->end && *s->p == (stack[*depth - 1] == '{' ? '}' : ']')) {
        s->p++;
        (*depth)--;
        skip_ws(s);
        return true;
    }
    return false;
}

/* Scans one value, recording it when its path was requested. When it opens a non-empty
 * container, also scans up to its first value and sets *NEED_VALUE. */
static bool scan_value(struct scan *s, struct pathing *pg, char *stack, size_t *depth,
                       bool *need_value)
{
    const unsigned char *vstart = s->p;
    int hit = path_match(pg);
    bool opened;

    if (!value_start(s, stack, depth, &opened)) {
        return false;
    }
    if (hit >= 0) {
        pg->out[hit].start = (const char *)vstart;
        pg->out[hit].len = opened ? 0 : (size_t)(s->p - vstart);
        pg->out[hit].present = true;
    }
    if (opened) {
        /* The new container's path: the value's path, or none inside arrays. */
        pg->len[*depth] = stack[*depth - 1] == '{' ? pg->cur : SIZE_MAX;
    }
    *need_value = false;
    skip_ws(s);
    if (opened && !try_close(s, stack, depth)) {
        /* The first member/element. */
        *need_value = true;
        return next_slot(s, pg, stack, *depth);
    }
    return true;
}

static int walk(const char *str, size_t n, struct pathing *pg, struct err *err)
{
    struct scan s = {(const unsigned char *)str, (const unsigned char *)str + n};
    char stack[JSONSCAN_MAX_DEPTH];
    size_t depth = 0;
    bool need_value = true;

    pg->len[0] = 0;
    pg->cur = 0;
    skip_ws(&s);
    for (;;) {
        if (need_value) {
            if (!scan_value(&s, pg, stack, &depth, &need_value)) {
                goto bad;
            }
            if (need_value) {
                continue;
            }
        }
        if (depth == 0) {
            break;
        }
        /* After a value inside a container: ',' or the close. */
        if (s.p >= s.end) {
            goto bad;
        }
        if (try_close(&s, stack, &depth)) {
            continue;
        }
        if (*s.p != ',') {
            goto bad;
        }
        s.p++;
        skip_ws(&s);
        if (!next_slot(&s, pg, stack, depth)) {
            goto bad;
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

int jsonscan_check(const char *str, size_t n, struct err *err)
{
    struct pathing pg = {.paths = NULL};

    return walk(str, n, &pg, err);
}

int jsonscan_extract(struct jsonscan_value *out, const char *str, size_t n,
                     const struct jsonscan_path *paths, size_t npaths, struct err *err)
{
    struct pathing *pg = xcalloc(1, sizeof(*pg));
    int rc;

    memset(out, 0, npaths * sizeof(*out));
    pg->paths = paths;
    pg->npaths = npaths;
    pg->plen = xmalloc((npaths > 0 ? npaths : 1) * sizeof(*pg->plen));
    for (size_t i = 0; i < npaths; i++) {
        pg->plen[i] = strlen(paths[i].path);
    }
    pg->out = out;
    rc = walk(str, n, pg, err);
    free(pg->plen);
    free(pg);
    if (rc != E_OK) {
        memset(out, 0, npaths * sizeof(*out));
    }
    return rc;
}

static int hexval(unsigned char c)
{
    return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10;
}

static unsigned read_u4(const char *p)
{
    return (unsigned)(hexval((unsigned char)p[0]) << 12 | hexval((unsigned char)p[1]) << 8 |
                      hexval((unsigned char)p[2]) << 4 | hexval((unsigned char)p[3]));
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decodes the \\uXXXX escape at *P (joining a surrogate pair) and advances *P past it.
 * Lone surrogates and NUL become U+FFFD: never in our strings. */
static unsigned unescape_u(const char **p, const char *end)
{
    unsigned cp = read_u4(*p + 2);

    *p += 6;
    if (cp >= 0xD800 && cp <= 0xDBFF && end - *p >= 6 && (*p)[0] == '\\' && (*p)[1] == 'u') {
        unsigned lo = read_u4(*p + 2);
        if (lo >= 0xDC00 && lo <= 0xDFFF) {
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            *p += 6;
        }
    }
    if ((cp >= 0xD800 && cp <= 0xDFFF) || cp == 0) {
        cp = 0xFFFD;
    }
    return cp;
}

/* The byte a one-letter escape stands for (" \\ / map to themselves). */
static char unescape_char(char c)
{
    switch (c) {
    case 'b':
        return '\b';
    case 'f':
        return '\f';
    case 'n':
        return '\n';
    case 'r':
        return '\r';
    case 't':
        return '\t';
    default:
        return c;
    }
}

char *jsonscan_string(const struct jsonscan_value *v)
{
    const char *p, *end;
    char *out, *o;

    if (!v->present || v->len < 2 || v->start[0] != '"') {
        return NULL;
    }
    p = v->start + 1;
    end = v->start + v->len - 1;
    out = xmalloc(v->len + 1);
    o = out;
    while (p < end) {
        if (*p != '\\') {
            *o++ = *p++;
        } else if (p[1] == 'u') {
            o += put_utf8(o, unescape_u(&p, end));
        } else {
            *o++ = unescape_char(p[1]);
            p += 2;
        }
    }
    *o = '\0';
    return out;
}

int jsonscan_int(int64_t *out, const struct jsonscan_value *v)
{
    char buf[32];
    char *end = NULL;
    long long x;

    if (!v->present || v->len == 0 || v->len >= sizeof(buf) ||
        memchr(v->start, '.', v->len) != NULL || memchr(v->start, 'e', v->len) != NULL ||
        memchr(v->start, 'E', v->len) != NULL || v->start[0] == '"') {
        return E_INVALID;
    }
    memcpy(buf, v->start, v->len);
    buf[v->len] = '\0';
    errno = 0;
    x = strtoll(buf, &end, 10);
    if (errno != 0 || *end != '\0') {
        return E_INVALID;
    }
    *out = x;
    return E_OK;
}
