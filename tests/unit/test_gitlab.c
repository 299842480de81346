/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of scm/gitlab: X-Gitlab-Token rotation, the Standard Webhooks published test
 * vector, GitLab's naming rules, Note Hook parsing of the real fixtures (one with a
 * duplicate key) and variants, and note bodies (no lone emoji, middle cut). */
#include <stdio.h>
#include <stdlib.h>

#include <jansson.h>

#include "scm/gitlab/gitlab.h"
#include "tests/t_check.h"

/* From https://github.com/standard-webhooks/standard-webhooks (spec test vector). */
#define SW_SECRET "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
#define SW_ID "msg_p5jXN8AQM9LWM0D4loKWxJek"
#define SW_TS "1614265330"
#define SW_BODY "{\"test\": 2432232314}"
#define SW_SIG "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
#define SW_NOW 1614265330

TEST(token_rotation)
{
    CHECK_OK(gitlab_token_verify("tok", "tok", NULL));
    CHECK_OK(gitlab_token_verify("old,tok", "tok", NULL));
    CHECK_OK(gitlab_token_verify("old,tok", "old", NULL));
    CHECK_EQ_INT(gitlab_token_verify("old,tok", "to", NULL), E_DENIED);
    CHECK_EQ_INT(gitlab_token_verify("old,tok", "tokk", NULL), E_DENIED);
    CHECK_EQ_INT(gitlab_token_verify("old,tok", "", NULL), E_DENIED);
    CHECK_EQ_INT(gitlab_token_verify("old,tok", "old,tok", NULL), E_DENIED);
    CHECK_EQ_INT(gitlab_token_verify("old,,", "", NULL), E_DENIED);
    CHECK_EQ_INT(gitlab_token_verify("tok", NULL, NULL), E_DENIED);
    CHECK_EQ_INT(gitlab_token_verify(NULL, "tok", NULL), E_DENIED);
}

TEST(standard_webhooks_vector)
{
    const char *b = SW_BODY;
    size_t n = strlen(b);

    CHECK_OK(gitlab_sig_verify(SW_SECRET, SW_ID, SW_TS, SW_SIG, b, n, SW_NOW, NULL));
    /* Rotation: any configured secret; several signatures: any of them. */
    CHECK_OK(gitlab_sig_verify("whsec_b2xkLXNlY3JldA==," SW_SECRET, SW_ID, SW_TS, SW_SIG, b, n,
                               SW_NOW, NULL));
    CHECK_OK(
        gitlab_sig_verify(SW_SECRET, SW_ID, SW_TS, "v1,bm9wZQ== v2,x " SW_SIG, b, n, SW_NOW, NULL));
    /* The window is +-300 s. */
    CHECK_OK(gitlab_sig_verify(SW_SECRET, SW_ID, SW_TS, SW_SIG, b, n, SW_NOW + 300, NULL));
    CHECK_OK(gitlab_sig_verify(SW_SECRET, SW_ID, SW_TS, SW_SIG, b, n, SW_NOW - 300, NULL));
    CHECK_EQ_INT(gitlab_sig_verify(SW_SECRET, SW_ID, SW_TS, SW_SIG, b, n, SW_NOW + 301, NULL),
                 E_DENIED);
    CHECK_EQ_INT(gitlab_sig_verify(SW_SECRET, SW_ID, SW_TS, SW_SIG, b, n, SW_NOW - 301, NULL),
                 E_DENIED);
    /* Anything changed. */
    CHECK_EQ_INT(gitlab_sig_verify(SW_SECRET, "msg_other", SW_TS, SW_SIG, b, n, SW_NOW, NULL),
                 E_DENIED);
    CHECK_EQ_INT(gitlab_sig_verify(SW_SECRET, SW_ID, "1614265331", SW_SIG, b, n, SW_NOW, NULL),
                 E_DENIED);
    CHECK_EQ_INT(gitlab_sig_verify(SW_SECRET, SW_ID, SW_TS, SW_SIG, b, n - 1, SW_NOW, NULL),
                 E_DENIED);
    CHECK_EQ_INT(
        gitlab_sig_verify("whsec_b2xkLXNlY3JldA==", SW_ID, SW_TS, SW_SIG, b, n, SW_NOW, NULL),
        E_DENIED);
    CHECK_EQ_INT(gitlab_sig_verify(SW_SECRET, SW_ID, SW_TS,
                                   "v2,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", b, n, SW_NOW,
                                   NULL),
                 E_DENIED);
    CHECK_EQ_INT(gitlab_sig_verify(SW_SECRET, SW_ID, "16142653x0", SW_SIG, b, n, SW_NOW, NULL),
                 E_DENIED);
    CHECK_EQ_INT(gitlab_sig_verify(SW_SECRET, NULL, SW_TS, SW_SIG, b, n, SW_NOW, NULL), E_DENIED);
    CHECK_EQ_INT(gitlab_sig_verify(SW_SECRET, SW_ID, NULL, SW_SIG, b, n, SW_NOW, NULL), E_DENIED);
    CHECK_EQ_INT(gitlab_sig_verify(SW_SECRET, SW_ID, SW_TS, NULL, b, n, SW_NOW, NULL), E_DENIED);
    CHECK_EQ_INT(gitlab_sig_verify("not-a-secret", SW_ID, SW_TS, SW_SIG, b, n, SW_NOW, NULL),
                 E_DENIED);
    CHECK(gitlab_sig_secrets_valid(SW_SECRET));
    CHECK(gitlab_sig_secrets_valid(SW_SECRET ",whsec_b2xkLXNlY3JldA=="));
    CHECK(!gitlab_sig_secrets_valid("whsec_"));
    CHECK(!gitlab_sig_secrets_valid("whsec_@@@@"));
    CHECK(!gitlab_sig_secrets_valid("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"));
    CHECK(!gitlab_sig_secrets_valid(SW_SECRET ","));
    CHECK(!gitlab_sig_secrets_valid(""));
}

TEST(names)
{
    CHECK(gitlab_valid_project_path("group/sub/project"));
    CHECK(gitlab_valid_project_path("gitlab-org/gitlab-test"));
    CHECK(gitlab_valid_project_path("a_b/c.d/e-f"));
    CHECK(gitlab_valid_project_path("_x/y"));
    CHECK(!gitlab_valid_project_path("a/../b"));
    CHECK(!gitlab_valid_project_path("a/./b"));
    CHECK(!gitlab_valid_project_path(".."));
    CHECK(!gitlab_valid_project_path("a//b"));
    CHECK(!gitlab_valid_project_path("/a/b"));
    CHECK(!gitlab_valid_project_path("a/b/"));
    CHECK(!gitlab_valid_project_path("-a/b"));
    CHECK(!gitlab_valid_project_path("a/.b"));
    CHECK(!gitlab_valid_project_path("a/b."));
    CHECK(!gitlab_valid_project_path("a/b.git"));
    CHECK(!gitlab_valid_project_path("a/b.atom"));
    CHECK(!gitlab_valid_project_path("a/b c"));
    CHECK(!gitlab_valid_project_path("a/b%2Fc"));
    CHECK(!gitlab_valid_project_path("a/b\\c"));
    CHECK(!gitlab_valid_project_path("a/b..c"));
    CHECK(!gitlab_valid_project_path(""));
    {
        char deep[200] = "";
        for (int i = 0; i < 22; i++) {
            strncat(deep, i == 0 ? "a" : "/a", sizeof(deep) - strlen(deep) - 1);
        }
        CHECK(!gitlab_valid_project_path(deep)); /* 22 segments */
    }
    CHECK(gitlab_valid_username("root"));
    CHECK(gitlab_valid_username("project_5_bot_1a2b"));
    CHECK(!gitlab_valid_username("al ice"));
    CHECK(!gitlab_valid_username("@alice"));
    CHECK(!gitlab_valid_username("a/b"));
    CHECK(gitlab_valid_branch("feature/x-1"));
    CHECK(gitlab_valid_branch("main"));
    CHECK(!gitlab_valid_branch("a..b"));
    CHECK(!gitlab_valid_branch("-x"));
    CHECK(!gitlab_valid_branch("x.lock"));
    CHECK(!gitlab_valid_branch("a b"));
    CHECK(!gitlab_valid_branch("a~1"));
    CHECK(!gitlab_valid_branch("a@{1}"));
    CHECK(!gitlab_valid_branch("a\nb"));
    CHECK(!gitlab_valid_branch(""));
}

static char *read_fixture(const char *name, size_t *len)
{
    const char *src = getenv("DIVERGE_SOURCE_DIR");
    char *path = xasprintf("%s/tests/fixtures/gitlab/%s", src != NULL ? src : ".", name);
    FILE *f = fopen(path, "rb");
    char *data = NULL;

    free(path);
    if (f == NULL) {
        return NULL;
    }
    data = xmalloc(1 << 20);
    *len = fread(data, 1, (1 << 20) - 1, f);
    data[*len] = '\0';
    fclose(f);
    return data;
}

/* The fixture NAME with its note text replaced by NOTE (bytes otherwise unchanged). */
static char *fixture_with_note(const char *name, const char *note, size_t *len)
{
    size_t n = 0;
    char *data = read_fixture(name, &n), *at, *out;
    const char *old = "This MR needs work.";

    if (data == NULL || (at = strstr(data, old)) == NULL) {
        free(data);
        return NULL;
    }
    out = xasprintf("%.*s%s%s", (int)(at - data), data, note, at + strlen(old));
    free(data);
    *len = strlen(out);
    return out;
}

TEST(fixtures_parse)
{
    static const struct {
        const char *file, *project, *head, *clone;
        int64_t uid;
    } cases[] = {
        {"note_hook.merge_request.gitlab-docs.json", "gitlab-org/gitlab-test", "master",
         "http://example.com/gitlab-org/gitlab-test.git", 1},
        /* The duplicate merge_request.source.git_http_url: the last value wins. */
        {"note_hook.merge_request.atlantis.json", "gitlabhq/gitlab-test", "main",
         "https://example.com/gitlab-org/gitlab-test.git", 1},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t len = 0;
        char *data = fixture_with_note(cases[i].file, "/diverge fix it", &len);
        enum gitlab_event ev;
        struct inbox_entry e;
        const char *why = NULL;
        json_t *x;

        if (data == NULL) {
            t_fail(__FILE__, __LINE__, "cannot read fixture %s", cases[i].file);
            continue;
        }
        CHECK_OK(
            gitlab_webhook_parse(&ev, &e, &why, "Note Hook", "d-1", "uuid-1", data, len, NULL));
        CHECK_EQ_INT(ev, GITLAB_EVENT_NOTE);
        CHECK_EQ_STR(e.provider, "gitlab");
        CHECK_EQ_STR(e.project, cases[i].project);
        CHECK_EQ_INT(e.number, 1);
        CHECK_EQ_STR(e.comment_id, "1244");
        CHECK_EQ_STR(e.author, "root");
        CHECK_EQ_INT(e.author_id, cases[i].uid);
        CHECK_EQ_STR(e.body, "/diverge fix it");
        CHECK_EQ_STR(e.delivery_id, "d-1");
        x = json_loads(e.extra != NULL ? e.extra : "", 0, NULL);
        CHECK_EQ_STR(json_string_value(json_object_get(x, "head_ref")), cases[i].head);
        CHECK_EQ_STR(json_string_value(json_object_get(x, "base_ref")), "markdown");
        CHECK_EQ_STR(json_string_value(json_object_get(x, "clone_url")), cases[i].clone);
        CHECK_EQ_STR(json_string_value(json_object_get(x, "event_uuid")), "uuid-1");
        json_decref(x);
        inbox_entry_cleanup(&e);
        free(data);
    }
}

TEST(duplicate_key_last_wins)
{
    size_t len = 0;
    char *data =
        fixture_with_note("note_hook.merge_request.atlantis.json", "/diverge fix it", &len);
    const char *dup = "\"http_url\":\"https://example.com/gitlab-org/gitlab-test.git\",\n"
                      "      \"git_http_url\":\"https://example.com/gitlab-org/gitlab-test.git\"";
    char *at = data != NULL ? strstr(data, dup) : NULL, *v;
    enum gitlab_event ev;
    struct inbox_entry e;
    const char *why = NULL;
    json_t *x;

    if (at == NULL) {
        t_fail(__FILE__, __LINE__, "the atlantis fixture lost its duplicate key");
        free(data);
        return;
    }
    /* The second (last) merge_request.source.git_http_url gets another value. */
    v = xasprintf("%.*s\"http_url\":\"x\",\n      "
                  "\"git_http_url\":\"https://example.com/last/wins.git\"%s",
                  (int)(at - data), data, at + strlen(dup));
    CHECK_OK(gitlab_webhook_parse(&ev, &e, &why, "Note Hook", NULL, NULL, v, strlen(v), NULL));
    CHECK_EQ_INT(ev, GITLAB_EVENT_NOTE);
    x = json_loads(e.extra != NULL ? e.extra : "", 0, NULL);
    CHECK_EQ_STR(json_string_value(json_object_get(x, "clone_url")),
                 "https://example.com/last/wins.git");
    json_decref(x);
    inbox_entry_cleanup(&e);
    free(v);
    free(data);
}

/* The docs fixture with REPLACE (a JSON fragment of object_attributes) spliced in after
 * its "object_attributes": { — later keys of the same name win over it, so the fragment
 * replaces nothing present later; used for keys the fixture does not set later. */
static int parse_variant(enum gitlab_event *ev, const char *event, const char *from, const char *to)
{
    size_t len = 0;
    char *data =
        fixture_with_note("note_hook.merge_request.gitlab-docs.json", "/diverge help", &len);
    char *at = data != NULL ? strstr(data, from) : NULL, *v;
    struct inbox_entry e;
    const char *why = NULL;
    int rc;

    if (at == NULL) {
        free(data);
        return -1;
    }
    v = xasprintf("%.*s%s%s", (int)(at - data), data, to, at + strlen(from));
    rc = gitlab_webhook_parse(ev, &e, &why, event, NULL, NULL, v, strlen(v), NULL);
    if (rc == E_OK && *ev == GITLAB_EVENT_NOTE) {
        inbox_entry_cleanup(&e);
    }
    free(v);
    free(data);
    return rc;
}

TEST(note_rules)
{
    enum gitlab_event ev;

    CHECK_OK(parse_variant(&ev, "Note Hook", "\"action\": \"create\"", "\"action\": \"create\""));
    CHECK_EQ_INT(ev, GITLAB_EVENT_NOTE);
    CHECK_OK(parse_variant(&ev, "Note Hook", "\"action\": \"create\"", "\"action\": \"update\""));
    CHECK_EQ_INT(ev, GITLAB_EVENT_IGNORED);
    CHECK_OK(parse_variant(&ev, "Note Hook", "\"system\": false", "\"system\": true"));
    CHECK_EQ_INT(ev, GITLAB_EVENT_IGNORED);
    CHECK_OK(parse_variant(&ev, "Note Hook", "\"noteable_type\": \"MergeRequest\"",
                           "\"noteable_type\": \"Issue\""));
    CHECK_EQ_INT(ev, GITLAB_EVENT_IGNORED);
    CHECK_OK(
        parse_variant(&ev, "Confidential Note Hook", "\"system\": false", "\"system\": false"));
    CHECK_EQ_INT(ev, GITLAB_EVENT_IGNORED);
    CHECK_OK(parse_variant(&ev, "Push Hook", "\"system\": false", "\"system\": false"));
    CHECK_EQ_INT(ev, GITLAB_EVENT_IGNORED);
    /* Missing or invalid fields: 400. */
    CHECK_EQ_INT(parse_variant(&ev, "Note Hook", "\"iid\": 1", "\"iid\": 0"), E_INVALID);
    CHECK_EQ_INT(parse_variant(&ev, "Note Hook", "\"iid\": 1", "\"iid\": \"1\""), E_INVALID);
    CHECK_EQ_INT(
        parse_variant(&ev, "Note Hook", "\"username\": \"root\"", "\"username\": \"ro ot\""),
        E_INVALID);
    CHECK_EQ_INT(parse_variant(&ev, "Note Hook",
                               "\"path_with_namespace\":\"gitlab-org/gitlab-test\"",
                               "\"path_with_namespace\":\"gitlab-org/../x\""),
                 E_INVALID);
    CHECK_EQ_INT(parse_variant(&ev, "Note Hook", "\"source_branch\": \"master\"",
                               "\"source_branch\": \"-x\""),
                 E_INVALID);
    CHECK_EQ_INT(
        parse_variant(&ev, "Note Hook", "\"object_kind\": \"note\"", "\"object_kind\": \"push\""),
        E_INVALID);
    CHECK_EQ_INT(parse_variant(&ev, "Note Hook", "\"object_kind\": \"note\"", "\"object_kind\": ["),
                 E_INVALID);
    CHECK_EQ_INT(parse_variant(&ev, NULL, "\"system\": false", "\"system\": false"), E_INVALID);
}

TEST(lone_emoji_never_sent)
{
    char *s;

    CHECK(gitlab_note_is_award(":thumbsup:"));
    CHECK(gitlab_note_is_award("  :+1:\n"));
    CHECK(gitlab_note_is_award("\xf0\x9f\x91\x8d"));                 /* thumbs up */
    CHECK(gitlab_note_is_award("\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd")); /* with a skin tone */
    CHECK(gitlab_note_is_award("1\xef\xb8\x8f\xe2\x83\xa3"));        /* keycap one */
    CHECK(!gitlab_note_is_award("ok :+1:"));
    CHECK(!gitlab_note_is_award("\xf0\x9f\x91\x8d done"));
    CHECK(!gitlab_note_is_award("12"));
    CHECK(!gitlab_note_is_award(""));
    CHECK(!gitlab_note_is_award("::"));
    s = gitlab_note_fit(":+1:", GITLAB_NOTE_MAX);
    CHECK(!gitlab_note_is_award(s));
    free(s);
    s = gitlab_note_fit("fine", GITLAB_NOTE_MAX);
    CHECK_EQ_STR(s, "fine");
    free(s);
}

TEST(no_quick_actions)
{
    char *s = gitlab_note_fit("/merge\nok /close\n/approve me\r\n/unassign", GITLAB_NOTE_MAX);

    CHECK_EQ_STR(s, "\\/merge\nok /close\n\\/approve me\r\n\\/unassign");
    free(s);
}

TEST(long_note_cut_in_the_middle)
{
    size_t n = 3 * 1000 * 1000;
    char *big = xmalloc(n + 1), *s;

    /* "é" (2 bytes) everywhere, "HEAD" first and "TAIL" last. */
    for (size_t i = 0; i < n; i += 2) {
        big[i] = (char)0xc3;
        big[i + 1] = (char)0xa9;
    }
    memcpy(big, "HEAD", 4);
    memcpy(big + n - 4, "TAIL", 4);
    big[n] = '\0';
    s = gitlab_note_fit(big, GITLAB_NOTE_MAX);
    CHECK(strlen(s) <= GITLAB_NOTE_MAX);
    CHECK(strlen(s) > GITLAB_NOTE_MAX - 100);
    CHECK(strncmp(s, "HEAD", 4) == 0);
    CHECK(strcmp(s + strlen(s) - 4, "TAIL") == 0);
    CHECK(strstr(s, "cut") != NULL);
    /* Valid UTF-8 at the seams: no lone continuation byte after an ASCII byte. */
    for (size_t i = 1; s[i] != '\0'; i++) {
        if (((unsigned char)s[i] & 0xC0) == 0x80) {
            CHECK(((unsigned char)s[i - 1] & 0x80) != 0);
        }
    }
    free(s);
    free(big);
}

TEST(level_names)
{
    CHECK_EQ_STR(scm_level_name_for("gitlab", SCM_LEVEL_WRITE), "Developer (30)");
    CHECK_EQ_STR(scm_level_name_for("gitlab", SCM_LEVEL_MAINTAIN), "Maintainer (40)");
    CHECK_EQ_STR(scm_level_name_for("gitlab", SCM_LEVEL_NONE), "no access (0)");
    CHECK_EQ_STR(scm_level_name_for("github", SCM_LEVEL_WRITE), "write");
}

T_MAIN
