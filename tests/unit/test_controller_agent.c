/* SPDX-License-Identifier: Apache-2.0 */
/* The agent-sandbox provider: the pure parts (names, the SandboxClaim and Secret documents,
 * what a claim and its Sandbox say) and the provider against tests/fakes/fake_kube.py, the
 * test playing the agent-sandbox controller (it writes the Sandbox and the claim status). */
#include <stdatomic.h>
#include <sys/stat.h>

#include "sandbox/agent/sandbox_agent.h"
#include "tests/unit/kube_fixture.h"

#include "tests/t_check.h"

static struct fake_kube fake;

TEST(claim_names)
{
    char long_name[64];
    char *a = sandbox_agent_claim_name("t1"), *b, *c;

    CHECK_EQ_STR(a, "diverge-t1");
    memset(long_name, 'x', 63);
    long_name[63] = '\0';
    long_name[45] = '-';
    b = sandbox_agent_claim_name(long_name);
    c = sandbox_agent_claim_name(long_name);
    CHECK(strlen(b) <= 63);
    CHECK_EQ_STR(b, c); /* deterministic */
    CHECK(strncmp(b, "diverge-", 8) == 0);
    CHECK(strstr(b, "--") == NULL);
    CHECK(b[strlen(b) - 1] != '-');
    free(a);
    free(b);
    free(c);
    a = sandbox_agent_secret_name("t1");
    CHECK_EQ_STR(a, "task-token-t1");
    free(a);
}

static const char *env_value(const json_t *claim, const char *name)
{
    const json_t *e;
    size_t i;

    json_array_foreach(json_object_get(json_object_get(claim, "spec"), "env"), i, e)
    {
        if (strcmp(json_string_value(json_object_get(e, "name")), name) == 0) {
            return json_string_value(json_object_get(e, "value"));
        }
    }
    return NULL;
}

static void spec_of(struct sandbox_spec *s)
{
    memset(s, 0, sizeof(*s));
    s->ns = "default";
    s->name = "t1";
    s->env[0] = "PATH=/usr/bin";
    s->env[1] = "DIVERGE_METER_URL=https://diverge.example/api/v1/agenttask/meter";
    s->env[2] = "DIVERGE_TOKEN_FILE=/data/tokens/default/t1/token";
    s->env[3] = "DIVERGE_METER_SOCKET=/data/sock/meter.sock";
    s->env[4] = "DIVERGE_OBJECTIVE=a=b";
    s->env[5] = "DIVERGE_WORKSPACE_DIR=/data/workspaces/default/t1";
    s->env[6] = "DIVERGE_PUSH_URL=file:///data/staging/default/t1.git";
    s->env[7] = "DIVERGE_USAGE_FILE=/data/state/default/t1/usage.jsonl";
    s->env[8] = "HTTPS_PROXY=http://127.0.0.1:3128";
    s->env[9] = NULL;
}

TEST(claim_document)
{
    struct sandbox_spec s;
    json_t *claim, *lc;

    spec_of(&s);
    s.timeout_s = 1800;
    claim = sandbox_agent_claim(&s, "pool-a", 1796041200000); /* 2026-11-30T12:20:00Z */
    CHECK_EQ_STR(json_string_value(json_object_get(claim, "apiVersion")),
                 "extensions.agents.x-k8s.io/v1beta1");
    CHECK_EQ_STR(json_string_value(json_object_get(claim, "kind")), "SandboxClaim");
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(claim, "metadata"), "name")),
                 "diverge-t1");
    CHECK_EQ_STR(json_string_value(
                     json_object_get(json_object_get(json_object_get(claim, "metadata"), "labels"),
                                     SANDBOX_AGENT_LABEL_TASK)),
                 "t1");
    CHECK_EQ_STR(json_string_value(json_object_get(
                     json_object_get(json_object_get(claim, "spec"), "warmPoolRef"), "name")),
                 "pool-a");
    CHECK_EQ_STR(env_value(claim, "DIVERGE_METER_URL"),
                 "https://diverge.example/api/v1/agenttask/meter");
    CHECK_EQ_STR(env_value(claim, "DIVERGE_OBJECTIVE"), "a=b");
    CHECK_EQ_STR(env_value(claim, "DIVERGE_USAGE_FILE"), "/tmp/diverge-usage.jsonl");
    CHECK(env_value(claim, "PATH") == NULL);
    CHECK(env_value(claim, "DIVERGE_TOKEN_FILE") == NULL);
    CHECK(env_value(claim, "DIVERGE_METER_SOCKET") == NULL);
    CHECK(env_value(claim, "DIVERGE_WORKSPACE_DIR") == NULL);
    CHECK(env_value(claim, "DIVERGE_PUSH_URL") == NULL);
    CHECK(env_value(claim, "HTTPS_PROXY") == NULL);
    lc = json_object_get(json_object_get(claim, "spec"), "lifecycle");
    /* 12:20:00 + 1800 s + 60 s grace */
    CHECK_EQ_STR(json_string_value(json_object_get(lc, "shutdownTime")), "2026-11-30T12:51:00Z");
    CHECK_EQ_STR(json_string_value(json_object_get(lc, "shutdownPolicy")), "Delete");
    json_decref(claim);
    s.timeout_s = 0;
    claim = sandbox_agent_claim(&s, "pool-a", 1796041200000);
    CHECK(json_object_get(json_object_get(claim, "spec"), "lifecycle") == NULL);
    json_decref(claim);
}

TEST(claim_repository_env_and_token)
{
    struct sandbox_spec s;
    json_t *claim, *sb, *patch, *env;
    char *u;

    spec_of(&s);
    s.mirror = "/data/mirrors/0123456789abcdef.git";
    s.token = "tok-1";
    claim = sandbox_agent_claim(&s, "pool-a", 1796041200000);
    /* The server's git smart HTTP, never the host paths. */
    CHECK_EQ_STR(env_value(claim, "DIVERGE_REPO_URL"),
                 "https://diverge.example/api/v1/git/default/t1.git");
    CHECK_EQ_STR(env_value(claim, "DIVERGE_PUSH_URL"),
                 "https://diverge.example/api/v1/git/default/t1.git");
    CHECK_EQ_STR(env_value(claim, SANDBOX_AGENT_TOKEN_ENV), "tok-1");
    json_decref(claim);
    s.mirror = NULL;
    claim = sandbox_agent_claim(&s, "pool-a", 1796041200000);
    CHECK(env_value(claim, "DIVERGE_REPO_URL") == NULL);
    CHECK(env_value(claim, "DIVERGE_PUSH_URL") == NULL);
    CHECK(sandbox_agent_git_url("https://x/other", "default", "t1") == NULL);
    CHECK(sandbox_agent_git_url(NULL, "default", "t1") == NULL);
    u = sandbox_agent_git_url("http://127.0.0.1:8080/api/v1/agenttask/meter", "ns", "t");
    CHECK_EQ_STR(u, "http://127.0.0.1:8080/api/v1/git/ns/t.git");
    free(u);

    /* The claim unbound: its spec.env gets the fresh token, guarded by resourceVersion. */
    json_object_set_new(json_object_get(claim, "metadata"), "resourceVersion", json_string("7"));
    patch = sandbox_agent_claim_token_patch(claim, "tok-2");
    CHECK(patch != NULL);
    CHECK_EQ_STR(
        json_string_value(json_object_get(json_object_get(patch, "metadata"), "resourceVersion")),
        "7");
    json_object_set(json_object_get(claim, "spec"), "env",
                    json_object_get(json_object_get(patch, "spec"), "env"));
    CHECK_EQ_STR(env_value(claim, SANDBOX_AGENT_TOKEN_ENV), "tok-2");
    CHECK_EQ_STR(env_value(claim, "DIVERGE_OBJECTIVE"), "a=b");
    json_decref(patch);

    /* A bound Sandbox: the env of its pod template's containers (the resumed pod's). */
    env = json_deep_copy(json_object_get(json_object_get(claim, "spec"), "env"));
    sb = json_pack("{s:{s:s}, s:{s:{s:{s:[{s:s}, {s:s, s:o}]}}}}", "metadata", "resourceVersion",
                   "9", "spec", "podTemplate", "spec", "containers", "name", "side", "name",
                   "runner", "env", env);
    patch = sandbox_agent_token_patch(sb, "tok-3");
    CHECK(patch != NULL);
    CHECK_EQ_STR(
        json_string_value(json_object_get(json_object_get(patch, "metadata"), "resourceVersion")),
        "9");
    env = json_object_get(
        json_array_get(
            json_object_get(
                json_object_get(json_object_get(json_object_get(patch, "spec"), "podTemplate"),
                                "spec"),
                "containers"),
            1),
        "env");
    {
        json_t *view = json_pack("{s:{s:O}}", "spec", "env", env);
        CHECK_EQ_STR(env_value(view, SANDBOX_AGENT_TOKEN_ENV), "tok-3");
        CHECK_EQ_STR(env_value(view, "DIVERGE_OBJECTIVE"), "a=b");
        json_decref(view);
    }
    json_decref(patch);
    /* No token var in the template: nothing to patch. */
    {
        json_t *tmpl = json_object_get(json_object_get(sb, "spec"), "podTemplate");
        json_t *runner =
            json_array_get(json_object_get(json_object_get(tmpl, "spec"), "containers"), 1);
        json_object_del(runner, "env");
    }
    CHECK(sandbox_agent_token_patch(sb, "tok-3") == NULL);
    json_decref(sb);
    json_decref(claim);
}

TEST(secret_document)
{
    json_t *sec = sandbox_agent_secret("ns1", "t1", "tok");

    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(sec, "metadata"), "name")),
                 "task-token-t1");
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(sec, "data"), "token")), "dG9r");
    json_decref(sec);
}

static json_t *sandbox_doc(const char *mode, const char *cond, const char *st, const char *reason,
                           const char *ip)
{
    json_t *sb =
        json_pack("{s:{s:s}, s:{s:[{s:s, s:s, s:s}], s:[]}}", "spec", "operatingMode", mode,
                  "status", "conditions", "type", cond, "status", st, "reason", reason, "podIPs");

    if (ip != NULL) {
        json_array_append_new(json_object_get(json_object_get(sb, "status"), "podIPs"),
                              json_string(ip));
    }
    return sb;
}

TEST(observe_mapping)
{
    struct sandbox_agent_obs o;
    json_t *claim = json_pack("{s:{s:s}, s:{s:{s:[s]}}}", "metadata", "name", "diverge-t1",
                              "status", "sandbox", "podIPs", "10.0.0.9");
    json_t *sb;

    sandbox_agent_observe(&o, NULL, NULL);
    CHECK_EQ_INT(o.state, SANDBOX_ABSENT);
    sandbox_agent_observe(&o, claim, NULL); /* claimed, not bound yet */
    CHECK_EQ_INT(o.state, SANDBOX_RUNNING);
    CHECK_EQ_STR(o.ip, "10.0.0.9");
    CHECK(sandbox_agent_bound(claim) == NULL);
    json_object_set_new(json_object_get(claim, "metadata"), "annotations",
                        json_pack("{s:s}", SANDBOX_AGENT_ANN_SANDBOX, "warm-1"));
    CHECK_EQ_STR(sandbox_agent_bound(claim), "warm-1");
    json_object_set_new(json_object_get(json_object_get(claim, "status"), "sandbox"), "name",
                        json_string("warm-2"));
    CHECK_EQ_STR(sandbox_agent_bound(claim), "warm-2"); /* status first */

    sb = sandbox_doc("Running", "Ready", "True", "DependenciesReady", "10.0.0.7");
    sandbox_agent_observe(&o, claim, sb);
    CHECK_EQ_INT(o.state, SANDBOX_RUNNING);
    CHECK_EQ_STR(o.ip, "10.0.0.7");
    json_decref(sb);
    sb = sandbox_doc("Suspended", "Suspended", "True", "PodTerminated", NULL);
    sandbox_agent_observe(&o, claim, sb);
    CHECK_EQ_INT(o.state, SANDBOX_PAUSED);
    CHECK(o.ip == NULL);
    json_decref(sb);
    sb = sandbox_doc("Running", "Finished", "True", "PodSucceeded", NULL);
    sandbox_agent_observe(&o, claim, sb);
    CHECK_EQ_INT(o.state, SANDBOX_EXITED);
    CHECK_EQ_INT(o.exit_code, 0);
    json_decref(sb);
    sb = sandbox_doc("Running", "Finished", "True", "PodFailed", NULL);
    sandbox_agent_observe(&o, claim, sb);
    CHECK_EQ_INT(o.state, SANDBOX_EXITED);
    CHECK_EQ_INT(o.exit_code, 1);
    json_decref(sb);
    sb = sandbox_doc("Running", "Ready", "False", "SandboxExpired", NULL);
    sandbox_agent_observe(&o, claim, sb);
    CHECK_EQ_INT(o.state, SANDBOX_EXITED);
    CHECK_EQ_INT(o.exit_code, SANDBOX_AGENT_EXIT_GONE);
    json_decref(sb);
    sb = sandbox_doc("Running", "Finished", "False", "PodSucceeded", "10.0.0.7");
    sandbox_agent_observe(&o, claim, sb); /* Finished False is not finished */
    CHECK_EQ_INT(o.state, SANDBOX_RUNNING);
    json_decref(sb);
    json_decref(claim);
}

TEST(pod_exit_status)
{
    json_t *pod = json_pack("{s:{s:[{s:s, s:{s:{s:i}}}, {s:s, s:{s:{s:i}}}]}}", "status",
                            "containerStatuses", "name", "sidecar", "state", "terminated",
                            "exitCode", 0, "name", "runner", "state", "terminated", "exitCode", 3);
    json_t *sb = json_pack("{s:{s:s}}", "metadata", "name", "sbx-1");
    int code = -1;

    CHECK(sandbox_agent_pod_exit(&code, pod));
    CHECK_EQ_INT(code, 3); /* the runner container, not the first */
    json_decref(pod);
    pod = json_pack("{s:{s:[{s:s, s:{s:{}}}]}}", "status", "containerStatuses", "name", "runner",
                    "state", "running");
    CHECK(!sandbox_agent_pod_exit(&code, pod)); /* still running: nothing to say */
    json_decref(pod);
    pod = json_pack("{s:{s:[{s:{s:{s:i}}}]}}", "status", "containerStatuses", "state", "terminated",
                    "exitCode", 999);
    CHECK(!sandbox_agent_pod_exit(&code, pod)); /* not an exit status */
    json_decref(pod);
    CHECK_EQ_STR(sandbox_agent_pod_name(sb), "sbx-1");
    json_object_set_new(json_object_get(sb, "metadata"), "annotations",
                        json_pack("{s:s}", "agents.x-k8s.io/pod-name", "warm-pod-7"));
    CHECK_EQ_STR(sandbox_agent_pod_name(sb), "warm-pod-7");
    json_decref(sb);
}

static atomic_int g_notes;

static void on_note(const char *ns, const char *name, void *userdata)
{
    (void)ns;
    (void)name;
    (void)userdata;
    atomic_fetch_add(&g_notes, 1);
}

/* Plays the agent-sandbox controller: binds the claim to Sandbox SB with IP. */
static void bind(struct kube_client *k, const char *sb, const char *ip)
{
    json_t *doc =
        json_pack("{s:{s:s}, s:{s:s}}", "metadata", "name", sb, "spec", "operatingMode", "Running");
    json_t *out = NULL, *claim = NULL;
    struct err err = {0};

    CHECK_OK(kube_create(&out, k, &KUBE_SANDBOXES, "default", doc, &err));
    json_object_set_new(out, "status",
                        json_pack("{s:[{s:s, s:s, s:s}], s:[s]}", "conditions", "type", "Ready",
                                  "status", "True", "reason", "DependenciesReady", "podIPs", ip));
    json_decref(doc);
    doc = out;
    CHECK_OK(kube_update_status(&out, k, &KUBE_SANDBOXES, "default", doc, &err));
    json_decref(doc);
    json_decref(out);
    CHECK_OK(kube_get(&claim, k, &KUBE_SANDBOXCLAIMS, "default", "diverge-p1", &err));
    json_object_set_new(claim, "status",
                        json_pack("{s:{s:s, s:[s]}}", "sandbox", "name", sb, "podIPs", ip));
    CHECK_OK(kube_update_status(&out, k, &KUBE_SANDBOXCLAIMS, "default", claim, &err));
    json_decref(claim);
    json_decref(out);
}

static bool streq(const char *a, const char *b)
{
    return a != NULL && strcmp(a, b) == 0;
}

static void write_token(const char *path, const char *token)
{
    FILE *f = fopen(path, "w");

    CHECK(f != NULL);
    if (f != NULL) {
        fputs(token, f);
        fclose(f);
    }
}

static char *wait_address(struct sandbox_provider *p)
{
    for (int i = 0; i < 2000; i++) {
        char *ip = sandbox_address(p, "default", "p1", NULL);
        if (ip != NULL) {
            return ip;
        }
        fixture_sleep_ms(5);
    }
    return NULL;
}

static const char *mode_of(struct kube_client *k, json_t **hold)
{
    struct err err = {0};

    json_decref(*hold);
    *hold = NULL;
    if (kube_get(hold, k, &KUBE_SANDBOXES, "default", "warm-p1", &err) != E_OK) {
        return NULL;
    }
    return json_string_value(json_object_get(json_object_get(*hold, "spec"), "operatingMode"));
}

TEST(provider_against_fake)
{
    struct kube_client *k = fake_kube_client(&fake, NULL);
    struct sandbox_agent_opts o = {.kube = k, .warm_pool = "pool-a", .poll_ms = 20};
    struct sandbox_provider *p = NULL;
    struct sandbox_status st;
    struct sandbox_spec s;
    struct err err = {0};
    char dir[] = "/tmp/diverge-agent-XXXXXX", *path, *ip;
    json_t *hold = NULL, *claim = NULL;

    CHECK(mkdtemp(dir) != NULL);
    path = xasprintf("%s/token", dir);
    spec_of(&s);
    s.name = "p1";
    s.token = "token-one";
    s.token_dir = dir;
    s.log_path = "/dev/null";
    CHECK_OK(sandbox_agent_new(&p, &o, &err));
    p->on_exit = on_note;
    CHECK_OK(sandbox_start(p, &s, &err));
    CHECK_OK(sandbox_start(p, &s, &err)); /* AlreadyExists: adopted, not a second one */
    CHECK_OK(kube_get(&claim, k, &KUBE_SANDBOXCLAIMS, "default", "diverge-p1", &err));
    json_decref(claim);
    sandbox_status(&st, p, "default", "p1");
    CHECK_EQ_INT(st.state, SANDBOX_RUNNING);
    CHECK(sandbox_address(p, "default", "p1", NULL) == NULL); /* no pod yet */
    /* Suspended before agent-sandbox bound the claim: the Sandbox is suspended as soon as
     * the claim names it. */
    CHECK_OK(sandbox_suspend(p, "default", "p1", &err));
    sandbox_status(&st, p, "default", "p1");
    CHECK_EQ_INT(st.state, SANDBOX_PAUSED);
    bind(k, "warm-p1", "10.9.8.7");
    for (int i = 0; i < 2000 && !streq(mode_of(k, &hold), "Suspended"); i++) {
        fixture_sleep_ms(5);
    }
    CHECK_EQ_STR(mode_of(k, &hold), "Suspended");

    write_token(path, "token-two");
    CHECK_OK(sandbox_resume(p, "default", "p1", &err));
    CHECK_EQ_STR(mode_of(k, &hold), "Running");
    json_decref(hold);
    hold = NULL;
    CHECK_OK(kube_get(&hold, k, &KUBE_SECRETS, "default", "task-token-p1", &err));
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(hold, "data"), "token")),
                 "dG9rZW4tdHdv"); /* base64("token-two"): the fresh token */
    sandbox_status(&st, p, "default", "p1");
    CHECK_EQ_INT(st.state, SANDBOX_RUNNING);

    ip = wait_address(p);
    CHECK_EQ_STR(ip, "10.9.8.7");
    free(ip);
    CHECK(atomic_load(&g_notes) >= 1); /* the controller hears of the address */

    CHECK_OK(sandbox_suspend(p, "default", "p1", &err));
    CHECK_EQ_STR(mode_of(k, &hold), "Suspended");
    sandbox_status(&st, p, "default", "p1");
    CHECK_EQ_INT(st.state, SANDBOX_PAUSED);
    CHECK(sandbox_address(p, "default", "p1", NULL) == NULL);
    CHECK_EQ_INT(sandbox_suspend(p, "default", "p1", &err), E_NOTFOUND);
    write_token(path, "token-three");
    CHECK_OK(sandbox_resume(p, "default", "p1", &err));
    CHECK_EQ_STR(mode_of(k, &hold), "Running");
    CHECK_EQ_INT(sandbox_resume(p, "default", "p1", &err), E_NOTFOUND); /* it runs */

    sandbox_stop(p, "default", "p1");
    sandbox_status(&st, p, "default", "p1");
    CHECK_EQ_INT(st.state, SANDBOX_ABSENT);
    CHECK_EQ_INT(kube_get(&claim, k, &KUBE_SANDBOXCLAIMS, "default", "diverge-p1", &err),
                 E_NOTFOUND);
    CHECK_EQ_INT(kube_get(&claim, k, &KUBE_SECRETS, "default", "task-token-p1", &err), E_NOTFOUND);
    sandbox_provider_free(p);
    json_decref(hold);
    (void)unlink(path);
    (void)rmdir(dir);
    free(path);
    kube_client_free(k);
}

TEST(provider_adopts_claims)
{
    struct kube_client *k = fake_kube_client(&fake, NULL);
    struct sandbox_agent_opts o = {.kube = k, .warm_pool = "pool-a", .poll_ms = 20};
    struct sandbox_provider *p = NULL;
    struct sandbox_status st;
    struct sandbox_spec s;
    struct err err = {0};
    json_t *foreign =
        json_pack("{s:{s:s, s:{s:s, s:s}}, s:{s:{s:s}}}", "metadata", "name", "not-ours", "labels",
                  SANDBOX_AGENT_LABEL_TASK, "q2", SANDBOX_AGENT_LABEL_MANAGED, "diverge", "spec",
                  "warmPoolRef", "name", "pool-a");
    json_t *out = NULL;

    spec_of(&s);
    s.name = "q1";
    s.token = "tok";
    s.token_dir = "/nonexistent";
    s.log_path = "/dev/null";
    CHECK_OK(sandbox_agent_new(&p, &o, &err));
    CHECK_OK(sandbox_start(p, &s, &err));
    sandbox_provider_free(p); /* the server stops: the claim stays */
    CHECK_OK(kube_create(&out, k, &KUBE_SANDBOXCLAIMS, "default", foreign, &err));
    json_decref(out);
    o.data_dir = "/nonexistent-data";
    CHECK_OK(sandbox_agent_new(&p, &o, &err));
    sandbox_status(&st, p, "default", "q1");
    CHECK_EQ_INT(st.state, SANDBOX_RUNNING); /* adopted: no restart */
    sandbox_status(&st, p, "default", "q2");
    CHECK_EQ_INT(st.state, SANDBOX_ABSENT); /* a claim not named like the task's */
    sandbox_stop(p, "default", "q1");
    CHECK_EQ_INT(kube_get(&out, k, &KUBE_SANDBOXCLAIMS, "default", "diverge-q1", &err), E_NOTFOUND);
    sandbox_provider_free(p);
    CHECK_OK(kube_delete(k, &KUBE_SANDBOXCLAIMS, "default", "not-ours", NULL, &err));
    json_decref(foreign);
    kube_client_free(k);
}

TEST(provider_needs_pool)
{
    struct kube_client *k = fake_kube_client(&fake, NULL);
    struct sandbox_agent_opts o = {.kube = k, .warm_pool = NULL};
    struct sandbox_provider *p = NULL;
    struct err err = {0};

    CHECK_EQ_INT(sandbox_agent_new(&p, &o, &err), E_INVALID);
    CHECK(strstr(err.msg, "warm pool") != NULL);
    kube_client_free(k);
}

int main(int argc, char **argv)
{
    int rc;

    fake_kube_start(&fake, NULL);
    rc = t_main(argc, argv);
    fake_kube_stop(&fake);
    return rc;
}
