/* SPDX-License-Identifier: Apache-2.0 */
/* POST /api/v1/webhooks/github: refuse a delivery without a signature before its body is
 * read, verify the signature on the raw bytes (hashed as they arrive), throw away what
 * cannot be a command as cheaply as possible, and commit the rest to the durable inbox
 * before answering 202. No outbound call happens here. */
#include <microhttpd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bot/slashcmd.h"
#include "common/jsonscan.h"
#include "common/log.h"
#include "common/secret.h"
#include "scm/github/github.h"
#include "server/api/api_int.h"

void api_comment_hint(struct server *srv, const char *text)
{
    /* The parse only where a hint does anything: the webhook's hot path stays as it was. */
    if (controller_warms(srv->controller) && text != NULL &&
        slashcmd_asks_fix(text, strlen(text))) {
        controller_start_coming(srv->controller);
    }
}

static int accepted(struct request *r, const struct inbox_entry *e)
{
    bool dup = false;
    struct err err = {0};

    if (task_store_inbox_add(&dup, r->srv->store, e, &err) != E_OK) {
        return http_send_error(r, 503, NULL, NULL, "could not store the delivery: %s; retry",
                               err.msg);
    }
    if (dup) {
        return http_send_json(r, 200, json_pack("{s:b}", "duplicate", 1));
    }
    {
        char num[32];
        snprintf(num, sizeof(num), "%lld", (long long)e->number);
        log_kv(LOG_INFO, "comment_accepted", "provider", e->provider, "project", e->project,
               "number", num, "comment", e->comment_id, "author", e->author, NULL);
    }
    return http_send_json(r, 202, json_pack("{s:b}", "accepted", 1));
}

/* A copy of the live webhook secret(s), or NULL: the one-click App setup may set them
 * while the server runs (caller wipes and frees). */
static char *secret_dup(struct server *srv)
{
    char *s = NULL;

    pthread_mutex_lock(&srv->gh_mu);
    if (srv->cfg.github_webhook_secret != NULL && srv->cfg.github_webhook_secret[0] != '\0') {
        s = xstrdup(srv->cfg.github_webhook_secret);
    }
    pthread_mutex_unlock(&srv->gh_mu);
    return s;
}

int api_webhook_github_begin(struct request *r)
{
    struct err err = {0};
    char *secret;
    int rc;

    secret = secret_dup(r->srv);
    if (secret == NULL) {
        return http_send_error(r, 503, NULL, NULL,
                               "GitHub webhooks are not configured (no --github-webhook-secret; "
                               "or set up a GitHub App at /setup/github-app)");
    }
    if (http_header(r, "X-Hub-Signature-256") == NULL) {
        rc = http_send_error(r, 401, NULL, NULL, "missing X-Hub-Signature-256");
    } else if (http_header(r, "X-GitHub-Event") == NULL) {
        rc = http_send_error(r, 400, NULL, NULL, "missing X-GitHub-Event header");
    } else if (github_webhook_mac_new(&r->gh_mac, secret, http_header(r, "X-Hub-Signature-256"),
                                      &err) != E_OK) {
        rc = http_send_error(r, 401, NULL, NULL, "%s", err.msg);
    } else {
        rc = MHD_YES;
    }
    secret_wipe(secret, strlen(secret));
    free(secret);
    return rc;
}

int api_webhook_github(struct request *r)
{
    const char *event = http_header(r, "X-GitHub-Event");
    const char *delivery = http_header(r, "X-GitHub-Delivery");
    const char *body = r->body.data != NULL ? r->body.data : "";
    enum github_event kind;
    struct inbox_entry e;
    const char *why = "";
    struct err err = {0};
    int ret;

    /* api_webhook_github_begin answered every request without a secret or a well-formed
     * signature header; the HMAC was computed as the body arrived. */
    ASSERT(r->gh_mac != NULL);
    if (github_webhook_mac_check(r->gh_mac, &err) != E_OK) {
        return http_send_error(r, 401, NULL, NULL, "%s", err.msg);
    }
    /* Every delivery is checked as a command's is (malformed or missing fields: 400,
     * SPEC §5); a comment without "/diverge" anywhere holds no command: it is checked
     * without keeping anything, answered at once and not stored. */
    if (event != NULL && strcmp(event, "issue_comment") == 0 &&
        !slashcmd_mentions(body, r->body.len)) {
        if (github_webhook_check(&kind, &why, event, body, r->body.len, &err) != E_OK) {
            return http_send_error(r, 400, NULL, NULL, "%s", err.msg);
        }
        return http_send_text(r, 204, "application/json", "");
    }
    if (github_webhook_parse(&kind, &e, &why, event, delivery, body, r->body.len, &err) != E_OK) {
        return http_send_error(r, 400, NULL, NULL, "%s", err.msg);
    }
    switch (kind) {
    case GITHUB_EVENT_PING:
        return http_send_json(r, 200, json_pack("{s:b}", "pong", 1));
    case GITHUB_EVENT_IGNORED:
        log_kv(LOG_DEBUG, "delivery_ignored", "event", event, "why", why, NULL);
        return http_send_text(r, 204, "application/json", "");
    case GITHUB_EVENT_COMMENT:
        break;
    }
    api_comment_hint(r->srv, e.body);
    ret = accepted(r, &e);
    inbox_entry_cleanup(&e);
    return ret;
}
