/* SPDX-License-Identifier: Apache-2.0 */
/* diverge-agent-runner (SPEC §9): clone, metered iterations of the agent and verify
 * commands, commit and push of the working branch. The pure parts (usage lines, request
 * ids, the offset state, exit codes, the iteration verdict) are separate functions so
 * they are unit-tested; runner_run() wires them to git, the meter and the children. */
#ifndef DIVERGE_RUNNER_RUNNER_H
#define DIVERGE_RUNNER_RUNNER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define RUNNER_USAGE_LINE_MAX 4096               /* bytes of one usage line, newline excluded */
#define RUNNER_MODEL_MAX 256                     /* bytes of a model name in a usage line */
#define RUNNER_TOKENS_MAX INT64_C(1000000000000) /* tokensUsed of one line */
#define RUNNER_COST_MAX_MICROS INT64_C(1000000000000000) /* $1e9: costUSD of one line */
#define RUNNER_REQUEST_ID_MAX 256    /* bytes of a requestId (the meter's limit) */
#define RUNNER_STATE_MAX 1024        /* bytes of the offset state file */
#define RUNNER_FAILURE_MAX 4096      /* bytes of DIVERGE_LAST_FAILURE */
#define RUNNER_TAIL_LINES 20         /* output lines quoted in DIVERGE_LAST_FAILURE */
#define RUNNER_GUIDANCE_MAX 8192     /* bytes of DIVERGE_GUIDANCE kept from an answer */
#define RUNNER_ITERATIONS_MAX 10000  /* DIVERGE_MAX_ITERATIONS cap */
#define RUNNER_REVOKED_WAIT_MS 30000 /* default wait of a 401 for a new token in the file */
/* Default time a meter call that reaches no server is retried for (past the attempts). */
#define RUNNER_UNREACHABLE_MS 60000
#define RUNNER_REVOKED_POLL_MS 100 /* how often that wait reads the token file */
#define RUNNER_ROTATIONS_MAX 8     /* new tokens tried for one meter call */

/* Exit codes of diverge-agent-runner (README-runner.md). */
enum runner_exit {
    RUNNER_EXIT_OK = 0,           /* verified and pushed, or stopped by a 429 (task paused) */
    RUNNER_EXIT_FAILED = 1,       /* every iteration failed */
    RUNNER_EXIT_CONFIG = 2,       /* missing or malformed environment */
    RUNNER_EXIT_FORBIDDEN = 3,    /* the meter answered 403 (model not allowed) */
    RUNNER_EXIT_UNAUTHORIZED = 4, /* the meter answered 401 (token revoked, task not Active) */
    RUNNER_EXIT_UNREACHABLE = 5,  /* the meter could not be reached after the retries */
    RUNNER_EXIT_GIT = 6,          /* clone, checkout, commit or push failed */
    RUNNER_EXIT_PROTOCOL = 7,     /* the meter answered 400 or something unexpected */
};

/* --- usage lines ---------------------------------------------------------------- */

/* One usage line {"model":…,"tokensUsed":…,"costUSD":…} the agent appended. */
struct runner_usage {
    bool has_model;                   /* "model" was a string */
    char model[RUNNER_MODEL_MAX + 1]; /* NUL-terminated when has_model */
    int64_t tokens;                   /* tokensUsed, 0..RUNNER_TOKENS_MAX; 0 when absent */
    int64_t cost_micros;              /* costUSD exactly, micro-dollars; 0 when absent */
};

/* Parses the usage line LINE[0..len) (no newline; untrusted bytes). costUSD may be a JSON
 * number (exponent allowed) or a decimal string, converted exactly: more than 6
 * decimals, a negative amount or one above the caps is E_INVALID, as is anything that is
 * not one JSON object, a non-integer tokensUsed, a model that is not a string of at most
 * RUNNER_MODEL_MAX bytes without control characters, and a line over
 * RUNNER_USAGE_LINE_MAX bytes. Other keys are ignored. */
int runner_usage_parse(struct runner_usage *out, const char *line, size_t len, struct err *err);

/* Converts the JSON number text S[0..len) ("0.0225", "2.25e-2", "3") to exact
 * micro-dollars; E_INVALID for a negative, malformed or over-precise number or one
 * above RUNNER_COST_MAX_MICROS. */
int runner_cost_parse(int64_t *micros_out, const char *s, size_t len);

/* Where the next line of a usage chunk is. BUF[0..len) are the bytes from the current
 * offset. *line_len_out gets the line's length without its newline and *advance_out the
 * bytes it takes (newline included). Returns false when no complete line is there: no
 * newline, unless AT_EOF and the rest is not empty (the agent is not running while the
 * runner meters, so an unterminated last line is complete then). */
bool runner_usage_next(size_t *line_len_out, size_t *advance_out, const char *buf, size_t len,
                       bool at_eof);

/* requestId of the usage line at byte OFFSET of task TASK: "<task>-u<offset>". OUT has
 * CAP bytes; E_TOOBIG when it does not fit. */
int runner_request_id_usage(char *out, size_t cap, const char *task, uint64_t offset);
/* requestId of a heartbeat without usage before iteration ITERATION ("<task>-i<n>-h") or
 * of the final one after it (FINAL: "<task>-i<n>-f"): the same id after a restart. */
int runner_request_id_heartbeat(char *out, size_t cap, const char *task, long iteration,
                                bool final);

/* --- the offset state (a file next to the usage file, outside the git tree) --------- */

struct runner_state {
    uint64_t offset;                  /* bytes of the usage file already metered */
    char model[RUNNER_MODEL_MAX + 1]; /* model of the last metered line, "" when none */
};

/* Reads PATH into *out; a missing file is the empty state (offset 0). E_INVALID when the
 * file is malformed, E_FAIL when it cannot be read. */
int runner_state_load(struct runner_state *out, const char *path, struct err *err);
/* Writes ST to PATH atomically (PATH.tmp, fsync, rename). E_FAIL on I/O errors. */
int runner_state_save(const char *path, const struct runner_state *st, struct err *err);
/* The state file as its one writer keeps it: runner_state_store writes the first state
 * and any of another length with runner_state_save, then keeps the file open and
 * rewrites a state of the same length in place (one pwrite of at most one 512-byte
 * sector at offset 0, then fdatasync): no new inode, no rename and no freed block per
 * charge, so the fsync'd record costs one data write. A power cut leaves the old or the
 * new text (a sector is written whole), as the rename left the old or the new file. */
struct runner_state_file {
    int fd;     /* the file at PATH, open for writing; -1 until the first store */
    size_t len; /* bytes of the text it holds */
};
int runner_state_store(struct runner_state_file *f, const char *path, const struct runner_state *st,
                       struct err *err);
void runner_state_file_close(struct runner_state_file *f);
/* Formats ST as the file's text ("<offset>\n<model>\n") into OUT (CAP bytes); returns
 * the length. Parses such text back with runner_state_parse (E_INVALID when junk). */
size_t runner_state_format(char *out, size_t cap, const struct runner_state *st);
int runner_state_parse(struct runner_state *out, const char *text, size_t len);

/* --- meter answers, exit codes, the iteration verdict ----------------------------- */

enum runner_meter_next {
    RUNNER_METER_CONTINUE,     /* 200: charged (or already charged) */
    RUNNER_METER_PAUSED,       /* 429: stop at once, exit 0 */
    RUNNER_METER_FORBIDDEN,    /* 403 */
    RUNNER_METER_UNAUTHORIZED, /* 401 */
    RUNNER_METER_RETRY,        /* unreachable, timeout, 5xx, 408: same requestId again */
    RUNNER_METER_PROTOCOL,     /* 400 or any other status */
};

/* What to do after a meter call that returned RC (E_OK: an HTTP STATUS arrived). */
enum runner_meter_next runner_meter_classify(int rc, long status);
/* The exit code a stop for NEXT means (RUNNER_EXIT_OK for PAUSED). */
enum runner_exit runner_exit_for(enum runner_meter_next next);
/* Delay before retry ATTEMPT (1-based) of a meter call, ms: FIRST_MS (DIVERGE_METER_BACKOFF_MS,
 * 100 by default), twice that, four times, ... capped at RUNNER_BACKOFF_CAP_FACTOR times
 * FIRST_MS (5000 by default). */
#define RUNNER_BACKOFF_CAP_FACTOR 50
long runner_backoff_ms(int attempt, long first_ms);
/* Whether a meter call is tried again after ATTEMPT (1-based) of MAX_ATTEMPTS ended in
 * RUNNER_METER_RETRY, ELAPSED_MS after its first try began: within MAX_ATTEMPTS always;
 * past them only when the server was not reached at all (UNREACHABLE: no HTTP answer,
 * e.g. a meter socket whose connections are all taken) and less than UNREACHABLE_MS has
 * passed. Any other answer (429, 403, ...) stops the call at once (the caller's). */
bool runner_meter_again(int attempt, int max_attempts, bool unreachable, long elapsed_ms,
                        long unreachable_ms);

/* The outcome of one iteration. preview_status is 0 when no preview is configured, -1
 * when the preview could not be reached. */
struct runner_iteration {
    long iteration;      /* 1-based */
    int agent_status;    /* exit status of the agent command (128+signal when killed) */
    bool verify_ran;     /* the verify command ran (agent exit 0 and a command set) */
    int verify_status;   /* its exit status */
    bool preview_ran;    /* the preview was checked */
    long preview_status; /* HTTP status of the preview GET, -1 unreachable */
};

/* Whether two failure texts (runner_failure_text) name the same failure: the same text
 * after their "iteration N: " prefixes (the command, its exit status, the last lines). */
bool runner_same_failure(const char *a, const char *b);

/* True when IT succeeded: agent 0, verify 0 (or not set), preview 2xx (or none). */
bool runner_iteration_ok(const struct runner_iteration *it);

/* DIVERGE_LAST_FAILURE for a failed IT: which command failed, its exit status and the
 * last RUNNER_TAIL_LINES lines of TAIL[0..tail_len) (its output; NUL and other control
 * bytes but tab and newline become '?'), at most RUNNER_FAILURE_MAX bytes. Caller frees. */
char *runner_failure_text(const struct runner_iteration *it, const char *tail, size_t tail_len);

/* The progress line "iteration 2/5: agent exit 0, verify exit 1" for IT of MAX. */
void runner_iteration_line(char *out, size_t cap, const struct runner_iteration *it, long max);

/* --- configuration ------------------------------------------------------------- */

/* Everything the runner reads from its environment. Strings are borrowed from the
 * environment (getenv). */
struct runner_config {
    const char *task;          /* DIVERGE_TASK_NAME, a DNS label (required) */
    const char *ns;            /* DIVERGE_NAMESPACE or "default" */
    const char *objective;     /* DIVERGE_OBJECTIVE or "agent task" */
    const char *repo_url;      /* DIVERGE_REPO_URL (required) */
    const char *base_branch;   /* DIVERGE_BASE_BRANCH or "main" */
    char *working_branch;      /* owned: DIVERGE_WORKING_BRANCH or "agent/<task>" */
    const char *push_url;      /* DIVERGE_PUSH_URL or NULL (then "origin") */
    const char *workspace;     /* DIVERGE_WORKSPACE_DIR or "/workspace" */
    const char *usage_file;    /* DIVERGE_USAGE_FILE or NULL (heartbeats only) */
    char *state_file;          /* owned: "<usage_file>.offset", NULL without one */
    const char *agent_cmd;     /* DIVERGE_AGENT_CMD (required) */
    const char *verify_cmd;    /* DIVERGE_VERIFY_CMD or NULL */
    long start_iteration;      /* DIVERGE_START_ITERATION or 1 */
    long run;                  /* DIVERGE_RUN or 1: the task's run (SPEC §14) */
    char id_prefix[96];        /* requestIds start with it: the task, "-r<run>" after it
                                  from run 2 on (ids stay unique across runs) */
    long max_iterations;       /* DIVERGE_MAX_ITERATIONS or 5 */
    const char *token_env;     /* DIVERGE_MACAROON_TOKEN when non-empty, else NULL */
    const char *token_file;    /* DIVERGE_TOKEN_FILE or NULL */
    const char *meter_socket;  /* DIVERGE_METER_SOCKET or NULL (preferred) */
    const char *meter_url;     /* DIVERGE_METER_URL or NULL */
    const char *ca_file;       /* DIVERGE_CA_FILE: PEM bundle that https meter, preview and
                                  git calls trust instead of the system's, or NULL */
    int meter_attempts;        /* DIVERGE_METER_ATTEMPTS or 8: tries per meter call */
    long backoff_ms;           /* DIVERGE_METER_BACKOFF_MS or 100: the first wait between
                                  them (runner_backoff_ms) */
    long revoked_wait_ms;      /* DIVERGE_REVOKED_WAIT_MS or 30000: how long a 401 with a
                                  token file waits for a new token (a pause in progress) */
    long unreachable_ms;       /* DIVERGE_METER_UNREACHABLE_MS or 60000: how long a meter
                                  call that reaches no server keeps being retried */
    const char *preview_url;   /* DIVERGE_PREVIEW_URL or NULL */
    const char *preview_key;   /* DIVERGE_PREVIEW_HEADER_KEY or "x-diverge-env" */
    const char *preview_value; /* DIVERGE_PREVIEW_HEADER_VALUE or "" */
    const char *author_name;   /* DIVERGE_GIT_AUTHOR_NAME or "diverge-agent" */
    const char *author_email;  /* DIVERGE_GIT_AUTHOR_EMAIL or "agent@diverge.invalid" */
    const char *network;       /* DIVERGE_SANDBOX_NETWORK: "none" (default) or "proxy" */
    const char *egress_socket; /* DIVERGE_EGRESS_SOCKET: the server's per-task CONNECT
                                  proxy socket (required with network proxy) */
    char *wip_branch;          /* owned: "diverge/wip/<task>", the checkpoint branch (SPEC §14) */
    char *failure_file;        /* owned: "<usage_file>.failure" (the last failure, for the
                                  server), NULL without a usage file */
    char *no_progress_file;    /* owned: "<usage_file>.no-progress" (asks the server to pause
                                  the task), NULL without a usage file */
    long no_progress_after;    /* DIVERGE_NO_PROGRESS_AFTER or 3: identical verify failures in
                                  a row that ask for a pause; 0: never */
    long follow_ms;            /* DIVERGE_USAGE_FOLLOW_MS or 250: how often the usage file is
                                  read while the agent runs */
    long gate_fd;              /* DIVERGE_START_GATE_FD or -1: a descriptor to read one byte
                                  from before touching the workspace (runner_gate_wait) */
};

/* The start gate of a sandbox the server started while it still made the workspace
 * (its mirror fetch): with CFG->gate_fd set, blocks until the server writes "g" (the
 * workspace is made and the task Active: go on), or "c" (the workspace is made: *LATER
 * is set, and runner_gate_go waits for the "g" before anything is metered). E_FAIL when
 * the server wrote anything else or closed its end (the start was called off). The
 * descriptor is closed once the "g" came (or the start was called off). */
int runner_gate_wait(const struct runner_config *cfg, bool *later, struct err *err);
int runner_gate_go(const struct runner_config *cfg, struct err *err);

#define RUNNER_GATE_ENV_MAX 60000 /* bytes of the environment a warm slot's gate brings */
#define RUNNER_GATE_ENV_ENTRIES 96

/* A warm slot's runner (DIVERGE_START_GATE_ENV=1, started before any task was known): its
 * environment is the task's, which the server writes into the start gate before the "c"
 * and "g": "e", the length (4 bytes, big-endian, 1 to RUNNER_GATE_ENV_MAX), then
 * "KEY=VALUE" entries each ended by a NUL. Blocks until it came, runs BEFORE_SET (may be
 * NULL: the runner waits there for its loading thread), then makes the process's
 * environment exactly those entries plus its own DIVERGE_START_GATE_FD. E_OK at once
 * without DIVERGE_START_GATE_ENV; E_FAIL when the message is malformed or the server
 * closed the gate. */
int runner_gate_env(void (*before_set)(void), struct err *err);

/* Starts loading libcurl on the early thread (curl_lazy.c, the executable only): the
 * runner's HTTP calls wait for it. runner_curl_settle waits for that thread (before the
 * runner exits). */
void runner_curl_preload(void);
void runner_curl_settle(void);
/* Waits until the load runner_curl_preload started is done. */
void runner_curl_wait(void);

/* The early thread (early.c): runner_early_start runs FIRST on a new thread, which then
 * runs at most one job handed over by runner_early_then (false when there is no early
 * thread or it has a job already: the caller runs JOB itself). runner_early_wait waits
 * until the handed job returned; runner_early_stop joins the thread. */
void runner_early_start(void (*first)(void));
bool runner_early_then(void (*job)(void *), void *arg);
void runner_early_wait(void);
void runner_early_stop(void);

/* Looks up NAME in an environment; NULL when unset. */
typedef const char *(*runner_getenv_fn)(const char *name, void *userdata);

/* Fills *out from the environment GET. E_INVALID (message names the variable) when a
 * required variable is missing or a value is malformed: task not a DNS label, an
 * iteration number out of 1..RUNNER_ITERATIONS_MAX, a branch or URL starting with '-'
 * or holding control characters, neither meter variable nor a token source set.
 * Release with runner_config_cleanup() even on failure. */
int runner_config_load(struct runner_config *out, runner_getenv_fn get, void *userdata,
                       struct err *err);
void runner_config_cleanup(struct runner_config *c);

/* Runs the whole runner (SPEC §9) and returns its exit code. Logs to stdout/stderr;
 * never prints the token. */
enum runner_exit runner_run(const struct runner_config *cfg);

/* Stops the relays runner_run started (the egress relay in `proxy` mode, the LLM relay):
 * their connections closed, their threads joined; a no-op without any. */
void runner_relays_stop(void);

#endif
