/* SPDX-License-Identifier: Apache-2.0 */
/* loadgen: an HTTP/1.1 keep-alive load generator for signed GitHub webhook deliveries
 * (bench/webhook.sh). wrk cannot sign a different body per request, and every command
 * comment must be unique (the server deduplicates by X-GitHub-Delivery and comment id),
 * so this tool builds each request itself:
 *
 *   body = template with __COMMENT_ID__ -> a run-unique integer and
 *                         __BODY__       -> "/diverge help" (cmd) or "LGTM, thanks" (nocmd)
 *   X-GitHub-Delivery: a run-unique UUID-shaped id
 *   X-Hub-Signature-256: sha256=<hex HMAC-SHA256(secret, body)>
 *
 * Design (as light as wrk): N threads, each owns connections/threads non-blocking sockets
 * on its own edge-triggered epoll instance; one request in flight per connection (no
 * pipelining); the response is parsed incrementally (status line, Content-Length or
 * chunked, or read-to-close). Latencies of every completed request are kept and sorted
 * at the end (exact percentiles).
 *
 * HMAC cost: a true HMAC-SHA256 of every body is computed, but the SHA-256 state after
 * the key block and the constant template bytes before the first placeholder (rounded
 * down to a 64-byte block) is computed once, so per request only the tail is hashed
 * (bench/webhook.sh puts the comment object last in the template to keep that tail short).
 * --full-hmac computes HMAC() one-shot over the whole body instead, to show the difference.
 * At start the midstate result is checked against HMAC() one-shot. SIGINT ends the run
 * early and still prints the report.
 *
 * usage: loadgen --url http://127.0.0.1:PORT/path [--connections 64] [--threads 2]
 *                [--duration 10] [--warmup 0] [--timeout 10] [--requests N]
 *                (--secret S --template FILE [--mode nocmd|cmd] [--body TEXT]
 *                 [--event issue_comment] [--bad-signature] [--full-hmac] [--gitlab]
 *                 | --raw-get)
 * --gitlab sends GitLab Note Hook deliveries instead: X-Gitlab-Event: Note Hook,
 * X-Gitlab-Token: <secret> (with --bad-signature a wrong one), a unique
 * X-Gitlab-Event-UUID, and no signature.
 * The last output line is machine-readable: RESULT key=value ...
 */
#define _GNU_SOURCE
#define OPENSSL_SUPPRESS_DEPRECATED /* SHA256_Init/Update/Final: the cheapest midstate copy */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define RBUF 16384
#define HDR_ROOM 1024 /* request headers are written right-aligned before the body */

/* --- options -------------------------------------------------------------------- */

static struct {
    const char *url;
    int connections, threads;
    double duration, warmup, timeout;
    uint64_t requests; /* 0: unlimited */
    const char *secret, *template_path, *mode, *body_text, *event;
    bool raw_get, bad_signature, full_hmac, gitlab;
    uint64_t id_base;
    bool id_base_set;
} opt = {.connections = 64, .threads = 2, .duration = 10, .timeout = 10, .event = "issue_comment"};

static char host_hdr[300], path[2048];
static struct sockaddr_storage addr;
static socklen_t addr_len;

/* --- template --------------------------------------------------------------------- */

enum seg_kind { SEG_LIT, SEG_ID, SEG_BODY };
struct seg {
    enum seg_kind kind;
    const char *p;
    size_t n;
};
static struct seg *segs;
static size_t nsegs;
static char *tmpl;
static size_t tmpl_len, const_prefix; /* bytes before the first placeholder */
static char body_json[512];           /* the comment text, JSON-escaped */
static size_t body_json_len, body_max;
static uint8_t key_block[64];
static SHA256_CTX inner_mid, outer_mid; /* after K^ipad (+ aligned prefix), after K^opad */
static size_t mid_aligned;
static char hdr_const[1024]; /* request line .. X-GitHub-Event */
static size_t hdr_const_len;
static char raw_req[2600];
static size_t raw_req_len;
static uint32_t nonce32;
static uint16_t nonce16;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("loadgen: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void json_escape(const char *s)
{
    size_t o = 0;
    for (; *s != '\0'; s++) {
        unsigned char c = (unsigned char)*s;
        if (o + 7 >= sizeof(body_json)) die("--body is too long");
        if (c == '"' || c == '\\') {
            body_json[o++] = '\\';
            body_json[o++] = (char)c;
        } else if (c == '\n') {
            body_json[o++] = '\\';
            body_json[o++] = 'n';
        } else if (c < 0x20) {
            o += (size_t)snprintf(body_json + o, 7, "\\u%04x", c);
        } else {
            body_json[o++] = (char)c;
        }
    }
    body_json[o] = '\0';
    body_json_len = o;
}

static void load_template(void)
{
    FILE *f = fopen(opt.template_path, "rb");
    long n;
    if (f == NULL) die("cannot open %s: %s", opt.template_path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0)
        die("cannot size %s", opt.template_path);
    tmpl = malloc((size_t)n + 1);
    if (tmpl == NULL || fread(tmpl, 1, (size_t)n, f) != (size_t)n) die("cannot read %s", opt.template_path);
    fclose(f);
    tmpl_len = (size_t)n;
    while (tmpl_len > 0 && (tmpl[tmpl_len - 1] == '\n' || tmpl[tmpl_len - 1] == '\r')) tmpl_len--;
    tmpl[tmpl_len] = '\0';

    segs = calloc(tmpl_len + 1, sizeof(*segs));
    const char *p = tmpl, *end = tmpl + tmpl_len;
    bool have_id = false;
    const_prefix = SIZE_MAX;
    body_max = 0;
    while (p < end) {
        const char *a = memmem(p, (size_t)(end - p), "__COMMENT_ID__", 14);
        const char *b = memmem(p, (size_t)(end - p), "__BODY__", 8);
        const char *q = a;
        enum seg_kind k = SEG_ID;
        size_t plen = 14;
        if (b != NULL && (q == NULL || b < q)) {
            q = b;
            k = SEG_BODY;
            plen = 8;
        }
        if (q == NULL) {
            segs[nsegs++] = (struct seg){SEG_LIT, p, (size_t)(end - p)};
            body_max += (size_t)(end - p);
            break;
        }
        if (q > p) {
            segs[nsegs++] = (struct seg){SEG_LIT, p, (size_t)(q - p)};
            body_max += (size_t)(q - p);
        }
        if (const_prefix == SIZE_MAX) const_prefix = (size_t)(q - tmpl);
        segs[nsegs++] = (struct seg){k, NULL, 0};
        body_max += k == SEG_ID ? 20 : body_json_len;
        have_id |= k == SEG_ID;
        p = q + plen;
    }
    if (!have_id)
        die("template %s has no __COMMENT_ID__ placeholder: requests would not be unique",
            opt.template_path);
    if (const_prefix == SIZE_MAX) const_prefix = tmpl_len;
}

static void hmac_setup(void)
{
    uint8_t pad[64];
    size_t klen = strlen(opt.secret);
    memset(key_block, 0, sizeof(key_block));
    if (klen > 64) {
        SHA256((const uint8_t *)opt.secret, klen, key_block);
    } else {
        memcpy(key_block, opt.secret, klen);
    }
    for (int i = 0; i < 64; i++) pad[i] = key_block[i] ^ 0x36;
    SHA256_Init(&inner_mid);
    SHA256_Update(&inner_mid, pad, 64);
    mid_aligned = opt.full_hmac ? 0 : const_prefix & ~(size_t)63;
    SHA256_Update(&inner_mid, tmpl, mid_aligned); /* the body starts with these bytes */
    for (int i = 0; i < 64; i++) pad[i] = key_block[i] ^ 0x5c;
    SHA256_Init(&outer_mid);
    SHA256_Update(&outer_mid, pad, 64);
}

static const char hexd[] = "0123456789abcdef";

static void sign_body(char out_hex[64], const char *body, size_t len)
{
    uint8_t d[32];
    if (opt.full_hmac) {
        unsigned int dl = 32;
        HMAC(EVP_sha256(), opt.secret, (int)strlen(opt.secret), (const uint8_t *)body, len, d, &dl);
    } else {
        SHA256_CTX c = inner_mid;
        SHA256_Update(&c, body + mid_aligned, len - mid_aligned);
        SHA256_Final(d, &c);
        c = outer_mid;
        SHA256_Update(&c, d, 32);
        SHA256_Final(d, &c);
    }
    for (int i = 0; i < 32; i++) {
        out_hex[2 * i] = hexd[d[i] >> 4];
        out_hex[2 * i + 1] = hexd[d[i] & 15];
    }
}

/* --- connections ------------------------------------------------------------------ */

enum cstate { C_CONNECTING, C_WRITING, C_READING };
enum rstate { R_HDR, R_BODY_CL, R_CHUNK_SIZE, R_CHUNK_DATA, R_CHUNK_CRLF, R_TRAILER, R_UNTIL_CLOSE };

struct stats {
    uint64_t done, bytes_out;
    uint64_t status[600];
    uint64_t e_connect, e_read, e_write, e_timeout, e_closed, e_parse, reconnects;
    uint64_t *lat; /* ns */
    size_t nlat, caplat;
};

struct worker;
struct conn {
    struct worker *w;
    int fd;
    enum cstate st;
    char *buf; /* HDR_ROOM + body_max */
    const char *wp;
    size_t wleft;
    uint64_t t0, seq;
    bool busy;
    char rbuf[RBUF];
    size_t rlen;
    enum rstate rs;
    uint64_t remaining;
    int status;
    bool close_after;
};

struct worker {
    pthread_t th;
    int idx, epfd, nconns;
    struct conn *conns;
    uint64_t seq, limit; /* requests started by this thread; 0: no limit */
    struct stats s;
};

static volatile sig_atomic_t g_stop;
static uint64_t g_start_ns, g_measure_ns, g_end_ns;

static void rec_latency(struct stats *s, uint64_t ns)
{
    if (s->nlat == s->caplat) {
        s->caplat = s->caplat ? s->caplat * 2 : 65536;
        s->lat = realloc(s->lat, s->caplat * sizeof(*s->lat));
        if (s->lat == NULL) die("out of memory");
    }
    s->lat[s->nlat++] = ns;
}

static void on_sigint(int sig)
{
    (void)sig;
    g_stop = 1;
}

static void conn_open(struct conn *c)
{
    int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0) die("socket: %s", strerror(errno));
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c->fd = fd;
    c->st = C_CONNECTING;
    c->busy = false;
    c->rlen = 0;
    if (connect(fd, (struct sockaddr *)&addr, addr_len) != 0 && errno != EINPROGRESS) {
        c->w->s.e_connect++;
    }
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data.ptr = c};
    if (epoll_ctl(c->w->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) die("epoll_ctl: %s", strerror(errno));
}

static void conn_reopen(struct conn *c)
{
    close(c->fd); /* also removes it from the epoll set */
    c->w->s.reconnects++;
    conn_open(c);
}

static bool measuring(uint64_t t) { return t >= g_measure_ns; }

/* Build the next request into c->buf; returns false when the thread's quota is used up. */
static bool build_request(struct conn *c)
{
    struct worker *w = c->w;
    if (w->limit != 0 && w->seq >= w->limit) return false;
    uint64_t seq = w->seq++;
    c->seq = seq;
    if (opt.raw_get) {
        c->wp = raw_req;
        c->wleft = raw_req_len;
        return true;
    }
    /* unique in this run: thread index + per-thread counter; across runs: id_base */
    uint64_t uniq = seq * (uint64_t)opt.threads + (uint64_t)w->idx;
    uint64_t id = opt.id_base + uniq;
    char *body = c->buf + HDR_ROOM;
    char *o = body + const_prefix; /* the constant prefix is already in place */
    for (size_t i = 0; i < nsegs; i++) {
        const struct seg *s = &segs[i];
        if (s->kind == SEG_LIT) {
            if (s->p + s->n <= tmpl + const_prefix) continue; /* part of the prefix */
            memcpy(o, s->p, s->n);
            o += s->n;
        } else if (s->kind == SEG_ID) {
            char num[24];
            int k = snprintf(num, sizeof(num), "%" PRIu64, id);
            memcpy(o, num, (size_t)k);
            o += k;
        } else {
            memcpy(o, body_json, body_json_len);
            o += body_json_len;
        }
    }
    size_t blen = (size_t)(o - body);
    char sig[65];
    char h[HDR_ROOM];
    int hl;
    if (opt.gitlab) { /* --gitlab: X-Gitlab-Token (the secret), a unique X-Gitlab-Event-UUID */
        hl = snprintf(h, sizeof(h),
                      "%.*sX-Gitlab-Event-UUID: %08" PRIx32 "-%04" PRIx16 "-4%03x-8%03" PRIx64
                      "-%012" PRIx64 "\r\nX-Gitlab-Token: %s%s\r\nContent-Length: %zu\r\n\r\n",
                      (int)hdr_const_len, hdr_const, nonce32, nonce16, (unsigned)(w->idx & 0xfff),
                      (uint64_t)((seq >> 48) & 0xfff), (uint64_t)(seq & 0xffffffffffffULL),
                      opt.secret, opt.bad_signature ? "x" : "", blen);
        if (hl <= 0 || (size_t)hl >= sizeof(h)) die("request headers too long");
        memcpy(body - hl, h, (size_t)hl);
        c->wp = body - hl;
        c->wleft = (size_t)hl + blen;
        return true;
    }
    sign_body(sig, body, blen);
    if (opt.bad_signature) sig[0] = sig[0] == '0' ? '1' : '0';
    sig[64] = '\0';
    hl = snprintf(h, sizeof(h),
                      "%.*sX-GitHub-Delivery: %08" PRIx32 "-%04" PRIx16 "-4%03x-8%03" PRIx64
                      "-%012" PRIx64 "\r\nX-Hub-Signature-256: sha256=%s\r\n"
                      "Content-Length: %zu\r\n\r\n",
                      (int)hdr_const_len, hdr_const, nonce32, nonce16, (unsigned)(w->idx & 0xfff),
                      (uint64_t)((seq >> 48) & 0xfff), (uint64_t)(seq & 0xffffffffffffULL), sig, blen);
    if (hl <= 0 || (size_t)hl >= sizeof(h)) die("request headers too long");
    memcpy(body - hl, h, (size_t)hl);
    c->wp = body - hl;
    c->wleft = (size_t)hl + blen;
    return true;
}

static void conn_send_next(struct conn *c);

static void response_done(struct conn *c)
{
    struct worker *w = c->w;
    uint64_t t = now_ns();
    if (measuring(c->t0)) {
        w->s.done++;
        if (c->status >= 100 && c->status < 600) w->s.status[c->status]++;
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
            if (errno == EAGAIN) return;
            if (errno == EINTR) continue;
            if (measuring(c->t0)) c->w->s.e_write++;
            conn_reopen(c);
            return;
        }
        c->wp += n;
        c->wleft -= (size_t)n;
        if (measuring(c->t0)) c->w->s.bytes_out += (uint64_t)n;
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

static bool hdr_has(const char *v, size_t n, const char *tok)
{
    size_t tl = strlen(tok);
    for (size_t i = 0; i + tl <= n; i++)
        if (strncasecmp(v + i, tok, tl) == 0) return true;
    return false;
}

/* Parse the response headers in rbuf[0..hlen); 0 ok, -1 malformed. */
static int parse_head(struct conn *c, size_t hlen)
{
    const char *p = c->rbuf, *end = c->rbuf + hlen;
    bool chunked = false, have_cl = false;
    uint64_t cl = 0;
    if (hlen < 12 || memcmp(p, "HTTP/1.", 7) != 0 || p[8] != ' ') return -1;
    if (p[9] < '1' || p[9] > '5' || p[10] < '0' || p[10] > '9' || p[11] < '0' || p[11] > '9') return -1;
    c->status = (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
    c->close_after = p[7] == '0';
    const char *line = memchr(p, '\n', (size_t)(end - p));
    while (line != NULL && line + 1 < end) {
        const char *ls = line + 1;
        const char *le = memchr(ls, '\n', (size_t)(end - ls));
        if (le == NULL) le = end;
        size_t ll = (size_t)(le - ls);
        if (ll > 0 && ls[ll - 1] == '\r') ll--;
        const char *colon = memchr(ls, ':', ll);
        if (colon != NULL) {
            size_t nl = (size_t)(colon - ls);
            const char *v = colon + 1;
            size_t vl = ll - nl - 1;
            while (vl > 0 && (*v == ' ' || *v == '\t')) v++, vl--;
            if (nl == 14 && strncasecmp(ls, "content-length", 14) == 0) {
                have_cl = true;
                cl = strtoull(v, NULL, 10);
            } else if (nl == 17 && strncasecmp(ls, "transfer-encoding", 17) == 0) {
                chunked = hdr_has(v, vl, "chunked");
            } else if (nl == 10 && strncasecmp(ls, "connection", 10) == 0) {
                if (hdr_has(v, vl, "close")) c->close_after = true;
                if (hdr_has(v, vl, "keep-alive")) c->close_after = false;
            }
        }
        line = le < end ? le : NULL;
    }
    if (c->status < 200 || c->status == 204 || c->status == 304) {
        if (c->status < 200) return -1; /* no 1xx expected: we never send Expect */
        c->remaining = 0;
        c->rs = R_BODY_CL;
    } else if (chunked) {
        c->rs = R_CHUNK_SIZE;
    } else if (have_cl) {
        c->rs = R_BODY_CL;
        c->remaining = cl;
    } else {
        c->rs = R_UNTIL_CLOSE;
        c->close_after = true;
    }
    return 0;
}

/* Consume what rbuf holds; returns 1 when a response is complete, 0 for more, -1 error. */
static int parse(struct conn *c)
{
    size_t off = 0;
    int ret = 0;
    for (;;) {
        char *p = c->rbuf + off;
        size_t avail = c->rlen - off;
        if (c->rs == R_HDR) {
            char *e = memmem(p, avail, "\r\n\r\n", 4);
            if (e == NULL) {
                if (c->rlen == RBUF) return -1;
                break;
            }
            size_t hl = (size_t)(e - p) + 4;
            if (off != 0) return -1;
            if (parse_head(c, hl) != 0) return -1;
            off += hl;
            if (c->rs == R_BODY_CL && c->remaining == 0) {
                ret = 1;
                break;
            }
        } else if (c->rs == R_BODY_CL || c->rs == R_CHUNK_DATA || c->rs == R_CHUNK_CRLF) {
            size_t take = avail < c->remaining ? avail : (size_t)c->remaining;
            off += take;
            c->remaining -= take;
            if (c->remaining > 0) break;
            if (c->rs == R_BODY_CL) {
                ret = 1;
                break;
            }
            if (c->rs == R_CHUNK_DATA) {
                c->rs = R_CHUNK_CRLF;
                c->remaining = 2;
            } else {
                c->rs = R_CHUNK_SIZE;
            }
        } else if (c->rs == R_CHUNK_SIZE || c->rs == R_TRAILER) {
            char *e = memmem(p, avail, "\r\n", 2);
            if (e == NULL) {
                if (avail > 1024) return -1;
                break;
            }
            size_t ll = (size_t)(e - p);
            off += ll + 2;
            if (c->rs == R_CHUNK_SIZE) {
                char *endp;
                unsigned long long n = strtoull(p, &endp, 16);
                if (endp == p) return -1;
                if (n == 0) {
                    c->rs = R_TRAILER;
                } else {
                    c->rs = R_CHUNK_DATA;
                    c->remaining = n;
                }
            } else if (ll == 0) {
                ret = 1;
                break;
            }
        } else { /* R_UNTIL_CLOSE: everything until EOF */
            off = c->rlen;
            break;
        }
    }
    if (off > 0) {
        memmove(c->rbuf, c->rbuf + off, c->rlen - off);
        c->rlen -= off;
    }
    return ret;
}

static void conn_read(struct conn *c)
{
    for (;;) {
        ssize_t n = read(c->fd, c->rbuf + c->rlen, RBUF - c->rlen);
        if (n < 0) {
            if (errno == EAGAIN) return;
            if (errno == EINTR) continue;
            if (c->busy && measuring(c->t0)) c->w->s.e_read++;
            conn_reopen(c);
            return;
        }
        if (n == 0) {
            if (c->busy && c->rs == R_UNTIL_CLOSE) {
                c->close_after = true;
                response_done(c);
                return;
            }
            if (c->busy && measuring(c->t0)) c->w->s.e_closed++;
            conn_reopen(c);
            return;
        }
        c->rlen += (size_t)n;
        if (!c->busy) {
            c->rlen = 0; /* unsolicited bytes: ignore */
            continue;
        }
        int r = parse(c);
        if (r < 0) {
            if (measuring(c->t0)) c->w->s.e_parse++;
            conn_reopen(c);
            return;
        }
        if (r == 1) {
            if (c->st == C_WRITING) { /* answered before the request was fully sent */
                c->close_after = true;
            }
            response_done(c);
            return; /* the next response will raise a new edge */
        }
    }
}

static void on_event(struct conn *c, uint32_t ev)
{
    if (c->st == C_CONNECTING) {
        if (!(ev & (EPOLLOUT | EPOLLERR | EPOLLHUP))) return;
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
    if (c->st == C_WRITING && (ev & (EPOLLOUT | EPOLLERR | EPOLLHUP))) conn_write(c);
    if (c->fd == fd && c->st != C_CONNECTING && (ev & (EPOLLIN | EPOLLRDHUP | EPOLLERR | EPOLLHUP)))
        conn_read(c);
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct epoll_event evs[256];
    uint64_t last_check = now_ns();
    uint64_t tmo = (uint64_t)(opt.timeout * 1e9);
    for (int i = 0; i < w->nconns; i++) conn_open(&w->conns[i]);
    for (;;) {
        uint64_t t = now_ns();
        if (t >= g_end_ns || g_stop) break;
        if (w->limit != 0 && w->seq >= w->limit) {
            bool any = false;
            for (int i = 0; i < w->nconns; i++) any |= w->conns[i].busy;
            if (!any) break;
        }
        int ms = (int)((g_end_ns - t) / 1000000u);
        if (ms > 100) ms = 100;
        int n = epoll_wait(w->epfd, evs, 256, ms);
        for (int i = 0; i < n; i++) on_event(evs[i].data.ptr, evs[i].events);
        t = now_ns();
        if (t - last_check > 100000000u) {
            last_check = t;
            for (int i = 0; i < w->nconns; i++) {
                struct conn *c = &w->conns[i];
                if (c->busy && t - c->t0 > tmo) {
                    if (measuring(c->t0)) w->s.e_timeout++;
                    conn_reopen(c);
                }
            }
        }
    }
    return NULL;
}

/* --- reporting -------------------------------------------------------------------- */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double pct(const uint64_t *v, size_t n, double p)
{
    if (n == 0) return 0;
    size_t i = (size_t)(p / 100.0 * (double)n);
    if (i >= n) i = n - 1;
    return (double)v[i] / 1e6;
}

static void parse_url(void)
{
    const char *u = opt.url;
    if (strncmp(u, "http://", 7) != 0) die("--url must start with http://");
    u += 7;
    const char *slash = strchr(u, '/');
    size_t hl = slash ? (size_t)(slash - u) : strlen(u);
    if (hl == 0 || hl >= sizeof(host_hdr)) die("bad --url host");
    memcpy(host_hdr, u, hl);
    host_hdr[hl] = '\0';
    snprintf(path, sizeof(path), "%s", slash ? slash : "/");
    char host[300], port[16] = "80";
    snprintf(host, sizeof(host), "%s", host_hdr);
    char *colon = strrchr(host, ':');
    if (host[0] == '[') { /* [v6]:port */
        char *rb = strchr(host, ']');
        if (rb == NULL) die("bad --url host");
        *rb = '\0';
        if (rb[1] == ':') snprintf(port, sizeof(port), "%s", rb + 2);
        memmove(host, host + 1, strlen(host));
    } else if (colon != NULL) {
        *colon = '\0';
        snprintf(port, sizeof(port), "%s", colon + 1);
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0) die("cannot resolve %s: %s", host, gai_strerror(rc));
    memcpy(&addr, res->ai_addr, res->ai_addrlen);
    addr_len = res->ai_addrlen;
    freeaddrinfo(res);
}

static void usage(int code)
{
    fprintf(code ? stderr : stdout,
            "usage: loadgen --url http://HOST:PORT/PATH [--connections 64] [--threads 2]\n"
            "               [--duration 10] [--warmup 0] [--timeout 10] [--requests N]\n"
            "               (--secret S --template FILE [--mode nocmd|cmd] [--body TEXT]\n"
            "                [--event issue_comment] [--id-base N] [--bad-signature] [--full-hmac]\n"
            "                [--gitlab]\n"
            "               | --raw-get)\n"
            "Template placeholders: __COMMENT_ID__ (required; a run-unique integer), __BODY__\n"
            "(JSON-escaped comment text: \"/diverge help\" for --mode cmd, \"LGTM, thanks\" for nocmd).\n");
    exit(code);
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"url", 1, 0, 'u'},        {"connections", 1, 0, 'c'}, {"threads", 1, 0, 't'},
        {"duration", 1, 0, 'd'},   {"warmup", 1, 0, 'W'},      {"timeout", 1, 0, 'T'},
        {"requests", 1, 0, 'n'},   {"secret", 1, 0, 's'},      {"template", 1, 0, 'f'},
        {"mode", 1, 0, 'm'},       {"body", 1, 0, 'b'},        {"event", 1, 0, 'e'},
        {"id-base", 1, 0, 'i'},    {"raw-get", 0, 0, 'g'},     {"bad-signature", 0, 0, 'B'},
        {"full-hmac", 0, 0, 'F'},  {"help", 0, 0, 'h'},        {"gitlab", 0, 0, 'L'},
        {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "u:c:t:d:n:h", lo, NULL)) != -1) {
        switch (ch) {
        case 'u': opt.url = optarg; break;
        case 'c': opt.connections = (int)strtol(optarg, NULL, 10); break;
        case 't': opt.threads = (int)strtol(optarg, NULL, 10); break;
        case 'd': opt.duration = atof(optarg); break;
        case 'W': opt.warmup = atof(optarg); break;
        case 'T': opt.timeout = atof(optarg); break;
        case 'n': opt.requests = strtoull(optarg, NULL, 10); break;
        case 's': opt.secret = optarg; break;
        case 'f': opt.template_path = optarg; break;
        case 'm': opt.mode = optarg; break;
        case 'b': opt.body_text = optarg; break;
        case 'e': opt.event = optarg; break;
        case 'i': opt.id_base = strtoull(optarg, NULL, 10); opt.id_base_set = true; break;
        case 'g': opt.raw_get = true; break;
        case 'B': opt.bad_signature = true; break;
        case 'F': opt.full_hmac = true; break;
        case 'L': opt.gitlab = true; break;
        case 'h': usage(0); break;
        default: usage(2);
        }
    }
    if (opt.url == NULL || optind != argc) usage(2);
    if (opt.threads < 1 || opt.connections < opt.threads) die("need 1 <= threads <= connections");
    if (opt.duration <= 0 && opt.requests == 0) die("--duration must be > 0");
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, on_sigint);
    parse_url();

    {
        uint8_t r[6] = {0};
        FILE *u = fopen("/dev/urandom", "rb");
        if (u == NULL || fread(r, 1, sizeof(r), u) != sizeof(r)) die("cannot read /dev/urandom");
        fclose(u);
        memcpy(&nonce32, r, 4);
        memcpy(&nonce16, r + 4, 2);
    }
    if (!opt.id_base_set) { /* microseconds since the epoch: later runs start above earlier ids */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        opt.id_base = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
    }

    if (opt.raw_get) {
        raw_req_len = (size_t)snprintf(raw_req, sizeof(raw_req),
                                       "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, host_hdr);
    } else {
        if (opt.secret == NULL || opt.template_path == NULL)
            die("--secret and --template are required (or --raw-get)");
        if (opt.mode == NULL) opt.mode = "nocmd";
        if (opt.body_text == NULL) {
            if (strcmp(opt.mode, "cmd") == 0) opt.body_text = "/diverge help";
            else if (strcmp(opt.mode, "nocmd") == 0) opt.body_text = "LGTM, thanks";
            else die("--mode is nocmd or cmd");
        }
        json_escape(opt.body_text);
        load_template();
        hmac_setup();
        hdr_const_len = (size_t)snprintf(hdr_const, sizeof(hdr_const),
                                         "POST %s HTTP/1.1\r\nHost: %s\r\n"
                                         "User-Agent: GitHub-Hookshot/loadgen\r\n"
                                         "Accept: */*\r\nContent-Type: application/json\r\n"
                                         "%s: %s\r\n",
                                         path, host_hdr, opt.gitlab ? "X-Gitlab-Event" : "X-GitHub-Event",
                                         opt.gitlab && strcmp(opt.event, "issue_comment") == 0
                                             ? "Note Hook" : opt.event);
        if (hdr_const_len > HDR_ROOM - 300) die("URL or event too long");
    }

    struct worker *ws = calloc((size_t)opt.threads, sizeof(*ws));
    for (int i = 0; i < opt.threads; i++) {
        struct worker *w = &ws[i];
        w->idx = i;
        w->nconns = opt.connections / opt.threads + (i < opt.connections % opt.threads);
        w->conns = calloc((size_t)w->nconns, sizeof(*w->conns));
        if (opt.requests)
            w->limit = opt.requests / (uint64_t)opt.threads + ((uint64_t)i < opt.requests % (uint64_t)opt.threads);
        w->epfd = epoll_create1(EPOLL_CLOEXEC);
        if (w->epfd < 0) die("epoll_create1: %s", strerror(errno));
        for (int j = 0; j < w->nconns; j++) {
            struct conn *c = &w->conns[j];
            c->w = w;
            c->fd = -1;
            if (!opt.raw_get) {
                c->buf = malloc(HDR_ROOM + body_max + 64);
                if (c->buf == NULL) die("out of memory");
                memcpy(c->buf + HDR_ROOM, tmpl, const_prefix);
            }
        }
    }
    if (!opt.raw_get && !opt.gitlab) { /* check the midstate HMAC against OpenSSL's one-shot HMAC() */
        struct worker tw = {.idx = 0};
        struct conn tc = {.w = &tw, .buf = ws[0].conns[0].buf};
        build_request(&tc);
        const char *body = strstr(tc.wp, "\r\n\r\n") + 4;
        size_t blen = tc.wleft - (size_t)(body - tc.wp);
        uint8_t d[32];
        unsigned int dl = 32;
        char want[65], *got = strstr(tc.wp, "sha256=") + 7;
        HMAC(EVP_sha256(), opt.secret, (int)strlen(opt.secret), (const uint8_t *)body, blen, d, &dl);
        for (int i = 0; i < 32; i++) {
            want[2 * i] = hexd[d[i] >> 4];
            want[2 * i + 1] = hexd[d[i] & 15];
        }
        if ((memcmp(want, got, 64) != 0) != opt.bad_signature) die("HMAC self-check failed");
        fprintf(stderr, "loadgen: body %zu bytes (%zu constant-prefix bytes pre-hashed); "
                        "first comment id %" PRIu64 "\n",
                blen, mid_aligned, opt.id_base);
    }

    struct rusage ru0, ru1;
    getrusage(RUSAGE_SELF, &ru0);
    g_start_ns = now_ns();
    g_measure_ns = g_start_ns + (uint64_t)(opt.warmup * 1e9);
    g_end_ns = g_measure_ns + (uint64_t)((opt.duration > 0 ? opt.duration : 1e6) * 1e9);
    for (int i = 0; i < opt.threads; i++)
        if (pthread_create(&ws[i].th, NULL, worker_main, &ws[i]) != 0) die("pthread_create failed");
    for (int i = 0; i < opt.threads; i++) pthread_join(ws[i].th, NULL);
    uint64_t t_end = now_ns();
    getrusage(RUSAGE_SELF, &ru1);

    struct stats tot = {0};
    for (int i = 0; i < opt.threads; i++) {
        struct stats *s = &ws[i].s;
        tot.done += s->done;
        tot.bytes_out += s->bytes_out;
        for (int k = 0; k < 600; k++) tot.status[k] += s->status[k];
        tot.e_connect += s->e_connect;
        tot.e_read += s->e_read;
        tot.e_write += s->e_write;
        tot.e_timeout += s->e_timeout;
        tot.e_closed += s->e_closed;
        tot.e_parse += s->e_parse;
        tot.reconnects += s->reconnects;
        tot.nlat += s->nlat;
    }
    uint64_t *lat = malloc((tot.nlat + 1) * sizeof(*lat));
    size_t k = 0;
    double sum = 0;
    for (int i = 0; i < opt.threads; i++) {
        memcpy(lat + k, ws[i].s.lat, ws[i].s.nlat * sizeof(*lat));
        k += ws[i].s.nlat;
    }
    qsort(lat, tot.nlat, sizeof(*lat), cmp_u64);
    for (size_t i = 0; i < tot.nlat; i++) sum += (double)lat[i];
    double secs = (double)(t_end - (g_measure_ns < t_end ? g_measure_ns : g_start_ns)) / 1e9;
    double rps = (double)tot.done / secs;
    double mean = tot.nlat ? sum / (double)tot.nlat / 1e6 : 0;
    double cpu = (double)(ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec) +
                 (double)(ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec) / 1e6;
    double sys = (double)(ru1.ru_stime.tv_sec - ru0.ru_stime.tv_sec) +
                 (double)(ru1.ru_stime.tv_usec - ru0.ru_stime.tv_usec) / 1e6;
    double total_secs = (double)(t_end - g_start_ns) / 1e9;
    uint64_t all_started = 0;
    for (int i = 0; i < opt.threads; i++) all_started += ws[i].seq;
    uint64_t non2xx = 0;
    for (int s = 0; s < 600; s++)
        if (s < 200 || s > 299) non2xx += tot.status[s];
    uint64_t errors = tot.e_connect + tot.e_read + tot.e_write + tot.e_timeout + tot.e_closed + tot.e_parse;

    printf("loadgen: %s %s  mode=%s  %d connections, %d threads, %.1f s (+%.1f s warm-up)\n",
           opt.raw_get ? "GET" : "POST", opt.url, opt.raw_get ? "raw-get" : opt.mode,
           opt.connections, opt.threads, opt.duration, opt.warmup);
    printf("  requests   %" PRIu64 " in %.2f s, %.1f MB sent\n", tot.done, secs,
           (double)tot.bytes_out / 1e6);
    printf("  req/s      %.1f\n", rps);
    printf("  latency    mean %.3f ms  p50 %.3f  p90 %.3f  p99 %.3f  p99.9 %.3f  max %.3f ms\n", mean,
           pct(lat, tot.nlat, 50), pct(lat, tot.nlat, 90), pct(lat, tot.nlat, 99),
           pct(lat, tot.nlat, 99.9), tot.nlat ? (double)lat[tot.nlat - 1] / 1e6 : 0.0);
    printf("  status    ");
    for (int s = 0; s < 600; s++)
        if (tot.status[s]) printf(" %d: %" PRIu64, s, tot.status[s]);
    printf("\n  errors     connect %" PRIu64 ", read %" PRIu64 ", write %" PRIu64 ", timeout %" PRIu64
           ", closed %" PRIu64 ", parse %" PRIu64 "; reconnects %" PRIu64 "\n",
           tot.e_connect, tot.e_read, tot.e_write, tot.e_timeout, tot.e_closed, tot.e_parse,
           tot.reconnects);
    printf("  loadgen CPU user %.2f s + sys %.2f s = %.0f%% of one core over %.1f s; %.2f us/request\n",
           cpu, sys, 100 * (cpu + sys) / total_secs, total_secs,
           all_started ? 1e6 * (cpu + sys) / (double)all_started : 0.0);
    printf("RESULT mode=%s requests=%" PRIu64 " seconds=%.3f rps=%.1f p50_ms=%.3f p90_ms=%.3f "
           "p99_ms=%.3f max_ms=%.3f non2xx=%" PRIu64 " errors=%" PRIu64 " cpu_us_per_req=%.2f cpu_s=%.3f",
           opt.raw_get ? "raw-get" : opt.mode, tot.done, secs, rps, pct(lat, tot.nlat, 50),
           pct(lat, tot.nlat, 90), pct(lat, tot.nlat, 99),
           tot.nlat ? (double)lat[tot.nlat - 1] / 1e6 : 0.0, non2xx, errors,
           all_started ? 1e6 * (cpu + sys) / (double)all_started : 0.0, cpu + sys);
    for (int s = 0; s < 600; s++)
        if (tot.status[s]) printf(" s%d=%" PRIu64, s, tot.status[s]);
    printf("\n");
    return 0;
}
