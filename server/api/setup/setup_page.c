/* SPDX-License-Identifier: Apache-2.0 */
/* The HTML of the one-click GitHub App: the form that posts the manifest to GitHub, the
 * login page of the callback, the result and the error pages. Everything that is not a
 * fixed string here goes through setup_html_escape(); no page loads anything (no script,
 * no style sheet, no CDN), and none shows a key, a secret or GitHub's code. */
#include <stdlib.h>
#include <string.h>

#include "server/api/api_int.h"
#include "server/api/setup/setup_int.h"

#define HEAD                                                                                       \
    "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"                            \
    "<meta name=\"viewport\" content=\"width=device-width\">"
#define TAIL "</body></html>\n"

void setup_html_escape(struct buf *b, const char *s)
{
    for (; *s != '\0'; s++) {
        switch (*s) {
        case '&':
            buf_puts(b, "&amp;");
            break;
        case '<':
            buf_puts(b, "&lt;");
            break;
        case '>':
            buf_puts(b, "&gt;");
            break;
        case '"':
            buf_puts(b, "&quot;");
            break;
        case '\'':
            buf_puts(b, "&#39;");
            break;
        default:
            buf_append(b, s, 1);
        }
    }
}

static void begin(struct buf *b, const char *title)
{
    buf_puts(b, HEAD "<title>Diverge: ");
    setup_html_escape(b, title);
    buf_puts(b, "</title></head><body>\n<h1>");
    setup_html_escape(b, title);
    buf_puts(b, "</h1>\n");
}

static void para(struct buf *b, const char *text)
{
    buf_puts(b, "<p>");
    setup_html_escape(b, text);
    buf_puts(b, "</p>\n");
}

/* <li>LABEL <code>VALUE</code></li> */
static void item(struct buf *b, const char *label, const char *value)
{
    buf_puts(b, "<li>");
    setup_html_escape(b, label);
    if (value != NULL) {
        buf_puts(b, " <code>");
        setup_html_escape(b, value);
        buf_puts(b, "</code>");
    }
    buf_puts(b, "</li>\n");
}

static int send(struct request *r, int status, struct buf *b)
{
    int ret;

    buf_puts(b, TAIL);
    ret = ui_send_html(r, status, b->data);
    buf_cleanup(b);
    return ret;
}

int setup_send_message(struct request *r, int status, const char *title, const char *const *lines,
                       size_t n_lines)
{
    struct buf b;

    buf_init(&b, 0);
    begin(&b, title);
    for (size_t i = 0; i < n_lines; i++) {
        if (lines[i] != NULL) {
            para(&b, lines[i]);
        }
    }
    return send(r, status, &b);
}

static void org_form(struct buf *b, const char *org)
{
    buf_puts(b, "<form method=\"get\" action=\"/setup/github-app\">\n<p><label>Create it in "
                "an organization instead (its owners only): <input name=\"org\" value=\"");
    setup_html_escape(b, org != NULL ? org : "");
    buf_puts(b, "\" maxlength=\"39\" pattern=\"[A-Za-z0-9][A-Za-z0-9-]*\"></label> "
                "<button type=\"submit\">Use this organization</button></p>\n</form>\n");
}

int setup_send_form(struct request *r, const struct setup_form *f)
{
    struct buf b;

    buf_init(&b, 0);
    begin(&b, "GitHub App in one click");
    para(&b, "GitHub creates a private GitHub App for this server from the settings below; you "
             "pick its name and confirm on GitHub, which then sends you back here. The server "
             "stores the App's id, private key and webhook secret in its data dir and uses them "
             "at once.");
    buf_puts(&b, "<ul>\n");
    item(&b, "Owner:", f->org != NULL ? f->org : "your GitHub account");
    item(&b, "Permissions: issues, pull requests and contents read and write; metadata read", NULL);
    item(&b, "Events: issue comment, pull request review comment", NULL);
    item(&b, "Webhook URL:", f->hook_url);
    item(&b, "Back to:", f->redirect_url);
    buf_puts(&b, "</ul>\n");
    if (f->no_public_url) {
        para(&b, "Warning: --public-url is not set, so these URLs name the listen address. "
                 "GitHub must reach the webhook URL: restart with --public-url set to the "
                 "address GitHub and your browser use, then reload this page.");
    }
    buf_puts(&b, "<form method=\"post\" action=\"");
    setup_html_escape(&b, f->action);
    buf_puts(&b, "\">\n<input type=\"hidden\" name=\"manifest\" value=\"");
    setup_html_escape(&b, f->manifest);
    buf_puts(&b, "\">\n<p><button type=\"submit\">Create the GitHub App on ");
    setup_html_escape(&b, f->web);
    buf_puts(&b, "</button></p>\n</form>\n");
    org_form(&b, f->org);
    para(&b, "This form works once and for one hour, in this browser session.");
    return send(r, 200, &b);
}

int setup_send_login(struct request *r, const char *reload_url)
{
    struct buf b;

    buf_init(&b, 0);
    buf_puts(&b, HEAD);
    if (reload_url != NULL) {
        buf_puts(&b, "<meta http-equiv=\"refresh\" content=\"0; url=");
        setup_html_escape(&b, reload_url);
        buf_puts(&b, "\">");
    }
    buf_puts(&b, "<title>Diverge: log in</title></head><body>\n<h1>Log in first</h1>\n");
    para(&b, "Setting up the GitHub App needs a dashboard login with the admin token: open "
             "/ui/login?token=<token> on this server (the token is the content of "
             "<data-dir>/api-token), then open /setup/github-app again. Scripts may send "
             "Authorization: Bearer <token> instead.");
    return send(r, 401, &b);
}

int setup_send_done(struct request *r, const struct github_app_grant *g, const char *data_dir)
{
    struct buf b;
    char *files = xasprintf("%s/" SERVER_GH_APP_ID_FILE ", " SERVER_GH_APP_KEY_FILE
                            " and " SERVER_GH_SECRET_FILE,
                            data_dir);

    buf_init(&b, 0);
    begin(&b, "GitHub App created");
    buf_puts(&b, "<ul>\n");
    item(&b, "App:", g->slug != NULL ? g->slug : "(no name given)");
    item(&b, "App id:", g->id);
    item(&b, "Stored in:", files);
    buf_puts(&b, "</ul>\n");
    para(&b, "The server uses the App now: webhook deliveries signed with its secret are "
             "accepted, and comments are answered as the App. After a restart it is read from "
             "the data dir again, unless --github-app-id, --github-app-key-file or "
             "--github-webhook-secret are given, which win.");
    if (g->html_url != NULL) {
        char *install = xasprintf("%s/installations/new", g->html_url);
        buf_puts(&b, "<p>Next: <a href=\"");
        setup_html_escape(&b, install);
        buf_puts(&b, "\">install the App on your repositories</a>.</p>\n");
        free(install);
    } else {
        para(&b, "Next: install the App on your repositories from its page on GitHub.");
    }
    free(files);
    return send(r, 200, &b);
}
