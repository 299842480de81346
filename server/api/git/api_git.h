/* SPDX-License-Identifier: Apache-2.0 */
/* Git smart HTTP for sandbox pods (api_git.c): clone/fetch of the task's repository mirror
 * and push into its staging repository under /api/v1/git/<ns>/<task>.git/, authenticated
 * with the task's macaroon. The parsers of untrusted request bytes are pure
 * (api_git_pkt.c) so that unit tests and the fuzz target reach them. */
#ifndef DIVERGE_SERVER_API_GIT_H
#define DIVERGE_SERVER_API_GIT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"

#define API_GIT_NAME_MAX 253 /* a task (or namespace) name */
/* Request body caps. Bodies are spooled to a file under the data dir as they arrive, never
 * held in memory: a fetch's negotiation, and a push's default (--git-push-max). The
 * runner's first push into the empty staging repository carries everything its clone
 * holds (the base branch's tree and up to 50 commits of history, compressed); later ones
 * only the agent's new objects. 64 MiB covers that for most repositories; larger ones
 * raise the flag. */
#define API_GIT_FETCH_BODY_MAX (8u * 1024u * 1024u)
#define API_GIT_PUSH_BODY_MAX (64u * 1024u * 1024u)
/* The push commands are read from the first this many bytes of a receive-pack body (two
 * pkt-lines of the largest size). */
#define API_GIT_COMMANDS_MAX (128u * 1024u)
/* Git requests at once: per task (a clone, or a push with the fetch git makes around it)
 * and in all; more get 429 with Retry-After. */
#define API_GIT_TASK_REQUESTS_MAX 2
#define API_GIT_REQUESTS_MAX 16
#define API_GIT_RETRY_AFTER_S 5

/* The concurrency gate (api_git_gate.c): caller storage, thread-safe. */
struct api_git_gate;
struct api_git_slot {
    char key[2 * API_GIT_NAME_MAX + 2]; /* "<ns>/<task>" while n > 0 */
    int n;                              /* requests of that task holding a slot */
    struct api_git_gate *gate;          /* back pointer */
};
struct api_git_gate {
    pthread_mutex_t mu;
    int per_task, total;                             /* limits; total <= API_GIT_REQUESTS_MAX */
    int busy;                                        /* slots taken in all, under mu */
    struct api_git_slot slots[API_GIT_REQUESTS_MAX]; /* under mu */
};

/* Prepares G with the limits (1 <= TOTAL <= API_GIT_REQUESTS_MAX). */
void api_git_gate_init(struct api_git_gate *g, int per_task, int total);
void api_git_gate_cleanup(struct api_git_gate *g);
/* Takes a slot of NS/TASK into *out (released with api_git_gate_leave). E_AGAIN when the
 * task already holds per_task slots or all total slots are taken. */
int api_git_gate_enter(struct api_git_slot **out, struct api_git_gate *g, const char *ns,
                       const char *task, struct err *err);
/* Gives back SLOT (a struct api_git_slot *; NULL is a no-op): a request's on_done. */
void api_git_gate_leave(void *slot);

struct request;

/* The task name of the path segment SEG ("<task>.git") into OUT (API_GIT_NAME_MAX + 1
 * bytes): lower-case letters, digits, '-' and '.', not starting with '.' or '-'.
 * E_INVALID otherwise. */
int api_git_repo_name(char *out, const char *seg, struct err *err);

/* True when NAME is a plausible namespace or task name (the same characters). */
bool api_git_name_ok(const char *name);

/* The token of an Authorization header value: "Bearer <token>", or "Basic <base64 of
 * user:token>" (any user: what git sends with a credential helper). A new string the
 * caller wipes and frees, or NULL when the header is absent or malformed. */
char *api_git_auth_token(const char *authorization);

/* Checks the commands at the start of a git-receive-pack request BODY[0..LEN): pkt-lines
 * "<old> <new> <ref>[NUL capabilities]" up to a flush packet. Accepted only when every
 * command updates refs/heads/WORKING to a new object (no delete; 40 or 64 hex digits);
 * shallow and certificate pushes are refused. E_INVALID (message without request bytes)
 * otherwise. A non-fast-forward is refused by git itself (receive.denyNonFastForwards). */
int api_git_check_push(const char *body, size_t len, const char *working, struct err *err);

/* Route handlers (listed in server/api/api_routes.c). */
int api_git_info_refs(struct request *r);
int api_git_upload_pack(struct request *r);
int api_git_receive_pack(struct request *r);
/* Runs before any body byte is read: authenticates, takes a concurrency slot (429 with
 * Retry-After when none is free) and opens the file a POST body is spooled to. */
int api_git_begin(struct request *r);

#endif
