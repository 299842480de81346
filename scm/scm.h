/* SPDX-License-Identifier: Apache-2.0 */
/* The SCM provider interface (GitHub, GitLab, the offline `local` one) and the outbox
 * worker that makes every SCM call from a durable outbox entry, with retries, backoff,
 * Retry-After / rate-limit headers and a cap on content-creating calls per minute. */
#ifndef DIVERGE_SCM_SCM_H
#define DIVERGE_SCM_SCM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/clock.h"
#include "common/err.h"
#include "store/store.h"

/* Permission levels, normalized to GitLab's access levels. */
enum scm_level {
    SCM_LEVEL_NONE = 0,
    SCM_LEVEL_READ = 10,     /* GitHub read; GitLab Guest */
    SCM_LEVEL_TRIAGE = 20,   /* GitHub triage; GitLab Reporter */
    SCM_LEVEL_WRITE = 30,    /* GitHub write; GitLab Developer */
    SCM_LEVEL_MAINTAIN = 40, /* GitHub maintain; GitLab Maintainer */
    SCM_LEVEL_ADMIN = 50,    /* GitHub admin; GitLab Owner */
};

/* "write", "maintain", ... (GitHub words; GitLab levels print as "Developer (30)" etc.) */
const char *scm_level_name(enum scm_level level);
/* The level as PROVIDER names it: GitLab's role and number ("Developer (30)"), else
 * scm_level_name. Static storage. */
const char *scm_level_name_for(const char *provider, enum scm_level level);
/* Parses a GitHub role word or a GitLab number; E_INVALID otherwise. */
int scm_level_parse(enum scm_level *out, const char *s);

/* Which PR/MR a call is about. Strings borrowed. */
struct scm_ref {
    const char *project;     /* "owner/repo" or the GitLab path */
    int64_t number;          /* PR number or MR iid */
    int64_t installation_id; /* GitHub App installation; 0 when none */
};

/* What an SCM answered, for retry decisions. */
struct scm_result {
    int status;             /* HTTP status; 0 when there was no answer */
    int64_t retry_after_ms; /* wait the SCM asked for (Retry-After, rate-limit reset), or 0 */
    bool rate_limited;      /* 429, or 403 with a rate-limit message or headers */
};

/* One comment of a PR/MR thread. */
struct scm_comment {
    char *id;     /* owned */
    char *author; /* owned: login */
    bool by_bot;  /* the author is a bot account */
    char *body;   /* owned */
};

void scm_comments_free(struct scm_comment *c, size_t n);

/* The head of a PR/MR. */
struct scm_pull {
    char *head_ref;  /* owned: the source branch */
    char *base_ref;  /* owned: the target branch (in the base repository), or NULL */
    char *clone_url; /* owned: the head repository's clone URL; NULL when head_gone */
    char *html_url;  /* owned: the PR's page, or NULL */
    char *base_url;  /* owned: the base repository's clone URL (the one the PR targets), or NULL */
    bool head_gone;  /* the head repository (a deleted fork) no longer exists */
};

void scm_pull_cleanup(struct scm_pull *p);

/* --- URLs sent to an SCM's API (pure) ------------------------------------------------ */

/* Percent-encodes S for a URL path: every byte but A-Z a-z 0-9 - . _ ~ becomes %XX, and a
 * segment made only of dots ("." or "..") is encoded whole so it cannot climb the path.
 * With KEEP_SLASH, '/' separates segments and stays ("owner/repo", ".diverge/agent.yaml");
 * else it is encoded too. Returns a new string; caller frees. */
char *scm_path_escape(const char *s, bool keep_slash);

/* "<API_BASE>/repos/<owner>/<repo><TAIL>" with each segment of PROJECT percent-encoded
 * (scm_path_escape with KEEP_SLASH). TAIL is appended as is: its variable parts must be
 * encoded by the caller. New string; caller frees. */
char *scm_repo_url(const char *api_base, const char *project, const char *tail);

/* Whether URL (a link an SCM answered with, e.g. Link rel="next") stays under API_BASE:
 * the same scheme, host and port (case-insensitive, default ports made explicit), no
 * user info, and a path equal to the base's path or below it. Credentials for API_BASE
 * may be sent to URL only when this is true. */
bool scm_url_under(const char *api_base, const char *url);

/* A pull request to open. Strings borrowed. */
struct scm_new_pull {
    const char *title, *head, *base, *body;
    bool draft;
    const char *key; /* a line BODY carries, by which the PR is found again (local) */
};

struct scm_provider;

/* Every call returns E_OK, or: E_AGAIN (transient: unreachable, 5xx, rate limited — see
 * res), E_NOTFOUND (404), E_DENIED (401/403), E_INVALID (422), E_FAIL. RES may be NULL. */
struct scm_provider_ops {
    const char *name; /* "github", "gitlab", "local" */
    int (*react)(struct scm_provider *p, const struct scm_ref *ref, const char *comment_id,
                 const char *content, struct scm_result *res, struct err *err);
    /* *id_out: the new comment's id (caller frees). */
    int (*post_comment)(char **id_out, struct scm_provider *p, const struct scm_ref *ref,
                        const char *body, struct scm_result *res, struct err *err);
    int (*update_comment)(struct scm_provider *p, const struct scm_ref *ref, const char *comment_id,
                          const char *body, struct scm_result *res, struct err *err);
    int (*delete_comment)(struct scm_provider *p, const struct scm_ref *ref, const char *comment_id,
                          struct scm_result *res, struct err *err);
    /* Every comment of the thread, all pages, oldest first. */
    int (*list_comments)(struct scm_comment **out, size_t *n_out, struct scm_provider *p,
                         const struct scm_ref *ref, struct scm_result *res, struct err *err);
    /* USER's permission on the project (USER_ID for GitLab; 0 when unknown). */
    int (*permission_of)(enum scm_level *out, struct scm_provider *p, const struct scm_ref *ref,
                         const char *user, int64_t user_id, struct scm_result *res,
                         struct err *err);
    /* The PR's head and base. A PR whose head repository was deleted is E_OK with
     * head_gone set and no clone_url: never the base repository in its place. */
    int (*pull_info)(struct scm_pull *out, struct scm_provider *p, const struct scm_ref *ref,
                     struct scm_result *res, struct err *err);
    /* The file PATH at GIT_REF; E_NOTFOUND when absent. *out: owned bytes, NUL-terminated. */
    int (*file_at)(char **out, size_t *len_out, struct scm_provider *p, const struct scm_ref *ref,
                   const char *git_ref, const char *path, struct scm_result *res, struct err *err);
    /* Opens the pull request PR in REF->project (REF->number unused); *url_out: its web
     * URL (caller frees). When one from PR->head exists already it is found and returned
     * instead. NULL for providers that cannot (the call fails for good). */
    int (*open_pull)(char **url_out, struct scm_provider *p, const struct scm_ref *ref,
                     const struct scm_new_pull *pr, struct scm_result *res, struct err *err);
    /* The bot's own login (configured, or learnt from the API, asked again with backoff
     * after a failure); NULL while unknown. Once non-NULL it changes only when the
     * provider's credentials become a GitHub App at run time (the one-click setup); a
     * string returned stays valid until the provider is freed. */
    const char *(*bot_login)(struct scm_provider *p);
    void (*free)(struct scm_provider *p);
};

/* Every provider embeds this as its first member. */
struct scm_provider {
    const struct scm_provider_ops *ops;
};

static inline void scm_provider_free(struct scm_provider *p)
{
    if (p != NULL) {
        p->ops->free(p);
    }
}

/* --- the registry of configured providers ------------------------------------------ */

#define SCM_PROVIDERS_MAX 4

/* Providers are only ever added (at start, or once a GitHub App is set up at run time),
 * never removed before scm_registry_cleanup(): readers in any thread see a slot only after
 * it is written. */
struct scm_registry {
    struct scm_provider *providers[SCM_PROVIDERS_MAX]; /* owned */
    atomic_size_t n;                                   /* slots published (release) */
};

/* The provider named NAME, or NULL. Thread-safe against scm_registry_add(). */
struct scm_provider *scm_registry_get(const struct scm_registry *r, const char *name);
/* Takes ownership of P. Callers serialise adds among themselves. */
void scm_registry_add(struct scm_registry *r, struct scm_provider *p);
void scm_registry_cleanup(struct scm_registry *r);

/* --- the offline `local` provider (scm/local.c) ------------------------------------- */

#define SCM_LOCAL_BOT "diverge"

/* The provider whose threads live in STORE (borrowed). */
int scm_local_new(struct scm_provider **out, struct task_store *store, struct err *err);

/* --- the sticky-comment notifier (scm/notifier.c) ---------------------------------- */

struct scm_notifier_config {
    int64_t min_interval_ms;   /* spend-only edits at most this often per task (10 s) */
    bool manual;               /* no thread: tests call scm_notifier_sync */
    const char *dashboard_url; /* borrowed; --public-url when set: each sticky links the
                                  task's dashboard page; NULL: no link */
};

struct scm_notifier;

/* Starts following STORE's change feed (STORE and REGISTRY borrowed). Every task is
 * looked at once on start, so a restart catches up without duplicates. */
int scm_notifier_new(struct scm_notifier **out, struct task_store *store,
                     const struct scm_registry *registry, const struct scm_notifier_config *cfg,
                     struct err *err);
void scm_notifier_free(struct scm_notifier *n);
/* Brings TASK's sticky comment up to date: queues a create/edit unless the body is
 * unchanged. */
int scm_notifier_sync(struct scm_notifier *n, const json_t *task, struct err *err);
/* The coalescing/state key of a task's sticky comment (new string). */
char *scm_sticky_key(const char *provider, const char *project, int64_t number, const char *ns,
                     const char *name);

/* --- the per-minute budget of content-creating calls (pure) ------------------------- */

#define SCM_RATE_WINDOW_MS 60000
#define SCM_RATE_SLOTS 256 /* more than any sane per-minute cap */

struct scm_rate {
    int64_t sent_ms[SCM_RATE_SLOTS]; /* ring of the latest calls' times (0: none) */
    size_t next;                     /* where the next call goes */
};

/* Milliseconds to wait before one more call keeps at most CAP calls in any window of
 * SCM_RATE_WINDOW_MS (0: go now). CAP < SCM_RATE_SLOTS. */
int64_t scm_rate_wait(const struct scm_rate *r, int cap, int64_t now_ms);
/* Records a call made at NOW_MS. */
void scm_rate_note(struct scm_rate *r, int64_t now_ms);

/* --- the outbox worker ------------------------------------------------------------- */

struct scm_outbox_config {
    int max_attempts;        /* give up after this many tries (default 12) */
    int64_t base_backoff_ms; /* first retry delay, doubled each time (default 500) */
    int64_t max_backoff_ms;  /* cap of the delay (default 5 min) */
    int content_per_minute;  /* content-creating calls per minute and provider (80) */
};

#define SCM_OUTBOX_CONFIG_DEFAULTS                                                                 \
    {                                                                                              \
        .max_attempts = 12, .base_backoff_ms = 500, .max_backoff_ms = 300000,                      \
        .content_per_minute = 80,                                                                  \
    }

struct scm_outbox;

/* Starts the worker over STORE and REGISTRY (both borrowed; must outlive it). */
int scm_outbox_new(struct scm_outbox **out, struct task_store *store,
                   const struct scm_registry *registry, const struct scm_outbox_config *cfg,
                   struct err *err);
/* Stops after the call in flight; NULL is a no-op. */
void scm_outbox_free(struct scm_outbox *o);

/* The retry delay after ATTEMPTS failed tries, honouring the SCM's RES (pure). */
int64_t scm_outbox_backoff(const struct scm_outbox_config *cfg, int attempts,
                           const struct scm_result *res);

struct scm_outbox_stats {
    int64_t calls;      /* calls made */
    int64_t failures;   /* calls that failed (retried or not) */
    int64_t rate_waits; /* times a call waited for the rate budget or a rate limit */
};
void scm_outbox_stats(struct scm_outbox_stats *out, struct scm_outbox *o);

#endif
