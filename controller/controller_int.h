/* SPDX-License-Identifier: Apache-2.0 */
/* Declarations shared inside controller/ only. */
#ifndef DIVERGE_CONTROLLER_CONTROLLER_INT_H
#define DIVERGE_CONTROLLER_CONTROLLER_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "controller/controller.h"
#include "sandbox/sandbox.h"

/* A task whose active time is being counted (it has a live, unfrozen sandbox). */
struct controller_timer {
    char *ns, *name;     /* owned */
    int64_t deadline_ms; /* epoch ms; the task times out at this time */
    int64_t warn_ms;     /* epoch ms of 80 % of its timeout (0: none); the agent is told the
                            time left from then on (status.timeoutAt) */
    bool warned;         /* status.timeoutAt was written for this deadline */
    /* Stalls (runs.c): the last activity seen, the task log's size then, the newest meter
     * request id seen (owned, or NULL), whether status.stalledSince is set, whether the
     * runner's no-progress note was acted on. */
    int64_t active_ms, log_size;
    char *meter_id;
    bool stalled, no_progress;
    struct controller_timer *next;
};

/* A task named by a sandbox's exit, waiting for the tick thread. */
struct controller_note {
    char *ns, *name; /* owned */
    struct controller_note *next;
};

struct controller {
    struct task_store *store;                   /* borrowed */
    char *data_dir;                             /* owned */
    unsigned char root_key[TOKEN_ROOT_KEY_LEN]; /* wiped on free */
    int64_t default_budget_usd;                 /* micro-dollars */
    int64_t default_budget_tokens;
    int64_t default_max_iterations; /* the runner's limit when spec.maxIterations is unset */
    char *provider;                 /* owned: the sandbox provider name */
    char *meter_url, *runner_path;  /* owned */
    char *meter_socket;             /* owned: the server's unix socket, or NULL */
    struct controller_meter_sockets meter_sockets; /* per-task sockets (open NULL: none) */
    char *agent_cmd, *verify_cmd;                  /* owned, may be NULL */
    char *sandbox_tools;                           /* owned: --sandbox-tools, or NULL */
    size_t log_cap;                                /* task log cap */
    char *preview_base;                            /* owned, or NULL: no linked previews */
    char *github_api_url;                          /* owned, or NULL */
    struct controller_git_auth git_auth;           /* GitHub App tokens for git; userdata owned */
    struct sandbox_provider *sandboxes;            /* owned; NULL for none (or no cluster) */
    struct kube_client *kube;                      /* agent-sandbox's client, or NULL */
    bool kube_owned;                               /* kube is freed with the controller */
    char *problem;                                 /* owned: why sandboxes cannot run, or NULL */
    unsigned int sandbox_uid, sandbox_gid;         /* owner of what the sandbox writes */
    bool chown_files;                              /* give files to sandbox_uid (server is root) */
    pthread_mutex_t lock;                          /* one reconcile at a time */
    pthread_mutex_t notes_lock;                    /* guards notes, timers, wake */
    pthread_mutex_t active_lock; /* one update of a counted-time record at a time */
    uint64_t run_id;             /* random: this server run (active.c) */
    pthread_cond_t notes_cond;
    struct controller_note *notes;   /* exits to reconcile */
    struct controller_timer *timers; /* running tasks with a timeout */
    bool tick_running;
    bool mirror_async; /* the tick thread was started: set once, before any reconcile */
    atomic_bool stopping;
    pthread_t tick;
    struct store_worker *worker; /* owned; NULL in manual mode */
    /* The depth-50 shallow lists of recent workspaces by their tips (lock): a commit's
     * parents never change, so a start on tips seen before runs no `git rev-list`
     * (workspace_clone.c). */
    struct controller_shallow_memo {
        char tips[2 * 40 + 19]; /* "<tip1> <tip2> <mirror path's hash>", "" unused */
        char *text;             /* owned: the shallow file, "" when the history fits */
    } shallow_memo[8];
    size_t shallow_next;                        /* the entry the next one replaces */
    struct controller_mirror_job *mirror_jobs;  /* fetches running or done (notes_lock) */
    struct controller_push_job *push_jobs;      /* pushes running or done (notes_lock) */
    struct controller_push_job *push_forgotten; /* deleted tasks' pushes (notes_lock) */
    struct controller_launch *prelaunches;      /* gated sandboxes (lock; launch.c) */
    /* Warm slots (slot.c; lock): at most slot_max (--sandbox-warm-slots), one per
     * repository a fresh start wanted (slot_wants, newest first). */
    int64_t slot_max;
    int64_t slot_busy_ms; /* the last start that claimed or launched (epoch ms) */
    int64_t slot_room;    /* slots --max-running-tasks leaves room for (queue.c), -1: any */
    uint64_t slot_seq;
    struct controller_slot *slots;
    struct controller_slot_want *slot_wants;

    /* Egress (network.c): --sandbox-network proxy (tasks may say otherwise), and
     * the --sandbox-allow-host rules plus the server's own addresses (owned). */
    bool network_proxy;
    struct egress_policy *egress_policy;

    /* Disk limits (disk_watch.c): --sandbox-disk, the data dir's reserve, --max-push-bytes
     * (bytes, 0: none), and the watchdog. */
    int64_t sandbox_disk, disk_reserve, max_push_bytes;
    bool push_wip;                /* --push-wip */
    int64_t stall_after_ms;       /* --stall-after, 0: never */
    int64_t no_progress_after;    /* --no-progress-after, 0: never */
    struct controller_disk *disk; /* owned: the watchdog's marks and thread */

    /* The queue (queue.c): --max-running-tasks (0: none) and the waiting tasks (guarded by
     * queue_lock, taken last: never held while calling the store). */
    int64_t max_running;
    atomic_bool ns_caps;       /* some SpendQuota caps its namespace's running tasks (last pass) */
    pthread_mutex_t pass_lock; /* one queue pass at a time (taken before lock) */
    pthread_mutex_t queue_lock;
    struct controller_queued *queued;
    size_t queue_hint_seen, queue_hint_bytes; /* the last pass's tasks and their strings' bytes
                                                 (pass_lock) */
    struct controller_queued **queued_index;  /* hash buckets of the records (queue_state.c) */
    size_t queued_buckets, queued_count;
    uint64_t queued_seed;    /* of the records' hash: names are the users' */
    atomic_bool queue_poked; /* a pass is due now (controller_queue_poke): the tick runs it */
};

/* One reconcile of one task: planned in a transaction, executed outside (sandbox, git),
 * applied in a second transaction. */
struct reconcile {
    struct controller *c;
    const char *ns, *name;         /* borrowed */
    bool plan;                     /* planning pass: decide (and mint) only */
    enum controller_action action; /* out of the plan */
    enum task_phase phase;         /* the phase seen when planning */
    char *token, *id;              /* owned: the token minted while planning */
    int64_t generation;            /* its generation */
    char *url, *base, *working;    /* owned copies of spec.repository (url may be NULL) */
    char *objective;               /* owned */
    char *ran_provider;            /* owned: TASK_ANN_SANDBOX_PROVIDER, or NULL */
    json_t *sandbox;               /* owned copy of spec.sandbox (network), or NULL */
    char *agent_cmd, *verify_cmd;  /* owned: spec.runner.command/verifyCommand, or NULL */
    int64_t iteration, max_iterations, timeout_s;
    int64_t run;  /* spec.run: the run a RERUN starts (given to the runner as DIVERGE_RUN) */
    bool started; /* a sandbox ran for it once (status.startTime is set) */
    const char *push_refusal; /* static: why the working branch may not be pushed, or NULL */
    int exit_code;            /* the runner's, for FAIL_RUNNER */
    const char *fail_reason;  /* set by execution when the task must fail */
    char *fail_msg;           /* owned */
    char *preview_env;        /* owned: the task's preview Environment, or NULL */
    char *preview_url;        /* owned: its previewUrl, or NULL */
    char *pr_url;             /* owned: a finished task's pull-request-url annotation */
    char *draft_pr;           /* owned: "<provider> <project>" of a queued draft PR */
    bool wip_pushed;          /* the run's checkpoint went to the remote (TASK_ANN_WIP_BRANCH) */
    char *last_failure;       /* owned: the runner's last failure text, with wip_pushed */
    /* The mirror fetched outside the lock (mirror_job.c), when mirror_done. */
    bool mirror_done;
    int mirror_rc;
    char *mirror; /* owned */
    struct err mirror_err;
    /* The push of a COMPLETE, FAIL_RUNNER, TIMEOUT or PUSH_WIP runs off the lock
     * (push_job.c): PUSHED once its outcome is in the fields above (execution does not
     * push again); GIT_BOUND (borrowed, or NULL) bounds and cancels the job's git. */
    bool pushed;
    struct controller_git_bound *git_bound;
    /* owned: a start prepared by execution, launched after the apply, or NULL */
    struct controller_launch *launch;
    bool froze; /* a PAUSE froze the sandbox (controller_pause_freeze) */
};

/* Executes R's side effects (execute.c) with C->lock held; failures that end the task are
 * left in R->fail_reason/fail_msg. */
void controller_execute(struct controller *c, struct reconcile *r);
/* Whether R's action pushes to the remote (the working branch of a COMPLETE, the
 * checkpoint of a FAIL_RUNNER, TIMEOUT or PUSH_WIP). */
bool controller_pushes(const struct controller *c, const struct reconcile *r);
/* What R's pushing action does before its push, with C->lock held (its log line; a
 * TIMEOUT stops the sandbox: nothing may write the staging repository while it is pushed);
 * the task's time stops counting. */
void controller_push_begin(struct controller *c, struct reconcile *r, const char *log);
/* The push of R's action (off the lock in a push job: R is the job's, C's settings are
 * read only), logged to LOG; its outcome in R's fail_reason/fail_msg, wip_pushed and
 * last_failure. */
void controller_push_run(struct controller *c, struct reconcile *r, const char *log);

/* --- the pushes off the reconcile lock (push_job.c) --- */
/* A push to a slow or hanging remote must not hold every other task: the reconcile that
 * plans a pushing action (controller_pushes) starts it in a thread of its own and plans
 * NOTHING while it runs (the task stays as it is: Active, or Paused for a checkpoint);
 * the job queues the task for the tick thread when done, whose reconcile takes its
 * outcome and applies the action as a push under the lock would have. Returns true when
 * R waits for its push (R->action NOTHING); with a finished push of R's task, R takes
 * its action and outcome (R->pushed) and false is returned. C->lock held. */
bool controller_push_async(struct controller *c, struct reconcile *r);
/* A deleted task's push: its git (and its helpers) killed, the result dropped. */
void controller_push_forget(struct controller *c, const char *ns, const char *name);
/* Kills every push's git and waits for the jobs (shutdown: the task is restarted as any
 * other after a server restart). */
void controller_push_jobs_stop(struct controller *c);

/* Starts the sandbox that execution prepared in R->launch, after the apply made R's fresh
 * token current and the task Active (with C->lock held): a runner that meters at once is
 * charged, not refused. On failure R->fail_reason is set (SandboxError); returns the
 * provider's code. */
int controller_launch(struct controller *c, struct reconcile *r);
/* Frees a prepared start (its egress proxy and meter socket too, unless launched); a
 * prelaunch's gate is closed (its runner exits without starting). */
void controller_launch_free(struct controller_launch *l);

/* --- a start's paths, environment and sandbox spec; the prelaunch (launch.c) --- */
enum controller_start_mode {
    CONTROLLER_START_FRESH,
    CONTROLLER_START_RESTART,
    CONTROLLER_START_RESUME
};
/* The host paths of a task's sandbox (owned strings). */
struct controller_paths {
    char *workspace, *token_dir, *staging, *state, *mirror, *log;
    char *sock_dir; /* the meter socket's directory, or NULL */
};
#define CONTROLLER_PRELAUNCH_DIRS 5 /* workspace, state, staging, token dir, mirror */
/* A start that execution prepared and the reconcile launches once the apply made its
 * token current and the task Active (a runner started earlier could meter before the
 * server knew its token: 401). Owns what the sandbox spec points at. */
struct controller_launch {
    struct sandbox_spec s;
    struct controller_paths p;
    char *env[SANDBOX_ENV_MAX + 1];
    size_t n;
    enum controller_start_mode mode;
    int64_t iteration;
    /* A prelaunch: the write end of its runner's start gate (-1: none, the sandbox is
     * spawned by controller_launch), how many of ENV controller_build_env made, and the
     * identities of the directories its sandbox was given (inode, then device). */
    int gate;
    size_t n_base;
    unsigned long long ids[CONTROLLER_PRELAUNCH_DIRS][2];
    char *ns, *name; /* owned copies (the prelaunch outlives its reconcile) */
    struct controller_launch *next;
};
/* Whether DIR holds nothing (or cannot be read). */
bool controller_dir_empty(const char *dir);
/* A new start of MODE (no gate). */
struct controller_launch *controller_launch_new(enum controller_start_mode mode);
void controller_paths_of(struct controller_paths *p, struct controller *c, const char *ns,
                         const char *name);
void controller_paths_cleanup(struct controller_paths *p);
/* The runner's environment of SPEC §9 at ENV (NULL-terminated), with paths as the sandbox
 * sees them; returns how many entries. */
size_t controller_build_env(char **env, struct controller *c, const struct reconcile *r,
                            const struct controller_paths *p, int64_t start_iteration);
/* Opens L's egress proxy and (but for agent-sandbox, whose pods meter over HTTP) its
 * meter socket, adding their variables to L's environment. */
int controller_launch_sockets(struct controller *c, struct controller_launch *l,
                              const struct reconcile *r, struct err *err);
/* The sandbox spec of L for R (pointing into L). */
void controller_launch_spec(struct controller_launch *l, const struct controller *c,
                            const struct reconcile *r);
/* While R's mirror is fetched (a fresh PROVISION on the local provider, the mirror
 * already there, the workspace empty, no checkpoint, no sandbox): spawns the sandbox
 * gated and keeps it in C's prelaunches (C->lock held). Silent when it cannot: the start
 * then spawns as before. */
void controller_prelaunch(struct controller *c, const struct reconcile *r);
/* The prelaunch of NS/NAME taken out of C's list, or NULL; stopped and freed instead
 * when its sandbox no longer runs. */
struct controller_launch *controller_prelaunch_take(struct controller *c, const char *ns,
                                                    const char *name);
/* Whether the prelaunch PRE was given what the start L (prepared, not spawned) would give
 * its sandbox: the same environment and the same directories. */
bool controller_prelaunch_fits(const struct controller_launch *pre,
                               const struct controller_launch *l);
/* Stops PRE's sandbox and frees it (NULL: nothing). */
void controller_prelaunch_discard(struct controller *c, struct controller_launch *pre);
/* Stops and frees the prelaunch of NS/NAME, if any (C->lock held). */
void controller_prelaunch_drop(struct controller *c, const char *ns, const char *name);
/* Stops and frees every prelaunch (shutdown). */
void controller_prelaunch_drop_all(struct controller *c);
/* Removes PATH and everything below it, best effort (execute.c). */
void controller_remove_tree(const char *path);
/* "PATH=..." as a sandbox gets it: new string. */
char *controller_env_path(const struct controller *c);

/* --- warm slots (slot.c) ------------------------------------------------------------- */

#define CONTROLLER_SLOT_NS "_slot" /* a slot's sandbox name until claimed: no task's */
#define CONTROLLER_SLOT_IDLE_MS (10 * 60 * 1000)
#define CONTROLLER_SLOT_QUIET_MS 100  /* no slot is made this soon after a start */
#define CONTROLLER_SLOT_ENV_MAX 60000 /* the runner's RUNNER_GATE_ENV_MAX */

/* Removes what a previous server left under <data-dir>/slots and sets the bound MAX (0
 * without the local provider). */
void controller_slots_init(struct controller *c, int64_t max);
/* A fresh start of a task of URL's repository ran (C->lock held): a slot is wanted. */
void controller_slot_want(struct controller *c, const char *url);
/* The queue's pass (C->lock not held): ROOM slots are left by --max-running-tasks once the
 * tasks it admitted start, whose repositories are URLS[N]. Slots beyond ROOM are stopped,
 * a slot of one of URLS (which its task takes) counting as that task's; the tick makes
 * none beyond ROOM. No-op without a limit. */
void controller_slots_fit(struct controller *c, int64_t room, const char *const *urls, size_t n);
/* The tick thread: stops idle slots, then makes one wanted slot (C->lock not held). */
void controller_slots_tick(struct controller *c, int64_t now);
/* Stops every slot (shutdown, threads stopped). */
void controller_slots_drop_all(struct controller *c);
/* In place of the prelaunch's spawn (C->lock held): the slot of L's mirror made R's
 * sandbox, L's environment built and sent, L->gate its gate; false when there was none
 * (or it did not fit: it is stopped), and L is as it was given but for its environment. */
bool controller_slot_claim(struct controller *c, struct controller_launch *l,
                           const struct reconcile *r);
/* Tells L's runner that its workspace is made (it checks it out; "c"). */
void controller_gate_ready(struct controller_launch *l);
/* Opens L's gate: its runner goes on ("g"). E_FAIL when the runner is gone. */
int controller_gate_open(struct controller_launch *l, struct err *err);

/* The freeze of a PAUSE planned on Pending, Provisioning or Active, before the Pausing
 * transaction revokes the token (with C->lock held): a frozen runner makes no meter call,
 * so none is caught between the revocation and the freeze (a 401 it would have to wait
 * out), and the freeze is not behind that transaction's fsync. Sets R->froze once every
 * process is frozen (also when the request that suspended the task froze it already,
 * controller_suspend_change); a sandbox that cannot be frozen is stopped. */
void controller_pause_freeze(struct controller *c, struct reconcile *r);
/* Thaws what controller_pause_freeze froze when the Pausing transaction found that the
 * task moved on (resumed meanwhile, or paused by the meter): it runs as it did. */
void controller_pause_undo(struct controller *c, struct reconcile *r);

/* Thaws R's sandbox after the apply of a CONTROLLER_THAW made the fresh token current
 * and the task Active (with C->lock held). On failure the sandbox is stopped and
 * R->fail_reason set (SandboxError); returns the provider's code. */
int controller_thaw(struct controller *c, struct reconcile *r);

/* Before run RUN of a finished task: removes what the previous run left (workspace,
 * staging repo, state dir with the usage file, counted-time and draft PR records); the
 * token dir and the log stay (and a failed run's checkpoint: rerun() in execute.c keeps
 * it in a new staging repository). */
void controller_forget_run(struct controller *c, const char *ns, const char *name);

/* Whether the staging repository of task NS/NAME holds its checkpoint
 * refs/heads/diverge/wip/NAME (a loose ref, or a line of packed-refs). */
bool controller_has_checkpoint(const struct controller *c, const char *ns, const char *name);
#define CONTROLLER_PACKED_REFS_MAX (1024 * 1024) /* bytes of packed-refs read for it */

/* Removes a deleted task's workspace, staging repo, state dir, token dir and paused-time
 * record (its log stays). */
void controller_forget_task(struct controller *c, const char *ns, const char *name);

/* --- the sandbox user's access to the data dir (owner.c) --- */
/* Lets the sandbox user's group search the directories from the data dir down to PATH's
 * parent (bubblewrap resolves its bind sources by name), when files are given away. */
void controller_reach(struct controller *c, const char *path);
/* Lets the sandbox user connect to the socket PATH (group of the sandbox user, 0660, its
 * directories searchable by that group) when the server runs as root. */
void controller_expose_socket(struct controller *c, const char *path);
/* Gives PATH (recursively) to the sandbox user when the server runs as root. E_FAIL. */
int controller_give(struct controller *c, const char *path, struct err *err);
/* Gives the mirror MIRROR to the sandbox user (it reads it through a read-only bind) when
 * the server runs as root, but for its object files, which stay the server's and become
 * read-only for everyone (0444): those can be hard-linked into a workspace the sandbox
 * writes. Entries already right cost no syscall. With LINK_TO (a new repository's git dir,
 * holding objects/pack), every object file is also hard-linked to the same path under it.
 * Call with the mirror's lock held (controller_mirror_lock): no git changes it meanwhile.
 * E_FAIL; E_INVALID with LINK_TO when the server does not run as root (then the sandbox
 * user and the server are one: a linked file would be the sandbox's to change). */
int controller_give_mirror(struct controller *c, const char *mirror, const char *link_to,
                           struct err *err);
/* Creates <data-dir>/KIND/<16 random hex> (0700, a task's socket directory: KIND "meter"
 * or "egress") into *OUT (new string). E_FAIL. */
int controller_socket_dir(char **out, const struct controller *c, const char *kind,
                          struct err *err);

/* One task the queue knows: when it began to wait, and whether it was given a slot. */
struct controller_queued {
    char *ns, *name; /* owned */
    int64_t arrival; /* ms */
    int64_t round;   /* its round in the queue, fixed when first ordered; -1: not yet */
    bool admitted;   /* given a slot; its reconcile starts it */
    bool seen;       /* still waiting in this pass */
    int64_t shown;   /* the queue status its listed object showed this pass (queue.c) */
    uint64_t hash;   /* of ns and name (queue_state.c) */
    struct controller_queued *next;  /* every record */
    struct controller_queued *hnext; /* its bucket's */
};

/* --- the queue (queue.c) --- */
/* The record of NS/NAME, or NULL; the caller holds queue_lock (queue_state.c). O(1): the
 * pass looks up every waiting task, and thousands may wait. */
struct controller_queued *controller_queued_find(struct controller *c, const char *ns,
                                                 const char *name);
/* A new record of NS/NAME (not admitted, not seen, round -1, arrival 0), which must not
 * have one; the caller holds queue_lock. */
struct controller_queued *controller_queued_add(struct controller *c, const char *ns,
                                                const char *name);
/* Forgets the records not seen since the last call and clears the others' seen marks;
 * the caller holds queue_lock. */
void controller_queued_prune(struct controller *c);
/* Looks at every task not finished: admits waiting ones into free slots (and reconciles
 * them), writes the queue positions of the others that are due. A no-op without a limit
 * or sandbox provider. Returns the ns it spent, but for the reconciles of the admitted. */
int64_t controller_queue_pass(struct controller *c);
/* Whether a waiting task whose object shows the queue position SHOWN (0: none, -1: a
 * queue status that is not a plain position) must be written to show POSITION (0:
 * admitted). A place among the first 10 is always exact, as is a task's first place in
 * the queue and its leaving it; a place further back is written again once it moved by a
 * tenth: a slot that comes free moves every waiting task up one, and with thousands
 * waiting, writing them all each time (and editing their sticky comments) would cost more
 * than the tasks' own work. A task far back so writes about 10 ln(its first place) new
 * places on its way to the front, not one per slot. */
bool controller_queue_position_due(int64_t shown, int64_t position);
/* Whether NS/NAME may take a slot now (no limit, or admitted). */
bool controller_queue_admitted(struct controller *c, const char *ns, const char *name);
/* Frees the queue's records. */
void controller_queue_free(struct controller *c);
/* Whether some task waits for a slot under a limit (the tick's timed pass: nothing to do
 * when none does). */
bool controller_queue_waiting(struct controller *c);
/* Whether the change feed may leave NS/NAME to the queue: its event shows it Pending and not
 * suspended, the queue holds it waiting (not admitted), or does not know it yet while others
 * wait (it joins them), it may run and no disk mark stops it. Its reconcile would then
 * decide nothing (controller_decide: queued) and drop what a start prepared, which a task
 * that waits never had: the feed skips both, and the pass admits and starts it later. */
bool controller_queue_holds(struct controller *c, const struct task_event *ev);
/* How often the tick thread runs a queue pass while a task waits (a slot or a cap that
 * changed without a task event, e.g. a SpendQuota written on another replica). */
#define CONTROLLER_QUEUE_PERIOD_MS 3000
/* After a queue pass of D ms the next one waits until this many times D ms have passed:
 * the passes take at most about a fifth of one core however long the queue. */
#define CONTROLLER_QUEUE_SPACING 4
/* The runner's note FILE ("failure", "no-progress") next to the task's usage file, made
 * safe (valid UTF-8, no control characters but newline and tab, at most
 * CONTROLLER_FAILURE_MAX - 1 bytes), or NULL when there is none. New string. */
#define CONTROLLER_FAILURE_MAX 4096
char *controller_read_failure(struct controller *c, const char *ns, const char *name,
                              const char *file);

/* Whether A ends the task (Completed or Failed). */
bool controller_finishes(enum controller_action a);

/* Writes TOKEN to the task's token file atomically, mode 0600 (owned by the sandbox
 * user when the server runs as root). */
int controller_write_token_file(struct controller *c, const char *ns, const char *name,
                                const char *token, struct err *err);

/* Mints the next-generation token for DOC from its spec and the server defaults. */
int controller_mint_for(char **token_out, char **id_out, struct controller *c, const json_t *doc,
                        int64_t generation, int64_t now_ms, struct err *err);

#define CONTROLLER_WAITING_PREFIX "sandbox provider"

/* --- per-task meter sockets (meter_socket.c) --- */
/* Removes the meter socket directories a previous server left (its sandboxes died). */
void controller_meter_sweep(const struct controller *c);
/* For a sandbox start on this host: opens the task's own meter socket into *OUT and
 * appends DIVERGE_METER_SOCKET to ENV (*N entries, a new string, NULL-terminated) as the
 * provider shows it. *OUT stays NULL without per-task sockets (cfg.meter_sockets) or when
 * the data dir path is too long for a socket (said in the task log at LOG_PATH). */
int controller_meter_open(struct sandbox_meter **out, struct controller *c, const char *log_path,
                          char **env, size_t *n, struct err *err);

/* --- egress (network.c) --- */
/* Reads the network flags of CFG into C (E_INVALID with the reason for bad ones) and
 * removes proxy sockets a previous server left. */
int controller_egress_init(struct controller *c, const struct controller_config *cfg,
                           struct err *err);
/* Frees what controller_egress_init made. */
void controller_egress_cleanup(struct controller *c);
/* For a sandbox start of R: the task's network (spec.sandbox.network, else the server's);
 * in `proxy` mode opens the task's egress proxy (allowlist: the server's rules plus
 * spec.sandbox.allowedHosts) into *OUT and appends the proxy variables to ENV (*N
 * entries, new strings, NULL-terminated; at most CONTROLLER_EGRESS_ENV_MAX more), with
 * paths as the provider shows them. *OUT stays NULL in `none` mode. */
/* Whether R's sandbox gets network none without asking for the proxy. */
bool controller_egress_none(const struct controller *c, const struct reconcile *r);
int controller_egress_open(struct sandbox_egress **out, struct controller *c,
                           const struct reconcile *r, const char *log_path, char **env, size_t *n,
                           struct err *err);
#define CONTROLLER_EGRESS_ENV_MAX 11

/* --- the mirror fetched off the reconcile lock (mirror_job.c) --- */
/* While the mirror of R (a PROVISION) is fetched: the staging repository prepare() would
 * make, made now (it does not depend on the fetch; prepare() finds it made). */
void controller_prepare_early(struct controller *c, const struct reconcile *r);
/* Whether R's start fetches the mirror in a thread of its own (a provider that starts
 * sandboxes, a repository, the tick thread running to pick the task up again). */
bool controller_mirror_async(const struct controller *c, const struct reconcile *r);
/* E_OK with R's mirror_* set from the task's finished fetch; E_AGAIN while one runs
 * (started here when none does: it queues the task for the tick thread once done). */
int controller_mirror_ready(struct controller *c, struct reconcile *r, struct err *err);
/* A deleted task's running fetch: nobody takes its result. */
void controller_mirror_forget(struct controller *c, const char *ns, const char *name);
/* The fetch of a task that was just made (the store's ADDED event: Pending, not suspended,
 * with a repository), started before its first plan and the queue pass that admits it;
 * the plan's start adopts it. A plan that does not start the task, or a queue pass that
 * makes it wait, drops it (controller_mirror_unwanted): a later start fetches again. */
void controller_mirror_prefetch(struct controller *c, const char *ns, const char *name,
                                const char *url, const char *base, const char *working);
/* A prefetch of NS/NAME is not taken by any start (one still running is waited for). */
void controller_mirror_unwanted(struct controller *c, const char *ns, const char *name);
/* After a start that took its mirror from a fetch: the mirror's upkeep
 * (controller_mirror_upkeep) in a thread of its own when it wants one, off the start. */
void controller_mirror_upkeep_async(struct controller *c, const struct reconcile *r);
/* Waits for every fetch and frees them (threads stopped). */
void controller_mirror_jobs_stop(struct controller *c);

/* --- disk limits (disk_watch.c) --- */
/* The watchdog: every CONTROLLER_DISK_PERIOD_MS it measures the files of each task whose
 * sandbox runs (workspace, staging, state dir) and stops a task over --sandbox-disk, and
 * while the data dir's filesystem has less than the reserve free (looked at every
 * CONTROLLER_DISK_FREE_MS), the biggest running task; the task then fails with reason
 * DiskLimit. Started with the tick thread for the providers whose sandboxes write under
 * the data dir (local, process). The state is made with the controller
 * (controller_disk_init) and lives as long. */
#define CONTROLLER_DISK_PERIOD_MS 1000
#define CONTROLLER_DISK_FREE_MS 100   /* how often the free space is looked at (reserve set) */
#define CONTROLLER_DISK_DEPTH_MAX 128 /* directory levels measured; deeper: over */
#define CONTROLLER_DISK_ENTRIES_MAX 1000000 /* files and directories of a task; more: over */
void controller_disk_init(struct controller *c);
/* Starts the watchdog thread when a limit applies (controller_start). E_FAIL. */
int controller_disk_start(struct controller *c, struct err *err);
/* Stops the thread (it stops sandboxes: before the provider goes); a no-op when none runs. */
void controller_disk_stop(struct controller *c);
/* Stops the thread and frees what controller_disk_init made (loop.c, with the controller). */
void controller_disk_cleanup(struct controller *c);
/* Whether the watchdog stopped NS/NAME; *msg_out (may be NULL) a new string saying why. */
bool controller_disk_over(struct controller *c, const char *ns, const char *name, char **msg_out);
/* Forgets that the watchdog stopped NS/NAME (it failed, or was deleted). */
void controller_disk_clear(struct controller *c, const char *ns, const char *name);
/* Before a start of R: when the data dir's filesystem has less than the reserve free,
 * turns R into CONTROLLER_DISK_LIMIT (reason and message set) and returns true. */
bool controller_disk_refuse_start(struct controller *c, struct reconcile *r);
/* The bytes PATH's tree occupies on disk (st_blocks), without following symlinks or
 * leaving PATH's filesystem; *bytes_out 0 when PATH is absent. Stops early once past
 * STOP_AT (0: never). E_TOOBIG when the tree is deeper than CONTROLLER_DISK_DEPTH_MAX or
 * has more than *ENTRIES (decremented per entry) entries; E_FAIL when it cannot be read.
 * SKIP_LINKS (the server runs as root, the sandbox as another user): regular files of the
 * server's user with more than one link are not counted: the mirror's object files linked
 * into a workspace (controller_give_mirror), which the task did not write and the sandbox
 * user cannot make. */
int controller_disk_usage(int64_t *bytes_out, const char *path, int64_t stop_at, int64_t *entries,
                          bool skip_links, struct err *err);
/* The bytes available on the filesystem of PATH (statvfs f_bavail), or -1. */
int64_t controller_disk_free(const char *path);
/* The size of what a push of refs/heads/WORKING from STAGING would send (git rev-list
 * --disk-usage of the objects not reachable from the refs of MIRROR, the remote's copy;
 * NULL or absent: every object counts). E_FAIL when git cannot tell, or when B (NULL:
 * CONTROLLER_PUSH_LIMIT_MS, no cancel) stopped it: the staging repository is the
 * sandbox's work, and its git must not hold a push job past a delete or the server's stop. */
int controller_push_size(int64_t *bytes_out, const char *staging, const char *mirror,
                         const char *working, struct controller_git_bound *b, struct err *err);

/* git plumbing (workspace.c). ARGV starts with "git"; output goes to LOG_PATH. No SCM
 * credentials: only controller_mirror and controller_push give git any. */
int controller_git(const char *log_path, const char *const argv[], struct err *err);
/* Runs git with ARGV without credentials, EXTRA_ENV ("NAME=value", or NULL) added to its
 * environment, in a process group of its own bounded by B as a push is (NULL:
 * CONTROLLER_PUSH_LIMIT_MS, no cancel); the first CAP - 1 bytes of its stdout into OUT as a
 * string, its stderr dropped. E_FAIL unless git exited 0. */
int controller_git_read(char *out, size_t cap, const char *const argv[], const char *extra_env,
                        struct controller_git_bound *b, struct err *err);
/* *out: the mirror of URL (new string) under C's data dir; cloned once, fetched afterwards,
 * with the server's credentials for URL's host. *HOW_OUT: what was done, for the task's log
 * ("cloned", "fetched (reused)", or reused without a fetch: a static string). */
int controller_mirror(char **out, struct controller *c, const char *url, const char *log_path,
                      const char **how_out, struct err *err);
/* controller_mirror fetching only the branches BRANCHES (NULL-terminated, each one
 * controller_plain_branch takes; what a start needs) into an existing mirror; every
 * branch when NULL. A clone takes every branch. Bounded as a push is (B, or the push's
 * limits when NULL): a remote that hangs ends the fetch, and B's cancel kills it. */
int controller_mirror_branches(char **out, struct controller *c, const char *url,
                               const char *const *branches, const char *log_path,
                               const char **how_out, struct controller_git_bound *b,
                               struct err *err);
/* Whether NAME is a branch name that needs no quoting in a config subsection, a path or a
 * refspec and that git reads the same way: [A-Za-z0-9._/+-], no "..", "//", "/.", no
 * leading '-', '.' or '/', no trailing '/', '.' or ".lock". */
bool controller_plain_branch(const char *name);
/* Takes the lock that serializes every git and every walk on the mirror of URL (flock on
 * <data-dir>/run/mirror.<hash>.lock): its descriptor, closed to release it; -1 on error. */
int controller_mirror_lock(const char *data_dir, const char *url, struct err *err);
/* Whether the mirror DIR has as many packs or loose objects as make git's gc --auto act
 * (its default limits); a count of directory entries, no git. */
bool controller_mirror_wants_upkeep(const char *dir);
/* Under the mirror's lock, `git maintenance run --auto` on the mirror of URL when
 * controller_mirror_wants_upkeep says so (its gc not detached). E_FAIL. */
int controller_mirror_upkeep(struct controller *c, const char *url, struct err *err);
/* A workspace's git directory made outside the sandbox (workspace_clone.c). */
#define CONTROLLER_PREPARED_MARK "diverge-prepared" /* in .git: made by the server, new */
struct controller_clone {
    const char *url;     /* the repository (names the mirror's lock) */
    const char *mirror;  /* its mirror, fetched */
    const char *gitdir;  /* <workspace>/.git, absent */
    const char *base;    /* the base branch */
    const char *working; /* the working branch */
};
/* Makes Q->gitdir what the runner's clone of the base branch and checkout of the working
 * branch would leave in it but the checked-out files (the runner checks out when it finds
 * CONTROLLER_PREPARED_MARK): the mirror's object files hard-linked (read-only, the
 * server's), the two branches' refs, origin at the mirror's path in the sandbox, the
 * shallow list of a depth-50 clone. E_INVALID (a branch name it leaves to git),
 * E_NOTFOUND (no base branch in the mirror), E_FAIL: the caller empties the workspace and
 * the runner clones as before. The server must run as root (controller_give_mirror). */
int controller_workspace_clone(struct controller *c, const struct controller_clone *q,
                               struct err *err);
/* Where the mirror of URL is under DATA_DIR: new string. */
char *controller_mirror_path(const char *data_dir, const char *url);
/* Writes TEXT into the new file DIR/NAME (mode 0644; never an existing one or through a
 * symlink). */
bool controller_put_new(const char *dir, const char *name, const char *text);
/* Creates the staging bare repository PATH unless it exists. */
int controller_staging(const char *path, const char *log_path, struct err *err);
/* Whether the repository GIT_DIR (server-owned or sanitized) holds REF. */
bool controller_repo_has(const char *git_dir, const char *ref);
/* Copies refs/heads/BRANCH of the repository SRC (the mirror, or a sanitized staging
 * repository) with the objects it needs into the repository DST (forced, without hooks):
 * how a run's checkpoint reaches the staging repository of the next one (SPEC §14). */
int controller_checkpoint_copy(const char *dst, const char *src, const char *branch,
                               const char *log_path, struct err *err);
/* Makes the staging repo STAGING (written by a sandbox that no longer runs) safe for the
 * server's git: symlinks and special files removed, owned by the server's user again,
 * hooks, alternates and grafts gone, config replaced by a fixed one. */
int controller_staging_sanitize(const char *staging, struct err *err);
/* A bound on a git run: its wall-clock limit, and a cancel from another thread that kills
 * its process group (git and its helpers: git-remote-http, ssh). */
struct controller_git_bound {
    pthread_mutex_t lock;
    pid_t pgid;      /* the running git's group (lock), 0: none */
    const char *why; /* static: why it was cancelled (lock), NULL: it was not */
    int64_t limit_ms;
};
void controller_git_bound_init(struct controller_git_bound *b, int64_t limit_ms);
void controller_git_bound_cleanup(struct controller_git_bound *b);
/* Kills B's running git (and any it starts later), saying WHY (static) in its error. */
void controller_git_cancel(struct controller_git_bound *b, const char *why);
/* Why B was cancelled, or NULL. */
const char *controller_git_cancelled(struct controller_git_bound *b);
/* A push's bounds: the remote sending less than CONTROLLER_PUSH_SILENT_BPS bytes a second
 * for CONTROLLER_PUSH_SILENT_S seconds (http and https: git's http.lowSpeedLimit and
 * http.lowSpeedTime), and its git running CONTROLLER_PUSH_LIMIT_MS in all (every scheme),
 * end it as failed. Minutes: a big branch to a busy remote is slow. */
#define CONTROLLER_PUSH_SILENT_BPS "1"
#define CONTROLLER_PUSH_SILENT_S "300"
#define CONTROLLER_PUSH_LIMIT_MS (60LL * 60 * 1000)
/* Pushes refs/heads/WORKING from STAGING to URL, never forced, without hooks, after
 * controller_staging_sanitize(), with the server's credentials for URL's host (a GitHub
 * App token asked again now, so a long task pushes with an unexpired one); bounded by B
 * (NULL: CONTROLLER_PUSH_LIMIT_MS, no cancel). */
int controller_push(struct controller *c, const char *staging, const char *url, const char *working,
                    const char *log_path, struct controller_git_bound *b, struct err *err);

/* --- counted time behind sandbox.timeoutSeconds (active.c) --- */
/* The record of one task: USED_MS of closed intervals, and the open one (SINCE_MS, 0: none)
 * that server run RUN opened and last saw running at SEEN_MS. */
struct controller_active {
    int64_t used_ms, since_ms, seen_ms;
    uint64_t run;
};
/* How often the tick thread records that running sandboxes still run. */
#define CONTROLLER_CHECKPOINT_MS 1000
/* The counted ms of A at NOW_MS for server run RUN: an open interval of another (dead)
 * run ends at its last checkpoint. */
int64_t controller_active_total(const struct controller_active *a, uint64_t run, int64_t now_ms);
/* Opens an interval at NOW_MS (closing one a dead run left); no-op when RUN counts already. */
void controller_active_begin(struct controller_active *a, uint64_t run, int64_t now_ms);
/* Closes the open interval (at NOW_MS for RUN's own, else at its last checkpoint). */
void controller_active_end(struct controller_active *a, uint64_t run, int64_t now_ms);
/* Checkpoint: RUN's open interval was still running at NOW_MS. */
void controller_active_seen(struct controller_active *a, uint64_t run, int64_t now_ms);
/* The file text "used since seen run(hex)\n" and back; false (all zero) when malformed. */
bool controller_active_parse(struct controller_active *a, const char *text);
int controller_active_format(char *buf, size_t cap, const struct controller_active *a);
/* The task's counted ms at NOW_MS, from its record under <data-dir>/run. */
int64_t controller_active_ms(struct controller *c, const char *ns, const char *name,
                             int64_t now_ms);
/* Records that the task's sandbox started or was thawed (RUNNING) or stopped counting
 * (frozen, paused, exited, finished) at NOW_MS. */
void controller_note_running(struct controller *c, const char *ns, const char *name, bool running,
                             int64_t now_ms);
/* Checkpoint of a running task (the tick thread). */
void controller_note_seen(struct controller *c, const char *ns, const char *name, int64_t now_ms);

/* --- what wakes the tick thread (notes.c) --- */
/* Arms (DEADLINE_MS > 0) or disarms (0) the task's timeout timer. */
void controller_timer_set(struct controller *c, const char *ns, const char *name,
                          int64_t deadline_ms);
/* Sets when the armed timer of the task warns (WARN_MS, 0: never): from then on the
 * meter tells the agent the minutes left (status.timeoutAt). */
void controller_timer_warn(struct controller *c, const char *ns, const char *name, int64_t warn_ms);
/* The tick thread's work on the timers at NOW_MS, outside notes_lock: status.timeoutAt
 * of the tasks past their warning (runs.c). */
void controller_runs_tick(struct controller *c, int64_t now_ms);
/* The sandbox provider's exit callback (USERDATA the controller), also called by the
 * mirror fetch and the disk watchdog: queues NS/NAME for the tick thread. */
void controller_on_exit(const char *ns, const char *name, void *userdata);

/* --- the tick thread and the provider (run.c) --- */
/* Starts/stops the tick thread that reconciles exited and timed-out tasks. */
int controller_tick_start(struct controller *c, struct err *err);
void controller_tick_stop(struct controller *c);
/* Creates C's sandbox provider from CFG (and runs its probe). */
int controller_sandboxes_open(struct controller *c, const struct controller_config *cfg,
                              struct err *err);

/* reconcile_preview.c: the task's linked preview Environment for R's outcome, in TX with
 * DOC (the task, whose output annotations and status.previewUrl it sets while it runs). */
int controller_apply_preview(struct reconcile *r, struct task_txn *tx, json_t *doc,
                             struct err *err);
/* Whether R (planned NOTHING) has a sandbox address its Environment does not carry yet
 * (checked on the read side); then controller_preview_refresh_txn (userdata R) writes it. */
bool controller_preview_address_changed(struct reconcile *r);
int controller_preview_refresh_txn(struct task_txn *tx, void *userdata);

/* The status message of a runner that exited with EXIT_CODE on a task whose repository is
 * URL (NULL: none). Exit 2 without a repository is the runner finding no DIVERGE_REPO_URL:
 * the message says what to do instead. Allocated. */
char *controller_runner_failed_msg(const char *url, int exit_code);

#endif
