/* SPDX-License-Identifier: Apache-2.0 */
/* GET /setup/github-app and GET /setup/github-app/callback: the one-click GitHub App
 * (GitHub's App manifest flow). The page posts a manifest to <github web>/settings/apps/new
 * (or an organization's) with a state bound to the admin's session; GitHub sends the
 * browser back to the callback with a code, which is exchanged at
 * POST <github api>/app-manifests/{code}/conversions once the state checks out. Admin
 * auth (bearer header or dashboard cookie) on both. The GitHub web URL comes from
 * --github-api-url: api.github.com gives https://github.com, any other its scheme and host
 * (GitHub Enterprise https://HOST/api/v3 gives https://HOST). The request log carries the
 * path only, so neither the code nor the state is ever logged. */
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/secret.h"
#include "controller/controller.h"
#include "scm/github/github.h"
#include "server/api/api_int.h"
#include "server/api/setup/setup_int.h"

#define CALLBACK_PATH "/setup/github-app/callback"
#define DESCRIPTION "Coding agents driven from pull request comments (Diverge)"

static int64_t now_ms(void)
{
    return clock_mono_ns() / 1000000;
}

/* What the state is bound to: the dashboard session of a cookie login, "" for the bearer
 * header (the admin token itself). */
static const char *binding_of(struct request *r)
{
    const char *id;

    if (http_admin_ok(r)) {
        return "";
    }
    id = ui_session_id(r);
    return id != NULL ? id : "";
}

/* A page that refuses with STATUS: TITLE, then WHY (static text). */
static int refuse(struct request *r, int status, const char *title, const char *why)
{
    const char *lines[] = {why};

    return setup_send_message(r, status, title, lines, ARRAY_LEN(lines));
}

/* The 409 of a server where this page cannot set up an App; 0 when it can. */
static int not_here(struct request *r)
{
    const char *why = setup_configured_why(r->srv);

    if (r->srv->kube != NULL) {
        return refuse(r, 409, "Not in cluster mode",
                      "With --store kubernetes the App's files would stay in one replica's "
                      "data dir. Create the App on GitHub and give every replica "
                      "--github-app-id, --github-app-key-file and --github-webhook-secret.");
    }
    return why != NULL ? refuse(r, 409, "GitHub App already configured", why) : 0;
}

/* The manifest and the URLs the page shows, for the server's public URL. */
static char *manifest_for(const char *base, char **hook_out, char **redirect_out)
{
    unsigned char raw[4];
    char suffix[2 * sizeof(raw) + 1], *name, *text;
    struct github_manifest m = {.description = DESCRIPTION, .url = base};

    /* GitHub App names are unique across GitHub: a random suffix; the user may rename it
     * on GitHub's form. */
    secret_random(raw, sizeof(raw));
    secret_hex(suffix, raw, sizeof(raw));
    name = xasprintf("diverge-%s", suffix);
    *hook_out = xasprintf("%s/api/v1/webhooks/github", base);
    *redirect_out = xasprintf("%s%s", base, CALLBACK_PATH);
    m.name = name;
    m.hook_url = *hook_out;
    m.redirect_url = *redirect_out;
    text = github_manifest_json(&m);
    free(name);
    return text;
}

int api_setup_github_app(struct request *r)
{
    const char *org = http_query(r, "org");
    struct setup_form f = {0};
    char state[GH_SETUP_STATE_LEN + 1];
    char *web, *hook = NULL, *redirect = NULL, *manifest, *action;
    int ret;

    if (!ui_auth_ok(r)) {
        return setup_send_login(r, NULL);
    }
    if ((ret = not_here(r)) != 0) {
        return ret;
    }
    if (org != NULL && org[0] == '\0') {
        org = NULL;
    }
    if (org != NULL && !github_valid_login(org, false)) {
        return refuse(r, 400, "Not an organization name",
                      "GitHub organization names are 1 to 39 letters, digits and '-', not "
                      "starting with '-'.");
    }
    web = controller_github_web_base(r->srv->cfg.github_api_url);
    if (web == NULL) {
        return refuse(r, 500, "No GitHub web URL", "--github-api-url is not an http(s) URL.");
    }
    gh_setup_state_create(state, r->srv->gh_setup, binding_of(r), now_ms());
    manifest = manifest_for(r->srv->base_url, &hook, &redirect);
    action = org != NULL
                 ? xasprintf("%s/organizations/%s/settings/apps/new?state=%s", web, org, state)
                 : xasprintf("%s/settings/apps/new?state=%s", web, state);
    f.action = action;
    f.manifest = manifest;
    f.hook_url = hook;
    f.redirect_url = redirect;
    f.web = web;
    f.org = org;
    f.no_public_url = r->srv->cfg.public_url == NULL || r->srv->cfg.public_url[0] == '\0';
    ret = setup_send_form(r, &f);
    secret_wipe(state, sizeof(state));
    free(action);
    free(manifest);
    free(hook);
    free(redirect);
    free(web);
    return ret;
}

/* Whether S is a well-formed state value: GH_SETUP_STATE_LEN lower-case hex digits. */
static bool state_valid(const char *s)
{
    return s != NULL && strlen(s) == GH_SETUP_STATE_LEN &&
           strspn(s, "0123456789abcdef") == GH_SETUP_STATE_LEN;
}

/* The 401 of the callback. A browser back from GitHub (a cross-site navigation) does not
 * send the SameSite=Strict login cookie: the page reloads itself once, from our own
 * origin, and then it does. */
static int callback_login(struct request *r, const char *code, const char *state)
{
    char *url = NULL;
    int ret;

    if (http_query(r, "reloaded") == NULL && github_manifest_code_valid(code) &&
        state_valid(state)) {
        url = xasprintf("%s?code=%s&state=%s&reloaded=1", CALLBACK_PATH, code, state);
    }
    ret = setup_send_login(r, url);
    free(url);
    return ret;
}

/* The page for a failed exchange (CODE: github_manifest_convert's). */
static int exchange_failed(struct request *r, int code, const struct err *err)
{
    const char *lines[] = {err->msg, "Start again at /setup/github-app."};

    return setup_send_message(r, code == E_AGAIN ? 503 : 502,
                              code == E_AGAIN ? "GitHub could not be reached"
                                              : "GitHub refused the App",
                              lines, ARRAY_LEN(lines));
}

/* Exchanges CODE and applies the App; answers the page. */
static int create_app(struct request *r, const char *code)
{
    struct github_app_grant g;
    struct err err = {0};
    int rc, ret;

    if (!gh_setup_begin(r->srv->gh_setup)) {
        return refuse(r, 409, "A setup is in progress",
                      "Another GitHub App setup is being completed right now; reload this "
                      "page in a moment.");
    }
    rc = github_manifest_convert(&g, r->srv->cfg.github_api_url, code, &err);
    if (rc != E_OK) {
        gh_setup_end(r->srv->gh_setup);
        return exchange_failed(r, rc, &err);
    }
    rc = setup_apply(r->srv, &g, &err);
    if (rc == E_OK) {
        ret = setup_send_done(r, &g, r->srv->cfg.data_dir);
    } else {
        const char *lines[] = {err.msg, rc == E_CONFLICT
                                            ? "Delete the App's files from the data dir and "
                                              "the App on GitHub, then start again."
                                            : "The App exists on GitHub but is not stored "
                                              "here: delete it on GitHub and start again."};
        ret = setup_send_message(r, rc == E_CONFLICT ? 409 : 500, "The App could not be stored",
                                 lines, ARRAY_LEN(lines));
    }
    github_app_grant_cleanup(&g);
    gh_setup_end(r->srv->gh_setup);
    return ret;
}

int api_setup_github_app_callback(struct request *r)
{
    const char *code = http_query(r, "code");
    const char *state = http_query(r, "state");
    int ret;

    if (!ui_auth_ok(r)) {
        return callback_login(r, code, state);
    }
    if ((ret = not_here(r)) != 0) {
        return ret;
    }
    if (!state_valid(state) ||
        !gh_setup_state_take(r->srv->gh_setup, state, binding_of(r), now_ms())) {
        return refuse(r, 403, "Unknown or expired setup",
                      "This answer from GitHub does not belong to a setup started in this "
                      "session within the last hour (or it was used already). Start again at "
                      "/setup/github-app.");
    }
    if (!github_manifest_code_valid(code)) {
        return refuse(r, 400, "No code from GitHub",
                      "GitHub's answer has no well-formed code. Start again at "
                      "/setup/github-app.");
    }
    return create_app(r, code);
}
