/* SPDX-License-Identifier: Apache-2.0 */
/* Decimal string <-> micro-dollar conversions without binary floating point. */
#include "common/money.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static int parse_digits(int64_t *acc, const char *p, const char *end, int limit_digits,
                        int *count_out, struct err *err)
{
    int n = 0;

    while (p < end && *p >= '0' && *p <= '9') {
        if (limit_digits >= 0 && n >= limit_digits) {
            return err_set(err, E_INVALID, "amount has more than 6 decimals");
        }
        if (*acc > (INT64_MAX - (*p - '0')) / 10) {
            return err_set(err, E_TOOBIG, "amount is too large");
        }
        *acc = *acc * 10 + (*p - '0');
        p++;
        n++;
    }
    *count_out = n;
    return E_OK;
}

/* Skips an optional '+' (reported through PLUS_OUT, which may be NULL) and then an optional
 * '$' at P; returns where the digits start. */
static const char *skip_prefix(const char *p, const char *end, bool *plus_out)
{
    bool plus = p < end && *p == '+';

    if (plus_out != NULL) {
        *plus_out = plus;
    }
    if (plus) {
        p++;
    }
    if (p < end && *p == '$') {
        p++;
    }
    return p;
}

int money_parse_n(int64_t *micros_out, bool *plus_out, const char *s, size_t len, struct err *err)
{
    const char *p = s, *end = s + len, *dot;
    int64_t whole = 0, frac = 0;
    int nwhole = 0, nfrac = 0, rc;

    *micros_out = 0;
    p = skip_prefix(p, end, plus_out);
    dot = memchr(p, '.', (size_t)(end - p));
    rc = parse_digits(&whole, p, dot != NULL ? dot : end, -1, &nwhole, err);
    if (rc != E_OK) {
        return rc;
    }
    p += nwhole;
    if (dot != NULL && p == dot) {
        p++;
        rc = parse_digits(&frac, p, end, 6, &nfrac, err);
        if (rc != E_OK) {
            return rc;
        }
        p += nfrac;
        if (nfrac == 0) {
            return err_set(err, E_INVALID, "amount needs digits after the decimal point");
        }
    }
    if (p != end || nwhole == 0) {
        return err_set(err, E_INVALID, "amount is not a decimal number of dollars");
    }
    for (int i = nfrac; i < 6; i++) {
        frac *= 10;
    }
    if (whole > (INT64_MAX - frac) / MONEY_MICROS_PER_USD) {
        return err_set(err, E_TOOBIG, "amount is too large");
    }
    *micros_out = whole * MONEY_MICROS_PER_USD + frac;
    return E_OK;
}

int money_parse(int64_t *micros_out, bool *plus_out, const char *s, struct err *err)
{
    return money_parse_n(micros_out, plus_out, s, strlen(s), err);
}

void money_format(char out[MONEY_STR_MAX], int64_t micros)
{
    uint64_t m = micros < 0 ? (uint64_t)0 - (uint64_t)micros : (uint64_t)micros;
    uint64_t whole = m / 1000000u, frac = m % 1000000u;
    char digits[24], *p = digits + sizeof(digits);
    size_t o = 0;
    int n;

    /* No printf: the meter writes several amounts per charge. */
    if (micros < 0) {
        out[o++] = '-';
    }
    do {
        *--p = (char)('0' + whole % 10);
        whole /= 10;
    } while (whole != 0);
    memcpy(out + o, p, (size_t)(digits + sizeof(digits) - p));
    o += (size_t)(digits + sizeof(digits) - p);
    out[o++] = '.';
    for (int i = 5; i >= 0; i--) {
        digits[i] = (char)('0' + frac % 10);
        frac /= 10;
    }
    /* Trim trailing zeros, keeping at least two decimals. */
    for (n = 6; n > 2 && digits[n - 1] == '0'; n--) {
    }
    memcpy(out + o, digits, (size_t)n);
    out[o + (size_t)n] = '\0';
}

bool money_micros_of_digits(int64_t *micros_out, const char *dig, size_t nd, long scale)
{
    long keep;
    int64_t v = 0;

    *micros_out = 0;
    while (nd > 0 && dig[nd - 1] == '0') {
        nd--;
        scale++;
    }
    if (nd == 0) {
        return true;
    }
    keep = (long)nd + scale; /* digits of whole micro-dollars */
    if (keep > 16) {
        return false;
    }
    for (long k = 0; k < keep && k < (long)nd; k++) {
        v = v * 10 + (dig[k] - '0');
    }
    for (long k = (long)nd; k < keep; k++) {
        v *= 10; /* at most 16 digits: below INT64_MAX */
    }
    if (keep >= 0 && keep < (long)nd && dig[keep] >= '5') {
        v++;
    }
    *micros_out = v > 0 ? v : 1;
    return true;
}

int money_add(int64_t *sum_out, int64_t a, int64_t b, struct err *err)
{
    if ((b > 0 && a > INT64_MAX - b) || (b < 0 && a < INT64_MIN - b)) {
        return err_set(err, E_TOOBIG, "amount overflows");
    }
    *sum_out = a + b;
    return E_OK;
}
