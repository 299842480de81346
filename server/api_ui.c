/* SPDX-License-Identifier: Apache-2.0 */
/* The dashboard's pages (SPEC §12): GET / (the page), GET /ui/<file> (its CSS and JS, built
 * into the binary from ui/), GET /ui/login?token=… (sets the diverge_token cookie and
 * redirects to /). Auth: the admin bearer header or that cookie, compared in constant
 * time; otherwise a 401 page that says how to log in. Read-only: nothing here changes
 * anything but the browser's cookie. The login URL's query string is never logged:
 * request logs carry the path only. */
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>

#include "common/secret.h"
#include "server/server_int.h"
#include "server/ui_assets.h"

#define UI_COOKIE "diverge_token"
#define UI_CSP "default-src 'self'"

static const char g_login_page[] =
    "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
    "<title>Diverge: log in</title></head><body>\n"
    "<h1>Diverge dashboard: log in</h1>\n"
    "<p>This page needs the admin token. Open the login URL that <code>diverge serve</code> "
    "printed when it started:</p>\n"
    "<pre>dashboard: http://&lt;host&gt;:&lt;port&gt;/ui/login?token=&lt;token&gt;</pre>\n"
    "<p>The token is the content of <code>&lt;data-dir&gt;/api-token</code> (or of "
    "<code>--api-token-file</code>). The login sets an HttpOnly cookie and brings you "
    "back here. Scripts may send <code>Authorization: Bearer &lt;token&gt;</code> "
    "instead.</p>\n</body></html>\n";

bool ui_auth_ok(struct request *r)
{
    const char *cookie = MHD_lookup_connection_value(r->conn, MHD_COOKIE_KIND, UI_COOKIE);

    return http_admin_ok(r) || (cookie != NULL && http_admin_token_is(r, cookie));
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

int api_ui_login(struct request *r)
{
    const char *token = http_query(r, "token");
    struct MHD_Response *resp;
    const union MHD_ConnectionInfo *tls;
    char *cookie;
    enum MHD_Result ret;

    if (token == NULL || !http_admin_token_is(r, token)) {
        return send_login_page(r);
    }
    tls = MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_PROTOCOL);
    cookie = xasprintf("%s=%s; HttpOnly; SameSite=Strict; Path=/%s", UI_COOKIE, r->srv->api_token,
                       tls != NULL ? "; Secure" : "");
    resp = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    if (resp != NULL) {
        harden(resp);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_SET_COOKIE, cookie); /* MHD copies */
        MHD_add_response_header(resp, MHD_HTTP_HEADER_LOCATION, "/");
    }
    secret_wipe(cookie, strlen(cookie));
    free(cookie);
    if (resp == NULL) {
        return MHD_NO;
    }
    http_guard_answering(r->conn);
    r->status = 303;
    ret = MHD_queue_response(r->conn, MHD_HTTP_SEE_OTHER, resp);
    MHD_destroy_response(resp);
    return ret;
}
