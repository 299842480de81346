/* SPDX-License-Identifier: Apache-2.0 */
/* Watch streams: one JSON event per line, each line capped at KUBE_EVENT_MAX and checked
 * (an object with a known type and an object carrying a resourceVersion) before the caller
 * sees it. The resourceVersion of every event and bookmark is kept in the caller's buffer
 * so a closed stream resumes where it stopped; 410 Expired is reported as its own ending. */
#include "kube/kube_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/httpc.h"

struct wstate {
    struct buf line;  /* the event being assembled; capped at KUBE_EVENT_MAX */
    char *rv;         /* the caller's KUBE_RV_MAX buffer; borrowed */
    kube_watch_fn fn; /* the caller's callback */
    void *userdata;   /* for fn */
    bool gone;        /* an ERROR event with 410 arrived */
    bool stopped;     /* the callback asked to stop */
    struct err *err;  /* the caller's, for a failure inside a chunk */
    const char *what; /* "watch agenttasks", for messages; borrowed */
};

/* What on_chunk returns to stop the transfer when the watch ends on purpose (gone or
 * stopped; the flags in struct wstate tell which): positive, so never an E_* code. */
#define STOP_MARK 1

/* Seconds a watch may run past the timeoutSeconds it asked for before we drop it. */
#define WATCH_GRACE_S 30L

static int event_type(enum kube_event *out, const char *t)
{
    static const struct {
        const char *name;
        enum kube_event type;
    } types[] = {
        {"ADDED", KUBE_EVENT_ADDED},
        {"MODIFIED", KUBE_EVENT_MODIFIED},
        {"DELETED", KUBE_EVENT_DELETED},
        {"BOOKMARK", KUBE_EVENT_BOOKMARK},
    };

    for (size_t i = 0; t != NULL && i < ARRAY_LEN(types); i++) {
        if (strcmp(t, types[i].name) == 0) {
            *out = types[i].type;
            return E_OK;
        }
    }
    return E_INVALID;
}

/* An ERROR event carries a metav1.Status: 410 means the resourceVersion is too old. */
static int error_event(struct wstate *w, const json_t *obj)
{
    json_int_t code = json_integer_value(json_object_get(obj, "code"));
    const char *reason = json_string_value(json_object_get(obj, "reason"));
    struct buf b;
    char *text;
    int rc;

    if (code == 410 ||
        (reason != NULL && (strcmp(reason, "Expired") == 0 || strcmp(reason, "Gone") == 0))) {
        w->gone = true;
        return STOP_MARK;
    }
    text = json_dumps(obj, JSON_COMPACT);
    buf_init(&b, 0);
    if (text != NULL) {
        (void)buf_puts(&b, text);
    }
    rc = kube_status_error(code >= 100 && code <= 599 ? (long)code : 500, &b, w->what, w->err);
    buf_cleanup(&b);
    free(text);
    return rc;
}

static int handle_line(struct wstate *w, const char *s, size_t n)
{
    json_t *ev = NULL, *obj;
    const char *type, *rv;
    enum kube_event t;
    int rc = E_OK;

    while (n > 0 && (s[n - 1] == '\r' || s[n - 1] == ' ' || s[n - 1] == '\t')) {
        n--;
    }
    if (n == 0) {
        return E_OK;
    }
    if (kube_parse_object(&ev, s, n, NULL) != E_OK) {
        return err_set(w->err, E_FAIL, "%s: malformed event", w->what);
    }
    type = json_string_value(json_object_get(ev, "type"));
    obj = json_object_get(ev, "object");
    if (!json_is_object(obj)) {
        rc = err_set(w->err, E_FAIL, "%s: event without an object", w->what);
    } else if (type != NULL && strcmp(type, "ERROR") == 0) {
        rc = error_event(w, obj);
    } else if (event_type(&t, type) != E_OK) {
        rc = err_set(w->err, E_FAIL, "%s: unknown event type", w->what);
    } else {
        rv =
            json_string_value(json_object_get(json_object_get(obj, "metadata"), "resourceVersion"));
        if (!kube_rv_ok(rv)) {
            rc = err_set(w->err, E_FAIL, "%s: event without a resourceVersion", w->what);
        } else {
            snprintf(w->rv, KUBE_RV_MAX, "%s", rv);
            if (w->fn(t, obj, w->userdata) != 0) {
                w->stopped = true;
                rc = STOP_MARK;
            }
        }
    }
    json_decref(ev);
    return rc;
}

static int on_chunk(const char *data, size_t len, void *userdata)
{
    struct wstate *w = userdata;

    while (len > 0) {
        const char *nl = memchr(data, '\n', len);
        size_t take = nl != NULL ? (size_t)(nl - data) : len;
        int rc;

        if (buf_append(&w->line, data, take) != E_OK) {
            return err_set(w->err, E_TOOBIG, "%s: event over %u bytes", w->what, KUBE_EVENT_MAX);
        }
        if (nl == NULL) {
            return E_OK;
        }
        rc = handle_line(w, w->line.data != NULL ? w->line.data : "", w->line.len);
        w->line.len = 0;
        if (rc != E_OK) {
            return rc;
        }
        data += take + 1;
        len -= take + 1;
    }
    return E_OK;
}

static char *watch_url(struct kube_client *c, const struct kube_resource *res, const char *ns,
                       const char *rv, const struct kube_watch_opts *opts, struct err *err)
{
    char *base = NULL, *erv, *url;
    struct buf b;

    if (kube_url(&base, c, res, ns, NULL, NULL, err) != E_OK) {
        return NULL;
    }
    buf_init(&b, 0);
    (void)buf_printf(&b, "%s?watch=true&allowWatchBookmarks=true", base);
    if (rv[0] != '\0') {
        erv = httpc_escape(rv);
        (void)buf_printf(&b, "&resourceVersion=%s", erv);
        free(erv);
    }
    if (opts != NULL && opts->timeout_s > 0) {
        (void)buf_printf(&b, "&timeoutSeconds=%ld", opts->timeout_s);
    }
    if (opts != NULL && opts->label_selector != NULL) {
        char *sel = httpc_escape(opts->label_selector);
        (void)buf_printf(&b, "&labelSelector=%s", sel);
        free(sel);
    }
    url = buf_take(&b);
    free(base);
    return url;
}

/* How the transfer that returned RC with STATUS ends the watch. */
static int finish(enum kube_watch_end *end_out, struct wstate *w, int rc, long status,
                  const struct buf *body, const atomic_int *cancel)
{
    bool ok = status >= 200 && status <= 299;

    if (rc == E_OK && ok && w->line.len > 0) {
        /* The last event may come without its newline when the server closes. */
        rc = handle_line(w, w->line.data, w->line.len);
    }
    if (w->gone || status == 410) {
        *end_out = KUBE_WATCH_GONE;
        return E_OK;
    }
    if (w->stopped || (cancel != NULL && atomic_load(cancel) != 0)) {
        *end_out = KUBE_WATCH_STOPPED;
        return E_OK;
    }
    if (rc == E_OK && !ok) {
        return kube_status_error(status, body, w->what, w->err);
    }
    return rc;
}

int kube_watch_feed(enum kube_watch_end *end_out, char rv[KUBE_RV_MAX], const char *data,
                    size_t len, size_t piece, kube_watch_fn fn, void *userdata, struct err *err)
{
    struct wstate w = {.rv = rv, .fn = fn, .userdata = userdata, .err = err, .what = "watch"};
    struct buf none;
    int rc = E_OK;

    *end_out = KUBE_WATCH_CLOSED;
    buf_init(&w.line, KUBE_EVENT_MAX);
    buf_init(&none, 0);
    for (size_t off = 0; off < len && rc == E_OK; off += piece) {
        rc = on_chunk(data + off, len - off < piece ? len - off : piece, &w);
    }
    rc =
        finish(end_out, &w, rc == STOP_MARK && (w.gone || w.stopped) ? E_OK : rc, 200, &none, NULL);
    buf_cleanup(&w.line);
    return rc;
}

int kube_watch(enum kube_watch_end *end_out, char rv[KUBE_RV_MAX], struct kube_client *c,
               const struct kube_resource *res, const char *ns, const struct kube_watch_opts *opts,
               kube_watch_fn fn, void *userdata, struct err *err)
{
    char *what = xasprintf("watch %s", res->plural);
    struct wstate w = {.rv = rv, .fn = fn, .userdata = userdata, .err = err, .what = what};
    struct kube_http_req req = {.method = "GET", .on_chunk = on_chunk, .userdata = &w};
    struct buf body;
    char *url = NULL;
    long status = 0;
    int rc;

    *end_out = KUBE_WATCH_CLOSED;
    buf_init(&w.line, KUBE_EVENT_MAX);
    buf_init(&body, KUBE_BODY_MAX);
    if (rv[0] != '\0' && !kube_rv_ok(rv)) {
        rc = err_set(err, E_INVALID, "%s: bad resourceVersion to resume from", what);
        goto out;
    }
    url = watch_url(c, res, ns, rv, opts, err);
    req.url = url;
    if (url == NULL) {
        rc = E_INVALID;
        goto out;
    }
    req.cancel = opts != NULL ? opts->cancel : NULL;
    /* The server ends the stream after timeoutSeconds; a stream that outlives that by a
     * margin is a dead connection, not a quiet watch. */
    if (opts != NULL && opts->timeout_s > 0) {
        req.timeout_ms = (opts->timeout_s + WATCH_GRACE_S) * 1000L;
    }
    rc = kube_http_do(&status, &body, kube_client_config(c), &req, err);
    rc = finish(end_out, &w, rc, status, &body, req.cancel);
out:
    free(url);
    buf_cleanup(&w.line);
    buf_cleanup(&body);
    free(what);
    return rc;
}
