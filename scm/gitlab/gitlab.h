/* SPDX-License-Identifier: Apache-2.0 */
/* GitLab: webhook authentication (X-Gitlab-Token, Standard Webhooks signatures), Note Hook
 * parsing (SPEC §5), and the REST provider (API v4, PRIVATE-TOKEN) behind the
 * scm_provider interface. */
#ifndef DIVERGE_SCM_GITLAB_GITLAB_H
#define DIVERGE_SCM_GITLAB_GITLAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "scm/scm.h"
#include "store/store.h"

/* Standard Webhooks: a timestamp further than this from now is refused (replays). */
#define GITLAB_SIG_TOLERANCE_S 300
/* GitLab's note body limit is 1,000,000 characters; we stay under it in bytes. */
#define GITLAB_NOTE_MAX 1000000
/* GitLab.com: note creations per minute and project. */
#define GITLAB_NOTES_PER_MINUTE 60

/* Whether HEADER (X-Gitlab-Token) equals one of the comma-separated TOKENS. Every token is
 * compared, through SHA-256 digests and CRYPTO_memcmp: the time does not tell how much of
 * a guess was right, its length, or which token matched. E_DENIED otherwise (also when
 * HEADER is NULL or TOKENS configures none). */
int gitlab_token_verify(const char *tokens, const char *header, struct err *err);

/* The header checks of a Standard Webhooks delivery that need no body: ID, TS and SIG
 * present, TS a decimal number of seconds within GITLAB_SIG_TOLERANCE_S of NOW_S. E_DENIED
 * otherwise. */
int gitlab_sig_precheck(const char *id, const char *ts, const char *sig, int64_t now_s,
                        struct err *err);

/* Verifies a Standard Webhooks signature: SIG is a space-separated list of "v1,<base64
 * HMAC-SHA256(key, ID "." TS "." BODY)>", SECRETS comma-separated "whsec_<base64 key>"
 * (several for rotation). E_OK when any signature matches any secret and the precheck
 * passes; E_DENIED otherwise. Comparisons are constant time. */
int gitlab_sig_verify(const char *secrets, const char *id, const char *ts, const char *sig,
                      const char *body, size_t len, int64_t now_s, struct err *err);
/* Whether SECRETS holds only well-formed "whsec_<base64>" secrets (for flag checks). */
bool gitlab_sig_secrets_valid(const char *secrets);

/* GitLab's naming rules, checked before a name is stored or put in a URL. A path segment
 * (group, subgroup or project path) is 1 to 255 of [A-Za-z0-9_.-], starting with a letter,
 * digit or '_', not ending in '.', ".git" or ".atom", without "..". A project path is 1 to
 * 21 such segments joined by '/'. A username follows the segment rules. */
bool gitlab_valid_path_segment(const char *s, size_t n);
bool gitlab_valid_project_path(const char *s);
bool gitlab_valid_username(const char *s);
/* A branch name usable as a git ref (no control bytes, spaces, "..", "@{", '~', '^', ':',
 * '?', '*', '[', '\\', no leading '-' or '/', no trailing '/', '.' or ".lock"), 1 to 255
 * bytes. */
bool gitlab_valid_branch(const char *s);

enum gitlab_event {
    GITLAB_EVENT_NOTE,    /* a new note on a merge request: *entry_out is filled */
    GITLAB_EVENT_IGNORED, /* anything else: answer 204 */
};

/* Parses a delivery of EVENT (X-Gitlab-Event) whose delivery id is DELIVERY (may be NULL)
 * and X-Gitlab-Event-UUID EVENT_UUID (may be NULL). A "Note Hook" on a MergeRequest with
 * object_attributes.action absent or "create", not a system or internal note, fills
 * *entry_out (provider "gitlab", project path_with_namespace, number = MR iid, extra =
 * {"head_ref","base_ref","clone_url","project_id","event_uuid"}; caller cleans it up with
 * inbox_entry_cleanup). *why_out (static text) says why an event is ignored. Duplicate
 * keys are accepted, the last one wins. E_INVALID (HTTP 400) for malformed JSON, a
 * missing EVENT, missing fields or names GitLab does not allow. */
int gitlab_webhook_parse(enum gitlab_event *event_out, struct inbox_entry *entry_out,
                         const char **why_out, const char *event, const char *delivery,
                         const char *event_uuid, const char *body, size_t len, struct err *err);

/* --- REST provider (rest.c) ---------------------------------------------------------- */

/* Whether the whole of BODY (surrounding whitespace aside) is one emoji (":name:" or one
 * pictograph sequence): GitLab turns such a note into an award, so it is never sent. */
bool gitlab_note_is_award(const char *body);
/* BODY made fit to post (new string): a line starting with '/' gets a backslash first
 * (GitLab would run it as a quick action with the bot's rights); longer than MAX bytes,
 * the middle is cut (at UTF-8 boundaries) and replaced by a line saying so; a lone emoji
 * gets a word added. */
char *gitlab_note_fit(const char *body, size_t max);

struct gitlab_config {
    const char *url;       /* base, e.g. https://gitlab.com (the API is under /api/v4) */
    const char *token;     /* PRIVATE-TOKEN; NULL: calls fail with E_DENIED */
    const char *bot_login; /* the bot's username, or NULL: asked from GET /user */
    int notes_per_minute;  /* note creations per minute and project; 0: 60 */
};

/* Creates the REST provider (copies CFG's strings). */
int gitlab_provider_new(struct scm_provider **out, const struct gitlab_config *cfg,
                        struct err *err);

/* Remembers that the delivery EVENT_UUID brought note NOTE_ID of PROJECT's MR IID, so the
 * API calls made for it send X-Gitlab-Event-UUID (GitLab's recursion guard). P must be
 * the GitLab provider; NULL values are ignored. Memory only: lost on restart. */
void gitlab_provider_note_delivery(struct scm_provider *p, const char *project, int64_t iid,
                                   const char *note_id, const char *event_uuid);

/* The token from the environment: DIVERGE_GITLAB_TOKEN, else GITLAB_TOKEN, else (with
 * NOTIFIER_FALLBACK) DIVERGE_NOTIFIER_TOKEN; NULL when none is set. Borrowed from the
 * environment. */
const char *gitlab_token_from_env(bool notifier_fallback);

#endif
