/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of scm/: permission levels, the per-minute budget of content-creating calls
 * (at most 80 per minute), the outbox's retry delays (Retry-After, rate limits), and the
 * URLs sent to an SCM (encoded path segments, pagination links kept to the API base), and
 * the local provider's answers for a PR bound by `diverge local pr open`. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "common/proc.h"
#include "scm/scm.h"
#include "tests/t_check.h"

TEST(levels)
{
    enum scm_level l;
    CHECK_OK(scm_level_parse(&l, "maintain"));
    CHECK_EQ_INT(l, SCM_LEVEL_MAINTAIN);
    CHECK_OK(scm_level_parse(&l, "30"));
    CHECK_EQ_INT(l, SCM_LEVEL_WRITE);
    CHECK_EQ_INT(scm_level_parse(&l, "owner"), E_INVALID);
    CHECK_EQ_STR(scm_level_name(SCM_LEVEL_ADMIN), "admin");
}

TEST(eighty_per_minute)
{
    struct scm_rate r;
    int64_t t = 1000000, sent = 0, first_wait = -1;

    memset(&r, 0, sizeof(r));
    /* Offer a call every 100 ms for two minutes; count what goes out per window. */
    for (int i = 0; i < 1200; i++, t += 100) {
        int64_t w = scm_rate_wait(&r, 80, t);
        if (w == 0) {
            scm_rate_note(&r, t);
            sent++;
        } else if (first_wait < 0) {
            first_wait = w;
        }
    }
    /* 80 in the first minute, 80 in the second: never more. */
    CHECK_EQ_INT(sent, 160);
    CHECK(first_wait > 0 && first_wait <= 60000);
    /* Any 60 s window holds at most 80 calls. */
    for (size_t i = 0; i < SCM_RATE_SLOTS; i++) {
        int64_t start = r.sent_ms[i], n = 0;
        if (start == 0) {
            continue;
        }
        for (size_t k = 0; k < SCM_RATE_SLOTS; k++) {
            n += r.sent_ms[k] >= start && r.sent_ms[k] < start + 60000;
        }
        CHECK(n <= 80);
    }
}

TEST(backoff_and_retry_after)
{
    struct scm_outbox_config cfg = SCM_OUTBOX_CONFIG_DEFAULTS;
    struct scm_result none = {0},
                      ra = {.status = 403, .retry_after_ms = 2000, .rate_limited = true};
    struct scm_result secondary = {.status = 403, .rate_limited = true};
    struct scm_result slow503 = {.status = 503, .retry_after_ms = 30000};

    CHECK_EQ_INT(scm_outbox_backoff(&cfg, 1, &none), 500);
    CHECK_EQ_INT(scm_outbox_backoff(&cfg, 2, &none), 1000);
    CHECK_EQ_INT(scm_outbox_backoff(&cfg, 4, &none), 4000);
    CHECK_EQ_INT(scm_outbox_backoff(&cfg, 30, &none), 300000);
    /* Retry-After wins over our backoff when rate limited: exactly when GitHub said. */
    CHECK_EQ_INT(scm_outbox_backoff(&cfg, 5, &ra), 2000);
    /* A secondary limit without a hint waits at least a minute. */
    CHECK_EQ_INT(scm_outbox_backoff(&cfg, 1, &secondary), 60000);
    /* A 503 asking for 30 s gets at least 30 s. */
    CHECK_EQ_INT(scm_outbox_backoff(&cfg, 1, &slow503), 30000);
}

/* Checks one scm_path_escape() case. */
static void check_escape(const char *in, bool keep_slash, const char *want)
{
    char *got = scm_path_escape(in, keep_slash);
    CHECK_EQ_STR(got, want);
    free(got);
}

TEST(path_segments_are_encoded)
{
    char *url;

    check_escape("octo", false, "octo");
    check_escape("A-z0.9_~", false, "A-z0.9_~");
    check_escape("a b/c?d#e%f", false, "a%20b%2Fc%3Fd%23e%25f");
    check_escape("..", false, "%2E%2E");
    check_escape("", false, "");
    check_escape("caf\xC3\xA9", false, "caf%C3%A9");
    check_escape(".diverge/agent.yaml", true, ".diverge/agent.yaml");
    check_escape("dir x/../a?b", true, "dir%20x/%2E%2E/a%3Fb");
    url = scm_repo_url("https://api.github.com", "octo/re po", "/issues/7/comments");
    CHECK_EQ_STR(url, "https://api.github.com/repos/octo/re%20po/issues/7/comments");
    free(url);
    url = scm_repo_url("http://127.0.0.1:9/api/v3", "o/../../admin", "");
    CHECK_EQ_STR(url, "http://127.0.0.1:9/api/v3/repos/o/%2E%2E/%2E%2E/admin");
    free(url);
}

TEST(links_stay_under_the_api_base)
{
    const char *gh = "https://api.github.com", *ghes = "http://127.0.0.1:8080/api/v3/";

    CHECK(scm_url_under(gh, "https://api.github.com/repositories/1/issues/7/comments?page=2"));
    CHECK(scm_url_under(gh, "HTTPS://API.GitHub.com:443/x"));
    CHECK(scm_url_under(gh, "https://api.github.com"));
    CHECK(!scm_url_under(gh, "http://api.github.com/x"));       /* scheme */
    CHECK(!scm_url_under(gh, "https://api.github.com.evil/x")); /* host */
    CHECK(!scm_url_under(gh, "https://api.github.com:444/x"));  /* port */
    CHECK(!scm_url_under(gh, "https://evil@api.github.com/x")); /* user info */
    CHECK(!scm_url_under(gh, "https://api.github.com@evil.example/x"));
    CHECK(!scm_url_under(gh, "//api.github.com/x"));
    CHECK(!scm_url_under(gh, "/repositories/1"));
    CHECK(!scm_url_under(gh, "ftp://api.github.com/x"));
    CHECK(scm_url_under(ghes, "http://127.0.0.1:8080/api/v3/repos/o/r/issues/1/comments"));
    CHECK(scm_url_under(ghes, "http://127.0.0.1:8080/api/v3?page=2"));
    CHECK(!scm_url_under(ghes, "http://127.0.0.1:8081/api/v3/repos"));
    CHECK(!scm_url_under(ghes, "http://127.0.0.1/api/v3/repos"));
    CHECK(!scm_url_under(ghes, "http://127.0.0.1:8080/api/v30/repos"));
    CHECK(!scm_url_under(ghes, "http://127.0.0.1:8080/other"));
    CHECK(!scm_url_under(ghes, "http://127.0.0.1:8080/api/v3/../admin"));
    CHECK(!scm_url_under(ghes, "http://127.0.0.1:8080/api/v3/%2E%2e/admin"));
    CHECK(scm_url_under("http://[::1]:9", "http://[::1]:9/x"));
    CHECK(!scm_url_under("http://[::1]:9", "http://[::1]:10/x"));
}

/* --- the local provider answers from `diverge local pr open` ------------------------- */

static int git_ok(const char *const *argv)
{
    int status = -1;
    struct err err = {0};

    return proc_run(&status, NULL, NULL, true, argv, &err) == E_OK ? status : -1;
}

/* A repository at DIR/w whose main holds .diverge/agent.yaml; its git dir's file:// URL. */
static char *repo_with_agent_yaml(const char *dir)
{
    char *w = xasprintf("%s/w", dir), *d = xasprintf("%s/w/.diverge", dir);
    char *f = xasprintf("%s/w/.diverge/agent.yaml", dir);
    FILE *fp;

    CHECK_EQ_INT(git_ok((const char *const[]){"git", "init", "-q", "-b", "main", w, NULL}), 0);
    CHECK_EQ_INT(mkdir(d, 0755), 0);
    fp = fopen(f, "w");
    ASSERT(fp != NULL);
    fputs("version: \"1\"\n", fp);
    fclose(fp);
    CHECK_EQ_INT(git_ok((const char *const[]){"git", "-C", w, "add", "-A", NULL}), 0);
    CHECK_EQ_INT(git_ok((const char *const[]){"git", "-C", w, "-c", "user.name=t", "-c",
                                              "user.email=t@example.invalid", "commit", "-q", "-m",
                                              "c", NULL}),
                 0);
    free(d);
    free(f);
    char *url = xasprintf("file://%s/.git", w);
    free(w);
    return url;
}

TEST(local_provider_answers_from_the_bound_pr)
{
    struct task_store *st = NULL;
    struct scm_provider *p = NULL;
    struct scm_ref ref = {.project = "o/r", .number = 3};
    struct scm_pull pull;
    struct err err = {0};
    char tmpl[] = "/tmp/test-scm-local-XXXXXX", *dir = mkdtemp(tmpl), *url, *out = NULL;
    size_t len = 0;
    bool created = false;

    ASSERT(dir != NULL);
    ASSERT(task_store_sqlite_open(&st, ":memory:", clock_system(), &err) == E_OK);
    CHECK_OK(scm_local_new(&p, st, &err));
    /* Never opened: a placeholder, no base, no files (as before). */
    CHECK_OK(p->ops->pull_info(&pull, p, &ref, NULL, &err));
    CHECK_EQ_STR(pull.head_ref, "pr-3");
    CHECK_EQ_STR(pull.clone_url, "local://o/r");
    CHECK(pull.base_ref == NULL);
    scm_pull_cleanup(&pull);
    CHECK_EQ_INT(p->ops->file_at(&out, &len, p, &ref, "main", ".diverge/agent.yaml", NULL, &err),
                 E_NOTFOUND);
    /* Opened: head, base and repository from the record; the file from the base. */
    url = repo_with_agent_yaml(dir);
    CHECK_OK(task_store_local_pull_set(&created, st, "o/r", 3, url, "feature", "main", &err));
    CHECK(created);
    CHECK_OK(task_store_local_pull_set(&created, st, "o/r", 3, url, "feature", "main", &err));
    CHECK(!created);
    CHECK_OK(p->ops->pull_info(&pull, p, &ref, NULL, &err));
    CHECK_EQ_STR(pull.head_ref, "feature");
    CHECK_EQ_STR(pull.base_ref, "main");
    CHECK_EQ_STR(pull.clone_url, url);
    scm_pull_cleanup(&pull);
    CHECK_OK(p->ops->file_at(&out, &len, p, &ref, "main", ".diverge/agent.yaml", NULL, &err));
    CHECK_EQ_STR(out != NULL ? out : "", "version: \"1\"\n");
    CHECK_EQ_INT(len, 13);
    free(out);
    out = NULL;
    CHECK_EQ_INT(p->ops->file_at(&out, &len, p, &ref, "main", "nope.yaml", NULL, &err), E_NOTFOUND);
    CHECK_EQ_INT(p->ops->file_at(&out, &len, p, &ref, "other", ".diverge/agent.yaml", NULL, &err),
                 E_NOTFOUND);
    /* An https repository is not read (the server's defaults apply). */
    CHECK_OK(task_store_local_pull_set(&created, st, "o/r", 3, "https://example.invalid/r.git",
                                       "feature", "main", &err));
    CHECK_EQ_INT(p->ops->file_at(&out, &len, p, &ref, "main", ".diverge/agent.yaml", NULL, &err),
                 E_NOTFOUND);
    CHECK(out == NULL);
    free(url);
    scm_provider_free(p);
    task_store_close(st);
    CHECK_EQ_INT(git_ok((const char *const[]){"rm", "-rf", dir, NULL}), 0);
}

/* Writes TEXT into W's .diverge/agent.yaml and commits it on main. */
static void commit_agent_yaml(const char *w, const char *text)
{
    char *f = xasprintf("%s/.diverge/agent.yaml", w);
    FILE *fp = fopen(f, "w");

    ASSERT(fp != NULL);
    fputs(text, fp);
    fclose(fp);
    CHECK_EQ_INT(git_ok((const char *const[]){"git", "-C", w, "-c", "user.name=t", "-c",
                                              "user.email=t@example.invalid", "commit", "-q", "-a",
                                              "-m", "c", NULL}),
                 0);
    free(f);
}

/* Reads PATH at main of P's PR o/r#3: its text, or "<none>" for E_NOTFOUND. */
static char *read_at_main(struct scm_provider *p, const char *path)
{
    struct scm_ref ref = {.project = "o/r", .number = 3};
    struct err err = {0};
    char *out = NULL;
    size_t len = 0;
    int rc = p->ops->file_at(&out, &len, p, &ref, "main", path, NULL, &err);

    if (rc == E_NOTFOUND) {
        CHECK(out == NULL);
        return xstrdup("<none>");
    }
    CHECK_OK(rc);
    CHECK_EQ_INT(len, out != NULL ? strlen(out) : 0);
    return out;
}

static void check_read(struct scm_provider *p, const char *path, const char *want)
{
    char *got = read_at_main(p, path);

    CHECK_EQ_STR(got, want);
    free(got);
}

TEST(local_provider_remembers_a_commits_files_and_reads_a_new_commit)
{
    struct task_store *st = NULL;
    struct scm_provider *p = NULL;
    struct err err = {0};
    char tmpl[] = "/tmp/test-scm-local-XXXXXX", *dir = mkdtemp(tmpl), *url, *w, *objects, *away;
    bool created = false;

    ASSERT(dir != NULL);
    ASSERT(task_store_sqlite_open(&st, ":memory:", clock_system(), &err) == E_OK);
    CHECK_OK(scm_local_new(&p, st, &err));
    url = repo_with_agent_yaml(dir);
    w = xasprintf("%s/w", dir);
    objects = xasprintf("%s/w/.git/objects", dir);
    away = xasprintf("%s/w/.git/objects.away", dir);
    CHECK_OK(task_store_local_pull_set(&created, st, "o/r", 3, url, "feature", "main", &err));
    check_read(p, ".diverge/agent.yaml", "version: \"1\"\n");
    check_read(p, "nope.yaml", "<none>");
    /* Without its objects git could read nothing: the same commit is answered from what
     * was read, the file and the absence alike. */
    CHECK_EQ_INT(rename(objects, away), 0);
    check_read(p, ".diverge/agent.yaml", "version: \"1\"\n");
    check_read(p, "nope.yaml", "<none>");
    CHECK_EQ_INT(rename(away, objects), 0);
    /* A new commit on the branch is read anew. */
    commit_agent_yaml(w, "version: \"1\"\n# second\n");
    check_read(p, ".diverge/agent.yaml", "version: \"1\"\n# second\n");
    /* A failure that is not an absence (here: no objects) is never remembered. */
    commit_agent_yaml(w, "version: \"1\"\n# third\n");
    CHECK_EQ_INT(rename(objects, away), 0);
    check_read(p, ".diverge/agent.yaml", "<none>");
    CHECK_EQ_INT(rename(away, objects), 0);
    check_read(p, ".diverge/agent.yaml", "version: \"1\"\n# third\n");
    free(url);
    free(w);
    free(objects);
    free(away);
    scm_provider_free(p);
    task_store_close(st);
    CHECK_EQ_INT(git_ok((const char *const[]){"rm", "-rf", dir, NULL}), 0);
}

T_MAIN
