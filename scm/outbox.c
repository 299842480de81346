/* SPDX-License-Identifier: Apache-2.0 */
/* The outbox worker: one thread that makes every queued SCM call, in order per PR/MR,
 * retrying transient failures with exponential backoff (or the wait the SCM asked for)
 * and keeping content-creating calls under a per-minute budget per provider. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "common/log.h"
#include "scm/render.h"
#include "scm/scm.h"

struct rate_window {
    char provider[STORE_PROVIDER_MAX];
    struct scm_rate rate;
};

struct scm_outbox {
    struct task_store *store;       /* borrowed */
    const struct scm_registry *reg; /* borrowed */
    struct scm_outbox_config cfg;
    struct rate_window windows[SCM_PROVIDERS_MAX];
    struct store_worker *worker; /* owned: the thread making the calls */
    pthread_mutex_t mu;          /* stats */
    struct scm_outbox_stats stats;
};

int64_t scm_outbox_backoff(const struct scm_outbox_config *cfg, int attempts,
                           const struct scm_result *res)
{
    int64_t d = cfg->base_backoff_ms;

    for (int i = 1; i < attempts && d < cfg->max_backoff_ms; i++) {
        d *= 2;
    }
    if (d > cfg->max_backoff_ms) {
        d = cfg->max_backoff_ms;
    }
    if (res != NULL && res->retry_after_ms > 0) {
        /* The SCM said when: never earlier (GitHub bans clients that ignore it). */
        d = res->retry_after_ms > d || res->rate_limited ? res->retry_after_ms : d;
    } else if (res != NULL && res->rate_limited) {
        /* Secondary rate limit without a hint: GitHub asks for at least a minute. */
        d = d > 60000 ? d : 60000;
    }
    return d;
}

static bool content_creating(const struct outbox_entry *e)
{
    return strcmp(e->kind, "react") == 0 || strcmp(e->kind, "comment") == 0 ||
           strcmp(e->kind, "edit") == 0 || strcmp(e->kind, "delete") == 0 ||
           strcmp(e->kind, "sticky") == 0 || strcmp(e->kind, "pull") == 0;
}

static struct rate_window *window_of(struct scm_outbox *o, const char *provider)
{
    for (size_t i = 0; i < SCM_PROVIDERS_MAX; i++) {
        struct rate_window *w = &o->windows[i];
        if (w->provider[0] == '\0') {
            snprintf(w->provider, sizeof(w->provider), "%s", provider);
        }
        if (strcmp(w->provider, provider) == 0) {
            return w;
        }
    }
    return &o->windows[0];
}

static bool is_sticky(const struct outbox_entry *e)
{
    return e->coalesce_key != NULL && strncmp(e->coalesce_key, "sticky/", 7) == 0;
}

/* A sticky call waits this long while the bot's login is unknown (the provider itself
 * asks for it again with backoff; until then nothing is created, adopted or folded). */
#define LOGIN_WAIT_MS 1000
/* The start of the task identity line (scm_render_task_tag). */
#define TASK_TAG_PREFIX "<!-- diverge-task:"

enum sticky_match {
    STICKY_OTHER,  /* not ours to touch: another author, no marker, or another task's */
    STICKY_OURS,   /* the bot's, with this task's identity line */
    STICKY_LEGACY, /* the bot's marker comment naming no task (an older version's) */
};

/* What comment C is to the task whose identity line is TAG. Only the bot's own comments
 * (LOGIN, compared as GitHub compares logins: ignoring case) with the marker as their
 * first line count: anyone can write the marker, and `user.type: Bot` is any app. */
static enum sticky_match match_of(const struct scm_comment *c, const char *login, const char *tag)
{
    size_t m = strlen(SCM_STICKY_MARKER);

    if (strcasecmp(c->author, login) != 0 || strncmp(c->body, SCM_STICKY_MARKER, m) != 0 ||
        (c->body[m] != '\0' && c->body[m] != '\n' && c->body[m] != '\r')) {
        return STICKY_OTHER;
    }
    if (tag[0] != '\0' && strstr(c->body, tag) != NULL) {
        return STICKY_OURS;
    }
    return strstr(c->body, TASK_TAG_PREFIX) == NULL ? STICKY_LEGACY : STICKY_OTHER;
}

/* The task's identity line: the second line of BODY (a new string). */
static char *tag_line_of(const char *body)
{
    const char *nl = strchr(body, '\n');
    const char *tag = nl != NULL ? nl + 1 : "";
    const char *tag_end = strchr(tag, '\n');

    return xstrndup(tag, tag_end != NULL ? (size_t)(tag_end - tag) : strlen(tag));
}

/* The index in CS[N] of the comment to adopt, or SIZE_MAX; *WANT_OUT: the kind it is. */
static size_t pick_sticky(enum sticky_match *want_out, const struct scm_comment *cs, size_t n,
                          const char *login, const char *tag_line)
{
    for (size_t i = 0; i < n; i++) {
        if (match_of(&cs[i], login, tag_line) == STICKY_OURS) {
            *want_out = STICKY_OURS;
            return i;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (match_of(&cs[i], login, tag_line) == STICKY_LEGACY) {
            *want_out = STICKY_LEGACY;
            return i;
        }
    }
    return SIZE_MAX;
}

/* Deletes the comments after CS[KEEP] that match like it does (already gone is fine). */
static int fold_duplicates(struct scm_provider *p, const struct scm_ref *ref,
                           const struct scm_comment *cs, size_t n, size_t keep,
                           enum sticky_match want, const char *login, const char *tag_line,
                           struct scm_result *res, struct err *err)
{
    int rc = E_OK;

    for (size_t i = keep + 1; i < n && rc == E_OK; i++) {
        if (match_of(&cs[i], login, tag_line) == want) {
            rc = p->ops->delete_comment(p, ref, cs[i].id, res, err);
            rc = rc == E_NOTFOUND ? E_OK : rc;
        }
    }
    return rc;
}

/* Creates the task's sticky comment, or adopts one already there and folds later
 * duplicates away: never a second comment. Adopted is, of the bot's marker comments, the
 * oldest with this task's identity line (after a crash between "created at the SCM" and
 * "id stored", or a lost database row), else the oldest naming no task (written by an
 * older version or another deployment); one naming another task never. *result_out: the
 * comment id. *login_wait_out: nothing was done because the bot's login is unknown. */
static int sticky(char **result_out, bool *login_wait_out, struct scm_provider *p,
                  const struct scm_ref *ref, const char *body, struct scm_result *res,
                  struct err *err)
{
    const char *login = p->ops->bot_login(p);
    char *tag_line = NULL;
    struct scm_comment *cs = NULL;
    size_t n = 0, keep;
    enum sticky_match want = STICKY_OURS;
    int rc;

    *result_out = NULL;
    if (login == NULL) {
        *login_wait_out = true;
        return err_set(err, E_AGAIN, "the bot's login is not known yet");
    }
    rc = p->ops->list_comments(&cs, &n, p, ref, res, err);
    if (rc != E_OK) {
        return rc;
    }
    tag_line = tag_line_of(body);
    keep = pick_sticky(&want, cs, n, login, tag_line);
    if (keep == SIZE_MAX) {
        rc = p->ops->post_comment(result_out, p, ref, body, res, err);
        goto out;
    }
    rc = fold_duplicates(p, ref, cs, n, keep, want, login, tag_line, res, err);
    if (rc == E_OK && strcmp(cs[keep].body, body) != 0) {
        rc = p->ops->update_comment(p, ref, cs[keep].id, body, res, err);
    }
    if (rc == E_OK) {
        *result_out = xstrdup(cs[keep].id);
    }
out:
    scm_comments_free(cs, n);
    free(tag_line);
    return rc;
}

/* A "pull" entry: BODY is the request (title, head, base, body, draft, key). */
static int open_pull(char **result_out, struct scm_provider *p, const struct scm_ref *ref,
                     const char *body, struct scm_result *res, struct err *err)
{
    json_t *req = json_loads(body != NULL ? body : "", 0, NULL);
    struct scm_new_pull pr = {
        .title = json_string_value(json_object_get(req, "title")),
        .head = json_string_value(json_object_get(req, "head")),
        .base = json_string_value(json_object_get(req, "base")),
        .body = json_string_value(json_object_get(req, "body")),
        .draft = json_is_true(json_object_get(req, "draft")),
        .key = json_string_value(json_object_get(req, "key")),
    };
    int rc;

    if (p->ops->open_pull == NULL) {
        rc = err_set(err, E_INVALID, "%s cannot open pull requests", p->ops->name);
    } else if (pr.title == NULL || pr.head == NULL || pr.base == NULL || pr.body == NULL ||
               pr.key == NULL) {
        rc = err_set(err, E_INVALID, "malformed pull request entry");
    } else {
        rc = p->ops->open_pull(result_out, p, ref, &pr, res, err);
    }
    json_decref(req);
    return rc;
}

static int set_pr_annotation(json_t *doc, struct err *err, void *userdata)
{
    json_t *md = json_object_get(doc, "metadata");
    json_t *ann = json_object_get(md, "annotations");
    const char *cur;

    (void)err;
    if (!json_is_object(ann)) {
        ann = json_object();
        json_object_set_new(md, "annotations", ann);
    }
    cur = json_string_value(json_object_get(ann, TASK_ANN_PULL_REQUEST_URL));
    if (cur != NULL && strcmp(cur, userdata) == 0) {
        return TASK_MUTATE_UNCHANGED;
    }
    json_object_set_new(ann, TASK_ANN_PULL_REQUEST_URL, json_string(userdata));
    return E_OK;
}

/* Links the opened PR URL in the task "ns/name" TARGET (gone meanwhile: nothing). */
static void link_pull(struct task_store *store, const char *target, const char *url)
{
    const char *slash = target != NULL ? strchr(target, '/') : NULL;
    char *ns, *copy;

    if (slash == NULL || url == NULL) {
        return;
    }
    ns = xstrndup(target, (size_t)(slash - target));
    copy = xstrdup(url);
    (void)task_store_mutate(NULL, store, ns, slash + 1, set_pr_annotation, copy, NULL);
    free(copy);
    free(ns);
}

static int call(char **result_out, bool *login_wait_out, struct scm_provider *p,
                const struct outbox_entry *e, struct scm_result *res, struct err *err)
{
    struct scm_ref ref = {
        .project = e->project, .number = e->number, .installation_id = e->installation_id};

    *result_out = NULL;
    if (strcmp(e->kind, "react") == 0) {
        return p->ops->react(p, &ref, e->target, e->body, res, err);
    }
    if (strcmp(e->kind, "comment") == 0) {
        return p->ops->post_comment(result_out, p, &ref, e->body, res, err);
    }
    if (strcmp(e->kind, "sticky") == 0) {
        return sticky(result_out, login_wait_out, p, &ref, e->body, res, err);
    }
    if (strcmp(e->kind, "edit") == 0) {
        int rc = p->ops->update_comment(p, &ref, e->target, e->body, res, err);
        if (rc == E_NOTFOUND && is_sticky(e)) {
            /* Someone deleted our sticky comment: make (or find) one again. */
            return sticky(result_out, login_wait_out, p, &ref, e->body, res, err);
        }
        return rc;
    }
    if (strcmp(e->kind, "delete") == 0) {
        return p->ops->delete_comment(p, &ref, e->target, res, err);
    }
    if (strcmp(e->kind, "pull") == 0) {
        return open_pull(result_out, p, &ref, e->body, res, err);
    }
    return err_set(err, E_INVALID, "unknown outbox call kind %s", e->kind);
}

static void bump(struct scm_outbox *o, int64_t *field)
{
    pthread_mutex_lock(&o->mu);
    (*field)++;
    pthread_mutex_unlock(&o->mu);
}

/* Sets aside an entry that cannot be sent now: its provider is not configured (it fails
 * for good) or it is a sticky call before the bot's login is known (it waits). True when
 * it did. */
static bool set_aside(struct scm_outbox *o, const struct outbox_entry *e, struct scm_provider *p)
{
    if (p == NULL) {
        log_kv(LOG_ERROR, "outbox_no_provider", "provider", e->provider, NULL);
        (void)task_store_outbox_retry(o->store, e->id, 0, true, "provider not configured", NULL);
        return true;
    }
    if (strcmp(e->kind, "sticky") == 0 && p->ops->bot_login(p) == NULL) {
        /* Not before the rate budget: a call that waits spends none of it. */
        (void)task_store_outbox_defer(o->store, e->id, LOGIN_WAIT_MS,
                                      "the bot's login is not known yet", NULL);
        return true;
    }
    return false;
}

/* Takes one call from W's rate budget when E creates content. Returns the ms to wait
 * when the budget is spent (the entry goes back), else 0. */
static int64_t spend_rate_budget(struct scm_outbox *o, const struct outbox_entry *e,
                                 struct rate_window *w)
{
    const struct clock *clk = clock_system();
    int64_t wait;

    if (!content_creating(e)) {
        return 0;
    }
    wait = scm_rate_wait(&w->rate, o->cfg.content_per_minute, clock_now_ms(clk));
    if (wait > 0) {
        bump(o, &o->stats.rate_waits);
        task_store_outbox_release(o->store);
        return wait;
    }
    scm_rate_note(&w->rate, clock_now_ms(clk));
    return 0;
}

/* True when the provider itself paced the call (GitLab: notes per minute and project). */
static bool provider_paced(int rc, const struct scm_result *res)
{
    return rc == E_AGAIN && res->status == 0 && res->rate_limited && res->retry_after_ms > 0;
}

/* A call the provider paced: not made, so no attempt is counted. */
static void record_paced(struct scm_outbox *o, const struct outbox_entry *e,
                         const struct scm_result *res, const struct err *err)
{
    bump(o, &o->stats.rate_waits);
    log_kv(LOG_INFO, "scm_call_paced", "provider", e->provider, "kind", e->kind, "project",
           e->project, "error", err->msg, NULL);
    (void)task_store_outbox_defer(o->store, e->id, res->retry_after_ms, err->msg, NULL);
}

/* A call that succeeded; RESULT (may be NULL) is what it returned. */
static void record_done(struct scm_outbox *o, const struct outbox_entry *e, const char *result,
                        const char *status, const char *attempts)
{
    if (is_sticky(e)) {
        (void)task_store_sticky_sent(o->store, e->coalesce_key, result != NULL ? result : e->target,
                                     NULL);
    }
    if (strcmp(e->kind, "pull") == 0) {
        link_pull(o->store, e->target, result);
    }
    (void)task_store_outbox_done(o->store, e->id, result, NULL);
    log_kv(LOG_INFO, "scm_call", "provider", e->provider, "kind", e->kind, "project", e->project,
           "status", status, "attempt", attempts, NULL);
}

/* A call that failed with RC: retried with backoff while it may be, else given up. */
static void record_failure(struct scm_outbox *o, const struct outbox_entry *e, int rc,
                           const struct scm_result *res, const struct err *err, const char *status,
                           const char *attempts)
{
    bump(o, &o->stats.failures);
    if (res->rate_limited) {
        bump(o, &o->stats.rate_waits);
    }
    if (rc == E_AGAIN && e->attempts + 1 < o->cfg.max_attempts) {
        int64_t delay = scm_outbox_backoff(&o->cfg, e->attempts + 1, res);
        char d[32];
        snprintf(d, sizeof(d), "%lld", (long long)delay);
        log_kv(LOG_WARN, "scm_call_retry", "provider", e->provider, "kind", e->kind, "project",
               e->project, "status", status, "attempt", attempts, "delay_ms", d, "error", err->msg,
               NULL);
        (void)task_store_outbox_retry(o->store, e->id, delay, false, err->msg, NULL);
        return;
    }
    log_kv(LOG_ERROR, "scm_call_failed", "provider", e->provider, "kind", e->kind, "project",
           e->project, "status", status, "attempt", attempts, "error", err->msg, NULL);
    (void)task_store_outbox_retry(o->store, e->id, 0, true, err->msg, NULL);
}

/* Makes the call of E and records what happened. Returns the ms to wait before the next
 * call (rate budget), else 0. */
static int64_t process(struct scm_outbox *o, struct outbox_entry *e)
{
    struct scm_provider *p = scm_registry_get(o->reg, e->provider);
    struct scm_result res = {0};
    struct err err = {0};
    struct rate_window *w = window_of(o, e->provider);
    char *result = NULL;
    char attempts[16], status[16];
    int64_t wait;
    bool login_wait = false;
    int rc;

    if (set_aside(o, e, p)) {
        return 0;
    }
    wait = spend_rate_budget(o, e, w);
    if (wait > 0) {
        return wait;
    }
    rc = call(&result, &login_wait, p, e, &res, &err);
    if (login_wait) {
        /* Not a failed call: it was not made. It waits, however long, and is never lost. */
        (void)task_store_outbox_defer(o->store, e->id, LOGIN_WAIT_MS, err.msg, NULL);
        return 0;
    }
    if (provider_paced(rc, &res)) {
        record_paced(o, e, &res, &err);
        free(result);
        return 0;
    }
    bump(o, &o->stats.calls);
    snprintf(attempts, sizeof(attempts), "%d", e->attempts + 1);
    snprintf(status, sizeof(status), "%d", res.status);
    if (rc == E_OK) {
        record_done(o, e, result, status, attempts);
    } else {
        record_failure(o, e, rc, &res, &err, status, attempts);
    }
    free(result);
    return 0;
}

/* One outbox entry (the store worker's step): 0 when it was sent (or failed for good),
 * else the ms to wait: for the rate budget to free, or until the next entry is due. */
static int64_t step(void *userdata)
{
    struct scm_outbox *o = userdata;
    struct outbox_entry e;
    int64_t wait = -1;

    if (task_store_outbox_next(&e, &wait, o->store, NULL) == E_OK) {
        int64_t rate = process(o, &e);
        outbox_entry_cleanup(&e);
        return rate > 0 ? rate : 0;
    }
    return wait;
}

static const struct store_worker_config queue = {
    .name = "scm-outbox", .wake = STORE_WORKER_OUTBOX, .step = step};

int scm_outbox_new(struct scm_outbox **out, struct task_store *store,
                   const struct scm_registry *registry, const struct scm_outbox_config *cfg,
                   struct err *err)
{
    struct scm_outbox *o = xcalloc(1, sizeof(*o));
    int rc;

    *out = NULL;
    o->store = store;
    o->reg = registry;
    o->cfg = *cfg;
    if (o->cfg.content_per_minute <= 0 || o->cfg.content_per_minute >= SCM_RATE_SLOTS) {
        o->cfg.content_per_minute = 80;
    }
    pthread_mutex_init(&o->mu, NULL);
    rc = store_worker_start(&o->worker, store, &queue, o, err);
    if (rc != E_OK) {
        pthread_mutex_destroy(&o->mu);
        free(o);
        return rc;
    }
    *out = o;
    return E_OK;
}

void scm_outbox_free(struct scm_outbox *o)
{
    if (o == NULL) {
        return;
    }
    store_worker_stop(o->worker);
    pthread_mutex_destroy(&o->mu);
    free(o);
}

void scm_outbox_stats(struct scm_outbox_stats *out, struct scm_outbox *o)
{
    pthread_mutex_lock(&o->mu);
    *out = o->stats;
    pthread_mutex_unlock(&o->mu);
}
