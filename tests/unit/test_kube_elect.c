/* SPDX-License-Identifier: Apache-2.0 */
/* Two Lease electors against tests/fakes/fake_kube.py: exactly one leads; when the holder
 * stops renewing (as a killed process does) the other takes over once the lease expired;
 * a graceful stop releases the lease so the other takes over before it would expire. */
#include "tests/unit/kube_fixture.h"

#include <pthread.h>

#include "common/clock.h"
#include "tests/t_check.h"

static struct fake_kube fake;

struct counter {
    pthread_mutex_t mu;
    int gained; /* on_change(true) calls */
    int lost;   /* on_change(false) calls */
};

static void on_change(bool leader, void *userdata)
{
    struct counter *k = userdata;

    pthread_mutex_lock(&k->mu);
    if (leader) {
        k->gained++;
    } else {
        k->lost++;
    }
    pthread_mutex_unlock(&k->mu);
}

/* Polls until exactly one of A, B leads (or the 60 s polling budget runs out: a failure,
 * not a timing assertion). Returns 0 for A, 1 for B, -1. */
static int wait_one_leader(struct kube_lease *a, struct kube_lease *b)
{
    for (int i = 0; i < 1200; i++) {
        bool la = a != NULL && kube_lease_is_leader(a), lb = b != NULL && kube_lease_is_leader(b);
        if (la && lb) {
            return -2;
        }
        if (la || lb) {
            return la ? 0 : 1;
        }
        fixture_sleep_ms(50);
    }
    return -1;
}

static json_t *read_lease(struct kube_client *c, const char *name)
{
    json_t *l = NULL;

    ASSERT(kube_get(&l, c, &KUBE_LEASES, "ns-lease", name, NULL) == E_OK);
    return l;
}

static const char *holder(const json_t *l)
{
    return json_string_value(json_object_get(json_object_get(l, "spec"), "holderIdentity"));
}

static long long transitions(const json_t *l)
{
    return json_integer_value(json_object_get(json_object_get(l, "spec"), "leaseTransitions"));
}

static int64_t spec_time(const json_t *l, const char *key)
{
    int64_t ms = 0;
    const char *s = json_string_value(json_object_get(json_object_get(l, "spec"), key));

    ASSERT(s != NULL && clock_parse_rfc3339(&ms, s) == E_OK);
    return ms;
}

static struct kube_lease *start(struct kube_client *c, const char *name, const char *id,
                                int duration_s, struct counter *k)
{
    struct kube_lease_opts o = KUBE_LEASE_OPTS_DEFAULTS;
    struct kube_lease *l = NULL;

    o.ns = "ns-lease";
    o.name = name;
    o.identity = id;
    o.duration_s = duration_s;
    o.renew_deadline_ms = (int64_t)duration_s * 2000 / 3; /* client-go: 10 s of 15 s */
    o.retry_ms = 200;
    o.on_change = on_change;
    o.userdata = k;
    ASSERT(kube_lease_start(&l, c, &o, NULL) == E_OK);
    return l;
}

TEST(holder_killed_other_takes_over_after_expiry)
{
    struct kube_client *c = fake_kube_client(&fake, NULL);
    struct counter ka = {.mu = PTHREAD_MUTEX_INITIALIZER}, kb = {.mu = PTHREAD_MUTEX_INITIALIZER};
    struct kube_lease *a = start(c, "expiry", "replica-a", 4, &ka), *b = NULL;
    json_t *before, *after;
    int who;

    CHECK_EQ_INT(wait_one_leader(a, NULL), 0); /* alone: a creates the lease */
    b = start(c, "expiry", "replica-b", 4, &kb);
    fixture_sleep_ms(600); /* several retry periods: b must keep waiting */
    CHECK(kube_lease_is_leader(a));
    CHECK(!kube_lease_is_leader(b));
    before = read_lease(c, "expiry");
    CHECK_EQ_STR(holder(before), "replica-a");
    /* a stops renewing without releasing: what the API server sees of a killed process */
    kube_lease_stop(a, false);
    who = wait_one_leader(NULL, b);
    CHECK_EQ_INT(who, 1);
    after = read_lease(c, "expiry");
    CHECK_EQ_STR(holder(after), "replica-b");
    CHECK_EQ_INT(transitions(after), transitions(before) + 1);
    /* b acquired only after a's lease had expired */
    CHECK(spec_time(after, "acquireTime") > spec_time(before, "renewTime") + 4000);
    kube_lease_stop(b, true);
    CHECK_EQ_INT(ka.gained, 1);
    CHECK_EQ_INT(ka.lost, 1);
    CHECK_EQ_INT(kb.gained, 1);
    CHECK_EQ_INT(kb.lost, 1);
    json_decref(before);
    json_decref(after);
    kube_client_free(c);
}

TEST(release_on_stop_hands_over_before_expiry)
{
    struct kube_client *c = fake_kube_client(&fake, NULL);
    struct counter ka = {.mu = PTHREAD_MUTEX_INITIALIZER}, kb = {.mu = PTHREAD_MUTEX_INITIALIZER};
    /* a one-hour lease: only a release lets b in within this test */
    struct kube_lease *a = start(c, "release", "replica-a", 3600, &ka), *b;
    json_t *before, *released = NULL, *after;

    CHECK_EQ_INT(wait_one_leader(a, NULL), 0);
    b = start(c, "release", "replica-b", 3600, &kb);
    fixture_sleep_ms(600);
    CHECK(!kube_lease_is_leader(b));
    before = read_lease(c, "release");
    kube_lease_stop(a, true);
    CHECK_EQ_INT(wait_one_leader(NULL, b), 1);
    after = read_lease(c, "release");
    CHECK_EQ_STR(holder(after), "replica-b");
    CHECK_EQ_INT(transitions(after), transitions(before) + 1);
    CHECK(spec_time(after, "acquireTime") < spec_time(before, "renewTime") + 3600 * 1000LL);
    kube_lease_stop(b, false);
    /* stopped without release: b's record stays (a new a would wait for the hour) */
    released = read_lease(c, "release");
    CHECK_EQ_STR(holder(released), "replica-b");
    json_decref(before);
    json_decref(after);
    json_decref(released);
    kube_client_free(c);
}

TEST(leader_steps_down_when_renewals_fail)
{
    struct kube_client *c = fake_kube_client(&fake, NULL);
    struct counter ka = {.mu = PTHREAD_MUTEX_INITIALIZER};
    struct kube_lease *a = start(c, "stepdown", "replica-a", 4, &ka);
    struct fake_kube *f = &fake;

    CHECK_EQ_INT(wait_one_leader(a, NULL), 0);
    /* the API server goes away: renewals fail; past the deadline a stops leading */
    kill(f->pid, SIGSTOP);
    for (int i = 0; i < 1200 && kube_lease_is_leader(a); i++) {
        fixture_sleep_ms(50);
    }
    CHECK(!kube_lease_is_leader(a));
    kill(f->pid, SIGCONT);
    kube_lease_stop(a, true);
    CHECK_EQ_INT(ka.lost, 1);
    kube_client_free(c);
}

int main(int argc, char **argv)
{
    int rc;

    fake_kube_start(&fake, NULL);
    rc = t_main(argc, argv);
    fake_kube_stop(&fake);
    return rc;
}
