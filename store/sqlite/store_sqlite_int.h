/* SPDX-License-Identifier: Apache-2.0 */
/* The SQLite backend of task_store, shared inside store/sqlite/ only. */
#ifndef DIVERGE_STORE_SQLITE_STORE_SQLITE_INT_H
#define DIVERGE_STORE_SQLITE_STORE_SQLITE_INT_H

#include <jansson.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/gcommit.h"
#include "store/store.h"
#include "store/sqlite/store_sqlite_mem.h"
#include "store/store_backend.h"

/* Events the change feed keeps (and STORE_EVENT_RING_BYTES of their JSON at most): a few
 * seconds of a stream of creates, so that a feed held up by a start does not fall behind it
 * and resync every task. */
#define EVENT_RING 16384

struct inbox_waiter;
struct sqlst_readers;  /* store_sqlite_read.c */
struct sqlst_archiver; /* store_sqlite_meter.c */

/* How many statements sqlst_prepare_cached keeps (the queues use about a dozen texts). */
#define SQLST_BY_TEXT_MAX 32

/* Cached prepared statements of the hot paths. */
enum sqlst_stmt_id {
    SQLST_INSERT_TASK,
    SQLST_UPDATE_TASK,
    SQLST_UPDATE_TASK_SAME_UID,
    SQLST_BUMP_RV,
    SQLST_GET_TASK,
    SQLST_METER_IDS,
    SQLST_METER_INSERT,
    SQLST_METER_SEEN,
    SQLST_METER_MOVE,
    SQLST_METER_DROP,
    SQLST_TOKEN_CURRENT,
    SQLST_TOKEN_INSERT,
    SQLST_TOKEN_REVOKE,
    SQLST_SAVEPOINT,
    SQLST_RELEASE,
    SQLST_ROLLBACK_TO,
    SQLST_INBOX_INSERT,
    SQLST_BEGIN_IMMEDIATE,
    SQLST_COMMIT,
    SQLST_QUOTA_LIST_NS,
    SQLST_RESV_PUT,
    SQLST_RESV_DROP,
    SQLST_COUNT,
};

struct sqlite_store {
    struct task_store base; /* must be first */
    sqlite3 *db;
    pthread_mutex_t mu;      /* one writer/reader at a time on db */
    pthread_mutex_t ring_mu; /* the ring, ring_rv and wake_gen: taken inside mu by a publish,
                                alone by a watcher, which so never waits for a writer's commit */
    pthread_cond_t changed;  /* (with ring_mu) broadcast on every new event and on wake */
    int64_t rv;              /* latest resourceVersion (under mu) */
    int64_t ring_rv;         /* the resourceVersion of the newest event published */
    int64_t wake_gen;        /* bumped by wake() so waiters return */
    uint64_t token_epoch;    /* bumped by every write to the tokens table (under mu) */
    struct event ring[EVENT_RING];
    size_t ring_bytes;                /* JSON bytes held by ring, <= STORE_EVENT_RING_BYTES but for
                                         the newest event alone */
    int64_t ring_oldest;              /* no event older than this rv is in ring */
    sqlite3_stmt *stmts[SQLST_COUNT]; /* owned; prepared on first use */
    struct sqlst_by_text {            /* statements of the queues, cached by their SQL */
        char *sql;                    /* owned */
        sqlite3_stmt *st;             /* owned */
    } by_text[SQLST_BY_TEXT_MAX];
    size_t nby_text;
    json_t *cache;                   /* "ns/name" -> parsed task, for task_txn_get */
    json_t *meter_ids;               /* "<task uid>\n<request id>" -> true: the ids of
                                        meter_log's current generation, the rows after
                                        meter_seal_upto (store_sqlite_txn.c); NULL = unloaded */
    size_t meter_ids_bytes;          /* estimated memory of meter_ids */
    json_t *meter_sealed;            /* the same for the sealed generation, the rows up to
                                        meter_seal_upto, moving into meter_requests; or NULL */
    size_t meter_sealed_bytes;       /* estimated memory of meter_sealed */
    int64_t meter_first, meter_last; /* meter_log ids of the current generation (0: empty) */
    int64_t meter_seal_upto;         /* the last meter_log id of the sealed generation */
    int64_t meter_seal_seq;          /* generations sealed so far (the archiver's job id) */
    bool meter_seal_new;             /* sealed in the open transaction: hand it to the
                                        archiver once the transaction commits */
    bool meter_main_archive;         /* main.meter_requests may hold ids (else no lookup) */
    uint64_t *meter_seen;            /* owned: Bloom filter (store_sqlite_idf.h) of every id
                                        of meter_log, main.meter_requests and the archive
                                        once meter_seen_ready; NULL without an archiver */
    bool meter_seen_ready;           /* the archiver's scan of what was stored at open is
                                        merged in: a "never" skips the lookups */
    uint64_t meter_lookups;          /* lookups in main.meter_requests or the archive */
    struct sqlst_archiver *archiver; /* owned: moves sealed generations into the archive
                                        file off the commit path; NULL for ":memory:" */
    pthread_cond_t inbox_cv;         /* an inbox entry was added, or wake() */
    pthread_cond_t outbox_cv;        /* an outbox entry was added, or wake() */
    int64_t inbox_gen;               /* bumped on every inbox add (and wake) */
    int64_t outbox_gen;              /* bumped on every outbox add (and wake) */
    int64_t outbox_inflight;         /* the entry being sent (never coalesced into), or 0 */
    struct gcommit *inbox_committer; /* owned: the group commit of inbox adds
                                        (store_sqlite_inbox.c) */
    struct sqlst_readers *readers;   /* owned: the read-only connections (GET, list) */
    struct sqlst_mem *mem;           /* owned: the tasks' texts GET and list are answered
                                        from (store_sqlite_mem.c) */
};

/* Binds V to parameter IDX of Q (a copy), or NULL when V is NULL (store_sqlite_queue.c). */
void sqlst_bind_opt(sqlite3_stmt *q, int idx, const char *v);

/* The cached statement ID, reset and unbound. Caller holds mu. */
int sqlst_stmt(sqlite3_stmt **out, struct sqlite_store *s, enum sqlst_stmt_id id, struct err *err);
/* Steps a statement that returns no rows and resets it; E_CONFLICT on a constraint. */
int sqlst_step_done(struct sqlite_store *s, sqlite3_stmt *st, const char *what, struct err *err);
/* Forgets the cached parse of one task (after any write outside task_txn_put). */
void sqlst_cache_forget(struct sqlite_store *s, const char *ns, const char *name);

/* Starts the inbox committer (store_sqlite_inbox.c); sqlst_close stops it. */
int sqlst_inbox_committer_start(struct sqlite_store *s, struct err *err);

/* The database handle of a transaction (store_sqlite_queue.c works inside store_sqlite_txn.c's). */
struct sqlite_store *sqlst_txn_store(struct task_txn *tx);

/* The txn op of the SQLite backend (store_sqlite_txn.c). */
int sqlst_txn(struct task_store *st, task_txn_fn fn, void *userdata, struct err *err);
/* The backend behind ST (every task_store of this module is an sqlite_store). */
static inline struct sqlite_store *sqlst_of(struct task_store *st)
{
    return container_of(st, struct sqlite_store, base);
}

/* Room for the usual key of sqlst_key on the stack. */
#define SQLST_KEY_SMALL 320

/* A, SEP, B as one string (NULL written "(null)"), in SMALL when it fits, else a new one:
 * the keys of the task cache and the meter's id index, built per call without printf.
 * Give it back with sqlst_key_free. */
static inline char *sqlst_key(char small[SQLST_KEY_SMALL], const char *a, char sep, const char *b)
{
    size_t na, nb;
    char *k;

    a = a != NULL ? a : "(null)";
    b = b != NULL ? b : "(null)";
    na = strlen(a);
    nb = strlen(b);
    k = na + nb + 2 <= SQLST_KEY_SMALL ? small : xmalloc(na + nb + 2);
    memcpy(k, a, na);
    k[na] = sep;
    memcpy(k + na + 1, b, nb);
    k[na + 1 + nb] = '\0';
    return k;
}

static inline void sqlst_key_free(char *k, const char *small)
{
    if (k != small) {
        free(k);
    }
}

/* A copy of text column COL (caller frees), or NULL for SQL NULL. */
char *sqlst_col_dup(sqlite3_stmt *q, int col);

/* Maps an SQLite result code to ours with a message naming WHAT. */
int sqlst_db_err(struct sqlite_store *s, int rc, const char *what, struct err *err);
/* Runs SQL (no results). */
int sqlst_exec(struct sqlite_store *s, const char *sql, struct err *err);
int sqlst_prepare(sqlite3_stmt **out, struct sqlite_store *s, const char *sql, struct err *err);
/* As sqlst_prepare, from a cache keyed by the SQL text (no parse on the queues' hot paths:
 * the bot's batch runs them under the writer lock). Caller holds mu, gives the statement
 * back with sqlst_unprepare (not sqlite3_finalize) and runs no other use of it meanwhile. */
int sqlst_prepare_cached(sqlite3_stmt **out, struct sqlite_store *s, const char *sql,
                         struct err *err);
/* Resets a statement of sqlst_prepare_cached (finalizes one the full cache could not keep). */
void sqlst_unprepare(struct sqlite_store *s, sqlite3_stmt *st);
/* Finalizes every statement of sqlst_prepare_cached (on close). */
void sqlst_by_text_free(struct sqlite_store *s);
/* Parses column COL as JSON; NULL when absent or corrupt. */
json_t *sqlst_column_json(sqlite3_stmt *st, int col);
/* Reads one object of TABLE; E_NOTFOUND when absent. Caller holds mu. */
int sqlst_read_obj(json_t **out, struct sqlite_store *s, const char *table, const char *ns,
                   const char *name, struct err *err);
/* Stores OBJ (its metadata's namespace and name) in TABLE, a side table of namespaced
 * objects (environments, spend_quotas) with its own resourceVersion counter: uid and
 * creationTimestamp kept from the stored one, else made; KIND names it in errors. */
int sqlst_obj_put(struct sqlite_store *s, const char *table, const char *kind, json_t *obj,
                  struct err *err);
/* Deletes NS/NAME from TABLE (nothing to delete is not an error). */
int sqlst_obj_delete(struct sqlite_store *s, const char *table, const char *kind, const char *ns,
                     const char *name, struct err *err);
/* Sets metadata.resourceVersion. */
void sqlst_set_rv(json_t *obj, int64_t rv);
/* Moves EV (and its JSON) into the ring, evicting the oldest events past EVENT_RING or
 * STORE_EVENT_RING_BYTES, and wakes watchers. Caller holds mu. (store_sqlite_txn.c) */
void sqlst_publish(struct sqlite_store *s, struct event *ev);
/* Writes OBJ (carrying rv s->rv + 1): inside the caller's sqlst_txn when IN_TXN (which
 * writes the counter row once, before its COMMIT: sqlst_bump_rv), else in a transaction of
 * its own that bumps the counter row too. Increments s->rv on success. *json_out (may be
 * NULL) gets the JSON text written, which the caller frees. */
/* Stores RV as the resourceVersion counter row, in the caller's transaction. */
int sqlst_bump_rv(struct sqlite_store *s, int64_t rv, struct err *err);
int sqlst_write_obj(struct sqlite_store *s, const json_t *obj, bool is_new, bool in_txn,
                    char **json_out, struct err *err);

/* Forgets the meter's request-id index; the next claim reloads it from meter_log
 * (store_sqlite_txn.c). Caller holds mu. */
void sqlst_meter_index_free(struct sqlite_store *s);
/* Just before the COMMIT of a write transaction: drops the sealed generation from meter_log
 * and from memory once the archiver has stored it durably (store_sqlite_meter.c). */
int sqlst_meter_precommit(struct sqlite_store *s, struct err *err);
/* Just after that COMMIT: hands a generation sealed in it to the archiver. */
void sqlst_meter_committed(struct sqlite_store *s);
/* Starts the archiver for the database at PATH (a file in WAL mode; else none). */
int sqlst_meter_archiver_open(struct sqlite_store *s, const char *path, struct err *err);
/* Stops and frees it (before the writer's connection closes). */
void sqlst_meter_archiver_close(struct sqlite_store *s);

/* Deletes the Environments of NS whose owner is the task with uid OWNER_UID (inside the
 * caller's transaction; store_sqlite_env.c). */
int sqlst_env_delete_owned(struct sqlite_store *s, const char *ns, const char *owner_uid,
                           struct err *err);

/* The SQLite implementations of struct task_store_xops (store_sqlite.c holds the table). */

/* The backend's implementation of every operation of struct task_store_xops. */
#define SQLST_XOP_DECLARE(RET, NAME, PARAMS) RET sqlst_##NAME PARAMS;
STORE_XOPS_SHARED(SQLST_XOP_DECLARE)
STORE_XOPS_LOCAL(SQLST_XOP_DECLARE)
STORE_XOPS_OPTIONAL(SQLST_XOP_DECLARE)

#endif
