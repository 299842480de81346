/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of common/config (agent.yaml: every error path with its line and key) and
 * common/httpc (against a one-shot HTTP server on a loopback thread). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "common/config.h"
#include "common/httpc.h"
#include "tests/t_check.h"

#define NAME ".diverge/agent.yaml"

static int load(struct config_agent **out, const char *yaml, struct err *err)
{
    return config_agent_load_mem(out, NAME, yaml, strlen(yaml), err);
}

TEST(example_loads_with_every_field)
{
    struct config_agent *c = NULL;
    struct err err = {0};

    CHECK_OK(load(&c, config_agent_example(), &err));
    if (c == NULL) {
        return;
    }
    CHECK_EQ_INT(c->n_capabilities, 2);
    CHECK_EQ_STR(c->capabilities[0], "claude-3-7-sonnet");
    CHECK_EQ_STR(c->capabilities[1], "gemini-2.5-pro");
    CHECK_EQ_INT(c->n_allowed_tools, 2);
    CHECK_EQ_STR(c->allowed_tools[1], "go");
    CHECK(c->has_budget_usd);
    CHECK_EQ_INT(c->budget_usd_micros, 5000000);
    CHECK_EQ_INT(c->budget_tokens, 200000);
    CHECK_EQ_INT(c->max_iterations, 8);
    CHECK_EQ_STR(c->base_branch, "main");
    CHECK_EQ_STR(c->sandbox_provider, "local");
    CHECK_EQ_INT(c->sandbox_timeout_s, 1800);
    CHECK_EQ_STR(c->sandbox_network, "none");
    CHECK(c->command == NULL && c->verify_command == NULL && !c->has_allowed_hosts);
    config_agent_free(c);
}

TEST(runner_commands_and_network)
{
    static const char yaml[] = "version: \"1\"\n"
                               "agent:\n"
                               "  command: sh .diverge/demo-agent.sh\n"
                               "  verifyCommand: \"sh test.sh\"\n"
                               "sandbox:\n"
                               "  network: proxy\n"
                               "  allowedHosts:\n"
                               "    - api.anthropic.com\n"
                               "    - \"*.example.com:8443\"\n";
    struct config_agent *c = NULL;
    json_t *spec = json_object();
    char *text;

    CHECK_OK(load(&c, yaml, NULL));
    if (c == NULL) {
        json_decref(spec);
        return;
    }
    CHECK_EQ_STR(c->command, "sh .diverge/demo-agent.sh");
    CHECK_EQ_STR(c->verify_command, "sh test.sh");
    CHECK_EQ_STR(c->sandbox_network, "proxy");
    CHECK(c->has_allowed_hosts);
    CHECK_EQ_INT(c->n_allowed_hosts, 2);
    CHECK_EQ_STR(c->allowed_hosts[1], "*.example.com:8443");
    /* What lands in a task's spec (SPEC §10). */
    config_agent_apply_spec(spec, c);
    text = json_dumps(spec, JSON_SORT_KEYS | JSON_COMPACT);
    CHECK_EQ_STR(text, "{\"runner\":{\"command\":\"sh .diverge/demo-agent.sh\","
                       "\"verifyCommand\":\"sh test.sh\"},\"sandbox\":{\"allowedHosts\":"
                       "[\"api.anthropic.com\",\"*.example.com:8443\"],\"network\":\"proxy\"}}");
    free(text);
    json_decref(spec);
    config_agent_free(c);
    /* NULL is a no-op. */
    spec = json_object();
    config_agent_apply_spec(spec, NULL);
    CHECK_EQ_INT(json_object_size(spec), 0);
    json_decref(spec);
}

TEST(minimal_file_has_nothing_set)
{
    static const char *const ok[] = {"version: \"1\"\n", "version: 1\n",
                                     "version: '1'\nagent:\nsandbox: ~\n"};
    for (size_t i = 0; i < ARRAY_LEN(ok); i++) {
        struct config_agent *c = NULL;
        CHECK_OK(load(&c, ok[i], NULL));
        if (c != NULL) {
            CHECK(!c->has_capabilities && !c->has_budget_usd && !c->has_budget_tokens);
            CHECK(!c->has_max_iterations && !c->has_sandbox_timeout);
            CHECK(c->base_branch == NULL && c->sandbox_provider == NULL);
        }
        config_agent_free(c);
    }
}

TEST(budget_forms)
{
    static const struct {
        const char *yaml;
        int64_t micros;
    } cases[] = {
        {"version: \"1\"\nagent:\n  budgetUSD: 5\n", 5000000},
        {"version: \"1\"\nagent:\n  budgetUSD: 5.00\n", 5000000},
        {"version: \"1\"\nagent:\n  budgetUSD: \"0.0225\"\n", 22500},
        {"version: \"1\"\nagent:\n  budgetUSD: '$12.5'\n", 12500000},
        {"version: \"1\"\nagent:\n  budgetUSD: 0\n", 0},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        struct config_agent *c = NULL;
        CHECK_OK(load(&c, cases[i].yaml, NULL));
        if (c != NULL) {
            CHECK(c->has_budget_usd);
            CHECK_EQ_INT(c->budget_usd_micros, cases[i].micros);
        }
        config_agent_free(c);
    }
}

TEST(anchors_and_empty_lists)
{
    struct config_agent *c = NULL;
    const char *y = "version: \"1\"\nagent:\n  capabilities: &m [a, b]\n  allowedTools: []\n";

    CHECK_OK(load(&c, y, NULL));
    if (c != NULL) {
        CHECK(c->has_allowed_tools);
        CHECK_EQ_INT(c->n_allowed_tools, 0);
        CHECK_EQ_INT(c->n_capabilities, 2);
    }
    config_agent_free(c);
}

/* Every way the loader refuses a file: the exact message (file, line, key) and field. */
TEST(errors_name_file_line_and_key)
{
#define V "version: \"1\"\n"
    static const struct {
        const char *yaml, *msg, *field;
    } bad[] = {
        {V "agent: [\n", NAME ":3: did not find expected node content while parsing a flow node",
         ""},
        {V "agent:\n\tx: 1\n",
         NAME ":3: found character that cannot start any token while "
              "scanning for the next token",
         ""},
        {"- a\n", NAME ":1: expected a mapping at the top level", ""},
        {"", NAME ":1: version: required (write version: \"1\")", "version"},
        {"# only a comment\n", NAME ":1: version: required (write version: \"1\")", "version"},
        {"agent: {}\n", NAME ":1: version: required (write version: \"1\")", "version"},
        {"version: \"2\"\n", NAME ":1: version: unsupported version (want \"1\")", "version"},
        {"version: [1]\n", NAME ":1: version: unsupported version (want \"1\")", "version"},
        {V "foo: 1\n", NAME ":2: foo: unknown key", "foo"},
        {V "agent: {\"a\\nb\": 1}\n", NAME ":2: agent.a?b: unknown key", "agent.a?b"},
        {V "agent:\n  budgetUsd: 5\n", NAME ":3: agent.budgetUsd: unknown key", "agent.budgetUsd"},
        {V "sandbox:\n  image: x\n", NAME ":3: sandbox.image: unknown key", "sandbox.image"},
        {V "version: \"1\"\n", NAME ":2: version: duplicate key", "version"},
        {V "agent:\n  maxIterations: 1\n  maxIterations: 2\n",
         NAME ":4: agent.maxIterations: duplicate key", "agent.maxIterations"},
        {V "? [a]\n: b\n", NAME ":2: mapping keys must be plain strings", ""},
        {V "agent:\n  ? {a: 1}\n  : b\n", NAME ":3: agent: mapping keys must be plain strings",
         "agent"},
        {V "agent: 5\n", NAME ":2: agent: expected a mapping", "agent"},
        {V "sandbox: [a]\n", NAME ":2: sandbox: expected a mapping", "sandbox"},
        {V "agent:\n  capabilities: a\n", NAME ":3: agent.capabilities: expected a list of strings",
         "agent.capabilities"},
        {V "agent:\n  allowedTools:\n    - git\n    - 1\n",
         NAME ":5: agent.allowedTools[1]: expected a string", "agent.allowedTools[1]"},
        {V "agent:\n  allowedTools: [[git]]\n", NAME ":3: agent.allowedTools[0]: expected a string",
         "agent.allowedTools[0]"},
        {V "agent:\n  capabilities: [\"\"]\n",
         NAME ":3: agent.capabilities[0]: expected a non-empty string", "agent.capabilities[0]"},
        {V "agent:\n  capabilities: [~]\n", NAME ":3: agent.capabilities[0]: expected a string",
         "agent.capabilities[0]"},
        {V "agent:\n  baseBranch: \"a\\0b\"\n",
         NAME ":3: agent.baseBranch: string contains a NUL byte", "agent.baseBranch"},
        {V "agent:\n  baseBranch: 123\n", NAME ":3: agent.baseBranch: expected a string",
         "agent.baseBranch"},
        {V "agent:\n  baseBranch: yes\n", NAME ":3: agent.baseBranch: expected a string",
         "agent.baseBranch"},
        {V "agent:\n  baseBranch:\n", NAME ":3: agent.baseBranch: expected a string",
         "agent.baseBranch"},
        {V "sandbox:\n  provider: [a]\n", NAME ":3: sandbox.provider: expected a string",
         "sandbox.provider"},
        {V "agent:\n  budgetUSD: abc\n",
         NAME ":3: agent.budgetUSD: expected a decimal amount such as \"5.00\": amount is not a "
              "decimal number of dollars",
         "agent.budgetUSD"},
        {V "agent:\n  budgetUSD: 1.0000001\n",
         NAME ":3: agent.budgetUSD: expected a decimal amount such as \"5.00\": amount has more "
              "than 6 decimals",
         "agent.budgetUSD"},
        {V "agent:\n  budgetUSD: true\n",
         NAME ":3: agent.budgetUSD: expected a decimal amount such as \"5.00\"", "agent.budgetUSD"},
        {V "agent:\n  budgetUSD: [5]\n",
         NAME ":3: agent.budgetUSD: expected a decimal amount such as \"5.00\"", "agent.budgetUSD"},
        {V "agent:\n  budgetUSD: \"+5\"\n",
         NAME ":3: agent.budgetUSD: expected an amount, not a '+' increment", "agent.budgetUSD"},
        {V "agent:\n  budgetTokens: -1\n",
         NAME ":3: agent.budgetTokens: expected a non-negative integer", "agent.budgetTokens"},
        {V "agent:\n  budgetTokens: \"100\"\n",
         NAME ":3: agent.budgetTokens: expected a non-negative integer", "agent.budgetTokens"},
        {V "agent:\n  budgetTokens: 1.5\n",
         NAME ":3: agent.budgetTokens: expected a non-negative integer", "agent.budgetTokens"},
        {V "agent:\n  budgetTokens: 0x10\n",
         NAME ":3: agent.budgetTokens: expected a non-negative integer", "agent.budgetTokens"},
        {V "agent:\n  budgetTokens: 010\n",
         NAME ":3: agent.budgetTokens: expected a non-negative integer without leading zeros",
         "agent.budgetTokens"},
        {V "agent:\n  budgetTokens: 99999999999999999999\n",
         NAME ":3: agent.budgetTokens: integer out of range (at most 9223372036854775807)",
         "agent.budgetTokens"},
        {V "agent:\n  maxIterations: 2147483648\n",
         NAME ":3: agent.maxIterations: integer out of range (at most 2147483647)",
         "agent.maxIterations"},
        {V "sandbox:\n  timeoutSeconds: {a: 1}\n",
         NAME ":3: sandbox.timeoutSeconds: expected a non-negative integer",
         "sandbox.timeoutSeconds"},
        {V "agent:\n  command: [sh, x]\n", NAME ":3: agent.command: expected a string",
         "agent.command"},
        {V "agent:\n  verifyCommand: \"\"\n",
         NAME ":3: agent.verifyCommand: expected a non-empty string", "agent.verifyCommand"},
        {V "agent:\n  agentCommand: x\n", NAME ":3: agent.agentCommand: unknown key",
         "agent.agentCommand"},
        {V "sandbox:\n  network: open\n", NAME ":3: sandbox.network: expected none or proxy",
         "sandbox.network"},
        {V "sandbox:\n  network: true\n", NAME ":3: sandbox.network: expected a string",
         "sandbox.network"},
        {V "sandbox:\n  allowedHosts: example.com\n",
         NAME ":3: sandbox.allowedHosts: expected a list of strings", "sandbox.allowedHosts"},
        {V "sandbox:\n  allowedHosts:\n    - a.com\n    - 443\n",
         NAME ":5: sandbox.allowedHosts[1]: expected a string", "sandbox.allowedHosts[1]"},
        {V "---\n" V, NAME ":2: expected a single YAML document", ""},
        {V "---\n[\n", NAME ":4: did not find expected node content while parsing a flow node", ""},
    };
#undef V
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        static struct config_agent dummy;
        struct config_agent *c = &dummy; /* must be reset to NULL */
        struct err err = {0};
        CHECK_EQ_INT(load(&c, bad[i].yaml, &err), E_INVALID);
        CHECK(c == NULL);
        CHECK_EQ_STR(err.msg, bad[i].msg);
        CHECK_EQ_STR(err.field, bad[i].field);
    }
}

TEST(size_cap)
{
    size_t n = CONFIG_AGENT_MAX_BYTES + 1;
    char *big = malloc(n);
    struct config_agent *c = NULL;
    struct err err = {0};

    memset(big, '#', n);
    CHECK_EQ_INT(config_agent_load_mem(&c, NAME, big, n, &err), E_TOOBIG);
    CHECK_EQ_STR(err.msg, NAME ": larger than 65536 bytes");
    free(big);
}

static char *temp_dir(void)
{
    char tmpl[] = "/tmp/test-config-XXXXXX";
    char *d = mkdtemp(tmpl);
    return d != NULL ? xstrdup(d) : NULL;
}

TEST(files_and_write_example)
{
    char *dir = temp_dir(), *path;
    struct config_agent *c = NULL;
    struct err err = {0};

    if (dir == NULL) {
        CHECK(dir != NULL);
        return;
    }
    path = xasprintf("%s/.diverge/agent.yaml", dir);
    CHECK_EQ_INT(config_agent_load_file(&c, path, &err), E_NOTFOUND);
    CHECK_OK(config_agent_write_example(path, false, &err));
    CHECK_EQ_INT(config_agent_write_example(path, false, &err), E_CONFLICT);
    CHECK(strstr(err.msg, "already exists") != NULL);
    CHECK_OK(config_agent_write_example(path, true, &err));
    CHECK_OK(config_agent_load_file(&c, path, &err));
    CHECK(c != NULL && c->budget_tokens == 200000);
    config_agent_free(c);
    /* Messages name the path they were given. */
    {
        FILE *f = fopen(path, "w");
        fputs("version: \"1\"\nagent:\n  budgetTokens: lots\n", f);
        fclose(f);
    }
    CHECK_EQ_INT(config_agent_load_file(&c, path, &err), E_INVALID);
    CHECK(strncmp(err.msg, path, strlen(path)) == 0);
    CHECK(strstr(err.msg, ":3: agent.budgetTokens: expected a non-negative integer") != NULL);
    unlink(path);
    free(path);
    path = xasprintf("%s/.diverge", dir);
    rmdir(path);
    rmdir(dir);
    free(path);
    free(dir);
}

/* --- httpc against a loopback server that answers one connection with canned bytes --- */

struct fake_srv {
    int fd;               /* listening socket */
    int port;             /* its port */
    const char *response; /* bytes sent back; borrowed */
    char request[8192];   /* what arrived: head and body */
    size_t request_len;   /* bytes in request */
    pthread_t thread;     /* the accepting thread */
};

static size_t content_length(const char *head)
{
    const char *p = strstr(head, "Content-Length:");
    return p != NULL ? (size_t)strtoul(p + 15, NULL, 10) : 0;
}

static void *serve_one(void *arg)
{
    struct fake_srv *s = arg;
    int c = accept(s->fd, NULL, NULL);
    const char *end = NULL;
    ssize_t n;

    if (c < 0) {
        return NULL;
    }
    while (s->request_len < sizeof(s->request) - 1) {
        n = read(c, s->request + s->request_len, sizeof(s->request) - 1 - s->request_len);
        if (n <= 0) {
            break;
        }
        s->request_len += (size_t)n;
        s->request[s->request_len] = '\0';
        end = strstr(s->request, "\r\n\r\n");
        if (end != NULL &&
            s->request_len >= (size_t)(end + 4 - s->request) + content_length(s->request)) {
            break;
        }
    }
    n = write(c, s->response, strlen(s->response));
    (void)n;
    close(c);
    return NULL;
}

static int fake_start(struct fake_srv *s, const char *response)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);

    memset(s, 0, sizeof(*s));
    s->response = response;
    s->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (s->fd < 0 || bind(s->fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(s->fd, 1) != 0 ||
        getsockname(s->fd, (struct sockaddr *)&a, &len) != 0) {
        return -1;
    }
    s->port = ntohs(a.sin_port);
    return pthread_create(&s->thread, NULL, serve_one, s);
}

static void fake_stop(struct fake_srv *s)
{
    pthread_join(s->thread, NULL);
    close(s->fd);
}

#define RESP_201                                                                                   \
    "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nX-Two:  spaced  \r\n"               \
    "Content-Length: 11\r\nConnection: close\r\n\r\n{\"ok\":true}"

TEST(httpc_request_roundtrip)
{
    static const char *const hdrs[] = {"X-Test: yes", "Content-Type: application/json", NULL};
    struct httpc_request req = HTTPC_REQUEST_DEFAULTS;
    struct httpc_response resp;
    struct fake_srv s;
    char *url;

    if (fake_start(&s, RESP_201) != 0) {
        t_fail(__FILE__, __LINE__, "fake server could not start");
        return;
    }
    url = xasprintf("http://127.0.0.1:%d/p?q=1", s.port);
    req.method = "POST";
    req.url = url;
    req.headers = hdrs;
    req.body = "{\"a\":1}";
    req.body_len = 7;
    CHECK_OK(httpc_request(&resp, &req, NULL));
    fake_stop(&s);
    CHECK_EQ_INT(resp.status, 201);
    CHECK_EQ_STR(httpc_response_header(&resp, "content-type"), "application/json");
    CHECK_EQ_STR(httpc_response_header(&resp, "X-TWO"), "spaced");
    CHECK(httpc_response_header(&resp, "X-Missing") == NULL);
    CHECK_EQ_STR(resp.body.data, "{\"ok\":true}");
    CHECK(strncmp(s.request, "POST /p?q=1 HTTP/1.1\r\n", 22) == 0);
    CHECK(strstr(s.request, "\r\nUser-Agent: diverge/" DIVERGE_VERSION "\r\n") != NULL);
    CHECK(strstr(s.request, "\r\nX-Test: yes\r\n") != NULL);
    CHECK(strstr(s.request, "\r\n\r\n{\"a\":1}") != NULL);
    httpc_response_cleanup(&resp);
    free(url);
}

/* An HTTP error status is a completed exchange, and the body cap is enforced. */
TEST(httpc_status_and_cap)
{
    struct httpc_request req = HTTPC_REQUEST_DEFAULTS;
    struct httpc_response resp;
    struct fake_srv s;
    char *url;

    if (fake_start(&s, "HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found") != 0) {
        t_fail(__FILE__, __LINE__, "fake server could not start");
        return;
    }
    url = xasprintf("http://127.0.0.1:%d/", s.port);
    req.url = url;
    CHECK_OK(httpc_request(&resp, &req, NULL));
    fake_stop(&s);
    CHECK_EQ_INT(resp.status, 404);
    CHECK_EQ_STR(resp.body.data, "not found");
    httpc_response_cleanup(&resp);
    free(url);

    if (fake_start(&s, RESP_201) != 0) {
        t_fail(__FILE__, __LINE__, "fake server could not start");
        return;
    }
    url = xasprintf("http://127.0.0.1:%d/", s.port);
    req.url = url;
    req.max_body = 4;
    CHECK_EQ_INT(httpc_request(&resp, &req, NULL), E_TOOBIG);
    fake_stop(&s);
    httpc_response_cleanup(&resp);
    free(url);
}

static int collect(const char *data, size_t len, void *userdata)
{
    return buf_append(userdata, data, len);
}

static int refuse(const char *data, size_t len, void *userdata)
{
    (void)data;
    (void)len;
    (void)userdata;
    return E_DENIED;
}

TEST(httpc_stream_chunks)
{
    struct httpc_request req = HTTPC_REQUEST_DEFAULTS;
    struct httpc_response resp;
    struct buf got;
    struct fake_srv s;
    char *url;

    buf_init(&got, 0);
    if (fake_start(&s, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                       "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n") != 0) {
        t_fail(__FILE__, __LINE__, "fake server could not start");
        return;
    }
    url = xasprintf("http://127.0.0.1:%d/w", s.port);
    req.url = url;
    req.max_body = 1; /* does not apply to a streamed 2xx body */
    CHECK_OK(httpc_stream(&resp, &req, collect, &got, NULL));
    fake_stop(&s);
    CHECK_EQ_STR(got.data, "abcde");
    CHECK_EQ_INT(resp.body.len, 0);
    httpc_response_cleanup(&resp);
    free(url);

    if (fake_start(&s, RESP_201) != 0) {
        t_fail(__FILE__, __LINE__, "fake server could not start");
        return;
    }
    url = xasprintf("http://127.0.0.1:%d/w", s.port);
    req.url = url;
    req.max_body = 0;
    CHECK_EQ_INT(httpc_stream(&resp, &req, refuse, NULL, NULL), E_DENIED);
    fake_stop(&s);
    httpc_response_cleanup(&resp);
    free(url);
    buf_cleanup(&got);
}

TEST(httpc_unreachable_and_invalid)
{
    struct httpc_request req = HTTPC_REQUEST_DEFAULTS;
    struct httpc_response resp;
    struct fake_srv s;
    struct err err = {0};
    char *url;

    /* A port that was just free: nothing listens there any more. */
    if (fake_start(&s, "") != 0) {
        t_fail(__FILE__, __LINE__, "fake server could not start");
        return;
    }
    url = xasprintf("http://127.0.0.1:%d/", s.port);
    pthread_cancel(s.thread);
    fake_stop(&s);
    req.url = url;
    CHECK_EQ_INT(httpc_request(&resp, &req, &err), E_AGAIN);
    CHECK(err.msg[0] != '\0');
    CHECK_EQ_INT(resp.status, 0);
    httpc_response_cleanup(&resp);
    free(url);

    req.url = "ftp://127.0.0.1/";
    CHECK_EQ_INT(httpc_request(&resp, &req, NULL), E_INVALID);
    httpc_response_cleanup(&resp);
    req.url = "http://127.0.0.1:1/";
    req.method = "get me";
    CHECK_EQ_INT(httpc_request(&resp, &req, NULL), E_INVALID);
    httpc_response_cleanup(&resp);
}

TEST(httpc_escape_segments)
{
    char *e = httpc_escape("a b/c~d.e_f-g%h\xc3\xa9");

    CHECK_EQ_STR(e, "a%20b%2Fc~d.e_f-g%25h%C3%A9");
    free(e);
}

T_MAIN
