/* SPDX-License-Identifier: Apache-2.0 */
/* The whole-request deadline. libmicrohttpd only has an idle timeout, so a client sending
 * one header byte now and then would hold a connection (and its thread) for ever. Every
 * connection is tracked from MHD_OPTION_NOTIFY_CONNECTION; a reaper thread shuts down the
 * socket of any connection still receiving its request past the deadline. A connection
 * whose request is complete (handler running, response or watch stream being sent) is
 * never cut; its clock restarts when the response ends (keep-alive). */
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "server/server_int.h"

struct guard_conn {
    int fd;                         /* the connection's socket, owned by MHD */
    _Atomic int64_t since_ns;       /* monotonic start of the request being received */
    atomic_bool answering;          /* request complete: exempt from the deadline */
    bool reaped;                    /* shut down once already (under g->mu) */
    struct guard_conn *prev, *next; /* list under g->mu */
};

struct http_guard {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    bool running;            /* the reaper thread was started */
    bool stop;               /* under mu */
    int64_t deadline_ns;     /* whole-request deadline */
    struct guard_conn *head; /* tracked connections, under mu */
    atomic_llong reaped;     /* connections cut so far */
};

static void *reaper(void *cls)
{
    struct http_guard *g = cls;
    /* Check a few times per deadline, at least once a second. */
    int64_t tick_ns = g->deadline_ns / 4 < 1000000000 ? g->deadline_ns / 4 : 1000000000;

    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        int64_t now = clock_mono_ns();
        struct timespec ts;

        for (struct guard_conn *c = g->head; c != NULL; c = c->next) {
            if (c->reaped || atomic_load(&c->answering) ||
                now - atomic_load(&c->since_ns) <= g->deadline_ns) {
                continue;
            }
            /* The fd is still the connection's: NOTIFY_CLOSED removes the entry under this
             * mutex before MHD closes the socket. MHD's thread sees EOF and cleans up. */
            (void)shutdown(c->fd, SHUT_RDWR);
            c->reaped = true;
            atomic_fetch_add(&g->reaped, 1);
        }
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)(tick_ns % 1000000000);
        ts.tv_sec += (time_t)(tick_ns / 1000000000) + ts.tv_nsec / 1000000000;
        ts.tv_nsec %= 1000000000;
        (void)pthread_cond_timedwait(&g->cv, &g->mu, &ts);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

int http_guard_new(struct http_guard **out, int64_t deadline_ms, struct err *err)
{
    struct http_guard *g = xcalloc(1, sizeof(*g));

    *out = NULL;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->deadline_ns = deadline_ms * 1000000;
    atomic_init(&g->reaped, 0);
    if (pthread_create(&g->thread, NULL, reaper, g) != 0) {
        http_guard_free(g);
        return err_set(err, E_FAIL, "cannot start the request deadline thread");
    }
    g->running = true;
    *out = g;
    return E_OK;
}

void http_guard_free(struct http_guard *g)
{
    if (g == NULL) {
        return;
    }
    pthread_mutex_lock(&g->mu);
    g->stop = true;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
    if (g->running) {
        pthread_join(g->thread, NULL);
    }
    /* MHD_stop_daemon ran before and notified every connection closed; free whatever it
     * did not, rather than trusting it at exit. */
    while (g->head != NULL) {
        struct guard_conn *next = g->head->next;
        free(g->head);
        g->head = next;
    }
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

long long http_guard_reaped(struct http_guard *g)
{
    return g != NULL ? atomic_load(&g->reaped) : 0;
}

void http_guard_notify(void *cls, struct MHD_Connection *conn, void **socket_context, int code)
{
    struct http_guard *g = cls;
    struct guard_conn *c;

    if (code == (int)MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        c = xcalloc(1, sizeof(*c));
        c->fd = ci != NULL ? (int)ci->connect_fd : -1;
        atomic_init(&c->since_ns, clock_mono_ns());
        atomic_init(&c->answering, false);
        c->reaped = c->fd < 0; /* nothing to shut down */
        pthread_mutex_lock(&g->mu);
        c->next = g->head;
        if (g->head != NULL) {
            g->head->prev = c;
        }
        g->head = c;
        pthread_mutex_unlock(&g->mu);
        *socket_context = c;
        return;
    }
    c = *socket_context;
    if (c == NULL) {
        return;
    }
    pthread_mutex_lock(&g->mu);
    if (c->prev != NULL) {
        c->prev->next = c->next;
    } else {
        g->head = c->next;
    }
    if (c->next != NULL) {
        c->next->prev = c->prev;
    }
    pthread_mutex_unlock(&g->mu);
    free(c);
    *socket_context = NULL;
}

static struct guard_conn *conn_of(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

    return ci != NULL ? ci->socket_context : NULL;
}

void http_guard_answering(struct MHD_Connection *conn)
{
    struct guard_conn *c = conn_of(conn);

    if (c != NULL) {
        atomic_store(&c->answering, true);
    }
}

void http_guard_request_done(struct MHD_Connection *conn)
{
    struct guard_conn *c = conn_of(conn);

    if (c != NULL) {
        atomic_store(&c->since_ns, clock_mono_ns());
        atomic_store(&c->answering, false);
    }
}
