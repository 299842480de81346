/* SPDX-License-Identifier: Apache-2.0 */
/* The pure half of the runner's LLM relay (SPEC §13, last bullet): parsing the agent's
 * request head and chunked body (hostile bytes: every limit is checked, nothing is
 * trusted), the headers and target sent on with the current token in place of the
 * placeholder key, the response head given back, and the agent's environment. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/httpc.h"
#include "runner/runner_int.h"

/* Request headers never sent on: hop-by-hop ones (RFC 9110 §7.6.1), the framing the
 * relay redoes (the body is sent with its own Content-Length) and Host (the target's). */
static const char *const g_req_drop[] = {
    "connection", "keep-alive",        "proxy-connection", "proxy-authorization", "te",
    "trailer",    "transfer-encoding", "upgrade",          "content-length",      "host",
    "expect",
};

/* Response headers never given back: hop-by-hop ones and the framing the relay redoes
 * (chunked, Connection: close). */
static const char *const g_resp_drop[] = {
    "connection", "keep-alive", "proxy-connection",  "te",
    "trailer",    "upgrade",    "transfer-encoding", "content-length",
};

/* The provider key headers whose value becomes the current token. */
static const char *const g_key_headers[] = {"x-api-key", "x-goog-api-key"};

static bool in_list(const char *name, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (strcasecmp(name, list[i]) == 0) {
            return true;
        }
    }
    return false;
}

/* RFC 9110 tchar. */
static bool tchar(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static bool token_ok(const char *s, size_t n)
{
    if (n == 0) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\0' || !tchar((unsigned char)s[i])) {
            return false;
        }
    }
    return true;
}

/* A field value: visible bytes, spaces and tabs (obs-text allowed), no NUL or CR/LF. */
static bool value_ok(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f) {
            return false;
        }
    }
    return true;
}

void runner_llm_head_cleanup(struct runner_llm_head *h)
{
    free(h->store);
    free(h->headers);
    memset(h, 0, sizeof(*h));
    h->content_length = -1;
}

/* PATH[0..n) holds no "." or ".." segment and no escaped dot ("%2e"). */
static bool segments_ok(const char *path, size_t n)
{
    size_t seg = 0;

    for (size_t i = 0; i <= n; i++) {
        if (i == n || path[i] == '/') {
            size_t len = i - seg;
            if ((len == 1 && path[seg] == '.') ||
                (len == 2 && path[seg] == '.' && path[seg + 1] == '.')) {
                return false;
            }
            seg = i + 1;
        } else if (path[i] == '%' && i + 2 < n && path[i + 1] == '2' &&
                   (path[i + 2] | 0x20) == 'e') {
            return false;
        }
    }
    return true;
}

/* TARGET[0..n) is origin-form under RUNNER_LLM_PREFIX, of visible ASCII without a
 * backslash, fragment or dot segment: the relay reaches the LLM routes and nothing else. */
static bool target_ok(const char *t, size_t n)
{
    const char *q = memchr(t, '?', n);
    size_t path = q != NULL ? (size_t)(q - t) : n;

    if (n > RUNNER_LLM_TARGET_MAX || path < strlen(RUNNER_LLM_PREFIX) ||
        memcmp(t, RUNNER_LLM_PREFIX, strlen(RUNNER_LLM_PREFIX)) != 0) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)t[i];
        if (c <= 0x20 || c >= 0x7f || c == '#' || c == '\\') {
            return false;
        }
    }
    return segments_ok(t, path);
}

/* "METHOD SP target SP HTTP/1.x" in LINE[0..n). */
static int parse_request_line(struct runner_llm_head *h, char *line, size_t n, struct err *err)
{
    char *sp1 = memchr(line, ' ', n), *sp2;
    size_t mlen, tlen;

    if (sp1 == NULL) {
        return err_set(err, E_INVALID, "malformed request line");
    }
    mlen = (size_t)(sp1 - line);
    sp2 = memchr(sp1 + 1, ' ', n - mlen - 1);
    if (sp2 == NULL || mlen == 0 || mlen >= sizeof(h->method)) {
        return err_set(err, E_INVALID, "malformed request line");
    }
    for (size_t i = 0; i < mlen; i++) {
        if (line[i] < 'A' || line[i] > 'Z') {
            return err_set(err, E_INVALID, "malformed request method");
        }
    }
    tlen = (size_t)(sp2 - sp1 - 1);
    if ((size_t)(line + n - sp2 - 1) != 8 ||
        (memcmp(sp2 + 1, "HTTP/1.1", 8) != 0 && memcmp(sp2 + 1, "HTTP/1.0", 8) != 0)) {
        return err_set(err, E_INVALID, "not an HTTP/1.x request");
    }
    memcpy(h->method, line, mlen);
    h->method[mlen] = '\0';
    if (!target_ok(sp1 + 1, tlen)) {
        return err_set(err, E_NOTFOUND, "only " RUNNER_LLM_PREFIX " is relayed");
    }
    h->target = sp1 + 1;
    *sp2 = '\0'; /* inside h->store: the target is a string */
    return E_OK;
}

/* Content-Length / Transfer-Encoding of one header into H. */
static int framing(struct runner_llm_head *h, const char *name, const char *value, struct err *err)
{
    if (strcasecmp(name, "content-length") == 0) {
        char *end = NULL;
        long long v;
        if (*value < '0' || *value > '9' || strlen(value) > 12) {
            return err_set(err, E_INVALID, "malformed content-length");
        }
        v = strtoll(value, &end, 10);
        if (*end != '\0' || (h->content_length >= 0 && h->content_length != v)) {
            return err_set(err, E_INVALID, "malformed content-length");
        }
        h->content_length = v;
        return v > (long long)RUNNER_LLM_BODY_MAX ? err_set(err, E_TOOBIG, "request body too large")
                                                  : E_OK;
    }
    if (strcasecmp(name, "transfer-encoding") == 0) {
        if (strcasecmp(value, "chunked") != 0 || h->chunked) {
            return err_set(err, E_INVALID, "unsupported transfer-encoding");
        }
        h->chunked = true;
    } else if (strcasecmp(name, "expect") == 0) {
        h->expect_continue = strcasecmp(value, "100-continue") == 0;
    }
    return E_OK;
}

/* One "Name: value" line LINE[0..n) (inside h->store) into H. */
static int parse_header(struct runner_llm_head *h, char *line, size_t n, struct err *err)
{
    char *colon = memchr(line, ':', n), *v, *end = line + n;

    if (colon == NULL || !token_ok(line, (size_t)(colon - line))) {
        return err_set(err, E_INVALID, "malformed header line");
    }
    if (h->nheaders >= RUNNER_LLM_HEADERS_MAX) {
        return err_set(err, E_TOOBIG, "too many header lines");
    }
    *colon = '\0';
    v = colon + 1;
    while (v < end && (*v == ' ' || *v == '\t')) {
        v++;
    }
    while (end > v && (end[-1] == ' ' || end[-1] == '\t')) {
        end--;
    }
    if (!value_ok(v, (size_t)(end - v))) {
        return err_set(err, E_INVALID, "malformed header value");
    }
    *end = '\0';
    h->headers[h->nheaders].name = line;
    h->headers[h->nheaders].value = v;
    h->nheaders++;
    return framing(h, line, v, err);
}

/* The next line of S[*pos..len): its start and length without CRLF (or bare LF); false
 * when no line ending is left. */
static bool next_line(char **line, size_t *n, char *s, size_t len, size_t *pos)
{
    char *nl = memchr(s + *pos, '\n', len - *pos);

    if (nl == NULL) {
        return false;
    }
    *line = s + *pos;
    *n = (size_t)(nl - *line);
    *pos = (size_t)(nl - s) + 1;
    if (*n > 0 && (*line)[*n - 1] == '\r') {
        (*n)--;
    }
    return true;
}

int runner_llm_head_parse(struct runner_llm_head *h, const char *head, size_t len, struct err *err)
{
    char *line;
    size_t n, pos = 0;
    int rc;

    memset(h, 0, sizeof(*h));
    h->content_length = -1;
    if (len > RUNNER_LLM_HEAD_MAX) {
        return err_set(err, E_TOOBIG, "request head too large");
    }
    h->store = xmalloc(len + 1);
    memcpy(h->store, head, len);
    h->store[len] = '\0';
    h->headers = xcalloc(RUNNER_LLM_HEADERS_MAX, sizeof(*h->headers));
    if (!next_line(&line, &n, h->store, len, &pos)) {
        return err_set(err, E_INVALID, "malformed request line");
    }
    rc = parse_request_line(h, line, n, err);
    while (rc == E_OK && next_line(&line, &n, h->store, len, &pos) && n > 0) {
        if (line[0] == ' ' || line[0] == '\t') {
            return err_set(err, E_INVALID, "folded header line");
        }
        rc = parse_header(h, line, n, err);
    }
    if (rc == E_OK && h->chunked && h->content_length >= 0) {
        rc = err_set(err, E_INVALID, "both content-length and transfer-encoding");
    }
    return rc;
}

char *runner_llm_target(const char *target, const char *token)
{
    const char *q = strchr(target, '?');
    struct buf out;
    char *tok;

    if (q == NULL) {
        return xstrdup(target);
    }
    tok = httpc_escape(token);
    buf_init(&out, 0);
    buf_append(&out, target, (size_t)(q - target) + 1);
    for (const char *p = q + 1; *p != '\0';) {
        size_t n = strcspn(p, "&");
        if (n >= 4 && memcmp(p, "key=", 4) == 0) {
            buf_printf(&out, "key=%s", tok);
        } else {
            buf_append(&out, p, n);
        }
        p += n;
        if (*p == '&') {
            buf_append(&out, "&", 1);
            p++;
        }
    }
    runner_token_free(tok);
    return buf_take(&out);
}

char **runner_llm_upstream_headers(const struct runner_llm_head *h, const char *token)
{
    char **lines = xcalloc(h->nheaders + 1, sizeof(*lines));
    size_t n = 0;

    for (size_t i = 0; i < h->nheaders; i++) {
        const char *name = h->headers[i].name, *value = h->headers[i].value;
        if (in_list(name, g_req_drop, ARRAY_LEN(g_req_drop))) {
            continue;
        }
        if (strcasecmp(name, "authorization") == 0) {
            lines[n++] = xasprintf("%s: Bearer %s", name, token);
        } else if (in_list(name, g_key_headers, ARRAY_LEN(g_key_headers))) {
            lines[n++] = xasprintf("%s: %s", name, token);
        } else if (*value == '\0') {
            lines[n++] = xasprintf("%s;", name); /* curl's way to send an empty header */
        } else {
            lines[n++] = xasprintf("%s: %s", name, value);
        }
    }
    lines[n] = NULL;
    return lines;
}

void runner_llm_lines_free(char **lines)
{
    for (size_t i = 0; lines != NULL && lines[i] != NULL; i++) {
        runner_token_free(lines[i]); /* some hold the token: wiped */
    }
    free(lines);
}

static const char *reason(long status)
{
    static const struct {
        long status;
        const char *text;
    } t[] = {{200, "OK"},
             {201, "Created"},
             {204, "No Content"},
             {304, "Not Modified"},
             {400, "Bad Request"},
             {401, "Unauthorized"},
             {402, "Payment Required"},
             {403, "Forbidden"},
             {404, "Not Found"},
             {408, "Request Timeout"},
             {413, "Content Too Large"},
             {429, "Too Many Requests"},
             {431, "Request Header Fields Too Large"},
             {500, "Internal Server Error"},
             {502, "Bad Gateway"},
             {503, "Service Unavailable"},
             {504, "Gateway Timeout"},
             {529, "Overloaded"}};

    for (size_t i = 0; i < ARRAY_LEN(t); i++) {
        if (t[i].status == status) {
            return t[i].text;
        }
    }
    return "Status";
}

char *runner_llm_reply_head(long status, const char *pairs, size_t len, bool head_request)
{
    bool body = !head_request && status != 204 && status != 304;
    const char *p = pairs, *end = pairs + len;
    struct buf out;

    buf_init(&out, 0);
    buf_printf(&out, "HTTP/1.1 %03ld %s\r\n", status, reason(status));
    while (p != NULL && p < end) {
        const char *value = p + strlen(p) + 1;
        if (value >= end) {
            break;
        }
        /* A HEAD answer keeps its Content-Length: it tells the size of the GET's body. */
        bool keep_len = head_request && strcasecmp(p, "content-length") == 0;
        if (token_ok(p, strlen(p)) && value_ok(value, strlen(value)) &&
            (keep_len || !in_list(p, g_resp_drop, ARRAY_LEN(g_resp_drop)))) {
            buf_printf(&out, "%s: %s\r\n", p, value);
        }
        p = value + strlen(value) + 1;
    }
    buf_printf(&out, "%sConnection: close\r\n\r\n", body ? "Transfer-Encoding: chunked\r\n" : "");
    return buf_take(&out);
}

/* Hex digits of a chunk size at S[0..n) (extensions after ';' ignored); -1 when junk. */
static long long chunk_size(const char *s, size_t n)
{
    long long v = 0;
    size_t i = 0;

    for (; i < n && s[i] != ';' && s[i] != ' ' && s[i] != '\t'; i++) {
        int d = (s[i] >= '0' && s[i] <= '9')   ? s[i] - '0'
                : (s[i] >= 'a' && s[i] <= 'f') ? s[i] - 'a' + 10
                : (s[i] >= 'A' && s[i] <= 'F') ? s[i] - 'A' + 10
                                               : -1;
        if (d < 0 || v > (long long)RUNNER_LLM_BODY_MAX) {
            return -1;
        }
        v = v * 16 + d;
    }
    return i == 0 ? -1 : v;
}

/* The next data bytes of the current chunk at IN[*pos..len) into OUT. */
static int dechunk_data(struct runner_llm_chunked *c, struct buf *out, const char *in, size_t len,
                        size_t *pos)
{
    size_t take = len - *pos < (size_t)c->left ? len - *pos : (size_t)c->left;

    if (buf_append(out, in + *pos, take) != E_OK) {
        return E_TOOBIG;
    }
    *pos += take;
    c->left -= (long long)take;
    c->need_crlf = c->left == 0;
    return E_OK;
}

/* A framing line LINE[0..n) (no line end): a chunk size, the CRLF after a chunk's data,
 * or a trailer line (ignored; the empty one ends the body). */
static int dechunk_line(struct runner_llm_chunked *c, const char *line, size_t n)
{
    long long size;

    if (c->need_crlf) {
        c->need_crlf = false;
        return n == 0 ? E_OK : E_INVALID;
    }
    if (c->trailers > 0) {
        c->done = n == 0;
        return ++c->trailers > RUNNER_LLM_TRAILERS_MAX ? E_INVALID : E_OK;
    }
    size = chunk_size(line, n);
    if (size < 0) {
        return E_INVALID;
    }
    c->left = size;
    c->trailers = size == 0 ? 1 : 0;
    return E_OK;
}

/* One step of decoding at IN[*pos..len): E_OK when it moved on, E_AGAIN when it needs
 * more bytes, E_INVALID or E_TOOBIG. */
static int dechunk_step(struct runner_llm_chunked *c, struct buf *out, const char *in, size_t len,
                        size_t *pos)
{
    const char *nl;
    size_t n;

    if (c->left > 0) {
        return dechunk_data(c, out, in, len, pos);
    }
    nl = memchr(in + *pos, '\n', len - *pos);
    if (nl == NULL) {
        return len - *pos > RUNNER_LLM_CHUNK_LINE_MAX ? E_INVALID : E_AGAIN;
    }
    n = (size_t)(nl - (in + *pos));
    if (n > RUNNER_LLM_CHUNK_LINE_MAX) {
        return E_INVALID;
    }
    *pos += n + 1;
    return dechunk_line(c, nl - n, n > 0 && nl[-1] == '\r' ? n - 1 : n);
}

int runner_llm_dechunk(struct runner_llm_chunked *c, struct buf *out, const char *in, size_t len,
                       size_t *used)
{
    size_t pos = 0;
    int rc = E_OK;

    while (rc == E_OK && !c->done && pos < len) {
        rc = dechunk_step(c, out, in, len, &pos);
    }
    *used = pos;
    if (c->done) {
        return E_OK;
    }
    return rc == E_OK ? E_AGAIN : rc;
}

void runner_llm_env(char *out[RUNNER_LLM_ENV_COUNT + 1], uint16_t port)
{
    const char *base = "http://127.0.0.1";
    size_t n = 0;

    out[n++] = xasprintf("DIVERGE_LLM_URL=%s:%u/api/v1/llm", base, (unsigned)port);
    out[n++] = xasprintf("ANTHROPIC_BASE_URL=%s:%u/api/v1/llm/anthropic", base, (unsigned)port);
    out[n++] = xasprintf("OPENAI_BASE_URL=%s:%u/api/v1/llm/openai/v1", base, (unsigned)port);
    out[n++] = xasprintf("GOOGLE_GEMINI_BASE_URL=%s:%u/api/v1/llm/gemini", base, (unsigned)port);
    out[n++] = xstrdup("ANTHROPIC_API_KEY=" RUNNER_LLM_PLACEHOLDER);
    out[n++] = xstrdup("OPENAI_API_KEY=" RUNNER_LLM_PLACEHOLDER);
    out[n++] = xstrdup("GEMINI_API_KEY=" RUNNER_LLM_PLACEHOLDER);
    out[n] = NULL;
    ASSERT(n == RUNNER_LLM_ENV_COUNT);
}
