/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of scm/github webhooks: GitHub's documented signature vector, secret
 * rotation, and parsing of the real fixtures (../shared/fixtures/github). */
#include <stdio.h>
#include <stdlib.h>

#include <jansson.h>

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
    CHECK_EQ_INT(github_webhook_verify(DOC_SECRET, "sha256=zz", body, strlen(body), NULL),
                 E_DENIED);
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
        "\"comment\":{\"id\":5,\"body\":\"x\",\"user\":{\"login\":\"u\"}},\"repository\":{\"full_"
        "name\":\"a/b\"}}",
        "{\"action\":\"created\",\"issue\":{\"number\":1,\"pull_request\":{}},"
        "\"comment\":{\"id\":5,\"body\":\"x\",\"user\":{\"login\":\"u\"}}}",
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        enum github_event ev;
        struct inbox_entry e;
        const char *why;
        struct err err = {0};
        int rc = github_webhook_parse(&ev, &e, &why, "issue_comment", NULL, bad[i], strlen(bad[i]),
                                      &err);
        if (rc != E_INVALID) {
            t_fail(__FILE__, __LINE__, "payload %zu: rc %d", i, rc);
        }
        inbox_entry_cleanup(&e);
    }
}

/* The derived PR fixture with one field replaced by VALUE (JSON text), re-serialized. */
static char *mutated(const char *path, const char *value)
{
    size_t len = 0;
    char *data = read_fixture("DERIVED.issue_comment.created.pr.with-installation.json", &len);
    json_t *doc = json_loads(data, 0, NULL), *parent = doc;
    json_t *v = json_loads(value, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    char *copy = xstrdup(path), *key = copy, *dot, *out;

    ASSERT(doc != NULL && v != NULL);
    while ((dot = strchr(key, '.')) != NULL) {
        *dot = '\0';
        parent = json_object_get(parent, key);
        key = dot + 1;
    }
    ASSERT(json_is_object(parent));
    json_object_set_new(parent, key, v);
    json_object_set_new(json_object_get(doc, "comment"), "body", json_string("/diverge help"));
    out = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    free(copy);
    free(data);
    return out;
}

static int parse_mutated(const char *path, const char *value, struct err *err)
{
    char *body = mutated(path, value);
    enum github_event ev;
    struct inbox_entry e;
    const char *why;
    int rc = github_webhook_parse(&ev, &e, &why, "issue_comment", "d-3", body, strlen(body), err);

    if (rc == E_OK && ev != GITHUB_EVENT_COMMENT) {
        rc = E_FAIL;
    }
    inbox_entry_cleanup(&e);
    free(body);
    return rc;
}

/* Numbers and names GitHub never sends are 400 before anything is stored (SPEC §5). */
TEST(names_and_numbers_checked)
{
    static const struct {
        const char *path, *value;
        int want;
    } cases[] = {
        {"issue.number", "7", E_OK},
        {"issue.number", "2147483647", E_OK},
        {"issue.number", "-7", E_INVALID},
        {"issue.number", "0", E_INVALID},
        {"issue.number", "7.0", E_INVALID},
        {"issue.number", "7e0", E_INVALID},
        {"issue.number", "2147483648", E_INVALID},
        {"issue.number", "\"7\"", E_INVALID},
        {"repository.full_name", "\"../../etc/passwd\"", E_INVALID},
        {"repository.full_name", "\"codertocat/hello-world\"", E_INVALID},
        {"repository.full_name", "\"Codertocat/Hello-World/x\"", E_INVALID},
        {"repository.full_name", "\"Codertocat\"", E_INVALID},
        {"repository.full_name", "null", E_INVALID},
        {"repository.name", "\"..\"", E_INVALID},
        {"repository.name", "\".\"", E_INVALID},
        {"repository.name", "\"a/b\"", E_INVALID},
        {"repository.name", "\"\"", E_INVALID},
        {"repository.owner.login", "\"-octo\"", E_INVALID},
        {"repository.owner.login", "\"octo[bot]\"", E_INVALID},
        {"repository.owner.login", "\"oct o\"", E_INVALID},
        {"repository.owner", "{}", E_INVALID},
        {"comment.user.login", "\"dependabot[bot]\"", E_OK},
        {"comment.user.login", "\"a-b-c\"", E_OK},
        {"comment.user.login", "\"-alice\"", E_INVALID},
        {"comment.user.login", "\"alice@x\"", E_INVALID},
        {"comment.user.login", "\"@octo/team\"", E_INVALID},
        {"comment.user.login", "\"\"", E_INVALID},
        {"comment.user.login", "\"a\\u0000b\"", E_INVALID},
        {"comment.user.login", "\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"", E_INVALID},
        {"comment.user.login", "\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"", E_OK},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        struct err err = {0};
        int rc = parse_mutated(cases[i].path, cases[i].value, &err);
        if (rc != cases[i].want) {
            t_fail(__FILE__, __LINE__, "%s = %s: rc %d, want %d (%s)", cases[i].path,
                   cases[i].value, rc, cases[i].want, err.msg);
        }
        /* The reason never echoes the bad value. */
        if (rc == E_INVALID && strstr(err.msg, "passwd") != NULL) {
            t_fail(__FILE__, __LINE__, "message echoes the payload: %s", err.msg);
        }
    }
    /* The repository fields are all required. */
    {
        struct err err = {0};
        CHECK_EQ_INT(parse_mutated("repository.name", "null", &err), E_INVALID);
        CHECK_EQ_STR(err.msg, "payload field repository.name is missing or has the wrong type");
    }
}

TEST(name_rules)
{
    CHECK(github_valid_login("a", false));
    CHECK(github_valid_login("Octo-Cat-9", false));
    CHECK(!github_valid_login("x[bot]", false));
    CHECK(github_valid_login("x[bot]", true));
    CHECK(!github_valid_login("[bot]", true));
    CHECK(!github_valid_login("-[bot]", true));
    CHECK(!github_valid_login("a_b", false));
    CHECK(github_valid_repo_name(".github"));
    CHECK(github_valid_repo_name("a..b"));
    CHECK(github_valid_repo_name("under_score-dash.dot"));
    CHECK(!github_valid_repo_name("caf\xc3\xa9"));
    CHECK(!github_valid_repo_name("a b"));
}

T_MAIN
