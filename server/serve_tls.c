/* SPDX-License-Identifier: Apache-2.0 */
/* The HTTPS listener of `diverge serve --tls-listen` (SPEC §2): its certificate (given
 * PEM files or generated once into the data dir), the daemon, and <data-dir>/tls-endpoint,
 * which tells `diverge kubeconfig` the HTTPS URL and where the certificate is. */
#define _XOPEN_SOURCE 700 /* realpath */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/secret.h"
#include "common/tlscert.h"
#include "server/serve_int.h"

#define ENDPOINT_FILE "tls-endpoint"

/* "https://HOST:PORT" for clients: a wildcard address becomes 127.0.0.1 (what the
 * generated certificate names). */
static char *tls_url(const char *listen, uint16_t port)
{
    const char *colon = strrchr(listen, ':');
    size_t n = colon != NULL ? (size_t)(colon - listen) : 0;

    if (n == 0 || (n == 7 && strncmp(listen, "0.0.0.0", 7) == 0)) {
        return xasprintf("https://127.0.0.1:%u", port);
    }
    return xasprintf("https://%.*s:%u", (int)n, listen, port);
}

/* Replaces DIR/tls-endpoint atomically with {"server": URL, "certificateAuthority":
 * absolute path of the certificate}. */
static int write_endpoint(const char *dir, const char *url, const char *cert_path, struct err *err)
{
    char abs[PATH_MAX];
    char *path = xasprintf("%s/%s", dir, ENDPOINT_FILE);
    char *tmp = xasprintf("%s.tmp", path);
    json_t *j;
    char *text;
    int fd, rc = E_OK;

    if (realpath(cert_path, abs) == NULL) {
        rc = err_set(err, E_FAIL, "realpath %s: %s", cert_path, strerror(errno));
        goto out;
    }
    j = json_pack("{s:s, s:s}", "server", url, "certificateAuthority", abs);
    text = j != NULL ? json_dumps(j, JSON_INDENT(2)) : NULL;
    json_decref(j);
    if (text == NULL) {
        rc = err_set(err, E_FAIL, "cannot encode %s", path);
        goto out;
    }
    (void)unlink(tmp);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text) ||
        write(fd, "\n", 1) != 1 || rename(tmp, path) != 0) {
        rc = err_set(err, E_FAIL, "write %s: %s", path, strerror(errno));
        (void)unlink(tmp);
    }
    if (fd >= 0) {
        close(fd);
    }
    free(text);
out:
    free(path);
    free(tmp);
    return rc;
}

/* The certificate and key, and the path of the certificate (for the endpoint file). */
static int load_cert(struct tlscert *c, char **cert_path_out, const struct server_config *cfg,
                     struct err *err)
{
    bool created = false;
    int rc;

    *cert_path_out = NULL;
    if ((cfg->tls_cert_file == NULL) != (cfg->tls_key_file == NULL)) {
        return err_set(err, E_INVALID, "--tls-cert-file and --tls-key-file go together");
    }
    if (cfg->tls_cert_file != NULL) {
        rc = tlscert_load_files(c, cfg->tls_cert_file, cfg->tls_key_file, err);
        if (rc == E_OK) {
            *cert_path_out = xstrdup(cfg->tls_cert_file);
        }
        return rc;
    }
    rc = tlscert_load_or_create(c, &created, cfg->data_dir, err);
    if (rc == E_OK) {
        *cert_path_out = xasprintf("%s/%s", cfg->data_dir, TLSCERT_CERT_FILE);
        if (created) {
            log_kv(LOG_INFO, "tls_certificate_generated", "certificate", *cert_path_out, NULL);
        }
    }
    return rc;
}

/* Replaces the port of srv->cfg.tls_listen by the bound one (":0" picks one), so the
 * egress proxies know the listener's real port (serve_egress_own). */
static void set_bound_tls(struct server *srv, uint16_t port)
{
    const char *colon = strrchr(srv->cfg.tls_listen, ':');
    char *l;

    if (colon == NULL) {
        return;
    }
    l = xasprintf("%.*s:%u", (int)(colon - srv->cfg.tls_listen), srv->cfg.tls_listen,
                  (unsigned)port);
    free(srv->cfg.tls_listen);
    srv->cfg.tls_listen = l;
}

int serve_tls_start(struct server *srv, struct err *err)
{
    struct tlscert *c = &srv->tls_pem;
    char *cert_path = NULL;
    uint16_t port = 0;
    int rc;

    if (srv->cfg.tls_listen == NULL || srv->cfg.tls_listen[0] == '\0') {
        char *path = xasprintf("%s/%s", srv->cfg.data_dir, ENDPOINT_FILE);
        (void)unlink(path); /* a stale one would point kubeconfig at nothing */
        free(path);
        return E_OK;
    }
    rc = load_cert(c, &cert_path, &srv->cfg, err);
    if (rc == E_OK) {
        /* MHD keeps pointers to both texts: they live in srv until serve_tls_stop(). */
        rc = http_start_tls(&srv->tls_daemon, &port, srv, srv->cfg.tls_listen, c->cert_pem,
                            c->key_pem, err);
    }
    if (rc == E_OK) {
        set_bound_tls(srv, port);
        srv->tls_url = tls_url(srv->cfg.tls_listen, port);
        rc = write_endpoint(srv->cfg.data_dir, srv->tls_url, cert_path, err);
    }
    if (rc != E_OK) {
        serve_tls_stop(srv);
    }
    free(cert_path);
    return rc;
}

void serve_tls_stop(struct server *srv)
{
    http_stop_unix(srv->tls_daemon);
    srv->tls_daemon = NULL;
    free(srv->tls_url);
    srv->tls_url = NULL;
    tlscert_cleanup(&srv->tls_pem);
}
