/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of bot/: the slash-command grammar, as one table of comment -> commands or
 * error, plus the size caps, the prefilter, the help table and concurrent parsing. Task
 * names, ownership and the replies are in test_bot_replies.c. */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "bot/bot_apply.h"
#include "bot/slashcmd.h"
#include "tests/t_check.h"

struct want {
    enum slashcmd_verb verb;
    const char *text; /* NULL: no text expected */
    bool has_usd;
    int64_t usd; /* micro-dollars */
    bool has_tokens;
    int64_t tokens;
    int line;
};

struct tcase {
    const char *name;
    const char *body; /* may hold NULs: len says how long it is */
    size_t len;
    int rc;
    const char *msg; /* the whole err.msg when rc != E_OK */
    size_t ncmds;
    struct want cmds[3];
};

/* clang-format off */
/* A body literal with its length, so NUL bytes inside work. */
#define B(s_) .body = (s_), .len = sizeof(s_) - 1
#define X10 "xxxxxxxxxx"
#define X80 X10 X10 X10 X10 X10 X10 X10 X10
#define NONE .rc = E_OK, .ncmds = 0
#define WANT(n_, ...) .rc = E_OK, .ncmds = (n_), .cmds = {__VA_ARGS__}
#define FAILS(rc_, msg_) .rc = (rc_), .msg = (msg_)
#define BARE(v_, line_) {(v_), NULL, false, 0, false, 0, (line_)}
#define TEXT(v_, line_, t_) {(v_), (t_), false, 0, false, 0, (line_)}
#define USD(v_, usd_) {(v_), NULL, true, (usd_), false, 0, 1}
#define TOK(v_, tok_) {(v_), NULL, false, 0, true, (tok_), 1}
#define BOTH(v_, usd_, tok_) {(v_), NULL, true, (usd_), true, (tok_), 1}
/* clang-format on */

static const struct tcase cases[] = {
    /* each verb */
    {"fix", B("/diverge fix the flaky test"), WANT(1, TEXT(SLASHCMD_FIX, 1, "the flaky test"))},
    {"fix_trimmed_inner_kept", B("/diverge fix    spaced  out \t "),
     WANT(1, TEXT(SLASHCMD_FIX, 1, "spaced  out"))},
    {"fix_no_objective", B("/diverge fix"), FAILS(E_INVALID, "line 1: fix needs an objective")},
    {"fix_blank_objective", B("/diverge fix  \t \r\n"),
     FAILS(E_INVALID, "line 1: fix needs an objective")},
    {"guide", B("/diverge guide use the v2 API"),
     WANT(1, TEXT(SLASHCMD_GUIDE, 1, "use the v2 API"))},
    {"guide_no_hint", B("/diverge guide"), FAILS(E_INVALID, "line 1: guide needs a hint")},
    {"budget_usd", B("/diverge budget +$15"), WANT(1, USD(SLASHCMD_BUDGET, 15000000))},
    {"budget_tokens", B("/diverge budget 2000000"), WANT(1, TOK(SLASHCMD_BUDGET, 2000000))},
    {"budget_both", B("/diverge budget +$15 2000000"),
     WANT(1, BOTH(SLASHCMD_BUDGET, 15000000, 2000000))},
    {"budget_tokens_first", B("/diverge budget 500k $2.50"),
     WANT(1, BOTH(SLASHCMD_BUDGET, 2500000, 500000))},
    {"budget_no_amount", B("/diverge budget"),
     FAILS(E_INVALID, "line 1: budget needs at least one amount")},
    {"pause", B("/diverge pause"), WANT(1, BARE(SLASHCMD_PAUSE, 1))},
    {"pause_extra_arg", B("/diverge pause now"),
     FAILS(E_INVALID, "line 1: unexpected argument `now` to pause")},
    {"resume", B("/diverge resume"), WANT(1, BARE(SLASHCMD_RESUME, 1))},
    {"resume_amounts", B("/diverge resume +$5 +1000"),
     WANT(1, BOTH(SLASHCMD_RESUME, 5000000, 1000))},
    {"resume_three_args", B("/diverge resume $1 2 3"),
     FAILS(E_INVALID, "line 1: unexpected argument `3` to resume")},
    {"status", B("/diverge status"), WANT(1, BARE(SLASHCMD_STATUS, 1))},
    {"status_extra_arg", B("/diverge status all"),
     FAILS(E_INVALID, "line 1: unexpected argument `all` to status")},
    {"help", B("/diverge help"), WANT(1, BARE(SLASHCMD_HELP, 1))},
    {"help_extra_arg", B("/diverge help me"),
     FAILS(E_INVALID, "line 1: unexpected argument `me` to help")},

    /* case and whitespace */
    {"upper_case", B("/DIVERGE FIX Objective Kept"),
     WANT(1, TEXT(SLASHCMD_FIX, 1, "Objective Kept"))},
    {"mixed_case", B("/Diverge Budget 2M"), WANT(1, TOK(SLASHCMD_BUDGET, 2000000))},
    {"upper_verb", B("/diverge RESUME"), WANT(1, BARE(SLASHCMD_RESUME, 1))},
    {"leading_spaces", B("    /diverge pause"), WANT(1, BARE(SLASHCMD_PAUSE, 1))},
    {"leading_tab", B("\t/diverge pause"), WANT(1, BARE(SLASHCMD_PAUSE, 1))},
    {"tab_separators", B("/diverge\tbudget\t$1\t2k"),
     WANT(1, BOTH(SLASHCMD_BUDGET, 1000000, 2000))},
    {"trailing_spaces", B("/diverge pause   "), WANT(1, BARE(SLASHCMD_PAUSE, 1))},
    {"nbsp_not_separator", B("/diverge\xc2\xa0pause"), NONE},
    {"lone_cr_separates", B("/diverge pause\rnow"),
     FAILS(E_INVALID, "line 1: unexpected argument `now` to pause")},

    /* CRLF */
    {"crlf_single", B("/diverge pause\r\n"), WANT(1, BARE(SLASHCMD_PAUSE, 1))},
    {"crlf_text_has_no_cr", B("hello\r\n/diverge fix a bug\r\n/diverge budget $1\r\n"),
     WANT(2, TEXT(SLASHCMD_FIX, 2, "a bug"), {SLASHCMD_BUDGET, NULL, true, 1000000, false, 0, 3})},
    {"crlf_fence", B("```\r\n/diverge pause\r\n```\r\n/diverge help\r\n"),
     WANT(1, BARE(SLASHCMD_HELP, 4))},

    /* several commands */
    {"in_order", B("/diverge fix x\ntext\n/diverge budget 1k\n/diverge resume"),
     WANT(3, TEXT(SLASHCMD_FIX, 1, "x"), {SLASHCMD_BUDGET, NULL, false, 0, true, 1000, 3},
          BARE(SLASHCMD_RESUME, 4))},
    {"one_bad_line_fails_all", B("/diverge pause\n/diverge bogus"),
     FAILS(E_INVALID, "line 2: unknown verb `bogus`")},
    {"bad_amount_line_3", B("/diverge pause\n\n/diverge budget abc"),
     FAILS(E_INVALID, "line 3: invalid amount `abc`")},
    {"prose_around", B("Thanks!\n\n/diverge status\n\nbye"), WANT(1, BARE(SLASHCMD_STATUS, 3))},
    {"leading_blank_lines", B("\n\n/diverge help"), WANT(1, BARE(SLASHCMD_HELP, 3))},

    /* fenced code */
    {"fence_backtick", B("```\n/diverge pause\n```"), NONE},
    {"fence_tilde", B("~~~\n/diverge pause\n~~~\n/diverge help"), WANT(1, BARE(SLASHCMD_HELP, 4))},
    {"fence_info_string", B("```sh\n/diverge pause\n```\n/diverge help"),
     WANT(1, BARE(SLASHCMD_HELP, 4))},
    {"fence_indented_3", B("   ```\n/diverge pause\n   ```\n/diverge help"),
     WANT(1, BARE(SLASHCMD_HELP, 4))},
    {"fence_unclosed_hides_rest", B("before\n```\n/diverge pause\n/diverge help"), NONE},
    {"fence_other_char_no_close", B("```\n~~~\n/diverge pause\n```\n/diverge help"),
     WANT(1, BARE(SLASHCMD_HELP, 5))},
    {"fence_shorter_no_close", B("````\n```\n/diverge pause\n````\n/diverge help"),
     WANT(1, BARE(SLASHCMD_HELP, 5))},
    {"fence_longer_closes", B("```\n/diverge pause\n`````\n/diverge help"),
     WANT(1, BARE(SLASHCMD_HELP, 4))},
    {"fence_info_no_close", B("```\n/diverge pause\n```sh\n/diverge status\n```\n/diverge help"),
     WANT(1, BARE(SLASHCMD_HELP, 6))},
    {"inline_code_not_fence", B("```not a fence```\n/diverge help"),
     WANT(1, BARE(SLASHCMD_HELP, 2))},
    {"tilde_info_backticks", B("~~~ `x`\n/diverge pause\n~~~\n/diverge help"),
     WANT(1, BARE(SLASHCMD_HELP, 4))},
    {"two_backticks_not_fence", B("``\n/diverge pause"), WANT(1, BARE(SLASHCMD_PAUSE, 2))},
    {"fence_in_list_item", B("1. run:\n    ```\n    /diverge pause\n    ```\n/diverge help"),
     WANT(1, BARE(SLASHCMD_HELP, 5))},
    {"fence_after_list_marker", B("- ```\n  /diverge pause\n  ```\n/diverge help"),
     WANT(1, BARE(SLASHCMD_HELP, 4))},

    /* quotes and HTML comments */
    {"quote", B("> /diverge pause"), NONE},
    {"quote_indented", B("  > /diverge pause"), NONE},
    {"quote_nested", B("> > /diverge pause\n>> /diverge fix x"), NONE},
    {"quote_then_command", B("> /diverge fix old\n\n/diverge fix new"),
     WANT(1, TEXT(SLASHCMD_FIX, 3, "new"))},
    {"quoted_fence_does_not_open", B("> ```\n/diverge help"), WANT(1, BARE(SLASHCMD_HELP, 2))},
    {"html_comment_block", B("<!--\n/diverge pause\n-->\n/diverge help"),
     WANT(1, BARE(SLASHCMD_HELP, 4))},
    {"html_comment_one_line", B("<!-- note -->\n/diverge help"), WANT(1, BARE(SLASHCMD_HELP, 2))},

    /* what is not a command, and bad verbs */
    {"mid_line", B("please run /diverge pause"), NONE},
    {"divergex", B("/divergex pause"), NONE},
    {"diverge_comma", B("/diverge, pause"), NONE},
    {"missing_verb", B("/diverge"), FAILS(E_INVALID, "line 1: missing verb after /diverge")},
    {"missing_verb_crlf", B("ok\r\n/diverge   \r\n"),
     FAILS(E_INVALID, "line 2: missing verb after /diverge")},
    {"unknown_verb", B("/diverge deploy now"), FAILS(E_INVALID, "line 1: unknown verb `deploy`")},
    {"unknown_verb_escaped", B("/diverge de\"p\\\x01"),
     FAILS(E_INVALID, "line 1: unknown verb `de\"p\\\\x01`")},
    {"verb_with_colon", B("/diverge fix: it"), FAILS(E_INVALID, "line 1: unknown verb `fix:`")},
    {"unicode_verb_kept", B("/diverge f\xc3\xadx x"),
     FAILS(E_INVALID, "line 1: unknown verb `f\xc3\xadx`")},
    {"invalid_utf8_verb", B("/diverge \xc3\x28"),
     FAILS(E_INVALID, "line 1: unknown verb `\\xc3(`")},
    {"nul_in_verb", B("/diverge pa\0use"), FAILS(E_INVALID, "line 1: unknown verb `pa\\x00use`")},

    /* amounts */
    {"usd_dollar", B("/diverge budget $15"), WANT(1, USD(SLASHCMD_BUDGET, 15000000))},
    {"usd_dollar_cents", B("/diverge budget $15.00"), WANT(1, USD(SLASHCMD_BUDGET, 15000000))},
    {"usd_plus_decimal", B("/diverge budget +15.00"), WANT(1, USD(SLASHCMD_BUDGET, 15000000))},
    {"usd_bare_decimal", B("/diverge budget 15.5"), WANT(1, USD(SLASHCMD_BUDGET, 15500000))},
    {"usd_six_decimals", B("/diverge budget $0.000001"), WANT(1, USD(SLASHCMD_BUDGET, 1))},
    {"usd_seven_decimals", B("/diverge budget $0.0000001"),
     FAILS(E_INVALID, "line 1: invalid amount `$0.0000001`: amount has more than 6 decimals")},
    {"usd_max", B("/diverge budget $9223372036854.775807"),
     WANT(1, USD(SLASHCMD_BUDGET, INT64_MAX))},
    {"usd_overflow", B("/diverge budget $9223372036854.775808"),
     FAILS(E_INVALID, "line 1: amount `$9223372036854.775808` is too large")},
    {"usd_dollar_alone", B("/diverge budget $"),
     FAILS(E_INVALID, "line 1: invalid amount `$`: amount is not a decimal number of dollars")},
    {"usd_trailing_dot", B("/diverge budget 1."),
     FAILS(E_INVALID, "line 1: invalid amount `1.`: amount needs digits after the decimal point")},
    {"usd_comma", B("/diverge budget $1,000"),
     FAILS(E_INVALID, "line 1: invalid amount `$1,000`: amount is not a decimal number of "
                      "dollars")},
    {"tokens_plus", B("/diverge budget +2000000"), WANT(1, TOK(SLASHCMD_BUDGET, 2000000))},
    {"tokens_M", B("/diverge budget 2M"), WANT(1, TOK(SLASHCMD_BUDGET, 2000000))},
    {"tokens_m", B("/diverge budget 3m"), WANT(1, TOK(SLASHCMD_BUDGET, 3000000))},
    {"tokens_k", B("/diverge budget 500k"), WANT(1, TOK(SLASHCMD_BUDGET, 500000))},
    {"tokens_plus_K", B("/diverge budget +5K"), WANT(1, TOK(SLASHCMD_BUDGET, 5000))},
    {"tokens_zero", B("/diverge budget 0"), WANT(1, TOK(SLASHCMD_BUDGET, 0))},
    {"tokens_max", B("/diverge budget 9223372036854775807"),
     WANT(1, TOK(SLASHCMD_BUDGET, INT64_MAX))},
    {"tokens_overflow", B("/diverge budget 9223372036854775808"),
     FAILS(E_INVALID, "line 1: amount `9223372036854775808` is too large")},
    {"tokens_suffix_overflow", B("/diverge budget 9223372036854776k"),
     FAILS(E_INVALID, "line 1: amount `9223372036854776k` is too large")},
    {"tokens_decimal_M", B("/diverge budget 1.5M"),
     FAILS(E_INVALID, "line 1: invalid amount `1.5M`: tokens with k or M must be whole numbers")},
    {"tokens_suffix_G", B("/diverge budget 2G"), FAILS(E_INVALID, "line 1: invalid amount `2G`")},
    {"double_plus", B("/diverge budget ++5"), FAILS(E_INVALID, "line 1: invalid amount `++5`")},
    {"plus_alone", B("/diverge budget +"), FAILS(E_INVALID, "line 1: invalid amount `+`")},
    {"word_amount", B("/diverge budget abc"), FAILS(E_INVALID, "line 1: invalid amount `abc`")},
    {"negative_tokens", B("/diverge budget -5"),
     FAILS(E_INVALID, "line 1: invalid amount `-5`: amounts cannot be negative")},
    {"negative_usd", B("/diverge resume -$5"),
     FAILS(E_INVALID, "line 1: invalid amount `-$5`: amounts cannot be negative")},
    {"duplicate_usd", B("/diverge budget $1 $2"),
     FAILS(E_INVALID, "line 1: duplicate USD amount `$2`")},
    {"duplicate_usd_forms", B("/diverge budget $1 1.50"),
     FAILS(E_INVALID, "line 1: duplicate USD amount `1.50`")},
    {"duplicate_tokens", B("/diverge resume 1k 2M"),
     FAILS(E_INVALID, "line 1: duplicate token amount `2M`")},
    /* At most 80 characters are echoed, cut between characters, then U+2026. */
    {"long_argument_cut", B("/diverge budget " X80 "x"),
     FAILS(E_INVALID, "line 1: invalid amount `" X80 "\xE2\x80\xA6`")},
    {"argument_of_80_not_cut", B("/diverge budget " X80),
     FAILS(E_INVALID, "line 1: invalid amount `" X80 "`")},
    {"cut_after_utf8", B("/diverge budget " X10 X10 X10 X10 X10 X10 X10 "xxxxxxxxx\xc3\xa9yz"),
     FAILS(E_INVALID, "line 1: invalid amount `" X10 X10 X10 X10 X10 X10 X10
                      "xxxxxxxxx\xc3\xa9\xE2\x80\xA6`")},
    /* Echoed arguments cannot end their code span, ping anyone or open HTML. */
    {"argument_backticks", B("/diverge budget a``b`"),
     FAILS(E_INVALID, "line 1: invalid amount ``` a``b` ```")},
    {"argument_mention_html", B("/diverge pause @team<!--&"),
     FAILS(E_INVALID, "line 1: unexpected argument `@\xE2\x80\x8Dteam\xEF\xBC\x9C!--"
                      "\xEF\xBC\x86` to pause")},
    {"argument_bidi_and_separators",
     B("/diverge pause a\xE2\x80\xAE"
       "b\xE2\x80\xA8"
       "c\xE2\x81\xA6"),
     FAILS(E_INVALID, "line 1: unexpected argument `a\xEF\xBF\xBD"
                      "b\xEF\xBF\xBD"
                      "c\xEF\xBF\xBD` to pause")},
    {"argument_binary", B("/diverge pause \x01\xff\x7f"),
     FAILS(E_INVALID, "line 1: unexpected argument `\\x01\\xff\\x7f` to pause")},

    /* text bytes */
    {"unicode_objective",
     B("/diverge fix r\xc3\xa9parer le test \xf0\x9f\x9a\x80 \xe2\x80\x94 "
       "\xe4\xbf\xae\xe5\xa4\x8d"),
     WANT(1,
          TEXT(SLASHCMD_FIX, 1,
               "r\xc3\xa9parer le test \xf0\x9f\x9a\x80 \xe2\x80\x94 \xe4\xbf\xae\xe5\xa4\x8d"))},
    {"hint_inner_tab", B("/diverge guide a\tb"), WANT(1, TEXT(SLASHCMD_GUIDE, 1, "a\tb"))},
    {"objective_with_nul", B("/diverge fix a\0b"),
     FAILS(E_INVALID, "line 1: the text after fix has a control character or invalid UTF-8")},
    {"objective_invalid_utf8", B("/diverge fix \xff\xfe"),
     FAILS(E_INVALID, "line 1: the text after fix has a control character or invalid UTF-8")},
    {"hint_surrogate", B("/diverge guide \xed\xa0\x80"),
     FAILS(E_INVALID, "line 1: the text after guide has a control character or invalid UTF-8")},
    {"nul_line_before", B("\0\n/diverge pause"), WANT(1, BARE(SLASHCMD_PAUSE, 2))},

    /* nothing there */
    {"empty", B(""), NONE},
    {"whitespace_only", B("  \n\t\n\r\n   "), NONE},
    {"plain_text", B("LGTM, thanks"), NONE},
};

static bool cmd_matches(const struct slashcmd *c, const struct want *w)
{
    bool text_ok =
        (w->text == NULL) ? c->text == NULL : (c->text != NULL && strcmp(c->text, w->text) == 0);

    return c->verb == w->verb && text_ok && c->has_usd == w->has_usd && c->usd_micros == w->usd &&
           c->has_tokens == w->has_tokens && c->tokens == w->tokens && c->line == w->line;
}

static void check_case(const struct tcase *tc)
{
    struct slashcmd_list *list = NULL;
    struct err err = {0};
    int rc = slashcmd_parse(&list, tc->body, tc->len, &err);

    if (rc != tc->rc) {
        t_fail(__FILE__, __LINE__, "%s: rc %d, want %d (%s)", tc->name, rc, tc->rc, err.msg);
        goto out;
    }
    if (rc != E_OK) {
        if (list != NULL || strcmp(err.msg, tc->msg) != 0) {
            t_fail(__FILE__, __LINE__, "%s: message \"%s\", want \"%s\"", tc->name, err.msg,
                   tc->msg);
        }
        goto out;
    }
    if (list->len != tc->ncmds) {
        t_fail(__FILE__, __LINE__, "%s: %zu commands, want %zu", tc->name, list->len, tc->ncmds);
        goto out;
    }
    for (size_t i = 0; i < list->len; i++) {
        const struct slashcmd *c = &list->cmds[i];

        if (!cmd_matches(c, &tc->cmds[i])) {
            t_fail(__FILE__, __LINE__,
                   "%s: command %zu is {%s, \"%s\", usd %d %lld, tokens %d %lld, line %d}",
                   tc->name, i, slashcmd_verb_name(c->verb), c->text ? c->text : "(null)",
                   c->has_usd, (long long)c->usd_micros, c->has_tokens, (long long)c->tokens,
                   c->line);
        }
    }
out:
    slashcmd_list_free(list);
}

TEST(grammar_table)
{
    CHECK(ARRAY_LEN(cases) >= 60);
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        check_case(&cases[i]);
    }
}

/* A body of N copies of LINE; caller frees. */
static char *repeat(const char *line, size_t n, size_t *len_out)
{
    size_t l = strlen(line);
    char *s = xmalloc(l * n + 1);

    for (size_t i = 0; i < n; i++) {
        memcpy(s + i * l, line, l);
    }
    s[l * n] = '\0';
    *len_out = l * n;
    return s;
}

TEST(size_caps)
{
    struct slashcmd_list *list = NULL;
    struct err err = {0};
    char *big = xcalloc(1, SLASHCMD_BODY_MAX + 1);
    size_t len;
    char *many;

    memset(big, ' ', SLASHCMD_BODY_MAX);
    memcpy(big + SLASHCMD_BODY_MAX - 13, "/diverge help", 13);
    big[SLASHCMD_BODY_MAX - 14] = '\n';
    CHECK_EQ_INT(slashcmd_parse(&list, big, SLASHCMD_BODY_MAX + 1, &err), E_TOOBIG);
    CHECK(list == NULL);
    CHECK_OK(slashcmd_parse(&list, big, SLASHCMD_BODY_MAX, &err));
    CHECK(list != NULL && list->len == 1 && list->cmds[0].line == 2);
    slashcmd_list_free(list);
    free(big);

    many = repeat("/diverge help\n", SLASHCMD_MAX_COMMANDS, &len);
    CHECK_OK(slashcmd_parse(&list, many, len, &err));
    CHECK(list != NULL && list->len == SLASHCMD_MAX_COMMANDS);
    slashcmd_list_free(list);
    free(many);
    many = repeat("/diverge fix it\n", SLASHCMD_MAX_COMMANDS + 1, &len);
    CHECK_EQ_INT(slashcmd_parse(&list, many, len, &err), E_TOOBIG);
    CHECK_EQ_STR(err.msg, "line 33: more than 32 commands in one comment");
    CHECK(list == NULL);
    free(many);
}

/* Lines built to make a backtracking matcher slow or hungry parse quickly and cleanly. */
TEST(pathological_lines)
{
    static const char *const units[] = {"- ", "1. ", " ", "`", "/diverge fix a ", "<!--"};

    for (size_t i = 0; i < ARRAY_LEN(units); i++) {
        struct slashcmd_list *list = NULL;
        struct err err = {0};
        size_t len;
        char *body = repeat(units[i], SLASHCMD_BODY_MAX / strlen(units[i]), &len);

        CHECK_OK(slashcmd_parse(&list, body, len, &err));
        CHECK(list != NULL && list->len == (i == 4 ? 1u : 0u));
        slashcmd_list_free(list);
        free(body);
    }
}

TEST(null_err_and_empty_body)
{
    struct slashcmd_list *list = NULL;

    CHECK_EQ_INT(slashcmd_parse(&list, "/diverge nope", 13, NULL), E_INVALID);
    CHECK(list == NULL);
    CHECK_OK(slashcmd_parse(&list, NULL, 0, NULL));
    CHECK(list != NULL && list->len == 0);
    slashcmd_list_free(list);
    slashcmd_list_free(NULL);
}

TEST(every_byte_in_every_place)
{
    for (int b = 0; b < 256; b++) {
        char body[] = "/diverge fix ?a\n/diverge budget 1?\n?/diverge pause\n```?\n";
        struct slashcmd_list *list = NULL;
        struct err err = {0};
        int rc;

        for (size_t i = 0; i < sizeof(body) - 1; i++) {
            if (body[i] == '?') {
                body[i] = (char)b;
            }
        }
        rc = slashcmd_parse(&list, body, sizeof(body) - 1, &err);
        CHECK(rc == E_OK || rc == E_INVALID);
        CHECK((rc == E_OK) == (list != NULL));
        slashcmd_list_free(list);
    }
}

TEST(mentions_prefilter)
{
    static const struct {
        const char *body;
        bool want;
    } m[] = {
        {"", false},         {"/diverg", false},          {"nothing here", false},
        {"/diverge", true},  {"x /DiVeRgE y", true},      {"> /diverge pause", true},
        {"//diverge", true}, {"/divergx /diverge", true},
    };
    for (size_t i = 0; i < ARRAY_LEN(m); i++) {
        if (slashcmd_mentions(m[i].body, strlen(m[i].body)) != m[i].want) {
            t_fail(__FILE__, __LINE__, "slashcmd_mentions(\"%s\") != %d", m[i].body, m[i].want);
        }
    }
    CHECK(slashcmd_mentions("\0/diverge", 9));
    CHECK(!slashcmd_mentions("/diverge", 7));
    CHECK(!slashcmd_mentions(NULL, 0));
}

TEST(asks_fix)
{
    static const struct {
        const char *body;
        bool want;
    } m[] = {
        {"/diverge fix the N+1 query", true},
        {"looks good\n/diverge budget $2\n/diverge fix it", true},
        {"/diverge status", false},
        {"```\n/diverge fix inside a code block\n```", false},
        {"/diverge fix", false}, /* no objective: the parse refuses the whole comment */
        {"/diverge frobnicate", false},
        {"no command at all", false},
    };
    struct slashcmd_list *list = NULL;
    struct err err = {0};

    for (size_t i = 0; i < ARRAY_LEN(m); i++) {
        if (slashcmd_asks_fix(m[i].body, strlen(m[i].body)) != m[i].want) {
            t_fail(__FILE__, __LINE__, "slashcmd_asks_fix(\"%s\") != %d", m[i].body, m[i].want);
        }
    }
    CHECK(!slashcmd_asks_fix(NULL, 0));
    CHECK(!slashcmd_has(NULL, SLASHCMD_FIX));
    CHECK_EQ_INT(slashcmd_parse(&list, "/diverge pause\n/diverge status", 30, &err), E_OK);
    CHECK(slashcmd_has(list, SLASHCMD_STATUS) && slashcmd_has(list, SLASHCMD_PAUSE));
    CHECK(!slashcmd_has(list, SLASHCMD_FIX));
    slashcmd_list_free(list);
}

TEST(verb_names_and_help)
{
    static const char *const names[] = {"fix",    "guide",  "budget", "pause",
                                        "resume", "status", "help"};
    const char *help = slashcmd_help_markdown();

    CHECK_EQ_STR(slashcmd_verb_name((enum slashcmd_verb)0), "unknown");
    CHECK_EQ_STR(slashcmd_verb_name((enum slashcmd_verb)99), "unknown");
    CHECK(strncmp(help, "| command | effect | who may use it |\n| --- | --- | --- |\n", 55) == 0);
    for (size_t i = 0; i < ARRAY_LEN(names); i++) {
        char cell[32];

        CHECK_EQ_STR(slashcmd_verb_name((enum slashcmd_verb)(SLASHCMD_FIX + (int)i)), names[i]);
        snprintf(cell, sizeof(cell), "| `/diverge %s", names[i]);
        if (strstr(help, cell) == NULL) {
            t_fail(__FILE__, __LINE__, "help has no row for %s", names[i]);
        }
    }
}

static void *parse_loop(void *arg)
{
    static const char body[] = "hi\r\n```\n/diverge pause\n```\n/diverge budget $1.25 3M\r\n"
                               "/diverge fix \xc3\xa9t\xc3\xa9\n";
    long *bad = arg;

    for (int i = 0; i < 2000; i++) {
        struct slashcmd_list *list = NULL;

        if (slashcmd_parse(&list, body, sizeof(body) - 1, NULL) != E_OK || list->len != 2 ||
            list->cmds[0].usd_micros != 1250000 || list->cmds[0].tokens != 3000000) {
            (*bad)++;
        }
        slashcmd_list_free(list);
    }
    return NULL;
}

TEST(parallel_parsing)
{
    pthread_t th[4];
    long bad[4] = {0};

    for (int i = 0; i < 4; i++) {
        CHECK_OK(pthread_create(&th[i], NULL, parse_loop, &bad[i]));
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_INT(bad[i], 0);
    }
}

T_MAIN
