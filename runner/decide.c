/* SPDX-License-Identifier: Apache-2.0 */
/* The runner's decisions as pure functions: what a meter answer means, the exit code of
 * a stop, the retry delay, whether an iteration succeeded and what the next one is told. */
#include <stdio.h>
#include <string.h>

#include "common/buf.h"
#include "runner/runner.h"

enum runner_meter_next runner_meter_classify(int rc, long status)
{
    if (rc == E_AGAIN) {
        return RUNNER_METER_RETRY;
    }
    if (rc != E_OK) {
        return RUNNER_METER_PROTOCOL;
    }
    switch (status) {
    case 200:
        return RUNNER_METER_CONTINUE;
    case 429:
        return RUNNER_METER_PAUSED;
    case 403:
        return RUNNER_METER_FORBIDDEN;
    case 401:
        return RUNNER_METER_UNAUTHORIZED;
    case 408:
        return RUNNER_METER_RETRY;
    default:
        return (status >= 500 && status <= 599) ? RUNNER_METER_RETRY : RUNNER_METER_PROTOCOL;
    }
}

enum runner_exit runner_exit_for(enum runner_meter_next next)
{
    switch (next) {
    case RUNNER_METER_CONTINUE:
    case RUNNER_METER_PAUSED:
        return RUNNER_EXIT_OK;
    case RUNNER_METER_FORBIDDEN:
        return RUNNER_EXIT_FORBIDDEN;
    case RUNNER_METER_UNAUTHORIZED:
        return RUNNER_EXIT_UNAUTHORIZED;
    case RUNNER_METER_RETRY:
        return RUNNER_EXIT_UNREACHABLE;
    case RUNNER_METER_PROTOCOL:
        return RUNNER_EXIT_PROTOCOL;
    }
    return RUNNER_EXIT_PROTOCOL;
}

long runner_backoff_ms(int attempt, long first_ms)
{
    long cap = first_ms * RUNNER_BACKOFF_CAP_FACTOR;
    long ms = first_ms;

    for (int i = 1; i < attempt && ms < cap; i++) {
        ms *= 2;
    }
    return ms > cap ? cap : ms;
}

bool runner_meter_again(int attempt, int max_attempts, bool unreachable, long elapsed_ms,
                        long unreachable_ms)
{
    if (attempt < max_attempts) {
        return true;
    }
    return unreachable && elapsed_ms < unreachable_ms;
}

bool runner_iteration_ok(const struct runner_iteration *it)
{
    if (it->agent_status != 0) {
        return false;
    }
    if (it->verify_ran && it->verify_status != 0) {
        return false;
    }
    if (it->preview_ran && (it->preview_status < 200 || it->preview_status > 299)) {
        return false;
    }
    return true;
}

/* Start of the last RUNNER_TAIL_LINES lines of TAIL[0..len) (a final newline does not
 * count as a line). */
static size_t tail_start(const char *tail, size_t len)
{
    size_t end = len, lines = 0;

    if (end > 0 && tail[end - 1] == '\n') {
        end--;
    }
    for (size_t i = end; i > 0; i--) {
        if (tail[i - 1] == '\n' && ++lines == RUNNER_TAIL_LINES) {
            return i;
        }
    }
    return 0;
}

char *runner_failure_text(const struct runner_iteration *it, const char *tail, size_t tail_len)
{
    struct buf b;
    size_t start, keep;
    char c;

    buf_init(&b, 0);
    if (it->agent_status != 0) {
        buf_printf(&b, "iteration %ld: the agent command failed (exit %d)", it->iteration,
                   it->agent_status);
    } else if (it->verify_ran && it->verify_status != 0) {
        buf_printf(&b, "iteration %ld: the verify command failed (exit %d)", it->iteration,
                   it->verify_status);
    } else if (it->preview_status < 0) {
        buf_printf(&b, "iteration %ld: the preview could not be reached", it->iteration);
    } else {
        buf_printf(&b, "iteration %ld: the preview answered HTTP %ld", it->iteration,
                   it->preview_status);
    }
    start = tail != NULL ? tail_start(tail, tail_len) : 0;
    keep = tail != NULL ? tail_len - start : 0;
    /* Keep the end of the output when it does not fit. */
    if (keep > RUNNER_FAILURE_MAX - 1 - b.len - 32) {
        start = tail_len - (RUNNER_FAILURE_MAX - 1 - b.len - 32);
        keep = tail_len - start;
    }
    if (keep > 0) {
        buf_puts(&b, "; last output lines:\n");
        for (size_t i = start; i < tail_len; i++) {
            c = tail[i];
            if ((unsigned char)c < 0x20 && c != '\n' && c != '\t') {
                c = '?';
            } else if (c == 0x7f) {
                c = '?';
            }
            buf_append(&b, &c, 1);
        }
    }
    return buf_take(&b);
}

void runner_iteration_line(char *out, size_t cap, const struct runner_iteration *it, long max)
{
    int n = snprintf(out, cap, "iteration %ld/%ld: agent exit %d", it->iteration, max,
                     it->agent_status);

    if (n < 0 || (size_t)n >= cap) {
        return;
    }
    if (it->verify_ran) {
        int m = snprintf(out + n, cap - (size_t)n, ", verify exit %d", it->verify_status);
        if (m < 0 || (size_t)m >= cap - (size_t)n) {
            return;
        }
        n += m;
    }
    if (it->preview_ran) {
        if (it->preview_status < 0) {
            snprintf(out + n, cap - (size_t)n, ", preview unreachable");
        } else {
            snprintf(out + n, cap - (size_t)n, ", preview HTTP %ld", it->preview_status);
        }
    }
}

/* TEXT after its "iteration N: " prefix. */
static const char *past_iteration(const char *text)
{
    const char *p = text;

    if (strncmp(p, "iteration ", 10) != 0) {
        return text;
    }
    p += 10;
    while (*p >= '0' && *p <= '9') {
        p++;
    }
    return strncmp(p, ": ", 2) == 0 ? p + 2 : text;
}

bool runner_same_failure(const char *a, const char *b)
{
    return a != NULL && b != NULL && strcmp(past_iteration(a), past_iteration(b)) == 0;
}
