/* SPDX-License-Identifier: Apache-2.0 */
/* kubeconfig files over libyaml's document loader: the current (or given) context, its
 * cluster (server, certificate-authority[-data], insecure-skip-tls-verify) and user (token,
 * tokenFile). Every way of authenticating we do not implement (exec plugins, auth providers,
 * client certificates, basic auth) is refused by name rather than silently ignored. */
#include "kube/kube_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

struct kc {
    yaml_document_t *doc; /* borrowed */
    const char *name;     /* file name for messages; borrowed */
    const char *dir;      /* directory relative paths resolve against; borrowed */
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

static yaml_node_t *get(const struct kc *k, yaml_node_t *map, const char *key)
{
    if (map == NULL || map->type != YAML_MAPPING_NODE) {
        return NULL;
    }
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *kn = yaml_document_get_node(k->doc, p->key);
        if (kn != NULL && kn->type == YAML_SCALAR_NODE && strlen(key) == kn->data.scalar.length &&
            memcmp(kn->data.scalar.value, key, kn->data.scalar.length) == 0) {
            return yaml_document_get_node(k->doc, p->value);
        }
    }
    return NULL;
}

/* The scalar text of N (NUL-terminated by libyaml), or NULL when N is not a scalar or holds
 * a NUL byte. */
static const char *scalar(yaml_node_t *n)
{
    if (n == NULL || n->type != YAML_SCALAR_NODE) {
        return NULL;
    }
    if (strlen((const char *)n->data.scalar.value) != n->data.scalar.length) {
        return NULL;
    }
    return (const char *)n->data.scalar.value;
}

static const char *get_str(const struct kc *k, yaml_node_t *map, const char *key)
{
    return scalar(get(k, map, key));
}

/* The ITEM mapping ("cluster", "context", "user") of the entry named NAME in the list
 * under LIST ("clusters", ...), or NULL. */
static yaml_node_t *find_named(const struct kc *k, const char *list, const char *item,
                               const char *name)
{
    yaml_node_t *root = yaml_document_get_root_node(k->doc);
    yaml_node_t *seq = get(k, root, list);

    if (seq == NULL || seq->type != YAML_SEQUENCE_NODE) {
        return NULL;
    }
    for (yaml_node_item_t *i = seq->data.sequence.items.start; i < seq->data.sequence.items.top;
         i++) {
        yaml_node_t *entry = yaml_document_get_node(k->doc, *i);
        const char *n = get_str(k, entry, "name");
        if (n != NULL && strcmp(n, name) == 0) {
            yaml_node_t *m = get(k, entry, item);
            return (m != NULL && m->type == YAML_MAPPING_NODE) ? m : NULL;
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

static int refuse_user_keys(const struct kc *k, yaml_node_t *user, const char *uname,
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
    yaml_node_t *user;
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

static int load_ca(struct kube_config *cfg, const struct kc *k, yaml_node_t *cluster,
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
    yaml_node_t *cluster;
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
    yaml_node_t *root = yaml_document_get_root_node(k->doc);
    const char *cur = want != NULL ? want : get_str(k, root, "current-context");
    yaml_node_t *ctx;
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
    yaml_parser_t parser;
    yaml_document_t doc;
    struct kube_config *cfg = NULL;
    struct kc k = {.doc = &doc, .name = name, .dir = dir};
    int rc;

    *out = NULL;
    if (len > KUBE_CONFIG_MAX) {
        return err_set(err, E_TOOBIG, "%s: larger than %u bytes", name, KUBE_CONFIG_MAX);
    }
    if (!yaml_parser_initialize(&parser)) {
        return err_set(err, E_FAIL, "libyaml: cannot initialise a parser");
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)data, len);
    if (!yaml_parser_load(&parser, &doc)) {
        rc = err_set(err, E_INVALID, "%s:%zu: malformed yaml", name, parser.problem_mark.line + 1);
        yaml_parser_delete(&parser);
        return rc;
    }
    if (yaml_document_get_root_node(&doc) == NULL ||
        yaml_document_get_root_node(&doc)->type != YAML_MAPPING_NODE) {
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
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    return rc;
}
