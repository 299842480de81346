/* SPDX-License-Identifier: Apache-2.0 */
/* The CONNECT request-head parser and the egress log line, both pure. The head comes from
 * inside the sandbox: it is hostile, bounded by the caller's cap, and never echoed (the
 * host is logged only after egress_host_normalise accepted it). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "egress/egress.h"
#include "egress/egress_int.h"

#define METHOD_MAX 16 /* bytes of a request method we bother to read */

static const char *find_crlf(const char *s, size_t len)
{
    for (size_t i = 0; i + 1 < len; i++) {
        if (s[i] == '\r' && s[i + 1] == '\n') {
            return s + i;
        }
    }
    return NULL;
}

static const char *find_head_end(const char *s, size_t len)
{
    for (size_t i = 0; i + 3 < len; i++) {
        if (s[i] == '\r' && s[i + 1] == '\n' && s[i + 2] == '\r' && s[i + 3] == '\n') {
            return s + i;
        }
    }
    return NULL;
}

/* RFC 9110 tchar. */
static bool tchar(char c)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
        return true;
    }
    return c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* Checks the request line LINE (LEN bytes, no CRLF): E_OK for a CONNECT with its target
 * in *TARGET and *TARGET_LEN, E_DENIED for another method, E_INVALID otherwise. */
static int parse_request_line(const char **target, size_t *target_len, const char *line, size_t len)
{
    const char *sp1 = memchr(line, ' ', len), *sp2;
    size_t mlen, rest;

    if (sp1 == NULL) {
        return E_INVALID;
    }
    mlen = (size_t)(sp1 - line);
    if (mlen == 0 || mlen > METHOD_MAX) {
        return E_INVALID;
    }
    for (size_t i = 0; i < mlen; i++) {
        if (!tchar(line[i])) {
            return E_INVALID;
        }
    }
    rest = len - mlen - 1;
    sp2 = memchr(sp1 + 1, ' ', rest);
    if (sp2 == NULL || sp2 == sp1 + 1) {
        return E_INVALID;
    }
    *target = sp1 + 1;
    *target_len = (size_t)(sp2 - *target);
    rest = len - (size_t)(sp2 + 1 - line);
    if (rest != 8 || (memcmp(sp2 + 1, "HTTP/1.1", 8) != 0 && memcmp(sp2 + 1, "HTTP/1.0", 8) != 0)) {
        return E_INVALID;
    }
    if (mlen != 7 || memcmp(line, "CONNECT", 7) != 0) {
        return E_DENIED;
    }
    return E_OK;
}

static int parse_target(struct egress_connect_req *out, const char *t, size_t len)
{
    const char *host, *port;
    size_t host_len, port_len;

    if (egress_split_hostport(&host, &host_len, &port, &port_len, t, len) != E_OK || port == NULL ||
        egress_port_parse(&out->port, port, port_len) != E_OK) {
        return E_INVALID; /* CONNECT's authority-form always names the port */
    }
    return egress_host_normalise(out->host, &out->is_ip, &out->addr, host, host_len);
}

int egress_connect_parse(struct egress_connect_req *out, const char *buf, size_t len, size_t max)
{
    const char *eol, *end, *target = NULL;
    size_t target_len = 0;
    int rc;

    memset(out, 0, sizeof(*out));
    if (len > max) {
        len = max; /* never look past the cap */
    }
    if (memchr(buf, '\0', len) != NULL) {
        return E_INVALID;
    }
    eol = find_crlf(buf, len);
    if (eol == NULL) {
        return len >= max ? E_TOOBIG : E_AGAIN;
    }
    rc = parse_request_line(&target, &target_len, buf, (size_t)(eol - buf));
    if (rc != E_OK) {
        return rc;
    }
    /* The request line's CRLF may be the first half of the blank line's. */
    end = find_head_end(eol, len - (size_t)(eol - buf));
    if (end == NULL) {
        return len >= max ? E_TOOBIG : E_AGAIN;
    }
    if (parse_target(out, target, target_len) != E_OK) {
        memset(out, 0, sizeof(*out));
        return E_INVALID;
    }
    out->head_len = (size_t)(end - buf) + 4;
    return E_OK;
}

size_t egress_event_format(char *out, const struct egress_event *ev)
{
    char ts[CLOCK_RFC3339_MAX];
    size_t body;
    int n;

    clock_rfc3339(ts, ev->time_ms);
    n = snprintf(out, EGRESS_LINE_MAX, "%s ", ts);
    body = n > 0 ? (size_t)n : 0;
    if (ev->kind == EGRESS_EVENT_CLOSE) {
        snprintf(out + body, EGRESS_LINE_MAX - body,
                 "egress %s allowed rule=%s closed bytes_out=%" PRIu64 " bytes_in=%" PRIu64,
                 ev->hostport, ev->rule, ev->bytes_out, ev->bytes_in);
    } else if (ev->allowed) {
        snprintf(out + body, EGRESS_LINE_MAX - body, "egress %s allowed rule=%s", ev->hostport,
                 ev->rule);
    } else {
        snprintf(out + body, EGRESS_LINE_MAX - body, "egress %s denied reason=%s%s%s", ev->hostport,
                 ev->reason, ev->rule[0] != '\0' ? " rule=" : "", ev->rule);
    }
    return body;
}
