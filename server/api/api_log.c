/* SPDX-License-Identifier: Apache-2.0 */
/* GET …/agenttasks/{name}/log (SPEC §3, §9): the task's sandbox log as text/plain, from
 * ?sinceBytes=N; with ?follow=true the response streams new lines until the task is
 * finished (Completed, Failed or deleted) or the server stops. */
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sandbox/sandbox.h"
#include "server/api/api_int.h"

#define LOG_BODY_MAX (SANDBOX_LOG_CAP + (1u << 20)) /* a whole log, plus lines in flight */
#define LOG_FOLLOW_POLL_MS 100                      /* how often a follower looks */

struct follow {
    struct server *srv; /* borrowed */
    char *ns, *name;    /* owned */
    char *path;         /* owned: the log file */
    uint64_t off;       /* next byte of the file to send */
    bool done;          /* the task finished: send the rest, then end */
};

static bool finished(struct follow *f)
{
    json_t *obj = NULL;
    struct task_view v;
    bool fin;

    if (task_store_get(&obj, f->srv->store, f->ns, f->name, NULL) != E_OK) {
        return true; /* deleted */
    }
    task_view_of(&v, obj);
    fin = v.phase == TASK_COMPLETED || v.phase == TASK_FAILED;
    json_decref(obj);
    return fin;
}

/* Reads up to MAX bytes of the file from F->off; 0 at its end, -1 when there is none. */
static long read_more(struct follow *f, char *out, size_t max)
{
    int fd = open(f->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    ssize_t n = 0;

    if (fd < 0) {
        return errno == ENOENT ? 0 : -1;
    }
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size < f->off) {
        f->off = 0; /* the oldest part was dropped: the file starts again */
    }
    n = pread(fd, out, max, (off_t)f->off);
    close(fd);
    if (n < 0) {
        return -1;
    }
    f->off += (uint64_t)n;
    return (long)n;
}

static long follow_read(void *cls, uint64_t pos, char *out, size_t max)
{
    struct follow *f = cls;

    (void)pos;
    for (;;) {
        /* Look at the phase before reading: lines written before the task finished are
         * then always sent. */
        bool fin = f->done || finished(f);
        long n = read_more(f, out, max);
        if (n != 0) {
            return n < 0 ? MHD_CONTENT_READER_END_WITH_ERROR : n;
        }
        if (fin || atomic_load(&f->srv->shutting_down)) {
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        struct timespec ts = {.tv_sec = 0, .tv_nsec = LOG_FOLLOW_POLL_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static void follow_free(void *cls)
{
    struct follow *f = cls;

    free(f->ns);
    free(f->name);
    free(f->path);
    free(f);
}

int api_task_log(struct request *r)
{
    const char *ns = r->params[0], *name = r->params[1];
    const char *since = http_query(r, "sinceBytes");
    uint64_t off = 0;
    json_t *obj = NULL;
    struct err err = {0};
    struct follow *f;
    char *end = NULL;

    if (task_store_get(&obj, r->srv->store, ns, name, &err) != E_OK) {
        return http_send_err(r, &err);
    }
    json_decref(obj);
    if (since != NULL) {
        errno = 0;
        unsigned long long v = strtoull(since, &end, 10);
        if (errno != 0 || end == since || *end != '\0' || since[0] == '-') {
            return http_send_error(r, 400, "BadRequest", NULL,
                                   "sinceBytes must be a non-negative integer");
        }
        off = v;
    }
    f = xcalloc(1, sizeof(*f));
    f->srv = r->srv;
    f->ns = xstrdup(ns);
    f->name = xstrdup(name);
    f->path = sandbox_log_path(r->srv->cfg.data_dir, ns, name);
    f->off = off;
    if (http_query_true(r, "follow")) {
        return http_send_stream(r, 200, "text/plain; charset=utf-8", follow_read, f, follow_free);
    }
    /* Not following: what is there now. */
    char *body = xmalloc(LOG_BODY_MAX + 1);
    size_t len = 0;
    long n;
    while (len < LOG_BODY_MAX && (n = read_more(f, body + len, LOG_BODY_MAX - len)) > 0) {
        len += (size_t)n;
    }
    body[len] = '\0';
    int ret = http_send_text(r, 200, "text/plain; charset=utf-8", body);
    free(body);
    follow_free(f);
    return ret;
}
