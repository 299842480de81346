/* SPDX-License-Identifier: Apache-2.0 */
/* AgentTask validation and normalization (SPEC §4). The invariant: every object that
 * reaches a store backend passed task_validate(), so readers may trust its types. */
#include <ctype.h>
#include <string.h>

#include "common/money.h"
#include "common/hash.h"
#include "store/store.h"
#include "store/store_backend.h"

static const char *const g_phase_names[TASK_PHASE_COUNT] = {
    "Pending", "Provisioning", "Active", "Pausing", "Paused", "Completed", "Failed",
};

const char *task_phase_name(enum task_phase p)
{
    return (p >= 0 && p < TASK_PHASE_COUNT) ? g_phase_names[p] : "Unknown";
}

int task_phase_parse(enum task_phase *out, const char *s)
{
    for (int i = 0; i < TASK_PHASE_COUNT; i++) {
        if (strcmp(s, g_phase_names[i]) == 0) {
            *out = (enum task_phase)i;
            return E_OK;
        }
    }
    return E_INVALID;
}

const char *task_event_name(enum task_event_type t)
{
    static const char *const names[] = {"ADDED", "MODIFIED", "DELETED"};
    return names[t];
}

bool task_name_valid(const char *s)
{
    size_t n = strlen(s);

    if (n == 0 || n > 63 || s[0] == '-' || s[n - 1] == '-') {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) {
            return false;
        }
    }
    return true;
}

/* --- field checkers: each returns E_OK or E_INVALID naming PATH, and may replace the
 * value in PARENT under KEY with its canonical form. */

typedef int (*field_check_fn)(json_t *parent, const char *key, json_t *v, const char *path,
                              struct err *err);

struct field_rule {
    const char *key;
    field_check_fn check;
};

static int check_string(json_t *parent, const char *key, json_t *v, const char *path,
                        struct err *err)
{
    (void)parent;
    (void)key;
    if (!json_is_string(v)) {
        return err_set_field(err, E_INVALID, path, "%s: must be a string", path);
    }
    return E_OK;
}

static int check_bool(json_t *parent, const char *key, json_t *v, const char *path, struct err *err)
{
    (void)parent;
    (void)key;
    if (!json_is_boolean(v)) {
        return err_set_field(err, E_INVALID, path, "%s: must be true or false", path);
    }
    return E_OK;
}

static int check_count(json_t *parent, const char *key, json_t *v, const char *path,
                       struct err *err)
{
    (void)parent;
    (void)key;
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        return err_set_field(err, E_INVALID, path, "%s: must be a non-negative integer", path);
    }
    return E_OK;
}

static int check_money(json_t *parent, const char *key, json_t *v, const char *path,
                       struct err *err)
{
    char canon[MONEY_STR_MAX];
    int64_t micros;
    struct err perr = {0};

    if (json_is_integer(v) && json_integer_value(v) >= 0 &&
        json_integer_value(v) <= INT64_MAX / MONEY_MICROS_PER_USD) {
        micros = json_integer_value(v) * MONEY_MICROS_PER_USD;
    } else if (json_is_string(v) && json_string_value(v)[0] >= '0' &&
               json_string_value(v)[0] <= '9') {
        if (money_parse(&micros, NULL, json_string_value(v), &perr) != E_OK) {
            return err_set_field(err, E_INVALID, path, "%s: %s", path, perr.msg);
        }
    } else {
        return err_set_field(err, E_INVALID, path,
                             "%s: must be a decimal string of dollars like \"5.00\"", path);
    }
    money_format(canon, micros);
    json_object_set_new(parent, key, json_string(canon));
    return E_OK;
}

static int check_string_list(json_t *parent, const char *key, json_t *v, const char *path,
                             struct err *err)
{
    size_t i;
    json_t *item;

    (void)parent;
    (void)key;
    if (!json_is_array(v)) {
        return err_set_field(err, E_INVALID, path, "%s: must be a list of strings", path);
    }
    json_array_foreach(v, i, item)
    {
        if (!json_is_string(item) || json_string_length(item) == 0) {
            char p[160];
            snprintf(p, sizeof(p), "%s[%zu]", path, i);
            return err_set_field(err, E_INVALID, p, "%s: must be a non-empty string", p);
        }
    }
    return E_OK;
}

static int check_string_map(json_t *parent, const char *key, json_t *v, const char *path,
                            struct err *err)
{
    const char *k;
    json_t *item;

    (void)parent;
    (void)key;
    if (!json_is_object(v)) {
        return err_set_field(err, E_INVALID, path, "%s: must be a map of strings", path);
    }
    json_object_foreach(v, k, item)
    {
        if (!json_is_string(item)) {
            char p[256];
            snprintf(p, sizeof(p), "%s[%s]", path, k);
            return err_set_field(err, E_INVALID, p, "%s: must be a string", p);
        }
    }
    return E_OK;
}

static int check_time_or_null(json_t *parent, const char *key, json_t *v, const char *path,
                              struct err *err)
{
    int64_t ms;

    (void)parent;
    (void)key;
    if (json_is_null(v)) {
        return E_OK;
    }
    if (!json_is_string(v) || clock_parse_rfc3339(&ms, json_string_value(v)) != E_OK) {
        return err_set_field(err, E_INVALID, path, "%s: must be an RFC 3339 time or null", path);
    }
    return E_OK;
}

static int check_phase(json_t *parent, const char *key, json_t *v, const char *path,
                       struct err *err)
{
    enum task_phase p;

    (void)parent;
    (void)key;
    if (!json_is_string(v) || task_phase_parse(&p, json_string_value(v)) != E_OK) {
        return err_set_field(err, E_INVALID, path,
                             "%s: must be one of Pending, Provisioning, Active, Pausing, "
                             "Paused, Completed, Failed",
                             path);
    }
    return E_OK;
}

static int check_provider(json_t *parent, const char *key, json_t *v, const char *path,
                          struct err *err)
{
    static const char *const ok[] = {"local", "process", "none", "agent-sandbox"};

    (void)parent;
    (void)key;
    if (json_is_string(v)) {
        for (size_t i = 0; i < ARRAY_LEN(ok); i++) {
            if (strcmp(json_string_value(v), ok[i]) == 0) {
                return E_OK;
            }
        }
    }
    return err_set_field(err, E_INVALID, path,
                         "%s: must be one of local, process, none, agent-sandbox", path);
}

static int check_network(json_t *parent, const char *key, json_t *v, const char *path,
                         struct err *err)
{
    (void)parent;
    (void)key;
    if (json_is_string(v) &&
        (strcmp(json_string_value(v), "none") == 0 || strcmp(json_string_value(v), "proxy") == 0)) {
        return E_OK;
    }
    return err_set_field(err, E_INVALID, path, "%s: must be none or proxy", path);
}

/* One allowlist entry: a host name, "*.suffix" or an IP literal ("[v6]" with a port),
 * optionally ":port". The egress module parses it fully; here only the shape and size. */
static bool allowed_host_shape_ok(const char *s, size_t len)
{
    if (len == 0 || len > TASK_ALLOWED_HOST_MAX) {
        return false;
    }
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == 0 || (!isalnum(c) && strchr(".-*:[]_", c) == NULL)) {
            return false;
        }
    }
    return true;
}

static int check_allowed_hosts(json_t *parent, const char *key, json_t *v, const char *path,
                               struct err *err)
{
    size_t i;
    json_t *item;

    (void)parent;
    (void)key;
    if (!json_is_array(v) || json_array_size(v) > TASK_ALLOWED_HOSTS_MAX) {
        return err_set_field(err, E_INVALID, path, "%s: must be a list of at most %d hosts", path,
                             TASK_ALLOWED_HOSTS_MAX);
    }
    json_array_foreach(v, i, item)
    {
        if (!json_is_string(item) ||
            !allowed_host_shape_ok(json_string_value(item), json_string_length(item))) {
            char p[160];
            snprintf(p, sizeof(p), "%s[%zu]", path, i);
            return err_set_field(err, E_INVALID, p,
                                 "%s: must be a host, *.suffix or IP literal, optionally :port", p);
        }
    }
    return E_OK;
}

static int check_command(json_t *parent, const char *key, json_t *v, const char *path,
                         struct err *err)
{
    (void)parent;
    (void)key;
    if (!json_is_string(v) || json_string_length(v) > TASK_COMMAND_MAX ||
        strlen(json_string_value(v)) != json_string_length(v)) {
        return err_set_field(err, E_INVALID, path, "%s: must be a string of at most %d bytes", path,
                             TASK_COMMAND_MAX);
    }
    return E_OK;
}

static int check_rules(json_t *obj, const char *path, const struct field_rule *rules, size_t nrules,
                       struct err *err);

static const struct field_rule g_runner_rules[] = {
    {"command", check_command},
    {"verifyCommand", check_command},
};

static int check_runner(json_t *parent, const char *key, json_t *v, const char *path,
                        struct err *err)
{
    (void)parent;
    (void)key;
    return check_rules(v, path, g_runner_rules, ARRAY_LEN(g_runner_rules), err);
}

static const struct field_rule g_repo_rules[] = {
    {"url", check_string},
    {"baseBranch", check_string},
    {"workingBranch", check_string},
};

static const struct field_rule g_sandbox_rules[] = {
    {"provider", check_provider},
    {"timeoutSeconds", check_count},
    {"network", check_network},
    {"allowedHosts", check_allowed_hosts},
};

static int check_repo(json_t *parent, const char *key, json_t *v, const char *path, struct err *err)
{
    (void)parent;
    (void)key;
    return check_rules(v, path, g_repo_rules, ARRAY_LEN(g_repo_rules), err);
}

static int check_sandbox(json_t *parent, const char *key, json_t *v, const char *path,
                         struct err *err)
{
    (void)parent;
    (void)key;
    return check_rules(v, path, g_sandbox_rules, ARRAY_LEN(g_sandbox_rules), err);
}

/* spec.run / status.run: a run number, 1 and up (SPEC §14). */
static int check_run(json_t *parent, const char *key, json_t *v, const char *path, struct err *err)
{
    (void)parent;
    (void)key;
    if (!json_is_integer(v) || json_integer_value(v) < 1) {
        return err_set_field(err, E_INVALID, path, "%s: must be an integer of 1 or more", path);
    }
    return E_OK;
}

static const struct field_rule g_spec_rules[] = {
    {"objective", check_string},
    {"draftPR", check_bool},
    {"repository", check_repo},
    {"maxIterations", check_count},
    {"budgetUSD", check_money},
    {"budgetTokens", check_count},
    {"capabilities", check_string_list},
    {"allowedTools", check_string_list},
    {"sandbox", check_sandbox},
    {"suspended", check_bool},
    {"runner", check_runner},
    {"run", check_run},
};

static const struct field_rule g_status_rules[] = {
    {"phase", check_phase},
    {"reason", check_string},
    {"message", check_string},
    {"iteration", check_count},
    {"tokensConsumed", check_count},
    {"costUSD", check_money},
    {"lastMeterRequestIds", check_string_list},
    {"previewUrl", check_string},
    {"forecastUSD", check_money},
    {"forecastPerIterationUSD", check_money},
    {"forecastIterationsLeft", check_count},
    {"forecastBudgetHolds", check_bool},
    {"forecastRunsOutIteration", check_count},
    {"effectiveBudgetUSD", check_money},
    {"effectiveBudgetTokens", check_count},
    {"effectiveMaxIterations", check_count},
    {"startTime", check_time_or_null},
    {"completionTime", check_time_or_null},
    {"guidanceHash", check_string},
    {"guidanceDeliveredAt", check_time_or_null},
    {"run", check_run},
    {"queuePosition", check_count},
    {"lastFailure", check_string}, /* SPEC §14: the failure quoted with a checkpoint */
    {"stalledSince", check_time_or_null},
    {"timeoutAt", check_time_or_null},
};

/* Checks every member of OBJ against RULES; unknown members are errors (a typo such as
 * "budget" for "budgetUSD" must not be silently dropped). */
static int check_rules(json_t *obj, const char *path, const struct field_rule *rules, size_t nrules,
                       struct err *err)
{
    const char *key;
    json_t *v;
    void *tmp;
    char p[256];

    if (!json_is_object(obj)) {
        return err_set_field(err, E_INVALID, path, "%s: must be an object", path);
    }
    json_object_foreach_safe(obj, tmp, key, v)
    {
        size_t i;
        snprintf(p, sizeof(p), "%s.%s", path, key);
        for (i = 0; i < nrules; i++) {
            if (strcmp(rules[i].key, key) == 0) {
                break;
            }
        }
        if (i == nrules) {
            return err_set_field(err, E_INVALID, p, "%s: unknown field", p);
        }
        if (json_is_null(v) && rules[i].check != check_time_or_null) {
            /* null means "not set" (merge-patch deletes it too). */
            json_object_del(obj, key);
            continue;
        }
        int rc = rules[i].check(obj, key, v, p, err);
        if (rc != E_OK) {
            return rc;
        }
    }
    return E_OK;
}

static int check_metadata(const json_t *md, struct err *err)
{
    const json_t *name = json_object_get(md, "name");
    const json_t *ns = json_object_get(md, "namespace");
    json_t *m;

    if (!json_is_object(md)) {
        return err_set_field(err, E_INVALID, "metadata", "metadata: must be an object");
    }
    if (!json_is_string(name) || !task_name_valid(json_string_value(name))) {
        return err_set_field(err, E_INVALID, "metadata.name",
                             "metadata.name: must be a DNS label ([a-z0-9]([-a-z0-9]*[a-z0-9])?, "
                             "at most 63 characters)");
    }
    if (!json_is_string(ns) || !task_name_valid(json_string_value(ns))) {
        return err_set_field(err, E_INVALID, "metadata.namespace",
                             "metadata.namespace: must be a DNS label");
    }
    m = json_object_get(md, "annotations");
    if (m != NULL && check_string_map(NULL, NULL, m, "metadata.annotations", err) != E_OK) {
        return E_INVALID;
    }
    /* Every meter 200 echoes the guidance, and every event keeps a copy of the task. */
    if (json_string_length(json_object_get(m, TASK_ANN_GUIDANCE)) > TASK_GUIDANCE_MAX) {
        return err_set_field(err, E_INVALID, "metadata.annotations." TASK_ANN_GUIDANCE,
                             "metadata.annotations." TASK_ANN_GUIDANCE ": longer than %d bytes",
                             TASK_GUIDANCE_MAX);
    }
    m = json_object_get(md, "labels");
    if (m != NULL && check_string_map(NULL, NULL, m, "metadata.labels", err) != E_OK) {
        return E_INVALID;
    }
    return E_OK;
}

/* Fills spec defaults: repository.baseBranch "main", workingBranch "agent/<name>". */
static void spec_defaults(json_t *spec, const char *name)
{
    json_t *repo = json_object_get(spec, "repository");

    if (repo == NULL) {
        repo = json_object();
        json_object_set_new(spec, "repository", repo);
    }
    if (json_object_get(repo, "baseBranch") == NULL ||
        json_string_length(json_object_get(repo, "baseBranch")) == 0) {
        json_object_set_new(repo, "baseBranch", json_string("main"));
    }
    if (json_object_get(repo, "workingBranch") == NULL ||
        json_string_length(json_object_get(repo, "workingBranch")) == 0) {
        char *wb = xasprintf("agent/%s", name);
        json_object_set_new(repo, "workingBranch", json_string(wb));
        free(wb);
    }
}

static int check_spec(json_t *spec, const char *name, struct err *err)
{
    const json_t *obj;
    int rc = check_rules(spec, "spec", g_spec_rules, ARRAY_LEN(g_spec_rules), err);

    if (rc != E_OK) {
        return rc;
    }
    obj = json_object_get(spec, "objective");
    if (!json_is_string(obj) || json_string_length(obj) == 0) {
        return err_set_field(err, E_INVALID, "spec.objective", "spec.objective: required");
    }
    if (json_string_length(obj) > TASK_OBJECTIVE_MAX) {
        return err_set_field(err, E_INVALID, "spec.objective",
                             "spec.objective: longer than %d bytes", TASK_OBJECTIVE_MAX);
    }
    spec_defaults(spec, name);
    return E_OK;
}

json_t *task_initial_status(void)
{
    return json_pack("{s:s, s:s, s:s, s:i, s:i, s:s, s:[], s:s, s:n, s:n}", "phase", "Pending",
                     "reason", "", "message", "", "iteration", 0, "tokensConsumed", 0, "costUSD",
                     "0.00", "lastMeterRequestIds", "previewUrl", "", "startTime",
                     "completionTime");
}

int task_check_type_fields(const json_t *obj, const char *kind, struct err *err)
{
    const json_t *v = json_object_get(obj, "apiVersion");

    if (v != NULL && (!json_is_string(v) || strcmp(json_string_value(v), TASK_API_VERSION) != 0)) {
        return err_set_field(err, E_INVALID, "apiVersion", "apiVersion: must be %s",
                             TASK_API_VERSION);
    }
    v = json_object_get(obj, "kind");
    if (v != NULL && (!json_is_string(v) || strcmp(json_string_value(v), kind) != 0)) {
        return err_set_field(err, E_INVALID, "kind", "kind: must be %s", kind);
    }
    return E_OK;
}

int task_copy_metadata(json_t **out, const json_t *md, const char *ns, struct err *err)
{
    static const char *const kept[] = {"labels", "annotations"}; /* after the namespace */
    const json_t *v = json_object_get(md, "namespace");
    const json_t *name = json_object_get(md, "name");
    json_t *nmd;

    *out = NULL;
    if (!json_is_object(md)) {
        return err_set_field(err, E_INVALID, "metadata", "metadata: required");
    }
    if (v != NULL && json_is_string(v) && ns != NULL && strcmp(json_string_value(v), ns) != 0) {
        return err_set_field(err, E_INVALID, "metadata.namespace",
                             "metadata.namespace: %s does not match the namespace of the URL %s",
                             json_string_value(v), ns);
    }
    nmd = json_object();
    if (name != NULL) {
        json_object_set_new(nmd, "name", json_deep_copy(name));
    }
    json_object_set_new(nmd, "namespace", ns != NULL ? json_string(ns) : json_deep_copy(v));
    for (size_t i = 0; i < sizeof(kept) / sizeof(kept[0]); i++) {
        const json_t *k = json_object_get(md, kept[i]);
        if (k != NULL) {
            json_object_set_new(nmd, kept[i], json_deep_copy(k));
        }
    }
    *out = nmd;
    return E_OK;
}

int task_normalize_new(json_t **out, const json_t *obj, const char *ns, struct err *err)
{
    const json_t *md, *v;
    json_t *doc = NULL, *nmd, *spec;
    int rc;

    *out = NULL;
    if (!json_is_object(obj)) {
        return err_set_field(err, E_INVALID, "", "the body must be an AgentTask object");
    }
    rc = task_check_type_fields(obj, TASK_KIND, err);
    if (rc != E_OK) {
        return rc;
    }
    md = json_object_get(obj, "metadata");
    rc = task_copy_metadata(&nmd, md, ns, err);
    if (rc != E_OK) {
        return rc;
    }
    doc = json_pack("{s:s, s:s, s:o}", "apiVersion", TASK_API_VERSION, "kind", TASK_KIND,
                    "metadata", nmd);
    rc = check_metadata(nmd, err);
    if (rc != E_OK) {
        goto out;
    }
    v = json_object_get(obj, "spec");
    if (v == NULL) {
        rc = err_set_field(err, E_INVALID, "spec", "spec: required");
        goto out;
    }
    spec = json_deep_copy(v);
    json_object_set_new(doc, "spec", spec);
    rc = check_spec(spec, json_string_value(json_object_get(nmd, "name")), err);
    if (rc != E_OK) {
        goto out;
    }
    json_object_set_new(doc, "status", task_initial_status());
    task_sync_effective_limits(doc); /* the spec's limits; the controller adds defaults */
    *out = doc;
    doc = NULL;
out:
    json_decref(doc);
    return rc;
}

/* Runs only go forward: spec.run (1 when unset) is never below status.run. */
static int check_run_order(const json_t *spec, const json_t *status, struct err *err)
{
    json_int_t want = json_integer_value(json_object_get(spec, "run"));
    json_int_t ran = json_integer_value(json_object_get(status, "run"));

    if (ran > 1 && (want > 0 ? want : 1) < ran) {
        return err_set_field(err, E_INVALID, "spec.run",
                             "spec.run: must not be lower than status.run (%lld): runs only go "
                             "forward",
                             (long long)ran);
    }
    return E_OK;
}

int task_validate(const json_t *obj, struct err *err)
{
    json_t *md = json_object_get(obj, "metadata");
    json_t *spec = json_object_get(obj, "spec");
    json_t *status = json_object_get(obj, "status");
    int rc;

    rc = check_metadata(md, err);
    if (rc != E_OK) {
        return rc;
    }
    if (spec == NULL) {
        return err_set_field(err, E_INVALID, "spec", "spec: required");
    }
    rc = check_spec(spec, json_string_value(json_object_get(md, "name")), err);
    if (rc != E_OK) {
        return rc;
    }
    if (!json_is_object(status)) {
        return err_set_field(err, E_INVALID, "status", "status: must be an object");
    }
    rc = check_rules(status, "status", g_status_rules, ARRAY_LEN(g_status_rules), err);
    if (rc != E_OK) {
        return rc;
    }
    if (json_object_get(status, "phase") == NULL) {
        return err_set_field(err, E_INVALID, "status.phase", "status.phase: required");
    }
    return check_run_order(spec, status, err);
}

void task_guidance_hash(char out[TASK_GUIDANCE_HASH_LEN], const char *guidance)
{
    snprintf(out, TASK_GUIDANCE_HASH_LEN, "%016llx", (unsigned long long)hash_fnv1a_str(guidance));
}
