/* SPDX-License-Identifier: Apache-2.0 */
/* Declarations shared inside runner/: children (git, the agent and verify commands), the
 * meter client and git steps. Nothing outside runner/ includes this. */
#ifndef DIVERGE_RUNNER_RUNNER_INT_H
#define DIVERGE_RUNNER_RUNNER_INT_H

#include <stdatomic.h>
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
    /* Called about every FOLLOW_MS while the child runs (NULL: never); returning false
     * kills the child's process group (it runs in one of its own then). */
    bool (*follow)(void *userdata);
    void *follow_userdata;
    long follow_ms;
    /* With FOLLOW: the file it reads, or NULL. A write to it calls FOLLOW at once (an
     * inotify watch of its directory) instead of at the next period. */
    const char *follow_path;
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
/* The file in .git of a workspace whose git directory the server made from the mirror
 * (controller's CONTROLLER_PREPARED_MARK): the runner checks it out as a fresh clone. */
#define RUNNER_PREPARED_MARK "diverge-prepared"
/* Stages everything, commits "fix(<task>): <objective>" when something changed, and
 * pushes HEAD to the working branch of DIVERGE_PUSH_URL or origin. E_FAIL on failure. */
int runner_git_publish(const struct runner_config *cfg, struct err *err);

/* What one checkpoint leaves for the next in the same runner: HEAD's commit, the
 * checkpoint made after it and its tree ("" when unknown), the last checkpoint whose
 * push went through, and the workspace's snapshot (runner_wip_snapshot) taken before
 * that tree was made, when it vouched for it. Zeroed before the first; released with
 * runner_wip_memo_cleanup. */
struct runner_wip_memo {
    char head[128];
    char wip[128];
    char tree[128];
    char pushed[128];
    struct buf snap; /* owned */
    bool snap_ok;    /* SNAP vouches for TREE */
};
/* Releases what MEMO owns. */
void runner_wip_memo_cleanup(struct runner_wip_memo *memo);
/* Writes into OUT (initialised here; caller cleans up) what the tree of a checkpoint
 * depends on besides HEAD, read without git: the status (mode, inode, size, modification
 * and change times) of the workspace and of every entry under it but .git, in name order,
 * and of the git files that decide what `git add -A` takes (the workspace's .git/config,
 * info/exclude, info/attributes, ...; the user's and system's git config, ignore and
 * attributes files). The same text again means the same tree (as git's index trusts an
 * unchanged status). False when it cannot vouch for that: an entry stamped at or after
 * .git/diverge-wip.stamp, touched as the snapshot begins (it may change again within the
 * same time stamp: git's "racy git" rule), an entry that cannot be read, a git config
 * that names other files (include, excludesFile, attributesFile), a snapshot over its cap. */
bool runner_wip_snapshot(struct buf *out, const struct runner_config *cfg);
/* Checkpoints the workspace (SPEC §14): a commit of every file (a separate index: the
 * agent's index and HEAD stay as they are) whose parents are the previous checkpoint and
 * HEAD, kept as refs/diverge/wip and pushed to refs/heads/<wip branch> of
 * DIVERGE_PUSH_URL (the staging repository). Nothing new since the last one: no commit,
 * and no push unless that one's push did not go through. MEMO carries what the merge-base of HEAD
 * and the last checkpoint said. E_FAIL when a git step failed (the caller only logs it). */
int runner_git_checkpoint(const struct runner_config *cfg, long iteration,
                          struct runner_wip_memo *memo, struct err *err);

/* In a workspace just cloned: when DIVERGE_PUSH_URL holds a checkpoint of this task (an
 * earlier run), its files are put in the working tree and index (HEAD stays the working
 * branch), so the run starts from it. No checkpoint: nothing done. */
int runner_git_restore(const struct runner_config *cfg, struct err *err);

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
/* Whether the branch REF (refs/heads/...) is in the repository at URL, read from its
 * files (loose ref, else packed-refs) when URL is a readable file:// repository: 1 yes,
 * 0 no, -1 when only git can tell (another scheme, a ref name a path could misread). */
int runner_git_ref_in(const char *url, const char *ref);

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

/* --- the relays inside the sandbox (relays.c) ------------------------------------ */

/* With DIVERGE_SANDBOX_NETWORK=proxy: listens on 127.0.0.1:3128 (EGRESS_RELAY_PORT, where
 * HTTPS_PROXY points inside the sandbox) and relays every connection to the server's
 * per-task CONNECT proxy at DIVERGE_EGRESS_SOCKET, on a thread of its own until the
 * runner exits (runner_relays_stop). E_FAIL when the port cannot be bound. A no-op in
 * `none` mode. */
int runner_egress_relay_start(const struct runner_config *cfg, struct err *err);

/* Starts the LLM relay (SPEC §13): 127.0.0.1:RUNNER_LLM_PORT (another free port when
 * that one is taken: a process sandbox shares the host's loopback) to the server's LLM
 * routes over DIVERGE_METER_SOCKET, else at the public URL DIVERGE_METER_URL was made
 * of, on a thread of its own until the runner exits. *PORT_OUT gets the bound port, 0
 * when there is no server to relay to (logged; the agent then gets no LLM variables).
 * E_FAIL when no port can be bound. */
int runner_llm_relay_start(uint16_t *port_out, const struct runner_config *cfg, struct err *err);

/* --- the LLM relay (llm_head.c: pure; llm_relay.c: the connections) ---------------- */

#define RUNNER_LLM_PORT 3129                     /* where the agent's *_BASE_URL point */
#define RUNNER_LLM_PREFIX "/api/v1/llm/"         /* the only paths relayed */
#define RUNNER_LLM_PLACEHOLDER "diverge-sandbox" /* the agent's API keys (replaced) */
#define RUNNER_LLM_HEAD_MAX (64u << 10)          /* bytes of a request head */
#define RUNNER_LLM_HEADERS_MAX 128               /* header lines of a request */
#define RUNNER_LLM_TARGET_MAX 8192               /* bytes of a request target */
#define RUNNER_LLM_BODY_MAX (32u << 20)          /* bytes of a request body */
#define RUNNER_LLM_CHUNK_LINE_MAX 1024           /* bytes of a chunk-size or trailer line */
#define RUNNER_LLM_TRAILERS_MAX 64               /* trailer lines of a chunked body */
#define RUNNER_LLM_ERROR_BODY_MAX (4u << 20)     /* bytes of a non-2xx answer passed back */
#define RUNNER_LLM_CONNS_MAX 32                  /* concurrent agent connections */
#define RUNNER_LLM_READ_TIMEOUT_MS 30000         /* the agent sends nothing for this long: 408 */
#define RUNNER_LLM_WRITE_TIMEOUT_MS 60000        /* the agent reads nothing for this long: cut */
#define RUNNER_LLM_CONNECT_TIMEOUT_MS 10000      /* reaching the server */
#define RUNNER_LLM_TIMEOUT_MS (30L * 60 * 1000)  /* one whole call, stream included */
#define RUNNER_LLM_ENV_COUNT 7                   /* variables runner_llm_env sets */

struct runner_llm_header {
    const char *name;  /* inside the head's store */
    const char *value; /* inside the head's store, surrounding blanks trimmed */
};

/* A parsed request head. */
struct runner_llm_head {
    char method[17];                   /* "POST", upper case letters */
    const char *target;                /* origin-form, under RUNNER_LLM_PREFIX; in store */
    struct runner_llm_header *headers; /* owned array, nheaders used */
    size_t nheaders;
    char *store;              /* owned copy of the head the strings point into */
    long long content_length; /* -1 when absent */
    bool chunked;             /* Transfer-Encoding: chunked */
    bool expect_continue;     /* Expect: 100-continue */
};

/* Parses the request head HEAD[0..len) (request line and header lines; CRLF or LF line
 * ends; the empty line may be included). Errors: E_NOTFOUND the target is not an
 * origin-form path under RUNNER_LLM_PREFIX without dot segments (404), E_TOOBIG the head,
 * the header count or the Content-Length is over its cap (413), E_INVALID anything
 * malformed: request line, header names or values, folded lines, conflicting framing, a
 * transfer coding other than chunked (400). Clean up with runner_llm_head_cleanup() even
 * on failure. */
int runner_llm_head_parse(struct runner_llm_head *h, const char *head, size_t len, struct err *err);
void runner_llm_head_cleanup(struct runner_llm_head *h);

/* The header lines ("Name: value") to send to the server for H: hop-by-hop and framing
 * headers dropped, and every x-api-key, x-goog-api-key and Authorization (as "Bearer")
 * carrying TOKEN instead of what the agent sent (the placeholder, or a token it was
 * given before a rotation). NULL-terminated; free with runner_llm_lines_free(). */
char **runner_llm_upstream_headers(const struct runner_llm_head *h, const char *token);
/* Wipes and frees LINES (NULL is a no-op). */
void runner_llm_lines_free(char **lines);

/* TARGET with every "key" query parameter (Gemini's ?key=) set to TOKEN (escaped); the
 * rest unchanged. Caller frees with runner_token_free(). */
char *runner_llm_target(const char *target, const char *token);

/* The response head for the agent: the status line, the server's headers (PAIRS[0..len)
 * as "name\0value\0", httpc's form) without hop-by-hop and framing ones or any with a
 * malformed name or value, then "Transfer-Encoding: chunked" when a body follows (not for
 * HEAD_REQUEST, 204 or 304; a HEAD answer keeps its Content-Length) and
 * "Connection: close". Caller frees. */
char *runner_llm_reply_head(long status, const char *pairs, size_t len, bool head_request);

/* A chunked request body being decoded. Zero it before the first call. */
struct runner_llm_chunked {
    long long left; /* data bytes left in the current chunk */
    bool need_crlf; /* the CRLF after a chunk's data is next */
    int trailers;   /* 0 before the last chunk, then 1 + trailer lines seen */
    bool done;      /* the body ended */
};

/* Decodes IN[0..len) (bytes that follow what earlier calls consumed) into OUT (whose
 * cap limits the body); *USED gets the bytes consumed. E_OK once the body ended (bytes
 * after it are not consumed), E_AGAIN when more is needed, E_INVALID for malformed
 * framing, E_TOOBIG when OUT's cap is reached. */
int runner_llm_dechunk(struct runner_llm_chunked *c, struct buf *out, const char *in, size_t len,
                       size_t *used);

/* The agent's LLM variables (SPEC §13) for a relay on PORT: DIVERGE_LLM_URL, the three
 * *_BASE_URL and the three placeholder API keys, as "NAME=value" strings the caller
 * frees, NULL-terminated. */
void runner_llm_env(char *out[RUNNER_LLM_ENV_COUNT + 1], uint16_t port);

/* The relay's state: what each connection needs. */
struct runner_llm_relay {
    const struct runner_config *cfg; /* borrowed: the token source and CA file */
    char *base;                      /* owned: "http://localhost" (socket) or the public URL */
    const char *unix_socket;         /* borrowed: DIVERGE_METER_SOCKET, or NULL */
    atomic_int stopping;             /* set when the runner stops: calls are cancelled */
};

/* Handles one agent connection FD (egress_conn_fn; USERDATA is a runner_llm_relay):
 * reads one request (bounded, timed), relays it with the current token and passes the
 * answer back as it arrives; then the listener closes the connection. */
void runner_llm_conn(int fd, int stop_fd, void *userdata);

/* The public URL of METER_URL ("<base>/api/v1/agenttask/meter" → "<base>", new string),
 * or NULL when it does not end so. */
char *runner_llm_url_base(const char *meter_url);

/* Prints one progress line to stdout (flushed), as the task log shows it. */
void runner_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
