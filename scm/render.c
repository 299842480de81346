/* SPDX-License-Identifier: Apache-2.0 */
/* Renders the sticky status comment (SPEC §6) from a task object. Invariant: every piece
 * of text that does not come from this file goes through escape_line() or encode_url()
 * with a byte cap, so a body can neither break out of its Markdown/HTML structure (close
 * our HTML comments, inject tags or links, ping people) nor reach SCM_STICKY_MAX. */
#include "scm/render.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/money.h"
#include "scm/render_int.h"
#include "store/store.h"

/* Byte caps of the escaped fields. */
enum {
    CAP_OBJECTIVE = 4000,
    CAP_GUIDANCE = 2000,
    CAP_MESSAGE = 1000,
    CAP_REASON = 120,
    CAP_NAME = 100,     /* the task name in the heading (a DNS label: 63) */
    CAP_BRANCH = 300,   /* the working branch */
    CAP_URL_TEXT = 300, /* the repository link's text */
    CAP_URL = 2048,     /* one link destination (repository, magic link, exit link) */
    CAP_FIXED = 4096,   /* everything else: template text, numbers, the tag, the time */
    CAP_FAILURE = 4096, /* the last failure quoted with a checkpoint (status.lastFailure) */
};

/* A code span of CAP content bytes takes at most this much (fences and padding). */
#define CODE_SPAN_MAX(cap_) (3 * (cap_) + 4)
/* The exit URL is at most "?_diverge_env=clear" (19 bytes) longer than the preview URL. */
#define EXIT_EXTRA 32

_Static_assert(CAP_FIXED + CAP_OBJECTIVE + CAP_GUIDANCE + CAP_MESSAGE + CAP_REASON +
                       CODE_SPAN_MAX(CAP_NAME) + CODE_SPAN_MAX(CAP_BRANCH) + CAP_URL_TEXT +
                       3 * (CAP_URL + EXIT_EXTRA) + CAP_URL + 4 * CAP_NAME +
                       (CAP_URL + 2 * CAP_NAME) + (CAP_FAILURE + 2 * CAP_FAILURE / 3 + 16) <
                   SCM_STICKY_MAX,
               "the field caps must keep a sticky comment under GitHub's limit");

#define ELLIPSIS "\xE2\x80\xA6"    /* U+2026 */
#define REPLACEMENT "\xEF\xBF\xBD" /* U+FFFD, for bytes that are not UTF-8 */
#define ZWJ "\xE2\x80\x8D"         /* U+200D: "@\u200Dname" is no mention */
#define ZWSP "\xE2\x80\x8B"        /* U+200B: "http:\u200B//", "w\u200Bww." are no autolinks */

enum esc_mode {
    ESC_TEXT, /* Markdown text: entities for <>&, backslashes for Markdown punctuation */
    ESC_CODE, /* the inside of a code span: taken literally by Markdown */
};

/* Length of the well-formed UTF-8 sequence at P (N > 0 bytes left), or 0 when the bytes
 * there are not one (RFC 3629: no overlongs, surrogates or code points past U+10FFFF). */
static size_t utf8_seq_len(const unsigned char *p, size_t n)
{
    return err_utf8_char_len((const char *)p, n);
}

/* Writes the escaped form of the ASCII byte C into OUT (8 bytes); returns its length. */
static size_t escape_ascii(char out[8], unsigned char c, enum esc_mode mode)
{
    static const struct {
        unsigned char c;
        const char *s;
    } subst[] = {{'<', "&lt;"}, {'>', "&gt;"}, {'&', "&amp;"}, {'@', "@" ZWJ}};

    if (c < 0x20 || c == 0x7F) {
        out[0] = ' '; /* one line: newlines, tabs and other controls become spaces */
        return 1;
    }
    if (mode == ESC_TEXT) {
        for (size_t i = 0; i < ARRAY_LEN(subst); i++) {
            if (subst[i].c == c) {
                memcpy(out, subst[i].s, strlen(subst[i].s));
                return strlen(subst[i].s);
            }
        }
        /* Emphasis, code spans, links, strikethrough, table cells and escapes. */
        if (strchr("\\`*_[]|~", c) != NULL) {
            out[0] = '\\';
            out[1] = (char)c;
            return 2;
        }
    }
    out[0] = (char)c;
    return 1;
}

/* Whether the ASCII text P[0..n) starts where GitHub would autolink a bare URL: the ':'
 * of "scheme://" or the first 'w' of "www." (GFM extended autolinks; bare e-mail
 * addresses are already broken by the ZWJ after '@'). */
static bool autolink_at(const unsigned char *p, size_t n)
{
    return (n >= 3 && p[0] == ':' && p[1] == '/' && p[2] == '/') ||
           (n >= 4 && strncasecmp((const char *)p, "www.", 4) == 0);
}

/* One output unit: the escape of the character at S[*i..n), advancing *i. Runs of spaces
 * collapse into one, and *SPACE tells whether the output so far ends in a space. Text
 * (ESC_TEXT) gets an invisible break wherever it would turn into a link. */
static size_t escape_unit(char out[8], const char *s, size_t *i, size_t n, enum esc_mode mode,
                          bool *space)
{
    const unsigned char *p = (const unsigned char *)s + *i;
    size_t len = utf8_seq_len(p, n - *i);
    bool was_space = *space;

    *i += len > 0 ? len : 1;
    *space = false;
    if (len == 0) {
        memcpy(out, REPLACEMENT, 3);
        return 3;
    }
    if (len > 1) {
        memcpy(out, p, len);
        return len;
    }
    if (mode == ESC_TEXT && autolink_at(p, n - (*i - 1))) {
        out[0] = (char)p[0];
        memcpy(out + 1, ZWSP, 3);
        return 4;
    }
    len = escape_ascii(out, p[0], mode);
    *space = len == 1 && out[0] == ' ';
    return *space && was_space ? 0 : len;
}

static bool is_blank(unsigned char c)
{
    return c <= 0x20 || c == 0x7F;
}

/* Returns S made safe as one line for MODE, at most CAP bytes: when the whole text does
 * not fit it is cut at a character boundary and ends in "…". New string; caller frees. */
static char *escape_line(const char *s, size_t cap, enum esc_mode mode)
{
    size_t n = strlen(s), i = 0, total = 0, len = 0, k;
    bool space = true; /* true at the start: leading blanks are dropped */
    char unit[8], *out;

    while (n > 0 && is_blank((unsigned char)s[n - 1])) {
        n--;
    }
    /* First pass: does the whole text fit? It stops at the cap, so a huge text costs
     * no more than a short one. */
    while (i < n && total <= cap) {
        total += escape_unit(unit, s, &i, n, mode, &space);
    }
    out = xmalloc(cap + 1);
    i = 0;
    space = true;
    while (i < n) {
        k = escape_unit(unit, s, &i, n, mode, &space);
        if (total > cap && len + k > cap - strlen(ELLIPSIS)) {
            break;
        }
        memcpy(out + len, unit, k);
        len += k;
    }
    if (total > cap) {
        while (len > 0 && out[len - 1] == ' ') {
            len--;
        }
        memcpy(out + len, ELLIPSIS, strlen(ELLIPSIS));
        len += strlen(ELLIPSIS);
    }
    out[len] = '\0';
    return out;
}

static bool is_http_url(const char *s)
{
    return strncasecmp(s, "http://", 7) == 0 || strncasecmp(s, "https://", 8) == 0;
}

/* Returns URL percent-encoded where Markdown or HTML would read a byte as structure
 * (blanks, controls, non-ASCII, <>"'()\`{}|^), or NULL when the result would pass CAP
 * bytes: a cut URL would be a wrong link. New string; caller frees. */
static char *encode_url(const char *url, size_t cap)
{
    struct buf b;

    buf_init(&b, cap);
    for (const unsigned char *p = (const unsigned char *)url; *p != '\0'; p++) {
        int rc = is_blank(*p) || *p >= 0x80 || strchr("<>\"'()\\`{}|^", *p) != NULL
                     ? buf_printf(&b, "%%%02X", (unsigned)*p)
                     : buf_append(&b, p, 1);
        if (rc != E_OK) {
            buf_cleanup(&b);
            return NULL;
        }
    }
    return buf_take(&b);
}

/* The body under construction. */
struct sticky {
    struct buf b; /* the body; capped below SCM_STICKY_MAX */
    int rc;       /* the first append failure; E_OK while none */
};

static void put(struct sticky *r, const char *s)
{
    if (r->rc == E_OK) {
        r->rc = buf_puts(&r->b, s);
    }
}

/* Appends each string argument up to the terminating NULL. */
static void put_all(struct sticky *r, ...) __attribute__((sentinel));
static void put_all(struct sticky *r, ...)
{
    va_list ap;
    const char *s;

    va_start(ap, r);
    while ((s = va_arg(ap, const char *)) != NULL) {
        put(r, s);
    }
    va_end(ap);
}

/* Appends S as escaped Markdown text of at most CAP bytes. */
static void put_text(struct sticky *r, const char *s, size_t cap)
{
    char *t = escape_line(s, cap, ESC_TEXT);

    put(r, t);
    free(t);
}

/* Appends S (at most CAP bytes of it) as a code span, or "—" when S is empty. */
static void put_code(struct sticky *r, const char *s, size_t cap)
{
    char *t = escape_line(s, cap, ESC_CODE);
    size_t run = 0, longest = 0;
    char fence[CODE_SPAN_MAX(CAP_BRANCH)];

    for (const char *p = t; *p != '\0'; p++) {
        run = *p == '`' ? run + 1 : 0;
        longest = run > longest ? run : longest;
    }
    ASSERT(longest + 1 < sizeof(fence));
    memset(fence, '`', longest + 1);
    fence[longest + 1] = '\0';
    if (t[0] == '\0') {
        put(r, "—");
    } else {
        /* Inside a fence longer than any backtick run the text is literal; the spaces
         * (stripped by Markdown) let it start or end with a backtick. */
        const char *pad = longest > 0 ? " " : "";
        put_all(r, fence, pad, t, pad, fence, NULL);
    }
    free(t);
}

/* Writes V with thousands separators ("1,234,567") into OUT. */
static void format_count(char out[32], int64_t v)
{
    char digits[24];
    size_t n, o = 0;

    snprintf(digits, sizeof(digits), "%" PRId64, v);
    n = strlen(digits);
    for (size_t i = 0; i < n; i++) {
        out[o++] = digits[i];
        if (digits[i] != '-' && (n - i - 1) % 3 == 0 && i + 1 < n) {
            out[o++] = ',';
        }
    }
    out[o] = '\0';
}

static const char *str_at(const json_t *obj, const char *key)
{
    const char *s = json_string_value(json_object_get(obj, key));

    return s != NULL ? s : "";
}

static const char *badge(enum task_phase phase)
{
    /* Emoji defeat clang-format's alignment. */
    /* clang-format off */
    static const char *const badges[TASK_PHASE_COUNT] = {
        [TASK_PENDING] = "⏳ Queued",   [TASK_PROVISIONING] = "🚀 Running",
        [TASK_ACTIVE] = "🚀 Running",   [TASK_PAUSING] = "⏸️ Paused",
        [TASK_PAUSED] = "⏸️ Paused",    [TASK_COMPLETED] = "✅ Completed",
        [TASK_FAILED] = "❌ Failed",
    };
    /* clang-format on */

    return phase < TASK_PHASE_COUNT ? badges[phase] : "⏳ Queued";
}

/* The repository: a link when it is an http(s) URL, else its text. */
static void put_repo(struct sticky *r, const char *url)
{
    char *text = escape_line(url, CAP_URL_TEXT, ESC_TEXT);
    char *dest = is_http_url(url) ? encode_url(url, CAP_URL) : NULL;

    put(r, "- **Repository:** ");
    if (dest != NULL) {
        put_all(r, "[", text, "](", dest, ")", NULL);
    } else {
        put(r, text);
    }
    put(r, "\n");
    free(text);
    free(dest);
}

/* The magic link and the exit link, only for an http(s) previewUrl; a URL too long to
 * link in full is left out rather than cut into a wrong link. */
static void put_preview(struct sticky *r, const char *preview)
{
    char *exit_url, *dest, *exit_dest;

    if (!is_http_url(preview) || strlen(preview) > CAP_URL) {
        return;
    }
    exit_url = scm_render_exit_url(preview);
    dest = encode_url(preview, CAP_URL);
    exit_dest = encode_url(exit_url, CAP_URL + EXIT_EXTRA);
    if (dest != NULL && exit_dest != NULL) {
        put_all(r, "- **Preview:** [🔗 Magic Link](", dest, ") · [🚪 Exit Preview](", exit_dest,
                ")\n", NULL);
    }
    free(exit_url);
    free(dest);
    free(exit_dest);
}

static void put_links(struct sticky *r, const json_t *spec, const json_t *status)
{
    const json_t *repo = json_object_get(spec, "repository");

    put(r, "- **Branch:** ");
    put_code(r, str_at(repo, "workingBranch"), CAP_BRANCH);
    put(r, "\n");
    if (str_at(repo, "url")[0] != '\0') {
        put_repo(r, str_at(repo, "url"));
    }
    put_preview(r, str_at(status, "previewUrl"));
}

/* The limit that applies: status.effective… (what the server enforces: spec, token caveat
 * or server default, SPEC §14), else the spec's (a task not started yet); 0 when neither. */
static int64_t limit_at(const json_t *status, const char *effective, int64_t spec_value)
{
    const json_t *e = json_object_get(status, effective);
    int64_t v = 0;

    if (json_is_integer(e)) {
        v = json_integer_value(e);
    } else if (json_is_string(e) && money_parse(&v, NULL, json_string_value(e), NULL) != E_OK) {
        v = 0;
    }
    return v > 0 ? v : spec_value;
}

static void put_usage(struct sticky *r, const struct task_view *v, const json_t *status)
{
    char used[MONEY_STR_MAX + 1], limit[MONEY_STR_MAX + 1], money[MONEY_STR_MAX];
    int64_t tokens = limit_at(status, "effectiveBudgetTokens", v->budget_tokens);
    int64_t usd = limit_at(status, "effectiveBudgetUSD", v->budget_usd);
    int64_t iterations = limit_at(status, "effectiveMaxIterations", v->max_iterations);

    put(r, "|  | Used | Budget |\n| --- | ---: | ---: |\n");
    format_count(used, v->tokens_consumed);
    format_count(limit, tokens);
    put_all(r, "| Tokens | ", used, " | ", tokens > 0 ? limit : "default", " |\n", NULL);
    /* Exact: micro-dollars formatted as a decimal string, never through a double. */
    money_format(money, v->cost_usd);
    snprintf(used, sizeof(used), "$%s", money);
    money_format(money, usd);
    snprintf(limit, sizeof(limit), "$%s", money);
    put_all(r, "| USD | ", used, " | ", usd > 0 ? limit : "default", " |\n", NULL);
    format_count(used, v->iteration);
    format_count(limit, iterations);
    put_all(r, "| Iterations | ", used, " | ", iterations > 0 ? limit : "—", " |\n", NULL);
}

/* The forecast line (SPEC §15), from the status the meter wrote; it starts with "≈ $":
 * "≈ $1.80 more to finish at $0.45/iteration · 4 iterations left · budget holds", or
 * "· ⚠️ at this rate the budget runs out in iteration 6 of 8". None for a finished task. */
static void put_forecast(struct sticky *r, enum task_phase phase, const json_t *status)
{
    struct task_forecast f;
    char money[MONEY_STR_MAX], num[32], max[32];

    if (phase == TASK_COMPLETED || phase == TASK_FAILED || !task_forecast_read(&f, status)) {
        return;
    }
    money_format(money, f.forecast_micros);
    put_all(r, "≈ $", money, " more to finish at $", NULL);
    money_format(money, f.per_iteration);
    format_count(num, f.iterations_left);
    put_all(r, money, "/iteration · ", num, f.iterations_left == 1 ? " iteration" : " iterations",
            " left", NULL);
    if (f.has_budget && f.budget_holds) {
        put(r, " · budget holds");
    } else if (f.has_budget) {
        format_count(num, f.runs_out);
        format_count(max, f.max_iterations);
        put_all(r, " · ⚠️ at this rate the budget runs out in iteration ", num, " of ", max,
                NULL);
    }
    put(r, "\n\n");
}

struct reason_text {
    const char *reason; /* status.reason */
    const char *text;   /* Markdown */
};

static const struct reason_text g_pause_texts[] = {
    {"BudgetExceeded", "budget exceeded. Add budget with `/diverge budget +$5`, then continue "
                       "with `/diverge resume` (or both at once: `/diverge resume +$5`)."},
    {"MaxIterationsExceeded", "maximum iterations reached. Raise `spec.maxIterations`, then "
                              "continue with `/diverge resume`."},
    {"Suspended", "paused by request. Continue with `/diverge resume`."},
    {TASK_REASON_QUEUED, "resumed; it continues once a sandbox slot is free."},
    {"NoProgress", "no progress: the same verify failure several iterations in a row (below). "
                   "Give the agent a hint with `/diverge guide …`, then continue with "
                   "`/diverge resume`."},
};

static const struct reason_text g_fail_texts[] = {
    {"Timeout", "timed out"},
    {"RunnerFailed", "the agent runner failed"},
    {"SandboxError", "sandbox error"},
    {"DiskLimit", "disk limit"},
    {"PushTooLarge", "push too large, not sent"},
    {"BudgetExceeded", "budget exceeded"},
    {"MaxIterationsExceeded", "maximum iterations reached"},
};

static const char *reason_text(const struct reason_text *t, size_t n, const char *reason)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(t[i].reason, reason) == 0) {
            return t[i].text;
        }
    }
    return NULL;
}

/* The state note: why a task is paused and how to continue, why it failed, or any
 * other status message. */
static void put_state(struct sticky *r, enum task_phase phase, const json_t *status)
{
    const char *reason = str_at(status, "reason"), *message = str_at(status, "message");
    const char *known;

    if (phase == TASK_PAUSING || phase == TASK_PAUSED) {
        known = reason_text(g_pause_texts, ARRAY_LEN(g_pause_texts), reason);
        put(r, "**Paused:** ");
        if (known != NULL) {
            put(r, known); /* the message would only repeat it */
        } else {
            put_text(r, reason[0] != '\0' ? reason : "paused", CAP_REASON);
            put(r, message[0] != '\0' ? ": " : "");
            put_text(r, message, CAP_MESSAGE);
            put(r, ". Continue with `/diverge resume`.");
        }
        put(r, "\n\n");
    } else if (phase == TASK_FAILED) {
        known = reason_text(g_fail_texts, ARRAY_LEN(g_fail_texts), reason);
        put(r, "**Failed:** ");
        if (known != NULL) {
            put(r, known);
        } else {
            put_text(r, reason[0] != '\0' ? reason : "no reason given", CAP_REASON);
        }
        put(r, message[0] != '\0' ? ": " : "");
        put_text(r, message, CAP_MESSAGE);
        put(r, "\n\n");
    } else if (message[0] != '\0') {
        put(r, "**Note:** ");
        put_text(r, message, CAP_MESSAGE);
        put(r, "\n\n");
    }
}

/* "⚠️ Stalled since HH:MM UTC" for a running task with status.stalledSince (SPEC §14). */
static void put_stalled(struct sticky *r, enum task_phase phase, const json_t *status)
{
    char when[CLOCK_RFC3339_MAX];
    int64_t ms = 0;

    if ((phase != TASK_ACTIVE && phase != TASK_PROVISIONING) ||
        clock_parse_rfc3339(&ms, str_at(status, "stalledSince")) != E_OK) {
        return;
    }
    clock_rfc3339(when, ms); /* "YYYY-MM-DDTHH:MM:SSZ", written anew: the status is not
                                trusted text */
    put(r, "**⚠️ Stalled since ");
    if (r->rc == E_OK && strlen(when) >= 16) {
        r->rc = buf_append(&r->b, when + 11, 5);
    }
    put(r, " UTC:** no output, no meter or gateway call since then.\n\n");
}

/* TEXT (at most CAP_FAILURE bytes of it) as a fenced code block: valid UTF-8, control
 * characters but newline and tab as spaces, the fence longer than any backtick run in it,
 * so nothing in it is read as Markdown or HTML (mentions inside code do not notify). */
static void put_fenced(struct sticky *r, const char *text)
{
    size_t n = strlen(text), run = 0, longest = 2;
    char *t = xmalloc(CAP_FAILURE + 1);
    char fence[CAP_FAILURE / 3 + 8];

    (void)err_utf8_copy(t, CAP_FAILURE + 1, text, n > CAP_FAILURE ? CAP_FAILURE : n);
    for (char *p = t; *p != '\0'; p++) {
        if (((unsigned char)*p < 0x20 && *p != '\n' && *p != '\t') || *p == 0x7f) {
            *p = ' ';
        }
        run = *p == '`' ? run + 1 : 0;
        longest = run > longest ? run : longest;
    }
    n = strlen(t);
    while (n > 0 && t[n - 1] == '\n') {
        t[--n] = '\0';
    }
    ASSERT(longest + 1 < sizeof(fence));
    memset(fence, '`', longest + 1);
    fence[longest + 1] = '\0';
    put_all(r, fence, "text\n", t, "\n", fence, "\n", NULL);
    free(t);
}

/* The checkpoint branch of a run that ended without a passing verify (SPEC §14): a link
 * when the repository is on an http(s) forge, and the last failure's lines. */
static void put_wip(struct sticky *r, enum task_phase phase, const json_t *spec,
                    const json_t *status, const json_t *ann)
{
    const char *branch = str_at(ann, TASK_ANN_WIP_BRANCH);
    const char *url = str_at(json_object_get(spec, "repository"), "url");
    const char *failure = str_at(status, "lastFailure");
    bool gitlab = strcmp(str_at(ann, "divergedev.com/provider"), "gitlab") == 0;
    char *base = NULL, *dest = NULL;
    size_t n = strlen(url);

    if (branch[0] == '\0' || phase == TASK_COMPLETED || strlen(branch) > 2 * CAP_NAME) {
        return;
    }
    if (is_http_url(url) && n < CAP_URL) {
        while (n > 0 && url[n - 1] == '/') {
            n--;
        }
        if (n > 4 && strncmp(url + n - 4, ".git", 4) == 0) {
            n -= 4;
        }
        base = xasprintf("%.*s%s%s", (int)n, url, gitlab ? "/-/tree/" : "/tree/", branch);
        dest = encode_url(base, CAP_URL + 2 * CAP_NAME);
    }
    put(r, "**Work in progress:** ");
    if (dest != NULL) {
        put(r, "[");
        put_code(r, branch, 2 * CAP_NAME);
        put_all(r, "](", dest, ")", NULL);
    } else {
        put_code(r, branch, 2 * CAP_NAME);
    }
    put(r, " holds the last checkpoint; the next run starts from it.\n\n");
    if (failure[0] != '\0') {
        put(r, "Last failure:\n\n");
        put_fenced(r, failure);
        put(r, "\n");
    }
    free(base);
    free(dest);
}

/* Whether URL may go into a Markdown link as is: http(s), and nothing that could end the
 * link or start markup. It comes from the operator's --public-url, but is checked anyway. */
static bool plain_http_url(const char *url)
{
    if (url == NULL || strlen(url) > CAP_URL ||
        (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0)) {
        return false;
    }
    for (const unsigned char *p = (const unsigned char *)url; *p != '\0'; p++) {
        if (*p <= ' ' || *p >= 0x7f || strchr("\"'<>()[]`\\", *p) != NULL) {
            return false;
        }
    }
    return true;
}

/* "- **Task page:** [ns/name](<dashboard>/#/task/ns/name)"; names are DNS labels. */
static void put_dashboard(struct sticky *r, const char *dashboard, const struct task_view *v)
{
    size_t n;

    if (!plain_http_url(dashboard)) {
        return;
    }
    n = strlen(dashboard);
    while (n > 0 && dashboard[n - 1] == '/') {
        n--;
    }
    put(r, "- **Task page:** [");
    put_text(r, v->ns, CAP_NAME);
    put(r, "/");
    put_text(r, v->name, CAP_NAME);
    put(r, "](");
    if (r->rc == E_OK) {
        r->rc = buf_append(&r->b, dashboard, n);
    }
    put_all(r, "/#/task/", v->ns, "/", v->name, ")\n", NULL);
}

/* The guidance, and whether this text has reached the agent yet (the meter or the LLM
 * gateway delivered it: status.guidanceHash names the text, guidanceDeliveredAt when). */
static void put_guidance(struct sticky *r, const char *guidance, const json_t *status)
{
    const char *had = json_string_value(json_object_get(status, "guidanceHash"));
    const char *at = json_string_value(json_object_get(status, "guidanceDeliveredAt"));
    char hash[TASK_GUIDANCE_HASH_LEN], when[CLOCK_RFC3339_MAX];
    int64_t ms = 0;

    task_guidance_hash(hash, guidance);
    put(r, "**Guidance:** ");
    put_text(r, guidance, CAP_GUIDANCE);
    if (had != NULL && at != NULL && strcmp(had, hash) == 0 &&
        clock_parse_rfc3339(&ms, at) == E_OK) {
        clock_rfc3339(when, ms); /* written anew: the status is not trusted text */
        put_all(r, "\n<sub>delivered to the agent ", when, "</sub>", NULL);
    } else {
        put(r, "\n<sub>not yet delivered to the agent</sub>");
    }
    put(r, "\n\n");
}

/* " — position N" after the badge of a task waiting for a sandbox slot (SPEC §14). */
static void put_queue(struct sticky *r, const struct task_view *v, const json_t *status)
{
    char num[32];

    if (v->queue_position > 0 && strcmp(str_at(status, "reason"), TASK_REASON_QUEUED) == 0) {
        snprintf(num, sizeof(num), "%lld", (long long)v->queue_position);
        put_all(r, v->phase == TASK_PENDING ? "" : " · ⏳ Queued", " — position ", num, NULL);
    }
}

/* " · run N" from the second run on: the run this comment shows (SPEC §14). */
static void put_run(struct sticky *r, const struct task_view *v)
{
    char num[32];

    if (v->status_run > 1) {
        snprintf(num, sizeof(num), "%lld", (long long)v->status_run);
        put_all(r, " · run ", num, NULL);
    }
}

static void put_body(struct sticky *r, const json_t *task, const struct task_view *v,
                     const char *dashboard, int64_t now_ms)
{
    const json_t *spec = json_object_get(task, "spec");
    const json_t *status = json_object_get(task, "status");
    const json_t *ann = json_object_get(json_object_get(task, "metadata"), "annotations");
    const char *guidance = str_at(ann, TASK_ANN_GUIDANCE);
    char tag[SCM_RENDER_TAG_MAX], when[CLOCK_RFC3339_MAX];

    scm_render_task_tag(tag, sizeof(tag), v->ns, v->name);
    put_all(r, SCM_STICKY_MARKER "\n", tag, "\n\n### ", badge(v->phase), NULL);
    put_queue(r, v, status);
    put(r, " · ");
    put_code(r, v->name, CAP_NAME);
    put_run(r, v);
    put(r, "\n\n**Objective:** ");
    put_text(r, v->objective != NULL ? v->objective : "", CAP_OBJECTIVE);
    put(r, "\n\n");
    put_links(r, spec, status);
    put_dashboard(r, dashboard, v);
    put(r, "\n");
    put_usage(r, v, status);
    put(r, "\n");
    put_forecast(r, v->phase, status);
    put_state(r, v->phase, status);
    put_stalled(r, v->phase, status);
    put_wip(r, v->phase, spec, status, ann);
    if (guidance[0] != '\0') {
        put_guidance(r, guidance, status);
    }
    clock_rfc3339(when, now_ms);
    put_all(r, UPDATED_PREFIX, when, "</sub>\n", NULL);
}

int scm_render_sticky(char **out, const json_t *task, int64_t now_ms, struct err *err)
{
    return scm_render_sticky_dashboard(out, task, NULL, now_ms, err);
}

int scm_render_sticky_dashboard(char **out, const json_t *task, const char *dashboard_url,
                                int64_t now_ms, struct err *err)
{
    struct task_view v;
    struct sticky r;

    *out = NULL;
    task_view_of(&v, task);
    if (v.name == NULL || v.ns == NULL) {
        return err_set(err, E_INVALID, "render sticky comment: task without name or namespace");
    }
    buf_init(&r.b, SCM_STICKY_MAX - 1);
    r.rc = E_OK;
    put_body(&r, task, &v, dashboard_url, now_ms);
    if (r.rc != E_OK) {
        buf_cleanup(&r.b);
        return err_set(err, r.rc, "sticky comment of %s/%s over %d bytes", v.ns, v.name,
                       SCM_STICKY_MAX);
    }
    *out = buf_take(&r.b);
    return E_OK;
}
