/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer harness for the slash-command grammar: any bytes must parse or fail cleanly,
 * and what parses must satisfy the invariants slashcmd.h promises. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bot/slashcmd.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(c_)                                                                             \
    do {                                                                                           \
        if (!(c_)) {                                                                               \
            assert_fail(#c_, __FILE__, __LINE__);                                                  \
        }                                                                                          \
    } while (0)

static int count_lines(const char *s, size_t n)
{
    int lines = n > 0 ? 1 : 0;

    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\n' && i + 1 < n) {
            lines++;
        }
    }
    return lines;
}

/* Texts are trimmed, non-empty, and free of control characters but tab. */
static void check_text(const char *t)
{
    size_t n = strlen(t);

    FUZZ_CHECK(n > 0);
    FUZZ_CHECK(t[0] != ' ' && t[0] != '\t' && t[n - 1] != ' ' && t[n - 1] != '\t');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)t[i];
        FUZZ_CHECK(c >= 0x20 || c == '\t');
        FUZZ_CHECK(c != 0x7F);
    }
}

static void check_command(const struct slashcmd *c, int prev_line, int lines)
{
    bool has_text = c->verb == SLASHCMD_FIX || c->verb == SLASHCMD_GUIDE;

    FUZZ_CHECK(strcmp(slashcmd_verb_name(c->verb), "unknown") != 0);
    FUZZ_CHECK(c->line > prev_line && c->line <= lines);
    FUZZ_CHECK(has_text == (c->text != NULL));
    if (c->text != NULL) {
        check_text(c->text);
    }
    FUZZ_CHECK(c->usd_micros >= 0 && c->tokens >= 0);
    FUZZ_CHECK(c->has_usd || c->usd_micros == 0);
    FUZZ_CHECK(c->has_tokens || c->tokens == 0);
    if (c->verb == SLASHCMD_BUDGET) {
        FUZZ_CHECK(c->has_usd || c->has_tokens);
    }
    if (c->verb != SLASHCMD_BUDGET && c->verb != SLASHCMD_RESUME) {
        FUZZ_CHECK(!c->has_usd && !c->has_tokens);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *body = (const char *)data;
    struct slashcmd_list *list = NULL;
    struct err err = {0};
    int rc = slashcmd_parse(&list, body, size, &err);
    bool mentions = slashcmd_mentions(body, size);
    int prev = 0, lines = count_lines(body, size);

    if (rc != E_OK) {
        FUZZ_CHECK(rc == E_INVALID || rc == E_TOOBIG);
        FUZZ_CHECK(list == NULL);
        FUZZ_CHECK(err.msg[0] != '\0');
        FUZZ_CHECK(mentions || size > SLASHCMD_BODY_MAX);
        /* Echoed arguments are escaped: a message never carries a control byte. */
        for (const char *p = err.msg; *p != '\0'; p++) {
            FUZZ_CHECK((unsigned char)*p >= 0x20 && *p != 0x7F);
            /* ...and quoted: no HTML, no mention (every '@' is followed by U+200D). */
            FUZZ_CHECK(*p != '<' && *p != '>' && *p != '&');
            FUZZ_CHECK(*p != '@' || strncmp(p + 1, "\xE2\x80\x8D", 3) == 0);
        }
        /* Never cut by the message buffer (a cut could drop the closing fence). */
        FUZZ_CHECK(strlen(err.msg) < ERR_MSG_MAX - 1);
        return 0;
    }
    FUZZ_CHECK(list != NULL && list->len <= SLASHCMD_MAX_COMMANDS);
    FUZZ_CHECK(mentions || list->len == 0);
    for (size_t i = 0; i < list->len; i++) {
        check_command(&list->cmds[i], prev, lines);
        prev = list->cmds[i].line;
    }
    slashcmd_list_free(list);
    return 0;
}
