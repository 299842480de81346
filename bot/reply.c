/* SPDX-License-Identifier: Apache-2.0 */
/* The bot's refusal replies. They go out under the bot's name, so user text in them is
 * always quoted (slashcmd_quote): it can neither mention anyone nor hide or add markup. */
#include <stdio.h>
#include <string.h>

#include "bot/bot_apply.h"
#include "bot/bot_int.h"

/* Parser messages are quoted whole: they may name YAML keys and values from the file. */
#define WHY_CHARS 200

char *bot_reply_unreadable(const char *author, const char *why)
{
    /* WHY comes from slashcmd_parse, whose messages quote their arguments already. */
    return xasprintf("@%s I could not read that command: %s. Nothing was changed.\n\n%s", author,
                     why, slashcmd_help_markdown());
}

char *bot_reply_bad_agent_yaml(const char *author, const char *branch, const char *why)
{
    char qbranch[SHOW_MAX], qwhy[SLASHCMD_QUOTE_SIZE(WHY_CHARS)];

    slashcmd_show_arg(qbranch, branch, strlen(branch));
    slashcmd_quote(qwhy, sizeof(qwhy), why, strlen(why), WHY_CHARS);
    return xasprintf("@%s the repository's `.diverge/agent.yaml` on %s is not valid: %s. "
                     "Nothing was changed.\n",
                     author, qbranch, qwhy);
}

char *bot_reply_too_long(const char *author, const struct slashcmd_list *cmds)
{
    for (size_t i = 0; i < cmds->len; i++) {
        const struct slashcmd *c = &cmds->cmds[i];
        size_t cap = c->verb == SLASHCMD_FIX     ? BOT_OBJECTIVE_MAX
                     : c->verb == SLASHCMD_GUIDE ? BOT_GUIDANCE_MAX
                                                 : 0;
        if (cap > 0 && c->text != NULL && strlen(c->text) > cap) {
            return xasprintf("@%s the %s on line %d is %zu bytes long; at most %zu are accepted. "
                             "Nothing was changed.\n",
                             author, c->verb == SLASHCMD_FIX ? "objective" : "hint", c->line,
                             strlen(c->text), cap);
        }
    }
    return NULL;
}

char *bot_reply_foreign_task(const char *author, const char *ns, const char *task)
{
    char qns[SHOW_MAX], qtask[SHOW_MAX];

    slashcmd_show_arg(qns, ns, strlen(ns));
    slashcmd_show_arg(qtask, task, strlen(task));
    return xasprintf("@%s the task name %s in namespace %s is held by a task of another "
                     "project or pull request (or one not made from a comment), so this "
                     "comment changed nothing. A server admin can remove or rename that task, "
                     "or give the projects separate namespaces.\n",
                     author, qtask, qns);
}

char *bot_reply_head_gone(const char *author, const char *provider)
{
    bool gitlab = strcmp(provider, "gitlab") == 0;

    return xasprintf("@%s the %s no longer exists, so there is no branch to work on and "
                     "push to. Nothing was changed.\n",
                     author, gitlab ? "MR's source project" : "PR's head repository");
}
