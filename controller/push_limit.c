/* SPDX-License-Identifier: Apache-2.0 */
/* The size of what the server's push of a task's working branch would send to the real
 * remote (--max-push-bytes): the on-disk size of the objects of the branch in the staging
 * repository that the repository's mirror (the remote's refs when it was last fetched)
 * cannot reach. git measures it (rev-list --disk-usage, git >= 2.31), with the mirror as an
 * alternate object store given through the environment, never through the staging repo's
 * files, which the sandbox wrote. That git reads what the sandbox wrote: it runs in a
 * process group of its own, bounded as the push is (a delete of the task or the server's
 * stop kills it, and so does the push's time limit). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "controller/controller_int.h"

#define PUSH_SIZE_OUT_MAX 64 /* bytes of rev-list output read: one number */

int controller_push_size(int64_t *bytes_out, const char *staging, const char *mirror,
                         const char *working, struct controller_git_bound *b, struct err *err)
{
    char *ref = xasprintf("refs/heads/%s", working);
    const char *argv[] = {"git",
                          "--git-dir",
                          staging,
                          "rev-list",
                          "--objects",
                          "--disk-usage",
                          "--ignore-missing",
                          ref,
                          "--not",
                          "--alternate-refs",
                          NULL};
    char *alt = NULL, out[PUSH_SIZE_OUT_MAX], *end = NULL;
    struct stat st;
    long long n;
    int rc;

    if (mirror != NULL && lstat(mirror, &st) == 0 && S_ISDIR(st.st_mode)) {
        alt = xasprintf("GIT_ALTERNATE_OBJECT_DIRECTORIES=%s/objects", mirror);
    }
    rc = controller_git_read(out, sizeof(out), argv, alt, b, err);
    *bytes_out = 0;
    if (rc != E_OK && err != NULL) {
        char said[ERR_MSG_MAX];
        snprintf(said, sizeof(said), "%s", err->msg);
        rc = err_set(err, rc, "cannot measure the push: %s", said);
    } else if (rc == E_OK) {
        errno = 0;
        n = strtoll(out, &end, 10);
        if (errno != 0 || end == out || (*end != '\n' && *end != '\0') || n < 0) {
            rc = err_set(err, E_FAIL, "cannot measure the push: git rev-list said no size");
        } else {
            *bytes_out = n;
        }
    }
    free(alt);
    free(ref);
    return rc;
}
