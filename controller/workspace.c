/* SPDX-License-Identifier: Apache-2.0 */
/* Repository plumbing outside the sandbox (SPEC §9): one mirror per repository URL under
 * <data-dir>/mirrors (cloned once, fetched for later tasks), a writable staging bare repo
 * per task that the runner pushes to, and the server's push of the working branch from
 * staging to the real remote. git runs through posix_spawnp with argv arrays; its output
 * goes to the task log. Fetches and pushes get the server's SCM credentials (GitHub App
 * installation token or PAT for the GitHub web host, GitLab token for the GitLab URL)
 * through credential helpers reading git's environment: never argv, URL or a file. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/gitref.h"
#include "common/hash.h"
#include "common/secret.h"
#include "controller/controller_int.h"

extern char **environ;

#define GIT_OUTPUT_MAX (64 * 1024) /* bytes of git output kept for the log */

/* A token from the first of the environment variables NAMES that is set, or NULL. A token
 * with a line break could add lines to git's credential answer: never used. */
static const char *env_token(const char *const *names, size_t n)
{
    const char *v = secret_env_first(names, n);

    return v != NULL && strpbrk(v, "\r\n") == NULL ? v : NULL;
}

/* Whether URL can be part of a git config key: nothing that could end or split it. */
static bool key_safe(const char *url)
{
    return url != NULL && url[0] != '\0' && strpbrk(url, " \t\r\n\"'\\") == NULL;
}

/* The credentials of one fetch or push: at most one for the GitHub web host and one for
 * the GitLab base URL. Tokens are owned secrets, wiped by creds_free(). */
struct creds {
    char *gh_base;       /* owned: the GitHub web base, or NULL */
    char *gh_token;      /* owned secret: an App installation token or the PAT, or NULL */
    const char *gl_base; /* borrowed: the GitLab base URL */
    char *gl_token;      /* owned secret, or NULL */
};

static void wipe_free(char *s)
{
    if (s != NULL) {
        secret_wipe(s, strlen(s));
        free(s);
    }
}

static void creds_free(struct creds *cr)
{
    free(cr->gh_base);
    wipe_free(cr->gh_token);
    wipe_free(cr->gl_token);
    memset(cr, 0, sizeof(*cr));
}

/* The GitHub App's installation token for URL when it is a repository on the web host
 * BASE (else NULL; a failure goes to the task log, and git goes on without). */
static char *app_token(struct controller *c, const char *base, const char *url,
                       const char *log_path)
{
    char *project = controller_github_project(url, base), *tok = NULL;
    struct err err = {0};

    if (project == NULL) {
        return NULL;
    }
    if (c->git_auth.token(c->git_auth.userdata, project, &tok, &err) != E_OK) {
        sandbox_log_event(log_path, "[diverge] no GitHub App token for %s: %s", project, err.msg);
        tok = NULL;
    } else if (tok == NULL || tok[0] == '\0' || strpbrk(tok, "\r\n") != NULL) {
        wipe_free(tok);
        tok = NULL;
    }
    free(project);
    return tok;
}

/* The server's SCM credentials for a fetch or push of URL (SPEC §9): for the GitHub web
 * host of --github-api-url (github.com for api.github.com) the GitHub App's installation
 * token of URL's repository when an App is configured, else DIVERGE_NOTIFIER_TOKEN or
 * GITHUB_TOKEN; for the GitLab base URL (DIVERGE_GITLAB_URL, which --gitlab-url sets;
 * default https://gitlab.com) DIVERGE_GITLAB_TOKEN or GITLAB_TOKEN. */
static void creds_for(struct creds *cr, struct controller *c, const char *url, const char *log_path)
{
    static const char *const gh_vars[] = {"DIVERGE_NOTIFIER_TOKEN", "GITHUB_TOKEN"};
    static const char *const gl_vars[] = {"DIVERGE_GITLAB_TOKEN", "GITLAB_TOKEN"};
    const char *gl = env_token(gl_vars, ARRAY_LEN(gl_vars));
    const char *gh;

    memset(cr, 0, sizeof(*cr));
    cr->gh_base = controller_github_web_base(c->github_api_url != NULL ? c->github_api_url
                                                                       : "https://api.github.com");
    if (!key_safe(cr->gh_base)) {
        free(cr->gh_base);
        cr->gh_base = NULL;
    } else if (c->git_auth.token != NULL &&
               (c->git_auth.active == NULL || c->git_auth.active(c->git_auth.userdata))) {
        cr->gh_token = app_token(c, cr->gh_base, url, log_path);
    } else if ((gh = env_token(gh_vars, ARRAY_LEN(gh_vars))) != NULL) {
        cr->gh_token = xstrdup(gh);
    }
    cr->gl_base = getenv("DIVERGE_GITLAB_URL");
    if (cr->gl_base == NULL || cr->gl_base[0] == '\0') {
        cr->gl_base = "https://gitlab.com";
    }
    if (gl != NULL && key_safe(cr->gl_base)) {
        cr->gl_token = xstrdup(gl);
    }
}

/* Appends credential helper number *K for URL_PREFIX (git's credential.<url>.helper),
 * answering USER and the password in the environment variable VAR. */
static size_t add_helper(char **env, size_t n, int *k, const char *url_prefix, const char *user,
                         const char *var)
{
    env[n++] = xasprintf("GIT_CONFIG_KEY_%d=credential.%s.helper", *k, url_prefix);
    env[n++] = xasprintf("GIT_CONFIG_VALUE_%d=!f() { test \"$1\" = get || return 0; "
                         "echo username=%s; echo \"password=$%s\"; }; f",
                         *k, user, var);
    (*k)++;
    return n;
}

/* Hands CR's tokens to git by fixed credential helpers that read them from git's
 * environment, so a token is never in an argv, a URL or a file (and never in a sandbox,
 * which gets only the mirror and staging paths). */
static char **with_credentials(char **env, size_t n, const struct creds *cr)
{
    int k = 0;

    if (cr == NULL || (cr->gh_token == NULL && cr->gl_token == NULL)) {
        return env;
    }
    env = xrealloc(env, (n + 8) * sizeof(*env));
    if (cr->gh_token != NULL) {
        env[n++] = xasprintf("DIVERGE_GIT_TOKEN=%s", cr->gh_token);
        n = add_helper(env, n, &k, cr->gh_base, "x-access-token", "DIVERGE_GIT_TOKEN");
    }
    if (cr->gl_token != NULL) {
        env[n++] = xasprintf("DIVERGE_GIT_GITLAB_TOKEN=%s", cr->gl_token);
        n = add_helper(env, n, &k, cr->gl_base, "oauth2", "DIVERGE_GIT_GITLAB_TOKEN");
    }
    env[n++] = xasprintf("GIT_CONFIG_COUNT=%d", k);
    env[n] = NULL;
    return env;
}

/* git's environment: the server's variables git needs, C locale, no prompt, EXTRA
 * ("NAME=value", may be NULL) and CR's credentials (may be NULL). */
static char **git_env(const struct creds *cr, const char *extra)
{
    static const char *const keep[] = {"PATH=",
                                       "HOME=",
                                       "GIT_SSH_COMMAND=",
                                       "SSL_CERT_FILE=",
                                       "SSL_CERT_DIR=",
                                       "HTTPS_PROXY=",
                                       "https_proxy=",
                                       "GIT_CONFIG_GLOBAL=",
                                       "GIT_CONFIG_NOSYSTEM=",
                                       "GIT_HTTP_LOW_SPEED_LIMIT=",
                                       "GIT_HTTP_LOW_SPEED_TIME="};
    size_t n = 0, cap = ARRAY_LEN(keep) + 5;
    char **env = xcalloc(cap, sizeof(*env));

    for (char **e = environ; *e != NULL; e++) {
        for (size_t i = 0; i < ARRAY_LEN(keep) && n + 4 < cap; i++) {
            if (strncmp(*e, keep[i], strlen(keep[i])) == 0) {
                env[n++] = xstrdup(*e);
            }
        }
    }
    env[n++] = xstrdup("GIT_TERMINAL_PROMPT=0");
    env[n++] = xstrdup("LC_ALL=C");
    if (extra != NULL) {
        env[n++] = xstrdup(extra);
    }
    env[n] = NULL;
    return with_credentials(env, n, cr);
}

static void env_free(char **env)
{
    for (char **e = env; *e != NULL; e++) {
        if (strncmp(*e, "DIVERGE_GIT_", 12) == 0) {
            secret_wipe(*e, strlen(*e));
        }
        free(*e);
    }
    free(env);
}

/* How git_start() runs git. */
struct git_how {
    const struct creds *cr; /* credentials, or NULL */
    const char *extra_env;  /* "NAME=value" added to git's environment, or NULL */
    bool group;             /* a process group of its own */
    bool quiet;             /* stderr to /dev/null instead of the pipe */
};

/* Starts git with ARGV and a filtered environment (HOW), stdin /dev/null and stdout (and
 * stderr unless quiet) into a pipe whose read end goes to *FD_OUT; in a process group of
 * its own with HOW->group (its helpers, git-remote-http or ssh, are killed with it). */
static int git_start(pid_t *pid_out, int *fd_out, const char *const argv[],
                     const struct git_how *how, struct err *err)
{
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    char **env;
    int pipefd[2], rc;

    if (pipe2(pipefd, O_CLOEXEC) != 0) {
        return err_set(err, E_FAIL, "pipe: %s", strerror(errno));
    }
    env = git_env(how->cr, how->extra_env);
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, pipefd[1], 1);
    if (how->quiet) {
        posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    } else {
        posix_spawn_file_actions_adddup2(&fa, pipefd[1], 2);
    }
    posix_spawnattr_init(&attr);
    if (how->group) {
        posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
        posix_spawnattr_setpgroup(&attr, 0);
    }
    rc = posix_spawnp(pid_out, "git", &fa, &attr, (char *const *)(uintptr_t)argv, env);
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&fa);
    close(pipefd[1]);
    env_free(env);
    if (rc != 0) {
        close(pipefd[0]);
        return err_set(err, E_FAIL, "start git: %s", strerror(rc));
    }
    *fd_out = pipefd[0];
    return E_OK;
}

/* Writes each non-empty line of OUT[0..len) to the task log as "[git] line". */
static void log_git_lines(const char *log_path, const char *out, size_t len)
{
    for (size_t start = 0, i = 0; i <= len; i++) {
        if (i == len || out[i] == '\n') {
            if (i > start) {
                char *line = xasprintf("[git] %.*s", (int)(i - start), out + start);
                sandbox_log_write(log_path, 0, line, strlen(line));
                free(line);
            }
            start = i + 1;
        }
    }
}

/* The git subcommand of ARGV (after "-c key=value", "-C dir" and "--git-dir dir"), for
 * messages. */
static const char *git_subcommand(const char *const argv[])
{
    size_t i = 1;

    while (argv[i] != NULL && argv[i + 1] != NULL &&
           (strcmp(argv[i], "-c") == 0 || strcmp(argv[i], "-C") == 0 ||
            strcmp(argv[i], "--git-dir") == 0)) {
        i += 2;
    }
    return argv[i] != NULL ? argv[i] : "";
}

void controller_git_bound_init(struct controller_git_bound *b, int64_t limit_ms)
{
    memset(b, 0, sizeof(*b));
    pthread_mutex_init(&b->lock, NULL);
    b->limit_ms = limit_ms;
}

void controller_git_bound_cleanup(struct controller_git_bound *b)
{
    pthread_mutex_destroy(&b->lock);
}

void controller_git_cancel(struct controller_git_bound *b, const char *why)
{
    pthread_mutex_lock(&b->lock);
    if (b->why == NULL) {
        b->why = why;
    }
    if (b->pgid > 0) {
        (void)kill(-b->pgid, SIGKILL); /* its leader is not reaped yet: the group is git's */
    }
    pthread_mutex_unlock(&b->lock);
}

const char *controller_git_cancelled(struct controller_git_bound *b)
{
    const char *why;

    pthread_mutex_lock(&b->lock);
    why = b->why;
    pthread_mutex_unlock(&b->lock);
    return why;
}

/* Records PGID (0: none any more) as B's running git; with a cancel already asked, the
 * group is killed at once. */
static void bound_group(struct controller_git_bound *b, pid_t pgid)
{
    pthread_mutex_lock(&b->lock);
    b->pgid = pgid;
    if (pgid > 0 && b->why != NULL) {
        (void)kill(-pgid, SIGKILL);
    }
    pthread_mutex_unlock(&b->lock);
}

/* Reads FD to its end, keeping the first CAP bytes in OUT; returns how many were kept.
 * With B, only until B's wall-clock limit (then *LATE, and the group of PID is killed) or
 * B's cancel (the group is killed: its pipe ends). */
static size_t read_output(char *out, size_t cap, int fd, pid_t pid, struct controller_git_bound *b,
                          bool *late)
{
    int64_t deadline = b != NULL ? clock_mono_ns() / 1000000 + b->limit_ms : 0;
    char buf[4096];
    size_t len = 0;

    *late = false;
    for (;;) {
        int64_t left = deadline - clock_mono_ns() / 1000000;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (b != NULL && left <= 0) {
            *late = true;
            (void)kill(-pid, SIGKILL);
            return len;
        }
        /* At most a second at a time: a helper outside the group that keeps the pipe
         * open cannot hold a cancelled run. */
        if (b != NULL && poll(&p, 1, left < 1000 ? (int)left : 1000) <= 0) {
            if (controller_git_cancelled(b) != NULL) {
                return len;
            }
            continue;
        }
        ssize_t got = read(fd, buf, sizeof(buf));
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got <= 0) {
            return len;
        }
        size_t take = (size_t)got < cap - len ? (size_t)got : cap - len;
        memcpy(out + len, buf, take);
        len += take;
    }
}

/* The error of a git run that did not exit 0 (OUT its output). */
static int git_failed(const char *const argv[], int status, const char *out, size_t len,
                      struct controller_git_bound *b, bool late, struct err *err)
{
    const char *sub = git_subcommand(argv);
    const char *why = b != NULL ? controller_git_cancelled(b) : NULL;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);

    if (why != NULL) {
        return err_set(err, E_FAIL, "git %s stopped: %s", sub, why);
    }
    if (late && b->limit_ms >= 60000) {
        return err_set(err, E_FAIL, "git %s stopped after %lld minutes without finishing", sub,
                       (long long)(b->limit_ms / 60000));
    }
    if (late) {
        return err_set(err, E_FAIL, "git %s stopped after %lld ms without finishing", sub,
                       (long long)b->limit_ms);
    }
    if (memmem(out, len, "Operation too slow", 18) != NULL) {
        return err_set(err, E_FAIL,
                       "git %s failed: the remote sent (almost) nothing for too long "
                       "(http.lowSpeedTime) (exit %d)",
                       sub, code);
    }
    return err_set(err, E_FAIL, "git %s failed (exit %d)", sub, code);
}

/* Runs git as HOW says with ARGV; with B, bounded by it (its group registered, its
 * wall-clock limit and cancel honoured). The first CAP bytes of its output into OUT
 * (*LEN_OUT of them); E_OK when git exited 0, else git_failed()'s error. */
static int git_capture(const struct git_how *how, const char *const argv[],
                       struct controller_git_bound *b, char *out, size_t cap, size_t *len_out,
                       struct err *err)
{
    int fd = -1, status = 0, rc;
    pid_t pid = -1;
    bool late = false;
    size_t len;

    *len_out = 0;
    rc = git_start(&pid, &fd, argv, how, err);
    if (rc != E_OK) {
        return rc;
    }
    if (b != NULL) {
        bound_group(b, pid);
    }
    len = read_output(out, cap, fd, pid, b, &late);
    if (b != NULL) {
        bound_group(b, 0); /* before the reap: the group id is not git's once reaped */
    }
    close(fd);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    *len_out = len;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        return git_failed(argv, status, out, len, b, late, err);
    }
    return E_OK;
}

/* Runs git with ARGV, and CR's credentials (may be NULL), its output into LOG_PATH; with
 * B, in a process group of its own that B's cancel or wall-clock limit kills. */
static int git_run(const struct creds *cr, const char *log_path, const char *const argv[],
                   struct controller_git_bound *b, struct err *err)
{
    struct git_how how = {.cr = cr, .group = b != NULL};
    char *out = xmalloc(GIT_OUTPUT_MAX + 1);
    size_t len = 0;
    int rc = git_capture(&how, argv, b, out, GIT_OUTPUT_MAX, &len, err);

    if (log_path != NULL) {
        log_git_lines(log_path, out, len);
    }
    free(out);
    return rc;
}

int controller_git(const char *log_path, const char *const argv[], struct err *err)
{
    return git_run(NULL, log_path, argv, NULL, err);
}

int controller_git_read(char *out, size_t cap, const char *const argv[], const char *extra_env,
                        struct controller_git_bound *b, struct err *err)
{
    struct git_how how = {.extra_env = extra_env, .group = true, .quiet = true};
    struct controller_git_bound own;
    size_t len = 0;
    int rc;

    if (b == NULL) {
        controller_git_bound_init(&own, CONTROLLER_PUSH_LIMIT_MS);
    }
    rc = git_capture(&how, argv, b != NULL ? b : &own, out, cap - 1, &len, err);
    out[len] = '\0';
    if (b == NULL) {
        controller_git_bound_cleanup(&own);
    }
    return rc;
}

/* git_run() with the server's credentials for URL, bounded by B, or when B is NULL by
 * CONTROLLER_PUSH_LIMIT_MS (no cancel): every git that talks to a remote is bounded. */
static int git_remote(struct controller *c, const char *url, const char *log_path,
                      const char *const argv[], struct controller_git_bound *b, struct err *err)
{
    struct controller_git_bound own;
    struct creds cr;
    int rc;

    if (b == NULL) {
        controller_git_bound_init(&own, CONTROLLER_PUSH_LIMIT_MS);
    }
    creds_for(&cr, c, url, log_path);
    rc = git_run(&cr, log_path, argv, b != NULL ? b : &own, err);
    creds_free(&cr);
    if (b == NULL) {
        controller_git_bound_cleanup(&own);
    }
    return rc;
}

static bool is_dir(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Only URLs git can fetch without running anything: no "ext::", no option injection. */
static bool url_ok(const char *url)
{
    static const char *const schemes[] = {"https://", "http://", "file://", "ssh://", "git://"};

    if (url == NULL || url[0] == '-' || strlen(url) > 2048) {
        return false;
    }
    for (size_t i = 0; i < ARRAY_LEN(schemes); i++) {
        if (strncmp(url, schemes[i], strlen(schemes[i])) == 0) {
            return true;
        }
    }
    return false;
}

char *controller_mirror_path(const char *data_dir, const char *url)
{
    return xasprintf("%s/mirrors/%016llx.git", data_dir, (unsigned long long)hash_fnv1a_str(url));
}

/* E_OK when URL may be mirrored, else E_INVALID with what to do. */
static int url_refused(const char *data_dir, const char *url, struct err *err)
{
    if (url != NULL && strncmp(url, "local://", 8) == 0) {
        /* The placeholder of a local PR that was never opened (scm/local.c). */
        return err_set(err, E_INVALID,
                       "no repository: %.200s is a local pull request without one (open it "
                       "with `diverge local pr open ... --repo URL`), or use "
                       "--sandbox-provider none for an external agent",
                       url);
    }
    if (!url_ok(url)) {
        return err_set(err, E_INVALID,
                       "spec.repository.url: only https, http, ssh, git and "
                       "file URLs can be mirrored");
    }
    /* The task API refuses these already; a task written another way (kubectl without the
     * admission webhook) still never reads other projects' mirrors or staging. */
    if (controller_url_in_data_dir(data_dir, url)) {
        return err_set(err, E_INVALID,
                       "spec.repository.url: a file:// repository inside the server's data "
                       "directory is refused");
    }
    return E_OK;
}

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw);

/* Whether the mirror DIR already holds what a fetch of BRANCHES from URL would bring, told
 * from the remote's files when URL is a local repository: each branch where the mirror
 * has it, or absent from both (the base must be there). The fetch's processes (git,
 * upload-pack, a rev-list checking the objects are all here) were most of a start on a
 * local repository; a branch that moved is fetched as before. */
static bool remote_unchanged(const char *url, const char *dir, const char *const *branches)
{
    char *remote = gitref_url_gitdir(url);
    bool same = remote != NULL && branches != NULL && branches[0] != NULL;

    for (size_t i = 0; same && branches[i] != NULL; i++) {
        char *ref = xasprintf("refs/heads/%s", branches[i]);
        char theirs[GITREF_OID_HEX + 1], ours[GITREF_OID_HEX + 1];
        int t = gitref_read(theirs, remote, ref, GITREF_PACKED_MAX);
        int o = gitref_read(ours, dir, ref, GITREF_PACKED_MAX);

        same = t >= 0 && t == o && (t == 1 ? strcmp(theirs, ours) == 0 : i > 0);
        free(ref);
    }
    free(remote);
    return same;
}

/* Fetches the mirror DIR of URL: the branches BRANCHES (NULL-terminated, names
 * controller_plain_branch takes), or every branch when NULL; *HOW_OUT what was done. */
static int fetch_mirror(struct controller *c, const char *url, const char *dir,
                        const char *const *branches, const char *log_path, const char **how_out,
                        struct controller_git_bound *b, struct err *err)
{
    /* What a fetch brings stays one pack (fetch.unpackLimit=1), never loose objects: a
     * start hard-links the mirror's object files into the workspace, a few packs cost a
     * few links where loose objects cost one (and a directory) each. No `git maintenance
     * run --auto` after the fetch (a process of its own on every start's way, ~3 ms, and a
     * gc it would start detached, outside this lock): controller_mirror_upkeep bounds the
     * packs after the start. A start needs its base and working branches only: the
     * others are not fetched for it (nor their new objects packed, sent, indexed and
     * checked); a pattern "<name>*" takes a branch the remote does not have (yet) without
     * an error, and its look-alikes ("<name>-2"), which is only more. */
    const char *argv[20] = {"git",
                            "-c",
                            "fetch.unpackLimit=1",
                            "-c",
                            "maintenance.auto=false",
                            "-c",
                            "http.lowSpeedLimit=" CONTROLLER_PUSH_SILENT_BPS,
                            "-c",
                            "http.lowSpeedTime=" CONTROLLER_PUSH_SILENT_S,
                            "--git-dir",
                            dir,
                            "fetch",
                            "--prune",
                            "--quiet",
                            "origin"};
    char *specs[2] = {NULL, NULL};
    size_t n = 15, k = 0;
    int rc;

    if (remote_unchanged(url, dir, branches)) {
        *how_out = "up to date (reused): the remote's branches are the mirror's, read from its "
                   "files; nothing to fetch";
        return E_OK;
    }
    *how_out = "fetched (reused)";
    for (; branches != NULL && branches[k] != NULL && k < ARRAY_LEN(specs); k++) {
        specs[k] = xasprintf("+refs/heads/%s*:refs/heads/%s*", branches[k], branches[k]);
        argv[n++] = specs[k];
    }
    if (k == 0) {
        argv[n++] = "+refs/heads/*:refs/heads/*";
    }
    argv[n] = NULL;
    rc = git_remote(c, url, log_path, argv, b, err);
    for (size_t i = 0; i < k; i++) {
        free(specs[i]);
    }
    return rc;
}

static int mirror_locked(char **out, struct controller *c, const char *url,
                         const char *const *branches, const char *log_path, const char **how_out,
                         struct controller_git_bound *b, struct err *err)
{
    const char *data_dir = c->data_dir;
    char *dir, *tmp, *marker;
    int rc = E_OK;

    *out = NULL;
    *how_out = "cloned";
    rc = url_refused(data_dir, url, err);
    if (rc != E_OK) {
        return rc;
    }
    dir = controller_mirror_path(data_dir, url);
    marker = xasprintf("%s/diverge-url", dir);
    if (is_dir(dir)) {
        /* The URL is kept next to the mirror: a hash collision must never hand one
         * repository's mirror to a task of another. */
        char got[2100] = {0};
        int fd = open(marker, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        ssize_t n = fd >= 0 ? read(fd, got, sizeof(got) - 1) : -1;
        if (fd >= 0) {
            close(fd);
        }
        if (n < 0 || strcmp(got, url) != 0) {
            rc = err_set(err, E_FAIL, "the mirror directory %s belongs to another URL", dir);
        } else {
            rc = fetch_mirror(c, url, dir, branches, log_path, how_out, b, err);
        }
    } else {
        unsigned int nonce = (unsigned int)getpid() ^ (unsigned int)clock_mono_ns();
        tmp = xasprintf("%s.%08x.tmp", dir, nonce);
        if (sandbox_mkdirs(dir, false) != 0) {
            rc = err_set(err, E_FAIL, "create the mirrors directory: %s", strerror(errno));
        } else {
            const char *argv[] = {"git",
                                  "-c",
                                  "http.lowSpeedLimit=" CONTROLLER_PUSH_SILENT_BPS,
                                  "-c",
                                  "http.lowSpeedTime=" CONTROLLER_PUSH_SILENT_S,
                                  "clone",
                                  "--mirror",
                                  "--quiet",
                                  "--",
                                  url,
                                  tmp,
                                  NULL};
            rc = git_remote(c, url, log_path, argv, b, err);
            if (rc != E_OK) {
                /* A git that was killed (a cancel, its limit) left its half clone. */
                (void)nftw(tmp, remove_one, 16, FTW_PHYS | FTW_DEPTH);
            }
        }
        if (rc == E_OK) {
            char *tmp_marker = xasprintf("%s/diverge-url", tmp);
            int fd = open(tmp_marker, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
            if (fd < 0 || write(fd, url, strlen(url)) != (ssize_t)strlen(url) ||
                rename(tmp, dir) != 0) {
                rc = err_set(err, E_FAIL, "store the mirror: %s", strerror(errno));
            }
            if (fd >= 0) {
                close(fd);
            }
            free(tmp_marker);
        }
        free(tmp);
    }
    free(marker);
    if (rc == E_OK) {
        *out = dir;
    } else {
        free(dir);
    }
    return rc;
}

int controller_mirror_lock(const char *data_dir, const char *url, struct err *err)
{
    char *lock = xasprintf("%s/run/mirror.%016llx.lock", data_dir,
                           (unsigned long long)hash_fnv1a_str(url != NULL ? url : ""));
    int fd = -1;

    if (sandbox_mkdirs(lock, false) == 0) {
        fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    }
    if (fd < 0) {
        err_set(err, E_FAIL, "open the mirror lock: %s", strerror(errno));
    } else {
        while (flock(fd, LOCK_EX) != 0 && errno == EINTR) {
        }
    }
    free(lock);
    return fd;
}

/* One git at a time per mirror (fetches run off the reconcile lock, several tasks may
 * start on one repository): an flock on <data-dir>/run/mirror.<hash>.lock, held while cloning or
 * fetching. A later task waits for the clone and then fetches into it. */
int controller_mirror(char **out, struct controller *c, const char *url, const char *log_path,
                      const char **how_out, struct err *err)
{
    return controller_mirror_branches(out, c, url, NULL, log_path, how_out, NULL, err);
}

int controller_mirror_branches(char **out, struct controller *c, const char *url,
                               const char *const *branches, const char *log_path,
                               const char **how_out, struct controller_git_bound *b,
                               struct err *err)
{
    int fd = controller_mirror_lock(c->data_dir, url, err), rc;

    if (fd < 0) {
        *out = NULL;
        *how_out = "not fetched";
        return E_FAIL;
    }
    rc = mirror_locked(out, c, url, branches, log_path, how_out, b, err);
    close(fd); /* releases the lock */
    return rc;
}

/* How many entries of the directory PATH end in SUFFIX, counting no further than MAX. */
static size_t count_entries(const char *path, const char *suffix, size_t max)
{
    DIR *d = opendir(path);
    size_t n = 0, k = strlen(suffix);
    struct dirent *e;

    while (d != NULL && n <= max && (e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        n += e->d_name[0] != '.' && len >= k && strcmp(e->d_name + len - k, suffix) == 0;
    }
    if (d != NULL) {
        closedir(d);
    }
    return n;
}

bool controller_mirror_wants_upkeep(const char *dir)
{
    /* git's own tests for gc --auto with its defaults: more than gc.autoPackLimit (50)
     * packs, or more than gc.auto (6700) / 256 loose objects in objects/17. */
    char *packs = xasprintf("%s/objects/pack", dir), *loose = xasprintf("%s/objects/17", dir);
    bool wants = count_entries(packs, ".pack", 50) > 50 || count_entries(loose, "", 27) > 27;

    free(packs);
    free(loose);
    return wants;
}

int controller_mirror_upkeep(struct controller *c, const char *url, struct err *err)
{
    char *dir = controller_mirror_path(c->data_dir, url);
    /* Not detached: the gc runs under the mirror's lock, never while a start links the
     * mirror's packs into its workspace or a fetch writes it. */
    const char *argv[] = {
        "git",     "-c", "gc.autoDetach=false", "--git-dir", dir, "maintenance", "run", "--auto",
        "--quiet", NULL};
    int fd = controller_mirror_lock(c->data_dir, url, err), rc = E_OK;

    if (fd < 0) {
        free(dir);
        return E_FAIL;
    }
    if (is_dir(dir) && controller_mirror_wants_upkeep(dir)) {
        rc = git_run(NULL, NULL, argv, NULL, err);
    }
    close(fd);
    free(dir);
    return rc;
}

bool controller_put_new(const char *dir, const char *name, const char *text)
{
    char *p = xasprintf("%s/%s", dir, name);
    int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    bool ok = fd >= 0 && write(fd, text, strlen(text)) == (ssize_t)strlen(text);

    if (fd >= 0) {
        ok = close(fd) == 0 && ok;
    }
    free(p);
    return ok;
}

/* The files of an empty bare repository in the new directory DIR: what git needs to
 * call it one (HEAD, config, objects/, refs/) and nothing else (no hook samples). It takes
 * pushes from a shallow clone (receive.shallowUpdate): the runner's depth-50 clone of a
 * branch with a longer history is one, and git refuses its push without it. */
static bool bare_skeleton(const char *dir)
{
    static const char *const sub[] = {"objects", "objects/info", "objects/pack",
                                      "refs",    "refs/heads",   "refs/tags"};
    static const char config[] = "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n"
                                 "\tbare = true\n[receive]\n\tshallowUpdate = true\n"
                                 "\tautogc = false\n"; /* no `gc --auto` after each push */

    for (size_t i = 0; i < ARRAY_LEN(sub); i++) {
        char *p = xasprintf("%s/%s", dir, sub[i]);
        int rc = mkdir(p, 0755);
        free(p);
        if (rc != 0) {
            return false;
        }
    }
    return controller_put_new(dir, "config", config) &&
           controller_put_new(dir, "HEAD", "ref: refs/heads/main\n");
}

/* The staging repository is written here rather than by `git init --bare`: one process
 * fewer on every start (it was ~13 ms of a ~115 ms start). Made under a temporary name
 * and renamed, so a crash never leaves a half-made repository that is_dir() would take. */
int controller_staging(const char *path, const char *log_path, struct err *err)
{
    unsigned int nonce = (unsigned int)getpid() ^ (unsigned int)clock_mono_ns();
    char *tmp;
    int rc = E_OK;

    (void)log_path;
    if (is_dir(path)) {
        return E_OK;
    }
    if (sandbox_mkdirs(path, false) != 0) {
        return err_set(err, E_FAIL, "create the staging directory: %s", strerror(errno));
    }
    tmp = xasprintf("%s.%08x.tmp", path, nonce);
    if (mkdir(tmp, 0755) != 0 || !bare_skeleton(tmp) || rename(tmp, path) != 0) {
        rc = err_set(err, E_FAIL, "create the staging repository: %s", strerror(errno));
        (void)nftw(tmp, remove_one, 16, FTW_PHYS | FTW_DEPTH);
    }
    free(tmp);
    return rc;
}

bool controller_repo_has(const char *git_dir, const char *ref)
{
    const char *argv[] = {"git", "--git-dir", git_dir, "rev-parse", "--verify", "-q", ref, NULL};
    struct err err = {0};

    return is_dir(git_dir) && controller_git(NULL, argv, &err) == E_OK;
}

int controller_checkpoint_copy(const char *dst, const char *src, const char *branch,
                               const char *log_path, struct err *err)
{
    char *spec = xasprintf("+refs/heads/%s:refs/heads/%s", branch, branch);
    /* No hooks (not even reference-transaction), no tags, nothing but the one ref. */
    const char *argv[] = {
        "git",       "-c",      "core.hooksPath=/dev/null", "--git-dir", dst, "fetch",
        "--no-tags", "--quiet", "--update-shallow",         "--",        src, spec,
        NULL};
    int rc = controller_git(log_path, argv, err);

    free(spec);
    return rc;
}

static int tidy_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)ftw;
    /* A bare repository holds only directories and regular files: anything else (a
     * symlink to a host file, a fifo) is the sandbox's doing. */
    if (flag == FTW_SL || flag == FTW_SLN || (!S_ISDIR(sb->st_mode) && !S_ISREG(sb->st_mode))) {
        return unlink(path) == 0 ? 0 : -1;
    }
    /* Back to the server's user: git then works on it without "dubious ownership". */
    return lchown(path, geteuid(), getegid()) == 0 || errno == EPERM ? 0 : -1;
}

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path) == 0 ? 0 : -1;
}

int controller_staging_sanitize(const char *staging, struct err *err)
{
    static const char *const drop[] = {"objects/info/alternates", "objects/info/http-alternates",
                                       "commondir", "info/grafts", "gitdir"};
    static const char config[] = "[core]\n\trepositoryformatversion = 0\n\tbare = true\n"
                                 "[receive]\n\tshallowUpdate = true\n\tautogc = false\n";
    char *p;
    int fd, rc = E_OK;

    if (nftw(staging, tidy_one, 16, FTW_PHYS | FTW_DEPTH) != 0) {
        return err_set(err, E_FAIL, "clean the staging repository: %s", strerror(errno));
    }
    for (size_t i = 0; i < ARRAY_LEN(drop); i++) {
        p = xasprintf("%s/%s", staging, drop[i]);
        (void)unlink(p);
        free(p);
    }
    p = xasprintf("%s/hooks", staging);
    (void)nftw(p, remove_one, 16, FTW_PHYS | FTW_DEPTH);
    free(p);
    /* The sandbox wrote this config: replace it (url.*.insteadOf, core.hooksPath, ...). */
    p = xasprintf("%s/config", staging);
    (void)unlink(p);
    fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 || write(fd, config, sizeof(config) - 1) != (ssize_t)(sizeof(config) - 1)) {
        rc = err_set(err, E_FAIL, "rewrite the staging repository's config: %s", strerror(errno));
    }
    if (fd >= 0) {
        close(fd);
    }
    free(p);
    return rc;
}

int controller_push(struct controller *c, const char *staging, const char *url, const char *working,
                    const char *log_path, struct controller_git_bound *b, struct err *err)
{
    char *ref = xasprintf("refs/heads/%s:refs/heads/%s", working, working);
    /* A remote that sends nothing for CONTROLLER_PUSH_SILENT_S seconds ends an http(s)
     * push (GIT_HTTP_LOW_SPEED_LIMIT/_TIME in the server's environment win, as in git);
     * every scheme has B's wall-clock limit. */
    const char *argv[] = {"git",
                          "-c",
                          "core.hooksPath=/dev/null",
                          "-c",
                          "http.lowSpeedLimit=" CONTROLLER_PUSH_SILENT_BPS,
                          "-c",
                          "http.lowSpeedTime=" CONTROLLER_PUSH_SILENT_S,
                          "--git-dir",
                          staging,
                          "push",
                          "--no-verify",
                          "--quiet",
                          "--",
                          url,
                          ref,
                          NULL};
    int rc;

    if (!url_ok(url)) {
        free(ref);
        return err_set(err, E_INVALID, "spec.repository.url cannot be pushed to");
    }
    /* The sandbox wrote the staging repo: nothing of it but refs and objects is used. */
    rc = controller_staging_sanitize(staging, err);
    /* Never "+": a push that is not a fast-forward is refused by the remote. */
    if (rc == E_OK) {
        rc = git_remote(c, url, log_path, argv, b, err);
    }
    free(ref);
    return rc;
}
