/* SPDX-License-Identifier: Apache-2.0 */
/* The parsers of the git smart HTTP endpoint (server/api_git_pkt.c): the repository path
 * segment, the Authorization header (Bearer, or Basic with any user), and the ref updates
 * of a receive-pack request (only a create or update of refs/heads/<workingBranch>; no
 * delete, no other ref, no shallow or signed push; malformed pkt-lines refused). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/api/git/api_git.h"
#include "server/api/api_int.h"
#include "tests/t_check.h"

#define OID_A "1111111111111111111111111111111111111111"
#define OID_B "2222222222222222222222222222222222222222"
#define ZERO "0000000000000000000000000000000000000000"

/* One pkt-line of S (with its 4-hex length) appended to B. */
static void pkt(struct buf *b, const char *s, size_t n)
{
    char len[20];

    snprintf(len, sizeof(len), "%04zx", n + 4);
    ASSERT(n + 4 <= 0xffff);
    (void)buf_append(b, len, 4);
    (void)buf_append(b, s, n);
}

static int check(const char *const *lines, const char *working)
{
    struct buf b;
    struct err err = {0};
    int rc;

    buf_init(&b, 0);
    for (size_t i = 0; lines[i] != NULL; i++) {
        pkt(&b, lines[i],
            strlen(lines[i]) + (i == 0 ? strlen(lines[i] + strlen(lines[i]) + 1) + 1 : 0));
    }
    (void)buf_append(&b, "0000PACK....", 12);
    rc = api_git_check_push(b.data, b.len, working, &err);
    CHECK(rc == E_OK || (err.msg[0] != '\0' && strstr(err.msg, "refs/heads/other") == NULL));
    buf_cleanup(&b);
    return rc;
}

TEST(push_of_the_working_branch_is_accepted)
{
    /* The first line carries capabilities after a NUL (the literal holds both halves). */
    const char *create[] = {ZERO " " OID_A " refs/heads/agent/t1\0report-status side-band-64k",
                            NULL};
    const char *update[] = {OID_A " " OID_B " refs/heads/agent/t1\0report-status", NULL};
    const char *plain[] = {OID_A " " OID_B " refs/heads/agent/t1\0", NULL};

    CHECK_OK(check(create, "agent/t1"));
    CHECK_OK(check(update, "agent/t1"));
    CHECK_OK(check(plain, "agent/t1"));
}

TEST(push_of_anything_else_is_refused)
{
    const char *other[] = {ZERO " " OID_A " refs/heads/other\0report-status", NULL};
    const char *prefix[] = {ZERO " " OID_A " refs/heads/agent/t1x\0", NULL};
    const char *shorter[] = {ZERO " " OID_A " refs/heads/agent/t\0", NULL};
    const char *tag[] = {ZERO " " OID_A " refs/tags/agent/t1\0", NULL};
    const char *del[] = {OID_A " " ZERO " refs/heads/agent/t1\0report-status", NULL};
    const char *second[] = {ZERO " " OID_A " refs/heads/agent/t1\0",
                            ZERO " " OID_A " refs/heads/main", NULL};
    const char *shallow[] = {"shallow " OID_A "\0", NULL};
    const char *cert[] = {"push-cert\0report-status", NULL};
    const char *bad_hex[] = {ZERO " 11111111111111111111111111111111111111zz refs/heads/agent/t1\0",
                             NULL};

    CHECK_EQ_INT(check(other, "agent/t1"), E_DENIED);
    CHECK_EQ_INT(check(prefix, "agent/t1"), E_DENIED);
    CHECK_EQ_INT(check(shorter, "agent/t1"), E_DENIED);
    CHECK_EQ_INT(check(tag, "agent/t1"), E_DENIED);
    CHECK_EQ_INT(check(del, "agent/t1"), E_DENIED);
    CHECK_EQ_INT(check(second, "agent/t1"), E_DENIED);
    CHECK_EQ_INT(check(shallow, "agent/t1"), E_DENIED);
    CHECK_EQ_INT(check(cert, "agent/t1"), E_DENIED);
    CHECK_EQ_INT(check(bad_hex, "agent/t1"), E_INVALID);
    CHECK_EQ_INT(check(other, ""), E_DENIED);
}

TEST(malformed_pkt_lines_are_refused)
{
    struct err err = {0};

    CHECK_EQ_INT(api_git_check_push("", 0, "w", &err), E_INVALID);
    CHECK_EQ_INT(api_git_check_push("0000", 4, "w", &err), E_INVALID); /* no command */
    CHECK_EQ_INT(api_git_check_push("00", 2, "w", &err), E_INVALID);
    CHECK_EQ_INT(api_git_check_push("zzzz", 4, "w", &err), E_INVALID);
    CHECK_EQ_INT(api_git_check_push("0003", 4, "w", &err), E_INVALID);
    CHECK_EQ_INT(api_git_check_push("00ff" ZERO, 44, "w", &err), E_INVALID); /* truncated */
    CHECK_EQ_INT(api_git_check_push("0030" ZERO " 1234", 0x30, "w", &err), E_INVALID);
    /* No flush after the commands. */
    CHECK_EQ_INT(api_git_check_push("0063" ZERO " " OID_A " refs/heads/w\n", 0x63, "w", &err),
                 E_INVALID);
}

TEST(repo_path_segment)
{
    char name[API_GIT_NAME_MAX + 1];
    char big[API_GIT_NAME_MAX + 10];
    struct err err = {0};

    CHECK_OK(api_git_repo_name(name, "task-1.git", &err));
    CHECK_EQ_STR(name, "task-1");
    CHECK_EQ_INT(api_git_repo_name(name, ".git", &err), E_INVALID);
    CHECK_EQ_INT(api_git_repo_name(name, "task", &err), E_INVALID);
    CHECK_EQ_INT(api_git_repo_name(name, "..git", &err), E_INVALID);
    CHECK_EQ_INT(api_git_repo_name(name, "a..b.git", &err), E_INVALID);
    CHECK_EQ_INT(api_git_repo_name(name, "Task.git", &err), E_INVALID);
    CHECK_EQ_INT(api_git_repo_name(name, "a%2f.git", &err), E_INVALID);
    CHECK_EQ_INT(api_git_repo_name(name, "-a.git", &err), E_INVALID);
    memset(big, 'a', sizeof(big) - 5);
    memcpy(big + sizeof(big) - 5, ".git", 5);
    CHECK_EQ_INT(api_git_repo_name(name, big, &err), E_INVALID);
    CHECK(api_git_name_ok("default"));
    CHECK(!api_git_name_ok(""));
    CHECK(!api_git_name_ok("a/b"));
}

TEST(authorization_header)
{
    char *t;

    t = api_git_auth_token("Bearer abc.DEF_-");
    CHECK_EQ_STR(t, "abc.DEF_-");
    free(t);
    t = api_git_auth_token("Basic eDp0b2tlbg=="); /* x:token */
    CHECK_EQ_STR(t, "token");
    free(t);
    t = api_git_auth_token("basic eDp0b2tlbg"); /* unpadded */
    CHECK_EQ_STR(t, "token");
    free(t);
    CHECK(api_git_auth_token(NULL) == NULL);
    CHECK(api_git_auth_token("Bearer ") == NULL);
    CHECK(api_git_auth_token("Bearer a b") == NULL);
    CHECK(api_git_auth_token("Basic !!!") == NULL);
    CHECK(api_git_auth_token("Basic dG9rZW4=") == NULL); /* no colon */
    CHECK(api_git_auth_token("Basic eDo=") == NULL);     /* empty password */
    CHECK(api_git_auth_token("Token abc") == NULL);
}

T_MAIN
