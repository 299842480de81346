/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of the Kubernetes Events the kubernetes store records for phase changes
 * (store/kube/store_kube_event.c): one core/v1 Event per change, on the AgentTask, and a
 * failed Event never fails the change. Always on the kubernetes backend over its own
 * tests/fakes/fake_kube.py (the sqlite store records no Events). */
#include <stdlib.h>
#include <string.h>

#include "kube/kube.h"
#include "store/store.h"
#include "tests/t_check.h"
#include "tests/unit/store_fixture.h"

static const struct kube_resource core_events = {"", "v1", "events", "Event"};

struct phase_ud {
    enum task_phase phase;
    const char *reason, *message;
};

static int set_phase(json_t *doc, struct err *err, void *ud)
{
    const struct phase_ud *p = ud;

    (void)err;
    task_set_phase(doc, p->phase, p->reason, p->message);
    return E_OK;
}

static const char *str_at(const json_t *o, const char *a, const char *b)
{
    const json_t *v = b != NULL ? json_object_get(json_object_get(o, a), b) : json_object_get(o, a);
    return json_string_value(v) != NULL ? json_string_value(v) : "";
}

static int by_rv(const void *a, const void *b)
{
    long long x =
        strtoll(str_at(*(json_t *const *)a, "involvedObject", "resourceVersion"), NULL, 10);
    long long y =
        strtoll(str_at(*(json_t *const *)b, "involvedObject", "resourceVersion"), NULL, 10);
    return (x > y) - (x < y);
}

/* The core/v1 Events in default on C about NAME, oldest first; *n_out how many (<= 16). */
static size_t task_events(json_t *out[16], struct kube_client *c, const char *name)
{
    json_t *items = NULL, *ev;
    char rv[KUBE_RV_MAX];
    struct err err = {0};
    size_t i, n = 0;

    ASSERT(kube_list(&items, rv, c, &core_events, "default", NULL, &err) == E_OK);
    json_array_foreach(items, i, ev)
    {
        if (strcmp(str_at(ev, "involvedObject", "name"), name) == 0 && n < 16) {
            out[n++] = json_incref(ev);
        }
    }
    json_decref(items);
    qsort(out, n, sizeof(*out), by_rv);
    return n;
}

static void release(json_t *evs[16], size_t n)
{
    for (size_t i = 0; i < n; i++) {
        json_decref(evs[i]);
    }
}

static struct task_store *open_kube(struct fake_kube *f, struct kube_client **reader)
{
    struct task_store *st = NULL;
    struct err err = {0};

    fake_kube_start(f, NULL);
    ASSERT(task_store_kube_open(&st, fake_kube_client(f, NULL), "diverge-system", clock_system(),
                                &err) == E_OK);
    *reader = fake_kube_client(f, NULL);
    return st;
}

TEST(each_phase_change_is_an_event_on_the_task)
{
    struct fake_kube f;
    struct kube_client *c = NULL;
    struct task_store *st = open_kube(&f, &c);
    json_t *t = new_task("ev-1"), *made = NULL, *evs[16];
    struct phase_ud active = {TASK_ACTIVE, "Started", "sandbox up"};
    struct phase_ud failed = {TASK_FAILED, "AgentError", "exit 3"};
    struct err err = {0};
    size_t n;

    CHECK_OK(task_store_create(&made, st, t, &err));
    CHECK_OK(task_store_mutate(NULL, st, "default", "ev-1", set_phase, &active, &err));
    CHECK_OK(task_store_mutate(NULL, st, "default", "ev-1", set_phase, &active, &err));
    CHECK_OK(task_store_mutate(NULL, st, "default", "ev-1", set_phase, &failed, &err));
    n = task_events(evs, c, "ev-1");
    CHECK_EQ_INT((int)n, 3); /* Pending, Active, Failed: the repeated Active is no change */
    if (n == 3) {
        CHECK_EQ_STR(str_at(evs[0], "reason", NULL), "Pending");
        CHECK_EQ_STR(str_at(evs[0], "message", NULL), "phase Pending");
        CHECK_EQ_STR(str_at(evs[1], "reason", NULL), "Active");
        CHECK_EQ_STR(str_at(evs[1], "message", NULL),
                     "phase Pending -> Active: Started: sandbox up");
        CHECK_EQ_STR(str_at(evs[1], "type", NULL), "Normal");
        CHECK_EQ_STR(str_at(evs[2], "reason", NULL), "Failed");
        CHECK_EQ_STR(str_at(evs[2], "message", NULL), "phase Active -> Failed: AgentError: exit 3");
        CHECK_EQ_STR(str_at(evs[2], "type", NULL), "Warning");
        for (size_t i = 0; i < n; i++) {
            CHECK_EQ_STR(str_at(evs[i], "involvedObject", "apiVersion"), "divergedev.com/v1alpha1");
            CHECK_EQ_STR(str_at(evs[i], "involvedObject", "kind"), "AgentTask");
            CHECK_EQ_STR(str_at(evs[i], "involvedObject", "namespace"), "default");
            CHECK_EQ_STR(str_at(evs[i], "involvedObject", "uid"), str_at(made, "metadata", "uid"));
            CHECK_EQ_STR(str_at(evs[i], "source", "component"), "diverge");
            CHECK_EQ_STR(str_at(evs[i], "metadata", "namespace"), "default");
            CHECK(str_at(evs[i], "firstTimestamp", NULL)[0] != '\0');
            CHECK_EQ_STR(str_at(evs[i], "lastTimestamp", NULL),
                         str_at(evs[i], "firstTimestamp", NULL));
            CHECK_EQ_INT((int)json_integer_value(json_object_get(evs[i], "count")), 1);
        }
    }
    release(evs, n);
    json_decref(t);
    json_decref(made);
    task_store_close(st);
    kube_client_free(c);
    fake_kube_stop(&f);
}

TEST(a_failed_event_never_fails_the_change)
{
    struct fake_kube f;
    struct kube_client *c = NULL;
    struct task_store *st = open_kube(&f, &c);
    json_t *t = new_task("ev-2"), *got = NULL, *items = NULL, *taken = NULL, *sq = NULL;
    json_t *made = NULL, *evs[16];
    struct phase_ud paused = {TASK_PAUSED, "", ""};
    char rv[KUBE_RV_MAX], name[64];
    struct err err = {0};
    size_t n;

    CHECK_OK(task_store_create(&made, st, t, &err));
    /* The Event of the next status write is named after its resourceVersion: the fake's
     * counter + 2 once this squatter (+1) is in. Its create is then AlreadyExists. */
    CHECK_OK(kube_list(&items, rv, c, &core_events, "default", NULL, &err));
    snprintf(name, sizeof(name), "ev-2.%llx", strtoll(rv, NULL, 10) + 2);
    taken = json_pack("{s:{s:s},s:s}", "metadata", "name", name, "reason", "Squatter");
    CHECK_OK(kube_create(&sq, c, &core_events, "default", taken, &err));
    CHECK_OK(task_store_mutate(NULL, st, "default", "ev-2", set_phase, &paused, &err));
    CHECK_OK(task_store_get(&got, st, "default", "ev-2", &err));
    CHECK_EQ_STR(str_at(got, "status", "phase"), "Paused");
    n = task_events(evs, c, "ev-2");
    CHECK_EQ_INT((int)n, 1); /* only the first (Pending) */
    release(evs, n);
    json_decref(items);
    json_decref(taken);
    json_decref(sq);
    json_decref(made);
    json_decref(got);
    json_decref(t);
    task_store_close(st);
    kube_client_free(c);
    fake_kube_stop(&f);
}

T_MAIN
