/* SPDX-License-Identifier: Apache-2.0 */
/* The Lease decision as a table (lease JSON + now + identity -> action) and the records
 * written for each action, as client-go's leaderelection writes them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "kube/kube.h"
#include "tests/t_check.h"

/* 2026-11-30T10:00:00Z */
#define T0 1796032800000LL

struct decide_case {
    const char *lease; /* Lease JSON, NULL when absent */
    int64_t now_ms;
    const char *identity;
    enum kube_lease_action want;
};

#define SPEC(holder_, renew_, dur_)                                                                \
    "{\"metadata\":{\"resourceVersion\":\"7\"},\"spec\":{\"holderIdentity\":" holder_              \
    ",\"renewTime\":" renew_ ",\"leaseDurationSeconds\":" dur_ ",\"leaseTransitions\":3}}"

static const struct decide_case decide_cases[] = {
    /* absent: create it */
    {NULL, T0, "a", KUBE_LEASE_CREATE},
    /* ours: renew, valid or not */
    {SPEC("\"a\"", "\"2026-11-30T09:59:55.000000Z\"", "15"), T0, "a", KUBE_LEASE_RENEW},
    {SPEC("\"a\"", "\"2026-11-30T09:00:00.000000Z\"", "15"), T0, "a", KUBE_LEASE_RENEW},
    /* another holder, within the duration: wait */
    {SPEC("\"b\"", "\"2026-11-30T09:59:55.000000Z\"", "15"), T0, "a", KUBE_LEASE_WAIT},
    /* exactly at the end of the duration is still valid (renewTime + d < now expires) */
    {SPEC("\"b\"", "\"2026-11-30T09:59:45.000000Z\"", "15"), T0, "a", KUBE_LEASE_WAIT},
    {SPEC("\"b\"", "\"2026-11-30T09:59:44.999000Z\"", "15"), T0, "a", KUBE_LEASE_ACQUIRE},
    /* another holder, expired: take over */
    {SPEC("\"b\"", "\"2026-11-30T09:00:00.000000Z\"", "15"), T0, "a", KUBE_LEASE_ACQUIRE},
    /* released (client-go: holderIdentity "", duration 1): take over at once */
    {SPEC("\"\"", "\"2026-11-30T09:59:59.900000Z\"", "1"), T0, "a", KUBE_LEASE_ACQUIRE},
    {SPEC("null", "\"2026-11-30T09:59:59.900000Z\"", "15"), T0, "a", KUBE_LEASE_ACQUIRE},
    /* unreadable renewTime or duration: nobody can rely on it */
    {SPEC("\"b\"", "\"yesterday\"", "15"), T0, "a", KUBE_LEASE_ACQUIRE},
    {SPEC("\"b\"", "null", "15"), T0, "a", KUBE_LEASE_ACQUIRE},
    {SPEC("\"b\"", "\"2026-11-30T09:59:59Z\"", "0"), T0, "a", KUBE_LEASE_ACQUIRE},
    {SPEC("\"b\"", "\"2026-11-30T09:59:59Z\"", "\"15\""), T0, "a", KUBE_LEASE_ACQUIRE},
    /* a renewTime in the future (clock skew) keeps it valid */
    {SPEC("\"b\"", "\"2026-11-30T10:00:30+00:00\"", "15"), T0, "a", KUBE_LEASE_WAIT},
    /* no spec at all: free */
    {"{\"metadata\":{}}", T0, "a", KUBE_LEASE_ACQUIRE},
};

TEST(decide_table)
{
    for (size_t i = 0; i < ARRAY_LEN(decide_cases); i++) {
        const struct decide_case *c = &decide_cases[i];
        json_t *lease = c->lease != NULL ? json_loads(c->lease, 0, NULL) : NULL;
        enum kube_lease_action got;

        if (c->lease != NULL && lease == NULL) {
            t_fail(__FILE__, __LINE__, "case %zu: bad fixture", i);
            continue;
        }
        got = kube_lease_decide(lease, c->now_ms, c->identity);
        if (got != c->want) {
            t_fail(__FILE__, __LINE__, "case %zu: action %d, want %d", i, (int)got, (int)c->want);
        }
        json_decref(lease);
    }
}

static const char *spec_str(const json_t *l, const char *key)
{
    return json_string_value(json_object_get(json_object_get(l, "spec"), key));
}

static long long spec_int(const json_t *l, const char *key)
{
    return (long long)json_integer_value(json_object_get(json_object_get(l, "spec"), key));
}

TEST(build_records)
{
    json_t *old = json_loads(SPEC("\"b\"", "\"2026-11-30T09:00:00.000000Z\"", "15"), 0, NULL);
    json_t *c = kube_lease_build(KUBE_LEASE_CREATE, NULL, "ns1", "leader", "a", T0 + 123, 15);
    json_t *acq = kube_lease_build(KUBE_LEASE_ACQUIRE, old, "ns1", "leader", "a", T0, 20);
    json_t *ren = kube_lease_build(KUBE_LEASE_RENEW, acq, "ns1", "leader", "a", T0 + 2500, 20);
    json_t *rel = kube_lease_build_release(ren, T0 + 3000);

    CHECK_EQ_STR(json_string_value(json_object_get(c, "kind")), "Lease");
    CHECK_EQ_STR(spec_str(c, "holderIdentity"), "a");
    CHECK_EQ_STR(spec_str(c, "renewTime"), "2026-11-30T10:00:00.123000Z");
    CHECK_EQ_INT(spec_int(c, "leaseTransitions"), 0);
    CHECK_EQ_INT(spec_int(c, "leaseDurationSeconds"), 15);
    /* takeover: holder, times, transitions + 1, and the resourceVersion that guards it */
    CHECK_EQ_STR(spec_str(acq, "holderIdentity"), "a");
    CHECK_EQ_STR(spec_str(acq, "acquireTime"), "2026-11-30T10:00:00.000000Z");
    CHECK_EQ_INT(spec_int(acq, "leaseTransitions"), 4);
    CHECK_EQ_INT(spec_int(acq, "leaseDurationSeconds"), 20);
    CHECK_EQ_STR(
        json_string_value(json_object_get(json_object_get(acq, "metadata"), "resourceVersion")),
        "7");
    /* renew: only renewTime moves */
    CHECK_EQ_STR(spec_str(ren, "renewTime"), "2026-11-30T10:00:02.500000Z");
    CHECK_EQ_STR(spec_str(ren, "acquireTime"), "2026-11-30T10:00:00.000000Z");
    CHECK_EQ_INT(spec_int(ren, "leaseTransitions"), 4);
    /* release: empty holder and a one-second duration, transitions kept */
    CHECK_EQ_STR(spec_str(rel, "holderIdentity"), "");
    CHECK_EQ_INT(spec_int(rel, "leaseDurationSeconds"), 1);
    CHECK_EQ_INT(spec_int(rel, "leaseTransitions"), 4);
    CHECK_EQ_INT(kube_lease_decide(rel, T0 + 3000, "b"), KUBE_LEASE_ACQUIRE);
    CHECK_EQ_INT(kube_lease_decide(ren, T0 + 3000, "b"), KUBE_LEASE_WAIT);
    CHECK_EQ_INT(kube_lease_decide(ren, T0 + 2500 + 20001, "b"), KUBE_LEASE_ACQUIRE);
    json_decref(old);
    json_decref(c);
    json_decref(acq);
    json_decref(ren);
    json_decref(rel);
}

TEST(start_refuses_bad_options)
{
    struct kube_lease_opts o = KUBE_LEASE_OPTS_DEFAULTS;
    struct kube_lease *l = NULL;
    struct err err = {0};

    /* identity missing */
    CHECK_EQ_INT(kube_lease_start(&l, NULL, &o, &err), E_INVALID);
    o.identity = "pod-a";
    o.renew_deadline_ms = 15000; /* not below the duration */
    CHECK_EQ_INT(kube_lease_start(&l, NULL, &o, &err), E_INVALID);
    o.renew_deadline_ms = 10000;
    o.retry_ms = 10000; /* not below the deadline */
    CHECK_EQ_INT(kube_lease_start(&l, NULL, &o, &err), E_INVALID);
    o.retry_ms = 2000;
    o.ns = "Bad_NS";
    CHECK_EQ_INT(kube_lease_start(&l, NULL, &o, &err), E_INVALID);
    CHECK(l == NULL);
}

T_MAIN
