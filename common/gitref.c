/* SPDX-License-Identifier: Apache-2.0 */
#define _GNU_SOURCE
#include "common/gitref.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/err.h"

#define LOOSE_MAX (GITREF_OID_HEX + 2) /* an id, a newline, and one byte to see more */
#define LINE_MAX_BYTES 1200            /* "<oid> <ref>\n" of a ref git would write */

static bool is_oid(const char *s)
{
    return strspn(s, "0123456789abcdef") >= GITREF_OID_HEX;
}

/* A name git could have written as a file under GITDIR without the path meaning more. */
static bool plain_ref(const char *ref)
{
    size_t n = strlen(ref);

    return strncmp(ref, "refs/", 5) == 0 && n > 5 && n < LINE_MAX_BYTES - GITREF_OID_HEX - 2 &&
           strstr(ref, "..") == NULL && strstr(ref, "//") == NULL && strstr(ref, "/.") == NULL &&
           ref[n - 1] != '/' && strpbrk(ref, "\\ \t\r\n") == NULL;
}

/* Opens GITDIR/NAME for reading with no symbolic link anywhere below GITDIR (openat2
 * RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH; a kernel without it: none as the last part) and
 * only a regular file; -1 with errno. */
static int open_in(const char *gitdir, const char *name)
{
    struct open_how how = {.flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK,
                           .resolve = RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH};
    int dir = open(gitdir, O_PATH | O_DIRECTORY | O_CLOEXEC), fd = -1, saved;
    struct stat st = {0};

    if (dir < 0) {
        return -1;
    }
    fd = (int)syscall(SYS_openat2, dir, name, &how, sizeof(how));
    if (fd < 0 && (errno == ENOSYS || errno == EPERM)) { /* no openat2, or a filter refuses it */
        fd = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    }
    saved = errno;
    close(dir);
    if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
        close(fd);
        errno = S_ISDIR(st.st_mode) ? EISDIR : EINVAL; /* a folder: refs/heads/team/... */
        return -1;
    }
    errno = fd >= 0 ? 0 : saved;
    return fd;
}

/* The loose ref file FD: exactly one id and a newline. */
static int read_loose(char *oid, int fd)
{
    char buf[LOOSE_MAX + 1];
    ssize_t n = read(fd, buf, LOOSE_MAX);

    close(fd);
    if (n != GITREF_OID_HEX + 1 || buf[GITREF_OID_HEX] != '\n' || !is_oid(buf)) {
        return -1;
    }
    if (oid != NULL) {
        memcpy(oid, buf, GITREF_OID_HEX);
        oid[GITREF_OID_HEX] = '\0';
    }
    return 1;
}

/* Whether the whole line LINE (LEN bytes, no newline) is "<oid> <REF>"; its id into OID. */
static bool packed_line(char *oid, const char *line, size_t len, const char *ref, size_t ref_len)
{
    if (len != GITREF_OID_HEX + 1 + ref_len || line[GITREF_OID_HEX] != ' ' || !is_oid(line) ||
        memcmp(line + GITREF_OID_HEX + 1, ref, ref_len) != 0) {
        return false;
    }
    if (oid != NULL) {
        memcpy(oid, line, GITREF_OID_HEX);
        oid[GITREF_OID_HEX] = '\0';
    }
    return true;
}

/* REF in the packed-refs file FD, reading at most MAX bytes: 1, 0, or -1 past the cap. */
static int read_packed(char *oid, int fd, const char *ref, size_t max)
{
    FILE *f = fdopen(fd, "r");
    char line[LINE_MAX_BYTES];
    size_t total = 0, ref_len = strlen(ref);
    bool at_start = true; /* the next piece fgets reads starts a line */
    int found = 0;

    if (f == NULL) {
        close(fd);
        return -1;
    }
    while (found == 0 && fgets(line, sizeof(line), f) != NULL) {
        size_t len = strlen(line);
        bool whole = len > 0 && line[len - 1] == '\n';
        size_t body = whole && len > 1 && line[len - 2] == '\r' ? len - 2 : len - 1; /* CRLF */
        total += len;
        if (total > max) {
            found = -1;
        } else if (at_start && whole && packed_line(oid, line, body, ref, ref_len)) {
            found = 1;
        }
        at_start = whole; /* a piece of a longer line is never believed */
    }
    fclose(f);
    return found;
}

/* Whether GITDIR keeps its refs in files: a reftable repository (git 2.45 on) keeps
 * them in reftable/, its loose refs and packed-refs are no answer. */
static bool files_backend(const char *gitdir)
{
    char *p = xasprintf("%s/reftable", gitdir);
    struct stat st;
    bool files = lstat(p, &st) != 0 && errno == ENOENT;

    free(p);
    return files;
}

char *gitref_url_gitdir(const char *url)
{
    static const char *const sub[] = {"/.git", ""};
    const char *path = url != NULL && strncmp(url, "file:///", 8) == 0 ? url + 7 : NULL;

    if (path == NULL || strchr(path, '%') != NULL) {
        return NULL;
    }
    for (size_t i = 0; i < sizeof(sub) / sizeof(sub[0]); i++) {
        char *dir = xasprintf("%s%s", path, sub[i]), *head = xasprintf("%s/HEAD", dir);
        struct stat st;
        bool dir_there = lstat(dir, &st) == 0, repo = dir_there && S_ISDIR(st.st_mode) &&
                                                      lstat(head, &st) == 0 && S_ISREG(st.st_mode);
        free(head);
        if (repo) {
            return dir;
        }
        free(dir);
        if (dir_there) {
            return NULL; /* a .git git would follow (a file, a link): git's to read */
        }
    }
    return NULL;
}

int gitref_read(char oid[GITREF_OID_HEX + 1], const char *gitdir, const char *ref,
                size_t packed_max)
{
    int fd;

    if (!plain_ref(ref) || !files_backend(gitdir)) {
        return -1;
    }
    fd = open_in(gitdir, ref);
    if (fd >= 0) {
        return read_loose(oid, fd);
    }
    if (errno != ENOENT && errno != ENOTDIR && errno != EISDIR) {
        return -1;
    }
    fd = open_in(gitdir, "packed-refs");
    if (fd < 0) {
        return errno == ENOENT ? 0 : -1;
    }
    return read_packed(oid, fd, ref, packed_max);
}
