/* SPDX-License-Identifier: Apache-2.0 */
/* The byte pump and the worker-thread set shared by the proxy and the relay. The pump
 * never blocks outside poll(), and every poll also watches the stop descriptor, so a
 * stop ends every tunnel however slow its peers are. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "egress/egress_int.h"

#define PUMP_BUF 16384 /* bytes in flight per direction */

int egress_set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);

    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        return E_FAIL;
    }
    return E_OK;
}

void egress_accept_backoff(int errno_, int stop_fd)
{
    struct pollfd pfd = {.fd = stop_fd, .events = POLLIN};

    if (errno_ == EMFILE || errno_ == ENFILE || errno_ == ENOBUFS || errno_ == ENOMEM) {
        poll(&pfd, 1, 100);
    }
}

struct dir {
    int from, to;
    char *buf;       /* PUMP_BUF bytes, owned by the pump */
    size_t off, len; /* unwritten bytes are buf[off..len) */
    bool eof;        /* FROM reached end of file */
    bool shut;       /* the half-close was passed on to TO */
    uint64_t *count; /* bytes written to TO */
};

/* Reads into an empty buffer; returns false when the tunnel must end. */
static bool dir_read(struct dir *d)
{
    ssize_t n = recv(d->from, d->buf, PUMP_BUF, 0);

    if (n > 0) {
        d->off = 0;
        d->len = (size_t)n;
        return true;
    }
    if (n == 0) {
        d->eof = true;
        return true;
    }
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}

static bool dir_write(struct dir *d)
{
    ssize_t n = send(d->to, d->buf + d->off, d->len - d->off, MSG_NOSIGNAL);

    if (n >= 0) {
        d->off += (size_t)n;
        *d->count += (uint64_t)n;
        if (d->off == d->len) {
            d->off = d->len = 0;
        }
        return true;
    }
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}

static short dir_events_in(const struct dir *d)
{
    return (!d->eof && d->len == 0) ? POLLIN : 0;
}

static short dir_events_out(const struct dir *d)
{
    return d->len > 0 ? POLLOUT : 0;
}

/* Passes a finished direction's end of file on; true when it is finished. */
static bool dir_finish(struct dir *d)
{
    if (d->eof && d->len == 0 && !d->shut) {
        shutdown(d->to, SHUT_WR);
        d->shut = true;
    }
    return d->shut;
}

/* What to wait for: pfd[0] the A side, pfd[1] the B side, pfd[2] the stop descriptor. */
static void fill_pollfds(struct pollfd pfd[3], const struct dir *ab, const struct dir *ba,
                         int stop_fd)
{
    pfd[0].fd = ab->from;
    pfd[0].events = (short)(dir_events_in(ab) | dir_events_out(ba));
    pfd[1].fd = ab->to;
    pfd[1].events = (short)(dir_events_in(ba) | dir_events_out(ab));
    pfd[2].fd = stop_fd;
    pfd[2].events = POLLIN;
    for (int i = 0; i < 2; i++) {
        if (pfd[i].events == 0) {
            pfd[i].fd = -1; /* nothing wanted: do not spin on its POLLHUP */
        }
        pfd[i].revents = 0;
    }
    pfd[2].revents = 0;
}

/* Moves what poll reported ready; false when a side failed and the pump must end. */
static bool move_ready(const struct pollfd pfd[3], struct dir *ab, struct dir *ba)
{
    return !((pfd[0].revents != 0 && dir_events_in(ab) && !dir_read(ab)) ||
             (pfd[1].revents != 0 && dir_events_in(ba) && !dir_read(ba)) ||
             (pfd[1].revents != 0 && dir_events_out(ab) && !dir_write(ab)) ||
             (pfd[0].revents != 0 && dir_events_out(ba) && !dir_write(ba)));
}

static void pump_loop(struct dir *ab, struct dir *ba, int stop_fd)
{
    for (;;) {
        struct pollfd pfd[3];
        bool done_ab = dir_finish(ab), done_ba = dir_finish(ba);

        if (done_ab && done_ba) {
            return;
        }
        fill_pollfds(pfd, ab, ba, stop_fd);
        if (poll(pfd, 3, -1) < 0) {
            if (errno == EINTR) {
                continue;
            }
            return;
        }
        if (pfd[2].revents != 0 || !move_ready(pfd, ab, ba)) {
            return;
        }
    }
}

void egress_pump(int a, int b, int stop_fd, const char *pending, size_t pending_len,
                 uint64_t *a_to_b, uint64_t *b_to_a)
{
    struct dir ab = {.from = a, .to = b, .count = a_to_b};
    struct dir ba = {.from = b, .to = a, .count = b_to_a};

    *a_to_b = *b_to_a = 0;
    if (egress_set_nonblock(a) != E_OK || egress_set_nonblock(b) != E_OK) {
        return;
    }
    ab.buf = xmalloc(PUMP_BUF);
    ba.buf = xmalloc(PUMP_BUF);
    if (pending_len > PUMP_BUF) {
        pending_len = PUMP_BUF; /* callers pass at most EGRESS_HEADER_MAX */
    }
    if (pending_len > 0) {
        memcpy(ab.buf, pending, pending_len);
    }
    ab.len = pending_len;
    pump_loop(&ab, &ba, stop_fd);
    free(ab.buf);
    free(ba.buf);
}

struct slot {
    pthread_t thread;
    bool used; /* a thread was started here and not joined yet */
    bool done; /* that thread called egress_workers_done */
};

struct egress_workers {
    pthread_mutex_t mu;
    struct slot *slots; /* owned, max of them */
    size_t max;
};

struct egress_workers *egress_workers_new(size_t max)
{
    struct egress_workers *w = xcalloc(1, sizeof(*w));

    pthread_mutex_init(&w->mu, NULL);
    w->slots = xcalloc(max, sizeof(*w->slots));
    w->max = max;
    return w;
}

/* Joins finished workers; W->mu held. A finished worker only has to return, so the
 * join is short. */
static void reap_locked(struct egress_workers *w)
{
    for (size_t i = 0; i < w->max; i++) {
        if (w->slots[i].used && w->slots[i].done) {
            pthread_join(w->slots[i].thread, NULL);
            w->slots[i].used = false;
            w->slots[i].done = false;
        }
    }
}

int egress_workers_start(struct egress_workers *w, void *(*fn)(void *), void *arg,
                         size_t *slot_field)
{
    int rc = E_AGAIN;

    pthread_mutex_lock(&w->mu);
    reap_locked(w);
    for (size_t i = 0; i < w->max; i++) {
        if (!w->slots[i].used) {
            *slot_field = i;
            if (pthread_create(&w->slots[i].thread, NULL, fn, arg) != 0) {
                rc = E_FAIL;
                break;
            }
            w->slots[i].used = true;
            w->slots[i].done = false;
            rc = E_OK;
            break;
        }
    }
    pthread_mutex_unlock(&w->mu);
    return rc;
}

void egress_workers_done(struct egress_workers *w, size_t slot)
{
    pthread_mutex_lock(&w->mu);
    w->slots[slot].done = true;
    pthread_mutex_unlock(&w->mu);
}

void egress_workers_reap(struct egress_workers *w)
{
    pthread_mutex_lock(&w->mu);
    reap_locked(w);
    pthread_mutex_unlock(&w->mu);
}

void egress_workers_free(struct egress_workers *w)
{
    if (w == NULL) {
        return;
    }
    /* No new worker can start now (only the owner starts them), so join unlocked: a
     * worker still running takes the mutex in egress_workers_done. */
    for (size_t i = 0; i < w->max; i++) {
        if (w->slots[i].used) {
            pthread_join(w->slots[i].thread, NULL);
        }
    }
    pthread_mutex_destroy(&w->mu);
    free(w->slots);
    free(w);
}
