/* SPDX-License-Identifier: Apache-2.0 */
/* Git smart HTTP for sandbox pods (api_git.c): clone/fetch of the task's repository mirror
 * and push into its staging repository under /api/v1/git/<ns>/<task>.git/, authenticated
 * with the task's macaroon. The parsers of untrusted request bytes are pure
 * (api_git_pkt.c) so that unit tests and the fuzz target reach them. */
#ifndef DIVERGE_SERVER_API_GIT_H
#define DIVERGE_SERVER_API_GIT_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"

#define API_GIT_NAME_MAX 253 /* a task (or namespace) name */
/* Request body caps: a fetch's negotiation, and a push (the runner's first push into the
 * empty staging repository carries the whole history it cloned). */
#define API_GIT_FETCH_BODY_MAX (8u * 1024u * 1024u)
#define API_GIT_PUSH_BODY_MAX (256u * 1024u * 1024u)

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

/* Route handlers (server/http.c). */
int api_git_info_refs(struct request *r);
int api_git_upload_pack(struct request *r);
int api_git_receive_pack(struct request *r);
int api_git_begin(struct request *r); /* authenticates before any body byte is read */

#endif
