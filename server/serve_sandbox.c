/* SPDX-License-Identifier: Apache-2.0 */
/* `serve`'s sandbox wiring: the limit flags, the controller (made before the HTTP threads
 * exist, started once the bound port is known) and the meter sockets under the data dir
 * that sandboxes without network meter through (SPEC §9, DIVERGE_METER_SOCKET): one of
 * each task's own for local and process sandboxes (controller/meter_socket.c), and the
 * shared <data-dir>/sock/meter.sock for meter clients on the host. Each serves only the
 * meter route. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/log.h"
#include "kube/kube.h"
#include "scm/github/github.h"
#include "server/serve_int.h"

/* Reads ".d", ".dd" or ".ddd" at *P as thousandths, moving *P past the digits taken;
 * 0 (and *P unchanged) without a dot. */
static int64_t parse_thousandths(const char **p)
{
    const char *s = *p;
    int64_t frac = 0, scale = 100;

    if (*s != '.') {
        return 0;
    }
    for (s++; *s >= '0' && *s <= '9' && scale > 0; s++, scale /= 10) {
        frac += (*s - '0') * scale;
    }
    *p = s;
    return frac;
}

/* Reads a final one-letter binary unit (k/K, M, G, T) at *P, moving *P past it: its
 * multiplier, 1 when *P is not a single last character, 0 for an unknown letter. */
static int64_t parse_unit(const char **p)
{
    const char *units = "KMGT";
    const char *u;
    int64_t mult = 1;

    if (**p == '\0' || (*p)[1] != '\0') {
        return 1;
    }
    u = strchr(units, **p == 'k' ? 'K' : **p);
    if (u == NULL) {
        return 0;
    }
    for (const char *q = units; q <= u; q++) {
        mult *= 1024;
    }
    (*p)++;
    return mult;
}

int serve_parse_size(int64_t *out, const char *flag, const char *v, bool milli)
{
    char *end = NULL;
    const char *rest;
    long long n;
    int64_t mult = 1, frac = 0;

    errno = 0;
    n = strtoll(v, &end, 10);
    if (errno != 0 || end == v || n < 0 || n > (1LL << 40)) {
        goto bad;
    }
    rest = end;
    if (milli) {
        frac = parse_thousandths(&rest);
    } else {
        mult = parse_unit(&rest);
    }
    if (mult == 0 || *rest != '\0' || (int64_t)n > INT64_MAX / mult) {
        goto bad;
    }
    *out = milli ? (int64_t)n * 1000 + frac : (int64_t)n * mult;
    return 0;
bad:
    fprintf(stderr, "diverge: serve: %s: cannot read %s\n", flag, v);
    return 2;
}

/* The GitHub App as the controller's git sees it (SPEC §9: the server fetches and pushes
 * with its own credentials): the server's shared credentials (an App set up while serving
 * counts at once), the REST base, and the store whose inbox remembers the installation
 * each project's comments came through. */
struct git_app {
    struct github_auth *auth; /* one reference */
    char *api_url;            /* owned */
    struct task_store *store; /* borrowed: outlives the controller */
};

static int git_app_token(void *userdata, const char *project, char **token_out, struct err *err)
{
    struct git_app *g = userdata;
    struct err ierr = {0};
    int64_t inst = 0;

    /* The installation a webhook delivered for the project (tasks made from comments),
     * else (0) the one GitHub names for the repository. */
    if (task_store_inbox_installation(&inst, g->store, "github", project, &ierr) != E_OK) {
        inst = 0;
    }
    return github_git_token(token_out, g->auth, g->api_url, project, inst, err);
}

static bool git_app_active(void *userdata)
{
    struct git_app *g = userdata;

    return github_auth_is_app(g->auth);
}

static void git_app_free(void *userdata)
{
    struct git_app *g = userdata;

    github_auth_free(g->auth);
    free(g->api_url);
    free(g);
}

/* CC's git_auth: App tokens whenever the server's credentials are an App; else git uses
 * the PAT of the environment (or nothing). */
static int git_app_config(struct controller_config *cc, struct server *srv, struct err *err)
{
    struct git_app *g;

    (void)err;
    if (srv->gh_auth == NULL) {
        return E_OK;
    }
    g = xcalloc(1, sizeof(*g));
    g->auth = github_auth_ref(srv->gh_auth);
    g->api_url = xstrdup(srv->cfg.github_api_url != NULL ? srv->cfg.github_api_url
                                                         : GITHUB_AUTH_DEFAULT_API_URL);
    g->store = srv->store;
    cc->git_auth = (struct controller_git_auth){
        .token = git_app_token, .active = git_app_active, .free = git_app_free, .userdata = g};
    return E_OK;
}

/* agent-sandbox (SPEC §11): CC's cluster client from --kubeconfig, else KUBECONFIG, the
 * in-cluster service account or ~/.kube/config (kube_config_load), owned by the controller,
 * and the warm pool. No configuration anywhere: the controller runs without it and tasks
 * wait saying why; an unusable one stops serve. */
static int agent_sandbox_config(struct controller_config *cc, struct server *srv, struct err *err)
{
    struct kube_config *kc = NULL;
    struct kube_client *kube = NULL;
    struct err kerr = {0};
    int rc = kube_config_load(&kc, srv->cfg.kubeconfig, &kerr);

    if (rc == E_NOTFOUND && srv->cfg.kubeconfig == NULL) {
        return E_OK;
    }
    if (rc == E_OK) {
        rc = kube_client_new(&kube, kc, &kerr);
    }
    if (rc != E_OK) {
        return err_set(err, rc, "agent-sandbox: %s", kerr.msg);
    }
    if (srv->cfg.sandbox_warm_pool == NULL || srv->cfg.sandbox_warm_pool[0] == '\0') {
        kube_client_free(kube);
        return err_set(err, E_INVALID,
                       "agent-sandbox needs --sandbox-warm-pool (DIVERGE_SANDBOX_WARMPOOL)");
    }
    cc->kube = kube;
    cc->kube_owned = true;
    cc->sandbox_warm_pool = srv->cfg.sandbox_warm_pool;
    if (getenv("DIVERGE_SANDBOX_POLL_MS") != NULL) { /* tests */
        cc->sandbox_poll_ms = strtoll(getenv("DIVERGE_SANDBOX_POLL_MS"), NULL, 10);
    }
    return E_OK;
}

/* The server's side of a task's meter socket: the meter route only, a few connections. */
static int task_meter_open(void **server_out, int listen_fd, void *userdata, struct err *err)
{
    struct MHD_Daemon *d = NULL;
    int rc = http_start_unix(&d, userdata, listen_fd, SERVER_TASK_METER_CONN_MAX, false, err);

    *server_out = d;
    return rc;
}

static void task_meter_close(void *server)
{
    http_stop_unix(server);
}

int serve_controller_new(struct server *srv, struct err *err)
{
    return serve_controller_make(&srv->controller, srv, err);
}

int serve_controller_make(struct controller **out, struct server *srv, struct err *err)
{
    struct controller_config cc = {
        .data_dir = srv->cfg.data_dir,
        .root_key = srv->root_key,
        .default_budget_usd = srv->default_budget_usd,
        .default_budget_tokens = srv->default_budget_tokens,
        .default_max_iterations = srv->default_max_iterations,
        .sandbox_provider = srv->cfg.sandbox_provider,
        .deferred = true,
        .agent_cmd = srv->cfg.agent_cmd,
        .verify_cmd = srv->cfg.verify_cmd,
        .sandbox_user = srv->cfg.sandbox_user,
        .sandbox_tools = srv->cfg.sandbox_tools,
        .sandbox_memory = srv->sandbox_memory,
        .sandbox_pids = srv->sandbox_pids,
        .warm_slots = srv->sandbox_warm_slots,
        .sandbox_cpus_milli = srv->sandbox_cpus_milli,
        .sandbox_disk = srv->sandbox_disk,
        .data_dir_reserve = srv->data_dir_reserve,
        .max_push_bytes = srv->max_push_bytes,
        .max_running_tasks = srv->max_running_tasks,
        .push_wip = strcmp(srv->cfg.push_wip, "true") == 0,
        .stall_after_ms = srv->stall_after_ms,
        .no_progress_after = srv->no_progress_after,
        .network = srv->cfg.sandbox_network,
        .allow_hosts = srv->cfg.sandbox_allow_hosts,
        .preview_base_url = srv->cfg.preview_base_url,
        .github_api_url = srv->cfg.github_api_url,
    };
    bool on_host = strcmp(srv->cfg.sandbox_provider, "local") == 0 ||
                   strcmp(srv->cfg.sandbox_provider, "process") == 0;
    int rc = git_app_config(&cc, srv, err);

    if (on_host) {
        cc.meter_sockets = (struct controller_meter_sockets){
            .open = task_meter_open, .close = task_meter_close, .userdata = srv};
    }
    if (rc == E_OK && strcmp(srv->cfg.sandbox_provider, "agent-sandbox") == 0) {
        rc = agent_sandbox_config(&cc, srv, err);
    }
    if (rc != E_OK) {
        if (cc.git_auth.free != NULL) {
            cc.git_auth.free(cc.git_auth.userdata);
        }
        return rc;
    }
    return controller_new(out, srv->store, &cc, err);
}

/* Listens on <data-dir>/sock/meter.sock; *fd_out the listening socket, or -1 when the path
 * does not fit a socket address (then sandboxes meter over TCP only). */
static int open_socket(int *fd_out, struct server *srv, struct err *err)
{
    char *dir = xasprintf("%s/sock", srv->cfg.data_dir);
    char *path = xasprintf("%s/meter.sock", dir);
    struct sockaddr_un sa;
    int fd = -1, rc = E_OK;

    *fd_out = -1;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(sa.sun_path)) {
        log_kv(LOG_WARN, "meter_socket_skipped", "reason",
               "the data dir path is too long "
               "for a unix socket",
               NULL);
        goto out;
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        rc = err_set(err, E_FAIL, "create %s: %s", dir, strerror(errno));
        goto out;
    }
    (void)unlink(path); /* a stale socket of a previous run */
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(fd, 128) != 0) {
        rc = err_set(err, E_FAIL, "listen on %s: %s", path, strerror(errno));
        if (fd >= 0) {
            close(fd);
        }
        goto out;
    }
    *fd_out = fd;
    srv->meter_socket = path;
    path = NULL;
out:
    free(dir);
    free(path);
    return rc;
}

int serve_egress_own(struct server *srv, struct controller *c, struct err *err)
{
    const char *listens[3] = {srv->cfg.listen, NULL, NULL};

    /* Every TCP listener of the server: the plain one and, when it runs, the TLS one. */
    if (srv->tls_daemon != NULL && srv->cfg.tls_listen != NULL) {
        listens[1] = srv->cfg.tls_listen;
    }
    return controller_egress_own(c, listens, err);
}

int serve_sandbox_start(struct server *srv, struct err *err)
{
    char *meter = xasprintf("%s/api/v1/agenttask/meter", srv->base_url);
    int fd = -1;
    int rc = open_socket(&fd, srv, err);

    if (rc == E_OK && fd >= 0) {
        rc = http_start_unix(&srv->unix_daemon, srv, fd, SERVER_CONN_MAX, true, err);
        if (rc != E_OK) {
            close(fd);
        }
    }
    if (rc == E_OK && srv->controller != NULL) {
        /* Egress proxies never connect back to the server itself. */
        rc = serve_egress_own(srv, srv->controller, err);
    }
    if (rc == E_OK && srv->controller != NULL) {
        rc = controller_start(srv->controller, meter, srv->meter_socket, err);
    }
    if (rc == E_OK && srv->kube != NULL) {
        rc = serve_kube_elect_start(srv, err); /* the leader starts its own controller */
    }
    free(meter);
    return rc;
}

void serve_sandbox_stop(struct server *srv)
{
    http_stop_unix(srv->unix_daemon);
    srv->unix_daemon = NULL;
    if (srv->meter_socket != NULL) {
        (void)unlink(srv->meter_socket);
        free(srv->meter_socket);
        srv->meter_socket = NULL;
    }
}
