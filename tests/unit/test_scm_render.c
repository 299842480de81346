/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of scm/render: the sticky status comment (SPEC §6): badges, links, budgets,
 * pause and failure notes, escaping of user text, the size bound and the body hash. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/money.h"
#include "scm/render.h"
#include "store/store.h"
#include "tests/t_check.h"

#define T0 INT64_C(1795946400000) /* 2026-11-29T10:00:00Z */
#define ZWSP "\xE2\x80\x8B"       /* U+200B: breaks an autolink */

static const char *const SPEC_EXAMPLE =
    "{\"apiVersion\":\"divergedev.com/v1alpha1\",\"kind\":\"AgentTask\","
    "\"metadata\":{\"name\":\"fix-checkout-latency\",\"namespace\":\"default\","
    "\"annotations\":{\"divergedev.com/preview-enabled\":\"true\"}},"
    "\"spec\":{\"objective\":\"Diagnose and fix N+1 query in /api/v1/checkout\",\"draftPR\":true,"
    "\"repository\":{\"url\":\"https://github.com/myorg/checkout-service\","
    "\"baseBranch\":\"main\",\"workingBranch\":\"fix/checkout-n-plus-1\"},"
    "\"maxIterations\":8,\"budgetUSD\":\"5.00\",\"budgetTokens\":200000,"
    "\"capabilities\":[\"claude-3-7-sonnet\",\"gemini-2.5-pro\"],\"allowedTools\":[\"git\",\"go\"],"
    "\"sandbox\":{\"provider\":\"agent-sandbox\",\"timeoutSeconds\":1800},\"suspended\":false}}";

/* The spec example, normalized, with status Active, iteration 3, 4500 tokens, $0.0675. */
static json_t *example_task(void)
{
    json_t *in = json_loads(SPEC_EXAMPLE, 0, NULL), *out = NULL;
    json_t *status;
    struct err err = {0};

    ASSERT(in != NULL);
    ASSERT(task_normalize_new(&out, in, "default", &err) == E_OK);
    json_decref(in);
    task_set_phase(out, TASK_ACTIVE, NULL, NULL);
    status = json_object_get(out, "status");
    json_object_set_new(status, "iteration", json_integer(3));
    json_object_set_new(status, "tokensConsumed", json_integer(4500));
    json_object_set_new(status, "costUSD", json_string("0.0675"));
    return out;
}

static void set_at(json_t *task, const char *part, const char *key, json_t *value)
{
    json_object_set_new(json_object_get(task, part), key, value);
}

static char *render_at(const json_t *task, int64_t now_ms)
{
    char *body = NULL;
    struct err err = {0};

    CHECK_OK(scm_render_sticky(&body, task, now_ms, &err));
    ASSERT(body != NULL);
    return body;
}

static char *render(const json_t *task)
{
    return render_at(task, T0);
}

static bool has(const char *hay, const char *needle)
{
    return strstr(hay, needle) != NULL;
}

#define CHECK_HAS(hay_, needle_)                                                                   \
    do {                                                                                           \
        if (!has((hay_), (needle_))) {                                                             \
            t_fail(__FILE__, __LINE__, "missing \"%s\" in:\n%s", (needle_), (hay_));               \
        }                                                                                          \
    } while (0)

#define CHECK_LACKS(hay_, needle_)                                                                 \
    do {                                                                                           \
        if (has((hay_), (needle_))) {                                                              \
            t_fail(__FILE__, __LINE__, "unexpected \"%s\" in:\n%s", (needle_), (hay_));            \
        }                                                                                          \
    } while (0)

/* Decodes the multi-byte sequence at P: returns its continuation byte count (0: bad lead
 * byte) and sets *CP, or returns -1 when a continuation byte is wrong. */
static int utf8_decode(const unsigned char *p, unsigned *cp)
{
    unsigned n;

    if ((*p & 0xE0) == 0xC0) {
        n = 1, *cp = *p & 0x1Fu;
    } else if ((*p & 0xF0) == 0xE0) {
        n = 2, *cp = *p & 0x0Fu;
    } else if ((*p & 0xF8) == 0xF0) {
        n = 3, *cp = *p & 0x07u;
    } else {
        return 0;
    }
    for (unsigned i = 1; i <= n; i++) {
        if ((p[i] & 0xC0) != 0x80) {
            return -1;
        }
        *cp = *cp << 6 | (p[i] & 0x3Fu);
    }
    return (int)n;
}

/* Strict UTF-8 (RFC 3629), written independently of the renderer's decoder. */
static bool utf8_valid(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;

    while (*p != '\0') {
        unsigned cp = 0;
        int n;
        if (*p < 0x80) {
            p++;
            continue;
        }
        n = utf8_decode(p, &cp);
        if (n <= 0) {
            return false;
        }
        if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
            cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
            return false;
        }
        p += n + 1;
    }
    return true;
}

/* A new copy of the line of BODY starting with PREFIX (without the newline), or "". */
static char *line_of(const char *body, const char *prefix)
{
    const char *p = strstr(body, prefix);
    return p == NULL ? xstrdup("") : xstrndup(p, strcspn(p, "\n"));
}

TEST(marker_first_line_then_tag)
{
    json_t *t = example_task();
    char *body = render(t);

    CHECK(strncmp(body, SCM_STICKY_MARKER "\n", strlen(SCM_STICKY_MARKER) + 1) == 0);
    CHECK(strncmp(body + strlen(SCM_STICKY_MARKER) + 1,
                  "<!-- diverge-task: default/fix-checkout-latency -->\n", 52) == 0);
    CHECK_HAS(body, "`fix-checkout-latency`");
    CHECK_HAS(body, "**Objective:** Diagnose and fix N+1 query in /api/v1/checkout\n");
    CHECK_HAS(body, "- **Branch:** `fix/checkout-n-plus-1`\n");
    CHECK_HAS(body, "(https://github.com/myorg/checkout-service)");
    CHECK_HAS(body, "\n<sub>Last updated 2026-11-29T10:00:00Z</sub>\n");
    CHECK(utf8_valid(body));
    free(body);
    json_decref(t);
}

TEST(badge_of_every_phase)
{
    static const char *const want[TASK_PHASE_COUNT] = {
        "⏳ Queued",      "🚀 Running",   "🚀 Running", "⏸️ Paused",
        "⏸️ Paused", "✅ Completed", "❌ Failed",
    };
    json_t *t = example_task();

    for (int p = 0; p < TASK_PHASE_COUNT; p++) {
        char heading[128];
        task_set_phase(t, (enum task_phase)p, NULL, NULL);
        char *body = render(t);
        snprintf(heading, sizeof(heading), "\n### %s · `fix-checkout-latency`\n", want[p]);
        CHECK_HAS(body, heading);
        free(body);
    }
    json_decref(t);
}

TEST(task_tag)
{
    char tag[SCM_RENDER_TAG_MAX], small[20];
    char longname[100];

    scm_render_task_tag(tag, sizeof(tag), "default", "fix-pr-7");
    CHECK_EQ_STR(tag, "<!-- diverge-task: default/fix-pr-7 -->");
    scm_render_task_tag(tag, sizeof(tag), "a b", "x-->y<z>");
    CHECK_EQ_STR(tag, "<!-- diverge-task: a_b/x--_y_z_ -->");
    memset(longname, 'a', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    scm_render_task_tag(tag, sizeof(tag), longname, longname);
    CHECK(strlen(tag) < SCM_RENDER_TAG_MAX);
    CHECK(strlen(tag) > 4 && strcmp(tag + strlen(tag) - 4, " -->") == 0);
    scm_render_task_tag(small, sizeof(small), "default", "fix-pr-7");
    CHECK_EQ_STR(small, ""); /* never a cut, unclosed comment */
}

TEST(preview_links_only_with_http_preview_url)
{
    json_t *t = example_task();
    char *body = render(t); /* previewUrl "" after normalization */

    CHECK_LACKS(body, "Magic Link");
    CHECK_LACKS(body, "Exit Preview");
    free(body);
    set_at(t, "status", "previewUrl", json_string("javascript:alert(1)//?_diverge_env=x"));
    body = render(t);
    CHECK_LACKS(body, "Magic Link");
    CHECK_LACKS(body, "javascript");
    free(body);
    json_object_del(json_object_get(t, "status"), "previewUrl");
    body = render(t);
    CHECK_LACKS(body, "Magic Link");
    free(body);
    set_at(t, "status", "previewUrl",
           json_string("https://preview.example.com/?_diverge_env=agent-preview-fix"));
    body = render(t);
    CHECK_HAS(body, "[🔗 Magic Link](https://preview.example.com/?_diverge_env=agent-preview-fix)");
    CHECK_HAS(body, "[🚪 Exit Preview](https://preview.example.com/?_diverge_env=clear)");
    free(body);
    /* Bytes that would end the Markdown link are percent-encoded. */
    set_at(t, "status", "previewUrl", json_string("https://p.example.com/a b)<x>?q=1"));
    body = render(t);
    CHECK_HAS(body, "(https://p.example.com/a%20b%29%3Cx%3E?q=1)");
    CHECK_HAS(body, "(https://p.example.com/a%20b%29%3Cx%3E?q=1&_diverge_env=clear)");
    free(body);
    json_decref(t);
}

TEST(exit_url)
{
    static const struct {
        const char *in, *want;
    } cases[] = {
        {"https://p.example.com", "https://p.example.com?_diverge_env=clear"},
        {"https://p.example.com/", "https://p.example.com/?_diverge_env=clear"},
        {"https://p.example.com/?", "https://p.example.com/?_diverge_env=clear"},
        {"https://p.example.com/?_diverge_env=env-1", "https://p.example.com/?_diverge_env=clear"},
        {"https://p.example.com/?a=1", "https://p.example.com/?a=1&_diverge_env=clear"},
        {"https://p.example.com/?a=1&", "https://p.example.com/?a=1&_diverge_env=clear"},
        {"https://p.example.com/?a=1&_diverge_env=e&b=2",
         "https://p.example.com/?a=1&_diverge_env=clear&b=2"},
        {"https://p.example.com/?a=1&_diverge_env&b=2",
         "https://p.example.com/?a=1&_diverge_env=clear&b=2"},
        {"https://p.example.com/?_diverge_env=e&x=1&_diverge_env=f",
         "https://p.example.com/?_diverge_env=clear&x=1"},
        {"https://p.example.com/?x_diverge_env=1&_diverge_envy=2",
         "https://p.example.com/?x_diverge_env=1&_diverge_envy=2&_diverge_env=clear"},
        {"https://p.example.com/p?_diverge_env=e#top",
         "https://p.example.com/p?_diverge_env=clear#top"},
        {"https://p.example.com/p#a?b", "https://p.example.com/p?_diverge_env=clear#a?b"},
    };

    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        char *got = scm_render_exit_url(cases[i].in);
        CHECK_EQ_STR(got, cases[i].want);
        free(got);
    }
}

TEST(usage_table_exact)
{
    json_t *t = example_task();
    char *body = render(t);

    CHECK_HAS(body, "| Tokens | 4,500 | 200,000 |\n");
    CHECK_HAS(body, "| USD | $0.0675 | $5.00 |\n");
    CHECK_HAS(body, "| Iterations | 3 | 8 |\n");
    free(body);
    json_object_del(json_object_get(t, "spec"), "budgetUSD");
    json_object_del(json_object_get(t, "spec"), "budgetTokens");
    json_object_del(json_object_get(t, "spec"), "maxIterations");
    /* Not started yet: the server's defaults are not decided (status.effective… unset). */
    json_object_del(json_object_get(t, "status"), "effectiveBudgetUSD");
    json_object_del(json_object_get(t, "status"), "effectiveBudgetTokens");
    json_object_del(json_object_get(t, "status"), "effectiveMaxIterations");
    set_at(t, "status", "tokensConsumed", json_integer(1234567));
    set_at(t, "status", "costUSD", json_string("12.345678"));
    body = render(t);
    CHECK_HAS(body, "| Tokens | 1,234,567 | default |\n");
    CHECK_HAS(body, "| USD | $12.345678 | default |\n");
    CHECK_HAS(body, "| Iterations | 3 | — |\n");
    free(body);
    /* Started: the limits the server enforces, its defaults included (SPEC §14). */
    set_at(t, "status", "effectiveBudgetUSD", json_string("5.00"));
    set_at(t, "status", "effectiveBudgetTokens", json_integer(1000000));
    set_at(t, "status", "effectiveMaxIterations", json_integer(5));
    body = render(t);
    CHECK_HAS(body, "| Tokens | 1,234,567 | 1,000,000 |\n");
    CHECK_HAS(body, "| USD | $12.345678 | $5.00 |\n");
    CHECK_HAS(body, "| Iterations | 3 | 5 |\n");
    free(body);
    json_decref(t);
}

TEST(pause_reasons)
{
    json_t *t = example_task();
    char *body, *line;

    task_set_phase(t, TASK_PAUSED, "BudgetExceeded", "budget exceeded: add budget");
    body = render(t);
    line = line_of(body, "**Paused:**");
    CHECK_HAS(line, "budget exceeded");
    CHECK_HAS(line, "`/diverge budget +$5`");
    CHECK_HAS(line, "`/diverge resume`");
    free(line);
    free(body);
    task_set_phase(t, TASK_PAUSED, "MaxIterationsExceeded", "max iterations exceeded");
    body = render(t);
    CHECK_HAS(body, "**Paused:** maximum iterations reached");
    free(body);
    task_set_phase(t, TASK_PAUSING, "Suspended", "");
    body = render(t);
    CHECK_HAS(body, "**Paused:** paused by request. Continue with `/diverge resume`.");
    free(body);
    task_set_phase(t, TASK_PAUSED, "OddReason", "it <b>stopped</b>");
    body = render(t);
    CHECK_HAS(body, "**Paused:** OddReason: it &lt;b&gt;stopped&lt;/b&gt;.");
    free(body);
    task_set_phase(t, TASK_ACTIVE, NULL, NULL);
    body = render(t);
    CHECK_LACKS(body, "**Paused:**");
    CHECK_LACKS(body, "/diverge resume");
    free(body);
    json_decref(t);
}

/* Writes the meter's forecast for COST at ITERATION (maxIterations 8) into T's status. */
static void set_forecast(json_t *t, int64_t cost, int64_t iteration, bool has_budget,
                         int64_t budget)
{
    json_t *status = json_object_get(t, "status");
    struct task_forecast f;
    char money[MONEY_STR_MAX];

    money_format(money, cost);
    json_object_set_new(status, "costUSD", json_string(money));
    json_object_set_new(status, "iteration", json_integer(iteration));
    task_forecast_compute(&f, cost, iteration, 8, has_budget, budget);
    task_forecast_store(status, &f);
}

TEST(forecast_line_budget_holds)
{
    json_t *t = example_task();
    char *body;

    set_forecast(t, 1800000, 5, true, 5000000);
    body = render(t);
    CHECK_HAS(body, "\n\n≈ $1.80 more to finish at $0.45/iteration · 4 iterations left · "
                    "budget holds\n\n");
    CHECK_LACKS(body, "⚠️");
    free(body);
    /* No USD budget known to the meter: no budget clause. */
    set_forecast(t, 1800000, 5, false, 0);
    body = render(t);
    CHECK_HAS(body, "\n≈ $1.80 more to finish at $0.45/iteration · 4 iterations left\n");
    CHECK_LACKS(body, "budget holds");
    free(body);
    /* The last iteration: singular. */
    set_forecast(t, 700000, 8, true, 5000000);
    body = render(t);
    CHECK_HAS(body, "\n≈ $0.10 more to finish at $0.10/iteration · 1 iteration left · "
                    "budget holds\n");
    free(body);
    json_decref(t);
}

TEST(forecast_line_budget_runs_out)
{
    json_t *t = example_task();
    char *body;

    set_forecast(t, 2400000, 5, true, 3500000);
    body = render(t);
    CHECK_HAS(body, "\n\n≈ $2.40 more to finish at $0.60/iteration · 4 iterations left · "
                    "⚠️ at this rate the budget runs out in iteration 6 of 8\n\n");
    CHECK_LACKS(body, "budget holds");
    free(body);
    /* Exact decimals, as in the table: no rounding to cents. */
    set_forecast(t, 72000, 3, true, 100000);
    body = render(t);
    CHECK_HAS(body, "| USD | $0.072 | $5.00 |");
    CHECK_HAS(body,
              "\n≈ $0.216 more to finish at $0.036/iteration · 6 iterations left · ⚠️ at "
              "this rate the budget runs out in iteration 3 of 8\n");
    free(body);
    json_decref(t);
}

TEST(forecast_line_absent_before_two_iterations_and_when_finished)
{
    json_t *t = example_task();
    char *body;

    set_forecast(t, 450000, 2, true, 5000000);
    body = render(t);
    CHECK_LACKS(body, "≈");
    CHECK_LACKS(body, "more to finish");
    free(body);
    /* A finished task's status may still hold a forecast written by another writer: it is
     * not shown. */
    set_forecast(t, 1800000, 5, true, 5000000);
    json_object_set_new(json_object_get(t, "status"), "phase", json_string("Completed"));
    body = render(t);
    CHECK_LACKS(body, "more to finish");
    free(body);
    /* A hand-written status that does not add up is not shown either. */
    set_forecast(t, 1800000, 5, true, 5000000);
    json_object_set_new(json_object_get(t, "status"), "phase", json_string("Active"));
    json_object_set_new(json_object_get(t, "status"), "forecastUSD", json_string("<b>1</b>"));
    body = render(t);
    CHECK_LACKS(body, "more to finish");
    CHECK_LACKS(body, "<b>");
    free(body);
    json_decref(t);
}

TEST(failure_reason_and_message)
{
    json_t *t = example_task();
    char *body;

    task_set_phase(t, TASK_FAILED, "RunnerFailed", "exit status 2");
    body = render(t);
    CHECK_HAS(body, "**Failed:** the agent runner failed: exit status 2\n");
    free(body);
    task_set_phase(t, TASK_FAILED, "Timeout", "");
    body = render(t);
    CHECK_HAS(body, "**Failed:** timed out\n");
    free(body);
    task_set_phase(t, TASK_FAILED, "DiskLimit", "over 2048 MiB (--sandbox-disk)");
    body = render(t);
    CHECK_HAS(body, "**Failed:** disk limit: over 2048 MiB (--sandbox-disk)\n");
    free(body);
    json_decref(t);
}

TEST(escaping_user_text)
{
    json_t *t = example_task();
    char *body, *line;

    set_at(t, "spec", "objective",
           json_string("end --> <script>alert(1)</script> & @someone\n/diverge pause\r\n"
                       "[click](https://evil.example) **bold** `code` a|b"));
    json_object_set_new(json_object_get(json_object_get(t, "metadata"), "annotations"),
                        TASK_ANN_GUIDANCE, json_string("ask @octocat <!-- hi -->"));
    body = render(t);
    line = line_of(body, "**Objective:**");
    CHECK_EQ_STR(line,
                 "**Objective:** end --&gt; &lt;script&gt;alert(1)&lt;/script&gt; &amp; "
                 "@\xE2\x80\x8Dsomeone /diverge pause \\[click\\](https:" ZWSP "//evil.example) "
                 "\\*\\*bold\\*\\* \\`code\\` a\\|b");
    free(line);
    CHECK_HAS(body, "**Guidance:** ask @\xE2\x80\x8Doctocat &lt;!-- hi --&gt;\n");
    CHECK_LACKS(body, "<script");
    CHECK_LACKS(body, "@someone");
    CHECK_LACKS(body, "\n/diverge");
    /* Only our two comments, both closed on their own lines. */
    CHECK(strstr(strstr(strstr(body, "-->") + 3, "-->") + 3, "-->") == NULL);
    free(body);
    /* A branch with backticks stays one literal code span. */
    set_at(json_object_get(t, "spec"), "repository", "workingBranch", json_string("a`b``c"));
    body = render(t);
    CHECK_HAS(body, "- **Branch:** ``` a`b``c ```\n");
    free(body);
    json_decref(t);
}

TEST(guidance_shows_whether_it_reached_the_agent)
{
    json_t *t = example_task();
    char hash[TASK_GUIDANCE_HASH_LEN];
    char *body;

    json_object_set_new(json_object_get(json_object_get(t, "metadata"), "annotations"),
                        TASK_ANN_GUIDANCE, json_string("use the ORM"));
    body = render(t);
    CHECK_HAS(body, "**Guidance:** use the ORM\n<sub>not yet delivered to the agent</sub>\n");
    free(body);
    /* Delivered: this text's hash and when. */
    task_guidance_hash(hash, "use the ORM");
    set_at(t, "status", "guidanceHash", json_string(hash));
    set_at(t, "status", "guidanceDeliveredAt", json_string("2026-12-01T14:02:03Z"));
    body = render(t);
    CHECK_HAS(
        body,
        "**Guidance:** use the ORM\n<sub>delivered to the agent 2026-12-01T14:02:03Z</sub>\n");
    free(body);
    /* A new guidance text is not delivered yet, though an older one was. */
    json_object_set_new(json_object_get(json_object_get(t, "metadata"), "annotations"),
                        TASK_ANN_GUIDANCE, json_string("use raw SQL"));
    body = render(t);
    CHECK_HAS(body, "**Guidance:** use raw SQL\n<sub>not yet delivered to the agent</sub>\n");
    free(body);
    /* A delivery time that is not a time is not shown (the status is not trusted text). */
    task_guidance_hash(hash, "use raw SQL");
    set_at(t, "status", "guidanceHash", json_string(hash));
    set_at(t, "status", "guidanceDeliveredAt", json_string("<b>now</b> [x](y)"));
    body = render(t);
    CHECK_HAS(body, "<sub>not yet delivered to the agent</sub>");
    CHECK_LACKS(body, "<b>now");
    free(body);
    json_decref(t);
}

TEST(bare_urls_are_not_autolinked)
{
    json_t *t = example_task();
    char *body;

    set_at(t, "spec", "objective",
           json_string("see https://evil.example/x, HTTP://Evil.example and www.evil.example"));
    set_at(json_object_get(t, "spec"), "repository", "workingBranch",
           json_string("https://branch.example"));
    json_object_set_new(json_object_get(json_object_get(t, "metadata"), "annotations"),
                        TASK_ANN_GUIDANCE, json_string("read wWw.guide.example/a now"));
    set_at(t, "status", "previewUrl", json_string("https://preview.test/?_diverge_env=e1"));
    body = render(t);
    CHECK_HAS(body, "**Objective:** see https:" ZWSP "//evil.example/x, HTTP:" ZWSP
                    "//Evil.example and w" ZWSP "ww.evil.example\n");
    CHECK_HAS(body, "**Guidance:** read w" ZWSP "Ww.guide.example/a now\n");
    CHECK_LACKS(body, "://evil");
    CHECK_LACKS(body, "www.");
    CHECK_LACKS(body, "wWw.");
    /* A code span is never autolinked: the branch stays as it is. */
    CHECK_HAS(body, "- **Branch:** `https://branch.example`\n");
    /* Our own links still work: the destinations are untouched. */
    CHECK_HAS(body, "[🔗 Magic Link](https://preview.test/?_diverge_env=e1) · "
                    "[🚪 Exit Preview](https://preview.test/?_diverge_env=clear)\n");
    CHECK_HAS(body, "](https://github.com/myorg/checkout-service)\n");
    free(body);
    json_decref(t);
}

/* Renders an objective of 1 MB: PREFIX then CH repeated, and checks the cut. */
static void check_cut(const char *prefix, const char *ch)
{
    size_t n = 1u << 20, k = strlen(ch), pre = strlen(prefix), i;
    char *obj = xmalloc(n + 1), *body, *line;
    json_t *t = example_task();

    memcpy(obj, prefix, pre);
    for (i = pre; i + k <= n; i += k) {
        memcpy(obj + i, ch, k);
    }
    obj[i] = '\0';
    set_at(t, "spec", "objective", json_string(obj));
    body = render(t);
    CHECK(strlen(body) < SCM_STICKY_MAX);
    CHECK(utf8_valid(body));
    line = line_of(body, "**Objective:**");
    CHECK(strlen(line) > 3000);
    CHECK(strlen(line) > 3 && strcmp(line + strlen(line) - 3, "\xE2\x80\xA6") == 0);
    free(line);
    free(body);
    free(obj);
    json_decref(t);
}

TEST(truncates_huge_objective_at_char_boundary)
{
    static const char *const prefixes[] = {"", "a", "ab", "abc"};

    for (size_t i = 0; i < ARRAY_LEN(prefixes); i++) {
        check_cut(prefixes[i], "x");
        check_cut(prefixes[i], "\xE2\x82\xAC");     /* € */
        check_cut(prefixes[i], "\xF0\x9F\x98\x80"); /* 😀 */
        check_cut(prefixes[i], "<&");               /* escapes grow 4x */
    }
}

TEST(every_field_huge_stays_under_limit)
{
    size_t n = 1u << 20;
    char *big = xmalloc(n + 1);
    json_t *t = example_task(), *repo = json_object_get(json_object_get(t, "spec"), "repository");
    char *body, *url;

    memset(big, '`', n);
    big[n] = '\0';
    set_at(t, "spec", "objective", json_string(big));
    json_object_set_new(repo, "workingBranch", json_string(big));
    json_object_set_new(json_object_get(json_object_get(t, "metadata"), "annotations"),
                        TASK_ANN_GUIDANCE, json_string(big));
    task_set_phase(t, TASK_FAILED, big, big);
    memcpy(big, "https://x/", 10);
    memset(big + 10, '(', 2040); /* encodes to about 6 KB: too long to link */
    big[2050] = '\0';
    url = xstrdup(big);
    json_object_set_new(repo, "url", json_string(url));
    set_at(t, "status", "previewUrl", json_string(url));
    body = render(t);
    CHECK(strlen(body) < SCM_STICKY_MAX);
    CHECK(utf8_valid(body));
    CHECK_LACKS(body, "Magic Link");
    free(body);
    free(url);
    free(big);
    json_decref(t);
}

static char *render_linked(const json_t *t, const char *dashboard)
{
    char *body = NULL;
    struct err err = {0};

    ASSERT(scm_render_sticky_dashboard(&body, t, dashboard, 1795860000000, &err) == E_OK);
    return body;
}

TEST(dashboard_link_only_with_a_plain_http_public_url)
{
    json_t *t = example_task();
    char *with = render_linked(t, "https://diverge.example.com/"), *none = render_linked(t, NULL);
    char *bad = render_linked(t, "https://x.example/)[y](javascript:alert(1)");
    char *not_http = render_linked(t, "javascript:alert(1)");

    CHECK_HAS(with, "- **Task page:** [default/fix-checkout-latency]"
                    "(https://diverge.example.com/#/task/default/fix-checkout-latency)\n");
    CHECK_LACKS(none, "Task page");
    CHECK_LACKS(bad, "Task page");
    CHECK_LACKS(not_http, "Task page");
    CHECK(utf8_valid(with));
    free(with);
    free(none);
    free(bad);
    free(not_http);
    json_decref(t);
}

TEST(invalid_utf8_is_replaced)
{
    json_t *t = example_task();
    char *body;

    set_at(t, "spec", "objective", json_stringn_nocheck("ok \xC3( \xED\xA0\x80 end", 14));
    body = render(t);
    CHECK(utf8_valid(body));
    CHECK_HAS(body, "**Objective:** ok \xEF\xBF\xBD( \xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD end\n");
    free(body);
    json_decref(t);
}

TEST(hash_ignores_update_time)
{
    json_t *t = example_task();
    char *a = render_at(t, T0), *b = render_at(t, T0 + 3600000), *c;
    char ha[17], hb[17], hc[17];

    CHECK(strcmp(a, b) != 0);
    scm_render_hash(ha, a);
    scm_render_hash(hb, b);
    CHECK_EQ_STR(ha, hb);
    CHECK_EQ_INT(strlen(ha), 16);
    set_at(t, "status", "costUSD", json_string("0.0676"));
    c = render_at(t, T0);
    scm_render_hash(hc, c);
    CHECK(strcmp(ha, hc) != 0);
    scm_render_hash(ha, "");
    CHECK_EQ_STR(ha, "cbf29ce484222325"); /* FNV-1a 64 offset basis */
    scm_render_hash(ha, "a");
    CHECK_EQ_STR(ha, "af63dc4c8601ec8c"); /* published FNV-1a 64 vector */
    free(a);
    free(b);
    free(c);
    json_decref(t);
}

TEST(task_without_name_is_invalid)
{
    json_t *t = json_pack("{s:{}}", "metadata");
    char *body = NULL;
    struct err err = {0};

    CHECK_EQ_INT(scm_render_sticky(&body, t, T0, &err), E_INVALID);
    CHECK(body == NULL);
    json_decref(t);
}

T_MAIN

/* From run 2 on the header names the run; a queued task shows its position (SPEC §14). */
TEST(run_number_and_queue_position)
{
    json_t *t = example_task();
    char *body;

    body = render(t);
    CHECK_LACKS(body, "· run ");
    CHECK_LACKS(body, "position");
    free(body);
    set_at(t, "status", "run", json_integer(3));
    body = render(t);
    CHECK_HAS(body, "### 🚀 Running · `fix-checkout-latency` · run 3\n");
    free(body);
    set_at(t, "status", "phase", json_string("Pending"));
    set_at(t, "status", "reason", json_string("Queued"));
    set_at(t, "status", "queuePosition", json_integer(2));
    set_at(t, "status", "run", json_integer(1));
    body = render(t);
    CHECK_HAS(body, "### ⏳ Queued — position 2 · `fix-checkout-latency`\n");
    free(body);
    /* A resumed task waiting for a slot. */
    set_at(t, "status", "phase", json_string("Paused"));
    body = render(t);
    CHECK_HAS(body, "### ⏸️ Paused · ⏳ Queued — position 2 · `fix-checkout-latency`\n");
    CHECK_HAS(body, "it continues once a sandbox slot is free");
    free(body);
    json_decref(t);
}
