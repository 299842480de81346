/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of controller/: the pure phase/token decision, and one reconcile pass on the
 * real SQLite store (":memory:") minting, pausing and re-minting tokens. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "controller/controller.h"
#include "controller/controller_int.h"
#include "sandbox/sandbox.h"
#include "tests/t_check.h"

/* Removes DIR and everything under it (a test's scratch folder under /tmp). */
static void rm_tree(const char *dir)
{
    char *cmd = xasprintf("rm -rf -- '%s'", dir);

    CHECK(system(cmd) == 0);
    free(cmd);
}

static struct task_view view(enum task_phase p, bool suspended)
{
    struct task_view v;
    memset(&v, 0, sizeof(v));
    v.phase = p;
    v.suspended = suspended;
    return v;
}

TEST(decide_table)
{
    static const struct {
        enum task_phase phase;
        bool suspended, token_active, can_run, noted;
        enum controller_action want;
    } cases[] = {
        {TASK_PENDING, false, false, true, false, CONTROLLER_ACTIVATE},
        {TASK_PENDING, false, false, false, false, CONTROLLER_WAIT},
        {TASK_PENDING, false, false, false, true, CONTROLLER_NOTHING},
        {TASK_PENDING, true, false, true, false, CONTROLLER_PAUSE},
        {TASK_ACTIVE, false, true, true, false, CONTROLLER_NOTHING},
        {TASK_ACTIVE, false, false, true, false, CONTROLLER_ACTIVATE},
        {TASK_ACTIVE, true, true, true, false, CONTROLLER_PAUSE},
        {TASK_PAUSING, true, true, true, false, CONTROLLER_PAUSE},
        {TASK_PAUSING, true, false, true, false, CONTROLLER_PAUSE},
        /* Resumed while Pausing (server died mid-pause): the pause finishes first. */
        {TASK_PAUSING, false, false, true, false, CONTROLLER_PAUSE},
        {TASK_PAUSED, true, false, true, false, CONTROLLER_NOTHING},
        {TASK_PAUSED, true, true, true, false, CONTROLLER_PAUSE},
        {TASK_PAUSED, false, false, true, false, CONTROLLER_ACTIVATE},
        {TASK_PAUSED, false, false, false, false, CONTROLLER_NOTHING},
        {TASK_COMPLETED, false, true, true, false, CONTROLLER_REVOKE},
        {TASK_FAILED, false, false, true, false, CONTROLLER_NOTHING},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        struct task_view v = view(cases[i].phase, cases[i].suspended);
        struct controller_observed o = {.token_active = cases[i].token_active,
                                        .can_run = cases[i].can_run,
                                        .waiting_noted = cases[i].noted};
        enum controller_action a = controller_decide(&v, &o);
        if (a != cases[i].want) {
            t_fail(__FILE__, __LINE__, "case %zu: got %d want %d", i, a, cases[i].want);
        }
    }
}

/* With a sandbox provider: one row per phase and observed sandbox state. */
TEST(decide_sandbox_table)
{
    enum { A = SANDBOX_ABSENT, R = SANDBOX_RUNNING, P = SANDBOX_PAUSED, X = SANDBOX_EXITED };
    static const struct {
        enum task_phase phase;
        bool suspended, token_active, can_run, timed_out, ws;
        int sandbox, code;
        enum controller_action want;
    } cases[] = {
        {TASK_PENDING, false, false, true, false, false, A, 0, CONTROLLER_PROVISION},
        {TASK_PENDING, false, false, false, false, false, A, 0, CONTROLLER_FAIL_SANDBOX},
        {TASK_PENDING, true, false, true, false, false, A, 0, CONTROLLER_PAUSE},
        {TASK_PROVISIONING, false, false, true, false, true, A, 0, CONTROLLER_PROVISION},
        {TASK_ACTIVE, false, true, true, false, true, R, 0, CONTROLLER_NOTHING},
        {TASK_ACTIVE, false, true, true, true, true, R, 0, CONTROLLER_TIMEOUT},
        {TASK_ACTIVE, false, true, true, false, true, X, 0, CONTROLLER_COMPLETE},
        {TASK_ACTIVE, false, true, true, false, true, X, 2, CONTROLLER_FAIL_RUNNER},
        {TASK_ACTIVE, false, true, true, false, true, A, 0, CONTROLLER_RESTART},
        {TASK_ACTIVE, false, true, true, false, false, A, 0, CONTROLLER_FAIL_SANDBOX},
        {TASK_ACTIVE, false, true, false, false, true, A, 0, CONTROLLER_FAIL_SANDBOX},
        {TASK_ACTIVE, true, true, true, false, true, R, 0, CONTROLLER_PAUSE},
        {TASK_PAUSING, true, true, true, false, true, R, 0, CONTROLLER_PAUSE},
        /* Restarted while Pausing: the sandbox died with the server, the pause finishes. */
        {TASK_PAUSING, true, false, true, false, true, A, 0, CONTROLLER_PAUSE},
        {TASK_PAUSING, false, false, true, false, true, A, 0, CONTROLLER_PAUSE},
        {TASK_PAUSING, true, false, true, true, true, P, 0, CONTROLLER_PAUSE},
        {TASK_PAUSED, true, false, true, false, true, P, 0, CONTROLLER_NOTHING},
        {TASK_PAUSED, true, true, true, false, true, R, 0, CONTROLLER_PAUSE},
        {TASK_PAUSED, true, false, true, false, true, X, 0, CONTROLLER_PUSH_WIP},
        {TASK_PAUSED, false, false, true, false, true, P, 0, CONTROLLER_THAW},
        {TASK_PAUSED, false, false, true, false, true, X, 0, CONTROLLER_RESUME_START},
        {TASK_PAUSED, false, false, true, false, true, R, 0, CONTROLLER_RESUME_START},
        {TASK_PAUSED, false, false, true, false, true, A, 0, CONTROLLER_RESUME_START},
        {TASK_PAUSED, false, false, true, false, false, A, 0, CONTROLLER_FAIL_SANDBOX},
        /* Paused before its first sandbox (never_started, row 99 below). */
        {TASK_PAUSED, false, false, true, false, false, A, 99, CONTROLLER_PROVISION},
        {TASK_PAUSED, false, false, false, false, false, A, 99, CONTROLLER_FAIL_SANDBOX},
        {TASK_COMPLETED, false, true, true, false, true, A, 0, CONTROLLER_REVOKE},
        {TASK_FAILED, false, false, true, false, true, X, 1, CONTROLLER_STOP},
        {TASK_FAILED, false, false, true, false, true, A, 0, CONTROLLER_NOTHING},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        struct task_view v = view(cases[i].phase, cases[i].suspended);
        struct controller_observed o = {.token_active = cases[i].token_active,
                                        .runs_sandboxes = true,
                                        .can_run = cases[i].can_run,
                                        .timed_out = cases[i].timed_out,
                                        .workspace_exists = cases[i].ws,
                                        .sandbox = cases[i].sandbox,
                                        .never_started = cases[i].code == 99,
                                        .exit_code = cases[i].code == 99 ? 0 : cases[i].code};
        enum controller_action a = controller_decide(&v, &o);
        if (a != cases[i].want) {
            t_fail(__FILE__, __LINE__, "case %zu: got %s want %s", i, controller_action_name(a),
                   controller_action_name(cases[i].want));
        }
    }
}

/* spec.run above status.run on a finished task starts that run (SPEC §14), with or
 * without a sandbox provider, stopping whatever still runs; elsewhere it changes nothing. */
TEST(decide_rerun)
{
    static const struct {
        enum task_phase phase;
        int64_t run, status_run;
        bool sandboxes;
        int sandbox;
        enum controller_action want;
    } cases[] = {
        {TASK_COMPLETED, 2, 1, true, SANDBOX_ABSENT, CONTROLLER_RERUN},
        {TASK_FAILED, 3, 2, true, SANDBOX_EXITED, CONTROLLER_RERUN},
        {TASK_FAILED, 2, 1, false, SANDBOX_ABSENT, CONTROLLER_RERUN},
        {TASK_COMPLETED, 2, 2, true, SANDBOX_ABSENT, CONTROLLER_NOTHING},
        {TASK_COMPLETED, 1, 1, false, SANDBOX_ABSENT, CONTROLLER_NOTHING},
        {TASK_ACTIVE, 2, 1, true, SANDBOX_RUNNING, CONTROLLER_NOTHING},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        struct task_view v = view(cases[i].phase, false);
        struct controller_observed o = {.runs_sandboxes = cases[i].sandboxes,
                                        .can_run = true,
                                        .workspace_exists = true,
                                        .sandbox = cases[i].sandbox};
        v.run = cases[i].run;
        v.status_run = cases[i].status_run;
        enum controller_action a = controller_decide(&v, &o);
        if (a != cases[i].want) {
            t_fail(__FILE__, __LINE__, "case %zu: got %s want %s", i, controller_action_name(a),
                   controller_action_name(cases[i].want));
        }
    }
}

/* Started under another --sandbox-provider: started again (workspace or not), never
 * failed as "workspace gone"; without that, a gone workspace still fails. */
TEST(decide_provider_changed)
{
    struct task_view v = view(TASK_ACTIVE, false);
    struct controller_observed o = {.token_active = true,
                                    .runs_sandboxes = true,
                                    .can_run = true,
                                    .sandbox = SANDBOX_ABSENT,
                                    .provider_changed = true};

    CHECK(controller_decide(&v, &o) == CONTROLLER_RESTART);
    o.workspace_exists = true;
    CHECK(controller_decide(&v, &o) == CONTROLLER_RESTART);
    v = view(TASK_PAUSED, false);
    o.workspace_exists = false;
    CHECK(controller_decide(&v, &o) == CONTROLLER_RESUME_START);
    o.can_run = false;
    CHECK(controller_decide(&v, &o) == CONTROLLER_FAIL_SANDBOX);
    v = view(TASK_ACTIVE, false);
    o.can_run = true;
    o.provider_changed = false;
    CHECK(controller_decide(&v, &o) == CONTROLLER_FAIL_SANDBOX);
    /* A gone workspace with a checkpoint in staging: started again from it (SPEC §14). */
    o.checkpoint = true;
    CHECK(controller_decide(&v, &o) == CONTROLLER_RESTART);
    v = view(TASK_PAUSED, false);
    CHECK(controller_decide(&v, &o) == CONTROLLER_RESUME_START);
    o.can_run = false;
    CHECK(controller_decide(&v, &o) == CONTROLLER_FAIL_SANDBOX);
}

/* sandbox.timeoutSeconds counts only the time a sandbox ran under a live server. */
TEST(active_time_record)
{
    struct controller_active a = {0};
    const uint64_t run1 = 0x11, run2 = 0x23;
    char buf[128];

    CHECK_EQ_INT(controller_active_total(&a, run1, 5000), 0);
    controller_active_begin(&a, run1, 1000);
    CHECK_EQ_INT(controller_active_total(&a, run1, 3000), 2000);
    controller_active_begin(&a, run1, 2000); /* already counting: no-op */
    CHECK_EQ_INT(controller_active_total(&a, run1, 3000), 2000);
    controller_active_seen(&a, run1, 2500);
    controller_active_seen(&a, run2, 9000); /* another run's checkpoint: ignored */
    /* run1 died (kill -9) after its checkpoint at 2500: for run2 the interval ended there,
     * whatever the time now (the server was down). */
    CHECK_EQ_INT(controller_active_total(&a, run2, 100000), 1500);
    controller_active_begin(&a, run2, 100000); /* restarted: closes the dead interval */
    CHECK_EQ_INT(a.used_ms, 1500);
    CHECK_EQ_INT(controller_active_total(&a, run2, 101000), 2500);
    controller_active_end(&a, run2, 102000); /* paused */
    CHECK_EQ_INT(controller_active_total(&a, run2, 500000), 3500);
    CHECK_EQ_INT(a.since_ms, 0);
    controller_active_end(&a, run2, 600000); /* ending twice changes nothing */
    CHECK_EQ_INT(controller_active_total(&a, run2, 700000), 3500);
    controller_active_begin(&a, run2, 800000);
    CHECK_EQ_INT(controller_active_total(&a, run2, 799000), 3500); /* clock stepped back */
    /* The file form round-trips; anything malformed reads as nothing counted. */
    CHECK(controller_active_format(buf, sizeof(buf), &a) > 0);
    struct controller_active b;
    CHECK(controller_active_parse(&b, buf));
    CHECK(memcmp(&a, &b, sizeof(a)) == 0);
    CHECK(!controller_active_parse(&b, "12 x"));
    CHECK_EQ_INT(b.used_ms, 0);
    CHECK(!controller_active_parse(&b, "-5 0 0 0"));
    CHECK(!controller_active_parse(&b, "5 100 50 1")); /* seen before since */
}

/* The record survives a server that dies without closing it (kill -9): the next server
 * ends the open interval at the dead one's last checkpoint. */
TEST(active_time_survives_restart)
{
    unsigned char key[TOKEN_ROOT_KEY_LEN] = {0};
    char dir[] = "/tmp/diverge-active-XXXXXX";
    struct controller_config cfg = {
        .data_dir = mkdtemp(dir), .root_key = key, .sandbox_provider = "none", .manual = true};
    struct task_store *st = NULL;
    struct controller *c = NULL;
    struct err err = {0};

    CHECK_OK(task_store_sqlite_open(&st, ":memory:", clock_system(), &err));
    CHECK_OK(controller_new(&c, st, &cfg, &err));
    controller_note_running(c, "default", "t", true, 10000);
    controller_note_seen(c, "default", "t", 14000);
    CHECK_EQ_INT(controller_active_ms(c, "default", "t", 15000), 5000);
    controller_free(c); /* nothing closes the interval: as a crash */
    CHECK_OK(controller_new(&c, st, &cfg, &err));
    CHECK_EQ_INT(controller_active_ms(c, "default", "t", 90000), 4000);
    controller_note_running(c, "default", "t", true, 90000);
    CHECK_EQ_INT(controller_active_ms(c, "default", "t", 91000), 5000);
    controller_note_running(c, "default", "t", false, 92000);
    CHECK_EQ_INT(controller_active_ms(c, "default", "t", 99000), 6000);
    controller_free(c);
    char *path = xasprintf("%s/run/default.t.active", dir);
    CHECK(unlink(path) == 0);
    free(path);
    task_store_close(st);
    rm_tree(dir);
}

/* Whether the token folder of ns/t1 under DD holds the file "token" and nothing else. */
static bool only_token_file(const char *dd)
{
    char *cmd = xasprintf("test \"$(ls -A %s/tokens/ns/t1)\" = token", dd);
    bool yes = system(cmd) == 0;

    free(cmd);
    return yes;
}

/* An AgentTask as the controller reads it: default/t pushing WORKING to URL, cloned from
 * BASE; with PR_URL, the bot's record of the repository and branch the PR targets. */
static json_t *push_task(const char *url, const char *base, const char *working, const char *pr_url,
                         const char *pr_ref)
{
    json_t *t = json_pack("{s:{s:s, s:s, s:{}}, s:{s:{s:s, s:s, s:s*}}}", "metadata", "name", "t",
                          "namespace", "default", "annotations", "spec", "repository", "url", url,
                          "baseBranch", base, "workingBranch", working);
    json_t *ann = json_object_get(json_object_get(t, "metadata"), "annotations");

    if (pr_url != NULL) {
        json_object_set_new(ann, TASK_ANN_PR_BASE_REPOSITORY, json_string(pr_url));
        json_object_set_new(ann, TASK_ANN_PR_BASE_BRANCH, json_string(pr_ref));
    }
    return t;
}

/* Signs T's push target as the bot does, under KEY. */
static void grant(json_t *t, const unsigned char key[TOKEN_ROOT_KEY_LEN])
{
    const json_t *repo = json_object_get(json_object_get(t, "spec"), "repository");
    json_t *ann = json_object_get(json_object_get(t, "metadata"), "annotations");
    struct token_push_target pt = {
        .ns = "default",
        .name = "t",
        .url = json_string_value(json_object_get(repo, "url")),
        .working = json_string_value(json_object_get(repo, "workingBranch")),
        .pr_base_url = json_string_value(json_object_get(ann, TASK_ANN_PR_BASE_REPOSITORY)),
        .pr_base_ref = json_string_value(json_object_get(ann, TASK_ANN_PR_BASE_BRANCH)),
    };
    char g[TOKEN_PUSH_GRANT_LEN + 1];

    CHECK(token_push_grant(g, key, &pt));
    json_object_set_new(ann, TASK_ANN_PUSH_GRANT, json_string(g));
}

TEST(push_refusal)
{
    static const unsigned char key[TOKEN_ROOT_KEY_LEN] = {1, 2, 3};
    static const unsigned char other[TOKEN_ROOT_KEY_LEN] = {9};
    static const char *const fork = "https://github.com/eve/repo.git";
    static const char *const octo = "https://github.com/octo/repo.git";
    static const struct {
        const char *url, *base, *working, *pr_url, *pr_ref;
        bool granted, allowed;
    } cases[] = {
        {octo, "main", "agent/t", NULL, NULL, false, true},
        {octo, "main", "main", NULL, NULL, false, false},
        {octo, "main", "-f", NULL, NULL, false, false},
        {octo, "main", "a..b", NULL, NULL, false, false},
        {octo, "main", "a:b", NULL, NULL, false, false},
        {octo, "main", "", NULL, NULL, false, false},
        /* A fork's main into octo's main: granted, pushed to the fork. */
        {fork, "main", "main", octo, "main", true, true},
        /* The same annotations set by hand (no grant, or one for another key): refused. */
        {fork, "main", "main", octo, "main", false, false},
        /* Granted, but the URL is the repository the PR targets and the branch its base
         * (a fork gone and the base repository in its place): refused whatever the grant. */
        {octo, "main", "main", octo, "main", true, false},
        {"https://GitHub.com/octo/repo/", "release", "main", octo, "main", false, false},
        {"https://github.com/octo/repo", "feature", "feature", octo, "main", true, true},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *t = push_task(cases[i].url, cases[i].base, cases[i].working, cases[i].pr_url,
                              cases[i].pr_ref);
        if (cases[i].granted) {
            grant(t, key);
        }
        const char *why = controller_push_refusal(t, key);
        if ((why == NULL) != cases[i].allowed) {
            t_fail(__FILE__, __LINE__, "case %zu: %s", i, why != NULL ? why : "allowed");
        }
        json_decref(t);
    }
    /* A grant made under another key, and one copied to another URL, are refused. */
    json_t *t = push_task(fork, "main", "main", octo, "main");
    grant(t, other);
    CHECK(controller_push_refusal(t, key) != NULL);
    json_decref(t);
    t = push_task(fork, "main", "main", octo, "main");
    grant(t, key);
    json_object_set_new(json_object_get(json_object_get(t, "spec"), "repository"), "url",
                        json_string("https://github.com/octo/other.git"));
    CHECK(controller_push_refusal(t, key) != NULL);
    json_decref(t);
    CHECK(controller_same_repository("https://x/a/b.git", "https://X/a/b/"));
    CHECK(!controller_same_repository("https://x/a/b.git", "https://x/a/bc.git"));
    CHECK(!controller_same_repository(NULL, "https://x/a/b"));
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    char *buf = xcalloc(1, 1 << 16);
    if (f != NULL) {
        (void)!fread(buf, 1, (1 << 16) - 1, f);
        fclose(f);
    }
    return buf;
}

/* The log keeps under its cap by dropping its oldest part, says so, and stays line-aligned
 * with a time in front of every line; control characters cannot forge lines. */
/* Security review 2026-12-01 (13): no task reads the server's own repositories. */
TEST(url_in_data_dir)
{
    char dir[] = "/tmp/diverge-dd-XXXXXX";
    char *dd = mkdtemp(dir);
    char *mirrors = xasprintf("%s/mirrors", dd), *link = xasprintf("%s-link", dd);
    char *demo = xasprintf("%s/demo", dd), *sibling = xasprintf("%s-sibling", dd);
    char *cwd = getcwd(NULL, 0);
    struct {
        char *url;
        bool in;
    } cases[] = {
        {xasprintf("file://%s/mirrors/0123.git", dd), true},
        {xasprintf("file://%s", dd), true},
        {xasprintf("file://localhost%s/staging/default/t.git", dd), true},
        {xasprintf("FILE://%s/mirrors/0123.git", dd), true},
        {xasprintf("file://%s%%2fmirrors%%2F0123.git", dd), true},
        {xasprintf("file:///tmp/../%s/./mirrors//x.git", dd + 1), true},
        {xasprintf("file://%s/mirrors/0123.git", link), true}, /* a link to the data dir */
        {xasprintf("file://%s/demo/../mirrors/x.git", dd), true},
        {xasprintf("file://%s/mirrors%%00/x.git", dd), true},
        {xasprintf("file://%s/demo/greeting.git", dd), false},
        {xasprintf("file://%s/repo.git", sibling), false},
        {xasprintf("file:///tmp/elsewhere.git"), false},
        {xasprintf("https://example.com%s/mirrors/x.git", dd), false},
    };

    CHECK(mkdir(mirrors, 0700) == 0 && mkdir(demo, 0700) == 0);
    CHECK(symlink(dd, link) == 0);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (controller_url_in_data_dir(dd, cases[i].url) != cases[i].in) {
            t_fail(__FILE__, __LINE__, "%s: want %s", cases[i].url,
                   cases[i].in ? "inside" : "outside");
        }
        free(cases[i].url);
    }
    /* A relative data dir (serve --data-dir ./var) is taken from the working directory. */
    CHECK(chdir("/tmp") == 0);
    char *url = xasprintf("file://%s/mirrors/x.git", dd);
    CHECK(controller_url_in_data_dir(dd + strlen("/tmp/"), url));
    free(url);
    CHECK(chdir(cwd) == 0);
    CHECK(unlink(link) == 0);
    CHECK(rmdir(mirrors) == 0 && rmdir(demo) == 0 && rmdir(dd) == 0);
    free(cwd);
    free(mirrors);
    free(link);
    free(demo);
    free(sibling);
}

TEST(task_log_cap)
{
    char dir[] = "/tmp/diverge-log-XXXXXX";
    char *path = xasprintf("%s/logs/ns/t.log", mkdtemp(dir));
    char line[64];
    struct stat st;

    for (int i = 0; i < 200; i++) {
        int n = snprintf(line, sizeof(line), "line %03d of the runner", i);
        sandbox_log_write(path, 2048, line, (size_t)n);
        CHECK(stat(path, &st) == 0 && st.st_size <= 2048);
    }
    char *text = slurp(path);
    CHECK(strstr(text, "older bytes dropped (log cap 2048)") != NULL);
    CHECK(strstr(text, "line 199 of the runner\n") != NULL);
    CHECK(strstr(text, "line 000 ") == NULL);
    for (char *l = text; *l != '\0'; l = strchr(l, '\n') + 1) {
        CHECK(strlen(l) > 21 && l[4] == '-' && l[10] == 'T' && l[19] == 'Z');
    }
    free(text);
    const char *evil = "evil\n2026-01-01T00:00:00Z forged\x1b[2J";
    sandbox_log_write(path, 0, evil, strlen(evil));
    text = slurp(path);
    CHECK(strstr(text, "evil?2026-01-01T00:00:00Z forged?[2J\n") != NULL);
    free(text);
    free(path);
    rm_tree(dir);
}

/* Sandbox output carries "[sandbox] " after the time; a forged server line printed by the
 * agent differs from the real one. */
TEST(task_log_sandbox_mark)
{
    char dir[] = "/tmp/diverge-log-XXXXXX";
    char *path = xasprintf("%s/logs/ns/t.log", mkdtemp(dir));
    const char *forged[] = {"[diverge] pushed refs/heads/main",
                            "egress x.example:443 allowed rule=x.example:443"};

    for (size_t i = 0; i < ARRAY_LEN(forged); i++) {
        sandbox_log_write(path, 0, forged[i], strlen(forged[i]));
        sandbox_log_output(path, 0, forged[i], strlen(forged[i]));
    }
    char *text = slurp(path);
    const char *l = text;
    for (size_t i = 0; i < ARRAY_LEN(forged); i++) {
        /* The server's line, then the sandbox's: same text, different line. */
        for (int k = 0; k < 2; k++) {
            char *want = xasprintf("%s%s\n", k == 0 ? "" : SANDBOX_LOG_MARK, forged[i]);
            CHECK(strlen(l) > 21 && l[19] == 'Z' && l[20] == ' ');
            CHECK(strncmp(l + 21, want, strlen(want)) == 0);
            free(want);
            l = strchr(l, '\n') + 1;
        }
    }
    free(text);
    free(path);
    rm_tree(dir);
}

static json_t *phase_of(struct task_store *st, const char *name, const char *field)
{
    json_t *o = NULL;
    ASSERT(task_store_get(&o, st, "default", name, NULL) == E_OK);
    json_t *v = json_incref(json_object_get(json_object_get(o, "status"), field));
    json_decref(o);
    return v;
}

static int suspend(json_t *doc, struct err *err, void *ud)
{
    (void)err;
    json_object_set_new(json_object_get(doc, "spec"), "suspended", json_boolean(ud != NULL));
    return E_OK;
}

static int64_t rv_of(struct task_store *st, const char *name)
{
    json_t *o = NULL;
    ASSERT(task_store_get(&o, st, "default", name, NULL) == E_OK);
    const char *rv =
        json_string_value(json_object_get(json_object_get(o, "metadata"), "resourceVersion"));
    int64_t n = rv != NULL ? strtoll(rv, NULL, 10) : 0;
    json_decref(o);
    return n;
}

struct phases_seen {
    char list[256];
};

static int note_phase(const struct task_event *ev, void *userdata)
{
    struct phases_seen *p = userdata;
    size_t len = strlen(p->list);
    static const char *const names[] = {"Pending", "Provisioning", "Active", "Pausing",
                                        "Paused",  "Completed",    "Failed"};
    snprintf(p->list + len, sizeof(p->list) - len, "%s ",
             (size_t)ev->phase < ARRAY_LEN(names) ? names[ev->phase] : "?");
    return 0;
}

/* The phases the feed shows for task changes after resourceVersion SINCE. */
static void phases_since(struct phases_seen *p, struct task_store *st, int64_t since)
{
    int64_t last = 0;
    memset(p, 0, sizeof(*p));
    CHECK_OK(task_store_watch(&last, st, "default", since, 0, note_phase, p, NULL));
}

static int set_phase(json_t *doc, struct err *err, void *ud)
{
    (void)err;
    task_set_phase(doc, TASK_PAUSING, "Suspended", "pausing by request");
    json_object_set_new(json_object_get(doc, "spec"), "suspended", json_boolean(ud != NULL));
    return E_OK;
}

TEST(reconcile_mints_pauses_and_reminted)
{
    struct task_store *st = NULL;
    struct controller *c = NULL;
    unsigned char key[TOKEN_ROOT_KEY_LEN] = {0};
    char dir[] = "/tmp/diverge-ctrl-XXXXXX";
    struct controller_config cfg = {.data_dir = mkdtemp(dir),
                                    .root_key = key,
                                    .default_budget_usd = 5000000,
                                    .default_budget_tokens = 1000000,
                                    .sandbox_provider = "none",
                                    .manual = true};
    json_t *in =
        json_loads("{\"metadata\":{\"name\":\"t\"},\"spec\":{\"objective\":\"x\"}}", 0, NULL);
    json_t *obj = NULL, *stored = NULL, *ph;
    struct token_record rec;
    struct err err = {0};
    char *first = NULL;

    CHECK_OK(task_store_sqlite_open(&st, ":memory:", clock_system(), &err));
    CHECK_OK(task_normalize_new(&obj, in, "default", &err));
    CHECK_OK(task_store_create(&stored, st, obj, &err));
    CHECK_OK(controller_new(&c, st, &cfg, &err));
    CHECK_OK(controller_reconcile(c, "default", "t", &err));
    ph = phase_of(st, "t", "phase");
    CHECK_EQ_STR(json_string_value(ph), "Active");
    json_decref(ph);
    CHECK_OK(task_store_token_current(&rec, st, "default", "t", &err));
    CHECK(rec.active);
    CHECK_EQ_INT(rec.generation, 1);
    first = rec.token;
    char *path = controller_token_path(c, "default", "t");
    CHECK(access(path, R_OK) == 0);
    CHECK_OK(task_store_mutate(NULL, st, "default", "t", suspend, (void *)1, &err));
    int64_t rv = rv_of(st, "t");
    struct phases_seen seen;
    CHECK_OK(controller_reconcile(c, "default", "t", &err));
    ph = phase_of(st, "t", "phase");
    CHECK_EQ_STR(json_string_value(ph), "Paused");
    json_decref(ph);
    /* Active → Pausing (token revoked with it) → Paused, never Active → Paused. */
    phases_since(&seen, st, rv);
    CHECK_EQ_STR(seen.list, "Pausing Paused ");
    CHECK_OK(task_store_token_current(&rec, st, "default", "t", &err));
    CHECK(!rec.active);
    free(rec.token);
    CHECK_OK(task_store_mutate(NULL, st, "default", "t", suspend, NULL, &err));
    CHECK_OK(controller_reconcile(c, "default", "t", &err));
    CHECK_OK(task_store_token_current(&rec, st, "default", "t", &err));
    CHECK(rec.active);
    CHECK_EQ_INT(rec.generation, 2);
    CHECK(strcmp(rec.token, first) != 0);
    free(rec.token);
    /* A server that died while Pausing: the restart finishes the pause (Paused, token
     * revoked) and a resume that arrived meanwhile applies after it. */
    CHECK_OK(task_store_mutate(NULL, st, "default", "t", set_phase, NULL, &err));
    rv = rv_of(st, "t");
    CHECK_OK(controller_reconcile(c, "default", "t", &err));
    ph = phase_of(st, "t", "phase");
    CHECK_EQ_STR(json_string_value(ph), "Paused");
    json_decref(ph);
    CHECK_OK(task_store_token_current(&rec, st, "default", "t", &err));
    CHECK(!rec.active);
    free(rec.token);
    CHECK_OK(controller_reconcile(c, "default", "t", &err));
    phases_since(&seen, st, rv);
    CHECK_EQ_STR(seen.list, "Paused Active ");
    CHECK_OK(task_store_token_current(&rec, st, "default", "t", &err));
    CHECK(rec.active);
    CHECK_EQ_INT(rec.generation, 3);
    free(rec.token);
    free(first);
    controller_free(c);
    unlink(path);
    free(path);
    json_decref(in);
    json_decref(obj);
    json_decref(stored);
    task_store_close(st);
    rm_tree(dir);
}

T_MAIN

/* The queue's order (SPEC §14): first come first served, round robin across namespaces:
 * one namespace's many tasks never starve another's one. */
TEST(queue_order_round_robin)
{
    struct controller_queue_item it[] = {
        {.ns = "big", .name = "t3", .arrival = 30, .round = -1},
        {.ns = "big", .name = "t1", .arrival = 10, .round = -1},
        {.ns = "small", .name = "s1", .arrival = 50, .round = -1},
        {.ns = "big", .name = "t2", .arrival = 20, .round = -1},
        {.ns = "mid", .name = "m1", .arrival = 15, .round = -1},
        {.ns = "mid", .name = "m2", .arrival = 60, .round = -1},
        {.ns = "big", .name = "t0", .arrival = 10, .round = -1}, /* same time as t1: by name */
    };
    static const char *const want[] = {"t0", "m1", "s1", "t1", "m2", "t2", "t3"};

    controller_queue_order(it, ARRAY_LEN(it));
    for (size_t i = 0; i < ARRAY_LEN(it); i++) {
        CHECK_EQ_STR(it[i].name, want[i]);
    }
    controller_queue_order(it, 0); /* empty: nothing to do */
}

/* Admission (SPEC §14, §15): free slots in queue order, a namespace's SpendQuota
 * maxRunningTasks counting its running tasks and those admitted before; a capped task
 * does not take a slot from the others. */
TEST(queue_admit_slots_and_namespace_caps)
{
    struct controller_queue_item it[] = {
        {.ns = "a", .name = "a1", .running = 1, .ns_cap = 2},
        {.ns = "a", .name = "a2", .running = 1, .ns_cap = 2},
        {.ns = "b", .name = "b1", .ns_cap = -1},
        {.ns = "c", .name = "c1", .ns_cap = 0},
        {.ns = "b", .name = "b2", .ns_cap = -1},
    };
    static const int64_t want_pos[] = {0, 1, 0, 2, 3};
    static const bool want_full[] = {false, true, false, true, false};

    controller_queue_admit(it, ARRAY_LEN(it), true, 2);
    for (size_t i = 0; i < ARRAY_LEN(it); i++) {
        CHECK_EQ_INT(it[i].position, want_pos[i]);
        CHECK(it[i].ns_full == want_full[i]);
    }
    /* No server-wide limit: only the caps hold tasks back. */
    controller_queue_admit(it, ARRAY_LEN(it), false, 0);
    for (size_t i = 0; i < ARRAY_LEN(it); i++) {
        CHECK_EQ_INT(it[i].position, i == 1 ? 1 : i == 3 ? 2 : 0);
    }
    controller_queue_admit(it, 0, true, 1); /* empty: nothing to do */
}

/* A namespace that holds slots already waits behind one that holds none, even when its
 * task came first. */
TEST(queue_order_counts_running_slots)
{
    struct controller_queue_item it[] = {
        {.ns = "alpha", .name = "a2", .arrival = 10, .running = 1, .round = -1},
        {.ns = "beta", .name = "b1", .arrival = 20, .running = 0, .round = -1},
        {.ns = "alpha", .name = "a3", .arrival = 5, .running = 1, .round = -1},
    };
    static const char *const want[] = {"b1", "a3", "a2"};

    controller_queue_order(it, ARRAY_LEN(it));
    for (size_t i = 0; i < ARRAY_LEN(it); i++) {
        CHECK_EQ_STR(it[i].name, want[i]);
    }
    /* Rounds are kept: once alpha's slot is free (running 0) the order does not change,
     * and a newcomer of a third namespace goes ahead only of later rounds. */
    it[0].running = it[1].running = it[2].running = 0;
    controller_queue_order(it, ARRAY_LEN(it));
    for (size_t i = 0; i < ARRAY_LEN(it); i++) {
        CHECK_EQ_STR(it[i].name, want[i]);
    }
}

/* The queue's order and admission as SPEC §14 defines them, pair by pair (the first
 * implementation, O(n^2)): the reference the sorted, counted one must agree with. */
static int ref_by_arrival(const void *pa, const void *pb)
{
    const struct controller_queue_item *a = pa, *b = pb;
    int c;

    if (a->arrival != b->arrival) {
        return a->arrival < b->arrival ? -1 : 1;
    }
    c = strcmp(a->ns, b->ns);
    return c != 0 ? c : strcmp(a->name, b->name);
}

static int ref_by_round(const void *pa, const void *pb)
{
    const struct controller_queue_item *a = pa, *b = pb;

    if (a->round != b->round) {
        return a->round < b->round ? -1 : 1;
    }
    return ref_by_arrival(pa, pb);
}

static void ref_order(struct controller_queue_item *items, size_t n)
{
    qsort(items, n, sizeof(*items), ref_by_arrival);
    for (size_t i = 0; i < n; i++) {
        int64_t before = 0;
        if (items[i].round >= 0) {
            continue;
        }
        for (size_t j = 0; j < n; j++) {
            bool ahead = j < i || items[j].round >= 0;
            if (j != i && ahead && strcmp(items[j].ns, items[i].ns) == 0) {
                before++;
            }
        }
        items[i].round = items[i].running + before;
    }
    qsort(items, n, sizeof(*items), ref_by_round);
}

static void ref_admit(struct controller_queue_item *items, size_t n, bool limited,
                      int64_t free_slots)
{
    int64_t waiting = 0;

    for (size_t i = 0; i < n; i++) {
        struct controller_queue_item *it = &items[i];
        int64_t used = it->running;
        for (size_t j = 0; j < i; j++) {
            used += items[j].position == 0 && strcmp(items[j].ns, it->ns) == 0 ? 1 : 0;
        }
        it->ns_full = it->ns_cap >= 0 && used >= it->ns_cap;
        if (!it->ns_full && (!limited || free_slots > 0)) {
            it->position = 0;
            free_slots--;
        } else {
            it->position = ++waiting;
        }
    }
}

/* Thousands may wait: the order and admission are computed per namespace in one sweep
 * (O(n log n)); on random queues (ties in arrival, tasks with and without a round, caps)
 * they give exactly what the pairwise definition gives. */
TEST(queue_order_and_admit_match_the_pairwise_definition)
{
    static const char *const nss[] = {"alpha", "beta", "gamma", "delta"};
    static const int64_t caps[] = {-1, 2, 0, -1};
    uint64_t seed = 42;
    char names[400][32];

    for (int round = 0; round < 40; round++) {
        struct controller_queue_item a[400], b[400];
        size_t n = (size_t)(round * 10 + 1);
        for (size_t i = 0; i < n; i++) {
            seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
            size_t k = (size_t)(seed >> 33) % ARRAY_LEN(nss);
            snprintf(names[i], sizeof(names[i]), "t%03zu", i);
            a[i] = (struct controller_queue_item){
                .ns = nss[k],
                .name = names[i],
                .arrival = (int64_t)((seed >> 20) % 50), /* many ties */
                .running = (int64_t)((seed >> 40) % 3),
                .round = (seed >> 45) % 3 == 0 ? (int64_t)((seed >> 50) % 20) : -1,
                .ns_cap = caps[k]};
        }
        memcpy(b, a, n * sizeof(*a));
        controller_queue_order(a, n);
        ref_order(b, n);
        for (size_t i = 0; i < n; i++) {
            CHECK_EQ_STR(a[i].name, b[i].name);
            CHECK_EQ_INT(a[i].round, b[i].round);
        }
        controller_queue_admit(a, n, round % 2 == 0, (int64_t)(round % 7));
        ref_admit(b, n, round % 2 == 0, (int64_t)(round % 7));
        for (size_t i = 0; i < n; i++) {
            CHECK_EQ_INT(a[i].position, b[i].position);
            CHECK(a[i].ns_full == b[i].ns_full);
        }
    }
}

/* The queue's records are found by a hash, not a walk: 5,000 of them are found, the ones
 * a pass did not see go, the others stay (their marks cleared). */
TEST(queue_records_found_added_and_pruned)
{
    struct controller *c = xcalloc(1, sizeof(*c));
    char ns[32], name[32];

    CHECK(controller_queued_find(c, "a", "b") == NULL); /* none yet: no buckets */
    for (int i = 0; i < 5000; i++) {
        snprintf(ns, sizeof(ns), "ns%d", i % 7);
        snprintf(name, sizeof(name), "task-%d", i);
        struct controller_queued *q = controller_queued_add(c, ns, name);
        q->seen = i % 3 != 0;
        q->arrival = i;
    }
    for (int i = 0; i < 5000; i++) {
        snprintf(ns, sizeof(ns), "ns%d", i % 7);
        snprintf(name, sizeof(name), "task-%d", i);
        struct controller_queued *q = controller_queued_find(c, ns, name);
        CHECK(q != NULL && q->arrival == i);
    }
    CHECK(controller_queued_find(c, "ns1", "task-0") == NULL); /* task-0 is in ns0 */
    controller_queued_prune(c);
    for (int i = 0; i < 5000; i++) {
        snprintf(ns, sizeof(ns), "ns%d", i % 7);
        snprintf(name, sizeof(name), "task-%d", i);
        struct controller_queued *q = controller_queued_find(c, ns, name);
        CHECK((q != NULL) == (i % 3 != 0));
        CHECK(q == NULL || !q->seen);
    }
    controller_queued_prune(c); /* none seen since: all go */
    CHECK(controller_queued_find(c, "ns1", "task-1") == NULL);
    CHECK(c->queued == NULL);
    CHECK(controller_queued_add(c, "ns1", "task-1") == controller_queued_find(c, "ns1", "task-1"));
    controller_queue_free(c);
    free(c);
}

static bool holds(struct controller *c, enum task_event_type type, const char *name,
                  enum task_phase phase, bool suspended)
{
    struct task_event ev = {
        .type = type, .ns = "ns", .name = name, .phase = phase, .suspended = suspended};
    return controller_queue_holds(c, &ev);
}

/* Which task events the change feed leaves to the queue (no reconcile): a Pending task the
 * queue holds waiting, or a new one while others wait; never an admitted one, one that
 * shows another phase or is suspended, nor without a limit, sandboxes or a working provider. */
TEST(queue_holds_waiting_tasks_from_the_feed)
{
    struct controller *c = xcalloc(1, sizeof(*c));
    static char provider; /* a provider is there; holds() never calls it */
    char problem[] = "no bubblewrap";

    c->max_running = 2;
    c->sandboxes = (struct sandbox_provider *)(void *)&provider;
    CHECK(!holds(c, TASK_EVENT_ADDED, "new", TASK_PENDING, false)); /* nothing waits */
    controller_queued_add(c, "ns", "running")->admitted = true;
    CHECK(!holds(c, TASK_EVENT_ADDED, "new", TASK_PENDING, false)); /* still nothing waits */
    controller_queued_add(c, "ns", "waits");
    CHECK(holds(c, TASK_EVENT_MODIFIED, "waits", TASK_PENDING, false));
    CHECK(holds(c, TASK_EVENT_ADDED, "new", TASK_PENDING, false));     /* joins the queue */
    CHECK(!holds(c, TASK_EVENT_MODIFIED, "new", TASK_PENDING, false)); /* unknown: reconciled */
    CHECK(!holds(c, TASK_EVENT_MODIFIED, "running", TASK_PENDING, false));
    CHECK(!holds(c, TASK_EVENT_MODIFIED, "waits", TASK_PENDING, true));
    CHECK(!holds(c, TASK_EVENT_MODIFIED, "waits", TASK_ACTIVE, false));
    CHECK(!holds(c, TASK_EVENT_MODIFIED, "waits", TASK_FAILED, false));
    c->problem = problem;
    CHECK(!holds(c, TASK_EVENT_MODIFIED, "waits", TASK_PENDING, false));
    c->problem = NULL;
    c->max_running = 0; /* no limit and no namespace caps: nothing is held */
    CHECK(!holds(c, TASK_EVENT_MODIFIED, "waits", TASK_PENDING, false));
    c->max_running = 2;
    c->sandboxes = NULL;
    CHECK(!holds(c, TASK_EVENT_MODIFIED, "waits", TASK_PENDING, false));
    controller_queue_free(c);
    free(c);
}

/* Which queue positions are written again: the first ten always exactly, a task's first
 * place and its leaving the queue always, a place further back once it moved by a tenth. */
TEST(queue_position_written_when_due)
{
    CHECK(controller_queue_position_due(0, 5));    /* new in the queue */
    CHECK(controller_queue_position_due(-1, 500)); /* a queue status that is no position */
    CHECK(controller_queue_position_due(4000, 0)); /* admitted: the status goes */
    CHECK(!controller_queue_position_due(0, 0));   /* admitted, nothing shown */
    CHECK(!controller_queue_position_due(7, 7));
    CHECK(controller_queue_position_due(3, 2));
    CHECK(controller_queue_position_due(11, 10)); /* into the first ten */
    CHECK(controller_queue_position_due(10, 11));
    CHECK(!controller_queue_position_due(12, 11)); /* moved by less than a tenth */
    CHECK(!controller_queue_position_due(100, 91));
    CHECK(controller_queue_position_due(100, 90));
    CHECK(!controller_queue_position_due(5000, 4501));
    CHECK(controller_queue_position_due(5000, 4500));
    CHECK(controller_queue_position_due(100, 110)); /* moved back (a namespace's first) */
}

/* Creates N empty files DIR/<i>SUFFIX. */
static void touch_n(const char *dir, const char *suffix, int n)
{
    for (int i = 0; i < n; i++) {
        char *p = xasprintf("%s/%d%s", dir, i, suffix);
        FILE *f = fopen(p, "w");
        CHECK(f != NULL);
        if (f != NULL) {
            fclose(f);
        }
        free(p);
    }
}

/* Copies the one pack of the repository GITDIR (its name in objects/one) N times under
 * other names: N more packs, as N fetches would leave. */
static void copy_pack(const char *gitdir, int n)
{
    char *one = xasprintf("%s/objects/one", gitdir), name[128] = {0};
    FILE *f = fopen(one, "r");

    CHECK(f != NULL && fgets(name, sizeof(name), f) != NULL);
    if (f != NULL) {
        fclose(f);
    }
    name[strcspn(name, "\n")] = '\0';
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < 2; k++) {
            const char *ext = k == 0 ? "pack" : "idx";
            char *src = xasprintf("%s/objects/pack/%s.%s", gitdir, name, ext);
            char *dst = xasprintf("%s/objects/pack/pack-%040d.%s", gitdir, i, ext);
            char data[4096];
            FILE *in = fopen(src, "r"), *o = fopen(dst, "w");
            size_t len = in != NULL ? fread(data, 1, sizeof(data), in) : 0;
            CHECK(len > 0 && len < sizeof(data) && o != NULL && fwrite(data, 1, len, o) == len);
            if (in != NULL) {
                fclose(in);
            }
            if (o != NULL) {
                fclose(o);
            }
            free(src);
            free(dst);
        }
    }
    CHECK(unlink(one) == 0);
    free(one);
}

static char *read_small(const char *path)
{
    char buf[256] = {0};
    FILE *f = fopen(path, "r");
    size_t n = f != NULL ? fread(buf, 1, sizeof(buf) - 1, f) : 0;

    if (f != NULL) {
        fclose(f);
    }
    return xstrndup(buf, n);
}

/* The token file: a second write replaces the first whole (by an exchange, then the old
 * file's removal), 0600, and leaves no other file in its directory. */
TEST(token_file_replaced_whole)
{
    char dir[] = "/tmp/diverge-tokfile-XXXXXX";
    char *dd = mkdtemp(dir), *path, *text;
    struct controller c = {.data_dir = dd};
    struct stat st;
    struct err err = {0};

    path = controller_token_path(&c, "ns", "t1");
    CHECK_OK(controller_write_token_file(&c, "ns", "t1", "first-token", &err));
    text = read_small(path);
    CHECK_EQ_STR(text, "first-token");
    free(text);
    CHECK_OK(controller_write_token_file(&c, "ns", "t1", "second-token", &err));
    text = read_small(path);
    CHECK_EQ_STR(text, "second-token");
    free(text);
    CHECK_EQ_INT(stat(path, &st), 0);
    CHECK_EQ_INT(st.st_mode & 0777, 0600);
    CHECK(only_token_file(dd));
    rm_tree(dd);
    free(path);
}

/* A token file that cannot be written whole (here: no file may grow, RLIMIT_FSIZE 0, in a
 * child) is an error and leaves no temporary file holding the token in the folder the
 * sandbox reads; the token file already there stays as it was. */
TEST(token_file_failed_write_leaves_nothing)
{
    char dir[] = "/tmp/diverge-tokfail-XXXXXX";
    char *dd = mkdtemp(dir), *path, *text;
    struct controller c = {.data_dir = dd};
    struct err err = {0};
    int status = 0;
    pid_t pid;

    path = controller_token_path(&c, "ns", "t1");
    CHECK_OK(controller_write_token_file(&c, "ns", "t1", "first-token", &err));
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        struct rlimit none = {0, 0};
        struct err cerr = {0};
        signal(SIGXFSZ, SIG_IGN); /* write() fails with EFBIG instead */
        setrlimit(RLIMIT_FSIZE, &none);
        _exit(controller_write_token_file(&c, "ns", "t1", "second-token", &cerr) != E_OK &&
                      strstr(cerr.msg, "write") != NULL
                  ? 0
                  : 1);
    }
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    text = read_small(path);
    CHECK_EQ_STR(text, "first-token");
    free(text);
    CHECK(only_token_file(dd));
    rm_tree(dd);
    free(path);
}

/* The fetch no longer runs git's maintenance: the mirror's upkeep does, when its packs or
 * loose objects are as many as make gc --auto act (git's defaults), under the mirror's
 * lock; then the packs are one. */
TEST(mirror_upkeep)
{
    char dir[] = "/tmp/diverge-upkeep-XXXXXX";
    char *dd = mkdtemp(dir), *cmd;
    struct controller c = {.data_dir = dd};
    const char *url = "https://example.com/o/r.git";
    char *mirror = controller_mirror_path(dd, url);
    char *fake = xasprintf("%s/fake", dd), *packs = xasprintf("%s/objects/pack", fake);
    char *loose = xasprintf("%s/objects/17", fake);
    struct err err = {0};

    cmd = xasprintf("mkdir -p %s %s", packs, loose);
    CHECK(system(cmd) == 0);
    free(cmd);
    touch_n(packs, ".pack", 50);
    touch_n(packs, ".idx", 60);
    touch_n(loose, "", 27);
    CHECK(!controller_mirror_wants_upkeep(fake));
    touch_n(loose, "", 28);
    CHECK(controller_mirror_wants_upkeep(fake)); /* 28 loose objects in objects/17 */
    cmd = xasprintf("rm -r %s && mkdir -p %s", loose, loose);
    CHECK(system(cmd) == 0);
    free(cmd);
    touch_n(packs, ".pack", 51);
    CHECK(controller_mirror_wants_upkeep(fake)); /* 51 packs */

    /* A mirror with 51 packs (one pack and 50 copies under other names): the upkeep
     * leaves one. Nothing to do (no mirror): no git at all. */
    CHECK_OK(controller_mirror_upkeep(&c, "https://example.com/none.git", &err));
    cmd = xasprintf("set -e; git init -q --bare %s; cd %s; b=$(echo x | git hash-object -w "
                    "--stdin); t=$(printf '100644 blob %%s\\tf\\n' $b | git mktree); "
                    "c=$(echo m | git -c user.name=t -c user.email=t@t commit-tree $t); "
                    "git update-ref refs/heads/main $c; git repack -q -a -d; "
                    "cd objects/pack; ls pack-*.pack | sed 's/.pack$//' > ../one",
                    mirror, mirror);
    CHECK(system(cmd) == 0);
    free(cmd);
    copy_pack(mirror, 50);
    CHECK(controller_mirror_wants_upkeep(mirror));
    CHECK_OK(controller_mirror_upkeep(&c, url, &err));
    CHECK(!controller_mirror_wants_upkeep(mirror));
    free(packs);
    packs = xasprintf("%s/objects/pack", mirror);
    cmd = xasprintf("test $(ls %s | grep -c '\\.pack$') = 1 && "
                    "git --git-dir %s rev-parse -q --verify refs/heads/main >/dev/null",
                    packs, mirror);
    CHECK(system(cmd) == 0);
    free(cmd);
    rm_tree(dd);
    free(mirror);
    free(fake);
    free(packs);
    free(loose);
}
