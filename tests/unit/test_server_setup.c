/* SPDX-License-Identifier: Apache-2.0 */
/* The state values of the one-click GitHub App (server/api/setup/setup_state.c): random,
 * bound to the session they were made for, used once, expiring after an hour, at most
 * GH_SETUP_STATES_MAX (the oldest goes first); one callback at a time. */
#include <string.h>

#include "server/api/api_int.h"
#include "tests/t_check.h"

#define SESSION_A "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define SESSION_B "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"

TEST(a_state_is_bound_used_once_and_expires)
{
    struct gh_setup *s;
    char st[GH_SETUP_STATE_LEN + 1], other[GH_SETUP_STATE_LEN + 1];

    gh_setup_new(&s);
    gh_setup_state_create(st, s, SESSION_A, 1000);
    gh_setup_state_create(other, s, "", 1000);
    CHECK_EQ_INT((int)strlen(st), GH_SETUP_STATE_LEN);
    CHECK(strspn(st, "0123456789abcdef") == GH_SETUP_STATE_LEN);
    CHECK(strcmp(st, other) != 0);
    CHECK(!gh_setup_state_take(s, st, SESSION_B, 1000)); /* another session */
    CHECK(!gh_setup_state_take(s, st, "", 1000));        /* the bearer header */
    CHECK(!gh_setup_state_take(s, other, SESSION_A, 1000));
    CHECK(!gh_setup_state_take(s, NULL, SESSION_A, 1000));
    CHECK(!gh_setup_state_take(s, "abc", SESSION_A, 1000));
    CHECK(gh_setup_state_take(s, st, SESSION_A, 1000 + GH_SETUP_STATE_TTL_MS - 1));
    CHECK(!gh_setup_state_take(s, st, SESSION_A, 1000));                     /* used */
    CHECK(!gh_setup_state_take(s, other, "", 1000 + GH_SETUP_STATE_TTL_MS)); /* expired */
    gh_setup_free(s);
    gh_setup_free(NULL);
}

TEST(a_short_binding_does_not_match_a_leftover)
{
    struct gh_setup *s;
    char st[GH_SETUP_STATE_LEN + 1];

    gh_setup_new(&s);
    /* Fill every slot with a long binding, then reuse them with the empty one. */
    for (int i = 0; i < GH_SETUP_STATES_MAX; i++) {
        gh_setup_state_create(st, s, SESSION_A, 1000);
    }
    gh_setup_state_create(st, s, "", 2000);
    CHECK(!gh_setup_state_take(s, st, SESSION_A, 2000));
    CHECK(gh_setup_state_take(s, st, "", 2000));
    gh_setup_free(s);
}

TEST(the_oldest_state_goes_when_the_table_is_full)
{
    struct gh_setup *s;
    char first[GH_SETUP_STATE_LEN + 1], st[GH_SETUP_STATE_LEN + 1];

    gh_setup_new(&s);
    gh_setup_state_create(first, s, "", 1000);
    for (int i = 0; i < GH_SETUP_STATES_MAX; i++) {
        gh_setup_state_create(st, s, "", 2000 + i);
    }
    CHECK(!gh_setup_state_take(s, first, "", 3000));
    CHECK(gh_setup_state_take(s, st, "", 3000));
    gh_setup_free(s);
}

TEST(one_callback_at_a_time)
{
    struct gh_setup *s;

    gh_setup_new(&s);
    CHECK(gh_setup_begin(s));
    CHECK(!gh_setup_begin(s));
    gh_setup_end(s);
    CHECK(gh_setup_begin(s));
    gh_setup_end(s);
    gh_setup_free(s);
}

T_MAIN
