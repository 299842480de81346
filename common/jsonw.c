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

static void put_string(struct buf *out, const char *s, size_t n)
{
    static const char hex[] = "0123456789ABCDEF"; /* as jansson writes them */
    size_t run = 0;

    (void)buf_append(out, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[6] = {'\\', 0, 0, 0, 0, 0};
        size_t elen = 2;

        if (c >= 0x20 && c != '"' && c != '\\') {
            continue;
        }
        (void)buf_append(out, s + run, i - run);
        run = i + 1;
        switch (c) {
        case '"':
            esc[1] = '"';
            break;
        case '\\':
            esc[1] = '\\';
            break;
        case '\b':
            esc[1] = 'b';
            break;
        case '\f':
            esc[1] = 'f';
            break;
        case '\n':
            esc[1] = 'n';
            break;
        case '\r':
            esc[1] = 'r';
            break;
        case '\t':
            esc[1] = 't';
            break;
        default:
            esc[1] = 'u';
            esc[2] = '0';
            esc[3] = '0';
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 0xf];
            elen = 6;
            break;
        }
        (void)buf_append(out, esc, elen);
    }
    (void)buf_append(out, s + run, n - run);
    (void)buf_append(out, "\"", 1);
}

void jsonw_append(struct buf *out, const json_t *j)
{
    char num[32];
    int n;

    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        const char *key;
        json_t *v;
        bool first = true;
        (void)buf_append(out, "{", 1);
        json_object_foreach((json_t *)(uintptr_t)j, key, v)
        {
            if (!first) {
                (void)buf_append(out, ",", 1);
            }
            first = false;
            put_string(out, key, strlen(key));
            (void)buf_append(out, ":", 1);
            jsonw_append(out, v);
        }
        (void)buf_append(out, "}", 1);
        break;
    }
    case JSON_ARRAY: {
        size_t i;
        json_t *v;
        (void)buf_append(out, "[", 1);
        json_array_foreach((json_t *)(uintptr_t)j, i, v)
        {
            if (i > 0) {
                (void)buf_append(out, ",", 1);
            }
            jsonw_append(out, v);
        }
        (void)buf_append(out, "]", 1);
        break;
    }
    case JSON_STRING:
        put_string(out, json_string_value(j), json_string_length(j));
        break;
    case JSON_INTEGER:
        n = snprintf(num, sizeof(num), "%" JSON_INTEGER_FORMAT, json_integer_value(j));
        (void)buf_append(out, num, (size_t)n);
        break;
    case JSON_REAL: {
        /* Rare here: let jansson format it the way it always does. */
        char *t = json_dumps(j, JSON_ENCODE_ANY | JSON_COMPACT);
        (void)buf_puts(out, t != NULL ? t : "null");
        free(t);
        break;
    }
    case JSON_TRUE:
        (void)buf_append(out, "true", 4);
        break;
    case JSON_FALSE:
        (void)buf_append(out, "false", 5);
        break;
    case JSON_NULL:
        (void)buf_append(out, "null", 4);
        break;
    }
}

char *jsonw_dumps(const json_t *j)
{
    struct buf b;

    buf_init(&b, 0);
    jsonw_append(&b, j);
    return buf_take(&b);
}
