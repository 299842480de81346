/* SPDX-License-Identifier: Apache-2.0 */
/* Inside scm/gitlab: the REST provider's state and its one-call helper, shared by rest.c
 * (members, merge requests, files, the bot's login) and rest_notes.c (notes and awards). */
#ifndef DIVERGE_SCM_GITLAB_GITLAB_INT_H
#define DIVERGE_SCM_GITLAB_GITLAB_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "scm/gitlab/gitlab.h"

#define GITLAB_PAGE_SIZE 100
#define GITLAB_MAX_PAGES 200
#define GITLAB_LOGIN_RETRY_MIN_MS 1000
#define GITLAB_LOGIN_RETRY_MAX_MS 300000
#define GITLAB_MEMO_MAX 64 /* deliveries remembered for X-Gitlab-Event-UUID */
#define GITLAB_PACE_MAX 32 /* projects whose note creations are paced at once */
#define GITLAB_UUID_MAX 128

struct memo {
    char project[256];
    int64_t iid;
    char note_id[24];
    char uuid[GITLAB_UUID_MAX + 1];
};

struct pace {
    char project[256];
    struct scm_rate rate;
};

struct gitlab {
    struct scm_provider base; /* must be first */
    char *api;                /* owned: <url>/api/v4 */
    char *token;              /* owned; NULL: no calls */
    int notes_per_minute;
    pthread_mutex_t mu; /* guards everything below */
    char *bot_login;
    int login_failures;
    int64_t login_next_ms;
    struct memo memo[GITLAB_MEMO_MAX];
    size_t memo_next;
    struct pace pace[GITLAB_PACE_MAX];
    size_t pace_next;
};

static inline struct gitlab *to_gitlab(struct scm_provider *p)
{
    return container_of(p, struct gitlab, base);
}

struct answer {
    json_t *json; /* parsed JSON body, or NULL */
    char *raw;    /* with want_raw: the body bytes, NUL-terminated */
    size_t raw_len;
    long next_page; /* x-next-page, 0 when none */
    bool taken;     /* a 4xx saying the award already exists */
};

void gitlab_answer_cleanup(struct answer *a);
/* One REST call. BODY (may be NULL) is JSON; UUID_LINE (may be NULL) an
 * X-Gitlab-Event-UUID header line; with WANT_RAW the answer's bytes are kept in ans->raw
 * instead of parsed. RES may be NULL. Errors as the scm_provider_ops. */
int gitlab_call(struct answer *ans, struct gitlab *gl, const char *method, const char *url,
                const json_t *body, const char *uuid_line, bool want_raw, struct scm_result *res,
                struct err *err);
/* "<api>/projects/<PROJECT as one encoded segment><TAIL>" (new string). */
char *gitlab_project_url(struct gitlab *gl, const char *project, const char *tail);
/* The notes URL of REF's MR, with "/<NOTE_ID>" when not NULL, then SUFFIX (new string). */
char *gitlab_notes_url(struct gitlab *gl, const struct scm_ref *ref, const char *note_id,
                       const char *suffix);
/* The X-Gitlab-Event-UUID header line for a call about REF (and NOTE_ID), or NULL. */
char *gitlab_uuid_header(struct gitlab *gl, const struct scm_ref *ref, const char *note_id);
/* Milliseconds before one more note may be created on PROJECT (0: now, and counted). */
int64_t gitlab_pace_take(struct gitlab *gl, const char *project);

/* The note operations (rest_notes.c). */
int gitlab_op_react(struct scm_provider *p, const struct scm_ref *ref, const char *comment_id,
                    const char *content, struct scm_result *res, struct err *err);
int gitlab_op_post_comment(char **id_out, struct scm_provider *p, const struct scm_ref *ref,
                           const char *text, struct scm_result *res, struct err *err);
int gitlab_op_update_comment(struct scm_provider *p, const struct scm_ref *ref,
                             const char *comment_id, const char *text, struct scm_result *res,
                             struct err *err);
int gitlab_op_delete_comment(struct scm_provider *p, const struct scm_ref *ref,
                             const char *comment_id, struct scm_result *res, struct err *err);
int gitlab_op_list_comments(struct scm_comment **out, size_t *n_out, struct scm_provider *p,
                            const struct scm_ref *ref, struct scm_result *res, struct err *err);

#endif
