/* SPDX-License-Identifier: Apache-2.0 */
/* What the sandbox providers share (sandbox/ only): the table of live sandboxes, the
 * thread per sandbox that pumps its output into the task log and reaps it, and the
 * records under the state dir that let a restarted server kill what a dead one left. */
#ifndef DIVERGE_SANDBOX_SANDBOX_INT_H
#define DIVERGE_SANDBOX_SANDBOX_INT_H

#include <pthread.h>
#include <sys/types.h>

#include "sandbox/sandbox.h"

#define SBX_LINE_MAX 4096 /* longer runner output lines are split */

struct sbx;

/* Starts the sandbox's leader process with stdout and stderr on OUT_FD (and stdin on
 * /dev/null), in its own process group; *pid_out its pid. CTX is the provider's. */
typedef int (*sbx_spawn_fn)(pid_t *pid_out, const struct sandbox_spec *s, int out_fd, void *ctx,
                            struct err *err);
/* Provider hooks on a sandbox: kill everything that is left (after the leader exited or
 * on stop), freeze, thaw. Optional; NULL uses the process group. */
struct sbx_hooks {
    void (*kill_rest)(struct sbx *x, void *ctx);
    int (*freeze)(struct sbx *x, void *ctx, struct err *err);
    int (*thaw)(struct sbx *x, void *ctx, struct err *err);
    void (*forget)(struct sbx *x, void *ctx); /* after the last process is gone */
};

struct sbx {
    char *ns, *name; /* owned */
    pid_t pid;       /* the leader (also the process group id) */
    int pidfd;       /* readable once the leader exited */
    int out_fd;      /* read end of the output pipe */
    enum sandbox_state state;
    int exit_code;
    bool stopping;  /* stop() asked: no exit callback */
    bool reaped;    /* the leader was reaped: its pid may be reused */
    char *log_path; /* owned; log_lock (a claim retargets it) */
    size_t log_cap; /* log_lock */
    pthread_mutex_t log_lock;
    char *record; /* owned: the state-dir record of this sandbox */
    void *ext;    /* the provider's per-sandbox data, owned by the provider */
    /* owned, or NULL: freed by the pump thread when the runner exits, else after that
     * thread is joined */
    struct sandbox_egress *egress;
    struct sandbox_meter *meter; /* owned, or NULL: freed like egress */
    pthread_t thread;
    struct sbx_set *set; /* back pointer */
    struct sbx *next;
};

struct sbx_set {
    pthread_mutex_t lock;
    struct sbx *head;              /* guarded by lock */
    struct sandbox_provider *base; /* for on_exit */
    char *state_dir;               /* owned */
    const struct sbx_hooks *hooks; /* borrowed */
    void *ctx;                     /* the provider */
};

void sbx_set_init(struct sbx_set *set, struct sandbox_provider *base, const char *state_dir,
                  const struct sbx_hooks *hooks, void *ctx);
/* Stops every sandbox and frees the table. */
void sbx_set_cleanup(struct sbx_set *set);
/* Starts S through SPAWN; EXT (may be NULL) is stored in the record. */
int sbx_launch(struct sbx_set *set, const struct sandbox_spec *s, sbx_spawn_fn spawn, void *ext,
               struct err *err);
int sbx_suspend(struct sbx_set *set, const char *ns, const char *name, struct err *err);
int sbx_resume(struct sbx_set *set, const char *ns, const char *name, struct err *err);
void sbx_status(struct sandbox_status *out, struct sbx_set *set, const char *ns, const char *name);
/* Makes the running sandbox FROM_NS/FROM_NAME NS/NAME's (sandbox_provider_ops.claim): its
 * name, record file and log change; the provider's EXT stays (SEEN, when not NULL, reads it
 * with ARG under the table's lock once the claim is done). */
int sbx_claim(struct sbx_set *set, const char *from_ns, const char *from_name, const char *ns,
              const char *name, const char *log_path, size_t log_cap,
              void (*seen)(const void *ext, void *arg), void *arg, struct err *err);
/* Stops the sandbox; with none known, kills what a previous server left (its record). */
void sbx_stop(struct sbx_set *set, const char *ns, const char *name);
/* The path of a sandbox's record file: new string. */
char *sbx_record_path(const struct sbx_set *set, const char *ns, const char *name);
/* SIGKILLs every process whose process group is PGID and that started no earlier than
 * the leader did (STARTTIME, /proc/<pid>/stat field 22). */
void sbx_kill_group(pid_t pgid, unsigned long long starttime);
/* Sends SIG to ROOT and all its descendants, repeating until the set is stable (the
 * pause fallback without a cgroup: it reaches into bubblewrap's pid namespace). For
 * SIGSTOP it returns once every one of them is stopped, or after SBX_STOP_WAIT_MS. */
#define SBX_STOP_WAIT_MS 1000
void sbx_signal_tree(pid_t root, int sig);
/* Reads up to SIZE - 1 bytes of PATH (a small /proc or cgroup file) into BUF,
 * NUL-terminated; the bytes read, or -1 (BUF empty, errno the open's or read's). */
ssize_t sbx_read_small(const char *path, char *buf, size_t size);
/* /proc/<pid>/stat field 22, 0 when unknown. */
unsigned long long sbx_starttime(pid_t pid);
/* Whether ROOT or one of its descendants runs the program whose command name is COMM
 * (compared as the kernel keeps it: its first 15 characters), i.e. whether bubblewrap has
 * set the sandbox up and executed it. */
bool sbx_tree_runs(pid_t root, const char *comm);

/* Code a sandbox's child runs between fork or vfork and execve: not instrumented by the
 * sanitizers (a vfork child runs in the server's memory, where their bookkeeping is the
 * server's), and kept out of line. */
#define SBX_CHILD_CODE __attribute__((no_sanitize("address", "thread", "undefined"), noinline))

/* In a forked or vforked child before execve: marks every descriptor from 3 up
 * close-on-exec (close_range; one fcntl per descriptor up to RLIMIT_NOFILE on kernels
 * before 5.11), so nothing the server holds or inherited from its own parent reaches task
 * code. The caller then clears the flag on the descriptors it means to pass on. Raw system
 * calls only (no libc wrapper that keeps state: safe in a vfork child); 0, or -1 when a
 * descriptor could not be marked. */
SBX_CHILD_CODE int sbx_cloexec_from_3(void);

#endif
