/* SPDX-License-Identifier: Apache-2.0 */
/* A hostile "API server" on loopback (a thread writing canned bytes) against the kube/
 * client: oversized bodies and events, bodies that are not JSON objects, Status messages
 * with control characters and broken UTF-8, malformed lists, redirects. Each must end in a
 * clean error, never in a crash, an unbounded buffer or a message carrying raw bytes. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kube/kube_int.h"
#include "tests/t_check.h"

struct canned {
    const char *head; /* status line and headers, without the blank line */
    const char *body; /* body text, or NULL for FILL_LEN bytes of FILL */
    size_t fill_len;  /* bytes of filler when BODY is NULL */
    char fill;        /* the filler byte */
};

static struct canned g_resp; /* the answer to the next request; set by the test */
static int g_listen = -1;    /* listening socket */
static char g_url[64];       /* http://127.0.0.1:PORT */
static pthread_t g_thread;   /* the server */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) {
            return; /* the client gave up (its cap): fine */
        }
        p += w;
        n -= (size_t)w;
    }
}

static void answer(int fd)
{
    char req[8192], head[512], fill[65536];
    size_t got = 0;
    struct canned r;

    while (got < sizeof(req) - 1) {
        ssize_t n = read(fd, req + got, sizeof(req) - 1 - got);
        if (n <= 0) {
            return;
        }
        got += (size_t)n;
        req[got] = '\0';
        if (strstr(req, "\r\n\r\n") != NULL) {
            break;
        }
    }
    pthread_mutex_lock(&g_mu);
    r = g_resp;
    pthread_mutex_unlock(&g_mu);
    size_t len = r.body != NULL ? strlen(r.body) : r.fill_len;
    snprintf(head, sizeof(head), "%s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", r.head,
             len);
    write_all(fd, head, strlen(head));
    if (r.body != NULL) {
        write_all(fd, r.body, len);
        return;
    }
    memset(fill, r.fill, sizeof(fill));
    for (size_t sent = 0; sent < len; sent += sizeof(fill)) {
        write_all(fd, fill, len - sent < sizeof(fill) ? len - sent : sizeof(fill));
    }
}

static void *serve(void *arg)
{
    (void)arg;
    for (;;) {
        int fd = accept(g_listen, NULL, NULL);
        if (fd < 0) {
            return NULL;
        }
        answer(fd);
        close(fd);
    }
}

static void start_server(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    socklen_t alen = sizeof(a);

    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    g_listen = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT(g_listen >= 0 && bind(g_listen, (struct sockaddr *)&a, sizeof(a)) == 0);
    ASSERT(listen(g_listen, 16) == 0);
    ASSERT(getsockname(g_listen, (struct sockaddr *)&a, &alen) == 0);
    snprintf(g_url, sizeof(g_url), "http://127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
    ASSERT(pthread_create(&g_thread, NULL, serve, NULL) == 0);
}

static void set_resp(const char *head, const char *body, size_t fill_len, char fill)
{
    pthread_mutex_lock(&g_mu);
    g_resp = (struct canned){.head = head, .body = body, .fill_len = fill_len, .fill = fill};
    pthread_mutex_unlock(&g_mu);
}

static struct kube_client *client(void)
{
    struct kube_config *cfg = kube_config_new_empty();
    struct kube_client *c = NULL;

    cfg->server = xstrdup(g_url);
    ASSERT(kube_client_new(&c, cfg, NULL) == E_OK);
    return c;
}

#define OK_JSON "HTTP/1.1 200 OK\r\nContent-Type: application/json"

static int get_once(struct err *err)
{
    struct kube_client *c = client();
    json_t *out = NULL;
    int rc = kube_get(&out, c, &KUBE_AGENTTASKS, "default", "t", err);

    CHECK(rc == E_OK || out == NULL);
    json_decref(out);
    kube_client_free(c);
    return rc;
}

TEST(body_over_the_cap)
{
    struct err err = {0};

    set_resp(OK_JSON, NULL, KUBE_BODY_MAX + 1, ' ');
    CHECK_EQ_INT(get_once(&err), E_TOOBIG);
    set_resp(OK_JSON, NULL, KUBE_BODY_MAX, ' '); /* at the cap: read, then refused as JSON */
    CHECK_EQ_INT(get_once(&err), E_FAIL);
}

TEST(bodies_that_are_not_one_json_object)
{
    static const char *const bodies[] = {
        "hello", "[1,2]", "{\"a\":1,\"a\":2}", "{\"a\":\"\xff\"}", "{\"a\":1} {\"b\":2}", ""};
    struct err err = {0};

    for (size_t i = 0; i < ARRAY_LEN(bodies); i++) {
        set_resp(OK_JSON, bodies[i], 0, 0);
        CHECK_EQ_INT(get_once(&err), E_FAIL);
        CHECK(strstr(err.msg, "kubernetes api:") == err.msg);
    }
}

TEST(status_messages_are_made_safe)
{
    struct err err = {0};

    set_resp("HTTP/1.1 404 Not Found\r\nContent-Type: application/json",
             "{\"kind\":\"Status\",\"reason\":\"Not\\nFound\",\"message\":\"line1\\r\\nline2 "
             "\\u0000 \xc3\x28\",\"code\":404}",
             0, 0);
    /* invalid UTF-8 inside the JSON string: the body is not JSON, so no message is used */
    CHECK_EQ_INT(get_once(&err), E_NOTFOUND);
    CHECK(strstr(err.msg, "HTTP error (404)") != NULL);
    set_resp("HTTP/1.1 409 Conflict\r\nContent-Type: application/json",
             "{\"kind\":\"Status\",\"reason\":\"Conflict\",\"message\":\"a\\r\\nb\\u0007c\","
             "\"code\":409}",
             0, 0);
    CHECK_EQ_INT(get_once(&err), E_CONFLICT);
    CHECK_EQ_STR(err.msg, "get agenttasks: Conflict (409): a  b c");
    set_resp("HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/html", "<html>down</html>", 0,
             0);
    CHECK_EQ_INT(get_once(&err), E_AGAIN);
    CHECK_EQ_STR(err.msg, "get agenttasks: HTTP error (503): ");
}

TEST(redirects_are_not_followed)
{
    struct err err = {0};

    set_resp("HTTP/1.1 302 Found\r\nLocation: http://192.0.2.1/steal", "", 0, 0);
    CHECK_EQ_INT(get_once(&err), E_FAIL);
    CHECK(strstr(err.msg, "(302)") != NULL);
}

TEST(malformed_lists)
{
    static const char *const bodies[] = {
        "{\"items\":{},\"metadata\":{\"resourceVersion\":\"5\"}}",
        "{\"items\":[],\"metadata\":{}}",
        "{\"items\":[],\"metadata\":{\"resourceVersion\":\"5&watch=false\"}}",
        "{\"items\":[],\"metadata\":{\"resourceVersion\":5}}",
    };
    struct kube_client *c = client();
    struct err err = {0};
    char rv[KUBE_RV_MAX];

    for (size_t i = 0; i < ARRAY_LEN(bodies); i++) {
        json_t *items = NULL;
        set_resp(OK_JSON, bodies[i], 0, 0);
        CHECK_EQ_INT(kube_list(&items, rv, c, &KUBE_AGENTTASKS, "default", NULL, &err), E_FAIL);
        CHECK(items == NULL);
        CHECK(strstr(err.msg, "malformed list") != NULL);
    }
    kube_client_free(c);
}

static int never(enum kube_event type, const json_t *obj, void *userdata)
{
    (void)type;
    (void)obj;
    (void)userdata;
    return 0;
}

TEST(watch_event_over_the_cap)
{
    struct kube_client *c = client();
    enum kube_watch_end end;
    char rv[KUBE_RV_MAX] = "1";
    struct err err = {0};

    set_resp(OK_JSON, NULL, KUBE_EVENT_MAX + 1, 'x');
    CHECK_EQ_INT(kube_watch(&end, rv, c, &KUBE_AGENTTASKS, "default", NULL, never, NULL, &err),
                 E_TOOBIG);
    CHECK_EQ_STR(rv, "1");
    kube_client_free(c);
}

int main(int argc, char **argv)
{
    int rc;

    start_server();
    rc = t_main(argc, argv);
    shutdown(g_listen, SHUT_RDWR);
    close(g_listen);
    pthread_join(g_thread, NULL);
    return rc;
}
