/* SPDX-License-Identifier: Apache-2.0 */
/* The runner's side of SPEC §7: the token (env, else the file, read again for every
 * call so a rotated token is used), one meter exchange over a unix socket or TCP with
 * bounded retries of the same requestId, and the preview check. Never logs the token. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/httpc.h"
#include "common/money.h"
#include "runner/runner_int.h"
#include "token/token.h"

#define RUNNER_SOCKET_URL "http://localhost/api/v1/agenttask/meter"
#define RUNNER_METER_TIMEOUT_MS 30000
#define RUNNER_PREVIEW_TIMEOUT_MS 10000

void runner_token_free(char *tok)
{
    if (tok != NULL) {
        volatile char *p = tok;
        while (*p != '\0') {
            *p++ = '\0';
        }
        free(tok);
    }
}

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* A new copy of S[0..n) without surrounding whitespace; NULL when empty or it holds a
 * control character (not a token). */
static char *trimmed(const char *s, size_t n)
{
    while (n > 0 && is_space(s[n - 1])) {
        n--;
    }
    while (n > 0 && is_space(*s)) {
        s++;
        n--;
    }
    for (size_t i = 0; i < n; i++) {
        if ((unsigned char)s[i] < 0x21 || s[i] == 0x7f) {
            return NULL;
        }
    }
    return n > 0 ? xstrndup(s, n) : NULL;
}

int runner_token_read(char **out, const struct runner_config *cfg, struct err *err)
{
    char buf[RUNNER_TOKEN_MAX + 1];
    ssize_t n = 0, r;
    int fd;

    *out = NULL;
    if (cfg->token_env != NULL) {
        *out = trimmed(cfg->token_env, strlen(cfg->token_env));
        return *out != NULL ? E_OK : err_set(err, E_FAIL, "DIVERGE_MACAROON_TOKEN is malformed");
    }
    /* No O_NOFOLLOW: mounted secrets are often symlinks. */
    fd = open(cfg->token_file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return err_set(err, E_FAIL, "cannot open the token file: %s", strerror(errno));
    }
    while ((size_t)n < sizeof(buf) &&
           ((r = read(fd, buf + n, sizeof(buf) - (size_t)n)) > 0 || (r < 0 && errno == EINTR))) {
        n += r > 0 ? r : 0;
    }
    close(fd);
    if ((size_t)n > RUNNER_TOKEN_MAX) {
        return err_set(err, E_FAIL, "the token file is larger than %d bytes", RUNNER_TOKEN_MAX);
    }
    *out = trimmed(buf, (size_t)n);
    memset(buf, 0, sizeof(buf));
    return *out != NULL ? E_OK : err_set(err, E_FAIL, "the token file is empty or malformed");
}

char *runner_token_model(const char *token)
{
    struct token *t = NULL;
    char *model = NULL;

    if (token == NULL || token_decode(&t, token, strlen(token), NULL) != E_OK) {
        return NULL;
    }
    for (size_t i = 0; i < token_caveat_count(t) && model == NULL; i++) {
        const char *c = token_caveat(t, i);
        const char *eq = strchr(c, '=');
        size_t k;
        if (eq == NULL || strncmp(c, "models", 6) != 0) {
            continue;
        }
        for (k = 6; c + k < eq && c[k] == ' '; k++) {
        }
        if (c + k != eq) {
            continue; /* another caveat whose name starts with "models" */
        }
        eq++;
        while (*eq == ' ') {
            eq++;
        }
        k = strcspn(eq, ", ");
        if (k > 0 && k <= RUNNER_MODEL_MAX) {
            model = xstrndup(eq, k);
        }
    }
    token_free(t);
    return model;
}

char *runner_meter_body(const struct runner_meter_call *call)
{
    char cost[MONEY_STR_MAX];
    json_t *j;
    char *s;

    money_format(cost, call->cost_micros);
    /* costUSD as the exact decimal string (the meter accepts it): no binary float. */
    j = json_pack("{s:s, s:I, s:I, s:s}", "requestId", call->request_id, "iteration",
                  (json_int_t)call->iteration, "tokensUsed", (json_int_t)call->tokens, "costUSD",
                  cost);
    ASSERT(j != NULL);
    if (call->model != NULL) {
        json_object_set_new(j, "model", json_string(call->model));
    }
    s = json_dumps(j, JSON_COMPACT);
    ASSERT(s != NULL);
    json_decref(j);
    return s;
}

/* A copy of S fit for a log line: at most 300 bytes of valid UTF-8, controls as '?'. */
static char *sanitised(const char *s)
{
    char tmp[301];

    err_utf8_copy(tmp, sizeof(tmp), s, strlen(s));
    for (char *p = tmp; *p != '\0'; p++) {
        if ((unsigned char)*p < 0x20 || *p == 0x7f) {
            *p = '?';
        }
    }
    return xstrdup(tmp);
}

void runner_meter_answer_parse(struct runner_meter_answer *a, long status, const char *body,
                               size_t len)
{
    json_t *j = body != NULL ? json_loadb(body, len, 0, NULL) : NULL;
    const char *g, *r;

    if (!json_is_object(j)) {
        json_decref(j);
        return;
    }
    g = json_string_value(json_object_get(j, "guidance"));
    if (status == 200 && g != NULL && *g != '\0') {
        char tmp[RUNNER_GUIDANCE_MAX + 1];
        err_utf8_copy(tmp, sizeof(tmp), g, strlen(g));
        free(a->guidance);
        a->guidance = xstrdup(tmp);
    }
    r = json_string_value(json_object_get(j, "error"));
    if (r == NULL) {
        r = json_string_value(json_object_get(j, "reason"));
    }
    if (status != 200 && r != NULL) {
        free(a->reason);
        a->reason = sanitised(r);
    }
    json_decref(j);
}

void runner_meter_answer_cleanup(struct runner_meter_answer *a)
{
    free(a->guidance);
    free(a->reason);
    a->guidance = NULL;
    a->reason = NULL;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* The meter connection kept alive from one call to the next (a heartbeat and the
 * iteration's charges reuse it: no connect, and no new server thread per call). A
 * connection the server closed meanwhile (idle timeout, a restart) is replaced by
 * libcurl, and a call that fails on it is retried with its requestId as before. */
static pthread_once_t g_pool_once = PTHREAD_ONCE_INIT;
static struct httpc_pool *g_pool;

static void pool_init(void)
{
    g_pool = httpc_pool_new(1);
}

/* One exchange with TOKEN. Returns the classification; fills A's status and texts. */
static enum runner_meter_next exchange(struct runner_meter_answer *a,
                                       const struct runner_config *cfg, const char *token,
                                       const char *body, struct err *err)
{
    struct httpc_request req = HTTPC_REQUEST_DEFAULTS;
    struct httpc_response resp;
    char *auth = xasprintf("Authorization: Bearer %s", token);
    const char *hdrs[] = {auth, "Content-Type: application/json", NULL};
    int rc;

    req.method = "POST";
    req.url = cfg->meter_socket != NULL ? RUNNER_SOCKET_URL : cfg->meter_url;
    req.unix_socket = cfg->meter_socket;
    req.ca_file = cfg->ca_file;
    req.headers = hdrs;
    req.body = body;
    req.body_len = strlen(body);
    req.timeout_ms = RUNNER_METER_TIMEOUT_MS;
    req.max_body = RUNNER_ANSWER_MAX;
    (void)pthread_once(&g_pool_once, pool_init);
    req.pool = g_pool;
    rc = httpc_request(&resp, &req, err);
    a->status = rc == E_OK ? resp.status : 0;
    if (rc == E_OK) {
        runner_meter_answer_parse(a, resp.status, resp.body.data, resp.body.len);
    }
    httpc_response_cleanup(&resp);
    runner_token_free(auth);
    return runner_meter_classify(rc, a->status);
}

/* After a 401 with token TOKEN read from the file: whether the file holds another token,
 * looking again every RUNNER_REVOKED_POLL_MS for up to cfg->revoked_wait_ms. A task being
 * paused has its sandbox frozen, this runner included, and its token revoked; a call sent
 * just before the freeze may be answered 401 once the token is revoked. On resume the
 * server writes a fresh token into the file before it thaws, so a runner caught so sees
 * the new token right after the thaw. A token that stays revoked (task deleted or
 * finished) ends the wait: the caller exits RUNNER_EXIT_UNAUTHORIZED. */
static bool new_token_arrived(const struct runner_config *cfg, const char *token)
{
    int64_t waited = 0;

    for (;;) {
        char *again = NULL;
        bool changed = runner_token_read(&again, cfg, NULL) == E_OK && strcmp(again, token) != 0;

        runner_token_free(again);
        if (changed) {
            return true;
        }
        if (waited >= cfg->revoked_wait_ms) {
            return false;
        }
        if (waited == 0) {
            runner_say("meter: token revoked (HTTP 401); waiting up to %ld ms for a new token "
                       "(a pause in progress)",
                       cfg->revoked_wait_ms);
        }
        sleep_ms(RUNNER_REVOKED_POLL_MS);
        waited += RUNNER_REVOKED_POLL_MS;
    }
}

static void say_retry(const struct runner_meter_answer *a, const struct runner_config *cfg,
                      const struct runner_meter_call *call, int attempt, const struct err *err)
{
    if (a->status != 0) {
        runner_say("meter: HTTP %ld for %s (attempt %d/%d)", a->status, call->request_id, attempt,
                   cfg->meter_attempts);
    } else if (attempt <= cfg->meter_attempts) {
        runner_say("meter: unreachable for %s (attempt %d/%d): %s", call->request_id, attempt,
                   cfg->meter_attempts, err->msg);
    } else {
        runner_say("meter: unreachable for %s (attempt %d, retrying for up to %ld s): %s",
                   call->request_id, attempt, cfg->unreachable_ms / 1000, err->msg);
    }
}

void runner_meter_send(struct runner_meter_answer *out, const struct runner_config *cfg,
                       const struct runner_meter_call *call)
{
    char *body = runner_meter_body(call);
    char *token = NULL;
    int rotations = 0;
    struct err err = {0};
    int64_t start_ns = clock_mono_ns();

    memset(out, 0, sizeof(*out));
    out->next = RUNNER_METER_RETRY;
    for (int attempt = 1;; attempt++) {
        runner_token_free(token);
        if (runner_token_read(&token, cfg, &err) != E_OK) {
            runner_say("meter: %s", err.msg);
            out->next = RUNNER_METER_UNAUTHORIZED;
            break;
        }
        runner_meter_answer_cleanup(out);
        err_clear(&err);
        out->next = exchange(out, cfg, token, body, &err);
        if (out->next == RUNNER_METER_UNAUTHORIZED && rotations < RUNNER_ROTATIONS_MAX &&
            cfg->token_env == NULL && new_token_arrived(cfg, token)) {
            /* The token was rotated while this call was on its way, or the task was being
             * paused (SPEC §4: the token is revoked in Pausing) and has been resumed with a
             * fresh token in the same file: use the new one. */
            rotations++;
            attempt--;
            continue;
        }
        if (out->next != RUNNER_METER_RETRY) {
            break;
        }
        say_retry(out, cfg, call, attempt, &err);
        /* A server that cannot be reached (its socket full, say) is waited for longer than
         * one that answers with an error. */
        if (!runner_meter_again(attempt, cfg->meter_attempts, out->status == 0,
                                (long)((clock_mono_ns() - start_ns) / 1000000),
                                cfg->unreachable_ms)) {
            break;
        }
        sleep_ms(runner_backoff_ms(attempt, cfg->backoff_ms));
    }
    runner_token_free(token);
    free(body);
}

long runner_preview_check(const struct runner_config *cfg)
{
    struct httpc_request req = HTTPC_REQUEST_DEFAULTS;
    struct httpc_response resp;
    char *hdr = xasprintf("%s: %s", cfg->preview_key, cfg->preview_value);
    const char *hdrs[] = {hdr, NULL};
    struct err err = {0};
    long status = -1;

    req.url = cfg->preview_url;
    req.ca_file = cfg->ca_file;
    req.headers = hdrs;
    req.timeout_ms = RUNNER_PREVIEW_TIMEOUT_MS;
    req.max_body = 1u << 20;
    if (httpc_request(&resp, &req, &err) == E_OK) {
        status = resp.status;
    } else if (err.code != E_TOOBIG) {
        runner_say("preview: %s", err.msg);
    } else {
        status = resp.status; /* a large page is still an answer */
    }
    httpc_response_cleanup(&resp);
    free(hdr);
    return status;
}
