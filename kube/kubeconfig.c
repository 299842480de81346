/* SPDX-License-Identifier: Apache-2.0 */
/* kubeconfig files over common/yamldoc: the current (or given) context, its
 * cluster (server, certificate-authority[-data], insecure-skip-tls-verify) and user (token,
 * tokenFile). Every way of authenticating we do not implement (exec plugins, auth providers,
 * client certificates, basic auth) is refused by name rather than silently ignored. */
#include "kube/kube_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/yamldoc.h"

struct kc {
    struct yamldoc *doc; /* borrowed */
    const char *name;    /* file name for messages; borrowed */
    const char *dir;     /* directory relative paths resolve against; borrowed */
};

/* NAME from the file, safe to put in a message: printable ASCII, at most 63 bytes. */
static void safe_copy(char out[64], const char *s)
{
    size_t i = 0;

    for (; s != NULL && s[i] != '\0' && i < 63; i++) {
        unsigned char ch = (unsigned char)s[i];
        out[i] = (ch >= 0x20 && ch < 0x7f && ch != '"') ? (char)ch : '?';
    }
    out[i] = '\0';
}

static const struct yamldoc_node *get(const struct kc *k, const struct yamldoc_node *map,
                                      const char *key)
{
    return yamldoc_get(k->doc, map, key);
}

/* The scalar text of N (NUL-terminated), or NULL when N is not a scalar or holds a NUL
 * byte. */
static const char *scalar(const struct yamldoc_node *n)
{
    if (n == NULL || yamldoc_kind(n) != YAMLDOC_SCALAR) {
        return NULL;
    }
    if (strlen(yamldoc_scalar(n)) != yamldoc_scalar_len(n)) {
        return NULL;
    }
    return yamldoc_scalar(n);
}

static const char *get_str(const struct kc *k, const struct yamldoc_node *map, const char *key)
{
    return scalar(get(k, map, key));
}

/* The ITEM mapping ("cluster", "context", "user") of the entry named NAME in the list
 * under LIST ("clusters", ...), or NULL. */
static const struct yamldoc_node *find_named(const struct kc *k, const char *list, const char *item,
                                             const char *name)
{
    const struct yamldoc_node *root = yamldoc_root(k->doc);
    const struct yamldoc_node *seq = get(k, root, list);

    if (seq == NULL || yamldoc_kind(seq) != YAMLDOC_SEQUENCE) {
        return NULL;
    }
    for (size_t i = 0; i < yamldoc_count(seq); i++) {
        const struct yamldoc_node *entry = yamldoc_item(k->doc, seq, i);
        const char *n = get_str(k, entry, "name");
        if (n != NULL && strcmp(n, name) == 0) {
            const struct yamldoc_node *m = get(k, entry, item);
            return (m != NULL && yamldoc_kind(m) == YAMLDOC_MAPPING) ? m : NULL;
        }
    }
    return NULL;
}

static char *resolve_path(const struct kc *k, const char *p)
{
    return p[0] == '/' ? xstrdup(p) : xasprintf("%s/%s", k->dir, p);
}

static int b64_value(unsigned char ch)
{
    if (ch >= 'A' && ch <= 'Z') {
        return ch - 'A';
    }
    if (ch >= 'a' && ch <= 'z') {
        return ch - 'a' + 26;
    }
    if (ch >= '0' && ch <= '9') {
        return ch - '0' + 52;
    }
    return ch == '+' ? 62 : ch == '/' ? 63 : -1;
}

/* Standard base64 with padding; whitespace is skipped. E_INVALID on anything else. */
int kube_base64_decode(char **out, size_t *len_out, const char *s)
{
    size_t n = strlen(s), o = 0, pad = 0;
    unsigned acc = 0;
    int bits = 0;
    char *d = xmalloc(n / 4 * 3 + 4);

    *out = NULL;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        int v;
        if (ch == ' ' || ch == '\n' || ch == '\r' || ch == '\t') {
            continue;
        }
        if (ch == '=') {
            pad++;
            continue;
        }
        v = b64_value(ch);
        if (v < 0 || pad > 0) {
            free(d);
            return E_INVALID;
        }
        acc = (acc << 6) | (unsigned)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            d[o++] = (char)((acc >> bits) & 0xff);
        }
    }
    if (pad > 2 || bits >= 6) {
        free(d);
        return E_INVALID;
    }
    d[o] = '\0';
    *out = d;
    *len_out = o;
    return E_OK;
}

static int refuse_user_keys(const struct kc *k, const struct yamldoc_node *user, const char *uname,
                            struct err *err)
{
    static const struct {
        const char *key;
        const char *what;
    } unsupported[] = {
        {"exec", "exec credential plugins"},
        {"auth-provider", "auth providers"},
        {"client-certificate", "client certificates"},
        {"client-certificate-data", "client certificates"},
        {"client-key", "client certificates"},
        {"client-key-data", "client certificates"},
        {"username", "basic auth"},
        {"password", "basic auth"},
        {"as", "impersonation"},
    };

    for (size_t i = 0; i < ARRAY_LEN(unsupported); i++) {
        if (get(k, user, unsupported[i].key) != NULL) {
            return err_set(err, E_INVALID,
                           "%s: user \"%s\": %s (%s) are not supported; use a bearer token "
                           "(token or tokenFile)",
                           k->name, uname, unsupported[i].what, unsupported[i].key);
        }
    }
    return E_OK;
}

static int load_user(struct kube_config *cfg, const struct kc *k, const char *uname_raw,
                     struct err *err)
{
    char uname[64];
    const struct yamldoc_node *user;
    const char *token, *file;

    safe_copy(uname, uname_raw);
    user = find_named(k, "users", "user", uname_raw);
    if (user == NULL) {
        return err_set(err, E_INVALID, "%s: user \"%s\" not found", k->name, uname);
    }
    if (refuse_user_keys(k, user, uname, err) != E_OK) {
        return err->code;
    }
    token = get_str(k, user, "token");
    file = get_str(k, user, "tokenFile");
    if (token != NULL && *token != '\0') {
        for (const char *p = token; *p != '\0'; p++) {
            if (*p <= 0x20 || *p >= 0x7f) {
                return err_set(err, E_INVALID, "%s: user \"%s\": token is not printable ascii",
                               k->name, uname);
            }
        }
        if (strlen(token) > KUBE_TOKEN_MAX) {
            return err_set(err, E_TOOBIG, "%s: user \"%s\": token too long", k->name, uname);
        }
        cfg->token = xstrdup(token);
    } else if (file != NULL && *file != '\0') {
        cfg->token_file = resolve_path(k, file);
    }
    return E_OK;
}

static int load_ca(struct kube_config *cfg, const struct kc *k, const struct yamldoc_node *cluster,
                   const char *cname, struct err *err)
{
    const char *data = get_str(k, cluster, "certificate-authority-data");
    const char *file = get_str(k, cluster, "certificate-authority");
    const char *insecure = get_str(k, cluster, "insecure-skip-tls-verify");

    cfg->insecure = insecure != NULL && strcmp(insecure, "true") == 0;
    if (data != NULL && *data != '\0') {
        if (strlen(data) > KUBE_CA_MAX) {
            return err_set(err, E_TOOBIG,
                           "%s: cluster \"%s\": certificate-authority-data too "
                           "large",
                           k->name, cname);
        }
        if (kube_base64_decode(&cfg->ca_data, &cfg->ca_len, data) != E_OK) {
            return err_set(err, E_INVALID,
                           "%s: cluster \"%s\": certificate-authority-data is "
                           "not base64",
                           k->name, cname);
        }
        if (cfg->ca_len == 0 || strstr(cfg->ca_data, "-----BEGIN CERTIFICATE-----") == NULL) {
            return err_set(err, E_INVALID,
                           "%s: cluster \"%s\": certificate-authority-data is "
                           "not a PEM certificate",
                           k->name, cname);
        }
    } else if (file != NULL && *file != '\0') {
        cfg->ca_file = resolve_path(k, file);
    }
    return E_OK;
}

static int load_cluster(struct kube_config *cfg, const struct kc *k, const char *cname_raw,
                        struct err *err)
{
    char cname[64];
    const struct yamldoc_node *cluster;
    const char *server;
    size_t n;

    safe_copy(cname, cname_raw);
    cluster = find_named(k, "clusters", "cluster", cname_raw);
    if (cluster == NULL) {
        return err_set(err, E_INVALID, "%s: cluster \"%s\" not found", k->name, cname);
    }
    if (get(k, cluster, "proxy-url") != NULL || get(k, cluster, "tls-server-name") != NULL) {
        return err_set(err, E_INVALID,
                       "%s: cluster \"%s\": proxy-url and tls-server-name are "
                       "not supported",
                       k->name, cname);
    }
    server = get_str(k, cluster, "server");
    if (server == NULL ||
        (strncmp(server, "https://", 8) != 0 && strncmp(server, "http://", 7) != 0)) {
        return err_set(err, E_INVALID, "%s: cluster \"%s\": server must be an http(s) url", k->name,
                       cname);
    }
    for (const char *p = server; *p != '\0'; p++) {
        if (*p <= 0x20 || *p >= 0x7f || *p == '?' || *p == '#') {
            return err_set(err, E_INVALID, "%s: cluster \"%s\": server is not a plain url", k->name,
                           cname);
        }
    }
    cfg->server = xstrdup(server);
    n = strlen(cfg->server);
    while (n > 0 && cfg->server[n - 1] == '/') {
        cfg->server[--n] = '\0';
    }
    return load_ca(cfg, k, cluster, cname, err);
}

static int load_context(struct kube_config *cfg, const struct kc *k, const char *want,
                        struct err *err)
{
    const struct yamldoc_node *root = yamldoc_root(k->doc);
    const char *cur = want != NULL ? want : get_str(k, root, "current-context");
    const struct yamldoc_node *ctx;
    const char *cluster, *user, *ns;
    char cname[64];
    int rc;

    if (cur == NULL || *cur == '\0') {
        return err_set(err, E_INVALID, "%s: no current-context", k->name);
    }
    safe_copy(cname, cur);
    ctx = find_named(k, "contexts", "context", cur);
    if (ctx == NULL) {
        return err_set(err, E_INVALID, "%s: context \"%s\" not found", k->name, cname);
    }
    cluster = get_str(k, ctx, "cluster");
    user = get_str(k, ctx, "user");
    ns = get_str(k, ctx, "namespace");
    if (cluster == NULL) {
        return err_set(err, E_INVALID, "%s: context \"%s\" names no cluster", k->name, cname);
    }
    rc = load_cluster(cfg, k, cluster, err);
    if (rc == E_OK && user != NULL && *user != '\0') {
        rc = load_user(cfg, k, user, err);
    }
    if (rc == E_OK && ns != NULL && *ns != '\0') {
        if (!kube_name_ok(ns)) {
            return err_set(err, E_INVALID, "%s: context \"%s\": namespace is not a dns label",
                           k->name, cname);
        }
        free(cfg->ns);
        cfg->ns = xstrdup(ns);
    }
    return rc;
}

int kube_config_load_kubeconfig(struct kube_config **out, const char *name, const char *dir,
                                const char *data, size_t len, const char *context, struct err *err)
{
    struct yamldoc_reader *reader = NULL;
    struct yamldoc_syntax syn = {0};
    struct yamldoc *doc = NULL;
    struct kube_config *cfg = NULL;
    struct kc k = {.doc = NULL, .name = name, .dir = dir};
    int rc;

    *out = NULL;
    if (len > KUBE_CONFIG_MAX) {
        return err_set(err, E_TOOBIG, "%s: larger than %u bytes", name, KUBE_CONFIG_MAX);
    }
    if (yamldoc_reader_new(&reader, data, len) != E_OK) {
        return err_set(err, E_FAIL, "libyaml: cannot initialise a parser");
    }
    if (yamldoc_next(&doc, reader, &syn) != E_OK) {
        rc = err_set(err, E_INVALID, "%s:%zu: malformed yaml", name, syn.line);
        yamldoc_reader_free(reader);
        return rc;
    }
    k.doc = doc;
    if (yamldoc_root(doc) == NULL || yamldoc_kind(yamldoc_root(doc)) != YAMLDOC_MAPPING) {
        rc = err_set(err, E_INVALID, "%s: not a kubeconfig (no top-level mapping)", name);
        goto out;
    }
    cfg = kube_config_new_empty();
    rc = load_context(cfg, &k, context, err);
    if (rc == E_OK) {
        *out = cfg;
        cfg = NULL;
    }
out:
    kube_config_free(cfg);
    yamldoc_free(doc);
    yamldoc_reader_free(reader);
    return rc;
}
