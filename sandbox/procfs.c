/* SPDX-License-Identifier: Apache-2.0 */
/* What the sandbox table reads from /proc: a process's start time, parent and process
 * group (fields of /proc/<pid>/stat), and the walks that signal a whole process group or
 * a whole process tree, also processes that left the leader's session. Also the
 * descriptor sweep every sandbox child does before exec. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "sandbox/sandbox_int.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2) /* linux/close_range.h, Linux 5.11 */
#endif
#define SBX_FD_SCAN_MAX (1 << 20) /* descriptors the fallback marks one by one */

ssize_t sbx_read_small(const char *path, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, buf, size - 1) : -1;
    int saved = errno;

    if (fd >= 0) {
        close(fd);
    }
    buf[n > 0 ? n : 0] = '\0';
    errno = saved;
    return n;
}

/* Reads /proc/<PID>/stat into BUF[SIZE]; the command's last ')' in it (the command may
 * hold spaces and parentheses: the fields are the text after it), or NULL when the process
 * is gone. */
static char *stat_tail(pid_t pid, char *buf, size_t size)
{
    char path[64];

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    return sbx_read_small(path, buf, size) > 0 ? strrchr(buf, ')') : NULL;
}

/* Field FIELD (1-based, as in proc(5): 4 ppid, 5 pgrp, 22 starttime) of
 * /proc/<PID>/stat. *OK_OUT is false when the process is gone. */
static unsigned long long stat_field(pid_t pid, int field, bool *ok_out)
{
    char buf[1024], *p = stat_tail(pid, buf, sizeof(buf));

    *ok_out = false;
    /* p is at ") S ...": field 3 follows the first space, field k the (k-2)th. */
    for (int f = 2; p != NULL && f < field; f++) {
        p = strchr(p + 1, ' ');
    }
    if (p == NULL) {
        return 0;
    }
    *ok_out = true;
    return strtoull(p + 1, NULL, 10);
}

unsigned long long sbx_starttime(pid_t pid)
{
    bool ok;
    unsigned long long v = stat_field(pid, 22, &ok);

    return ok ? v : 0;
}

static pid_t pgrp_of(pid_t pid)
{
    bool ok;
    unsigned long long v = stat_field(pid, 5, &ok);

    return ok ? (pid_t)v : -1;
}

static pid_t ppid_of(pid_t pid)
{
    bool ok;
    unsigned long long v = stat_field(pid, 4, &ok);

    return ok ? (pid_t)v : -1;
}

void sbx_kill_group(pid_t pgid, unsigned long long starttime)
{
    DIR *d = opendir("/proc");
    struct dirent *e;

    if (d == NULL || pgid <= 1) {
        if (d != NULL) {
            closedir(d);
        }
        return;
    }
    while ((e = readdir(d)) != NULL) {
        char *end = NULL;
        long pid = strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end != '\0' || pid <= 1 || pid == (long)getpid()) {
            continue;
        }
        if (pgrp_of((pid_t)pid) == pgid && sbx_starttime((pid_t)pid) >= starttime) {
            kill((pid_t)pid, SIGKILL);
            kill((pid_t)pid, SIGCONT);
        }
    }
    closedir(d);
}

#define SBX_TREE_MAX 4096     /* processes of one sandbox signalled by the fallback */
#define SBX_READY_TREE_MAX 64 /* processes of a starting sandbox looked at for its program */
#define SBX_COMM_MAX 15       /* what the kernel keeps of a command's name (TASK_COMM_LEN - 1) */

/* True if PID is not in SEEN[0..N) but its parent is. */
static bool is_new_child(const pid_t *seen, size_t n, pid_t pid)
{
    bool known = false, child = false;

    for (size_t i = 0; i < n && !known; i++) {
        known = seen[i] == pid;
    }
    pid_t pp = known ? -1 : ppid_of(pid);
    for (size_t i = 0; i < n && !child && pp > 0; i++) {
        child = seen[i] == pp;
    }
    return child;
}

/* One pass over /proc: appends to SEEN every new child of a process in it. */
static void collect_pass(pid_t *seen, size_t *n)
{
    DIR *d = opendir("/proc");
    struct dirent *e;

    while (d != NULL && (e = readdir(d)) != NULL && *n < SBX_TREE_MAX) {
        char *end = NULL;
        long pid = strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end != '\0' || pid <= 1) {
            continue;
        }
        if (is_new_child(seen, *n, (pid_t)pid)) {
            seen[(*n)++] = (pid_t)pid;
        }
    }
    if (d != NULL) {
        closedir(d);
    }
}

/* Adds to SEEN[*n..] every descendant of SEEN[0..*n) not in it yet, until none is new. */
static void collect(pid_t *seen, size_t *n)
{
    size_t before;

    do {
        before = *n;
        collect_pass(seen, n);
    } while (*n != before);
}

/* The processes of one tree, as collect() reads them from /proc: one array (too large for
 * a thread's stack) for every walk, the walks one at a time. tree_begin locks it and puts
 * ROOT first; tree_end unlocks it. */
static pid_t tree_seen[SBX_TREE_MAX];
static pthread_mutex_t tree_lock = PTHREAD_MUTEX_INITIALIZER;

static pid_t *tree_begin(pid_t root)
{
    pthread_mutex_lock(&tree_lock);
    tree_seen[0] = root;
    return tree_seen;
}

static void tree_end(void)
{
    pthread_mutex_unlock(&tree_lock);
}

/* The state letter of PID (/proc/<pid>/stat field 3), or 0 when it is gone. */
static char state_of(pid_t pid)
{
    char buf[1024], *p = stat_tail(pid, buf, sizeof(buf));

    return p != NULL && p[1] == ' ' ? p[2] : 0;
}

/* Waits until every process of SEEN[0..n) is stopped (T, t), a zombie or gone: a SIGSTOP
 * takes effect when its process next runs, after kill() returned. At most
 * SBX_STOP_WAIT_MS (one in uninterruptible sleep stops only when it leaves it). */
static void wait_stopped(const pid_t *seen, size_t n)
{
    for (int waited_us = 0; waited_us < SBX_STOP_WAIT_MS * 1000; waited_us += 200) {
        size_t i = 0;
        for (char st; i < n; i++) {
            st = state_of(seen[i]);
            if (st != 0 && st != 'T' && st != 't' && st != 'Z' && st != 'X') {
                break;
            }
        }
        if (i == n) {
            return;
        }
        usleep(200);
    }
}

/* Sends SIG to ROOT and every descendant (also those that left its session or process
 * group, e.g. inside bubblewrap's pid namespace). The tree is read before any signal
 * (a killed parent would hand its children to init) and read again until no new process
 * shows up; the deepest get the signal first. A SIGSTOP returns once they stopped. */
void sbx_signal_tree(pid_t root, int sig)
{
    pid_t *seen = tree_begin(root);
    size_t n = 1, done = 0;

    for (int round = 0; round < 8; round++) {
        collect(seen, &n);
        if (n == done && round > 0) {
            break;
        }
        for (size_t i = n; i > done; i--) {
            kill(seen[i - 1], sig);
        }
        done = n;
    }
    if (sig == SIGSTOP) {
        wait_stopped(seen, n);
    }
    tree_end();
}

/* Whether /proc/<PID>/comm is COMM (a command name, at most 15 characters kept). */
static bool comm_is(pid_t pid, const char *comm)
{
    char path[64], buf[32];

    snprintf(path, sizeof(path), "/proc/%d/comm", (int)pid);
    if (sbx_read_small(path, buf, sizeof(buf)) <= 0) {
        return false;
    }
    buf[strcspn(buf, "\n")] = '\0';
    return strncmp(buf, comm, SBX_COMM_MAX) == 0;
}

/* Appends to KIDS[*n..] the children of PID listed in /proc/<pid>/task/<pid>/children
 * (each thread has its own list; a process's children are those of its threads, but
 * bubblewrap and the runner's start fork from their main thread). False when the kernel
 * has no such file. */
static bool children_of(pid_t pid, pid_t *kids, size_t *n, size_t max)
{
    char path[96], buf[512], *p, *end;

    snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int)pid, (int)pid);
    if (sbx_read_small(path, buf, sizeof(buf)) < 0 && errno == ENOENT && kill(pid, 0) == 0) {
        return false; /* the process is there, its children file is not */
    }
    for (p = buf; *n < max; p = end) {
        long v = strtol(p, &end, 10);
        if (end == p) {
            break;
        }
        kids[(*n)++] = (pid_t)v;
    }
    return true;
}

bool sbx_tree_runs(pid_t root, const char *comm)
{
    pid_t tree[SBX_READY_TREE_MAX];
    size_t n = 1;

    tree[0] = root;
    for (size_t i = 0; i < n; i++) {
        if (comm_is(tree[i], comm)) {
            return true;
        }
        if (!children_of(tree[i], tree, &n, ARRAY_LEN(tree))) {
            /* No children files (CONFIG_PROC_CHILDREN off): the whole tree from /proc. */
            pid_t *seen = tree_begin(root);
            bool yes = false;
            size_t m = 1;

            collect(seen, &m);
            for (size_t k = 0; k < m && !yes; k++) {
                yes = comm_is(seen[k], comm);
            }
            tree_end();
            return yes;
        }
    }
    return false;
}

SBX_CHILD_CODE int sbx_cloexec_from_3(void)
{
    struct rlimit rl;
    long max;

    if (syscall(SYS_close_range, 3, ~0U, CLOSE_RANGE_CLOEXEC) == 0) {
        return 0;
    }
    /* Before Linux 5.11 (ENOSYS or EINVAL): each possible descriptor in turn. */
    if (syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, NULL, &rl) != 0) {
        return -1;
    }
    max = rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > SBX_FD_SCAN_MAX ? SBX_FD_SCAN_MAX
                                                                        : (long)rl.rlim_cur;
    for (long fd = 3; fd < max; fd++) {
        long fl = syscall(SYS_fcntl, fd, F_GETFD);
        if (fl >= 0 && (fl & FD_CLOEXEC) == 0 &&
            syscall(SYS_fcntl, fd, F_SETFD, fl | FD_CLOEXEC) != 0) {
            return -1;
        }
    }
    return 0;
}
