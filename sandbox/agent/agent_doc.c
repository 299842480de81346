/* SPDX-License-Identifier: Apache-2.0 */
/* The agent-sandbox documents (see sandbox_agent.h): SandboxClaim
 * extensions.agents.x-k8s.io/v1beta1, Secret v1, and the reading of a claim's status and
 * its Sandbox agents.x-k8s.io/v1beta1 (conditions Ready, Suspended, Finished; podIPs). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/secret.h"
#include "common/tlscert.h"
#include "sandbox/agent/sandbox_agent.h"

#define CLAIM_PREFIX "diverge-"
#define NAME_MAX_LABEL 63

char *sandbox_agent_claim_name(const char *task)
{
    size_t keep = NAME_MAX_LABEL - strlen(CLAIM_PREFIX) - 9; /* "-" + 8 hex */
    uint32_t h = 2166136261u;                                /* FNV-1a */

    if (strlen(CLAIM_PREFIX) + strlen(task) <= NAME_MAX_LABEL) {
        return xasprintf(CLAIM_PREFIX "%s", task);
    }
    for (const char *p = task; *p != '\0'; p++) {
        h = (h ^ (unsigned char)*p) * 16777619u;
    }
    while (keep > 0 && task[keep - 1] == '-') {
        keep--; /* a label never has "--" before the hash's "-"... nor ends in "-" */
    }
    return xasprintf(CLAIM_PREFIX "%.*s-%08x", (int)keep, task, (unsigned int)h);
}

char *sandbox_agent_secret_name(const char *task)
{
    return xasprintf("task-token-%s", task);
}

bool sandbox_agent_env_wanted(const char *kv)
{
    static const char *const skip[] = {
        "PATH",
        "HOME",
        "DIVERGE_WORKSPACE_DIR",
        "DIVERGE_TOKEN_FILE",
        "DIVERGE_METER_SOCKET",
        "DIVERGE_PUSH_URL",
        "DIVERGE_REPO_URL",
        "DIVERGE_USAGE_FILE",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "no_proxy",
    };
    const char *eq = strchr(kv, '=');
    size_t n = eq != NULL ? (size_t)(eq - kv) : strlen(kv);

    if (eq == NULL || n == 0) {
        return false;
    }
    for (size_t i = 0; i < ARRAY_LEN(skip); i++) {
        if (strlen(skip[i]) == n && strncmp(kv, skip[i], n) == 0) {
            return false;
        }
    }
    return true;
}

#define METER_PATH "/api/v1/agenttask/meter"

char *sandbox_agent_git_url(const char *meter_url, const char *ns, const char *task)
{
    size_t n = meter_url != NULL ? strlen(meter_url) : 0;

    if (n <= strlen(METER_PATH) || strcmp(meter_url + n - strlen(METER_PATH), METER_PATH) != 0) {
        return NULL;
    }
    return xasprintf("%.*s/api/v1/git/%s/%s.git", (int)(n - strlen(METER_PATH)), meter_url, ns,
                     task);
}

/* A task with a repository: the server's git smart HTTP (server/api_git.c) for both the
 * clone and the push, at the public URL the meter URL was made of. */
static void git_env(json_t *env, const struct sandbox_spec *s)
{
    const char *meter = NULL;
    char *url;

    for (size_t i = 0; i < SANDBOX_ENV_MAX && s->env[i] != NULL; i++) {
        if (strncmp(s->env[i], "DIVERGE_METER_URL=", 18) == 0) {
            meter = s->env[i] + 18;
        }
    }
    url = s->mirror != NULL ? sandbox_agent_git_url(meter, s->ns, s->name) : NULL;
    if (url != NULL) {
        json_array_append_new(env,
                              json_pack("{s:s, s:s}", "name", "DIVERGE_REPO_URL", "value", url));
        json_array_append_new(env,
                              json_pack("{s:s, s:s}", "name", "DIVERGE_PUSH_URL", "value", url));
    }
    free(url);
}

static json_t *claim_env(const struct sandbox_spec *s)
{
    json_t *env = json_array();

    for (size_t i = 0; i < SANDBOX_ENV_MAX && s->env[i] != NULL; i++) {
        const char *kv = s->env[i];
        const char *eq = strchr(kv, '=');
        if (!sandbox_agent_env_wanted(kv)) {
            continue;
        }
        json_array_append_new(
            env, json_pack("{s:s%, s:s}", "name", kv, (size_t)(eq - kv), "value", eq + 1));
    }
    git_env(env, s);
    if (s->token != NULL) {
        /* The pod's token (docs/cluster-mode.md "Token delivery"): a claim can add env
         * only, no per-task volume. Replaced in the Sandbox's pod template on resume. */
        json_array_append_new(
            env, json_pack("{s:s, s:s}", "name", SANDBOX_AGENT_TOKEN_ENV, "value", s->token));
    }
    /* The usage file in the pod's writable /tmp (the root file system is read-only). */
    json_array_append_new(env, json_pack("{s:s, s:s}", "name", "DIVERGE_USAGE_FILE", "value",
                                         "/tmp/diverge-usage.jsonl"));
    return env;
}

json_t *sandbox_agent_claim(const struct sandbox_spec *s, const char *pool, int64_t now_ms)
{
    char *name = sandbox_agent_claim_name(s->name);
    json_t *spec = json_pack("{s:{s:s}, s:{s:{s:s, s:s}}, s:o}", "warmPoolRef", "name", pool,
                             "additionalPodMetadata", "labels", SANDBOX_AGENT_LABEL_TASK, s->name,
                             SANDBOX_AGENT_LABEL_MANAGED, "diverge", "env", claim_env(s));
    json_t *doc;

    if (s->timeout_s > 0) {
        char ts[CLOCK_RFC3339_MAX];
        clock_rfc3339(ts, now_ms + (s->timeout_s + SANDBOX_AGENT_GRACE_S) * 1000);
        json_object_set_new(
            spec, "lifecycle",
            json_pack("{s:s, s:s}", "shutdownTime", ts, "shutdownPolicy", "Delete"));
    }
    doc = json_pack("{s:s, s:s, s:{s:s, s:s, s:{s:s, s:s}}, s:o}", "apiVersion",
                    "extensions.agents.x-k8s.io/v1beta1", "kind", "SandboxClaim", "metadata",
                    "name", name, "namespace", s->ns, "labels", SANDBOX_AGENT_LABEL_TASK, s->name,
                    SANDBOX_AGENT_LABEL_MANAGED, "diverge", "spec", spec);
    free(name);
    return doc;
}

json_t *sandbox_agent_secret(const char *ns, const char *task, const char *token)
{
    char *name = sandbox_agent_secret_name(task);
    char *b64 = tlscert_base64(token, strlen(token));
    json_t *doc = json_pack("{s:s, s:s, s:{s:s, s:s, s:{s:s, s:s}}, s:s, s:{s:s}}", "apiVersion",
                            "v1", "kind", "Secret", "metadata", "name", name, "namespace", ns,
                            "labels", SANDBOX_AGENT_LABEL_TASK, task, SANDBOX_AGENT_LABEL_MANAGED,
                            "diverge", "type", "Opaque", "data", SANDBOX_AGENT_TOKEN_KEY, b64);

    secret_wipe(b64, strlen(b64));
    free(b64);
    free(name);
    return doc;
}

const char *sandbox_agent_bound(const json_t *claim)
{
    const char *n = json_string_value(
        json_object_get(json_object_get(json_object_get(claim, "status"), "sandbox"), "name"));

    if (n == NULL || n[0] == '\0') {
        n = json_string_value(
            json_object_get(json_object_get(json_object_get(claim, "metadata"), "annotations"),
                            SANDBOX_AGENT_ANN_SANDBOX));
    }
    return n != NULL && n[0] != '\0' ? n : NULL;
}

/* The condition TYPE of DOC's status whose status is "True": its reason ("" without one),
 * or NULL. WANT_FALSE: the one whose status is "False" instead. */
static const char *condition(const json_t *doc, const char *type, bool want_false)
{
    const json_t *conds = json_object_get(json_object_get(doc, "status"), "conditions");
    const json_t *c;
    size_t i;

    json_array_foreach(conds, i, c)
    {
        const char *t = json_string_value(json_object_get(c, "type"));
        const char *st = json_string_value(json_object_get(c, "status"));
        const char *reason = json_string_value(json_object_get(c, "reason"));
        if (t != NULL && st != NULL && strcmp(t, type) == 0 &&
            strcmp(st, want_false ? "False" : "True") == 0) {
            return reason != NULL ? reason : "";
        }
    }
    return NULL;
}

static const char *first_ip(const json_t *status)
{
    const char *ip = json_string_value(json_array_get(json_object_get(status, "podIPs"), 0));

    return ip != NULL && ip[0] != '\0' ? ip : NULL;
}

void sandbox_agent_observe(struct sandbox_agent_obs *out, const json_t *claim,
                           const json_t *sandbox)
{
    const char *mode, *finished, *ready_false;

    memset(out, 0, sizeof(*out));
    if (claim == NULL) {
        out->state = SANDBOX_ABSENT;
        return;
    }
    out->state = SANDBOX_RUNNING; /* claimed: provisioning or running */
    out->ip = first_ip(json_object_get(json_object_get(claim, "status"), "sandbox"));
    if (sandbox == NULL) {
        return;
    }
    if (first_ip(json_object_get(sandbox, "status")) != NULL) {
        out->ip = first_ip(json_object_get(sandbox, "status"));
    }
    finished = condition(sandbox, "Finished", false);
    ready_false = condition(sandbox, "Ready", true);
    mode = json_string_value(json_object_get(json_object_get(sandbox, "spec"), "operatingMode"));
    if (finished != NULL) {
        out->state = SANDBOX_EXITED;
        out->exit_code = strcmp(finished, "PodSucceeded") == 0 ? 0 : 1;
        out->ip = NULL;
    } else if (ready_false != NULL && strcmp(ready_false, "SandboxExpired") == 0) {
        out->state = SANDBOX_EXITED;
        out->exit_code = SANDBOX_AGENT_EXIT_GONE;
        out->ip = NULL;
    } else if (mode != NULL && strcmp(mode, "Suspended") == 0) {
        out->state = SANDBOX_PAUSED;
        out->ip = NULL;
    }
}

const char *sandbox_agent_pod_name(const json_t *sandbox)
{
    const json_t *md = json_object_get(sandbox, "metadata");
    const char *pod = json_string_value(
        json_object_get(json_object_get(md, "annotations"), "agents.x-k8s.io/pod-name"));

    return pod != NULL && pod[0] != '\0' ? pod : json_string_value(json_object_get(md, "name"));
}

bool sandbox_agent_pod_exit(int *code_out, const json_t *pod)
{
    const json_t *all = json_object_get(json_object_get(pod, "status"), "containerStatuses");
    const json_t *c, *pick = json_array_get(all, 0), *code;
    size_t i;

    json_array_foreach(all, i, c)
    {
        const char *n = json_string_value(json_object_get(c, "name"));
        if (n != NULL && strcmp(n, "runner") == 0) {
            pick = c;
        }
    }
    code =
        json_object_get(json_object_get(json_object_get(pick, "state"), "terminated"), "exitCode");
    if (!json_is_integer(code) || json_integer_value(code) < 0 || json_integer_value(code) > 255) {
        return false;
    }
    *code_out = (int)json_integer_value(code);
    return true;
}

/* Sets the value of every SANDBOX_AGENT_TOKEN_ENV entry of the env array ENV to TOKEN;
 * false when there is none. */
static bool env_set_token(json_t *env, const char *token)
{
    size_t j;
    json_t *e;
    bool found = false;

    json_array_foreach(env, j, e)
    {
        const char *name = json_string_value(json_object_get(e, "name"));
        if (name != NULL && strcmp(name, SANDBOX_AGENT_TOKEN_ENV) == 0) {
            json_object_set_new(e, "value", json_string(token));
            found = true;
        }
    }
    return found;
}

static const char *resource_version(const json_t *doc)
{
    return json_string_value(json_object_get(json_object_get(doc, "metadata"), "resourceVersion"));
}

json_t *sandbox_agent_token_patch(const json_t *doc, const char *token)
{
    const json_t *tmpl = json_object_get(json_object_get(doc, "spec"), "podTemplate");
    json_t *containers =
        json_deep_copy(json_object_get(json_object_get(tmpl, "spec"), "containers"));
    size_t i;
    json_t *c;
    bool found = false;

    json_array_foreach(containers, i, c)
    {
        found = env_set_token(json_object_get(c, "env"), token) || found;
    }
    if (!found || resource_version(doc) == NULL) {
        json_decref(containers);
        return NULL;
    }
    return json_pack("{s:{s:s}, s:{s:{s:{s:o}}}}", "metadata", "resourceVersion",
                     resource_version(doc), "spec", "podTemplate", "spec", "containers",
                     containers);
}

json_t *sandbox_agent_claim_token_patch(const json_t *doc, const char *token)
{
    json_t *env = json_deep_copy(json_object_get(json_object_get(doc, "spec"), "env"));

    if (!env_set_token(env, token) || resource_version(doc) == NULL) {
        json_decref(env);
        return NULL;
    }
    return json_pack("{s:{s:s}, s:{s:o}}", "metadata", "resourceVersion", resource_version(doc),
                     "spec", "env", env);
}
