/* SPDX-License-Identifier: Apache-2.0 */
/* The meter's request-id index on the SQLite store. Every id ever charged is kept in
 * SQLite, so no retry is ever charged twice (SPEC §7 step 4), and memory stays bounded
 * however many ids a task token sends (security review finding 7a).
 *
 * Charges append to meter_log (one hot page per commit, no index to update); the
 * in-memory index holds exactly the ids of meter_log, in two generations. The current one
 * takes new charges; at half of STORE_METER_INDEX_IDS ids (or half the bytes) it is
 * sealed and a new one starts. Once the transaction that sealed it has committed, the
 * archiver thread copies the sealed rows, sorted, into meter_requests of a second SQLite
 * file (the archive, "<db>-meter") in its own fsync'd transaction on its own connections,
 * so no meter commit waits for it (moving 4,096 rows inside a meter commit stalled it
 * 20-40 ms). A later write transaction sees the archive's commit and deletes the sealed
 * rows from meter_log; only then are their ids dropped from memory. An id in neither
 * generation is looked up in main.meter_requests (rows moved there in the writer's own
 * transaction: ":memory:" stores, restarts, a generation sealed twice within one
 * transaction) and in the archive before it is charged.
 *
 * Invariants: the archive holds only committed ids (it reads meter_log on a connection of
 * its own, after the COMMIT); a row leaves meter_log only after it is durable in the
 * archive or in main.meter_requests; a kill -9 in between leaves it in both, which lookups
 * tolerate.
 *
 * In front of those two lookups, a Bloom filter (store_sqlite_idf.h, s->meter_seen) of
 * every id they could find: an id it has never seen is fresh without a B-tree probe. It
 * has no false negative, because (1) a row enters main.meter_requests or the archive only
 * from meter_log (SQLST_METER_MOVE, the archiver, migration 7 before the open) or was
 * there at the open; (2) a row enters meter_log only in sqlst_txn_meter_claim, and every
 * meter_log row reaches the index through index_add (the claim, or load_meter_ids before
 * any seal can move it), which adds it to the filter; (3) the rows stored at the open are
 * added by a scan on connections of its own (a snapshot taken after the open: no row is
 * ever deleted from those tables), merged in before the filter is first trusted
 * (meter_seen_ready; until then every fresh id is looked up as before); (4) nothing is
 * ever removed from the filter: an id of a rolled-back transaction stays in it, which
 * costs that id a lookup, never a charge. Only this process writes these files (one
 * server per data dir, server/serve.c). */
#include <pthread.h>
#include <sqlite3.h>
#include <string.h>
#include <sys/prctl.h>

#include "common/log.h"
#include "store/sqlite/store_sqlite_idf.h"
#include "store/sqlite/store_sqlite_int.h"
#include "store/sqlite/store_sqlite_read.h"

#define METER_KEY_OVERHEAD 64 /* bytes per index entry beyond its key (hash table, node) */

struct sqlst_archiver {
    pthread_t thread;
    pthread_mutex_t mu; /* guards want_*, done_seq, stop */
    pthread_cond_t cv;  /* work asked, work done, or stop */
    int64_t want_seq;   /* the generation asked for (its seal number) */
    int64_t want_upto;  /* its last meter_log id */
    int64_t done_seq;   /* the last generation stored durably in the archive */
    bool stop;          /* close: the thread exits */
    bool started;       /* thread is running */
    sqlite3 *log_db;    /* the main file, read-only: the thread reads meter_log */
    sqlite3 *arc_db;    /* the archive, written by the thread only */
    sqlite3 *look_db;   /* the archive, read by the writer under the store's mu */
    sqlite3_stmt *look; /* owned: the lookup on look_db */
    sqlite3_stmt *look_begin, *look_commit; /* owned: its read transaction's BEGIN, COMMIT */
    bool look_open;        /* look_db is in a read transaction (until the write one ends) */
    char *path, *arc_path; /* owned: the main file and the archive, for the scanner */
    pthread_t scanner;     /* reads the ids stored at the open into scan */
    bool scanner_started;  /* scanner is running or joinable */
    uint64_t *scan;        /* owned: the scanner's filter, once scan_done; NULL: no id (mu) */
    bool scan_done;        /* scan holds every id stored at the open (under mu) */
};

/* Ends the read transaction on the archive: the next lookup sees its latest commit. Must
 * run before the ids of an archived generation leave memory. */
static void look_end(struct sqlite_store *s)
{
    struct sqlst_archiver *a = s->archiver;

    if (a != NULL && a->look_open) {
        (void)sqlite3_step(a->look_commit);
        (void)sqlite3_reset(a->look_commit);
        a->look_open = false;
    }
}

/* The index key of (UID, ID) in SMALL or a new string (sqlst_key_free): a uid is a UUID, the
 * first '\n' ends it, so distinct pairs get distinct keys. */
static char *meter_key(char small[SQLST_KEY_SMALL], const char *uid, const char *id)
{
    return sqlst_key(small, uid, '\n', id);
}

void sqlst_meter_index_free(struct sqlite_store *s)
{
    look_end(s);
    json_decref(s->meter_ids);
    json_decref(s->meter_sealed);
    s->meter_ids = s->meter_sealed = NULL;
    s->meter_ids_bytes = s->meter_sealed_bytes = 0;
    s->meter_first = s->meter_last = s->meter_seal_upto = 0;
    s->meter_seal_new = false;
}

static void index_add(struct sqlite_store *s, int64_t row, const char *uid, const char *id)
{
    char small[SQLST_KEY_SMALL], *key = meter_key(small, uid, id);

    if (s->meter_seen != NULL) { /* before the id can reach either lookup's tables */
        sqlst_idf_add(s->meter_seen, sqlst_idf_hash(uid, strlen(uid), id, strlen(id)));
    }

    json_object_set_new_nocheck(s->meter_ids, key, json_true());
    s->meter_ids_bytes += strlen(key) + METER_KEY_OVERHEAD;
    sqlst_key_free(key, small);
    if (s->meter_first == 0) {
        s->meter_first = row;
    }
    s->meter_last = row;
}

static int step_upto(struct sqlite_store *s, enum sqlst_stmt_id id, int64_t upto, const char *what,
                     struct err *err)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlst_stmt(&st, s, id, err);

    if (rc != E_OK) {
        return rc;
    }
    sqlite3_bind_int64(st, 1, upto);
    return sqlst_step_done(s, st, what, err);
}

/* Forgets the sealed generation, whose rows are now out of meter_log. */
static void drop_sealed(struct sqlite_store *s)
{
    look_end(s);
    json_decref(s->meter_sealed);
    s->meter_sealed = NULL;
    s->meter_sealed_bytes = 0;
    s->meter_seal_upto = 0;
    s->meter_seal_new = false;
}

static bool archived(struct sqlite_store *s)
{
    struct sqlst_archiver *a = s->archiver;
    bool done;

    if (a == NULL || s->meter_seal_new) {
        return false;
    }
    pthread_mutex_lock(&a->mu);
    done = a->done_seq == s->meter_seal_seq;
    pthread_mutex_unlock(&a->mu);
    return done;
}

/* Takes the sealed generation out of meter_log: the archiver stored it, or it moves into
 * main.meter_requests now, in the caller's transaction. WAIT: wait for an archiver that
 * has it (the current generation is full) instead of moving it here. */
static int finish_sealed(struct sqlite_store *s, bool wait, struct err *err)
{
    struct sqlst_archiver *a = s->archiver;
    int rc;

    if (s->meter_sealed == NULL) {
        return E_OK;
    }
    if (wait && a != NULL && !s->meter_seal_new) {
        pthread_mutex_lock(&a->mu);
        while (a->done_seq != s->meter_seal_seq && a->want_seq == s->meter_seal_seq) {
            pthread_cond_wait(&a->cv, &a->mu);
        }
        pthread_mutex_unlock(&a->mu);
    }
    if (!archived(s)) {
        s->meter_main_archive = true;
        rc = step_upto(s, SQLST_METER_MOVE, s->meter_seal_upto, "archive meter ids", err);
        if (rc != E_OK) {
            return rc;
        }
    }
    rc = step_upto(s, SQLST_METER_DROP, s->meter_seal_upto, "trim meter log", err);
    if (rc == E_OK) {
        drop_sealed(s);
    }
    return rc;
}

static bool half_full(const struct sqlite_store *s)
{
    return json_object_size(s->meter_ids) >= STORE_METER_INDEX_IDS / 2 ||
           s->meter_ids_bytes >= STORE_METER_INDEX_BYTES / 2;
}

/* Seals the current generation once it is half full (an older sealed one goes first). */
static int maybe_seal(struct sqlite_store *s, struct err *err)
{
    int rc;

    if (!half_full(s)) {
        return E_OK;
    }
    rc = finish_sealed(s, true, err);
    if (rc != E_OK) {
        return rc;
    }
    s->meter_sealed = s->meter_ids;
    s->meter_sealed_bytes = s->meter_ids_bytes;
    s->meter_seal_upto = s->meter_last;
    s->meter_seal_seq++;
    s->meter_seal_new = true;
    s->meter_ids = json_object();
    s->meter_ids_bytes = 0;
    s->meter_first = s->meter_last = 0;
    return E_OK;
}

/* Whether s->meter_seen holds every id stored: the scanner's part merged in (once). */
static bool seen_ready(struct sqlite_store *s)
{
    struct sqlst_archiver *a = s->archiver;

    if (s->meter_seen_ready || a == NULL || s->meter_seen == NULL) {
        return s->meter_seen_ready;
    }
    pthread_mutex_lock(&a->mu);
    if (a->scan_done) {
        if (a->scan != NULL) { /* NULL: nothing was stored at the open */
            sqlst_idf_merge(s->meter_seen, a->scan);
        }
        free(a->scan);
        a->scan = NULL;
        s->meter_seen_ready = true;
    }
    pthread_mutex_unlock(&a->mu);
    return s->meter_seen_ready;
}

int sqlst_meter_precommit(struct sqlite_store *s, struct err *err)
{
    (void)seen_ready(s); /* the scan merged in soon, even before the next claim */
    look_end(s);
    if (s->meter_sealed == NULL || !archived(s)) {
        return E_OK;
    }
    return finish_sealed(s, false, err);
}

void sqlst_meter_committed(struct sqlite_store *s)
{
    struct sqlst_archiver *a = s->archiver;

    if (!s->meter_seal_new) {
        return;
    }
    s->meter_seal_new = false;
    if (a == NULL) {
        return;
    }
    pthread_mutex_lock(&a->mu);
    a->want_seq = s->meter_seal_seq;
    a->want_upto = s->meter_seal_upto;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

/* Loads the ids of meter_log. After a restart or a rolled-back transaction the whole log
 * is one generation; more than half full, it moves into main.meter_requests at once. */
static int load_meter_ids(struct sqlite_store *s, struct err *err)
{
    sqlite3_stmt *st = NULL;
    int rc, step;

    if (s->meter_ids != NULL) {
        return E_OK;
    }
    rc = sqlst_stmt(&st, s, SQLST_METER_IDS, err);
    if (rc != E_OK) {
        return rc;
    }
    sqlst_meter_index_free(s);
    s->meter_ids = json_object();
    while ((step = sqlite3_step(st)) == SQLITE_ROW) {
        index_add(s, sqlite3_column_int64(st, 0), (const char *)sqlite3_column_text(st, 1),
                  (const char *)sqlite3_column_text(st, 2));
    }
    sqlite3_reset(st);
    if (step != SQLITE_DONE) {
        sqlst_meter_index_free(s);
        return sqlst_db_err(s, step, "load meter ids", err);
    }
    rc = maybe_seal(s, err);
    return rc == E_OK ? finish_sealed(s, false, err) : rc;
}

static int look_step(bool *out, sqlite3_stmt *st, const char *uid, const char *id, struct err *err)
{
    int step;

    sqlite3_bind_text(st, 1, uid, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, id, -1, SQLITE_STATIC);
    step = sqlite3_step(st);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    *out = step == SQLITE_ROW;
    if (step != SQLITE_ROW && step != SQLITE_DONE) {
        return err_set(err, E_FAIL, "look up meter id: %s", sqlite3_errstr(step));
    }
    return E_OK;
}

/* Whether (UID, ID) is in main.meter_requests (when anything ever moved there) or in the
 * archive. The archive is read in one read transaction per write transaction (one lock of
 * its -shm file instead of one per lookup), ended before an archived generation's ids
 * leave memory, so every id is always in memory or in what the lookup sees. */
static int meter_archived(bool *out, struct sqlite_store *s, const char *uid, const char *id,
                          struct err *err)
{
    struct sqlst_archiver *a = s->archiver;
    sqlite3_stmt *st = NULL;
    int rc = E_OK;

    *out = false;
    s->meter_lookups++;
    if (s->meter_main_archive || a == NULL) {
        rc = sqlst_stmt(&st, s, SQLST_METER_SEEN, err);
        if (rc == E_OK) {
            rc = look_step(out, st, uid, id, err);
        }
    }
    if (rc != E_OK || *out || a == NULL) {
        return rc;
    }
    if (!a->look_open) {
        int step = sqlite3_step(a->look_begin);
        sqlite3_reset(a->look_begin);
        if (step != SQLITE_DONE) {
            return err_set(err, E_FAIL, "read the meter archive: %s", sqlite3_errmsg(a->look_db));
        }
        a->look_open = true;
    }
    return look_step(out, a->look, uid, id, err);
}

/* Whether (UID, ID) is in either generation of the in-memory index. */
static bool in_index(const struct sqlite_store *s, const char *uid, const char *id)
{
    char small[SQLST_KEY_SMALL], *key = meter_key(small, uid, id);
    bool hit = json_object_get(s->meter_ids, key) != NULL ||
               (s->meter_sealed != NULL && json_object_get(s->meter_sealed, key) != NULL);

    sqlst_key_free(key, small);
    return hit;
}

int sqlst_txn_meter_claim(bool *fresh_out, struct task_txn *txb, const char *task_uid,
                          const char *request_id, int64_t tokens, int64_t cost_micros,
                          struct err *err)
{
    struct sqlite_store *s = sqlst_txn_store(txb);
    sqlite3_stmt *st = NULL;
    bool seen = false;
    int rc;

    *fresh_out = false;
    if (task_uid == NULL || request_id == NULL) {
        return err_set(err, E_INVALID, "meter claim without a task uid or request id");
    }
    rc = load_meter_ids(s, err);
    if (rc != E_OK) {
        return rc;
    }
    if (in_index(s, task_uid, request_id)) {
        return E_OK; /* a retry, still in the log */
    }
    if (!seen_ready(s) ||
        sqlst_idf_maybe(s->meter_seen, sqlst_idf_hash(task_uid, strlen(task_uid), request_id,
                                                      strlen(request_id)))) {
        rc = meter_archived(&seen, s, task_uid, request_id, err);
        if (rc != E_OK || seen) {
            return rc; /* archived: a retry */
        }
    }
    rc = sqlst_stmt(&st, s, SQLST_METER_INSERT, err);
    if (rc != E_OK) {
        return rc;
    }
    sqlite3_bind_text(st, 1, task_uid, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, request_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, clock_now_ms(s->base.clock));
    sqlite3_bind_int64(st, 4, tokens);
    sqlite3_bind_int64(st, 5, cost_micros);
    rc = sqlst_step_done(s, st, "record meter request", err);
    if (rc != E_OK) {
        return rc;
    }
    index_add(s, sqlite3_last_insert_rowid(s->db), task_uid, request_id);
    *fresh_out = true;
    return maybe_seal(s, err);
}

/* --- the archiver thread --------------------------------------------------------------- */

static int arc_exec(sqlite3 *db, const char *sql)
{
    return sqlite3_exec(db, sql, NULL, NULL, NULL);
}

/* Copies the meter_log rows up to id UPTO, sorted, into the archive in one transaction. */
static int archive_rows(struct sqlst_archiver *a, int64_t upto)
{
    sqlite3_stmt *rd = NULL, *wr = NULL;
    int rc = sqlite3_prepare_v2(a->log_db,
                                "SELECT task_uid,request_id,charged_ms,tokens,cost_micros "
                                "FROM meter_log WHERE id<=?1 ORDER BY task_uid,request_id",
                                -1, &rd, NULL);

    if (rc == SQLITE_OK) {
        rc = sqlite3_prepare_v2(a->arc_db,
                                "INSERT OR IGNORE INTO meter_requests VALUES(?1,?2,?3,?4,?5)", -1,
                                &wr, NULL);
    }
    if (rc == SQLITE_OK) {
        rc = arc_exec(a->arc_db, "BEGIN IMMEDIATE");
    }
    sqlite3_bind_int64(rd, 1, upto);
    while (rc == SQLITE_OK && (rc = sqlite3_step(rd)) == SQLITE_ROW) {
        for (int i = 0; i < 5; i++) {
            sqlite3_bind_value(wr, i + 1, sqlite3_column_value(rd, i));
        }
        rc = sqlite3_step(wr);
        sqlite3_reset(wr);
        rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
    }
    sqlite3_finalize(rd); /* ends the read transaction on the main file */
    sqlite3_finalize(wr);
    rc = rc == SQLITE_DONE ? arc_exec(a->arc_db, "COMMIT") : rc;
    if (rc != SQLITE_OK) {
        (void)arc_exec(a->arc_db, "ROLLBACK");
    }
    return rc;
}

static void *archiver(void *arg)
{
    struct sqlst_archiver *a = arg;

    prctl(PR_SET_NAME, "meter-archive", 0, 0, 0);
    pthread_mutex_lock(&a->mu);
    while (!a->stop) {
        int64_t seq = a->want_seq, upto = a->want_upto;
        int rc;
        if (seq == a->done_seq) {
            pthread_cond_wait(&a->cv, &a->mu);
            continue;
        }
        pthread_mutex_unlock(&a->mu);
        rc = archive_rows(a, upto);
        pthread_mutex_lock(&a->mu);
        if (rc != SQLITE_OK) {
            /* The writer moves the generation itself when it needs the room. */
            log_kv(LOG_ERROR, "meter_archive_failed", "error", sqlite3_errstr(rc), NULL);
            a->want_seq = a->done_seq;
        } else {
            a->done_seq = seq;
        }
        pthread_cond_broadcast(&a->cv);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

static int open_db(sqlite3 **out, const char *path, int flags, struct err *err);

/* Adds every id of DB's meter_requests to *F, made at the first id (a data dir with none
 * never touches the filter's 4 MiB, nor merges them); false on an error or when asked to
 * stop. */
static bool scan_ids(uint64_t **f, struct sqlst_archiver *a, sqlite3 *db)
{
    sqlite3_stmt *st = NULL;
    int step = SQLITE_ERROR;
    bool stop = false;

    if (sqlite3_prepare_v2(db, "SELECT task_uid, request_id FROM meter_requests", -1, &st, NULL) !=
        SQLITE_OK) {
        return false;
    }
    for (uint64_t n = 1; !stop && (step = sqlite3_step(st)) == SQLITE_ROW; n++) {
        if (*f == NULL) {
            *f = sqlst_idf_new();
        }
        sqlst_idf_add(*f, sqlst_idf_hash((const char *)sqlite3_column_text(st, 0),
                                         (size_t)sqlite3_column_bytes(st, 0),
                                         (const char *)sqlite3_column_text(st, 1),
                                         (size_t)sqlite3_column_bytes(st, 1)));
        if (n % 4096 == 0) {
            pthread_mutex_lock(&a->mu);
            stop = a->stop;
            pthread_mutex_unlock(&a->mu);
        }
    }
    sqlite3_finalize(st);
    return !stop && step == SQLITE_DONE;
}

/* The scanner thread: the ids stored at the open (main.meter_requests, the archive) into a
 * filter of its own, on read-only connections of its own, handed to the writer. */
static void *scanner(void *arg)
{
    struct sqlst_archiver *a = arg;
    uint64_t *f = NULL;
    sqlite3 *main_db = NULL, *arc_db = NULL;
    bool ok;

    prctl(PR_SET_NAME, "meter-idscan", 0, 0, 0);
    ok = open_db(&main_db, a->path, SQLITE_OPEN_READONLY, NULL) == E_OK &&
         open_db(&arc_db, a->arc_path, SQLITE_OPEN_READONLY, NULL) == E_OK &&
         scan_ids(&f, a, main_db) && scan_ids(&f, a, arc_db);
    sqlite3_close(main_db);
    sqlite3_close(arc_db);
    pthread_mutex_lock(&a->mu);
    if (ok) {
        a->scan = f;
        a->scan_done = true;
        f = NULL;
    } else if (!a->stop) {
        /* Every fresh id is then looked up, as without the filter. */
        log_kv(LOG_ERROR, "meter_id_scan_failed", NULL);
    }
    pthread_mutex_unlock(&a->mu);
    free(f);
    return NULL;
}

static int open_db(sqlite3 **out, const char *path, int flags, struct err *err)
{
    int rc = sqlite3_open_v2(path, out, flags | SQLITE_OPEN_NOMUTEX, NULL);

    if (rc != SQLITE_OK) {
        return err_set(err, E_FAIL, "open %s: %s", path,
                       *out != NULL ? sqlite3_errmsg(*out) : sqlite3_errstr(rc));
    }
    sqlite3_busy_timeout(*out, 5000);
    return E_OK;
}

static int archiver_dbs(struct sqlst_archiver *a, const char *path, const char *arc,
                        struct err *err)
{
    int rc = open_db(&a->arc_db, arc, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, err);

    if (rc == E_OK &&
        arc_exec(a->arc_db,
                 "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
                 "CREATE TABLE IF NOT EXISTS meter_requests (task_uid TEXT NOT NULL,"
                 " request_id TEXT NOT NULL, charged_ms INTEGER NOT NULL,"
                 " tokens INTEGER NOT NULL, cost_micros INTEGER NOT NULL,"
                 " PRIMARY KEY (task_uid, request_id)) STRICT, WITHOUT ROWID;") != SQLITE_OK) {
        rc = err_set(err, E_FAIL, "set up %s: %s", arc, sqlite3_errmsg(a->arc_db));
    }
    if (rc == E_OK) {
        rc = open_db(&a->log_db, path, SQLITE_OPEN_READONLY, err);
    }
    if (rc == E_OK) {
        rc = open_db(&a->look_db, arc, SQLITE_OPEN_READONLY, err);
    }
    if (rc == E_OK && sqlite3_prepare_v2(a->look_db,
                                         "SELECT 1 FROM meter_requests "
                                         "WHERE task_uid=?1 AND request_id=?2",
                                         -1, &a->look, NULL) != SQLITE_OK) {
        rc = err_set(err, E_FAIL, "prepare archive lookup: %s", sqlite3_errmsg(a->look_db));
    }
    if (rc == E_OK &&
        (sqlite3_prepare_v2(a->look_db, "BEGIN", -1, &a->look_begin, NULL) != SQLITE_OK ||
         sqlite3_prepare_v2(a->look_db, "COMMIT", -1, &a->look_commit, NULL) != SQLITE_OK)) {
        rc = err_set(err, E_FAIL, "prepare archive reads: %s", sqlite3_errmsg(a->look_db));
    }
    return rc;
}

/* Whether main.meter_requests holds any id (moved there before the archive existed, or by
 * the writer itself); when in doubt, yes. */
static bool main_archive_used(struct sqlite_store *s)
{
    sqlite3_stmt *st = NULL;
    bool used = true;

    if (sqlst_prepare(&st, s, "SELECT EXISTS (SELECT 1 FROM meter_requests)", NULL) == E_OK &&
        sqlite3_step(st) == SQLITE_ROW) {
        used = sqlite3_column_int(st, 0) != 0;
    }
    sqlite3_finalize(st);
    return used;
}

int sqlst_meter_archiver_open(struct sqlite_store *s, const char *path, struct err *err)
{
    struct sqlst_archiver *a;
    char *arc;
    int rc;

    if (sqlst_readers_shared(s)) {
        return E_OK; /* one connection only: sealed generations move in the writer's txn */
    }
    s->meter_main_archive = main_archive_used(s);
    a = xcalloc(1, sizeof(*a));
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    s->archiver = a;
    arc = xasprintf("%s-meter", path);
    rc = archiver_dbs(a, path, arc, err);
    free(arc);
    if (rc != E_OK) {
        return rc;
    }
    if (pthread_create(&a->thread, NULL, archiver, a) != 0) {
        return err_set(err, E_FAIL, "start the meter archiver");
    }
    a->started = true;
    /* After archiver_dbs: the archive file and its table exist for the scanner. */
    s->meter_seen = sqlst_idf_new();
    a->path = xstrdup(path);
    a->arc_path = xasprintf("%s-meter", path);
    a->scanner_started = pthread_create(&a->scanner, NULL, scanner, a) == 0;
    return E_OK;
}

void sqlst_meter_archiver_close(struct sqlite_store *s)
{
    struct sqlst_archiver *a = s->archiver;

    if (a == NULL) {
        return;
    }
    if (a->started) {
        pthread_mutex_lock(&a->mu);
        a->stop = true;
        pthread_cond_broadcast(&a->cv);
        pthread_mutex_unlock(&a->mu);
        pthread_join(a->thread, NULL);
    }
    if (a->scanner_started) { /* a->stop is set: it ends within 4,096 rows */
        pthread_join(a->scanner, NULL);
    }
    free(a->scan);
    free(a->path);
    free(a->arc_path);
    free(s->meter_seen);
    s->meter_seen = NULL;
    s->meter_seen_ready = false;
    sqlite3_finalize(a->look);
    sqlite3_finalize(a->look_begin);
    sqlite3_finalize(a->look_commit);
    sqlite3_close(a->look_db);
    sqlite3_close(a->log_db);
    sqlite3_close(a->arc_db);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    free(a);
    s->archiver = NULL;
}
