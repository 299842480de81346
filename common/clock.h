/* SPDX-License-Identifier: Apache-2.0 */
/* Time comes through this interface so tests can drive it; clock_system() is the real one.
 * Also RFC 3339 helpers. */
#ifndef DIVERGE_COMMON_CLOCK_H
#define DIVERGE_COMMON_CLOCK_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

typedef int64_t (*clock_now_fn)(void *userdata);

struct clock {
    clock_now_fn now_ms; /* wall-clock milliseconds since the Unix epoch */
    void *userdata;
};

/* The process-wide real clock (borrowed, static storage). */
const struct clock *clock_system(void);

static inline int64_t clock_now_ms(const struct clock *c)
{
    return c->now_ms(c->userdata);
}

/* Milliseconds of a monotonic clock, for measuring durations. */
int64_t clock_mono_ns(void);

/* *TS = the clock ID now + MS (MS >= 0): the deadline of a pthread_cond_timedwait whose
 * condition variable waits on ID. */
void clock_deadline_in(struct timespec *ts, clockid_t id, int64_t ms);

#define CLOCK_RFC3339_MAX 80

/* Formats SECS (since the epoch) as "2026-11-29T10:00:00" (UTC) into OUT; its length.
 * Arithmetic only: gmtime_r takes a glibc lock, which every request thread's access line
 * would contend for (and a child forked while another thread held it would wait for ever). */
size_t clock_utc_seconds(char out[CLOCK_RFC3339_MAX], int64_t secs);
/* Formats MS (epoch ms) as "2026-11-29T10:00:00Z" into OUT. */
void clock_rfc3339(char out[CLOCK_RFC3339_MAX], int64_t ms);

/* Parses "YYYY-MM-DDTHH:MM:SS[.frac](Z|±hh:mm)" into epoch ms; E_INVALID otherwise. */
int clock_parse_rfc3339(int64_t *ms_out, const char *s);
/* The start (00:00:00 UTC on the 1st) of the calendar month holding MS, epoch ms. */
int64_t clock_month_start(int64_t ms);
/* The start of the month after the one holding MS. */
int64_t clock_next_month(int64_t ms);

#endif
