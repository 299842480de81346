/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer harness for the two egress parsers that read hostile bytes: the CONNECT
 * request head (from inside the sandbox) and the host[:port] allowlist rule (flags and
 * .diverge/agent.yaml). The first byte picks the parser. Whatever parses must round-trip:
 * a parsed host normalises to itself, and a rule's canonical text parses to the same rule. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "egress/egress.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(c_)                                                                             \
    do {                                                                                           \
        if (!(c_)) {                                                                               \
            assert_fail(#c_, __FILE__, __LINE__);                                                  \
        }                                                                                          \
    } while (0)

static void fuzz_connect(const char *s, size_t n)
{
    struct egress_connect_req req, again;
    struct egress_decision d;
    struct egress_policy *p;
    struct egress_addr a;
    char host[EGRESS_HOST_MAX + 1];
    bool is_ip;
    int rc = egress_connect_parse(&req, s, n, EGRESS_HEADER_MAX);

    FUZZ_CHECK(rc == E_OK || rc == E_AGAIN || rc == E_TOOBIG || rc == E_DENIED || rc == E_INVALID);
    if (rc != E_OK) {
        return;
    }
    FUZZ_CHECK(req.head_len >= 4 && req.head_len <= n && req.head_len <= EGRESS_HEADER_MAX);
    FUZZ_CHECK(memcmp(s + req.head_len - 4, "\r\n\r\n", 4) == 0);
    FUZZ_CHECK(req.port != 0 && req.host[0] != '\0');
    FUZZ_CHECK(egress_host_normalise(host, &is_ip, &a, req.host, strlen(req.host)) == E_OK);
    FUZZ_CHECK(strcmp(host, req.host) == 0 && is_ip == req.is_ip);
    /* The parse only depends on the head. */
    FUZZ_CHECK(egress_connect_parse(&again, s, req.head_len, EGRESS_HEADER_MAX) == E_OK);
    FUZZ_CHECK(strcmp(again.host, req.host) == 0 && again.port == req.port);
    /* An empty policy denies everything. */
    egress_policy_new(&p);
    egress_decide(&d, p, req.host, req.is_ip, &req.addr, req.port, &req.addr, req.is_ip);
    FUZZ_CHECK(!d.allowed);
    egress_policy_free(p);
}

static void fuzz_rule(const char *s, size_t n)
{
    struct egress_rule r, again;
    int rc = egress_rule_parse(&r, s, n, NULL);

    FUZZ_CHECK(rc == E_OK || rc == E_INVALID);
    if (rc != E_OK) {
        return;
    }
    FUZZ_CHECK(r.port != 0 && r.host[0] != '\0');
    FUZZ_CHECK(egress_rule_parse(&again, r.text, strlen(r.text), NULL) == E_OK);
    FUZZ_CHECK(strcmp(again.text, r.text) == 0 && again.kind == r.kind && again.port == r.port);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) {
        return 0;
    }
    if (data[0] & 1) {
        fuzz_rule((const char *)data + 1, size - 1);
    } else {
        fuzz_connect((const char *)data + 1, size - 1);
    }
    return 0;
}
