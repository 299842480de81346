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
 * The last output line is machine-readable: RESULT key=value ...
 *
 * This file: options, setup and the report; loadgen_template.c builds and signs the
 * requests, loadgen_conn.c runs the connections and parses the responses.
 */
#include "loadgen_int.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <netdb.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <time.h>

/* --- options -------------------------------------------------------------------- */

struct options opt = {
    .connections = 64, .threads = 2, .duration = 10, .timeout = 10, .event = "issue_comment"};

char host_hdr[300], path[2048];
struct sockaddr_storage addr;
socklen_t addr_len;

void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("loadgen: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void on_sigint(int sig)
{
    (void)sig;
    g_stop = 1;
}

/* Splits host_hdr into HOST and PORT ("[v6]:port", "host:port" or "host"). */
static void split_host_port(char host[300], char port[16])
{
    snprintf(host, 300, "%s", host_hdr);
    char *colon = strrchr(host, ':');
    if (host[0] == '[') { /* [v6]:port */
        char *rb = strchr(host, ']');
        if (rb == NULL)
            die("bad --url host");
        *rb = '\0';
        if (rb[1] == ':')
            snprintf(port, 16, "%s", rb + 2);
        memmove(host, host + 1, strlen(host));
    } else if (colon != NULL) {
        *colon = '\0';
        snprintf(port, 16, "%s", colon + 1);
    }
}

static void parse_url(void)
{
    const char *u = opt.url;
    if (strncmp(u, "http://", 7) != 0)
        die("--url must start with http://");
    u += 7;
    const char *slash = strchr(u, '/');
    size_t hl = slash ? (size_t)(slash - u) : strlen(u);
    if (hl == 0 || hl >= sizeof(host_hdr))
        die("bad --url host");
    memcpy(host_hdr, u, hl);
    host_hdr[hl] = '\0';
    snprintf(path, sizeof(path), "%s", slash ? slash : "/");
    char host[300], port[16] = "80";
    split_host_port(host, port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0)
        die("cannot resolve %s: %s", host, gai_strerror(rc));
    memcpy(&addr, res->ai_addr, res->ai_addrlen);
    addr_len = res->ai_addrlen;
    freeaddrinfo(res);
}

static void usage(int code)
{
    fprintf(
        code ? stderr : stdout,
        "usage: loadgen --url http://HOST:PORT/PATH [--connections 64] [--threads 2]\n"
        "               [--duration 10] [--warmup 0] [--timeout 10] [--requests N]\n"
        "               (--secret S --template FILE [--mode nocmd|cmd] [--body TEXT]\n"
        "                [--event issue_comment] [--id-base N] [--bad-signature] [--full-hmac]\n"
        "                [--gitlab]\n"
        "               | --raw-get)\n"
        "Template placeholders: __COMMENT_ID__ (required; a run-unique integer), __BODY__\n"
        "(JSON-escaped comment text: \"/diverge help\" for --mode cmd, \"LGTM, thanks\" for "
        "nocmd).\n");
    exit(code);
}

/* One option CH with its argument. */
static void set_option(int ch)
{
    switch (ch) {
    case 'u':
        opt.url = optarg;
        break;
    case 'c':
        opt.connections = (int)strtol(optarg, NULL, 10);
        break;
    case 't':
        opt.threads = (int)strtol(optarg, NULL, 10);
        break;
    case 'd':
        opt.duration = strtod(optarg, NULL);
        break;
    case 'W':
        opt.warmup = strtod(optarg, NULL);
        break;
    case 'T':
        opt.timeout = strtod(optarg, NULL);
        break;
    case 'n':
        opt.requests = strtoull(optarg, NULL, 10);
        break;
    case 's':
        opt.secret = optarg;
        break;
    case 'f':
        opt.template_path = optarg;
        break;
    case 'm':
        opt.mode = optarg;
        break;
    case 'b':
        opt.body_text = optarg;
        break;
    case 'e':
        opt.event = optarg;
        break;
    case 'i':
        opt.id_base = strtoull(optarg, NULL, 10);
        opt.id_base_set = true;
        break;
    case 'g':
        opt.raw_get = true;
        break;
    case 'B':
        opt.bad_signature = true;
        break;
    case 'F':
        opt.full_hmac = true;
        break;
    case 'L':
        opt.gitlab = true;
        break;
    case 'h':
        usage(0);
        break;
    default:
        usage(2);
    }
}

static void parse_args(int argc, char **argv)
{
    static const struct option lo[] = {{"url", 1, 0, 'u'},
                                       {"connections", 1, 0, 'c'},
                                       {"threads", 1, 0, 't'},
                                       {"duration", 1, 0, 'd'},
                                       {"warmup", 1, 0, 'W'},
                                       {"timeout", 1, 0, 'T'},
                                       {"requests", 1, 0, 'n'},
                                       {"secret", 1, 0, 's'},
                                       {"template", 1, 0, 'f'},
                                       {"mode", 1, 0, 'm'},
                                       {"body", 1, 0, 'b'},
                                       {"event", 1, 0, 'e'},
                                       {"id-base", 1, 0, 'i'},
                                       {"raw-get", 0, 0, 'g'},
                                       {"bad-signature", 0, 0, 'B'},
                                       {"full-hmac", 0, 0, 'F'},
                                       {"help", 0, 0, 'h'},
                                       {"gitlab", 0, 0, 'L'},
                                       {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "u:c:t:d:n:h", lo, NULL)) != -1)
        set_option(ch);
    if (opt.url == NULL || optind != argc)
        usage(2);
    if (opt.threads < 1 || opt.connections < opt.threads)
        die("need 1 <= threads <= connections");
    if (opt.duration <= 0 && opt.requests == 0)
        die("--duration must be > 0");
}

/* --- setup ---------------------------------------------------------------------------- */

/* The run-unique parts of the delivery ids and the first comment id. */
static void seed_ids(void)
{
    uint8_t r[6] = {0};
    FILE *u = fopen("/dev/urandom", "rb");
    if (u == NULL || fread(r, 1, sizeof(r), u) != sizeof(r))
        die("cannot read /dev/urandom");
    fclose(u);
    memcpy(&nonce32, r, 4);
    memcpy(&nonce16, r + 4, 2);
    if (!opt.id_base_set) { /* microseconds since the epoch: later runs start above earlier ids */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        opt.id_base = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
    }
}

/* The comment text of --mode when --body is not given. */
static const char *mode_body(void)
{
    if (strcmp(opt.mode, "cmd") == 0)
        return "/diverge help";
    if (strcmp(opt.mode, "nocmd") == 0)
        return "LGTM, thanks";
    die("--mode is nocmd or cmd");
}

/* The constant parts of every request. */
static void setup_requests(void)
{
    if (opt.raw_get) {
        raw_req_len = (size_t)snprintf(raw_req, sizeof(raw_req),
                                       "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, host_hdr);
        return;
    }
    if (opt.secret == NULL || opt.template_path == NULL)
        die("--secret and --template are required (or --raw-get)");
    if (opt.mode == NULL)
        opt.mode = "nocmd";
    if (opt.body_text == NULL)
        opt.body_text = mode_body();
    json_escape(opt.body_text);
    load_template();
    hmac_setup();
    hdr_const_len = (size_t)snprintf(
        hdr_const, sizeof(hdr_const),
        "POST %s HTTP/1.1\r\nHost: %s\r\n"
        "User-Agent: GitHub-Hookshot/loadgen\r\n"
        "Accept: */*\r\nContent-Type: application/json\r\n"
        "%s: %s\r\n",
        path, host_hdr, opt.gitlab ? "X-Gitlab-Event" : "X-GitHub-Event",
        opt.gitlab && strcmp(opt.event, "issue_comment") == 0 ? "Note Hook" : opt.event);
    if (hdr_const_len > HDR_ROOM - 300)
        die("URL or event too long");
}

static void init_worker(struct worker *w, int i)
{
    w->idx = i;
    w->nconns = opt.connections / opt.threads + (i < opt.connections % opt.threads);
    w->conns = calloc((size_t)w->nconns, sizeof(*w->conns));
    if (opt.requests)
        w->limit = opt.requests / (uint64_t)opt.threads +
                   ((uint64_t)i < opt.requests % (uint64_t)opt.threads);
    w->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (w->epfd < 0)
        die("epoll_create1: %s", strerror(errno));
    for (int j = 0; j < w->nconns; j++) {
        struct conn *c = &w->conns[j];
        c->w = w;
        c->fd = -1;
        if (!opt.raw_get) {
            c->buf = malloc(HDR_ROOM + body_max + 64);
            if (c->buf == NULL)
                die("out of memory");
            memcpy(c->buf + HDR_ROOM, tmpl, const_prefix);
        }
    }
}

/* Checks the midstate HMAC of a request built in BUF against OpenSSL's one-shot HMAC(). */
static void hmac_self_check(char *buf)
{
    struct worker tw = {.idx = 0};
    struct conn tc = {.w = &tw, .buf = buf};
    build_request(&tc);
    const char *body = strstr(tc.wp, "\r\n\r\n") + 4;
    size_t blen = tc.wleft - (size_t)(body - tc.wp);
    uint8_t d[32];
    unsigned int dl = 32;
    char want[64], *got = strstr(tc.wp, "sha256=") + 7;
    HMAC(EVP_sha256(), opt.secret, (int)strlen(opt.secret), (const uint8_t *)body, blen, d, &dl);
    hex32(want, d);
    if ((memcmp(want, got, 64) != 0) != opt.bad_signature)
        die("HMAC self-check failed");
    fprintf(stderr,
            "loadgen: body %zu bytes (%zu constant-prefix bytes pre-hashed); "
            "first comment id %" PRIu64 "\n",
            blen, mid_aligned, opt.id_base);
}

/* --- reporting -------------------------------------------------------------------- */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double pct(const uint64_t *v, size_t n, double p)
{
    if (n == 0)
        return 0;
    size_t i = (size_t)(p / 100.0 * (double)n);
    if (i >= n)
        i = n - 1;
    return (double)v[i] / 1e6;
}

/* The sum of every thread's counters (latencies: only their count). */
static void sum_stats(struct stats *tot, const struct worker *ws)
{
    for (int i = 0; i < opt.threads; i++) {
        const struct stats *s = &ws[i].s;
        tot->done += s->done;
        tot->bytes_out += s->bytes_out;
        for (int k = 0; k < 600; k++)
            tot->status[k] += s->status[k];
        tot->e_connect += s->e_connect;
        tot->e_read += s->e_read;
        tot->e_write += s->e_write;
        tot->e_timeout += s->e_timeout;
        tot->e_closed += s->e_closed;
        tot->e_parse += s->e_parse;
        tot->reconnects += s->reconnects;
        tot->nlat += s->nlat;
    }
}

/* Every thread's latencies in one sorted array of N (caller frees). */
static uint64_t *sorted_latencies(const struct worker *ws, size_t n)
{
    uint64_t *lat = malloc((n + 1) * sizeof(*lat));
    size_t k = 0;
    for (int i = 0; i < opt.threads; i++) {
        memcpy(lat + k, ws[i].s.lat, ws[i].s.nlat * sizeof(*lat));
        k += ws[i].s.nlat;
    }
    qsort(lat, n, sizeof(*lat), cmp_u64);
    return lat;
}

/* What the report prints, computed once. */
struct summary {
    double secs, rps, mean, cpu, sys, total_secs, us_per_req, max_ms;
    uint64_t non2xx, errors;
};

static double tv_secs(struct timeval a, struct timeval b)
{
    return (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_usec - a.tv_usec) / 1e6;
}

static void summarise(struct summary *m, const struct stats *tot, const uint64_t *lat,
                      const struct worker *ws, uint64_t t_end, const struct rusage *ru0,
                      const struct rusage *ru1)
{
    double sum = 0;
    uint64_t all_started = 0;
    for (size_t i = 0; i < tot->nlat; i++)
        sum += (double)lat[i];
    m->secs = (double)(t_end - (g_measure_ns < t_end ? g_measure_ns : g_start_ns)) / 1e9;
    m->rps = (double)tot->done / m->secs;
    m->mean = tot->nlat ? sum / (double)tot->nlat / 1e6 : 0;
    m->cpu = tv_secs(ru0->ru_utime, ru1->ru_utime);
    m->sys = tv_secs(ru0->ru_stime, ru1->ru_stime);
    m->total_secs = (double)(t_end - g_start_ns) / 1e9;
    for (int i = 0; i < opt.threads; i++)
        all_started += ws[i].seq;
    m->us_per_req = all_started ? 1e6 * (m->cpu + m->sys) / (double)all_started : 0.0;
    m->max_ms = tot->nlat ? (double)lat[tot->nlat - 1] / 1e6 : 0.0;
    m->non2xx = 0;
    for (int s = 0; s < 600; s++)
        if (s < 200 || s > 299)
            m->non2xx += tot->status[s];
    m->errors =
        tot->e_connect + tot->e_read + tot->e_write + tot->e_timeout + tot->e_closed + tot->e_parse;
}

static void print_report(const struct stats *tot, const uint64_t *lat, const struct summary *m)
{
    printf("loadgen: %s %s  mode=%s  %d connections, %d threads, %.1f s (+%.1f s warm-up)\n",
           opt.raw_get ? "GET" : "POST", opt.url, opt.raw_get ? "raw-get" : opt.mode,
           opt.connections, opt.threads, opt.duration, opt.warmup);
    printf("  requests   %" PRIu64 " in %.2f s, %.1f MB sent\n", tot->done, m->secs,
           (double)tot->bytes_out / 1e6);
    printf("  req/s      %.1f\n", m->rps);
    printf("  latency    mean %.3f ms  p50 %.3f  p90 %.3f  p99 %.3f  p99.9 %.3f  max %.3f ms\n",
           m->mean, pct(lat, tot->nlat, 50), pct(lat, tot->nlat, 90), pct(lat, tot->nlat, 99),
           pct(lat, tot->nlat, 99.9), m->max_ms);
    printf("  status    ");
    for (int s = 0; s < 600; s++)
        if (tot->status[s])
            printf(" %d: %" PRIu64, s, tot->status[s]);
    printf("\n  errors     connect %" PRIu64 ", read %" PRIu64 ", write %" PRIu64
           ", timeout %" PRIu64 ", closed %" PRIu64 ", parse %" PRIu64 "; reconnects %" PRIu64 "\n",
           tot->e_connect, tot->e_read, tot->e_write, tot->e_timeout, tot->e_closed, tot->e_parse,
           tot->reconnects);
    printf("  loadgen CPU user %.2f s + sys %.2f s = %.0f%% of one core over %.1f s; %.2f "
           "us/request\n",
           m->cpu, m->sys, 100 * (m->cpu + m->sys) / m->total_secs, m->total_secs, m->us_per_req);
    printf("RESULT mode=%s requests=%" PRIu64 " seconds=%.3f rps=%.1f p50_ms=%.3f p90_ms=%.3f "
           "p99_ms=%.3f max_ms=%.3f non2xx=%" PRIu64 " errors=%" PRIu64
           " cpu_us_per_req=%.2f cpu_s=%.3f",
           opt.raw_get ? "raw-get" : opt.mode, tot->done, m->secs, m->rps, pct(lat, tot->nlat, 50),
           pct(lat, tot->nlat, 90), pct(lat, tot->nlat, 99), m->max_ms, m->non2xx, m->errors,
           m->us_per_req, m->cpu + m->sys);
    for (int s = 0; s < 600; s++)
        if (tot->status[s])
            printf(" s%d=%" PRIu64, s, tot->status[s]);
    printf("\n");
}

int main(int argc, char **argv)
{
    parse_args(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, on_sigint);
    parse_url();
    seed_ids();
    setup_requests();

    struct worker *ws = calloc((size_t)opt.threads, sizeof(*ws));
    for (int i = 0; i < opt.threads; i++)
        init_worker(&ws[i], i);
    if (!opt.raw_get && !opt.gitlab)
        hmac_self_check(ws[0].conns[0].buf);

    struct rusage ru0, ru1;
    getrusage(RUSAGE_SELF, &ru0);
    g_start_ns = now_ns();
    g_measure_ns = g_start_ns + (uint64_t)(opt.warmup * 1e9);
    g_end_ns = g_measure_ns + (uint64_t)((opt.duration > 0 ? opt.duration : 1e6) * 1e9);
    for (int i = 0; i < opt.threads; i++)
        if (pthread_create(&ws[i].th, NULL, worker_main, &ws[i]) != 0)
            die("pthread_create failed");
    for (int i = 0; i < opt.threads; i++)
        pthread_join(ws[i].th, NULL);
    uint64_t t_end = now_ns();
    getrusage(RUSAGE_SELF, &ru1);

    struct stats tot = {0};
    struct summary m;
    sum_stats(&tot, ws);
    uint64_t *lat = sorted_latencies(ws, tot.nlat);
    summarise(&m, &tot, lat, ws, t_end, &ru0, &ru1);
    print_report(&tot, lat, &m);
    return 0;
}
