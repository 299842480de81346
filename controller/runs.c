/* SPDX-License-Identifier: Apache-2.0 */
/* What the tick thread watches in running tasks (SPEC §14 "Runs"): the time left once
 * 80 % of sandbox.timeoutSeconds has passed (status.timeoutAt, which the meter turns into
 * guidance for the agent); stalls (no sandbox output, meter or gateway call for
 * --stall-after: status.stalledSince); and the runner's no-progress note (the same verify
 * failure --no-progress-after times: a pause with reason NoProgress and a reply on the
 * PR). The store is read and written outside notes_lock. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "controller/controller_int.h"

enum runs_kind { RUNS_TIMEOUT_AT, RUNS_STALL_CHECK, RUNS_UNSTALL, RUNS_NO_PROGRESS };

/* One task's pending work. */
struct runs_work {
    enum runs_kind kind;
    char *ns, *name;
    int64_t timeout_at_ms; /* RUNS_TIMEOUT_AT: status.timeoutAt */
    int64_t active_ms;     /* RUNS_STALL_CHECK: the last activity seen */
    char *meter_id;        /* RUNS_STALL_CHECK: the newest meter request id seen, or NULL */
    char *failure;         /* RUNS_NO_PROGRESS: the runner's note */
    struct controller *c;
    struct runs_work *next;
};

static void work_free(struct runs_work *w)
{
    free(w->ns);
    free(w->name);
    free(w->meter_id);
    free(w->failure);
    free(w);
}

static struct runs_work *work_new(enum runs_kind kind, const struct controller_timer *t,
                                  struct runs_work *next)
{
    struct runs_work *w = xcalloc(1, sizeof(*w));

    w->kind = kind;
    w->ns = xstrdup(t->ns);
    w->name = xstrdup(t->name);
    w->next = next;
    return w;
}

static int timeout_at_txn(struct task_txn *tx, void *userdata)
{
    const struct runs_work *w = userdata;
    char when[CLOCK_RFC3339_MAX];
    struct task_view v;
    json_t *doc = NULL;
    int rc = task_txn_get(&doc, tx, w->ns, w->name, NULL);

    if (rc != E_OK) {
        return rc;
    }
    task_view_of(&v, doc);
    if (v.phase == TASK_ACTIVE && !v.suspended) {
        clock_rfc3339(when, w->timeout_at_ms);
        json_object_set_new(json_object_get(doc, "status"), "timeoutAt", json_string(when));
        rc = task_txn_put(tx, doc, NULL);
    }
    json_decref(doc);
    return rc;
}

/* status.stalledSince set (SINCE_MS > 0) or removed (0) on a running task. */
struct stall_arg {
    const struct runs_work *w;
    int64_t since_ms;
    char *meter_id; /* out (check): the newest meter request id, or NULL */
    bool check;     /* only read the newest meter request id */
};

static int stall_txn(struct task_txn *tx, void *userdata)
{
    struct stall_arg *a = userdata;
    char when[CLOCK_RFC3339_MAX];
    struct task_view v;
    json_t *doc = NULL, *status, *ids;
    int rc = task_txn_get(&doc, tx, a->w->ns, a->w->name, NULL);

    if (rc != E_OK) {
        return rc;
    }
    task_view_of(&v, doc);
    status = json_object_get(doc, "status");
    ids = json_object_get(status, "lastMeterRequestIds");
    if (a->check) {
        const char *last = json_string_value(json_array_get(ids, json_array_size(ids) - 1));
        a->meter_id = last != NULL ? xstrdup(last) : NULL;
    } else if (v.phase == TASK_ACTIVE && a->since_ms > 0) {
        clock_rfc3339(when, a->since_ms);
        json_object_set_new(status, "stalledSince", json_string(when));
        rc = task_txn_put(tx, doc, NULL);
    } else if (a->since_ms == 0 && json_object_get(status, "stalledSince") != NULL) {
        json_object_del(status, "stalledSince");
        rc = task_txn_put(tx, doc, NULL);
    }
    json_decref(doc);
    return rc;
}

static struct controller_timer *timer_of(struct controller *c, const struct runs_work *w)
{
    for (struct controller_timer *t = c->timers; t != NULL; t = t->next) {
        if (strcmp(t->ns, w->ns) == 0 && strcmp(t->name, w->name) == 0) {
            return t;
        }
    }
    return NULL;
}

static bool same_id(const char *a, const char *b)
{
    return a == b || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

/* No output for --stall-after: a meter or gateway call since (the newest request id
 * moved) is activity; else the task is stalled since its last activity. */
static void stall_check(struct controller *c, struct runs_work *w, int64_t now_ms, struct err *err)
{
    struct stall_arg a = {.w = w, .check = true};
    struct controller_timer *t;
    bool moved, stalled = false;

    if (task_store_txn(c->store, stall_txn, &a, err) != E_OK) {
        return;
    }
    moved = !same_id(a.meter_id, w->meter_id);
    pthread_mutex_lock(&c->notes_lock);
    t = timer_of(c, w);
    if (t != NULL && moved) {
        free(t->meter_id);
        t->meter_id = a.meter_id;
        a.meter_id = NULL;
        t->active_ms = now_ms;
    } else if (t != NULL) {
        t->stalled = stalled = true;
    }
    pthread_mutex_unlock(&c->notes_lock);
    free(a.meter_id);
    if (stalled) {
        a = (struct stall_arg){.w = w, .since_ms = w->active_ms};
        (void)task_store_txn(c->store, stall_txn, &a, err);
    }
}

/* TEXT as a fenced code block of Markdown: the fence longer than any backtick run in it
 * (the text comes from the sandbox; inside code nothing is markup and nobody is
 * mentioned). New string. */
static char *fenced(const char *text)
{
    size_t run = 0, longest = 2;
    char fence[CONTROLLER_FAILURE_MAX + 8];

    for (const char *p = text; *p != '\0'; p++) {
        run = *p == '`' ? run + 1 : 0;
        longest = run > longest ? run : longest;
    }
    memset(fence, '`', longest + 1);
    fence[longest + 1] = '\0';
    return xasprintf("%stext\n%s\n%s", fence, text, fence);
}

/* Where the task's PR/MR is (annotations the bot set), or false. */
static bool pr_of(const json_t *doc, const char **provider, const char **project, int64_t *number)
{
    const json_t *ann = json_object_get(json_object_get(doc, "metadata"), "annotations");
    const char *num = json_string_value(json_object_get(ann, "divergedev.com/pr-number"));

    if (num == NULL) {
        num = json_string_value(json_object_get(ann, "divergedev.com/mr-iid"));
    }
    *provider = json_string_value(json_object_get(ann, "divergedev.com/provider"));
    *project = json_string_value(json_object_get(ann, "divergedev.com/project"));
    *number = num != NULL ? strtoll(num, NULL, 10) : 0;
    return *provider != NULL && *project != NULL && *number > 0;
}

/* The reply on the PR of a task paused for NoProgress, in its transaction. */
static int queue_reply(struct task_txn *tx, const struct runs_work *w, const json_t *doc,
                       int64_t installation)
{
    struct outbox_entry e;
    const char *provider, *project;
    char *quote;
    int rc;

    memset(&e, 0, sizeof(e));
    if (!pr_of(doc, &provider, &project, &e.number)) {
        return E_OK;
    }
    quote = fenced(w->failure);
    snprintf(e.provider, sizeof(e.provider), "%s", provider);
    snprintf(e.kind, sizeof(e.kind), "comment");
    e.project = (char *)(uintptr_t)project;
    e.installation_id = installation;
    e.body = xasprintf("⏸️ Task `%s` paused: no progress. The same verify failure came back "
                       "%lld iterations in a row:\n\n%s\n\nGive the agent a hint with "
                       "`/diverge guide …`, then continue with `/diverge resume`.\n",
                       w->name, (long long)w->c->no_progress_after, quote);
    rc = task_txn_outbox_add(NULL, tx, &e, NULL);
    free(e.body);
    free(quote);
    return rc;
}

struct no_progress_arg {
    const struct runs_work *w;
    int64_t installation;
    bool paused; /* out */
};

/* Active → Pausing with reason NoProgress (the token revoked in the same transaction; the
 * reconcile then freezes the sandbox), and the reply. */
static int no_progress_txn(struct task_txn *tx, void *userdata)
{
    struct no_progress_arg *a = userdata;
    const struct runs_work *w = a->w;
    struct task_view v;
    json_t *doc = NULL;
    char *msg;
    int rc = task_txn_get(&doc, tx, w->ns, w->name, NULL);

    if (rc != E_OK) {
        return rc;
    }
    task_view_of(&v, doc);
    if (v.phase == TASK_ACTIVE && !v.suspended) {
        json_object_set_new(json_object_get(doc, "spec"), "suspended", json_true());
        msg = xasprintf("no progress: the same verify failure %lld iterations in a row",
                        (long long)w->c->no_progress_after);
        task_set_phase(doc, TASK_PAUSING, "NoProgress", msg);
        free(msg);
        json_object_set_new(json_object_get(doc, "status"), "lastFailure", json_string(w->failure));
        rc = task_txn_token_revoke(tx, w->ns, w->name, NULL);
        if (rc == E_OK) {
            rc = queue_reply(tx, w, doc, a->installation);
        }
        if (rc == E_OK) {
            rc = task_txn_put(tx, doc, NULL);
            a->paused = rc == E_OK;
        }
    }
    json_decref(doc);
    return rc;
}

static void no_progress(struct controller *c, struct runs_work *w, struct err *err)
{
    struct no_progress_arg a = {.w = w};
    char *note = xasprintf("%s/state/%s/%s/usage.jsonl.no-progress", c->data_dir, w->ns, w->name);
    json_t *doc = NULL;
    const char *provider, *project;
    int64_t number;

    if (task_store_get(&doc, c->store, w->ns, w->name, NULL) == E_OK &&
        pr_of(doc, &provider, &project, &number)) {
        (void)task_store_inbox_installation(&a.installation, c->store, provider, project, NULL);
    }
    json_decref(doc);
    if (task_store_txn(c->store, no_progress_txn, &a, err) == E_OK && a.paused) {
        char *log = sandbox_log_path(c->data_dir, w->ns, w->name);
        sandbox_log_event(log,
                          "[diverge] no progress: the same verify failure %lld iterations in a "
                          "row; pausing",
                          (long long)c->no_progress_after);
        free(log);
    }
    (void)unlink(note);
    free(note);
}

/* The size of the task log (sandbox output), -1 when it cannot be read. */
static int64_t log_size(struct controller *c, const struct controller_timer *t)
{
    char *path = sandbox_log_path(c->data_dir, t->ns, t->name);
    struct stat st;
    int64_t n = stat(path, &st) == 0 ? (int64_t)st.st_size : -1;

    free(path);
    return n;
}

static bool has_note(struct controller *c, const struct controller_timer *t)
{
    char *path = xasprintf("%s/state/%s/%s/usage.jsonl.no-progress", c->data_dir, t->ns, t->name);
    struct stat st;
    bool yes = lstat(path, &st) == 0;

    free(path);
    return yes;
}

/* What one timer needs now (with notes_lock held); prepends it to TODO. */
static struct runs_work *plan_timer(struct controller *c, struct controller_timer *t,
                                    int64_t now_ms, struct runs_work *todo)
{
    int64_t size = log_size(c, t);

    if (t->warn_ms > 0 && !t->warned && now_ms >= t->warn_ms) {
        t->warned = true;
        todo = work_new(RUNS_TIMEOUT_AT, t, todo);
        todo->timeout_at_ms = t->deadline_ms;
    }
    if (c->no_progress_after > 0 && !t->no_progress && has_note(c, t)) {
        t->no_progress = true;
        todo = work_new(RUNS_NO_PROGRESS, t, todo);
    }
    if (size != t->log_size) { /* output (or the first look): activity */
        t->log_size = size;
        t->active_ms = now_ms;
        if (t->stalled) {
            t->stalled = false;
            todo = work_new(RUNS_UNSTALL, t, todo);
        }
    } else if (c->stall_after_ms > 0 && !t->stalled && now_ms - t->active_ms >= c->stall_after_ms) {
        todo = work_new(RUNS_STALL_CHECK, t, todo);
        todo->active_ms = t->active_ms;
        todo->meter_id = t->meter_id != NULL ? xstrdup(t->meter_id) : NULL;
    }
    return todo;
}

static void run_work(struct controller *c, struct runs_work *w, int64_t now_ms, struct err *err)
{
    struct stall_arg a = {.w = w};

    w->c = c;
    switch (w->kind) {
    case RUNS_TIMEOUT_AT:
        (void)task_store_txn(c->store, timeout_at_txn, w, err);
        break;
    case RUNS_STALL_CHECK:
        stall_check(c, w, now_ms, err);
        break;
    case RUNS_UNSTALL:
        (void)task_store_txn(c->store, stall_txn, &a, err);
        break;
    case RUNS_NO_PROGRESS:
        w->failure = controller_read_failure(c, w->ns, w->name, "no-progress");
        if (w->failure == NULL) {
            w->failure = xstrdup("(the runner's note could not be read)");
        }
        no_progress(c, w, err);
        break;
    }
}

void controller_runs_tick(struct controller *c, int64_t now_ms)
{
    struct runs_work *todo = NULL, *w;

    pthread_mutex_lock(&c->notes_lock);
    for (struct controller_timer *t = c->timers; t != NULL; t = t->next) {
        todo = plan_timer(c, t, now_ms, todo);
    }
    pthread_mutex_unlock(&c->notes_lock);
    while ((w = todo) != NULL) {
        struct err err = {0};
        todo = w->next;
        run_work(c, w, now_ms, &err);
        if (err.code != E_OK && err.code != E_NOTFOUND) {
            log_kv(LOG_WARN, "runs_watch_failed", "namespace", w->ns, "name", w->name, "error",
                   err.msg, NULL);
        }
        work_free(w);
    }
}
