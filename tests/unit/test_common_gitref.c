/* SPDX-License-Identifier: Apache-2.0 */
/* Reading a branch from a git directory's files (common/gitref.c) as hostile input: the
 * loose ref wins over packed-refs, packed-refs lines are believed only whole, a symbolic
 * link anywhere below the directory, a ref file that is not one SHA-1 id, a cap passed
 * and a name that is not plain all answer -1 (the caller then asks git). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/gitref.h"
#include "tests/t_check.h"

#define A "1111111111111111111111111111111111111111"
#define B "2222222222222222222222222222222222222222"

static char *repo(void)
{
    char tmpl[] = "/tmp/diverge-gitref-XXXXXX";
    char *dir = xstrdup(mkdtemp(tmpl));
    char *p = xasprintf("%s/refs/heads/diverge/wip", dir);
    char *cmd = xasprintf("mkdir -p '%s'", p);

    ASSERT(system(cmd) == 0);
    free(cmd);
    free(p);
    return dir;
}

static void put(const char *dir, const char *name, const char *text)
{
    char *path = xasprintf("%s/%s", dir, name);
    FILE *f = fopen(path, "w");

    ASSERT(f != NULL);
    fputs(text, f);
    fclose(f);
    free(path);
}

static void drop(char *dir)
{
    char *cmd = xasprintf("rm -rf '%s'", dir);

    ASSERT(system(cmd) == 0);
    free(cmd);
    free(dir);
}

TEST(loose_ref_then_packed_refs)
{
    char *dir = repo();
    char oid[GITREF_OID_HEX + 1];

    CHECK_EQ_INT(gitref_read(oid, dir, "refs/heads/main", 1 << 20), 0); /* no packed-refs */
    put(dir, "packed-refs",
        "# pack-refs with: peeled fully-peeled sorted \n" A " refs/heads/main\n^" B "\n" B
        " refs/heads/feature\n");
    CHECK_EQ_INT(gitref_read(oid, dir, "refs/heads/main", 1 << 20), 1);
    CHECK_EQ_STR(oid, A);
    CHECK_EQ_INT(gitref_read(oid, dir, "refs/heads/feature", 1 << 20), 1);
    CHECK_EQ_STR(oid, B);
    CHECK_EQ_INT(gitref_read(NULL, dir, "refs/heads/feat", 1 << 20), 0);
    put(dir, "refs/heads/main", B "\n"); /* the loose ref is newer than the packed one */
    CHECK_EQ_INT(gitref_read(oid, dir, "refs/heads/main", 1 << 20), 1);
    CHECK_EQ_STR(oid, B);
    put(dir, "refs/heads/diverge/wip/t", A "\n");
    CHECK_EQ_INT(gitref_read(NULL, dir, "refs/heads/diverge/wip/t", 1 << 20), 1);
    drop(dir);
}

TEST(hostile_files_and_names_cannot_tell)
{
    char *dir = repo();
    char *link = NULL;

    put(dir, "refs/heads/sym", "ref: refs/heads/main\n"); /* a symbolic ref */
    CHECK_EQ_INT(gitref_read(NULL, dir, "refs/heads/sym", 1 << 20), -1);
    put(dir, "refs/heads/long", A "\n" A "\n");
    CHECK_EQ_INT(gitref_read(NULL, dir, "refs/heads/long", 1 << 20), -1);
    put(dir, "refs/heads/sha256", A B "\n");
    CHECK_EQ_INT(gitref_read(NULL, dir, "refs/heads/sha256", 1 << 20), -1);
    link = xasprintf("%s/refs/heads/out", dir);
    ASSERT(symlink("/etc/hostname", link) == 0);
    CHECK_EQ_INT(gitref_read(NULL, dir, "refs/heads/out", 1 << 20), -1);
    free(link);
    link = xasprintf("%s/refs/heads/x", dir); /* a link in the middle of the path */
    ASSERT(symlink("/tmp", link) == 0);
    CHECK_EQ_INT(gitref_read(NULL, dir, "refs/heads/x/y", 1 << 20), -1);
    free(link);
    CHECK_EQ_INT(gitref_read(NULL, dir, "refs/heads/../../etc", 1 << 20), -1);
    CHECK_EQ_INT(gitref_read(NULL, dir, "HEAD", 1 << 20), -1);
    CHECK_EQ_INT(gitref_read(NULL, dir, "refs/heads/a b", 1 << 20), -1);
    drop(dir);
}

TEST(a_reftable_repository_cannot_tell_absent)
{
    char *dir = repo();
    char *tables = xasprintf("%s/reftable", dir);

    put(dir, "packed-refs", A " refs/heads/main\n");
    ASSERT(mkdir(tables, 0700) == 0);
    /* Its refs are in reftable/: neither "absent" nor a stale packed-refs is an answer. */
    CHECK_EQ_INT(gitref_read(NULL, dir, "refs/heads/other", 1 << 20), -1);
    CHECK_EQ_INT(gitref_read(NULL, dir, "refs/heads/main", 1 << 20), -1);
    free(tables);
    drop(dir);
}

TEST(a_file_url_names_its_git_directory_as_git_finds_it)
{
    char *dir = repo(), *url, *got, *work, *dotgit, *cmd;

    url = xasprintf("file://%s", dir);
    CHECK(gitref_url_gitdir(url) == NULL); /* no HEAD: not plainly a repository */
    put(dir, "HEAD", "ref: refs/heads/main\n");
    got = gitref_url_gitdir(url);
    CHECK_EQ_STR(got != NULL ? got : "(null)", dir); /* a bare repository */
    free(got);
    free(url);
    work = xasprintf("%s/work", dir); /* a work tree: its .git first */
    dotgit = xasprintf("%s/.git", work);
    ASSERT(mkdir(work, 0700) == 0 && mkdir(dotgit, 0700) == 0);
    put(dotgit, "HEAD", "ref: refs/heads/main\n");
    url = xasprintf("file://%s", work);
    got = gitref_url_gitdir(url);
    CHECK_EQ_STR(got != NULL ? got : "(null)", dotgit);
    free(got);
    free(url);
    /* What git would resolve otherwise, or another scheme: NULL, git is asked. */
    url = xasprintf("file://%s%%2e", dir);
    CHECK(gitref_url_gitdir(url) == NULL);
    free(url);
    CHECK(gitref_url_gitdir("file://relative/x.git") == NULL);
    CHECK(gitref_url_gitdir("https://example.invalid/x.git") == NULL);
    CHECK(gitref_url_gitdir(NULL) == NULL);
    cmd = xasprintf("rm -rf '%s'", dotgit);
    ASSERT(system(cmd) == 0);
    free(cmd);
    put(work, ".git", "gitdir: /elsewhere\n");
    url = xasprintf("file://%s", work);
    CHECK(gitref_url_gitdir(url) == NULL); /* a .git file git would follow */
    free(url);
    free(dotgit);
    free(work);
    drop(dir);
}

TEST(packed_refs_believed_only_by_whole_lines_within_the_cap)
{
    char *dir = repo();
    char *text, *pad = xmalloc(3000);

    memset(pad, 'z', 2999);
    pad[2999] = '\0';
    /* A line longer than any ref line, whose tail alone would read as a match. */
    text = xasprintf("%s " A " refs/heads/main\n" B " refs/heads/other", pad);
    put(dir, "packed-refs", text);
    CHECK_EQ_INT(gitref_read(NULL, dir, "refs/heads/main", 1 << 20), 0);
    /* The last line has no newline: not believed either. */
    CHECK_EQ_INT(gitref_read(NULL, dir, "refs/heads/other", 1 << 20), 0);
    /* Past the cap before the ref: cannot tell. */
    CHECK_EQ_INT(gitref_read(NULL, dir, "refs/heads/other", 100), -1);
    free(text);
    free(pad);
    drop(dir);
}

T_MAIN
