/* SPDX-License-Identifier: Apache-2.0 */
/* The system clock and RFC 3339 conversions (UTC only on output). */
#include "common/clock.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/err.h"

static int64_t system_now_ms(void *userdata)
{
    struct timespec ts;

    (void)userdata;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const struct clock g_system = {.now_ms = system_now_ms, .userdata = NULL};

const struct clock *clock_system(void)
{
    return &g_system;
}

int64_t clock_mono_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void clock_deadline_in(struct timespec *ts, clockid_t id, int64_t ms)
{
    clock_gettime(id, ts);
    ts->tv_sec += (time_t)(ms / 1000);
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm). */
static int64_t days_from_civil(int64_t y, int m, int d)
{
    int64_t era, yoe, doy, doe;

    y -= m <= 2;
    era = (y >= 0 ? y : y - 399) / 400;
    yoe = y - era * 400;
    doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* The year, month (1-12) and day (1-31) of DAYS since 1970-01-01 (the inverse of
 * days_from_civil). */
static void civil_from_days(int64_t *y_out, int *m_out, int *d_out, int64_t days)
{
    int64_t z = days + 719468, era, doe, yoe, doy, mp, m;

    era = (z >= 0 ? z : z - 146096) / 146097;
    doe = z - era * 146097;
    yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    mp = (5 * doy + 2) / 153;
    m = mp + (mp < 10 ? 3 : -9);
    *y_out = yoe + era * 400 + (m <= 2);
    *m_out = (int)m;
    *d_out = (int)(doy - (153 * mp + 2) / 5 + 1);
}

size_t clock_utc_seconds(char out[CLOCK_RFC3339_MAX], int64_t secs)
{
    int64_t days = secs / 86400 - (secs % 86400 < 0 ? 1 : 0), rem = secs - days * 86400, y;
    int m, d;
    int n;

    civil_from_days(&y, &m, &d, days);
    n = snprintf(out, CLOCK_RFC3339_MAX, "%04lld-%02d-%02dT%02d:%02d:%02d", (long long)y, m, d,
                 (int)(rem / 3600), (int)(rem / 60 % 60), (int)(rem % 60));
    return n > 0 && n < CLOCK_RFC3339_MAX ? (size_t)n : 0;
}

void clock_rfc3339(char out[CLOCK_RFC3339_MAX], int64_t ms)
{
    size_t n = clock_utc_seconds(out, ms / 1000);

    snprintf(out + n, CLOCK_RFC3339_MAX - n, "Z");
}

#define CLOCK_MS_PER_DAY INT64_C(86400000)

/* The day (since 1970-01-01) of MS, rounding down before the epoch too. */
static int64_t day_of(int64_t ms)
{
    return ms / CLOCK_MS_PER_DAY - (ms % CLOCK_MS_PER_DAY < 0 ? 1 : 0);
}

int64_t clock_month_start(int64_t ms)
{
    int64_t y;
    int m, d;

    civil_from_days(&y, &m, &d, day_of(ms));
    return days_from_civil(y, m, 1) * CLOCK_MS_PER_DAY;
}

int64_t clock_next_month(int64_t ms)
{
    int64_t y;
    int m, d;

    civil_from_days(&y, &m, &d, day_of(ms));
    return (m == 12 ? days_from_civil(y + 1, 1, 1) : days_from_civil(y, m + 1, 1)) *
           CLOCK_MS_PER_DAY;
}

static int digits(const char *s, int n, int *out)
{
    int v = 0;

    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return E_INVALID;
        }
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return E_OK;
}

/* The broken-down fields of an RFC 3339 timestamp. */
struct rfc3339 {
    int y, mo, d, h, mi, sec; /* as written; sec may be 60 (a leap second) */
    int ms;                   /* the first three fraction digits */
    int oh, om;               /* the offset from UTC, both negative west of it */
};

/* "YYYY-MM-DDTHH:MM:SS" at S (at least 19 bytes), range-checked. */
static int parse_date_time(struct rfc3339 *t, const char *s)
{
    const struct {
        int off, n; /* where the field starts, how many digits */
        int lo, hi; /* its allowed range */
        int *v;     /* where it goes */
    } fields[] = {
        {0, 4, 0, 9999, &t->y}, {5, 2, 1, 12, &t->mo},  {8, 2, 1, 31, &t->d},
        {11, 2, 0, 23, &t->h},  {14, 2, 0, 59, &t->mi}, {17, 2, 0, 60, &t->sec},
    };

    if (s[4] != '-' || s[7] != '-' || (s[10] != 'T' && s[10] != 't') || s[13] != ':' ||
        s[16] != ':') {
        return E_INVALID;
    }
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        if (digits(s + fields[i].off, fields[i].n, fields[i].v) != E_OK ||
            *fields[i].v < fields[i].lo || *fields[i].v > fields[i].hi) {
            return E_INVALID;
        }
    }
    return E_OK;
}

/* An optional ".digits" at *P: milliseconds into T, *P advanced past it. */
static int parse_fraction(struct rfc3339 *t, const char **p)
{
    const char *q = *p;
    int scale = 100;

    if (*q != '.') {
        return E_OK;
    }
    q++;
    if (*q < '0' || *q > '9') {
        return E_INVALID;
    }
    for (; *q >= '0' && *q <= '9'; q++) {
        t->ms += (*q - '0') * scale;
        scale /= 10;
    }
    *p = q;
    return E_OK;
}

/* "Z" or "+HH:MM"/"-HH:MM" ending the string at P. */
static int parse_offset(struct rfc3339 *t, const char *p)
{
    if ((*p == 'Z' || *p == 'z') && p[1] == '\0') {
        return E_OK;
    }
    if ((*p != '+' && *p != '-') || strlen(p) != 6 || digits(p + 1, 2, &t->oh) || p[3] != ':' ||
        digits(p + 4, 2, &t->om)) {
        return E_INVALID;
    }
    if (*p == '-') {
        t->oh = -t->oh;
        t->om = -t->om;
    }
    return E_OK;
}

int clock_parse_rfc3339(int64_t *ms_out, const char *s)
{
    struct rfc3339 t = {0};
    const char *p;
    int64_t secs;

    if (strlen(s) < 20 || parse_date_time(&t, s) != E_OK) {
        return E_INVALID;
    }
    p = s + 19;
    if (parse_fraction(&t, &p) != E_OK || parse_offset(&t, p) != E_OK) {
        return E_INVALID;
    }
    secs = days_from_civil(t.y, t.mo, t.d) * 86400 + t.h * 3600 + t.mi * 60 + t.sec - t.oh * 3600 -
           t.om * 60;
    *ms_out = secs * 1000 + t.ms;
    return E_OK;
}
