/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of bot/: task names and ownership (security review finding 2) and the refusal
 * replies, which echo no markup (finding 10) and enforce the length caps (issue 15). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bot/bot_apply.h"
#include "bot/slashcmd.h"
#include "tests/t_check.h"

#define X10 "xxxxxxxxxx"
#define X80 X10 X10 X10 X10 X10 X10 X10 X10

/* --- task identity (security review finding 2) --------------------------------------- */

TEST(task_names)
{
    char a[64], b[64], ns1[64], ns2[64];

    bot_task_name(a, "github", "octo/repo", 7, false);
    CHECK_EQ_STR(a, "fix-pr-7");
    bot_task_name(a, "gitlab", "grp/sub/proj", 12, false);
    CHECK_EQ_STR(a, "fix-mr-12");
    /* The SPEC mapping is lossy: these two projects share a namespace... */
    bot_project_namespace(ns1, "octo/checkout-service");
    bot_project_namespace(ns2, "octo-checkout/service");
    CHECK_EQ_STR(ns1, "octo-checkout-service");
    CHECK_EQ_STR(ns2, ns1);
    bot_project_namespace(ns1, "myorg/checkout-service");
    CHECK_EQ_STR(ns1, "myorg-checkout-service");
    /* ...and in a shared namespace the names carry a hash of provider:project. */
    bot_task_name(a, "github", "octo/checkout-service", 7, true);
    bot_task_name(b, "github", "octo-checkout/service", 7, true);
    CHECK(strncmp(a, "fix-pr-7-", 9) == 0 && strlen(a) == 17);
    CHECK(strncmp(b, "fix-pr-7-", 9) == 0 && strlen(b) == 17);
    CHECK(strcmp(a, b) != 0);
    bot_task_name(b, "gitlab", "octo/checkout-service", 7, true);
    CHECK(strncmp(b, "fix-mr-7-", 9) == 0 && strcmp(a + 9, b + 9) != 0);
    bot_task_name(b, "github", "octo/checkout-service", 7, true);
    CHECK_EQ_STR(a, b); /* stable */
    bot_task_name(a, "github", "o/r", INT64_MAX, true);
    CHECK(strlen(a) <= 63);
}

static json_t *task_with(const char *provider, const char *project, const char *pr, const char *mr)
{
    json_t *ann = json_object();
    json_t *t = json_pack("{s:{s:s, s:o}}", "metadata", "name", "fix-pr-7", "annotations", ann);

    if (provider != NULL) {
        json_object_set_new(ann, "divergedev.com/provider", json_string(provider));
    }
    if (project != NULL) {
        json_object_set_new(ann, "divergedev.com/project", json_string(project));
    }
    if (pr != NULL) {
        json_object_set_new(ann, "divergedev.com/pr-number", json_string(pr));
    }
    if (mr != NULL) {
        json_object_set_new(ann, "divergedev.com/mr-iid", json_string(mr));
    }
    return t;
}

TEST(task_ownership_decision)
{
    static const struct {
        const char *provider, *project, *pr, *mr;
        bool want;
    } owners[] = {
        {"github", "octo/checkout-service", "7", NULL, true},
        {"github", "octo-checkout/service", "7", NULL, false}, /* same namespace, other repo */
        {"github", "Octo/checkout-service", "7", NULL, false}, /* exact, not case-folded */
        {"github", "octo/checkout-service", "8", NULL, false},
        {"github", "octo/checkout-service", "07", NULL, false},
        {"gitlab", "octo/checkout-service", "7", NULL, false},
        {"github", "octo/checkout-service", NULL, "7", false},
        {NULL, "octo/checkout-service", "7", NULL, false},
        {"github", NULL, "7", NULL, false},
        {NULL, NULL, NULL, NULL, false}, /* made by the CLI or the API */
    };
    for (size_t i = 0; i < ARRAY_LEN(owners); i++) {
        json_t *t = task_with(owners[i].provider, owners[i].project, owners[i].pr, owners[i].mr);
        if (bot_task_belongs(t, "github", "octo/checkout-service", 7) != owners[i].want) {
            t_fail(__FILE__, __LINE__, "case %zu: want %d", i, owners[i].want);
        }
        json_decref(t);
    }
    {
        json_t *t = task_with("gitlab", "grp/proj", NULL, "3");
        CHECK(bot_task_belongs(t, "gitlab", "grp/proj", 3));
        CHECK(!bot_task_belongs(t, "gitlab", "grp/proj", 4));
        json_decref(t);
        t = json_pack("{s:s}", "metadata", "x");
        CHECK(!bot_task_belongs(t, "github", "octo/checkout-service", 7));
        json_decref(t);
    }
}

TEST(foreign_task_reply)
{
    char *r = bot_reply_foreign_task("eve", "octo-checkout-service", "fix-pr-7");

    CHECK_EQ_STR(r, "@eve the task name `fix-pr-7` in namespace `octo-checkout-service` is held "
                    "by a task of another project or pull request (or one not made from a "
                    "comment), so this comment changed nothing. A server admin can remove or "
                    "rename that task, or give the projects separate namespaces.\n");
    free(r);
}

/* --- replies echo no markup (security review finding 10) ------------------------------ */

static char *unreadable_reply(const char *author, const char *body)
{
    struct slashcmd_list *list = NULL;
    struct err err = {0};

    if (slashcmd_parse(&list, body, strlen(body), &err) == E_OK) {
        slashcmd_list_free(list);
        return NULL;
    }
    return bot_reply_unreadable(author, err.msg);
}

static void check_reply(const char *got, const char *head)
{
    size_t n = strlen(head);

    if (got == NULL || strncmp(got, head, n) != 0 ||
        strcmp(got + n, slashcmd_help_markdown()) != 0) {
        t_fail(__FILE__, __LINE__, "reply \"%s\", want \"%s\" + help", got ? got : "(null)", head);
    }
}

TEST(replies_quote_arguments)
{
    char *r = unreadable_reply("eve", "/diverge @octo/security-team");
    /* U+200D after '@': GitHub sees no team mention; the code span keeps it literal. */
    check_reply(r, "@eve I could not read that command: line 1: unknown verb "
                   "`@\xE2\x80\x8Docto/security-team`. Nothing was changed.\n\n");
    free(r);
    /* "<!--" cannot open an HTML comment that hides the rest of the reply. */
    r = unreadable_reply("eve", "/diverge pause <!--");
    check_reply(r, "@eve I could not read that command: line 1: unexpected argument "
                   "`\xEF\xBC\x9C!--` to pause. Nothing was changed.\n\n");
    CHECK(strstr(r, "<!--") == NULL);
    free(r);
    /* Long, binary, backticks and newlines-to-be: one line, one span, capped. */
    r = unreadable_reply("eve", "/diverge pause ``x\x01\xff" X80 "@here");
    check_reply(r, "@eve I could not read that command: line 1: unexpected argument "
                   "``` ``x\\x01\\xff" X10 X10 X10 X10 X10 X10 X10 "xxxxx\xE2\x80\xA6 ``` to "
                   "pause. Nothing was changed.\n\n");
    CHECK(strstr(r, "@here") == NULL);
    free(r);
}

TEST(agent_yaml_reply_quotes_branch_and_keys)
{
    char *r = bot_reply_bad_agent_yaml("alice", "main`@x<!--",
                                       ".diverge/agent.yaml:3: @team<b>: not a number");

    CHECK_EQ_STR(r, "@alice the repository's `.diverge/agent.yaml` on ``main`@\xE2\x80\x8Dx"
                    "\xEF\xBC\x9C!--`` is not valid: `.diverge/agent.yaml:3: @\xE2\x80\x8Dteam"
                    "\xEF\xBC\x9C"
                    "b\xEF\xBC\x9E: not a number`. Nothing was changed.\n");
    free(r);
}

/* --- length caps (issue 15 item 7) ------------------------------------------------------ */

TEST(too_long_texts_refused)
{
    size_t n = 20 * 1024;
    char *body = xmalloc(n + 1);
    struct slashcmd_list *list = NULL;
    char *r;

    memset(body, 'g', n);
    memcpy(body, "/diverge pause\n/diverge guide ", 30);
    body[n] = '\0';
    CHECK_OK(slashcmd_parse(&list, body, n, NULL));
    r = bot_reply_too_long("alice", list);
    CHECK_EQ_STR(r, "@alice the hint on line 2 is 20450 bytes long; at most 16384 are accepted. "
                    "Nothing was changed.\n");
    free(r);
    slashcmd_list_free(list);
    /* Exactly at the caps: accepted. */
    memset(body, 'o', n);
    memcpy(body, "/diverge fix ", 13);
    CHECK_OK(slashcmd_parse(&list, body, 13 + BOT_OBJECTIVE_MAX, NULL));
    CHECK(bot_reply_too_long("alice", list) == NULL);
    slashcmd_list_free(list);
    CHECK_OK(slashcmd_parse(&list, body, 14 + BOT_OBJECTIVE_MAX, NULL));
    r = bot_reply_too_long("alice", list);
    CHECK_EQ_STR(r, "@alice the objective on line 1 is 4097 bytes long; at most 4096 are "
                    "accepted. Nothing was changed.\n");
    free(r);
    slashcmd_list_free(list);
    free(body);
}

T_MAIN
