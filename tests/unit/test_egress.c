/* SPDX-License-Identifier: Apache-2.0 */
/* egress policy, table-driven and without any I/O: rule and host parsing, address
 * classes, decisions on (host, port, resolved answers), the CONNECT head parser and the
 * log line. No test here opens a socket. */
#include <stdio.h>
#include <string.h>

#include "egress/egress.h"
#include "tests/t_check.h"

static const struct {
    const char *in;
    int rc;
    enum egress_rule_kind kind;
    const char *text;
} rule_cases[] = {
    {"example.com", E_OK, EGRESS_RULE_EXACT, "example.com:443"},
    {"Example.COM.", E_OK, EGRESS_RULE_EXACT, "example.com:443"},
    {"*.github.com:8443", E_OK, EGRESS_RULE_SUFFIX, "*.github.com:8443"},
    {"*.GitHub.com.", E_OK, EGRESS_RULE_SUFFIX, "*.github.com:443"},
    {"[::1]:443", E_OK, EGRESS_RULE_IP, "[::1]:443"},
    {"[2001:DB8:0::1]", E_OK, EGRESS_RULE_IP, "[2001:db8::1]:443"},
    {"127.0.0.1:9000", E_OK, EGRESS_RULE_IP, "127.0.0.1:9000"},
    {"1.1.1.1", E_OK, EGRESS_RULE_IP, "1.1.1.1:443"},
    {"a_b.example.com:1", E_OK, EGRESS_RULE_EXACT, "a_b.example.com:1"},
    {"x.com:65535", E_OK, EGRESS_RULE_EXACT, "x.com:65535"},
    {"::1", E_INVALID, 0, NULL},
    {"::1:443", E_INVALID, 0, NULL},
    {"*.1.2.3.4", E_INVALID, 0, NULL},
    {"*.[::1]", E_INVALID, 0, NULL},
    {"*", E_INVALID, 0, NULL},
    {"*.", E_INVALID, 0, NULL},
    {"*.*.com", E_INVALID, 0, NULL},
    {"a*.com", E_INVALID, 0, NULL},
    {"", E_INVALID, 0, NULL},
    {".", E_INVALID, 0, NULL},
    {"a..b", E_INVALID, 0, NULL},
    {"-a.com", E_INVALID, 0, NULL},
    {"a-.com", E_INVALID, 0, NULL},
    {"host:0", E_INVALID, 0, NULL},
    {"host:65536", E_INVALID, 0, NULL},
    {"host:", E_INVALID, 0, NULL},
    {"host:+1", E_INVALID, 0, NULL},
    {"host:000443", E_INVALID, 0, NULL},
    {"a.com:443:1", E_INVALID, 0, NULL},
    {"[::1", E_INVALID, 0, NULL},
    {"[::1]x", E_INVALID, 0, NULL},
    {"[fe80::1%eth0]", E_INVALID, 0, NULL},
    {"127.1", E_INVALID, 0, NULL},
    {"0x7f000001", E_INVALID, 0, NULL},
    {"example.123", E_INVALID, 0, NULL},
    {"exa mple.com", E_INVALID, 0, NULL},
    {"http://example.com", E_INVALID, 0, NULL},
};

TEST(rule_parse_table)
{
    for (size_t i = 0; i < ARRAY_LEN(rule_cases); i++) {
        struct egress_rule r;
        struct err e;
        int rc = egress_rule_parse(&r, rule_cases[i].in, strlen(rule_cases[i].in), &e);
        if (rc != rule_cases[i].rc) {
            t_fail(__FILE__, __LINE__, "rule %zu \"%s\": rc %d, want %d", i, rule_cases[i].in, rc,
                   rule_cases[i].rc);
            continue;
        }
        if (rc == E_OK) {
            CHECK_EQ_INT(r.kind, rule_cases[i].kind);
            CHECK_EQ_STR(r.text, rule_cases[i].text);
        } else {
            CHECK(strlen(rule_cases[i].in) < 6 || strstr(e.msg, rule_cases[i].in) == NULL);
        }
    }
}

TEST(rule_length_limits)
{
    char host[300], rule[310];
    struct egress_rule r;

    /* 63-byte labels pass, 64 do not; 253 bytes pass, 254 do not. */
    memset(host, 'a', 63);
    memcpy(host + 63, ".com", 5);
    CHECK_OK(egress_rule_parse(&r, host, strlen(host), NULL));
    memset(host, 'a', 64);
    memcpy(host + 64, ".com", 5);
    CHECK_EQ_INT(egress_rule_parse(&r, host, strlen(host), NULL), E_INVALID);
    for (size_t i = 0; i < 249; i++) {
        host[i] = (i % 2 == 0) ? 'a' : '.';
    }
    memcpy(host + 249, "com", 4); /* 252 bytes */
    snprintf(rule, sizeof(rule), "b%s", host);
    CHECK_EQ_INT(strlen(rule), 253);
    CHECK_OK(egress_rule_parse(&r, rule, strlen(rule), NULL));
    snprintf(rule, sizeof(rule), "bb%s", host);
    CHECK_EQ_INT(egress_rule_parse(&r, rule, strlen(rule), NULL), E_INVALID);
}

static const struct {
    const char *addr;
    enum egress_addr_class cls;
} class_cases[] = {
    {"8.8.8.8", EGRESS_ADDR_PUBLIC},
    {"140.82.112.6", EGRESS_ADDR_PUBLIC},
    {"127.0.0.1", EGRESS_ADDR_LOOPBACK},
    {"127.255.1.2", EGRESS_ADDR_LOOPBACK},
    {"::1", EGRESS_ADDR_LOOPBACK},
    {"169.254.169.254", EGRESS_ADDR_LINK_LOCAL},
    {"169.254.0.1", EGRESS_ADDR_LINK_LOCAL},
    {"fe80::1", EGRESS_ADDR_LINK_LOCAL},
    {"febf::1", EGRESS_ADDR_LINK_LOCAL},
    {"10.0.0.1", EGRESS_ADDR_PRIVATE},
    {"172.16.0.1", EGRESS_ADDR_PRIVATE},
    {"172.31.255.255", EGRESS_ADDR_PRIVATE},
    {"172.32.0.1", EGRESS_ADDR_PUBLIC},
    {"172.15.255.255", EGRESS_ADDR_PUBLIC},
    {"192.168.1.1", EGRESS_ADDR_PRIVATE},
    {"fd00::1", EGRESS_ADDR_PRIVATE},
    {"fc00::1", EGRESS_ADDR_PRIVATE},
    {"fec0::1", EGRESS_ADDR_PRIVATE},
    {"100.64.0.1", EGRESS_ADDR_CGNAT},
    {"100.127.255.255", EGRESS_ADDR_CGNAT},
    {"100.128.0.1", EGRESS_ADDR_PUBLIC},
    {"0.0.0.0", EGRESS_ADDR_UNSPECIFIED},
    {"0.1.2.3", EGRESS_ADDR_UNSPECIFIED},
    {"::", EGRESS_ADDR_UNSPECIFIED},
    {"224.0.0.1", EGRESS_ADDR_MULTICAST},
    {"239.255.255.250", EGRESS_ADDR_MULTICAST},
    {"ff02::1", EGRESS_ADDR_MULTICAST},
    {"255.255.255.255", EGRESS_ADDR_RESERVED},
    {"240.0.0.1", EGRESS_ADDR_RESERVED},
    {"198.18.0.1", EGRESS_ADDR_RESERVED},
    {"2001:db8::1", EGRESS_ADDR_RESERVED},
    {"2001::1", EGRESS_ADDR_RESERVED},
    {"100::1", EGRESS_ADDR_RESERVED},
    {"::ffff:127.0.0.1", EGRESS_ADDR_LOOPBACK},
    {"::ffff:169.254.169.254", EGRESS_ADDR_LINK_LOCAL},
    {"::ffff:10.1.2.3", EGRESS_ADDR_PRIVATE},
    {"::ffff:8.8.8.8", EGRESS_ADDR_PUBLIC},
    {"::127.0.0.1", EGRESS_ADDR_LOOPBACK},
    {"64:ff9b::a9fe:a9fe", EGRESS_ADDR_LINK_LOCAL},
    {"64:ff9b::808:808", EGRESS_ADDR_PUBLIC},
    {"2002:7f00:1::", EGRESS_ADDR_LOOPBACK},
    {"2002:a9fe:a9fe::1", EGRESS_ADDR_LINK_LOCAL},
    {"2606:4700::1111", EGRESS_ADDR_PUBLIC},
};

TEST(address_classes)
{
    for (size_t i = 0; i < ARRAY_LEN(class_cases); i++) {
        struct egress_addr a;
        if (egress_addr_parse(&a, class_cases[i].addr) != E_OK) {
            t_fail(__FILE__, __LINE__, "cannot parse %s", class_cases[i].addr);
            continue;
        }
        if (egress_addr_classify(&a) != class_cases[i].cls) {
            t_fail(__FILE__, __LINE__, "%s: class %d, want %d", class_cases[i].addr,
                   (int)egress_addr_classify(&a), (int)class_cases[i].cls);
        }
    }
}

static const struct {
    const char *in;
    int rc;
    const char *out;
    bool is_ip;
} host_cases[] = {
    {"LocalHost.", E_OK, "localhost", false},
    {"API.GitHub.com", E_OK, "api.github.com", false},
    {"[::FFFF:127.0.0.1]", E_OK, "::ffff:127.0.0.1", true},
    {"::1", E_OK, "::1", true},
    {"127.0.0.1", E_OK, "127.0.0.1", true},
    {"123.example", E_OK, "123.example", false},
    {"xn--bcher-kva.example", E_OK, "xn--bcher-kva.example", false},
    {"127.1", E_INVALID, NULL, false},
    {"0x7f.0.0.1", E_INVALID, NULL, false},
    {"0177.0.0.1", E_INVALID, NULL, false},
    {"1.2.3", E_INVALID, NULL, false},
    {"4294967295", E_INVALID, NULL, false},
    {"", E_INVALID, NULL, false},
    {".", E_INVALID, NULL, false},
    {"..", E_INVALID, NULL, false},
    {"[]", E_INVALID, NULL, false},
    {"[127.0.0.1]", E_INVALID, NULL, false},
    {"a/b", E_INVALID, NULL, false},
    {"a%2eb", E_INVALID, NULL, false},
};

TEST(host_normalise_table)
{
    for (size_t i = 0; i < ARRAY_LEN(host_cases); i++) {
        char out[EGRESS_HOST_MAX + 1];
        struct egress_addr a;
        bool is_ip;
        int rc = egress_host_normalise(out, &is_ip, &a, host_cases[i].in, strlen(host_cases[i].in));
        if (rc != host_cases[i].rc) {
            t_fail(__FILE__, __LINE__, "host \"%s\": rc %d, want %d", host_cases[i].in, rc,
                   host_cases[i].rc);
        } else if (rc == E_OK) {
            CHECK_EQ_STR(out, host_cases[i].out);
            CHECK_EQ_INT(is_ip, host_cases[i].is_ip);
        }
    }
}

/* Answers are written as a space-separated list; NULL means none. */
static const struct {
    const char *host;
    uint16_t port;
    const char *answers;
    bool allowed;
    const char *why; /* rule text when allowed, reason when denied */
} decide_cases[] = {
    {"api.github.com", 443, "140.82.112.6", true, "*.github.com:443"},
    {"a.b.github.com", 443, "140.82.112.6 2606:50c0:8000::154", true, "*.github.com:443"},
    {"API.GitHub.com.", 443, "140.82.112.6", true, "*.github.com:443"},
    {"github.com", 443, "140.82.112.6", false, "blocked-by-allowlist"}, /* apex */
    {"evilgithub.com", 443, "140.82.112.6", false, "blocked-by-allowlist"},
    {"github.com.evil.net", 443, "140.82.112.6", false, "blocked-by-allowlist"},
    {"api.github.com", 80, "140.82.112.6", false, "blocked-by-allowlist"},
    {"example.com", 8443, "93.184.216.34", true, "example.com:8443"},
    {"example.com", 443, "93.184.216.34", false, "blocked-by-allowlist"},
    {"sub.example.com", 8443, "93.184.216.34", false, "blocked-by-allowlist"},
    {"1.1.1.1", 443, "1.1.1.1", true, "1.1.1.1:443"},
    {"[2606:4700:0::1111]", 443, "2606:4700::1111", true, "[2606:4700::1111]:443"},
    {"api.test", 443, "169.254.169.254", false, "link-local-address"},
    {"api.test", 443, "10.1.2.3", false, "private-address"},
    {"api.test", 443, "::ffff:127.0.0.1", false, "loopback-address"},
    {"api.test", 443, "::ffff:169.254.169.254", false, "link-local-address"},
    {"api.test", 443, "93.184.216.34 10.0.0.1", false, "private-address"},
    {"api.test", 443, "2606:4700::1111 fd00::1", false, "private-address"},
    {"api.test", 443, "172.16.5.4", false, "private-address"},
    {"api.test", 443, "172.32.0.1", true, "api.test:443"},
    {"api.test", 443, "100.64.0.1", false, "cgnat-address"},
    {"api.test", 443, "0.0.0.0", false, "unspecified-address"},
    {"api.test", 443, "::", false, "unspecified-address"},
    {"api.test", 443, "224.0.0.1", false, "multicast-address"},
    {"api.test", 443, "fe80::1", false, "link-local-address"},
    {"api.test", 443, "203.0.114.7", false, "own-address"},
    {"api.test", 443, "::ffff:203.0.114.7", false, "own-address"},
    {"api.test", 443, NULL, false, "no-addresses"},
    {"127.0.0.1", 4000, "127.0.0.1", true, "127.0.0.1:4000"}, /* the test exception */
    {"127.0.0.1", 4001, "127.0.0.1", false, "blocked-by-allowlist"},
    {"localhost", 4000, "127.0.0.1", false, "blocked-by-allowlist"},
    {"[::ffff:127.0.0.1]", 4000, "::ffff:127.0.0.1", false, "blocked-by-allowlist"},
    {"[::1]", 4001, "::1", true, "[::1]:4001"},
    {"127.0.0.2", 443, "127.0.0.2", false, "loopback-address"}, /* port not explicit */
    {"10.0.0.5", 443, "10.0.0.5", false, "private-address"},    /* only loopback is excepted */
    {"169.254.169.254", 80, "169.254.169.254", false, "link-local-address"},
    {"127.0.0.1", 5000, "127.0.0.1", false, "own-address"}, /* the server's own port */
    {"127.0.0.3", 6000, "127.0.0.3", false, "own-address"}, /* server on 0.0.0.0:6000 */
    {"[::1]", 6000, "::1", false, "own-address"},
    {"127.0.0.3", 6001, "127.0.0.3", true, "127.0.0.3:6001"},
    {"rebind.test", 4000, "127.0.0.1", false, "loopback-address"}, /* names never excepted */
    {"metadata.test", 443, "169.254.169.254", false, "link-local-address"},
};

static size_t parse_answers(struct egress_addr *out, const char *list)
{
    char buf[256], *save = NULL;
    size_t n = 0;

    if (list == NULL) {
        return 0;
    }
    snprintf(buf, sizeof(buf), "%s", list);
    for (char *tok = strtok_r(buf, " ", &save); tok != NULL; tok = strtok_r(NULL, " ", &save)) {
        if (egress_addr_parse(&out[n], tok) == E_OK) {
            n++;
        }
    }
    return n;
}

static struct egress_policy *test_policy(void)
{
    static const char *rules[] = {
        "*.github.com",       "example.com:8443", "api.test",         "1.1.1.1:443",
        "[2606:4700::1111]",  "127.0.0.1:4000",   "[::1]:4001",       "10.0.0.5:443",
        "127.0.0.2",          "metadata.test",    "rebind.test:4000", "127.0.0.1:5000",
        "169.254.169.254:80", "127.0.0.3:6000",   "[::1]:6000",       "127.0.0.3:6001"};
    struct egress_policy *p;
    struct egress_addr own;

    egress_policy_new(&p);
    for (size_t i = 0; i < ARRAY_LEN(rules); i++) {
        CHECK_OK(egress_policy_add_rule(p, rules[i], EGRESS_ORIGIN_SERVER, NULL));
    }
    CHECK_OK(egress_addr_parse(&own, "203.0.114.7"));
    egress_policy_add_own(p, &own, 0);
    CHECK_OK(egress_addr_parse(&own, "127.0.0.1"));
    egress_policy_add_own(p, &own, 5000);
    CHECK_OK(egress_addr_parse(&own, "0.0.0.0"));
    egress_policy_add_own(p, &own, 6000);
    return p;
}

TEST(decide_table)
{
    struct egress_policy *p = test_policy();

    for (size_t i = 0; i < ARRAY_LEN(decide_cases); i++) {
        struct egress_addr addrs[EGRESS_ADDRS_MAX], addr;
        char host[EGRESS_HOST_MAX + 1];
        bool is_ip;
        struct egress_decision d;
        size_t n = parse_answers(addrs, decide_cases[i].answers);
        const char *got;

        CHECK_OK(egress_host_normalise(host, &is_ip, &addr, decide_cases[i].host,
                                       strlen(decide_cases[i].host)));
        egress_decide(&d, p, host, is_ip, &addr, decide_cases[i].port, addrs, n);
        got = d.allowed ? (d.rule != NULL ? d.rule->text : "(null)") : d.reason;
        if (d.allowed != decide_cases[i].allowed || strcmp(got, decide_cases[i].why) != 0) {
            t_fail(__FILE__, __LINE__, "case %zu %s:%u: %s %s, want %s %s", i, decide_cases[i].host,
                   (unsigned)decide_cases[i].port, d.allowed ? "allowed" : "denied", got,
                   decide_cases[i].allowed ? "allowed" : "denied", decide_cases[i].why);
        }
    }
    egress_policy_free(p);
}

TEST(policy_csv_and_dup)
{
    struct egress_policy *p, *d;
    struct egress_decision dec;
    struct egress_addr a;
    struct err e;

    egress_policy_new(&p);
    CHECK_OK(
        egress_policy_add_rules_csv(p, "a.example,,*.b.example:8443", EGRESS_ORIGIN_SERVER, NULL));
    CHECK_EQ_INT(egress_policy_rule_count(p), 2);
    CHECK_EQ_INT(egress_policy_add_rules_csv(p, "c.example,bad host", EGRESS_ORIGIN_SERVER, &e),
                 E_INVALID);
    CHECK_EQ_INT(egress_policy_rule_count(p), 2); /* nothing of a bad list is kept */
    d = egress_policy_dup(p);
    egress_policy_free(p);
    CHECK_OK(egress_addr_parse(&a, "93.184.216.34"));
    egress_decide(&dec, d, "x.b.example", false, &a, 8443, &a, 1);
    CHECK(dec.allowed);
    egress_decide(&dec, d, "c.example", false, &a, 443, &a, 1);
    CHECK(!dec.allowed);
    egress_policy_free(d);
    egress_policy_free(NULL);
}

TEST(rules_max)
{
    struct egress_policy *p;

    egress_policy_new(&p);
    for (int i = 0; i < EGRESS_RULES_MAX; i++) {
        CHECK_OK(egress_policy_add_rule(p, "a.example", EGRESS_ORIGIN_SERVER, NULL));
    }
    CHECK_EQ_INT(egress_policy_add_rule(p, "a.example", EGRESS_ORIGIN_SERVER, NULL), E_TOOBIG);
    egress_policy_free(p);
}

/* The loopback exception is the operator's alone: the same 127.0.0.1:PORT rule from a task's
 * spec.sandbox.allowedHosts (a repository's .diverge/agent.yaml) opens nothing. */
TEST(loopback_exception_only_from_server_rules)
{
    static const struct {
        const char *rule, *ip;
        uint16_t port;
    } loops[] = {{"127.0.0.1:4000", "127.0.0.1", 4000},
                 {"[::1]:4001", "::1", 4001},
                 {"127.0.0.2:4002", "127.0.0.2", 4002}};
    struct egress_policy *srv, *task, *dup;
    struct egress_decision d;
    struct egress_addr a;

    egress_policy_new(&srv);
    egress_policy_new(&task);
    for (size_t i = 0; i < ARRAY_LEN(loops); i++) {
        CHECK_OK(egress_policy_add_rule(srv, loops[i].rule, EGRESS_ORIGIN_SERVER, NULL));
        CHECK_OK(egress_policy_add_rule(task, loops[i].rule, EGRESS_ORIGIN_TASK, NULL));
        CHECK_OK(egress_addr_parse(&a, loops[i].ip));
        egress_decide(&d, srv, loops[i].ip, true, &a, loops[i].port, &a, 1);
        CHECK(d.allowed);
        egress_decide(&d, task, loops[i].ip, true, &a, loops[i].port, &a, 1);
        CHECK(!d.allowed);
        CHECK_EQ_STR(d.reason, "loopback-address");
        CHECK(d.rule != NULL && d.rule->origin == EGRESS_ORIGIN_TASK);
    }
    /* A copy (what each proxy gets) keeps every rule's origin. */
    CHECK_OK(egress_policy_add_rules_csv(task, "127.0.0.9:5000", EGRESS_ORIGIN_TASK, NULL));
    dup = egress_policy_dup(task);
    CHECK_OK(egress_addr_parse(&a, "127.0.0.9"));
    egress_decide(&d, dup, "127.0.0.9", true, &a, 5000, &a, 1);
    CHECK(!d.allowed);
    CHECK_EQ_STR(d.reason, "loopback-address");
    egress_policy_free(dup);
    egress_policy_free(srv);
    egress_policy_free(task);
}

TEST(own_interfaces_skip_loopback)
{
    struct egress_policy *p;
    struct egress_addr lo;
    struct egress_decision d;

    egress_policy_new(&p);
    CHECK_OK(egress_policy_add_rule(p, "127.0.0.1:4000", EGRESS_ORIGIN_SERVER, NULL));
    CHECK_OK(egress_policy_add_own_interfaces(p, NULL));
    CHECK_OK(egress_addr_parse(&lo, "127.0.0.1"));
    egress_decide(&d, p, "127.0.0.1", true, &lo, 4000, &lo, 1);
    CHECK(d.allowed);
    egress_policy_free(p);
}

static const struct {
    const char *in;
    int rc;
    const char *host;
    unsigned port;
    size_t head_len;
} connect_cases[] = {
    {"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", E_OK, "example.com", 443,
     59},
    {"CONNECT Example.COM.:8443 HTTP/1.0\r\n\r\nEARLY", E_OK, "example.com", 8443, 38},
    {"CONNECT [::1]:443 HTTP/1.1\r\n\r\n", E_OK, "::1", 443, 30},
    {"CONNECT 127.0.0.1:4000 HTTP/1.1\r\nProxy-Connection: keep-alive\r\n\r\n", E_OK, "127.0.0.1",
     4000, 65},
    {"CONNECT example.com:443 HTTP/1.1\r\nHost: x", E_AGAIN, NULL, 0, 0},
    {"CONNECT example.com:443 HTTP/1.1", E_AGAIN, NULL, 0, 0},
    {"CONN", E_AGAIN, NULL, 0, 0},
    {"", E_AGAIN, NULL, 0, 0},
    {"GET / HTTP/1.1\r\n", E_DENIED, NULL, 0, 0},
    {"GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n", E_DENIED, NULL, 0, 0},
    {"connect example.com:443 HTTP/1.1\r\n\r\n", E_DENIED, NULL, 0, 0},
    {"CONNECT example.com HTTP/1.1\r\n\r\n", E_INVALID, NULL, 0, 0},
    {"CONNECT ::1:443 HTTP/1.1\r\n\r\n", E_INVALID, NULL, 0, 0},
    {"CONNECT example.com:443 HTTP/2.0\r\n\r\n", E_INVALID, NULL, 0, 0},
    {"CONNECT example.com:443 HTTP/1.1 \r\n\r\n", E_INVALID, NULL, 0, 0},
    {"CONNECT  example.com:443 HTTP/1.1\r\n\r\n", E_INVALID, NULL, 0, 0},
    {"CONNECT example.com:99999 HTTP/1.1\r\n\r\n", E_INVALID, NULL, 0, 0},
    {"CONNECT exa%6dple.com:443 HTTP/1.1\r\n\r\n", E_INVALID, NULL, 0, 0},
    {"CONNECT 127.1:443 HTTP/1.1\r\n\r\n", E_INVALID, NULL, 0, 0},
    {"CONNECT user@example.com:443 HTTP/1.1\r\n\r\n", E_INVALID, NULL, 0, 0},
    {"G(T / HTTP/1.1\r\n\r\n", E_INVALID, NULL, 0, 0},
    {"\r\n\r\n", E_INVALID, NULL, 0, 0},
};

TEST(connect_parse_table)
{
    for (size_t i = 0; i < ARRAY_LEN(connect_cases); i++) {
        struct egress_connect_req req;
        const char *in = connect_cases[i].in;
        int rc = egress_connect_parse(&req, in, strlen(in), EGRESS_HEADER_MAX);
        if (rc != connect_cases[i].rc) {
            t_fail(__FILE__, __LINE__, "connect case %zu: rc %d, want %d", i, rc,
                   connect_cases[i].rc);
        } else if (rc == E_OK) {
            CHECK_EQ_STR(req.host, connect_cases[i].host);
            CHECK_EQ_INT(req.port, connect_cases[i].port);
            CHECK_EQ_INT(req.head_len, connect_cases[i].head_len);
        }
    }
}

TEST(connect_parse_limits)
{
    static const char head[] = "CONNECT example.com:443 HTTP/1.1\r\nX-Pad: ";
    char buf[EGRESS_HEADER_MAX + 16];
    struct egress_connect_req req;
    size_t max = 256, pad;

    /* A head of exactly MAX bytes parses; one byte more is E_TOOBIG. */
    pad = max - (sizeof(head) - 1) - 4;
    memcpy(buf, head, sizeof(head) - 1);
    memset(buf + sizeof(head) - 1, 'a', pad);
    memcpy(buf + sizeof(head) - 1 + pad, "\r\n\r\n", 4);
    CHECK_OK(egress_connect_parse(&req, buf, max, max));
    CHECK_EQ_INT(req.head_len, max);
    memset(buf + sizeof(head) - 1, 'a', pad + 1);
    memcpy(buf + sizeof(head) - 1 + pad + 1, "\r\n\r\n", 4);
    CHECK_EQ_INT(egress_connect_parse(&req, buf, max + 1, max), E_TOOBIG);
    CHECK_EQ_INT(egress_connect_parse(&req, buf, max, max), E_TOOBIG);
    CHECK_EQ_INT(egress_connect_parse(&req, buf, max - 1, max), E_AGAIN);
    /* An endless request line is E_TOOBIG at the cap, not E_AGAIN forever. */
    memset(buf, 'A', sizeof(buf));
    CHECK_EQ_INT(egress_connect_parse(&req, buf, EGRESS_HEADER_MAX, EGRESS_HEADER_MAX), E_TOOBIG);
    /* A NUL anywhere in the head is invalid. */
    memcpy(buf, "CONNECT a.example:443 HTTP/1.1\r\nX: \0\r\n\r\n", 41);
    CHECK_EQ_INT(egress_connect_parse(&req, buf, 41, EGRESS_HEADER_MAX), E_INVALID);
}

TEST(event_lines)
{
    char line[EGRESS_LINE_MAX];
    struct egress_event ev = {.kind = EGRESS_EVENT_DECISION,
                              .time_ms = 1796025600000,
                              .hostport = "api.github.com:443",
                              .allowed = true,
                              .rule = "*.github.com:443",
                              .reason = ""};
    size_t body = egress_event_format(line, &ev);

    CHECK_EQ_STR(line,
                 "2026-11-30T08:00:00Z egress api.github.com:443 allowed rule=*.github.com:443");
    CHECK_EQ_STR(line + body, "egress api.github.com:443 allowed rule=*.github.com:443");
    ev.kind = EGRESS_EVENT_CLOSE;
    ev.bytes_out = 517;
    ev.bytes_in = 4242;
    egress_event_format(line, &ev);
    CHECK_EQ_STR(line + body, "egress api.github.com:443 allowed rule=*.github.com:443 closed "
                              "bytes_out=517 bytes_in=4242");
    ev.kind = EGRESS_EVENT_DECISION;
    ev.allowed = false;
    ev.hostport = "localhost:3000";
    ev.rule = "";
    ev.reason = "blocked-by-allowlist";
    egress_event_format(line, &ev);
    CHECK_EQ_STR(line + body, "egress localhost:3000 denied reason=blocked-by-allowlist");
    ev.rule = "api.test:443";
    ev.reason = "link-local-address";
    egress_event_format(line, &ev);
    CHECK_EQ_STR(line + body,
                 "egress localhost:3000 denied reason=link-local-address rule=api.test:443");
}

T_MAIN
