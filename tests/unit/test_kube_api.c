/* SPDX-License-Identifier: Apache-2.0 */
/* The kube/ resource calls against tests/fakes/fake_kube.py on loopback: CRUD and metav1.Status
 * errors, status-subresource conflicts and the retry that follows, list + watch resume,
 * 410 Expired -> relist, and HTTPS with the CA taken from a kubeconfig. */
#include "tests/unit/kube_fixture.h"

#include "tests/t_check.h"

static json_t *task(const char *name, const char *objective)
{
    return json_pack("{s:s, s:s, s:{s:s, s:{s:s}}, s:{s:s}, s:{s:s}}", "apiVersion",
                     "divergedev.com/v1alpha1", "kind", "AgentTask", "metadata", "name", name,
                     "labels", "team", "a", "spec", "objective", objective, "status", "phase",
                     "Smuggled");
}

static const char *str_at(const json_t *o, const char *a, const char *b)
{
    return json_string_value(json_object_get(json_object_get(o, a), b));
}

static struct fake_kube fake;

TEST(crud_and_status_errors)
{
    struct kube_client *c = fake_kube_client(&fake, NULL), *bad = fake_kube_client(&fake, "nope");
    json_t *t = task("crud-1", "first"), *got = NULL, *out = NULL, *patch;
    struct err err = {0};

    CHECK_OK(kube_create(&out, c, &KUBE_AGENTTASKS, "default", t, &err));
    CHECK_EQ_STR(str_at(out, "metadata", "name"), "crud-1");
    CHECK(json_object_get(out, "status") == NULL); /* status is the subresource's */
    json_decref(out);
    CHECK_EQ_INT(kube_create(&out, c, &KUBE_AGENTTASKS, "default", t, &err), E_CONFLICT);
    CHECK(strstr(err.msg, "AlreadyExists") != NULL);
    CHECK_EQ_INT(kube_get(&got, c, &KUBE_AGENTTASKS, "default", "nope-1", &err), E_NOTFOUND);
    CHECK(strstr(err.msg, "NotFound") != NULL && strstr(err.msg, "not found") != NULL);
    CHECK_EQ_INT(kube_get(&got, bad, &KUBE_AGENTTASKS, "default", "crud-1", &err), E_DENIED);
    CHECK_EQ_INT(kube_get(&got, c, &KUBE_AGENTTASKS, "default", "../x", &err), E_INVALID);
    CHECK_EQ_INT(kube_get(&got, c, &KUBE_AGENTTASKS, "Default", "x", &err), E_INVALID);
    patch = json_pack("{s:{s:s, s:n}}", "spec", "objective", "second", "missing");
    CHECK_OK(kube_merge_patch(&out, c, &KUBE_AGENTTASKS, "default", "crud-1", patch, &err));
    CHECK_EQ_STR(str_at(out, "spec", "objective"), "second");
    json_decref(out);
    json_decref(patch);
    CHECK_EQ_INT(kube_delete(c, &KUBE_AGENTTASKS, "default", "crud-1", "1", &err), E_CONFLICT);
    CHECK(strstr(err.msg, "Conflict") != NULL);
    CHECK_OK(kube_get(&got, c, &KUBE_AGENTTASKS, "default", "crud-1", &err));
    CHECK_OK(kube_delete(c, &KUBE_AGENTTASKS, "default", "crud-1",
                         str_at(got, "metadata", "resourceVersion"), &err));
    json_decref(got);
    got = NULL;
    CHECK_EQ_INT(kube_get(&got, c, &KUBE_AGENTTASKS, "default", "crud-1", &err), E_NOTFOUND);
    CHECK_EQ_INT(kube_delete(c, &KUBE_AGENTTASKS, "default", "crud-1", NULL, &err), E_NOTFOUND);
    json_decref(t);
    kube_client_free(c);
    kube_client_free(bad);
}

TEST(every_resource_type_round_trips)
{
    const struct kube_resource *res[] = {&KUBE_ENVIRONMENTS, &KUBE_SECRETS, &KUBE_CONFIGMAPS,
                                         &KUBE_EVENTS,       &KUBE_LEASES,  &KUBE_SANDBOXCLAIMS,
                                         &KUBE_SANDBOXES};
    struct kube_client *c = fake_kube_client(&fake, NULL);
    struct err err = {0};

    for (size_t i = 0; i < ARRAY_LEN(res); i++) {
        json_t *o = json_pack("{s:{s:s}}", "metadata", "name", "rt-1"), *out = NULL, *got = NULL;
        CHECK_OK(kube_create(&out, c, res[i], "ns-rt", o, &err));
        CHECK_EQ_STR(json_string_value(json_object_get(out, "kind")), res[i]->kind);
        CHECK_OK(kube_get(&got, c, res[i], "ns-rt", "rt-1", &err));
        CHECK_OK(kube_delete(c, res[i], "ns-rt", "rt-1", NULL, &err));
        json_decref(o);
        json_decref(out);
        json_decref(got);
    }
    kube_client_free(c);
}

TEST(stale_status_update_conflicts_then_retry_succeeds)
{
    struct kube_client *c = fake_kube_client(&fake, NULL);
    json_t *t = task("st-1", "obj"), *v1 = NULL, *v2 = NULL, *out = NULL, *cur = NULL, *patch;
    struct err err = {0};

    CHECK_OK(kube_create(&v1, c, &KUBE_AGENTTASKS, "default", t, &err));
    patch = json_pack("{s:{s:b}}", "spec", "suspended", 1);
    CHECK_OK(kube_merge_patch(&v2, c, &KUBE_AGENTTASKS, "default", "st-1", patch, &err));
    /* a writer holding v1 is stale now */
    json_object_set_new(v1, "status", json_pack("{s:s}", "phase", "Active"));
    CHECK_EQ_INT(kube_update_status(&out, c, &KUBE_AGENTTASKS, "default", v1, &err), E_CONFLICT);
    CHECK(strstr(err.msg, "Conflict") != NULL);
    /* the retry: re-read, re-apply, write */
    CHECK_OK(kube_get(&cur, c, &KUBE_AGENTTASKS, "default", "st-1", &err));
    json_object_set_new(cur, "status", json_pack("{s:s}", "phase", "Active"));
    json_object_set_new(json_object_get(cur, "spec"), "objective", json_string("ignored"));
    CHECK_OK(kube_update_status(&out, c, &KUBE_AGENTTASKS, "default", cur, &err));
    CHECK_EQ_STR(str_at(out, "status", "phase"), "Active");
    CHECK_EQ_STR(str_at(out, "spec", "objective"), "obj"); /* /status changes only status */
    CHECK(json_is_true(json_object_get(json_object_get(out, "spec"), "suspended")));
    json_decref(cur);
    cur = out;
    out = NULL;
    /* and the main resource ignores status */
    json_object_set_new(cur, "status", json_pack("{s:s}", "phase", "Failed"));
    CHECK_OK(kube_replace(&out, c, &KUBE_AGENTTASKS, "default", cur, &err));
    CHECK_EQ_STR(str_at(out, "status", "phase"), "Active");
    /* a stale replace conflicts too */
    json_decref(out);
    CHECK_EQ_INT(kube_replace(&out, c, &KUBE_AGENTTASKS, "default", v2, &err), E_CONFLICT);
    CHECK(out == NULL);
    json_decref(v1);
    json_decref(cur);
    json_decref(v2);
    json_decref(patch);
    json_decref(t);
    kube_client_free(c);
}

struct seen {
    char names[16][64]; /* "<type>:<name>" of each non-bookmark event */
    size_t n;           /* entries used */
    size_t bookmarks;   /* bookmarks seen */
    size_t stop_after;  /* stop once this many events and a bookmark were seen */
};

static int on_event(enum kube_event type, const json_t *obj, void *userdata)
{
    struct seen *s = userdata;
    static const char *const names[] = {"ADDED", "MODIFIED", "DELETED", "BOOKMARK"};

    if (type == KUBE_EVENT_BOOKMARK) {
        s->bookmarks++;
    } else if (s->n < ARRAY_LEN(s->names)) {
        snprintf(s->names[s->n++], sizeof(s->names[0]), "%s:%s", names[type],
                 str_at(obj, "metadata", "name"));
    }
    return s->n >= s->stop_after && s->bookmarks > 0;
}

static void make(struct kube_client *c, const char *ns, const char *name)
{
    json_t *t = task(name, "x"), *out = NULL;

    CHECK_OK(kube_create(&out, c, &KUBE_AGENTTASKS, ns, t, NULL));
    json_decref(out);
    json_decref(t);
}

TEST(list_then_watch_resumes_without_duplicates)
{
    struct kube_client *c = fake_kube_client(&fake, NULL);
    struct kube_watch_opts opts = {.timeout_s = 30};
    enum kube_watch_end end;
    struct seen s = {.stop_after = 2};
    char rv[KUBE_RV_MAX];
    json_t *items = NULL, *patch = json_pack("{s:{s:s}}", "spec", "objective", "y"), *out = NULL;
    struct err err = {0};

    make(c, "ns-w", "w-1");
    make(c, "ns-w", "w-2");
    CHECK_OK(kube_list(&items, rv, c, &KUBE_AGENTTASKS, "ns-w", "team=a", &err));
    CHECK_EQ_INT(json_array_size(items), 2);
    json_decref(items);
    make(c, "ns-w", "w-3");
    make(c, "other", "w-x"); /* another namespace: not in this watch */
    CHECK_OK(kube_merge_patch(&out, c, &KUBE_AGENTTASKS, "ns-w", "w-1", patch, &err));
    json_decref(out);
    CHECK_OK(kube_watch(&end, rv, c, &KUBE_AGENTTASKS, "ns-w", &opts, on_event, &s, &err));
    CHECK_EQ_INT(end, KUBE_WATCH_STOPPED);
    CHECK_EQ_INT(s.n, 2);
    CHECK_EQ_STR(s.names[0], "ADDED:w-3");
    CHECK_EQ_STR(s.names[1], "MODIFIED:w-1");
    /* resume from the kept resourceVersion: only what happened since */
    CHECK_OK(kube_delete(c, &KUBE_AGENTTASKS, "ns-w", "w-2", NULL, &err));
    s.n = 0;
    s.bookmarks = 0;
    s.stop_after = 1;
    CHECK_OK(kube_watch(&end, rv, c, &KUBE_AGENTTASKS, "ns-w", &opts, on_event, &s, &err));
    CHECK_EQ_INT(s.n, 1);
    CHECK_EQ_STR(s.names[0], "DELETED:w-2");
    /* a server-side timeout ends the stream: CLOSED, resume later */
    opts.timeout_s = 1;
    s.stop_after = 100;
    CHECK_OK(kube_watch(&end, rv, c, &KUBE_AGENTTASKS, "ns-w", &opts, on_event, &s, &err));
    CHECK_EQ_INT(end, KUBE_WATCH_CLOSED);
    CHECK_EQ_INT(s.n, 1);
    json_decref(patch);
    kube_client_free(c);
}

TEST(expired_resource_version_reports_gone_then_relist_works)
{
    struct kube_client *c = fake_kube_client(&fake, NULL);
    struct kube_watch_opts opts = {.timeout_s = 30};
    enum kube_watch_end end;
    struct seen s = {.stop_after = 1};
    char rv[KUBE_RV_MAX], name[32];
    json_t *items = NULL;
    struct err err = {0};

    CHECK_OK(kube_list(&items, rv, c, &KUBE_AGENTTASKS, "ns-g", NULL, &err));
    json_decref(items);
    for (int i = 0; i < 12; i++) { /* more than the fake's history of 8 */
        snprintf(name, sizeof(name), "g-%d", i);
        make(c, "ns-g", name);
    }
    CHECK_OK(kube_watch(&end, rv, c, &KUBE_AGENTTASKS, "ns-g", &opts, on_event, &s, &err));
    CHECK_EQ_INT(end, KUBE_WATCH_GONE);
    CHECK_EQ_INT(s.n, 0);
    CHECK_OK(kube_list(&items, rv, c, &KUBE_AGENTTASKS, "ns-g", NULL, &err));
    CHECK_EQ_INT(json_array_size(items), 12);
    json_decref(items);
    make(c, "ns-g", "g-new");
    CHECK_OK(kube_watch(&end, rv, c, &KUBE_AGENTTASKS, "ns-g", &opts, on_event, &s, &err));
    CHECK_EQ_INT(end, KUBE_WATCH_STOPPED);
    CHECK_EQ_STR(s.names[0], "ADDED:g-new");
    kube_client_free(c);
}

TEST(cancelled_watch_stops)
{
    struct kube_client *c = fake_kube_client(&fake, NULL);
    atomic_int cancel = 1;
    struct kube_watch_opts opts = {.timeout_s = 600, .cancel = &cancel};
    enum kube_watch_end end = KUBE_WATCH_CLOSED;
    struct seen s = {.stop_after = 1000};
    char rv[KUBE_RV_MAX] = "";
    struct err err = {0};

    CHECK_OK(kube_watch(&end, rv, c, &KUBE_AGENTTASKS, "ns-c", &opts, on_event, &s, &err));
    CHECK_EQ_INT(end, KUBE_WATCH_STOPPED);
    kube_client_free(c);
}

static char *tmpdir_path;

static char *tpath(const char *name)
{
    return xasprintf("%s/%s", tmpdir_path, name);
}

static int kubeconfig_list(const char *text, struct err *err)
{
    struct kube_config *cfg = NULL;
    struct kube_client *c = NULL;
    json_t *items = NULL;
    char rv[KUBE_RV_MAX];
    int rc = kube_config_load_kubeconfig(&cfg, "kc", tmpdir_path, text, strlen(text), NULL, err);

    if (rc == E_OK) {
        rc = kube_client_new(&c, cfg, err);
    }
    if (rc == E_OK) {
        rc = kube_list(&items, rv, c, &KUBE_SECRETS, "default", NULL, err);
    }
    json_decref(items);
    kube_client_free(c);
    return rc;
}

TEST(https_trusts_the_kubeconfig_ca)
{
    char dir[] = "/tmp/kube-tls-XXXXXX";
    char *crt, *key, *b64, *data = NULL, *kc;
    size_t len = 0;
    struct fake_kube tls;
    struct err err = {0};

    tmpdir_path = mkdtemp(dir);
    ASSERT(tmpdir_path != NULL);
    crt = tpath("tls.crt");
    key = tpath("tls.key");
    b64 = tpath("tls.b64");
    const char *const gen[] = {"openssl",
                               "req",
                               "-x509",
                               "-newkey",
                               "ec",
                               "-pkeyopt",
                               "ec_paramgen_curve:prime256v1",
                               "-nodes",
                               "-days",
                               "1",
                               "-subj",
                               "/CN=127.0.0.1",
                               "-addext",
                               "subjectAltName=IP:127.0.0.1",
                               "-keyout",
                               key,
                               "-out",
                               crt,
                               NULL};
    const char *const enc[] = {"openssl", "base64", "-A", "-in", crt, "-out", b64, NULL};
    ASSERT(fixture_run(gen) == 0 && fixture_run(enc) == 0);
    ASSERT(kube_read_file(&data, &len, b64, 1 << 20, NULL) == E_OK);
    const char *extra[] = {"--tls-cert", crt, "--tls-key", key, NULL};
    fake_kube_start(&tls, extra);
    CHECK(strncmp(tls.url, "https://127.0.0.1:", 18) == 0);
    kc =
        xasprintf("current-context: c\n"
                  "clusters: [{name: k, cluster: {server: '%s', certificate-authority-data: %s}}]\n"
                  "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
                  "users: [{name: u, user: {token: " FAKE_TOKEN "}}]\n",
                  tls.url, data);
    CHECK_OK(kubeconfig_list(kc, &err));
    free(kc);
    kc =
        xasprintf("current-context: c\n"
                  "clusters: [{name: k, cluster: {server: '%s', certificate-authority: tls.crt}}]\n"
                  "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
                  "users: [{name: u, user: {token: " FAKE_TOKEN "}}]\n",
                  tls.url);
    CHECK_OK(kubeconfig_list(kc, &err));
    free(kc);
    /* without the CA the system store does not trust it; insecure-skip-tls-verify does */
    kc = xasprintf("current-context: c\n"
                   "clusters: [{name: k, cluster: {server: '%s'}}]\n"
                   "contexts: [{name: c, context: {cluster: k}}]\n",
                   tls.url);
    CHECK(kubeconfig_list(kc, &err) != E_OK);
    free(kc);
    kc =
        xasprintf("current-context: c\n"
                  "clusters: [{name: k, cluster: {server: '%s', insecure-skip-tls-verify: true}}]\n"
                  "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
                  "users: [{name: u, user: {token: " FAKE_TOKEN "}}]\n",
                  tls.url);
    CHECK_OK(kubeconfig_list(kc, &err));
    free(kc);
    fake_kube_stop(&tls);
    unlink(crt);
    unlink(key);
    unlink(b64);
    rmdir(dir);
    free(data);
    free(crt);
    free(key);
    free(b64);
}

int main(int argc, char **argv)
{
    const char *extra[] = {"--history", "8", "--bookmark-seconds", "0.2", NULL};
    int rc;

    fake_kube_start(&fake, extra);
    rc = t_main(argc, argv);
    fake_kube_stop(&fake);
    return rc;
}
