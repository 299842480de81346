/* SPDX-License-Identifier: Apache-2.0 */
/* log_kv: formats a whole line into a buffer, then one write(2) so threads never interleave. */
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"

static enum log_format g_format = LOG_FORMAT_TEXT;

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

struct line {
    char buf[4096];
    size_t len;
};

static void put(struct line *l, const char *s, size_t n)
{
    size_t room = sizeof(l->buf) - 2 - l->len; /* keep room for "\n\0" */

    if (n > room) {
        n = room;
    }
    memcpy(l->buf + l->len, s, n);
    l->len += n;
}

static void puts_(struct line *l, const char *s)
{
    put(l, s, strlen(s));
}

static void put_json_str(struct line *l, const char *s)
{
    char esc[8];

    put(l, "\"", 1);
    for (; *s != '\0'; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            put(l, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof(esc), "\\u%04x", c);
            put(l, esc, 6);
        } else {
            put(l, s, 1);
        }
    }
    put(l, "\"", 1);
}

static void put_text_val(struct line *l, const char *s)
{
    int quote = strpbrk(s, " \"=\t\n") != NULL || *s == '\0';

    if (!quote) {
        puts_(l, s);
        return;
    }
    put(l, "\"", 1);
    for (; *s != '\0'; s++) {
        if (*s == '"' || *s == '\\') {
            put(l, "\\", 1);
        }
        if (*s == '\n') {
            put(l, "\\n", 2);
            continue;
        }
        put(l, s, 1);
    }
    put(l, "\"", 1);
}

static const char *level_name(enum log_level level)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    return names[level];
}

void log_kv(enum log_level level, const char *event, ...)
{
    struct line l = {.len = 0};
    char ts[96];
    struct timespec now;
    struct tm tm;
    va_list ap;
    const char *k, *v;
    ssize_t w;

    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    snprintf(ts, sizeof(ts), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
             now.tv_nsec / 1000000);
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
        puts_(&l, event);
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
            puts_(&l, k);
            puts_(&l, "=");
            put_text_val(&l, v);
        }
    }
    va_end(ap);
    if (g_format == LOG_FORMAT_JSON) {
        puts_(&l, "}");
    }
    l.buf[l.len++] = '\n';
    w = write(STDERR_FILENO, l.buf, l.len);
    (void)w;
}
