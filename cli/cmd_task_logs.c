/* SPDX-License-Identifier: Apache-2.0 */
/* `task token` (GET …/agenttasks/{name}/token, text/plain) and `task logs [-f]`
 * (GET …/agenttasks/{name}/log, text/plain; -f follows until the task finishes). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli_int.h"
#include "common/httpc.h"

static int write_chunk(const char *data, size_t len, void *userdata)
{
    (void)userdata;
    if (fwrite(data, 1, len, stdout) != len || fflush(stdout) != 0) {
        return E_FAIL; /* stdout closed (e.g. a pipe into head): stop quietly */
    }
    return E_OK;
}

/* -f: streams GET …/log?follow=true until the server ends it (the task finished).
 * Ctrl-C only ends this process: the task is left alone. */
static int follow(const struct cli_ctx *ctx, const char *path, struct err *err)
{
    struct httpc_request req = HTTPC_REQUEST_DEFAULTS;
    struct httpc_response resp;
    char *url = xasprintf("%s%s?follow=true", ctx->server, path);
    char *auth = ctx->token != NULL ? xasprintf("Authorization: Bearer %s", ctx->token) : NULL;
    const char *headers[] = {"Accept: text/plain", auth, NULL};
    struct err herr = {0};
    int rc;

    req.url = url;
    req.headers = headers;
    req.timeout_ms = 0;
    rc = httpc_stream(&resp, &req, write_chunk, NULL, &herr);
    if (rc == E_AGAIN) {
        rc = err_set(err, E_AGAIN, "cannot reach the server at %s: %s", ctx->server, herr.msg);
    } else if (rc == E_OK && (resp.status < 200 || resp.status > 299)) {
        json_t *j =
            json_loadb(resp.body.data != NULL ? resp.body.data : "", resp.body.len, 0, NULL);
        const char *msg = json_string_value(json_object_get(j, "message"));
        rc = err_set(err, resp.status == 404 ? E_NOTFOUND : E_FAIL, "%s",
                     msg != NULL ? msg : "the server refused the log request");
        json_decref(j);
    } else if (rc != E_OK && rc != E_FAIL) {
        rc = err_set(err, rc, "GET %s: %s", ctx->server, herr.msg);
    } else {
        rc = E_OK;
    }
    httpc_response_cleanup(&resp);
    free(url);
    free(auth);
    return rc;
}

int cli_task_logs(struct cli_ctx *ctx, const struct cli_args *args)
{
    char *base = cli_task_path(ctx, args->pos[0], false);
    char *path = xasprintf("%s/log", base);
    char *text = NULL;
    struct err err = {0};
    int rc;

    free(base);
    if (cli_args_has(args, CLI_OPT_FOLLOW)) {
        rc = follow(ctx, path, &err);
    } else {
        rc = cli_api_call(NULL, &text, ctx, "GET", path, NULL, NULL, &err);
        if (rc == E_OK) {
            fputs(text, stdout);
        }
        free(text);
    }
    free(path);
    return rc != E_OK ? cli_api_fail(rc, &err) : CLI_EXIT_OK;
}

/* How many 100 ms waits `task token` makes for a token not minted yet: 100 (10 s), or
 * DIVERGE_TOKEN_WAIT_MS (0 to 600000) rounded up, so that a test expecting "no token yet"
 * need not wait the 10 s (docs/testing.md). */
static int token_wait_tries(void)
{
    const char *v = getenv("DIVERGE_TOKEN_WAIT_MS");
    char *end = NULL;
    long ms;

    if (v == NULL || *v < '0' || *v > '9') {
        return 100;
    }
    ms = strtol(v, &end, 10);
    if (*end != '\0' || ms > 600000) {
        return 100;
    }
    return (int)((ms + 99) / 100);
}

int cli_task_token(struct cli_ctx *ctx, const struct cli_args *args)
{
    char *base = cli_task_path(ctx, args->pos[0], false);
    char *path = xasprintf("%s/token", base);
    char *text = NULL;
    struct err err = {0};
    int rc = cli_api_call(NULL, &text, ctx, "GET", path, NULL, NULL, &err);

    /* Right after `task create` the controller has not minted the token yet (it does when
     * the task starts, a moment later): wait for it, up to 10 s (token_wait_tries), instead
     * of failing. */
    int tries = token_wait_tries();

    for (int i = 0; i < tries && rc == E_NOTFOUND && strstr(err.msg, "no token yet") != NULL; i++) {
        const struct timespec pause = {.tv_sec = 0, .tv_nsec = 100 * 1000 * 1000};

        nanosleep(&pause, NULL);
        free(text);
        text = NULL;
        err = (struct err){0};
        rc = cli_api_call(NULL, &text, ctx, "GET", path, NULL, NULL, &err);
    }
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
