/* SPDX-License-Identifier: Apache-2.0 */
/* `task token` (GET …/agenttasks/{name}/token, text/plain) and `task logs`, which waits
 * for the sandbox log route of the server (no sandbox provider writes logs yet). */
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli_int.h"

int cli_task_logs(struct cli_ctx *ctx, const struct cli_args *args)
{
    (void)ctx;
    (void)args;
    /* TODO(#5): the server has no /log route until a sandbox provider writes logs. */
    cli_errorf("task logs: this server has no sandbox logs (no sandbox provider writes them yet)");
    return CLI_EXIT_FAILED;
}

int cli_task_token(struct cli_ctx *ctx, const struct cli_args *args)
{
    char *base = cli_task_path(ctx, args->pos[0], false);
    char *path = xasprintf("%s/token", base);
    char *text = NULL;
    struct err err = {0};
    int rc = cli_api_call(NULL, &text, ctx, "GET", path, NULL, NULL, &err);

    free(base);
    free(path);
    if (rc != E_OK) {
        return cli_api_fail(rc, &err);
    }
    fputs(text, stdout);
    fputc('\n', stdout);
    free(text);
    return CLI_EXIT_OK;
}
