/* SPDX-License-Identifier: Apache-2.0 */
/* `diverge serve`: flags and environment (SPEC §2), data dir and generated secrets, the
 * store, the HTTP server, endpoint lines on start, and graceful shutdown on SIGTERM. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/money.h"
#include "common/secret.h"
#include "scm/github/github.h"
#include "scm/gitlab/gitlab.h"
#include "server/api/api.h"
#include "server/serve_int.h"
#include "server/api/llm/llm.h"
#include "server/server.h"

#include "common/version.h"
#define VERSION DIVERGE_VERSION

static int mkdir_p(const char *path, struct err *err)
{
    char *p = xstrdup(path);
    int rc = E_OK;

    for (char *s = p + 1; *s != '\0'; s++) {
        if (*s == '/') {
            *s = '\0';
            if (mkdir(p, 0700) != 0 && errno != EEXIST) {
                rc = err_set(err, E_FAIL, "mkdir %s: %s", p, strerror(errno));
                goto out;
            }
            *s = '/';
        }
    }
    if (mkdir(p, 0700) != 0 && errno != EEXIST) {
        rc = err_set(err, E_FAIL, "mkdir %s: %s", p, strerror(errno));
    }
out:
    free(p);
    return rc;
}

/* SPEC §2: the data dir holds the admin token and the macaroon root key, so it must be
 * ours and writable by nobody else; otherwise another local user could have planted them. */
static int check_data_dir(const char *dir, struct err *err)
{
    struct stat st;
    unsigned uid = (unsigned)geteuid();

    if (stat(dir, &st) != 0) {
        return err_set(err, E_FAIL, "data dir %s: %s", dir, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode)) {
        return err_set(err, E_DENIED, "data dir %s is not a directory", dir);
    }
    if ((unsigned)st.st_uid != uid) {
        return err_set(err, E_DENIED,
                       "data dir %s belongs to uid %u, not to the server's user: chown %u %s "
                       "(or use another --data-dir)",
                       dir, (unsigned)st.st_uid, uid, dir);
    }
    if ((st.st_mode & 022) != 0) {
        return err_set(err, E_DENIED, "data dir %s is writable by others: chmod 700 %s", dir, dir);
    }
    return E_OK;
}

/* One server per data dir (SPEC §14): a write lock on <data-dir>/serve.lock, held until
 * the process ends, whose file names the holder's pid. A POSIX record lock (fcntl), not
 * flock(): it belongs to this process only, so a sandbox or helper forked from the server
 * never inherits it and never keeps a restarted server out; the kernel drops it when the
 * process dies, kill -9 included. */
static int lock_data_dir(int *fd_out, const char *dir, struct err *err)
{
    char *path = xasprintf("%s/serve.lock", dir);
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    char pid[32] = "";
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    int rc = E_OK;

    *fd_out = -1;
    if (fd < 0) {
        rc = err_set(err, E_FAIL, "open %s: %s", path, strerror(errno));
        goto out;
    }
    if (fcntl(fd, F_SETLK, &fl) != 0) {
        ssize_t n = errno == EACCES || errno == EAGAIN ? pread(fd, pid, sizeof(pid) - 1, 0) : -1;
        long holder = n > 0 ? strtol(pid, NULL, 10) : 0;
        rc = holder > 0 ? err_set(err, E_CONFLICT,
                                  "data dir %s is in use (pid %ld): stop that server or use "
                                  "another --data-dir",
                                  dir, holder)
                        : err_set(err, E_CONFLICT,
                                  "data dir %s is in use by another diverge serve: stop it or "
                                  "use another --data-dir",
                                  dir);
        close(fd);
        goto out;
    }
    snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, strlen(pid), 0) != (ssize_t)strlen(pid)) {
        rc = err_set(err, E_FAIL, "write %s: %s", path, strerror(errno));
        close(fd);
        goto out;
    }
    *fd_out = fd;
out:
    free(path);
    return rc;
}

/* The data dir: created, checked, and locked for this server. */
static int prepare_data_dir(struct server *srv, struct err *err)
{
    int rc = mkdir_p(srv->cfg.data_dir, err);

    if (rc == E_OK) {
        rc = check_data_dir(srv->cfg.data_dir, err);
    }
    if (rc == E_OK && srv->data_lock_fd < 0) {
        rc = lock_data_dir(&srv->data_lock_fd, srv->cfg.data_dir, err);
    }
    return rc;
}

static int load_secrets(struct server *srv, struct err *err)
{
    int rc;

    if (srv->cfg.api_token_file == NULL) {
        srv->cfg.api_token_file = xasprintf("%s/api-token", srv->cfg.data_dir);
    }
    if (srv->cfg.root_key_file == NULL) {
        srv->cfg.root_key_file = xasprintf("%s/macaroon-root-key", srv->cfg.data_dir);
    }
    rc = secret_file_load_or_create(&srv->api_token, NULL, srv->cfg.api_token_file, 32, err);
    if (rc != E_OK) {
        return rc;
    }
    if (srv->sessions == NULL) {
        ui_sessions_new(&srv->sessions);
    }
    rc = token_root_key_load_or_create(srv->root_key, srv->cfg.root_key_file, err);
    /* GitHub's: the flags', else the one-click App's files (serve_github.c). */
    return rc == E_OK ? serve_github_open(srv, err) : rc;
}

static bool provider_wanted(const struct server *srv, const char *name);

/* A GitLab access level: a number (0..50) or a role name. */
static int gitlab_level_parse(enum scm_level *out, const char *s)
{
    static const struct {
        const char *name;
        enum scm_level level;
    } roles[] = {{"guest", SCM_LEVEL_READ},
                 {"reporter", SCM_LEVEL_TRIAGE},
                 {"developer", SCM_LEVEL_WRITE},
                 {"maintainer", SCM_LEVEL_MAINTAIN},
                 {"owner", SCM_LEVEL_ADMIN}};

    for (size_t i = 0; i < ARRAY_LEN(roles); i++) {
        if (strcasecmp(roles[i].name, s) == 0) {
            *out = roles[i].level;
            return E_OK;
        }
    }
    return s[0] >= '0' && s[0] <= '9' ? scm_level_parse(out, s) : E_INVALID;
}

/* The GitLab flags: tiers and the signing secret's form. 0, or 2 after a message. */
static int gitlab_flags_check(struct server *srv)
{
    if (gitlab_level_parse(&srv->gitlab_min_fix, srv->cfg.gitlab_min_fix) != E_OK ||
        gitlab_level_parse(&srv->gitlab_min_budget, srv->cfg.gitlab_min_budget) != E_OK ||
        srv->gitlab_min_fix == SCM_LEVEL_NONE || srv->gitlab_min_budget == SCM_LEVEL_NONE) {
        fprintf(stderr, "diverge: serve: GitLab access levels are 10, 20, 30, 40, 50 or guest, "
                        "reporter, developer, maintainer, owner\n");
        return 2;
    }
    if (srv->cfg.gitlab_signing_secret != NULL &&
        !gitlab_sig_secrets_valid(srv->cfg.gitlab_signing_secret)) {
        fprintf(stderr, "diverge: serve: --gitlab-signing-secret must be whsec_<base64>, "
                        "comma-separated\n");
        return 2;
    }
    /* The controller's git credential helper finds the GitLab base URL where it finds the
     * token: in the environment (set here, before any thread starts; the flag wins). */
    if (srv->cfg.gitlab_url != NULL && setenv("DIVERGE_GITLAB_URL", srv->cfg.gitlab_url, 1) != 0) {
        fprintf(stderr, "diverge: serve: cannot set DIVERGE_GITLAB_URL\n");
        return 2;
    }
    return 0;
}

static void print_gitlab_endpoint(const struct server *srv)
{
    bool on = srv->cfg.gitlab_webhook_token != NULL || srv->cfg.gitlab_signing_secret != NULL;

    printf("  GitLab webhook: %s/api/v1/webhooks/gitlab%s\n", srv->base_url,
           on ? "" : " (off: no --gitlab-webhook-token or --gitlab-signing-secret)");
}

/* The GitLab provider, when a token is in the environment. */
static int start_gitlab(struct server *srv, struct err *err)
{
    bool hooks = srv->cfg.gitlab_webhook_token != NULL || srv->cfg.gitlab_signing_secret != NULL;
    /* DIVERGE_NOTIFIER_TOKEN is also GitHub's: GitLab takes it only when GitLab alone is
     * configured, so a GitHub token is never sent to a GitLab host. */
    bool only_gitlab =
        (srv->cfg.notifier_provider != NULL && strcmp(srv->cfg.notifier_provider, "gitlab") == 0) ||
        (hooks && srv->cfg.github_webhook_secret == NULL);
    const char *token = gitlab_token_from_env(only_gitlab);
    struct scm_provider *gl = NULL;
    int rc;

    if (!provider_wanted(srv, "gitlab")) {
        return E_OK;
    }
    if (token == NULL) {
        if (hooks) {
            log_kv(LOG_WARN, "gitlab_no_credentials", "hint",
                   "set DIVERGE_GITLAB_TOKEN or GITLAB_TOKEN: commands are accepted but cannot "
                   "be answered",
                   NULL);
        }
        return E_OK;
    }
    {
        /* DIVERGE_GITLAB_NOTES_PER_MINUTE (undocumented: for tests) lowers the pace. */
        const char *pace = getenv("DIVERGE_GITLAB_NOTES_PER_MINUTE");
        struct gitlab_config gc = {.url = srv->cfg.gitlab_url,
                                   .token = token,
                                   .bot_login = srv->cfg.bot_login,
                                   .notes_per_minute =
                                       pace != NULL ? (int)strtol(pace, NULL, 10) : 0};
        rc = gitlab_provider_new(&gl, &gc, err);
    }
    if (rc == E_OK) {
        scm_registry_add(&srv->scm, gl);
    }
    return rc;
}

static void print_endpoints(struct server *srv)
{
    const char *b = srv->base_url;

    printf("diverge serve %s: listening on http://%s\n", VERSION, srv->cfg.listen);
    printf("  task API:  %s/apis/divergedev.com/v1alpha1/namespaces/{ns}/agenttasks\n", b);
    if (srv->tls_url != NULL) {
        printf("  HTTPS:     %s (kubectl: diverge kubeconfig > kubeconfig)\n", srv->tls_url);
    }
    printf("  meter:     %s/api/v1/agenttask/meter\n", b);
    /* Already serving: a one-click App setup may be changing these. */
    pthread_mutex_lock(&srv->gh_mu);
    printf("  GitHub webhook: %s/api/v1/webhooks/github%s\n", b,
           srv->cfg.github_webhook_secret != NULL ? "" : " (off: no --github-webhook-secret)");
    if (srv->cfg.github_app_id == NULL && srv->kube == NULL) {
        printf("  GitHub App setup: %s/setup/github-app\n", b);
    }
    pthread_mutex_unlock(&srv->gh_mu);
    print_gitlab_endpoint(srv);
    printf("  health:    %s/healthz  %s/readyz\n", b, b);
    printf("  metrics:   %s/metrics\n", b);
    if (isatty(STDOUT_FILENO)) {
        /* A person reads a terminal; a pipe or a file ends up in logs (SPEC §12). */
        printf("  dashboard: %s/ui/login?token=%s\n", b, srv->api_token);
    } else {
        printf("  dashboard: %s/ (log in with the token in %s)\n", b, srv->cfg.api_token_file);
    }
    if (srv->kube != NULL) {
        printf("  store:     kubernetes (Lease diverge-leader, token index and queues in "
               "namespace %s)\n",
               serve_kube_namespace(srv));
    } else {
        printf("  database:  %s/diverge.db\n", srv->cfg.data_dir);
        printf("  local SCM: %s/api/v1/local/comments (diverge local comment OWNER/REPO#N "
               "\"...\")\n",
               b);
    }
    printf("  sandbox provider: %s\n", srv->cfg.sandbox_provider);
    if (controller_sandbox_problem(srv->controller) != NULL) {
        printf("  SANDBOXES CANNOT RUN: %s\n", controller_sandbox_problem(srv->controller));
    }
    printf("admin token: %s\n", srv->cfg.api_token_file);
    fflush(stdout);
}

/* Replaces a ":0" port in the configured listen address by the bound one. */
static void set_bound_listen(struct server *srv, uint16_t port)
{
    char *colon = strrchr(srv->cfg.listen, ':');
    char *l;

    *colon = '\0';
    l = xasprintf("%s:%u", srv->cfg.listen[0] != '\0' ? srv->cfg.listen : "127.0.0.1", port);
    free(srv->cfg.listen);
    srv->cfg.listen = l;
    if (srv->cfg.public_url != NULL && srv->cfg.public_url[0] != '\0') {
        size_t n = strlen(srv->cfg.public_url);
        srv->base_url = xstrdup(srv->cfg.public_url);
        if (n > 0 && srv->base_url[n - 1] == '/') {
            srv->base_url[n - 1] = '\0';
        }
    } else {
        srv->base_url = xasprintf("http://%s", srv->cfg.listen);
    }
}

static int parse_count_flag(int64_t *out, const char *flag, const char *v)
{
    char *end = NULL;
    long long n;

    errno = 0;
    n = strtoll(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || n < 0) {
        fprintf(stderr, "diverge: serve: %s must be a non-negative integer, not %s\n", flag, v);
        return 2;
    }
    *out = n;
    return 0;
}

/* --max-running-tasks: default the number of CPUs online (SPEC §14); and
 * --sandbox-warm-slots, a few at most. */
static int parse_max_running(struct server *srv)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);

    if (parse_count_flag(&srv->sandbox_warm_slots, "--sandbox-warm-slots",
                         srv->cfg.sandbox_warm_slots) != 0) {
        return 2;
    }
    if (srv->sandbox_warm_slots > 16) {
        fprintf(stderr, "diverge: serve: --sandbox-warm-slots must be 0 to 16\n");
        return 2;
    }

    if (srv->cfg.max_running_tasks == NULL || srv->cfg.max_running_tasks[0] == '\0') {
        srv->max_running_tasks = cpus > 0 ? cpus : 1;
        return 0;
    }
    return parse_count_flag(&srv->max_running_tasks, "--max-running-tasks",
                            srv->cfg.max_running_tasks);
}

/* A duration flag: digits with an optional unit (ms, s, m, h; none: seconds) into *OUT
 * milliseconds. Returns 2 after telling stderr what is wrong. */
static int parse_duration_flag(int64_t *out, const char *flag, const char *v)
{
    static const struct {
        const char *unit;
        int64_t ms;
    } units[] = {{"", 1000}, {"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}};
    char *end = NULL;
    long long n;

    errno = 0;
    n = strtoll(v, &end, 10);
    if (errno == 0 && end != v && v[0] >= '0' && v[0] <= '9' && n <= 1000000000LL) {
        for (size_t i = 0; i < ARRAY_LEN(units); i++) {
            if (strcmp(end, units[i].unit) == 0) {
                *out = (int64_t)n * units[i].ms;
                return 0;
            }
        }
    }
    fprintf(stderr, "diverge: serve: %s must be a duration such as 10m, 90s or 500ms, not %s\n",
            flag, v);
    return 2;
}

/* --push-wip, --stall-after, --no-progress-after (SPEC §14). */
static int parse_runs(struct server *srv)
{
    if (strcmp(srv->cfg.push_wip, "true") != 0 && strcmp(srv->cfg.push_wip, "false") != 0) {
        fprintf(stderr, "diverge: serve: --push-wip must be true or false\n");
        return 2;
    }
    if (parse_duration_flag(&srv->stall_after_ms, "--stall-after", srv->cfg.stall_after) != 0 ||
        parse_count_flag(&srv->no_progress_after, "--no-progress-after",
                         srv->cfg.no_progress_after) != 0) {
        return 2;
    }
    if (srv->no_progress_after > 10000) {
        fprintf(stderr, "diverge: serve: --no-progress-after must be 0 to 10000\n");
        return 2;
    }
    return 0;
}

/* The numeric flags: default budgets and iterations, the notifier interval and the
 * sandbox limits. Returns 2 after telling stderr what is wrong. */
static int parse_numbers(struct server *srv)
{
    struct err err = {0};

    if (money_parse(&srv->default_budget_usd, NULL, srv->cfg.default_budget_usd, &err) != E_OK) {
        fprintf(stderr, "diverge: serve: --default-budget-usd %s: %s\n",
                srv->cfg.default_budget_usd, err.msg);
        return 2;
    }
    if (parse_count_flag(&srv->notifier_min_interval_ms, "--notifier-min-interval",
                         srv->cfg.notifier_min_interval) != 0) {
        return 2;
    }
    srv->notifier_min_interval_ms *= 1000;
    if (parse_count_flag(&srv->default_budget_tokens, "--default-budget-tokens",
                         srv->cfg.default_budget_tokens) != 0 ||
        parse_count_flag(&srv->default_max_iterations, "--default-max-iterations",
                         srv->cfg.default_max_iterations) != 0) {
        return 2;
    }
    if (serve_parse_size(&srv->sandbox_memory, "--sandbox-memory", srv->cfg.sandbox_memory,
                         false) != 0 ||
        parse_count_flag(&srv->sandbox_pids, "--sandbox-pids", srv->cfg.sandbox_pids) != 0 ||
        serve_parse_size(&srv->sandbox_cpus_milli, "--sandbox-cpus", srv->cfg.sandbox_cpus, true) !=
            0 ||
        serve_parse_size(&srv->git_push_max, "--git-push-max", srv->cfg.git_push_max, false) != 0) {
        return 2;
    }
    if (srv->git_push_max < 1024 || srv->git_push_max > ((int64_t)1 << 32)) {
        fprintf(stderr, "diverge: serve: --git-push-max must be 1K to 4G\n");
        return 2;
    }
    if (serve_parse_size(&srv->sandbox_disk, "--sandbox-disk", srv->cfg.sandbox_disk, false) != 0 ||
        serve_parse_size(&srv->data_dir_reserve, "--data-dir-reserve", srv->cfg.data_dir_reserve,
                         false) != 0 ||
        serve_parse_size(&srv->max_push_bytes, "--max-push-bytes", srv->cfg.max_push_bytes,
                         false) != 0) {
        return 2;
    }
    if (parse_max_running(srv) != 0) {
        return 2;
    }
    return parse_runs(srv);
}

static bool one_of(const char *v, const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(v, names[i]) == 0) {
            return true;
        }
    }
    return false;
}

static int parse_defaults(struct server *srv)
{
    static const char *const providers[] = {"local", "process", "none", "agent-sandbox"};
    static const char *const notifiers[] = {"github", "gitlab", "none"};

    if (parse_numbers(srv) != 0) {
        return 2;
    }
    if (scm_level_parse(&srv->min_fix, srv->cfg.github_min_fix) != E_OK ||
        scm_level_parse(&srv->min_budget, srv->cfg.github_min_budget) != E_OK) {
        fprintf(stderr, "diverge: serve: permission tiers are read, triage, write, maintain or "
                        "admin\n");
        return 2;
    }
    if (gitlab_flags_check(srv) != 0) {
        return 2;
    }
    if (srv->cfg.namespace_ != NULL && !task_name_valid(srv->cfg.namespace_)) {
        fprintf(stderr, "diverge: serve: --namespace %s is not a DNS label\n", srv->cfg.namespace_);
        return 2;
    }
    if (srv->cfg.notifier_provider != NULL &&
        !one_of(srv->cfg.notifier_provider, notifiers, ARRAY_LEN(notifiers))) {
        fprintf(stderr, "diverge: serve: --notifier-provider is github, gitlab or none\n");
        return 2;
    }
    if (one_of(srv->cfg.sandbox_provider, providers, ARRAY_LEN(providers))) {
        return 0;
    }
    fprintf(stderr,
            "diverge: serve: --sandbox-provider must be local, process, none or "
            "agent-sandbox, not %s\n",
            srv->cfg.sandbox_provider);
    return 2;
}

static int setup_logging(const struct server_config *cfg)
{
    enum log_format fmt = isatty(STDERR_FILENO) ? LOG_FORMAT_TEXT : LOG_FORMAT_JSON;

    if (cfg->log_format != NULL && log_format_parse(&fmt, cfg->log_format) != E_OK) {
        fprintf(stderr, "diverge: serve: --log-format must be text or json, not %s\n",
                cfg->log_format);
        return 2;
    }
    log_set_format(fmt);
    return 0;
}

/* Raises the soft RLIMIT_NOFILE towards SERVER_NOFILE_RAISE_MAX within the hard limit:
 * every connection is a thread with its descriptors, and an LLM call four. The
 * server uses poll(), never select(), so descriptors past 1024 are fine. Warns when even
 * the hard limit is below what the connection limits need. */
static void raise_nofile(void)
{
    struct rlimit rl;
    rlim_t want = SERVER_NOFILE_RAISE_MAX, before;
    char cur[24], max[24], need[24], from[24];

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        return;
    }
    before = rl.rlim_cur;
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want) {
        want = rl.rlim_max;
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
        rl.rlim_cur = want;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0 || getrlimit(RLIMIT_NOFILE, &rl) != 0) {
            rl.rlim_cur = before;
        }
    }
    snprintf(cur, sizeof(cur), "%llu", (unsigned long long)rl.rlim_cur);
    snprintf(max, sizeof(max), "%llu", (unsigned long long)rl.rlim_max);
    snprintf(need, sizeof(need), "%d", SERVER_NOFILE_WANT);
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < SERVER_NOFILE_WANT) {
        log_kv(LOG_WARN, "fd_limit_low", "soft", cur, "hard", max, "wanted", need, "hint",
               "raise the hard RLIMIT_NOFILE (ulimit -Hn, LimitNOFILE=): each connection and "
               "each LLM stream needs descriptors",
               NULL);
    } else if (rl.rlim_cur != before) {
        snprintf(from, sizeof(from), "%llu", (unsigned long long)before);
        log_kv(LOG_INFO, "fd_limit_raised", "from", from, "to", cur, NULL);
    }
}

static bool provider_wanted(const struct server *srv, const char *name)
{
    return srv->cfg.notifier_provider == NULL || strcmp(srv->cfg.notifier_provider, name) == 0;
}

/* The SCM providers that have credentials, the outbox worker and the bot. */
/* bot_config.fix_coming: the embedded controller's sandbox provider gets ready. */
static void fix_coming(void *userdata)
{
    controller_start_coming(userdata);
}

static int start_scm(struct server *srv, struct err *err)
{
    struct scm_provider *gh = NULL;
    int rc;

    if (provider_wanted(srv, "github")) {
        if (github_auth_has_credentials(srv->gh_auth)) {
            struct github_config gc = {.api_url = srv->cfg.github_api_url,
                                       .bot_login = srv->cfg.bot_login};
            struct github_auth *auth = github_auth_ref(srv->gh_auth);
            rc = github_provider_new(&gh, &gc, auth, err);
            if (rc != E_OK) {
                github_auth_free(auth);
                return rc;
            }
            scm_registry_add(&srv->scm, gh);
        } else if (srv->cfg.github_webhook_secret != NULL) {
            log_kv(LOG_WARN, "github_no_credentials", "hint",
                   "set DIVERGE_NOTIFIER_TOKEN, GITHUB_TOKEN or --github-app-id: commands are "
                   "accepted but cannot be answered",
                   NULL);
        }
    }
    rc = start_gitlab(srv, err);
    if (rc != E_OK) {
        return rc;
    }
    /* The offline provider needs no credentials: always there for `diverge local`. */
    {
        struct scm_provider *local = NULL;
        rc = scm_local_new(&local, srv->store, err);
        if (rc != E_OK) {
            return rc;
        }
        scm_registry_add(&srv->scm, local);
    }
    if (srv->kube != NULL) {
        return E_OK; /* cluster mode: the leader runs the workers (serve_kube.c) */
    }
    return serve_scm_workers_start(srv, &srv->outbox, &srv->bot, &srv->notifier, err);
}

int serve_scm_workers_start(struct server *srv, struct scm_outbox **outbox, struct bot **bot,
                            struct scm_notifier **notifier, struct err *err)
{
    struct scm_outbox_config oc = SCM_OUTBOX_CONFIG_DEFAULTS;
    struct bot_config bc = BOT_CONFIG_DEFAULTS;
    int rc = scm_outbox_new(outbox, srv->store, &srv->scm, &oc, err);

    if (rc != E_OK) {
        return rc;
    }
    bc.namespace_override = srv->cfg.namespace_;
    bc.default_budget_usd = srv->default_budget_usd;
    bc.default_budget_tokens = srv->default_budget_tokens;
    bc.default_max_iterations = srv->default_max_iterations;
    bc.min_fix = srv->min_fix;
    bc.min_budget = srv->min_budget;
    bc.gitlab_min_fix = srv->gitlab_min_fix;
    bc.gitlab_min_budget = srv->gitlab_min_budget;
    bc.root_key = srv->root_key;
    bc.fix_coming = fix_coming;
    bc.fix_coming_userdata = srv->controller; /* freed after the bot (stop_scm first) */
    rc = bot_new(bot, srv->store, &srv->scm, &bc, err);
    if (rc == E_OK) {
        /* The sticky comment links the task's dashboard page only when --public-url
         * says where people reach the server (SPEC §12); the listen address may not be. */
        const char *pub = srv->cfg.public_url;
        struct scm_notifier_config nc = {.min_interval_ms = srv->notifier_min_interval_ms,
                                         .manual = false,
                                         .dashboard_url =
                                             pub != NULL && pub[0] != '\0' ? pub : NULL};
        rc = scm_notifier_new(notifier, srv->store, &srv->scm, &nc, err);
    }
    return rc;
}

static void stop_scm(struct server *srv)
{
    scm_notifier_free(srv->notifier);
    srv->notifier = NULL;
    bot_free(srv->bot);
    srv->bot = NULL;
    scm_outbox_free(srv->outbox);
    srv->outbox = NULL;
    scm_registry_cleanup(&srv->scm);
}

static int wait_for_signal(void)
{
    sigset_t set;
    int sig = 0;

    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigwait(&set, &sig);
    return sig;
}

/* What the cluster mode's leader starts (serve_kube.c). */
static const struct serve_kube_workers g_kube_workers = {
    .controller_make = serve_controller_make,
    .egress_own = serve_egress_own,
    .scm_start = serve_scm_workers_start,
};

/* Everything `serve` runs, from SRV->cfg: data dir, secrets, store, workers, HTTP. On
 * failure whatever was started is stopped again. */
static int start_all(struct server *srv, struct err *err)
{
    char *db = NULL;
    uint16_t port = 0;
    int rc;

    srv->routes = &api_routes;
    /* First: it takes the provider keys out of the environment before any thread or child
     * could see them. */
    rc = llm_gateway_new(&srv->llm, srv->cfg.llm_upstreams, srv->cfg.llm_key_files,
                         srv->cfg.llm_prices, err);
    if (rc == E_OK) {
        rc = prepare_data_dir(srv, err);
    }
    if (rc == E_OK) {
        rc = load_secrets(srv, err);
    }
    if (rc == E_OK) {
        if (strcmp(srv->cfg.store, "kubernetes") == 0) {
            rc = serve_kube_open_store(srv, &g_kube_workers, err);
        } else {
            db = xasprintf("%s/diverge.db", srv->cfg.data_dir);
            rc = task_store_sqlite_open(&srv->store, db, clock_system(), err);
        }
    }
    if (rc == E_OK) {
        rc = meter_service_new(&srv->meter, srv->store, srv->root_key, err);
    }
    if (rc == E_OK) {
        llm_gateway_recover(srv); /* before tasks restart: they see what was charged */
    }
    if (rc == E_OK && srv->kube == NULL) {
        rc = serve_controller_new(srv, err); /* cluster mode: the leader's (serve_kube.c) */
    }
    if (rc == E_OK) {
        rc = start_scm(srv, err);
    }
    if (rc == E_OK) {
        rc = http_start(&srv->daemon, &port, srv, err);
    }
    if (rc == E_OK) {
        /* After the listener: sandboxes get the meter URL with the bound port. */
        set_bound_listen(srv, port);
        rc = serve_tls_start(srv, err);
        if (rc == E_OK) {
            rc = serve_sandbox_start(srv, err);
        }
        if (rc != E_OK) {
            serve_sandbox_stop(srv);
            serve_tls_stop(srv);
            http_stop(srv->daemon, srv);
            srv->daemon = NULL;
        }
    }
    free(db);
    if (rc != E_OK) {
        serve_kube_elect_stop(srv);
        stop_scm(srv);
        controller_free(srv->controller);
        llm_gateway_free(srv->llm);
        srv->llm = NULL;
        meter_service_free(srv->meter);
        task_store_close(srv->store);
        srv->store = NULL;
        serve_github_close(srv);
        return rc;
    }
    atomic_store(&srv->started, true);
    return E_OK;
}

/* Stops accepting, ends watch streams, lets requests in flight finish, stops the rest. */
static void stop_all(struct server *srv)
{
    atomic_store(&srv->shutting_down, true);
    task_store_wake(srv->store);
    serve_kube_elect_stop(srv); /* the leader's workers, then the Lease is released */
    serve_sandbox_stop(srv);
    serve_tls_stop(srv);
    http_stop(srv->daemon, srv);
    srv->daemon = NULL;
    stop_scm(srv);
    controller_free(srv->controller);
    llm_gateway_free(srv->llm); /* its streams end with their connections, closed above */
    srv->llm = NULL;
    meter_service_free(srv->meter);
    task_store_close(srv->store);
    srv->store = NULL;
    serve_github_close(srv); /* after the provider and controller dropped their references */
}

static int run(struct server *srv)
{
    struct err err = {0};
    int sig;

    if (start_all(srv, &err) != E_OK) {
        fprintf(stderr, "diverge: serve: %s\n", err.msg);
        return 1;
    }
    log_kv(LOG_INFO, "server_started", "listen", srv->cfg.listen, "data_dir", srv->cfg.data_dir,
           "store", srv->cfg.store, NULL);
    print_endpoints(srv);
    sig = wait_for_signal();
    log_kv(LOG_INFO, "server_stopping", "signal", sig == SIGTERM ? "SIGTERM" : "SIGINT", NULL);
    stop_all(srv);
    log_kv(LOG_INFO, "server_stopped", NULL);
    return 0;
}

static void server_cleanup(struct server *srv)
{
    if (srv->api_token != NULL) {
        secret_wipe(srv->api_token, strlen(srv->api_token));
    }
    free(srv->api_token);
    srv->api_token = NULL;
    ui_sessions_free(srv->sessions);
    srv->sessions = NULL;
    secret_wipe(srv->root_key, sizeof(srv->root_key));
    free(srv->base_url);
    srv->base_url = NULL;
    if (srv->data_lock_fd >= 0) {
        close(srv->data_lock_fd); /* the lock goes with it */
        srv->data_lock_fd = -1;
    }
    serve_config_cleanup(&srv->cfg);
}

int server_start(struct server **out, int argc, char **argv, struct err *err)
{
    struct server *srv = xcalloc(1, sizeof(*srv));
    int rc;

    *out = NULL;
    srv->data_lock_fd = -1;
    atomic_init(&srv->shutting_down, false);
    atomic_init(&srv->started, false);
    rc = serve_parse_flags(&srv->cfg, argc, argv) == 0 && parse_defaults(srv) == 0
             ? E_OK
             : err_set(err, E_INVALID, "bad serve flags");
    if (rc == E_OK) {
        rc = start_all(srv, err);
    }
    if (rc != E_OK) {
        server_cleanup(srv);
        free(srv);
        return rc;
    }
    *out = srv;
    return E_OK;
}

void server_stop(struct server *srv)
{
    if (srv == NULL) {
        return;
    }
    stop_all(srv);
    server_cleanup(srv);
    free(srv);
}

int server_main(int argc, char **argv)
{
    struct server srv;
    sigset_t set;
    int rc;

    memset(&srv, 0, sizeof(srv));
    srv.data_lock_fd = -1;
    rc = serve_parse_flags(&srv.cfg, argc, argv);
    if (rc == 0) {
        rc = setup_logging(&srv.cfg);
    }
    if (rc == 0) {
        rc = parse_defaults(&srv);
    }
    if (rc == 0 && strcmp(srv.cfg.store, "sqlite") != 0 &&
        strcmp(srv.cfg.store, "kubernetes") != 0) {
        fprintf(stderr, "diverge: serve: --store is sqlite or kubernetes, not %s\n", srv.cfg.store);
        rc = 2;
    }
    if (rc != 0) {
        serve_config_cleanup(&srv.cfg);
        return rc < 0 ? 0 : rc;
    }
    /* Block the stop signals in every thread; the main thread takes them with sigwait. */
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    raise_nofile();
    /* The database and workspaces hold tokens and task data: owner-only. */
    umask(077);
    atomic_init(&srv.shutting_down, false);
    atomic_init(&srv.started, false);
    rc = run(&srv);
    server_cleanup(&srv);
    return rc;
}
