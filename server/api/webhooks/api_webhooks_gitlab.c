/* SPDX-License-Identifier: Apache-2.0 */
/* POST /api/v1/webhooks/gitlab: refuse a delivery without a valid X-Gitlab-Token (or a
 * fresh Standard Webhooks header set) before its body is read, verify a signature on the
 * raw bytes before anything parses them, throw away what cannot be a command as cheaply
 * as possible, and commit the rest to the durable inbox before answering 202. */
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bot/slashcmd.h"
#include "common/clock.h"
#include "common/jsonscan.h"
#include "common/log.h"
#include "scm/gitlab/gitlab.h"
#include "server/api/api_int.h"

static bool has(const char *s)
{
    return s != NULL && s[0] != '\0';
}

static int64_t now_s(void)
{
    return clock_now_ms(clock_system()) / 1000;
}

/* The delivery's id for deduplication: Idempotency-Key, else webhook-id, else
 * X-Gitlab-Event-UUID (each a header GitLab keeps across retries of one delivery). */
static const char *delivery_of(struct request *r)
{
    const char *keys[] = {"Idempotency-Key", "webhook-id", "X-Gitlab-Event-UUID"};

    for (size_t i = 0; i < ARRAY_LEN(keys); i++) {
        const char *v = http_header(r, keys[i]);
        if (has(v) && strlen(v) <= 200) {
            return v;
        }
    }
    return NULL;
}

/* The check a delivery is given (SPEC §5: the token, or a valid signature when a signing
 * secret is configured): a token that matches, else the signature when a secret is
 * configured and the delivery carries one, else a token that matches none, or neither. */
enum auth_kind { AUTH_NONE, AUTH_TOKEN, AUTH_SIGNATURE, AUTH_WRONG_TOKEN };

static enum auth_kind auth_kind(struct request *r)
{
    const struct server_config *c = &r->srv->cfg;
    bool token = has(c->gitlab_webhook_token) && http_header(r, "X-Gitlab-Token") != NULL;

    if (token && http_header_count(r, "X-Gitlab-Token") == 1 &&
        gitlab_token_verify(c->gitlab_webhook_token, http_header(r, "X-Gitlab-Token"), NULL) ==
            E_OK) {
        return AUTH_TOKEN;
    }
    if (has(c->gitlab_signing_secret) && http_header(r, "webhook-signature") != NULL) {
        return AUTH_SIGNATURE;
    }
    return token ? AUTH_WRONG_TOKEN : AUTH_NONE;
}

int api_webhook_gitlab_begin(struct request *r)
{
    const struct server_config *c = &r->srv->cfg;
    struct err err = {0};

    if (!has(c->gitlab_webhook_token) && !has(c->gitlab_signing_secret)) {
        return http_send_error(r, 503, NULL, NULL,
                               "GitLab webhooks are not configured (no --gitlab-webhook-token or "
                               "--gitlab-signing-secret)");
    }
    switch (auth_kind(r)) {
    case AUTH_TOKEN:
        break;
    case AUTH_WRONG_TOKEN:
        return http_send_error(r, 401, NULL, NULL,
                               "the X-Gitlab-Token matches no configured token");
    case AUTH_SIGNATURE:
        if (gitlab_sig_precheck(http_header(r, "webhook-id"), http_header(r, "webhook-timestamp"),
                                http_header(r, "webhook-signature"), now_s(), &err) != E_OK) {
            return http_send_error(r, 401, NULL, NULL, "%s", err.msg);
        }
        break;
    default:
        return http_send_error(r, 401, NULL, NULL, "missing X-Gitlab-Token or webhook-signature");
    }
    if (http_header(r, "X-Gitlab-Event") == NULL) {
        return http_send_error(r, 400, NULL, NULL, "missing X-Gitlab-Event header");
    }
    return MHD_YES;
}

/* The full check on the whole body (the begin hook already refused what it could). */
static int authenticate(struct request *r, const char *body, struct err *err)
{
    const struct server_config *c = &r->srv->cfg;

    switch (auth_kind(r)) {
    case AUTH_TOKEN:
        return E_OK; /* the token matched a configured one */
    case AUTH_SIGNATURE:
        return gitlab_sig_verify(c->gitlab_signing_secret, http_header(r, "webhook-id"),
                                 http_header(r, "webhook-timestamp"),
                                 http_header(r, "webhook-signature"), body, r->body.len, now_s(),
                                 err);
    default:
        return err_set(err, E_DENIED, "missing or wrong X-Gitlab-Token or webhook-signature");
    }
}

static int accept_note(struct request *r, const struct inbox_entry *e)
{
    bool dup = false;
    struct err err = {0};
    char num[32];

    /* Remembered before the entry is queued: the bot may take it (and call the API for
     * it) the moment it is in the inbox. */
    gitlab_provider_note_delivery(scm_registry_get(&r->srv->scm, "gitlab"), e->project, e->number,
                                  e->comment_id, http_header(r, "X-Gitlab-Event-UUID"));
    if (task_store_inbox_add(&dup, r->srv->store, e, &err) != E_OK) {
        return http_send_error(r, 503, NULL, NULL, "could not store the delivery: %s; retry",
                               err.msg);
    }
    if (dup) {
        return http_send_json(r, 200, json_pack("{s:b}", "duplicate", 1));
    }
    snprintf(num, sizeof(num), "%lld", (long long)e->number);
    log_kv(LOG_INFO, "comment_accepted", "provider", e->provider, "project", e->project, "number",
           num, "comment", e->comment_id, "author", e->author, NULL);
    return http_send_json(r, 202, json_pack("{s:b}", "accepted", 1));
}

int api_webhook_gitlab(struct request *r)
{
    const char *event = http_header(r, "X-Gitlab-Event");
    const char *body = r->body.data != NULL ? r->body.data : "";
    enum gitlab_event kind;
    struct inbox_entry e;
    const char *why = "";
    struct err err = {0};
    int ret;

    if (authenticate(r, body, &err) != E_OK) {
        return http_send_error(r, 401, NULL, NULL, "%s", err.msg);
    }
    /* Every delivery is read and checked as a command's is (malformed or missing fields:
     * 400, SPEC §5); a note without "/diverge" anywhere holds no command: nothing stored. */
    if (gitlab_webhook_parse(&kind, &e, &why, event, delivery_of(r),
                             http_header(r, "X-Gitlab-Event-UUID"), body, r->body.len,
                             &err) != E_OK) {
        return http_send_error(r, 400, NULL, NULL, "%s", err.msg);
    }
    if (kind == GITLAB_EVENT_IGNORED) {
        log_kv(LOG_DEBUG, "delivery_ignored", "provider", "gitlab", "why", why, NULL);
        return http_send_text(r, 204, "application/json", "");
    }
    if (!slashcmd_mentions(body, r->body.len)) {
        inbox_entry_cleanup(&e);
        return http_send_text(r, 204, "application/json", "");
    }
    api_comment_hint(r->srv, e.body);
    ret = accept_note(r, &e);
    inbox_entry_cleanup(&e);
    return ret;
}
