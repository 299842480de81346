/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of controller/preview.c: the linked preview decisions (which Environment,
 * its URL, its state after each action, its document) and where a draft PR goes; and one
 * reconcile on the real SQLite store creating, hibernating and waking the Environment. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "controller/controller.h"
#include "tests/t_check.h"

static json_t *doc(const char *json)
{
    json_t *d = json_loads(json, 0, NULL);
    ASSERT(d != NULL);
    return d;
}

#define REPO_TASK(ann_, extra_)                                                                    \
    "{\"metadata\":{\"name\":\"t1\",\"namespace\":\"ns\",\"uid\":\"u-1\",\"annotations\":{" ann_   \
    "}},\"spec\":{\"objective\":\"fix it\",\"repository\":{\"url\":\"https://github.com/o/r\","    \
    "\"baseBranch\":\"main\",\"workingBranch\":\"agent/t1\"}" extra_ "}}"

TEST(preview_env_name)
{
    static const struct {
        const char *task, *base, *want;
    } cases[] = {
        {REPO_TASK("", ""), "https://p.example", "agent-preview-t1"},
        {REPO_TASK("\"divergedev.com/preview-enabled\":\"true\"", ""), "https://p.example",
         "agent-preview-t1"},
        {REPO_TASK("\"divergedev.com/preview-enabled\":\"false\"", ""), "https://p.example", NULL},
        {REPO_TASK("", ""), NULL, NULL},
        {REPO_TASK("", ""), "", NULL},
        {"{\"metadata\":{\"name\":\"t1\"},\"spec\":{\"objective\":\"x\"}}", "https://p.example",
         NULL},
    };

    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        json_t *t = doc(cases[i].task);
        char *got = controller_preview_env_name(t, cases[i].base);
        if (cases[i].want == NULL) {
            CHECK(got == NULL);
        } else {
            CHECK_EQ_STR(got, cases[i].want);
        }
        free(got);
        json_decref(t);
    }
}

TEST(preview_url)
{
    char *u = controller_preview_url("https://preview.example.com/", "agent-preview-t1");
    CHECK_EQ_STR(u, "https://preview.example.com/?_diverge_env=agent-preview-t1");
    free(u);
    u = controller_preview_url("http://127.0.0.1:9/p", "agent-preview-x");
    CHECK_EQ_STR(u, "http://127.0.0.1:9/p/?_diverge_env=agent-preview-x");
    free(u);
}

TEST(preview_base_valid)
{
    CHECK(controller_preview_base_valid("https://preview.example.com"));
    CHECK(controller_preview_base_valid("http://127.0.0.1:9/p/"));
    CHECK(!controller_preview_base_valid("ftp://x"));
    CHECK(!controller_preview_base_valid("preview.example.com"));
    CHECK(!controller_preview_base_valid("https://"));
    CHECK(!controller_preview_base_valid("https:///p"));
    CHECK(!controller_preview_base_valid("https://x/?a=b"));
    CHECK(!controller_preview_base_valid("https://x/#f"));
    CHECK(!controller_preview_base_valid("https://x/\n"));
}

TEST(preview_state_table)
{
    static const struct {
        enum controller_action a;
        bool failed;
        enum controller_env_state want;
    } cases[] = {
        {CONTROLLER_ACTIVATE, false, CONTROLLER_ENV_RUNNING},
        {CONTROLLER_PROVISION, false, CONTROLLER_ENV_RUNNING},
        {CONTROLLER_RESTART, false, CONTROLLER_ENV_RUNNING},
        {CONTROLLER_THAW, false, CONTROLLER_ENV_RUNNING},
        {CONTROLLER_RESUME_START, false, CONTROLLER_ENV_RUNNING},
        {CONTROLLER_PROVISION, true, CONTROLLER_ENV_RELEASED}, /* SandboxError */
        {CONTROLLER_PAUSE, false, CONTROLLER_ENV_HIBERNATED},
        {CONTROLLER_COMPLETE, false, CONTROLLER_ENV_RELEASED},
        {CONTROLLER_COMPLETE, true, CONTROLLER_ENV_RELEASED}, /* push failed */
        {CONTROLLER_FAIL_RUNNER, false, CONTROLLER_ENV_RELEASED},
        {CONTROLLER_TIMEOUT, false, CONTROLLER_ENV_RELEASED},
        {CONTROLLER_FAIL_SANDBOX, false, CONTROLLER_ENV_RELEASED},
        {CONTROLLER_NOTHING, false, CONTROLLER_ENV_KEEP},
        {CONTROLLER_REVOKE, false, CONTROLLER_ENV_KEEP},
        {CONTROLLER_WAIT, false, CONTROLLER_ENV_KEEP},
        {CONTROLLER_STOP, false, CONTROLLER_ENV_KEEP},
    };

    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        enum controller_env_state got = controller_preview_state(cases[i].a, cases[i].failed);
        if (got != cases[i].want) {
            t_fail(__FILE__, __LINE__, "case %zu (%s): got %d want %d", i,
                   controller_action_name(cases[i].a), (int)got, (int)cases[i].want);
        }
    }
}

static const char *env_ann(const json_t *env, const char *key)
{
    return json_string_value(
        json_object_get(json_object_get(json_object_get(env, "metadata"), "annotations"), key));
}

TEST(preview_env_document)
{
    json_t *t = doc(REPO_TASK("\"divergedev.com/preview-image\":\"img:1\","
                              "\"divergedev.com/preview-port\":\"3000\"",
                              ""));
    const char *url = "https://p/?_diverge_env=agent-preview-t1";
    json_t *run = controller_preview_env(t, NULL, "agent-preview-t1", url, CONTROLLER_ENV_RUNNING,
                                         CONTROLLER_SANDBOX_IP);
    const json_t *md = json_object_get(run, "metadata");
    const json_t *owner = json_array_get(json_object_get(md, "ownerReferences"), 0);
    const json_t *spec = json_object_get(run, "spec");

    CHECK_EQ_STR(json_string_value(json_object_get(run, "apiVersion")), TASK_API_VERSION);
    CHECK_EQ_STR(json_string_value(json_object_get(run, "kind")), "Environment");
    CHECK_EQ_STR(json_string_value(json_object_get(md, "name")), "agent-preview-t1");
    CHECK_EQ_STR(json_string_value(json_object_get(md, "namespace")), "ns");
    CHECK_EQ_STR(json_string_value(json_object_get(owner, "kind")), "AgentTask");
    CHECK_EQ_STR(json_string_value(json_object_get(owner, "name")), "t1");
    CHECK_EQ_STR(json_string_value(json_object_get(owner, "uid")), "u-1");
    CHECK(json_is_true(json_object_get(owner, "controller")));
    CHECK_EQ_STR(json_string_value(json_object_get(spec, "branch")), "agent/t1");
    CHECK_EQ_STR(json_string_value(json_object_get(spec, "service")), "t1");
    CHECK_EQ_STR(json_string_value(json_object_get(spec, "image")), "img:1");
    CHECK_EQ_INT(json_integer_value(json_object_get(spec, "port")), 3000);
    CHECK_EQ_STR(env_ann(run, CONTROLLER_ANN_SANDBOX_IP), "127.0.0.1");
    CHECK(env_ann(run, CONTROLLER_ANN_HIBERNATED) == NULL);
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(run, "status"), "url")), url);

    /* Hibernated: the IP goes, other annotations someone set stay. */
    json_object_set_new(json_object_get(json_object_get(run, "metadata"), "annotations"),
                        "example.com/keep", json_string("yes"));
    json_t *hib = controller_preview_env(t, run, "agent-preview-t1", url, CONTROLLER_ENV_HIBERNATED,
                                         CONTROLLER_SANDBOX_IP);
    CHECK_EQ_STR(env_ann(hib, CONTROLLER_ANN_HIBERNATED), "true");
    CHECK(env_ann(hib, CONTROLLER_ANN_SANDBOX_IP) == NULL);
    CHECK_EQ_STR(env_ann(hib, "example.com/keep"), "yes");
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(hib, "status"), "phase")),
                 "Hibernated");
    /* Woken: hibernated removed, IP back. */
    json_t *wake = controller_preview_env(t, hib, "agent-preview-t1", url, CONTROLLER_ENV_RUNNING,
                                          CONTROLLER_SANDBOX_IP);
    CHECK(env_ann(wake, CONTROLLER_ANN_HIBERNATED) == NULL);
    CHECK_EQ_STR(env_ann(wake, CONTROLLER_ANN_SANDBOX_IP), "127.0.0.1");
    /* Released: neither. */
    json_t *rel = controller_preview_env(t, wake, "agent-preview-t1", url, CONTROLLER_ENV_RELEASED,
                                         CONTROLLER_SANDBOX_IP);
    CHECK(env_ann(rel, CONTROLLER_ANN_HIBERNATED) == NULL);
    CHECK(env_ann(rel, CONTROLLER_ANN_SANDBOX_IP) == NULL);
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(rel, "status"), "phase")),
                 "Released");
    json_decref(run);
    json_decref(hib);
    json_decref(wake);
    json_decref(rel);
    json_decref(t);

    /* Defaults: service = task name, port 8080 (also for a bad port), no image. */
    t = doc(REPO_TASK("\"divergedev.com/preview-port\":\"80x\"", ""));
    run = controller_preview_env(t, NULL, "agent-preview-t1", url, CONTROLLER_ENV_RUNNING, NULL);
    spec = json_object_get(run, "spec");
    CHECK_EQ_INT(json_integer_value(json_object_get(spec, "port")), 8080);
    CHECK(json_object_get(spec, "image") == NULL);
    CHECK(env_ann(run, CONTROLLER_ANN_SANDBOX_IP) == NULL); /* provider none: no sandbox */
    json_decref(run);
    json_decref(t);
}

static json_t *pr_task(const char *url, bool draft, bool from_scm)
{
    json_t *t = doc("{\"metadata\":{\"name\":\"t1\",\"namespace\":\"ns\",\"annotations\":{}},"
                    "\"spec\":{\"objective\":\"fix it\",\"repository\":{\"baseBranch\":\"main\","
                    "\"workingBranch\":\"agent/t1\"}}}");
    json_t *spec = json_object_get(t, "spec");

    if (url != NULL) {
        json_object_set_new(json_object_get(spec, "repository"), "url", json_string(url));
    }
    json_object_set_new(spec, "draftPR", json_boolean(draft));
    if (from_scm) {
        json_object_set_new(json_object_get(json_object_get(t, "metadata"), "annotations"),
                            "divergedev.com/provider", json_string("github"));
    }
    return t;
}

TEST(draft_pr_target_table)
{
    static const struct {
        const char *url, *api;
        bool draft, from_scm;
        const char *provider, *project;
    } cases[] = {
        {"https://github.com/o/r", "https://api.github.com", true, false, "github", "o/r"},
        {"https://github.com/o/r.git", "https://api.github.com/", true, false, "github", "o/r"},
        {"https://GitHub.com/o/r/", "https://api.github.com", true, false, "github", "o/r"},
        {"https://ghe.example/o/r", "https://ghe.example/api/v3", true, false, "github", "o/r"},
        {"http://127.0.0.1:5/o/r", "http://127.0.0.1:5", true, false, "github", "o/r"},
        {"https://github.com/o/r", "https://ghe.example/api/v3", true, false, NULL, NULL},
        {"http://github.com/o/r", "https://api.github.com", true, false, NULL, NULL},
        {"https://github.com/o/r/tree/x", "https://api.github.com", true, false, NULL, NULL},
        {"https://github.com/o", "https://api.github.com", true, false, NULL, NULL},
        {"https://github.com.evil/o/r", "https://api.github.com", true, false, NULL, NULL},
        {"https://gitlab.com/o/r", "https://api.github.com", true, false, NULL, NULL},
        {"file:///tmp/x/repo.git", "https://api.github.com", true, false, "local", "local/repo"},
        {"file:///tmp/x/my repo/", NULL, true, false, "local", "local/my-repo"},
        {"https://github.com/o/r", "https://api.github.com", false, false, NULL, NULL},
        {"https://github.com/o/r", "https://api.github.com", true, true, NULL, NULL},
        {"file:///tmp/x/repo.git", NULL, true, true, NULL, NULL},
        {NULL, "https://api.github.com", true, false, NULL, NULL},
    };

    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        json_t *t = pr_task(cases[i].url, cases[i].draft, cases[i].from_scm);
        char *prov = NULL, *proj = NULL;
        bool ok = controller_draft_pr_target(&prov, &proj, t, cases[i].api);
        if (ok != (cases[i].provider != NULL)) {
            t_fail(__FILE__, __LINE__, "case %zu (%s): got %d", i,
                   cases[i].url ? cases[i].url : "-", ok);
        } else if (ok) {
            CHECK_EQ_STR(prov, cases[i].provider);
            CHECK_EQ_STR(proj, cases[i].project);
        } else {
            CHECK(prov == NULL && proj == NULL);
        }
        free(prov);
        free(proj);
        json_decref(t);
    }
}

/* The one web base the draft PR and git's credentials (workspace.c) both use. */
TEST(github_web_base_table)
{
    static const struct {
        const char *api, *web;
    } cases[] = {
        {"https://api.github.com", "https://github.com"},
        {"https://API.github.com/", "https://github.com"},
        {"https://ghe.example/api/v3", "https://ghe.example"},
        {"https://ghe.example:8443/api/v3/", "https://ghe.example:8443"},
        {"http://127.0.0.1:5/api/v3", "http://127.0.0.1:5"},
        {"http://127.0.0.1:5", "http://127.0.0.1:5"},
        {"ftp://ghe.example/api/v3", NULL},
        {"https:///api/v3", NULL},
        {NULL, NULL},
    };

    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        char *web = controller_github_web_base(cases[i].api);
        if (cases[i].web == NULL) {
            CHECK(web == NULL);
        } else {
            CHECK_EQ_STR(web, cases[i].web);
        }
        free(web);
    }
}

TEST(draft_pr_request_shape)
{
    json_t *t = pr_task("https://github.com/o/r", true, false);
    json_t *req = controller_draft_pr_request(t);
    const char *body = json_string_value(json_object_get(req, "body"));
    const char *key = json_string_value(json_object_get(req, "key"));

    CHECK_EQ_STR(json_string_value(json_object_get(req, "title")), "fix(t1): fix it");
    CHECK_EQ_STR(json_string_value(json_object_get(req, "head")), "agent/t1");
    CHECK_EQ_STR(json_string_value(json_object_get(req, "base")), "main");
    CHECK(json_is_true(json_object_get(req, "draft")));
    CHECK_EQ_STR(key, "<!-- diverge-draft-pr: ns/t1 -->");
    CHECK(body != NULL && key != NULL && strstr(body, key) != NULL);
    json_decref(req);

    /* Only the first line, and at most 240 bytes cut on a UTF-8 boundary. */
    char obj[600];
    size_t n = 0;
    while (n + 2 < 500) {
        obj[n++] = (char)0xC3; /* é */
        obj[n++] = (char)0xA9;
    }
    obj[n] = '\0';
    json_object_set_new(json_object_get(t, "spec"), "objective", json_string(obj));
    req = controller_draft_pr_request(t);
    const char *title = json_string_value(json_object_get(req, "title"));
    CHECK(title != NULL && strlen(title) <= 240 && strlen(title) > 200);
    json_t *valid = json_string(title); /* NULL for invalid UTF-8 */
    CHECK(valid != NULL);
    json_decref(valid);
    CHECK((strlen(title) - strlen("fix(t1): ")) % 2 == 0);
    json_decref(req);
    json_object_set_new(json_object_get(t, "spec"), "objective",
                        json_string("first line\nsecond line"));
    req = controller_draft_pr_request(t);
    CHECK_EQ_STR(json_string_value(json_object_get(req, "title")), "fix(t1): first line");
    json_decref(req);
    json_decref(t);
}

static int set_suspended(json_t *d, struct err *err, void *ud)
{
    (void)err;
    json_object_set_new(json_object_get(d, "spec"), "suspended", json_boolean(ud != NULL));
    return E_OK;
}

static const char *stored_env_ann(struct task_store *st, const char *key, json_t **hold)
{
    json_decref(*hold);
    *hold = NULL;
    if (task_store_env_get(hold, st, "default", "agent-preview-t", NULL) != E_OK) {
        return NULL;
    }
    return env_ann(*hold, key);
}

/* Provider none: the task turns Active with its Environment, output annotations and
 * previewUrl written in the same transaction; pause hibernates it, resume wakes it;
 * deleting the task deletes it. */
TEST(reconcile_writes_preview)
{
    struct task_store *st = NULL;
    struct controller *c = NULL;
    unsigned char key[TOKEN_ROOT_KEY_LEN] = {0};
    char dir[] = "/tmp/diverge-prev-XXXXXX";
    char *cmd;
    struct controller_config cfg = {.data_dir = mkdtemp(dir),
                                    .root_key = key,
                                    .default_budget_usd = 5000000,
                                    .default_budget_tokens = 1000000,
                                    .sandbox_provider = "none",
                                    .preview_base_url = "https://preview.example",
                                    .manual = true};
    json_t *in = doc("{\"metadata\":{\"name\":\"t\"},\"spec\":{\"objective\":\"x\","
                     "\"repository\":{\"url\":\"https://github.com/o/r\"}}}");
    json_t *obj = NULL, *stored = NULL, *got = NULL, *env = NULL;
    struct err err = {0};
    const char *url = "https://preview.example/?_diverge_env=agent-preview-t";

    CHECK_OK(task_store_sqlite_open(&st, ":memory:", clock_system(), &err));
    CHECK_OK(task_normalize_new(&obj, in, "default", &err));
    CHECK_OK(task_store_create(&stored, st, obj, &err));
    CHECK_OK(controller_new(&c, st, &cfg, &err));
    CHECK_OK(controller_reconcile(c, "default", "t", &err));
    CHECK_OK(task_store_get(&got, st, "default", "t", &err));
    const json_t *ann = json_object_get(json_object_get(got, "metadata"), "annotations");
    CHECK_EQ_STR(json_string_value(json_object_get(ann, CONTROLLER_ANN_PREVIEW_ENV)),
                 "agent-preview-t");
    CHECK_EQ_STR(json_string_value(json_object_get(ann, CONTROLLER_ANN_PREVIEW_URL)), url);
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(got, "status"), "previewUrl")),
                 url);
    CHECK_OK(task_store_env_get(&env, st, "default", "agent-preview-t", &err));
    const json_t *owner =
        json_array_get(json_object_get(json_object_get(env, "metadata"), "ownerReferences"), 0);
    CHECK_EQ_STR(json_string_value(json_object_get(owner, "uid")),
                 json_string_value(json_object_get(json_object_get(got, "metadata"), "uid")));
    CHECK(stored_env_ann(st, CONTROLLER_ANN_HIBERNATED, &env) == NULL);

    CHECK_OK(task_store_mutate(NULL, st, "default", "t", set_suspended, (void *)1, &err));
    CHECK_OK(controller_reconcile(c, "default", "t", &err));
    CHECK_EQ_STR(stored_env_ann(st, CONTROLLER_ANN_HIBERNATED, &env), "true");
    CHECK_OK(task_store_mutate(NULL, st, "default", "t", set_suspended, NULL, &err));
    CHECK_OK(controller_reconcile(c, "default", "t", &err));
    CHECK(stored_env_ann(st, CONTROLLER_ANN_HIBERNATED, &env) == NULL);

    CHECK_OK(task_store_remove(NULL, st, "default", "t", 0, &err));
    json_decref(env);
    env = NULL;
    CHECK_EQ_INT(task_store_env_get(&env, st, "default", "agent-preview-t", &err), E_NOTFOUND);
    char *path = controller_token_path(c, "default", "t");
    controller_free(c);
    unlink(path);
    free(path);
    json_decref(env);
    json_decref(got);
    json_decref(in);
    json_decref(obj);
    json_decref(stored);
    task_store_close(st);
    cmd = xasprintf("rm -rf -- '%s'", dir);
    CHECK(system(cmd) == 0);
    free(cmd);
}

T_MAIN
