/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of scm/github webhooks: GitHub's documented signature vector, secret
 * rotation, and parsing of the real fixtures (../shared/fixtures/github). */
#include <stdio.h>
#include <stdlib.h>

#include "scm/github/github.h"
#include "tests/t_check.h"

#define DOC_SECRET "It's a Secret to Everybody"

TEST(documented_signature_vector)
{
    const char *body = "Hello, World!";
    const char *sig = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";

    CHECK_OK(github_webhook_verify(DOC_SECRET, sig, body, strlen(body), NULL));
    CHECK_OK(github_webhook_verify("old-secret," DOC_SECRET, sig, body, strlen(body), NULL));
    CHECK_EQ_INT(github_webhook_verify("old-secret", sig, body, strlen(body), NULL), E_DENIED);
    CHECK_EQ_INT(github_webhook_verify(DOC_SECRET, sig, "Hello, World?", 13, NULL), E_DENIED);
    CHECK_EQ_INT(github_webhook_verify(DOC_SECRET, NULL, body, strlen(body), NULL), E_DENIED);
    CHECK_EQ_INT(github_webhook_verify(DOC_SECRET, "sha1=abc", body, strlen(body), NULL), E_DENIED);
    CHECK_EQ_INT(github_webhook_verify(DOC_SECRET, "sha256=zz", body, strlen(body), NULL), E_DENIED);
    CHECK_EQ_INT(github_webhook_verify("", sig, body, strlen(body), NULL), E_DENIED);
}

static char *read_fixture(const char *name, size_t *len)
{
    const char *src = getenv("DIVERGE_SOURCE_DIR");
    char *path = xasprintf("%s/tests/fixtures/github/%s", src != NULL ? src : ".", name);
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

TEST(fixtures_parse)
{
    static const struct {
        const char *file;
        const char *event;
        enum github_event want;
    } cases[] = {
        {"DERIVED.issue_comment.created.pr.with-installation.json", "issue_comment",
         GITHUB_EVENT_COMMENT},
        {"issue_comment.created.pr.atlantis.json", "issue_comment", GITHUB_EVENT_COMMENT},
        {"issue_comment.created.octokit.json", "issue_comment", GITHUB_EVENT_IGNORED},
        {"issue_comment.edited.octokit.json", "issue_comment", GITHUB_EVENT_IGNORED},
        {"issue_comment.deleted.octokit.json", "issue_comment", GITHUB_EVENT_IGNORED},
        {"DERIVED.issue_comment.edited.pr.with-installation.json", "issue_comment",
         GITHUB_EVENT_IGNORED},
        {"ping.repository.octokit.json", "ping", GITHUB_EVENT_PING},
        {"ping.app.octokit.json", "ping", GITHUB_EVENT_PING},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        size_t len = 0;
        char *data = read_fixture(cases[i].file, &len);
        enum github_event ev;
        struct inbox_entry e;
        const char *why;
        if (data == NULL) {
            t_fail(__FILE__, __LINE__, "cannot read fixture %s", cases[i].file);
            continue;
        }
        CHECK_OK(github_webhook_parse(&ev, &e, &why, cases[i].event, "d-1", data, len, NULL));
        if (ev != cases[i].want) {
            t_fail(__FILE__, __LINE__, "%s: event %d want %d (%s)", cases[i].file, ev,
                   cases[i].want, why);
        }
        if (ev == GITHUB_EVENT_COMMENT) {
            CHECK(e.project != NULL && e.comment_id != NULL && e.author != NULL);
            CHECK(e.number > 0);
        }
        inbox_entry_cleanup(&e);
        free(data);
    }
}

TEST(atlantis_fixture_fields)
{
    size_t len = 0;
    char *data = read_fixture("issue_comment.created.pr.atlantis.json", &len);
    enum github_event ev;
    struct inbox_entry e;
    const char *why;

    ASSERT(data != NULL);
    CHECK_OK(github_webhook_parse(&ev, &e, &why, "issue_comment", "d-2", data, len, NULL));
    CHECK_EQ_STR(e.comment_id, "396926483");
    CHECK_EQ_STR(e.author, "runatlantis");
    CHECK_EQ_STR(e.project, "runatlantis/atlantis-tests");
    CHECK_EQ_STR(e.author_association, "OWNER");
    CHECK_EQ_STR(e.body, "###comment body###");
    CHECK_EQ_STR(e.delivery_id, "d-2");
    CHECK_EQ_INT(e.installation_id, 0);
    inbox_entry_cleanup(&e);
    free(data);
}

TEST(malformed_payloads)
{
    static const char *const bad[] = {
        "not json",
        "[]",
        "{\"issue\":{}}",
        "{\"action\":\"created\",\"issue\":{\"number\":1,\"pull_request\":{}},"
        "\"comment\":{\"id\":5,\"body\":\"x\"},\"repository\":{\"full_name\":\"a/b\"}}",
        "{\"action\":\"created\",\"issue\":{\"number\":\"1\",\"pull_request\":{}},"
        "\"comment\":{\"id\":5,\"body\":\"x\",\"user\":{\"login\":\"u\"}},\"repository\":{\"full_name\":\"a/b\"}}",
        "{\"action\":\"created\",\"issue\":{\"number\":1,\"pull_request\":{}},"
        "\"comment\":{\"id\":5,\"body\":\"x\",\"user\":{\"login\":\"u\"}}}",
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        enum github_event ev;
        struct inbox_entry e;
        const char *why;
        struct err err = {0};
        int rc = github_webhook_parse(&ev, &e, &why, "issue_comment", NULL, bad[i],
                                      strlen(bad[i]), &err);
        if (rc != E_INVALID) {
            t_fail(__FILE__, __LINE__, "payload %zu: rc %d", i, rc);
        }
        inbox_entry_cleanup(&e);
    }
}

T_MAIN
