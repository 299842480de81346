/* SPDX-License-Identifier: Apache-2.0 */
/* Where the API server is: the loader order (flag, $KUBECONFIG, in-cluster, ~/.kube/config),
 * the in-cluster service account, and the bearer token, re-read from its file whenever the
 * file changes so a rotated service-account token is picked up without a restart. */
#include "kube/kube_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct kube_config *kube_config_new_empty(void)
{
    struct kube_config *cfg = xcalloc(1, sizeof(*cfg));

    if (pthread_mutex_init(&cfg->mu, NULL) != 0) {
        abort();
    }
    cfg->ns = xstrdup("default");
    return cfg;
}

static void wipe_free(char *s)
{
    if (s != NULL) {
        volatile char *p = s;
        for (size_t i = 0; p[i] != '\0'; i++) {
            p[i] = 0;
        }
        free(s);
    }
}

void kube_config_free(struct kube_config *cfg)
{
    if (cfg == NULL) {
        return;
    }
    free(cfg->server);
    free(cfg->ns);
    free(cfg->ca_file);
    free(cfg->ca_data);
    wipe_free(cfg->token);
    free(cfg->token_file);
    wipe_free(cfg->token_cache);
    pthread_mutex_destroy(&cfg->mu);
    free(cfg);
}

const char *kube_config_server(const struct kube_config *cfg)
{
    return cfg->server;
}

const char *kube_config_namespace(const struct kube_config *cfg)
{
    return cfg->ns;
}

int kube_read_file(char **out, size_t *len_out, const char *path, size_t max, struct err *err)
{
    struct buf b;
    char chunk[8192];
    int fd, rc = E_OK;

    *out = NULL;
    *len_out = 0;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return err_set(err, errno == ENOENT ? E_NOTFOUND : E_FAIL, "%s: %s", path, strerror(errno));
    }
    buf_init(&b, max);
    for (;;) {
        ssize_t n = read(fd, chunk, sizeof(chunk));
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            rc = err_set(err, E_FAIL, "%s: %s", path, strerror(errno));
            break;
        }
        if (n == 0) {
            break;
        }
        if (buf_append(&b, chunk, (size_t)n) != E_OK) {
            rc = err_set(err, E_TOOBIG, "%s: larger than %zu bytes", path, max);
            break;
        }
    }
    close(fd);
    if (rc != E_OK) {
        buf_cleanup(&b);
        return rc;
    }
    *len_out = b.len;
    *out = buf_take(&b);
    return E_OK;
}

/* Drops trailing whitespace (a token or namespace file usually ends in a newline). */
static void trim_right(char *s)
{
    size_t n = strlen(s);

    while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ' || s[n - 1] == '\t')) {
        s[--n] = '\0';
    }
}

/* A bearer token goes into a header line: printable ASCII only. */
static bool token_ok(const char *t, size_t len)
{
    if (len == 0 || strlen(t) != len) {
        return false;
    }
    for (size_t i = 0; i < len; i++) {
        if (t[i] <= 0x20 || t[i] >= 0x7f) {
            return false;
        }
    }
    return true;
}

static bool same_file_state(const struct stat *a, const struct stat *b)
{
    return a->st_ino == b->st_ino && a->st_dev == b->st_dev && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

static int reread_token(struct kube_config *cfg, struct err *err)
{
    struct stat st;
    char *data = NULL;
    size_t len = 0;
    int rc;

    /* stat follows the symlink kubelet swaps (..data), so a rotation shows up here. */
    if (stat(cfg->token_file, &st) != 0) {
        return err_set(err, E_FAIL, "token file %s: %s", cfg->token_file, strerror(errno));
    }
    if (cfg->token_cache != NULL && same_file_state(&st, &cfg->token_st)) {
        return E_OK;
    }
    rc = kube_read_file(&data, &len, cfg->token_file, KUBE_TOKEN_MAX, err);
    if (rc != E_OK) {
        return rc == E_NOTFOUND ? err_set(err, E_FAIL, "token file %s is gone", cfg->token_file)
                                : rc;
    }
    trim_right(data);
    if (!token_ok(data, strlen(data))) {
        wipe_free(data);
        return err_set(err, E_FAIL, "token file %s does not hold a token", cfg->token_file);
    }
    wipe_free(cfg->token_cache);
    cfg->token_cache = data;
    cfg->token_st = st;
    return E_OK;
}

int kube_config_token_dup(char **out, struct kube_config *cfg, struct err *err)
{
    int rc = E_OK;

    *out = NULL;
    if (cfg->token_file == NULL) {
        *out = cfg->token != NULL ? xstrdup(cfg->token) : NULL;
        return E_OK;
    }
    pthread_mutex_lock(&cfg->mu);
    rc = reread_token(cfg, err);
    if (rc == E_OK) {
        *out = xstrdup(cfg->token_cache);
    }
    pthread_mutex_unlock(&cfg->mu);
    return rc;
}

static bool host_ok(const char *h)
{
    size_t n = strlen(h);

    if (n == 0 || n > 253) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        char ch = h[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '-' || ch == ':')) {
            return false;
        }
    }
    return true;
}

static bool port_ok(const char *p)
{
    char *end = NULL;
    long v;

    if (p == NULL || *p < '0' || *p > '9') {
        return false;
    }
    errno = 0;
    v = strtol(p, &end, 10);
    return errno == 0 && *end == '\0' && v >= 1 && v <= 65535;
}

/* Reads SA_DIR/namespace when present (an invalid one is an error, an absent one is not). */
static int read_sa_namespace(struct kube_config *cfg, const char *sa_dir, struct err *err)
{
    char *path = xasprintf("%s/namespace", sa_dir), *data = NULL;
    size_t len = 0;
    int rc = kube_read_file(&data, &len, path, 256, err);

    if (rc == E_NOTFOUND) {
        err_clear(err);
        rc = E_OK;
    } else if (rc == E_OK) {
        trim_right(data);
        if (!kube_name_ok(data)) {
            rc = err_set(err, E_INVALID, "%s does not hold a namespace name", path);
        } else {
            free(cfg->ns);
            cfg->ns = data;
            data = NULL;
        }
    }
    free(data);
    free(path);
    return rc;
}

int kube_config_load_incluster(struct kube_config **out, const char *sa_dir, const char *host,
                               const char *port, struct err *err)
{
    struct kube_config *cfg = NULL;
    char *ca = NULL;
    int rc;

    *out = NULL;
    if (host == NULL || !host_ok(host) || !port_ok(port)) {
        return err_set(err, E_INVALID,
                       "KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT are not a host and port");
    }
    cfg = kube_config_new_empty();
    cfg->server = strchr(host, ':') != NULL ? xasprintf("https://[%s]:%s", host, port)
                                            : xasprintf("https://%s:%s", host, port);
    cfg->token_file = xasprintf("%s/token", sa_dir);
    rc = kube_config_token_dup(&ca, cfg, err); /* the token must be readable now */
    if (rc != E_OK) {
        rc = access(cfg->token_file, F_OK) != 0
                 ? err_set(err, E_NOTFOUND, "no service account token at %s", cfg->token_file)
                 : rc;
        goto out;
    }
    wipe_free(ca);
    ca = xasprintf("%s/ca.crt", sa_dir);
    if (access(ca, R_OK) == 0) {
        cfg->ca_file = ca;
        ca = NULL;
    }
    rc = read_sa_namespace(cfg, sa_dir, err);
    if (rc == E_OK) {
        *out = cfg;
        cfg = NULL;
    }
out:
    free(ca);
    kube_config_free(cfg);
    return rc;
}

static int load_kubeconfig_file(struct kube_config **out, const char *path, struct err *err)
{
    char *data = NULL, *dir = xstrdup(path), *slash = strrchr(dir, '/');
    size_t len = 0;
    int rc;

    if (slash == NULL) {
        free(dir);
        dir = xstrdup(".");
    } else if (slash == dir) {
        slash[1] = '\0';
    } else {
        *slash = '\0';
    }
    rc = kube_read_file(&data, &len, path, KUBE_CONFIG_MAX, err);
    if (rc == E_OK) {
        rc = kube_config_load_kubeconfig(out, path, dir, data, len, NULL, err);
    }
    free(data);
    free(dir);
    return rc;
}

/* The first existing file of a colon-separated $KUBECONFIG (client-go merges them all;
 * we use the first, which holds the current context in the usual setups). */
static char *first_kubeconfig(const char *list)
{
    char *copy = xstrdup(list), *save = NULL, *found = NULL;

    for (char *p = strtok_r(copy, ":", &save); p != NULL; p = strtok_r(NULL, ":", &save)) {
        if (*p != '\0' && access(p, F_OK) == 0) {
            found = xstrdup(p);
            break;
        }
    }
    free(copy);
    return found;
}

int kube_config_load(struct kube_config **out, const char *path, struct err *err)
{
    const char *env = getenv("KUBECONFIG"), *host = getenv("KUBERNETES_SERVICE_HOST");
    const char *home = getenv("HOME");
    char *p = NULL;
    int rc;

    *out = NULL;
    if (path != NULL) {
        return load_kubeconfig_file(out, path, err);
    }
    if (env != NULL && *env != '\0') {
        p = first_kubeconfig(env);
        if (p == NULL) {
            return err_set(err, E_NOTFOUND, "no file of $KUBECONFIG exists");
        }
        rc = load_kubeconfig_file(out, p, err);
        free(p);
        return rc;
    }
    if (host != NULL && *host != '\0') {
        return kube_config_load_incluster(out, KUBE_SA_DIR, host, getenv("KUBERNETES_SERVICE_PORT"),
                                          err);
    }
    if (home != NULL && *home != '\0') {
        p = xasprintf("%s/.kube/config", home);
        if (access(p, F_OK) == 0) {
            rc = load_kubeconfig_file(out, p, err);
            free(p);
            return rc;
        }
        free(p);
    }
    return err_set(err, E_NOTFOUND,
                   "no kubernetes configuration: give --kubeconfig, set "
                   "KUBECONFIG, run in a pod, or create ~/.kube/config");
}
