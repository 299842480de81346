/* SPDX-License-Identifier: Apache-2.0 */
/* What a checkpoint's tree is made of besides HEAD, read without git (runner_int.h):
 * the status of every entry of the workspace but its .git, and of the git files that
 * decide what `git add -A` takes. Equal text at the next checkpoint means the same tree,
 * as git's own index trusts a file whose status did not change. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "runner/runner_int.h"

#define SNAP_MAX (64u << 20)          /* bytes of a snapshot; more: git is asked */
#define SNAP_DEPTH 256                /* directory levels walked; deeper: git is asked */
#define SNAP_NAMES_MAX (1u << 20)     /* entries of one directory; more: git is asked */
#define SNAP_CONFIG_MAX (1024 * 1024) /* bytes of a git config file read for indirections */
/* The file in the workspace's .git stamped as a snapshot begins (git's "racy git" rule,
 * with this file in the role of the index): an entry of the workspace stamped at or after
 * it may change again within the same time stamp. */
#define SNAP_STAMP "diverge-wip.stamp"
/* Files outside the workspace (another file system, maybe another clock granularity):
 * changed within this long of the snapshot, not vouched for (whole-second stamps). */
#define SNAP_OUTSIDE_RACY_NS 1100000000LL

struct snap {
    struct buf *out;
    long long cutoff_ns; /* entries changed at or after it: not vouched for */
    bool bad;            /* something cannot be vouched for: git is asked */
};

static long long ts_ns(const struct timespec *t)
{
    return (long long)t->tv_sec * 1000000000LL + (long long)t->tv_nsec;
}

/* Appends NAME (never empty, never holding a NUL) and its status, or a marker when SB is
 * NULL: NAME "{" enters a directory, "}" leaves it, "-" says NAME is absent. */
static void snap_put(struct snap *s, const char *name, const struct stat *sb, const char *mark)
{
    int rc = buf_append(s->out, name, strlen(name) + 1);

    if (sb != NULL) {
        if (ts_ns(&sb->st_ctim) >= s->cutoff_ns || ts_ns(&sb->st_mtim) >= s->cutoff_ns) {
            s->bad = true;
        }
        rc = rc != E_OK ? rc
                        : buf_printf(s->out, "%o %llu %llu %lld %lld.%09ld %lld.%09ld\n",
                                     (unsigned)sb->st_mode, (unsigned long long)sb->st_dev,
                                     (unsigned long long)sb->st_ino, (long long)sb->st_size,
                                     (long long)sb->st_mtim.tv_sec, sb->st_mtim.tv_nsec,
                                     (long long)sb->st_ctim.tv_sec, sb->st_ctim.tv_nsec);
    } else if (rc == E_OK) {
        rc = buf_printf(s->out, "%s\n", mark);
    }
    if (rc != E_OK) {
        s->bad = true;
    }
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The names in D but "." and ".." (and ".git" when SKIP_GIT), sorted, into *NAMES_OUT
 * (caller frees each and the array) and *N_OUT. False (nothing to free) when the
 * directory cannot be read whole. */
static bool dir_names(char ***names_out, size_t *n_out, DIR *d, bool skip_git)
{
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;

    errno = 0;
    while ((e = readdir(d)) != NULL && n < SNAP_NAMES_MAX) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
            (skip_git && strcmp(e->d_name, ".git") == 0)) {
            continue;
        }
        if (n == cap) {
            cap = cap == 0 ? 32 : cap * 2;
            names = xrealloc(names, cap * sizeof(*names));
        }
        names[n++] = xstrdup(e->d_name);
    }
    if (e != NULL || errno != 0) {
        for (size_t i = 0; i < n; i++) {
            free(names[i]);
        }
        free(names);
        return false;
    }
    if (n > 1) {
        qsort(names, n, sizeof(*names), name_cmp);
    }
    *names_out = names;
    *n_out = n;
    return true;
}

static void walk_dir(struct snap *s, int dfd, int depth);

/* One entry NAME of the directory DFD, and what it holds when it is a directory. */
static void walk_entry(struct snap *s, int dfd, const char *name, int depth)
{
    struct stat sb;
    int fd;

    if (fstatat(dfd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0) {
        s->bad = true; /* gone while it was read: it changed */
        return;
    }
    snap_put(s, name, &sb, NULL);
    if (!S_ISDIR(sb.st_mode)) {
        return;
    }
    fd = depth < SNAP_DEPTH ? openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                            : -1;
    if (fd < 0) {
        s->bad = true;
        return;
    }
    snap_put(s, name, NULL, "{");
    walk_dir(s, fd, depth + 1);
    snap_put(s, name, NULL, "}");
}

/* Every entry under the directory DFD (taken: closed here), sorted by name. */
static void walk_dir(struct snap *s, int dfd, int depth)
{
    DIR *d = fdopendir(dfd);
    char **names = NULL;
    size_t n = 0;

    if (d == NULL) {
        close(dfd);
        s->bad = true;
        return;
    }
    if (!dir_names(&names, &n, d, depth == 0)) {
        names = NULL;
        s->bad = true;
    }
    for (size_t i = 0; i < n; i++) {
        if (!s->bad) {
            walk_entry(s, dirfd(d), names[i], depth);
        }
        free(names[i]);
    }
    free(names);
    closedir(d);
}

/* Whether the git config file PATH (relative to DFD), a regular file whose status is SB,
 * names another file whose content decides what is taken: an include, an excludes or
 * attributes file. True too when it cannot be read whole. */
static bool config_points_away(int dfd, const char *path, const struct stat *sb)
{
    struct stat now;
    int fd = openat(dfd, path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    char *text;
    ssize_t n;
    bool away;

    if (fd < 0 || fstat(fd, &now) != 0 || now.st_ino != sb->st_ino || now.st_dev != sb->st_dev ||
        !S_ISREG(now.st_mode) || now.st_size > SNAP_CONFIG_MAX) {
        if (fd >= 0) {
            close(fd);
        }
        return true;
    }
    text = xmalloc((size_t)now.st_size + 1);
    n = pread(fd, text, (size_t)now.st_size, 0);
    close(fd);
    text[n > 0 ? n : 0] = '\0';
    for (ssize_t i = 0; i < n; i++) {
        text[i] = (char)tolower((unsigned char)text[i]);
    }
    away = n != (ssize_t)now.st_size || strlen(text) != (size_t)n || strstr(text, "include") ||
           strstr(text, "excludesfile") || strstr(text, "attributesfile");
    free(text);
    return away;
}

/* The file PATH (relative to DFD unless absolute), followed as git follows it: its status,
 * or that it is absent; when CONFIG, a git config file that must not point elsewhere. Only
 * a regular config file is ever opened (never a device or a FIFO). */
static void snap_file(struct snap *s, int dfd, const char *path, bool config)
{
    struct stat sb;

    if (fstatat(dfd, path, &sb, 0) != 0) {
        if (errno == ENOENT || errno == ENOTDIR) {
            snap_put(s, path, NULL, "-");
        } else {
            s->bad = true;
        }
    } else if (config && (!S_ISREG(sb.st_mode) || config_points_away(dfd, path, &sb))) {
        s->bad = true;
    } else {
        snap_put(s, path, &sb, NULL);
    }
}

/* The user's and the system's git files that `git add -A` reads (git's own defaults). */
static void snap_outside(struct snap *s)
{
    const char *home = getenv("HOME"), *xdg = getenv("XDG_CONFIG_HOME");
    const char *global = getenv("GIT_CONFIG_GLOBAL"), *system = getenv("GIT_CONFIG_SYSTEM");
    static const char *const xdg_files[] = {"config", "ignore", "attributes"};
    long long cutoff = s->cutoff_ns;
    struct timespec now;
    char *path;

    clock_gettime(CLOCK_REALTIME, &now);
    s->cutoff_ns = ts_ns(&now) - SNAP_OUTSIDE_RACY_NS;
    snap_put(s, "+", NULL, "outside");
    snap_file(s, AT_FDCWD, system != NULL && system[0] != '\0' ? system : "/etc/gitconfig", true);
    if (global != NULL && global[0] != '\0') {
        snap_file(s, AT_FDCWD, global, true);
    }
    if (home != NULL && home[0] == '/') {
        path = xasprintf("%s/.gitconfig", home);
        snap_file(s, AT_FDCWD, path, true);
        free(path);
    }
    for (size_t i = 0; i < ARRAY_LEN(xdg_files); i++) {
        if (xdg != NULL && xdg[0] == '/') {
            path = xasprintf("%s/git/%s", xdg, xdg_files[i]);
        } else if (home != NULL && home[0] == '/') {
            path = xasprintf("%s/.config/git/%s", home, xdg_files[i]);
        } else {
            continue;
        }
        snap_file(s, AT_FDCWD, path, i == 0);
        free(path);
    }
    s->cutoff_ns = cutoff;
}

/* The workspace's own git files that decide what is taken, or what HEAD's tree is. */
static void snap_gitdir(struct snap *s, int gfd)
{
    static const char *const configs[] = {"config", "config.worktree"};
    static const char *const others[] = {"info",        "info/exclude", "info/attributes",
                                         "info/grafts", "shallow",      "packed-refs",
                                         "refs/replace"};

    snap_put(s, "+", NULL, ".git");
    for (size_t i = 0; i < ARRAY_LEN(configs); i++) {
        snap_file(s, gfd, configs[i], true);
    }
    for (size_t i = 0; i < ARRAY_LEN(others); i++) {
        snap_file(s, gfd, others[i], false);
    }
}

/* Stamps SNAP_STAMP in the git directory GFD now: its change time is the cutoff. */
static void snap_stamp(struct snap *s, int gfd)
{
    struct stat sb;
    int fd =
        openat(gfd, SNAP_STAMP, O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);

    if (fd < 0 || futimens(fd, NULL) != 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        s->bad = true;
    } else {
        s->cutoff_ns = ts_ns(&sb.st_ctim);
    }
    if (fd >= 0) {
        close(fd);
    }
}

bool runner_wip_snapshot(struct buf *out, const struct runner_config *cfg)
{
    struct snap s = {.out = out};
    int wfd = open(cfg->workspace, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int gfd = wfd >= 0 ? openat(wfd, ".git", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
    struct stat sb;

    buf_init(out, SNAP_MAX);
    if (gfd < 0 || fstat(wfd, &sb) != 0) {
        s.bad = true; /* no workspace, or its git directory is elsewhere */
    } else {
        snap_stamp(&s, gfd);
        snap_put(&s, ".", &sb, NULL);
        snap_gitdir(&s, gfd);
        snap_outside(&s);
    }
    if (gfd >= 0) {
        close(gfd);
    }
    if (!s.bad) {
        snap_put(&s, "+", NULL, "workspace");
        walk_dir(&s, wfd, 0); /* takes wfd */
    } else if (wfd >= 0) {
        close(wfd);
    }
    return !s.bad;
}

void runner_wip_memo_cleanup(struct runner_wip_memo *memo)
{
    buf_cleanup(&memo->snap);
    memo->snap_ok = false;
}
