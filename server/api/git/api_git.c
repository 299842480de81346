/* SPDX-License-Identifier: Apache-2.0 */
/* Git smart HTTP for sandbox pods (SPEC §9 with --sandbox-provider agent-sandbox): under
 * /api/v1/git/<ns>/<task>.git/ a pod clones and fetches the task's repository mirror
 * (read-only, upload-pack) and pushes into the task's staging repository (receive-pack),
 * authenticated with the task's current macaroon (as the meter checks it: signature,
 * caveats, the token index's active token, task Active). A push may only create or
 * fast-forward refs/heads/<workingBranch>: the ref updates are read here before git sees
 * them, and git runs with receive.denyNonFastForwards / denyDeletes. git http-backend runs
 * as CGI with a fixed environment (no system or global config, hooks off); the request body
 * (capped by the route, spooled to an unlinked file under <data-dir>/spool as it arrives,
 * never held in memory) is its stdin, its output is streamed back. A task runs at most
 * API_GIT_TASK_REQUESTS_MAX requests at once, the server API_GIT_REQUESTS_MAX. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/secret.h"
#include "server/api/git/api_git.h"
#include "server/api/api_int.h"
#include "token/token.h"

extern char **environ;

#define CGI_HEAD_MAX 8192 /* bytes of http-backend's response headers */
#define GIT_READ_TIMEOUT_MS (SERVER_IDLE_TIMEOUT_S * 1000)
#define GIT_ENV_MAX 40

enum git_service { SVC_UPLOAD, SVC_RECEIVE };

/* What an authorized request may reach. */
struct git_target {
    char task[API_GIT_NAME_MAX + 1];
    char *url;                /* spec.repository.url */
    char *working;            /* spec.repository.workingBranch */
    const char *push_refusal; /* static: why the server would not push it, or NULL */
};

static void target_cleanup(struct git_target *t)
{
    free(t->url);
    free(t->working);
    t->url = NULL;
    t->working = NULL;
}

static bool signature_ok(struct request *r, const char *text)
{
    struct token *tok = NULL;
    struct err err = {0};
    bool ok = token_decode(&tok, text, strlen(text), &err) == E_OK &&
              token_verify_signature(tok, r->srv->root_key, &err) == E_OK;

    token_free(tok);
    return ok;
}

/* True when the token string TEXT is NS/TASK's current token and the task runs. Sets
 * *status to the refusal (401, 403) otherwise. */
static bool token_ok(int *status, struct request *r, const char *text, const char *ns,
                     const json_t *doc)
{
    const json_t *repo = json_object_get(json_object_get(doc, "spec"), "repository");
    struct token_context ctx = {
        .task = json_string_value(json_object_get(json_object_get(doc, "metadata"), "name")),
        .ns = ns,
        .repo = json_string_value(json_object_get(repo, "url")),
        .branch = json_string_value(json_object_get(repo, "workingBranch")),
        .now_ms = clock_now_ms(clock_system()),
    };
    struct token *tok = NULL;
    struct token_grant grant;
    struct token_record rec = {0};
    struct task_view v;
    struct err err = {0};
    bool current;

    *status = 401;
    if (token_decode(&tok, text, strlen(text), &err) != E_OK ||
        token_verify_signature(tok, r->srv->root_key, &err) != E_OK) {
        token_free(tok);
        return false;
    }
    *status = 403;
    if (doc == NULL || token_check_caveats(&grant, tok, &ctx, &err) != E_OK) {
        token_free(tok);
        return false;
    }
    current = task_store_token_current(&rec, r->srv->store, ns, ctx.task, &err) == E_OK &&
              rec.active && strcmp(rec.token_id, token_identifier(tok)) == 0;
    free(rec.token);
    token_free(tok);
    if (!current) {
        *status = 401; /* revoked (paused, finished) or replaced */
        return false;
    }
    task_view_of(&v, doc);
    return v.phase == TASK_ACTIVE;
}

/* Authorizes R for the repository of its path; fills T. Answers the refusal itself (and
 * returns false): 404 for a path that names no repository, 401 without a valid current
 * token, 403 with a token of another task or a task that does not run. */
static bool authorize(struct request *r, struct git_target *t, int *ret)
{
    const char *ns = r->params[0];
    json_t *doc = NULL;
    struct err err = {0};
    char *text;
    int status = 401;
    bool ok;

    memset(t, 0, sizeof(*t));
    if (!api_git_name_ok(ns) || api_git_repo_name(t->task, r->params[1], &err) != E_OK) {
        *ret = http_send_error(r, 404, NULL, NULL, "no such repository");
        return false;
    }
    text = http_header_count(r, MHD_HTTP_HEADER_AUTHORIZATION) == 1
               ? api_git_auth_token(http_header(r, MHD_HTTP_HEADER_AUTHORIZATION))
               : NULL;
    if (text == NULL) {
        *ret = http_send_error(r, 401, NULL, NULL, "the task's token is required");
        return false;
    }
    /* The signature before any store read: a request without a token we minted costs
     * no lookup. */
    ok = signature_ok(r, text);
    if (ok) {
        (void)task_store_get(&doc, r->srv->store, ns, t->task, &err);
        ok = token_ok(&status, r, text, ns, doc);
    }
    secret_wipe(text, strlen(text));
    free(text);
    if (ok) {
        const json_t *repo = json_object_get(json_object_get(doc, "spec"), "repository");
        const char *url = json_string_value(json_object_get(repo, "url"));
        const char *wb = json_string_value(json_object_get(repo, "workingBranch"));
        t->url = url != NULL ? xstrdup(url) : NULL;
        t->working = wb != NULL ? xstrdup(wb) : NULL;
        t->push_refusal = controller_push_refusal(doc, r->srv->root_key);
    }
    json_decref(doc);
    if (!ok) {
        *ret = http_send_error(r, status, NULL, NULL,
                               status == 401 ? "the token is not valid or no longer current"
                                             : "the token does not grant this repository");
        return false;
    }
    if (t->url == NULL) {
        target_cleanup(t);
        *ret = http_send_error(r, 404, NULL, NULL, "the task has no repository");
        return false;
    }
    return true;
}

static struct api_git_gate g_gate; /* process-wide: every listener shares the limits */
static pthread_once_t g_gate_once = PTHREAD_ONCE_INIT;

static void gate_init(void)
{
    api_git_gate_init(&g_gate, API_GIT_TASK_REQUESTS_MAX, API_GIT_REQUESTS_MAX);
}

/* 429 with Retry-After: git says "The requested URL returned error: 429". */
static int send_busy(struct request *r, const struct err *err)
{
    char *text =
        xasprintf("{\"error\":\"%s; retry later\",\"reason\":\"TooManyRequests\"}\n", err->msg);
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    char retry[16];
    int ret;

    if (resp == NULL) {
        free(text);
        return MHD_NO;
    }
    snprintf(retry, sizeof(retry), "%d", API_GIT_RETRY_AFTER_S);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, retry);
    http_guard_answering(r->conn);
    r->status = 429;
    ret = MHD_queue_response(r->conn, 429, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* An unlinked file under <data-dir>/spool for a request body; -1 on failure. */
static int spool_open(const struct server *srv)
{
    char *dir = xasprintf("%s/spool", srv->cfg.data_dir);
    int fd = -1;

    if (mkdir(dir, 0700) == 0 || errno == EEXIST) {
        fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
            char *tmpl = xasprintf("%s/body-XXXXXX", dir); /* no O_TMPFILE on this fs */
            fd = mkostemp(tmpl, O_CLOEXEC);
            if (fd >= 0) {
                (void)unlink(tmpl);
            }
            free(tmpl);
        }
    }
    free(dir);
    return fd;
}

int api_git_begin(struct request *r)
{
    struct git_target t;
    struct api_git_slot *slot = NULL;
    struct err err = {0};
    int ret = MHD_YES;

    if (!authorize(r, &t, &ret)) {
        return ret;
    }
    target_cleanup(&t);
    pthread_once(&g_gate_once, gate_init);
    if (api_git_gate_enter(&slot, &g_gate, r->params[0], t.task, &err) != E_OK) {
        return send_busy(r, &err);
    }
    r->on_done = api_git_gate_leave; /* held until the response has been sent */
    r->on_done_arg = slot;
    if (strcmp(r->method, "POST") == 0) {
        r->body_fd = spool_open(r->srv);
        if (r->body_fd < 0) {
            log_kv(LOG_WARN, "git_spool_failed", "error", strerror(errno), NULL);
            return http_send_error(r, 503, NULL, NULL, "the request body cannot be stored; retry");
        }
        if (strcmp(http_route_name(r->srv, r->route), "git.receive") == 0) {
            r->body_max = r->srv->git_push_max;
        }
    }
    return MHD_YES;
}

/* The request body's length (spooled or in memory). */
static size_t body_len(const struct request *r)
{
    return r->body_fd >= 0 ? r->body_spooled : r->body.len;
}

/* --- the repository directories --------------------------------------------------------- */

static bool is_dir(const char *p)
{
    struct stat sb;

    return lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* The mirror of URL under the data dir (the controller's layout, controller/workspace.c),
 * checked against the URL it records; NULL when there is none. *root_out: its parent. */
static char *mirror_dir(const struct server *srv, const char *url)
{
    char *dir = xasprintf("%s/mirrors/%016llx.git", srv->cfg.data_dir,
                          (unsigned long long)hash_fnv1a_str(url));
    char *marker = xasprintf("%s/diverge-url", dir);
    char got[2100] = {0};
    int fd = open(marker, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    ssize_t n = fd >= 0 ? read(fd, got, sizeof(got) - 1) : -1;

    if (fd >= 0) {
        close(fd);
    }
    free(marker);
    if (n < 0 || strcmp(got, url) != 0 || !is_dir(dir)) {
        free(dir);
        return NULL;
    }
    return dir;
}

/* --- running git http-backend ----------------------------------------------------------- */

struct git_child {
    pid_t pid;
    int out;  /* its stdout */
    bool eof; /* read to the end */
    char head[CGI_HEAD_MAX + 1];
    size_t head_len, body_off; /* bytes in HEAD; where the body starts in it */
};

static size_t env_add(char **env, size_t n, char *kv)
{
    ASSERT(n < GIT_ENV_MAX);
    env[n] = kv;
    return n + 1;
}

/* The config git runs with (GIT_CONFIG_COUNT: over the repository's own): hooks off,
 * only fast-forwards of existing refs, no deletes, objects checked, only SVC served. */
static size_t cgi_config(char **env, size_t n, enum git_service svc)
{
    static const char *const cfg[] = {
        "core.hooksPath=/dev/null", "receive.denyNonFastForwards=true",
        "receive.denyDeletes=true", "receive.fsckObjects=true",
        "receive.autogc=false",     "receive.advertisePushOptions=false",
        "http.getanyfile=false",    "uploadpack.allowAnySHA1InWant=false",
    };
    size_t k = 0;

    for (size_t i = 0; i < ARRAY_LEN(cfg); i++) {
        const char *eq = strchr(cfg[i], '=');
        n = env_add(env, n, xasprintf("GIT_CONFIG_KEY_%zu=%.*s", k, (int)(eq - cfg[i]), cfg[i]));
        n = env_add(env, n, xasprintf("GIT_CONFIG_VALUE_%zu=%s", k, eq + 1));
        k++;
    }
    n = env_add(env, n, xasprintf("GIT_CONFIG_KEY_%zu=http.uploadpack", k));
    n = env_add(env, n,
                xasprintf("GIT_CONFIG_VALUE_%zu=%s", k, svc == SVC_UPLOAD ? "true" : "false"));
    k++;
    n = env_add(env, n, xasprintf("GIT_CONFIG_KEY_%zu=http.receivepack", k));
    n = env_add(env, n,
                xasprintf("GIT_CONFIG_VALUE_%zu=%s", k, svc == SVC_RECEIVE ? "true" : "false"));
    k++;
    n = env_add(env, n, xasprintf("GIT_CONFIG_COUNT=%zu", k));
    return n;
}

/* The CGI environment: nothing of the server's but PATH, nothing of the request but
 * what is checked here. */
static size_t cgi_env(char **env, struct request *r, enum git_service svc, const char *root,
                      const char *path_info, bool post)
{
    const char *path = getenv("PATH");
    const char *proto = http_header(r, "Git-Protocol");
    const char *enc = http_header(r, MHD_HTTP_HEADER_CONTENT_ENCODING);
    const char *name = svc == SVC_UPLOAD ? "git-upload-pack" : "git-receive-pack";
    size_t n = 0;

    n = env_add(env, n, xasprintf("PATH=%s", path != NULL ? path : "/usr/bin:/bin"));
    n = env_add(env, n, xstrdup("HOME=/nonexistent"));
    n = env_add(env, n, xstrdup("GIT_CONFIG_NOSYSTEM=1"));
    n = env_add(env, n, xstrdup("GIT_CONFIG_GLOBAL=/dev/null"));
    n = env_add(env, n, xstrdup("GIT_TERMINAL_PROMPT=0"));
    n = env_add(env, n, xstrdup("GIT_HTTP_EXPORT_ALL=1"));
    n = env_add(env, n, xasprintf("GIT_PROJECT_ROOT=%s", root));
    n = env_add(env, n, xasprintf("PATH_INFO=%s", path_info));
    n = env_add(env, n, xasprintf("REQUEST_METHOD=%s", post ? "POST" : "GET"));
    n = env_add(env, n,
                xasprintf("QUERY_STRING=%s", post                ? ""
                                             : svc == SVC_UPLOAD ? "service=git-upload-pack"
                                                                 : "service=git-receive-pack"));
    if (post) {
        n = env_add(env, n, xasprintf("CONTENT_TYPE=application/x-%s-request", name));
        n = env_add(env, n, xasprintf("CONTENT_LENGTH=%zu", body_len(r)));
        if (svc == SVC_UPLOAD && enc != NULL && strcmp(enc, "gzip") == 0) {
            n = env_add(env, n, xstrdup("HTTP_CONTENT_ENCODING=gzip"));
        }
    }
    if (svc == SVC_UPLOAD && proto != NULL && strcmp(proto, "version=2") == 0) {
        n = env_add(env, n, xstrdup("GIT_PROTOCOL=version=2"));
    }
    n = cgi_config(env, n, svc);
    env[n] = NULL;
    return n;
}

/* The request body as a file at offset 0 (http-backend's stdin): the spool, else the
 * (small, GET) body in a memfd; -1 on failure. */
static int body_fd(const struct request *r)
{
    int fd;
    size_t off = 0;

    if (r->body_fd >= 0) {
        return lseek(r->body_fd, 0, SEEK_SET) == 0 ? fcntl(r->body_fd, F_DUPFD_CLOEXEC, 0) : -1;
    }
    fd = memfd_create("diverge-git-body", MFD_CLOEXEC);

    while (fd >= 0 && off < r->body.len) {
        ssize_t w = write(fd, r->body.data + off, r->body.len - off);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            close(fd);
            return -1;
        }
        off += (size_t)w;
    }
    if (fd >= 0 && lseek(fd, 0, SEEK_SET) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int spawn_backend(struct git_child *ch, char **env, int in)
{
    const char *argv[] = {"git", "http-backend", NULL};
    posix_spawn_file_actions_t fa;
    int pipefd[2], rc;

    if (pipe2(pipefd, O_CLOEXEC) != 0) {
        return E_FAIL;
    }
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in, 0);
    posix_spawn_file_actions_adddup2(&fa, pipefd[1], 1);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    rc = posix_spawnp(&ch->pid, "git", &fa, NULL, (char *const *)(uintptr_t)argv, env);
    posix_spawn_file_actions_destroy(&fa);
    close(pipefd[1]);
    if (rc != 0) {
        close(pipefd[0]);
        return E_FAIL;
    }
    ch->out = pipefd[0];
    return E_OK;
}

/* Reads up to MAX bytes of CH's stdout into BUF, waiting at most GIT_READ_TIMEOUT_MS. */
static ssize_t child_read(struct git_child *ch, char *buf, size_t max)
{
    struct pollfd pfd = {.fd = ch->out, .events = POLLIN};
    ssize_t n;

    for (;;) {
        int p = poll(&pfd, 1, GIT_READ_TIMEOUT_MS);
        if (p < 0 && errno == EINTR) {
            continue;
        }
        if (p <= 0) {
            return -1;
        }
        n = read(ch->out, buf, max);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        return n;
    }
}

static void child_end(struct git_child *ch)
{
    int st;

    if (ch->out >= 0) {
        close(ch->out);
    }
    if (ch->pid > 0) {
        if (!ch->eof && waitpid(ch->pid, &st, WNOHANG) == 0) {
            (void)kill(ch->pid, SIGKILL);
        }
        while (waitpid(ch->pid, &st, 0) < 0 && errno == EINTR) {
        }
    }
    free(ch);
}

/* Reads http-backend's CGI headers; *status and CTYPE (cap 128) from them. */
static int read_head(struct git_child *ch, int *status, char *ctype)
{
    char *end = NULL;
    size_t hl;

    while (end == NULL) {
        ssize_t n;
        if (ch->head_len >= CGI_HEAD_MAX) {
            return E_TOOBIG;
        }
        n = child_read(ch, ch->head + ch->head_len, CGI_HEAD_MAX - ch->head_len);
        if (n <= 0) {
            return E_FAIL;
        }
        ch->head_len += (size_t)n;
        ch->head[ch->head_len] = '\0';
        end = strstr(ch->head, "\r\n\r\n");
    }
    hl = (size_t)(end - ch->head);
    ch->body_off = hl + 4;
    *status = 200;
    ctype[0] = '\0';
    for (char *line = ch->head; line < ch->head + hl;) {
        char *eol = strstr(line, "\r\n");
        *eol = '\0';
        if (strncasecmp(line, "Status: ", 8) == 0) {
            *status = (int)strtol(line + 8, NULL, 10);
        } else if (strncasecmp(line, "Content-Type: ", 14) == 0) {
            snprintf(ctype, 128, "%s", line + 14);
        }
        line = eol + 2;
    }
    return *status >= 200 && *status < 600 ? E_OK : E_FAIL;
}

static ssize_t stream_cb(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct git_child *ch = cls;
    ssize_t n;

    (void)pos;
    if (ch->body_off < ch->head_len) {
        size_t k = ch->head_len - ch->body_off;
        k = k < max ? k : max;
        memcpy(buf, ch->head + ch->body_off, k);
        ch->body_off += k;
        return (ssize_t)k;
    }
    n = child_read(ch, buf, max);
    if (n == 0) {
        ch->eof = true;
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    return n < 0 ? MHD_CONTENT_READER_END_WITH_ERROR : n;
}

static void stream_free(void *cls)
{
    child_end(cls);
}

/* Runs http-backend for SVC on the repository ROOT/PATH_INFO and streams its answer. */
static int run_backend(struct request *r, enum git_service svc, const char *root,
                       const char *path_info, bool post)
{
    char *env[GIT_ENV_MAX + 1];
    struct git_child *ch = xcalloc(1, sizeof(*ch));
    struct MHD_Response *resp;
    char ctype[128];
    int in = body_fd(r), status = 500, rc;
    size_t n = cgi_env(env, r, svc, root, path_info, post);

    ch->out = -1;
    rc = in >= 0 ? spawn_backend(ch, env, in) : E_FAIL;
    if (in >= 0) {
        close(in);
    }
    for (size_t i = 0; i < n; i++) {
        free(env[i]);
    }
    if (rc == E_OK) {
        rc = read_head(ch, &status, ctype);
    }
    if (rc != E_OK) {
        child_end(ch);
        log_kv(LOG_WARN, "git_backend_failed", "route", http_route_name(r->srv, r->route), NULL);
        return http_send_error(r, 500, NULL, NULL, "git http-backend failed");
    }
    resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, stream_cb, ch, stream_free);
    if (resp == NULL) {
        child_end(ch);
        return MHD_NO;
    }
    if (ctype[0] != '\0') {
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache, max-age=0");
    http_guard_answering(r->conn);
    r->status = status;
    rc = MHD_queue_response(r->conn, (unsigned int)status, resp);
    MHD_destroy_response(resp);
    return rc;
}

/* Checks the commands at the start of R's receive-pack body (an empty push, "0000", passes);
 * answers the refusal itself (and returns false). */
static bool push_ok(struct request *r, const struct git_target *t, int *ret)
{
    const char *enc = http_header(r, MHD_HTTP_HEADER_CONTENT_ENCODING);
    size_t len = body_len(r), n = len < API_GIT_COMMANDS_MAX ? len : API_GIT_COMMANDS_MAX;
    char *head = xmalloc(n + 1);
    struct err err = {0};
    bool ok = true;

    if (r->body_fd >= 0) {
        ssize_t got = pread(r->body_fd, head, n, 0);
        n = got > 0 ? (size_t)got : 0;
    } else if (n > 0) {
        memcpy(head, r->body.data, n);
    }
    head[n] = '\0';
    if (enc != NULL && strcmp(enc, "identity") != 0) {
        *ret = http_send_error(r, 415, NULL, NULL, "compressed pushes are not accepted");
        ok = false;
    } else if (api_git_check_push(head, n, t->working, &err) != E_OK &&
               !(len == 4 && n == 4 && memcmp(head, "0000", 4) == 0)) {
        *ret = http_send_error(r, 403, NULL, NULL, "push refused: %s", err.msg);
        ok = false;
    }
    free(head);
    return ok;
}

/* Serves SVC for R's task: the mirror for upload-pack, the staging repo for receive-pack. */
static int serve(struct request *r, enum git_service svc, const char *suffix, bool post)
{
    struct git_target t;
    char *dir = NULL, *root = NULL, *info = NULL;
    int ret = MHD_NO;

    if (!authorize(r, &t, &ret)) {
        return ret;
    }
    if (svc == SVC_UPLOAD) {
        dir = mirror_dir(r->srv, t.url);
    } else {
        dir = xasprintf("%s/staging/%s/%s.git", r->srv->cfg.data_dir, r->params[0], t.task);
        if (!is_dir(dir)) {
            free(dir);
            dir = NULL;
        }
    }
    if (dir == NULL) {
        ret = http_send_error(r, 404, NULL, NULL, "the task's repository is not prepared");
        goto out;
    }
    if (svc == SVC_RECEIVE && t.push_refusal != NULL) {
        /* The staging repository takes only what the server would push on (SPEC §9). */
        ret = http_send_error(r, 403, NULL, NULL, "push refused: %s", t.push_refusal);
        goto out;
    }
    if (svc == SVC_RECEIVE && post && !push_ok(r, &t, &ret)) {
        goto out;
    }
    root = xstrdup(dir);
    *strrchr(root, '/') = '\0';
    info = xasprintf("%s/%s", strrchr(dir, '/'), suffix);
    ret = run_backend(r, svc, root, info, post);
out:
    free(dir);
    free(root);
    free(info);
    target_cleanup(&t);
    return ret;
}

int api_git_info_refs(struct request *r)
{
    const char *svc = http_query(r, "service");

    if (svc == NULL ||
        (strcmp(svc, "git-upload-pack") != 0 && strcmp(svc, "git-receive-pack") != 0)) {
        return http_send_error(r, 403, NULL, NULL,
                               "only the smart protocol is served (service=git-upload-pack or "
                               "git-receive-pack)");
    }
    return serve(r, strcmp(svc, "git-upload-pack") == 0 ? SVC_UPLOAD : SVC_RECEIVE, "info/refs",
                 false);
}

int api_git_upload_pack(struct request *r)
{
    return serve(r, SVC_UPLOAD, "git-upload-pack", true);
}

int api_git_receive_pack(struct request *r)
{
    return serve(r, SVC_RECEIVE, "git-receive-pack", true);
}
