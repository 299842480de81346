/* SPDX-License-Identifier: Apache-2.0 */
/* The dashboard's pages (SPEC §12): GET / (the page), GET /ui/<file> (its CSS and JS, built
 * into the binary from ui/), GET /ui/login?token=… (starts a session, sets its id as the
 * diverge_token cookie, __Host-diverge_token over TLS, and redirects to /), POST
 * /ui/logout (ends it). Auth: the admin bearer header or a live session cookie (never the
 * admin token itself: other services on the host receive the cookie too); otherwise a 401
 * page that says how to log in. Read-only: nothing here changes anything but the
 * browser's session. The login URL's query string is never logged: request logs carry the
 * path only. */
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/secret.h"
#include "server/api/api_int.h"
#include "server/api/ui/ui_assets.h"

#define UI_COOKIE "diverge_token"
#define UI_COOKIE_TLS "__Host-diverge_token" /* the browser keeps it to this origin, Secure */
#define UI_CSP "default-src 'self'"

static const char g_login_page[] =
    "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
    "<title>Diverge: log in</title></head><body>\n"
    "<h1>Diverge dashboard: log in</h1>\n"
    "<p>This page needs a login with the admin token. Open</p>\n"
    "<pre>http://&lt;host&gt;:&lt;port&gt;/ui/login?token=&lt;token&gt;</pre>\n"
    "<p>The token is the content of <code>&lt;data-dir&gt;/api-token</code> (or of "
    "<code>--api-token-file</code>); <code>diverge serve</code> prints this URL when it "
    "starts on a terminal. The login sets an HttpOnly session cookie (valid for 12 hours, "
    "until you log out or the server restarts) and brings you back here. Scripts may send "
    "<code>Authorization: Bearer &lt;token&gt;</code> instead.</p>\n</body></html>\n";

static bool over_tls(struct request *r)
{
    return MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_PROTOCOL) != NULL;
}

static const char *cookie_name(struct request *r)
{
    return over_tls(r) ? UI_COOKIE_TLS : UI_COOKIE;
}

static int64_t now_ms(void)
{
    return clock_mono_ns() / 1000000;
}

static const char *session_cookie(struct request *r)
{
    return MHD_lookup_connection_value(r->conn, MHD_COOKIE_KIND, cookie_name(r));
}

bool ui_auth_ok(struct request *r)
{
    return http_admin_ok(r) || ui_session_valid(r->srv->sessions, session_cookie(r), now_ms());
}

bool ui_same_origin(struct request *r)
{
    const char *origin = http_header(r, "Origin");
    const char *host = http_header(r, MHD_HTTP_HEADER_HOST);
    const char *rest;

    if (origin == NULL) {
        return true;
    }
    if (host == NULL) {
        return false;
    }
    if (strncmp(origin, "http://", 7) == 0) {
        rest = origin + 7;
    } else if (strncmp(origin, "https://", 8) == 0) {
        rest = origin + 8;
    } else {
        return false;
    }
    return strcmp(rest, host) == 0;
}

/* Headers every dashboard response carries. */
static void harden(struct MHD_Response *resp)
{
    MHD_add_response_header(resp, "Content-Security-Policy", UI_CSP);
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(resp, "X-Frame-Options", "DENY");
    MHD_add_response_header(resp, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
}

static int send_static(struct request *r, int status, const char *type, const void *data,
                       size_t len)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, (void *)(uintptr_t)data, MHD_RESPMEM_PERSISTENT);
    enum MHD_Result ret;

    if (resp == NULL) {
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    harden(resp);
    http_guard_answering(r->conn);
    r->status = status;
    ret = MHD_queue_response(r->conn, (unsigned int)status, resp);
    MHD_destroy_response(resp);
    return ret;
}

int ui_send_html(struct request *r, int status, const char *html)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        strlen(html), (void *)(uintptr_t)html, MHD_RESPMEM_MUST_COPY);
    enum MHD_Result ret;

    if (resp == NULL) {
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/html; charset=utf-8");
    harden(resp);
    http_guard_answering(r->conn);
    r->status = status;
    ret = MHD_queue_response(r->conn, (unsigned int)status, resp);
    MHD_destroy_response(resp);
    return ret;
}

const char *ui_session_id(struct request *r)
{
    const char *id = session_cookie(r);

    return ui_session_valid(r->srv->sessions, id, now_ms()) ? id : NULL;
}

static int send_login_page(struct request *r)
{
    return send_static(r, 401, "text/html; charset=utf-8", g_login_page, sizeof(g_login_page) - 1);
}

static const struct ui_asset *asset(const char *path)
{
    for (const struct ui_asset *a = ui_assets; a->path != NULL; a++) {
        if (strcmp(a->path, path) == 0) {
            return a;
        }
    }
    return NULL;
}

static int send_asset(struct request *r, const char *path)
{
    const struct ui_asset *a = asset(path);

    if (!ui_auth_ok(r)) {
        return send_login_page(r);
    }
    if (a == NULL) {
        return http_send_error(r, 404, NULL, NULL, "no such path");
    }
    return send_static(r, 200, a->content_type, a->data, a->len);
}

int api_ui_index(struct request *r)
{
    return send_asset(r, "index.html");
}

int api_ui_file(struct request *r)
{
    return send_asset(r, r->params[0]);
}

/* A 303 to LOCATION that sets COOKIE (wiped by the caller). */
static int send_redirect(struct request *r, const char *location, const char *cookie)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    enum MHD_Result ret;

    if (resp == NULL) {
        return MHD_NO;
    }
    harden(resp);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_SET_COOKIE, cookie); /* MHD copies */
    MHD_add_response_header(resp, MHD_HTTP_HEADER_LOCATION, location);
    http_guard_answering(r->conn);
    r->status = 303;
    ret = MHD_queue_response(r->conn, MHD_HTTP_SEE_OTHER, resp);
    MHD_destroy_response(resp);
    return ret;
}

int api_ui_login(struct request *r)
{
    const char *token = http_query(r, "token");
    char id[UI_SESSION_ID_LEN + 1];
    char *cookie;
    int ret;

    if (token == NULL || !http_admin_token_is(r, token)) {
        return send_login_page(r);
    }
    ui_session_create(id, r->srv->sessions, now_ms());
    cookie = xasprintf("%s=%s; %sHttpOnly; SameSite=Strict; Path=/", cookie_name(r), id,
                       over_tls(r) ? "Secure; " : "");
    secret_wipe(id, sizeof(id));
    ret = send_redirect(r, "/", cookie);
    secret_wipe(cookie, strlen(cookie));
    free(cookie);
    return ret;
}

int api_ui_logout(struct request *r)
{
    char *cookie;
    int ret;

    /* SameSite=Strict keeps the cookie off cross-site posts; a foreign Origin is refused
     * as well, for browsers that send the cookie anyway. */
    if (!ui_same_origin(r)) {
        return http_send_error(r, 403, NULL, NULL, "cross-origin logout is refused");
    }
    if (!ui_session_end(r->srv->sessions, session_cookie(r), now_ms())) {
        return send_login_page(r);
    }
    cookie = xasprintf("%s=; Max-Age=0; %sHttpOnly; SameSite=Strict; Path=/", cookie_name(r),
                       over_tls(r) ? "Secure; " : "");
    ret = send_redirect(r, "/ui/login", cookie);
    free(cookie);
    return ret;
}
