/* SPDX-License-Identifier: Apache-2.0 */
/* Sandbox egress (SPEC §9 "Network", `--sandbox-network proxy`): the allowlist policy as a
 * pure function, the server's HTTP CONNECT proxy on a per-task unix socket, and the relay
 * the runner runs inside the sandbox (127.0.0.1:3128 → that unix socket). The policy
 * refuses loopback, link-local, private, CGNAT, unspecified, multicast, reserved and the
 * server's own addresses whatever the allowlist says; the one exception is an explicit
 * loopback IP literal rule with a port (`127.0.0.1:PORT`, for tests) that came from the
 * operator's `--sandbox-allow-host`, never one from a task or its repository. */
#ifndef DIVERGE_EGRESS_EGRESS_H
#define DIVERGE_EGRESS_EGRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/clock.h"
#include "common/err.h"

#define EGRESS_HOST_MAX 253     /* bytes of a normalised host name (DNS limit) */
#define EGRESS_HOSTPORT_MAX 300 /* bytes of "host:port" / "[v6]:port" / "*.x:port", NUL incl. */
#define EGRESS_DEFAULT_PORT 443 /* port of a rule that names none */
#define EGRESS_ADDRS_MAX 16     /* resolved addresses checked (and tried) per request */
#define EGRESS_HEADER_MAX 8192  /* bytes of a CONNECT request head, CRLFCRLF included */
#define EGRESS_RULES_MAX 256    /* rules per policy */
#define EGRESS_LINE_MAX 512     /* bytes of one formatted egress log line, NUL incl. */

/* An IP address: FAMILY is 4 or 6; BYTES holds 4 or 16 bytes in network order. */
struct egress_addr {
    int family;        /* 4 or 6 */
    uint8_t bytes[16]; /* the first 4 for IPv4 */
};

/* Parses a bare IPv4 dotted quad or IPv6 literal (no brackets, no port, no zone) into
 * OUT. Returns E_INVALID otherwise. */
int egress_addr_parse(struct egress_addr *out, const char *s);

/* Formats A as "1.2.3.4" or "::1" (no brackets) into OUT (at least 46 bytes). */
void egress_addr_format(char *out, size_t cap, const struct egress_addr *a);

/* Why an address may not be reached; EGRESS_ADDR_PUBLIC is the only reachable class.
 * IPv4-mapped, IPv4-compatible, NAT64 and 6to4 IPv6 addresses take the class of the
 * IPv4 address they embed. */
enum egress_addr_class {
    EGRESS_ADDR_PUBLIC,
    EGRESS_ADDR_LOOPBACK,    /* 127/8, ::1 */
    EGRESS_ADDR_LINK_LOCAL,  /* 169.254/16 (metadata), fe80::/10 */
    EGRESS_ADDR_PRIVATE,     /* 10/8, 172.16/12, 192.168/16, fc00::/7, fec0::/10 */
    EGRESS_ADDR_CGNAT,       /* 100.64/10 */
    EGRESS_ADDR_UNSPECIFIED, /* 0/8, :: */
    EGRESS_ADDR_MULTICAST,   /* 224/4, ff00::/8 */
    EGRESS_ADDR_RESERVED,    /* 240/4, broadcast, 192.0.0/24, 198.18/15, docs, Teredo */
};

/* The class of A (pure). */
enum egress_addr_class egress_addr_classify(const struct egress_addr *a);

/* The X-Proxy-Error token of a class ("loopback-address", ...); "" for PUBLIC. */
const char *egress_addr_class_reason(enum egress_addr_class c);

/* An allowlist rule, parsed from `--sandbox-allow-host` or `sandbox.allowedHosts`. */
enum egress_rule_kind {
    EGRESS_RULE_EXACT,  /* host name, matched whole */
    EGRESS_RULE_SUFFIX, /* "*.suffix": strict subdomains of suffix, never the apex */
    EGRESS_RULE_IP,     /* IP literal, matched only by the same literal */
};

/* Who wrote a rule. Only the operator's rules may open the loopback exception; the zero
 * value is the untrusted origin, so a rule whose origin nobody set gets no exception. */
enum egress_rule_origin {
    EGRESS_ORIGIN_TASK,   /* spec.sandbox.allowedHosts: the task's caller or its repository */
    EGRESS_ORIGIN_SERVER, /* --sandbox-allow-host / DIVERGE_SANDBOX_ALLOW_HOSTS */
};

struct egress_rule {
    enum egress_rule_kind kind;
    enum egress_rule_origin origin; /* set by egress_policy_add_rule*, not by parsing */
    char host[EGRESS_HOST_MAX + 1]; /* normalised: lower case, no trailing dot; for SUFFIX
                                       the part after "*."; for IP the canonical literal */
    struct egress_addr addr;        /* IP only */
    uint16_t port;                  /* 1..65535; EGRESS_DEFAULT_PORT when not given */
    bool port_explicit;             /* the rule named its port */
    char text[EGRESS_HOSTPORT_MAX]; /* canonical form for log lines: "*.x.com:443" */
};

/* Parses one rule: `host`, `*.suffix`, an IPv4 literal or a bracketed IPv6 literal
 * (`[::1]`), each optionally followed by `:port`; case-insensitive, one trailing dot
 * dropped. Returns E_INVALID (message never echoes the input) otherwise. */
int egress_rule_parse(struct egress_rule *out, const char *s, size_t len, struct err *err);

/* Normalises a requested host (from a CONNECT line: name, IPv4, or IPv6 with or without
 * brackets) into OUT (EGRESS_HOST_MAX + 1 bytes): lower case, trailing dot dropped, IP
 * literals canonical without brackets. *IS_IP_OUT tells whether it is an IP literal (then
 * *ADDR_OUT holds it). Names that glibc would read as numeric IPv4 ("127.1", "0x7f.1")
 * are E_INVALID, as is anything that is not a valid host name. */
int egress_host_normalise(char *out, bool *is_ip_out, struct egress_addr *addr_out,
                          const char *host, size_t len);

/* The allowlist plus the server's own addresses. Built once, then read-only: concurrent
 * egress_decide() calls on one policy are safe. */
struct egress_policy;

/* On success *OUT is an empty policy (denies everything) the caller frees with
 * egress_policy_free(). */
void egress_policy_new(struct egress_policy **out);
void egress_policy_free(struct egress_policy *p);
/* A deep copy; caller frees with egress_policy_free(). */
struct egress_policy *egress_policy_dup(const struct egress_policy *p);

/* Adds a rule (see egress_rule_parse) written by ORIGIN. E_INVALID, or E_TOOBIG past
 * EGRESS_RULES_MAX. */
int egress_policy_add_rule(struct egress_policy *p, const char *rule,
                           enum egress_rule_origin origin, struct err *err);

/* Adds the comma-separated rules of S (`DIVERGE_SANDBOX_ALLOW_HOSTS`), written by ORIGIN;
 * empty items are skipped. Same codes as egress_policy_add_rule; on error no rule of S is
 * kept. */
int egress_policy_add_rules_csv(struct egress_policy *p, const char *s,
                                enum egress_rule_origin origin, struct err *err);

/* Adds one of the server's own addresses, always refused (even under the loopback
 * exception); PORT 0 means every port. The server passes its listen address and port as
 * configured (an unspecified 0.0.0.0 or :: stands for every loopback address too) and
 * every address of its interfaces (egress_policy_add_own_interfaces). */
void egress_policy_add_own(struct egress_policy *p, const struct egress_addr *a, uint16_t port);

/* Adds the addresses of every local interface (getifaddrs) as own addresses, every port,
 * except loopback ones (refused by class anyway; the caller adds its loopback listener
 * with egress_policy_add_own and its port). E_FAIL when they cannot be listed. */
int egress_policy_add_own_interfaces(struct egress_policy *p, struct err *err);

/* Number of rules. */
size_t egress_policy_rule_count(const struct egress_policy *p);

/* The outcome of one request. */
struct egress_decision {
    bool allowed;
    const struct egress_rule *rule; /* the matching rule (borrowed from the policy), or NULL */
    const char *reason;             /* static X-Proxy-Error token when denied, else "" */
};

/* The first rule matching the normalised HOST (IS_IP/ADDR as from egress_host_normalise)
 * and PORT, or NULL. Pure; the proxy calls it before resolving, so names outside the
 * allowlist are never looked up. */
const struct egress_rule *egress_policy_match(const struct egress_policy *p, const char *host,
                                              bool is_ip, const struct egress_addr *addr,
                                              uint16_t port);

/* The decision for a request to HOST:PORT (normalised, as for egress_policy_match) whose
 * resolution gave ADDRS (N of them). Allowed only when a rule matches, N > 0 and every
 * address is public and not an own address — except that an EGRESS_RULE_IP loopback rule
 * of EGRESS_ORIGIN_SERVER with an explicit port, requested by that very literal and port,
 * allows exactly that address (still not an own address). Pure. */
void egress_decide(struct egress_decision *out, const struct egress_policy *p, const char *host,
                   bool is_ip, const struct egress_addr *addr, uint16_t port,
                   const struct egress_addr *addrs, size_t n);

/* A parsed CONNECT request head. */
struct egress_connect_req {
    char host[EGRESS_HOST_MAX + 1]; /* normalised (egress_host_normalise) */
    bool is_ip;                     /* host is an IP literal */
    struct egress_addr addr;        /* when is_ip */
    uint16_t port;                  /* 1..65535 */
    size_t head_len;                /* bytes of the head, CRLFCRLF included */
};

/* Parses the first LEN bytes received on a proxy connection. Returns
 * - E_OK: a complete `CONNECT host:port HTTP/1.x` head (OUT filled);
 * - E_AGAIN: incomplete so far, within MAX bytes;
 * - E_TOOBIG: MAX bytes and still no end of head (431);
 * - E_DENIED: a well-formed request line whose method is not CONNECT (405);
 * - E_INVALID: anything else (400).
 * The header fields after the request line are skipped (only checked for NUL bytes). */
int egress_connect_parse(struct egress_connect_req *out, const char *buf, size_t len, size_t max);

/* What the log callback is told. */
enum egress_event_kind {
    EGRESS_EVENT_DECISION, /* after the policy decided (and, if allowed, connected) */
    EGRESS_EVENT_CLOSE,    /* an allowed tunnel closed */
};

struct egress_event {
    enum egress_event_kind kind;
    int64_t time_ms;      /* wall clock, epoch ms */
    const char *hostport; /* "host:port", "[v6]:port", or "-" when the request had none */
    bool allowed;
    const char *rule;   /* canonical rule text, or "" */
    const char *reason; /* X-Proxy-Error token when denied (or connect failure), else "" */
    uint64_t bytes_out; /* CLOSE: sandbox → remote */
    uint64_t bytes_in;  /* CLOSE: remote → sandbox */
    const char *line;   /* the whole egress line, RFC 3339 time first, no newline */
    const char *body;   /* LINE after its time and space, for logs that add their own */
};

/* Called for every event, from the proxy's threads (possibly concurrently): must be
 * thread-safe and must not call back into the proxy. EV and its strings are borrowed for
 * the call. */
typedef void (*egress_log_fn)(const struct egress_event *ev, void *userdata);

/* Formats EV's line (ignoring ev->line/body) into OUT (EGRESS_LINE_MAX bytes); returns the
 * offset of the body. Example lines:
 *   2026-11-30T08:00:00Z egress api.github.com:443 allowed rule=*.github.com:443
 *   2026-11-30T08:00:00Z egress localhost:3000 denied reason=blocked-by-allowlist
 *   2026-11-30T08:00:09Z egress api.github.com:443 closed rule=*.github.com:443 bytes_out=517
 * bytes_in=4242 */
size_t egress_event_format(char *out, const struct egress_event *ev);

/* Resolver hook (tests): fills up to MAX addresses of HOST into OUT, *N_OUT of them.
 * Returns E_OK, or E_NOTFOUND / E_FAIL. The default is getaddrinfo. */
typedef int (*egress_resolve_fn)(struct egress_addr *out, size_t max, size_t *n_out,
                                 const char *host, void *userdata);

struct egress_proxy_opts {
    const char *socket_path;            /* unix socket to create (removed on stop); required */
    unsigned socket_mode;               /* chmod of the socket after bind */
    const struct egress_policy *policy; /* copied at open; required */
    egress_log_fn log;                  /* may be NULL */
    void *log_userdata;
    unsigned max_tunnels;      /* concurrent connections; more get 503 */
    int header_timeout_ms;     /* deadline for the whole request head (408) */
    int connect_timeout_ms;    /* deadline for the upstream connect (502) */
    size_t header_max;         /* request head cap (431), at most EGRESS_HEADER_MAX */
    egress_resolve_fn resolve; /* NULL: getaddrinfo */
    void *resolve_userdata;
    const struct clock *clock; /* NULL: clock_system() */
};

#define EGRESS_PROXY_OPTS_DEFAULTS                                                                 \
    {                                                                                              \
        .socket_path = NULL, .socket_mode = 0600, .policy = NULL, .log = NULL,                     \
        .log_userdata = NULL, .max_tunnels = 32, .header_timeout_ms = 10000,                       \
        .connect_timeout_ms = 10000, .header_max = EGRESS_HEADER_MAX, .resolve = NULL,             \
        .resolve_userdata = NULL, .clock = NULL                                                    \
    }

struct egress_proxy;

/* Creates the socket at opts->socket_path (a stale socket there is replaced; any other
 * file is E_CONFLICT) and starts serving it on a thread of its own. On success *OUT is a
 * proxy the caller stops with egress_proxy_stop(). Returns E_INVALID (bad options),
 * E_CONFLICT or E_FAIL. */
int egress_proxy_open(struct egress_proxy **out, const struct egress_proxy_opts *opts,
                      struct err *err);

/* Closes the socket and removes its path, ends every tunnel, joins every thread and frees
 * P. NULL is a no-op. Not to be called from the log callback. */
void egress_proxy_stop(struct egress_proxy *p);

/* A loopback TCP listener whose every accepted connection is handed to a handler on a
 * thread of its own, at most CONNS_MAX at once (further connections are closed at once).
 * The in-sandbox relays share it: the egress relay below and the runner's LLM relay. */
struct egress_listener;

/* Handles one accepted connection FD (borrowed: closed by the listener after the call).
 * STOP_FD becomes readable when the listener stops: a handler that waits on anything
 * polls it too and returns soon after. */
typedef void (*egress_conn_fn)(int fd, int stop_fd, void *userdata);

/* Binds LISTEN_IP:PORT (IPv4 or IPv6 literal; PORT 0 picks one, see egress_listener_port).
 * HANDLER(fd, stop_fd, USERDATA) runs for each connection once egress_listener_run
 * serves. On success *OUT is a listener the caller frees with egress_listener_free().
 * E_CONFLICT when the port is taken, E_INVALID or E_FAIL otherwise. */
int egress_listener_open(struct egress_listener **out, const char *listen_ip, uint16_t port,
                         size_t conns_max, egress_conn_fn handler, void *userdata, struct err *err);

/* The bound TCP port. */
uint16_t egress_listener_port(const struct egress_listener *l);

/* Serves until egress_listener_stop(); then joins every handler thread (each sees its
 * STOP_FD readable) before returning E_OK. E_FAIL when polling fails for good. */
int egress_listener_run(struct egress_listener *l, struct err *err);

/* Makes egress_listener_run return; safe from another thread and from a signal handler. */
void egress_listener_stop(struct egress_listener *l);

/* Frees L (after egress_listener_run returned, or if it never ran). NULL is a no-op. */
void egress_listener_free(struct egress_listener *l);

/* The in-sandbox relay: TCP on a loopback address → a new connection to the proxy's unix
 * socket per accepted connection, bytes copied both ways (half-closes passed on). */
struct egress_relay;

#define EGRESS_RELAY_PORT 3128      /* where HTTPS_PROXY points inside the sandbox */
#define EGRESS_RELAY_CONNS_MAX 64   /* concurrent relayed connections; more are closed */
#define EGRESS_RELAY_SOCKET_MAX 108 /* bytes of a unix socket path, NUL included (sun_path) */

/* The relay's connection handler (an egress_conn_fn, for a listener of one's own): copies
 * FD both ways to a new connection to the unix socket whose path USERDATA is (a string
 * shorter than EGRESS_RELAY_SOCKET_MAX, borrowed) until both sides are done or STOP_FD is
 * readable. A socket that cannot be reached just closes FD. */
void egress_relay_conn(int fd, int stop_fd, void *userdata);

/* Binds LISTEN_IP:PORT (IPv4 or IPv6 literal; PORT 0 picks one, see egress_relay_port)
 * and records UNIX_PATH. On success *OUT is a relay the caller frees with
 * egress_relay_free(). E_INVALID or E_FAIL. */
int egress_relay_open(struct egress_relay **out, const char *listen_ip, uint16_t port,
                      const char *unix_path, struct err *err);

/* The bound TCP port. */
uint16_t egress_relay_port(const struct egress_relay *r);

/* Serves until egress_relay_stop(); then closes every relayed connection and joins its
 * threads before returning E_OK. E_FAIL when accepting fails for good. */
int egress_relay_run(struct egress_relay *r, struct err *err);

/* Makes egress_relay_run return; safe from another thread and from a signal handler. */
void egress_relay_stop(struct egress_relay *r);

/* Frees R (after egress_relay_run returned, or if it never ran). NULL is a no-op. */
void egress_relay_free(struct egress_relay *r);

/* egress_relay_open + egress_relay_run + egress_relay_free, for the runner: serves
 * LISTEN_IP:PORT → UNIX_PATH until the process ends. */
int egress_relay_serve(const char *listen_ip, uint16_t port, const char *unix_path,
                       struct err *err);

#endif
