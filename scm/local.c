/* SPDX-License-Identifier: Apache-2.0 */
/* The `local` SCM provider: PR threads kept in the database, so `diverge local` runs the
 * whole pipeline (inbox, bot, controller, notifier, outbox) offline. Its bot account is
 * SCM_LOCAL_BOT; a commenter's permission is what `diverge local comment --permission`
 * said last. */
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/proc.h"
#include "scm/scm.h"

struct local_scm {
    struct scm_provider base; /* must be first */
    struct task_store *store; /* borrowed */
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

/* PATH at branch GIT_REF of the repository the PR is bound to, read with git from a
 * file:// repository. https repositories are not read here (no agent.yaml: the server's
 * defaults), nor are PRs never opened. */
static int lc_file(char **out, size_t *len_out, struct scm_provider *p, const struct scm_ref *ref,
                   const char *git_ref, const char *path, struct scm_result *res, struct err *err)
{
    json_t *pr = NULL;
    const char *url;
    char *git_dir = NULL, *object = NULL;
    struct buf content;
    int rc, status = 0;

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
    object = xasprintf("refs/heads/%s:%s", git_ref, path);
    json_decref(pr);
    buf_init(&content, LOCAL_FILE_MAX);
    rc = proc_run(&status, &content, NULL, false,
                  (const char *const[]){"git", git_dir, "cat-file", "blob", object, NULL}, err);
    if (rc == E_OK && status != 0) {
        rc = err_set(err, E_NOTFOUND, "%s: not found at %s", path, git_ref);
    }
    if (rc == E_OK) {
        *len_out = content.len;
        *out = buf_take(&content);
    } else if (rc != E_NOTFOUND) {
        rc = E_AGAIN;
    }
    buf_cleanup(&content);
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
    free(to_local(p));
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
    *out = &l->base;
    return E_OK;
}
