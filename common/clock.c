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

void clock_rfc3339(char out[CLOCK_RFC3339_MAX], int64_t ms)
{
    time_t secs = (time_t)(ms / 1000);
    struct tm tm;

    gmtime_r(&secs, &tm);
    snprintf(out, CLOCK_RFC3339_MAX, "%04d-%02d-%02dT%02d:%02d:%02dZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
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

int clock_parse_rfc3339(int64_t *ms_out, const char *s)
{
    int y, mo, d, h, mi, sec, oh = 0, om = 0, ms = 0, scale = 100;
    const char *p;
    int64_t secs;

    if (strlen(s) < 20 || digits(s, 4, &y) || s[4] != '-' || digits(s + 5, 2, &mo) ||
        s[7] != '-' || digits(s + 8, 2, &d) || (s[10] != 'T' && s[10] != 't') ||
        digits(s + 11, 2, &h) || s[13] != ':' || digits(s + 14, 2, &mi) || s[16] != ':' ||
        digits(s + 17, 2, &sec)) {
        return E_INVALID;
    }
    if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60) {
        return E_INVALID;
    }
    p = s + 19;
    if (*p == '.') {
        p++;
        if (*p < '0' || *p > '9') {
            return E_INVALID;
        }
        for (; *p >= '0' && *p <= '9'; p++) {
            ms += (*p - '0') * scale;
            scale /= 10;
        }
    }
    if ((*p == 'Z' || *p == 'z') && p[1] == '\0') {
        oh = 0;
    } else if ((*p == '+' || *p == '-') && strlen(p) == 6 && !digits(p + 1, 2, &oh) &&
               p[3] == ':' && !digits(p + 4, 2, &om)) {
        if (*p == '-') {
            oh = -oh;
            om = -om;
        }
    } else {
        return E_INVALID;
    }
    secs = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + sec - oh * 3600 - om * 60;
    *ms_out = secs * 1000 + ms;
    return E_OK;
}
