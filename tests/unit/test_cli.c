/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of the CLI's pure parts: option parsing and dispatch, AGE, the YAML emitter,
 * the JSON re-indenter, table alignment, and the budget arithmetic of `task resume`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/cli_int.h"
#include "cli/mcp.h"
#include "tests/t_check.h"

#define ALL_OPTS (~0u)

/* A writable argv copy of the literals in SRC (-Wwrite-strings makes literals const);
 * free with free_argv(). */
static char **mkargv(const char *const *src, int n)
{
    char **v = xcalloc((size_t)n + 1, sizeof(char *));
    for (int i = 0; i < n; i++) {
        v[i] = src[i] != NULL ? xstrdup(src[i]) : NULL;
    }
    return v;
}

static void free_argv(char **v, int n)
{
    for (int i = 0; i < n; i++) {
        free(v[i]);
    }
    free(v);
}

TEST(args_forms)
{
    static const char *const src[] = {"--name=a",   "obj",     "-n",          "ns1",
                                      "-ojson",     "--model", "m1",          "--model=m2",
                                      "--draft-pr", "--",      "--not-a-flag"};
    char **argv = mkargv(src, 11);
    struct cli_args a;

    CHECK_OK(cli_args_parse(&a, 11, argv, ALL_OPTS, NULL));
    CHECK_EQ_INT(a.npos, 2);
    CHECK_EQ_STR(a.pos[0], "obj");
    CHECK_EQ_STR(a.pos[1], "--not-a-flag");
    CHECK_EQ_STR(cli_args_value(&a, CLI_OPT_NAME), "a");
    CHECK_EQ_STR(cli_args_value(&a, CLI_OPT_NAMESPACE), "ns1");
    CHECK_EQ_STR(cli_args_value(&a, CLI_OPT_OUTPUT), "json");
    CHECK_EQ_STR(cli_args_value(&a, CLI_OPT_MODEL), "m2"); /* the last one wins */
    CHECK(cli_args_has(&a, CLI_OPT_DRAFT_PR));
    CHECK(cli_args_value(&a, CLI_OPT_DRAFT_PR) == NULL);
    CHECK(!cli_args_has(&a, CLI_OPT_BUDGET));
    CHECK_EQ_INT(a.nopt, 6);
    free_argv(argv, 11);
}

TEST(args_errors)
{
    static const struct {
        const char *arg, *arg2, *msg;
    } bad[] = {
        {"--bogus", NULL, "unknown flag --bogus"},
        {"-x", NULL, "unknown flag -x"},
        {"--budget", "5", "unknown flag --budget"}, /* known, but not allowed here */
        {"--name", NULL, "flag --name needs a value"},
        {"-A=1", NULL, "unknown flag -A"},
        {"--draft-pr=yes", NULL, "unknown flag --draft-pr"},
        {"--force=yes", NULL, "flag --force takes no value"},
    };
    unsigned allowed = CLI_OPTS_GLOBAL | CLI_OPT_BIT(CLI_OPT_NAME) | CLI_OPT_BIT(CLI_OPT_FORCE);

    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        const char *src[] = {bad[i].arg, bad[i].arg2};
        int n = bad[i].arg2 != NULL ? 2 : 1;
        char **argv = mkargv(src, n);
        struct cli_args a;
        struct err err = {0};
        CHECK_EQ_INT(cli_args_parse(&a, n, argv, allowed, &err), E_INVALID);
        CHECK_EQ_STR(err.msg, bad[i].msg);
        free_argv(argv, n);
    }
}

TEST(args_find_word_and_help)
{
    static const char *const s1[] = {"-n", "x", "--server=u", "-o", "yaml", "task", "list"};
    static const char *const s2[] = {"-A", "--token", "t", "list"};
    static const char *const s3[] = {"--", "-h"};
    static const char *const s4[] = {"-n", "x"};
    char **a1 = mkargv(s1, 7), **a2 = mkargv(s2, 4), **a3 = mkargv(s3, 2), **a4 = mkargv(s4, 2);

    CHECK_EQ_INT(cli_args_find_word(7, a1), 5);
    CHECK_EQ_INT(cli_args_find_word(4, a2), 3);
    CHECK_EQ_INT(cli_args_find_word(2, a3), 1);
    CHECK_EQ_INT(cli_args_find_word(2, a4), 2);
    CHECK_EQ_INT(cli_args_find_word(0, a4), 0);
    CHECK(!cli_args_wants_help(2, a3));
    CHECK(cli_args_wants_help(1, a3 + 1));
    free_argv(a1, 7);
    free_argv(a2, 4);
    free_argv(a3, 2);
    free_argv(a4, 2);
}

static char g_seen[256];

static int record(int argc, char **argv)
{
    size_t len = 0;

    g_seen[0] = '\0';
    for (int i = 0; i < argc && len < sizeof(g_seen); i++) {
        int n = snprintf(g_seen + len, sizeof(g_seen) - len, "%s ", argv[i]);
        len += n > 0 ? (size_t)n : 0;
    }
    return 7;
}

static int run_one(struct cli_ctx *ctx, const struct cli_args *args)
{
    (void)ctx;
    snprintf(g_seen, sizeof(g_seen), "one(%s) -n %s", args->pos[0],
             cli_args_value(args, CLI_OPT_NAMESPACE));
    return 8;
}

TEST(dispatch_both_kinds_of_verbs)
{
    static const struct cli_cmd cmds[] = {
        {"raw", 0, 0, record, NULL, 0, NULL},
        {"one", 1, 1, NULL, run_one, CLI_OPT_BIT(CLI_OPT_FORCE), "usage of one\n"},
    };
    static const char *const s1[] = {"-n", "ns", "raw", "--x", "y"};
    static const char *const s2[] = {"one", "a", "b"};
    static const char *const s3[] = {"-n", "ns", "one", "--force", "a"};
    static const char *const s4[] = {"nope"};
    static const char *const s5[] = {"-n", "ns"};
    static const char *const s6[] = {"one", "--budget", "1", "a"};
    static const char *const s7[] = {"one", "caf\xc3", "a"};
    char **a1 = mkargv(s1, 5), **a2 = mkargv(s2, 3), **a3 = mkargv(s3, 5), **a4 = mkargv(s4, 1);
    char **a5 = mkargv(s5, 2), **a6 = mkargv(s6, 4), **a7 = mkargv(s7, 2);

    /* Raw verbs get everything, options from before the verb right after it. */
    CHECK_EQ_INT(cli_dispatch(cmds, 2, "", "usage\n", 5, a1), 7);
    CHECK_EQ_STR(g_seen, "raw -n ns --x y ");
    /* Parsed verbs: positional count, allowed options, UTF-8. */
    CHECK_EQ_INT(cli_dispatch(cmds, 2, "g", "usage\n", 3, a2), CLI_EXIT_USAGE);
    CHECK_EQ_INT(cli_dispatch(cmds, 2, "g", "usage\n", 5, a3), 8);
    CHECK_EQ_STR(g_seen, "one(a) -n ns");
    CHECK_EQ_INT(cli_dispatch(cmds, 2, "g", "usage\n", 4, a6), CLI_EXIT_USAGE);
    CHECK_EQ_INT(cli_dispatch(cmds, 2, "g", "usage\n", 2, a7), CLI_EXIT_USAGE);
    CHECK_EQ_INT(cli_dispatch(cmds, 2, "", "usage\n", 1, a4), CLI_EXIT_USAGE);
    CHECK_EQ_INT(cli_dispatch(cmds, 2, "", "usage\n", 2, a5), CLI_EXIT_USAGE);
    free_argv(a1, 5);
    free_argv(a2, 3);
    free_argv(a3, 5);
    free_argv(a4, 1);
    free_argv(a5, 2);
    free_argv(a6, 4);
    free_argv(a7, 2);
}

TEST(age_like_kubectl)
{
    static const struct {
        int64_t s;
        const char *want;
    } cases[] = {
        {-5, "<invalid>"},
        {-1, "0s"},
        {0, "0s"},
        {5, "5s"},
        {119, "119s"},
        {120, "2m"},
        {200, "3m20s"},
        {599, "9m59s"},
        {600, "10m"},
        {10799, "179m"},
        {10800, "3h"},
        {3 * 3600 + 60, "3h1m"},
        {8 * 3600, "8h"},
        {47 * 3600, "47h"},
        {48 * 3600, "2d"},
        {4 * 86400 + 3600, "4d1h"},
        {8 * 86400, "8d"},
        {729 * 86400, "729d"},
        {730 * 86400, "2y"},
        {731 * 86400, "2y1d"},
        {8 * 365 * 86400, "8y"},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        char out[CLI_AGE_MAX];
        cli_format_age(out, cases[i].s * 1000);
        CHECK_EQ_STR(out, cases[i].want);
    }
}

TEST(yaml_quoting)
{
    static const char *const quoted[] = {"",
                                         "5.00",
                                         "0.0675",
                                         "-1",
                                         "+1",
                                         ".5",
                                         "true",
                                         "No",
                                         "ON",
                                         "~",
                                         "null",
                                         "y",
                                         "2026-11-29T10:00:00Z",
                                         "- a",
                                         "a: b",
                                         "a #b",
                                         "ends:",
                                         " lead",
                                         "trail ",
                                         "*x",
                                         "&x",
                                         "!x",
                                         "{a}",
                                         "[a]",
                                         "'q'",
                                         "\"q\"",
                                         "@x",
                                         "`x",
                                         "%x",
                                         "|x",
                                         ">x",
                                         "#x",
                                         "a\nb",
                                         "caf\xc3\xa9"};
    static const char *const plain[] = {"main",     "agent/fix-x", "divergedev.com/v1alpha1",
                                        "Active",   "a:b",         "a#b",
                                        "claude-*", "fix checkout"};
    for (size_t i = 0; i < ARRAY_LEN(quoted); i++) {
        if (!cli_yaml_needs_quotes(quoted[i])) {
            t_fail(__FILE__, __LINE__, "\"%s\" should be quoted", quoted[i]);
        }
    }
    for (size_t i = 0; i < ARRAY_LEN(plain); i++) {
        if (cli_yaml_needs_quotes(plain[i])) {
            t_fail(__FILE__, __LINE__, "\"%s\" should stay plain", plain[i]);
        }
    }
}

TEST(yaml_emit_layout)
{
    const char *in = "{\"apiVersion\":\"divergedev.com/v1alpha1\",\"metadata\":{\"name\":\"t\","
                     "\"annotations\":{\"divergedev.com/guidance\":\"say \\\"hi\\\"\\n\"}},"
                     "\"spec\":{\"budgetUSD\":\"5.00\",\"budgetTokens\":200000,\"draftPR\":true,"
                     "\"capabilities\":[\"a\",\"b\"],\"tools\":[],\"sandbox\":{},\"x\":null,"
                     "\"cost\":0.0225,\"nested\":[{\"a\":1,\"b\":[1,[2,3]]},[]]}}";
    const char *want = "apiVersion: divergedev.com/v1alpha1\n"
                       "metadata:\n"
                       "  name: t\n"
                       "  annotations:\n"
                       "    divergedev.com/guidance: \"say \\\"hi\\\"\\n\"\n"
                       "spec:\n"
                       "  budgetUSD: \"5.00\"\n"
                       "  budgetTokens: 200000\n"
                       "  draftPR: true\n"
                       "  capabilities:\n"
                       "  - a\n"
                       "  - b\n"
                       "  tools: []\n"
                       "  sandbox: {}\n"
                       "  x: null\n"
                       "  cost: 0.0225\n"
                       "  nested:\n"
                       "  - a: 1\n"
                       "    b:\n"
                       "    - 1\n"
                       "    - - 2\n"
                       "      - 3\n"
                       "  - []\n";
    json_t *j = json_loads(in, 0, NULL);
    struct buf b;

    buf_init(&b, 0);
    cli_yaml_emit(&b, j);
    CHECK_EQ_STR(b.data, want);
    buf_cleanup(&b);
    json_decref(j);
}

TEST(json_pretty_keeps_tokens)
{
    const char *in = " {\"a\" : [1, 2.50, 1e400], \"b\":{}, \"c\":[ ], \"s\":\"x, {y}: \\\"z\\\"\","
                     "\"d\":{\"e\":null}}";
    const char *want = "{\n  \"a\": [\n    1,\n    2.50,\n    1e400\n  ],\n  \"b\": {},\n"
                       "  \"c\": [],\n  \"s\": \"x, {y}: \\\"z\\\"\",\n  \"d\": {\n"
                       "    \"e\": null\n  }\n}\n";
    struct buf b;

    buf_init(&b, 0);
    cli_json_pretty(&b, in, strlen(in));
    CHECK_EQ_STR(b.data, want);
    buf_cleanup(&b);
}

TEST(table_alignment)
{
    static const char *const rows[][3] = {
        {"NAME", "PHASE", "COST"}, {"caf\xc3\xa9", "Active", "0.0675"}, {"a-long-name", "", "5"}};
    struct cli_table t;
    struct buf b;

    cli_table_init(&t, 3);
    for (size_t i = 0; i < ARRAY_LEN(rows); i++) {
        cli_table_add(&t, rows[i]);
    }
    buf_init(&b, 0);
    cli_table_render(&b, &t);
    CHECK_EQ_STR(b.data, "NAME          PHASE    COST\n"
                         "caf\xc3\xa9          Active   0.0675\n"
                         "a-long-name            5\n");
    buf_cleanup(&b);
    cli_table_cleanup(&t);
}

TEST(resume_budget_arithmetic)
{
    int64_t v;
    struct err err = {0};

    /* spec 5.00 + 15.00 */
    CHECK_OK(cli_budget_bump(&v, 5000000, CLI_DEFAULT_BUDGET_USD_MICROS, 15000000, &err));
    CHECK_EQ_INT(v, 20000000);
    /* no spec budget: the server default 5.00 is the base */
    CHECK_OK(cli_budget_bump(&v, 0, CLI_DEFAULT_BUDGET_USD_MICROS, 1, &err));
    CHECK_EQ_INT(v, 5000001);
    CHECK_OK(cli_budget_bump(&v, 0, CLI_DEFAULT_BUDGET_TOKENS, 2000000, &err));
    CHECK_EQ_INT(v, 3000000);
    CHECK_EQ_INT(cli_budget_bump(&v, INT64_MAX, 0, 1, &err), E_TOOBIG);
    CHECK_EQ_INT(cli_budget_bump(&v, 1, 0, -1, &err), E_INVALID);
}

TEST(token_counts)
{
    static const struct {
        const char *s;
        bool plus;
        int rc;
        int64_t want;
    } cases[] = {
        {"2000000", false, E_OK, 2000000},
        {"2M", false, E_OK, 2000000},
        {"500k", false, E_OK, 500000},
        {"+2M", true, E_OK, 2000000},
        {"+1", false, E_INVALID, 0},
        {"1.5", true, E_INVALID, 0},
        {"", true, E_INVALID, 0},
        {"M", true, E_INVALID, 0},
        {"2MB", true, E_INVALID, 0},
        {"-1", true, E_INVALID, 0},
        {"99999999999999999999", true, E_TOOBIG, 0},
        {"9223372036854775807k", true, E_TOOBIG, 0},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        int64_t v = -1;
        int rc = cli_parse_tokens(&v, cases[i].s, cases[i].plus, NULL);
        if (rc != cases[i].rc || (rc == E_OK && v != cases[i].want)) {
            t_fail(__FILE__, __LINE__, "cli_parse_tokens(\"%s\") = %d/%lld", cases[i].s, rc,
                   (long long)v);
        }
    }
}

TEST(output_formats)
{
    enum cli_output o = CLI_OUTPUT_TABLE;
    struct err err = {0};

    CHECK_OK(cli_output_parse(&o, "yaml", NULL));
    CHECK_EQ_INT(o, CLI_OUTPUT_YAML);
    CHECK_OK(cli_output_parse(&o, "json", NULL));
    CHECK_EQ_INT(o, CLI_OUTPUT_JSON);
    CHECK_EQ_INT(cli_output_parse(&o, "wide", &err), E_INVALID);
    CHECK_EQ_STR(err.msg, "unknown output format \"wide\" (want table, json or yaml)");
}

/* --- `diverge mcp`: the JSON-RPC handler, without stdio --- */

/* The reply to LINE parsed, or NULL when there was none. */
static json_t *mcp_reply(struct cli_mcp *m, const char *line)
{
    char *text = cli_mcp_handle(m, line, strlen(line));
    json_t *j = text != NULL ? json_loads(text, 0, NULL) : NULL;

    CHECK(text == NULL || j != NULL);
    CHECK(text == NULL || strchr(text, '\n') == NULL); /* one line on the wire */
    free(text);
    return j;
}

static long long mcp_error_code(const json_t *r)
{
    return (long long)json_integer_value(json_object_get(json_object_get(r, "error"), "code"));
}

/* A context whose server refuses connections at once (nothing listens on port 1). */
static void mcp_ctx(struct cli_ctx *ctx)
{
    memset(ctx, 0, sizeof(*ctx));
    ctx->server = xstrdup("http://127.0.0.1:1");
    ctx->ns = "default";
}

TEST(mcp_protocol_errors)
{
    struct cli_ctx ctx;
    struct cli_mcp m;
    json_t *r;

    mcp_ctx(&ctx);
    cli_mcp_init(&m, &ctx);
    r = mcp_reply(&m, "{nope");
    CHECK_EQ_INT(mcp_error_code(r), CLI_MCP_PARSE_ERROR);
    CHECK(json_is_null(json_object_get(r, "id")));
    json_decref(r);
    r = mcp_reply(&m, "[]");
    CHECK_EQ_INT(mcp_error_code(r), CLI_MCP_INVALID_REQUEST);
    json_decref(r);
    r = mcp_reply(&m, "{\"jsonrpc\":\"2.0\",\"id\":true,\"method\":\"ping\"}");
    CHECK_EQ_INT(mcp_error_code(r), CLI_MCP_INVALID_REQUEST);
    json_decref(r);
    r = mcp_reply(&m, "{\"jsonrpc\":\"2.0\",\"id\":\"x\",\"method\":\"prompts/list\"}");
    CHECK_EQ_INT(mcp_error_code(r), CLI_MCP_METHOD_NOT_FOUND);
    CHECK_EQ_STR(json_string_value(json_object_get(r, "id")), "x");
    json_decref(r);
    /* notifications, responses and blank lines get nothing */
    CHECK(mcp_reply(&m, "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}") == NULL);
    CHECK(m.initialized);
    CHECK(mcp_reply(&m, "{\"jsonrpc\":\"2.0\",\"method\":\"whatever\"}") == NULL);
    CHECK(mcp_reply(&m, "{\"jsonrpc\":\"2.0\",\"id\":4,\"result\":{}}") == NULL);
    CHECK(mcp_reply(&m, " \t\r") == NULL);
    /* over the line limit: refused without being parsed */
    {
        char *big = xmalloc(CLI_MCP_MAX_LINE + 2);
        char *text;
        memset(big, ' ', CLI_MCP_MAX_LINE + 1);
        big[CLI_MCP_MAX_LINE + 1] = '\0';
        text = cli_mcp_handle(&m, big, CLI_MCP_MAX_LINE + 1);
        CHECK(text != NULL && strstr(text, "-32600") != NULL);
        free(text);
        CHECK(cli_mcp_handle(&m, big, CLI_MCP_MAX_LINE) == NULL); /* blank, at the limit */
        free(big);
    }
    cli_ctx_cleanup(&ctx);
}

TEST(mcp_initialize_and_tools)
{
    struct cli_ctx ctx;
    struct cli_mcp m;
    json_t *r, *tools;

    mcp_ctx(&ctx);
    cli_mcp_init(&m, &ctx);
    r = mcp_reply(&m, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\","
                      "\"params\":{\"protocolVersion\":\"2024-11-05\"}}");
    CHECK_EQ_STR(cli_json_str(r, "result.protocolVersion"), "2024-11-05");
    CHECK_EQ_STR(m.version, "2024-11-05");
    json_decref(r);
    r = mcp_reply(&m, "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"initialize\","
                      "\"params\":{\"protocolVersion\":\"1.0\"}}");
    CHECK_EQ_STR(cli_json_str(r, "result.protocolVersion"), "2025-06-18");
    json_decref(r);
    r = mcp_reply(&m, "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/list\"}");
    tools = json_object_get(json_object_get(r, "result"), "tools");
    CHECK_EQ_INT(json_array_size(tools), 8);
    for (size_t i = 0; i < json_array_size(tools); i++) {
        CHECK_EQ_STR(cli_json_str(json_array_get(tools, i), "inputSchema.type"), "object");
    }
    json_decref(r);
    /* bad arguments: an isError result, no request made */
    r = mcp_reply(&m, "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"tools/call\",\"params\":"
                      "{\"name\":\"diverge_create_task\",\"arguments\":{\"name\":\"a\","
                      "\"objective\":\"o\",\"budgetUSD\":0.1}}}");
    CHECK(json_is_true(cli_json_at(r, "result.isError")));
    CHECK_EQ_STR(cli_json_str(r, "result.structuredContent.reason"), "Invalid");
    json_decref(r);
    /* the server is unreachable: also an isError result */
    r = mcp_reply(&m, "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"tools/call\",\"params\":"
                      "{\"name\":\"diverge_task_status\",\"arguments\":{\"name\":\"a\"}}}");
    CHECK(json_is_true(cli_json_at(r, "result.isError")));
    CHECK_EQ_STR(cli_json_str(r, "result.structuredContent.reason"), "Unreachable");
    json_decref(r);
    r = mcp_reply(&m, "{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"tools/call\",\"params\":"
                      "{\"name\":\"nope\"}}");
    CHECK_EQ_INT(mcp_error_code(r), CLI_MCP_INVALID_PARAMS);
    json_decref(r);
    cli_ctx_cleanup(&ctx);
}

/* `diverge local thread` shows a comment as read on the PR page, never a terminal escape. */
TEST(term_text_reads_like_the_pr_page)
{
    char *t = cli_term_text("<!-- diverge:sticky -->\n<!-- diverge-task:default/x -->\n\n"
                            "### \xE2\x9C\x85 Completed \xC2\xB7 `x`\n\n"
                            "**Objective:** see https:\xE2\x80\x8B//evil.example &lt;b&gt; "
                            "\\*not bold\\* @\xE2\x80\x8D"
                            "alice\n\n"
                            "[dashboard](http://127.0.0.1:8080/#/task/default/x)\n"
                            "<sub>updated 2026-12-01T00:00:00Z</sub>\n\n\n\n"
                            "bell\x07 escape\x1b[31mred\x7f end");

    CHECK_EQ_STR(t, "### \xE2\x9C\x85 Completed \xC2\xB7 `x`\n\n"
                    "**Objective:** see https://evil.example <b> *not bold* @alice\n\n"
                    "dashboard (http://127.0.0.1:8080/#/task/default/x)\n"
                    "updated 2026-12-01T00:00:00Z\n\n"
                    "bell escape[31mred end");
    free(t);
    t = cli_term_text("[a [b](c) <!-- open");
    CHECK_EQ_STR(t, "[a b (c) ");
    free(t);
    t = cli_term_text(NULL);
    CHECK_EQ_STR(t, "");
    free(t);
}

T_MAIN
