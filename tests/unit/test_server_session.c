/* SPDX-License-Identifier: Apache-2.0 */
/* Dashboard login sessions (server/ui_session.c): random ids that are not guessable from
 * one another, valid until they expire after 12 hours or end, at most UI_SESSIONS_MAX at
 * once (the oldest login goes first), malformed ids refused. */
#include <string.h>

#include "server/api/api_int.h"
#include "tests/t_check.h"

#define HOUR_MS (3600LL * 1000)

TEST(a_login_is_valid_until_it_expires)
{
    struct ui_sessions *s;
    char id[UI_SESSION_ID_LEN + 1], other[UI_SESSION_ID_LEN + 1];

    ui_sessions_new(&s);
    ui_session_create(id, s, 1000);
    ui_session_create(other, s, 1000);
    CHECK_EQ_INT((int)strlen(id), UI_SESSION_ID_LEN);
    CHECK(strspn(id, "0123456789abcdef") == UI_SESSION_ID_LEN);
    CHECK(strcmp(id, other) != 0);
    CHECK(ui_session_valid(s, id, 1000));
    CHECK(ui_session_valid(s, id, 1000 + 12 * HOUR_MS - 1));
    CHECK(!ui_session_valid(s, id, 1000 + 12 * HOUR_MS));
    CHECK(!ui_session_end(s, id, 1000 + 12 * HOUR_MS)); /* expired: nothing to end */
    ui_sessions_free(s);
}

TEST(logout_ends_only_that_session)
{
    struct ui_sessions *s;
    char a[UI_SESSION_ID_LEN + 1], b[UI_SESSION_ID_LEN + 1];

    ui_sessions_new(&s);
    ui_session_create(a, s, 0);
    ui_session_create(b, s, 0);
    CHECK(ui_session_end(s, a, 5));
    CHECK(!ui_session_valid(s, a, 5));
    CHECK(!ui_session_end(s, a, 5));
    CHECK(ui_session_valid(s, b, 5));
    ui_sessions_free(s);
}

TEST(malformed_or_unknown_ids_are_refused)
{
    struct ui_sessions *s;
    char id[UI_SESSION_ID_LEN + 1], wrong[UI_SESSION_ID_LEN + 2];

    ui_sessions_new(&s);
    ui_session_create(id, s, 0);
    CHECK(!ui_session_valid(s, NULL, 0));
    CHECK(!ui_session_valid(s, "", 0));
    memcpy(wrong, id, sizeof(id));
    wrong[UI_SESSION_ID_LEN - 1] = '\0'; /* a prefix */
    CHECK(!ui_session_valid(s, wrong, 0));
    memcpy(wrong, id, sizeof(id));
    wrong[UI_SESSION_ID_LEN] = 'a'; /* longer */
    wrong[UI_SESSION_ID_LEN + 1] = '\0';
    CHECK(!ui_session_valid(s, wrong, 0));
    memcpy(wrong, id, sizeof(id));
    wrong[0] = wrong[0] == '0' ? '1' : '0';
    CHECK(!ui_session_valid(s, wrong, 0));
    CHECK(!ui_session_valid(NULL, id, 0));
    ui_sessions_free(s);
    ui_sessions_free(NULL);
}

TEST(the_oldest_login_goes_when_the_table_is_full)
{
    struct ui_sessions *s;
    char first[UI_SESSION_ID_LEN + 1], second[UI_SESSION_ID_LEN + 1], id[UI_SESSION_ID_LEN + 1];

    ui_sessions_new(&s);
    ui_session_create(first, s, 0);
    ui_session_create(second, s, 1);
    for (int i = 2; i < UI_SESSIONS_MAX; i++) {
        ui_session_create(id, s, 2 + i);
    }
    CHECK(ui_session_valid(s, first, 1000));
    ui_session_create(id, s, 1000); /* one too many */
    CHECK(!ui_session_valid(s, first, 1000));
    CHECK(ui_session_valid(s, second, 1000));
    CHECK(ui_session_valid(s, id, 1000));
    ui_sessions_free(s);
}

T_MAIN
