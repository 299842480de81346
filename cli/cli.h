/* SPDX-License-Identifier: Apache-2.0 */
/* The `diverge` command line (SPEC §10): verb dispatch, option parsing, and the pure
 * pieces (output rendering, budget arithmetic) that the verbs share and the tests check.
 * Everything here writes to stdout/stderr only through the functions that say so. */
#ifndef DIVERGE_CLI_CLI_H
#define DIVERGE_CLI_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/buf.h"
#include "common/err.h"

/* Process exit codes (SPEC §10). */
enum cli_exit {
    CLI_EXIT_OK = 0,          /* success */
    CLI_EXIT_FAILED = 1,      /* the operation failed: the server said no */
    CLI_EXIT_USAGE = 2,       /* bad arguments, flags or .diverge/agent.yaml */
    CLI_EXIT_UNREACHABLE = 3, /* the server could not be reached */
};

/* Every option any verb knows. The first five are global: accepted by every verb,
 * before or after it. */
enum cli_opt_id {
    CLI_OPT_SERVER,
    CLI_OPT_TOKEN,
    CLI_OPT_NAMESPACE,
    CLI_OPT_OUTPUT,
    CLI_OPT_HELP,
    CLI_OPT_ALL_NAMESPACES,
    CLI_OPT_NAME,
    CLI_OPT_BUDGET,
    CLI_OPT_TOKENS,
    CLI_OPT_MAX_ITERATIONS,
    CLI_OPT_BASE_BRANCH,
    CLI_OPT_WORKING_BRANCH,
    CLI_OPT_REPO,
    CLI_OPT_MODEL,
    CLI_OPT_DRAFT_PR,
    CLI_OPT_FORCE,
    CLI_OPT_FOLLOW,
    CLI_OPT_AS,
    CLI_OPT_PERMISSION,
    CLI_OPT_HEAD,
    CLI_OPT_BASE,
    CLI_OPT_OBJECTIVE,
    CLI_OPT_COUNT,
};

#define CLI_OPT_BIT(id_) (1u << (id_))
#define CLI_OPTS_GLOBAL                                                                            \
    (CLI_OPT_BIT(CLI_OPT_SERVER) | CLI_OPT_BIT(CLI_OPT_TOKEN) | CLI_OPT_BIT(CLI_OPT_NAMESPACE) |   \
     CLI_OPT_BIT(CLI_OPT_OUTPUT) | CLI_OPT_BIT(CLI_OPT_HELP))

#define CLI_ARGS_MAX 64

/* Parsed arguments; every string is borrowed from the argv that was parsed. */
struct cli_args {
    const char *pos[CLI_ARGS_MAX]; /* positional arguments, in order */
    int npos;                      /* entries in pos */
    struct {
        enum cli_opt_id id; /* which option */
        const char *value;  /* its value; NULL for a flag without value */
    } opt[CLI_ARGS_MAX];    /* options, in the order given */
    int nopt;               /* entries in opt */
};

/* Parses ARGV[0..argc): "--name value", "--name=value", "-n value", "-nvalue", flags,
 * positionals, and "--" ending the options. Options outside the bit set ALLOWED are
 * errors. Returns E_INVALID (unknown or misplaced flag, missing value) or E_TOOBIG (more
 * than CLI_ARGS_MAX positionals or options), with a one-line message in ERR. */
int cli_args_parse(struct cli_args *out, int argc, char **argv, unsigned allowed, struct err *err);

/* The value of the last occurrence of ID, or NULL. */
const char *cli_args_value(const struct cli_args *a, enum cli_opt_id id);

/* Whether ID was given at least once. */
bool cli_args_has(const struct cli_args *a, enum cli_opt_id id);

/* Index in ARGV of the first positional argument, skipping options (and the values of
 * those that take one); ARGC when there is none. */
int cli_args_find_word(int argc, char **argv);

/* Whether -h/--help appears before any "--" in ARGV. */
bool cli_args_wants_help(int argc, char **argv);

struct cli_ctx; /* the global options once resolved (cli_int.h) */

/* One verb of a dispatch table, handled in one of two ways (both return the exit code):
 *  - RAW gets ARGV[0] == NAME followed by every other argument in order (options given
 *    before the verb come right after NAME) and does its own parsing (`serve`, `task`);
 *  - else the dispatcher answers --help with USAGE, parses the options of
 *    CLI_OPTS_GLOBAL | OPTS, checks MIN_ARGS..MAX_ARGS positionals and UTF-8, resolves
 *    the global options into a struct cli_ctx, and calls RUN. */
struct cli_cmd {
    const char *name;                                             /* verb */
    int min_args;                                                 /* positionals, at least */
    int max_args;                                                 /* positionals, at most */
    int (*raw)(int argc, char **argv);                            /* or NULL */
    int (*run)(struct cli_ctx *ctx, const struct cli_args *args); /* when RAW is NULL */
    unsigned opts;     /* CLI_OPT_BIT()s RUN accepts besides the global ones */
    const char *usage; /* --help text for RUN verbs */
};

/* Runs the verb named in ARGV[0..argc) from CMDS. GROUP names the level in messages
 * ("" at the top, "task" for `diverge task`); USAGE answers a --help without a verb. */
int cli_dispatch(const struct cli_cmd *cmds, size_t n, const char *group, const char *usage,
                 int argc, char **argv);

/* Prints "diverge: <message>" as ONE line on stderr (control characters become
 * spaces). */
void cli_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* --- output --- */

enum cli_output {
    CLI_OUTPUT_TABLE,
    CLI_OUTPUT_JSON,
    CLI_OUTPUT_YAML,
};

/* Parses "table", "json" or "yaml"; E_INVALID otherwise. */
int cli_output_parse(enum cli_output *out, const char *s, struct err *err);

/* Re-indents the JSON text TEXT[0..len) (assumed valid) with two spaces per level,
 * keeping every token byte for byte (numbers are never re-rounded); ends with '\n'. */
void cli_json_pretty(struct buf *out, const char *text, size_t len);

/* Appends V as a YAML block document in kubectl's layout (sequences at their key's
 * indent; "{}"/"[]" for empty containers); strings are quoted when needed. */
void cli_yaml_emit(struct buf *out, const json_t *v);

/* Whether S must be quoted to stay a string in YAML 1.1 and 1.2. */
bool cli_yaml_needs_quotes(const char *s);

/* A text table in kubectl's layout: columns left-aligned and separated by three
 * spaces, widths in UTF-8 characters, no trailing spaces. */
struct cli_table {
    size_t ncols; /* columns */
    size_t nrows; /* rows added, header included */
    char **cells; /* owned; nrows * ncols owned strings */
};

/* Prepares T (caller storage) for rows of NCOLS cells; the first row added is the header. */
void cli_table_init(struct cli_table *t, size_t ncols);
/* Appends a row of T->ncols cells (copied; NULL is printed as ""). */
void cli_table_add(struct cli_table *t, const char *const *cells);
/* Appends every row of T to OUT, one line each. */
void cli_table_render(struct buf *out, const struct cli_table *t);
/* Frees the cells; T may be reused after cli_table_init(). */
void cli_table_cleanup(struct cli_table *t);

#define CLI_AGE_MAX 24

/* Formats the duration MS like kubectl's AGE column ("45s", "3m20s", "2h", "4d"):
 * k8s.io/apimachinery HumanDuration. */
void cli_format_age(char out[CLI_AGE_MAX], int64_t ms);

/* --- budgets --- */

/* The server's defaults when spec.budgetUSD / spec.budgetTokens are not positive
 * (SPEC §5 and §8: --default-budget-usd 5.00, --default-budget-tokens 1000000). The CLI
 * cannot see the server's flags, so a server started with other defaults would make
 * `task resume` bump from these instead; see cli_budget_bump(). */
#define CLI_DEFAULT_BUDGET_USD_MICROS INT64_C(5000000)
#define CLI_DEFAULT_BUDGET_TOKENS INT64_C(1000000)

/* The bumped budget: (SPEC_VALUE if positive, else SERVER_DEFAULT) + BUMP. E_TOOBIG on
 * overflow, E_INVALID for a negative bump. */
int cli_budget_bump(int64_t *out, int64_t spec_value, int64_t server_default, int64_t bump,
                    struct err *err);

/* Parses a token count: digits with an optional 'k' (thousand) or 'M' (million) suffix,
 * and, only when ALLOW_PLUS, a leading '+'. E_INVALID or E_TOOBIG otherwise. */
int cli_parse_tokens(int64_t *out, const char *s, bool allow_plus, struct err *err);

/* --- verbs (argv[0] is the verb; each returns the process exit code) --- */

/* `diverge task ...`. */
int cli_task_main(int argc, char **argv);

/* `diverge token ...`. */
int cli_token_main(int argc, char **argv);
/* `diverge quota list|status` (cmd_quota.c). */
int cli_quota_main(int argc, char **argv);
/* `diverge local ...` (cmd_local.c). */
int cli_local_main(int argc, char **argv);

#endif
