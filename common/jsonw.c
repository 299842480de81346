/* SPDX-License-Identifier: Apache-2.0 */
/* jsonw: a recursive writer into a struct buf; strings are scanned for the bytes JSON
 * must escape and copied in runs between them. */
#include "common/jsonw.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonscan.h"

/* Appends N bytes: a plain copy while they fit, buf_append when the buffer must grow. */
static inline void put(struct buf *out, const char *s, size_t n)
{
    if (out->max == 0 && out->len + n < out->cap) {
        memcpy(out->data + out->len, s, n);
        out->len += n;
        out->data[out->len] = '\0';
        return;
    }
    (void)buf_append(out, s, n);
}

/* The escape of byte C (one that jsonscan_word_special flags and JSON must escape) into
 * ESC; its length, or 0 when C needs none (a byte >= 0x80 goes out as it is). */
static size_t escape_of(char esc[6], unsigned char c)
{
    static const char hex[] = "0123456789ABCDEF"; /* as jansson writes them */
    static const char short_esc[0x20] = {
        ['\b'] = 'b', ['\f'] = 'f', ['\n'] = 'n', ['\r'] = 'r', ['\t'] = 't'};

    if (c >= 0x20 && c != '"' && c != '\\') {
        return 0;
    }
    esc[0] = '\\';
    if (c == '"' || c == '\\') {
        esc[1] = (char)c;
        return 2;
    }
    if (short_esc[c] != 0) {
        esc[1] = short_esc[c];
        return 2;
    }
    esc[1] = 'u';
    esc[2] = '0';
    esc[3] = '0';
    esc[4] = hex[c >> 4];
    esc[5] = hex[c & 0xf];
    return 6;
}

/* Whether the N (< 8) bytes at S hold one that jsonscan_word_special flags: one word
 * check, padded with spaces (plain ASCII). */
static inline bool short_special(const char *s, size_t n)
{
    uint64_t w = 0x2020202020202020ULL;

    memcpy(&w, s, n);
    return jsonscan_word_special(w);
}

static void put_string(struct buf *out, const char *s, size_t n)
{
    size_t run = 0, i = 0;

    put(out, "\"", 1);
    while (i < n) {
        char esc[6];
        size_t elen;
        uint64_t w;
        /* Eight plain ASCII bytes at a time, the usual case, then one byte at a time. */
        while (n - i >= 8) {
            memcpy(&w, s + i, sizeof(w));
            if (jsonscan_word_special(w)) {
                break;
            }
            i += 8;
        }
        if (i >= n) {
            break;
        }
        if (n - i < 8 && !short_special(s + i, n - i)) {
            break; /* a plain tail (or a whole short string, the usual key): one copy */
        }
        elen = escape_of(esc, (unsigned char)s[i]);
        if (elen > 0) {
            put(out, s + run, i - run);
            put(out, esc, elen);
            run = i + 1;
        }
        i++;
    }
    put(out, s + run, n - run);
    put(out, "\"", 1);
}

/* Appends V in decimal (no printf on this path: the store writes every task change). */
static void put_int(struct buf *out, json_int_t v)
{
    char num[24], *p = num + sizeof(num);
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;

    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u != 0);
    if (v < 0) {
        *--p = '-';
    }
    put(out, p, (size_t)(num + sizeof(num) - p));
}

void jsonw_int(struct buf *out, int64_t v)
{
    put_int(out, (json_int_t)v);
}

void jsonw_string(struct buf *out, const char *s)
{
    put_string(out, s, strlen(s));
}

void jsonw_append(struct buf *out, const json_t *j)
{
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        json_t *o = (json_t *)(uintptr_t)j;
        bool first = true;
        put(out, "{", 1);
        /* The iterator itself: the key's length is stored, no strlen or key lookups. */
        for (void *it = json_object_iter(o); it != NULL; it = json_object_iter_next(o, it)) {
            if (!first) {
                put(out, ",", 1);
            }
            first = false;
            put_string(out, json_object_iter_key(it), json_object_iter_key_len(it));
            put(out, ":", 1);
            jsonw_append(out, json_object_iter_value(it));
        }
        put(out, "}", 1);
        break;
    }
    case JSON_ARRAY: {
        size_t i;
        json_t *v;
        put(out, "[", 1);
        json_array_foreach((json_t *)(uintptr_t)j, i, v)
        {
            if (i > 0) {
                put(out, ",", 1);
            }
            jsonw_append(out, v);
        }
        put(out, "]", 1);
        break;
    }
    case JSON_STRING:
        put_string(out, json_string_value(j), json_string_length(j));
        break;
    case JSON_INTEGER:
        put_int(out, json_integer_value(j));
        break;
    case JSON_REAL: {
        /* Rare here: let jansson format it the way it always does. */
        char *t = json_dumps(j, JSON_ENCODE_ANY | JSON_COMPACT);
        (void)buf_puts(out, t != NULL ? t : "null");
        free(t);
        break;
    }
    case JSON_TRUE:
        put(out, "true", 4);
        break;
    case JSON_FALSE:
        put(out, "false", 5);
        break;
    case JSON_NULL:
        put(out, "null", 4);
        break;
    }
}

char *jsonw_dumps(const json_t *j)
{
    struct buf b;

    buf_init(&b, 0);
    buf_reserve(&b, 2048); /* a task document: no regrowth on the way */
    jsonw_append(&b, j);
    return buf_take(&b);
}
