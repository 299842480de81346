/* SPDX-License-Identifier: Apache-2.0 */
/* Declarations shared inside runner/: children (git, the agent and verify commands), the
 * meter client and git steps. Nothing outside runner/ includes this. */
#ifndef DIVERGE_RUNNER_RUNNER_INT_H
#define DIVERGE_RUNNER_RUNNER_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/err.h"
#include "runner/runner.h"

#define RUNNER_TAIL_BYTES (16u << 10)  /* output kept for DIVERGE_LAST_FAILURE */
#define RUNNER_CAPTURE_MAX (64u << 10) /* stdout of a git command kept (rev-parse etc.) */
#define RUNNER_TOKEN_MAX 8192          /* bytes of a token (env or file) */
#define RUNNER_ANSWER_MAX (64u << 10)  /* bytes of a meter answer read */

/* The last RUNNER_TAIL_BYTES bytes a child wrote, contiguous. */
struct runner_tail {
    char data[2 * RUNNER_TAIL_BYTES]; /* data[0..len) */
    size_t len;                       /* bytes held, at most 2 * RUNNER_TAIL_BYTES */
};

void runner_tail_add(struct runner_tail *t, const char *data, size_t len);

/* One child. ARGV[0] is an absolute path; nothing goes through a shell here (the agent
 * and verify commands are run as "/bin/sh", "-c", CMD by design: they are the sandbox's
 * own commands). */
struct runner_spawn {
    const char *const *argv;  /* NULL-terminated; borrowed */
    const char *cwd;          /* directory to run in, or NULL */
    char *const *envp;        /* the child's environment; borrowed */
    struct buf *capture;      /* stdout collected here (capped) instead of passed on, or NULL */
    struct runner_tail *tail; /* stdout+stderr passed to our stdout and kept here, or NULL */
};

/* Runs SP to completion; *status_out is its exit status (128+N when killed by signal N,
 * 127 when it could not be executed). E_FAIL when it could not be started. */
int runner_spawn_run(int *status_out, const struct runner_spawn *sp, struct err *err);

/* A copy of BASE without the variables named in UNSET (NULL-terminated, may be NULL) and
 * with the "NAME=value" strings of SET appended (NULL-terminated, may be NULL). Caller
 * frees with runner_env_free(). */
char **runner_env_build(char *const *base, const char *const *unset, const char *const *set);
void runner_env_free(char **env);

/* The absolute path of PROG found on PATH (or /usr/bin, /bin), or NULL. Caller frees. */
char *runner_which(const char *prog);

/* --- git (git.c) ----------------------------------------------------------------- */

/* Clones the repository into the workspace unless it already holds a clone, then checks
 * out the working branch (tracking it when the remote has it, else created from the
 * base). E_FAIL when a git command failed (logged). */
int runner_git_prepare(const struct runner_config *cfg, struct err *err);
/* Stages everything, commits "fix(<task>): <objective>" when something changed, and
 * pushes HEAD to the working branch of DIVERGE_PUSH_URL or origin. E_FAIL on failure. */
int runner_git_publish(const struct runner_config *cfg, struct err *err);

/* --- the meter client (meter_client.c) ------------------------------------------- */

/* One meter call's body. */
struct runner_meter_call {
    const char *request_id; /* borrowed */
    long iteration;         /* reported iteration */
    const char *model;      /* borrowed, or NULL */
    int64_t tokens;         /* delta */
    int64_t cost_micros;    /* delta, exact */
};

/* The answer that ended a meter exchange. */
struct runner_meter_answer {
    enum runner_meter_next next; /* what to do */
    long status;                 /* HTTP status, 0 when none arrived */
    char *guidance;              /* owned; a 200's non-empty guidance, else NULL */
    char *reason;                /* owned; a 4xx's reason or error (sanitised), or NULL */
};
void runner_meter_answer_cleanup(struct runner_meter_answer *a);

/* Parses a meter answer BODY[0..len) with STATUS into A's guidance/reason (next and
 * status are set by the caller). Never fails: junk just leaves them NULL. */
void runner_meter_answer_parse(struct runner_meter_answer *a, long status, const char *body,
                               size_t len);

/* Builds the JSON body of CALL (caller frees). */
char *runner_meter_body(const struct runner_meter_call *call);

/* Reads the current token (DIVERGE_MACAROON_TOKEN, else the token file, whitespace
 * trimmed) into a new string the caller frees with runner_token_free(). E_FAIL when
 * there is none. */
/* The prefix <public-url>/api/v1/git/ (new string) when URL is under the server's git
 * smart HTTP at the public URL METER_URL was made of; else NULL (git then gets no token). */
char *runner_git_server_prefix(const char *meter_url, const char *url);

int runner_token_read(char **out, const struct runner_config *cfg, struct err *err);
void runner_token_free(char *tok);

/* The first model of the token's "models" caveat, for heartbeats that carry no usage
 * (a task that restricts models answers 403 to a call without one). NULL when the token
 * has none. Caller frees. */
char *runner_token_model(const char *token);

/* Sends CALL until it gets an answer that is not RUNNER_METER_RETRY or the attempts are
 * used up (backoff between them; the same requestId each time). A 401 with a token file
 * waits up to cfg->revoked_wait_ms for another token in the file (rotated, or a pause in
 * progress whose resume writes a fresh one) and retries with it. Fills *out. */
void runner_meter_send(struct runner_meter_answer *out, const struct runner_config *cfg,
                       const struct runner_meter_call *call);

/* GETs the preview URL with the preview header; returns the HTTP status, -1 when it
 * could not be reached. */
long runner_preview_check(const struct runner_config *cfg);

/* With DIVERGE_SANDBOX_NETWORK=proxy: listens on 127.0.0.1:3128 (EGRESS_RELAY_PORT, where
 * HTTPS_PROXY points inside the sandbox) and relays every connection to the server's
 * per-task CONNECT proxy at DIVERGE_EGRESS_SOCKET, on a thread of its own until the
 * runner exits. E_FAIL when the port cannot be bound. A no-op in `none` mode. */
int runner_egress_relay_start(const struct runner_config *cfg, struct err *err);

/* Prints one progress line to stdout (flushed), as the task log shows it. */
void runner_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
