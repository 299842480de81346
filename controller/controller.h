/* SPDX-License-Identifier: Apache-2.0 */
/* The embedded controller: a reconcile loop driven by the store's change feed. It owns
 * the token lifecycle (mint on create/resume, revoke on pause/finish) and the phase
 * machine of SPEC §4. With sandbox provider "none" nothing is started: a task turns
 * Active once its token is minted, and an external agent meters with that token. With
 * "process" or "local" it mirrors the repository, starts the runner in a sandbox, freezes
 * and thaws it, pushes the working branch from staging after a runner exit 0, and ends
 * the task (SPEC §9); a second thread reconciles runner exits and timeouts. */
#ifndef DIVERGE_CONTROLLER_CONTROLLER_H
#define DIVERGE_CONTROLLER_CONTROLLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/clock.h"
#include "common/err.h"
#include "store/store.h"
#include "token/token.h"

/* The server's GitHub App credentials for git (SPEC §9: mirror fetch and push outside the
 * sandbox). TOKEN sets *token_out to a new secret string (the controller wipes and frees
 * it): the installation access token git sends as "x-access-token" for PROJECT
 * ("owner/repo") on the GitHub web host, valid for a while yet (a cached one close to its
 * expiry is exchanged again). ACTIVE (may be NULL: always) says whether an App is
 * configured now; while it is not, git uses the environment's PAT as without TOKEN (an App
 * may be set up while the server runs). FREE (may be NULL) frees USERDATA with the
 * controller. */
struct controller_git_auth {
    int (*token)(void *userdata, const char *project, char **token_out, struct err *err);
    bool (*active)(void *userdata);
    void (*free)(void *userdata);
    void *userdata;
};

struct kube_client;

/* The server's side of the per-task meter sockets (local and process sandboxes). OPEN
 * serves the meter route only, with a small connection cap, on LISTEN_FD (a listening
 * unix socket, taken over on success) and sets *server_out to a handle for CLOSE, which
 * stops serving (connections closed, threads joined) and closes the socket. */
struct controller_meter_sockets {
    int (*open)(void **server_out, int listen_fd, void *userdata, struct err *err);
    void (*close)(void *server);
    void *userdata;
};

struct controller_config {
    const char *data_dir;           /* tokens, workspaces, mirrors, staging, logs under it */
    const unsigned char *root_key;  /* TOKEN_ROOT_KEY_LEN bytes, copied */
    int64_t default_budget_usd;     /* micro-dollars, when spec.budgetUSD is unset */
    int64_t default_budget_tokens;  /* when spec.budgetTokens is unset */
    int64_t default_max_iterations; /* runner's limit when spec.maxIterations is unset; 0: 5 */
    const char *sandbox_provider;   /* none, process, local, agent-sandbox */
    const char *meter_url;          /* DIVERGE_METER_URL given to sandboxes */
    const char *runner_path;        /* NULL: DIVERGE_RUNNER_PATH, else next to /proc/self/exe */
    const char *agent_cmd;          /* DIVERGE_AGENT_CMD (may be NULL) */
    const char *verify_cmd;         /* DIVERGE_VERIFY_CMD (may be NULL) */
    const char *sandbox_user;       /* local provider: host user; NULL: SPEC §2 default */
    const char *sandbox_tools;      /* local, process: read-only tools folder (bin/ on PATH) */
    int64_t sandbox_memory;         /* bytes, 0: none */
    int64_t sandbox_pids;           /* 0: none */
    int64_t warm_slots;             /* local: sandboxes started ahead (slot.c), 0: none */
    int64_t sandbox_cpus_milli;     /* 1000 = one CPU, 0: none */
    int64_t sandbox_disk;           /* bytes a task's files may use (local, process), 0: none */
    int64_t data_dir_reserve;       /* bytes kept free on the data dir's filesystem, 0: none */
    int64_t max_push_bytes;         /* bytes the server pushes to a remote at most, 0: none */
    bool push_wip;                  /* push a failed run's checkpoint as diverge/wip/<task> */
    int64_t stall_after_ms;         /* no activity this long: status.stalledSince; 0: never */
    int64_t no_progress_after;      /* identical verify failures that pause; 0: never */
    size_t log_cap;                 /* task log cap in bytes; 0: SANDBOX_LOG_CAP */
    const char *network;            /* none (NULL) or proxy: without spec.sandbox.network */
    const char *allow_hosts;        /* comma list of egress rules (proxy mode), or NULL */
    const char *preview_base_url;   /* --preview-base-url; NULL: no linked previews */
    const char *github_api_url;     /* --github-api-url: which https repositories are GitHub's */
    /* GitHub App tokens for git on the GitHub web host; token NULL: none (the PAT in
     * DIVERGE_NOTIFIER_TOKEN/GITHUB_TOKEN is used). controller_new takes USERDATA, also
     * when it fails. */
    struct controller_git_auth git_auth;
    /* Per-task meter sockets; open NULL: sandboxes get the server's shared socket
     * (controller_start's METER_SOCKET) instead. USERDATA must outlive the controller. */
    struct controller_meter_sockets meter_sockets;
    /* agent-sandbox: the cluster (NULL: tasks wait with the reason; with KUBE_OWNED
     * controller_new takes it, also when it fails, else it must outlive the controller),
     * the SandboxWarmPool claims name, and the poll period (0: 2 s). */
    struct kube_client *kube;
    bool kube_owned;
    const char *sandbox_warm_pool;
    int64_t sandbox_poll_ms;
    /* --max-running-tasks: sandboxes (running or frozen) at most; more tasks wait in a
     * queue (SPEC §14). 0: no limit. */
    int64_t max_running_tasks;
    bool manual;   /* no threads: the caller drives controller_reconcile */
    bool deferred; /* no threads until controller_start() */
};

struct controller;

/* What one reconcile step does to a task. */
enum controller_action {
    CONTROLLER_NOTHING,
    CONTROLLER_ACTIVATE,     /* provider none: mint a fresh token, phase Active */
    CONTROLLER_PAUSE,        /* revoke the token, freeze the sandbox, phase Paused */
    CONTROLLER_REVOKE,       /* finished task still holding an active token: revoke it */
    CONTROLLER_WAIT,         /* no sandbox provider can run it: note why, stay Pending */
    CONTROLLER_PROVISION,    /* mint, write the token file, mirror, staging, start → Active */
    CONTROLLER_RESTART,      /* Active but nothing runs (server restart): fresh token, start */
    CONTROLLER_THAW,         /* resume a frozen sandbox with a fresh token → Active */
    CONTROLLER_RESUME_START, /* resume after the runner exited: new runner, next iteration */
    CONTROLLER_COMPLETE,     /* runner exit 0 while Active: push the branch → Completed */
    CONTROLLER_FAIL_RUNNER,  /* runner exit != 0 → Failed (RunnerFailed) */
    CONTROLLER_TIMEOUT,      /* past sandbox.timeoutSeconds → stop, Failed (Timeout) */
    CONTROLLER_FAIL_SANDBOX, /* cannot run a sandbox (probe, workspace gone) → SandboxError */
    CONTROLLER_STOP,         /* finished task with something still running: stop, revoke */
    CONTROLLER_DISK_LIMIT,   /* over --sandbox-disk or the data dir's reserve → Failed */
    CONTROLLER_RERUN,        /* finished, spec.run raised: clean workspace → Pending, run N */
    CONTROLLER_PUSH_WIP,     /* paused and its runner exited: push the checkpoint, stop */
    CONTROLLER_ACTION_COUNT,
};

/* What the controller sees of a task besides its object. */
struct controller_observed {
    bool token_active;     /* its latest token is active */
    bool runs_sandboxes;   /* the provider starts sandboxes (process, local) */
    bool can_run;          /* the provider works on this host */
    bool waiting_noted;    /* provider none/unbuilt: the task already says why it waits */
    int sandbox;           /* enum sandbox_state of its sandbox */
    int exit_code;         /* SANDBOX_EXITED: the runner's status */
    bool timed_out;        /* active time is past sandbox.timeoutSeconds */
    bool workspace_exists; /* its workspace directory is there */
    bool never_started;    /* no sandbox ever ran for it (status.startTime unset) */
    bool disk_over;        /* the disk watchdog stopped it (disk_watch.c) */
    bool queued;           /* it must wait for a sandbox slot (the queue did not admit it) */
    bool provider_changed; /* it last started under another --sandbox-provider */
    bool checkpoint;       /* its staging repository holds refs/heads/diverge/wip/<task> */
};

/* The pure decision: V is the task, O what is observed of it. */
enum controller_action controller_decide(const struct task_view *v,
                                         const struct controller_observed *o);
/* "provision", "pause", ... */
const char *controller_action_name(enum controller_action a);

/* --- the queue of tasks waiting for a sandbox slot (queue.c) -------------------------- */

/* One waiting task. */
struct controller_queue_item {
    const char *ns, *name; /* borrowed */
    int64_t arrival;       /* when it began to wait (ms); ties by namespace, name */
    int64_t running;       /* slots its namespace holds already */
    int64_t round;         /* in: its round, -1 for a task new to the queue; out: a new
                              one's is RUNNING + the tasks of its namespace waiting before it */
    int64_t ns_cap;        /* in: slots its namespace may hold (SpendQuota maxRunningTasks),
                              -1: no cap */
    int64_t position;      /* out (controller_queue_admit): 0 admitted, else 1, 2, ... */
    bool ns_full;          /* out: it waits for its namespace's cap, not for a free slot */
    const char *url;       /* borrowed: its spec.repository.url, or NULL */
};
/* Admits ITEMS[N], in queue order, into FREE_SLOTS (when LIMITED; else any number): one
 * is admitted (position 0) while slots remain and its namespace holds fewer than its
 * ns_cap, counting those admitted before it; the others wait, numbered 1, 2, ... in
 * order (ns_full: because of their namespace's cap). Pure. */
void controller_queue_admit(struct controller_queue_item *items, size_t n, bool limited,
                            int64_t free_slots);
/* Orders ITEMS[N] in place for the queue: first come first served, round robin across
 * namespaces. A task new to the queue gets a round (the slots its namespace holds plus its
 * namespace's tasks waiting before it), kept while it waits; the queue is by round, then
 * by arrival. So the oldest waiting task of a namespace with nothing running goes first,
 * and no task passes one that was ahead of it when it came. */
void controller_queue_order(struct controller_queue_item *items, size_t n);

/* --- linked preview Environment and draft PR (preview.c): pure decisions ------------- */

#define CONTROLLER_PREVIEW_PREFIX "agent-preview-"
#define CONTROLLER_PREVIEW_HEADER "x-diverge-env"
#define CONTROLLER_ANN_PREVIEW_ENABLED "divergedev.com/preview-enabled"
#define CONTROLLER_ANN_PREVIEW_ENV "divergedev.com/preview-environment"
#define CONTROLLER_ANN_PREVIEW_URL "divergedev.com/preview-url"
#define CONTROLLER_ANN_SANDBOX_IP "divergedev.com/sandbox-ip"
#define CONTROLLER_ANN_HIBERNATED "divergedev.com/hibernated"
#define CONTROLLER_SANDBOX_IP "127.0.0.1" /* local sandboxes: loopback of their own host */

/* What an action does to the task's Environment. */
enum controller_env_state {
    CONTROLLER_ENV_KEEP,       /* nothing */
    CONTROLLER_ENV_RUNNING,    /* the sandbox runs: sandbox-ip set, hibernated removed */
    CONTROLLER_ENV_HIBERNATED, /* paused: hibernated "true", sandbox-ip removed */
    CONTROLLER_ENV_RELEASED,   /* the task finished: no sandbox, kept until the task goes */
};

/* "agent-preview-<task>" when TASK gets a linked preview (spec.repository.url set,
 * preview-enabled not "false", BASE_URL configured), else NULL. New string. */
char *controller_preview_env_name(const json_t *task, const char *base_url);
/* Whether BASE_URL can be --preview-base-url: http(s), a host, printable ASCII, no query
 * or fragment. */
bool controller_preview_base_valid(const char *base_url);
/* "<BASE_URL without trailing '/'>/?_diverge_env=<ENV>". New string. */
char *controller_preview_url(const char *base_url, const char *env);
/* The Environment's state after action A (FAILED: execution failed the task). */
enum controller_env_state controller_preview_state(enum controller_action a, bool failed);
/* The Environment ENV of TASK in STATE (new object); OLD (may be NULL) is the stored one,
 * whose other annotations are kept. SANDBOX_IP (may be NULL) is annotated while running. */
json_t *controller_preview_env(const json_t *task, const json_t *old, const char *env,
                               const char *url, enum controller_env_state state,
                               const char *sandbox_ip);
/* Where the draft PR of the completed TASK goes (spec.draftPR true, a repository, not made
 * from a PR comment): "github" and "owner/repo" for https://<GitHub web host>/owner/repo
 * (github.com for api.github.com, else the host of GITHUB_API_URL), "local" and
 * "local/<repository directory name>" for file:// repositories. False (both NULL) else. */
bool controller_draft_pr_target(char **provider_out, char **project_out, const json_t *task,
                                const char *github_api_url);
/* The GitHub web base of the REST base API_URL: "https://github.com" for
 * api.github.com, else (Enterprise https://HOST/api/v3, or a test server) its scheme, host
 * and port. New string, or NULL when API_URL is not http(s). */
char *controller_github_web_base(const char *api_url);
/* "owner/repo" of WEB/owner/repo[.git][/] (WEB from controller_github_web_base), or NULL.
 * New string. */
char *controller_github_project(const char *url, const char *web);

/* The draft PR request of TASK (new object): title "fix(<task>): <objective's first
 * line>", head, base, body, draft true, and "key", the marker line its body carries. */
json_t *controller_draft_pr_request(const json_t *task);

/* Why the server may not push the working branch of TASK (an AgentTask document) to
 * spec.repository.url, or NULL when it may (SPEC §9). Refused: no repository; a working
 * branch that is not a plain branch name; the working branch equal to the bot-recorded
 * base branch (TASK_ANN_PR_BASE_BRANCH) of the repository the pull request targets
 * (TASK_ANN_PR_BASE_REPOSITORY, compared with controller_same_repository), whoever made
 * the task; the working branch equal to spec.repository.baseBranch, unless the task
 * carries a push grant (TASK_ANN_PUSH_GRANT) that token_push_grant_ok accepts under
 * ROOT_KEY for its namespace, name, URL, working branch and recorded PR base. Only the
 * bot makes grants; the task API's callers can copy one but not make one for another
 * target. The reason is a static string. */
const char *controller_push_refusal(const json_t *task,
                                    const unsigned char root_key[TOKEN_ROOT_KEY_LEN]);

/* Whether URL is a file:// URL naming a path inside DATA_DIR (the server's data
 * directory: other projects' mirrors, staging repositories, workspaces), except its
 * "demo" directory (`diverge local demo`'s example repository). The path is read as git
 * reads it (the host ignored, percent-decoded; a %00 counts as inside), then resolved
 * lexically and through the symbolic links of the part that exists. Such a URL is refused
 * wherever a task gets its repository. */
bool controller_url_in_data_dir(const char *data_dir, const char *url);

/* Whether the clone URLs A and B name the same repository: equal ignoring ASCII case, a
 * trailing "/" and a trailing ".git". False when either is NULL. */
bool controller_same_repository(const char *a, const char *b);

/* Why sandboxes cannot run here (with the fix), or NULL: borrowed from C. */
const char *controller_sandbox_problem(const struct controller *c);

struct controller;

/* Starts the reconcile threads over STORE (borrowed). Every existing task is reconciled
 * first, so a restart resumes where the previous process stopped (sandboxes that died
 * with the previous server are started again). */
int controller_new(struct controller **out, struct task_store *store,
                   const struct controller_config *cfg, struct err *err);
/* Starts the threads of a controller made with cfg.deferred, giving sandboxes METER_URL
 * (NULL: the one from the config) and the server's unix socket METER_SOCKET (may be NULL;
 * made reachable for the sandbox user). E_FAIL when a thread cannot start (then free C). */
int controller_start(struct controller *c, const char *meter_url, const char *meter_socket,
                     struct err *err);
/* Adds the server's listeners LISTENS (a NULL-terminated list of "host:port" or
 * "[v6]:port"; a name is resolved), each with its port, and every address of the host's
 * interfaces to the addresses egress proxies always refuse. Call once, before
 * controller_start. E_INVALID / E_FAIL. */
int controller_egress_own(struct controller *c, const char *const *listens, struct err *err);

/* Stops the threads and every sandbox (they die with the server, SPEC §9); NULL is a
 * no-op. */
void controller_free(struct controller *c);

/* Reconciles one task now (also used by tests). E_NOTFOUND when it is gone. */
int controller_reconcile(struct controller *c, const char *ns, const char *name, struct err *err);

/* Runs CHANGE (a write of task NS/NAME that may set spec.suspended, e.g. a PATCH) with
 * the task's sandbox frozen first when the task is Active, not suspended and its sandbox
 * runs, so that the pause's freeze is not behind the change's fsync and the controller's
 * wake-up. Kept frozen when the task is Active and suspended after CHANGE (its reconcile
 * then revokes the token and writes Paused), else thawed again. Only when no reconcile
 * is at work (the reconcile lock is taken without waiting); otherwise, and for a NULL C
 * or one without sandboxes, CHANGE alone. Returns what CHANGE returned. */
int controller_suspend_change(struct controller *c, const char *ns, const char *name,
                              int (*change)(void *userdata), void *userdata);

/* For a DELETE the store could not record (its filesystem full): stops the task's
 * sandbox and removes its files (workspace, staging, state, token, log) so that space
 * frees up, with the reconcile lock held. A no-op for a NULL C. */
void controller_release_task(struct controller *c, const char *ns, const char *name);

/* A SpendQuota was created, changed or deleted (its maxRunningTasks may free slots): the
 * tick thread runs a queue pass now. A no-op for a NULL C. */
void controller_queue_poke(struct controller *c);

/* A task may be made and started soon (a comment that asks for a `fix` came in, or the
 * bot gathers a permitted one): the sandbox provider may get ready for a start of a task
 * it does not know yet (sandbox_warm). A hint that never blocks; a no-op for a NULL C or
 * without sandboxes. */
void controller_start_coming(struct controller *c);
/* Whether controller_start_coming does anything for C (NULL: no): callers skip the work of
 * finding out whether a start is coming when it would not. */
bool controller_warms(const struct controller *c);

/* Path of the task's token file: new string, caller frees. */
char *controller_token_path(const struct controller *c, const char *ns, const char *name);

#endif
