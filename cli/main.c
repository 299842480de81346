/* SPDX-License-Identifier: Apache-2.0 */
/* The `diverge` binary: one table of verbs. `serve` is the server module's entry point;
 * everything else lives in cli_lib. */
#include <stdio.h>
#include <string.h>

#include "cli/cli_int.h"
#include "cli/mcp.h"
#include "common/version.h"
#ifdef DIVERGE_HAVE_SERVER
#include "server/server.h"
#endif

static const char usage[] =
    "Usage: diverge [global options] COMMAND [options]\n"
    "\n"
    "Commands:\n"
    "  serve      run the server (webhooks, task API, meter, controller, notifier)\n"
    "  task       create and manage agent tasks (init, create, list, status, logs, guide,\n"
    "             pause, resume, token)\n"
    "  quota      a project's spend quotas, used against their limits (list, status)\n"
    "  token      inspect a capability token\n"
    "  local      the offline SCM: open a PR on a repository, comment, read the thread;\n"
    "             `local demo` sets up an example\n"
    "  mcp        serve the Model Context Protocol on stdio (tools for IDE assistants)\n"
    "  kubeconfig print a kubeconfig for kubectl against the server's TLS listener\n"
    "  version    print the version (also --version)\n"
    "  help       show help for a command\n" CLI_GLOBAL_HELP "\n"
    "Exit codes: 0 success, 1 the operation failed, 2 usage error, 3 server unreachable.\n";

static int cmd_serve(int argc, char **argv)
{
#ifdef DIVERGE_HAVE_SERVER
    return server_main(argc, argv);
#else
    (void)argc;
    (void)argv;
    cli_errorf("serve: not built into this binary");
    return CLI_EXIT_FAILED;
#endif
}

static int cmd_version(struct cli_ctx *ctx, const struct cli_args *args)
{
    (void)ctx;
    (void)args;
    printf("diverge %s\n", DIVERGE_VERSION);
    return CLI_EXIT_OK;
}

static int cmd_help(struct cli_ctx *ctx, const struct cli_args *args);

static const struct cli_cmd commands[] = {
    {"serve", 0, 0, cmd_serve, NULL, 0, NULL},
    {"task", 0, 0, cli_task_main, NULL, 0, NULL},
    {"quota", 0, 0, cli_quota_main, NULL, 0, NULL},
    {"token", 0, 0, cli_token_main, NULL, 0, NULL},
    {"local", 0, 0, cli_local_main, NULL, 0, NULL},
    {"mcp", 0, 0, NULL, cli_mcp_run, 0, CLI_MCP_USAGE},
    {"kubeconfig", 0, 0, NULL, cli_kubeconfig, 0, CLI_KUBECONFIG_USAGE},
    {"version", 0, 0, NULL, cmd_version, 0, "Usage: diverge version\n\nPrints the version.\n"},
    {"help", 0, 2, NULL, cmd_help, 0,
     "Usage: diverge help [COMMAND [SUBCOMMAND]]\n\nShows help for a command.\n"},
};

/* `help X [Y]` is `X [Y] --help`. */
static int cmd_help(struct cli_ctx *ctx, const struct cli_args *args)
{
    char *argv[4];
    int n = 0;

    (void)ctx;
    if (args->npos == 0) {
        fputs(usage, stdout);
        return CLI_EXIT_OK;
    }
    /* argv entries are never written through; the cast only drops const for the
     * main()-style signature. */
    for (int i = 0; i < args->npos; i++) {
        argv[n++] = (char *)(uintptr_t)args->pos[i];
    }
    argv[n++] = (char *)(uintptr_t) "--help";
    return cli_dispatch(commands, ARRAY_LEN(commands), "", usage, n, argv);
}

int main(int argc, char **argv)
{
    if (argc > 0 && argv[0] != NULL && argv[0][0] != '\0') {
        cli_program = argv[0];
    }
    if (argc == 2 && strcmp(argv[1], "--version") == 0) {
        printf("diverge %s\n", DIVERGE_VERSION); /* as `diverge version` */
        return CLI_EXIT_OK;
    }
    return cli_dispatch(commands, ARRAY_LEN(commands), "", usage, argc - 1, argv + 1);
}
