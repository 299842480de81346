/* SPDX-License-Identifier: Apache-2.0 */
/* `task list|status|guide|pause|resume`: read and merge-patch AgentTasks. Money is shown
 * from the object's decimal strings as they are and computed only in micro-dollars. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_int.h"
#include "common/clock.h"
#include "common/money.h"

#define GUIDANCE_ANNOTATION "divergedev.com/guidance"
#define MERGE_PATCH "application/merge-patch+json"
/* GET+PATCH rounds a resume tries when another writer keeps winning (HTTP 409). */
#define RESUME_ATTEMPTS 5

int cli_budget_bump(int64_t *out, int64_t spec_value, int64_t server_default, int64_t bump,
                    struct err *err)
{
    *out = 0;
    if (bump < 0) {
        return err_set(err, E_INVALID, "a budget bump cannot be negative");
    }
    return money_add(out, spec_value > 0 ? spec_value : server_default, bump, err);
}

int cli_parse_tokens(int64_t *out, const char *s, bool allow_plus, struct err *err)
{
    const char *p = s;
    int64_t v = 0, mult = 1;

    *out = 0;
    if (*p == '+' && allow_plus) {
        p++;
    }
    if (*p < '0' || *p > '9') {
        return err_set(err, E_INVALID, "expected a token count such as 200000 or 2M, got \"%s\"",
                       s);
    }
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (INT64_MAX - (*p - '0')) / 10) {
            return err_set(err, E_TOOBIG, "token count \"%s\" is too large", s);
        }
        v = v * 10 + (*p - '0');
    }
    if (*p == 'k' || *p == 'K') {
        mult = 1000;
        p++;
    } else if (*p == 'M') {
        mult = 1000000;
        p++;
    }
    if (*p != '\0') {
        return err_set(err, E_INVALID, "expected a token count such as 200000 or 2M, got \"%s\"",
                       s);
    }
    if (v > INT64_MAX / mult) {
        return err_set(err, E_TOOBIG, "token count \"%s\" is too large", s);
    }
    *out = v * mult;
    return E_OK;
}

const char *cli_text_or_dash(char tmp[32], const json_t *obj, const char *path)
{
    const json_t *v = cli_json_at(obj, path);

    if (json_is_string(v) && *json_string_value(v) != '\0') {
        return json_string_value(v);
    }
    if (json_is_integer(v)) {
        snprintf(tmp, 32, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return tmp;
    }
    return "-";
}

/* The path of the limit that applies: status.effective… (what the server enforces, spec
 * or default, SPEC §14), else the spec field (a task not started yet). */
static const char *limit_of(const json_t *obj, const char *effective, const char *spec)
{
    return cli_json_at(obj, effective) != NULL ? effective : spec;
}

#define LIMIT_ITER(o) limit_of((o), "status.effectiveMaxIterations", "spec.maxIterations")
#define LIMIT_TOKENS(o) limit_of((o), "status.effectiveBudgetTokens", "spec.budgetTokens")
#define LIMIT_USD(o) limit_of((o), "status.effectiveBudgetUSD", "spec.budgetUSD")

/* "USED/LIMIT", or just "USED" without a positive limit. */
static void ratio(char out[48], const json_t *obj, const char *used, const char *limit)
{
    json_int_t u = json_integer_value(cli_json_at(obj, used));
    json_int_t l = json_integer_value(cli_json_at(obj, limit));

    if (l > 0) {
        snprintf(out, 48, "%" JSON_INTEGER_FORMAT "/%" JSON_INTEGER_FORMAT, u, l);
    } else {
        snprintf(out, 48, "%" JSON_INTEGER_FORMAT, u);
    }
}

static void age_of(char out[CLI_AGE_MAX], const json_t *obj)
{
    const char *ts = cli_json_str(obj, "metadata.creationTimestamp");
    int64_t ms;

    if (ts == NULL || clock_parse_rfc3339(&ms, ts) != E_OK) {
        snprintf(out, CLI_AGE_MAX, "<unknown>");
        return;
    }
    cli_format_age(out, clock_now_ms(clock_system()) - ms);
}

static void add_list_row(struct cli_table *t, const json_t *item, bool all)
{
    char iter[48], tokens[48], age[CLI_AGE_MAX], cost[32], budget[32], queued[64];
    const char *row[8], *phase = cli_json_str(item, "status.phase");
    json_int_t pos = json_integer_value(cli_json_at(item, "status.queuePosition"));
    size_t n = 0;

    ratio(iter, item, "status.iteration", LIMIT_ITER(item));
    ratio(tokens, item, "status.tokensConsumed", LIMIT_TOKENS(item));
    age_of(age, item);
    if (all) {
        row[n++] = cli_json_str(item, "metadata.namespace");
    }
    row[n++] = cli_json_str(item, "metadata.name");
    row[n++] = phase != NULL && *phase != '\0' ? phase : "-";
    if (pos > 0 && phase != NULL) {
        /* Waiting for a sandbox slot (SPEC §14): "Pending (queued #2)". */
        snprintf(queued, sizeof(queued), "%s (queued #%lld)", phase, (long long)pos);
        row[n - 1] = queued;
    }
    row[n++] = iter;
    row[n++] = cli_text_or_dash(cost, item, "status.costUSD");
    row[n++] = cli_text_or_dash(budget, item, LIMIT_USD(item));
    row[n++] = tokens;
    row[n++] = age;
    cli_table_add(t, row);
}

static void print_table(const struct cli_table *t)
{
    struct buf b;

    buf_init(&b, 0);
    cli_table_render(&b, t);
    fwrite(b.data, 1, b.len, stdout);
    buf_cleanup(&b);
}

static void print_list(const struct cli_ctx *ctx, const json_t *items)
{
    static const char *const head[] = {"NAMESPACE", "NAME",   "PHASE",  "ITERATION",
                                       "COST",      "BUDGET", "TOKENS", "AGE"};
    bool all = ctx->all_namespaces;
    struct cli_table t;

    if (json_array_size(items) == 0) {
        /* Like kubectl: on stderr, so that a pipe sees an empty list. */
        if (all) {
            fprintf(stderr, "No tasks found.\n");
        } else {
            fprintf(stderr, "No tasks found in namespace %s.\n", ctx->ns);
        }
        return;
    }
    cli_table_init(&t, all ? 8 : 7);
    cli_table_add(&t, all ? head : head + 1);
    for (size_t i = 0; i < json_array_size(items); i++) {
        add_list_row(&t, json_array_get(items, i), all);
    }
    print_table(&t);
    cli_table_cleanup(&t);
}

int cli_task_list(struct cli_ctx *ctx, const struct cli_args *args)
{
    char *path = cli_task_path(ctx, NULL, ctx->all_namespaces), *raw = NULL;
    struct err err = {0};
    json_t *list = NULL;
    int rc;

    (void)args;
    rc = cli_api_call(&list, &raw, ctx, "GET", path, NULL, NULL, &err);
    if (rc != E_OK) {
        rc = cli_api_fail(rc, &err);
        goto out;
    }
    if (ctx->output == CLI_OUTPUT_TABLE) {
        print_list(ctx, json_object_get(list, "items"));
    } else {
        cli_print_object(ctx, raw, list);
    }
    rc = CLI_EXIT_OK;
out:
    json_decref(list);
    free(raw);
    free(path);
    return rc;
}

static const char *str_or_dash(const json_t *obj, const char *path)
{
    const char *s = cli_json_str(obj, path);
    return s != NULL && *s != '\0' ? s : "-";
}

/* The forecast (status.forecast*, written by the meter) as one line, or "-" when the task
 * has none: "1.80 more at 0.45/iteration, 4 iterations left, budget holds". */
static void forecast_text(char *out, size_t n, const json_t *t)
{
    const char *usd = cli_json_str(t, "status.forecastUSD");
    const char *per = cli_json_str(t, "status.forecastPerIterationUSD");
    const json_t *left = cli_json_at(t, "status.forecastIterationsLeft");
    const json_t *holds = cli_json_at(t, "status.forecastBudgetHolds");
    const json_t *runs = cli_json_at(t, "status.forecastRunsOutIteration");
    const json_t *it = cli_json_at(t, "status.iteration");
    long long l = json_integer_value(left);
    int k;

    if (usd == NULL || per == NULL || !json_is_integer(left)) {
        snprintf(out, n, "-");
        return;
    }
    k = snprintf(out, n, "%s more at %s/iteration, %lld iteration%s left", usd, per, l,
                 l == 1 ? "" : "s");
    if (k < 0 || (size_t)k >= n) {
        return;
    }
    if (json_is_true(holds)) {
        snprintf(out + k, n - (size_t)k, ", budget holds");
    } else if (json_is_false(holds) && json_is_integer(runs)) {
        /* Of the iterations done (status.iteration - 1) and left: the sticky's "of N". */
        snprintf(out + k, n - (size_t)k, ", budget runs out in iteration %lld of %lld",
                 (long long)json_integer_value(runs), (long long)json_integer_value(it) - 1 + l);
    }
}

static void print_status(const json_t *t)
{
    const json_t *ann = cli_json_at(t, "metadata.annotations");
    const char *guidance = json_string_value(json_object_get(ann, GUIDANCE_ANNOTATION));
    const json_t *suspended = cli_json_at(t, "spec.suspended");
    char iter[48], tokens[48], cost[96], created[160], age[CLI_AGE_MAX], a[32], b[32];
    char forecast[256];
    const char *ts = cli_json_str(t, "metadata.creationTimestamp");
    struct cli_table tab;

    ratio(iter, t, "status.iteration", LIMIT_ITER(t));
    ratio(tokens, t, "status.tokensConsumed", LIMIT_TOKENS(t));
    snprintf(cost, sizeof(cost), "%s/%s", cli_text_or_dash(a, t, "status.costUSD"),
             cli_text_or_dash(b, t, LIMIT_USD(t)));
    forecast_text(forecast, sizeof(forecast), t);
    age_of(age, t);
    snprintf(created, sizeof(created), "%s (%s ago)", ts != NULL ? ts : "-", age);
    {
        const char *rows[][2] = {
            {"Name:", str_or_dash(t, "metadata.name")},
            {"Namespace:", str_or_dash(t, "metadata.namespace")},
            {"Phase:", str_or_dash(t, "status.phase")},
            {"Reason:", str_or_dash(t, "status.reason")},
            {"Message:", str_or_dash(t, "status.message")},
            {"Objective:", str_or_dash(t, "spec.objective")},
            {"Repository:", str_or_dash(t, "spec.repository.url")},
            {"Base branch:", str_or_dash(t, "spec.repository.baseBranch")},
            {"Working branch:", str_or_dash(t, "spec.repository.workingBranch")},
            {"Iteration:", iter},
            {"Tokens:", tokens},
            {"Cost (USD):", cost},
            {"Forecast (USD):", forecast},
            {"Suspended:", json_is_true(suspended) ? "true" : "false"},
            {"Preview URL:", str_or_dash(t, "status.previewUrl")},
            {"Guidance:", guidance != NULL && *guidance != '\0' ? guidance : "-"},
            {"Created:", created},
        };
        cli_table_init(&tab, 2);
        for (size_t i = 0; i < ARRAY_LEN(rows); i++) {
            cli_table_add(&tab, rows[i]);
        }
    }
    print_table(&tab);
    cli_table_cleanup(&tab);
}

int cli_task_status(struct cli_ctx *ctx, const struct cli_args *args)
{
    char *path = cli_task_path(ctx, args->pos[0], false), *raw = NULL;
    struct err err = {0};
    json_t *task = NULL;
    int rc;

    rc = cli_api_call(&task, &raw, ctx, "GET", path, NULL, NULL, &err);
    if (rc != E_OK) {
        rc = cli_api_fail(rc, &err);
        goto out;
    }
    if (ctx->output == CLI_OUTPUT_TABLE) {
        print_status(task);
    } else {
        cli_print_object(ctx, raw, task);
    }
    rc = CLI_EXIT_OK;
out:
    json_decref(task);
    free(raw);
    free(path);
    return rc;
}

/* PATCHes task NAME with the merge patch PATCH; results as cli_api_call. */
static int patch_task(json_t **out, char **raw_out, const struct cli_ctx *ctx, const char *name,
                      const json_t *patch, struct err *err)
{
    char *path = cli_task_path(ctx, name, false);
    int rc = cli_api_call(out, raw_out, ctx, "PATCH", path, MERGE_PATCH, patch, err);

    free(path);
    return rc;
}

/* Sends PATCH to task NAME and reports DONE ("paused") or the object. Takes PATCH. */
static int patch_and_report(const struct cli_ctx *ctx, const char *name, json_t *patch,
                            const char *done)
{
    json_t *task = NULL;
    char *raw = NULL;
    struct err err = {0};
    int rc = patch_task(&task, &raw, ctx, name, patch, &err);

    if (rc != E_OK) {
        rc = cli_api_fail(rc, &err);
    } else {
        if (ctx->output == CLI_OUTPUT_TABLE) {
            printf("agenttask.divergedev.com/%s %s\n", name, done);
        } else {
            cli_print_object(ctx, raw, task);
        }
        rc = CLI_EXIT_OK;
    }
    json_decref(patch);
    json_decref(task);
    free(raw);
    return rc;
}

int cli_task_guide(struct cli_ctx *ctx, const struct cli_args *args)
{
    const char *hint = args->pos[1];
    /* In a merge patch null deletes the key: an empty hint clears the guidance. */
    json_t *value = *hint != '\0' ? json_string(hint) : json_null();
    json_t *patch =
        json_pack("{s:{s:{s:o}}}", "metadata", "annotations", GUIDANCE_ANNOTATION, value);

    ASSERT(patch != NULL);
    return patch_and_report(ctx, args->pos[0], patch,
                            *hint != '\0' ? "guidance set" : "guidance cleared");
}

int cli_task_pause(struct cli_ctx *ctx, const struct cli_args *args)
{
    json_t *patch = json_pack("{s:{s:b}}", "spec", "suspended", 1);

    ASSERT(patch != NULL);
    return patch_and_report(ctx, args->pos[0], patch, "paused");
}

/* `task delete NAME`: DELETE of the task; the server stops its sandbox and removes its
 * files. Prints "deleted" (kubectl's word), or the last version with -o json|yaml. */
int cli_task_delete(struct cli_ctx *ctx, const struct cli_args *args)
{
    char *path = cli_task_path(ctx, args->pos[0], false);
    json_t *task = NULL;
    char *raw = NULL;
    struct err err = {0};
    int rc = cli_api_call(&task, &raw, ctx, "DELETE", path, NULL, NULL, &err);

    if (rc != E_OK) {
        rc = cli_api_fail(rc, &err);
    } else {
        if (ctx->output == CLI_OUTPUT_TABLE) {
            printf("agenttask.divergedev.com/%s deleted\n", args->pos[0]);
        } else {
            cli_print_object(ctx, raw, task);
        }
        rc = CLI_EXIT_OK;
    }
    json_decref(task);
    free(raw);
    free(path);
    return rc;
}

/* The optional bumps of `task resume`. */
struct bumps {
    bool usd;           /* --budget given */
    int64_t usd_micros; /* its amount */
    bool tokens;        /* --tokens given */
    int64_t tokens_n;   /* its count */
};

static int parse_bumps(struct bumps *b, const struct cli_args *args)
{
    const char *budget = cli_args_value(args, CLI_OPT_BUDGET);
    const char *tokens = cli_args_value(args, CLI_OPT_TOKENS);
    struct err err = {0};

    memset(b, 0, sizeof(*b));
    /* "+15.00" and "15.00" both add, as in the `/diverge resume` comment command. */
    if (budget != NULL && money_parse(&b->usd_micros, NULL, budget, &err) != E_OK) {
        cli_errorf("task resume: --budget: expected an amount such as +15.00, got \"%s\"", budget);
        return CLI_EXIT_USAGE;
    }
    if (tokens != NULL && cli_parse_tokens(&b->tokens_n, tokens, true, &err) != E_OK) {
        cli_errorf("task resume: --tokens: %s", err.msg);
        return CLI_EXIT_USAGE;
    }
    b->usd = budget != NULL;
    b->tokens = tokens != NULL;
    return CLI_EXIT_OK;
}

int64_t cli_spec_usd(const json_t *task)
{
    const json_t *v = cli_json_at(task, "spec.budgetUSD");
    int64_t micros = 0;

    if (json_is_string(v) && money_parse(&micros, NULL, json_string_value(v), NULL) == E_OK) {
        return micros;
    }
    if (json_is_integer(v) && json_integer_value(v) > 0 &&
        json_integer_value(v) <= INT64_MAX / MONEY_MICROS_PER_USD) {
        return json_integer_value(v) * MONEY_MICROS_PER_USD;
    }
    return 0;
}

int64_t cli_default_usd(const json_t *task)
{
    const char *s = cli_json_str(task, "status.effectiveBudgetUSD");
    int64_t micros = 0;

    if (s != NULL && money_parse(&micros, NULL, s, NULL) == E_OK && micros > 0) {
        return micros;
    }
    return CLI_DEFAULT_BUDGET_USD_MICROS;
}

int64_t cli_default_tokens(const json_t *task)
{
    json_int_t v = json_integer_value(cli_json_at(task, "status.effectiveBudgetTokens"));

    return v > 0 ? (int64_t)v : CLI_DEFAULT_BUDGET_TOKENS;
}

/* The merge patch resuming TASK with B applied; *out is new. SUMMARY gets the new
 * budgets for the message. The resourceVersion makes a concurrent change a 409. */
static int resume_patch(json_t **out, char summary[128], const json_t *task, const struct bumps *b,
                        struct err *err)
{
    const json_t *rv = cli_json_at(task, "metadata.resourceVersion");
    json_t *patch = json_pack("{s:{s:b}}", "spec", "suspended", 0);
    json_t *spec = json_object_get(patch, "spec");
    char money[MONEY_STR_MAX] = "";
    int64_t usd = 0, tokens = 0;
    int rc = E_OK;

    *out = NULL;
    summary[0] = '\0';
    if (json_is_string(rv)) {
        json_object_set_new(patch, "metadata",
                            json_pack("{s:s}", "resourceVersion", json_string_value(rv)));
    }
    if (b->usd) {
        rc = cli_budget_bump(&usd, cli_spec_usd(task), cli_default_usd(task), b->usd_micros, err);
        money_format(money, usd);
        json_object_set_new(spec, "budgetUSD", json_string(money));
    }
    if (rc == E_OK && b->tokens) {
        rc = cli_budget_bump(&tokens, json_integer_value(cli_json_at(task, "spec.budgetTokens")),
                             cli_default_tokens(task), b->tokens_n, err);
        json_object_set_new(spec, "budgetTokens", json_integer(tokens));
    }
    if (rc != E_OK) {
        json_decref(patch);
        return rc;
    }
    if (b->usd && b->tokens) {
        snprintf(summary, 128, " (budget %s USD, %lld tokens)", money, (long long)tokens);
    } else if (b->usd) {
        snprintf(summary, 128, " (budget %s USD)", money);
    } else if (b->tokens) {
        snprintf(summary, 128, " (budget %lld tokens)", (long long)tokens);
    }
    *out = patch;
    return E_OK;
}

static bool task_finished(const json_t *task)
{
    const char *phase = json_string_value(cli_json_at(task, "status.phase"));

    return phase != NULL && (strcmp(phase, "Completed") == 0 || strcmp(phase, "Failed") == 0);
}

/* What a resume or rerun adds to resume_patch: a rerun raises spec.run past the run
 * asked for and the run that ran (SPEC §14), with OBJECTIVE (may be NULL). */
static void rerun_patch(json_t *patch, const json_t *task, const char *objective)
{
    json_t *spec = json_object_get(patch, "spec");
    json_int_t want = json_integer_value(cli_json_at(task, "spec.run"));
    json_int_t ran = json_integer_value(cli_json_at(task, "status.run"));
    json_int_t last = want > ran ? want : ran;

    json_object_set_new(spec, "run", json_integer((last > 0 ? last : 1) + 1));
    if (objective != NULL) {
        json_object_set_new(spec, "objective", json_string(objective));
    }
}

/* One GET and guarded PATCH of a resume (RERUN false) or rerun of NAME; E_CONFLICT when
 * someone wrote between. *refused_out: the task's phase does not allow it (said). */
static int resume_once(json_t **done, char **raw, char summary[128], bool *refused_out,
                       const struct cli_ctx *ctx, const char *name, const struct bumps *b,
                       bool rerun, const char *objective, struct err *err)
{
    char *path = cli_task_path(ctx, name, false);
    json_t *task = NULL, *patch = NULL;
    int rc = cli_api_call(&task, NULL, ctx, "GET", path, NULL, NULL, err);

    free(path);
    *refused_out = false;
    if (rc == E_OK && task_finished(task) != rerun) {
        const char *phase = json_string_value(cli_json_at(task, "status.phase"));
        *refused_out = true;
        if (rerun) {
            cli_errorf("task %s is %s, not finished: only a Completed or Failed task runs again "
                       "(`diverge task resume %s` continues a paused one)",
                       name, phase != NULL ? phase : "new", name);
        } else {
            cli_errorf("task %s is finished (%s): there is nothing to resume; `/diverge fix "
                       "<objective>` on its pull request or `diverge task rerun %s` starts a "
                       "new run",
                       name, phase, name);
        }
        rc = E_DENIED;
    }
    if (rc == E_OK) {
        rc = resume_patch(&patch, summary, task, b, err);
    }
    if (rc == E_OK && rerun) {
        rerun_patch(patch, task, objective);
    }
    if (rc == E_OK) {
        rc = patch_task(done, raw, ctx, name, patch, err);
    }
    json_decref(task);
    json_decref(patch);
    return rc;
}

/* `task resume` and `task rerun`: read, check the phase, write with the version read;
 * again when someone else wrote between. */
static int resume_or_rerun(struct cli_ctx *ctx, const struct cli_args *args, bool rerun)
{
    const char *name = args->pos[0];
    json_t *done = NULL;
    char *raw = NULL, summary[128];
    struct err err = {0};
    struct bumps b;
    bool refused = false;
    int rc = parse_bumps(&b, args);

    if (rc != CLI_EXIT_OK) {
        return rc;
    }
    for (int attempt = 0; attempt < RESUME_ATTEMPTS; attempt++) {
        json_decref(done);
        free(raw);
        done = NULL;
        raw = NULL;
        rc = resume_once(&done, &raw, summary, &refused, ctx, name, &b, rerun,
                         cli_args_value(args, CLI_OPT_OBJECTIVE), &err);
        if (rc != E_CONFLICT) {
            break;
        }
    }
    if (refused) {
        rc = CLI_EXIT_FAILED;
    } else if (rc != E_OK) {
        rc = cli_api_fail(rc, &err);
    } else if (ctx->output == CLI_OUTPUT_TABLE) {
        if (rerun) {
            printf("agenttask.divergedev.com/%s run %lld started%s\n", name,
                   (long long)json_integer_value(cli_json_at(done, "spec.run")), summary);
        } else {
            printf("agenttask.divergedev.com/%s resumed%s\n", name, summary);
        }
        rc = CLI_EXIT_OK;
    } else {
        cli_print_object(ctx, raw, done);
        rc = CLI_EXIT_OK;
    }
    json_decref(done);
    free(raw);
    return rc;
}

int cli_task_resume(struct cli_ctx *ctx, const struct cli_args *args)
{
    return resume_or_rerun(ctx, args, false);
}

int cli_task_rerun(struct cli_ctx *ctx, const struct cli_args *args)
{
    return resume_or_rerun(ctx, args, true);
}
