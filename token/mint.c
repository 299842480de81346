/* SPDX-License-Identifier: Apache-2.0 */
/* Minting a task's token: a unique identifier and the caveats in one fixed order. Every
 * value is validated with the same rules verification applies, so a minted token always
 * verifies for its own task. */
#include <inttypes.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/money.h"
#include "common/secret.h"
#include "token/token.h"
#include "token/token_int.h"

#define ID_RANDOM_BYTES 16

/* Adds "NAME = VALUE" to T when VALUE is set; E_INVALID when VALUE breaks the caveat rules. */
static int add_string(struct token *t, const char *name, const char *value, struct err *err)
{
    char *predicate;
    int rc;

    if (value == NULL || value[0] == '\0') {
        return E_OK;
    }
    if (!token_caveat_value_valid(value)) {
        return err_set_field(err, E_INVALID, name, "invalid %s value", name);
    }
    predicate = xasprintf("%s = %s", name, value);
    rc = token_add_caveat(t, predicate, err);
    free(predicate);
    return rc;
}

/* Adds "NAME = a,b,c" when N > 0; every entry must be a valid list entry. */
static int add_list(struct token *t, const char *name, const char *const *items, size_t n,
                    bool wildcard, struct err *err)
{
    struct buf b;
    int rc = E_OK;

    if (n == 0) {
        return E_OK;
    }
    buf_init(&b, TOKEN_FIELD_MAX);
    for (size_t i = 0; i < n && rc == E_OK; i++) {
        if (items[i] == NULL || items[i][0] == '\0' || strchr(items[i], ',') != NULL) {
            rc = err_set_field(err, E_INVALID, name, "invalid %s entry", name);
        } else {
            rc = buf_printf(&b, "%s%s", i > 0 ? "," : "", items[i]);
        }
    }
    if (rc == E_TOOBIG) {
        rc = err_set_field(err, E_INVALID, name, "%s list too long", name);
    } else if (rc == E_OK && !token_caveat_list_valid(b.data, wildcard)) {
        rc = err_set_field(err, E_INVALID, name, "invalid %s entry", name);
    }
    if (rc == E_OK) {
        rc = add_string(t, name, b.data, err);
    }
    buf_cleanup(&b);
    return rc;
}

static int add_limits(struct token *t, const struct token_mint_opts *o, struct err *err)
{
    char money[MONEY_STR_MAX], when[CLOCK_RFC3339_MAX], count[24];
    int rc = E_OK;

    if (o->max_cost_micros > 0) {
        money_format(money, o->max_cost_micros);
        rc = add_string(t, "max_cost_usd", money, err);
    }
    if (rc == E_OK && o->max_tokens > 0) {
        snprintf(count, sizeof(count), "%" PRId64, o->max_tokens);
        rc = add_string(t, "max_tokens", count, err);
    }
    if (rc == E_OK && o->expires_ms != 0) {
        if (o->expires_ms < 0) {
            return err_set_field(err, E_INVALID, "expires", "expiry before 1970");
        }
        clock_rfc3339(when, o->expires_ms);
        rc = add_string(t, "expires", when, err);
    }
    return rc;
}

/* "<ns>/<task>/<generation>/<random hex>" into *out (caller frees with free()). */
static int make_identifier(char **out, const struct token_mint_opts *o, struct err *err)
{
    unsigned char rnd[ID_RANDOM_BYTES];
    char hex[2 * ID_RANDOM_BYTES + 1];
    bool has_ns = o->ns != NULL && o->ns[0] != '\0';

    *out = NULL;
    if (RAND_bytes(rnd, sizeof(rnd)) != 1) {
        return err_set(err, E_FAIL, "no randomness for the token identifier");
    }
    secret_hex(hex, rnd, sizeof(rnd));
    *out = xasprintf("%s%s%s/%" PRId64 "/%s", has_ns ? o->ns : "", has_ns ? "/" : "", o->task,
                     o->generation, hex);
    return E_OK;
}

int token_mint_task(char **token_out, char **id_out,
                    const unsigned char root_key[TOKEN_ROOT_KEY_LEN],
                    const struct token_mint_opts *opts, struct err *err)
{
    struct token *t = NULL;
    char *id = NULL;
    int rc;

    *token_out = NULL;
    if (id_out != NULL) {
        *id_out = NULL;
    }
    if (opts->task == NULL || opts->task[0] == '\0' || !token_caveat_value_valid(opts->task)) {
        return err_set_field(err, E_INVALID, "task_id", "missing or invalid task name");
    }
    rc = make_identifier(&id, opts, err);
    if (rc == E_OK) {
        rc = token_mint(&t, root_key, TOKEN_LOCATION, id, err);
    }
    if (rc == E_OK) {
        rc = add_string(t, "task_id", opts->task, err);
    }
    if (rc == E_OK) {
        rc = add_string(t, "namespace", opts->ns, err);
    }
    if (rc == E_OK) {
        rc = add_string(t, "repo", opts->repo, err);
    }
    if (rc == E_OK) {
        rc = add_string(t, "branch", opts->branch, err);
    }
    if (rc == E_OK) {
        rc = add_list(t, "tools", opts->tools, opts->n_tools, false, err);
    }
    if (rc == E_OK) {
        rc = add_list(t, "models", opts->models, opts->n_models, true, err);
    }
    if (rc == E_OK) {
        rc = add_limits(t, opts, err);
    }
    if (rc != E_OK) {
        goto out;
    }
    token_encode(token_out, t);
    if (id_out != NULL) {
        *id_out = id;
        id = NULL;
    }
out:
    free(id);
    token_free(t);
    return rc;
}
