/* SPDX-License-Identifier: Apache-2.0 */
/* The stored tasks in memory: a copy of every task's text as last committed, sorted by
 * namespace and name, from which GET and list are answered without SQLite (as the
 * Kubernetes API server answers them from its watch cache). A list of thousands of tasks
 * read from SQLite re-reads every page a commit made stale and seeks a row per task; here
 * it takes a reference to each text under a short lock and copies them after it.
 *
 * Loaded from the database at open, then changed only by committed changes, applied in
 * resourceVersion order by whoever publishes them (under the writer's lock, before the
 * change is acknowledged): a read that starts after a write was acknowledged sees it. All
 * the changes of one transaction are applied under one hold of the copy's lock, so no read
 * sees half a transaction. A list reports the resourceVersion of the last change applied,
 * so a watch from it misses and repeats nothing.
 *
 * Bounded: past STORE_TASK_COPY_BYTES of text the copy is dropped and every read goes to
 * SQLite as before (a warning says so), until the server starts again. */
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "store/sqlite/store_sqlite_mem.h"

/* One task's text, shared by the copy and the reads that hold it; it never changes while a
 * read holds it (put writes over it only when the copy's reference is the only one). */
struct mem_text {
    size_t refs; /* atomic: the copy's one, and one per read that holds it */
    size_t len;  /* bytes of text, without the NUL */
    size_t cap;  /* bytes of text it has room for */
    char text[]; /* NUL-terminated */
};

struct mem_entry {
    char *key;    /* owned: "namespace\0name\0" */
    size_t nslen; /* strlen of the namespace: the name starts at key + nslen + 1 */
    struct mem_text *t;
    enum task_phase phase; /* status.phase (Pending when absent or unknown) */
};

#define CHUNK 256 /* entries per chunk: an insert moves at most this many */

struct mem_chunk {
    size_t n;
    struct mem_entry e[CHUNK];
};

struct sqlst_mem {
    pthread_mutex_t mu;
    struct mem_chunk **chunks; /* owned; in order, none empty */
    size_t nchunks, capchunks;
    size_t count;     /* entries */
    size_t bytes;     /* text and keys held */
    size_t max_bytes; /* past it the copy goes off */
    int64_t rv;       /* the resourceVersion of the last change applied */
    bool off;         /* dropped (over max_bytes, or not loaded): reads go to SQLite */
};

static struct mem_text *text_new(const char *s, size_t len)
{
    struct mem_text *t = xmalloc(sizeof(*t) + len + 1);

    t->refs = 1;
    t->len = len;
    t->cap = len;
    memcpy(t->text, s, len);
    t->text[len] = '\0';
    return t;
}

static void text_ref(struct mem_text *t)
{
    __atomic_fetch_add(&t->refs, 1, __ATOMIC_RELAXED);
}

static void text_unref(struct mem_text *t)
{
    if (t != NULL && __atomic_sub_fetch(&t->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        free(t);
    }
}

/* <0, 0, >0 as (NS, NAME) sorts before, with, after entry E (SQLite's BINARY order). */
static int cmp_entry(const char *ns, const char *name, const struct mem_entry *e)
{
    int c = strcmp(ns, e->key);

    return c != 0 ? c : strcmp(name, e->key + e->nslen + 1);
}

/* Where (NS, NAME) is or would go: chunk *CI (== nchunks: after everything) and index *I
 * in it (the first entry not before the key). */
static void find(const struct sqlst_mem *m, const char *ns, const char *name, size_t *ci, size_t *i)
{
    size_t lo = 0, hi = m->nchunks;

    while (lo < hi) { /* the first chunk whose last entry is not before the key */
        size_t mid = lo + (hi - lo) / 2;
        const struct mem_chunk *c = m->chunks[mid];
        if (cmp_entry(ns, name, &c->e[c->n - 1]) > 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    *ci = lo;
    *i = 0;
    if (lo == m->nchunks) {
        return;
    }
    hi = m->chunks[lo]->n;
    lo = 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cmp_entry(ns, name, &m->chunks[*ci]->e[mid]) > 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    *i = lo;
}

/* Whether (NS, NAME) is there: find's chunk *CI and index *I either way. */
static bool find_exact(const struct sqlst_mem *m, const char *ns, const char *name, size_t *ci,
                       size_t *i)
{
    find(m, ns, name, ci, i);
    return *ci < m->nchunks && cmp_entry(ns, name, &m->chunks[*ci]->e[*i]) == 0;
}

static void chunk_insert_at(struct sqlst_mem *m, size_t ci, struct mem_chunk *c)
{
    if (m->nchunks == m->capchunks) {
        m->capchunks = m->capchunks != 0 ? m->capchunks * 2 : 16;
        m->chunks = xrealloc(m->chunks, m->capchunks * sizeof(*m->chunks));
    }
    memmove(&m->chunks[ci + 1], &m->chunks[ci], (m->nchunks - ci) * sizeof(*m->chunks));
    m->chunks[ci] = c;
    m->nchunks++;
}

/* Inserts E at chunk CI, index I (from find): a full chunk is split in two first. */
static void insert(struct sqlst_mem *m, size_t ci, size_t i, struct mem_entry e)
{
    struct mem_chunk *c;

    if (ci == m->nchunks) { /* after everything: the last chunk, or a new one */
        if (ci == 0 || m->chunks[ci - 1]->n == CHUNK) {
            chunk_insert_at(m, ci, xcalloc(1, sizeof(struct mem_chunk)));
        } else {
            ci--;
        }
        i = m->chunks[ci]->n;
    }
    c = m->chunks[ci];
    if (c->n == CHUNK) {
        struct mem_chunk *right = xcalloc(1, sizeof(*right));
        right->n = CHUNK / 2;
        memcpy(right->e, &c->e[CHUNK / 2], (CHUNK / 2) * sizeof(c->e[0]));
        c->n = CHUNK / 2;
        chunk_insert_at(m, ci + 1, right);
        if (i > CHUNK / 2) {
            c = right;
            i -= CHUNK / 2;
        }
    }
    memmove(&c->e[i + 1], &c->e[i], (c->n - i) * sizeof(c->e[0]));
    c->e[i] = e;
    c->n++;
    m->count++;
}

/* Frees what entry E holds (its key, its reference to the text). */
static void entry_drop(struct mem_entry *e)
{
    free(e->key);
    text_unref(e->t);
}

static void remove_at(struct sqlst_mem *m, size_t ci, size_t i)
{
    struct mem_chunk *c = m->chunks[ci];

    m->bytes -= c->e[i].t->len + c->e[i].nslen + strlen(c->e[i].key + c->e[i].nslen + 1) + 2;
    entry_drop(&c->e[i]);
    memmove(&c->e[i], &c->e[i + 1], (c->n - i - 1) * sizeof(c->e[0]));
    c->n--;
    m->count--;
    if (c->n == 0) {
        free(c);
        memmove(&m->chunks[ci], &m->chunks[ci + 1], (m->nchunks - ci - 1) * sizeof(*m->chunks));
        m->nchunks--;
    }
}

/* Frees every entry (the copy stays, empty). */
static void drop_all(struct sqlst_mem *m)
{
    for (size_t ci = 0; ci < m->nchunks; ci++) {
        struct mem_chunk *c = m->chunks[ci];
        for (size_t i = 0; i < c->n; i++) {
            entry_drop(&c->e[i]);
        }
        free(c);
    }
    free(m->chunks);
    m->chunks = NULL;
    m->nchunks = m->capchunks = m->count = m->bytes = 0;
}

/* A new entry for (NS, NAME) with a copy of TEXT[LEN], counted in m->bytes. */
static struct mem_entry entry_new(struct sqlst_mem *m, const char *ns, const char *name,
                                  const char *text, size_t len, enum task_phase phase)
{
    size_t nslen = strlen(ns), nlen = strlen(name);
    struct mem_entry e = {.key = xmalloc(nslen + nlen + 2), .nslen = nslen, .phase = phase};

    memcpy(e.key, ns, nslen + 1);
    memcpy(e.key + nslen + 1, name, nlen + 1);
    e.t = text_new(text, len);
    m->bytes += len + nslen + nlen + 2;
    return e;
}

/* Sets (NS, NAME) to TEXT[LEN] (a copy) in phase PHASE. */
static void put(struct sqlst_mem *m, const char *ns, const char *name, const char *text, size_t len,
                enum task_phase phase)
{
    size_t ci, i;

    if (find_exact(m, ns, name, &ci, &i)) {
        struct mem_entry *old = &m->chunks[ci]->e[i];
        m->bytes = m->bytes - old->t->len + len;
        /* No read holds the old text (a read takes its reference under the lock held
         * here) and it has room: written over, not allocated again. */
        if (__atomic_load_n(&old->t->refs, __ATOMIC_ACQUIRE) == 1 && old->t->cap >= len) {
            memcpy(old->t->text, text, len);
            old->t->text[len] = '\0';
            old->t->len = len;
        } else {
            text_unref(old->t);
            old->t = text_new(text, len);
        }
        old->phase = phase;
        return;
    }
    insert(m, ci, i, entry_new(m, ns, name, text, len, phase));
}

static void go_off(struct sqlst_mem *m, const char *why)
{
    char limit[32];

    snprintf(limit, sizeof(limit), "%zu", m->max_bytes);
    log_kv(LOG_WARN, "store_task_copy_off", "why", why, "limit_bytes", limit, "note",
           "tasks are read from the database until the server restarts", NULL);
    drop_all(m);
    m->off = true;
}

static int by_key(const void *pa, const void *pb)
{
    const struct mem_entry *a = pa, *b = pb;
    int c = strcmp(a->key, b->key);

    return c != 0 ? c : strcmp(a->key + a->nslen + 1, b->key + b->nslen + 1);
}

/* Frees the N entries E (the array too). */
static void entries_free(struct mem_entry *e, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        entry_drop(&e[i]);
    }
    free(e);
}

/* The copy made of the N entries E (taken; distinct keys): sorted, then cut into chunks. */
static void fill(struct sqlst_mem *m, struct mem_entry *e, size_t n)
{
    if (n > 0) {
        qsort(e, n, sizeof(*e), by_key);
    }
    for (size_t at = 0; at < n; at += CHUNK) {
        struct mem_chunk *c = xcalloc(1, sizeof(*c));
        c->n = n - at < CHUNK ? n - at : CHUNK;
        memcpy(c->e, &e[at], c->n * sizeof(e[0]));
        chunk_insert_at(m, m->nchunks, c);
    }
    m->count = n;
    free(e);
}

/* The entries read at open (load). */
struct loaded {
    struct mem_entry *e;
    size_t n, cap;
};

/* Takes the row Q holds (namespace, name, doc, phase) into L, or turns the copy off. */
static void load_row(struct sqlst_mem *m, struct loaded *l, sqlite3_stmt *q)
{
    const char *ns = (const char *)sqlite3_column_text(q, 0);
    const char *name = (const char *)sqlite3_column_text(q, 1);
    const char *doc = (const char *)sqlite3_column_text(q, 2);
    const char *phase = (const char *)sqlite3_column_text(q, 3);
    enum task_phase ph = TASK_PENDING;

    if (ns == NULL || name == NULL || doc == NULL) {
        go_off(m, "a task row without namespace, name or text");
        return;
    }
    if (strlen(ns) >= sizeof(((struct event *)0)->ns) ||
        strlen(name) >= sizeof(((struct event *)0)->name)) {
        /* Changes name their task by a copy cut to that length (struct event). */
        go_off(m, "a task name longer than a change event holds");
        return;
    }
    if (phase != NULL && task_phase_parse(&ph, phase) != E_OK) {
        ph = TASK_PENDING;
    }
    if (l->n == l->cap) {
        l->cap = l->cap != 0 ? l->cap * 2 : 1024;
        l->e = xrealloc(l->e, l->cap * sizeof(*l->e));
    }
    l->e[l->n++] = entry_new(m, ns, name, doc, (size_t)sqlite3_column_bytes(q, 2), ph);
    if (m->bytes > m->max_bytes) {
        go_off(m, "the stored tasks are larger than the limit");
    }
}

/* Loads every task row of DB (the writer's connection, at open): read in the table's own
 * order (one pass over its pages, where its index's order would seek a row per task: on a
 * cold disk, a random read each), sorted here. */
static int load(struct sqlst_mem *m, sqlite3 *db, struct err *err)
{
    sqlite3_stmt *q = NULL;
    struct loaded l = {.e = NULL, .n = 0, .cap = 0};
    int rc = sqlite3_prepare_v2(db, "SELECT namespace, name, doc, phase FROM tasks", -1, &q, NULL),
        step;

    if (rc != SQLITE_OK) {
        return err_set(err, E_FAIL, "load tasks: %s", sqlite3_errmsg(db));
    }
    while ((step = sqlite3_step(q)) == SQLITE_ROW && !m->off) {
        load_row(m, &l, q);
    }
    rc = step == SQLITE_DONE || m->off ? E_OK
                                       : err_set(err, E_FAIL, "load tasks: %s", sqlite3_errmsg(db));
    sqlite3_finalize(q);
    if (rc == E_OK && !m->off) {
        fill(m, l.e, l.n);
    } else {
        entries_free(l.e, l.n);
        m->bytes = 0;
    }
    return rc;
}

int sqlst_mem_open(struct sqlst_mem **out, sqlite3 *db, int64_t rv, struct err *err)
{
    struct sqlst_mem *m = xcalloc(1, sizeof(*m));
    int rc;

    pthread_mutex_init(&m->mu, NULL);
    m->max_bytes = STORE_TASK_COPY_BYTES;
    m->rv = rv;
    rc = load(m, db, err);
    if (rc != E_OK) {
        sqlst_mem_close(m);
        *out = NULL;
        return rc;
    }
    *out = m;
    return E_OK;
}

void sqlst_mem_close(struct sqlst_mem *m)
{
    if (m == NULL) {
        return;
    }
    drop_all(m);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void sqlst_mem_apply(struct sqlst_mem *m, const struct event *ev, size_t n)
{
    if (m == NULL) {
        return;
    }
    pthread_mutex_lock(&m->mu);
    for (size_t k = 0; k < n && !m->off; k++) {
        const struct event *e = &ev[k];
        if (e->type == TASK_EVENT_DELETED) {
            size_t ci, i;
            if (find_exact(m, e->ns, e->name, &ci, &i)) {
                remove_at(m, ci, i);
            }
        } else if (e->json == NULL) {
            go_off(m, "a change without its text"); /* never: the text is what was written */
        } else {
            put(m, e->ns, e->name, e->json, e->bytes, e->phase);
            if (m->bytes > m->max_bytes) {
                go_off(m, "the stored tasks grew larger than the limit");
            }
        }
        m->rv = e->rv;
    }
    pthread_mutex_unlock(&m->mu);
}

/* Takes M's lock when there is a copy to read: false (lock not held) when M is NULL or off. */
static bool lock_on(struct sqlst_mem *m)
{
    if (m == NULL) {
        return false;
    }
    pthread_mutex_lock(&m->mu);
    if (m->off) {
        pthread_mutex_unlock(&m->mu);
        return false;
    }
    return true;
}

bool sqlst_mem_get(int *rc_out, struct sqlst_mem *m, const char *ns, const char *name,
                   task_text_fn fn, void *userdata)
{
    struct mem_text *t = NULL;
    size_t ci, i;

    if (!lock_on(m)) {
        return false;
    }
    if (find_exact(m, ns, name, &ci, &i)) {
        t = m->chunks[ci]->e[i].t;
        text_ref(t);
    }
    pthread_mutex_unlock(&m->mu);
    *rc_out = t != NULL ? fn(t->text, t->len, userdata) : E_NOTFOUND;
    text_unref(t);
    return true;
}

static bool live(enum task_phase p)
{
    return p != TASK_COMPLETED && p != TASK_FAILED;
}

/* The texts of NS (NULL: every namespace; of the tasks not finished only when LIVE_ONLY),
 * referenced, in order, into *OUT (owned). */
static size_t snapshot(struct mem_text ***out, struct sqlst_mem *m, const char *ns, bool live_only)
{
    struct mem_text **ts = xmalloc((m->count + 1) * sizeof(*ts));
    size_t n = 0, ci = 0, i = 0;

    if (ns != NULL) {
        find(m, ns, "", &ci, &i);
    }
    for (; ci < m->nchunks; ci++, i = 0) {
        const struct mem_chunk *c = m->chunks[ci];
        for (; i < c->n; i++) {
            if (ns != NULL && strcmp(ns, c->e[i].key) != 0) {
                *out = ts;
                return n;
            }
            if (!live_only || live(c->e[i].phase)) {
                text_ref(c->e[i].t);
                ts[n++] = c->e[i].t;
            }
        }
    }
    *out = ts;
    return n;
}

static bool list(int *rc_out, int64_t *rv_out, struct sqlst_mem *m, const char *ns, bool live_only,
                 task_text_fn fn, void *userdata)
{
    struct mem_text **ts;
    size_t n, i;
    int rc = E_OK;

    if (!lock_on(m)) {
        return false;
    }
    n = snapshot(&ts, m, ns, live_only);
    if (rv_out != NULL) {
        *rv_out = m->rv;
    }
    pthread_mutex_unlock(&m->mu);
    for (i = 0; i < n && rc == E_OK; i++) {
        rc = fn(ts[i]->text, ts[i]->len, userdata);
    }
    for (i = 0; i < n; i++) {
        text_unref(ts[i]);
    }
    free(ts);
    *rc_out = rc;
    return true;
}

bool sqlst_mem_list(int *rc_out, int64_t *rv_out, struct sqlst_mem *m, const char *ns,
                    task_text_fn fn, void *userdata)
{
    return list(rc_out, rv_out, m, ns, false, fn, userdata);
}

bool sqlst_mem_list_live(int *rc_out, struct sqlst_mem *m, task_text_fn fn, void *userdata)
{
    return list(rc_out, NULL, m, NULL, true, fn, userdata);
}

void sqlst_mem_stats(struct sqlst_mem *m, size_t *count, size_t *bytes, bool *on)
{
    *count = *bytes = 0;
    *on = false;
    if (m == NULL) {
        return;
    }
    pthread_mutex_lock(&m->mu);
    *count = m->count;
    *bytes = m->bytes;
    *on = !m->off;
    pthread_mutex_unlock(&m->mu);
}

void sqlst_mem_limit(struct sqlst_mem *m, size_t max_bytes)
{
    if (m == NULL) {
        return;
    }
    pthread_mutex_lock(&m->mu);
    m->max_bytes = max_bytes;
    if (!m->off && m->bytes > m->max_bytes) {
        go_off(m, "the stored tasks are larger than the limit");
    }
    pthread_mutex_unlock(&m->mu);
}
