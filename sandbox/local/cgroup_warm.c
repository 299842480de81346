/* SPDX-License-Identifier: Apache-2.0 */
/* A start's cgroups, made ahead. The first move of a process between cgroups after a quiet
 * while waits for an RCU grace period: the kernel's cgroup_threadgroup_rwsem takes its slow
 * path for writers only after one (rcu_sync), and stays cheap for a grace period after the
 * last writer. The move waits holding cgroup_mutex, which every cgroup mkdir (of any v1
 * hierarchy) takes too. A sandbox's child moves itself into the task's cgroups right after
 * the fork, so a start paid those 5 to 20 ms on its way, in the mkdir or in the move.
 * When a start is coming (sandbox_warm: a task was made), a thread of the provider makes
 * the task's cgroups with their limits first (local_cgroup_create, while nothing holds the
 * mutex) and then pays the grace period ahead: it moves the server into the cgroup it is
 * already in, which changes nothing but takes the same lock. A stop of the task that
 * comes first drops its entry; one that comes after removes what was made
 * (local_stop takes warm_lock, under which the thread makes the cgroups). Best effort:
 * without a cgroup (not root) or its file, nothing happens. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sandbox/local/local_int.h"

/* The cgroup.procs file of the server's own cgroup in the hierarchy the sandboxes use
 * (the freezer's under v1, the unified one under v2), opened for writing; -1 if none. */
static int own_procs(const struct local_provider *lp)
{
    char line[4096], *path = NULL;
    FILE *f = fopen("/proc/self/cgroup", "re");
    int fd = -1;

    while (f != NULL && path == NULL && fgets(line, sizeof(line), f) != NULL) {
        char *p = strchr(line, ':'), *q = p != NULL ? strchr(p + 1, ':') : NULL;
        bool ours = q != NULL && (lp->v2 ? q == p + 1 && strncmp(line, "0:", 2) == 0
                                         : strncmp(p + 1, "freezer:", 8) == 0);

        if (ours && q[1] == '/') {
            q[strcspn(q, "\n")] = '\0';
            path = xasprintf("/sys/fs/cgroup%s%s/cgroup.procs", lp->v2 ? "" : "/freezer",
                             strcmp(q + 1, "/") == 0 ? "" : q + 1);
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    if (path != NULL && strstr(path, "/../") == NULL) {
        fd = open(path, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
    }
    free(path);
    return fd;
}

/* Removes the wanted task at I (warm_lock held). */
static void drop_at(struct local_provider *lp, size_t i)
{
    lp->warm_n--;
    memmove(&lp->warm_q[i], &lp->warm_q[i + 1], (lp->warm_n - i) * sizeof(lp->warm_q[0]));
}

/* Takes the oldest wanted task (warm_lock held) into NS and NAME (64 bytes each); false
 * when none is waiting. */
static bool take(struct local_provider *lp, char *ns, char *name)
{
    if (lp->warm_n == 0) {
        return false;
    }
    memcpy(ns, lp->warm_q[0].ns, sizeof(lp->warm_q[0].ns));
    memcpy(name, lp->warm_q[0].name, sizeof(lp->warm_q[0].name));
    drop_at(lp, 0);
    return true;
}

static void *warm_main(void *arg)
{
    struct local_provider *lp = arg;
    char ns[LOCAL_WARM_NAME], name[LOCAL_WARM_NAME], limits[512];

    pthread_mutex_lock(&lp->warm_lock);
    for (;;) {
        while (!lp->warm_want && lp->warm_n == 0 && !lp->warm_stop) {
            pthread_cond_wait(&lp->warm_cond, &lp->warm_lock);
        }
        if (lp->warm_stop) {
            break;
        }
        while (take(lp, ns, name)) {
            local_cgroup_create(lp, ns, name, limits, sizeof(limits)); /* under warm_lock */
        }
        lp->warm_want = false;
        pthread_mutex_unlock(&lp->warm_lock);
        (void)!write(lp->warm_fd, "0", 1); /* "0": the writer's own process */
        pthread_mutex_lock(&lp->warm_lock);
    }
    pthread_mutex_unlock(&lp->warm_lock);
    return NULL;
}

void local_warm_init(struct local_provider *lp)
{
    lp->warm_fd = -1;
    pthread_mutex_init(&lp->warm_lock, NULL);
    pthread_cond_init(&lp->warm_cond, NULL);
    if (lp->cg_root[0] == NULL) {
        return; /* no cgroup: nothing moves at a start */
    }
    lp->warm_fd = own_procs(lp);
    if (lp->warm_fd >= 0 && pthread_create(&lp->warm_thread, NULL, warm_main, lp) == 0) {
        lp->warm_running = true;
    } else if (lp->warm_fd >= 0) {
        close(lp->warm_fd);
        lp->warm_fd = -1;
    }
}

void local_warm(struct sandbox_provider *p, const char *ns, const char *name)
{
    struct local_provider *lp = (struct local_provider *)p;
    size_t i;

    if (!lp->warm_running) {
        return;
    }
    pthread_mutex_lock(&lp->warm_lock);
    lp->warm_want = true;
    if (ns != NULL && name != NULL && strlen(ns) < LOCAL_WARM_NAME &&
        strlen(name) < LOCAL_WARM_NAME) {
        if (lp->warm_n == LOCAL_WARM_MAX) { /* a burst: the oldest is made at its start */
            drop_at(lp, 0);
        }
        i = lp->warm_n++;
        memcpy(lp->warm_q[i].ns, ns, strlen(ns) + 1);
        memcpy(lp->warm_q[i].name, name, strlen(name) + 1);
    }
    pthread_cond_signal(&lp->warm_cond);
    pthread_mutex_unlock(&lp->warm_lock);
}

void local_warm_forget(struct local_provider *lp, const char *ns, const char *name)
{
    size_t i = 0;

    if (!lp->warm_running) {
        return;
    }
    pthread_mutex_lock(&lp->warm_lock);
    while (i < lp->warm_n) {
        if (strcmp(lp->warm_q[i].ns, ns) == 0 && strcmp(lp->warm_q[i].name, name) == 0) {
            drop_at(lp, i);
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&lp->warm_lock);
}

void local_warm_cleanup(struct local_provider *lp)
{
    if (lp->warm_running) {
        pthread_mutex_lock(&lp->warm_lock);
        lp->warm_stop = true;
        pthread_cond_signal(&lp->warm_cond);
        pthread_mutex_unlock(&lp->warm_lock);
        pthread_join(lp->warm_thread, NULL);
        lp->warm_running = false;
    }
    if (lp->warm_fd >= 0) {
        close(lp->warm_fd);
    }
    pthread_cond_destroy(&lp->warm_cond);
    pthread_mutex_destroy(&lp->warm_lock);
}
