/* SPDX-License-Identifier: Apache-2.0 */
/* token_tool: a thin command line over token/ for the interop test, so third-party
 * macaroon libraries can be checked against exactly the code the server runs.
 * Exit status: 0 success, 1 denied or invalid, 2 usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/money.h"
#include "token/token.h"

#define EXIT_DENIED 1
#define EXIT_USAGE 2

struct verb {
    const char *name;
    int min_args;
    int max_args;
    int (*handler)(int argc, char **argv);
    const char *usage;
};

static int load_key(unsigned char key[TOKEN_ROOT_KEY_LEN], const char *hex)
{
    struct err err = {0};

    if (token_root_key_parse(key, hex, &err) != E_OK) {
        fprintf(stderr, "token_tool: %s\n", err.msg);
        return EXIT_USAGE;
    }
    return 0;
}

static int decode(struct token **out, const char *s)
{
    struct err err = {0};

    if (token_decode(out, s, strlen(s), &err) != E_OK) {
        printf("invalid: %s\n", err.msg);
        return EXIT_DENIED;
    }
    return 0;
}

/* mint KEYHEX IDENTIFIER [CAVEAT...]: a plain macaroon at location "diverge". */
static int cmd_mint(int argc, char **argv)
{
    unsigned char key[TOKEN_ROOT_KEY_LEN];
    struct token *t = NULL;
    struct err err = {0};
    char *s = NULL;
    int rc = load_key(key, argv[0]);

    if (rc == 0 && token_mint(&t, key, TOKEN_LOCATION, argv[1], &err) != E_OK) {
        rc = EXIT_DENIED;
    }
    for (int i = 2; rc == 0 && i < argc; i++) {
        if (token_add_caveat(t, argv[i], &err) != E_OK) {
            rc = EXIT_DENIED;
        }
    }
    if (rc == 0) {
        token_encode(&s, t);
        printf("%s\n", s);
    } else if (rc == EXIT_DENIED) {
        printf("invalid: %s\n", err.msg);
    }
    free(s);
    token_free(t);
    return rc;
}

/* Splits "a,b,c" in place into LIST (at most MAX entries); "" gives none. */
static size_t split_list(const char **list, size_t max, char *s)
{
    size_t n = 0;

    while (s[0] != '\0' && n < max) {
        char *comma = strchr(s, ',');
        list[n++] = s;
        if (comma == NULL) {
            break;
        }
        *comma = '\0';
        s = comma + 1;
    }
    return n;
}

/* mint-task KEYHEX TASK NS GEN REPO BRANCH TOOLS MODELS MAX_USD MAX_TOKENS EXPIRES:
 * token_mint_task(); "" leaves a field unset. Prints the token, then the identifier. */
static int cmd_mint_task(int argc, char **argv)
{
    struct token_mint_opts o = TOKEN_MINT_OPTS_DEFAULTS;
    const char *tools[16], *models[16];
    unsigned char key[TOKEN_ROOT_KEY_LEN];
    struct err err = {0};
    char *s = NULL, *id = NULL;
    int rc = load_key(key, argv[0]);

    (void)argc;
    o.task = argv[1], o.ns = argv[2], o.repo = argv[4], o.branch = argv[5];
    o.generation = strtoll(argv[3], NULL, 10);
    o.tools = tools, o.n_tools = split_list(tools, ARRAY_LEN(tools), argv[6]);
    o.models = models, o.n_models = split_list(models, ARRAY_LEN(models), argv[7]);
    if (argv[8][0] != '\0' && money_parse(&o.max_cost_micros, NULL, argv[8], &err) != E_OK) {
        rc = EXIT_USAGE;
    }
    o.max_tokens = strtoll(argv[9], NULL, 10);
    if (argv[10][0] != '\0' && clock_parse_rfc3339(&o.expires_ms, argv[10]) != E_OK) {
        rc = EXIT_USAGE;
    }
    if (rc == 0 && token_mint_task(&s, &id, key, &o, &err) != E_OK) {
        printf("invalid: %s\n", err.msg);
        rc = EXIT_DENIED;
    }
    if (rc == 0) {
        printf("%s\n%s\n", s, id);
    }
    free(s);
    free(id);
    return rc;
}

/* Sets the context field NAME (N bytes) of CTX to V; -1 when there is no such field. */
static int set_context(struct token_context *ctx, const char *name, size_t n, const char *v)
{
    const struct {
        const char *name;
        const char **field;
    } fields[] = {{"task", &ctx->task},
                  {"ns", &ctx->ns},
                  {"repo", &ctx->repo},
                  {"branch", &ctx->branch},
                  {"model", &ctx->model}};

    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        if (n == strlen(fields[i].name) && strncmp(name, fields[i].name, n) == 0) {
            *fields[i].field = v;
            return 0;
        }
    }
    if (n == 3 && strncmp(name, "now", n) == 0) {
        return clock_parse_rfc3339(&ctx->now_ms, v) == E_OK ? 0 : -1;
    }
    return -1;
}

/* Fills CTX from "name=value" arguments; returns how many were context arguments. */
static int parse_context(struct token_context *ctx, int argc, char **argv)
{
    for (int i = 0; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        const char *v = eq != NULL ? eq + 1 : "";
        size_t n = eq != NULL ? (size_t)(eq - argv[i]) : 0;
        if (set_context(ctx, argv[i], n, v) != 0) {
            return -1;
        }
    }
    return argc;
}

/* Prints the outcome of cmd_verify: RC, the denial in ERR or (FULL: a context was given)
 * the limits in G. */
static void print_verdict(int rc, bool full, const struct token_grant *g, const struct err *err)
{
    char money[MONEY_STR_MAX];

    if (rc == EXIT_DENIED && err->msg[0] != '\0') {
        printf("denied: %s\n", err->msg);
    } else if (rc == 0 && !full) {
        printf("ok\n");
    } else if (rc == 0) {
        money_format(money, g->max_cost_micros);
        printf("ok max_cost_usd=%s max_tokens=%lld models_restricted=%d model_allowed=%d\n",
               g->has_max_cost ? money : "none",
               g->has_max_tokens ? (long long)g->max_tokens : -1LL, g->models_restricted,
               g->model_allowed);
    }
}

/* verify KEYHEX TOKEN: the signature only. verify KEYHEX TOKEN name=value...: the full
 * check with a context (task, ns, repo, branch, model, now), printing the limits. */
static int cmd_verify(int argc, char **argv)
{
    struct token_context ctx = {.now_ms = clock_now_ms(clock_system())};
    unsigned char key[TOKEN_ROOT_KEY_LEN];
    struct token *t = NULL;
    struct token_grant g = {0};
    struct err err = {0};
    int rc = load_key(key, argv[0]);

    if (rc == 0 && parse_context(&ctx, argc - 2, argv + 2) < 0) {
        rc = EXIT_USAGE;
    }
    if (rc == 0) {
        rc = decode(&t, argv[1]);
    }
    if (rc == 0 && argc == 2 && token_verify_signature(t, key, &err) != E_OK) {
        rc = EXIT_DENIED;
    } else if (rc == 0 && argc > 2 && token_verify(&g, t, key, &ctx, &err) != E_OK) {
        rc = EXIT_DENIED;
    }
    print_verdict(rc, argc > 2, &g, &err);
    token_free(t);
    return rc;
}

/* attenuate TOKEN CAVEAT...: adds caveats without the key. */
static int cmd_attenuate(int argc, char **argv)
{
    struct token *t = NULL;
    struct err err = {0};
    char *s = NULL;
    int rc = decode(&t, argv[0]);

    for (int i = 1; rc == 0 && i < argc; i++) {
        if (token_add_caveat(t, argv[i], &err) != E_OK) {
            printf("invalid: %s\n", err.msg);
            rc = EXIT_DENIED;
        }
    }
    if (rc == 0) {
        token_encode(&s, t);
        printf("%s\n", s);
    }
    free(s);
    token_free(t);
    return rc;
}

/* inspect TOKEN: what `diverge token inspect` prints. */
static int cmd_inspect(int argc, char **argv)
{
    struct token *t = NULL;
    int rc = decode(&t, argv[0]);

    (void)argc;
    if (rc == 0) {
        token_print(stdout, t);
    }
    token_free(t);
    return rc;
}

static const struct verb VERBS[] = {
    {"mint", 2, 66, cmd_mint, "mint KEYHEX IDENTIFIER [CAVEAT...]"},
    {"mint-task", 11, 11, cmd_mint_task,
     "mint-task KEYHEX TASK NS GEN REPO BRANCH TOOLS MODELS MAX_USD MAX_TOKENS EXPIRES"},
    {"verify", 2, 8, cmd_verify, "verify KEYHEX TOKEN [task=|ns=|repo=|branch=|model=|now=...]"},
    {"attenuate", 2, 66, cmd_attenuate, "attenuate TOKEN CAVEAT..."},
    {"inspect", 1, 1, cmd_inspect, "inspect TOKEN"},
};

int main(int argc, char **argv)
{
    for (size_t i = 0; argc >= 2 && i < ARRAY_LEN(VERBS); i++) {
        const struct verb *v = &VERBS[i];
        if (strcmp(argv[1], v->name) == 0 && argc - 2 >= v->min_args && argc - 2 <= v->max_args) {
            return v->handler(argc - 2, argv + 2);
        }
    }
    fprintf(stderr, "usage:\n");
    for (size_t i = 0; i < ARRAY_LEN(VERBS); i++) {
        fprintf(stderr, "  token_tool %s\n", VERBS[i].usage);
    }
    return EXIT_USAGE;
}
