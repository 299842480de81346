/* SPDX-License-Identifier: Apache-2.0 */
/* The informer against tests/fakes/fake_kube.py: the first list fills the cache, watch
 * events follow, and changes missed while the watch was cut off (then compacted away, so
 * resuming is 410) arrive as the differences of a relist. */
#include "tests/unit/kube_fixture.h"

#include <pthread.h>

#include "tests/t_check.h"

static struct fake_kube fake;

struct log {
    pthread_mutex_t mu;
    char lines[64][64]; /* "<TYPE>:<name>" */
    size_t n;           /* lines used */
};

static void on_event(enum kube_event type, const json_t *obj, void *userdata)
{
    static const char *const names[] = {"ADDED", "MODIFIED", "DELETED", "BOOKMARK"};
    struct log *l = userdata;
    const char *name = json_string_value(json_object_get(json_object_get(obj, "metadata"), "name"));

    pthread_mutex_lock(&l->mu);
    if (l->n < ARRAY_LEN(l->lines)) {
        snprintf(l->lines[l->n++], sizeof(l->lines[0]), "%s:%s", names[type],
                 name != NULL ? name : "?");
    }
    pthread_mutex_unlock(&l->mu);
}

/* Polls until LINE was logged (a 60 s polling budget: a failure, not a timing assertion). */
static bool wait_line(struct log *l, const char *line)
{
    for (int i = 0; i < 1200; i++) {
        bool found = false;
        pthread_mutex_lock(&l->mu);
        for (size_t j = 0; j < l->n && !found; j++) {
            found = strcmp(l->lines[j], line) == 0;
        }
        pthread_mutex_unlock(&l->mu);
        if (found) {
            return true;
        }
        fixture_sleep_ms(50);
    }
    t_fail(__FILE__, __LINE__, "event %s never arrived", line);
    return false;
}

static size_t count_line(struct log *l, const char *line)
{
    size_t n = 0;

    pthread_mutex_lock(&l->mu);
    for (size_t j = 0; j < l->n; j++) {
        n += strcmp(l->lines[j], line) == 0;
    }
    pthread_mutex_unlock(&l->mu);
    return n;
}

static void make(struct kube_client *c, const char *name)
{
    json_t *o = json_pack("{s:{s:s}, s:{s:s}}", "metadata", "name", name, "spec", "objective", "x"),
           *out = NULL;

    CHECK_OK(kube_create(&out, c, &KUBE_AGENTTASKS, "inf", o, NULL));
    json_decref(out);
    json_decref(o);
}

static void control(struct kube_client *c, const char *path)
{
    char *url = xasprintf("%s%s", fake.url, path);

    CHECK_OK(kube_call(NULL, c, "POST", url, "application/json", NULL, 10000, "control", NULL));
    free(url);
}

TEST(list_watch_and_relist_differences)
{
    struct kube_client *c = fake_kube_client(&fake, NULL);
    struct kube_informer_opts o = KUBE_INFORMER_OPTS_DEFAULTS;
    struct log l = {.mu = PTHREAD_MUTEX_INITIALIZER};
    struct kube_informer *inf = NULL;
    json_t *patch = json_pack("{s:{s:s}}", "spec", "objective", "changed"), *out = NULL, *items;
    char rv[KUBE_RV_MAX];
    int64_t relists = 0;

    make(c, "a");
    make(c, "b");
    o.res = &KUBE_AGENTTASKS;
    o.ns = "inf";
    o.retry_ms = 100;
    o.on_event = on_event;
    o.userdata = &l;
    CHECK_OK(kube_informer_start(&inf, c, &o, NULL));
    wait_line(&l, "ADDED:a");
    wait_line(&l, "ADDED:b");
    CHECK(kube_informer_synced(inf));
    make(c, "c");
    wait_line(&l, "ADDED:c");
    CHECK_OK(kube_informer_get(&out, inf, "inf", "c"));
    json_decref(out);
    /* cut the watch off, change things behind its back, compact the history away */
    control(c, "/fake/freeze");
    CHECK_OK(kube_delete(c, &KUBE_AGENTTASKS, "inf", "a", NULL, NULL));
    CHECK_OK(kube_merge_patch(&out, c, &KUBE_AGENTTASKS, "inf", "b", patch, NULL));
    json_decref(out);
    make(c, "d");
    control(c, "/fake/compact");
    wait_line(&l, "DELETED:a");
    wait_line(&l, "MODIFIED:b");
    wait_line(&l, "ADDED:d");
    items = kube_informer_list(rv, &relists, inf);
    CHECK_EQ_INT(json_array_size(items), 3);
    CHECK(relists >= 2);
    CHECK_EQ_INT(kube_informer_get(&out, inf, "inf", "a"), E_NOTFOUND);
    /* nothing was delivered twice: c stayed as it was across the relist */
    CHECK_EQ_INT(count_line(&l, "ADDED:c"), 1);
    CHECK_EQ_INT(count_line(&l, "MODIFIED:c"), 0);
    json_decref(items);
    /* and watching goes on after the relist */
    make(c, "e");
    wait_line(&l, "ADDED:e");
    kube_informer_stop(inf);
    json_decref(patch);
    kube_client_free(c);
}

int main(int argc, char **argv)
{
    const char *extra[] = {"--bookmark-seconds", "0.2", NULL};
    int rc;

    fake_kube_start(&fake, extra);
    rc = t_main(argc, argv);
    fake_kube_stop(&fake);
    return rc;
}
