/* SPDX-License-Identifier: Apache-2.0 */
/* GitLab deliveries: the secret token or the Standard Webhooks signature is checked on the
 * headers and raw bytes before anything parses them; then only what the bot needs is
 * taken from the Note Hook payload, every name checked against GitLab's rules. */
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/core_names.h>
#include <openssl/params.h>
#include <openssl/sha.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/jsonscan.h"
#include "scm/gitlab/gitlab.h"

#define WHSEC_PREFIX "whsec_"
#define SIG_PREFIX "v1,"
#define KEY_MAX 256    /* bytes of a decoded signing key */
#define SIG_B64_LEN 44 /* base64 of 32 bytes */
#define PATH_SEGMENTS_MAX 21
#define NAME_MAX_LEN 255

/* --- X-Gitlab-Token ------------------------------------------------------------------ */

int gitlab_token_verify(const char *tokens, const char *header, struct err *err)
{
    unsigned char got[SHA256_DIGEST_LENGTH], want[SHA256_DIGEST_LENGTH];
    const char *p = tokens;
    bool ok = false;

    if (header == NULL || tokens == NULL) {
        return err_set(err, E_DENIED, "missing X-Gitlab-Token");
    }
    /* Digests of equal length: the comparison time depends on neither string's length. */
    SHA256((const unsigned char *)header, strlen(header), got);
    while (*p != '\0') {
        const char *comma = strchr(p, ',');
        size_t n = comma != NULL ? (size_t)(comma - p) : strlen(p);
        if (n > 0) {
            SHA256((const unsigned char *)p, n, want);
            ok |= CRYPTO_memcmp(got, want, sizeof(want)) == 0;
        }
        if (comma == NULL) {
            break;
        }
        p = comma + 1;
    }
    OPENSSL_cleanse(want, sizeof(want));
    return ok ? E_OK : err_set(err, E_DENIED, "the X-Gitlab-Token matches no configured token");
}

/* --- Standard Webhooks ----------------------------------------------------------------- */

int gitlab_sig_precheck(const char *id, const char *ts, const char *sig, int64_t now_s,
                        struct err *err)
{
    int64_t t = 0;

    if (id == NULL || id[0] == '\0' || ts == NULL || sig == NULL) {
        return err_set(err, E_DENIED, "missing webhook-id, webhook-timestamp or webhook-signature");
    }
    if (ts[0] == '\0' || strlen(ts) > 15) {
        return err_set(err, E_DENIED, "malformed webhook-timestamp");
    }
    for (const char *c = ts; *c != '\0'; c++) {
        if (*c < '0' || *c > '9') {
            return err_set(err, E_DENIED, "malformed webhook-timestamp");
        }
        t = t * 10 + (*c - '0');
    }
    if (t > now_s + GITLAB_SIG_TOLERANCE_S || t < now_s - GITLAB_SIG_TOLERANCE_S) {
        return err_set(err, E_DENIED, "webhook-timestamp is more than %d s from now",
                       GITLAB_SIG_TOLERANCE_S);
    }
    return E_OK;
}

static bool is_alnum(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

/* Whether S[0..n) (n >= 2) is base64 text whose only '=' are padding in the last two
 * places; their number goes to *pad. */
static bool b64_valid(const char *s, size_t n, size_t *pad)
{
    *pad = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool ok = is_alnum(c) || c == '+' || c == '/' || (c == '=' && i >= n - 2);
        if (!ok || (c != '=' && i > 0 && s[i - 1] == '=')) {
            return false;
        }
        *pad += c == '=';
    }
    return true;
}

/* Decodes standard base64 S[0..n) (padding required) into OUT (cap bytes); -1 on error. */
static long b64_decode(unsigned char *out, size_t cap, const char *s, size_t n)
{
    int len;
    size_t pad = 0;

    if (n == 0 || n % 4 != 0 || n / 4 * 3 > cap || !b64_valid(s, n, &pad)) {
        return -1;
    }
    len = EVP_DecodeBlock(out, (const unsigned char *)s, (int)n);
    return len < 0 ? -1 : (long)len - (long)pad;
}

/* The key of one "whsec_<base64>" secret S[0..n) into KEY; its length, or -1. */
static long secret_key(unsigned char key[KEY_MAX], const char *s, size_t n)
{
    size_t pl = strlen(WHSEC_PREFIX);

    if (n <= pl || strncmp(s, WHSEC_PREFIX, pl) != 0) {
        return -1;
    }
    return b64_decode(key, KEY_MAX, s + pl, n - pl);
}

bool gitlab_sig_secrets_valid(const char *secrets)
{
    unsigned char key[KEY_MAX];
    const char *p = secrets;
    bool any = false;

    while (p != NULL) {
        const char *comma = strchr(p, ',');
        size_t n = comma != NULL ? (size_t)(comma - p) : strlen(p);
        if (secret_key(key, p, n) <= 0) { /* an empty entry too */
            OPENSSL_cleanse(key, sizeof(key));
            return false;
        }
        any = true;
        p = comma != NULL ? comma + 1 : NULL;
    }
    OPENSSL_cleanse(key, sizeof(key));
    return any;
}

/* Whether the base64 signature WANT (SIG_B64_LEN chars) is among SIG's "v1,<b64>" items;
 * every item is compared. */
static bool sig_listed(const char *sig, const char *want)
{
    bool ok = false;
    const char *p = sig;

    while (*p != '\0') {
        size_t n;
        while (*p == ' ') {
            p++;
        }
        n = strcspn(p, " ");
        if (n == strlen(SIG_PREFIX) + SIG_B64_LEN && strncmp(p, SIG_PREFIX, 3) == 0) {
            ok |= CRYPTO_memcmp(p + 3, want, SIG_B64_LEN) == 0;
        }
        p += n;
    }
    return ok;
}

/* MAC = HMAC-SHA256(KEY, ID "." TS "." BODY); false when OpenSSL failed. */
static bool hmac_sign(unsigned char mac[32], const unsigned char *key, size_t klen, const char *id,
                      const char *ts, const char *body, size_t len)
{
    EVP_MAC *hmac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *ctx = hmac != NULL ? EVP_MAC_CTX_new(hmac) : NULL;
    OSSL_PARAM params[2];
    size_t mlen = 0;
    bool ok;

    params[0] =
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)(uintptr_t) "SHA256", 0);
    params[1] = OSSL_PARAM_construct_end();
    ok = ctx != NULL && EVP_MAC_init(ctx, key, klen, params) == 1 &&
         EVP_MAC_update(ctx, (const unsigned char *)id, strlen(id)) == 1 &&
         EVP_MAC_update(ctx, (const unsigned char *)".", 1) == 1 &&
         EVP_MAC_update(ctx, (const unsigned char *)ts, strlen(ts)) == 1 &&
         EVP_MAC_update(ctx, (const unsigned char *)".", 1) == 1 &&
         EVP_MAC_update(ctx, (const unsigned char *)body, len) == 1 &&
         EVP_MAC_final(ctx, mac, &mlen, 32) == 1 && mlen == 32;
    EVP_MAC_CTX_free(ctx);
    EVP_MAC_free(hmac);
    return ok;
}

int gitlab_sig_verify(const char *secrets, const char *id, const char *ts, const char *sig,
                      const char *body, size_t len, int64_t now_s, struct err *err)
{
    unsigned char key[KEY_MAX], mac[32];
    char want[SIG_B64_LEN + 4];
    const char *p = secrets;
    bool ok = false;
    int rc = gitlab_sig_precheck(id, ts, sig, now_s, err);

    if (rc != E_OK) {
        return rc;
    }
    while (p != NULL && *p != '\0') {
        const char *comma = strchr(p, ',');
        size_t n = comma != NULL ? (size_t)(comma - p) : strlen(p);
        long klen = secret_key(key, p, n);

        if (klen > 0 && hmac_sign(mac, key, (size_t)klen, id, ts, body, len)) {
            EVP_EncodeBlock((unsigned char *)want, mac, 32);
            ok |= sig_listed(sig, want);
        }
        p = comma != NULL ? comma + 1 : NULL;
    }
    OPENSSL_cleanse(key, sizeof(key));
    OPENSSL_cleanse(mac, sizeof(mac));
    return ok ? E_OK : err_set(err, E_DENIED, "webhook-signature matches no configured secret");
}

/* --- names ------------------------------------------------------------------------------ */

static bool ends_with(const char *s, size_t n, const char *suffix)
{
    size_t m = strlen(suffix);

    return n >= m && memcmp(s + n - m, suffix, m) == 0;
}

static bool is_segment_char(char c)
{
    return is_alnum(c) || c == '_' || c == '-' || c == '.';
}

/* GitLab's rules for the length and the ends of a path segment S[0..n). */
static bool segment_ends_valid(const char *s, size_t n)
{
    return n > 0 && n <= NAME_MAX_LEN && (is_alnum(s[0]) || s[0] == '_') && s[n - 1] != '.' &&
           !ends_with(s, n, ".git") && !ends_with(s, n, ".atom");
}

bool gitlab_valid_path_segment(const char *s, size_t n)
{
    if (!segment_ends_valid(s, n)) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (!is_segment_char(s[i])) {
            return false;
        }
        if (s[i] == '.' && i + 1 < n && s[i + 1] == '.') {
            return false;
        }
    }
    return true;
}

bool gitlab_valid_project_path(const char *s)
{
    size_t segments = 0;

    for (;;) {
        const char *slash = strchr(s, '/');
        size_t n = slash != NULL ? (size_t)(slash - s) : strlen(s);
        if (!gitlab_valid_path_segment(s, n) || ++segments > PATH_SEGMENTS_MAX) {
            return false;
        }
        if (slash == NULL) {
            return true;
        }
        s = slash + 1;
    }
}

bool gitlab_valid_username(const char *s)
{
    return gitlab_valid_path_segment(s, strlen(s));
}

/* git's rules (check-ref-format) for the length and the ends of the branch name S[0..n). */
static bool branch_ends_valid(const char *s, size_t n)
{
    return n > 0 && n <= NAME_MAX_LEN && s[0] != '-' && s[0] != '/' && s[0] != '.' &&
           s[n - 1] != '/' && s[n - 1] != '.' && !ends_with(s, n, ".lock") && strcmp(s, "@") != 0;
}

/* Whether S holds a sequence git refuses anywhere in a ref name. */
static bool branch_has_bad_sequence(const char *s)
{
    static const char *const bad[] = {"..", "@{", "//", "/."};

    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        if (strstr(s, bad[i]) != NULL) {
            return true;
        }
    }
    return false;
}

/* A byte git allows in a ref name: no control character, space, DEL or "~^:?*[\\". */
static bool is_branch_char(unsigned char c)
{
    return c > 0x20 && c != 0x7f && strchr("~^:?*[\\", (int)c) == NULL;
}

bool gitlab_valid_branch(const char *s)
{
    size_t n = strlen(s);

    if (!branch_ends_valid(s, n) || branch_has_bad_sequence(s)) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (!is_branch_char((unsigned char)s[i])) {
            return false;
        }
    }
    return true;
}

/* --- Note Hook ------------------------------------------------------------------------ */

enum field {
    F_KIND,
    F_NOTEABLE,
    F_ACTION,
    F_SYSTEM,
    F_INTERNAL,
    F_CONFIDENTIAL,
    F_NOTE_ID,
    F_NOTE,
    F_AUTHOR_ID,
    F_USERNAME,
    F_USER_ID,
    F_PROJECT,
    F_PROJECT_ID,
    F_PROJECT_HTTP,
    F_MR,
    F_IID,
    F_SOURCE_BRANCH,
    F_TARGET_BRANCH,
    F_SOURCE_HTTP,
    F_COUNT,
};

static const struct jsonscan_path g_fields[F_COUNT] = {
    [F_KIND] = {"object_kind"},
    [F_NOTEABLE] = {"object_attributes.noteable_type"},
    [F_ACTION] = {"object_attributes.action"},
    [F_SYSTEM] = {"object_attributes.system"},
    [F_INTERNAL] = {"object_attributes.internal"},
    [F_CONFIDENTIAL] = {"object_attributes.confidential"},
    [F_NOTE_ID] = {"object_attributes.id"},
    [F_NOTE] = {"object_attributes.note"},
    [F_AUTHOR_ID] = {"object_attributes.author_id"},
    [F_USERNAME] = {"user.username"},
    [F_USER_ID] = {"user.id"},
    [F_PROJECT] = {"project.path_with_namespace"},
    [F_PROJECT_ID] = {"project.id"},
    [F_PROJECT_HTTP] = {"project.git_http_url"},
    [F_MR] = {"merge_request"},
    [F_IID] = {"merge_request.iid"},
    [F_SOURCE_BRANCH] = {"merge_request.source_branch"},
    [F_TARGET_BRANCH] = {"merge_request.target_branch"},
    [F_SOURCE_HTTP] = {"merge_request.source.git_http_url"},
};

static int missing(struct err *err, const char *field)
{
    return err_set(err, E_INVALID, "payload field %s is missing or has the wrong type", field);
}

static bool is_true(const struct jsonscan_value *v)
{
    return v->present && v->len == 4 && memcmp(v->start, "true", 4) == 0;
}

/* A clone URL: http(s), printable ASCII without spaces, quotes or backslashes. */
static bool valid_clone_url(const char *u)
{
    if (strncmp(u, "https://", 8) != 0 && strncmp(u, "http://", 7) != 0) {
        return false;
    }
    if (strlen(u) > 2048) {
        return false;
    }
    for (const char *c = u; *c != '\0'; c++) {
        if ((unsigned char)*c <= 0x20 || (unsigned char)*c >= 0x7f || *c == '"' || *c == '\\' ||
            *c == '<' || *c == '>') {
            return false;
        }
    }
    return true;
}

struct mr_strings {
    char *source, *target;   /* branches */
    char *clone, *clone_alt; /* the source project's clone URL; the target project's */
};

static void mr_strings_free(struct mr_strings *m)
{
    free(m->source);
    free(m->target);
    free(m->clone);
    free(m->clone_alt);
}

/* The target project's id and the event's UUID of the payload F into X. */
static void add_ids(json_t *x, const struct jsonscan_value *f, const char *uuid)
{
    int64_t pid = 0;

    if (jsonscan_int(&pid, &f[F_PROJECT_ID]) == E_OK && pid > 0) {
        json_object_set_new(x, "project_id", json_integer(pid));
    }
    if (uuid != NULL && uuid[0] != '\0' && strlen(uuid) <= 128) {
        json_object_set_new(x, "event_uuid", json_string(uuid));
    }
}

/* The MR's branches, its source project's clone URL and its target project's (the one the
 * note is on) into E->extra (JSON). Without merge_request.source (GitLab sends null once
 * the source project is deleted) no clone URL is recorded: the bot then asks the API, which
 * tells whether the source project still exists. Never the target project in its place. */
static int parse_mr(struct inbox_entry *e, const struct jsonscan_value *f, const char *uuid,
                    struct err *err)
{
    struct mr_strings m = {jsonscan_string(&f[F_SOURCE_BRANCH]),
                           jsonscan_string(&f[F_TARGET_BRANCH]), jsonscan_string(&f[F_SOURCE_HTTP]),
                           jsonscan_string(&f[F_PROJECT_HTTP])};
    json_t *x;
    int rc = E_OK;

    if (m.source == NULL || m.target == NULL) {
        rc = missing(err, m.source == NULL ? "merge_request.source_branch"
                                           : "merge_request.target_branch");
    } else if (!gitlab_valid_branch(m.source) || !gitlab_valid_branch(m.target)) {
        rc = err_set(err, E_INVALID, "merge_request branches are not valid branch names");
    } else if (m.clone != NULL && !valid_clone_url(m.clone)) {
        rc = err_set(err, E_INVALID, "the repository url is not an http(s) url");
    }
    if (rc == E_OK) {
        x = json_pack("{s:s,s:s}", "head_ref", m.source, "base_ref", m.target);
        if (m.clone != NULL) {
            json_object_set_new(x, "clone_url", json_string(m.clone));
        }
        if (m.clone_alt != NULL && valid_clone_url(m.clone_alt)) {
            json_object_set_new(x, "base_url", json_string(m.clone_alt));
        }
        add_ids(x, f, uuid);
        e->extra = json_dumps(x, JSON_COMPACT | JSON_SORT_KEYS);
        json_decref(x);
    }
    mr_strings_free(&m);
    return rc;
}

/* The merge request iid and the note id of the payload F. */
static int note_ids(int64_t *iid_out, int64_t *id_out, const struct jsonscan_value *f,
                    struct err *err)
{
    if (jsonscan_int(iid_out, &f[F_IID]) != E_OK) {
        return missing(err, "merge_request.iid");
    }
    if (*iid_out < 1 || *iid_out > INT32_MAX) {
        return err_set(err, E_INVALID, "merge_request.iid is not a merge request iid");
    }
    if (jsonscan_int(id_out, &f[F_NOTE_ID]) != E_OK || *id_out < 1) {
        return missing(err, "object_attributes.id");
    }
    return E_OK;
}

/* The provider, project, note body and author of the payload F into E, names checked. */
static int note_names(struct inbox_entry *e, const struct jsonscan_value *f, struct err *err)
{
    snprintf(e->provider, sizeof(e->provider), "gitlab");
    e->project = jsonscan_string(&f[F_PROJECT]);
    e->body = jsonscan_string(&f[F_NOTE]);
    e->author = jsonscan_string(&f[F_USERNAME]);
    if (e->project == NULL) {
        return missing(err, "project.path_with_namespace");
    }
    if (e->body == NULL) {
        return missing(err, "object_attributes.note");
    }
    if (e->author == NULL) {
        return missing(err, "user.username");
    }
    if (!gitlab_valid_project_path(e->project)) {
        return err_set(err, E_INVALID, "project.path_with_namespace is not a valid GitLab path");
    }
    if (!gitlab_valid_username(e->author)) {
        return err_set(err, E_INVALID, "user.username is not a valid GitLab username");
    }
    return E_OK;
}

/* The note author's user id, or 0 when the payload F has none. */
static int64_t note_author_id(const struct jsonscan_value *f)
{
    int64_t uid = 0;

    if (jsonscan_int(&uid, &f[F_USER_ID]) == E_OK && uid >= 1) {
        return uid;
    }
    /* Older payloads carry no user.id: the note's author_id is the same person. */
    return jsonscan_int(&uid, &f[F_AUTHOR_ID]) == E_OK && uid > 0 ? uid : 0;
}

static int parse_note(struct inbox_entry *e, const struct jsonscan_value *f, const char *delivery,
                      const char *uuid, struct err *err)
{
    int64_t iid = 0, id = 0;
    int rc = note_ids(&iid, &id, f, err);

    if (rc == E_OK) {
        rc = note_names(e, f, err);
    }
    if (rc != E_OK) {
        return rc;
    }
    e->delivery_id = delivery != NULL ? xstrdup(delivery) : NULL;
    e->number = iid;
    e->comment_id = xasprintf("%lld", (long long)id);
    e->author_id = note_author_id(f);
    return parse_mr(e, f, uuid, err);
}

/* Why a well-formed note is not a command, or NULL. */
static const char *ignored_note(const struct jsonscan_value *f, struct err *err, int *rc)
{
    char *noteable = jsonscan_string(&f[F_NOTEABLE]);
    char *action = jsonscan_string(&f[F_ACTION]);
    const char *why = NULL;

    *rc = E_OK;
    if (noteable == NULL) {
        *rc = missing(err, "object_attributes.noteable_type");
    } else if (strcmp(noteable, "MergeRequest") != 0) {
        why = "note on an issue, commit or snippet, not a merge request";
    } else if (f[F_ACTION].present && !jsonscan_is_null(&f[F_ACTION]) &&
               (action == NULL || strcmp(action, "create") != 0)) {
        why = "only new notes are commands";
    } else if (is_true(&f[F_SYSTEM])) {
        why = "system note";
    } else if (is_true(&f[F_INTERNAL]) || is_true(&f[F_CONFIDENTIAL])) {
        why = "internal note";
    } else if (!f[F_MR].present || f[F_MR].start[0] != '{') {
        *rc = missing(err, "merge_request");
    }
    free(noteable);
    free(action);
    return why;
}

/* Whether BODY[0..len) starts, after white space, with '{'. */
static bool starts_object(const char *body, size_t len)
{
    size_t i = 0;

    while (i < len && (body[i] == ' ' || body[i] == '\t' || body[i] == '\n' || body[i] == '\r')) {
        i++;
    }
    return i < len && body[i] == '{';
}

/* A Note Hook's payload F: a command in *entry_out, or why it is none in *why_out. */
static int parse_note_hook(enum gitlab_event *event_out, struct inbox_entry *entry_out,
                           const char **why_out, const struct jsonscan_value *f,
                           const char *delivery, const char *event_uuid, struct err *err)
{
    char *kind = jsonscan_string(&f[F_KIND]);
    const char *why;
    int rc = E_OK;

    if (kind == NULL || strcmp(kind, "note") != 0) {
        free(kind);
        return err_set(err, E_INVALID, "a Note Hook payload must have object_kind note");
    }
    free(kind);
    why = ignored_note(f, err, &rc);
    if (rc != E_OK || why != NULL) {
        *why_out = why != NULL ? why : "";
        return rc;
    }
    rc = parse_note(entry_out, f, delivery, event_uuid, err);
    if (rc == E_OK) {
        *event_out = GITLAB_EVENT_NOTE;
    } else {
        inbox_entry_cleanup(entry_out);
        memset(entry_out, 0, sizeof(*entry_out));
    }
    return rc;
}

int gitlab_webhook_parse(enum gitlab_event *event_out, struct inbox_entry *entry_out,
                         const char **why_out, const char *event, const char *delivery,
                         const char *event_uuid, const char *body, size_t len, struct err *err)
{
    struct jsonscan_value f[F_COUNT];
    struct err jerr = {0};

    *event_out = GITLAB_EVENT_IGNORED;
    *why_out = "";
    memset(entry_out, 0, sizeof(*entry_out));
    if (event == NULL) {
        return err_set(err, E_INVALID, "missing X-Gitlab-Event header");
    }
    if (jsonscan_extract(f, body, len, g_fields, F_COUNT, &jerr) != E_OK ||
        !starts_object(body, len)) {
        return err_set(err, E_INVALID, "payload is not a JSON object: %s",
                       jerr.msg[0] != '\0' ? jerr.msg : "wrong type");
    }
    if (strcmp(event, "Note Hook") != 0) {
        *why_out = strcmp(event, "Confidential Note Hook") == 0 ? "confidential note"
                                                                : "event not handled";
        return E_OK;
    }
    return parse_note_hook(event_out, entry_out, why_out, f, delivery, event_uuid, err);
}
