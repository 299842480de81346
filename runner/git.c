/* SPDX-License-Identifier: Apache-2.0 */
/* The runner's git steps (SPEC §9 steps 2 and 4): shallow clone of the base branch,
 * checkout of the working branch, commit and push. Every value reaches git as one argv
 * element after the options it belongs to; hooks are off (the agent can write them). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/gitref.h"
#include "common/secret.h"
#include "runner/runner_int.h"

extern char **environ;

#define RUNNER_SUBJECT_MAX 200 /* bytes of the objective in the commit subject */

/* Runs "git -C WS -c core.hooksPath=/dev/null ARGS..." with ENV; *status_out its exit
 * status. CAPTURE (may be NULL) collects stdout. */
static int git_run(int *status_out, const struct runner_config *cfg, char *const *env,
                   struct buf *capture, const char *const *args, struct err *err)
{
    const char *argv[24];
    size_t n = 0;
    char *git = runner_which("git");
    struct runner_spawn sp = {.argv = argv, .cwd = NULL, .envp = env, .capture = capture};
    int rc;

    if (git == NULL) {
        return err_set(err, E_FAIL, "git not found on PATH");
    }
    argv[n++] = git;
    if (cfg != NULL) {
        argv[n++] = "-C";
        argv[n++] = cfg->workspace;
    }
    argv[n++] = "-c";
    argv[n++] = "core.hooksPath=/dev/null";
    for (size_t i = 0; args[i] != NULL; i++) {
        ASSERT(n < ARRAY_LEN(argv) - 1);
        argv[n++] = args[i];
    }
    argv[n] = NULL;
    rc = runner_spawn_run(status_out, &sp, err);
    free(git);
    return rc;
}

/* As git_run, and a non-zero exit status is E_FAIL naming STEP. */
static int git_ok(const struct runner_config *cfg, char *const *env, const char *step,
                  const char *const *args, struct err *err)
{
    int st = 0, rc = git_run(&st, cfg, env, NULL, args, err);

    if (rc == E_OK && st != 0) {
        rc = err_set(err, E_FAIL, "git %s failed (exit %d)", step, st);
    }
    return rc;
}

#define METER_PATH "/api/v1/agenttask/meter"
#define GIT_PATH "/api/v1/git/"

/* The URL prefix of the server's git smart HTTP (<public-url>/api/v1/git/), from the
 * public URL DIVERGE_METER_URL was made of, when URL is under it; NULL otherwise (a
 * file:// mirror, another host): then git gets no token. New string. */
char *runner_git_server_prefix(const char *meter_url, const char *url)
{
    size_t n = meter_url != NULL ? strlen(meter_url) : 0, m = strlen(METER_PATH);
    char *prefix;

    if (url == NULL || n <= m || strcmp(meter_url + n - m, METER_PATH) != 0 ||
        (strncmp(meter_url, "https://", 8) != 0 && strncmp(meter_url, "http://", 7) != 0)) {
        return NULL;
    }
    prefix = xasprintf("%.*s" GIT_PATH, (int)(n - m), meter_url);
    if (strncmp(url, prefix, strlen(prefix)) != 0) {
        free(prefix);
        return NULL;
    }
    return prefix;
}

/* Config for git's environment (never argv or the URL): the task's token as an
 * Authorization header only for URLs under the server's git prefix (http.<url>.*
 * matching), and no redirects. SET gets the entries; returns how many. */
static size_t token_header(char **set, const struct runner_config *cfg)
{
    char *prefix = runner_git_server_prefix(cfg->meter_url, cfg->repo_url);
    char *tok = NULL;
    struct err err = {0};
    size_t n = 0;

    if (prefix == NULL) {
        prefix = runner_git_server_prefix(cfg->meter_url, cfg->push_url);
    }
    if (prefix == NULL) {
        return 0;
    }
    if (runner_token_read(&tok, cfg, &err) == E_OK) {
        set[n++] = xstrdup("GIT_CONFIG_COUNT=2");
        set[n++] = xasprintf("GIT_CONFIG_KEY_0=http.%s.extraHeader", prefix);
        set[n++] = xasprintf("GIT_CONFIG_VALUE_0=Authorization: Bearer %s", tok);
        set[n++] = xstrdup("GIT_CONFIG_KEY_1=http.followRedirects");
        set[n++] = xstrdup("GIT_CONFIG_VALUE_1=false");
        runner_token_free(tok);
    }
    free(prefix);
    return n;
}

static char **git_env(const struct runner_config *cfg)
{
    static const char *const unset[] = {"GIT_DIR",
                                        "GIT_WORK_TREE",
                                        "GIT_INDEX_FILE",
                                        "GIT_AUTHOR_NAME",
                                        "GIT_AUTHOR_EMAIL",
                                        "GIT_COMMITTER_NAME",
                                        "GIT_COMMITTER_EMAIL",
                                        "DIVERGE_MACAROON_TOKEN",
                                        "GIT_CONFIG_PARAMETERS",
                                        "GIT_CONFIG_COUNT",
                                        "GIT_SSL_CAINFO",
                                        NULL};
    char *set[12];
    char **env;
    size_t n;

    set[0] = xasprintf("GIT_AUTHOR_NAME=%s", cfg->author_name);
    set[1] = xasprintf("GIT_AUTHOR_EMAIL=%s", cfg->author_email);
    set[2] = xasprintf("GIT_COMMITTER_NAME=%s", cfg->author_name);
    set[3] = xasprintf("GIT_COMMITTER_EMAIL=%s", cfg->author_email);
    set[4] = xstrdup("GIT_TERMINAL_PROMPT=0");
    n = 5 + token_header(set + 5, cfg);
    if (cfg->ca_file != NULL) {
        set[n++] = xasprintf("GIT_SSL_CAINFO=%s", cfg->ca_file);
    }
    set[n] = NULL;
    env = runner_env_build(environ, unset, (const char *const *)(uintptr_t)set);
    for (size_t i = 0; set[i] != NULL; i++) {
        secret_wipe(set[i], strlen(set[i]));
        free(set[i]);
    }
    return env;
}

/* Whether the branch REF ("refs/heads/...") is in the repository at URL: 1 yes, 0 no,
 * read from its files (a loose ref, else packed-refs) when URL is a file:// path to a
 * repository this process can read; -1 when only git can tell (another scheme, a name a
 * path could misread). It answers what `git ls-remote --exit-code --heads URL REF` does,
 * without the two processes (git and upload-pack) of that call. */
int runner_git_ref_in(const char *url, const char *ref)
{
    char *dir = strncmp(ref, "refs/heads/", 11) == 0 ? gitref_url_gitdir(url) : NULL;
    int rc = dir != NULL ? gitref_read(NULL, dir, ref, GITREF_PACKED_MAX) : -1;

    free(dir); /* NULL: not a repository this process can read, or not a local one */
    return rc;
}

/* Whether the branch REF is on the remote URL (REMOTE: how git names it): 1, 0, or an
 * error. From the repository's files when they can be read, else `git ls-remote`. */
static int on_remote(int *out, const struct runner_config *cfg, char *const *env,
                     const char *remote, const char *url, const char *ref, struct err *err)
{
    struct buf b;
    int st = 0, rc;

    *out = runner_git_ref_in(url, ref);
    if (*out >= 0) {
        return E_OK;
    }
    buf_init(&b, RUNNER_CAPTURE_MAX);
    rc = git_run(
        &st, cfg, env, &b,
        (const char *const[]){"ls-remote", "--exit-code", "--heads", "--", remote, ref, NULL}, err);
    buf_cleanup(&b);
    if (rc == E_OK && st != 0 && st != 2) {
        rc = err_set(err, E_FAIL, "git ls-remote failed (exit %d)", st);
    }
    *out = st == 0 ? 1 : 0;
    return rc;
}

/* Tracks the working branch WB of the remote: a --branch clone fetches only the base, so
 * WB goes into origin's refspecs and is fetched, and the new branch tracks it. */
static int track_remote(const struct runner_config *cfg, char *const *env, struct err *err)
{
    const char *wb = cfg->working_branch;
    char *spec = xasprintf("+refs/heads/%s:refs/remotes/origin/%s", wb, wb);
    char *track = xasprintf("origin/%s", wb);
    int rc;

    runner_say("working branch %s exists on the remote: tracking it", wb);
    rc = git_ok(cfg, env, "remote",
                (const char *const[]){"remote", "set-branches", "--add", "origin", wb, NULL}, err);
    if (rc == E_OK) {
        rc = git_ok(cfg, env, "fetch",
                    (const char *const[]){"fetch", "-q", "--depth=50", "origin", spec, NULL}, err);
    }
    if (rc == E_OK) {
        rc = git_ok(cfg, env, "checkout",
                    (const char *const[]){"checkout", "-q", "-b", wb, "--track", track, NULL}, err);
    }
    free(spec);
    free(track);
    return rc;
}

/* Checks out the working branch: the local one when it exists (a restarted runner), else
 * the remote's (tracked), else a new one from the base. After a FRESH clone the only
 * local branch is the base, already checked out: no git is asked about the others. */
static int ensure_branch(const struct runner_config *cfg, char *const *env, bool fresh,
                         struct err *err)
{
    const char *wb = cfg->working_branch;
    char *ref = xasprintf("refs/heads/%s", wb);
    int st = 1, on = 0, rc = E_OK;

    if (fresh && strcmp(wb, cfg->base_branch) == 0) {
        free(ref);
        return E_OK;
    }
    if (!fresh) {
        rc = git_run(&st, cfg, env, NULL,
                     (const char *const[]){"rev-parse", "--verify", "--quiet", ref, NULL}, err);
    }
    if (rc == E_OK && st == 0) {
        rc = git_ok(cfg, env, "checkout", (const char *const[]){"checkout", "-q", wb, NULL}, err);
    } else if (rc == E_OK) {
        rc = on_remote(&on, cfg, env, "origin", cfg->repo_url, ref, err);
    }
    if (rc == E_OK && st != 0 && on == 1) {
        rc = track_remote(cfg, env, err);
    } else if (rc == E_OK && st != 0) {
        runner_say("creating working branch %s from %s", wb, cfg->base_branch);
        rc = git_ok(cfg, env, "checkout", (const char *const[]){"checkout", "-q", "-b", wb, NULL},
                    err);
    }
    free(ref);
    return rc;
}

/* A workspace whose git directory the server made from the mirror (the local provider:
 * controller/workspace_clone.c), marked by .git/RUNNER_PREPARED_MARK: what this clone
 * and checkout would have made but the files, which are checked out here, inside the
 * sandbox. The mark goes first: a runner started again later continues in the workspace
 * as in one it cloned. */
static int checkout_prepared(const struct runner_config *cfg, char *const *env, const char *mark,
                             struct err *err)
{
    char *head = xasprintf("%s/.git/HEAD", cfg->workspace);
    char *want = xasprintf("ref: refs/heads/%s\n", cfg->working_branch);
    char got[512];
    int fd = open(head, O_RDONLY | O_NOFOLLOW | O_CLOEXEC), rc = E_OK;
    ssize_t n = fd >= 0 ? read(fd, got, sizeof(got) - 1) : -1;

    if (fd >= 0) {
        close(fd);
    }
    got[n > 0 ? n : 0] = '\0';
    if (unlink(mark) != 0) {
        rc = err_set(err, E_FAIL, "remove %s: %s", mark, strerror(errno));
    } else if (strcmp(got, want) != 0) {
        rc = err_set(err, E_FAIL, "the workspace made by the server is not on branch %s",
                     cfg->working_branch);
    } else {
        runner_say("workspace made from the mirror by the server: checking out %s",
                   cfg->working_branch);
        rc = git_ok(cfg, env, "checkout", (const char *const[]){"checkout", "-q", "-f", NULL}, err);
    }
    free(head);
    free(want);
    return rc;
}

int runner_git_prepare(const struct runner_config *cfg, struct err *err)
{
    char *dotgit = xasprintf("%s/.git", cfg->workspace);
    char *mark = xasprintf("%s/" RUNNER_PREPARED_MARK, dotgit);
    char **env = git_env(cfg);
    struct stat sb;
    int rc = E_OK;
    bool fresh = false, mark_seen = false;

    if (lstat(mark, &sb) == 0 && S_ISREG(sb.st_mode)) {
        fresh = mark_seen = true;
        rc = checkout_prepared(cfg, env, mark, err);
    } else if (stat(dotgit, &sb) == 0) {
        runner_say("workspace already holds a clone: continuing in it");
    } else {
        fresh = true;
        runner_say("cloning the repository (branch %s)", cfg->base_branch);
        rc = git_ok(NULL, env, "clone",
                    (const char *const[]){"clone", "-q", "--depth=50", "--branch", cfg->base_branch,
                                          "--", cfg->repo_url, cfg->workspace, NULL},
                    err);
    }
    if (rc == E_OK && !(fresh && mark_seen)) {
        rc = ensure_branch(cfg, env, fresh, err);
    }
    if (rc == E_OK && fresh) {
        rc = runner_git_restore(cfg, err);
    }
    runner_env_free(env);
    free(dotgit);
    free(mark);
    return rc;
}

/* "fix(<task>): <first line of the objective, at most RUNNER_SUBJECT_MAX bytes>". */
static char *commit_message(const struct runner_config *cfg)
{
    char subject[RUNNER_SUBJECT_MAX + 4];
    size_t n = strcspn(cfg->objective, "\r\n");

    err_utf8_copy(subject, RUNNER_SUBJECT_MAX + 1, cfg->objective,
                  n > RUNNER_SUBJECT_MAX ? RUNNER_SUBJECT_MAX : n);
    return xasprintf("fix(%s): %s", cfg->task, subject);
}

int runner_git_publish(const struct runner_config *cfg, struct err *err)
{
    char **env = git_env(cfg);
    char *msg = commit_message(cfg);
    char *dst = xasprintf("HEAD:refs/heads/%s", cfg->working_branch);
    const char *remote = cfg->push_url != NULL ? cfg->push_url : "origin";
    int st = 0, rc;

    rc = git_ok(cfg, env, "add", (const char *const[]){"add", "-A", NULL}, err);
    if (rc == E_OK) {
        rc = git_run(&st, cfg, env, NULL,
                     (const char *const[]){"diff", "--cached", "--quiet", NULL}, err);
    }
    if (rc == E_OK && st == 1) {
        rc = git_ok(
            cfg, env, "commit",
            (const char *const[]){"-c", "commit.gpgsign=false", "commit", "-q", "-m", msg, NULL},
            err);
        if (rc == E_OK) {
            runner_say("committed: %s", msg);
        }
    } else if (rc == E_OK && st == 0) {
        runner_say("nothing to commit: pushing the branch as it is");
    } else if (rc == E_OK) {
        rc = err_set(err, E_FAIL, "git diff failed (exit %d)", st);
    }
    if (rc == E_OK) {
        rc = git_ok(cfg, env, "push", (const char *const[]){"push", "-q", "--", remote, dst, NULL},
                    err);
    }
    if (rc == E_OK) {
        runner_say("pushed %s to %s", cfg->working_branch,
                   cfg->push_url != NULL ? "the staging repository" : "origin");
    }
    runner_env_free(env);
    free(msg);
    free(dst);
    return rc;
}

#define WIP_REF "refs/diverge/wip" /* the workspace's own pointer to its last checkpoint */
#define OID_MAX 128                /* bytes of an object id kept (SHA-256: 64) */

/* Runs git ARGS (status 0 required) and keeps the first line of its output in OUT. */
static int git_line(const struct runner_config *cfg, char *const *env, const char *step,
                    const char *const *args, char out[OID_MAX], struct err *err)
{
    struct buf b;
    int st = 0, rc;

    buf_init(&b, RUNNER_CAPTURE_MAX);
    rc = git_run(&st, cfg, env, &b, args, err);
    if (rc == E_OK && st != 0) {
        rc = err_set(err, E_FAIL, "git %s failed (exit %d)", step, st);
    }
    if (rc == E_OK) {
        size_t n = strcspn(b.len > 0 ? b.data : "", "\r\n");
        if (n == 0 || n >= OID_MAX || n > b.len) {
            rc = err_set(err, E_FAIL, "git %s printed no object id", step);
        } else {
            memcpy(out, b.data, n);
            out[n] = '\0';
        }
    }
    buf_cleanup(&b);
    return rc;
}

/* The tree of every file of the workspace, through a separate index. */
static int workspace_tree(const struct runner_config *cfg, char *const *env, char tree[OID_MAX],
                          struct err *err)
{
    char *index = xasprintf("%s/.git/diverge-wip.index", cfg->workspace);
    char *var = xasprintf("GIT_INDEX_FILE=%s", index);
    char **ienv = runner_env_build(env, NULL, (const char *const[]){var, NULL});
    int rc;

    (void)unlink(index);
    rc = git_ok(cfg, ienv, "read-tree", (const char *const[]){"read-tree", "HEAD", NULL}, err);
    if (rc == E_OK) {
        rc = git_ok(cfg, ienv, "add", (const char *const[]){"add", "-A", NULL}, err);
    }
    if (rc == E_OK) {
        rc =
            git_line(cfg, ienv, "write-tree", (const char *const[]){"write-tree", NULL}, tree, err);
    }
    (void)unlink(index);
    runner_env_free(ienv);
    free(var);
    free(index);
    return rc;
}

/* Whether git ARGS exits 0 (false when it cannot run). */
static bool git_true(const struct runner_config *cfg, char *const *env, const char *const *args)
{
    int st = 1;

    return git_run(&st, cfg, env, NULL, args, NULL) == E_OK && st == 0;
}

/* Reads git rev-parse's lines for HEAD^{commit}, the checkpoint's ^{commit} and ^{tree}
 * into OUT: true when all three were there. Every argument before "--" is a revision:
 * no file of the workspace is consulted. */
static bool wip_refs_at_once(const struct runner_config *cfg, char *const *env, char *const out[3])
{
    struct buf b;
    int st = 1;
    size_t pos = 0, k = 0;

    buf_init(&b, RUNNER_CAPTURE_MAX);
    if (git_run(&st, cfg, env, &b,
                (const char *const[]){"rev-parse", "HEAD^{commit}", WIP_REF "^{commit}",
                                      WIP_REF "^{tree}", "--", NULL},
                NULL) == E_OK &&
        st == 0) {
        for (; k < 3 && pos < b.len; k++) {
            size_t n = strcspn(b.data + pos, "\r\n");
            if (n == 0 || n >= OID_MAX || pos + n > b.len) {
                break;
            }
            memcpy(out[k], b.data + pos, n);
            out[k][n] = '\0';
            pos += n + 1;
        }
    }
    buf_cleanup(&b);
    return k == 3;
}

/* Bytes of packed-refs read to see that a ref did not move before git is asked instead. */
#define RUNNER_WIP_PACKED_MAX (1024 * 1024)

/* Whether HEAD is still the working branch at MEMO's commit and the checkpoint ref still
 * MEMO's checkpoint, read from the workspace's files (common/gitref.h: no symbolic link
 * followed, anything unusual is "cannot tell") instead of a git process. */
static bool wip_refs_unchanged(const struct runner_config *cfg, const struct runner_wip_memo *memo)
{
    char *gitdir = xasprintf("%s/.git", cfg->workspace);
    char *ref = xasprintf("refs/heads/%s", cfg->working_branch);
    char *want = xasprintf("ref: %s\n", ref);
    char got[512], oid[GITREF_OID_HEX + 1];
    int dfd =
        memo->tree[0] != '\0' ? open(gitdir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
    int fd = dfd >= 0 ? openat(dfd, "HEAD", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC) : -1;
    ssize_t n = fd >= 0 ? read(fd, got, sizeof(got) - 1) : -1;
    bool same;

    if (fd >= 0) {
        close(fd);
    }
    if (dfd >= 0) {
        close(dfd);
    }
    got[n > 0 ? n : 0] = '\0';
    same = n > 0 && strcmp(got, want) == 0 &&
           gitref_read(oid, gitdir, ref, RUNNER_WIP_PACKED_MAX) == 1 &&
           strcmp(oid, memo->head) == 0 &&
           gitref_read(oid, gitdir, WIP_REF, RUNNER_WIP_PACKED_MAX) == 1 &&
           strcmp(oid, memo->wip) == 0;
    free(gitdir);
    free(ref);
    free(want);
    return same;
}

/* HEAD's commit, and the last checkpoint's commit and tree when refs/diverge/wip names one
 * (else PREV and PREV_TREE are ""). No git process when neither moved since this runner's
 * last checkpoint (MEMO), one when the checkpoint ref was there then, else one per value,
 * quiet about a missing ref. */
static int wip_refs(const struct runner_config *cfg, char *const *env,
                    const struct runner_wip_memo *memo, char head[OID_MAX], char prev[OID_MAX],
                    char prev_tree[OID_MAX], struct err *err)
{
    int rc;

    if (wip_refs_unchanged(cfg, memo)) {
        snprintf(head, OID_MAX, "%s", memo->head);
        snprintf(prev, OID_MAX, "%s", memo->wip);
        snprintf(prev_tree, OID_MAX, "%s", memo->tree);
        return E_OK;
    }
    if (memo->wip[0] != '\0' &&
        wip_refs_at_once(cfg, env, (char *const[]){head, prev, prev_tree})) {
        return E_OK;
    }
    prev[0] = prev_tree[0] = '\0';
    rc = git_line(cfg, env, "rev-parse",
                  (const char *const[]){"rev-parse", "--verify", "HEAD^{commit}", NULL}, head, err);
    if (rc == E_OK &&
        git_line(cfg, env, "rev-parse",
                 (const char *const[]){"rev-parse", "--verify", "-q", WIP_REF "^{commit}", NULL},
                 prev, NULL) == E_OK) {
        (void)git_line(
            cfg, env, "rev-parse",
            (const char *const[]){"rev-parse", "--verify", "-q", WIP_REF "^{tree}", NULL},
            prev_tree, NULL);
    }
    return rc;
}

/* Makes the checkpoint commit of TREE into ID; *same_out when nothing changed since the
 * last one (no commit then). MEMO: the HEAD and checkpoint of this runner's last
 * checkpoint (HEAD is an ancestor of it): the same pair again needs no merge-base. */
static int wip_commit(const struct runner_config *cfg, char *const *env, const char *tree,
                      long iteration, struct runner_wip_memo *memo, char id[OID_MAX],
                      bool *same_out, struct err *err)
{
    char head[OID_MAX], prev[OID_MAX], prev_tree[OID_MAX];
    const char *argv[16];
    char *msg;
    size_t n = 0;
    bool head_in = false;
    int rc = wip_refs(cfg, env, memo, head, prev, prev_tree, err);

    *same_out = false;
    if (rc != E_OK) {
        return rc;
    }
    if (prev[0] != '\0') {
        head_in = (strcmp(memo->head, head) == 0 && strcmp(memo->wip, prev) == 0) ||
                  git_true(cfg, env,
                           (const char *const[]){"merge-base", "--is-ancestor", head, prev, NULL});
    }
    snprintf(memo->head, sizeof(memo->head), "%s", head);
    memo->wip[0] = memo->tree[0] = '\0'; /* set again once the ref names a commit after HEAD */
    if (head_in && strcmp(prev_tree, tree) == 0) {
        snprintf(memo->wip, sizeof(memo->wip), "%s", prev);
        snprintf(memo->tree, sizeof(memo->tree), "%s", tree);
        *same_out = true;
        return E_OK;
    }
    msg = xasprintf("diverge wip(%s): iteration %ld", cfg->task, iteration);
    argv[n++] = "-c";
    argv[n++] = "commit.gpgsign=false";
    argv[n++] = "commit-tree";
    argv[n++] = tree;
    if (prev[0] != '\0') {
        argv[n++] = "-p";
        argv[n++] = prev; /* each checkpoint follows the last: pushes fast-forward */
    }
    if (!head_in) {
        argv[n++] = "-p";
        argv[n++] = head;
    }
    argv[n++] = "-m";
    argv[n++] = msg;
    argv[n] = NULL;
    rc = git_line(cfg, env, "commit-tree", argv, id, err);
    free(msg);
    return rc;
}

/* The tree of the workspace and, when it differs from the last checkpoint's, its
 * checkpoint commit ID made and refs/diverge/wip set to it (*SAME_OUT otherwise). */
static int wip_save(const struct runner_config *cfg, char *const *env, long iteration,
                    struct runner_wip_memo *memo, char id[OID_MAX], bool *same_out, struct err *err)
{
    char tree[OID_MAX];
    int rc = workspace_tree(cfg, env, tree, err);

    if (rc == E_OK) {
        rc = wip_commit(cfg, env, tree, iteration, memo, id, same_out, err);
    }
    if (rc == E_OK && !*same_out) {
        rc = git_ok(cfg, env, "update-ref", (const char *const[]){"update-ref", WIP_REF, id, NULL},
                    err);
        if (rc == E_OK) {
            snprintf(memo->wip, sizeof(memo->wip), "%s", id); /* a child of HEAD's line */
            snprintf(memo->tree, sizeof(memo->tree), "%s", tree);
        }
    }
    return rc;
}

/* Whether the workspace is as the last checkpoint found it, without a git process: SNAP
 * (VOUCHED: runner_wip_snapshot said it can be trusted) is the one MEMO's tree was made
 * after, and HEAD and the checkpoint ref did not move. */
static bool wip_unchanged(const struct runner_config *cfg, const struct runner_wip_memo *memo,
                          const struct buf *snap, bool vouched)
{
    return vouched && memo->snap_ok && memo->snap.len == snap->len &&
           memcmp(memo->snap.data, snap->data, snap->len) == 0 && wip_refs_unchanged(cfg, memo);
}

int runner_git_checkpoint(const struct runner_config *cfg, long iteration,
                          struct runner_wip_memo *memo, struct err *err)
{
    char **env = git_env(cfg);
    char id[OID_MAX];
    const char *remote = cfg->push_url != NULL ? cfg->push_url : "origin";
    char *dst = NULL;
    struct buf snap;
    /* Taken before git reads the files: what changes later shows in the next one. */
    bool vouched = runner_wip_snapshot(&snap, cfg);
    bool same = wip_unchanged(cfg, memo, &snap, vouched);
    int rc = same ? E_OK : wip_save(cfg, env, iteration, memo, id, &same, err);

    buf_cleanup(&memo->snap);
    memo->snap = snap; /* taken over */
    memo->snap_ok = vouched && rc == E_OK;
    /* Unchanged, the last checkpoint is pushed again when its push did not go through. */
    const char *push = rc != E_OK                             ? NULL
                       : !same                                ? id
                       : strcmp(memo->pushed, memo->wip) != 0 ? memo->wip
                                                              : NULL;
    if (push != NULL) {
        /* Forced into the staging repository only: it always holds the newest checkpoint. */
        dst = xasprintf("+%s:refs/heads/%s", push, cfg->wip_branch);
        rc = git_ok(cfg, env, "push", (const char *const[]){"push", "-q", "--", remote, dst, NULL},
                    err);
        if (rc == E_OK) {
            snprintf(memo->pushed, sizeof(memo->pushed), "%s", push);
        }
    }
    if (rc == E_OK) {
        runner_say("checkpoint %s: %s", cfg->wip_branch,
                   !same          ? "saved"
                   : push != NULL ? "nothing changed since the last one, which is pushed now"
                                  : "nothing changed since the last one");
    }
    free(dst);
    runner_env_free(env);
    return rc;
}

int runner_git_restore(const struct runner_config *cfg, struct err *err)
{
    char **env;
    char *ref;
    int on = 0, rc;

    if (cfg->push_url == NULL) {
        return E_OK; /* no staging repository: nothing of an earlier run */
    }
    env = git_env(cfg);
    ref = xasprintf("refs/heads/%s", cfg->wip_branch);
    rc = on_remote(&on, cfg, env, cfg->push_url, cfg->push_url, ref, err);
    if (rc == E_OK && on == 1) {
        rc = git_ok(
            cfg, env, "fetch",
            (const char *const[]){"fetch", "-q", "--depth=1", "--", cfg->push_url, ref, NULL}, err);
        if (rc == E_OK) {
            rc = git_ok(cfg, env, "read-tree",
                        (const char *const[]){"read-tree", "-u", "--reset", "FETCH_HEAD", NULL},
                        err);
        }
        if (rc == E_OK) {
            rc = git_ok(cfg, env, "update-ref",
                        (const char *const[]){"update-ref", WIP_REF, "FETCH_HEAD", NULL}, err);
        }
        if (rc == E_OK) {
            runner_say("continuing from the checkpoint %s of an earlier run", cfg->wip_branch);
        }
    }
    free(ref);
    runner_env_free(env);
    return rc;
}
