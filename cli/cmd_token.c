/* SPDX-License-Identifier: Apache-2.0 */
/* `diverge token inspect TOKEN`: prints a capability token's location, identifier,
 * caveats and signature fingerprint (SPEC §8). Decoding needs no key and no server; the
 * signature is not checked. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "token/token.h"

#define TOKEN_USAGE                                                                                \
    "Usage: diverge token inspect TOKEN\n\n"                                                       \
    "Prints a capability token's location, identifier, caveats and a fingerprint (a hash\n"        \
    "of the signature, never the signature: no secret is needed or shown; the signature is\n"      \
    "not verified). TOKEN may be '-' to read it from stdin.\n"

int cli_token_main(int argc, char **argv)
{
    char line[TOKEN_ENCODED_MAX + 2];
    const char *text;
    struct token *t = NULL;
    struct err err = {0};

    if (cli_args_wants_help(argc - 1, argv + 1)) {
        fputs(TOKEN_USAGE, stdout);
        return CLI_EXIT_OK;
    }
    if (argc != 3 || strcmp(argv[1], "inspect") != 0) {
        cli_errorf("token: expected `token inspect TOKEN` (see diverge token --help)");
        return CLI_EXIT_USAGE;
    }
    text = argv[2];
    if (strcmp(text, "-") == 0) {
        if (fgets(line, sizeof(line), stdin) == NULL) {
            cli_errorf("token inspect: no token on stdin");
            return CLI_EXIT_USAGE;
        }
        line[strcspn(line, "\r\n")] = '\0';
        text = line;
    }
    if (token_decode(&t, text, strlen(text), &err) != E_OK) {
        cli_errorf("token inspect: malformed token: %s", err.msg);
        return CLI_EXIT_FAILED;
    }
    token_print(stdout, t);
    token_free(t);
    return CLI_EXIT_OK;
}
