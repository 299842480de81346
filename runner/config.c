/* SPDX-License-Identifier: Apache-2.0 */
/* The runner's environment (SPEC §9) checked once at start: a malformed value is exit 2
 * with the variable's name, never a surprise half-way through a task. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runner/runner.h"
#include "store/store.h"

#define RUNNER_VALUE_MAX 4096 /* bytes of a branch, URL or path variable */

static const char *get_opt(runner_getenv_fn get, void *ud, const char *name, const char *dflt)
{
    const char *v = get(name, ud);

    return (v != NULL && *v != '\0') ? v : dflt;
}

/* A value handed to git as an argument: not an option, no control characters. */
static bool arg_ok(const char *s)
{
    size_t n = strlen(s);

    if (n == 0 || n > RUNNER_VALUE_MAX || s[0] == '-') {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) {
            return false;
        }
    }
    return true;
}

static int parse_long(long *out, const char *s, long min, long max)
{
    char *end = NULL;
    long v;

    if (s == NULL || *s < '0' || *s > '9') {
        return E_INVALID;
    }
    v = strtol(s, &end, 10);
    if (*end != '\0' || v < min || v > max) {
        return E_INVALID;
    }
    *out = v;
    return E_OK;
}

/* DIVERGE_RUN and the requestId prefix it makes (SPEC §14: a new run meters a new usage
 * file from offset 0; its ids must not be those of the runs before). */
static int load_run(struct runner_config *c, runner_getenv_fn get, void *ud, struct err *err)
{
    const char *v = get_opt(get, ud, "DIVERGE_START_GATE_FD", NULL);

    if (v != NULL && parse_long(&c->gate_fd, v, 3, 65535) != E_OK) {
        return err_set(err, E_INVALID,
                       "DIVERGE_START_GATE_FD must be a descriptor from 3 to 65535");
    }
    v = get_opt(get, ud, "DIVERGE_RUN", NULL);

    if (v != NULL && parse_long(&c->run, v, 1, 1000000000L) != E_OK) {
        return err_set(err, E_INVALID, "DIVERGE_RUN must be a number from 1 to 1000000000");
    }
    if (c->run > 1) {
        snprintf(c->id_prefix, sizeof(c->id_prefix), "%s-r%ld", c->task, c->run);
    } else {
        snprintf(c->id_prefix, sizeof(c->id_prefix), "%s", c->task);
    }
    return E_OK;
}

static int load_numbers(struct runner_config *c, runner_getenv_fn get, void *ud, struct err *err)
{
    const char *v;
    long n = 8;

    v = get_opt(get, ud, "DIVERGE_START_ITERATION", NULL);
    if (v != NULL && parse_long(&c->start_iteration, v, 1, RUNNER_ITERATIONS_MAX) != E_OK) {
        return err_set(err, E_INVALID, "DIVERGE_START_ITERATION must be 1 to %d",
                       RUNNER_ITERATIONS_MAX);
    }
    v = get_opt(get, ud, "DIVERGE_MAX_ITERATIONS", NULL);
    if (v != NULL && parse_long(&c->max_iterations, v, 1, RUNNER_ITERATIONS_MAX) != E_OK) {
        return err_set(err, E_INVALID, "DIVERGE_MAX_ITERATIONS must be 1 to %d",
                       RUNNER_ITERATIONS_MAX);
    }
    v = get_opt(get, ud, "DIVERGE_METER_ATTEMPTS", NULL);
    if (v != NULL && parse_long(&n, v, 1, 100) != E_OK) {
        return err_set(err, E_INVALID, "DIVERGE_METER_ATTEMPTS must be 1 to 100");
    }
    c->meter_attempts = (int)n;
    v = get_opt(get, ud, "DIVERGE_METER_BACKOFF_MS", NULL);
    if (v != NULL && parse_long(&c->backoff_ms, v, 1, 1000) != E_OK) {
        return err_set(err, E_INVALID, "DIVERGE_METER_BACKOFF_MS must be 1 to 1000");
    }
    c->ca_file = get_opt(get, ud, "DIVERGE_CA_FILE", NULL);
    if (c->ca_file != NULL && c->ca_file[0] != '/') {
        return err_set(err, E_INVALID, "DIVERGE_CA_FILE must be an absolute path");
    }
    v = get_opt(get, ud, "DIVERGE_METER_UNREACHABLE_MS", NULL);
    if (v != NULL && parse_long(&c->unreachable_ms, v, 0, 3600000) != E_OK) {
        return err_set(err, E_INVALID, "DIVERGE_METER_UNREACHABLE_MS must be 0 to 3600000");
    }
    v = get_opt(get, ud, "DIVERGE_REVOKED_WAIT_MS", NULL);
    if (v != NULL && parse_long(&c->revoked_wait_ms, v, 0, 3600000) != E_OK) {
        return err_set(err, E_INVALID, "DIVERGE_REVOKED_WAIT_MS must be 0 to 3600000");
    }
    return load_run(c, get, ud, err);
}

/* DIVERGE_USAGE_FILE and the files next to it (the offset state; SPEC §14: the notes for
 * the server), DIVERGE_NO_PROGRESS_AFTER and DIVERGE_USAGE_FOLLOW_MS. */
static int load_runs(struct runner_config *c, runner_getenv_fn get, void *ud, struct err *err)
{
    const char *v = get_opt(get, ud, "DIVERGE_NO_PROGRESS_AFTER", NULL);

    c->usage_file = get_opt(get, ud, "DIVERGE_USAGE_FILE", NULL);
    c->state_file = c->usage_file != NULL ? xasprintf("%s.offset", c->usage_file) : NULL;

    if (v != NULL && parse_long(&c->no_progress_after, v, 0, RUNNER_ITERATIONS_MAX) != E_OK) {
        return err_set(err, E_INVALID, "DIVERGE_NO_PROGRESS_AFTER must be 0 to %d",
                       RUNNER_ITERATIONS_MAX);
    }
    v = get_opt(get, ud, "DIVERGE_USAGE_FOLLOW_MS", NULL);
    if (v != NULL && parse_long(&c->follow_ms, v, 10, 60000) != E_OK) {
        return err_set(err, E_INVALID, "DIVERGE_USAGE_FOLLOW_MS must be 10 to 60000");
    }
    if (c->usage_file != NULL) {
        c->failure_file = xasprintf("%s.failure", c->usage_file);
        c->no_progress_file = xasprintf("%s.no-progress", c->usage_file);
    }
    return E_OK;
}

static int load_git(struct runner_config *c, runner_getenv_fn get, void *ud, struct err *err)
{
    const char *wb = get_opt(get, ud, "DIVERGE_WORKING_BRANCH", NULL);

    c->repo_url = get_opt(get, ud, "DIVERGE_REPO_URL", NULL);
    c->base_branch = get_opt(get, ud, "DIVERGE_BASE_BRANCH", "main");
    c->push_url = get_opt(get, ud, "DIVERGE_PUSH_URL", NULL);
    c->workspace = get_opt(get, ud, "DIVERGE_WORKSPACE_DIR", "/workspace");
    c->working_branch = wb != NULL ? xstrdup(wb) : xasprintf("agent/%s", c->task);
    c->wip_branch = xasprintf("diverge/wip/%s", c->task);
    if (c->repo_url == NULL || !arg_ok(c->repo_url)) {
        return err_set(err, E_INVALID, "DIVERGE_REPO_URL is missing or malformed");
    }
    if (!arg_ok(c->base_branch)) {
        return err_set(err, E_INVALID, "DIVERGE_BASE_BRANCH is malformed");
    }
    if (!arg_ok(c->working_branch)) {
        return err_set(err, E_INVALID, "DIVERGE_WORKING_BRANCH is malformed");
    }
    if (c->push_url != NULL && !arg_ok(c->push_url)) {
        return err_set(err, E_INVALID, "DIVERGE_PUSH_URL is malformed");
    }
    if (strcmp(c->working_branch, c->wip_branch) == 0 ||
        strcmp(c->base_branch, c->wip_branch) == 0) {
        return err_set(err, E_INVALID, "the working and base branches cannot be %s", c->wip_branch);
    }
    if (!arg_ok(c->workspace)) {
        return err_set(err, E_INVALID, "DIVERGE_WORKSPACE_DIR is malformed");
    }
    return E_OK;
}

/* DIVERGE_SANDBOX_NETWORK (none or proxy) and, for proxy, DIVERGE_EGRESS_SOCKET. */
static int network_config(struct runner_config *c, runner_getenv_fn get, void *ud, struct err *err)
{
    c->network = get_opt(get, ud, "DIVERGE_SANDBOX_NETWORK", "none");
    c->egress_socket = get_opt(get, ud, "DIVERGE_EGRESS_SOCKET", NULL);
    if (strcmp(c->network, "none") != 0 && strcmp(c->network, "proxy") != 0) {
        return err_set(err, E_INVALID, "DIVERGE_SANDBOX_NETWORK must be none or proxy");
    }
    if (strcmp(c->network, "proxy") == 0 && c->egress_socket == NULL) {
        return err_set(err, E_INVALID,
                       "DIVERGE_SANDBOX_NETWORK=proxy needs DIVERGE_EGRESS_SOCKET (the "
                       "server's egress proxy socket)");
    }
    return E_OK;
}

int runner_config_load(struct runner_config *out, runner_getenv_fn get, void *ud, struct err *err)
{
    struct runner_config *c = out;
    int rc;

    memset(c, 0, sizeof(*c));
    c->start_iteration = 1;
    c->run = 1;
    c->max_iterations = 5;
    c->meter_attempts = 8;
    c->backoff_ms = 100;
    c->revoked_wait_ms = RUNNER_REVOKED_WAIT_MS;
    c->unreachable_ms = RUNNER_UNREACHABLE_MS;
    c->no_progress_after = 3;
    c->follow_ms = 250;
    c->gate_fd = -1;
    c->task = get_opt(get, ud, "DIVERGE_TASK_NAME", NULL);
    if (c->task == NULL || !task_name_valid(c->task)) {
        return err_set(err, E_INVALID, "DIVERGE_TASK_NAME is missing or not a DNS label");
    }
    c->ns = get_opt(get, ud, "DIVERGE_NAMESPACE", "default");
    c->objective = get_opt(get, ud, "DIVERGE_OBJECTIVE", "agent task");
    rc = load_git(c, get, ud, err);
    if (rc != E_OK) {
        return rc;
    }
    rc = load_numbers(c, get, ud, err);
    if (rc != E_OK) {
        return rc;
    }
    rc = load_runs(c, get, ud, err);
    if (rc != E_OK) {
        return rc;
    }
    c->agent_cmd = get_opt(get, ud, "DIVERGE_AGENT_CMD", NULL);
    if (c->agent_cmd == NULL) {
        return err_set(err, E_INVALID, "DIVERGE_AGENT_CMD is missing");
    }
    c->verify_cmd = get_opt(get, ud, "DIVERGE_VERIFY_CMD", NULL);
    c->token_env = get_opt(get, ud, "DIVERGE_MACAROON_TOKEN", NULL);
    c->token_file = get_opt(get, ud, "DIVERGE_TOKEN_FILE", NULL);
    if (c->token_env == NULL && c->token_file == NULL) {
        return err_set(err, E_INVALID, "set DIVERGE_MACAROON_TOKEN or DIVERGE_TOKEN_FILE");
    }
    c->meter_socket = get_opt(get, ud, "DIVERGE_METER_SOCKET", NULL);
    c->meter_url = get_opt(get, ud, "DIVERGE_METER_URL", NULL);
    if (c->meter_socket == NULL && c->meter_url == NULL) {
        return err_set(err, E_INVALID, "set DIVERGE_METER_SOCKET or DIVERGE_METER_URL");
    }
    c->preview_url = get_opt(get, ud, "DIVERGE_PREVIEW_URL", NULL);
    c->preview_key = get_opt(get, ud, "DIVERGE_PREVIEW_HEADER_KEY", "x-diverge-env");
    c->preview_value = get_opt(get, ud, "DIVERGE_PREVIEW_HEADER_VALUE", "");
    if (strchr(c->preview_key, ':') != NULL || !arg_ok(c->preview_key) ||
        (*c->preview_value != '\0' && !arg_ok(c->preview_value))) {
        return err_set(err, E_INVALID, "DIVERGE_PREVIEW_HEADER_KEY or _VALUE is malformed");
    }
    c->author_name = get_opt(get, ud, "DIVERGE_GIT_AUTHOR_NAME", "diverge-agent");
    c->author_email = get_opt(get, ud, "DIVERGE_GIT_AUTHOR_EMAIL", "agent@diverge.invalid");
    return network_config(c, get, ud, err);
}

void runner_config_cleanup(struct runner_config *c)
{
    free(c->working_branch);
    free(c->state_file);
    free(c->wip_branch);
    free(c->failure_file);
    free(c->no_progress_file);
    c->working_branch = NULL;
    c->state_file = NULL;
    c->wip_branch = NULL;
    c->failure_file = NULL;
    c->no_progress_file = NULL;
}
