/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of scm/github credentials: app JWTs checked with OpenSSL against keys the
 * openssl tool generates, key-file errors, PAT and config precedence, and the
 * installation-token exchange and cache against a loopback fake of GitHub. */
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

#define T0 INT64_C(1764410400000) /* 2025-11-29T10:00:00Z */
#define APP_ID "12345"

/* ---- fixture: keys made once by the openssl tool in a temporary directory ---- */

static char g_dir[] = "/tmp/test_github_auth-XXXXXX";
static bool g_ready;

static void remove_dir(void)
{
    char *cmd = xasprintf("rm -rf '%s'", g_dir);

    if (system(cmd) != 0) {
        fprintf(stderr, "could not remove %s\n", g_dir);
    }
    free(cmd);
}

/* Runs CMD in the fixture directory. */
static void sh(const char *cmd)
{
    char *line = xasprintf("cd '%s' && %s 2>/dev/null", g_dir, cmd);

    if (system(line) != 0) {
        t_fail(__FILE__, __LINE__, "fixture command failed: %s", line);
    }
    free(line);
}

/* Path of fixture file NAME (caller frees); generates all keys on first use. */
static char *fixture(const char *name)
{
    if (!g_ready) {
        if (mkdtemp(g_dir) == NULL) {
            t_fail(__FILE__, __LINE__, "mkdtemp failed");
        }
        atexit(remove_dir);
        sh("openssl genrsa -out key8.pem 2048");                   /* OpenSSL 3 writes PKCS#8 */
        sh("openssl rsa -in key8.pem -traditional -out key1.pem"); /* PKCS#1 */
        sh("openssl pkey -in key8.pem -pubout -out pub.pem");
        sh("openssl genrsa -out small.pem 1024");
        sh("openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ec.pem");
        sh("openssl genrsa -aes256 -passout pass:x -out enc.pem 2048");
        sh("printf -- '-----BEGIN PRIVATE KEY-----\\nbm90IGEga2V5\\n-----END PRIVATE KEY-----\\n'"
           " > bad.pem && : > empty.pem");
        g_ready = true;
    }
    return xasprintf("%s/%s", g_dir, name);
}

static int64_t fake_now(void *userdata)
{
    return *(const int64_t *)userdata;
}

static int new_app(struct github_auth **out, const char *url, const char *key,
                   const struct clock *c, struct err *err)
{
    char *path = fixture(key);
    int rc = github_auth_new_app(out, url, APP_ID, path, c, err);

    free(path);
    return rc;
}

/* ---- an independent JWT reader ---- */

static size_t b64url_decode(unsigned char *out, const char *s, size_t n)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    unsigned v = 0, bits = 0;
    size_t len = 0;

    for (size_t i = 0; i < n; i++) {
        const char *p = strchr(abc, s[i]);
        CHECK(p != NULL && s[i] != '\0');
        v = v << 6 | (unsigned)(p != NULL ? p - abc : 0);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[len++] = (unsigned char)(v >> bits & 0xff);
        }
    }
    return len;
}

static json_t *part_json(const char *s, size_t n)
{
    unsigned char raw[512];

    CHECK(n < 600);
    return n < 600 ? json_loadb((const char *)raw, b64url_decode(raw, s, n), 0, NULL) : NULL;
}

/* Checks JWT's form, claims at NOW_S and RS256 signature under the key in pub.pem. */
static void check_jwt(const char *jwt, int64_t now_s)
{
    const char *d1 = strchr(jwt, '.'), *d2 = d1 != NULL ? strchr(d1 + 1, '.') : NULL;
    char *pub = fixture("pub.pem");
    FILE *f = fopen(pub, "r");
    EVP_PKEY *key = f != NULL ? PEM_read_PUBKEY(f, NULL, NULL, NULL) : NULL;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned char sig[1024];
    json_t *h, *c;
    size_t sig_len;

    CHECK(d2 != NULL && strchr(d2 + 1, '.') == NULL && key != NULL && ctx != NULL);
    if (d2 == NULL || key == NULL || ctx == NULL) {
        goto out;
    }
    h = part_json(jwt, (size_t)(d1 - jwt));
    c = part_json(d1 + 1, (size_t)(d2 - d1 - 1));
    CHECK_EQ_STR(json_string_value(json_object_get(h, "alg")), "RS256");
    CHECK_EQ_STR(json_string_value(json_object_get(h, "typ")), "JWT");
    CHECK_EQ_INT(json_integer_value(json_object_get(c, "iat")), now_s - 60);
    CHECK_EQ_INT(json_integer_value(json_object_get(c, "exp")), now_s + 540);
    CHECK_EQ_STR(json_string_value(json_object_get(c, "iss")), APP_ID);
    CHECK_EQ_INT(json_object_size(c), 3);
    json_decref(h);
    json_decref(c);
    sig_len = b64url_decode(sig, d2 + 1, strlen(d2 + 1) < 1300 ? strlen(d2 + 1) : 0);
    CHECK_EQ_INT(sig_len, 256);
    CHECK(EVP_DigestVerifyInit(ctx, NULL, EVP_sha256(), NULL, key) == 1);
    CHECK(EVP_DigestVerify(ctx, sig, sig_len, (const unsigned char *)jwt, (size_t)(d2 - jwt)) == 1);
    /* The same signature over a changed message must not verify. */
    CHECK(EVP_DigestVerifyInit(ctx, NULL, EVP_sha256(), NULL, key) == 1);
    CHECK(EVP_DigestVerify(ctx, sig, sig_len, (const unsigned char *)jwt, (size_t)(d2 - jwt) - 1) !=
          1);
out:
    EVP_MD_CTX_free(ctx);
    EVP_PKEY_free(key);
    if (f != NULL) {
        fclose(f);
    }
    free(pub);
}

/* ---- JWTs and keys ---- */

TEST(jwt_pkcs8_and_pkcs1)
{
    const char *keys[] = {"key8.pem", "key1.pem"};
    int64_t now = T0 + 999;
    struct clock c = {fake_now, &now};
    struct err err = {0};

    for (size_t i = 0; i < ARRAY_LEN(keys); i++) {
        struct github_auth *a = NULL;
        char *jwt = NULL, *hdr = NULL, *want = NULL;
        CHECK_OK(new_app(&a, NULL, keys[i], &c, &err));
        CHECK_OK(github_auth_app_jwt(&jwt, a, &err));
        if (jwt != NULL) {
            check_jwt(jwt, T0 / 1000);
            /* RS256 is deterministic, so installation 0 gives the same JWT. */
            CHECK_OK(github_auth_header(&hdr, a, 0, &err));
            want = xasprintf("Bearer %s", jwt);
            CHECK_EQ_STR(hdr, want);
        }
        now += 3600 * 1000;
        free(jwt);
        CHECK_OK(github_auth_app_jwt(&jwt, a, &err));
        if (jwt != NULL) {
            check_jwt(jwt, T0 / 1000 + 3600);
        }
        free(jwt);
        free(hdr);
        free(want);
        github_auth_free(a);
        now = T0 + 999;
    }
}

TEST(bad_key_files)
{
    const char *invalid[] = {"bad.pem", "empty.pem", "ec.pem", "small.pem", "enc.pem", "pub.pem"};
    int64_t now = T0;
    struct clock c = {fake_now, &now};
    struct github_auth *a = NULL;
    struct err err = {0};
    char *key = fixture("key8.pem");

    for (size_t i = 0; i < ARRAY_LEN(invalid); i++) {
        CHECK_EQ_INT(new_app(&a, NULL, invalid[i], &c, &err), E_INVALID);
        CHECK(a == NULL);
    }
    /* Missing file: E_NOTFOUND; a file that cannot be read (a directory): E_FAIL. */
    CHECK_EQ_INT(new_app(&a, NULL, "missing.pem", &c, &err), E_NOTFOUND);
    CHECK_EQ_INT(github_auth_new_app(&a, NULL, APP_ID, g_dir, &c, &err), E_FAIL);
    CHECK_EQ_INT(github_auth_new_app(&a, NULL, "12 34", key, &c, &err), E_INVALID);
    CHECK_EQ_INT(github_auth_new_app(&a, NULL, "", key, &c, &err), E_INVALID);
    CHECK_EQ_INT(github_auth_new_app(&a, "ftp://x", APP_ID, key, &c, &err), E_INVALID);
    CHECK(a == NULL);
    free(key);
}

TEST(pat_header)
{
    struct github_auth *a = NULL;
    struct err err = {0};
    char *hdr = NULL;

    CHECK_OK(github_auth_new_token(&a, "ghp_abc123", &err));
    CHECK_OK(github_auth_header(&hdr, a, 42, &err));
    CHECK_EQ_STR(hdr, "Bearer ghp_abc123");
    free(hdr);
    CHECK_OK(github_auth_header(&hdr, a, 0, &err));
    CHECK_EQ_STR(hdr, "Bearer ghp_abc123");
    free(hdr);
    CHECK_EQ_INT(github_auth_app_jwt(&hdr, a, &err), E_INVALID);
    github_auth_invalidate(a, 42);
    github_auth_free(a);
    github_auth_free(NULL);
    CHECK_EQ_INT(github_auth_new_token(&a, "", &err), E_INVALID);
    CHECK_EQ_INT(github_auth_new_token(&a, "ghp_a\r\nX-Evil: 1", &err), E_INVALID);
    CHECK(a == NULL);
}

/* Header of the source from_config picks; "app" for an app, NULL on error. */
static char *picked(const char *app_id, const char *key_file, int want_rc)
{
    int64_t now = T0;
    struct clock c = {fake_now, &now};
    struct github_auth *a = NULL;
    struct err err = {0};
    char *hdr = NULL;

    CHECK_EQ_INT(github_auth_from_config(&a, NULL, app_id, key_file, &c, &err), want_rc);
    if (a != NULL && github_auth_app_jwt(&hdr, a, &err) == E_OK) {
        free(hdr);
        hdr = xstrdup("app");
    } else if (a != NULL) {
        CHECK_OK(github_auth_header(&hdr, a, 7, &err));
    }
    github_auth_free(a);
    return hdr;
}

#define CHECK_PICKED(id_, key_, rc_, want_)                                                        \
    do {                                                                                           \
        char *got_ = picked((id_), (key_), (rc_));                                                 \
        CHECK_EQ_STR(got_ != NULL ? got_ : "(none)", (want_));                                     \
        free(got_);                                                                                \
    } while (0)

TEST(from_config_precedence)
{
    char *key = fixture("key8.pem");

    unsetenv("DIVERGE_GITHUB_APP_ID");
    unsetenv("DIVERGE_GITHUB_APP_KEY_FILE");
    unsetenv("DIVERGE_NOTIFIER_TOKEN");
    unsetenv("GITHUB_TOKEN");
    CHECK_PICKED(NULL, NULL, E_NOTFOUND, "(none)");
    setenv("GITHUB_TOKEN", "gh_tok", 1);
    CHECK_PICKED(NULL, NULL, E_OK, "Bearer gh_tok");
    setenv("DIVERGE_NOTIFIER_TOKEN", "", 1); /* empty counts as unset */
    CHECK_PICKED(NULL, NULL, E_OK, "Bearer gh_tok");
    setenv("DIVERGE_NOTIFIER_TOKEN", "notifier_tok", 1);
    CHECK_PICKED(NULL, NULL, E_OK, "Bearer notifier_tok");
    CHECK_PICKED(APP_ID, key, E_OK, "app");
    CHECK_PICKED(APP_ID, NULL, E_INVALID, "(none)");
    CHECK_PICKED(NULL, key, E_INVALID, "(none)");
    /* Each flag falls back to its environment variable. */
    setenv("DIVERGE_GITHUB_APP_KEY_FILE", key, 1);
    CHECK_PICKED(APP_ID, NULL, E_OK, "app");
    setenv("DIVERGE_GITHUB_APP_ID", APP_ID, 1);
    CHECK_PICKED(NULL, NULL, E_OK, "app");
    CHECK_PICKED("", "", E_OK, "app");
    CHECK_PICKED(NULL, "/nonexistent/key.pem", E_NOTFOUND, "(none)");
    unsetenv("DIVERGE_GITHUB_APP_ID");
    unsetenv("DIVERGE_GITHUB_APP_KEY_FILE");
    unsetenv("DIVERGE_NOTIFIER_TOKEN");
    unsetenv("GITHUB_TOKEN");
    free(key);
}

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
