/* SPDX-License-Identifier: Apache-2.0 */
/* The sandbox module's one header: the sandbox_provider interface (ARCHITECTURE.md):
 * start, suspend, resume, status and stop of one sandbox per task, keyed by
 * "<ns>/<task>", and the per-task log the providers and the controller write. Backends:
 * process (no isolation, development only), local (bubblewrap + cgroups) and
 * agent-sandbox. Providers capture the runner's stdout/stderr into the task log line by
 * line and reap their children; nothing they start outlives stop(). They report runner
 * exits through the callback given at creation. Every operation is thread-safe. */
#ifndef DIVERGE_SANDBOX_SANDBOX_H
#define DIVERGE_SANDBOX_SANDBOX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define SANDBOX_ENV_MAX 48 /* environment entries given to a sandbox */

/* Where the local provider shows things inside the sandbox. */
#define SANDBOX_IN_WORKSPACE "/workspace"
#define SANDBOX_IN_TOKEN_DIR "/etc/diverge/token"
#define SANDBOX_IN_MIRROR "/diverge/mirror.git"
#define SANDBOX_IN_STAGING "/diverge/staging.git"
#define SANDBOX_IN_STATE "/diverge/state"
#define SANDBOX_IN_SOCK_DIR "/diverge/sock" /* the task's meter socket dir */
#define SANDBOX_METER_SOCKET "meter.sock"   /* the socket's name in that dir */
#define SANDBOX_IN_RUNNER "/diverge/bin/diverge-agent-runner"
#define SANDBOX_IN_EGRESS_DIR "/diverge/egress" /* the task's egress proxy socket dir */
#define SANDBOX_EGRESS_SOCKET "proxy.sock"      /* the socket's name in that dir */

/* --- the task log (tasklog.c) --- */

#define SANDBOX_LOG_CAP (10u << 20) /* default cap of a task log (SPEC §9) */

/* Path of the task log <data-dir>/logs/<ns>/<task>.log: new string, caller frees. */
char *sandbox_log_path(const char *data_dir, const char *ns, const char *name);
/* Appends TEXT[0..len) to the task log at PATH as one line with the RFC 3339 time in
 * front (control characters replaced). When the file would pass CAP bytes (0:
 * SANDBOX_LOG_CAP) its oldest part is dropped first and a line says so. Thread-safe. */
void sandbox_log_write(const char *path, size_t cap, const char *text, size_t len);

/* What starts every line of sandbox output in a task log, after the time. */
#define SANDBOX_LOG_MARK "[sandbox] "

/* sandbox_log_write for a line the sandbox printed: "<time> [sandbox] TEXT". Only
 * sandbox output is written with this mark, and all of it is, so a sandbox cannot print a
 * line that reads as one of the server's. Thread-safe. */
void sandbox_log_output(const char *path, size_t cap, const char *text, size_t len);
/* sandbox_log_write of one event line formatted from FMT (cut at 1023 bytes). */
void sandbox_log_event(const char *path, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* mkdir -p of PATH's parent directories (and PATH itself when LAST), mode 0700. */
int sandbox_mkdirs(const char *path, bool last);

/* The egress proxy of a task in network `proxy` mode (SPEC §9 "Network"): the server's
 * CONNECT proxy on a unix socket in a directory of its own under the data dir. A started
 * sandbox owns it: the provider stops it (socket and directory removed, threads joined)
 * when the runner exits, when the sandbox is stopped, and when start() fails. */
struct egress_proxy;

struct sandbox_egress {
    struct egress_proxy *proxy; /* owned */
    char *dir;                  /* owned: the socket's directory (read-only inside) */
    char *log_path;             /* owned: the task log, where egress lines go */
    size_t log_cap;
};

/* Stops E's proxy, removes its socket and directory and frees E. NULL is a no-op. */
void sandbox_egress_free(struct sandbox_egress *e);

/* The task's own meter socket (local and process sandboxes): the server serves only the
 * meter route on it, with a small connection cap, so that what one sandbox does to it
 * touches no other task. A unix socket in a directory of its own under the data dir,
 * read-only at SANDBOX_IN_SOCK_DIR inside. Owned like the egress proxy: the provider
 * frees it when the runner exits, when the sandbox is stopped, and when start() fails. */
struct sandbox_meter {
    void *server;                /* the server's handle, closed with CLOSE */
    void (*close)(void *server); /* stops serving (connections closed, threads joined) */
    char *dir;                   /* owned: the socket's directory */
};

/* Stops serving M, removes its socket and directory and frees M. NULL is a no-op. */
void sandbox_meter_free(struct sandbox_meter *m);

/* Removes the socket SOCKNAME of the per-task directory DIR, then DIR itself (best effort). */
void sandbox_socket_dir_remove(const char *dir, const char *sockname);
/* Removes every per-task socket directory below ROOT (each with its socket SOCKNAME) that
 * a previous server left behind: its sandboxes died with it. */
void sandbox_socket_sweep(const char *root, const char *sockname);

/* What to start. Every string is borrowed for the call. Paths are host paths. */
struct sandbox_spec {
    const char *ns, *name;   /* the task */
    const char *runner_path; /* the diverge-agent-runner binary */
    const char *workspace;   /* <data-dir>/workspaces/<ns>/<task>, writable */
    const char *token_dir;   /* the token file's directory, read-only inside */
    const char *mirror;      /* the repository mirror (read-only inside), or NULL */
    const char *staging;     /* the staging bare repo (writable inside), or NULL */
    const char *usage_dir;   /* per-task state dir outside the git tree, writable */
    const char *sock_dir;    /* the task's meter socket directory (read-only), or NULL */
    const char *log_path;    /* the task log */
    size_t log_cap;          /* its cap in bytes, 0: SANDBOX_LOG_CAP */
    /* network proxy: the task's egress proxy, taken over by start(); else NULL */
    struct sandbox_egress *egress;
    /* the task's meter socket (its dir is SOCK_DIR), taken over by start(); or NULL */
    struct sandbox_meter *meter;
    const char *env[SANDBOX_ENV_MAX + 1]; /* "KEY=VALUE" as seen inside, NULL-terminated */
    /* Remote providers (agent-sandbox): the task's current token, which they publish where
     * their sandbox reads it, and spec.sandbox.timeoutSeconds (0: none). */
    const char *token;
    int64_t timeout_s;
    /* Local provider: a descriptor (> 2) the sandbox inherits as it is, the read end of
     * the runner's start gate (DIVERGE_START_GATE_FD); 0 or less: none. */
    int gate_fd;
};

enum sandbox_state {
    SANDBOX_ABSENT, /* nothing runs for this task (never started, or stopped) */
    SANDBOX_RUNNING,
    SANDBOX_PAUSED, /* every process frozen */
    SANDBOX_EXITED, /* the runner exited; nothing is left running */
};

struct sandbox_status {
    enum sandbox_state state;
    int exit_code; /* SANDBOX_EXITED: the runner's exit status (128+N for signal N) */
};

/* Called from a provider thread when a sandbox's runner exited, or (agent-sandbox) when
 * what the owner sees of it changed (its address): the owner should look at the task again
 * (NS, NAME borrowed). Handed to the provider at creation (the *_opts below): this is how
 * a provider reports to the controller, which it does not know. */
typedef void (*sandbox_exit_fn)(const char *ns, const char *name, void *userdata);

struct sandbox_provider;

struct sandbox_provider_ops {
    const char *name;
    /* Starts S. E_CONFLICT when the task already has a live sandbox; E_FAIL (with the
     * reason) when it cannot be started. */
    int (*start)(struct sandbox_provider *p, const struct sandbox_spec *s, struct err *err);
    /* Freezes every process of the sandbox (memory kept). E_NOTFOUND when none runs. */
    int (*suspend)(struct sandbox_provider *p, const char *ns, const char *name, struct err *err);
    /* Thaws a frozen sandbox. E_NOTFOUND when none is frozen. */
    int (*resume)(struct sandbox_provider *p, const char *ns, const char *name, struct err *err);
    /* The observed state (reaped children are reported once as EXITED, then stay so
     * until stop or the next start). */
    void (*status)(struct sandbox_status *out, struct sandbox_provider *p, const char *ns,
                   const char *name);
    /* Kills every process of the sandbox, waits for them and forgets it (a no-op when
     * there is none). */
    void (*stop)(struct sandbox_provider *p, const char *ns, const char *name);
    /* Optional: why this provider cannot run sandboxes on this host (a new string with
     * the fix), or NULL when it can. */
    char *(*probe)(struct sandbox_provider *p);
    /* Optional: the host user that must own what the sandbox writes; false when files
     * stay the server's. */
    bool (*owner)(struct sandbox_provider *p, unsigned int *uid_out, unsigned int *gid_out);
    /* Optional: a start of NS/NAME is coming soon; get ready for it (best effort, never
     * blocks). A stop of NS/NAME undoes what it prepared. NS and NAME NULL: a start of a
     * task not made yet. */
    void (*warm)(struct sandbox_provider *p, const char *ns, const char *name);
    /* Stops every sandbox and frees P. */
    void (*free)(struct sandbox_provider *p);
    /* Optional (local): the running sandbox FROM_NS/FROM_NAME, started gated and given no
     * task yet (a warm slot), becomes NS/NAME's: every later operation on NS/NAME is on
     * it, its output goes to LOG_PATH (cap LOG_CAP) and its record is NS/NAME's.
     * E_NOTFOUND when it does not run any more, E_CONFLICT when NS/NAME has a sandbox,
     * E_AGAIN (nothing changed) while its program (the runner) does not run yet. */
    int (*claim)(struct sandbox_provider *p, const char *from_ns, const char *from_name,
                 const char *ns, const char *name, const char *log_path, size_t log_cap,
                 struct err *err);
    /* Optional: the address the sandbox is reached at (a new string), NULL while unknown.
     * Without it a running sandbox is on the server's own host (CONTROLLER_SANDBOX_IP). */
    char *(*address)(struct sandbox_provider *p, const char *ns, const char *name);
};

/* Every backend embeds this as its first member. */
struct sandbox_provider {
    const struct sandbox_provider_ops *ops;
    sandbox_exit_fn on_exit; /* from the options at creation; may be NULL */
    void *on_exit_userdata;
};

static inline int sandbox_start(struct sandbox_provider *p, const struct sandbox_spec *s,
                                struct err *err)
{
    return p->ops->start(p, s, err);
}

static inline int sandbox_suspend(struct sandbox_provider *p, const char *ns, const char *name,
                                  struct err *err)
{
    return p->ops->suspend(p, ns, name, err);
}

static inline int sandbox_resume(struct sandbox_provider *p, const char *ns, const char *name,
                                 struct err *err)
{
    return p->ops->resume(p, ns, name, err);
}

static inline void sandbox_status(struct sandbox_status *out, struct sandbox_provider *p,
                                  const char *ns, const char *name)
{
    p->ops->status(out, p, ns, name);
}

static inline void sandbox_stop(struct sandbox_provider *p, const char *ns, const char *name)
{
    p->ops->stop(p, ns, name);
}

/* A start of NS/NAME is coming soon (the task was made; both NULL: a task may be made): a
 * provider may get ready for it (optional); sandbox_stop undoes it. */
static inline void sandbox_warm(struct sandbox_provider *p, const char *ns, const char *name)
{
    if (p != NULL && p->ops->warm != NULL) {
        p->ops->warm(p, ns, name);
    }
}

/* ops->claim; E_FAIL when P has no claim, E_AGAIN (nothing changed) while the sandbox's
 * program does not run yet. */
static inline int sandbox_claim(struct sandbox_provider *p, const char *from_ns,
                                const char *from_name, const char *ns, const char *name,
                                const char *log_path, size_t log_cap, struct err *err)
{
    if (p == NULL || p->ops->claim == NULL) {
        return err_set(err, E_FAIL, "this sandbox provider has no warm slots");
    }
    return p->ops->claim(p, from_ns, from_name, ns, name, log_path, log_cap, err);
}

/* Whether P gets ready for a start it is told of (sandbox_warm does anything). */
static inline bool sandbox_warms(const struct sandbox_provider *p)
{
    return p != NULL && p->ops->warm != NULL;
}

static inline char *sandbox_probe(struct sandbox_provider *p)
{
    return p->ops->probe != NULL ? p->ops->probe(p) : NULL;
}

static inline bool sandbox_owner(struct sandbox_provider *p, unsigned int *uid_out,
                                 unsigned int *gid_out)
{
    return p->ops->owner != NULL && p->ops->owner(p, uid_out, gid_out);
}

/* The sandbox's address: the provider's (new string, or NULL while unknown), else a copy
 * of LOCAL_IP (NULL: none). */
static inline char *sandbox_address(struct sandbox_provider *p, const char *ns, const char *name,
                                    const char *local_ip)
{
    if (p->ops->address != NULL) {
        return p->ops->address(p, ns, name);
    }
    return local_ip != NULL ? xstrdup(local_ip) : NULL;
}

static inline void sandbox_provider_free(struct sandbox_provider *p)
{
    if (p != NULL) {
        p->ops->free(p);
    }
}

/* Options of the local (bubblewrap) provider. */
struct sandbox_local_opts {
    const char *user;        /* host user the sandbox runs as; NULL: see SPEC §2 */
    const char *tools;       /* host folder bound read-only at the same path, or NULL */
    int64_t memory_bytes;    /* 0: no limit */
    int64_t pids;            /* 0: no limit */
    int64_t cpus_milli;      /* 1000 = one CPU; 0: no limit */
    const char *state_dir;   /* <data-dir>/run: records of live sandboxes (restart cleanup) */
    sandbox_exit_fn on_exit; /* runner exits (may be NULL) */
    void *on_exit_userdata;
};

/* Options of the process provider. */
struct sandbox_process_opts {
    const char *state_dir;   /* as in sandbox_local_opts */
    sandbox_exit_fn on_exit; /* runner exits (may be NULL) */
    void *on_exit_userdata;
};

/* The process provider: the runner as a plain child in its own process group. No
 * isolation. */
int sandbox_process_new(struct sandbox_provider **out, const struct sandbox_process_opts *o,
                        struct err *err);
/* The local provider. Never fails for a missing bubblewrap: probe() says why instead. */
int sandbox_local_new(struct sandbox_provider **out, const struct sandbox_local_opts *o,
                      struct err *err);

/* Options of the agent-sandbox provider (SPEC §11): one SandboxClaim per task. */
struct kube_client;
struct sandbox_agent_opts {
    struct kube_client *kube; /* borrowed: outlives the provider */
    const char *warm_pool;    /* SandboxWarmPool every claim names (spec.warmPoolRef) */
    int64_t poll_ms;          /* how often claims and sandboxes are read; 0: 2000 */
    /* The controller's data dir (token files, task logs): claims a previous server or
     * leader made are adopted at start (NULL: none are). */
    const char *data_dir;
    sandbox_exit_fn on_exit; /* runner exits and address changes (may be NULL) */
    void *on_exit_userdata;
};

/* The agent-sandbox provider: SandboxClaims `diverge-<task>` in the task's namespace. */
int sandbox_agent_new(struct sandbox_provider **out, const struct sandbox_agent_opts *o,
                      struct err *err);

#endif
