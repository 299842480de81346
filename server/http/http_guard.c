/* SPDX-License-Identifier: Apache-2.0 */
/* Connection admission and deadlines for the HTTP listeners. libmicrohttpd gives every
 * connection a thread and has only an idle timeout, so slow clients are bounded here:
 * - deadlines: a request head must be complete HTTP_GUARD_HEAD_MS after the connection
 *   started (or its previous response ended), the whole request within the request
 *   deadline; a reaper thread shuts down the socket of a connection past either. A
 *   connection whose request is complete (handler running, response or stream being
 *   sent) is never cut.
 * - limits: the general pool has a total, a per-address and a per-prefix (IPv4 /24,
 *   IPv6 /64) cap. A connection over any of them goes to a small reserve pool, which
 *   serves only the health and meter routes (http_guard_head) and must send its whole
 *   request within the head deadline. A full reserve makes room by shutting down an
 *   incomplete reserve connection from the prefix, then the address, holding the most
 *   reserve slots (the oldest of them), so flooding sources evict each other first; it
 *   does so only for a newcomer whose prefix, then address, holds fewer reserve slots
 *   than that one's (a source never pushes out its own).
 * A connection the limits would refuse is refused in libmicrohttpd's accept policy
 * callback, before a thread is made for it (under a flood, threads of connections shut down
 * at once were most of the listener's work); the decision is made again, authoritatively,
 * when the connection is tracked. Every connection is tracked from
 * MHD_OPTION_NOTIFY_CONNECTION until it is closed. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "server/http/http_int.h"

enum guard_pool {
    POOL_LOCAL,   /* a unix socket peer: no address limits */
    POOL_GENERAL, /* within the general limits */
    POOL_RESERVE, /* over them: health and meter routes only */
    POOL_NONE,    /* refused or evicted: shut down, waiting for MHD to close it */
};

struct guard_conn {
    int fd;                         /* the connection's socket, owned by MHD */
    _Atomic int pool;               /* enum guard_pool; changed under g->mu */
    unsigned char addr[16];         /* client address (IPv4 in the first 4 bytes) */
    unsigned char prefix[16];       /* its /24 or /64, the rest zero */
    int family;                     /* AF_INET, AF_INET6, or another (local) */
    _Atomic int64_t since_ns;       /* monotonic start of the request being received */
    atomic_bool head_done;          /* the request head is in: the request deadline applies */
    atomic_bool answering;          /* request complete: exempt from the deadlines */
    bool reaped;                    /* shut down once already (under g->mu) */
    int unix_sock;                  /* 1: accepted on a unix socket, 0: not, -1: unknown */
    struct guard_conn *prev, *next; /* list under g->mu */
};

struct http_guard {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    bool running;                  /* the reaper thread was started */
    bool stop;                     /* under mu */
    struct http_guard_limits lim;  /* deadlines and caps */
    struct guard_conn *head;       /* tracked connections, under mu */
    struct guard_conn **scratch;   /* owned; lim.reserve_max entries, under mu */
    int n_general, n_reserve;      /* connections in those pools, under mu */
    int n_ip;                      /* tracked TCP connections, refused ones included, under mu */
    atomic_llong reaped;           /* connections cut for a deadline so far */
    atomic_llong refused, evicted; /* over every limit / pushed out of the reserve */
};

/* The deadline of C at NOW (nanoseconds since its request began), or 0 for none. */
static int64_t deadline_ns(const struct http_guard *g, const struct guard_conn *c)
{
    int64_t head = g->lim.head_ms * 1000000, whole = g->lim.request_ms * 1000000;

    if (atomic_load(&c->answering)) {
        return 0;
    }
    if (c->pool == POOL_RESERVE || !atomic_load(&c->head_done)) {
        return head < whole ? head : whole;
    }
    return whole;
}

/* Shuts down C's socket (under g->mu). The fd is still the connection's: NOTIFY_CLOSED
 * removes the entry under this mutex before MHD closes the socket. MHD's thread sees EOF
 * and cleans up. */
static void cut(struct guard_conn *c)
{
    if (!c->reaped && c->fd >= 0) {
        (void)shutdown(c->fd, SHUT_RDWR);
    }
    c->reaped = true;
}

static void *reaper(void *cls)
{
    struct http_guard *g = cls;
    int64_t shortest = g->lim.head_ms < g->lim.request_ms ? g->lim.head_ms : g->lim.request_ms;
    /* Check a few times per deadline, at least once a second. */
    int64_t tick_ns = shortest * 1000000 / 4 < 1000000000 ? shortest * 1000000 / 4 : 1000000000;

    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        int64_t now = clock_mono_ns();
        struct timespec ts;

        for (struct guard_conn *c = g->head; c != NULL; c = c->next) {
            int64_t d = deadline_ns(g, c);
            if (c->reaped || d == 0 || now - atomic_load(&c->since_ns) <= d) {
                continue;
            }
            cut(c);
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

int http_guard_new(struct http_guard **out, const struct http_guard_limits *lim, struct err *err)
{
    struct http_guard *g = xcalloc(1, sizeof(*g));

    *out = NULL;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->lim = *lim;
    g->scratch =
        xcalloc((size_t)(lim->reserve_max > 0 ? lim->reserve_max : 1), sizeof(*g->scratch));
    atomic_init(&g->reaped, 0);
    atomic_init(&g->refused, 0);
    atomic_init(&g->evicted, 0);
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
    free(g->scratch);
    free(g);
}

long long http_guard_reaped(struct http_guard *g)
{
    return g != NULL ? atomic_load(&g->reaped) : 0;
}

long long http_guard_refused(struct http_guard *g)
{
    return g != NULL ? atomic_load(&g->refused) + atomic_load(&g->evicted) : 0;
}

/* Fills C's family, address and prefix from the client address SA (may be NULL). */
static void address_from(struct guard_conn *c, const struct sockaddr *sa)
{
    c->family = sa != NULL ? sa->sa_family : AF_UNSPEC;
    if (c->family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)sa;
        memcpy(c->addr, &in->sin_addr, 4);
        memcpy(c->prefix, c->addr, 3); /* /24 */
    } else if (c->family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)(const void *)sa;
        memcpy(c->addr, &in6->sin6_addr, 16);
        memcpy(c->prefix, c->addr, 8); /* /64 */
    }
}

static bool same(const unsigned char a[16], const unsigned char b[16], int fa, int fb)
{
    return fa == fb && memcmp(a, b, 16) == 0;
}

/* Connections of POOL from C's address and from C's prefix (under g->mu). */
static void count_like(int *addr_out, int *prefix_out, const struct http_guard *g,
                       const struct guard_conn *c, enum guard_pool pool)
{
    *addr_out = 0;
    *prefix_out = 0;
    for (const struct guard_conn *o = g->head; o != NULL; o = o->next) {
        if (o == c || o->pool != (int)pool) {
            continue;
        }
        *addr_out += same(o->addr, c->addr, o->family, c->family);
        *prefix_out += same(o->prefix, c->prefix, o->family, c->family);
    }
}

/* Reserve connections among the N of R (the reserve) that share C's prefix and address. */
static void count_reserve(int *addr_out, int *prefix_out, struct guard_conn *const *r, int n,
                          const struct guard_conn *c)
{
    *addr_out = 0;
    *prefix_out = 0;
    for (int i = 0; i < n; i++) {
        *addr_out += same(r[i]->addr, c->addr, r[i]->family, c->family);
        *prefix_out += same(r[i]->prefix, c->prefix, r[i]->family, c->family);
    }
}

/* The reserve connection a full reserve drops first: an incomplete one from the prefix
 * holding the most reserve slots, then the address, then the oldest; NULL when every
 * reserve connection is being answered. Gathers the reserve into g->scratch (*N_OUT
 * entries) and sets *PREFIX_OUT and *ADDR_OUT to the victim's slot counts (under g->mu). */
static struct guard_conn *pick_victim(struct http_guard *g, int *n_out, int *prefix_out,
                                      int *addr_out)
{
    struct guard_conn *victim = NULL;
    int n = 0;

    *prefix_out = -1;
    *addr_out = -1;
    for (struct guard_conn *c = g->head; c != NULL && n < g->lim.reserve_max; c = c->next) {
        if (c->pool == POOL_RESERVE) {
            g->scratch[n++] = c;
        }
    }
    for (int i = 0; i < n; i++) {
        struct guard_conn *c = g->scratch[i];
        int in_addr, in_prefix;
        if (c->reaped || atomic_load(&c->answering)) {
            continue;
        }
        count_reserve(&in_addr, &in_prefix, g->scratch, n, c);
        if (in_prefix > *prefix_out || (in_prefix == *prefix_out && in_addr > *addr_out) ||
            (in_prefix == *prefix_out && in_addr == *addr_out &&
             atomic_load(&c->since_ns) < atomic_load(&victim->since_ns))) {
            victim = c;
            *prefix_out = in_prefix;
            *addr_out = in_addr;
        }
    }
    *n_out = n;
    return victim;
}

/* Frees a reserve slot for the new connection NEWCOMER by shutting down pick_victim's
 * connection, only for a newcomer whose prefix, then address, holds fewer reserve slots
 * than the victim's: a source does not push out its own (or an equal source's)
 * connections, which under a flood would only churn threads. False when no connection
 * may go; DRY: nothing is shut down (under g->mu). */
static bool evict_one(struct http_guard *g, const struct guard_conn *newcomer, bool dry)
{
    int n, v_prefix, v_addr, new_addr, new_prefix;
    struct guard_conn *victim = pick_victim(g, &n, &v_prefix, &v_addr);

    count_reserve(&new_addr, &new_prefix, g->scratch, n, newcomer);
    if (victim == NULL || new_prefix > v_prefix || (new_prefix == v_prefix && new_addr >= v_addr)) {
        return false;
    }
    if (dry) {
        return true;
    }
    cut(victim);
    victim->pool = POOL_NONE;
    g->n_reserve--;
    atomic_fetch_add(&g->evicted, 1);
    return true;
}

/* Puts the new connection C in a pool (under g->mu); POOL_NONE when it is refused. DRY:
 * only says which, evicting nobody. */
static enum guard_pool admit(struct http_guard *g, const struct guard_conn *c, bool dry)
{
    int in_addr, in_prefix;

    if (c->family != AF_INET && c->family != AF_INET6) {
        return POOL_LOCAL;
    }
    if (g->n_ip >= g->lim.hard_max) {
        return POOL_NONE; /* refused connections still closing: wait for them */
    }
    count_like(&in_addr, &in_prefix, g, c, POOL_GENERAL);
    if (g->n_general < g->lim.conn_max && in_addr < g->lim.per_addr_max &&
        in_prefix < g->lim.per_prefix_max) {
        return POOL_GENERAL;
    }
    if (g->n_reserve < g->lim.reserve_max || evict_one(g, c, dry)) {
        return POOL_RESERVE;
    }
    return POOL_NONE;
}

static void track(struct http_guard *g, struct MHD_Connection *conn, void **socket_context)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    const union MHD_ConnectionInfo *ai =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    struct guard_conn *c = xcalloc(1, sizeof(*c));

    c->fd = ci != NULL ? (int)ci->connect_fd : -1;
    address_from(c, ai != NULL ? ai->client_addr : NULL);
    {
        /* Once per connection, not per request (http_route_find asks on every request). */
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        c->unix_sock = c->fd < 0 || getsockname(c->fd, (struct sockaddr *)&ss, &len) != 0
                           ? -1
                           : ss.ss_family == AF_UNIX;
    }
    atomic_init(&c->since_ns, clock_mono_ns());
    atomic_init(&c->head_done, false);
    atomic_init(&c->answering, false);
    c->reaped = c->fd < 0; /* nothing to shut down */
    pthread_mutex_lock(&g->mu);
    c->pool = admit(g, c, false);
    g->n_general += c->pool == POOL_GENERAL;
    g->n_reserve += c->pool == POOL_RESERVE;
    g->n_ip += c->pool != POOL_LOCAL;
    if (c->pool == POOL_NONE) {
        cut(c);
        atomic_fetch_add(&g->refused, 1);
    }
    c->next = g->head;
    if (g->head != NULL) {
        g->head->prev = c;
    }
    g->head = c;
    pthread_mutex_unlock(&g->mu);
    *socket_context = c;
}

bool http_guard_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
    struct http_guard *g = cls;
    struct guard_conn c = {.family = AF_UNSPEC};
    enum guard_pool pool;

    if (addr != NULL && addrlen >= (socklen_t)sizeof(sa_family_t) &&
        ((addr->sa_family == AF_INET && addrlen >= (socklen_t)sizeof(struct sockaddr_in)) ||
         (addr->sa_family == AF_INET6 && addrlen >= (socklen_t)sizeof(struct sockaddr_in6)))) {
        address_from(&c, addr);
    }
    pthread_mutex_lock(&g->mu);
    pool = admit(g, &c, true);
    pthread_mutex_unlock(&g->mu);
    if (pool == POOL_NONE) {
        atomic_fetch_add(&g->refused, 1);
        return false;
    }
    return true;
}

void http_guard_notify(void *cls, struct MHD_Connection *conn, void **socket_context, int code)
{
    struct http_guard *g = cls;
    struct guard_conn *c;

    if (code == (int)MHD_CONNECTION_NOTIFY_STARTED) {
        track(g, conn, socket_context);
        return;
    }
    c = *socket_context;
    if (c == NULL) {
        return;
    }
    pthread_mutex_lock(&g->mu);
    g->n_general -= c->pool == POOL_GENERAL;
    g->n_reserve -= c->pool == POOL_RESERVE;
    g->n_ip -= c->pool != POOL_LOCAL;
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

bool http_guard_head(struct MHD_Connection *conn, bool reserved_route)
{
    struct guard_conn *c = conn_of(conn);
    bool ok;

    if (c == NULL) {
        return true;
    }
    atomic_store(&c->head_done, true);
    /* Read without the mutex: the pool changes only from RESERVE to NONE, and an evicted
     * connection is shut down already. */
    ok = reserved_route || c->pool != POOL_RESERVE;
    return ok;
}

int http_guard_unix_socket(struct MHD_Connection *conn)
{
    const struct guard_conn *c = conn_of(conn);

    return c != NULL ? c->unix_sock : -1;
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
        atomic_store(&c->head_done, false);
        atomic_store(&c->answering, false);
    }
}
