/* SPDX-License-Identifier: Apache-2.0 */
/* Structured log lines on stderr, as text ("ts LEVEL event k=v ...") or one JSON object
 * per line. Thread-safe: each line is written with a single write(2). Values may hold
 * hostile bytes: a line is always exactly one line. Text escapes every control character
 * and byte that is not UTF-8 as \xNN (\n, \r, \t, \\, \" by name); JSON is always one valid
 * JSON object (controls escaped, invalid UTF-8 as U+FFFD). A value longer than
 * LOG_VALUE_MAX bytes is cut on a character boundary and ends in LOG_TRUNCATED. */
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

#define LOG_VALUE_MAX 2048             /* bytes of one value (or event name) written */
#define LOG_TRUNCATED "...[truncated]" /* appended to a value cut at LOG_VALUE_MAX */

/* Picks the output format; the default before any call is text. */
void log_set_format(enum log_format fmt);

/* Parses "text" or "json"; returns E_INVALID otherwise. */
int log_format_parse(enum log_format *out, const char *s);

/* Sends lines to FD instead of stderr (tests); -1 restores stderr. FD stays the
 * caller's. */
void log_set_fd(int fd);

/* Writes one line: EVENT plus key/value string pairs, terminated by a NULL key.
 * A NULL value is written as empty. Example:
 *   log_kv(LOG_INFO, "request", "method", "GET", "path", "/healthz", NULL); */
void log_kv(enum log_level level, const char *event, ...) __attribute__((sentinel));

#endif
