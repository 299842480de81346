/* SPDX-License-Identifier: Apache-2.0 */
/* `diverge local comment OWNER/REPO#N "<text>" [--as USER] [--permission P]` and
 * `diverge local thread OWNER/REPO#N` (SPEC §10): the offline SCM, where a comment goes
 * through the same inbox, bot, controller and notifier as a webhook. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_int.h"
#include "common/httpc.h"

#define LOCAL_USAGE_TAIL                                                                           \
    "OWNER/REPO#N names a pull request of the local SCM, e.g. myorg/checkout#7.\n" CLI_GLOBAL_HELP

static int cmd_comment(struct cli_ctx *ctx, const struct cli_args *args);
static int cmd_thread(struct cli_ctx *ctx, const struct cli_args *args);

static const struct cli_cmd local_cmds[] = {
    {"comment", 2, 2, NULL, cmd_comment, CLI_OPT_BIT(CLI_OPT_AS) | CLI_OPT_BIT(CLI_OPT_PERMISSION),
     "Usage: diverge local comment OWNER/REPO#N \"<text>\" [--as USER] [--permission P]\n\n"
     "Posts a comment on a local pull request; `/diverge ...` lines in it are commands.\n\n"
     "Options:\n"
     "  --as USER           the commenter (default $USER, else \"you\")\n"
     "  --permission P      the commenter's permission: none, read, triage, write,\n"
     "                      maintain or admin (default admin: it is your "
     "repository)\n\n" LOCAL_USAGE_TAIL},
    {"thread", 1, 1, NULL, cmd_thread, 0,
     "Usage: diverge local thread OWNER/REPO#N\n\n"
     "Prints the thread: your comments, the bot's replies and its sticky status "
     "comment.\n\n" LOCAL_USAGE_TAIL},
};

static const char local_usage[] =
    "Usage: diverge local COMMAND\n\n"
    "The offline SCM: a pull-request thread kept by the server itself.\n\n"
    "Commands:\n"
    "  comment OWNER/REPO#N \"<text>\" [--as USER] [--permission P]\n"
    "  thread OWNER/REPO#N\n" CLI_GLOBAL_HELP;

int cli_local_main(int argc, char **argv)
{
    return cli_dispatch(local_cmds, ARRAY_LEN(local_cmds), "local", local_usage, argc - 1,
                        argv + 1);
}

/* Splits "owner/repo#7". Returns false (after a usage message) when malformed. */
static bool parse_ref(char **project_out, long long *number_out, const char *ref)
{
    const char *hash = strrchr(ref, '#');
    char *end = NULL;

    *project_out = NULL;
    if (hash == NULL || hash == ref || strchr(ref, '/') == NULL || strchr(ref, '/') > hash) {
        cli_errorf("local: %s: expected OWNER/REPO#NUMBER", ref);
        return false;
    }
    *number_out = strtoll(hash + 1, &end, 10);
    if (end == hash + 1 || *end != '\0' || *number_out < 1) {
        cli_errorf("local: %s: the number after # must be a positive integer", ref);
        return false;
    }
    *project_out = xstrndup(ref, (size_t)(hash - ref));
    return true;
}

static int cmd_comment(struct cli_ctx *ctx, const struct cli_args *args)
{
    const char *as = cli_args_value(args, CLI_OPT_AS);
    const char *perm = cli_args_value(args, CLI_OPT_PERMISSION);
    char *project = NULL;
    long long number;
    json_t *body, *ans = NULL;
    char *raw = NULL;
    struct err err = {0};
    int rc;

    if (!parse_ref(&project, &number, args->pos[0])) {
        return CLI_EXIT_USAGE;
    }
    if (as == NULL || as[0] == '\0') {
        as = getenv("USER") != NULL && getenv("USER")[0] != '\0' ? getenv("USER") : "you";
    }
    body =
        json_pack("{s:s, s:I, s:s, s:s, s:s}", "project", project, "number", (json_int_t)number,
                  "body", args->pos[1], "author", as, "permission", perm != NULL ? perm : "admin");
    rc = cli_api_call(&ans, &raw, ctx, "POST", "/api/v1/local/comments", "application/json", body,
                      &err);
    json_decref(body);
    if (rc != E_OK) {
        free(project);
        return cli_api_fail(rc, &err);
    }
    if (ctx->output != CLI_OUTPUT_TABLE) {
        cli_print_object(ctx, raw, ans);
    } else {
        printf("comment %lld posted on %s#%lld\n",
               (long long)json_integer_value(json_object_get(ans, "id")), project, number);
        if (json_is_true(json_object_get(ans, "command"))) {
            printf("the bot answers in the thread: diverge local thread %s#%lld\n", project,
                   number);
        }
    }
    json_decref(ans);
    free(raw);
    free(project);
    return CLI_EXIT_OK;
}

static void print_comment(const json_t *c)
{
    const char *author = json_string_value(json_object_get(c, "author"));
    const char *created = json_string_value(json_object_get(c, "createdAt"));
    const char *updated = json_string_value(json_object_get(c, "updatedAt"));
    const json_t *reactions = json_object_get(c, "reactions"), *r;
    size_t i;

    printf("--- #%lld %s at %s", (long long)json_integer_value(json_object_get(c, "id")),
           author != NULL ? author : "?", created != NULL ? created : "?");
    if (updated != NULL && created != NULL && strcmp(updated, created) != 0) {
        printf(" (edited %s)", updated);
    }
    json_array_foreach(reactions, i, r)
    {
        printf(" [%s]", json_string_value(r));
    }
    printf("\n%s\n\n", json_string_value(json_object_get(c, "body")));
}

static int cmd_thread(struct cli_ctx *ctx, const struct cli_args *args)
{
    char *project = NULL, *path, *esc_owner, *esc_repo, *slash, *raw = NULL;
    long long number;
    json_t *ans = NULL, *c;
    struct err err = {0};
    size_t i;
    int rc;

    if (!parse_ref(&project, &number, args->pos[0])) {
        return CLI_EXIT_USAGE;
    }
    slash = strchr(project, '/');
    *slash = '\0';
    esc_owner = httpc_escape(project);
    esc_repo = httpc_escape(slash + 1);
    *slash = '/';
    path = xasprintf("/api/v1/local/threads/%s/%s/%lld", esc_owner, esc_repo, number);
    rc = cli_api_call(&ans, &raw, ctx, "GET", path, NULL, NULL, &err);
    free(path);
    free(esc_owner);
    free(esc_repo);
    if (rc != E_OK) {
        free(project);
        return cli_api_fail(rc, &err);
    }
    if (ctx->output != CLI_OUTPUT_TABLE) {
        cli_print_object(ctx, raw, ans);
    } else if (json_array_size(json_object_get(ans, "comments")) == 0) {
        printf("%s#%lld has no comments yet\n", project, number);
    } else {
        json_array_foreach(json_object_get(ans, "comments"), i, c)
        {
            print_comment(c);
        }
    }
    json_decref(ans);
    free(raw);
    free(project);
    return CLI_EXIT_OK;
}
