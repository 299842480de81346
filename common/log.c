/* SPDX-License-Identifier: Apache-2.0 */
/* log_kv: formats a whole line into a buffer, then one write(2) so threads never interleave. */
#include "common/log.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"

static enum log_format g_format = LOG_FORMAT_TEXT;
static int g_fd = -1; /* -1: stderr */

void log_set_fd(int fd)
{
    g_fd = fd;
}

void log_set_format(enum log_format fmt)
{
    g_format = fmt;
}

int log_format_parse(enum log_format *out, const char *s)
{
    if (strcmp(s, "text") == 0) {
        *out = LOG_FORMAT_TEXT;
        return E_OK;
    }
    if (strcmp(s, "json") == 0) {
        *out = LOG_FORMAT_JSON;
        return E_OK;
    }
    return E_INVALID;
}

/* The whole line, grown as needed: values are capped, so a line is bounded by the number
 * of pairs the code passes. */
struct line {
    char *buf;  /* owned */
    size_t len; /* bytes used */
    size_t cap; /* bytes allocated */
};

static void put(struct line *l, const char *s, size_t n)
{
    if (l->len + n + 2 > l->cap) { /* keep room for "\n" */
        size_t cap = l->cap == 0 ? 512 : l->cap;
        while (l->len + n + 2 > cap) {
            cap *= 2;
        }
        l->buf = xrealloc(l->buf, cap);
        l->cap = cap;
    }
    memcpy(l->buf + l->len, s, n);
    l->len += n;
}

static void puts_(struct line *l, const char *s)
{
    put(l, s, strlen(s));
}

/* Bytes of S to write: at most LOG_VALUE_MAX, cut on a character boundary (a malformed
 * byte counts as one character). *cut_out says whether anything was left out. */
static size_t value_len(const char *s, bool *cut_out)
{
    size_t n = 0, len = strlen(s);

    *cut_out = false;
    if (len <= LOG_VALUE_MAX) {
        return len; /* the usual case: nothing to cut */
    }
    while (n < len) {
        size_t c = err_utf8_char_len(s + n, len - n);
        c = c > 0 ? c : 1;
        if (n + c > LOG_VALUE_MAX) {
            *cut_out = true;
            break;
        }
        n += c;
    }
    return n;
}

static void put_json_str(struct line *l, const char *s)
{
    char esc[8];
    bool cut;
    size_t len = value_len(s, &cut);

    put(l, "\"", 1);
    for (size_t i = 0; i < len;) {
        unsigned char c = (unsigned char)s[i];
        size_t n, run = i;

        /* A run of printable ASCII other than '"' and '\\' goes out as it is, at once. */
        while (run < len && (unsigned char)s[run] >= 0x20 && (unsigned char)s[run] < 0x7f &&
               s[run] != '"' && s[run] != '\\') {
            run++;
        }
        if (run > i) {
            put(l, s + i, run - i);
            i = run;
            continue;
        }
        n = err_utf8_char_len(s + i, len - i);

        if (n == 0) {
            put(l, "\\ufffd", 6); /* not UTF-8: the replacement character */
            i++;
            continue;
        }
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            put(l, esc, 2);
        } else if (c < 0x20 || c == 0x7f) {
            snprintf(esc, sizeof(esc), "\\u%04x", c);
            put(l, esc, 6);
        } else {
            put(l, s + i, n);
        }
        i += n;
    }
    if (cut) {
        puts_(l, LOG_TRUNCATED);
    }
    put(l, "\"", 1);
}

/* True when the character at S (N bytes, 0 when malformed) is written as \xNN in text:
 * C0 controls, DEL, C1 controls (U+0080..U+009F, which some terminals obey) and bytes
 * that are not UTF-8. */
static bool text_escaped(const char *s, size_t n)
{
    unsigned char c = (unsigned char)s[0];

    return n == 0 || c < 0x20 || c == 0x7f || (n == 2 && c == 0xc2 && (unsigned char)s[1] < 0xa0);
}

static bool text_needs_quotes(const char *s, size_t len)
{
    if (len == 0) {
        return true;
    }
    for (size_t i = 0; i < len;) {
        size_t n = err_utf8_char_len(s + i, len - i);
        if (text_escaped(s + i, n) || s[i] == ' ' || s[i] == '"' || s[i] == '=' || s[i] == '\\') {
            return true;
        }
        i += n > 0 ? n : 1;
    }
    return false;
}

/* Writes the character at S (N bytes, 0 when malformed) escaped as needed. */
static void put_text_char(struct line *l, const char *s, size_t n)
{
    unsigned char c = (unsigned char)s[0];
    char esc[8];

    if (c == '"' || c == '\\') {
        esc[0] = '\\';
        esc[1] = (char)c;
        put(l, esc, 2);
    } else if (c == '\n' || c == '\r' || c == '\t') {
        put(l, c == '\n' ? "\\n" : c == '\r' ? "\\r" : "\\t", 2);
    } else if (text_escaped(s, n)) {
        /* Byte by byte: a C1 control is two bytes, a malformed byte one. */
        for (size_t k = 0; k < (n > 0 ? n : 1); k++) {
            snprintf(esc, sizeof(esc), "\\x%02x", (unsigned char)s[k]);
            put(l, esc, 4);
        }
    } else {
        put(l, s, n);
    }
}

static void put_text_val(struct line *l, const char *s)
{
    bool cut;
    size_t len = value_len(s, &cut);
    bool quote = text_needs_quotes(s, len);

    if (quote) {
        put(l, "\"", 1);
    }
    for (size_t i = 0; i < len;) {
        size_t n = err_utf8_char_len(s + i, len - i);

        put_text_char(l, s + i, n);
        i += n > 0 ? n : 1;
    }
    if (cut) {
        puts_(l, LOG_TRUNCATED);
    }
    if (quote) {
        put(l, "\"", 1);
    }
}

static const char *level_name(enum log_level level)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    return names[level];
}

/* "YYYY-MM-DDTHH:MM:SS.mmmZ" of NOW into TS (at least 96 bytes). The part up to the
 * seconds is formatted once per second per thread. */
static void timestamp(char *ts, const struct timespec *now)
{
    static __thread __attribute__((tls_model("initial-exec"))) time_t sec = (time_t)-1;
    static __thread __attribute__((tls_model("initial-exec"))) char prefix[CLOCK_RFC3339_MAX];
    static __thread __attribute__((tls_model("initial-exec"))) size_t plen;
    long ms = now->tv_nsec / 1000000;

    if (now->tv_sec != sec) {
        plen = clock_utc_seconds(prefix, (int64_t)now->tv_sec);
        prefix[plen++] = '.';
        sec = now->tv_sec;
    }
    memcpy(ts, prefix, plen);
    ts[plen] = (char)('0' + ms / 100);
    ts[plen + 1] = (char)('0' + ms / 10 % 10);
    ts[plen + 2] = (char)('0' + ms % 10);
    ts[plen + 3] = 'Z';
    ts[plen + 4] = '\0';
}

void log_kv(enum log_level level, const char *event, ...)
{
    struct line l = {.buf = NULL, .len = 0, .cap = 0};
    char ts[96];
    struct timespec now;
    va_list ap;
    const char *k, *v;
    ssize_t w;

    clock_gettime(CLOCK_REALTIME, &now);
    timestamp(ts, &now);
    if (g_format == LOG_FORMAT_JSON) {
        puts_(&l, "{\"ts\":\"");
        puts_(&l, ts);
        puts_(&l, "\",\"level\":\"");
        puts_(&l, level_name(level));
        puts_(&l, "\",\"event\":");
        put_json_str(&l, event);
    } else {
        puts_(&l, ts);
        puts_(&l, " ");
        puts_(&l, level_name(level));
        puts_(&l, " ");
        put_text_val(&l, event);
    }
    va_start(ap, event);
    while ((k = va_arg(ap, const char *)) != NULL) {
        v = va_arg(ap, const char *);
        if (v == NULL) {
            v = "";
        }
        if (g_format == LOG_FORMAT_JSON) {
            puts_(&l, ",");
            put_json_str(&l, k);
            puts_(&l, ":");
            put_json_str(&l, v);
        } else {
            puts_(&l, " ");
            put_text_val(&l, k);
            puts_(&l, "=");
            put_text_val(&l, v);
        }
    }
    va_end(ap);
    if (g_format == LOG_FORMAT_JSON) {
        puts_(&l, "}");
    }
    l.buf[l.len++] = '\n';
    w = write(g_fd >= 0 ? g_fd : STDERR_FILENO, l.buf, l.len);
    (void)w;
    free(l.buf);
}
