/* SPDX-License-Identifier: Apache-2.0 */
/* The slash-command grammar of SPEC section 5: finds the `/diverge` lines of a PR/MR
 * comment that a reader sees as text (not code, quotes or HTML comments) and parses each
 * into a struct slashcmd. Pure: no I/O, no knowledge of tasks or permissions. */
#ifndef DIVERGE_BOT_SLASHCMD_H
#define DIVERGE_BOT_SLASHCMD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* Largest comment slashcmd_parse() looks at, in bytes. */
#define SLASHCMD_BODY_MAX ((size_t)65536 * 4)
/* Most commands one comment may carry; each one can cause a reply or a task change. */
#define SLASHCMD_MAX_COMMANDS 32

enum slashcmd_verb {
    SLASHCMD_FIX = 1, /* create the task or change its objective; text is the objective */
    SLASHCMD_GUIDE,   /* pass a hint to the agent; text is the hint */
    SLASHCMD_BUDGET,  /* add to the budgets; at least one amount */
    SLASHCMD_PAUSE,   /* suspend */
    SLASHCMD_RESUME,  /* optional budget bumps, then unsuspend */
    SLASHCMD_STATUS,  /* reply with the project's tasks */
    SLASHCMD_HELP,    /* reply with slashcmd_help_markdown() */
};

struct slashcmd {
    enum slashcmd_verb verb;
    char *text;         /* fix objective or guide hint, trimmed, valid UTF-8 without control
                         * characters other than tab; owned by the list; NULL for other verbs */
    bool has_usd;       /* a USD amount was given */
    int64_t usd_micros; /* USD to add, micro-dollars, >= 0; 0 unless has_usd */
    bool has_tokens;    /* a token amount was given */
    int64_t tokens;     /* tokens to add, >= 0; 0 unless has_tokens */
    int line;           /* 1-based line of the comment the command is on */
};

struct slashcmd_list {
    struct slashcmd *cmds; /* owned array of len commands, in comment order */
    size_t len;            /* 0 when the comment has no command */
};

/* Parses the comment BODY[0..len) (arbitrary bytes; NULs and invalid UTF-8 are safe;
 * BODY may be NULL when LEN is 0). On success *out is a new list, possibly empty, that the
 * caller frees with slashcmd_list_free().
 *
 * A comment is taken whole or not at all: if any command line is invalid the result is
 * E_INVALID, *out stays NULL and ERR's message is "line N: <reason>", naming the bad
 * argument as a Markdown code span (slashcmd_quote: escaped, no mention, no HTML, at most
 * 80 characters; safe to echo in a reply) where there is one. The message fits ERR_MSG_MAX.
 * E_TOOBIG when LEN is over SLASHCMD_BODY_MAX, there are more than SLASHCMD_MAX_COMMANDS
 * commands, or a line trips the matcher's time/memory limits (never seen in practice; the
 * limits bound what one comment can cost). Thread-safe: the compiled patterns are shared
 * read-only. */
int slashcmd_parse(struct slashcmd_list **out, const char *body, size_t len, struct err *err);

/* Frees LIST and the texts of its commands. NULL is a no-op. */
void slashcmd_list_free(struct slashcmd_list *list);

/* Whether LIST (NULL: none) holds a command with verb V. */
bool slashcmd_has(const struct slashcmd_list *list, enum slashcmd_verb v);

/* Whether the comment BODY[0..len) parses (slashcmd_parse) and asks for a `fix`. */
bool slashcmd_asks_fix(const char *body, size_t len);

/* Cheap prefilter: false when BODY[0..len) cannot hold a command because "/diverge" does
 * not occur in it (ASCII case-insensitive). True does not promise a command. */
bool slashcmd_mentions(const char *body, size_t len);

/* The verb as typed, lower case ("fix", "budget", ...); "unknown" for a value outside the
 * enum. Static storage. */
const char *slashcmd_verb_name(enum slashcmd_verb verb);

/* The command reference, a static Markdown table (command | effect | who may use it) with
 * the default permission tiers of SPEC section 5, followed by a line on amounts. */
const char *slashcmd_help_markdown(void);

#endif
