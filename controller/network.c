/* SPDX-License-Identifier: Apache-2.0 */
/* Network `proxy` of sandboxes (SPEC §9 "Network"): the server flags, the per-task egress
 * proxy (egress/) on a unix socket in <data-dir>/egress/<random>/proxy.sock whose
 * directory the sandbox sees read-only at /diverge/egress, its allowlist (the server's
 * --sandbox-allow-host rules plus spec.sandbox.allowedHosts, each rule tagged with its
 * origin), the egress lines it writes
 * to the task log, and the proxy variables of the sandbox environment. The sandbox
 * provider owns a started proxy (sandbox.h): it goes with the sandbox. */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "controller/controller_int.h"
#include "egress/egress.h"

#define RELAY_URL "http://127.0.0.1:3128" /* the runner's relay inside (EGRESS_RELAY_PORT) */

/* The proxy's log callback: one egress line per decision (and per closed tunnel). */
static void log_line(const struct egress_event *ev, void *userdata)
{
    const struct sandbox_egress *e = userdata;

    sandbox_log_write(e->log_path, e->log_cap, ev->body, strlen(ev->body));
}

static char *egress_root(const struct controller *c)
{
    return xasprintf("%s/egress", c->data_dir);
}

int controller_egress_init(struct controller *c, const struct controller_config *cfg,
                           struct err *err)
{
    const char *net = cfg->network;

    if (net != NULL && strcmp(net, "none") != 0 && strcmp(net, "proxy") != 0) {
        return err_set(err, E_INVALID, "--sandbox-network must be none or proxy");
    }
    c->network_proxy = net != NULL && strcmp(net, "proxy") == 0;
    egress_policy_new(&c->egress_policy);
    if (cfg->allow_hosts != NULL) {
        struct err perr = {0};
        if (egress_policy_add_rules_csv(c->egress_policy, cfg->allow_hosts, EGRESS_ORIGIN_SERVER,
                                        &perr) != E_OK) {
            return err_set(err, E_INVALID, "--sandbox-allow-host: %s", perr.msg);
        }
    }
    char *root = egress_root(c);
    sandbox_socket_sweep(root, SANDBOX_EGRESS_SOCKET);
    free(root);
    return E_OK;
}

void controller_egress_cleanup(struct controller *c)
{
    egress_policy_free(c->egress_policy);
    c->egress_policy = NULL;
}

/* Splits LISTEN into a host (brackets dropped) and a port. */
static int split_listen(char *host, size_t cap, uint16_t *port, const char *listen)
{
    const char *colon = strrchr(listen, ':'), *h = listen;
    size_t hlen;
    char *end = NULL;
    long v;

    if (colon == NULL) {
        return E_INVALID;
    }
    hlen = (size_t)(colon - listen);
    if (hlen >= 2 && listen[0] == '[' && listen[hlen - 1] == ']') {
        h++;
        hlen -= 2;
    }
    errno = 0;
    v = strtol(colon + 1, &end, 10);
    if (hlen >= cap || errno != 0 || end == colon + 1 || *end != '\0' || v < 0 || v > 65535) {
        return E_INVALID;
    }
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    *port = (uint16_t)v;
    return E_OK;
}

/* Adds every address HOST resolves to as an own address on PORT. */
static int add_resolved(struct controller *c, const char *host, uint16_t port, struct err *err)
{
    struct addrinfo hints, *res = NULL;

    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_ADDRCONFIG;
    if (getaddrinfo(host, NULL, &hints, &res) != 0) {
        return err_set(err, E_INVALID, "cannot resolve the listen address");
    }
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        char text[64];
        struct egress_addr a;
        if (getnameinfo(ai->ai_addr, ai->ai_addrlen, text, sizeof(text), NULL, 0, NI_NUMERICHOST) ==
                0 &&
            egress_addr_parse(&a, text) == E_OK) {
            egress_policy_add_own(c->egress_policy, &a, port);
        }
    }
    freeaddrinfo(res);
    return E_OK;
}

/* Adds the listener LISTEN ("host:port") as an own address on its port. */
static int add_listener(struct controller *c, const char *listen, struct err *err)
{
    char host[EGRESS_HOST_MAX + 1];
    struct egress_addr a;
    uint16_t port = 0;

    if (split_listen(host, sizeof(host), &port, listen) != E_OK) {
        return err_set(err, E_INVALID, "the listen address is not host:port");
    }
    if (host[0] == '\0') {
        memcpy(host, "0.0.0.0", sizeof("0.0.0.0"));
    }
    if (egress_addr_parse(&a, host) == E_OK) {
        egress_policy_add_own(c->egress_policy, &a, port);
        return E_OK;
    }
    return add_resolved(c, host, port, err);
}

int controller_egress_own(struct controller *c, const char *const *listens, struct err *err)
{
    struct err ierr = {0};
    int rc = E_OK;

    for (size_t i = 0; rc == E_OK && listens[i] != NULL; i++) {
        rc = add_listener(c, listens[i], err);
    }
    if (rc == E_OK && egress_policy_add_own_interfaces(c->egress_policy, &ierr) != E_OK) {
        log_kv(LOG_WARN, "egress_own_addresses", "error", ierr.msg, NULL);
    }
    return rc;
}

/* Adds spec.sandbox.allowedHosts of SANDBOX to P; entries the egress parser refuses are
 * skipped (they could only allow less) and said in the task log. */
static void add_spec_rules(struct egress_policy *p, const json_t *sandbox, const char *log_path)
{
    const json_t *hosts = json_object_get(sandbox, "allowedHosts"), *v;
    size_t i;

    json_array_foreach(hosts, i, v)
    {
        struct err err = {0};
        if (!json_is_string(v) ||
            egress_policy_add_rule(p, json_string_value(v), EGRESS_ORIGIN_TASK, &err) != E_OK) {
            sandbox_log_event(log_path,
                              "[diverge] network proxy: sandbox.allowedHosts entry %zu "
                              "skipped: %s",
                              i, err.msg[0] != '\0' ? err.msg : "not a string");
        }
    }
}

/* Opens the proxy of E (dir and log set) with POLICY. */
static int open_proxy(struct sandbox_egress *e, struct controller *c,
                      const struct egress_policy *policy, struct err *err)
{
    struct egress_proxy_opts o = EGRESS_PROXY_OPTS_DEFAULTS;
    char *sock = xasprintf("%s/%s", e->dir, SANDBOX_EGRESS_SOCKET);
    int rc;

    o.socket_path = sock;
    o.policy = policy;
    o.log = log_line;
    o.log_userdata = e;
    rc = egress_proxy_open(&e->proxy, &o, err);
    if (rc == E_OK) {
        controller_expose_socket(c, sock); /* the sandbox user connects to it */
    }
    free(sock);
    return rc;
}

/* The proxy variables (SPEC §9), upper and lower case. */
static void proxy_env(char **env, size_t *n, const char *sock)
{
    static const char *const names[] = {"HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY",
                                        "https_proxy", "http_proxy", "all_proxy"};

    env[(*n)++] = xasprintf("DIVERGE_EGRESS_SOCKET=%s", sock);
    for (size_t i = 0; i < ARRAY_LEN(names); i++) {
        env[(*n)++] = xasprintf("%s=" RELAY_URL, names[i]);
    }
    env[(*n)++] = xstrdup("NO_PROXY=localhost,127.0.0.1,::1");
    env[(*n)++] = xstrdup("no_proxy=localhost,127.0.0.1,::1");
}

bool controller_egress_none(const struct controller *c, const struct reconcile *r)
{
    const char *net = json_string_value(json_object_get(r->sandbox, "network"));

    return !(net != NULL ? strcmp(net, "proxy") == 0 : c->network_proxy);
}

int controller_egress_open(struct sandbox_egress **out, struct controller *c,
                           const struct reconcile *r, const char *log_path, char **env, size_t *n,
                           struct err *err)
{
    const char *net = json_string_value(json_object_get(r->sandbox, "network"));
    bool asked = net != NULL ? strcmp(net, "proxy") == 0 : c->network_proxy;
    /* The operator's --sandbox-network none is a ceiling: a task (or the repository's
     * agent.yaml behind it) may ask for less network, never for more. */
    bool proxy = asked && c->network_proxy;
    bool inside = strcmp(c->provider, "local") == 0;
    struct egress_policy *policy;
    struct sandbox_egress *e;
    size_t rules;
    int rc;

    *out = NULL;
    env[(*n)++] = xasprintf("DIVERGE_SANDBOX_NETWORK=%s", proxy ? "proxy" : "none");
    env[*n] = NULL;
    if (asked && !proxy) {
        sandbox_log_event(log_path, "[diverge] network none: sandbox.network proxy ignored "
                                    "(the server runs with --sandbox-network none)");
    }
    if (!proxy) {
        return E_OK;
    }
    policy = egress_policy_dup(c->egress_policy);
    add_spec_rules(policy, r->sandbox, log_path);
    rules = egress_policy_rule_count(policy);
    e = xcalloc(1, sizeof(*e));
    e->log_path = xstrdup(log_path);
    e->log_cap = c->log_cap;
    rc = controller_socket_dir(&e->dir, c, "egress", err);
    if (rc == E_OK) {
        rc = open_proxy(e, c, policy, err);
    }
    egress_policy_free(policy);
    if (rc != E_OK) {
        sandbox_egress_free(e);
        return rc;
    }
    if (inside) {
        proxy_env(env, n, SANDBOX_IN_EGRESS_DIR "/" SANDBOX_EGRESS_SOCKET);
    } else {
        char *sock = xasprintf("%s/%s", e->dir, SANDBOX_EGRESS_SOCKET);
        proxy_env(env, n, sock);
        free(sock);
    }
    env[*n] = NULL;
    sandbox_log_event(log_path,
                      "[diverge] network proxy: egress only through the server's proxy "
                      "(%zu allowlist rule%s)%s",
                      rules, rules == 1 ? "" : "s",
                      inside ? ""
                             : "; WARNING: provider process has no network isolation and "
                               "the runner's relay binds the host's 127.0.0.1:3128");
    *out = e;
    return E_OK;
}
