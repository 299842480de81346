/* SPDX-License-Identifier: Apache-2.0 */
/* Where a branch of a git repository points, read from the repository's own files (the
 * loose ref, else packed-refs) instead of asking git: the runner's look at its file://
 * remote, the controller's at a staging repository the sandbox wrote and at a mirror. The
 * files are read as hostile: no symbolic link is followed, packed-refs is read up to a
 * cap, a line is believed only whole and only with a SHA-1 object id. Whatever cannot be
 * told this way is -1: the caller asks git, or does without. */
#ifndef DIVERGE_COMMON_GITREF_H
#define DIVERGE_COMMON_GITREF_H

#include <stddef.h>

#define GITREF_OID_HEX 40 /* SHA-1 object ids; a repository of another format answers -1 */
/* The bytes of packed-refs the readers look through for a branch (every tag of a large
 * repository fits) before they ask git instead. */
#define GITREF_PACKED_MAX (64 * 1024 * 1024)

/* The object id the ref REF ("refs/heads/<branch>") of the git directory GITDIR (a bare
 * repository, or a work tree's .git) points at, into OID (may be NULL). Reads at most
 * PACKED_MAX bytes of packed-refs. Returns 1 found, 0 absent, -1 when the files cannot
 * tell (unreadable, a symbolic link, a ref file that is not one SHA-1 id, packed-refs
 * over the cap before REF was found, a REF that is not a plain name under refs/, a
 * reftable repository). */
int gitref_read(char oid[GITREF_OID_HEX + 1], const char *gitdir, const char *ref,
                size_t packed_max);

/* The git directory of the repository a file:// URL names, as git's local transport finds
 * it (PATH/.git, else PATH), when it is plainly one: a folder with a regular HEAD, reached
 * without a symbolic link at its end. NULL (the caller asks git) for any other URL: another
 * scheme, a host or relative path, a %-escape, a .git that is a file or a link. Free it. */
char *gitref_url_gitdir(const char *url);

#endif
