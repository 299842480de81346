/* SPDX-License-Identifier: Apache-2.0 */
/* Base64 (both alphabets in, URL-safe unpadded out) and hex for tokens and root keys.
 * Decoding is canonical: one byte string, one accepted unpadded text per alphabet. */
#include <stdint.h>
#include <stdlib.h>

#include "common/err.h"
#include "token/token_int.h"

static const char B64_URL[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

void token_b64_encode(char **out, const unsigned char *data, size_t len)
{
    char *s = xmalloc(len / 3 * 4 + 5);
    size_t i = 0, o = 0;

    for (; i + 3 <= len; i += 3) {
        uint32_t v = (uint32_t)data[i] << 16 | (uint32_t)data[i + 1] << 8 | data[i + 2];
        s[o++] = B64_URL[v >> 18 & 63];
        s[o++] = B64_URL[v >> 12 & 63];
        s[o++] = B64_URL[v >> 6 & 63];
        s[o++] = B64_URL[v & 63];
    }
    if (len - i == 1) {
        uint32_t v = (uint32_t)data[i] << 16;
        s[o++] = B64_URL[v >> 18 & 63];
        s[o++] = B64_URL[v >> 12 & 63];
    } else if (len - i == 2) {
        uint32_t v = (uint32_t)data[i] << 16 | (uint32_t)data[i + 1] << 8;
        s[o++] = B64_URL[v >> 18 & 63];
        s[o++] = B64_URL[v >> 12 & 63];
        s[o++] = B64_URL[v >> 6 & 63];
    }
    s[o] = '\0';
    *out = s;
}

/* Value of one base64 character in either alphabet, or -1. */
static int b64_value(char c)
{
    if (c >= 'A' && c <= 'Z') {
        return c - 'A';
    }
    if (c >= 'a' && c <= 'z') {
        return c - 'a' + 26;
    }
    if (c >= '0' && c <= '9') {
        return c - '0' + 52;
    }
    if (c == '+' || c == '-') {
        return 62;
    }
    if (c == '/' || c == '_') {
        return 63;
    }
    return -1;
}

int token_b64_decode(unsigned char **out, size_t *len_out, const char *s, size_t len)
{
    unsigned char *d = NULL;
    size_t n = len, o = 0, pad = 0;
    uint32_t acc = 0;
    int bits = 0;

    *out = NULL;
    *len_out = 0;
    while (n > 0 && s[n - 1] == '=') {
        n--;
        pad++;
    }
    /* Padding, when present, completes the last quantum exactly: "xx==" or "xxx=". */
    if (pad > 2 || (pad > 0 && (len % 4 != 0 || (n % 4) + pad != 4)) || n % 4 == 1) {
        return E_INVALID;
    }
    d = xmalloc(n / 4 * 3 + 3);
    for (size_t i = 0; i < n; i++) {
        int v = b64_value(s[i]);
        if (v < 0) {
            free(d);
            return E_INVALID;
        }
        acc = (acc << 6 | (uint32_t)v) & 0xffffff;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            d[o++] = (unsigned char)(acc >> bits & 0xff);
        }
    }
    /* Left-over bits must be zero, or two texts would decode to the same bytes. */
    if ((acc & ((1u << bits) - 1)) != 0) {
        free(d);
        return E_INVALID;
    }
    *out = d;
    *len_out = o;
    return E_OK;
}
