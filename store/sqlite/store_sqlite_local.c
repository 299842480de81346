/* SPDX-License-Identifier: Apache-2.0 */
/* Sticky-comment state (one row per task and PR/MR) and the threads of the offline
 * `local` SCM provider, kept in the same database as everything else. */
#include <stdlib.h>
#include <string.h>

#include "store/sqlite/store_sqlite_int.h"

void sticky_state_cleanup(struct sticky_state *s)
{
    free(s->comment_id);
    memset(s, 0, sizeof(*s));
}

int sqlst_sticky_get(struct sticky_state *out, struct task_store *st, const char *key,
                     struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    sqlite3_stmt *q = NULL;
    int rc, step;

    memset(out, 0, sizeof(*out));
    pthread_mutex_lock(&s->mu);
    rc = sqlst_prepare(
        &q, s, "SELECT comment_id, body_hash, phase, last_sent_ms FROM sticky WHERE key=?1", err);
    if (rc == E_OK) {
        sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
        step = sqlite3_step(q);
        if (step == SQLITE_ROW) {
            out->comment_id = sqlst_col_dup(q, 0);
            snprintf(out->body_hash, sizeof(out->body_hash), "%s",
                     sqlite3_column_text(q, 1) != NULL ? (const char *)sqlite3_column_text(q, 1)
                                                       : "");
            snprintf(out->phase, sizeof(out->phase), "%s",
                     sqlite3_column_text(q, 2) != NULL ? (const char *)sqlite3_column_text(q, 2)
                                                       : "");
            out->last_sent_ms = sqlite3_column_int64(q, 3);
        } else if (step == SQLITE_DONE) {
            rc = E_NOTFOUND;
        } else {
            rc = sqlst_db_err(s, step, "sticky get", err);
        }
        sqlite3_finalize(q);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int sqlst_txn_sticky_note(struct task_txn *tx, const char *key, const char *provider,
                          const char *project, int64_t number, const char *ns, const char *name,
                          const char *hash, const char *phase, struct err *err)
{
    struct sqlite_store *s = sqlst_txn_store(tx);
    sqlite3_stmt *q = NULL;
    int rc = sqlst_prepare(
        &q, s,
        "INSERT INTO sticky(key,provider,project,number,namespace,name,body_hash,phase) "
        "VALUES(?1,?2,?3,?4,?5,?6,?7,?8) ON CONFLICT(key) DO UPDATE SET "
        "body_hash=excluded.body_hash, phase=excluded.phase",
        err);

    if (rc != E_OK) {
        return rc;
    }
    sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, provider, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 3, project, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 4, number);
    sqlite3_bind_text(q, 5, ns, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 6, name, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 7, hash, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 8, phase, -1, SQLITE_STATIC);
    rc = sqlst_step_done(s, q, "sticky note", err);
    sqlite3_finalize(q);
    return rc;
}

/* Runs SQL binding KEY as ?1 and the optional text A as ?2 and the int B as ?3, under mu. */
static int exec_key(struct task_store *st, const char *sql, const char *key, const char *a,
                    int64_t b, struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    sqlite3_stmt *q = NULL;
    int rc;

    pthread_mutex_lock(&s->mu);
    rc = sqlst_prepare(&q, s, sql, err);
    if (rc == E_OK) {
        sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
        if (a != NULL) {
            sqlite3_bind_text(q, 2, a, -1, SQLITE_STATIC);
        }
        sqlite3_bind_int64(q, 3, b);
        rc = sqlst_step_done(s, q, "sticky update", err);
        sqlite3_finalize(q);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int sqlst_sticky_sent(struct task_store *st, const char *key, const char *comment_id,
                      struct err *err)
{
    return exec_key(st,
                    "UPDATE sticky SET comment_id=coalesce(?2, comment_id), last_sent_ms=?3 "
                    "WHERE key=?1",
                    key, comment_id, clock_now_ms(st->clock), err);
}

int sqlst_sticky_list(json_t **out, struct task_store *st, const char *provider,
                      const char *project, int64_t number, struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    sqlite3_stmt *q = NULL;
    int rc;

    *out = json_object();
    pthread_mutex_lock(&s->mu);
    rc = sqlst_prepare(
        &q, s,
        "SELECT namespace || '/' || name, comment_id FROM sticky WHERE provider=?1 AND "
        "project=?2 AND number=?3 AND comment_id IS NOT NULL",
        err);
    if (rc == E_OK) {
        sqlite3_bind_text(q, 1, provider, -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 2, project, -1, SQLITE_STATIC);
        sqlite3_bind_int64(q, 3, number);
        while (sqlite3_step(q) == SQLITE_ROW) {
            json_object_set_new(*out, (const char *)sqlite3_column_text(q, 0),
                                json_string((const char *)sqlite3_column_text(q, 1)));
        }
        sqlite3_finalize(q);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* --- local threads ------------------------------------------------------------------ */

int sqlst_local_add(int64_t *id_out, struct task_store *st, const char *project, int64_t number,
                    const char *author, const char *body, struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    sqlite3_stmt *q = NULL;
    int64_t now = clock_now_ms(st->clock);
    int rc;

    *id_out = 0;
    pthread_mutex_lock(&s->mu);
    rc = sqlst_prepare(
        &q, s,
        "INSERT INTO local_comments(project,number,author,body,created_ms,updated_ms) "
        "VALUES(?1,?2,?3,?4,?5,?5)",
        err);
    if (rc == E_OK) {
        sqlite3_bind_text(q, 1, project, -1, SQLITE_STATIC);
        sqlite3_bind_int64(q, 2, number);
        sqlite3_bind_text(q, 3, author, -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 4, body, -1, SQLITE_STATIC);
        sqlite3_bind_int64(q, 5, now);
        rc = sqlst_step_done(s, q, "local comment", err);
        sqlite3_finalize(q);
        *id_out = sqlite3_last_insert_rowid(s->db);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* The thread of PROJECT holding a comment that contains MARKER: *number_out, or 0. */
static int local_find(int64_t *number_out, struct sqlite_store *s, const char *project,
                      const char *marker, struct err *err)
{
    sqlite3_stmt *q = NULL;
    int rc = sqlst_prepare(&q, s,
                           "SELECT number FROM local_comments WHERE project=?1 AND"
                           " instr(body, ?2) > 0 ORDER BY id LIMIT 1",
                           err),
        step;

    *number_out = 0;
    if (rc != E_OK) {
        return rc;
    }
    sqlite3_bind_text(q, 1, project, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, marker, -1, SQLITE_STATIC);
    step = sqlite3_step(q);
    if (step == SQLITE_ROW) {
        *number_out = sqlite3_column_int64(q, 0);
    } else if (step != SQLITE_DONE) {
        rc = sqlst_db_err(s, step, "find local pull request", err);
    }
    sqlite3_finalize(q);
    return rc;
}

int sqlst_local_open_pull(int64_t *number_out, bool *existed_out, struct task_store *st,
                          const char *project, const char *marker, const char *author,
                          const char *body, struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    sqlite3_stmt *q = NULL;
    int rc;

    *existed_out = false;
    pthread_mutex_lock(&s->mu);
    rc = local_find(number_out, s, project, marker, err);
    if (rc == E_OK && *number_out > 0) {
        *existed_out = true;
        goto out;
    }
    if (rc == E_OK) {
        /* The next free thread number of the project (under mu: no other writer). */
        rc = sqlst_prepare(
            &q, s,
            "INSERT INTO local_comments(project,number,author,body,created_ms,updated_ms)"
            " SELECT ?1, COALESCE(MAX(number),0)+1, ?2, ?3, ?4, ?4 FROM local_comments"
            " WHERE project=?1",
            err);
    }
    if (rc == E_OK) {
        sqlite3_bind_text(q, 1, project, -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 2, author, -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 3, body, -1, SQLITE_STATIC);
        sqlite3_bind_int64(q, 4, clock_now_ms(st->clock));
        rc = sqlst_step_done(s, q, "local pull request", err);
        sqlite3_finalize(q);
    }
    if (rc == E_OK) {
        rc = local_find(number_out, s, project, marker, err);
    }
out:
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* Runs SQL with ?1 project, ?2 id, ?3 text, ?4 now; E_NOTFOUND when no row changed. */
static int local_change(struct task_store *st, const char *sql, const char *project, int64_t id,
                        const char *text, struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    sqlite3_stmt *q = NULL;
    int rc;

    pthread_mutex_lock(&s->mu);
    rc = sqlst_prepare(&q, s, sql, err);
    if (rc == E_OK) {
        sqlite3_bind_text(q, 1, project, -1, SQLITE_STATIC);
        sqlite3_bind_int64(q, 2, id);
        if (text != NULL) {
            sqlite3_bind_text(q, 3, text, -1, SQLITE_STATIC);
        }
        sqlite3_bind_int64(q, 4, clock_now_ms(st->clock));
        rc = sqlst_step_done(s, q, "local comment change", err);
        sqlite3_finalize(q);
        if (rc == E_OK && sqlite3_changes(s->db) == 0) {
            rc = err_set(err, E_NOTFOUND, "comment %lld not found", (long long)id);
        }
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int sqlst_local_update(struct task_store *st, const char *project, int64_t id, const char *body,
                       struct err *err)
{
    return local_change(
        st, "UPDATE local_comments SET body=?3, updated_ms=?4 WHERE project=?1 AND id=?2", project,
        id, body, err);
}

int sqlst_local_delete(struct task_store *st, const char *project, int64_t id, struct err *err)
{
    return local_change(st, "DELETE FROM local_comments WHERE project=?1 AND id=?2 AND ?4=?4",
                        project, id, NULL, err);
}

int sqlst_local_react(struct task_store *st, const char *project, int64_t id, const char *author,
                      const char *content, struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    sqlite3_stmt *q = NULL;
    int rc;

    pthread_mutex_lock(&s->mu);
    rc = sqlst_prepare(
        &q, s,
        "INSERT OR IGNORE INTO local_reactions(comment_id,author,content) SELECT id, ?3, ?4 "
        "FROM local_comments WHERE project=?1 AND id=?2",
        err);
    if (rc == E_OK) {
        sqlite3_bind_text(q, 1, project, -1, SQLITE_STATIC);
        sqlite3_bind_int64(q, 2, id);
        sqlite3_bind_text(q, 3, author, -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 4, content, -1, SQLITE_STATIC);
        rc = sqlst_step_done(s, q, "local reaction", err);
        sqlite3_finalize(q);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int sqlst_local_thread(json_t **out, struct task_store *st, const char *project, int64_t number,
                       struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    sqlite3_stmt *q = NULL;
    int rc;

    *out = json_array();
    pthread_mutex_lock(&s->mu);
    rc = sqlst_prepare(
        &q, s,
        "SELECT c.id, c.author, c.body, c.created_ms, c.updated_ms, "
        "(SELECT json_group_array(content) FROM local_reactions r WHERE r.comment_id=c.id) "
        "FROM local_comments c WHERE c.project=?1 AND c.number=?2 ORDER BY c.id",
        err);
    if (rc == E_OK) {
        sqlite3_bind_text(q, 1, project, -1, SQLITE_STATIC);
        sqlite3_bind_int64(q, 2, number);
        while (sqlite3_step(q) == SQLITE_ROW) {
            char created[CLOCK_RFC3339_MAX], updated[CLOCK_RFC3339_MAX];
            json_t *reactions = sqlst_column_json(q, 5);
            clock_rfc3339(created, sqlite3_column_int64(q, 3));
            clock_rfc3339(updated, sqlite3_column_int64(q, 4));
            json_array_append_new(*out,
                                  json_pack("{s:I, s:s, s:s, s:s, s:s, s:o}", "id",
                                            (json_int_t)sqlite3_column_int64(q, 0), "author",
                                            (const char *)sqlite3_column_text(q, 1), "body",
                                            (const char *)sqlite3_column_text(q, 2), "createdAt",
                                            created, "updatedAt", updated, "reactions",
                                            reactions != NULL ? reactions : json_array()));
        }
        sqlite3_finalize(q);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int sqlst_local_permission_set(struct task_store *st, const char *project, const char *user,
                               int level, struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    sqlite3_stmt *q = NULL;
    int rc;

    pthread_mutex_lock(&s->mu);
    rc = sqlst_prepare(&q, s,
                       "INSERT INTO local_permissions(project,user,level) VALUES(?1,?2,?3) "
                       "ON CONFLICT(project,user) DO UPDATE SET level=excluded.level",
                       err);
    if (rc == E_OK) {
        sqlite3_bind_text(q, 1, project, -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 2, user, -1, SQLITE_STATIC);
        sqlite3_bind_int(q, 3, level);
        rc = sqlst_step_done(s, q, "local permission", err);
        sqlite3_finalize(q);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int sqlst_local_permission_get(int *level_out, struct task_store *st, const char *project,
                               const char *user, struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    sqlite3_stmt *q = NULL;
    int rc;

    *level_out = 0;
    pthread_mutex_lock(&s->mu);
    rc = sqlst_prepare(&q, s, "SELECT level FROM local_permissions WHERE project=?1 AND user=?2",
                       err);
    if (rc == E_OK) {
        sqlite3_bind_text(q, 1, project, -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 2, user, -1, SQLITE_STATIC);
        if (sqlite3_step(q) == SQLITE_ROW) {
            *level_out = sqlite3_column_int(q, 0);
        }
        sqlite3_finalize(q);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* --- local pull requests bound to a repository (`diverge local pr open`) -------------- */

/* Created on first use (a no-op once it exists) rather than by a schema migration: a
 * database that never saw `diverge local pr open` stays as it was. Called with mu held. */
static int ensure_pulls_table(struct sqlite_store *s, struct err *err)
{
    return sqlst_exec(s,
                      "CREATE TABLE IF NOT EXISTS local_pulls (project TEXT NOT NULL,"
                      " number INTEGER NOT NULL, url TEXT NOT NULL, head TEXT NOT NULL,"
                      " base TEXT NOT NULL, created_ms INTEGER NOT NULL,"
                      " updated_ms INTEGER NOT NULL, PRIMARY KEY (project, number)) STRICT",
                      err);
}

int sqlst_local_pull_set(bool *created_out, struct task_store *st, const char *project,
                         int64_t number, const char *url, const char *head, const char *base,
                         struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    sqlite3_stmt *q = NULL;
    int64_t now = clock_now_ms(st->clock);
    int rc;

    *created_out = false;
    pthread_mutex_lock(&s->mu);
    rc = ensure_pulls_table(s, err);
    if (rc == E_OK) {
        rc = sqlst_prepare(&q, s,
                           "INSERT INTO local_pulls(project,number,url,head,base,created_ms,"
                           "updated_ms) VALUES(?1,?2,?3,?4,?5,?6,?6) ON CONFLICT(project,number) "
                           "DO UPDATE SET url=excluded.url, head=excluded.head, "
                           "base=excluded.base, updated_ms=excluded.updated_ms "
                           "WHERE url IS NOT excluded.url OR head IS NOT excluded.head OR "
                           "base IS NOT excluded.base RETURNING created_ms=updated_ms",
                           err);
    }
    if (rc == E_OK) {
        sqlite3_bind_text(q, 1, project, -1, SQLITE_STATIC);
        sqlite3_bind_int64(q, 2, number);
        sqlite3_bind_text(q, 3, url, -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 4, head, -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 5, base, -1, SQLITE_STATIC);
        sqlite3_bind_int64(q, 6, now);
        int step = sqlite3_step(q);
        if (step == SQLITE_ROW) {
            *created_out = sqlite3_column_int(q, 0) != 0;
            step = sqlite3_step(q);
        }
        if (step != SQLITE_DONE) {
            rc = sqlst_db_err(s, step, "local pull", err);
        }
        sqlite3_finalize(q);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int sqlst_local_pull_get(json_t **out, struct task_store *st, const char *project, int64_t number,
                         struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    sqlite3_stmt *q = NULL;
    int rc;

    *out = NULL;
    pthread_mutex_lock(&s->mu);
    rc = ensure_pulls_table(s, err);
    if (rc == E_OK) {
        rc = sqlst_prepare(&q, s,
                           "SELECT url, head, base, created_ms FROM local_pulls "
                           "WHERE project=?1 AND number=?2",
                           err);
    }
    if (rc == E_OK) {
        sqlite3_bind_text(q, 1, project, -1, SQLITE_STATIC);
        sqlite3_bind_int64(q, 2, number);
        int step = sqlite3_step(q);
        if (step == SQLITE_ROW) {
            char created[CLOCK_RFC3339_MAX];
            clock_rfc3339(created, sqlite3_column_int64(q, 3));
            *out =
                json_pack("{s:s, s:I, s:s, s:s, s:s, s:s}", "project", project, "number",
                          (json_int_t)number, "repository", (const char *)sqlite3_column_text(q, 0),
                          "head", (const char *)sqlite3_column_text(q, 1), "base",
                          (const char *)sqlite3_column_text(q, 2), "createdAt", created);
        } else if (step == SQLITE_DONE) {
            rc = err_set(err, E_NOTFOUND, "%s#%lld was not opened (diverge local pr open)", project,
                         (long long)number);
        } else {
            rc = sqlst_db_err(s, step, "local pull", err);
        }
        sqlite3_finalize(q);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}
