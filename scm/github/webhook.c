/* SPDX-License-Identifier: Apache-2.0 */
/* GitHub deliveries: the signature is checked on the raw bytes before anything parses
 * them; then only what the bot needs is taken from the payload. */
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/secret.h"
#include "scm/github/github.h"

#define SIG_PREFIX "sha256="

int github_webhook_verify(const char *secrets, const char *sig_header, const char *body,
                          size_t len, struct err *err)
{
    unsigned char want[32], got[EVP_MAX_MD_SIZE];
    unsigned int got_len = 0;
    const char *p = secrets;
    bool ok = false;

    if (sig_header == NULL || strncmp(sig_header, SIG_PREFIX, strlen(SIG_PREFIX)) != 0 ||
        secret_unhex(want, sizeof(want), sig_header + strlen(SIG_PREFIX)) != E_OK) {
        return err_set(err, E_DENIED, "missing or malformed X-Hub-Signature-256");
    }
    while (p != NULL && *p != '\0') {
        const char *comma = strchr(p, ',');
        size_t n = comma != NULL ? (size_t)(comma - p) : strlen(p);
        if (n > 0 && HMAC(EVP_sha256(), p, (int)n, (const unsigned char *)body, len, got,
                          &got_len) != NULL) {
            /* CRYPTO_memcmp, not memcmp: no early exit telling how much of a forgery was
             * right. Every secret is tried, so timing does not tell which one matched. */
            ok |= got_len == sizeof(want) && CRYPTO_memcmp(got, want, sizeof(want)) == 0;
        }
        p = comma != NULL ? comma + 1 : NULL;
    }
    OPENSSL_cleanse(got, sizeof(got));
    return ok ? E_OK : err_set(err, E_DENIED, "signature does not match any configured secret");
}

static const char *str_at(const json_t *obj, const char *a, const char *b)
{
    const json_t *v = json_object_get(obj, a);
    if (b != NULL) {
        v = json_object_get(v, b);
    }
    return json_string_value(v);
}

static int missing(struct err *err, const char *field)
{
    return err_set(err, E_INVALID, "payload field %s is missing or has the wrong type", field);
}

static int parse_comment(struct inbox_entry *e, const json_t *j, const char *delivery,
                         struct err *err)
{
    const json_t *issue = json_object_get(j, "issue");
    const json_t *comment = json_object_get(j, "comment");
    const json_t *user = json_object_get(comment, "user");
    const json_t *id = json_object_get(comment, "id");
    const json_t *number = json_object_get(issue, "number");
    const json_t *inst = json_object_get(json_object_get(j, "installation"), "id");
    const char *project = str_at(j, "repository", "full_name");
    const char *body = str_at(j, "comment", "body");
    const char *login = json_string_value(json_object_get(user, "login"));

    if (!json_is_integer(number)) {
        return missing(err, "issue.number");
    }
    if (!json_is_integer(id)) {
        return missing(err, "comment.id");
    }
    if (project == NULL) {
        return missing(err, "repository.full_name");
    }
    if (body == NULL) {
        return missing(err, "comment.body");
    }
    if (login == NULL) {
        return missing(err, "comment.user.login");
    }
    snprintf(e->provider, sizeof(e->provider), "github");
    e->delivery_id = delivery != NULL ? xstrdup(delivery) : NULL;
    e->project = xstrdup(project);
    e->number = (int64_t)json_integer_value(number);
    e->comment_id = xasprintf("%lld", (long long)json_integer_value(id));
    e->author = xstrdup(login);
    e->author_id = (int64_t)json_integer_value(json_object_get(user, "id"));
    if (str_at(j, "comment", "author_association") != NULL) {
        e->author_association = xstrdup(str_at(j, "comment", "author_association"));
    }
    e->installation_id = json_is_integer(inst) ? (int64_t)json_integer_value(inst) : 0;
    e->body = xstrdup(body);
    return E_OK;
}

int github_webhook_parse(enum github_event *event_out, struct inbox_entry *entry_out,
                         const char **why_out, const char *event, const char *delivery,
                         const char *body, size_t len, struct err *err)
{
    json_error_t jerr;
    json_t *j;
    const char *action;
    int rc = E_OK;

    *event_out = GITHUB_EVENT_IGNORED;
    *why_out = "";
    memset(entry_out, 0, sizeof(*entry_out));
    if (event == NULL) {
        return err_set(err, E_INVALID, "missing X-GitHub-Event header");
    }
    /* Duplicate keys are tolerated like GitHub's own consumers do: the last one wins. */
    j = json_loadb(body, len, 0, &jerr);
    if (j == NULL || !json_is_object(j)) {
        json_decref(j);
        return err_set(err, E_INVALID, "payload is not a JSON object: %s",
                       j == NULL ? jerr.text : "wrong type");
    }
    if (strcmp(event, "ping") == 0) {
        *event_out = GITHUB_EVENT_PING;
        goto out;
    }
    if (strcmp(event, "issue_comment") != 0) {
        *why_out = "event not handled";
        goto out;
    }
    action = json_string_value(json_object_get(j, "action"));
    if (action == NULL) {
        rc = missing(err, "action");
        goto out;
    }
    if (strcmp(action, "created") != 0) {
        *why_out = "only created comments are commands";
        goto out;
    }
    if (!json_is_object(json_object_get(j, "issue")) ||
        !json_is_object(json_object_get(j, "comment"))) {
        rc = missing(err, json_is_object(json_object_get(j, "issue")) ? "comment" : "issue");
        goto out;
    }
    if (json_object_get(json_object_get(j, "issue"), "pull_request") == NULL) {
        *why_out = "comment on an issue, not a pull request";
        goto out;
    }
    if (str_at(json_object_get(j, "comment"), "user", "type") != NULL &&
        strcmp(str_at(json_object_get(j, "comment"), "user", "type"), "Bot") == 0) {
        *why_out = "comment by a bot";
        goto out;
    }
    rc = parse_comment(entry_out, j, delivery, err);
    if (rc == E_OK) {
        *event_out = GITHUB_EVENT_COMMENT;
    } else {
        inbox_entry_cleanup(entry_out);
    }
out:
    json_decref(j);
    return rc;
}
