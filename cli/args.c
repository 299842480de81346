/* SPDX-License-Identifier: Apache-2.0 */
/* Option parsing from one table of every option, the verb dispatcher both levels of the
 * command line use, and the single-line error printer. argv is never modified; parsed
 * strings borrow from it. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_int.h"

const char *cli_program = "diverge";

struct opt_def {
    const char *name; /* long name without "--" */
    char short_name;  /* single-letter form, or 0 */
    bool takes_value; /* "--name value" rather than a flag */
};

static const struct opt_def opt_defs[CLI_OPT_COUNT] = {
    [CLI_OPT_SERVER] = {"server", 0, true},
    [CLI_OPT_TOKEN] = {"token", 0, true},
    [CLI_OPT_NAMESPACE] = {"namespace", 'n', true},
    [CLI_OPT_OUTPUT] = {"output", 'o', true},
    [CLI_OPT_HELP] = {"help", 'h', false},
    [CLI_OPT_ALL_NAMESPACES] = {"all-namespaces", 'A', false},
    [CLI_OPT_NAME] = {"name", 0, true},
    [CLI_OPT_BUDGET] = {"budget", 0, true},
    [CLI_OPT_TOKENS] = {"tokens", 0, true},
    [CLI_OPT_MAX_ITERATIONS] = {"max-iterations", 0, true},
    [CLI_OPT_BASE_BRANCH] = {"base-branch", 0, true},
    [CLI_OPT_WORKING_BRANCH] = {"working-branch", 0, true},
    [CLI_OPT_REPO] = {"repo", 0, true},
    [CLI_OPT_MODEL] = {"model", 0, true},
    [CLI_OPT_DRAFT_PR] = {"draft-pr", 0, false},
    [CLI_OPT_FORCE] = {"force", 0, false},
    [CLI_OPT_FOLLOW] = {"follow", 'f', false},
    [CLI_OPT_AS] = {"as", 0, true},
    [CLI_OPT_PERMISSION] = {"permission", 0, true},
    [CLI_OPT_HEAD] = {"head", 0, true},
    [CLI_OPT_BASE] = {"base", 0, true},
    [CLI_OPT_OBJECTIVE] = {"objective", 0, true},
};

/* Finds the option written as ARG ("--name[=v]" or "-x[v]"); *inline_out points at an
 * attached value or is NULL. Returns -1 when unknown. */
static int lookup(const char *arg, const char **inline_out)
{
    *inline_out = NULL;
    if (arg[1] == '-') {
        const char *name = arg + 2, *eq = strchr(name, '=');
        size_t len = eq != NULL ? (size_t)(eq - name) : strlen(name);
        for (int i = 0; i < CLI_OPT_COUNT; i++) {
            if (strlen(opt_defs[i].name) == len && strncmp(opt_defs[i].name, name, len) == 0) {
                *inline_out = eq != NULL ? eq + 1 : NULL;
                return i;
            }
        }
        return -1;
    }
    for (int i = 0; i < CLI_OPT_COUNT; i++) {
        if (opt_defs[i].short_name != 0 && opt_defs[i].short_name == arg[1]) {
            *inline_out = arg[2] != '\0' ? arg + 2 : NULL;
            return i;
        }
    }
    return -1;
}

static bool is_option(const char *arg)
{
    return arg[0] == '-' && arg[1] != '\0';
}

/* The option as the user would write it, for messages: "--budget" or "-n". */
static void spell(char out[64], const char *arg)
{
    size_t len = arg[1] == '-' ? strcspn(arg, "=") : 2;
    snprintf(out, 64, "%.*s", (int)(len < 63 ? len : 63), arg);
}

int cli_args_parse(struct cli_args *out, int argc, char **argv, unsigned allowed, struct err *err)
{
    bool options_done = false;

    memset(out, 0, sizeof(*out));
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i], *value;
        char name[64];
        int id;

        if (options_done || !is_option(arg)) {
            if (out->npos == CLI_ARGS_MAX) {
                return err_set(err, E_TOOBIG, "too many arguments");
            }
            out->pos[out->npos++] = arg;
            continue;
        }
        if (strcmp(arg, "--") == 0) {
            options_done = true;
            continue;
        }
        spell(name, arg);
        id = lookup(arg, &value);
        if (id < 0 || !(allowed & CLI_OPT_BIT(id))) {
            return err_set(err, E_INVALID, "unknown flag %s", name);
        }
        if (!opt_defs[id].takes_value && value != NULL) {
            return err_set(err, E_INVALID, "flag %s takes no value", name);
        }
        if (opt_defs[id].takes_value && value == NULL) {
            if (i + 1 == argc) {
                return err_set(err, E_INVALID, "flag %s needs a value", name);
            }
            value = argv[++i];
        }
        if (out->nopt == CLI_ARGS_MAX) {
            return err_set(err, E_TOOBIG, "too many flags");
        }
        out->opt[out->nopt].id = (enum cli_opt_id)id;
        out->opt[out->nopt].value = value;
        out->nopt++;
    }
    return E_OK;
}

const char *cli_args_value(const struct cli_args *a, enum cli_opt_id id)
{
    for (int i = a->nopt - 1; i >= 0; i--) {
        if (a->opt[i].id == id) {
            return a->opt[i].value;
        }
    }
    return NULL;
}

bool cli_args_has(const struct cli_args *a, enum cli_opt_id id)
{
    for (int i = 0; i < a->nopt; i++) {
        if (a->opt[i].id == id) {
            return true;
        }
    }
    return false;
}

int cli_args_find_word(int argc, char **argv)
{
    for (int i = 0; i < argc; i++) {
        const char *value;
        int id;

        if (strcmp(argv[i], "--") == 0) {
            return i + 1 < argc ? i + 1 : argc;
        }
        if (!is_option(argv[i])) {
            return i;
        }
        id = lookup(argv[i], &value);
        if (id >= 0 && opt_defs[id].takes_value && value == NULL) {
            i++; /* skip the option's value */
        }
    }
    return argc;
}

bool cli_args_wants_help(int argc, char **argv)
{
    for (int i = 0; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            return true;
        }
    }
    return false;
}

/* The API carries JSON strings, which must be UTF-8; reject a bad argument up front. */
static bool args_are_utf8(const struct cli_args *args)
{
    for (int i = 0; i < args->npos + args->nopt; i++) {
        const char *s = i < args->npos ? args->pos[i] : args->opt[i - args->npos].value;
        json_t *probe = s != NULL ? json_string(s) : NULL;
        if (s != NULL && probe == NULL) {
            return false;
        }
        json_decref(probe);
    }
    return true;
}

void cli_errorf(const char *fmt, ...)
{
    char line[2048];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    /* One line, whatever the server put in its message. */
    for (char *p = line; *p != '\0'; p++) {
        if ((unsigned char)*p < 0x20 || *p == 0x7f) {
            *p = ' ';
        }
    }
    fprintf(stderr, "diverge: %s\n", line);
}

/* Parses ARGV (the arguments after the verb) for C, resolves the global options and
 * runs C->run. FULL is the verb as typed ("task list"), for messages. */
static int run_parsed(const struct cli_cmd *c, const char *full, int argc, char **argv)
{
    struct cli_args args;
    struct cli_ctx ctx = {0};
    struct err err = {0};
    int rc;

    if (cli_args_parse(&args, argc, argv, CLI_OPTS_GLOBAL | c->opts, &err) != E_OK) {
        cli_errorf("%s: %s (see diverge %s --help)", full, err.msg, full);
        return CLI_EXIT_USAGE;
    }
    if (args.npos < c->min_args || args.npos > c->max_args) {
        if (c->min_args == c->max_args) {
            cli_errorf("%s: expected %d argument%s, got %d (see diverge %s --help)", full,
                       c->max_args, c->max_args == 1 ? "" : "s", args.npos, full);
        } else {
            cli_errorf("%s: expected %d to %d arguments, got %d (see diverge %s --help)", full,
                       c->min_args, c->max_args, args.npos, full);
        }
        return CLI_EXIT_USAGE;
    }
    if (!args_are_utf8(&args)) {
        cli_errorf("%s: arguments must be valid UTF-8", full);
        return CLI_EXIT_USAGE;
    }
    rc = cli_ctx_init(&ctx, &args, &err);
    if (rc != E_OK) {
        cli_errorf("%s", err.msg);
        rc = CLI_EXIT_USAGE;
    } else {
        rc = c->run(&ctx, &args);
    }
    cli_ctx_cleanup(&ctx);
    return rc;
}

static const struct cli_cmd *find_cmd(const struct cli_cmd *cmds, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(cmds[i].name, name) == 0) {
            return &cmds[i];
        }
    }
    return NULL;
}

int cli_dispatch(const struct cli_cmd *cmds, size_t n, const char *group, const char *usage,
                 int argc, char **argv)
{
    int w = cli_args_find_word(argc, argv), rc, nargc = 0;
    const char *sep = group[0] != '\0' ? " " : "", *colon = group[0] != '\0' ? ": " : "";
    const struct cli_cmd *c;
    char full[64], **nargv;

    if (w == argc) {
        if (cli_args_wants_help(argc, argv)) {
            fputs(usage, stdout);
            return CLI_EXIT_OK;
        }
        cli_errorf("%s%smissing command (see diverge%s%s --help)", group, colon, sep, group);
        return CLI_EXIT_USAGE;
    }
    c = find_cmd(cmds, n, argv[w]);
    if (c == NULL) {
        cli_errorf("%s%sunknown command \"%s\" (see diverge%s%s --help)", group, colon, argv[w],
                   sep, group);
        return CLI_EXIT_USAGE;
    }
    snprintf(full, sizeof(full), "%s%s%s", group, sep, c->name);
    /* The verb first, then the options that came before it, then the rest. */
    nargv = xcalloc((size_t)argc + 1, sizeof(char *));
    nargv[nargc++] = argv[w];
    for (int i = 0; i < argc; i++) {
        if (i != w) {
            nargv[nargc++] = argv[i];
        }
    }
    if (c->raw != NULL) {
        rc = c->raw(nargc, nargv);
    } else if (cli_args_wants_help(nargc - 1, nargv + 1)) {
        fputs(c->usage, stdout);
        rc = CLI_EXIT_OK;
    } else {
        rc = run_parsed(c, full, nargc - 1, nargv + 1);
    }
    free(nargv);
    return rc;
}
