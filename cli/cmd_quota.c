/* SPDX-License-Identifier: Apache-2.0 */
/* `diverge quota list|status` (SPEC §15): a project's SpendQuotas, used against their
 * limits this month, read from the task API. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_int.h"
#include "common/buf.h"
#include "common/httpc.h"

static const char quota_usage[] =
    "Usage: diverge quota COMMAND [options]\n"
    "\n"
    "Commands:\n"
    "  list [-A]                 list the namespace's spend quotas (-A: every namespace)\n"
    "  status NAME               show one quota: used / limit this month\n"
    "\n"
    "Quotas are SpendQuota objects an operator creates (kubectl or the task API).\n"
    "Run 'diverge quota COMMAND --help' for a command's options.\n" CLI_GLOBAL_HELP;

static int quota_list(struct cli_ctx *ctx, const struct cli_args *args);
static int quota_status(struct cli_ctx *ctx, const struct cli_args *args);

static const struct cli_cmd quota_cmds[] = {
    {"list", 0, 0, NULL, quota_list, CLI_OPT_BIT(CLI_OPT_ALL_NAMESPACES),
     "Usage: diverge quota list [-A]\n\n"
     "Lists the spend quotas of the namespace, or of every namespace with "
     "-A/--all-namespaces.\n" CLI_GLOBAL_HELP},
    {"status", 1, 1, NULL, quota_status, 0,
     "Usage: diverge quota status NAME\n\nShows one spend quota: USD and tokens used this "
     "month against its limits, the running-task cap and the period.\n" CLI_GLOBAL_HELP},
};

int cli_quota_main(int argc, char **argv)
{
    return cli_dispatch(quota_cmds, ARRAY_LEN(quota_cmds), "quota", quota_usage, argc - 1,
                        argv + 1);
}

static char *quota_path(const struct cli_ctx *ctx, const char *name, bool all)
{
    return cli_resource_path(ctx, "spendquotas", name, all);
}

/* "used / limit" of Q's USED and LIMIT (a JSON string or integer), or "used" unlimited. */
static void used_of(char *out, size_t n, const json_t *q, const char *used, const char *limit)
{
    const json_t *u = cli_json_at(q, used), *l = cli_json_at(q, limit);
    char us[32], ls[32];

    snprintf(us, sizeof(us), "%s", json_is_string(u) ? json_string_value(u) : "");
    if (json_is_integer(u)) {
        snprintf(us, sizeof(us), "%lld", (long long)json_integer_value(u));
    }
    snprintf(ls, sizeof(ls), "%s", json_is_string(l) ? json_string_value(l) : "");
    if (json_is_integer(l)) {
        snprintf(ls, sizeof(ls), "%lld", (long long)json_integer_value(l));
    }
    if (l == NULL) {
        snprintf(out, n, "%s", us[0] != '\0' ? us : "0");
    } else {
        snprintf(out, n, "%s/%s", us[0] != '\0' ? us : "0", ls);
    }
}

static void running_of(char out[24], const json_t *q)
{
    const json_t *r = cli_json_at(q, "spec.maxRunningTasks");

    if (json_is_integer(r)) {
        snprintf(out, 24, "%lld", (long long)json_integer_value(r));
    } else {
        snprintf(out, 24, "-");
    }
}

static void print_list(const struct cli_ctx *ctx, const json_t *items)
{
    static const char *const head[] = {"NAMESPACE", "NAME",        "USD",
                                       "TOKENS",    "MAX-RUNNING", "PERIOD"};
    bool all = ctx->all_namespaces;
    struct cli_table t;
    struct buf b;

    if (json_array_size(items) == 0) {
        if (all) {
            fprintf(stderr, "No spend quotas found.\n");
        } else {
            fprintf(stderr, "No spend quotas found in namespace %s.\n", ctx->ns);
        }
        return;
    }
    cli_table_init(&t, all ? 6 : 5);
    cli_table_add(&t, all ? head : head + 1);
    for (size_t i = 0; i < json_array_size(items); i++) {
        const json_t *q = json_array_get(items, i);
        char usd[72], tok[48], run[24];
        const char *row[6], *ps = cli_json_str(q, "status.periodStart");
        size_t n = 0;
        used_of(usd, sizeof(usd), q, "status.usedUSD", "spec.monthlyUSD");
        used_of(tok, sizeof(tok), q, "status.usedTokens", "spec.monthlyTokens");
        running_of(run, q);
        if (all) {
            row[n++] = cli_json_str(q, "metadata.namespace");
        }
        row[n++] = cli_json_str(q, "metadata.name");
        row[n++] = usd;
        row[n++] = tok;
        row[n++] = run;
        row[n++] = ps != NULL ? ps : "-";
        cli_table_add(&t, row);
    }
    buf_init(&b, 0);
    cli_table_render(&b, &t);
    fwrite(b.data, 1, b.len, stdout);
    buf_cleanup(&b);
    cli_table_cleanup(&t);
}

static int get(json_t **out, char **raw, struct cli_ctx *ctx, const char *path)
{
    struct err err = {0};
    int rc = cli_api_call(out, raw, ctx, "GET", path, NULL, NULL, &err);

    return rc == E_OK ? CLI_EXIT_OK : cli_api_fail(rc, &err);
}

static int quota_list(struct cli_ctx *ctx, const struct cli_args *args)
{
    char *path = quota_path(ctx, NULL, ctx->all_namespaces), *raw = NULL;
    json_t *list = NULL;
    int rc = get(&list, &raw, ctx, path);

    (void)args;
    if (rc == CLI_EXIT_OK) {
        if (ctx->output == CLI_OUTPUT_TABLE) {
            print_list(ctx, json_object_get(list, "items"));
        } else {
            cli_print_object(ctx, raw, list);
        }
    }
    json_decref(list);
    free(raw);
    free(path);
    return rc;
}

static int quota_status(struct cli_ctx *ctx, const struct cli_args *args)
{
    char *path = quota_path(ctx, args->pos[0], false), *raw = NULL;
    char usd[72], tok[48], run[24];
    json_t *q = NULL;
    int rc = get(&q, &raw, ctx, path);

    if (rc == CLI_EXIT_OK && ctx->output != CLI_OUTPUT_TABLE) {
        cli_print_object(ctx, raw, q);
    } else if (rc == CLI_EXIT_OK) {
        used_of(usd, sizeof(usd), q, "status.usedUSD", "spec.monthlyUSD");
        used_of(tok, sizeof(tok), q, "status.usedTokens", "spec.monthlyTokens");
        running_of(run, q);
        printf("Name:         %s\nNamespace:    %s\nUSD:          %s\nTokens:       %s\n"
               "Max running:  %s\nPeriod start: %s (UTC calendar month)\n",
               cli_json_str(q, "metadata.name"), cli_json_str(q, "metadata.namespace"), usd, tok,
               run,
               cli_json_str(q, "status.periodStart") != NULL ? cli_json_str(q, "status.periodStart")
                                                             : "-");
    }
    json_decref(q);
    free(raw);
    free(path);
    return rc;
}
