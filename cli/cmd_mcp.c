/* SPDX-License-Identifier: Apache-2.0 */
/* `diverge mcp`: the JSON-RPC 2.0 side of the MCP stdio transport. One message per
 * line in, one reply per request out; notifications and stray responses are never
 * answered; stdout carries nothing but protocol messages (diagnostics go to stderr).
 * The tools themselves are in cmd_mcp_tools.c. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/mcp.h"
#include "common/version.h"

/* Protocol versions we speak, newest first: a client asking for one of them gets it,
 * any other gets the newest (the client then decides whether it can go on). */
static const char *const mcp_versions[] = {"2025-06-18", "2025-03-26", "2024-11-05"};

#define MCP_INSTRUCTIONS                                                                           \
    "Diverge runs autonomous coding agents as AgentTasks with budgets. Create a task with "        \
    "diverge_create_task, watch it with diverge_task_status or diverge_list_tasks, steer it "      \
    "with diverge_guide_task, and stop or continue it with diverge_pause_task and "                \
    "diverge_resume_task (which can raise the budget); diverge_delete_task removes one. Money "    \
    "amounts are decimal strings "                                                                 \
    "such as \"5.00\"."

void cli_mcp_init(struct cli_mcp *m, const struct cli_ctx *ctx)
{
    memset(m, 0, sizeof(*m));
    m->ctx = ctx;
}

/* An error reply. ID (borrowed) may be NULL: the reply then carries "id": null. */
static json_t *rpc_error(const json_t *id, int code, const char *message)
{
    json_t *r = json_pack("{s:s, s:O?, s:{s:i, s:s}}", "jsonrpc", "2.0", "id", id, "error", "code",
                          code, "message", message);
    ASSERT(r != NULL);
    return r;
}

/* A result reply; takes RESULT. */
static json_t *rpc_result(const json_t *id, json_t *result)
{
    json_t *r = json_pack("{s:s, s:O, s:o}", "jsonrpc", "2.0", "id", id, "result", result);
    ASSERT(r != NULL);
    return r;
}

static json_t *do_initialize(struct cli_mcp *m, const json_t *id, const json_t *params)
{
    const char *asked = json_string_value(json_object_get(params, "protocolVersion"));
    const char *chosen = mcp_versions[0];
    json_t *result;

    if (!json_is_object(params) || asked == NULL) {
        return rpc_error(id, CLI_MCP_INVALID_PARAMS,
                         "invalid params: initialize needs a protocolVersion string");
    }
    for (size_t i = 0; i < ARRAY_LEN(mcp_versions); i++) {
        if (strcmp(asked, mcp_versions[i]) == 0) {
            chosen = mcp_versions[i];
        }
    }
    snprintf(m->version, sizeof(m->version), "%s", chosen);
    result = json_pack("{s:s, s:{s:{s:b}}, s:{s:s, s:s, s:s}, s:s}", "protocolVersion", chosen,
                       "capabilities", "tools", "listChanged", 0, "serverInfo", "name", "diverge",
                       "title", "Diverge agent tasks", "version", DIVERGE_VERSION, "instructions",
                       MCP_INSTRUCTIONS);
    ASSERT(result != NULL);
    return rpc_result(id, result);
}

static json_t *do_tools_call(struct cli_mcp *m, const json_t *id, const json_t *params)
{
    const char *name = json_string_value(json_object_get(params, "name"));
    const json_t *args = json_object_get(params, "arguments");
    json_t *empty = NULL, *result;

    if (!json_is_object(params) || name == NULL) {
        return rpc_error(id, CLI_MCP_INVALID_PARAMS, "invalid params: tools/call needs a name");
    }
    if (args != NULL && !json_is_null(args) && !json_is_object(args)) {
        return rpc_error(id, CLI_MCP_INVALID_PARAMS,
                         "invalid params: tools/call arguments must be an object");
    }
    if (args == NULL || json_is_null(args)) {
        args = empty = json_object();
    }
    result = cli_mcp_tool_call(m, name, args);
    json_decref(empty);
    if (result == NULL) {
        return rpc_error(id, CLI_MCP_INVALID_PARAMS, "unknown tool (see tools/list)");
    }
    return rpc_result(id, result);
}

/* A JSON-RPC id we accept: a string or an integer (MCP forbids null). */
static bool valid_id(const json_t *id)
{
    return json_is_string(id) || json_is_integer(id);
}

static json_t *do_ping(struct cli_mcp *m, const json_t *id, const json_t *params)
{
    (void)m;
    (void)params;
    return rpc_result(id, json_object());
}

static json_t *do_tools_list(struct cli_mcp *m, const json_t *id, const json_t *params)
{
    (void)m;
    (void)params;
    return rpc_result(id, cli_mcp_tools_list());
}

/* The request methods we answer; anything else gets "method not found". */
static const struct {
    const char *name;
    json_t *(*handler)(struct cli_mcp *m, const json_t *id, const json_t *params);
} mcp_methods[] = {
    {.name = "initialize", .handler = do_initialize},
    {.name = "ping", .handler = do_ping},
    {.name = "tools/list", .handler = do_tools_list},
    {.name = "tools/call", .handler = do_tools_call},
};

/* True for a response object (a result or error with a valid id and no method). */
static bool is_response(const json_t *msg, const json_t *id)
{
    return json_object_get(msg, "method") == NULL && valid_id(id) &&
           (json_object_get(msg, "result") != NULL || json_object_get(msg, "error") != NULL);
}

/* True when MSG (an object) is a well-formed JSON-RPC 2.0 request or notification. */
static bool is_request_shape(const json_t *msg)
{
    const json_t *id = json_object_get(msg, "id"), *params = json_object_get(msg, "params");
    const char *version = json_string_value(json_object_get(msg, "jsonrpc"));

    return version != NULL && strcmp(version, "2.0") == 0 &&
           json_string_value(json_object_get(msg, "method")) != NULL &&
           (id == NULL || valid_id(id)) &&
           (params == NULL || json_is_object(params) || json_is_array(params));
}

/* A notification: acted on where it matters, never answered. */
static void handle_notification(struct cli_mcp *m, const char *method)
{
    if (strcmp(method, "notifications/initialized") == 0) {
        m->initialized = true;
    }
}

static json_t *dispatch(struct cli_mcp *m, const char *method, const json_t *id,
                        const json_t *params)
{
    for (size_t i = 0; i < ARRAY_LEN(mcp_methods); i++) {
        if (strcmp(method, mcp_methods[i].name) == 0) {
            return mcp_methods[i].handler(m, id, params);
        }
    }
    return rpc_error(id, CLI_MCP_METHOD_NOT_FOUND, "method not found");
}

/* Handles one message object (or anything else found where one should be). Returns the
 * reply, or NULL for none. */
static json_t *handle_message(struct cli_mcp *m, const json_t *msg)
{
    const json_t *id = json_object_get(msg, "id");
    const char *method = json_string_value(json_object_get(msg, "method"));

    if (!json_is_object(msg)) {
        return rpc_error(NULL, CLI_MCP_INVALID_REQUEST,
                         "invalid request: a message must be a JSON-RPC 2.0 object");
    }
    if (is_response(msg, id)) {
        return NULL; /* we send no requests, so it answers nothing of ours */
    }
    if (!is_request_shape(msg)) {
        return rpc_error(valid_id(id) ? id : NULL, CLI_MCP_INVALID_REQUEST,
                         "invalid request: need jsonrpc \"2.0\", a method string, a string or "
                         "integer id, and object params");
    }
    if (id == NULL) {
        handle_notification(m, method);
        return NULL;
    }
    return dispatch(m, method, id, json_object_get(msg, "params"));
}

/* A batch (JSON-RPC 2.0; MCP 2025-03-26): the replies as an array, NULL when none. */
static json_t *handle_batch(struct cli_mcp *m, const json_t *batch)
{
    json_t *replies, *r;
    size_t i;
    const json_t *msg;

    if (json_array_size(batch) == 0) {
        return rpc_error(NULL, CLI_MCP_INVALID_REQUEST, "invalid request: empty batch");
    }
    replies = json_array();
    json_array_foreach(batch, i, msg)
    {
        r = handle_message(m, msg);
        if (r != NULL) {
            json_array_append_new(replies, r);
        }
    }
    if (json_array_size(replies) == 0) {
        json_decref(replies);
        return NULL;
    }
    return replies;
}

static bool is_blank(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') {
            return false;
        }
    }
    return true;
}

char *cli_mcp_handle(struct cli_mcp *m, const char *line, size_t len)
{
    json_error_t jerr;
    json_t *msg, *reply;
    char *text;

    if (len > CLI_MCP_MAX_LINE) {
        reply =
            rpc_error(NULL, CLI_MCP_INVALID_REQUEST, "invalid request: message longer than 1 MiB");
    } else if (is_blank(line, len)) {
        return NULL;
    } else {
        msg = json_loadb(line, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
        if (msg == NULL) {
            reply = rpc_error(NULL, CLI_MCP_PARSE_ERROR, "parse error: not valid JSON");
        } else if (json_is_array(msg)) {
            reply = handle_batch(m, msg);
        } else {
            reply = handle_message(m, msg);
        }
        json_decref(msg);
    }
    if (reply == NULL) {
        return NULL;
    }
    text = json_dumps(reply, JSON_COMPACT);
    ASSERT(text != NULL);
    json_decref(reply);
    return text;
}

/* Handles the complete line in LINE (overlong: its first part was dropped) and writes
 * the reply. E_FAIL when stdout is gone. */
static int answer(struct cli_mcp *m, struct buf *line, bool overlong)
{
    size_t len = line->len;
    char *reply;
    int rc = E_OK;

    if (len > 0 && line->data[len - 1] == '\r') {
        len--;
    }
    reply = cli_mcp_handle(m, line->data != NULL ? line->data : "",
                           overlong ? (size_t)CLI_MCP_MAX_LINE + 1 : len);
    if (reply != NULL) {
        if (fputs(reply, stdout) == EOF || fputc('\n', stdout) == EOF || fflush(stdout) != 0) {
            rc = E_FAIL;
        }
        free(reply);
    }
    buf_cleanup(line);
    buf_init(line, 0);
    return rc;
}

/* The line being read: its bytes so far, or, once it grew past the limit, only the fact. */
struct line_reader {
    struct buf line;
    bool overlong;
};

/* Adds SEG bytes at P to the line being read, dropping the line once it grows too long. */
static void take_segment(struct line_reader *r, const char *p, size_t seg)
{
    if (!r->overlong && r->line.len + seg > CLI_MCP_MAX_LINE) {
        r->overlong = true; /* keep nothing more of this line */
        buf_cleanup(&r->line);
        buf_init(&r->line, 0);
    }
    if (!r->overlong) {
        buf_append(&r->line, p, seg);
    }
}

/* Splits the N bytes at DATA into lines, answering each complete one. E_FAIL when stdout
 * is gone. */
static int feed(struct cli_mcp *m, struct line_reader *r, const char *data, size_t n)
{
    size_t off = 0;
    int rc = E_OK;

    while (rc == E_OK && off < n) {
        const char *nl = memchr(data + off, '\n', n - off);
        size_t seg = (nl != NULL ? (size_t)(nl - data) : n) - off;

        take_segment(r, data + off, seg);
        off += seg;
        if (nl != NULL) {
            off++;
            rc = answer(m, &r->line, r->overlong);
            r->overlong = false;
        }
    }
    return rc;
}

/* read(2) retried on EINTR: the byte count, 0 at end of input, -1 on error (reported). */
static ssize_t read_some(int fd, char *data, size_t size)
{
    for (;;) {
        ssize_t n = read(fd, data, size);

        if (n >= 0) {
            return n;
        }
        if (errno != EINTR) {
            cli_errorf("mcp: reading stdin: %s", strerror(errno));
            return -1;
        }
    }
}

/* Reads lines from FD until end of input (or stdout closes), answering each. */
static int serve_fd(struct cli_mcp *m, int fd)
{
    static char chunk[64 * 1024];
    struct line_reader r = {.overlong = false};
    int rc = E_OK;

    buf_init(&r.line, 0);
    while (rc == E_OK) {
        ssize_t n = read_some(fd, chunk, sizeof(chunk));

        if (n <= 0) {
            break;
        }
        rc = feed(m, &r, chunk, (size_t)n);
    }
    if (rc == E_OK && (r.line.len > 0 || r.overlong)) {
        rc = answer(m, &r.line, r.overlong); /* a last line without its newline */
    }
    buf_cleanup(&r.line);
    return rc;
}

int cli_mcp_run(struct cli_ctx *ctx, const struct cli_args *args)
{
    struct cli_mcp m;

    (void)args;
    /* A client that goes away must end us through a failed write, not a signal. */
    signal(SIGPIPE, SIG_IGN);
    cli_mcp_init(&m, ctx);
    fprintf(stderr, "diverge mcp: serving MCP on stdio for %s%s\n", ctx->server,
            ctx->token == NULL ? " (no API token: tools will be refused)" : "");
    if (serve_fd(&m, STDIN_FILENO) != E_OK) {
        return CLI_EXIT_FAILED;
    }
    return CLI_EXIT_OK;
}
