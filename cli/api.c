/* SPDX-License-Identifier: Apache-2.0 */
/* The CLI's side of the task API (SPEC §3): resolving server and token, one function per
 * HTTP exchange, and turning the server's error bodies into one-line messages. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_int.h"
#include "common/httpc.h"

/* Lists can be long; a single object is far smaller. */
#define CLI_MAX_RESPONSE (64u << 20)
#define CLI_MAX_TOKEN_FILE 4096

/* The first line of the file PATH, whitespace-trimmed, or NULL when absent or empty. */
static char *read_token_file(const char *path)
{
    char line[CLI_MAX_TOKEN_FILE];
    FILE *f = fopen(path, "r");
    size_t len;

    if (f == NULL) {
        return NULL;
    }
    if (fgets(line, sizeof(line), f) == NULL) {
        line[0] = '\0';
    }
    fclose(f);
    len = strlen(line);
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' ' ||
                       line[len - 1] == '\t')) {
        line[--len] = '\0';
    }
    return len > 0 ? xstrdup(line) : NULL;
}

static char *resolve_token(const struct cli_args *args)
{
    const char *flag = cli_args_value(args, CLI_OPT_TOKEN), *env, *dir;
    char *path, *tok;

    if (flag != NULL) {
        return *flag != '\0' ? xstrdup(flag) : NULL; /* --token "": send none */
    }
    env = getenv("DIVERGE_API_TOKEN");
    if (env != NULL && *env != '\0') {
        return xstrdup(env);
    }
    dir = getenv("DIVERGE_DATA_DIR");
    path = xasprintf("%s/api-token", (dir != NULL && *dir != '\0') ? dir : "./var");
    tok = read_token_file(path);
    free(path);
    return tok;
}

int cli_ctx_init(struct cli_ctx *ctx, const struct cli_args *args, struct err *err)
{
    const char *server = cli_args_value(args, CLI_OPT_SERVER);
    const char *output = cli_args_value(args, CLI_OPT_OUTPUT);
    size_t len;

    memset(ctx, 0, sizeof(*ctx));
    if (server == NULL || *server == '\0') {
        server = getenv("DIVERGE_SERVER");
    }
    ctx->server = xstrdup(server != NULL && *server != '\0' ? server : CLI_DEFAULT_SERVER);
    len = strlen(ctx->server);
    while (len > 0 && ctx->server[len - 1] == '/') {
        ctx->server[--len] = '\0';
    }
    ctx->ns = cli_args_value(args, CLI_OPT_NAMESPACE);
    if (ctx->ns == NULL) {
        ctx->ns = CLI_DEFAULT_NAMESPACE;
    }
    if (*ctx->ns == '\0') {
        return err_set(err, E_INVALID, "the namespace must not be empty");
    }
    ctx->output = CLI_OUTPUT_TABLE;
    if (output != NULL && cli_output_parse(&ctx->output, output, err) != E_OK) {
        return E_INVALID;
    }
    ctx->all_namespaces = cli_args_has(args, CLI_OPT_ALL_NAMESPACES);
    ctx->token = resolve_token(args);
    for (const char *p = ctx->token; p != NULL && *p != '\0'; p++) {
        /* It goes into a header line. */
        if ((unsigned char)*p < 0x20 || *p == 0x7f) {
            return err_set(err, E_INVALID, "the API token contains control characters");
        }
    }
    return E_OK;
}

void cli_ctx_cleanup(struct cli_ctx *ctx)
{
    free(ctx->server);
    free(ctx->token);
    ctx->server = NULL;
    ctx->token = NULL;
}

char *cli_resource_path(const struct cli_ctx *ctx, const char *plural, const char *name, bool all)
{
    char *ns, *n, *path;

    if (all) {
        return xasprintf(CLI_API_BASE "/%s", plural);
    }
    ns = httpc_escape(ctx->ns);
    if (name == NULL) {
        path = xasprintf(CLI_API_BASE "/namespaces/%s/%s", ns, plural);
    } else {
        n = httpc_escape(name);
        path = xasprintf(CLI_API_BASE "/namespaces/%s/%s/%s", ns, plural, n);
        free(n);
    }
    free(ns);
    return path;
}

char *cli_task_path(const struct cli_ctx *ctx, const char *name, bool all)
{
    return cli_resource_path(ctx, "agenttasks", name, all);
}

/* The server's message: metav1.Status "message", else our {"error": ...}. */
static int error_from_response(const struct cli_ctx *ctx, const struct httpc_response *resp,
                               struct err *err)
{
    int code = httpc_status_err(resp->status);
    json_t *j = json_loadb(resp->body.data != NULL ? resp->body.data : "", resp->body.len, 0, NULL);
    const char *msg = cli_json_str(j, "message");
    int rc;

    if (msg == NULL || *msg == '\0') {
        msg = cli_json_str(j, "error");
    }
    if (msg != NULL && *msg != '\0') {
        rc = err_set(err, code, "%s%s", msg,
                     (resp->status == 401 && ctx->token == NULL)
                         ? " (no API token: use --token or DIVERGE_API_TOKEN)"
                         : "");
    } else {
        rc = err_set(err, code, "the server answered HTTP %ld", resp->status);
    }
    json_decref(j);
    return rc;
}

int cli_api_call(json_t **obj_out, char **raw_out, const struct cli_ctx *ctx, const char *method,
                 const char *path, const char *content_type, const json_t *body, struct err *err)
{
    struct httpc_request req = HTTPC_REQUEST_DEFAULTS;
    struct httpc_response resp;
    struct err herr = {0};
    const char *headers[4] = {"Accept: application/json", NULL, NULL, NULL};
    char *url = xasprintf("%s%s", ctx->server, path), *auth = NULL, *ctype = NULL;
    char *text = NULL;
    json_error_t jerr;
    size_t nh = 1;
    int rc;

    if (obj_out != NULL) {
        *obj_out = NULL;
    }
    if (raw_out != NULL) {
        *raw_out = NULL;
    }
    if (obj_out == NULL) {
        headers[0] = "Accept: text/plain, application/json";
    }
    if (ctx->token != NULL) {
        auth = xasprintf("Authorization: Bearer %s", ctx->token);
        headers[nh++] = auth;
    }
    if (body != NULL) {
        text = json_dumps(body, JSON_COMPACT);
        ASSERT(text != NULL);
        ctype = xasprintf("Content-Type: %s", content_type);
        headers[nh++] = ctype;
    }
    req.method = method;
    req.url = url;
    req.headers = headers;
    req.body = text;
    req.body_len = text != NULL ? strlen(text) : 0;
    req.max_body = CLI_MAX_RESPONSE;
    rc = httpc_request(&resp, &req, &herr);
    if (rc == E_AGAIN) {
        rc = err_set(err, E_AGAIN, "cannot reach the server at %s: %s", ctx->server, herr.msg);
    } else if (rc != E_OK) {
        rc = err_set(err, rc, "%s %s: %s", method, ctx->server, herr.msg);
    } else if (resp.status < 200 || resp.status > 299) {
        rc = error_from_response(ctx, &resp, err);
    } else if (obj_out == NULL) {
        *raw_out = buf_take(&resp.body);
    } else {
        *obj_out = json_loadb(resp.body.data != NULL ? resp.body.data : "", resp.body.len,
                              JSON_DECODE_ANY, &jerr);
        if (*obj_out == NULL) {
            rc = err_set(err, E_FAIL, "the server's answer is not JSON: %s", jerr.text);
        } else if (raw_out != NULL) {
            *raw_out = buf_take(&resp.body);
        }
    }
    httpc_response_cleanup(&resp);
    free(url);
    free(auth);
    free(ctype);
    free(text);
    return rc;
}

int cli_api_fail(int rc, const struct err *err)
{
    cli_errorf("%s", err->msg);
    return rc == E_AGAIN ? CLI_EXIT_UNREACHABLE : CLI_EXIT_FAILED;
}

void cli_print_object(const struct cli_ctx *ctx, const char *raw, const json_t *obj)
{
    struct buf b;

    buf_init(&b, 0);
    if (ctx->output == CLI_OUTPUT_YAML) {
        cli_yaml_emit(&b, obj);
    } else {
        cli_json_pretty(&b, raw, strlen(raw));
    }
    fwrite(b.data, 1, b.len, stdout);
    buf_cleanup(&b);
}

const json_t *cli_json_at(const json_t *obj, const char *path)
{
    const char *p = path;

    while (obj != NULL && *p != '\0') {
        const char *dot = strchr(p, '.');
        size_t len = dot != NULL ? (size_t)(dot - p) : strlen(p);
        obj = json_is_object(obj) ? json_object_getn(obj, p, len) : NULL;
        p += len + (dot != NULL ? 1 : 0);
    }
    return obj;
}

const char *cli_json_str(const json_t *obj, const char *path)
{
    return json_string_value(cli_json_at(obj, path));
}
