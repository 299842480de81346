/* SPDX-License-Identifier: Apache-2.0 */
/* `diverge task`: the subverb table, `task init` and `task create`
 * (whose defaults come from ./.diverge/agent.yaml, flags overriding). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_int.h"
#include "common/config.h"
#include "common/money.h"

static const char task_usage[] =
    "Usage: diverge task COMMAND [options]\n"
    "\n"
    "Commands:\n"
    "  init                      write an example .diverge/agent.yaml\n"
    "  create OBJECTIVE --name N create a task (defaults from .diverge/agent.yaml)\n"
    "  list [-A]                 list tasks (-A: in every namespace)\n"
    "  status NAME               show one task\n"
    "  logs NAME [-f]            print the task's sandbox log\n"
    "  guide NAME HINT           give the agent guidance for its next heartbeat\n"
    "  pause NAME                suspend the task\n"
    "  resume NAME [--budget +USD] [--tokens N]\n"
    "                            raise the budgets, then resume the task\n"
    "  rerun NAME [--objective TEXT] [--budget +USD] [--tokens N]\n"
    "                            start a new run of a finished task\n"
    "  delete NAME               delete the task (sandbox stopped, files removed)\n"
    "  token NAME                print the task's current capability token\n"
    "\n"
    "Run 'diverge task COMMAND --help' for a command's options.\n" CLI_GLOBAL_HELP;

#define OPT(x_) CLI_OPT_BIT(CLI_OPT_##x_)

static const struct cli_cmd task_cmds[] = {
    {"init", 0, 0, NULL, cli_task_init, OPT(FORCE),
     "Usage: diverge task init [--force]\n\n"
     "Writes an example .diverge/agent.yaml in the current directory; an existing file is\n"
     "kept unless --force is given.\n" CLI_GLOBAL_HELP},
    {"create", 1, 1, NULL, cli_task_create,
     OPT(NAME) | OPT(BUDGET) | OPT(TOKENS) | OPT(MAX_ITERATIONS) | OPT(BASE_BRANCH) |
         OPT(WORKING_BRANCH) | OPT(REPO) | OPT(MODEL) | OPT(DRAFT_PR),
     "Usage: diverge task create OBJECTIVE --name NAME [options]\n\n"
     "Creates an AgentTask. Defaults come from ./.diverge/agent.yaml when present;\n"
     "flags override them.\n\n"
     "Options:\n"
     "  --name NAME               task name (a DNS label), required\n"
     "  --budget USD              spend limit, e.g. 5.00\n"
     "  --tokens N                token limit, e.g. 200000 (or 200k, 2M)\n"
     "  --max-iterations N        iteration limit\n"
     "  --base-branch B           branch to start from (server default: main)\n"
     "  --working-branch B        branch to push (server default: agent/NAME)\n"
     "  --repo URL                repository to clone\n"
     "  --model M                 allowed model, repeatable (replaces the file's list)\n"
     "  --draft-pr                open the pull request as a draft\n" CLI_GLOBAL_HELP},
    {"list", 0, 0, NULL, cli_task_list, OPT(ALL_NAMESPACES),
     "Usage: diverge task list [-A]\n\n"
     "Lists the tasks of the namespace, or of every namespace with "
     "-A/--all-namespaces.\n" CLI_GLOBAL_HELP},
    {"status", 1, 1, NULL, cli_task_status, 0,
     "Usage: diverge task status NAME\n\nShows one task: phase, spend, budgets, "
     "preview.\n" CLI_GLOBAL_HELP},
    {"logs", 1, 1, NULL, cli_task_logs, OPT(FOLLOW),
     "Usage: diverge task logs NAME [-f]\n\nPrints the sandbox log; -f follows "
     "it.\n" CLI_GLOBAL_HELP},
    {"guide", 2, 2, NULL, cli_task_guide, 0,
     "Usage: diverge task guide NAME HINT\n\n"
     "Sets the annotation divergedev.com/guidance; the agent receives it on its next\n"
     "heartbeat. An empty HINT removes the guidance.\n" CLI_GLOBAL_HELP},
    {"pause", 1, 1, NULL, cli_task_pause, 0,
     "Usage: diverge task pause NAME\n\nSets spec.suspended: the sandbox is suspended and "
     "its token revoked.\n" CLI_GLOBAL_HELP},
    {"resume", 1, 1, NULL, cli_task_resume, OPT(BUDGET) | OPT(TOKENS),
     "Usage: diverge task resume NAME [--budget +USD] [--tokens N]\n\n"
     "Adds the optional bumps to the effective budgets (spec value if set, else the\n"
     "server default 5.00 USD / 1000000 tokens), then clears spec.suspended.\n\n"
     "Options:\n"
     "  --budget +USD             add to the USD budget, e.g. +15.00\n"
     "  --tokens N                add to the token budget, e.g. 2000000 (or "
     "+2M)\n" CLI_GLOBAL_HELP},
    {"rerun", 1, 1, NULL, cli_task_rerun, OPT(OBJECTIVE) | OPT(BUDGET) | OPT(TOKENS),
     "Usage: diverge task rerun NAME [--objective TEXT] [--budget +USD] [--tokens N]\n\n"
     "Starts a new run of a Completed or Failed task (raises spec.run): it is Pending\n"
     "again, with iterations from 0. Its spend so far still counts against its budgets;\n"
     "--budget and --tokens raise them as `task resume` does.\n\n"
     "Options:\n"
     "  --objective TEXT          a new objective for the run\n"
     "  --budget +USD             add to the USD budget, e.g. +15.00\n"
     "  --tokens N                add to the token budget, e.g. 2000000\n" CLI_GLOBAL_HELP},
    {"delete", 1, 1, NULL, cli_task_delete, 0,
     "Usage: diverge task delete NAME\n\nDeletes the task: its sandbox is stopped, its token "
     "revoked and its\nfiles (workspace, log) removed. What was pushed stays "
     "pushed.\n" CLI_GLOBAL_HELP},
    {"token", 1, 1, NULL, cli_task_token, 0,
     "Usage: diverge task token NAME\n\nPrints the task's current capability "
     "token; waits up to 10 s (DIVERGE_TOKEN_WAIT_MS) for one not minted yet.\n" CLI_GLOBAL_HELP},
};

int cli_task_main(int argc, char **argv)
{
    return cli_dispatch(task_cmds, ARRAY_LEN(task_cmds), "task", task_usage, argc - 1, argv + 1);
}

int cli_task_init(struct cli_ctx *ctx, const struct cli_args *args)
{
    struct err err = {0};
    int rc;

    (void)ctx;
    rc = config_agent_write_example(CONFIG_AGENT_PATH, cli_args_has(args, CLI_OPT_FORCE), &err);
    if (rc == E_CONFLICT) {
        cli_errorf("%s (use --force to overwrite)", err.msg);
        return CLI_EXIT_FAILED;
    }
    if (rc != E_OK) {
        cli_errorf("%s", err.msg);
        return CLI_EXIT_FAILED;
    }
    printf("wrote %s\n", CONFIG_AGENT_PATH);
    return CLI_EXIT_OK;
}

static json_t *string_array(char *const *items, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) {
        json_array_append_new(a, json_string(items[i]));
    }
    return a;
}

/* The settings `task create` sends, from agent.yaml and then the flags. */
struct create_opts {
    int64_t budget_usd;     /* micro-dollars; -1: not set */
    int64_t budget_tokens;  /* -1: not set */
    int64_t max_iterations; /* -1: not set */
};

static int parse_count(int64_t *out, const char *flag, const char *s, int64_t max)
{
    char *end;
    long long v;

    if (s[0] < '0' || s[0] > '9') {
        cli_errorf("task create: %s: expected a non-negative integer, got \"%s\"", flag, s);
        return CLI_EXIT_USAGE;
    }
    v = strtoll(s, &end, 10);
    if (*end != '\0' || v > max) {
        cli_errorf("task create: %s: expected an integer from 0 to %lld, got \"%s\"", flag,
                   (long long)max, s);
        return CLI_EXIT_USAGE;
    }
    *out = v;
    return CLI_EXIT_OK;
}

/* Applies the numeric flags over the file's values. */
static int numeric_flags(struct create_opts *o, const struct cli_args *args)
{
    const char *budget = cli_args_value(args, CLI_OPT_BUDGET);
    const char *tokens = cli_args_value(args, CLI_OPT_TOKENS);
    const char *iters = cli_args_value(args, CLI_OPT_MAX_ITERATIONS);
    struct err err = {0};
    bool plus = false;

    if (budget != NULL && (money_parse(&o->budget_usd, &plus, budget, &err) != E_OK || plus)) {
        cli_errorf("task create: --budget: expected an amount such as 5.00, got \"%s\"", budget);
        return CLI_EXIT_USAGE;
    }
    if (tokens != NULL && cli_parse_tokens(&o->budget_tokens, tokens, false, &err) != E_OK) {
        cli_errorf("task create: --tokens: %s", err.msg);
        return CLI_EXIT_USAGE;
    }
    if (iters != NULL) {
        return parse_count(&o->max_iterations, "--max-iterations", iters, INT32_MAX);
    }
    return CLI_EXIT_OK;
}

static void set_str(json_t *obj, const char *key, const char *value)
{
    if (value != NULL) {
        json_object_set_new(obj, key, json_string(value));
    }
}

/* spec.repository from --repo, --base-branch (else the file's) and --working-branch. */
static void add_repository(json_t *spec, const struct cli_args *args,
                           const struct config_agent *cfg)
{
    json_t *repo = json_object();
    const char *base = cli_args_value(args, CLI_OPT_BASE_BRANCH);

    set_str(repo, "url", cli_args_value(args, CLI_OPT_REPO));
    set_str(repo, "baseBranch", base != NULL ? base : (cfg != NULL ? cfg->base_branch : NULL));
    set_str(repo, "workingBranch", cli_args_value(args, CLI_OPT_WORKING_BRANCH));
    if (json_object_size(repo) > 0) {
        json_object_set(spec, "repository", repo);
    }
    json_decref(repo);
}

static void add_models(json_t *spec, const struct cli_args *args, const struct config_agent *cfg)
{
    json_t *models;

    if (!cli_args_has(args, CLI_OPT_MODEL)) {
        if (cfg != NULL && cfg->has_capabilities) {
            json_object_set_new(spec, "capabilities",
                                string_array(cfg->capabilities, cfg->n_capabilities));
        }
        return;
    }
    models = json_array();
    for (int i = 0; i < args->nopt; i++) {
        if (args->opt[i].id == CLI_OPT_MODEL) {
            json_array_append_new(models, json_string(args->opt[i].value));
        }
    }
    json_object_set_new(spec, "capabilities", models);
}

static json_t *build_spec(const char *objective, const struct cli_args *args,
                          const struct config_agent *cfg, const struct create_opts *o)
{
    json_t *spec = json_object();
    char money[MONEY_STR_MAX];

    json_object_set_new(spec, "objective", json_string(objective));
    if (cli_args_has(args, CLI_OPT_DRAFT_PR)) {
        json_object_set_new(spec, "draftPR", json_true());
    }
    add_repository(spec, args, cfg);
    if (o->max_iterations >= 0) {
        json_object_set_new(spec, "maxIterations", json_integer(o->max_iterations));
    }
    if (o->budget_usd >= 0) {
        money_format(money, o->budget_usd);
        json_object_set_new(spec, "budgetUSD", json_string(money));
    }
    if (o->budget_tokens >= 0) {
        json_object_set_new(spec, "budgetTokens", json_integer(o->budget_tokens));
    }
    /* Tools, sandbox settings and the runner's commands (SPEC §10); --model wins over
     * the file's capabilities. */
    config_agent_apply_spec(spec, cfg);
    add_models(spec, args, cfg);
    return spec;
}

/* Loads ./.diverge/agent.yaml into *out (NULL when there is none). A broken file is a
 * usage error (exit 2), like a bad flag: the user has to fix their input. */
static int load_config(struct config_agent **out, struct create_opts *o)
{
    struct err err = {0};
    int rc = config_agent_load_file(out, CONFIG_AGENT_PATH, &err);

    if (rc == E_NOTFOUND) {
        return CLI_EXIT_OK;
    }
    if (rc != E_OK) {
        cli_errorf("%s", err.msg);
        return rc == E_FAIL ? CLI_EXIT_FAILED : CLI_EXIT_USAGE;
    }
    o->budget_usd = (*out)->has_budget_usd ? (*out)->budget_usd_micros : -1;
    o->budget_tokens = (*out)->has_budget_tokens ? (*out)->budget_tokens : -1;
    o->max_iterations = (*out)->has_max_iterations ? (*out)->max_iterations : -1;
    return CLI_EXIT_OK;
}

int cli_task_create(struct cli_ctx *ctx, const struct cli_args *args)
{
    const char *name = cli_args_value(args, CLI_OPT_NAME), *objective = args->pos[0];
    struct create_opts o = {.budget_usd = -1, .budget_tokens = -1, .max_iterations = -1};
    struct config_agent *cfg = NULL;
    json_t *task = NULL, *created = NULL;
    char *path = NULL, *raw = NULL;
    struct err err = {0};
    int rc;

    if (name == NULL || *name == '\0') {
        cli_errorf("task create: --name is required (see diverge task create --help)");
        return CLI_EXIT_USAGE;
    }
    if (*objective == '\0') {
        cli_errorf("task create: the objective must not be empty");
        return CLI_EXIT_USAGE;
    }
    rc = load_config(&cfg, &o);
    if (rc == CLI_EXIT_OK) {
        rc = numeric_flags(&o, args);
    }
    if (rc != CLI_EXIT_OK) {
        goto out;
    }
    task = json_pack("{s:s, s:s, s:{s:s, s:s}, s:o}", "apiVersion", "divergedev.com/v1alpha1",
                     "kind", "AgentTask", "metadata", "name", name, "namespace", ctx->ns, "spec",
                     build_spec(objective, args, cfg, &o));
    ASSERT(task != NULL);
    path = cli_task_path(ctx, NULL, false);
    rc = cli_api_call(&created, &raw, ctx, "POST", path, "application/json", task, &err);
    if (rc != E_OK) {
        rc = cli_api_fail(rc, &err);
        goto out;
    }
    if (ctx->output == CLI_OUTPUT_TABLE) {
        printf("agenttask.divergedev.com/%s created\n", name);
    } else {
        cli_print_object(ctx, raw, created);
    }
    rc = CLI_EXIT_OK;
out:
    config_agent_free(cfg);
    json_decref(task);
    json_decref(created);
    free(path);
    free(raw);
    return rc;
}
