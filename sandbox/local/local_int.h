/* SPDX-License-Identifier: Apache-2.0 */
/* The local provider's parts (sandbox/local/ only): its state, the sandbox user, cgroups
 * and the seccomp filter. */
#ifndef DIVERGE_SANDBOX_LOCAL_INT_H
#define DIVERGE_SANDBOX_LOCAL_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <sys/types.h>

#include "sandbox/sandbox_int.h"

#define LOCAL_CG_MAX 4     /* cgroup v1 hierarchies used: freezer, memory, pids, cpu */
#define LOCAL_WARM_MAX 8   /* tasks whose cgroups wait to be made ahead */
#define LOCAL_WARM_NAME 64 /* a namespace or name and its NUL (DNS labels: 63) */

struct local_provider {
    struct sandbox_provider base; /* must be first */
    struct sbx_set set;
    char *bwrap;   /* owned: the bubblewrap binary */
    char *problem; /* owned: why sandboxes cannot run, or NULL */
    char *tools;   /* owned: host folder bound read-only at the same path, or NULL */
    bool drop;     /* the server is root: switch to uid/gid in the child */
    uid_t uid;
    gid_t gid;
    bool v2;                          /* unified cgroup hierarchy */
    char *cg_root[LOCAL_CG_MAX];      /* owned: parent cgroup dirs (NULL: not available) */
    int64_t memory, pids, cpus_milli; /* limits */
    /* cgroup_warm.c: the thread that takes the cgroup lock's slow path ahead of a start */
    pthread_t warm_thread;
    pthread_mutex_t warm_lock;
    pthread_cond_t warm_cond;
    bool warm_want, warm_stop, warm_running; /* warm_lock */
    int warm_fd;                             /* the server's own cgroup.procs, or -1 */
    struct {
        char ns[LOCAL_WARM_NAME], name[LOCAL_WARM_NAME];
    } warm_q[LOCAL_WARM_MAX]; /* warm_lock: tasks whose cgroups are to be made */
    size_t warm_n;
    unsigned char *seccomp_prog; /* owned: the filter built once (local_seccomp_init) */
    size_t seccomp_len;
};

/* A local sandbox's EXT: what its start named, which a claim keeps. */
struct local_ext {
    char cg[2 * LOCAL_WARM_NAME + 2]; /* its cgroups' name "<ns>.<name>" */
    char line[600];                   /* the task log's line on its user and limits */
};

extern const struct sbx_hooks local_hooks;

/* Resolves (and as root creates) the sandbox user NAME (NULL: SPEC §2 default). */
int local_user(struct local_provider *lp, const char *name, struct err *err);
/* Finds the cgroup hierarchies this host offers. */
void local_cgroup_init(struct local_provider *lp, const struct sandbox_local_opts *o);
void local_cgroup_cleanup(struct local_provider *lp);
/* Creates the task's cgroups with the limits; LIMITS gets a sentence for the task log. */
void local_cgroup_create(struct local_provider *lp, const char *ns, const char *name, char *limits,
                         size_t limits_len);
/* Removes the cgroups named after NS/NAME (made ahead for a start that took a warm slot,
 * whose sandbox keeps its own), killing what is in them. */
void local_cgroup_remove(struct local_provider *lp, const char *ns, const char *name);
/* Opens the task's cgroup.procs files (write) into FDS[0..LOCAL_CG_MAX), -1 unused. */
void local_cgroup_join(int *fds, struct local_provider *lp, const char *ns, const char *name);
/* The warm-up of cgroup_warm.c: set up after local_cgroup_init, asked for by the
 * provider's warm op (sandbox_warm), stopped before local_cgroup_cleanup. */
void local_warm_init(struct local_provider *lp);
void local_warm(struct sandbox_provider *p, const char *ns, const char *name);
/* Drops a wanted task NS/NAME not made yet; when this returns, the thread is not making
 * its cgroups (what it made is there for the caller to remove). */
void local_warm_forget(struct local_provider *lp, const char *ns, const char *name);
void local_warm_cleanup(struct local_provider *lp);
/* Builds the seccomp BPF program for bwrap --seccomp once, into LP (left unset when it
 * cannot: then every spawn builds it and reports why). */
void local_seccomp_init(struct local_provider *lp);
/* A new memfd holding the seccomp BPF program for bwrap --seccomp, at offset 0. */
int local_seccomp_fd(const struct local_provider *lp, int *fd_out, struct err *err);

#endif
