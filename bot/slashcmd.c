/* SPDX-License-Identifier: Apache-2.0 */
/* Slash-command grammar (SPEC section 5). A comment is accepted whole or not at all, so a
 * caller never applies half of it. The PCRE2 patterns are compiled once and then only read,
 * which pcre2_match() allows from any number of threads; match data is per call. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "bot/slashcmd.h"

#include <pcre2.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "bot/bot_int.h"
#include "common/money.h"

/* Separators inside a line: Markdown whitespace without the newline. \r is one of them,
 * so CRLF comments need no special case. */
#define WS "[ \\t\\v\\f\\r]"
/* What may stand before a fence: indentation and list markers. CommonMark allows three
 * spaces at top level but more inside list items; we accept any, so code in a list item
 * is never run. When unsure we fail closed: a line wrongly taken for a fence only hides
 * commands, it never runs one. The markers are bounded: each one costs PCRE2 a frame. */
#define FENCE_LEAD "\\A[ \\t]*(?:(?:[-*+]|[0-9]{1,9}[.)])[ \\t]+){0,8}"

/* Patterns work on bytes (no UTF mode), so invalid UTF-8 can't make a match fail. */
enum pat_id {
    PAT_COMMAND,        /* a command line; group 1: everything after "/diverge" */
    PAT_FENCE_OPEN,     /* group 1: the fence run; group 2: the info string */
    PAT_FENCE_CLOSE,    /* group 1: the fence run */
    PAT_HTML_OPEN,      /* a line starting an HTML comment */
    PAT_HTML_CLOSE,     /* the end of an HTML comment, anywhere in the line */
    PAT_TOKENS,         /* group 1: digits; group 2: k/K/m/M suffix or unset */
    PAT_SCALED_DECIMAL, /* "1.5M": a decimal with a token suffix */
    PAT_COUNT,
};

static const struct {
    const char *src;
    uint32_t options;
} pat_defs[PAT_COUNT] = {
    /* "/diverge" must be a whole word: "/divergex" and "/diverge," are not commands. */
    [PAT_COMMAND] = {"\\A" WS "*/diverge(?=" WS "|\\z)" WS "*(.*)\\z",
                     PCRE2_CASELESS | PCRE2_DOTALL},
    [PAT_FENCE_OPEN] = {FENCE_LEAD "(`{3,}|~{3,})(.*)\\z", PCRE2_DOTALL},
    [PAT_FENCE_CLOSE] = {"\\A[ \\t]*(`{3,}|~{3,})" WS "*\\z", 0},
    [PAT_HTML_OPEN] = {"\\A[ \\t]*<!--", 0},
    [PAT_HTML_CLOSE] = {"-->", 0},
    /* Tokens are whole numbers; k and M are decimal (1,000 and 1,000,000). */
    [PAT_TOKENS] = {"\\A\\+?([0-9]+)([kKmM])?\\z", 0},
    /* "1.5M" reads as either 1.5 million tokens or a dollar amount: rejected, not guessed. */
    [PAT_SCALED_DECIMAL] = {"\\A\\+?[0-9]*\\.[0-9]*[kKmM]\\z", 0},
};

/* Far above what these patterns need on a 256 KiB line; reaching either refuses the
 * comment instead of letting one comment take unbounded time or memory. */
#define PAT_MATCH_LIMIT 1000000
#define PAT_HEAP_LIMIT_KIB 1024

static pcre2_code *g_pat[PAT_COUNT]; /* compiled once by compile_patterns, never freed */
static pcre2_match_context *g_mctx;  /* the limits above; read-only after compile_patterns */
static pthread_once_t g_pat_once = PTHREAD_ONCE_INIT;

enum scan_state {
    SCAN_TEXT,  /* ordinary Markdown: command lines count */
    SCAN_FENCE, /* inside a fenced code block */
    SCAN_HTML,  /* inside an HTML comment, which the reader never sees */
};

/* Per-call parsing state. */
struct scan {
    pcre2_match_data *md;  /* owned; reused for every match of this call */
    enum scan_state state; /* where the previous line left us */
    bool over_limit;       /* a match hit a PCRE2 limit: the comment is refused */
    char fence_char;       /* '`' or '~' while in SCAN_FENCE */
    size_t fence_len;      /* length of the opening fence run */
};

/* The part of a command line after the verb. */
struct cmd_args {
    struct scan *sc; /* borrowed, for its match data */
    const char *s;   /* borrowed; not NUL-terminated */
    size_t len;      /* bytes at s */
    int line;        /* 1-based line number, for messages */
};

struct verb_def;
typedef int (*verb_handler_fn)(struct slashcmd *cmd, const struct verb_def *def,
                               const struct cmd_args *a, struct err *err);

struct verb_def {
    const char *name;        /* lower case, matched ASCII case-insensitively */
    enum slashcmd_verb verb; /* what the command becomes */
    int min_args;            /* arguments required after the verb */
    int max_args;            /* most arguments allowed; VERB_REST: one free-text argument */
    const char *what;        /* what is missing when there are fewer than min_args */
    verb_handler_fn handler; /* fills the command from the arguments */
};

#define VERB_REST (-1)

/* Every message holds at most one quoted argument and under 96 bytes of its own text. */
_Static_assert(SHOW_MAX + 96 <= ERR_MSG_MAX, "a quoted argument must fit in an error message");

static int handle_text(struct slashcmd *cmd, const struct verb_def *def, const struct cmd_args *a,
                       struct err *err);
static int handle_amounts(struct slashcmd *cmd, const struct verb_def *def,
                          const struct cmd_args *a, struct err *err);

static const struct verb_def verbs[] = {
    {"fix", SLASHCMD_FIX, 1, VERB_REST, "an objective", handle_text},
    {"guide", SLASHCMD_GUIDE, 1, VERB_REST, "a hint", handle_text},
    {"budget", SLASHCMD_BUDGET, 1, 2, "at least one amount", handle_amounts},
    {"pause", SLASHCMD_PAUSE, 0, 0, "", handle_amounts},
    {"resume", SLASHCMD_RESUME, 0, 2, "", handle_amounts},
    {"status", SLASHCMD_STATUS, 0, 0, "", handle_amounts},
    {"help", SLASHCMD_HELP, 0, 0, "", handle_amounts},
};

static void compile_patterns(void)
{
    for (size_t i = 0; i < PAT_COUNT; i++) {
        int code = 0;
        PCRE2_SIZE off = 0;

        g_pat[i] = pcre2_compile((PCRE2_SPTR)pat_defs[i].src, PCRE2_ZERO_TERMINATED,
                                 pat_defs[i].options | PCRE2_NEVER_UTF | PCRE2_NEVER_UCP, &code,
                                 &off, NULL);
        /* Constant patterns: failing to compile them is a bug (or out of memory). */
        ASSERT(g_pat[i] != NULL);
    }
    g_mctx = pcre2_match_context_create(NULL);
    ASSERT(g_mctx != NULL); /* out of memory aborts, as in xmalloc */
    pcre2_set_match_limit(g_mctx, PAT_MATCH_LIMIT);
    pcre2_set_heap_limit(g_mctx, PAT_HEAP_LIMIT_KIB);
}

/* True when pattern ID matches S[0..n); the ovector of sc->md then holds the groups. */
static bool pat_match(struct scan *sc, enum pat_id id, const char *s, size_t n)
{
    int rc = pcre2_match(g_pat[id], (PCRE2_SPTR)s, n, 0, 0, sc->md, g_mctx);

    ASSERT(rc != 0); /* 0: the match data has too few pairs for the pattern's groups */
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
        sc->over_limit = true;
    }
    return rc > 0;
}

/* Start and length of group G of the last match; length 0 when the group is unset. */
static const char *pat_group(struct scan *sc, const char *s, int g, size_t *len_out)
{
    const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(sc->md);

    if (ov[2 * g] == PCRE2_UNSET) {
        *len_out = 0;
        return s;
    }
    *len_out = ov[2 * g + 1] - ov[2 * g];
    return s + ov[2 * g];
}

static int handle_text(struct slashcmd *cmd, const struct verb_def *def, const struct cmd_args *a,
                       struct err *err)
{
    const char *s = a->s;
    size_t n = a->len;

    slashcmd_trim(&s, &n);
    if (n == 0) {
        return err_set(err, E_INVALID, "line %d: %s needs %s", a->line, def->name, def->what);
    }
    if (!slashcmd_text_ok(s, n)) {
        return err_set(err, E_INVALID,
                       "line %d: the text after %s has a control character or invalid UTF-8",
                       a->line, def->name);
    }
    cmd->text = xstrndup(s, n);
    return E_OK;
}

static int parse_tokens(int64_t *out, struct scan *sc, const char *t, int line, const char *shown,
                        struct err *err)
{
    size_t nd, ns;
    const char *d = pat_group(sc, t, 1, &nd);
    const char *suffix = pat_group(sc, t, 2, &ns);
    int64_t v = 0, mult = 1;

    for (size_t i = 0; i < nd; i++) {
        if (v > (INT64_MAX - (d[i] - '0')) / 10) {
            return err_set(err, E_INVALID, "line %d: amount %s is too large", line, shown);
        }
        v = v * 10 + (d[i] - '0');
    }
    if (ns == 1) {
        mult = slashcmd_lower(suffix[0]) == 'k' ? INT64_C(1000) : INT64_C(1000000);
    }
    if (v > INT64_MAX / mult) {
        return err_set(err, E_INVALID, "line %d: amount %s is too large", line, shown);
    }
    *out = v * mult;
    return E_OK;
}

static int parse_usd(int64_t *out, const char *t, size_t n, int line, const char *shown,
                     struct err *err)
{
    struct err merr = {0};
    int rc = money_parse_n(out, NULL, t, n, &merr);

    if (rc == E_TOOBIG) {
        return err_set(err, E_INVALID, "line %d: amount %s is too large", line, shown);
    }
    if (rc != E_OK) {
        return err_set(err, E_INVALID, "line %d: invalid amount %s: %s", line, shown, merr.msg);
    }
    return E_OK;
}

/* Classifies and parses one amount: *usd_out says which kind it is. */
static int parse_amount(int64_t *v_out, bool *usd_out, struct scan *sc, const char *t, size_t n,
                        int line, struct err *err)
{
    char shown[SHOW_MAX];

    slashcmd_show_arg(shown, t, n);
    *usd_out = false;
    if (t[0] == '-') {
        return err_set(err, E_INVALID, "line %d: invalid amount %s: amounts cannot be negative",
                       line, shown);
    }
    if (pat_match(sc, PAT_TOKENS, t, n)) {
        return parse_tokens(v_out, sc, t, line, shown, err);
    }
    if (pat_match(sc, PAT_SCALED_DECIMAL, t, n)) {
        return err_set(err, E_INVALID,
                       "line %d: invalid amount %s: tokens with k or M must be whole numbers", line,
                       shown);
    }
    /* USD is whatever is written with "$" or a decimal point; money_parse says if it is. */
    if (memchr(t, '$', n) != NULL || memchr(t, '.', n) != NULL) {
        *usd_out = true;
        return parse_usd(v_out, t, n, line, shown, err);
    }
    return err_set(err, E_INVALID, "line %d: invalid amount %s", line, shown);
}

static int add_amount(struct slashcmd *cmd, struct scan *sc, const char *t, size_t n, int line,
                      struct err *err)
{
    char shown[SHOW_MAX];
    int64_t v = 0;
    bool usd = false;
    int rc = parse_amount(&v, &usd, sc, t, n, line, err);

    if (rc != E_OK) {
        return rc;
    }
    if (usd ? cmd->has_usd : cmd->has_tokens) {
        slashcmd_show_arg(shown, t, n);
        return err_set(err, E_INVALID, "line %d: duplicate %s amount %s", line,
                       usd ? "USD" : "token", shown);
    }
    if (usd) {
        cmd->has_usd = true;
        cmd->usd_micros = v;
    } else {
        cmd->has_tokens = true;
        cmd->tokens = v;
    }
    return E_OK;
}

/* Every verb without free text: zero or more amounts, within the verb's bounds. */
static int handle_amounts(struct slashcmd *cmd, const struct verb_def *def,
                          const struct cmd_args *a, struct err *err)
{
    const char *s = a->s, *tok;
    size_t n = a->len, tlen;
    int count = 0, rc;

    while (slashcmd_next_token(&tok, &tlen, &s, &n)) {
        if (count >= def->max_args) {
            char shown[SHOW_MAX];

            slashcmd_show_arg(shown, tok, tlen);
            return err_set(err, E_INVALID, "line %d: unexpected argument %s to %s", a->line, shown,
                           def->name);
        }
        rc = add_amount(cmd, a->sc, tok, tlen, a->line, err);
        if (rc != E_OK) {
            return rc;
        }
        count++;
    }
    if (count < def->min_args) {
        return err_set(err, E_INVALID, "line %d: %s needs %s", a->line, def->name, def->what);
    }
    return E_OK;
}

static const struct verb_def *verb_find(const char *s, size_t n)
{
    for (size_t i = 0; i < ARRAY_LEN(verbs); i++) {
        if (slashcmd_ieq(s, n, verbs[i].name)) {
            return &verbs[i];
        }
    }
    return NULL;
}

/* Parses REST, the part of command line LINE after "/diverge", into CMD (zeroed). */
static int parse_command(struct slashcmd *cmd, struct scan *sc, const char *rest, size_t n,
                         int line, struct err *err)
{
    char shown[SHOW_MAX];
    const char *verb;
    size_t vlen;
    const struct verb_def *def;
    struct cmd_args a;

    if (!slashcmd_next_token(&verb, &vlen, &rest, &n)) {
        return err_set(err, E_INVALID, "line %d: missing verb after /diverge", line);
    }
    def = verb_find(verb, vlen);
    if (def == NULL) {
        slashcmd_show_arg(shown, verb, vlen);
        return err_set(err, E_INVALID, "line %d: unknown verb %s", line, shown);
    }
    cmd->verb = def->verb;
    cmd->line = line;
    a.sc = sc;
    a.s = rest;
    a.len = n;
    a.line = line;
    return def->handler(cmd, def, &a, err);
}

/* A fence opens on "```info" or "~~~info"; a backtick fence's info string has no backtick
 * (otherwise the line is inline code). */
static bool opens_fence(struct scan *sc, const char *s, size_t n)
{
    size_t flen, ilen;
    const char *fence, *info;

    if (!pat_match(sc, PAT_FENCE_OPEN, s, n)) {
        return false;
    }
    fence = pat_group(sc, s, 1, &flen);
    info = pat_group(sc, s, 2, &ilen);
    if (fence[0] == '`' && memchr(info, '`', ilen) != NULL) {
        return false;
    }
    sc->fence_char = fence[0];
    sc->fence_len = flen;
    return true;
}

/* Only a bare run of the same character, at least as long as the opening one, closes. */
static bool closes_fence(struct scan *sc, const char *s, size_t n)
{
    size_t flen;
    const char *fence;

    if (!pat_match(sc, PAT_FENCE_CLOSE, s, n)) {
        return false;
    }
    fence = pat_group(sc, s, 1, &flen);
    return fence[0] == sc->fence_char && flen >= sc->fence_len;
}

/* An HTML comment starts on a line beginning with "<!--" and ends on the line holding
 * "-->", which may be the same one. */
static bool opens_html_comment(struct scan *sc, const char *s, size_t n)
{
    size_t end;

    if (!pat_match(sc, PAT_HTML_OPEN, s, n)) {
        return false;
    }
    end = pcre2_get_ovector_pointer(sc->md)[1];
    return !pat_match(sc, PAT_HTML_CLOSE, s + end, n - end);
}

/* Advances the block state over one line; true when the line is visible text that may be a
 * command. Quoted lines need no case here: their first word is ">", never "/diverge", and
 * a fence inside a quote ends with the quote, as in CommonMark. */
static bool line_is_text(struct scan *sc, const char *s, size_t n)
{
    switch (sc->state) {
    case SCAN_FENCE:
        if (closes_fence(sc, s, n)) {
            sc->state = SCAN_TEXT;
        }
        return false;
    case SCAN_HTML:
        if (pat_match(sc, PAT_HTML_CLOSE, s, n)) {
            sc->state = SCAN_TEXT;
        }
        return false;
    case SCAN_TEXT:
        break;
    }
    if (opens_fence(sc, s, n)) {
        sc->state = SCAN_FENCE;
        return false;
    }
    if (opens_html_comment(sc, s, n)) {
        sc->state = SCAN_HTML;
        return false;
    }
    return true;
}

/* Handles line LINE = S[0..n): appends to LIST when it is a valid command. */
static int scan_line(struct slashcmd_list *list, struct scan *sc, const char *s, size_t n, int line,
                     struct err *err)
{
    struct slashcmd *cmd;
    const char *rest;
    size_t rlen;
    int rc;

    if (!line_is_text(sc, s, n) || !pat_match(sc, PAT_COMMAND, s, n)) {
        return E_OK;
    }
    if (list->len == SLASHCMD_MAX_COMMANDS) {
        return err_set(err, E_TOOBIG, "line %d: more than %d commands in one comment", line,
                       SLASHCMD_MAX_COMMANDS);
    }
    rest = pat_group(sc, s, 1, &rlen);
    list->cmds = xrealloc(list->cmds, (list->len + 1) * sizeof(*list->cmds));
    cmd = &list->cmds[list->len];
    memset(cmd, 0, sizeof(*cmd));
    rc = parse_command(cmd, sc, rest, rlen, line, err);
    if (rc != E_OK) {
        free(cmd->text);
        return rc;
    }
    list->len++;
    return E_OK;
}

int slashcmd_parse(struct slashcmd_list **out, const char *body, size_t len, struct err *err)
{
    struct slashcmd_list *list = NULL;
    struct scan sc = {.md = NULL, .state = SCAN_TEXT};
    size_t pos = 0;
    int line = 0, rc = E_OK;

    *out = NULL;
    ASSERT(body != NULL || len == 0);
    if (len > SLASHCMD_BODY_MAX) {
        return err_set(err, E_TOOBIG, "comment is larger than %zu bytes", SLASHCMD_BODY_MAX);
    }
    pthread_once(&g_pat_once, compile_patterns);
    sc.md = pcre2_match_data_create(4, NULL);
    ASSERT(sc.md != NULL); /* out of memory aborts, as in xmalloc */
    list = xcalloc(1, sizeof(*list));
    while (pos < len) {
        const char *s = body + pos;
        const char *nl = memchr(s, '\n', len - pos);
        size_t n = nl != NULL ? (size_t)(nl - s) : len - pos;

        pos += n + (nl != NULL ? 1 : 0);
        line++;
        rc = scan_line(list, &sc, s, n, line, err);
        if (sc.over_limit) {
            /* Whatever scan_line concluded rests on a match that never finished. */
            rc = err_set(err, E_TOOBIG, "line %d: too complex to parse", line);
        }
        if (rc != E_OK) {
            goto out;
        }
    }
    *out = list;
    list = NULL;
out:
    slashcmd_list_free(list);
    pcre2_match_data_free(sc.md);
    return rc;
}

void slashcmd_list_free(struct slashcmd_list *list)
{
    if (list == NULL) {
        return;
    }
    for (size_t i = 0; i < list->len; i++) {
        free(list->cmds[i].text);
    }
    free(list->cmds);
    free(list);
}

bool slashcmd_has(const struct slashcmd_list *list, enum slashcmd_verb v)
{
    for (size_t i = 0; list != NULL && i < list->len; i++) {
        if (list->cmds[i].verb == v) {
            return true;
        }
    }
    return false;
}

bool slashcmd_asks_fix(const char *body, size_t len)
{
    struct slashcmd_list *list = NULL;
    struct err err = {0};
    bool fix;

    if (!slashcmd_mentions(body, len) || slashcmd_parse(&list, body, len, &err) != E_OK) {
        return false;
    }
    fix = slashcmd_has(list, SLASHCMD_FIX);
    slashcmd_list_free(list);
    return fix;
}

bool slashcmd_mentions(const char *body, size_t len)
{
    static const char word[] = "/diverge";
    const size_t wlen = sizeof(word) - 1;
    const char *p = body, *end = body + len;

    if (body == NULL) {
        return false;
    }
    while ((size_t)(end - p) >= wlen) {
        p = memchr(p, '/', (size_t)(end - p) - wlen + 1);
        if (p == NULL) {
            return false;
        }
        /* Most slashes of a payload are in URLs: one byte rules them out. */
        if (slashcmd_lower(p[1]) == 'd' && slashcmd_ieq(p + 1, wlen - 1, word + 1)) {
            return true;
        }
        p++;
    }
    return false;
}

const char *slashcmd_verb_name(enum slashcmd_verb verb)
{
    for (size_t i = 0; i < ARRAY_LEN(verbs); i++) {
        if (verbs[i].verb == verb) {
            return verbs[i].name;
        }
    }
    return "unknown";
}

const char *slashcmd_help_markdown(void)
{
    /* Dollar signs stay inside code spans: GitHub renders $...$ elsewhere as math. */
    return "| command | effect | who may use it |\n"
           "| --- | --- | --- |\n"
           "| `/diverge fix <objective>` | start an agent task on this branch, change the "
           "objective of the running one, or run a finished one again | write access "
           "(GitLab: Developer) |\n"
           "| `/diverge guide <hint>` | give the agent a hint, delivered on its next "
           "heartbeat | write access (GitLab: Developer) |\n"
           "| `/diverge budget [+$USD] [TOKENS]` | add to the task's USD and/or token budget "
           "| maintain access (GitLab: Maintainer) |\n"
           "| `/diverge pause` | suspend the task | write access (GitLab: Developer) |\n"
           "| `/diverge resume [+$USD] [TOKENS]` | add the amounts, if any, then resume the "
           "task | write access (GitLab: Developer); with amounts, maintain access (GitLab: "
           "Maintainer) |\n"
           "| `/diverge status` | list this project's tasks and their preview links | anyone "
           "who can comment |\n"
           "| `/diverge help` | show this table | anyone who can comment |\n"
           "\n"
           "Amounts are added to the budget: `$15`, `+$15.00` or `15.50` are dollars (up to 6 "
           "decimals); `2000000`, `+2000000`, `500k` or `2M` are tokens. One of each per "
           "command. The access levels shown are the defaults.\n";
}
