/* SPDX-License-Identifier: Apache-2.0 */
/* What the tools of `diverge mcp` share: tool results (text plus structuredContent, and
 * isError failures), the flat task summary, and the argument checks. Messages never echo
 * argument values. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/mcp.h"
#include "common/money.h"

#define GUIDANCE_ANNOTATION "divergedev.com/guidance"

/* --- results --------------------------------------------------------------------------- */

/* Makes S valid UTF-8 in place: a byte that starts no complete, shortest-form sequence
 * becomes '?' (a message cut at its size limit may end inside a character). */
static void utf8_clean(char *s)
{
    unsigned char *p = (unsigned char *)s;

    while (*p != 0) {
        size_t n = *p < 0x80             ? 1
                   : (*p & 0xe0) == 0xc0 ? 2
                   : (*p & 0xf0) == 0xe0 ? 3
                   : (*p & 0xf8) == 0xf0 ? 4
                                         : 0;
        bool ok = n > 0;

        for (size_t i = 1; ok && i < n; i++) {
            ok = (p[i] & 0xc0) == 0x80;
        }
        if (ok && n > 1) {
            /* jansson's own check: no overlong forms, surrogates or values past U+10FFFF. */
            json_t *probe = json_stringn((const char *)p, n);
            ok = probe != NULL;
            json_decref(probe);
        }
        if (!ok) {
            *p++ = '?';
            continue;
        }
        p += n;
    }
}

/* A tool result; takes TEXT (malloc'd) and STRUCTURED (may be NULL). */
json_t *cli_mcp_result(bool is_error, char *text, json_t *structured)
{
    json_t *r;

    utf8_clean(text);
    r = json_pack("{s:[{s:s, s:s}], s:b}", "content", "type", "text", "text", text, "isError",
                  is_error);

    ASSERT(r != NULL);
    if (structured != NULL) {
        json_object_set_new(r, "structuredContent", structured);
    }
    free(text);
    return r;
}

static const char *reason_of(int rc)
{
    switch (rc) {
    case E_AGAIN:
        return "Unreachable";
    case E_NOTFOUND:
        return "NotFound";
    case E_CONFLICT:
        return "Conflict";
    case E_DENIED:
        return "Unauthorized";
    case E_INVALID:
        return "Invalid";
    default:
        return "Failed";
    }
}

/* The isError result for RC with the message in ERR. */
json_t *cli_mcp_failure(int rc, const struct err *err)
{
    char *msg = xstrdup(err->msg[0] != '\0' ? err->msg : "the operation failed");
    json_t *structured;

    utf8_clean(msg);
    structured = json_pack("{s:s, s:s}", "error", msg, "reason", reason_of(rc));
    ASSERT(structured != NULL);
    return cli_mcp_result(true, msg, structured);
}

/* "argument KEY PROBLEM" as an isError result. */
json_t *cli_mcp_bad_arg(const char *key, const char *problem)
{
    struct err err = {0};

    err_set(&err, E_INVALID, "argument %s %s", key, problem);
    return cli_mcp_failure(E_INVALID, &err);
}

/* The fields of TASK an agent cares about, flat. New. */
json_t *cli_mcp_summary(const json_t *task)
{
    static const char *const fields[][2] = {
        {"name", "metadata.name"},
        {"namespace", "metadata.namespace"},
        {"phase", "status.phase"},
        {"reason", "status.reason"},
        {"message", "status.message"},
        {"objective", "spec.objective"},
        {"repository", "spec.repository.url"},
        {"workingBranch", "spec.repository.workingBranch"},
        {"iteration", "status.iteration"},
        {"maxIterations", "spec.maxIterations"},
        {"tokensConsumed", "status.tokensConsumed"},
        {"budgetTokens", "spec.budgetTokens"},
        {"costUSD", "status.costUSD"},
        {"budgetUSD", "spec.budgetUSD"},
        {"forecastUSD", "status.forecastUSD"},
        {"forecastPerIterationUSD", "status.forecastPerIterationUSD"},
        {"forecastIterationsLeft", "status.forecastIterationsLeft"},
        {"forecastBudgetHolds", "status.forecastBudgetHolds"},
        {"forecastRunsOutIteration", "status.forecastRunsOutIteration"},
        {"effectiveMaxIterations", "status.effectiveMaxIterations"},
        {"effectiveBudgetTokens", "status.effectiveBudgetTokens"},
        {"effectiveBudgetUSD", "status.effectiveBudgetUSD"},
        {"suspended", "spec.suspended"},
        {"previewUrl", "status.previewUrl"},
        {"resourceVersion", "metadata.resourceVersion"},
    };
    const json_t *ann = cli_json_at(task, "metadata.annotations");
    const json_t *guidance = json_object_get(ann, GUIDANCE_ANNOTATION);
    json_t *s = json_object();

    for (size_t i = 0; i < ARRAY_LEN(fields); i++) {
        const json_t *v = cli_json_at(task, fields[i][1]);
        if (v != NULL && !json_is_null(v)) {
            json_object_set_new(s, fields[i][0], json_deep_copy(v));
        }
    }
    if (json_is_string(guidance)) {
        json_object_set_new(s, "guidance", json_deep_copy(guidance));
    }
    return s;
}

/* MEMBER of S as text: strings as they are, integers in decimal, else "-". */
const char *cli_mcp_member_text(char tmp[32], const json_t *s, const char *member)
{
    /* Summary members are plain names, so the dotted-path lookup finds them as is. */
    return cli_text_or_dash(tmp, s, member);
}

/* ", forecast 1.80 USD more to finish" when S has a forecast (status.forecastUSD), else "".
 * New string. */
static char *forecast_clause(const json_t *s)
{
    const char *forecast = json_string_value(json_object_get(s, "forecastUSD"));

    return forecast != NULL ? xasprintf(", forecast %s USD more to finish", forecast) : xstrdup("");
}

const char *cli_mcp_limit(const json_t *s, const char *effective, const char *spec)
{
    return json_object_get(s, effective) != NULL ? effective : spec;
}

/* One human line for the task summary S: what `diverge task status` shows first. */
static char *summary_line(const json_t *s)
{
    char a[7][32];
    const char *guidance = json_string_value(json_object_get(s, "guidance"));
    const char *preview = json_string_value(json_object_get(s, "previewUrl"));
    const char *reason = json_string_value(json_object_get(s, "reason"));
    char *forecast = forecast_clause(s), *line;

    guidance = guidance != NULL && *guidance != '\0' ? guidance : NULL;
    preview = preview != NULL && *preview != '\0' ? preview : NULL;

    line = xasprintf(
        "task %s/%s: phase %s%s%s%s, iteration %s/%s, tokens %s/%s, cost %s/%s "
        "USD%s%s%s%s%s",
        cli_mcp_member_text(a[0], s, "namespace"), cli_mcp_member_text(a[1], s, "name"),
        cli_mcp_member_text(a[2], s, "phase"), reason != NULL && *reason ? " (" : "",
        reason != NULL ? reason : "", reason != NULL && *reason ? ")" : "",
        cli_mcp_member_text(a[3], s, "iteration"), cli_mcp_member_text(a[4], s, MCP_LIMIT_ITER(s)),
        cli_mcp_member_text(a[5], s, "tokensConsumed"),
        cli_mcp_member_text(a[6], s, MCP_LIMIT_TOKENS(s)), cli_mcp_member_text(a[0], s, "costUSD"),
        cli_mcp_member_text(a[1], s, MCP_LIMIT_USD(s)), forecast,
        guidance != NULL ? ", guidance: " : "", guidance != NULL ? guidance : "",
        preview != NULL ? ", preview: " : "", preview != NULL ? preview : "");
    free(forecast);
    return line;
}

/* The success result for one task: VERB (e.g. "created") and the summary. Takes
 * nothing; TASK is borrowed. */
json_t *cli_mcp_task_result(const json_t *task, const char *verb)
{
    json_t *s = cli_mcp_summary(task);
    char *line = summary_line(s), *text;

    text = verb != NULL ? xasprintf("%s\n%s", verb, line) : xstrdup(line);
    free(line);
    return cli_mcp_result(false, text, s);
}

/* --- arguments ------------------------------------------------------------------------- */

/* Checks that every member of ARGS is in the NULL-terminated list KNOWN. */
json_t *cli_mcp_check_known(const json_t *args, const char *const *known, const char *allowed)
{
    const char *key;
    const json_t *v;

    json_object_foreach((json_t *)(uintptr_t)args, key, v)
    {
        bool found = false;
        for (size_t i = 0; known[i] != NULL; i++) {
            found = found || strcmp(known[i], key) == 0;
        }
        if (!found) {
            struct err err = {0};
            err_set(&err, E_INVALID, "unknown argument (this tool takes %s)", allowed);
            return cli_mcp_failure(E_INVALID, &err);
        }
    }
    return NULL;
}

/* The optional string argument KEY into *out (borrowed; NULL when absent). */
json_t *cli_mcp_opt_string(const char **out, const json_t *args, const char *key)
{
    const json_t *v = json_object_get(args, key);

    *out = NULL;
    if (v == NULL || json_is_null(v)) {
        return NULL;
    }
    if (!json_is_string(v)) {
        return cli_mcp_bad_arg(key, "must be a string");
    }
    *out = json_string_value(v);
    return NULL;
}

json_t *cli_mcp_req_string(const char **out, const json_t *args, const char *key)
{
    json_t *bad = cli_mcp_opt_string(out, args, key);

    if (bad == NULL && (*out == NULL || **out == '\0')) {
        return cli_mcp_bad_arg(key, "is required and must not be empty");
    }
    return bad;
}

/* The context for one call: CTX with the namespace argument, if any, in *OUT. */
json_t *cli_mcp_with_namespace(struct cli_ctx *out, const struct cli_ctx *ctx, const json_t *args)
{
    const char *ns;
    json_t *bad = cli_mcp_opt_string(&ns, args, "namespace");

    *out = *ctx;
    if (bad == NULL && ns != NULL) {
        if (*ns == '\0') {
            return cli_mcp_bad_arg("namespace", "must not be empty");
        }
        out->ns = ns;
    }
    return bad;
}

/* An optional count: a non-negative JSON integer, or a string such as "200000", "2M"
 * (and "+2M" with ALLOW_PLUS). *out is -1 when absent. */
json_t *cli_mcp_opt_count(int64_t *out, const json_t *args, const char *key, bool allow_plus)
{
    const json_t *v = json_object_get(args, key);

    *out = -1;
    if (v == NULL || json_is_null(v)) {
        return NULL;
    }
    if (json_is_integer(v) && json_integer_value(v) >= 0) {
        *out = json_integer_value(v);
        return NULL;
    }
    if (json_is_string(v) &&
        cli_parse_tokens(out, json_string_value(v), allow_plus, NULL) == E_OK) {
        return NULL;
    }
    return cli_mcp_bad_arg(key, "must be a non-negative integer");
}

/* An optional USD amount: a decimal string ("5.00"; "+15.00" only with ALLOW_PLUS) or a
 * non-negative JSON integer. Binary floating point is refused: it cannot say 0.10
 * exactly. *out is -1 when absent. */
json_t *cli_mcp_opt_money(int64_t *out, const json_t *args, const char *key, bool allow_plus)
{
    const json_t *v = json_object_get(args, key);
    bool plus = false;

    *out = -1;
    if (v == NULL || json_is_null(v)) {
        return NULL;
    }
    if (json_is_integer(v) && json_integer_value(v) >= 0 &&
        json_integer_value(v) <= INT64_MAX / MONEY_MICROS_PER_USD) {
        *out = json_integer_value(v) * MONEY_MICROS_PER_USD;
        return NULL;
    }
    if (json_is_string(v) && money_parse(out, &plus, json_string_value(v), NULL) == E_OK &&
        (allow_plus || !plus)) {
        return NULL;
    }
    *out = -1;
    return cli_mcp_bad_arg(key, allow_plus ? "must be a decimal string such as \"+15.00\""
                                           : "must be a decimal string such as \"5.00\"");
}

#define REPO_PROBLEM                                                                               \
    "must be a URL string or an object of the strings url, baseBranch and workingBranch"

/* spec.repository from the argument: a URL string, or {url, baseBranch, workingBranch}. */
json_t *cli_mcp_opt_repository(json_t **out, const json_t *args)
{
    static const char *const keys[] = {"url", "baseBranch", "workingBranch", NULL};
    const json_t *v = json_object_get(args, "repository");
    const char *key;
    const json_t *member;

    *out = NULL;
    if (v == NULL || json_is_null(v)) {
        return NULL;
    }
    if (json_is_string(v) && *json_string_value(v) != '\0') {
        *out = json_pack("{s:O}", "url", v);
        return NULL;
    }
    if (json_is_object(v) && json_object_size(v) > 0) {
        json_object_foreach((json_t *)(uintptr_t)v, key, member)
        {
            bool known = false;
            for (size_t i = 0; keys[i] != NULL; i++) {
                known = known || strcmp(keys[i], key) == 0;
            }
            if (!known || !json_is_string(member)) {
                return cli_mcp_bad_arg("repository", REPO_PROBLEM);
            }
        }
        *out = json_deep_copy(v);
        return NULL;
    }
    return cli_mcp_bad_arg("repository", REPO_PROBLEM);
}
