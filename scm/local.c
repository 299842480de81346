/* SPDX-License-Identifier: Apache-2.0 */
/* The `local` SCM provider: PR threads kept in the database, so `diverge local` runs the
 * whole pipeline (inbox, bot, controller, notifier, outbox) offline. Its bot account is
 * SCM_LOCAL_BOT; a commenter's permission is what `diverge local comment --permission`
 * said last. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/gitref.h"
#include "common/proc.h"
#include "scm/scm.h"

#define LOCAL_MEMO_MAX 8                /* files remembered by commit */
#define LOCAL_MEMO_FILE_MAX (64 * 1024) /* a longer file is read every time */

/* A file as it is at one commit: what git read, or that the commit has no such path. */
struct local_memo {
    char *key;     /* owned: "<git dir>\n<commit>\n<path>"; NULL when unused */
    char *content; /* owned; NULL: no such file at that commit */
    size_t len;
};

struct local_scm {
    struct scm_provider base; /* must be first */
    struct task_store *store; /* borrowed */
    pthread_mutex_t memo_lock;
    struct local_memo memo[LOCAL_MEMO_MAX]; /* the agent.yaml reads of recent comments */
    size_t memo_next;                       /* the entry the next one replaces */
};

static struct local_scm *to_local(struct scm_provider *p)
{
    return container_of(p, struct local_scm, base);
}

static int parse_id(int64_t *out, const char *id, struct err *err)
{
    char *end = NULL;
    long long v = strtoll(id != NULL ? id : "", &end, 10);

    if (id == NULL || end == id || *end != '\0' || v <= 0) {
        return err_set(err, E_NOTFOUND, "no comment %s", id != NULL ? id : "(none)");
    }
    *out = v;
    return E_OK;
}

static int lc_react(struct scm_provider *p, const struct scm_ref *ref, const char *comment_id,
                    const char *content, struct scm_result *res, struct err *err)
{
    int64_t id;
    int rc = parse_id(&id, comment_id, err);

    (void)res;
    return rc != E_OK ? rc
                      : task_store_local_react(to_local(p)->store, ref->project, id, SCM_LOCAL_BOT,
                                               content, err);
}

static int lc_post(char **id_out, struct scm_provider *p, const struct scm_ref *ref,
                   const char *body, struct scm_result *res, struct err *err)
{
    int64_t id = 0;
    int rc = task_store_local_add(&id, to_local(p)->store, ref->project, ref->number, SCM_LOCAL_BOT,
                                  body, err);

    (void)res;
    *id_out = rc == E_OK ? xasprintf("%lld", (long long)id) : NULL;
    return rc;
}

static int lc_update(struct scm_provider *p, const struct scm_ref *ref, const char *comment_id,
                     const char *body, struct scm_result *res, struct err *err)
{
    int64_t id;
    int rc = parse_id(&id, comment_id, err);

    (void)res;
    return rc != E_OK ? rc
                      : task_store_local_update(to_local(p)->store, ref->project, id, body, err);
}

static int lc_delete(struct scm_provider *p, const struct scm_ref *ref, const char *comment_id,
                     struct scm_result *res, struct err *err)
{
    int64_t id;
    int rc = parse_id(&id, comment_id, err);

    (void)res;
    return rc != E_OK ? rc : task_store_local_delete(to_local(p)->store, ref->project, id, err);
}

static int lc_list(struct scm_comment **out, size_t *n_out, struct scm_provider *p,
                   const struct scm_ref *ref, struct scm_result *res, struct err *err)
{
    json_t *thread = NULL, *c;
    size_t i;
    int rc = task_store_local_thread(&thread, to_local(p)->store, ref->project, ref->number, err);

    (void)res;
    *out = NULL;
    *n_out = 0;
    if (rc == E_OK && json_array_size(thread) > 0) {
        *out = xcalloc(json_array_size(thread), sizeof(**out));
        json_array_foreach(thread, i, c)
        {
            struct scm_comment *sc = &(*out)[(*n_out)++];
            sc->id = xasprintf("%lld", (long long)json_integer_value(json_object_get(c, "id")));
            sc->author = xstrdup(json_string_value(json_object_get(c, "author")));
            sc->by_bot = strcmp(sc->author, SCM_LOCAL_BOT) == 0;
            sc->body = xstrdup(json_string_value(json_object_get(c, "body")));
        }
    }
    json_decref(thread);
    return rc;
}

static int lc_permission(enum scm_level *out, struct scm_provider *p, const struct scm_ref *ref,
                         const char *user, int64_t user_id, struct scm_result *res, struct err *err)
{
    int level = 0;
    int rc = task_store_local_permission_get(&level, to_local(p)->store, ref->project, user, err);

    (void)user_id;
    (void)res;
    *out = (enum scm_level)level;
    return rc;
}

/* A PR bound by `diverge local pr open` (SPEC §10) answers from its record: the head
 * branch, the base, the repository. One never opened has no repository: the task
 * records where it would come from, as before. */
static int lc_pull(struct scm_pull *out, struct scm_provider *p, const struct scm_ref *ref,
                   struct scm_result *res, struct err *err)
{
    json_t *pr = NULL;
    int rc = task_store_local_pull_get(&pr, to_local(p)->store, ref->project, ref->number, err);

    (void)res;
    memset(out, 0, sizeof(*out));
    if (rc == E_OK) {
        out->head_ref = xstrdup(json_string_value(json_object_get(pr, "head")));
        out->base_ref = xstrdup(json_string_value(json_object_get(pr, "base")));
        out->clone_url = xstrdup(json_string_value(json_object_get(pr, "repository")));
        out->base_url = xstrdup(out->clone_url); /* head and base live in one repository */
        json_decref(pr);
        return E_OK;
    }
    if (rc != E_NOTFOUND) {
        return E_AGAIN;
    }
    out->head_ref = xasprintf("pr-%lld", (long long)ref->number);
    out->clone_url = xasprintf("local://%s", ref->project);
    return E_OK;
}

#define LOCAL_FILE_MAX (1024 * 1024) /* bytes of a file read from a bound repository */

/* N bytes at S, NUL-terminated (a file may hold NULs). */
static char *copy_bytes(const char *s, size_t n)
{
    char *d = xmalloc(n + 1);

    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

/* KEY's memo entry of L into *OUT / *LEN_OUT (a copy; NULL: no such file): true when
 * there is one. */
static bool memo_get(char **out, size_t *len_out, struct local_scm *l, const char *key)
{
    bool found = false;

    pthread_mutex_lock(&l->memo_lock);
    for (size_t i = 0; i < LOCAL_MEMO_MAX && !found; i++) {
        struct local_memo *m = &l->memo[i];
        if (m->key != NULL && strcmp(m->key, key) == 0) {
            found = true;
            *out = m->content != NULL ? copy_bytes(m->content, m->len) : NULL;
            *len_out = m->len;
        }
    }
    pthread_mutex_unlock(&l->memo_lock);
    return found;
}

/* Remembers KEY's file CONTENT (LEN bytes; NULL: none) in L, over its oldest entry. */
static void memo_put(struct local_scm *l, const char *key, const char *content, size_t len)
{
    struct local_memo *m;

    pthread_mutex_lock(&l->memo_lock);
    m = &l->memo[l->memo_next];
    l->memo_next = (l->memo_next + 1) % LOCAL_MEMO_MAX;
    free(m->key);
    free(m->content);
    m->key = xstrdup(key);
    m->content = content != NULL ? copy_bytes(content, len) : NULL;
    m->len = content != NULL ? len : 0;
    pthread_mutex_unlock(&l->memo_lock);
}

/* Whether git's failure to read OBJECT ("<commit>:<path>") from GIT_DIR (its argument) is
 * that the commit has no such path, asked again with git's message: a failure of another
 * kind (a process limit, a broken pack) is never remembered. */
static bool path_absent(const char *git_dir, const char *object)
{
    struct buf msg;
    int status = 0;
    struct err err = {0};
    bool absent;

    buf_init(&msg, 4096);
    absent = proc_run(&status, &msg, NULL, true,
                      (const char *const[]){"git", git_dir, "cat-file", "blob", object, NULL},
                      &err) == E_OK &&
             status == 128 && msg.data != NULL && strstr(msg.data, "' does not exist in '") != NULL;
    buf_cleanup(&msg);
    return absent;
}

/* OBJECT ("<commit or branch>:<path>") of the repository GIT_DIR (git's --git-dir=
 * argument) read with git into *OUT / *LEN_OUT; with KEY (OBJECT names a commit), what
 * is found, or that the commit has no such path, is remembered in L. */
static int read_object(char **out, size_t *len_out, struct local_scm *l, const char *git_dir,
                       const char *object, const char *key, struct err *err)
{
    struct buf content;
    int status = 0, rc;

    buf_init(&content, LOCAL_FILE_MAX);
    rc = proc_run(&status, &content, NULL, false,
                  (const char *const[]){"git", git_dir, "cat-file", "blob", object, NULL}, err);
    if (rc == E_OK && status != 0) {
        if (key != NULL && status == 128 && path_absent(git_dir, object)) {
            memo_put(l, key, NULL, 0);
        }
        rc = E_NOTFOUND;
    }
    if (rc == E_OK) {
        if (key != NULL && content.len <= LOCAL_MEMO_FILE_MAX) {
            memo_put(l, key, content.data != NULL ? content.data : "", content.len);
        }
        *len_out = content.len;
        *out = buf_take(&content);
    }
    buf_cleanup(&content);
    return rc;
}

/* PATH at branch GIT_REF of the repository the PR is bound to, read with git from a
 * file:// repository. https repositories are not read here (no agent.yaml: the server's
 * defaults), nor are PRs never opened. A branch whose commit its files tell is read at
 * that commit, and what is found there (or that nothing is) remembered: a commit's files
 * never change, so the next comment on the same base runs no git. */
static int lc_file(char **out, size_t *len_out, struct scm_provider *p, const struct scm_ref *ref,
                   const char *git_ref, const char *path, struct scm_result *res, struct err *err)
{
    json_t *pr = NULL;
    const char *url;
    char *git_dir = NULL, *object = NULL, *branch, *key = NULL;
    char commit[GITREF_OID_HEX + 1];
    int rc;

    (void)res;
    *out = NULL;
    *len_out = 0;
    rc = task_store_local_pull_get(&pr, to_local(p)->store, ref->project, ref->number, err);
    if (rc != E_OK) {
        return rc == E_NOTFOUND ? err_set(err, E_NOTFOUND, "%s: local PR not bound", path)
                                : E_AGAIN;
    }
    url = json_string_value(json_object_get(pr, "repository"));
    if (url == NULL || strncmp(url, "file://", 7) != 0) {
        json_decref(pr);
        return err_set(err, E_NOTFOUND, "%s: only file:// repositories are read", path);
    }
    git_dir = xasprintf("--git-dir=%s", url + 7);
    branch = xasprintf("refs/heads/%s", git_ref);
    if (gitref_read(commit, url + 7, branch, GITREF_PACKED_MAX) == 1) {
        key = xasprintf("%s\n%s\n%s", url + 7, commit, path);
        object = xasprintf("%s:%s", commit, path); /* what the memo's entry will hold */
    } else {
        object = xasprintf("refs/heads/%s:%s", git_ref, path);
    }
    free(branch);
    json_decref(pr);
    if (key != NULL && memo_get(out, len_out, to_local(p), key)) {
        rc = *out != NULL ? E_OK : E_NOTFOUND;
    } else {
        rc = read_object(out, len_out, to_local(p), git_dir, object, key, err);
    }
    if (rc == E_NOTFOUND) {
        rc = err_set(err, E_NOTFOUND, "%s: not found at %s", path, git_ref);
    } else if (rc != E_OK) {
        rc = E_AGAIN;
    }
    free(key);
    free(git_dir);
    free(object);
    return rc;
}

/* A local PR is a new thread of the project whose first comment, by the bot, describes
 * it; PR->key in that comment finds it again, so a retried call opens no second one. */
static int lc_open_pull(char **url_out, struct scm_provider *p, const struct scm_ref *ref,
                        const struct scm_new_pull *pr, struct scm_result *res, struct err *err)
{
    char *body = xasprintf("%s**%s**\n\n`%s` → `%s`\n\n%s%s%s",
                           pr->draft ? "📝 Draft pull request: " : "Pull request: ", pr->title,
                           pr->head, pr->base, pr->body, strstr(pr->body, pr->key) ? "" : "\n",
                           strstr(pr->body, pr->key) ? "" : pr->key);
    int64_t number = 0;
    bool existed = false;
    int rc = task_store_local_open_pull(&number, &existed, to_local(p)->store, ref->project,
                                        pr->key, SCM_LOCAL_BOT, body, err);

    (void)res;
    *url_out = rc == E_OK ? xasprintf("local://%s#%lld", ref->project, (long long)number) : NULL;
    free(body);
    return rc;
}

static const char *lc_bot_login(struct scm_provider *p)
{
    (void)p;
    return SCM_LOCAL_BOT;
}

static void lc_free(struct scm_provider *p)
{
    struct local_scm *l = to_local(p);

    for (size_t i = 0; i < LOCAL_MEMO_MAX; i++) {
        free(l->memo[i].key);
        free(l->memo[i].content);
    }
    pthread_mutex_destroy(&l->memo_lock);
    free(l);
}

static const struct scm_provider_ops local_ops = {
    .name = "local",
    .react = lc_react,
    .post_comment = lc_post,
    .update_comment = lc_update,
    .delete_comment = lc_delete,
    .list_comments = lc_list,
    .permission_of = lc_permission,
    .pull_info = lc_pull,
    .file_at = lc_file,
    .open_pull = lc_open_pull,
    .bot_login = lc_bot_login,
    .free = lc_free,
};

int scm_local_new(struct scm_provider **out, struct task_store *store, struct err *err)
{
    struct local_scm *l = xcalloc(1, sizeof(*l));

    (void)err;
    l->base.ops = &local_ops;
    l->store = store;
    pthread_mutex_init(&l->memo_lock, NULL);
    *out = &l->base;
    return E_OK;
}
