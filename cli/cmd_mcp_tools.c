/* SPDX-License-Identifier: Apache-2.0 */
/* The tools of `diverge mcp` (SPEC §10): their JSON Schemas, argument checks, and the
 * task API calls behind them, made with cli_api_call() exactly as the `diverge task`
 * verbs make them. Every failure (bad arguments, the server said no, the server is
 * unreachable) is a tool result with isError: true, never a protocol error. Money stays
 * in decimal strings and micro-dollars. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/mcp.h"
#include "common/httpc.h"
#include "common/money.h"

#define GUIDANCE_ANNOTATION "divergedev.com/guidance"
#define MERGE_PATCH "application/merge-patch+json"
#define RESUME_ATTEMPTS 5 /* GET+PATCH rounds while another writer keeps winning (409) */

/* Pieces of the input schemas, shared by several tools. */
#define S_NS                                                                                       \
    "\"namespace\":{\"type\":\"string\",\"description\":\"namespace of the task (default: "        \
    "\\\"default\\\")\"}"
#define S_NAME                                                                                     \
    "\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":63,"                              \
    "\"pattern\":\"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$\",\"description\":\"task name (a DNS "          \
    "label)\"}"
#define S_OBJ(props_, required_)                                                                   \
    "{\"type\":\"object\",\"properties\":{" props_ "},\"required\":[" required_ "],"               \
    "\"additionalProperties\":false}"

struct tool_def {
    const char *name;
    const char *title;
    const char *description;
    const char *schema; /* inputSchema as JSON text */
    bool read_only;     /* annotations.readOnlyHint */
    json_t *(*run)(const struct cli_ctx *ctx, const json_t *args);
};

/* --- tools ----------------------------------------------------------------------------- */

static json_t *run_create(const struct cli_ctx *base, const json_t *args)
{
    static const char *const known[] = {"namespace",    "name",          "objective",  "budgetUSD",
                                        "budgetTokens", "maxIterations", "repository", NULL};
    const char *name = NULL, *objective = NULL;
    int64_t usd = -1, tokens = -1, iters = -1;
    json_t *bad, *repo = NULL, *task = NULL, *created = NULL, *r;
    struct cli_ctx ctx;
    struct err err = {0};
    char money[MONEY_STR_MAX], *path;
    int rc;

    bad = cli_mcp_check_known(args, known,
                              "namespace, name, objective, budgetUSD, budgetTokens, "
                              "maxIterations, repository");
    bad = bad != NULL ? bad : cli_mcp_with_namespace(&ctx, base, args);
    bad = bad != NULL ? bad : cli_mcp_req_string(&name, args, "name");
    bad = bad != NULL ? bad : cli_mcp_req_string(&objective, args, "objective");
    bad = bad != NULL ? bad : cli_mcp_opt_money(&usd, args, "budgetUSD", false);
    bad = bad != NULL ? bad : cli_mcp_opt_count(&tokens, args, "budgetTokens", false);
    bad = bad != NULL ? bad : cli_mcp_opt_count(&iters, args, "maxIterations", false);
    bad = bad != NULL ? bad : cli_mcp_opt_repository(&repo, args);
    if (bad != NULL) {
        json_decref(repo);
        return bad;
    }
    task = json_pack("{s:s, s:s, s:{s:s, s:s}, s:{s:s}}", "apiVersion", "divergedev.com/v1alpha1",
                     "kind", "AgentTask", "metadata", "name", name, "namespace", ctx.ns, "spec",
                     "objective", objective);
    ASSERT(task != NULL);
    if (usd >= 0) {
        money_format(money, usd);
        json_object_set_new(json_object_get(task, "spec"), "budgetUSD", json_string(money));
    }
    if (tokens >= 0) {
        json_object_set_new(json_object_get(task, "spec"), "budgetTokens", json_integer(tokens));
    }
    if (iters >= 0) {
        json_object_set_new(json_object_get(task, "spec"), "maxIterations", json_integer(iters));
    }
    if (repo != NULL) {
        json_object_set_new(json_object_get(task, "spec"), "repository", repo);
    }
    path = cli_task_path(&ctx, NULL, false);
    rc = cli_api_call(&created, NULL, &ctx, "POST", path, "application/json", task, &err);
    r = rc == E_OK ? cli_mcp_task_result(created, "created") : cli_mcp_failure(rc, &err);
    free(path);
    json_decref(task);
    json_decref(created);
    return r;
}

static json_t *run_list(const struct cli_ctx *base, const json_t *args)
{
    static const char *const known[] = {"namespace", "allNamespaces", NULL};
    static const char *const head[] = {"NAMESPACE", "NAME",   "PHASE", "ITERATION",
                                       "COST",      "BUDGET", "TOKENS"};
    const json_t *all = json_object_get(args, "allNamespaces"), *item;
    json_t *bad, *list = NULL, *tasks, *r;
    struct cli_ctx ctx;
    struct err err = {0};
    struct cli_table t;
    struct buf b;
    char *path;
    size_t i;
    int rc;

    bad = cli_mcp_check_known(args, known, "namespace, allNamespaces");
    bad = bad != NULL ? bad : cli_mcp_with_namespace(&ctx, base, args);
    if (bad == NULL && all != NULL && !json_is_boolean(all)) {
        bad = cli_mcp_bad_arg("allNamespaces", "must be a boolean");
    }
    if (bad != NULL) {
        return bad;
    }
    path = cli_task_path(&ctx, NULL, json_is_true(all));
    rc = cli_api_call(&list, NULL, &ctx, "GET", path, NULL, NULL, &err);
    free(path);
    if (rc != E_OK) {
        return cli_mcp_failure(rc, &err);
    }
    tasks = json_array();
    cli_table_init(&t, 7);
    cli_table_add(&t, head);
    json_array_foreach(json_object_get(list, "items"), i, item)
    {
        json_t *s = cli_mcp_summary(item);
        char a[6][32], iter[70], cost[70], tok[70];
        const char *row[7];

        snprintf(iter, sizeof(iter), "%s/%s", cli_mcp_member_text(a[0], s, "iteration"),
                 cli_mcp_member_text(a[1], s, MCP_LIMIT_ITER(s)));
        snprintf(cost, sizeof(cost), "%s", cli_mcp_member_text(a[2], s, "costUSD"));
        snprintf(tok, sizeof(tok), "%s/%s", cli_mcp_member_text(a[3], s, "tokensConsumed"),
                 cli_mcp_member_text(a[4], s, MCP_LIMIT_TOKENS(s)));
        row[0] = cli_mcp_member_text(a[5], s, "namespace");
        row[1] = json_string_value(json_object_get(s, "name"));
        row[2] = json_string_value(json_object_get(s, "phase"));
        row[3] = iter;
        row[4] = cost;
        row[5] = cli_mcp_member_text(a[0], s, MCP_LIMIT_USD(s));
        row[6] = tok;
        cli_table_add(&t, row);
        json_array_append_new(tasks, s);
    }
    buf_init(&b, 0);
    if (json_array_size(tasks) == 0) {
        buf_printf(&b, "no tasks found%s%s", json_is_true(all) ? "" : " in namespace ",
                   json_is_true(all) ? "" : ctx.ns);
    } else {
        cli_table_render(&b, &t);
    }
    cli_table_cleanup(&t);
    r = cli_mcp_result(
        false, buf_take(&b),
        json_pack("{s:o, s:I}", "tasks", tasks, "count", (json_int_t)json_array_size(tasks)));
    if (!json_is_true(all)) {
        json_object_set_new(json_object_get(r, "structuredContent"), "namespace",
                            json_string(ctx.ns));
    }
    buf_cleanup(&b);
    json_decref(list);
    return r;
}

/* Checks ARGS for the tools that take just a name (and KNOWN more), fills CTX and
 * *name. NULL when fine, else the isError result. */
static json_t *name_args(struct cli_ctx *ctx, const char **name, const struct cli_ctx *base,
                         const json_t *args, const char *const *known, const char *allowed)
{
    json_t *bad = cli_mcp_check_known(args, known, allowed);

    bad = bad != NULL ? bad : cli_mcp_with_namespace(ctx, base, args);
    return bad != NULL ? bad : cli_mcp_req_string(name, args, "name");
}

static json_t *run_status(const struct cli_ctx *base, const json_t *args)
{
    static const char *const known[] = {"namespace", "name", NULL};
    const char *name = NULL;
    json_t *bad, *task = NULL, *r;
    struct cli_ctx ctx;
    struct err err = {0};
    char *path;
    int rc;

    bad = name_args(&ctx, &name, base, args, known, "namespace, name");
    if (bad != NULL) {
        return bad;
    }
    path = cli_task_path(&ctx, name, false);
    rc = cli_api_call(&task, NULL, &ctx, "GET", path, NULL, NULL, &err);
    r = rc == E_OK ? cli_mcp_task_result(task, NULL) : cli_mcp_failure(rc, &err);
    free(path);
    json_decref(task);
    return r;
}

/* PATCHes task NAME with PATCH (taken) and reports VERB. */
static json_t *patch_and_report(const struct cli_ctx *ctx, const char *name, json_t *patch,
                                const char *verb)
{
    char *path = cli_task_path(ctx, name, false);
    json_t *task = NULL, *r;
    struct err err = {0};
    int rc;

    ASSERT(patch != NULL);
    rc = cli_api_call(&task, NULL, ctx, "PATCH", path, MERGE_PATCH, patch, &err);
    r = rc == E_OK ? cli_mcp_task_result(task, verb) : cli_mcp_failure(rc, &err);
    free(path);
    json_decref(patch);
    json_decref(task);
    return r;
}

static json_t *run_guide(const struct cli_ctx *base, const json_t *args)
{
    static const char *const known[] = {"namespace", "name", "guidance", NULL};
    const char *name = NULL, *hint = NULL;
    struct cli_ctx ctx;
    json_t *bad;

    bad = name_args(&ctx, &name, base, args, known, "namespace, name, guidance");
    bad = bad != NULL ? bad : cli_mcp_opt_string(&hint, args, "guidance");
    if (bad == NULL && hint == NULL) {
        bad = cli_mcp_bad_arg("guidance", "is required (an empty string clears it)");
    }
    if (bad != NULL) {
        return bad;
    }
    /* In a merge patch null deletes the key: an empty hint clears the guidance. */
    return patch_and_report(&ctx, name,
                            json_pack("{s:{s:{s:o}}}", "metadata", "annotations",
                                      GUIDANCE_ANNOTATION,
                                      *hint != '\0' ? json_string(hint) : json_null()),
                            *hint != '\0' ? "guidance set" : "guidance cleared");
}

static json_t *run_pause(const struct cli_ctx *base, const json_t *args)
{
    static const char *const known[] = {"namespace", "name", NULL};
    const char *name = NULL;
    struct cli_ctx ctx;
    json_t *bad = name_args(&ctx, &name, base, args, known, "namespace, name");

    if (bad != NULL) {
        return bad;
    }
    return patch_and_report(&ctx, name, json_pack("{s:{s:b}}", "spec", "suspended", 1), "paused");
}

/* DELETE of the task (its sandbox stopped, token revoked, files removed). */
static json_t *run_delete(const struct cli_ctx *base, const json_t *args)
{
    static const char *const known[] = {"namespace", "name", NULL};
    const char *name = NULL;
    struct cli_ctx ctx;
    json_t *bad = name_args(&ctx, &name, base, args, known, "namespace, name"), *task = NULL, *r;
    struct err err = {0};
    char *path;
    int rc;

    if (bad != NULL) {
        return bad;
    }
    path = cli_task_path(&ctx, name, false);
    rc = cli_api_call(&task, NULL, &ctx, "DELETE", path, NULL, NULL, &err);
    r = rc == E_OK ? cli_mcp_task_result(task, "deleted") : cli_mcp_failure(rc, &err);
    free(path);
    json_decref(task);
    return r;
}

/* The merge patch resuming TASK with the bumps USD and TOKENS (-1: none) added to the
 * effective budgets, guarded by the resourceVersion read. New in *out. */
static int resume_patch(json_t **out, const json_t *task, int64_t usd, int64_t tokens,
                        struct err *err)
{
    const json_t *rv = cli_json_at(task, "metadata.resourceVersion");
    json_t *patch = json_pack("{s:{s:b}}", "spec", "suspended", 0);
    json_t *spec = json_object_get(patch, "spec");
    char money[MONEY_STR_MAX];
    int64_t v = 0;
    int rc = E_OK;

    *out = NULL;
    if (json_is_string(rv)) {
        json_object_set_new(patch, "metadata", json_pack("{s:O}", "resourceVersion", rv));
    }
    if (usd >= 0) {
        rc = cli_budget_bump(&v, cli_spec_usd(task), cli_default_usd(task), usd, err);
        money_format(money, v);
        json_object_set_new(spec, "budgetUSD", json_string(money));
    }
    if (rc == E_OK && tokens >= 0) {
        rc = cli_budget_bump(&v, json_integer_value(cli_json_at(task, "spec.budgetTokens")),
                             cli_default_tokens(task), tokens, err);
        json_object_set_new(spec, "budgetTokens", json_integer(v));
    }
    if (rc != E_OK) {
        json_decref(patch);
        return rc;
    }
    *out = patch;
    return E_OK;
}

static bool finished(const json_t *task)
{
    const char *phase = json_string_value(cli_json_at(task, "status.phase"));

    return phase != NULL && (strcmp(phase, "Completed") == 0 || strcmp(phase, "Failed") == 0);
}

static json_t *run_resume(const struct cli_ctx *base, const json_t *args)
{
    static const char *const known[] = {"namespace", "name", "budget", "tokens", NULL};
    const char *name = NULL;
    int64_t usd = -1, tokens = -1;
    json_t *bad, *task = NULL, *patch = NULL, *done = NULL, *r;
    struct cli_ctx ctx;
    struct err err = {0};
    char *path;
    int rc = E_OK;

    bad = name_args(&ctx, &name, base, args, known, "namespace, name, budget, tokens");
    bad = bad != NULL ? bad : cli_mcp_opt_money(&usd, args, "budget", true);
    bad = bad != NULL ? bad : cli_mcp_opt_count(&tokens, args, "tokens", true);
    if (bad != NULL) {
        return bad;
    }
    /* Read, bump, write with the version read; again when someone else wrote between. */
    path = cli_task_path(&ctx, name, false);
    for (int attempt = 0; attempt < RESUME_ATTEMPTS; attempt++) {
        json_decref(task);
        json_decref(patch);
        json_decref(done);
        task = patch = done = NULL;
        rc = cli_api_call(&task, NULL, &ctx, "GET", path, NULL, NULL, &err);
        if (rc == E_OK && finished(task)) {
            rc = err_set(&err, E_INVALID,
                         "task %s is finished: there is nothing to resume; `diverge task rerun "
                         "%s` starts a new run",
                         name, name);
        }
        if (rc == E_OK) {
            rc = resume_patch(&patch, task, usd, tokens, &err);
        }
        if (rc == E_OK) {
            rc = cli_api_call(&done, NULL, &ctx, "PATCH", path, MERGE_PATCH, patch, &err);
        }
        if (rc != E_CONFLICT) {
            break;
        }
    }
    r = rc == E_OK ? cli_mcp_task_result(done, "resumed") : cli_mcp_failure(rc, &err);
    json_decref(task);
    json_decref(patch);
    json_decref(done);
    free(path);
    return r;
}

/* The namespace's SpendQuotas, used against their limits this month (SPEC §15). */
static json_t *run_quota(const struct cli_ctx *base, const json_t *args)
{
    static const char *const known[] = {"namespace", NULL};
    json_t *bad = cli_mcp_check_known(args, known, "namespace"), *list = NULL, *items, *q, *r;
    struct cli_ctx ctx;
    struct err err = {0};
    struct buf b;
    char *ns, *path;
    size_t i;
    int rc;

    bad = bad != NULL ? bad : cli_mcp_with_namespace(&ctx, base, args);
    if (bad != NULL) {
        return bad;
    }
    ns = httpc_escape(ctx.ns);
    path = xasprintf(CLI_API_BASE "/namespaces/%s/spendquotas", ns);
    free(ns);
    rc = cli_api_call(&list, NULL, &ctx, "GET", path, NULL, NULL, &err);
    free(path);
    if (rc != E_OK) {
        return cli_mcp_failure(rc, &err);
    }
    items = json_object_get(list, "items");
    buf_init(&b, 0);
    if (json_array_size(items) == 0) {
        buf_printf(&b, "No spend quotas in namespace %s: its spend is not capped.", ctx.ns);
    }
    json_array_foreach(items, i, q)
    {
        const char *lim = cli_json_str(q, "spec.monthlyUSD");
        const json_t *lt = cli_json_at(q, "spec.monthlyTokens");
        buf_printf(&b, "%s%s: $%s", i > 0 ? "\n" : "", cli_json_str(q, "metadata.name"),
                   cli_json_str(q, "status.usedUSD"));
        buf_printf(&b, lim != NULL ? " / $%s" : "%s", lim != NULL ? lim : "");
        buf_printf(&b, ", %lld",
                   (long long)json_integer_value(cli_json_at(q, "status.usedTokens")));
        if (json_is_integer(lt)) {
            buf_printf(&b, " / %lld", (long long)json_integer_value(lt));
        }
        buf_printf(&b, " tokens this month (since %s)", cli_json_str(q, "status.periodStart"));
    }
    r = cli_mcp_result(false, buf_take(&b),
                       json_pack("{s:O, s:s}", "quotas", items, "namespace", ctx.ns));
    json_decref(list);
    return r;
}

static const struct tool_def tools[] = {
    {"diverge_create_task", "Create an agent task",
     "Creates an AgentTask: an autonomous coding agent works on OBJECTIVE in a sandbox "
     "until it succeeds or a budget (USD, tokens, iterations) runs out.",
     S_OBJ(S_NS "," S_NAME ","
                "\"objective\":{\"type\":\"string\",\"minLength\":1,\"description\":\"what the "
                "agent should do\"},"
                "\"budgetUSD\":{\"type\":\"string\",\"pattern\":\"^[0-9]+(\\\\.[0-9]{1,6})?$\","
                "\"description\":\"spend limit in USD as a decimal string, e.g. \\\"5.00\\\"\"},"
                "\"budgetTokens\":{\"type\":\"integer\",\"minimum\":0,\"description\":\"token "
                "limit\"},"
                "\"maxIterations\":{\"type\":\"integer\",\"minimum\":0,\"description\":"
                "\"iteration limit\"},"
                "\"repository\":{\"anyOf\":[{\"type\":\"string\",\"description\":\"repository "
                "URL\"},{\"type\":\"object\",\"properties\":{\"url\":{\"type\":\"string\"},"
                "\"baseBranch\":{\"type\":\"string\"},\"workingBranch\":{\"type\":\"string\"}},"
                "\"additionalProperties\":false}],\"description\":\"repository to work on: its "
                "URL, or {url, baseBranch, workingBranch}\"}",
           "\"name\",\"objective\""),
     false, run_create},
    {"diverge_list_tasks", "List agent tasks",
     "Lists the AgentTasks of a namespace (or of every namespace) with phase, iteration, "
     "spend and budgets.",
     S_OBJ(S_NS ",\"allNamespaces\":{\"type\":\"boolean\",\"description\":\"list every "
                "namespace\"}",
           ""),
     true, run_list},
    {"diverge_task_status", "Show an agent task",
     "Shows one AgentTask: phase and reason, iteration, tokens and cost against the "
     "budgets, the forecast of the spend still expected to finish, guidance and preview URL.",
     S_OBJ(S_NS "," S_NAME, "\"name\""), true, run_status},
    {"diverge_quota_status", "Show a project's spend quotas",
     "Shows the SpendQuotas of a namespace (a project): USD and tokens used this month "
     "against their monthly limits. A call past a quota pauses its task (QuotaExceeded).",
     S_OBJ(S_NS, ""), true, run_quota},
    {"diverge_guide_task", "Guide an agent task",
     "Gives the agent guidance it receives on its next metering heartbeat; an empty string "
     "clears it.",
     S_OBJ(S_NS "," S_NAME ",\"guidance\":{\"type\":\"string\",\"description\":\"the hint "
                "for the agent\"}",
           "\"name\",\"guidance\""),
     false, run_guide},
    {"diverge_pause_task", "Pause an agent task",
     "Suspends the task: its sandbox stops and its token is revoked until it is resumed.",
     S_OBJ(S_NS "," S_NAME, "\"name\""), false, run_pause},
    {"diverge_resume_task", "Resume an agent task",
     "Resumes a paused task, first adding the optional amounts to its effective budgets "
     "(the spec value, else the server default 5.00 USD / 1000000 tokens).",
     S_OBJ(S_NS "," S_NAME ",\"budget\":{\"type\":\"string\",\"pattern\":\"^\\\\+?[0-9]+("
                "\\\\.[0-9]{1,6})?$\",\"description\":\"USD to add, e.g. \\\"+15.00\\\"\"},"
                "\"tokens\":{\"type\":\"integer\",\"minimum\":0,\"description\":\"tokens to "
                "add\"}",
           "\"name\""),
     false, run_resume},
    {"diverge_delete_task", "Delete an agent task",
     "Deletes the task: its sandbox is stopped, its token revoked and its files (workspace, "
     "log) removed. What was already pushed stays.",
     S_OBJ(S_NS "," S_NAME, "\"name\""), false, run_delete},
};

json_t *cli_mcp_tools_list(void)
{
    json_t *list = json_array();

    for (size_t i = 0; i < ARRAY_LEN(tools); i++) {
        json_error_t jerr;
        json_t *schema = json_loads(tools[i].schema, 0, &jerr);

        ASSERT(schema != NULL);
        json_array_append_new(list,
                              json_pack("{s:s, s:s, s:s, s:o, s:{s:b, s:b}}", "name", tools[i].name,
                                        "title", tools[i].title, "description",
                                        tools[i].description, "inputSchema", schema, "annotations",
                                        "readOnlyHint", tools[i].read_only, "openWorldHint", 0));
    }
    return json_pack("{s:o}", "tools", list);
}

json_t *cli_mcp_tool_call(const struct cli_mcp *m, const char *name, const json_t *args)
{
    for (size_t i = 0; i < ARRAY_LEN(tools); i++) {
        if (strcmp(tools[i].name, name) == 0) {
            return tools[i].run(m->ctx, args);
        }
    }
    return NULL;
}
