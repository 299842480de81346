/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of the runner's LLM relay (pure half): the agent's request head parsed
 * strictly (hostile input refused with the right status), the key headers and ?key=
 * carrying the current token instead of the placeholder, hop-by-hop headers dropped, the
 * response head, the chunked body decoder and the agent's variables. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "runner/runner_int.h"
#include "tests/t_check.h"

#define TOK "MDAxY2xvY2F0aW9uIGRpdmVyZ2UK-new"

static int parse(struct runner_llm_head *h, const char *s)
{
    return runner_llm_head_parse(h, s, strlen(s), NULL);
}

/* The header line named NAME (case-insensitive) among LINES, or NULL. */
static const char *line_of(char **lines, const char *name)
{
    for (size_t i = 0; lines[i] != NULL; i++) {
        if (strncasecmp(lines[i], name, strlen(name)) == 0 &&
            (lines[i][strlen(name)] == ':' || lines[i][strlen(name)] == ';')) {
            return lines[i];
        }
    }
    return NULL;
}

TEST(placeholder_replaced_in_every_key_header)
{
    struct runner_llm_head h;
    char **l;

    CHECK_OK(parse(&h, "POST /api/v1/llm/anthropic/v1/messages?beta=true HTTP/1.1\r\n"
                       "Host: 127.0.0.1:3129\r\n"
                       "x-api-key: diverge-sandbox\r\n"
                       "Authorization: Bearer diverge-sandbox\r\n"
                       "X-Goog-Api-Key:   diverge-sandbox  \r\n"
                       "anthropic-beta: claude-code-20250219\r\n"
                       "Content-Type: application/json\r\n"
                       "Content-Length: 2\r\n"
                       "Connection: keep-alive\r\n"
                       "Accept-Encoding: gzip, zstd\r\n"
                       "X-Empty:\r\n"
                       "\r\n"));
    CHECK_EQ_STR(h.method, "POST");
    CHECK_EQ_STR(h.target, "/api/v1/llm/anthropic/v1/messages?beta=true");
    CHECK_EQ_INT(h.content_length, 2);
    CHECK(!h.chunked);
    l = runner_llm_upstream_headers(&h, TOK);
    CHECK_EQ_STR(line_of(l, "x-api-key"), "x-api-key: " TOK);
    CHECK_EQ_STR(line_of(l, "authorization"), "Authorization: Bearer " TOK);
    CHECK_EQ_STR(line_of(l, "x-goog-api-key"), "X-Goog-Api-Key: " TOK);
    CHECK_EQ_STR(line_of(l, "anthropic-beta"), "anthropic-beta: claude-code-20250219");
    CHECK_EQ_STR(line_of(l, "accept-encoding"), "Accept-Encoding: gzip, zstd");
    CHECK_EQ_STR(line_of(l, "x-empty"), "X-Empty;");
    CHECK(line_of(l, "host") == NULL);
    CHECK(line_of(l, "connection") == NULL);
    CHECK(line_of(l, "content-length") == NULL);
    for (size_t i = 0; l[i] != NULL; i++) {
        CHECK(strstr(l[i], RUNNER_LLM_PLACEHOLDER) == NULL);
    }
    runner_llm_lines_free(l);
    runner_llm_head_cleanup(&h);
}

/* A key the agent was given before a rotation (or any other) is replaced as well. */
TEST(old_token_replaced_and_query_key)
{
    struct runner_llm_head h;
    char *t;
    char **l;

    CHECK_OK(parse(&h, "GET /api/v1/llm/gemini/v1beta/models HTTP/1.1\n"
                       "authorization: Basic b2xkOnRva2Vu\n\n"));
    l = runner_llm_upstream_headers(&h, TOK);
    CHECK_EQ_STR(line_of(l, "authorization"), "authorization: Bearer " TOK);
    runner_llm_lines_free(l);
    runner_llm_head_cleanup(&h);
    t = runner_llm_target("/api/v1/llm/gemini/v1beta/models/m:streamGenerateContent?alt=sse&"
                          "key=diverge-sandbox",
                          "a+b/c=");
    CHECK_EQ_STR(t, "/api/v1/llm/gemini/v1beta/models/m:streamGenerateContent?alt=sse&"
                    "key=a%2Bb%2Fc%3D");
    runner_token_free(t);
    t = runner_llm_target("/api/v1/llm/x?key=old&monkey=1&key=", "T");
    CHECK_EQ_STR(t, "/api/v1/llm/x?key=T&monkey=1&key=T");
    runner_token_free(t);
    t = runner_llm_target("/api/v1/llm/anthropic/v1/messages", "T");
    CHECK_EQ_STR(t, "/api/v1/llm/anthropic/v1/messages");
    runner_token_free(t);
}

TEST(hostile_heads_refused)
{
    static const struct {
        const char *head;
        int rc;
    } cases[] = {
        {"POST /api/v1/agenttask/meter HTTP/1.1\r\n\r\n", E_NOTFOUND},
        {"GET /api/v1/llm HTTP/1.1\r\n\r\n", E_NOTFOUND},
        {"GET /api/v1/llm/../agenttask/meter HTTP/1.1\r\n\r\n", E_NOTFOUND},
        {"GET /api/v1/llm/a/%2e%2E/b HTTP/1.1\r\n\r\n", E_NOTFOUND},
        {"GET /api/v1/llm/./a HTTP/1.1\r\n\r\n", E_NOTFOUND},
        {"GET /api/v1/llm/a\\b HTTP/1.1\r\n\r\n", E_NOTFOUND},
        {"GET http://evil/api/v1/llm/a HTTP/1.1\r\n\r\n", E_NOTFOUND},
        {"GET /api/v1/llm/a HTTP/2\r\n\r\n", E_INVALID},
        {"get /api/v1/llm/a HTTP/1.1\r\n\r\n", E_INVALID},
        {"GET  /api/v1/llm/a HTTP/1.1\r\n\r\n", E_INVALID},
        {"GET /api/v1/llm/a HTTP/1.1\r\nNo colon here\r\n\r\n", E_INVALID},
        {"GET /api/v1/llm/a HTTP/1.1\r\nBad Name: x\r\n\r\n", E_INVALID},
        {"GET /api/v1/llm/a HTTP/1.1\r\nX: a\r\n folded\r\n\r\n", E_INVALID},
        {"GET /api/v1/llm/a HTTP/1.1\r\nX: a\rb\r\n\r\n", E_INVALID},
        {"POST /api/v1/llm/a HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
         E_INVALID},
        {"POST /api/v1/llm/a HTTP/1.1\r\nContent-Length: -1\r\n\r\n", E_INVALID},
        {"POST /api/v1/llm/a HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
         E_INVALID},
        {"POST /api/v1/llm/a HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", E_INVALID},
        {"POST /api/v1/llm/a HTTP/1.1\r\nContent-Length: 999999999999\r\n\r\n", E_TOOBIG},
        {"", E_INVALID},
        {"GARBAGE", E_INVALID},
    };
    struct runner_llm_head h;
    char nul[] = "GET /api/v1/llm/a HTTP/1.1\r\nX: a\0b\r\n\r\n";

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int rc = parse(&h, cases[i].head);
        if (rc != cases[i].rc) {
            t_fail(__FILE__, __LINE__, "case %zu: %d != %d", i, rc, cases[i].rc);
        }
        runner_llm_head_cleanup(&h);
    }
    CHECK_EQ_INT(runner_llm_head_parse(&h, nul, sizeof(nul) - 1, NULL), E_INVALID);
    runner_llm_head_cleanup(&h);
}

TEST(too_many_headers_refused)
{
    struct buf b;
    struct runner_llm_head h;

    buf_init(&b, 0);
    buf_puts(&b, "GET /api/v1/llm/a HTTP/1.1\r\n");
    for (int i = 0; i <= RUNNER_LLM_HEADERS_MAX; i++) {
        buf_printf(&b, "X-%d: y\r\n", i);
    }
    buf_puts(&b, "\r\n");
    CHECK_EQ_INT(runner_llm_head_parse(&h, b.data, b.len, NULL), E_TOOBIG);
    runner_llm_head_cleanup(&h);
    buf_cleanup(&b);
}

TEST(reply_head_reframes)
{
    static const char pairs[] = "content-type\0text/event-stream\0transfer-encoding\0chunked\0"
                                "Content-Length\0 12\0connection\0keep-alive\0x-ok\0v\0"
                                "bad name\0x\0x-bad\0a\rb\0";
    char *h = runner_llm_reply_head(200, pairs, sizeof(pairs) - 1, false);

    CHECK_EQ_STR(h, "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nx-ok: v\r\n"
                    "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
    free(h);
    h = runner_llm_reply_head(200, pairs, sizeof(pairs) - 1, true);
    CHECK(strstr(h, "Transfer-Encoding") == NULL);
    CHECK(strstr(h, "Content-Length:  12\r\n") != NULL);
    free(h);
    h = runner_llm_reply_head(402, NULL, 0, false);
    CHECK_EQ_STR(h, "HTTP/1.1 402 Payment Required\r\nTransfer-Encoding: chunked\r\n"
                    "Connection: close\r\n\r\n");
    free(h);
}

TEST(chunked_body_decoded_piecewise)
{
    static const char body[] = "4;ext=1\r\nWiki\r\n5\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n"
                               "0\r\nX-Trailer: 1\r\n\r\nextra";
    struct runner_llm_chunked c = {0};
    struct buf out;
    size_t pos = 0, used;
    int rc = E_AGAIN;

    buf_init(&out, 0);
    /* One byte at a time, carrying what was not consumed: as reads may split it. */
    for (size_t end = 1; end <= sizeof(body) - 1 && rc == E_AGAIN; end++) {
        rc = runner_llm_dechunk(&c, &out, body + pos, end - pos, &used);
        pos += used;
    }
    CHECK_OK(rc);
    CHECK_EQ_STR(out.data, "Wikipedia in\r\n\r\nchunks.");
    CHECK_EQ_STR(body + pos, "extra");
    buf_cleanup(&out);

    memset(&c, 0, sizeof(c));
    buf_init(&out, 0);
    CHECK_EQ_INT(runner_llm_dechunk(&c, &out, "zz\r\n", 4, &used), E_INVALID);
    memset(&c, 0, sizeof(c));
    CHECK_EQ_INT(runner_llm_dechunk(&c, &out, "2\r\nabX\r\n", 8, &used), E_INVALID);
    memset(&c, 0, sizeof(c));
    CHECK_EQ_INT(runner_llm_dechunk(&c, &out, "fffffffffffffff\r\n", 17, &used), E_INVALID);
    buf_cleanup(&out);
    memset(&c, 0, sizeof(c));
    buf_init(&out, 3);
    CHECK_EQ_INT(runner_llm_dechunk(&c, &out, "4\r\nabcd\r\n0\r\n\r\n", 15, &used), E_TOOBIG);
    buf_cleanup(&out);
}

TEST(agent_environment)
{
    char *env[RUNNER_LLM_ENV_COUNT + 1];

    runner_llm_env(env, RUNNER_LLM_PORT);
    CHECK_EQ_STR(env[0], "DIVERGE_LLM_URL=http://127.0.0.1:3129/api/v1/llm");
    CHECK_EQ_STR(env[1], "ANTHROPIC_BASE_URL=http://127.0.0.1:3129/api/v1/llm/anthropic");
    CHECK_EQ_STR(env[2], "OPENAI_BASE_URL=http://127.0.0.1:3129/api/v1/llm/openai/v1");
    CHECK_EQ_STR(env[3], "GOOGLE_GEMINI_BASE_URL=http://127.0.0.1:3129/api/v1/llm/gemini");
    CHECK_EQ_STR(env[4], "ANTHROPIC_API_KEY=diverge-sandbox");
    CHECK_EQ_STR(env[5], "OPENAI_API_KEY=diverge-sandbox");
    CHECK_EQ_STR(env[6], "GEMINI_API_KEY=diverge-sandbox");
    CHECK(env[7] == NULL);
    for (int i = 0; env[i] != NULL; i++) {
        free(env[i]);
    }
}

TEST(public_url_base)
{
    char *b = runner_llm_url_base("https://diverge.example.com/api/v1/agenttask/meter");

    CHECK_EQ_STR(b, "https://diverge.example.com");
    free(b);
    CHECK(runner_llm_url_base("https://diverge.example.com/meter") == NULL);
    CHECK(runner_llm_url_base("file:///x/api/v1/agenttask/meter") == NULL);
    CHECK(runner_llm_url_base(NULL) == NULL);
}

T_MAIN
