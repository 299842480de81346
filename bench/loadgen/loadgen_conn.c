/* SPDX-License-Identifier: Apache-2.0 */
/* loadgen's connections: non-blocking keep-alive sockets on a per-thread edge-triggered
 * epoll set, one request in flight each, and the incremental HTTP/1.1 response parser
 * (status line, Content-Length or chunked, or read-to-close). */
#include "loadgen_int.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <unistd.h>

volatile sig_atomic_t g_stop;
uint64_t g_start_ns, g_measure_ns, g_end_ns;

static void rec_latency(struct stats *s, uint64_t ns)
{
    if (s->nlat == s->caplat) {
        s->caplat = s->caplat ? s->caplat * 2 : 65536;
        s->lat = realloc(s->lat, s->caplat * sizeof(*s->lat));
        if (s->lat == NULL)
            die("out of memory");
    }
    s->lat[s->nlat++] = ns;
}

static void conn_open(struct conn *c)
{
    int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0)
        die("socket: %s", strerror(errno));
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c->fd = fd;
    c->st = C_CONNECTING;
    c->busy = false;
    c->rlen = 0;
    if (connect(fd, (struct sockaddr *)&addr, addr_len) != 0 && errno != EINPROGRESS) {
        c->w->s.e_connect++;
    }
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data.ptr = c};
    if (epoll_ctl(c->w->epfd, EPOLL_CTL_ADD, fd, &ev) != 0)
        die("epoll_ctl: %s", strerror(errno));
}

static void conn_reopen(struct conn *c)
{
    close(c->fd); /* also removes it from the epoll set */
    c->w->s.reconnects++;
    conn_open(c);
}

static bool measuring(uint64_t t)
{
    return t >= g_measure_ns;
}

static void conn_send_next(struct conn *c);

static void response_done(struct conn *c)
{
    struct worker *w = c->w;
    uint64_t t = now_ns();
    if (measuring(c->t0)) {
        w->s.done++;
        if (c->status >= 100 && c->status < 600)
            w->s.status[c->status]++;
        rec_latency(&w->s, t - c->t0);
    }
    c->busy = false;
    if (c->close_after) {
        conn_reopen(c);
        return;
    }
    conn_send_next(c);
}

static void conn_write(struct conn *c)
{
    while (c->wleft > 0) {
        ssize_t n = write(c->fd, c->wp, c->wleft);
        if (n < 0) {
            if (errno == EAGAIN)
                return;
            if (errno == EINTR)
                continue;
            if (measuring(c->t0))
                c->w->s.e_write++;
            conn_reopen(c);
            return;
        }
        c->wp += n;
        c->wleft -= (size_t)n;
        if (measuring(c->t0))
            c->w->s.bytes_out += (uint64_t)n;
    }
    c->st = C_READING;
}

static void conn_send_next(struct conn *c)
{
    if (g_stop || !build_request(c)) {
        c->st = C_READING; /* idle: nothing more to send */
        c->busy = false;
        return;
    }
    c->t0 = now_ns();
    c->busy = true;
    c->rs = R_HDR;
    c->rlen = 0;
    c->status = 0;
    c->close_after = false;
    c->st = C_WRITING;
    conn_write(c);
}

/* --- response parsing --------------------------------------------------------------- */

static bool hdr_has(const char *v, size_t n, const char *tok)
{
    size_t tl = strlen(tok);
    for (size_t i = 0; i + tl <= n; i++)
        if (strncasecmp(v + i, tok, tl) == 0)
            return true;
    return false;
}

/* What the response headers say about framing. */
struct framing {
    bool chunked, have_cl;
    uint64_t cl;
};

/* "HTTP/1.x NNN" at the start of rbuf[0..hlen); 0 ok, -1 malformed. */
static int parse_status_line(struct conn *c, size_t hlen)
{
    const char *p = c->rbuf;
    if (hlen < 12 || memcmp(p, "HTTP/1.", 7) != 0 || p[8] != ' ')
        return -1;
    if (p[9] < '1' || p[9] > '5' || p[10] < '0' || p[10] > '9' || p[11] < '0' || p[11] > '9')
        return -1;
    c->status = (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
    c->close_after = p[7] == '0';
    return 0;
}

/* One header line LS[0..ll): the framing and connection headers. */
static void header_line(struct conn *c, struct framing *f, const char *ls, size_t ll)
{
    const char *colon = memchr(ls, ':', ll);
    if (colon == NULL)
        return;
    size_t nl = (size_t)(colon - ls);
    const char *v = colon + 1;
    size_t vl = ll - nl - 1;
    while (vl > 0 && (*v == ' ' || *v == '\t'))
        v++, vl--;
    if (nl == 14 && strncasecmp(ls, "content-length", 14) == 0) {
        f->have_cl = true;
        f->cl = strtoull(v, NULL, 10);
    } else if (nl == 17 && strncasecmp(ls, "transfer-encoding", 17) == 0) {
        f->chunked = hdr_has(v, vl, "chunked");
    } else if (nl == 10 && strncasecmp(ls, "connection", 10) == 0) {
        if (hdr_has(v, vl, "close"))
            c->close_after = true;
        if (hdr_has(v, vl, "keep-alive"))
            c->close_after = false;
    }
}

/* Sets how the body is read; 0 ok, -1 for a 1xx (we never send Expect). */
static int set_framing(struct conn *c, const struct framing *f)
{
    if (c->status < 200 || c->status == 204 || c->status == 304) {
        if (c->status < 200)
            return -1;
        c->remaining = 0;
        c->rs = R_BODY_CL;
    } else if (f->chunked) {
        c->rs = R_CHUNK_SIZE;
    } else if (f->have_cl) {
        c->rs = R_BODY_CL;
        c->remaining = f->cl;
    } else {
        c->rs = R_UNTIL_CLOSE;
        c->close_after = true;
    }
    return 0;
}

/* Parse the response headers in rbuf[0..hlen); 0 ok, -1 malformed. */
static int parse_head(struct conn *c, size_t hlen)
{
    const char *p = c->rbuf, *end = c->rbuf + hlen;
    struct framing f = {0};
    if (parse_status_line(c, hlen) != 0)
        return -1;
    const char *line = memchr(p, '\n', (size_t)(end - p));
    while (line != NULL && line + 1 < end) {
        const char *ls = line + 1;
        const char *le = memchr(ls, '\n', (size_t)(end - ls));
        if (le == NULL)
            le = end;
        size_t ll = (size_t)(le - ls);
        if (ll > 0 && ls[ll - 1] == '\r')
            ll--;
        header_line(c, &f, ls, ll);
        line = le < end ? le : NULL;
    }
    return set_framing(c, &f);
}

/* The result of one parser step: consumed bytes, and whether to go on. */
enum step { STEP_MORE, STEP_WAIT, STEP_DONE, STEP_ERROR };

/* R_HDR: the header block at P (AVAIL bytes, OFF into rbuf). */
static enum step step_head(struct conn *c, const char *p, size_t avail, size_t *off)
{
    const char *e = memmem(p, avail, "\r\n\r\n", 4);
    if (e == NULL)
        return c->rlen == RBUF ? STEP_ERROR : STEP_WAIT;
    size_t hl = (size_t)(e - p) + 4;
    if (*off != 0 || parse_head(c, hl) != 0)
        return STEP_ERROR;
    *off += hl;
    return c->rs == R_BODY_CL && c->remaining == 0 ? STEP_DONE : STEP_MORE;
}

/* R_BODY_CL, R_CHUNK_DATA, R_CHUNK_CRLF: c->remaining counted bytes. */
static enum step step_counted(struct conn *c, size_t avail, size_t *off)
{
    size_t take = avail < c->remaining ? avail : (size_t)c->remaining;
    *off += take;
    c->remaining -= take;
    if (c->remaining > 0)
        return STEP_WAIT;
    if (c->rs == R_BODY_CL)
        return STEP_DONE;
    if (c->rs == R_CHUNK_DATA) {
        c->rs = R_CHUNK_CRLF;
        c->remaining = 2;
    } else {
        c->rs = R_CHUNK_SIZE;
    }
    return STEP_MORE;
}

/* R_CHUNK_SIZE, R_TRAILER: one CRLF-terminated line at P. */
static enum step step_line(struct conn *c, char *p, size_t avail, size_t *off)
{
    char *e = memmem(p, avail, "\r\n", 2);
    if (e == NULL)
        return avail > 1024 ? STEP_ERROR : STEP_WAIT;
    size_t ll = (size_t)(e - p);
    *off += ll + 2;
    if (c->rs == R_TRAILER)
        return ll == 0 ? STEP_DONE : STEP_MORE;
    char *endp;
    unsigned long long n = strtoull(p, &endp, 16);
    if (endp == p)
        return STEP_ERROR;
    if (n == 0) {
        c->rs = R_TRAILER;
    } else {
        c->rs = R_CHUNK_DATA;
        c->remaining = n;
    }
    return STEP_MORE;
}

static enum step parse_step(struct conn *c, size_t *off)
{
    char *p = c->rbuf + *off;
    size_t avail = c->rlen - *off;
    switch (c->rs) {
    case R_HDR:
        return step_head(c, p, avail, off);
    case R_BODY_CL:
    case R_CHUNK_DATA:
    case R_CHUNK_CRLF:
        return step_counted(c, avail, off);
    case R_CHUNK_SIZE:
    case R_TRAILER:
        return step_line(c, p, avail, off);
    case R_UNTIL_CLOSE:
        break;
    }
    *off = c->rlen; /* R_UNTIL_CLOSE: everything until EOF */
    return STEP_WAIT;
}

/* Consume what rbuf holds; returns 1 when a response is complete, 0 for more, -1 error. */
static int parse(struct conn *c)
{
    size_t off = 0;
    enum step s;
    while ((s = parse_step(c, &off)) == STEP_MORE) {
    }
    if (s == STEP_ERROR)
        return -1;
    if (off > 0) {
        memmove(c->rbuf, c->rbuf + off, c->rlen - off);
        c->rlen -= off;
    }
    return s == STEP_DONE;
}

/* --- events -------------------------------------------------------------------------- */

/* The peer closed: the end of a read-to-close response, else an error. */
static void on_eof(struct conn *c)
{
    if (c->busy && c->rs == R_UNTIL_CLOSE) {
        c->close_after = true;
        response_done(c);
        return;
    }
    if (c->busy && measuring(c->t0))
        c->w->s.e_closed++;
    conn_reopen(c);
}

/* N new bytes in rbuf; returns false when the connection is done reading for now. */
static bool on_data(struct conn *c, size_t n)
{
    c->rlen += n;
    if (!c->busy) {
        c->rlen = 0; /* unsolicited bytes: ignore */
        return true;
    }
    int r = parse(c);
    if (r < 0) {
        if (measuring(c->t0))
            c->w->s.e_parse++;
        conn_reopen(c);
        return false;
    }
    if (r == 1) {
        if (c->st == C_WRITING) { /* answered before the request was fully sent */
            c->close_after = true;
        }
        response_done(c);
        return false; /* the next response will raise a new edge */
    }
    return true;
}

static void conn_read(struct conn *c)
{
    for (;;) {
        ssize_t n = read(c->fd, c->rbuf + c->rlen, RBUF - c->rlen);
        if (n < 0) {
            if (errno == EAGAIN)
                return;
            if (errno == EINTR)
                continue;
            if (c->busy && measuring(c->t0))
                c->w->s.e_read++;
            conn_reopen(c);
            return;
        }
        if (n == 0) {
            on_eof(c);
            return;
        }
        if (!on_data(c, (size_t)n))
            return;
    }
}

static void on_event(struct conn *c, uint32_t ev)
{
    if (c->st == C_CONNECTING) {
        if (!(ev & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
            return;
        int err = 0;
        socklen_t l = sizeof(err);
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &l);
        if (err != 0 || (ev & (EPOLLERR | EPOLLHUP))) {
            c->w->s.e_connect++;
            if (!g_stop) {
                usleep(10000);
                conn_reopen(c);
            }
            return;
        }
        conn_send_next(c);
        return;
    }
    int fd = c->fd;
    if (c->st == C_WRITING && (ev & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
        conn_write(c);
    if (c->fd == fd && c->st != C_CONNECTING && (ev & (EPOLLIN | EPOLLRDHUP | EPOLLERR | EPOLLHUP)))
        conn_read(c);
}

/* --- the worker thread --------------------------------------------------------------- */

/* Whether W has used its request quota and has nothing in flight. */
static bool quota_done(const struct worker *w)
{
    if (w->limit == 0 || w->seq < w->limit)
        return false;
    for (int i = 0; i < w->nconns; i++)
        if (w->conns[i].busy)
            return false;
    return true;
}

/* Reopens the connections whose request has waited longer than TMO ns at time T. */
static void reap_timeouts(struct worker *w, uint64_t t, uint64_t tmo)
{
    for (int i = 0; i < w->nconns; i++) {
        struct conn *c = &w->conns[i];
        if (c->busy && t - c->t0 > tmo) {
            if (measuring(c->t0))
                w->s.e_timeout++;
            conn_reopen(c);
        }
    }
}

void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct epoll_event evs[256];
    uint64_t last_check = now_ns();
    uint64_t tmo = (uint64_t)(opt.timeout * 1e9);
    for (int i = 0; i < w->nconns; i++)
        conn_open(&w->conns[i]);
    for (;;) {
        uint64_t t = now_ns();
        if (t >= g_end_ns || g_stop || quota_done(w))
            break;
        int ms = (int)((g_end_ns - t) / 1000000u);
        if (ms > 100)
            ms = 100;
        int n = epoll_wait(w->epfd, evs, 256, ms);
        for (int i = 0; i < n; i++)
            on_event(evs[i].data.ptr, evs[i].events);
        t = now_ns();
        if (t - last_check > 100000000u) {
            last_check = t;
            reap_timeouts(w, t, tmo);
        }
    }
    return NULL;
}
