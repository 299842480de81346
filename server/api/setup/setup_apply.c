/* SPDX-License-Identifier: Apache-2.0 */
/* Storing a one-click GitHub App and switching the running server to it: the key, the
 * webhook secret and the id (last: its presence means "configured") are written 0600 and
 * atomically into the data dir; then, under srv->gh_mu, the shared credentials become the
 * App, the webhook secret goes live and a GitHub provider joins the registry when there
 * was none. Nothing here logs or returns a secret. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/secret.h"
#include "scm/github/github.h"
#include "server/api/api_int.h"
#include "server/api/setup/setup_int.h"

static const char *const g_files[] = {SERVER_GH_APP_ID_FILE, SERVER_GH_APP_KEY_FILE,
                                      SERVER_GH_SECRET_FILE};

static bool exists_in(const char *dir, const char *name)
{
    struct stat st;
    char *path = xasprintf("%s/%s", dir, name);
    bool there = lstat(path, &st) == 0 || errno != ENOENT;

    free(path);
    return there;
}

const char *setup_configured_why(struct server *srv)
{
    const char *why = NULL;

    pthread_mutex_lock(&srv->gh_mu);
    if (srv->gh_app_stored) {
        why = "A GitHub App is set up already (its id is in github-app-id in the data dir). "
              "To set up another one: stop the server, delete github-app-id, "
              "github-app-key.pem and github-webhook-secret from the data dir (and the old "
              "App on GitHub), start it again and open this page.";
    } else if (srv->cfg.github_app_id != NULL || srv->cfg.github_app_key_file != NULL) {
        why = "A GitHub App is configured by --github-app-id and --github-app-key-file (or "
              "their environment variables), which win over a stored one. Remove them (and "
              "--github-webhook-secret) to set up an App here.";
    } else if (srv->cfg.github_webhook_secret != NULL && !srv->gh_secret_stored) {
        why = "--github-webhook-secret (or DIVERGE_GITHUB_WEBHOOK_SECRET) is given: it would "
              "win over the new App's webhook secret, and GitHub's deliveries would be "
              "refused. Remove it to set up an App here.";
    }
    for (size_t i = 0; why == NULL && i < ARRAY_LEN(g_files); i++) {
        if (exists_in(srv->cfg.data_dir, g_files[i])) {
            why = "A file of an earlier GitHub App setup is left in the data dir "
                  "(github-app-id, github-app-key.pem or github-webhook-secret). Stop the "
                  "server, delete those files, start it again and open this page.";
        }
    }
    pthread_mutex_unlock(&srv->gh_mu);
    return why;
}

static void remove_files(const char *dir, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char *path = xasprintf("%s/%s", dir, g_files[i]);
        unlink(path);
        free(path);
    }
}

/* Writes NAME = TEXT + "\n" into DIR. E_CONFLICT when it exists. */
static int write_one(const char *dir, const char *name, const char *text, struct err *err)
{
    char *path = xasprintf("%s/%s", dir, name);
    size_t n = strlen(text);
    char *data = xmalloc(n + 2);
    int rc;

    memcpy(data, text, n);
    memcpy(data + n, "\n", 2);
    rc = secret_file_write(path, data, n + 1, err);
    if (rc == E_AGAIN) {
        rc = err_set(err, E_CONFLICT, "%s exists already", path);
    }
    secret_wipe(data, n + 2);
    free(data);
    free(path);
    return rc;
}

static int store(const char *dir, const struct github_app_grant *g, struct err *err)
{
    /* The order of g_files, backwards: the id, which means "configured", comes last. */
    const char *texts[] = {g->id, g->pem, g->webhook_secret};
    size_t written = 0;
    int rc = E_OK;

    for (size_t i = ARRAY_LEN(g_files); i-- > 0 && rc == E_OK;) {
        rc = write_one(dir, g_files[i], texts[i], err);
        written += rc == E_OK ? 1 : 0;
    }
    if (rc != E_OK) {
        /* Only what this call wrote: the last WRITTEN of g_files. */
        for (size_t i = ARRAY_LEN(g_files) - written; i < ARRAY_LEN(g_files); i++) {
            char *path = xasprintf("%s/%s", dir, g_files[i]);
            unlink(path);
            free(path);
        }
    }
    return rc;
}

/* The provider a server without GitHub credentials at start gets once the App exists
 * (under srv->gh_mu, which serialises late adds). */
static int add_provider(struct server *srv, struct err *err)
{
    const char *np = srv->cfg.notifier_provider;
    struct github_config gc = {.api_url = srv->cfg.github_api_url, .bot_login = srv->cfg.bot_login};
    struct scm_provider *gh = NULL;
    struct github_auth *auth;
    int rc;

    if ((np != NULL && strcmp(np, "github") != 0) ||
        scm_registry_get(&srv->scm, "github") != NULL) {
        return E_OK;
    }
    auth = github_auth_ref(srv->gh_auth);
    rc = github_provider_new(&gh, &gc, auth, err);
    if (rc != E_OK) {
        github_auth_free(auth);
        return rc;
    }
    scm_registry_add(&srv->scm, gh);
    return E_OK;
}

int setup_apply(struct server *srv, const struct github_app_grant *g, struct err *err)
{
    const char *dir = srv->cfg.data_dir;
    char *key_path = xasprintf("%s/%s", dir, SERVER_GH_APP_KEY_FILE);
    int rc = store(dir, g, err);

    if (rc == E_OK) {
        rc = github_auth_use_app(srv->gh_auth, srv->cfg.github_api_url, g->id, key_path,
                                 clock_system(), err);
        if (rc != E_OK) {
            remove_files(dir, ARRAY_LEN(g_files));
        }
    }
    if (rc != E_OK) {
        free(key_path);
        return rc;
    }
    pthread_mutex_lock(&srv->gh_mu);
    free(srv->cfg.github_app_id);
    free(srv->cfg.github_app_key_file);
    free(srv->cfg.github_webhook_secret);
    srv->cfg.github_app_id = xstrdup(g->id);
    srv->cfg.github_app_key_file = key_path;
    srv->cfg.github_webhook_secret = xstrdup(g->webhook_secret);
    srv->gh_app_stored = true;
    srv->gh_secret_stored = true;
    rc = add_provider(srv, err);
    pthread_mutex_unlock(&srv->gh_mu);
    log_kv(LOG_INFO, "github_app_created", "app_id", g->id, "slug", g->slug != NULL ? g->slug : "",
           NULL);
    return rc;
}
