/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: the whole HTTP request path. The real server (routes, handlers,
 * SQLite store, workers; sandbox provider none, no SCM credentials) is started once in
 * this process on 127.0.0.1:0; each input becomes one HTTP/1.1 request sent over loopback
 * and its answer is checked: the server must never abort, and every JSON body it sends
 * must be valid JSON (so valid UTF-8).
 *
 * Input: the first line is the method (a leading '!' adds the admin bearer token), the
 * second the request target, then header lines up to an empty line, then the body. The
 * harness adds Host, Content-Length and Connection: close; a header line
 * "X-Hub-Signature-256: auto" is replaced by the body's real signature (secret "s"), so
 * signed deliveries reach the payload parser; GitLab deliveries carry "X-Gitlab-Token: s". */
#define _XOPEN_SOURCE 700 /* nftw */
#include <arpa/inet.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/log.h"
#include "common/secret.h"
#include "server/serve_int.h"

#define WEBHOOK_SECRET "s"
#define RESPONSE_MAX (4u * 1024u * 1024u)

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
const char *__lsan_default_suppressions(void);

/* The server's worker threads keep OpenSSL's per-thread state (DRBG, error queue) in
 * thread-local storage, which LeakSanitizer does not see as reachable while they run. */
const char *__lsan_default_suppressions(void)
{
    return "leak:libcrypto.so\n";
}

static struct server *g_srv;
static uint16_t g_port;
static char g_dir[] = "/tmp/fuzz_server_router.XXXXXX";

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void stop_server(void)
{
    server_stop(g_srv);
    g_srv = NULL;
    (void)nftw(g_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char data_dir[sizeof(g_dir) + 8];
    const char *const flags[] = {"serve",
                                 "--listen",
                                 "127.0.0.1:0",
                                 "--data-dir",
                                 data_dir,
                                 "--sandbox-provider",
                                 "none",
                                 "--github-webhook-secret",
                                 WEBHOOK_SECRET,
                                 "--github-api-url",
                                 "http://127.0.0.1:9",
                                 "--bot-login",
                                 "diverge-bot",
                                 "--gitlab-webhook-token",
                                 WEBHOOK_SECRET,
                                 "--gitlab-url",
                                 "http://127.0.0.1:9"};
    char *args[ARRAY_LEN(flags)];
    struct err err = {0};
    const char *colon;
    int devnull;

    (void)argc;
    (void)argv;
    signal(SIGPIPE, SIG_IGN);
    /* Only loopback, and no credentials from the environment. */
    unsetenv("GITHUB_TOKEN");
    unsetenv("DIVERGE_NOTIFIER_TOKEN");
    unsetenv("DIVERGE_GITHUB_APP_ID");
    unsetenv("DIVERGE_GITLAB_TOKEN");
    unsetenv("GITLAB_TOKEN");
    ASSERT(mkdtemp(g_dir) != NULL);
    snprintf(data_dir, sizeof(data_dir), "%s/var", g_dir);
    devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
    log_set_format(LOG_FORMAT_JSON);
    log_set_fd(devnull); /* the log still formats every line: exercised, not shown */
    for (size_t i = 0; i < ARRAY_LEN(flags); i++) {
        args[i] = xstrdup(flags[i]);
    }
    if (server_start(&g_srv, (int)ARRAY_LEN(args), args, &err) != E_OK) {
        fprintf(stderr, "fuzz_server_router: cannot start the server: %s\n", err.msg);
        abort();
    }
    for (size_t i = 0; i < ARRAY_LEN(flags); i++) {
        free(args[i]);
    }
    colon = strrchr(g_srv->cfg.listen, ':');
    g_port = (uint16_t)strtoul(colon + 1, NULL, 10);
    atexit(stop_server);
    return 0;
}

/* Next line of [*p, end) without its "\n" (and a trailing "\r"); false at the end. */
static bool next_line(const char **line, size_t *len, const char **p, const char *end)
{
    const char *nl;

    if (*p >= end) {
        return false;
    }
    nl = memchr(*p, '\n', (size_t)(end - *p));
    *line = *p;
    *len = nl != NULL ? (size_t)(nl - *p) : (size_t)(end - *p);
    *p = nl != NULL ? nl + 1 : end;
    if (*len > 0 && (*line)[*len - 1] == '\r') {
        (*len)--;
    }
    return true;
}

/* Appends S[0..n) without the bytes that would end the line or the token early. */
static void put_clean(struct buf *b, const char *s, size_t n, bool no_space)
{
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\r' || s[i] == '\n' || s[i] == '\0' || (no_space && s[i] == ' ')) {
            continue;
        }
        (void)buf_append(b, s + i, 1);
    }
}

static bool header_is(const char *line, size_t len, const char *name)
{
    size_t n = strlen(name);

    return len > n && line[n] == ':' && strncasecmp(line, name, n) == 0;
}

static void put_signature(struct buf *b, const char *body, size_t len)
{
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int mac_len = 0;
    char hex[2 * EVP_MAX_MD_SIZE + 1];

    HMAC(EVP_sha256(), WEBHOOK_SECRET, (int)strlen(WEBHOOK_SECRET), (const unsigned char *)body,
         len, mac, &mac_len);
    secret_hex(hex, mac, mac_len);
    buf_printf(b, "X-Hub-Signature-256: sha256=%s\r\n", hex);
}

/* The request line from the first two input lines ("!" before the method: send the admin
 * token); returns whether it asked for the admin token. */
static bool put_request_line(struct buf *req, const char **p, const char *end)
{
    const char *line = "";
    size_t len = 0;
    bool admin = false;

    if (next_line(&line, &len, p, end) && len > 0 && line[0] == '!') {
        admin = true;
        line++;
        len--;
    }
    if (len == 0) {
        line = "GET";
        len = 3;
    }
    put_clean(req, line, len < 32 ? len : 32, true);
    buf_puts(req, " ");
    if (!next_line(&line, &len, p, end) || len == 0 || line[0] != '/') {
        buf_puts(req, "/");
    }
    put_clean(req, line, len, true);
    buf_puts(req, " HTTP/1.1\r\nHost: f\r\nConnection: close\r\n");
    return admin;
}

/* The header lines up to an empty one into HEADERS, but never the framing ones; a
 * signature header "auto" becomes the real signature of the body that follows. */
static void put_headers(struct buf *headers, const char **p, const char *end)
{
    const char *line = NULL;
    size_t len = 0;

    while (next_line(&line, &len, p, end) && len > 0) {
        if (header_is(line, len, "Content-Length") || header_is(line, len, "Transfer-Encoding") ||
            header_is(line, len, "Connection")) {
            continue; /* the harness frames the body: a mismatch would only stall */
        }
        if (len == strlen("X-Hub-Signature-256: auto") &&
            memcmp(line, "X-Hub-Signature-256: auto", len) == 0) {
            put_signature(headers, *p, (size_t)(end - *p)); /* the body follows the headers */
            continue;
        }
        put_clean(headers, line, len, false);
        buf_puts(headers, "\r\n");
    }
}

/* Builds the request from the input; see the file comment. */
static void build_request(struct buf *req, const char *p, const char *end)
{
    bool admin = put_request_line(req, &p, end);
    struct buf headers;

    buf_init(&headers, 0);
    put_headers(&headers, &p, end);
    if (admin) {
        buf_printf(req, "Authorization: Bearer %s\r\n", g_srv->api_token);
    }
    if (headers.len > 0) {
        buf_append(req, headers.data, headers.len);
    }
    buf_printf(req, "Content-Length: %zu\r\n\r\n", (size_t)(end - p));
    buf_append(req, p, (size_t)(end - p));
    buf_cleanup(&headers);
}

static int connect_server(void)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(g_port)};
    struct timeval tv = {.tv_sec = 2, .tv_usec = 0};  /* a stream may hold its headers */
    struct linger lg = {.l_onoff = 1, .l_linger = 0}; /* RST on close: no TIME_WAIT pile-up */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    ASSERT(fd >= 0);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        /* The server is in this process: if it is gone we crashed already. */
        perror("fuzz_server_router: connect");
        abort();
    }
    return fd;
}

/* The value of header NAME (with its ": ") in the head [head, end), or NULL. */
static const char *find_header(const char *head, const char *end, const char *name)
{
    size_t n = strlen(name);

    for (const char *p = head; p + n < end; p++) {
        if (p[0] == '\n' && strncasecmp(p + 1, name, n) == 0) {
            return p + 1 + n;
        }
    }
    return NULL;
}

/* Reads the answer; streams (chunked: watch, log follow) are checked up to the headers. */
static void check_response(int fd)
{
    struct buf resp;
    char chunk[16384], *hdr_end = NULL;
    ssize_t n;
    size_t want = SIZE_MAX;
    bool json = false;

    buf_init(&resp, RESPONSE_MAX);
    while ((n = recv(fd, chunk, sizeof(chunk), 0)) > 0) {
        if (buf_append(&resp, chunk, (size_t)n) != E_OK) {
            break;
        }
        if (hdr_end == NULL && (hdr_end = strstr(resp.data, "\r\n\r\n")) != NULL) {
            const char *cl = find_header(resp.data, hdr_end, "Content-Length: ");
            if (cl == NULL) {
                break; /* chunked: a stream, maybe endless */
            }
            want = (size_t)(hdr_end + 4 - resp.data) + strtoull(cl, NULL, 10);
            json = find_header(resp.data, hdr_end, "Content-Type: application/json") != NULL;
        }
        if (hdr_end != NULL && resp.len >= want) {
            break;
        }
    }
    if (resp.len == 0) {
        buf_cleanup(&resp); /* closed without an answer (malformed framing): allowed */
        return;
    }
    ASSERT(strncmp(resp.data, "HTTP/1.", 7) == 0);
    if (json && want != SIZE_MAX && resp.len >= want) {
        size_t off = (size_t)(hdr_end + 4 - resp.data);
        json_error_t jerr;
        json_t *j = json_loadb(resp.data + off, want - off, 0, &jerr);
        if (j == NULL) {
            fprintf(stderr, "invalid JSON body (%s): %.*s\n", jerr.text, (int)(want - off),
                    resp.data + off);
            abort();
        }
        json_decref(j);
    }
    buf_cleanup(&resp);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *p = (const char *)data;
    struct buf req;
    size_t off = 0;
    int fd;

    if (size > 2u * 1024u * 1024u) {
        return 0;
    }
    buf_init(&req, 0);
    build_request(&req, p, p + size);
    fd = connect_server();
    while (off < req.len) {
        ssize_t n = send(fd, req.data + off, req.len - off, MSG_NOSIGNAL);
        if (n <= 0) {
            break; /* answered early (404, 401, 413) and closed: read what it said */
        }
        off += (size_t)n;
    }
    check_response(fd);
    close(fd);
    buf_cleanup(&req);
    return 0;
}
