/* SPDX-License-Identifier: Apache-2.0 */
/* Note bodies made safe for GitLab (pure): never a lone emoji (GitLab turns it into an
 * award), never a line GitLab would run as a quick action (`/merge`, `/close`, … at the
 * start of a line run with the bot's rights), never over the body limit (the middle of a
 * long body is cut). */
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "scm/gitlab/gitlab.h"

#define CUT_LINE "\n\n… (cut: the note was longer than GitLab allows) …\n\n"
#define AWARD_SUFFIX " (diverge)"
/* A pictograph sequence (with skin tones, ZWJ joins, variation selectors) stays short. */
#define EMOJI_SEQ_MAX 40

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* ":name:" with name of [a-z0-9_+-]. */
static bool is_shortcode(const char *s, size_t n)
{
    if (n < 3 || s[0] != ':' || s[n - 1] != ':') {
        return false;
    }
    for (size_t i = 1; i + 1 < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '+' ||
              c == '-')) {
            return false;
        }
    }
    return true;
}

/* Whether S[0..n) (n > 0) is one short run of non-ASCII bytes with no space: one pictograph
 * (sequence). A leading digit, '#' or '*' starts a keycap emoji. */
static bool is_pictograph(const char *s, size_t n)
{
    bool wide = false;

    if (n > EMOJI_SEQ_MAX) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        bool keycap = i == 0 && ((c >= '0' && c <= '9') || c == '#' || c == '*');
        if (c < 0x80 && !keycap) {
            return false;
        }
        wide = wide || c >= 0x80;
    }
    return wide;
}

bool gitlab_note_is_award(const char *body)
{
    size_t a = 0, n = strlen(body);

    while (a < n && is_space(body[a])) {
        a++;
    }
    while (n > a && is_space(body[n - 1])) {
        n--;
    }
    if (n == a) {
        return false;
    }
    return is_shortcode(body + a, n - a) || is_pictograph(body + a, n - a);
}

/* The largest boundary <= AT that does not split a UTF-8 sequence of S. */
static size_t utf8_floor(const char *s, size_t at)
{
    while (at > 0 && ((unsigned char)s[at] & 0xC0) == 0x80) {
        at--;
    }
    return at;
}

/* BODY with every line that starts with '/' escaped as "\\/" (Markdown shows "/"; GitLab
 * runs no quick action). New string. */
static char *no_quick_actions(const char *body)
{
    struct buf b;
    bool line_start = true;

    buf_init(&b, 0);
    for (const char *p = body; *p != '\0'; p++) {
        if (line_start && *p == '/') {
            (void)buf_append(&b, "\\", 1);
        }
        (void)buf_append(&b, p, 1);
        line_start = *p == '\n' || *p == '\r';
    }
    return buf_take(&b);
}

static char *fit_len(const char *body, size_t max);

char *gitlab_note_fit(const char *body, size_t max)
{
    char *safe = no_quick_actions(body), *out;

    if (gitlab_note_is_award(safe)) {
        out = xasprintf("%s%s", safe, AWARD_SUFFIX);
    } else {
        out = fit_len(safe, max);
    }
    free(safe);
    return out;
}

static char *fit_len(const char *body, size_t max)
{
    size_t n = strlen(body), cut = strlen(CUT_LINE);
    struct buf b;

    if (n <= max || max < cut + 2) {
        return n <= max ? xstrdup(body) : xstrndup(body, utf8_floor(body, max));
    }
    {
        size_t keep = max - cut, head = utf8_floor(body, keep / 2);
        size_t tail = n - (keep - head);
        /* Move the tail's start forward to a character boundary. */
        while (tail < n && ((unsigned char)body[tail] & 0xC0) == 0x80) {
            tail++;
        }
        buf_init(&b, 0);
        (void)buf_append(&b, body, head);
        (void)buf_append(&b, CUT_LINE, cut);
        (void)buf_append(&b, body + tail, n - tail);
        return buf_take(&b);
    }
}
