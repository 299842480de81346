/* SPDX-License-Identifier: Apache-2.0 */
/* Building an egress policy: rules from flags and agent.yaml, and the server's own
 * addresses (given, or listed from the interfaces). A policy is read-only once built. */
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "egress/egress.h"
#include "egress/egress_int.h"

#define OWN_MAX 1024 /* own addresses kept; more interfaces than this are ignored */

void egress_policy_new(struct egress_policy **out)
{
    *out = xcalloc(1, sizeof(**out));
}

void egress_policy_free(struct egress_policy *p)
{
    if (p == NULL) {
        return;
    }
    free(p->rules);
    free(p->own);
    free(p);
}

struct egress_policy *egress_policy_dup(const struct egress_policy *p)
{
    struct egress_policy *d = xcalloc(1, sizeof(*d));

    if (p->nrules > 0) {
        d->rules = xmalloc(p->nrules * sizeof(*d->rules));
        memcpy(d->rules, p->rules, p->nrules * sizeof(*d->rules));
        d->nrules = p->nrules;
    }
    if (p->nown > 0) {
        d->own = xmalloc(p->nown * sizeof(*d->own));
        memcpy(d->own, p->own, p->nown * sizeof(*d->own));
        d->nown = p->nown;
    }
    return d;
}

size_t egress_policy_rule_count(const struct egress_policy *p)
{
    return p->nrules;
}

static int add_rule_n(struct egress_policy *p, const char *s, size_t len,
                      enum egress_rule_origin origin, struct err *err)
{
    struct egress_rule r;
    int rc;

    if (p->nrules >= EGRESS_RULES_MAX) {
        return err_set(err, E_TOOBIG, "allowed hosts: more than %d rules", EGRESS_RULES_MAX);
    }
    rc = egress_rule_parse(&r, s, len, err);
    if (rc != E_OK) {
        return rc;
    }
    r.origin = origin;
    p->rules = xrealloc(p->rules, (p->nrules + 1) * sizeof(*p->rules));
    p->rules[p->nrules++] = r;
    return E_OK;
}

int egress_policy_add_rule(struct egress_policy *p, const char *rule,
                           enum egress_rule_origin origin, struct err *err)
{
    return add_rule_n(p, rule, strlen(rule), origin, err);
}

int egress_policy_add_rules_csv(struct egress_policy *p, const char *s,
                                enum egress_rule_origin origin, struct err *err)
{
    size_t keep = p->nrules;
    const char *item = s;

    for (;;) {
        const char *comma = strchr(item, ',');
        size_t n = comma != NULL ? (size_t)(comma - item) : strlen(item);
        if (n > 0) {
            int rc = add_rule_n(p, item, n, origin, err);
            if (rc != E_OK) {
                p->nrules = keep;
                return rc;
            }
        }
        if (comma == NULL) {
            return E_OK;
        }
        item = comma + 1;
    }
}

void egress_policy_add_own(struct egress_policy *p, const struct egress_addr *a, uint16_t port)
{
    if (p->nown >= OWN_MAX) {
        return;
    }
    p->own = xrealloc(p->own, (p->nown + 1) * sizeof(*p->own));
    p->own[p->nown].addr = *a;
    p->own[p->nown].port = port;
    p->nown++;
}

int egress_policy_add_own_interfaces(struct egress_policy *p, struct err *err)
{
    struct ifaddrs *ifs = NULL;

    if (getifaddrs(&ifs) != 0) {
        return err_set(err, E_FAIL, "egress: cannot list the interface addresses");
    }
    for (struct ifaddrs *i = ifs; i != NULL; i = i->ifa_next) {
        struct egress_addr a;
        memset(&a, 0, sizeof(a));
        if (i->ifa_addr == NULL) {
            continue;
        }
        if (i->ifa_addr->sa_family == AF_INET) {
            const struct sockaddr_in *sin = (const struct sockaddr_in *)(const void *)i->ifa_addr;
            a.family = 4;
            memcpy(a.bytes, &sin->sin_addr, 4);
        } else if (i->ifa_addr->sa_family == AF_INET6) {
            const struct sockaddr_in6 *sin6 =
                (const struct sockaddr_in6 *)(const void *)i->ifa_addr;
            a.family = 6;
            memcpy(a.bytes, &sin6->sin6_addr, 16);
        } else {
            continue;
        }
        /* Loopback is refused by its class already; listing it here would also refuse
         * the explicit 127.0.0.1:PORT test rule. The server's own loopback listener is
         * added with its port by the caller. */
        if (egress_addr_classify(&a) != EGRESS_ADDR_LOOPBACK) {
            egress_policy_add_own(p, &a, 0);
        }
    }
    freeifaddrs(ifs);
    return E_OK;
}
