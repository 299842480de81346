/* SPDX-License-Identifier: Apache-2.0 */
/* The egress allowlist as pure functions: address classes, rule and host parsing, and the
 * decision. Invariant: nothing here does I/O, so the whole policy is table-tested; an
 * address outside the public class is refused whatever the rules say, except the exact
 * loopback literal:port of an explicit IP rule of the operator's (never a name, never a
 * task's or repository's rule, never an own address). */
#include <arpa/inet.h>
#include <ctype.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "egress/egress.h"
#include "egress/egress_int.h"

int egress_addr_parse(struct egress_addr *out, const char *s)
{
    memset(out, 0, sizeof(*out));
    if (inet_pton(AF_INET, s, out->bytes) == 1) {
        out->family = 4;
        return E_OK;
    }
    if (inet_pton(AF_INET6, s, out->bytes) == 1) {
        out->family = 6;
        return E_OK;
    }
    memset(out, 0, sizeof(*out));
    return E_INVALID;
}

void egress_addr_format(char *out, size_t cap, const struct egress_addr *a)
{
    char tmp[INET6_ADDRSTRLEN];

    if (inet_ntop(a->family == 4 ? AF_INET : AF_INET6, a->bytes, tmp, sizeof(tmp)) == NULL) {
        tmp[0] = '\0';
    }
    snprintf(out, cap, "%s", tmp);
}

bool egress_addr_equal(const struct egress_addr *a, const struct egress_addr *b)
{
    size_t n = a->family == 4 ? 4 : 16;

    return a->family == b->family && memcmp(a->bytes, b->bytes, n) == 0;
}

/* The IPv4 address an IPv6 one embeds (mapped ::ffff:0:0/96), else A itself. */
struct egress_addr egress_addr_unmap(const struct egress_addr *a)
{
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    struct egress_addr v4 = *a;

    if (a->family == 6 && memcmp(a->bytes, mapped, 12) == 0) {
        memset(&v4, 0, sizeof(v4));
        v4.family = 4;
        memcpy(v4.bytes, a->bytes + 12, 4);
    }
    return v4;
}

static bool in4(uint32_t x, uint32_t net, int bits)
{
    uint32_t mask = bits == 0 ? 0 : 0xffffffffu << (32 - bits);

    return (x & mask) == net;
}

static enum egress_addr_class classify4(const uint8_t *b)
{
    static const struct {
        uint32_t net;
        int bits;
        enum egress_addr_class cls;
    } table[] = {
        {0x00000000u, 8, EGRESS_ADDR_UNSPECIFIED}, /* 0/8 "this network" */
        {0x7f000000u, 8, EGRESS_ADDR_LOOPBACK},
        {0x0a000000u, 8, EGRESS_ADDR_PRIVATE},
        {0xac100000u, 12, EGRESS_ADDR_PRIVATE},
        {0xc0a80000u, 16, EGRESS_ADDR_PRIVATE},
        {0x64400000u, 10, EGRESS_ADDR_CGNAT},
        {0xa9fe0000u, 16, EGRESS_ADDR_LINK_LOCAL}, /* 169.254.169.254 metadata inside */
        {0xe0000000u, 4, EGRESS_ADDR_MULTICAST},
        {0xf0000000u, 4, EGRESS_ADDR_RESERVED},  /* incl. 255.255.255.255 */
        {0xc0000000u, 24, EGRESS_ADDR_RESERVED}, /* 192.0.0/24 protocol assignments */
        {0xc0000200u, 24, EGRESS_ADDR_RESERVED}, /* TEST-NET-1 */
        {0xc6336400u, 24, EGRESS_ADDR_RESERVED}, /* TEST-NET-2 */
        {0xcb007100u, 24, EGRESS_ADDR_RESERVED}, /* TEST-NET-3 */
        {0xc6120000u, 15, EGRESS_ADDR_RESERVED}, /* 198.18/15 benchmarking */
        {0xc0586300u, 24, EGRESS_ADDR_RESERVED}, /* 192.88.99/24 6to4 relay */
    };
    uint32_t x = (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];

    for (size_t i = 0; i < ARRAY_LEN(table); i++) {
        if (in4(x, table[i].net, table[i].bits)) {
            return table[i].cls;
        }
    }
    return EGRESS_ADDR_PUBLIC;
}

static bool zero(const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (b[i] != 0) {
            return false;
        }
    }
    return true;
}

/* The IPv4 address an IPv6 address carries and routes to, or NULL: mapped ::ffff:0:0/96,
 * IPv4-compatible ::/96, NAT64 64:ff9b::/96 and 6to4 2002:V4ADDR::/48. */
static const uint8_t *embedded_v4(const uint8_t *b)
{
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    static const uint8_t nat64[12] = {0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0};

    if (memcmp(b, mapped, 12) == 0 || zero(b, 12) || memcmp(b, nat64, 12) == 0) {
        return b + 12;
    }
    if (b[0] == 0x20 && b[1] == 0x02) {
        return b + 2;
    }
    return NULL;
}

/* Special-purpose IPv6 ranges that are not embedded IPv4, checked in order. */
static const struct v6_range {
    uint8_t prefix[4]; /* the first bytes of the range */
    unsigned bits;     /* its prefix length, at most 32 */
    enum egress_addr_class cls;
} v6_ranges[] = {
    {{0xff}, 8, EGRESS_ADDR_MULTICAST},
    {{0xfe, 0x80}, 10, EGRESS_ADDR_LINK_LOCAL},
    {{0xfc}, 7, EGRESS_ADDR_PRIVATE},                     /* ULA fc00::/7 */
    {{0xfe, 0xc0}, 10, EGRESS_ADDR_PRIVATE},              /* site-local fec0::/10 */
    {{0x00, 0x64, 0xff, 0x9b}, 32, EGRESS_ADDR_PRIVATE},  /* 64:ff9b:1::/48 local NAT64 etc. */
    {{0x20, 0x01, 0x00, 0x00}, 32, EGRESS_ADDR_RESERVED}, /* Teredo 2001::/32 */
    {{0x20, 0x01, 0x0d, 0xb8}, 32, EGRESS_ADDR_RESERVED}, /* documentation 2001:db8::/32 */
};

static bool in_range(const uint8_t *b, const struct v6_range *r)
{
    unsigned whole = r->bits / 8, rest = r->bits % 8;
    uint8_t mask = (uint8_t)(0xff << (8 - rest));

    return memcmp(b, r->prefix, whole) == 0 && (rest == 0 || (b[whole] & mask) == r->prefix[whole]);
}

static enum egress_addr_class classify6(const uint8_t *b)
{
    const uint8_t *v4;

    if (zero(b, 16)) {
        return EGRESS_ADDR_UNSPECIFIED;
    }
    if (zero(b, 15) && b[15] == 1) {
        return EGRESS_ADDR_LOOPBACK;
    }
    v4 = embedded_v4(b);
    if (v4 != NULL) {
        return classify4(v4);
    }
    for (size_t i = 0; i < sizeof(v6_ranges) / sizeof(v6_ranges[0]); i++) {
        if (in_range(b, &v6_ranges[i])) {
            return v6_ranges[i].cls;
        }
    }
    if ((b[0] & 0xe0) != 0x20) {
        return EGRESS_ADDR_RESERVED; /* outside global unicast 2000::/3 (100::/64 etc.) */
    }
    return EGRESS_ADDR_PUBLIC;
}

enum egress_addr_class egress_addr_classify(const struct egress_addr *a)
{
    return a->family == 4 ? classify4(a->bytes) : classify6(a->bytes);
}

const char *egress_addr_class_reason(enum egress_addr_class c)
{
    switch (c) {
    case EGRESS_ADDR_PUBLIC:
        return "";
    case EGRESS_ADDR_LOOPBACK:
        return "loopback-address";
    case EGRESS_ADDR_LINK_LOCAL:
        return "link-local-address";
    case EGRESS_ADDR_PRIVATE:
        return "private-address";
    case EGRESS_ADDR_CGNAT:
        return "cgnat-address";
    case EGRESS_ADDR_UNSPECIFIED:
        return "unspecified-address";
    case EGRESS_ADDR_MULTICAST:
        return "multicast-address";
    case EGRESS_ADDR_RESERVED:
        return "reserved-address";
    }
    return "reserved-address";
}

/* A label glibc's getaddrinfo (inet_aton) would read as a number: decimal, octal or 0x hex. */
static bool numeric_label(const char *s, size_t n)
{
    size_t i = 0;

    if (n >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        i = 2;
        for (; i < n; i++) {
            if (!isxdigit((unsigned char)s[i])) {
                return false;
            }
        }
        return true;
    }
    if (n == 0) {
        return false;
    }
    for (; i < n; i++) {
        if (!isdigit((unsigned char)s[i])) {
            return false;
        }
    }
    return true;
}

static bool name_char(char c)
{
    return islower((unsigned char)c) || isdigit((unsigned char)c) || c == '-' || c == '_';
}

/* One label of N bytes: 1 to 63 of them, no dash at either end. */
static bool valid_label(const char *s, size_t n)
{
    return n > 0 && n <= 63 && s[0] != '-' && s[n - 1] != '-';
}

/* Checks the lower-cased name NAME (LEN bytes, no trailing dot) label by label. */
static bool valid_name(const char *name, size_t len)
{
    size_t start = 0, labels = 0, numeric = 0;
    bool last_numeric = false;

    if (len == 0 || len > EGRESS_HOST_MAX) {
        return false;
    }
    for (size_t i = 0; i <= len; i++) {
        if (i < len && name[i] != '.') {
            if (!name_char(name[i])) {
                return false;
            }
            continue;
        }
        if (!valid_label(name + start, i - start)) {
            return false;
        }
        labels++;
        last_numeric = numeric_label(name + start, i - start);
        numeric += last_numeric;
        start = i + 1;
    }
    /* "127.1", "0x7f000001", "10.1.2" would reach an address no rule names; a real name
     * never ends in an all-digit label. */
    return !((numeric == labels && labels <= 4) || last_numeric);
}

/* "[v6]" (the brackets already checked): the address inside into ADDR. */
static int parse_bracketed(struct egress_addr *addr, const char *host, size_t len)
{
    char tmp[EGRESS_HOST_MAX + 2];

    host++;
    len -= 2;
    if (len == 0 || len >= sizeof(tmp) || memchr(host, '\0', len) != NULL) {
        return E_INVALID;
    }
    memcpy(tmp, host, len);
    tmp[len] = '\0';
    if (inet_pton(AF_INET6, tmp, addr->bytes) != 1) {
        return E_INVALID;
    }
    addr->family = 6;
    return E_OK;
}

/* HOST (LEN bytes, 1 to EGRESS_HOST_MAX) lower-cased into TMP; E_INVALID on a NUL byte. */
static int lower_copy(char *tmp, const char *host, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        tmp[i] = (char)tolower((unsigned char)host[i]);
        if (host[i] == '\0') {
            return E_INVALID;
        }
    }
    tmp[len] = '\0';
    return E_OK;
}

int egress_host_normalise(char *out, bool *is_ip_out, struct egress_addr *addr_out,
                          const char *host, size_t len)
{
    char tmp[EGRESS_HOST_MAX + 2];

    out[0] = '\0';
    *is_ip_out = false;
    memset(addr_out, 0, sizeof(*addr_out));
    if (len >= 2 && host[0] == '[' && host[len - 1] == ']') {
        if (parse_bracketed(addr_out, host, len) != E_OK) {
            return E_INVALID;
        }
        goto ip;
    }
    if (len > 0 && host[len - 1] == '.') {
        len--; /* one trailing dot: the root label */
    }
    if (len == 0 || len > EGRESS_HOST_MAX || lower_copy(tmp, host, len) != E_OK) {
        return E_INVALID;
    }
    if (egress_addr_parse(addr_out, tmp) == E_OK) {
        goto ip;
    }
    if (!valid_name(tmp, len)) {
        return E_INVALID;
    }
    memcpy(out, tmp, len + 1);
    return E_OK;
ip:
    egress_addr_format(out, EGRESS_HOST_MAX + 1, addr_out);
    *is_ip_out = true;
    return E_OK;
}

int egress_port_parse(uint16_t *out, const char *s, size_t n)
{
    unsigned long v = 0;

    *out = 0;
    if (n == 0 || n > 5) {
        return E_INVALID;
    }
    for (size_t i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i])) {
            return E_INVALID;
        }
        v = v * 10 + (unsigned long)(s[i] - '0');
    }
    if (v == 0 || v > 65535) {
        return E_INVALID;
    }
    *out = (uint16_t)v;
    return E_OK;
}

int egress_split_hostport(const char **host, size_t *host_len, const char **port, size_t *port_len,
                          const char *s, size_t len)
{
    const char *colon = NULL;

    *host = s;
    *port = NULL;
    *port_len = 0;
    if (len > 0 && s[0] == '[') {
        const char *close = memchr(s, ']', len);
        if (close == NULL) {
            return E_INVALID;
        }
        *host_len = (size_t)(close - s) + 1;
        if (*host_len == len) {
            return E_OK;
        }
        if (s[*host_len] != ':') {
            return E_INVALID;
        }
        *port = s + *host_len + 1;
        *port_len = len - *host_len - 1;
        return E_OK;
    }
    for (size_t i = 0; i < len; i++) {
        if (s[i] == ':') {
            if (colon != NULL) {
                return E_INVALID; /* a bare IPv6 literal: ambiguous with the port */
            }
            colon = s + i;
        }
    }
    *host_len = colon == NULL ? len : (size_t)(colon - s);
    if (colon != NULL) {
        *port = colon + 1;
        *port_len = len - *host_len - 1;
    }
    return E_OK;
}

int egress_rule_parse(struct egress_rule *out, const char *s, size_t len, struct err *err)
{
    const char *host, *port;
    size_t host_len, port_len;
    bool is_ip = false, suffix = false;

    memset(out, 0, sizeof(*out));
    if (egress_split_hostport(&host, &host_len, &port, &port_len, s, len) != E_OK) {
        return err_set(err, E_INVALID, "allowed host: not host[:port] (ipv6 needs brackets)");
    }
    out->port = EGRESS_DEFAULT_PORT;
    if (port != NULL) {
        if (egress_port_parse(&out->port, port, port_len) != E_OK) {
            return err_set(err, E_INVALID, "allowed host: port must be 1 to 65535");
        }
        out->port_explicit = true;
    }
    if (host_len >= 2 && host[0] == '*' && host[1] == '.') {
        suffix = true;
        host += 2;
        host_len -= 2;
    }
    if (egress_host_normalise(out->host, &is_ip, &out->addr, host, host_len) != E_OK ||
        (suffix && is_ip)) {
        memset(out, 0, sizeof(*out));
        return err_set(err, E_INVALID, "allowed host: not a host name, *.suffix or ip literal");
    }
    out->kind = suffix ? EGRESS_RULE_SUFFIX : is_ip ? EGRESS_RULE_IP : EGRESS_RULE_EXACT;
    egress_hostport_format(out->text, sizeof(out->text), suffix ? "*." : "", out->host,
                           is_ip && out->addr.family == 6, out->port);
    return E_OK;
}

void egress_hostport_format(char *out, size_t cap, const char *prefix, const char *host,
                            bool brackets, uint16_t port)
{
    snprintf(out, cap, "%s%s%s%s:%u", prefix, brackets ? "[" : "", host, brackets ? "]" : "",
             (unsigned)port);
}

static bool rule_matches(const struct egress_rule *r, const char *host, bool is_ip,
                         const struct egress_addr *addr, uint16_t port)
{
    size_t hl, sl;

    if (r->port != port) {
        return false;
    }
    switch (r->kind) {
    case EGRESS_RULE_IP:
        return is_ip && egress_addr_equal(&r->addr, addr);
    case EGRESS_RULE_EXACT:
        return !is_ip && strcmp(r->host, host) == 0;
    case EGRESS_RULE_SUFFIX:
        hl = strlen(host);
        sl = strlen(r->host);
        /* Strict subdomains only: "a.x.com" matches "*.x.com", "x.com" and "ax.com" do not. */
        return !is_ip && hl > sl + 1 && host[hl - sl - 1] == '.' &&
               memcmp(host + hl - sl, r->host, sl) == 0;
    }
    return false;
}

const struct egress_rule *egress_policy_match(const struct egress_policy *p, const char *host,
                                              bool is_ip, const struct egress_addr *addr,
                                              uint16_t port)
{
    for (size_t i = 0; i < p->nrules; i++) {
        if (rule_matches(&p->rules[i], host, is_ip, addr, port)) {
            return &p->rules[i];
        }
    }
    return NULL;
}

static bool own_address(const struct egress_policy *p, const struct egress_addr *a, uint16_t port)
{
    struct egress_addr ua = egress_addr_unmap(a);

    for (size_t i = 0; i < p->nown; i++) {
        struct egress_addr uo = egress_addr_unmap(&p->own[i].addr);
        if (p->own[i].port != 0 && p->own[i].port != port) {
            continue;
        }
        /* A listener on 0.0.0.0 or :: is reachable on every loopback address too. */
        if (egress_addr_equal(&ua, &uo) || (egress_addr_classify(&uo) == EGRESS_ADDR_UNSPECIFIED &&
                                            egress_addr_classify(&ua) == EGRESS_ADDR_LOOPBACK)) {
            return true;
        }
    }
    return false;
}

void egress_decide(struct egress_decision *out, const struct egress_policy *p, const char *host,
                   bool is_ip, const struct egress_addr *addr, uint16_t port,
                   const struct egress_addr *addrs, size_t n)
{
    const struct egress_rule *r = egress_policy_match(p, host, is_ip, addr, port);
    bool exception;

    out->allowed = false;
    out->rule = r;
    out->reason = "blocked-by-allowlist";
    if (r == NULL) {
        return;
    }
    if (n == 0) {
        out->reason = "no-addresses";
        return;
    }
    /* The test exception: the operator's explicit loopback literal:port, and only that
     * address. A repository's agent.yaml must never open the host's loopback services. */
    exception = r->origin == EGRESS_ORIGIN_SERVER && r->kind == EGRESS_RULE_IP &&
                r->port_explicit && is_ip &&
                egress_addr_classify(&r->addr) == EGRESS_ADDR_LOOPBACK && n == 1 &&
                egress_addr_equal(&addrs[0], &r->addr);
    for (size_t i = 0; i < n; i++) {
        enum egress_addr_class c = egress_addr_classify(&addrs[i]);
        if (own_address(p, &addrs[i], port)) {
            out->reason = "own-address";
            return;
        }
        if (c != EGRESS_ADDR_PUBLIC && !exception) {
            out->reason = egress_addr_class_reason(c);
            return;
        }
    }
    out->allowed = true;
    out->reason = "";
}
