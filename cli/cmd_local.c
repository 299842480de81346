/* SPDX-License-Identifier: Apache-2.0 */
/* `diverge local comment OWNER/REPO#N "<text>" [--as USER] [--permission P]`,
 * `diverge local thread OWNER/REPO#N`, `diverge local pr open OWNER/REPO#N --repo URL
 * --head BRANCH [--base main]` and `diverge local demo` (cmd_local_demo.c) (SPEC §10):
 * the offline SCM, where a comment goes through the same inbox, bot, controller and
 * notifier as a webhook, on a PR that may be bound to a real git repository. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_int.h"
#include "common/httpc.h"

#define LOCAL_USAGE_TAIL                                                                           \
    "OWNER/REPO#N names a pull request of the local SCM, e.g. myorg/checkout#7.\n" CLI_GLOBAL_HELP

static int cmd_comment(struct cli_ctx *ctx, const struct cli_args *args);
static int cmd_thread(struct cli_ctx *ctx, const struct cli_args *args);
static int cmd_pr_main(int argc, char **argv);
static int cmd_pr_open(struct cli_ctx *ctx, const struct cli_args *args);

#define PR_OPEN_USAGE                                                                              \
    "Usage: diverge local pr open OWNER/REPO#N --repo URL --head BRANCH [--base main]\n\n"         \
    "Binds a local pull request to a git repository: `/diverge fix ...` commented on it\n"         \
    "makes a task that clones URL at the base branch, works on the head branch and\n"              \
    "pushes it there. Opening it again with other values rebinds it.\n\n"                          \
    "Options:\n"                                                                                   \
    "  --repo URL          the repository: file:///absolute/path or https://...\n"                 \
    "  --head BRANCH       the PR's head branch: the task's working branch\n"                      \
    "  --base BRANCH       the branch the PR targets (default main); its\n"                        \
    "                      .diverge/agent.yaml configures the task\n\n" LOCAL_USAGE_TAIL

static const struct cli_cmd pr_cmds[] = {
    {"open", 1, 1, NULL, cmd_pr_open,
     CLI_OPT_BIT(CLI_OPT_REPO) | CLI_OPT_BIT(CLI_OPT_HEAD) | CLI_OPT_BIT(CLI_OPT_BASE),
     PR_OPEN_USAGE},
};

static const char pr_usage[] = "Usage: diverge local pr COMMAND\n\n"
                               "Commands:\n"
                               "  open OWNER/REPO#N --repo URL --head BRANCH [--base main]\n"
                               "                      bind a local PR to a git repository\n";

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
    {"pr", 0, 0, cmd_pr_main, NULL, 0, NULL},
    {"demo", 0, 0, NULL, cli_local_demo, 0,
     "Usage: diverge local demo\n\n"
     "Creates a small example repository (a failing test the demo agent fixes) under the\n"
     "data dir ($DIVERGE_DATA_DIR, default ./var: the server's), opens the local PR\n"
     "demo/greeting#1 on it and prints the commands to try next. Run again, it says the\n"
     "repository exists and prints the same steps.\n" CLI_GLOBAL_HELP},
};

static const char local_usage[] =
    "Usage: diverge local COMMAND\n\n"
    "The offline SCM: a pull-request thread kept by the server itself.\n\n"
    "Commands:\n"
    "  comment OWNER/REPO#N \"<text>\" [--as USER] [--permission P]\n"
    "  thread OWNER/REPO#N\n"
    "  pr open OWNER/REPO#N --repo URL --head BRANCH [--base main]\n"
    "  demo                an example repository and PR, and the next steps\n" CLI_GLOBAL_HELP;

int cli_local_main(int argc, char **argv)
{
    return cli_dispatch(local_cmds, ARRAY_LEN(local_cmds), "local", local_usage, argc - 1,
                        argv + 1);
}

static int cmd_pr_main(int argc, char **argv)
{
    return cli_dispatch(pr_cmds, ARRAY_LEN(pr_cmds), "local pr", pr_usage, argc - 1, argv + 1);
}

bool cli_local_parse_ref(char **project_out, long long *number_out, const char *ref)
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

    if (!cli_local_parse_ref(&project, &number, args->pos[0])) {
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
            printf("the bot answers in the thread: %s local thread %s#%lld\n", cli_program, project,
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
    char *text;
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
    text = cli_term_text(json_string_value(json_object_get(c, "body")));
    printf("\n%s\n\n", text);
    free(text);
}

static int cmd_thread(struct cli_ctx *ctx, const struct cli_args *args)
{
    char *project = NULL, *path, *esc_owner, *esc_repo, *slash, *raw = NULL;
    long long number;
    json_t *ans = NULL, *c;
    struct err err = {0};
    size_t i;
    int rc;

    if (!cli_local_parse_ref(&project, &number, args->pos[0])) {
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

/* Whether B is a branch name the server accepts (the same rule as server/api/api_local.c). */
static bool branch_ok(const char *b)
{
    size_t n = strlen(b);

    if (n == 0 || n > 200 || strchr("-/.", b[0]) != NULL || strchr("/.", b[n - 1]) != NULL) {
        return false;
    }
    if (strstr(b, "..") != NULL || strstr(b, "//") != NULL || strstr(b, "/.") != NULL ||
        (n >= 5 && strcmp(b + n - 5, ".lock") == 0)) {
        return false;
    }
    return strspn(b, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._/-") == n;
}

/* The usage problems of `pr open`; exit 2 with one line when there is one. */
static bool pr_args_ok(const char *url, const char *head, const char *base)
{
    if (url == NULL || url[0] == '\0') {
        cli_errorf("local pr open: --repo URL is required (file:///path or https://...)");
        return false;
    }
    if (strncmp(url, "file:///", 8) != 0 && strncmp(url, "https://", 8) != 0) {
        cli_errorf("local pr open: --repo must be a file:///absolute/path or https:// URL");
        return false;
    }
    if (head == NULL || head[0] == '\0') {
        cli_errorf("local pr open: --head BRANCH is required (the PR's branch)");
        return false;
    }
    if (!branch_ok(head) || !branch_ok(base)) {
        cli_errorf("local pr open: %s is not a branch name", branch_ok(head) ? "--base" : "--head");
        return false;
    }
    if (strcmp(head, base) == 0) {
        cli_errorf("local pr open: --head and --base must be different branches");
        return false;
    }
    return true;
}

int cli_local_pr_open(json_t **ans_out, char **raw_out, struct cli_ctx *ctx, const char *project,
                      long long number, const char *url, const char *head, const char *base)
{
    char *path, *esc_owner, *esc_repo, *owner = xstrdup(project), *slash = strchr(owner, '/');
    json_t *body;
    struct err err = {0};
    int rc;

    *slash = '\0';
    esc_owner = httpc_escape(owner);
    esc_repo = httpc_escape(slash + 1);
    path = xasprintf("/api/v1/local/pulls/%s/%s/%lld", esc_owner, esc_repo, number);
    body = json_pack("{s:s, s:s, s:s}", "repository", url, "head", head, "base", base);
    rc = cli_api_call(ans_out, raw_out, ctx, "PUT", path, "application/json", body, &err);
    json_decref(body);
    free(path);
    free(esc_owner);
    free(esc_repo);
    free(owner);
    return rc != E_OK ? cli_api_fail(rc, &err) : CLI_EXIT_OK;
}

static int cmd_pr_open(struct cli_ctx *ctx, const struct cli_args *args)
{
    const char *url = cli_args_value(args, CLI_OPT_REPO);
    const char *head = cli_args_value(args, CLI_OPT_HEAD);
    const char *base = cli_args_value(args, CLI_OPT_BASE);
    char *project = NULL, *raw = NULL;
    long long number;
    json_t *ans = NULL;
    int rc;

    if (base == NULL) {
        base = "main";
    }
    if (!cli_local_parse_ref(&project, &number, args->pos[0])) {
        return CLI_EXIT_USAGE;
    }
    if (!pr_args_ok(url, head, base)) {
        free(project);
        return CLI_EXIT_USAGE;
    }
    rc = cli_local_pr_open(&ans, &raw, ctx, project, number, url, head, base);
    if (rc == CLI_EXIT_OK && ctx->output != CLI_OUTPUT_TABLE) {
        cli_print_object(ctx, raw, ans);
    } else if (rc == CLI_EXIT_OK) {
        printf("local PR %s#%lld %s: %s -> %s of %s\n", project, number,
               json_is_true(json_object_get(ans, "created")) ? "opened" : "is open", head, base,
               url);
        printf("next: %s local comment %s#%lld \"/diverge fix <objective>\"\n", cli_program,
               project, number);
    }
    json_decref(ans);
    free(raw);
    free(project);
    return rc;
}
