/* SPDX-License-Identifier: Apache-2.0 */
/* GET /api/v1/events: the dashboard's one Server-Sent Events stream (SPEC §12).
 *
 * A stream opened without Last-Event-ID starts with one `event: task` per existing task
 * (a snapshot), then sends `event: task` with the task JSON on every change of the
 * store's change feed (a deleted task: its last JSON with metadata.deletionTimestamp
 * set). With ?task=ns/name it also tails <data-dir>/logs/<ns>/<name>.log: `event: log`
 * carries complete new lines (one `data:` line each), `event: end` follows once the task
 * is Completed, Failed or deleted (and its last lines are out). `: ping` every 15 s.
 *
 * Event ids: every event has `id: R-I-O-F`, the stream's whole cursor after the event:
 *   R  resourceVersion of the last task change sent (snapshot: the list's version),
 *   I  inode of the log file tailed (0: none yet), O  bytes of that file sent,
 *   F  0 live, 1 `end` was sent (no more log), 2 inside the snapshot.
 * R and O only grow within a stream, so Last-Event-ID resumes exactly after the last event
 * the client saw: changes after R, log bytes after O. F=2 (cut inside the snapshot)
 * sends the snapshot again. When the log file was replaced by its cap (a new inode whose
 * first line says "N older bytes dropped") O is mapped into the new file; otherwise the
 * new file is sent from its start. When R is older than the change feed keeps, the
 * stream sends `event: reset` and a new snapshot.
 *
 * Threads: libmicrohttpd runs one thread per connection here, so the read callback
 * waits in its own connection's thread only, and at most EVENTS_WAIT_MS at a time (a
 * callback returning 0 bytes at once would make that thread spin). Streams are capped
 * (503 past EVENTS_MAX); each ends within EVENTS_WAIT_MS of shutdown or of its client
 * closing the connection. */
#include <fcntl.h>
#include <microhttpd.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "server/api/api_int.h"

#define EVENTS_MAX_DEFAULT 256
#define EVENTS_PING_MS 15000
#define EVENTS_WAIT_MS 1000    /* longest wait inside one read callback */
#define EVENTS_LOG_POLL_MS 250 /* log file size checks while a log is tailed */
#define EVENTS_LOG_CHUNK (64u * 1024u)
#define EVENTS_LOG_CHUNKS 4     /* per read callback: a long log goes out in steps, never whole */
#define EVENTS_END_GRACE_MS 500 /* last lines written right after the final phase */

enum { F_LIVE = 0, F_END = 1, F_SNAPSHOT = 2 };

static atomic_int g_streams;

struct events {
    struct server *srv;      /* borrowed */
    int fd;                  /* the connection's socket (MHD's), -1: unknown */
    int64_t rv;              /* last resourceVersion sent */
    char *log_ns, *log_name; /* owned; NULL: no ?task= */
    char *log_path;          /* owned */
    unsigned long long ino;  /* inode of the log file tailed, 0: none yet */
    unsigned long long off;  /* bytes of that file sent */
    bool ended;              /* `end` sent */
    bool log_behind;         /* the log has more bytes than the last look sent */
    int64_t end_at_ms;       /* the task is finished: send `end` at this time; 0: not yet */
    int64_t ping_ms;         /* EVENTS_PING_MS */
    int64_t next_ping_ms;
    struct buf pending; /* event text not yet written */
    size_t sent;        /* bytes of pending written */
};

static void put_id(struct events *e, int flag)
{
    (void)buf_printf(&e->pending, "id: %lld-%llu-%llu-%d\n", (long long)e->rv, e->ino, e->off,
                     e->ended ? F_END : flag);
}

static bool is_log_task(const struct events *e, const char *ns, const char *name)
{
    return e->log_ns != NULL && strcmp(e->log_ns, ns) == 0 && strcmp(e->log_name, name) == 0;
}

static void mark_finished(struct events *e)
{
    if (e->end_at_ms == 0) {
        e->end_at_ms = clock_now_ms(clock_system()) + EVENTS_END_GRACE_MS;
    }
}

/* The last JSON of a deleted task, marked the Kubernetes way. */
static char *deleted_json(const char *json)
{
    json_t *obj = json_loads(json, 0, NULL);
    json_t *md = json_object_get(obj, "metadata");
    char ts[CLOCK_RFC3339_MAX];
    char *out;

    if (!json_is_object(md)) {
        json_decref(obj);
        return NULL;
    }
    clock_rfc3339(ts, clock_now_ms(clock_system()));
    json_object_set_new(md, "deletionTimestamp", json_string(ts));
    out = json_dumps(obj, JSON_COMPACT);
    json_decref(obj);
    return out;
}

static int on_change(const struct task_event *ev, void *userdata)
{
    struct events *e = userdata;
    char *del = ev->type == TASK_EVENT_DELETED ? deleted_json(ev->json) : NULL;

    e->rv = ev->rv;
    if (is_log_task(e, ev->ns, ev->name) &&
        (ev->type == TASK_EVENT_DELETED || ev->phase == TASK_COMPLETED ||
         ev->phase == TASK_FAILED)) {
        mark_finished(e);
    }
    if (ev->type == TASK_EVENT_DELETED && del == NULL) {
        return 0; /* not an object: nothing a page could show */
    }
    (void)buf_puts(&e->pending, "event: task\n");
    put_id(e, F_LIVE);
    (void)buf_puts(&e->pending, "data: ");
    (void)buf_puts(&e->pending, del != NULL ? del : ev->json);
    (void)buf_puts(&e->pending, "\n\n");
    free(del);
    return 0;
}

struct snapshot {
    struct events *e;
    int64_t rv;
    size_t last_flag_at; /* offset of the flag digit of the last id written */
    size_t n;
};

static int on_listed(const char *json, size_t len, void *userdata)
{
    struct snapshot *s = userdata;
    struct events *e = s->e;

    e->rv = s->rv;
    (void)buf_puts(&e->pending, "event: task\n");
    put_id(e, F_SNAPSHOT);
    s->last_flag_at = e->pending.len - 2;
    (void)buf_puts(&e->pending, "data: ");
    (void)buf_append(&e->pending, json, len);
    (void)buf_puts(&e->pending, "\n\n");
    s->n++;
    return E_OK;
}

/* One event per existing task; the last one's id is a live cursor. */
static int snapshot(struct events *e, struct err *err)
{
    struct snapshot s = {.e = e};
    int rc = task_store_list_text(&s.rv, e->srv->store, NULL, on_listed, &s, err);

    if (rc != E_OK) {
        return rc;
    }
    e->rv = s.rv;
    if (s.n > 0 && e->pending.data != NULL && e->pending.data[s.last_flag_at] == '2') {
        e->pending.data[s.last_flag_at] = (char)('0' + (e->ended ? F_END : F_LIVE));
    }
    return E_OK;
}

/* --- the task log ----------------------------------------------------------------- */

/* Where byte OLD_OFF of the file the cap replaced lies in the new file at FD: its first
 * line says how many bytes of the old file were dropped. 0 when that line is missing or
 * the bytes were dropped before they were sent (the first line then says so). */
static unsigned long long map_offset(int fd, unsigned long long old_off, unsigned long long size)
{
    char head[256];
    ssize_t got = pread(fd, head, sizeof(head) - 1, 0);
    char *nl, *p, *end;
    unsigned long long dropped, head_len, at;

    if (got <= 0) {
        return 0;
    }
    head[got] = '\0';
    nl = strchr(head, '\n');
    p = strstr(head, " [log] ");
    if (nl == NULL || p == NULL || p > nl) {
        return 0;
    }
    p += 7;
    if (*p < '0' || *p > '9') {
        return 0;
    }
    dropped = strtoull(p, &end, 10);
    if (strncmp(end, " older bytes dropped", 20) != 0 || old_off < dropped) {
        return 0;
    }
    head_len = (unsigned long long)(nl - head) + 1;
    at = head_len + (old_off - dropped);
    return at <= size ? at : 0;
}

/* Appends the complete lines of DATA[0..N) as one `event: log` and returns the bytes
 * used (up to the last newline; everything when a line fills a whole chunk). */
static size_t put_lines(struct events *e, const char *data, size_t n, bool full)
{
    size_t used = n;
    struct buf ev;

    while (used > 0 && data[used - 1] != '\n') {
        used--;
    }
    if (used == 0 && full) {
        used = n; /* one line longer than a chunk: sent in pieces */
    }

    if (used == 0) {
        return 0;
    }
    buf_init(&ev, 0);
    for (size_t i = 0; i < used;) {
        const char *nl = memchr(data + i, '\n', used - i);
        size_t len = nl != NULL ? (size_t)(nl - (data + i)) : used - i;
        size_t at;

        (void)buf_puts(&ev, "data: ");
        at = ev.len;
        (void)buf_append(&ev, data + i, len);
        /* A CR would end the line for the browser's parser: never let a log line add
         * fields of its own. */
        for (size_t k = at; k < ev.len; k++) {
            if (ev.data[k] == '\r' || ev.data[k] == '\0') {
                ev.data[k] = ' ';
            }
        }
        (void)buf_puts(&ev, "\n");
        i += len + 1;
    }
    e->off += used;
    (void)buf_puts(&e->pending, "event: log\n");
    put_id(e, F_LIVE);
    (void)buf_append(&e->pending, ev.data, ev.len);
    (void)buf_puts(&e->pending, "\n");
    buf_cleanup(&ev);
    return used;
}

/* Sends what the log file gained since the last look. No file yet: nothing. */
static void log_poll(struct events *e)
{
    struct stat st;
    char *chunk;
    int fd;

    if (e->log_path == NULL || e->ended) {
        return;
    }
    fd = open(e->log_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        return;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return;
    }
    if ((unsigned long long)st.st_ino != e->ino) {
        /* First look, or the cap replaced the file. */
        e->off = e->ino != 0 ? map_offset(fd, e->off, (unsigned long long)st.st_size) : 0;
        e->ino = (unsigned long long)st.st_ino;
    } else if ((unsigned long long)st.st_size < e->off) {
        e->off = 0; /* truncated in place */
    }
    chunk = xmalloc(EVENTS_LOG_CHUNK);
    e->log_behind = false;
    for (int i = 0; e->off < (unsigned long long)st.st_size; i++) {
        ssize_t got;
        if (i == EVENTS_LOG_CHUNKS) {
            e->log_behind = true; /* the rest in the next step */
            break;
        }
        got = pread(fd, chunk, EVENTS_LOG_CHUNK, (off_t)e->off);
        if (got <= 0 || put_lines(e, chunk, (size_t)got, (size_t)got == EVENTS_LOG_CHUNK) == 0) {
            break; /* only a partial line so far */
        }
    }
    free(chunk);
    close(fd);
}

static void maybe_end(struct events *e, int64_t now)
{
    if (e->log_ns == NULL || e->ended || e->end_at_ms == 0 || now < e->end_at_ms) {
        return;
    }
    log_poll(e);
    if (e->log_behind) {
        return; /* the rest of the log first */
    }
    e->ended = true;
    (void)buf_puts(&e->pending, "event: end\n");
    put_id(e, F_END);
    (void)buf_printf(&e->pending, "data: {\"task\":\"%s/%s\"}\n\n", e->log_ns, e->log_name);
}

/* --- the stream ------------------------------------------------------------------- */

/* An SSE client sends nothing after its request: a readable end of stream means it left.
 * Seen at once rather than at the next write, so its slot and thread are freed. */
static bool client_gone(const struct events *e)
{
    char c;

    return e->fd >= 0 && recv(e->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

static void fill(struct events *e)
{
    int64_t now = clock_now_ms(clock_system());
    int64_t wait = e->log_ns != NULL && !e->ended ? EVENTS_LOG_POLL_MS : EVENTS_WAIT_MS;
    int64_t last = e->rv;
    struct err err = {0};

    if (now >= e->next_ping_ms) {
        (void)buf_puts(&e->pending, ": ping\n\n");
        e->next_ping_ms = now + e->ping_ms;
        return;
    }
    if (e->end_at_ms != 0 && !e->ended && e->end_at_ms - now < wait) {
        wait = e->end_at_ms - now > 0 ? e->end_at_ms - now : 1;
    }
    if (e->next_ping_ms - now < wait) {
        wait = e->next_ping_ms - now;
    }
    if (e->log_behind) {
        wait = 0; /* more of the log is waiting: no pause between steps */
    }
    if (task_store_watch(&last, e->srv->store, NULL, e->rv, (int)wait, on_change, e, &err) ==
        E_AGAIN) {
        /* Older than the change feed keeps: start over with a fresh snapshot. */
        buf_cleanup(&e->pending);
        (void)buf_puts(&e->pending, "event: reset\n");
        put_id(e, F_LIVE);
        (void)buf_puts(&e->pending, "data: {}\n\n");
        if (snapshot(e, &err) != E_OK) {
            return;
        }
        last = e->rv;
    }
    e->rv = last;
    log_poll(e);
    maybe_end(e, clock_now_ms(clock_system()));
}

static long events_read(void *cls, uint64_t pos, char *out, size_t max)
{
    struct events *e = cls;
    size_t n;

    (void)pos;
    while (e->sent >= e->pending.len) {
        buf_cleanup(&e->pending);
        e->sent = 0;
        if (atomic_load(&e->srv->shutting_down)) {
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (client_gone(e)) {
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        fill(e);
    }
    n = e->pending.len - e->sent;
    if (n > max) {
        n = max;
    }
    memcpy(out, e->pending.data + e->sent, n);
    e->sent += n;
    return (long)n;
}

static void events_free(void *cls)
{
    struct events *e = cls;

    buf_cleanup(&e->pending);
    free(e->log_ns);
    free(e->log_name);
    free(e->log_path);
    free(e);
    atomic_fetch_sub(&g_streams, 1);
}

/* A positive number from the environment (undocumented: for tests), else DEF. */
static int env_int(const char *name, int def)
{
    const char *v = getenv(name);
    char *end = NULL;
    long n;

    if (v == NULL || v[0] == '\0') {
        return def;
    }
    n = strtol(v, &end, 10);
    return *end == '\0' && n > 0 && n < 1000000 ? (int)n : def;
}

static int events_max(void)
{
    return env_int("DIVERGE_EVENTS_MAX", EVENTS_MAX_DEFAULT);
}

/* Parses "R-I-O-F" into E. */
static bool parse_last_id(struct events *e, int *flag, const char *s)
{
    unsigned long long v[4];
    const char *p = s;
    char *end;

    for (int i = 0; i < 4; i++) {
        if (*p < '0' || *p > '9') {
            return false;
        }
        v[i] = strtoull(p, &end, 10);
        if (*end != (i < 3 ? '-' : '\0')) {
            return false;
        }
        p = end + 1;
    }
    if (v[0] > (unsigned long long)INT64_MAX || v[3] > F_SNAPSHOT) {
        return false;
    }
    e->rv = (int64_t)v[0];
    e->ino = v[1];
    e->off = v[2];
    *flag = (int)v[3];
    e->ended = *flag == F_END;
    return true;
}

/* ?task=ns/name: both DNS labels. */
static bool parse_task(struct events *e, const char *q)
{
    const char *slash = strchr(q, '/');
    char *ns;

    if (slash == NULL) {
        return false;
    }
    ns = xstrdup(q);
    ns[slash - q] = '\0';
    if (!task_name_valid(ns) || !task_name_valid(slash + 1)) {
        free(ns);
        return false;
    }
    e->log_ns = ns;
    e->log_name = xstrdup(slash + 1);
    e->log_path = xasprintf("%s/logs/%s/%s.log", e->srv->cfg.data_dir, ns, slash + 1);
    return true;
}

/* The task already finished when the stream starts: its log is complete. */
static void check_finished(struct events *e)
{
    json_t *obj = NULL;
    struct err err = {0};
    const char *phase;

    if (e->log_ns == NULL || e->ended ||
        task_store_get(&obj, e->srv->store, e->log_ns, e->log_name, &err) != E_OK) {
        return;
    }
    phase = json_string_value(json_object_get(json_object_get(obj, "status"), "phase"));
    if (phase != NULL && (strcmp(phase, "Completed") == 0 || strcmp(phase, "Failed") == 0)) {
        e->end_at_ms = clock_now_ms(clock_system());
    }
    json_decref(obj);
}

/* A browser sends Origin on cross-origin EventSource requests: only this host's own. */
static int start_stream(struct request *r, struct events *e)
{
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, events_read, e, events_free);
    enum MHD_Result ret;

    if (resp == NULL) {
        events_free(e);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    http_guard_answering(r->conn);
    r->status = 200;
    ret = MHD_queue_response(r->conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return ret;
}

int api_events(struct request *r)
{
    const char *task = http_query(r, "task");
    const char *last_id = http_header(r, "Last-Event-ID");
    struct events *e;
    const union MHD_ConnectionInfo *ci;
    int flag = F_SNAPSHOT;
    struct err err = {0};

    if (!ui_auth_ok(r)) {
        return http_send_error(r, 401, NULL, NULL,
                               "missing or wrong admin token (bearer header, or the "
                               "diverge_token session cookie from /ui/login)");
    }
    if (!ui_same_origin(r)) {
        return http_send_error(r, 403, NULL, NULL, "cross-origin event streams are refused");
    }
    if (atomic_fetch_add(&g_streams, 1) >= events_max()) {
        atomic_fetch_sub(&g_streams, 1);
        return http_send_error(r, 503, NULL, NULL,
                               "too many event streams open (at most %d); try again later",
                               events_max());
    }
    e = xcalloc(1, sizeof(*e));
    e->srv = r->srv;
    ci = MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    e->fd = ci != NULL ? (int)ci->connect_fd : -1;
    buf_init(&e->pending, 0);
    if (task != NULL && !parse_task(e, task)) {
        events_free(e);
        return http_send_error(r, 400, NULL, NULL, "task must be <namespace>/<name>");
    }
    if (last_id != NULL && last_id[0] != '\0' && !parse_last_id(e, &flag, last_id)) {
        events_free(e);
        return http_send_error(r, 400, NULL, NULL, "last event id is not one of this stream");
    }
    (void)buf_puts(&e->pending, "retry: 2000\n\n");
    if (flag == F_SNAPSHOT && snapshot(e, &err) != E_OK) {
        events_free(e);
        return http_send_err(r, &err);
    }
    e->ping_ms = env_int("DIVERGE_EVENTS_PING_MS", EVENTS_PING_MS);
    e->next_ping_ms = clock_now_ms(clock_system()) + e->ping_ms;
    check_finished(e);
    return start_stream(r, e);
}
