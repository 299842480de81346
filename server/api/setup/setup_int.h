/* SPDX-License-Identifier: Apache-2.0 */
/* Declarations shared inside server/api/setup/ (the one-click GitHub App): the HTML pages
 * (setup_page.c) and the storing and applying of a new App (setup_apply.c) for the
 * handlers (api_setup.c). Nothing outside this folder includes it. */
#ifndef DIVERGE_SERVER_API_SETUP_SETUP_INT_H
#define DIVERGE_SERVER_API_SETUP_SETUP_INT_H

#include <stdbool.h>

#include "common/buf.h"
#include "common/err.h"
#include "scm/github/github.h"
#include "server/http/http.h"

/* --- pages (setup_page.c): every piece of text is HTML-escaped --- */

/* Appends S to B with & < > " ' escaped (safe in text and in quoted attributes). */
void setup_html_escape(struct buf *b, const char *s);
/* Sends a page of STATUS: TITLE as heading, then each non-NULL line of LINES (plain text,
 * escaped) as a paragraph. */
int setup_send_message(struct request *r, int status, const char *title, const char *const *lines,
                       size_t n_lines);
/* What the setup form shows and posts (all borrowed). */
struct setup_form {
    const char *action;   /* <github web>/[organizations/ORG/]settings/apps/new?state=S */
    const char *manifest; /* the manifest JSON */
    const char *hook_url, *redirect_url, *web;
    const char *org;    /* the organization, or NULL: the user's account */
    bool no_public_url; /* --public-url is unset: warn that GitHub cannot reach us */
};
int setup_send_form(struct request *r, const struct setup_form *f);
/* The 401 page of the callback: it reloads itself once (same-site, so that the browser now
 * sends its SameSite=Strict dashboard cookie, which it held back on the redirect from
 * GitHub) when RELOAD_URL is not NULL, and says how to log in. */
int setup_send_login(struct request *r, const char *reload_url);
/* The page after a successful setup (G: the new App; nothing secret is shown). */
int setup_send_done(struct request *r, const struct github_app_grant *g, const char *data_dir);

/* --- storing and applying (setup_apply.c) --- */

/* Why a new App cannot be set up on SRV (a static sentence with the fix), or NULL: the
 * App flags or --github-webhook-secret are given, an App is stored already, or one of its
 * files is left over. Takes srv->gh_mu. */
const char *setup_configured_why(struct server *srv);
/* Writes G's key, webhook secret and id (last) into the data dir (0600, atomically) and
 * makes the running server use them: the shared credentials become the App, the webhook
 * secret is live, and a GitHub provider is added when none was configured. E_CONFLICT
 * when a file exists already (nothing is left written), E_FAIL. */
int setup_apply(struct server *srv, const struct github_app_grant *g, struct err *err);

#endif
