/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of the one-click GitHub App pieces of scm/github: the manifest's JSON, which
 * codes may go into a URL, and credentials that turn into an App while shared (none or a
 * PAT upgraded in place, references, the JWT of the new App). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "scm/github/github.h"
#include "scm/github/github_auth.h"
#include "tests/t_check.h"
#include "tests/unit/github_auth_fixture.h"

TEST(manifest_json_has_the_fixed_permissions_and_events)
{
    struct github_manifest m = {.name = "diverge-1",
                                .description = "d \"quoted\" <b>",
                                .url = "https://x.test",
                                .hook_url = "https://x.test/api/v1/webhooks/github",
                                .redirect_url = "https://x.test/setup/github-app/callback"};
    char *text = github_manifest_json(&m);
    json_t *doc = json_loads(text, 0, NULL);
    json_t *perm = json_object_get(doc, "default_permissions");
    json_t *ev = json_object_get(doc, "default_events");

    CHECK(doc != NULL);
    CHECK_EQ_STR(json_string_value(json_object_get(doc, "name")), "diverge-1");
    CHECK_EQ_STR(json_string_value(json_object_get(doc, "description")), "d \"quoted\" <b>");
    CHECK_EQ_STR(json_string_value(json_object_get(doc, "url")), "https://x.test");
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(doc, "hook_attributes"), "url")),
                 "https://x.test/api/v1/webhooks/github");
    CHECK(json_is_true(json_object_get(json_object_get(doc, "hook_attributes"), "active")));
    CHECK_EQ_STR(json_string_value(json_object_get(doc, "redirect_url")),
                 "https://x.test/setup/github-app/callback");
    CHECK(json_is_false(json_object_get(doc, "public")));
    CHECK_EQ_INT(json_object_size(perm), 4);
    CHECK_EQ_STR(json_string_value(json_object_get(perm, "issues")), "write");
    CHECK_EQ_STR(json_string_value(json_object_get(perm, "pull_requests")), "write");
    CHECK_EQ_STR(json_string_value(json_object_get(perm, "contents")), "write");
    CHECK_EQ_STR(json_string_value(json_object_get(perm, "metadata")), "read");
    CHECK_EQ_INT(json_array_size(ev), 2);
    CHECK_EQ_STR(json_string_value(json_array_get(ev, 0)), "issue_comment");
    CHECK_EQ_STR(json_string_value(json_array_get(ev, 1)), "pull_request_review_comment");
    json_decref(doc);
    free(text);
}

TEST(only_plain_codes_go_into_a_url)
{
    char longest[GITHUB_MANIFEST_CODE_MAX + 2];

    CHECK(github_manifest_code_valid("a1B2_c3-d4"));
    CHECK(!github_manifest_code_valid(NULL));
    CHECK(!github_manifest_code_valid(""));
    CHECK(!github_manifest_code_valid("../x"));
    CHECK(!github_manifest_code_valid("a b"));
    CHECK(!github_manifest_code_valid("a%2F"));
    CHECK(!github_manifest_code_valid("a?b"));
    memset(longest, 'a', sizeof(longest) - 1);
    longest[GITHUB_MANIFEST_CODE_MAX] = '\0';
    CHECK(github_manifest_code_valid(longest));
    longest[GITHUB_MANIFEST_CODE_MAX] = 'a';
    longest[GITHUB_MANIFEST_CODE_MAX + 1] = '\0';
    CHECK(!github_manifest_code_valid(longest));
}

TEST(convert_refuses_a_bad_code_before_any_request)
{
    struct github_app_grant g;
    struct err err = {0};

    /* Port 9 on loopback: nothing would answer, but nothing is asked either. */
    CHECK_EQ_INT(github_manifest_convert(&g, "http://127.0.0.1:9", "../../x", &err), E_INVALID);
    CHECK(g.id == NULL && g.pem == NULL);
    CHECK_EQ_INT(github_manifest_convert(&g, "http://127.0.0.1:9", "abc", &err), E_AGAIN);
    github_app_grant_cleanup(&g);
}

TEST(none_and_pat_become_an_app_for_every_reference)
{
    int64_t now = T0;
    struct clock c = {fake_now, &now};
    char *key = fixture("key8.pem");
    struct github_auth *a = NULL, *b = NULL;
    struct err err = {0};
    char *hdr = NULL;

    github_auth_new_none(&a);
    CHECK(!github_auth_has_credentials(a) && !github_auth_is_app(a));
    CHECK_EQ_INT(github_auth_header(&hdr, a, 0, &err), E_DENIED);
    CHECK(hdr == NULL);
    b = github_auth_ref(a);
    CHECK(b == a);
    /* A failed upgrade changes nothing. */
    CHECK_EQ_INT(github_auth_use_app(a, NULL, "12 34", key, &c, &err), E_INVALID);
    CHECK_EQ_INT(github_auth_use_app(a, NULL, APP_ID, "/nonexistent.pem", &c, &err), E_NOTFOUND);
    CHECK(!github_auth_has_credentials(b));
    CHECK_OK(github_auth_use_app(a, "http://127.0.0.1:9/", APP_ID, key, &c, &err));
    CHECK(github_auth_is_app(b) && github_auth_has_credentials(b));
    CHECK_OK(github_auth_header(&hdr, b, 0, &err));
    CHECK(hdr != NULL && strncmp(hdr, "Bearer eyJ", 10) == 0);
    free(hdr);
    github_auth_free(a); /* b still holds it */
    CHECK(github_auth_is_app(b));
    github_auth_free(b);

    CHECK_OK(github_auth_new_token(&a, "ghp_x", &err));
    CHECK_OK(github_auth_use_app(a, NULL, APP_ID, key, &c, &err));
    CHECK_OK(github_auth_header(&hdr, a, 0, &err));
    CHECK(hdr != NULL && strcmp(hdr, "Bearer ghp_x") != 0); /* the App's JWT, not the PAT */
    free(hdr);
    github_auth_free(a);
    free(key);
}

T_MAIN
