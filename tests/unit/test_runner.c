/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of the runner's pure parts: usage lines (exact money), request ids, the
 * offset state, line splitting, meter answers and exit codes, the iteration verdict,
 * DIVERGE_LAST_FAILURE, the environment. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "runner/runner.h"
#include "runner/runner_int.h"
#include "tests/t_check.h"
#include "token/token.h"

static int parse(struct runner_usage *u, const char *line)
{
    return runner_usage_parse(u, line, strlen(line), NULL);
}

/* git gets the task's token only for the server's git smart HTTP at its public URL. */
TEST(git_token_only_for_the_server)
{
    const char *meter = "http://127.0.0.1:8080/api/v1/agenttask/meter";
    char *p = runner_git_server_prefix(meter, "http://127.0.0.1:8080/api/v1/git/default/t.git");

    CHECK_EQ_STR(p, "http://127.0.0.1:8080/api/v1/git/");
    free(p);
    CHECK(runner_git_server_prefix(meter, "file:///data/mirrors/x.git") == NULL);
    CHECK(runner_git_server_prefix(meter, "http://127.0.0.1:8081/api/v1/git/default/t.git") ==
          NULL);
    CHECK(runner_git_server_prefix(meter, "http://127.0.0.1:8080.evil/api/v1/git/d/t.git") == NULL);
    CHECK(runner_git_server_prefix(meter, "https://github.com/o/r.git") == NULL);
    CHECK(runner_git_server_prefix(NULL, "http://127.0.0.1:8080/api/v1/git/d/t.git") == NULL);
    CHECK(runner_git_server_prefix("file:///x/api/v1/agenttask/meter", "file:///x/api/v1/git/") ==
          NULL);
    CHECK(runner_git_server_prefix(meter, NULL) == NULL);
}

static void put_file(const char *dir, const char *name, const char *text)
{
    char *p = xasprintf("%s/%s", dir, name);
    FILE *f = fopen(p, "w");

    CHECK(f != NULL);
    fputs(text, f);
    fclose(f);
    free(p);
}

/* A branch is looked up in a file:// repository's own files (loose ref, else
 * packed-refs), as `git ls-remote --heads` would answer; -1 hands it back to git. */
TEST(git_ref_in_a_local_repository)
{
    char tmpl[] = "/tmp/diverge-refin-XXXXXX";
    char *dir = mkdtemp(tmpl), *url, *sub;

    CHECK(dir != NULL);
    url = xasprintf("file://%s", dir);
    CHECK(runner_git_ref_in(url, "refs/heads/main") == -1); /* no HEAD: not a repository */
    put_file(dir, "HEAD", "ref: refs/heads/main\n");
    sub = xasprintf("%s/refs", dir);
    CHECK(mkdir(sub, 0700) == 0);
    free(sub);
    sub = xasprintf("%s/refs/heads", dir);
    CHECK(mkdir(sub, 0700) == 0);
    free(sub);
    sub = xasprintf("%s/refs/heads/team", dir);
    CHECK(mkdir(sub, 0700) == 0);
    free(sub);
    CHECK(runner_git_ref_in(url, "refs/heads/main") == 0); /* no ref, no packed-refs */
    put_file(dir, "refs/heads/loose", "0123456789012345678901234567890123456789\n");
    put_file(dir, "packed-refs",
             "# pack-refs with: peeled fully-peeled sorted \n"
             "0123456789012345678901234567890123456789 refs/heads/main\n"
             "0123456789012345678901234567890123456789 refs/heads/main-2\r\n"
             "^0123456789012345678901234567890123456789\n"
             "0123456789012345678901234567890123456789 refs/tags/v1\n");
    CHECK(runner_git_ref_in(url, "refs/heads/main") == 1);
    CHECK(runner_git_ref_in(url, "refs/heads/main-2") == 1);
    CHECK(runner_git_ref_in(url, "refs/heads/loose") == 1);
    CHECK(runner_git_ref_in(url, "refs/heads/mai") == 0);
    CHECK(runner_git_ref_in(url, "refs/heads/team") == 0); /* a folder: branches team/... */
    CHECK(runner_git_ref_in(url, "refs/heads/v1") == 0);
    /* Names a path could misread, other schemes: git is asked. */
    CHECK(runner_git_ref_in(url, "refs/heads/../HEAD") == -1);
    CHECK(runner_git_ref_in(url, "refs/heads/team/") == -1);
    CHECK(runner_git_ref_in(url, "refs/heads//main") == -1);
    CHECK(runner_git_ref_in(url, "refs/tags/v1") == -1);
    CHECK(runner_git_ref_in("http://127.0.0.1:1/api/v1/git/d/t.git", "refs/heads/main") == -1);
    CHECK(runner_git_ref_in("file://relative/x.git", "refs/heads/main") == -1);
    CHECK(runner_git_ref_in(NULL, "refs/heads/main") == -1);
    free(url);
    url = xasprintf("rm -rf '%s'", dir);
    CHECK(system(url) == 0);
    free(url);
}

TEST(usage_line_exact_money)
{
    struct runner_usage u;

    CHECK_OK(parse(&u, "{\"model\":\"claude-3-7-sonnet\",\"tokensUsed\":1500,\"costUSD\":0.0225}"));
    CHECK(u.has_model);
    CHECK_EQ_STR(u.model, "claude-3-7-sonnet");
    CHECK_EQ_INT(u.tokens, 1500);
    CHECK_EQ_INT(u.cost_micros, 22500);
    CHECK_OK(parse(&u, " {\"costUSD\":\"0.10\"}"));
    CHECK_EQ_INT(u.cost_micros, 100000);
    CHECK(!u.has_model);
    CHECK_OK(parse(&u, "{\"costUSD\":2.5e-2,\"tokensUsed\":0}"));
    CHECK_EQ_INT(u.cost_micros, 25000);
    CHECK_OK(parse(&u, "{\"costUSD\":1E+3}"));
    CHECK_EQ_INT(u.cost_micros, 1000000000);
    CHECK_OK(parse(&u, "{\"costUSD\":0.1000000000}"));
    CHECK_EQ_INT(u.cost_micros, 100000);
    CHECK_OK(parse(&u, "{\"costUSD\":null,\"model\":null,\"extra\":[1,2]}"));
    CHECK_EQ_INT(u.cost_micros, 0);
    CHECK_OK(parse(&u, "{\"costUSD\":1000000000}"));
    CHECK_EQ_INT(u.cost_micros, RUNNER_COST_MAX_MICROS);
}

TEST(usage_line_refused)
{
    static const char *const bad[] = {"",
                                      "not json",
                                      "[]",
                                      "{",
                                      "{\"costUSD\":-0.01}",
                                      "{\"costUSD\":\"+1\"}",
                                      "{\"costUSD\":\"$1\"}",
                                      "{\"costUSD\":1000000000.000001}",
                                      "{\"costUSD\":1e99999999}",
                                      "{\"costUSD\":true}",
                                      "{\"costUSD\":{}}",
                                      "{\"tokensUsed\":-1}",
                                      "{\"tokensUsed\":1.5}",
                                      "{\"tokensUsed\":\"5\"}",
                                      "{\"tokensUsed\":1000000000001}",
                                      "{\"model\":5}",
                                      "{\"model\":\"\"}",
                                      "{\"model\":\"a\\u0000b\"}",
                                      "{\"model\":\"a\\nb\"}",
                                      "{\"model\":\"x\"} trailing",
                                      "{\"model\":\"\xff\"}"};
    struct runner_usage u;
    char big[RUNNER_USAGE_LINE_MAX + 40];

    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        if (parse(&u, bad[i]) != E_INVALID) {
            t_fail(__FILE__, __LINE__, "accepted bad usage line %zu", i);
        }
        CHECK_EQ_INT(u.cost_micros, 0);
    }
    /* One past the line cap is refused; a long model one past its cap too. */
    memset(big, ' ', sizeof(big));
    memcpy(big, "{\"costUSD\":1}", 13);
    CHECK_OK(runner_usage_parse(&u, big, RUNNER_USAGE_LINE_MAX, NULL));
    CHECK_EQ_INT(runner_usage_parse(&u, big, RUNNER_USAGE_LINE_MAX + 1, NULL), E_INVALID);
    big[0] = '\0';
    snprintf(big, sizeof(big), "{\"model\":\"%0*d\"}", RUNNER_MODEL_MAX, 0);
    CHECK_OK(parse(&u, big));
    snprintf(big, sizeof(big), "{\"model\":\"%0*d\"}", RUNNER_MODEL_MAX + 1, 0);
    CHECK_EQ_INT(parse(&u, big), E_INVALID);
}

TEST(cost_numbers)
{
    static const struct {
        const char *in;
        int64_t want;
    } good[] = {
        {"0", 0},
        {"0.000001", 1},
        {"12.5", 12500000},
        {"0e5", 0},
        /* Finer than a micro-dollar: rounded half up, and never to nothing. */
        {"0.00045000000000000004", 450},
        {"0.0000015", 2},
        {"0.0000014999", 1},
        {"1e-7", 1},
        {"12.9999996", 13000000},
    };
    static const char *const bad[] = {"01", "1.", "1e", "-0"};
    int64_t v = -1;

    for (size_t i = 0; i < ARRAY_LEN(good); i++) {
        if (runner_cost_parse(&v, good[i].in, strlen(good[i].in)) != E_OK || v != good[i].want) {
            t_fail(__FILE__, __LINE__, "%s read as %lld, want %lld", good[i].in, (long long)v,
                   (long long)good[i].want);
        }
    }
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        if (runner_cost_parse(&v, bad[i], strlen(bad[i])) != E_INVALID) {
            t_fail(__FILE__, __LINE__, "%s accepted", bad[i]);
        }
    }
}

TEST(line_splitting)
{
    size_t len = 9, adv = 9;

    CHECK(runner_usage_next(&len, &adv, "ab\ncd", 5, false));
    CHECK_EQ_INT(len, 2);
    CHECK_EQ_INT(adv, 3);
    CHECK(!runner_usage_next(&len, &adv, "cd", 2, false)); /* unterminated: wait */
    CHECK(runner_usage_next(&len, &adv, "cd", 2, true));   /* unless the agent is done */
    CHECK_EQ_INT(adv, 2);
    CHECK(!runner_usage_next(&len, &adv, "", 0, true));
    CHECK(runner_usage_next(&len, &adv, "\n", 1, false));
    CHECK_EQ_INT(len, 0);
}

TEST(request_ids)
{
    char id[RUNNER_REQUEST_ID_MAX + 1], small[8];

    CHECK_OK(runner_request_id_usage(id, sizeof(id), "fix-it", 1234));
    CHECK_EQ_STR(id, "fix-it-u1234");
    CHECK_OK(runner_request_id_heartbeat(id, sizeof(id), "fix-it", 3, false));
    CHECK_EQ_STR(id, "fix-it-i3-h");
    CHECK_OK(runner_request_id_heartbeat(id, sizeof(id), "fix-it", 3, true));
    CHECK_EQ_STR(id, "fix-it-i3-f");
    CHECK_EQ_INT(runner_request_id_usage(small, sizeof(small), "fix-it", 1234), E_TOOBIG);
}

TEST(state_file_round_trip)
{
    struct runner_state st = {.offset = 987654321}, back;
    char dir[] = "/tmp/runner-test-XXXXXX", *path, text[RUNNER_STATE_MAX];
    size_t n;

    snprintf(st.model, sizeof(st.model), "claude-3-7-sonnet");
    n = runner_state_format(text, sizeof(text), &st);
    CHECK_OK(runner_state_parse(&back, text, n));
    CHECK_EQ_INT(back.offset, 987654321);
    CHECK_EQ_STR(back.model, "claude-3-7-sonnet");
    CHECK_EQ_INT(runner_state_parse(&back, "12", 2), E_INVALID);
    CHECK_EQ_INT(runner_state_parse(&back, "x\n\n", 3), E_INVALID);
    CHECK_EQ_INT(runner_state_parse(&back, "99999999999999999999\n\n", 22), E_INVALID);
    CHECK_EQ_INT(runner_state_parse(&back, "1\nm\nextra\n", 10), E_INVALID);
    CHECK(mkdtemp(dir) != NULL);
    path = xasprintf("%s/usage.jsonl.offset", dir);
    CHECK_OK(runner_state_load(&back, path, NULL)); /* missing: offset 0 */
    CHECK_EQ_INT(back.offset, 0);
    CHECK_OK(runner_state_save(path, &st, NULL));
    CHECK_OK(runner_state_load(&back, path, NULL));
    CHECK_EQ_INT(back.offset, 987654321);
    CHECK_EQ_STR(back.model, "claude-3-7-sonnet");
    unlink(path);
    rmdir(dir);
    free(path);
}

/* The runner's kept state file: a state of the same length is rewritten in place (the
 * same inode), one of another length replaces the file; each reads back as stored. */
TEST(state_file_kept_and_rewritten_in_place)
{
    struct runner_state_file f = {.fd = -1};
    struct runner_state st = {.offset = 100}, back;
    char dir[] = "/tmp/runner-test-XXXXXX", *path;
    struct stat a, b;

    CHECK(mkdtemp(dir) != NULL);
    path = xasprintf("%s/usage.jsonl.offset", dir);
    snprintf(st.model, sizeof(st.model), "m1");
    CHECK_OK(runner_state_store(&f, path, &st, NULL));
    CHECK(f.fd >= 0);
    CHECK_EQ_INT(stat(path, &a), 0);
    st.offset = 200;
    snprintf(st.model, sizeof(st.model), "m2");
    CHECK_OK(runner_state_store(&f, path, &st, NULL));
    CHECK_EQ_INT(stat(path, &b), 0);
    CHECK_EQ_INT(a.st_ino, b.st_ino); /* in place */
    CHECK_OK(runner_state_load(&back, path, NULL));
    CHECK_EQ_INT(back.offset, 200);
    CHECK_EQ_STR(back.model, "m2");
    st.offset = 1000; /* one digit more: a new file of the new length */
    CHECK_OK(runner_state_store(&f, path, &st, NULL));
    CHECK_OK(runner_state_load(&back, path, NULL));
    CHECK_EQ_INT(back.offset, 1000);
    CHECK_EQ_STR(back.model, "m2");
    CHECK_EQ_INT(stat(path, &b), 0);
    CHECK_EQ_INT((long long)b.st_size, 8);
    st.offset = 1001;
    CHECK_OK(runner_state_store(&f, path, &st, NULL));
    CHECK_OK(runner_state_load(&back, path, NULL));
    CHECK_EQ_INT(back.offset, 1001);
    runner_state_file_close(&f);
    CHECK_EQ_INT(f.fd, -1);
    unlink(path);
    rmdir(dir);
    free(path);
}

TEST(meter_answers_and_exit_codes)
{
    struct runner_meter_answer a = {0};
    static const char ok[] = "{\"allowed\":true,\"guidance\":\"use the cache\"}";
    static const char no[] = "{\"error\":\"model not\\nallowed\",\"reason\":\"Forbidden\"}";

    CHECK_EQ_INT(runner_meter_classify(E_OK, 200), RUNNER_METER_CONTINUE);
    CHECK_EQ_INT(runner_meter_classify(E_OK, 429), RUNNER_METER_PAUSED);
    CHECK_EQ_INT(runner_meter_classify(E_OK, 403), RUNNER_METER_FORBIDDEN);
    CHECK_EQ_INT(runner_meter_classify(E_OK, 401), RUNNER_METER_UNAUTHORIZED);
    CHECK_EQ_INT(runner_meter_classify(E_OK, 503), RUNNER_METER_RETRY);
    CHECK_EQ_INT(runner_meter_classify(E_AGAIN, 0), RUNNER_METER_RETRY);
    CHECK_EQ_INT(runner_meter_classify(E_OK, 400), RUNNER_METER_PROTOCOL);
    CHECK_EQ_INT(runner_meter_classify(E_TOOBIG, 200), RUNNER_METER_PROTOCOL);
    CHECK_EQ_INT(runner_exit_for(RUNNER_METER_PAUSED), 0);
    CHECK_EQ_INT(runner_exit_for(RUNNER_METER_FORBIDDEN), 3);
    CHECK_EQ_INT(runner_exit_for(RUNNER_METER_UNAUTHORIZED), 4);
    CHECK_EQ_INT(runner_exit_for(RUNNER_METER_RETRY), 5);
    CHECK_EQ_INT(runner_exit_for(RUNNER_METER_PROTOCOL), 7);
    CHECK_EQ_INT(runner_backoff_ms(1, 100), 100);
    CHECK_EQ_INT(runner_backoff_ms(3, 100), 400);
    CHECK_EQ_INT(runner_backoff_ms(30, 100), 5000);
    CHECK_EQ_INT(runner_backoff_ms(3, 10), 40);
    CHECK_EQ_INT(runner_backoff_ms(30, 10), 500);
    /* Within the attempts always; past them only while no server answered for less than
     * the unreachable window. */
    CHECK(runner_meter_again(7, 8, false, 0, 60000));
    CHECK(!runner_meter_again(8, 8, false, 0, 60000));
    CHECK(runner_meter_again(8, 8, true, 59999, 60000));
    CHECK(runner_meter_again(30, 8, true, 12000, 60000));
    CHECK(!runner_meter_again(30, 8, true, 60000, 60000));
    CHECK(!runner_meter_again(8, 8, true, 0, 0));
    runner_meter_answer_parse(&a, 200, ok, strlen(ok));
    CHECK_EQ_STR(a.guidance, "use the cache");
    runner_meter_answer_parse(&a, 403, no, strlen(no));
    CHECK_EQ_STR(a.reason, "model not?allowed"); /* one log line */
    runner_meter_answer_parse(&a, 200, "junk", 4);
    runner_meter_answer_cleanup(&a);
}

TEST(meter_body_is_exact)
{
    struct runner_meter_call c = {
        .request_id = "t-u0", .iteration = 2, .model = "m", .tokens = 1500, .cost_micros = 22500};
    char *body = runner_meter_body(&c);

    CHECK_EQ_STR(body, "{\"requestId\":\"t-u0\",\"iteration\":2,\"tokensUsed\":1500,"
                       "\"costUSD\":\"0.0225\",\"model\":\"m\"}");
    free(body);
}

TEST(iteration_verdict_and_failure_text)
{
    struct runner_iteration it = {
        .iteration = 2, .agent_status = 0, .verify_ran = true, .verify_status = 1};
    char line[128], tail[4096];
    char *text;
    size_t n = 0;

    CHECK(!runner_iteration_ok(&it));
    runner_iteration_line(line, sizeof(line), &it, 5);
    CHECK_EQ_STR(line, "iteration 2/5: agent exit 0, verify exit 1");
    for (int i = 0; i < 30; i++) {
        n += (size_t)snprintf(tail + n, sizeof(tail) - n, "line %d\n", i);
    }
    tail[3] = '\0'; /* a NUL in the output must not cut the text short */
    text = runner_failure_text(&it, tail, n);
    CHECK(strncmp(text, "iteration 2: the verify command failed (exit 1)", 47) == 0);
    CHECK(strstr(text, "line 9\n") == NULL && strstr(text, "line 10\nline 11") != NULL);
    CHECK(strstr(text, "line 29\n") != NULL);
    free(text);
    it.verify_status = 0;
    CHECK(runner_iteration_ok(&it));
    it.preview_ran = true;
    it.preview_status = 503;
    CHECK(!runner_iteration_ok(&it));
    it.preview_status = 204;
    CHECK(runner_iteration_ok(&it));
    it.agent_status = 137;
    CHECK(!runner_iteration_ok(&it));
    text = runner_failure_text(&it, NULL, 0);
    CHECK_EQ_STR(text, "iteration 2: the agent command failed (exit 137)");
    free(text);
}

struct fake_env {
    const char *const *kv; /* name, value, ..., NULL */
};

static const char *fake_get(const char *name, void *ud)
{
    const struct fake_env *e = ud;

    for (size_t i = 0; e->kv[i] != NULL; i += 2) {
        if (strcmp(e->kv[i], name) == 0) {
            return e->kv[i + 1];
        }
    }
    return NULL;
}

TEST(config_from_env)
{
    static const char *const good[] = {"DIVERGE_TASK_NAME",
                                       "fix-it",
                                       "DIVERGE_REPO_URL",
                                       "file:///r.git",
                                       "DIVERGE_AGENT_CMD",
                                       "sh a.sh",
                                       "DIVERGE_TOKEN_FILE",
                                       "/t",
                                       "DIVERGE_METER_URL",
                                       "http://127.0.0.1:1/m",
                                       "DIVERGE_USAGE_FILE",
                                       "/u",
                                       "DIVERGE_MAX_ITERATIONS",
                                       "3",
                                       NULL};
    static const char *const badbranch[] = {"DIVERGE_TASK_NAME",
                                            "fix-it",
                                            "DIVERGE_REPO_URL",
                                            "file:///r.git",
                                            "DIVERGE_AGENT_CMD",
                                            "x",
                                            "DIVERGE_MACAROON_TOKEN",
                                            "t",
                                            "DIVERGE_METER_URL",
                                            "u",
                                            "DIVERGE_WORKING_BRANCH",
                                            "--upload-pack=x",
                                            NULL};
    static const char *const badstart[] = {"DIVERGE_TASK_NAME",
                                           "fix-it",
                                           "DIVERGE_REPO_URL",
                                           "file:///r.git",
                                           "DIVERGE_AGENT_CMD",
                                           "x",
                                           "DIVERGE_MACAROON_TOKEN",
                                           "t",
                                           "DIVERGE_METER_URL",
                                           "u",
                                           "DIVERGE_START_ITERATION",
                                           "0",
                                           NULL};
    static const char *const nometer[] = {"DIVERGE_TASK_NAME",
                                          "fix-it",
                                          "DIVERGE_REPO_URL",
                                          "file:///r.git",
                                          "DIVERGE_AGENT_CMD",
                                          "x",
                                          "DIVERGE_MACAROON_TOKEN",
                                          "t",
                                          NULL};
    struct fake_env e = {good};
    struct runner_config c;
    struct err err = {0};

    CHECK_OK(runner_config_load(&c, fake_get, &e, &err));
    CHECK_EQ_STR(c.working_branch, "agent/fix-it");
    CHECK_EQ_STR(c.base_branch, "main");
    CHECK_EQ_STR(c.workspace, "/workspace");
    CHECK_EQ_STR(c.state_file, "/u.offset");
    CHECK_EQ_INT(c.start_iteration, 1);
    CHECK_EQ_INT(c.max_iterations, 3);
    CHECK(c.token_env == NULL && c.push_url == NULL);
    CHECK_EQ_INT(c.run, 1);
    CHECK_EQ_STR(c.id_prefix, "fix-it"); /* run 1: the ids of older servers' runners */
    runner_config_cleanup(&c);
    e.kv = badbranch;
    CHECK_EQ_INT(runner_config_load(&c, fake_get, &e, &err), E_INVALID);
    CHECK(strstr(err.msg, "DIVERGE_WORKING_BRANCH") != NULL);
    runner_config_cleanup(&c);
    e.kv = badstart;
    CHECK_EQ_INT(runner_config_load(&c, fake_get, &e, &err), E_INVALID);
    runner_config_cleanup(&c);
    e.kv = nometer;
    CHECK_EQ_INT(runner_config_load(&c, fake_get, &e, &err), E_INVALID);
    runner_config_cleanup(&c);
}

/* DIVERGE_RUN: from run 2 on the requestIds carry the run, so a new run's usage file,
 * metered again from offset 0, never reuses an id of an earlier run (SPEC §14). */
TEST(config_run)
{
    static const char *const run2[] = {"DIVERGE_TASK_NAME",
                                       "fix-it",
                                       "DIVERGE_REPO_URL",
                                       "file:///r.git",
                                       "DIVERGE_AGENT_CMD",
                                       "x",
                                       "DIVERGE_MACAROON_TOKEN",
                                       "t",
                                       "DIVERGE_METER_URL",
                                       "u",
                                       "DIVERGE_RUN",
                                       "2",
                                       NULL};
    static const char *const bad[] = {"DIVERGE_TASK_NAME",
                                      "fix-it",
                                      "DIVERGE_REPO_URL",
                                      "file:///r.git",
                                      "DIVERGE_AGENT_CMD",
                                      "x",
                                      "DIVERGE_MACAROON_TOKEN",
                                      "t",
                                      "DIVERGE_METER_URL",
                                      "u",
                                      "DIVERGE_RUN",
                                      "0",
                                      NULL};
    struct fake_env e = {run2};
    struct runner_config c;
    struct err err = {0};
    char id[RUNNER_REQUEST_ID_MAX + 1];

    CHECK_OK(runner_config_load(&c, fake_get, &e, &err));
    CHECK_EQ_INT(c.run, 2);
    CHECK_OK(runner_request_id_usage(id, sizeof(id), c.id_prefix, 0));
    CHECK_EQ_STR(id, "fix-it-r2-u0");
    runner_config_cleanup(&c);
    e.kv = bad;
    CHECK_EQ_INT(runner_config_load(&c, fake_get, &e, &err), E_INVALID);
    CHECK(strstr(err.msg, "DIVERGE_RUN") != NULL);
    runner_config_cleanup(&c);
}

/* DIVERGE_SANDBOX_NETWORK: none by default; proxy needs DIVERGE_EGRESS_SOCKET; nothing
 * else is accepted. */
TEST(config_network)
{
    static const char *const proxy[] = {"DIVERGE_TASK_NAME",
                                        "fix-it",
                                        "DIVERGE_REPO_URL",
                                        "file:///r.git",
                                        "DIVERGE_AGENT_CMD",
                                        "x",
                                        "DIVERGE_MACAROON_TOKEN",
                                        "t",
                                        "DIVERGE_METER_URL",
                                        "u",
                                        "DIVERGE_SANDBOX_NETWORK",
                                        "proxy",
                                        "DIVERGE_EGRESS_SOCKET",
                                        "/diverge/egress/proxy.sock",
                                        NULL};
    static const char *const nosock[] = {"DIVERGE_TASK_NAME",
                                         "fix-it",
                                         "DIVERGE_REPO_URL",
                                         "file:///r.git",
                                         "DIVERGE_AGENT_CMD",
                                         "x",
                                         "DIVERGE_MACAROON_TOKEN",
                                         "t",
                                         "DIVERGE_METER_URL",
                                         "u",
                                         "DIVERGE_SANDBOX_NETWORK",
                                         "proxy",
                                         NULL};
    static const char *const bad[] = {"DIVERGE_TASK_NAME",
                                      "fix-it",
                                      "DIVERGE_REPO_URL",
                                      "file:///r.git",
                                      "DIVERGE_AGENT_CMD",
                                      "x",
                                      "DIVERGE_MACAROON_TOKEN",
                                      "t",
                                      "DIVERGE_METER_URL",
                                      "u",
                                      "DIVERGE_SANDBOX_NETWORK",
                                      "open",
                                      NULL};
    struct fake_env e = {proxy};
    struct runner_config c;
    struct err err = {0};

    CHECK_OK(runner_config_load(&c, fake_get, &e, &err));
    CHECK_EQ_STR(c.network, "proxy");
    CHECK_EQ_STR(c.egress_socket, "/diverge/egress/proxy.sock");
    runner_config_cleanup(&c);
    e.kv = nosock;
    CHECK_EQ_INT(runner_config_load(&c, fake_get, &e, &err), E_INVALID);
    CHECK(strstr(err.msg, "DIVERGE_EGRESS_SOCKET") != NULL);
    runner_config_cleanup(&c);
    e.kv = bad;
    CHECK_EQ_INT(runner_config_load(&c, fake_get, &e, &err), E_INVALID);
    CHECK(strstr(err.msg, "DIVERGE_SANDBOX_NETWORK") != NULL);
    runner_config_cleanup(&c);
}

TEST(env_build_and_tail)
{
    char a[] = "A=1", g[] = "DIVERGE_GUIDANCE=old", b[] = "B=2";
    char *const base[] = {a, g, b, NULL};
    const char *const unset[] = {"DIVERGE_GUIDANCE", NULL};
    const char *const set[] = {"DIVERGE_GUIDANCE=new", NULL};
    char **env = runner_env_build(base, unset, set);
    struct runner_tail *t = xcalloc(1, sizeof(*t));
    char *big = xmalloc(3 * RUNNER_TAIL_BYTES);

    CHECK_EQ_STR(env[0], "A=1");
    CHECK_EQ_STR(env[1], "B=2");
    CHECK_EQ_STR(env[2], "DIVERGE_GUIDANCE=new");
    CHECK(env[3] == NULL);
    runner_env_free(env);
    memset(big, 'a', 3 * RUNNER_TAIL_BYTES);
    big[3 * RUNNER_TAIL_BYTES - 1] = 'z';
    runner_tail_add(t, "hello", 5);
    runner_tail_add(t, big, 3 * RUNNER_TAIL_BYTES);
    CHECK_EQ_INT(t->len, RUNNER_TAIL_BYTES);
    CHECK(t->data[t->len - 1] == 'z');
    for (int i = 0; i < 5; i++) {
        runner_tail_add(t, big + 2 * RUNNER_TAIL_BYTES + 1, RUNNER_TAIL_BYTES - 1);
        CHECK(t->len <= 2 * RUNNER_TAIL_BYTES && t->data[t->len - 1] == 'z');
    }
    free(big);
    free(t);
}

TEST(token_model_from_caveat)
{
    /* SPEC §8's reference token has no models caveat. */
    static const char ref[] = "AgEHZGl2ZXJnZQIIdGFzay0xMjMAAhJ0YXNrX2lkID0gdGFzay0xMjMAAhNtYXhf"
                              "Y29zdF91c2QgPSA1LjAwAAAGINK-JhAmYkGspdMojx9f3ildDI80uEXIHF3q5jq8"
                              "itwQ";
    char *m = runner_token_model(ref);

    unsigned char key[TOKEN_ROOT_KEY_LEN] = {0};
    struct token *t = NULL;
    char *enc = NULL;

    CHECK(m == NULL);
    CHECK(runner_token_model("not a token") == NULL);
    CHECK_OK(token_mint(&t, key, TOKEN_LOCATION, "task-1", NULL));
    CHECK_OK(token_add_caveat(t, "modelsx = nope", NULL));
    CHECK_OK(token_add_caveat(t, "models = claude-*,gpt-4o", NULL));
    token_encode(&enc, t);
    m = runner_token_model(enc);
    CHECK_EQ_STR(m, "claude-*");
    free(m);
    free(enc);
    token_free(t);
}

T_MAIN

/* The start gate: "g" goes on, "c" then "g" goes on in two steps, anything else or the
 * server's end closed calls the start off; the descriptor is closed once it is decided
 * (the agent never inherits it). */
TEST(start_gate)
{
    struct runner_config cfg = {.gate_fd = -1};
    struct err err = {0};
    bool later = true;
    int p[2];

    CHECK_OK(runner_gate_wait(&cfg, &later, &err)); /* no gate: nothing to wait for */
    CHECK(!later);
    const char *sent[] = {"g", "x", NULL};
    for (size_t i = 0; i < 3; i++) {
        CHECK(pipe(p) == 0);
        if (sent[i] != NULL) {
            CHECK(write(p[1], sent[i], 1) == 1);
        }
        close(p[1]);
        cfg.gate_fd = p[0];
        CHECK_EQ_INT(runner_gate_wait(&cfg, &later, &err), i == 0 ? E_OK : E_FAIL);
        CHECK(!later);
        CHECK(fcntl(p[0], F_GETFD) == -1); /* closed */
    }
    const char *two[] = {"cg", "c", "cx"};
    for (size_t i = 0; i < 3; i++) {
        CHECK(pipe(p) == 0);
        CHECK(write(p[1], two[i], strlen(two[i])) == (ssize_t)strlen(two[i]));
        close(p[1]);
        cfg.gate_fd = p[0];
        CHECK_OK(runner_gate_wait(&cfg, &later, &err));
        CHECK(later);
        CHECK(fcntl(p[0], F_GETFD) == FD_CLOEXEC); /* open, not for the git processes */
        CHECK_EQ_INT(runner_gate_go(&cfg, &err), i == 0 ? E_OK : E_FAIL);
        CHECK(fcntl(p[0], F_GETFD) == -1);
    }
}

/* Writes the gate message "e", LEN (big-endian) and BODY[0..n) into a new pipe whose read
 * end becomes DIVERGE_START_GATE_FD; the write end is closed. */
static void gate_message(uint32_t len, const char *body, size_t n)
{
    unsigned char head[5] = {'e', (unsigned char)(len >> 24), (unsigned char)(len >> 16),
                             (unsigned char)(len >> 8), (unsigned char)len};
    char fd[16];
    int p[2];

    CHECK(pipe(p) == 0);
    CHECK(write(p[1], head, sizeof(head)) == (ssize_t)sizeof(head));
    CHECK(n == 0 || write(p[1], body, n) == (ssize_t)n);
    close(p[1]);
    snprintf(fd, sizeof(fd), "%d", p[0]);
    setenv("DIVERGE_START_GATE_FD", fd, 1);
    setenv("DIVERGE_START_GATE_ENV", "1", 1);
}

static int g_before_set_calls;
static char **g_saved_env;

static void before_set(void)
{
    g_before_set_calls++;
}

/* A warm slot's environment through the gate: exactly the entries sent (and the gate's own
 * descriptor), the rest gone; a malformed message changes nothing and fails. */
TEST(start_gate_env)
{
    extern char **environ;
    struct err err = {0};
    char **saved;
    size_t n = 0;

    while (environ[n] != NULL) {
        n++;
    }
    saved = xcalloc(n + 1, sizeof(*saved));
    for (size_t i = 0; i < n; i++) {
        saved[i] = xstrdup(environ[i]);
    }
    unsetenv("DIVERGE_START_GATE_ENV");
    CHECK_OK(runner_gate_env(before_set, &err)); /* not a slot: nothing read */
    CHECK_EQ_INT(g_before_set_calls, 0);

    const struct {
        uint32_t len;
        const char *body;
        size_t n;
    } bad[] = {
        {0, "", 0},                       /* empty */
        {4, "A=1", 3},                    /* no final NUL */
        {5, "A=1\0", 4},                  /* shorter than said */
        {3, "=1\0", 3},                   /* no name */
        {4, "AB\0\0", 4},                 /* no "=" */
        {RUNNER_GATE_ENV_MAX + 1, "", 0}, /* too long */
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        gate_message(bad[i].len, bad[i].body, bad[i].n);
        CHECK_EQ_INT(runner_gate_env(before_set, &err), E_FAIL);
        CHECK(getenv("DIVERGE_START_GATE_ENV") != NULL); /* the environment unchanged */
        close((int)strtol(getenv("DIVERGE_START_GATE_FD"), NULL, 10));
    }
    CHECK_EQ_INT(g_before_set_calls, 0);

    static const char good[] = "DIVERGE_TASK_NAME=t1\0PATH=/bin\0DIVERGE_START_GATE_ENV=1\0"
                               "V=a=b\0";
    gate_message(sizeof(good) - 1, good, sizeof(good) - 1);
    const char *fd = getenv("DIVERGE_START_GATE_FD");
    char *want_fd = xstrdup(fd);
    CHECK_OK(runner_gate_env(before_set, &err));
    CHECK_EQ_INT(g_before_set_calls, 1);
    CHECK_EQ_STR(getenv("DIVERGE_TASK_NAME"), "t1");
    CHECK_EQ_STR(getenv("PATH"), "/bin");
    CHECK_EQ_STR(getenv("V"), "a=b");
    CHECK_EQ_STR(getenv("DIVERGE_START_GATE_FD"), want_fd);
    CHECK(getenv("DIVERGE_START_GATE_ENV") == NULL && getenv("HOME") == NULL);
    n = 0;
    while (environ[n] != NULL) {
        n++;
    }
    CHECK_EQ_INT(n, 4);
    CHECK(fcntl((int)strtol(want_fd, NULL, 10), F_GETFD) ==
          FD_CLOEXEC); /* kept for the "c" and "g" */
    close((int)strtol(want_fd, NULL, 10));
    free(want_fd);
    clearenv();
    for (size_t i = 0; saved[i] != NULL; i++) {
        putenv(saved[i]); /* the process's environment from now on */
    }
    g_saved_env = saved; /* the environment points into it from now on */
}

/* Waits until a file stamped now in DIR is stamped later than PATH's last change (any
 * time stamp granularity): PATH's change is then older than the next snapshot's stamp. */
static void wait_past_change(const char *dir, const char *path)
{
    char *probe = xasprintf("%s/probe", dir);
    struct stat a, b;
    int fd;

    CHECK(stat(path, &a) == 0);
    do {
        fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        CHECK(fd >= 0 && futimens(fd, NULL) == 0 && fstat(fd, &b) == 0);
        close(fd);
    } while (b.st_ctim.tv_sec < a.st_ctim.tv_sec ||
             (b.st_ctim.tv_sec == a.st_ctim.tv_sec && b.st_ctim.tv_nsec <= a.st_ctim.tv_nsec));
    unlink(probe);
    free(probe);
}

static bool snap_equal(const struct buf *a, const struct buf *b)
{
    return a->len == b->len && memcmp(a->data, b->data, a->len) == 0;
}

/* Writes DIR/NAME (TEXT), waits past that change, and checks that the next snapshot
 * differs from *A, which becomes it. */
static void snapshot_sees(struct buf *a, const struct runner_config *cfg, const char *top,
                          const char *dir, const char *name, const char *text)
{
    char *path = xasprintf("%s/%s", dir, name);
    struct buf b;

    put_file(dir, name, text);
    wait_past_change(top, path);
    CHECK(runner_wip_snapshot(&b, cfg));
    CHECK(!snap_equal(a, &b));
    buf_cleanup(a);
    *a = b;
    free(path);
}

/* The checkpoint's snapshot (runner_wip_snapshot): the same text while nothing changed
 * but git's own files, another after a changed or new file, directory or excludes; no
 * vouching for a change as new as the snapshot, or for a git config that names other
 * files. */
TEST(wip_snapshot_sees_every_change)
{
    char tmpl[] = "/tmp/diverge-wipsnap-XXXXXX";
    char *top = mkdtemp(tmpl), *ws, *home, *gitdir, *path;
    struct runner_config cfg = {0};
    struct buf a, b;
    int fd;
    char *old_home = getenv("HOME") != NULL ? xstrdup(getenv("HOME")) : NULL;

    CHECK(top != NULL);
    ws = xasprintf("%s/ws", top);
    home = xasprintf("%s/home", top);
    gitdir = xasprintf("%s/.git", ws);
    CHECK(mkdir(ws, 0700) == 0 && mkdir(home, 0700) == 0 && mkdir(gitdir, 0700) == 0);
    setenv("HOME", home, 1);
    unsetenv("XDG_CONFIG_HOME");
    unsetenv("GIT_CONFIG_GLOBAL");
    cfg.workspace = ws;
    put_file(gitdir, "config", "[core]\n\tbare = false\n");
    put_file(ws, "a.txt", "a\n");
    path = xasprintf("%s/a.txt", ws);
    wait_past_change(top, path);
    CHECK(runner_wip_snapshot(&a, &cfg));
    put_file(gitdir, "index", "git's own\n"); /* not what the checkpoint reads */
    CHECK(runner_wip_snapshot(&b, &cfg));
    CHECK(snap_equal(&a, &b));
    buf_cleanup(&b);
    snapshot_sees(&a, &cfg, top, ws, "a.txt", "ab\n");
    free(path);
    path = xasprintf("%s/d", ws);
    CHECK(mkdir(path, 0700) == 0);
    snapshot_sees(&a, &cfg, top, path, "new", "");
    free(path);
    path = xasprintf("%s/info", gitdir);
    CHECK(mkdir(path, 0700) == 0);
    snapshot_sees(&a, &cfg, top, path, "exclude", "a.txt\n");
    free(path);
    path = xasprintf("%s/later", ws); /* stamped after the snapshot's own stamp */
    fd = open(path, O_WRONLY | O_CREAT, 0600);
    CHECK(fd >= 0 && futimens(fd, (struct timespec[]){{.tv_sec = time(NULL) + 3600},
                                                      {.tv_sec = time(NULL) + 3600}}) == 0);
    close(fd);
    CHECK(!runner_wip_snapshot(&b, &cfg)); /* it may change again within its stamp */
    buf_cleanup(&b);
    unlink(path);
    put_file(home, ".gitconfig", "[core]\n\texcludesFile = /elsewhere\n");
    CHECK(!runner_wip_snapshot(&b, &cfg)); /* a file the snapshot does not read */
    buf_cleanup(&b);
    put_file(home, ".gitconfig", "");
    put_file(gitdir, "config", "[Include]\n\tpath = other\n");
    free(path);
    path = xasprintf("%s/config", gitdir);
    wait_past_change(top, path);
    CHECK(!runner_wip_snapshot(&b, &cfg));
    buf_cleanup(&b);
    buf_cleanup(&a);
    free(path);
    path = xasprintf("rm -rf -- '%s'", top);
    CHECK(system(path) == 0);
    free(path);
    if (old_home != NULL) {
        setenv("HOME", old_home, 1);
    }
    free(old_home);
    free(ws);
    free(home);
    free(gitdir);
}
