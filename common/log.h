/* SPDX-License-Identifier: Apache-2.0 */
/* Structured log lines on stderr, as text ("ts LEVEL event k=v ...") or one JSON object
 * per line. Thread-safe: each line is written with a single write(2). */
#ifndef DIVERGE_COMMON_LOG_H
#define DIVERGE_COMMON_LOG_H

enum log_format {
    LOG_FORMAT_TEXT,
    LOG_FORMAT_JSON,
};

enum log_level {
    LOG_DEBUG,
    LOG_INFO,
    LOG_WARN,
    LOG_ERROR,
};

/* Picks the output format; the default before any call is text. */
void log_set_format(enum log_format fmt);

/* Parses "text" or "json"; returns E_INVALID otherwise. */
int log_format_parse(enum log_format *out, const char *s);

/* Writes one line: EVENT plus key/value string pairs, terminated by a NULL key.
 * A NULL value is written as empty. Example:
 *   log_kv(LOG_INFO, "request", "method", "GET", "path", "/healthz", NULL); */
void log_kv(enum log_level level, const char *event, ...) __attribute__((sentinel));

#endif
