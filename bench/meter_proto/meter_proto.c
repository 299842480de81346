/* SPDX-License-Identifier: Apache-2.0 */
/* The minimal group-commit prototype the meter benchmark compares against (bench/meter.sh):
 * POST /api/v1/agenttask/meter with a bearer naming one of N tasks and a JSON body
 * {requestId, tokensUsed, costUSD}; request threads (libmicrohttpd, a thread per
 * connection, as diverge serve) parse the body and queue it; one committer thread applies
 * every queued call in ONE SQLite transaction (WAL, synchronous=FULL): the request id into a
 * keyed table (a repeat is not charged), the task's totals updated, then one fsync'd COMMIT
 * and every waiter answered with the totals. No macaroons, budgets, phases, quotas, events
 * or task documents: the floor of what a durable, exactly-once meter must do.
 * usage: meter_proto DB PORT NTASKS  (tasks are named m1..mNTASKS; prints "listening")
 * Not part of the CMake build: bench/meter.sh builds it (make OUT=...). */
#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <semaphore.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BODY_MAX 16384

struct job {
    char task[64];
    char request_id[257];
    long long tokens, cost_micros;
    long long total_tokens, total_cost; /* out */
    int status;                         /* out */
    sem_t done;
    struct job *next;
};

struct conn {
    char body[BODY_MAX];
    size_t len;
    int too_big;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_work = PTHREAD_COND_INITIALIZER;
static struct job *g_head, *g_tail;
static sqlite3 *g_db;
static sqlite3_stmt *g_claim, *g_charge, *g_totals;

static void die(const char *what)
{
    fprintf(stderr, "meter_proto: %s: %s\n", what, g_db != NULL ? sqlite3_errmsg(g_db) : "");
    exit(1);
}

static void exec(const char *sql)
{
    if (sqlite3_exec(g_db, sql, NULL, NULL, NULL) != SQLITE_OK) {
        die(sql);
    }
}

static void apply(struct job *j)
{
    sqlite3_bind_text(g_claim, 1, j->task, -1, SQLITE_STATIC);
    sqlite3_bind_text(g_claim, 2, j->request_id, -1, SQLITE_STATIC);
    if (sqlite3_step(g_claim) != SQLITE_DONE) {
        die("claim");
    }
    sqlite3_reset(g_claim);
    if (sqlite3_changes(g_db) == 1) {
        sqlite3_bind_int64(g_charge, 1, j->tokens);
        sqlite3_bind_int64(g_charge, 2, j->cost_micros);
        sqlite3_bind_text(g_charge, 3, j->task, -1, SQLITE_STATIC);
        if (sqlite3_step(g_charge) != SQLITE_DONE) {
            die("charge");
        }
        sqlite3_reset(g_charge);
    }
    sqlite3_bind_text(g_totals, 1, j->task, -1, SQLITE_STATIC);
    j->status = sqlite3_step(g_totals) == SQLITE_ROW ? 200 : 401;
    if (j->status == 200) {
        j->total_tokens = sqlite3_column_int64(g_totals, 0);
        j->total_cost = sqlite3_column_int64(g_totals, 1);
    }
    sqlite3_reset(g_totals);
}

static void *committer(void *arg)
{
    (void)arg;
    for (;;) {
        struct job *batch, *next;
        pthread_mutex_lock(&g_mu);
        while (g_head == NULL) {
            pthread_cond_wait(&g_work, &g_mu);
        }
        batch = g_head;
        g_head = g_tail = NULL;
        pthread_mutex_unlock(&g_mu);
        exec("BEGIN IMMEDIATE");
        for (struct job *j = batch; j != NULL; j = j->next) {
            apply(j);
        }
        exec("COMMIT");
        for (struct job *j = batch; j != NULL; j = next) {
            next = j->next;
            sem_post(&j->done);
        }
    }
    return NULL;
}

static int reply(struct MHD_Connection *c, int status, const char *text)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
    int rc;

    MHD_add_response_header(r, "Content-Type", "application/json");
    rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

/* Parses BODY into J; 0 on success. */
static int parse(struct job *j, const char *body, size_t len)
{
    json_t *doc = json_loadb(body, len, 0, NULL);
    json_t *id = json_object_get(doc, "requestId"), *tok = json_object_get(doc, "tokensUsed"),
           *cost = json_object_get(doc, "costUSD");
    int rc = -1;

    if (json_is_string(id) && json_string_length(id) < sizeof(j->request_id) &&
        json_is_integer(tok) && json_is_number(cost)) {
        snprintf(j->request_id, sizeof(j->request_id), "%s", json_string_value(id));
        j->tokens = json_integer_value(tok);
        j->cost_micros = (long long)(json_number_value(cost) * 1e6 + 0.5);
        rc = 0;
    }
    json_decref(doc);
    return rc;
}

static int meter(struct MHD_Connection *c, const struct conn *cn)
{
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    struct job j;
    char out[160];

    memset(&j, 0, sizeof(j));
    if (auth == NULL || strncmp(auth, "Bearer ", 7) != 0 || strlen(auth + 7) >= sizeof(j.task)) {
        return reply(c, 401, "{\"error\":\"unauthorized\"}");
    }
    snprintf(j.task, sizeof(j.task), "%s", auth + 7);
    if (cn->too_big || parse(&j, cn->body, cn->len) != 0) {
        return reply(c, 400, "{\"error\":\"bad body\"}");
    }
    sem_init(&j.done, 0, 0);
    pthread_mutex_lock(&g_mu);
    if (g_tail != NULL) {
        g_tail->next = &j;
    } else {
        g_head = &j;
    }
    g_tail = &j;
    pthread_cond_signal(&g_work);
    pthread_mutex_unlock(&g_mu);
    sem_wait(&j.done);
    sem_destroy(&j.done);
    if (j.status != 200) {
        return reply(c, j.status, "{\"error\":\"unknown task\"}");
    }
    snprintf(out, sizeof(out),
             "{\"allowed\":true,\"totalTokensUsed\":%lld,\"totalCostUSD\":%lld.%06lld}",
             j.total_tokens, j.total_cost / 1000000, j.total_cost % 1000000);
    return reply(c, 200, out);
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *data,
                              size_t *size, void **state)
{
    struct conn *cn = *state;

    (void)cls, (void)version;
    if (strcmp(method, "POST") != 0 || strcmp(url, "/api/v1/agenttask/meter") != 0) {
        return (enum MHD_Result)reply(c, 404, "{\"error\":\"not found\"}");
    }
    if (cn == NULL) {
        *state = calloc(1, sizeof(struct conn));
        return MHD_YES;
    }
    if (*size > 0) {
        if (cn->len + *size > BODY_MAX) {
            cn->too_big = 1;
        } else {
            memcpy(cn->body + cn->len, data, *size);
            cn->len += *size;
        }
        *size = 0;
        return MHD_YES;
    }
    return (enum MHD_Result)meter(c, cn);
}

static void completed(void *cls, struct MHD_Connection *c, void **state,
                      enum MHD_RequestTerminationCode code)
{
    (void)cls, (void)c, (void)code;
    free(*state);
    *state = NULL;
}

int main(int argc, char **argv)
{
    pthread_t t;
    int ntasks;

    if (argc != 4) {
        fprintf(stderr, "usage: meter_proto DB PORT NTASKS\n");
        return 2;
    }
    ntasks = (int)strtol(argv[3], NULL, 10);
    if (sqlite3_open(argv[1], &g_db) != SQLITE_OK) {
        die("open");
    }
    exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
         "CREATE TABLE IF NOT EXISTS tasks (name TEXT PRIMARY KEY, tokens INTEGER NOT NULL,"
         " cost_micros INTEGER NOT NULL) STRICT;"
         "CREATE TABLE IF NOT EXISTS charges (task TEXT NOT NULL, request_id TEXT NOT NULL,"
         " PRIMARY KEY (task, request_id)) STRICT, WITHOUT ROWID;");
    for (int i = 1; i <= ntasks; i++) {
        char sql[128];
        snprintf(sql, sizeof(sql), "INSERT OR IGNORE INTO tasks VALUES ('m%d', 0, 0)", i);
        exec(sql);
    }
    if (sqlite3_prepare_v2(g_db, "INSERT OR IGNORE INTO charges VALUES (?1, ?2)", -1, &g_claim,
                           NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(g_db,
                           "UPDATE tasks SET tokens=tokens+?1, cost_micros=cost_micros+?2 "
                           "WHERE name=?3",
                           -1, &g_charge, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(g_db, "SELECT tokens, cost_micros FROM tasks WHERE name=?1", -1,
                           &g_totals, NULL) != SQLITE_OK) {
        die("prepare");
    }
    pthread_create(&t, NULL, committer, NULL);
    if (MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD |
                             MHD_USE_ERROR_LOG | MHD_USE_ITC,
                         (uint16_t)strtol(argv[2], NULL, 10), NULL, NULL, handle, NULL,
                         MHD_OPTION_NOTIFY_COMPLETED, completed, NULL, MHD_OPTION_CONNECTION_LIMIT,
                         1024u, MHD_OPTION_END) == NULL) {
        die("listen");
    }
    printf("listening\n");
    fflush(stdout);
    for (;;) {
        pause();
    }
}
