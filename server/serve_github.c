/* SPDX-License-Identifier: Apache-2.0 */
/* The server's GitHub credentials at start: the flags (and their environment variables)
 * win; what they leave unset comes from the files the one-click App setup stored in the
 * data dir (github-app-id with github-app-key.pem, github-webhook-secret). One shared
 * credential object serves the REST provider and the controller's git, so an App set up
 * later reaches both at once. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/secret.h"
#include "scm/github/github.h"
#include "server/api/api.h"
#include "server/serve_int.h"

#define APP_ID_FILE_MAX 64
#define SECRET_FILE_MAX 1024

/* The trimmed content of the secret file DIR/NAME into *out (NULL when absent). */
static int read_stored(char **out, const char *dir, const char *name, size_t max, struct err *err)
{
    char *path = xasprintf("%s/%s", dir, name);
    char *data = NULL;
    size_t len = 0, start = 0;
    int rc = secret_file_read(&data, &len, path, max, err);

    *out = NULL;
    if (rc == E_NOTFOUND) {
        rc = E_OK;
    } else if (rc == E_OK) {
        while (len > 0 && strchr(" \t\r\n", data[len - 1]) != NULL) {
            data[--len] = '\0';
        }
        start = strspn(data, " \t\r\n");
        if (data[start] == '\0') {
            rc = err_set(err, E_INVALID, "%s is empty: delete it, or set up the GitHub App again",
                         path);
        } else {
            *out = xstrdup(data + start);
        }
        secret_wipe(data, len);
    }
    free(data);
    free(path);
    return rc;
}

/* The stored App when neither --github-app-id nor --github-app-key-file is given. */
static int load_stored_app(struct server *srv, struct err *err)
{
    struct server_config *cfg = &srv->cfg;
    char *id = NULL, *pem = NULL;
    int rc;

    if (cfg->github_app_id != NULL || cfg->github_app_key_file != NULL) {
        return E_OK;
    }
    rc = read_stored(&id, cfg->data_dir, SERVER_GH_APP_ID_FILE, APP_ID_FILE_MAX, err);
    if (rc != E_OK || id == NULL) {
        return rc;
    }
    /* The key is loaded by its path below; read here only to check it is a private file
     * of ours (0600, no symbolic link), as every secret of the data dir is. */
    rc = read_stored(&pem, cfg->data_dir, SERVER_GH_APP_KEY_FILE, GITHUB_AUTH_KEY_FILE_MAX, err);
    if (rc == E_OK && pem == NULL) {
        rc = err_set(err, E_INVALID,
                     "%s/%s exists without %s: restore the key, or delete %s and set up the "
                     "GitHub App again",
                     cfg->data_dir, SERVER_GH_APP_ID_FILE, SERVER_GH_APP_KEY_FILE,
                     SERVER_GH_APP_ID_FILE);
    }
    if (pem != NULL) {
        secret_wipe(pem, strlen(pem));
        free(pem);
    }
    if (rc != E_OK) {
        free(id);
        return rc;
    }
    cfg->github_app_id = id;
    cfg->github_app_key_file = xasprintf("%s/%s", cfg->data_dir, SERVER_GH_APP_KEY_FILE);
    srv->gh_app_stored = true;
    log_kv(LOG_INFO, "github_app_stored", "app_id", id, NULL);
    return E_OK;
}

int serve_github_open(struct server *srv, struct err *err)
{
    struct err aerr = {0};
    int rc;

    pthread_mutex_init(&srv->gh_mu, NULL);
    srv->gh_mu_ready = true;
    gh_setup_new(&srv->gh_setup);
    rc = load_stored_app(srv, err);
    if (rc == E_OK && srv->cfg.github_webhook_secret == NULL) {
        rc = read_stored(&srv->cfg.github_webhook_secret, srv->cfg.data_dir, SERVER_GH_SECRET_FILE,
                         SECRET_FILE_MAX, err);
        srv->gh_secret_stored = srv->cfg.github_webhook_secret != NULL;
    }
    if (rc != E_OK) {
        return rc;
    }
    rc = github_auth_from_config(&srv->gh_auth, srv->cfg.github_api_url, srv->cfg.github_app_id,
                                 srv->cfg.github_app_key_file, clock_system(), &aerr);
    if (rc == E_NOTFOUND) {
        github_auth_new_none(&srv->gh_auth); /* an App set up later fills it */
        return E_OK;
    }
    return rc == E_OK ? E_OK : err_set(err, rc, "GitHub credentials: %s", aerr.msg);
}

void serve_github_close(struct server *srv)
{
    github_auth_free(srv->gh_auth);
    srv->gh_auth = NULL;
    gh_setup_free(srv->gh_setup);
    srv->gh_setup = NULL;
    if (srv->gh_mu_ready) {
        pthread_mutex_destroy(&srv->gh_mu);
        srv->gh_mu_ready = false;
    }
}
