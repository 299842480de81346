/* SPDX-License-Identifier: Apache-2.0 */
/* A fast compact JSON writer for jansson trees: the same compact text json_dumps(…,
 * JSON_COMPACT) writes for objects of strings, integers, booleans, nulls, arrays and
 * objects (insertion order), with long runs of plain characters copied at once. The
 * store writes every task change with it (the meter's hot path). */
#ifndef DIVERGE_COMMON_JSONW_H
#define DIVERGE_COMMON_JSONW_H

#include <jansson.h>
#include <stdint.h>

#include "common/buf.h"

/* Appends the compact JSON of J to OUT (uncapped buffer). Reals are written with
 * jansson's own formatting. */
void jsonw_append(struct buf *out, const json_t *j);

/* Appends the NUL-terminated string S as a JSON string, escaped as jansson escapes it. */
void jsonw_string(struct buf *out, const char *s);

/* Appends V as a JSON integer (decimal, no printf). */
void jsonw_int(struct buf *out, int64_t v);

/* The compact JSON of J as a new string (caller frees). */
char *jsonw_dumps(const json_t *j);

#endif
