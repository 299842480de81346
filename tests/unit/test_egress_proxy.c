/* SPDX-License-Identifier: Apache-2.0 */
/* egress proxy and relay over real sockets, loopback only: every listener is on
 * 127.0.0.1:0, every allow rule is 127.0.0.1:PORT, names are only `localhost` (denied
 * before any lookup) or resolved by a test resolver that answers 127.0.0.1. So even a
 * broken proxy cannot send a packet off this host. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "egress/egress.h"
#include "tests/t_check.h"

/* A loopback echo server: accepts, echoes until EOF, closes; counts connections. */
struct echo {
    int fd;
    uint16_t port;
    pthread_t thread;
    pthread_mutex_t mu;
    int accepted; /* guarded by mu */
};

static int listen_loopback(uint16_t *port_out)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = 0};
    socklen_t sl = sizeof(sin);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sin, sizeof(sin)) != 0 || listen(fd, 16) != 0 ||
        getsockname(fd, (struct sockaddr *)&sin, &sl) != 0) {
        return -1;
    }
    *port_out = ntohs(sin.sin_port);
    return fd;
}

static void *echo_main(void *arg)
{
    struct echo *e = arg;
    int c;

    while ((c = accept(e->fd, NULL, NULL)) >= 0) {
        char buf[4096];
        ssize_t n;
        pthread_mutex_lock(&e->mu);
        e->accepted++;
        pthread_mutex_unlock(&e->mu);
        while ((n = recv(c, buf, sizeof(buf), 0)) > 0) {
            if (send(c, buf, (size_t)n, MSG_NOSIGNAL) != n) {
                break;
            }
        }
        close(c);
    }
    return NULL;
}

static void echo_start(struct echo *e)
{
    memset(e, 0, sizeof(*e));
    pthread_mutex_init(&e->mu, NULL);
    e->fd = listen_loopback(&e->port);
    ASSERT(e->fd >= 0);
    ASSERT(pthread_create(&e->thread, NULL, echo_main, e) == 0);
}

static int echo_accepted(struct echo *e)
{
    int n;

    pthread_mutex_lock(&e->mu);
    n = e->accepted;
    pthread_mutex_unlock(&e->mu);
    return n;
}

static void echo_stop(struct echo *e)
{
    shutdown(e->fd, SHUT_RDWR); /* wakes accept() */
    pthread_join(e->thread, NULL);
    close(e->fd);
    pthread_mutex_destroy(&e->mu);
}

/* Log lines collected from the proxy's threads. */
static struct {
    pthread_mutex_t mu;
    char lines[32][EGRESS_LINE_MAX];
    int n;
} g_log = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void log_cb(const struct egress_event *ev, void *userdata)
{
    (void)userdata;
    pthread_mutex_lock(&g_log.mu);
    if (g_log.n < 32) {
        snprintf(g_log.lines[g_log.n++], EGRESS_LINE_MAX, "%s", ev->body);
    }
    pthread_mutex_unlock(&g_log.mu);
}

static bool log_has(const char *want)
{
    bool found = false;

    pthread_mutex_lock(&g_log.mu);
    for (int i = 0; i < g_log.n; i++) {
        found = found || strcmp(g_log.lines[i], want) == 0;
    }
    pthread_mutex_unlock(&g_log.mu);
    if (!found) {
        fprintf(stderr, "missing log line: %s\n", want);
    }
    return found;
}

static void log_reset(void)
{
    pthread_mutex_lock(&g_log.mu);
    g_log.n = 0;
    pthread_mutex_unlock(&g_log.mu);
}

static atomic_int g_lookups; /* names the proxy asked the resolver for */

/* Answers 127.0.0.1 for every name: a broken policy could only reach loopback. */
static int resolve_loopback(struct egress_addr *out, size_t max, size_t *n_out, const char *host,
                            void *userdata)
{
    (void)host;
    (void)userdata;
    atomic_fetch_add(&g_lookups, 1);
    *n_out = 0;
    if (max > 0 && egress_addr_parse(&out[0], "127.0.0.1") == E_OK) {
        *n_out = 1;
    }
    return E_OK;
}

struct fixture {
    char dir[64];
    char sock[128];
    struct egress_proxy *proxy;
    struct echo echo;
};

static void fixture_open(struct fixture *f, unsigned max_tunnels, int header_timeout_ms)
{
    struct egress_proxy_opts o = EGRESS_PROXY_OPTS_DEFAULTS;
    struct egress_policy *pol;
    char rule[64];
    struct err e;

    log_reset();
    echo_start(&f->echo);
    snprintf(f->dir, sizeof(f->dir), "/tmp/egress-test-XXXXXX");
    ASSERT(mkdtemp(f->dir) != NULL);
    snprintf(f->sock, sizeof(f->sock), "%s/proxy.sock", f->dir);
    egress_policy_new(&pol);
    snprintf(rule, sizeof(rule), "127.0.0.1:%u", (unsigned)f->echo.port);
    CHECK_OK(egress_policy_add_rule(pol, rule, EGRESS_ORIGIN_SERVER, NULL));
    snprintf(rule, sizeof(rule), "rebind.test:%u", (unsigned)f->echo.port);
    CHECK_OK(egress_policy_add_rule(pol, rule, EGRESS_ORIGIN_SERVER, NULL));
    o.socket_path = f->sock;
    o.policy = pol;
    o.log = log_cb;
    o.max_tunnels = max_tunnels;
    o.header_timeout_ms = header_timeout_ms;
    o.resolve = resolve_loopback;
    if (egress_proxy_open(&f->proxy, &o, &e) != E_OK) {
        t_fail(__FILE__, __LINE__, "proxy open: %s", e.msg);
    }
    egress_policy_free(pol); /* the proxy keeps its own copy */
}

static void fixture_close(struct fixture *f)
{
    struct stat st;

    egress_proxy_stop(f->proxy);
    CHECK(lstat(f->sock, &st) != 0); /* the socket is removed */
    rmdir(f->dir);
    echo_stop(&f->echo);
}

static void set_timeout(int fd)
{
    /* A hang guard only (a broken proxy must fail the test, not stall ctest). */
    struct timeval tv = {.tv_sec = 30, .tv_usec = 0};

    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

static int dial_unix(const char *path)
{
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", path);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sun, sizeof(sun)) != 0) {
        return -1;
    }
    set_timeout(fd);
    return fd;
}

static void send_str(int fd, const char *s)
{
    CHECK_EQ_INT(send(fd, s, strlen(s), MSG_NOSIGNAL), strlen(s));
}

/* Reads a response head (up to CRLFCRLF, byte by byte so nothing after it is consumed). */
static void read_head(int fd, char *out, size_t cap)
{
    size_t n = 0;

    out[0] = '\0';
    while (n + 1 < cap && recv(fd, out + n, 1, 0) == 1) {
        n++;
        out[n] = '\0';
        if (n >= 4 && memcmp(out + n - 4, "\r\n\r\n", 4) == 0) {
            break;
        }
    }
}

/* Reads exactly N bytes (or until EOF) into OUT (N + 1 bytes). */
static size_t read_n(int fd, char *out, size_t n)
{
    size_t got = 0;
    ssize_t r;

    while (got < n && (r = recv(fd, out + got, n - got, 0)) > 0) {
        got += (size_t)r;
    }
    out[got] = '\0';
    return got;
}

static bool at_eof(int fd)
{
    char c;

    return recv(fd, &c, 1, 0) == 0;
}

/* Sends REQ on a new connection and returns the response head. */
static void request(const struct fixture *f, const char *req, char *head, size_t cap)
{
    int fd = dial_unix(f->sock);

    CHECK(fd >= 0);
    send_str(fd, req);
    read_head(fd, head, cap);
    close(fd);
}

TEST(proxy_tunnel_relays_and_logs)
{
    struct fixture f;
    char req[128], head[512], buf[64], line[EGRESS_LINE_MAX];
    int fd;

    fixture_open(&f, 4, 10000);
    fd = dial_unix(f.sock);
    CHECK(fd >= 0);
    /* Bytes sent with the head (a ClientHello, say) reach the remote first. */
    snprintf(req, sizeof(req), "CONNECT 127.0.0.1:%u HTTP/1.1\r\nHost: x\r\n\r\nearly",
             (unsigned)f.echo.port);
    send_str(fd, req);
    read_head(fd, head, sizeof(head));
    CHECK_EQ_STR(head, "HTTP/1.1 200 Connection established\r\n\r\n");
    CHECK_EQ_INT(read_n(fd, buf, 5), 5);
    CHECK_EQ_STR(buf, "early");
    send_str(fd, "ping-pong");
    CHECK_EQ_INT(read_n(fd, buf, 9), 9);
    CHECK_EQ_STR(buf, "ping-pong");
    shutdown(fd, SHUT_WR); /* the half-close travels on; the echo server closes; EOF back */
    CHECK(at_eof(fd));
    close(fd);
    fixture_close(&f); /* joins every thread: the close line is in */
    snprintf(line, sizeof(line), "egress 127.0.0.1:%u allowed rule=127.0.0.1:%u",
             (unsigned)f.echo.port, (unsigned)f.echo.port);
    CHECK(log_has(line));
    snprintf(line, sizeof(line),
             "egress 127.0.0.1:%u allowed rule=127.0.0.1:%u closed bytes_out=14 bytes_in=14",
             (unsigned)f.echo.port, (unsigned)f.echo.port);
    CHECK(log_has(line));
}

TEST(proxy_denies_other_loopback_port)
{
    struct fixture f;
    char req[128], head[512], line[EGRESS_LINE_MAX];
    uint16_t port;
    int other = listen_loopback(&port), c;

    CHECK(other >= 0);
    fixture_open(&f, 4, 10000);
    snprintf(req, sizeof(req), "CONNECT 127.0.0.1:%u HTTP/1.1\r\n\r\n", (unsigned)port);
    request(&f, req, head, sizeof(head));
    CHECK(strncmp(head, "HTTP/1.1 403 Forbidden\r\n", 24) == 0);
    CHECK(strstr(head, "\r\nX-Proxy-Error: blocked-by-allowlist\r\n") != NULL);
    /* Had the proxy connected, the connection would sit in the backlog by now. */
    CHECK(fcntl(other, F_SETFL, O_NONBLOCK) == 0);
    c = accept(other, NULL, NULL);
    CHECK(c < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
    close(other);
    fixture_close(&f);
    snprintf(line, sizeof(line), "egress 127.0.0.1:%u denied reason=blocked-by-allowlist",
             (unsigned)port);
    CHECK(log_has(line));
}

TEST(proxy_denies_names)
{
    struct fixture f;
    char req[128], head[512], line[EGRESS_LINE_MAX];

    fixture_open(&f, 4, 10000);
    /* localhost is not implied by 127.0.0.1:PORT (and is never looked up). */
    snprintf(req, sizeof(req), "CONNECT localhost:%u HTTP/1.1\r\n\r\n", (unsigned)f.echo.port);
    request(&f, req, head, sizeof(head));
    CHECK(strncmp(head, "HTTP/1.1 403 Forbidden\r\n", 24) == 0);
    CHECK(strstr(head, "X-Proxy-Error: blocked-by-allowlist\r\n") != NULL);
    /* An allowed name whose answer is loopback: refused after the proxy's own lookup. */
    snprintf(req, sizeof(req), "CONNECT rebind.test:%u HTTP/1.1\r\n\r\n", (unsigned)f.echo.port);
    request(&f, req, head, sizeof(head));
    CHECK(strncmp(head, "HTTP/1.1 403 Forbidden\r\n", 24) == 0);
    CHECK(strstr(head, "X-Proxy-Error: loopback-address\r\n") != NULL);
    CHECK_EQ_INT(echo_accepted(&f.echo), 0);
    fixture_close(&f);
    snprintf(line, sizeof(line),
             "egress rebind.test:%u denied reason=loopback-address "
             "rule=rebind.test:%u",
             (unsigned)f.echo.port, (unsigned)f.echo.port);
    CHECK(log_has(line));
}

/* A name outside the allowlist is refused before any lookup: an unresolvable `.invalid`
 * name, `localhost`, a suffix rule's apex, a name that differs only by a trailing dot or
 * case from nothing listed. The listed name is looked up (the counter works). */
TEST(proxy_never_resolves_unlisted_names)
{
    static const char *const unlisted[] = {"nowhere.invalid:443", "NOWHERE.invalid.:443",
                                           "localhost:443", "test:443", "x.rebind.test:443"};
    struct fixture f;
    char req[128], head[512];

    /* Six requests one after another: a worker that answered may not have given its slot
     * back yet when the next comes (slow under TSan), so more slots than requests, or the
     * last could meet a 503 too-many-tunnels instead of the 403 under test. */
    fixture_open(&f, 16, 10000);
    atomic_store(&g_lookups, 0);
    for (size_t i = 0; i < sizeof(unlisted) / sizeof(unlisted[0]); i++) {
        snprintf(req, sizeof(req), "CONNECT %s HTTP/1.1\r\n\r\n", unlisted[i]);
        request(&f, req, head, sizeof(head));
        CHECK(strncmp(head, "HTTP/1.1 403 Forbidden\r\n", 24) == 0);
        CHECK(strstr(head, "X-Proxy-Error: blocked-by-allowlist\r\n") != NULL);
    }
    CHECK_EQ_INT(atomic_load(&g_lookups), 0);
    snprintf(req, sizeof(req), "CONNECT rebind.test:%u HTTP/1.1\r\n\r\n", (unsigned)f.echo.port);
    request(&f, req, head, sizeof(head));
    CHECK_EQ_INT(atomic_load(&g_lookups), 1);
    CHECK_EQ_INT(echo_accepted(&f.echo), 0);
    fixture_close(&f);
    CHECK(log_has("egress nowhere.invalid:443 denied reason=blocked-by-allowlist"));
}

TEST(proxy_refuses_bad_requests)
{
    struct fixture f;
    char head[512], *big;
    int fd;

    fixture_open(&f, 4, 10000);
    request(&f, "GET http://127.0.0.1/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", head, sizeof(head));
    CHECK(strncmp(head, "HTTP/1.1 405 Method Not Allowed\r\n", 33) == 0);
    CHECK(strstr(head, "X-Proxy-Error: method-not-allowed\r\n") != NULL);
    request(&f, "CONNECT 127.0.0.1 HTTP/1.1\r\n\r\n", head, sizeof(head));
    CHECK(strncmp(head, "HTTP/1.1 400 Bad Request\r\n", 26) == 0);
    /* One byte past the head cap, still no blank line: 431. */
    big = xmalloc(EGRESS_HEADER_MAX + 1);
    memcpy(big, "CONNECT 127.0.0.1:1 HTTP/1.1\r\nX: ", 33);
    memset(big + 33, 'a', EGRESS_HEADER_MAX + 1 - 33);
    fd = dial_unix(f.sock);
    CHECK_EQ_INT(send(fd, big, EGRESS_HEADER_MAX + 1, MSG_NOSIGNAL), EGRESS_HEADER_MAX + 1);
    read_head(fd, head, sizeof(head));
    CHECK(strncmp(head, "HTTP/1.1 431 ", 13) == 0);
    close(fd);
    free(big);
    CHECK_EQ_INT(echo_accepted(&f.echo), 0);
    fixture_close(&f);
    CHECK(log_has("egress - denied reason=method-not-allowed"));
    CHECK(log_has("egress - denied reason=header-too-large"));
}

TEST(proxy_header_deadline)
{
    struct fixture f;
    char head[512];

    fixture_open(&f, 4, 50);
    request(&f, "CONNECT 127.0.0.1:1 HTTP/1.1\r\n", head, sizeof(head));
    CHECK(strncmp(head, "HTTP/1.1 408 ", 13) == 0);
    fixture_close(&f);
}

TEST(proxy_tunnel_cap_and_stop)
{
    struct fixture f;
    char req[128], head[512];
    int first, second;

    fixture_open(&f, 1, 10000);
    first = dial_unix(f.sock);
    snprintf(req, sizeof(req), "CONNECT 127.0.0.1:%u HTTP/1.1\r\n\r\n", (unsigned)f.echo.port);
    send_str(first, req);
    read_head(first, head, sizeof(head));
    CHECK_EQ_STR(head, "HTTP/1.1 200 Connection established\r\n\r\n");
    /* The refusal comes at accept, before any request is read (sending could hit EPIPE). */
    second = dial_unix(f.sock);
    read_head(second, head, sizeof(head));
    close(second);
    CHECK(strncmp(head, "HTTP/1.1 503 ", 13) == 0);
    CHECK(strstr(head, "X-Proxy-Error: too-many-tunnels\r\n") != NULL);
    /* Stop with the tunnel still open: it ends, the threads are joined. */
    fixture_close(&f);
    CHECK(at_eof(first));
    close(first);
}

TEST(proxy_socket_path_conflict)
{
    struct egress_proxy_opts o = EGRESS_PROXY_OPTS_DEFAULTS;
    struct egress_proxy *p = NULL;
    struct egress_policy *pol;
    char dir[] = "/tmp/egress-test-XXXXXX", path[64];
    FILE *fp;

    ASSERT(mkdtemp(dir) != NULL);
    snprintf(path, sizeof(path), "%s/file", dir);
    fp = fopen(path, "w");
    ASSERT(fp != NULL);
    fclose(fp);
    egress_policy_new(&pol);
    o.socket_path = path;
    o.policy = pol;
    CHECK_EQ_INT(egress_proxy_open(&p, &o, NULL), E_CONFLICT);
    CHECK(p == NULL);
    o.socket_path = NULL;
    CHECK_EQ_INT(egress_proxy_open(&p, &o, NULL), E_INVALID);
    egress_policy_free(pol);
    unlink(path);
    rmdir(dir);
}

static void *relay_main(void *arg)
{
    struct egress_relay *r = arg;

    CHECK_OK(egress_relay_run(r, NULL));
    return NULL;
}

static int dial_tcp(uint16_t port)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sin, sizeof(sin)) != 0) {
        return -1;
    }
    set_timeout(fd);
    return fd;
}

TEST(relay_to_proxy_to_echo)
{
    struct fixture f;
    struct egress_relay *r = NULL;
    pthread_t t;
    char req[128], head[512], buf[16];
    int fd, held;

    fixture_open(&f, 4, 10000);
    CHECK_OK(egress_relay_open(&r, "127.0.0.1", 0, f.sock, NULL));
    CHECK(egress_relay_port(r) != 0);
    ASSERT(pthread_create(&t, NULL, relay_main, r) == 0);
    snprintf(req, sizeof(req), "CONNECT 127.0.0.1:%u HTTP/1.1\r\n\r\n", (unsigned)f.echo.port);
    fd = dial_tcp(egress_relay_port(r));
    CHECK(fd >= 0);
    send_str(fd, req);
    read_head(fd, head, sizeof(head));
    CHECK_EQ_STR(head, "HTTP/1.1 200 Connection established\r\n\r\n");
    send_str(fd, "via-relay");
    CHECK_EQ_INT(read_n(fd, buf, 9), 9);
    CHECK_EQ_STR(buf, "via-relay");
    shutdown(fd, SHUT_WR);
    CHECK(at_eof(fd));
    close(fd);
    /* A denial comes back through the relay unchanged. */
    fd = dial_tcp(egress_relay_port(r));
    send_str(fd, "CONNECT localhost:1 HTTP/1.1\r\n\r\n");
    read_head(fd, head, sizeof(head));
    CHECK(strncmp(head, "HTTP/1.1 403 Forbidden\r\n", 24) == 0);
    close(fd);
    /* Stop with a relayed connection still open. */
    held = dial_tcp(egress_relay_port(r));
    send_str(held, req);
    read_head(held, head, sizeof(head));
    egress_relay_stop(r);
    pthread_join(t, NULL);
    CHECK(at_eof(held));
    close(held);
    egress_relay_free(r);
    CHECK_EQ_INT(egress_relay_open(&r, "localhost", 0, f.sock, NULL), E_INVALID);
    fixture_close(&f);
}

T_MAIN
