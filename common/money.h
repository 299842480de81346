/* SPDX-License-Identifier: Apache-2.0 */
/* Exact money: amounts are int64 micro-dollars (1 USD = 1,000,000). Parsing never rounds:
 * more than 6 decimals, overflow or junk is an error (a reported cost that is a JSON number
 * is rounded: money_micros_of_digits). */
#ifndef DIVERGE_COMMON_MONEY_H
#define DIVERGE_COMMON_MONEY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define MONEY_MICROS_PER_USD INT64_C(1000000)
/* Large enough for "-9223372036854.775807" and a NUL. */
#define MONEY_STR_MAX 32

/* Parses a non-negative decimal USD amount: "5.00", "0.0225", "5", "$5", "+15.00", "+$15",
 * "$15.00". Leading/trailing spaces are not accepted. *plus_out (may be NULL) tells
 * whether a leading '+' was written. Returns E_INVALID on junk or more than 6 decimals,
 * E_TOOBIG on overflow. */
int money_parse(int64_t *micros_out, bool *plus_out, const char *s, struct err *err);

/* As money_parse but over S[0..len). */
int money_parse_n(int64_t *micros_out, bool *plus_out, const char *s, size_t len, struct err *err);

/* Writes MICROS as a decimal with at least two and at most six decimals ("5.00",
 * "0.0675", "12.345678") into OUT (MONEY_STR_MAX bytes). Negative amounts get '-'. */
void money_format(char out[MONEY_STR_MAX], int64_t micros);

/* A reported cost given by its significant digits DIG[0..nd) (no leading zeros; ND may be
 * 0 for zero) times 10^SCALE micro-dollars, into *micros_out: whole micro-dollars as they
 * are, finer amounts rounded half up to the micro-dollar and to at least one when not zero
 * (a cost is never charged as nothing). False when it has more than 16 digits of whole
 * micro-dollars. The one rounding rule of the meter's JSON numbers and the runner's usage
 * lines. */
bool money_micros_of_digits(int64_t *micros_out, const char *dig, size_t nd, long scale);

/* Adds with overflow detection: E_TOOBIG when the sum does not fit. */
int money_add(int64_t *sum_out, int64_t a, int64_t b, struct err *err);

#endif
