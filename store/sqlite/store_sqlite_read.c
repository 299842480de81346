/* SPDX-License-Identifier: Apache-2.0 */
/* The read side of the SQLite store: GET, list (and so the first list of a watch), phase
 * counts and environments run on a small pool of read-only connections to the same WAL
 * file, never on the writer's connection, so they never wait behind a write transaction:
 * in WAL mode a reader sees the last commit before its read transaction began, and a
 * writer does not block it.
 *
 * Rules that keep reads correct:
 * - A connection is used by one thread at a time (checked out of the pool).
 * - No read transaction outlives a call: every statement is reset before the connection
 *   goes back, so a read that starts after a write was acknowledged sees that write.
 * - A list and the resourceVersion it reports come from one read transaction, so a watch
 *   that streams the events with a greater resourceVersion misses and repeats nothing.
 * A ":memory:" database cannot be shared between connections: there every read runs on
 * the writer's connection under s->mu, as the whole store did before the pool. */
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/sqlite/store_sqlite_read.h"

#define READERS 4

enum rd_stmt_id {
    RD_BEGIN,
    RD_COMMIT,
    RD_ROLLBACK,
    RD_RV,
    RD_GET_TASK,
    RD_GET_ENV,
    RD_LIST_TASKS,
    RD_LIST_TASKS_NS,
    RD_LIST_LIVE,
    RD_LIST_ENVS,
    RD_LIST_ENVS_NS,
    RD_COUNT_PHASES,
    RD_CHARGES,
    RD_STMT_COUNT,
};

static const char *const g_rd_sql[RD_STMT_COUNT] = {
    [RD_BEGIN] = "BEGIN",
    [RD_COMMIT] = "COMMIT",
    [RD_ROLLBACK] = "ROLLBACK",
    [RD_RV] = "SELECT value FROM meta WHERE key='resource_version'",
    [RD_GET_TASK] = "SELECT doc FROM tasks WHERE namespace=?1 AND name=?2",
    [RD_GET_ENV] = "SELECT doc FROM environments WHERE namespace=?1 AND name=?2",
    [RD_LIST_TASKS] = "SELECT doc FROM tasks ORDER BY namespace, name",
    [RD_LIST_TASKS_NS] = "SELECT doc FROM tasks WHERE namespace=?1 ORDER BY namespace, name",
    /* Through the partial index tasks_live (migration 10): only the tasks not finished. */
    [RD_LIST_LIVE] = "SELECT doc FROM tasks WHERE phase NOT IN ('Completed','Failed')",
    [RD_LIST_ENVS] = "SELECT doc FROM environments ORDER BY namespace, name",
    [RD_LIST_ENVS_NS] = ("SELECT doc FROM environments WHERE namespace=?1 "
                         "ORDER BY namespace, name"),
    [RD_COUNT_PHASES] = "SELECT phase, count(*) FROM tasks GROUP BY phase",
    /* A task's charges in ?2 equal slices of their time span: per slice its last time, its
     * sums, and the number of charges in all (meter_log holds the recent tail of the ids,
     * meter_requests the rest; an id is in one of them only). */
    [RD_CHARGES] = ("WITH c(t, k, m) AS (SELECT charged_ms, tokens, cost_micros FROM "
                    "meter_requests WHERE task_uid=?1 UNION ALL SELECT charged_ms, tokens, "
                    "cost_micros FROM meter_log WHERE task_uid=?1), "
                    "r(t0, span, n) AS (SELECT min(t), max(t) - min(t) + 1, count(*) FROM c) "
                    "SELECT max(c.t), sum(c.k), sum(c.m), r.n FROM c, r "
                    "GROUP BY ((c.t - r.t0) * ?2) / r.span ORDER BY 1"),
};

struct reader {
    sqlite3 *db;                        /* owned, unless the pool is shared */
    sqlite3_stmt *stmts[RD_STMT_COUNT]; /* owned; prepared on first use */
    struct reader *next;                /* on the free list */
};

struct sqlst_readers {
    pthread_mutex_t mu;   /* guards free */
    pthread_cond_t freed; /* a connection came back to the pool */
    struct reader *free;  /* idle connections */
    bool shared;          /* conns[0] is the writer's connection, used under s->mu */
    size_t n;             /* connections opened */
    struct reader conns[READERS];
};

static int rd_err(struct reader *r, int rc, const char *what, struct err *err)
{
    if (rc == SQLITE_BUSY || rc == SQLITE_LOCKED) {
        return err_set(err, E_AGAIN, "%s: database busy", what);
    }
    return err_set(err, E_FAIL, "%s: %s", what, sqlite3_errmsg(r->db));
}

/* Checks a connection out (waits while all are in use). */
static struct reader *rd_take(struct sqlite_store *s)
{
    struct sqlst_readers *p = s->readers;
    struct reader *r;

    if (p->shared) {
        pthread_mutex_lock(&s->mu);
        return &p->conns[0];
    }
    pthread_mutex_lock(&p->mu);
    while (p->free == NULL) {
        pthread_cond_wait(&p->freed, &p->mu);
    }
    r = p->free;
    p->free = r->next;
    pthread_mutex_unlock(&p->mu);
    return r;
}

static void rd_give(struct sqlite_store *s, struct reader *r)
{
    struct sqlst_readers *p = s->readers;

    if (p->shared) {
        pthread_mutex_unlock(&s->mu);
        return;
    }
    pthread_mutex_lock(&p->mu);
    r->next = p->free;
    p->free = r;
    pthread_cond_signal(&p->freed);
    pthread_mutex_unlock(&p->mu);
}

/* The connection's statement ID, reset and unbound. */
static int rd_stmt(sqlite3_stmt **out, struct reader *r, enum rd_stmt_id id, struct err *err)
{
    *out = NULL;
    if (r->stmts[id] == NULL) {
        int rc = sqlite3_prepare_v3(r->db, g_rd_sql[id], -1, SQLITE_PREPARE_PERSISTENT,
                                    &r->stmts[id], NULL);
        if (rc != SQLITE_OK) {
            return rd_err(r, rc, "prepare", err);
        }
    }
    sqlite3_reset(r->stmts[id]);
    sqlite3_clear_bindings(r->stmts[id]);
    *out = r->stmts[id];
    return E_OK;
}

static int rd_exec(struct reader *r, enum rd_stmt_id id, struct err *err)
{
    sqlite3_stmt *q = NULL;
    int rc = rd_stmt(&q, r, id, err), step;

    if (rc != E_OK) {
        return rc;
    }
    step = sqlite3_step(q);
    rc = step == SQLITE_DONE ? E_OK : rd_err(r, step, g_rd_sql[id], err);
    sqlite3_reset(q);
    return rc;
}

/* Starts a read transaction: the snapshot is taken by its first SELECT. */
static int rd_begin(struct sqlite_store *s, struct reader *r, struct err *err)
{
    return s->readers->shared ? E_OK : rd_exec(r, RD_BEGIN, err);
}

/* Ends the read transaction, whatever happened inside it. */
static void rd_end(struct sqlite_store *s, struct reader *r)
{
    if (s->readers->shared || sqlite3_get_autocommit(r->db)) {
        return;
    }
    if (rd_exec(r, RD_COMMIT, NULL) != E_OK) {
        (void)rd_exec(r, RD_ROLLBACK, NULL);
    }
}

static int rd_rv(int64_t *out, struct reader *r, struct err *err)
{
    sqlite3_stmt *q = NULL;
    int rc = rd_stmt(&q, r, RD_RV, err), step;

    *out = 0;
    if (rc != E_OK) {
        return rc;
    }
    step = sqlite3_step(q);
    if (step == SQLITE_ROW) {
        *out = sqlite3_column_int64(q, 0);
    } else {
        rc = rd_err(r, step, "read resourceVersion", err);
    }
    sqlite3_reset(q);
    return rc;
}

static int not_found(const char *name, struct err *err)
{
    return err_set(err, E_NOTFOUND, "agenttasks \"%s\" not found", name);
}

/* Calls FN with one stored object by namespace and name, as text (its return is
 * returned); E_NOTFOUND names agenttasks. */
static int rd_get_text(struct sqlite_store *s, enum rd_stmt_id id, const char *ns, const char *name,
                       task_text_fn fn, void *userdata, struct err *err)
{
    struct reader *r;
    sqlite3_stmt *q = NULL;
    int rc, step;

    if (id == RD_GET_TASK && sqlst_mem_get(&rc, s->mem, ns, name, fn, userdata)) {
        return rc == E_NOTFOUND ? not_found(name, err) : rc;
    }
    r = rd_take(s);
    rc = rd_stmt(&q, r, id, err);
    if (rc == E_OK) {
        sqlite3_bind_text(q, 1, ns, -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 2, name, -1, SQLITE_STATIC);
        step = sqlite3_step(q);
        if (step == SQLITE_ROW && sqlite3_column_text(q, 0) != NULL) {
            rc = fn((const char *)sqlite3_column_text(q, 0), (size_t)sqlite3_column_bytes(q, 0),
                    userdata);
        } else if (step == SQLITE_ROW) {
            rc = err_set(err, E_FAIL, "stored object %s/%s is corrupt", ns, name);
        } else if (step == SQLITE_DONE) {
            rc = not_found(name, err);
        } else {
            rc = rd_err(r, step, "read", err);
        }
        sqlite3_reset(q);
    }
    rd_give(s, r);
    return rc;
}

struct parsed {
    json_t *obj;  /* out: owned */
    bool corrupt; /* out: the stored text did not parse */
};

static int parse_text(const char *json, size_t len, void *userdata)
{
    struct parsed *p = userdata;

    p->obj = json_loadb(json, len, 0, NULL);
    p->corrupt = p->obj == NULL;
    return p->obj != NULL ? E_OK : E_FAIL;
}

/* One object by namespace and name, parsed; E_NOTFOUND names agenttasks. */
static int rd_get(json_t **out, struct sqlite_store *s, enum rd_stmt_id id, const char *ns,
                  const char *name, struct err *err)
{
    struct parsed p = {.obj = NULL, .corrupt = false};
    int rc = rd_get_text(s, id, ns, name, parse_text, &p, err);

    *out = NULL;
    if (p.corrupt) {
        return err_set(err, E_FAIL, "stored object %s/%s is corrupt", ns, name);
    }
    if (rc == E_OK) {
        *out = p.obj;
    }
    return rc;
}

/* Calls FN with each stored object of NS (NULL: all) of the tasks (or environments),
 * and sets *rv_out (may be NULL) to the resourceVersion of the same snapshot. */
static int rd_list_by(int64_t *rv_out, struct sqlite_store *s, enum rd_stmt_id id, const char *ns,
                      task_text_fn fn, void *userdata, struct err *err)
{
    struct reader *r = rd_take(s);
    sqlite3_stmt *q = NULL;
    int rc = rd_begin(s, r, err), step = SQLITE_DONE;

    if (rc == E_OK && rv_out != NULL) {
        rc = rd_rv(rv_out, r, err);
    }
    if (rc == E_OK) {
        rc = rd_stmt(&q, r, id, err);
    }
    if (rc == E_OK) {
        if (ns != NULL) {
            sqlite3_bind_text(q, 1, ns, -1, SQLITE_STATIC);
        }
        while ((step = sqlite3_step(q)) == SQLITE_ROW) {
            const char *text = (const char *)sqlite3_column_text(q, 0);
            if (text != NULL) {
                rc = fn(text, (size_t)sqlite3_column_bytes(q, 0), userdata);
                if (rc != E_OK) {
                    break;
                }
            }
        }
        if (rc == E_OK && step != SQLITE_DONE) {
            rc = rd_err(r, step, "list", err);
        }
        sqlite3_reset(q);
    }
    rd_end(s, r);
    rd_give(s, r);
    return rc;
}

static int rd_list(int64_t *rv_out, struct sqlite_store *s, bool envs, const char *ns,
                   task_text_fn fn, void *userdata, struct err *err)
{
    enum rd_stmt_id id = envs ? (ns != NULL ? RD_LIST_ENVS_NS : RD_LIST_ENVS)
                              : (ns != NULL ? RD_LIST_TASKS_NS : RD_LIST_TASKS);
    int rc;

    if (!envs && sqlst_mem_list(&rc, rv_out, s->mem, ns, fn, userdata)) {
        return rc;
    }
    return rd_list_by(rv_out, s, id, ns, fn, userdata, err);
}

int sqlst_list_text(int64_t *rv_out, struct task_store *st, const char *ns, task_text_fn fn,
                    void *userdata, struct err *err)
{
    *rv_out = 0;
    return rd_list(rv_out, sqlst_of(st), false, ns, fn, userdata, err);
}

static int append_parsed(const char *json, size_t len, void *userdata)
{
    json_t *obj = json_loadb(json, len, 0, NULL);

    if (obj != NULL) { /* a corrupt row is skipped, as it always was */
        json_array_append_new(userdata, obj);
    }
    return E_OK;
}

static int list_json(json_t **items_out, int64_t *rv_out, struct sqlite_store *s, bool envs,
                     const char *ns, struct err *err)
{
    json_t *items = json_array();
    int rc = rd_list(rv_out, s, envs, ns, append_parsed, items, err);

    *items_out = NULL;
    if (rc != E_OK) {
        json_decref(items);
        return rc;
    }
    *items_out = items;
    return E_OK;
}

int sqlst_get(json_t **out, struct task_store *st, const char *ns, const char *name,
              struct err *err)
{
    return rd_get(out, sqlst_of(st), RD_GET_TASK, ns, name, err);
}

int sqlst_get_text(struct task_store *st, const char *ns, const char *name, task_text_fn fn,
                   void *userdata, struct err *err)
{
    return rd_get_text(sqlst_of(st), RD_GET_TASK, ns, name, fn, userdata, err);
}

int sqlst_list(json_t **items_out, int64_t *rv_out, struct task_store *st, const char *ns,
               struct err *err)
{
    *rv_out = 0;
    return list_json(items_out, rv_out, sqlst_of(st), false, ns, err);
}

int sqlst_list_live(struct task_store *st, task_text_fn fn, void *userdata, struct err *err)
{
    int rc;

    if (sqlst_mem_list_live(&rc, sqlst_of(st)->mem, fn, userdata)) {
        return rc;
    }
    return rd_list_by(NULL, sqlst_of(st), RD_LIST_LIVE, NULL, fn, userdata, err);
}

int sqlst_env_list(json_t **items_out, struct task_store *st, const char *ns, struct err *err)
{
    return list_json(items_out, NULL, sqlst_of(st), true, ns, err);
}

int sqlst_env_get(json_t **out, struct task_store *st, const char *ns, const char *name,
                  struct err *err)
{
    int rc = rd_get(out, sqlst_of(st), RD_GET_ENV, ns, name, err);

    if (rc == E_NOTFOUND) {
        rc = err_set(err, E_NOTFOUND, "environments \"%s\" not found", name);
    }
    return rc;
}

int sqlst_count_phases(int64_t counts_out[TASK_PHASE_COUNT], struct task_store *st, struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    struct reader *r = rd_take(s);
    sqlite3_stmt *q = NULL;
    int rc = rd_stmt(&q, r, RD_COUNT_PHASES, err), step = SQLITE_DONE;

    memset(counts_out, 0, sizeof(int64_t) * TASK_PHASE_COUNT);
    while (rc == E_OK && (step = sqlite3_step(q)) == SQLITE_ROW) {
        enum task_phase p;
        const char *name = (const char *)sqlite3_column_text(q, 0);
        if (name != NULL && task_phase_parse(&p, name) == E_OK) {
            counts_out[p] = sqlite3_column_int64(q, 1);
        }
    }
    if (rc == E_OK && step != SQLITE_DONE) {
        rc = rd_err(r, step, "count phases", err);
    }
    if (q != NULL) {
        sqlite3_reset(q);
    }
    rd_give(s, r);
    return rc;
}

int sqlst_charges(struct task_charge_point *out, size_t max, size_t *n_out, int64_t *count_out,
                  struct task_store *st, const char *task_uid, struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    struct reader *r = rd_take(s);
    sqlite3_stmt *q = NULL;
    int rc = rd_stmt(&q, r, RD_CHARGES, err), step = SQLITE_DONE;
    int64_t tokens = 0, micros = 0;

    if (rc == E_OK) {
        sqlite3_bind_text(q, 1, task_uid, -1, SQLITE_STATIC);
        sqlite3_bind_int64(q, 2, (sqlite3_int64)max);
    }
    while (rc == E_OK && *n_out < max && (step = sqlite3_step(q)) == SQLITE_ROW) {
        /* Each sum stays below the task's own totals, which the meter keeps in range. */
        tokens += sqlite3_column_int64(q, 1);
        micros += sqlite3_column_int64(q, 2);
        out[*n_out] = (struct task_charge_point){sqlite3_column_int64(q, 0), tokens, micros};
        *count_out = sqlite3_column_int64(q, 3);
        (*n_out)++;
    }
    if (rc == E_OK && step != SQLITE_DONE && step != SQLITE_ROW) {
        rc = rd_err(r, step, "read charges", err);
    }
    if (q != NULL) {
        sqlite3_reset(q);
    }
    rd_give(s, r);
    return rc;
}

/* True when the writer's connection runs in WAL mode (else readers would block writers). */
static bool writer_in_wal(struct sqlite_store *s)
{
    sqlite3_stmt *q = NULL;
    bool wal = false;

    if (sqlite3_prepare_v2(s->db, "PRAGMA journal_mode", -1, &q, NULL) == SQLITE_OK &&
        sqlite3_step(q) == SQLITE_ROW) {
        const char *mode = (const char *)sqlite3_column_text(q, 0);
        wal = mode != NULL && strcmp(mode, "wal") == 0;
    }
    sqlite3_finalize(q);
    return wal;
}

int sqlst_readers_open(struct sqlite_store *s, const char *path, struct err *err)
{
    struct sqlst_readers *p = xcalloc(1, sizeof(*p));

    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->freed, NULL);
    s->readers = p;
    if (path[0] == '\0' || strcmp(path, ":memory:") == 0 || strncmp(path, "file:", 5) == 0 ||
        !writer_in_wal(s)) {
        p->shared = true;
        p->conns[0].db = s->db;
        p->n = 1;
        return E_OK;
    }
    for (size_t i = 0; i < READERS; i++) {
        struct reader *r = &p->conns[i];
        int rc = sqlite3_open_v2(path, &r->db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL);
        p->n = i + 1; /* closed by sqlst_readers_close even when the open failed */
        if (rc != SQLITE_OK) {
            return err_set(err, E_FAIL, "open %s for reading: %s", path,
                           r->db != NULL ? sqlite3_errmsg(r->db) : sqlite3_errstr(rc));
        }
        sqlite3_busy_timeout(r->db, 5000);
        r->next = p->free;
        p->free = r;
    }
    return E_OK;
}

bool sqlst_readers_shared(const struct sqlite_store *s)
{
    return s->readers == NULL || s->readers->shared;
}

void sqlst_readers_close(struct sqlite_store *s)
{
    struct sqlst_readers *p = s->readers;

    if (p == NULL) {
        return;
    }
    for (size_t i = 0; i < p->n; i++) {
        for (size_t k = 0; k < RD_STMT_COUNT; k++) {
            sqlite3_finalize(p->conns[i].stmts[k]);
        }
        if (!p->shared) {
            sqlite3_close(p->conns[i].db);
        }
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->freed);
    free(p);
    s->readers = NULL;
}
