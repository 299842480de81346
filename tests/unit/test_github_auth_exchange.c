/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of scm/github's installation-token exchange against a loopback fake of
 * GitHub's token endpoint: caching until five minutes before expiry, error answers,
 * unreachable servers and concurrent callers sharing one exchange. */
#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "scm/github/github_auth.h"
#include "tests/t_check.h"
#include "tests/unit/github_auth_fixture.h"

/* ---- a loopback fake of GitHub's token endpoint, one connection at a time ---- */

struct fake_gh {
    int fd;               /* listening socket */
    int port;             /* its port */
    pthread_t thread;     /* the accepting thread */
    pthread_mutex_t mu;   /* guards everything below */
    bool stop;            /* set by fake_gh_stop() */
    int status;           /* status of each answer */
    char body[512];       /* body of each answer */
    int delay_ms;         /* wait before answering */
    int requests;         /* requests answered */
    char last_head[8192]; /* request line and headers of the last request */
};

static void *fake_gh_serve(void *arg)
{
    struct fake_gh *s = arg;
    char req[8192], resp[1024];
    struct timespec ts;
    size_t len;
    ssize_t n;
    int c;

    for (;;) {
        c = accept(s->fd, NULL, NULL);
        pthread_mutex_lock(&s->mu);
        if (s->stop || c < 0) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        pthread_mutex_unlock(&s->mu);
        len = 0;
        while (len < sizeof(req) - 1 && (n = read(c, req + len, sizeof(req) - 1 - len)) > 0) {
            len += (size_t)n;
            req[len] = '\0';
            if (strstr(req, "\r\n\r\n") != NULL) {
                break; /* the client sends no body */
            }
        }
        req[len] = '\0';
        pthread_mutex_lock(&s->mu);
        s->requests++;
        snprintf(s->last_head, sizeof(s->last_head), "%s", req);
        snprintf(resp, sizeof(resp),
                 "HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                 "Connection: close\r\n\r\n%s",
                 s->status, strlen(s->body), s->body);
        ts.tv_sec = s->delay_ms / 1000;
        ts.tv_nsec = (long)(s->delay_ms % 1000) * 1000000L;
        pthread_mutex_unlock(&s->mu);
        nanosleep(&ts, NULL);
        n = write(c, resp, strlen(resp));
        (void)n;
        close(c);
    }
    if (c >= 0) {
        close(c);
    }
    return NULL;
}

static void fake_gh_set(struct fake_gh *s, int status, const char *body, int delay_ms)
{
    pthread_mutex_lock(&s->mu);
    s->status = status;
    snprintf(s->body, sizeof(s->body), "%s", body);
    s->delay_ms = delay_ms;
    pthread_mutex_unlock(&s->mu);
}

static int fake_gh_requests(struct fake_gh *s)
{
    int n;

    pthread_mutex_lock(&s->mu);
    n = s->requests;
    pthread_mutex_unlock(&s->mu);
    return n;
}

static int fake_gh_start(struct fake_gh *s)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);

    memset(s, 0, sizeof(*s));
    pthread_mutex_init(&s->mu, NULL);
    s->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (s->fd < 0 || bind(s->fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(s->fd, 16) != 0 ||
        getsockname(s->fd, (struct sockaddr *)&a, &len) != 0) {
        return -1;
    }
    s->port = ntohs(a.sin_port);
    return pthread_create(&s->thread, NULL, fake_gh_serve, s);
}

static void fake_gh_stop(struct fake_gh *s)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_mutex_unlock(&s->mu);
    a.sin_port = htons((uint16_t)s->port);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0) {
        pthread_join(s->thread, NULL);
    }
    close(fd);
    close(s->fd);
    pthread_mutex_destroy(&s->mu);
}

static bool head_has(struct fake_gh *s, const char *line)
{
    bool found;

    pthread_mutex_lock(&s->mu);
    found = strstr(s->last_head, line) != NULL;
    pthread_mutex_unlock(&s->mu);
    return found;
}

#define GRANT(exp_) "{\"token\":\"ghs_x\",\"expires_at\":\"" exp_ "\",\"permissions\":{}}"

/* Starts S and an app on it; *now drives its clock. */
static struct github_auth *app_on(struct fake_gh *s, struct clock *c)
{
    struct github_auth *a = NULL;
    struct err err = {0};
    char *url;

    if (fake_gh_start(s) != 0) {
        t_fail(__FILE__, __LINE__, "fake github could not start");
        return NULL;
    }
    url = xasprintf("http://127.0.0.1:%d/", s->port); /* trailing '/' is dropped */
    CHECK_OK(new_app(&a, url, "key8.pem", c, &err));
    free(url);
    return a;
}

static int header_of(struct github_auth *a, int64_t id, const char *want, struct err *err)
{
    char *hdr = NULL;
    int rc = github_auth_header(&hdr, a, id, err);

    if (want != NULL) {
        CHECK_EQ_STR(hdr, want);
    }
    CHECK(rc == E_OK || hdr == NULL);
    free(hdr);
    return rc;
}

TEST(exchange_is_cached_until_five_minutes_before_expiry)
{
    int64_t now = T0;
    struct clock c = {fake_now, &now};
    struct fake_gh s;
    struct github_auth *a = app_on(&s, &c);
    struct err err = {0};

    if (a == NULL) {
        return;
    }
    fake_gh_set(&s, 201, GRANT("2025-11-29T11:00:00Z"), 0);
    CHECK_OK(header_of(a, 42, "Bearer ghs_x", &err));
    CHECK_EQ_INT(fake_gh_requests(&s), 1);
    CHECK(head_has(&s, "POST /app/installations/42/access_tokens HTTP/1.1\r\n"));
    CHECK(head_has(&s, "\r\nAuthorization: Bearer eyJ"));
    CHECK(head_has(&s, "\r\nAccept: application/vnd.github+json\r\n"));
    CHECK(head_has(&s, "\r\nX-GitHub-Api-Version: 2022-11-28\r\n"));
    CHECK(head_has(&s, "\r\nUser-Agent: diverge/"));
    now = T0 + 55 * 60 * 1000 - 1; /* last ms before expires_at - 5 min */
    CHECK_OK(header_of(a, 42, "Bearer ghs_x", &err));
    CHECK_EQ_INT(fake_gh_requests(&s), 1);
    fake_gh_set(&s, 201, GRANT("2025-11-29T12:00:00+01:00"), 0); /* = 11:00Z, as before */
    now = T0 + 55 * 60 * 1000;
    CHECK_OK(header_of(a, 42, "Bearer ghs_x", &err));
    CHECK_EQ_INT(fake_gh_requests(&s), 2);
    fake_gh_set(&s, 201, GRANT("2025-11-29T12:00:00Z"), 0);
    CHECK_OK(header_of(a, 42, "Bearer ghs_x", &err)); /* the last one was inside the margin */
    CHECK_OK(header_of(a, 42, "Bearer ghs_x", &err));
    CHECK_EQ_INT(fake_gh_requests(&s), 3);
    CHECK_OK(header_of(a, 7, "Bearer ghs_x", &err)); /* another installation: its own */
    CHECK(head_has(&s, "POST /app/installations/7/access_tokens "));
    github_auth_invalidate(a, 42);
    CHECK_OK(header_of(a, 42, "Bearer ghs_x", &err));
    CHECK_OK(header_of(a, 42, "Bearer ghs_x", &err));
    CHECK_EQ_INT(fake_gh_requests(&s), 5);
    CHECK_EQ_INT(header_of(a, -1, NULL, &err), E_INVALID);
    github_auth_free(a);
    fake_gh_stop(&s);
}

TEST(exchange_errors)
{
    static const struct {
        int status;
        const char *body;
        int want;
    } cases[] = {
        {401, "{\"message\":\"Bad credentials\"}", E_DENIED},
        {403, "{}", E_DENIED},
        {404, "{\"message\":\"Not Found\"}", E_DENIED},
        {500, "oops", E_AGAIN},
        {503, "", E_AGAIN},
        {429, "{}", E_AGAIN},
        {302, "", E_FAIL},
        {201, "{\"token\":\"ghs_x\"", E_FAIL},
        {201, "{\"token\":\"ghs_x\"}", E_FAIL},
        {201, "{\"token\":\"ghs_x\",\"expires_at\":\"soon\"}", E_FAIL},
        {201, "{\"token\":\"a b\",\"expires_at\":\"2025-11-29T11:00:00Z\"}", E_FAIL},
    };
    int64_t now = T0;
    struct clock c = {fake_now, &now};
    struct fake_gh s;
    struct github_auth *a = app_on(&s, &c);
    struct err err = {0};

    if (a == NULL) {
        return;
    }
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        fake_gh_set(&s, cases[i].status, cases[i].body, 0);
        CHECK_EQ_INT(header_of(a, 42, NULL, &err), cases[i].want);
        CHECK_EQ_INT(fake_gh_requests(&s), (int)i + 1); /* failures are never cached */
        CHECK(strstr(err.msg, "ghs_x") == NULL);
    }
    fake_gh_set(&s, 401, "{\"message\":\"Bad credentials\"}", 0);
    CHECK_EQ_INT(header_of(a, 42, NULL, &err), E_DENIED);
    CHECK(strstr(err.msg, "http 401: Bad credentials") != NULL);
    github_auth_free(a);
    fake_gh_stop(&s);
}

TEST(unreachable_is_again)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int64_t now = T0;
    struct clock c = {fake_now, &now};
    struct github_auth *a = NULL;
    struct err err = {0};
    char *url;

    /* A port that was just free and has no listener: connect is refused. */
    CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
          getsockname(fd, (struct sockaddr *)&sa, &len) == 0);
    close(fd);
    url = xasprintf("http://127.0.0.1:%d", ntohs(sa.sin_port));
    CHECK_OK(new_app(&a, url, "key8.pem", &c, &err));
    if (a != NULL) {
        CHECK_EQ_INT(header_of(a, 42, NULL, &err), E_AGAIN);
    }
    github_auth_free(a);
    free(url);
}

struct caller {
    struct github_auth *a; /* borrowed */
    int rc;                /* what github_auth_header returned */
    char *hdr;             /* owned; the header it got */
};

static void *call_header(void *arg)
{
    struct caller *cl = arg;

    cl->rc = github_auth_header(&cl->hdr, cl->a, 42, NULL);
    return NULL;
}

/* Runs N concurrent callers; checks each got WANT_RC (and "Bearer ghs_x" on success). */
static void run_callers(struct github_auth *a, int want_rc)
{
    struct caller cl[6];
    pthread_t th[6];

    for (size_t i = 0; i < ARRAY_LEN(cl); i++) {
        cl[i] = (struct caller){.a = a};
        CHECK_OK(pthread_create(&th[i], NULL, call_header, &cl[i]));
    }
    for (size_t i = 0; i < ARRAY_LEN(cl); i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_INT(cl[i].rc, want_rc);
        if (want_rc == E_OK) {
            CHECK_EQ_STR(cl[i].hdr, "Bearer ghs_x");
        }
        free(cl[i].hdr);
    }
}

TEST(concurrent_callers_share_one_exchange)
{
    int64_t now = T0;
    struct clock c = {fake_now, &now};
    struct fake_gh s;
    struct github_auth *a = app_on(&s, &c);

    if (a == NULL) {
        return;
    }
    fake_gh_set(&s, 500, "{}", 500);
    run_callers(a, E_AGAIN);
    CHECK_EQ_INT(fake_gh_requests(&s), 1);
    fake_gh_set(&s, 201, GRANT("2025-11-29T11:00:00Z"), 500);
    run_callers(a, E_OK);
    CHECK_EQ_INT(fake_gh_requests(&s), 2);
    github_auth_free(a);
    fake_gh_stop(&s);
}

T_MAIN
