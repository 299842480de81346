/* SPDX-License-Identifier: Apache-2.0 */
/* The runner's main loop (SPEC §9 steps 3-4): heartbeat (meter every new usage line once,
 * remembering the offset only after the meter answered), agent, verify, preview; then
 * the final heartbeat and, on success, commit and push. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runner/runner_int.h"

extern char **environ;

#define RUNNER_CHUNK (64u << 10) /* bytes of the usage file read at a time */

/* What the heartbeats carry from one iteration to the next. */
struct run {
    const struct runner_config *cfg;         /* borrowed */
    struct runner_state state;               /* the offset state */
    char *guidance;                          /* owned: guidance of the last heartbeat, or NULL */
    char *last_failure;                      /* owned: DIVERGE_LAST_FAILURE for the next try */
    char *llm_env[RUNNER_LLM_ENV_COUNT + 1]; /* owned: the agent's LLM variables, or {NULL} */
};

/* Records a 200 (or 429: charged too) for a usage line ending at NEW_OFFSET. */
static int commit_offset(struct run *r, uint64_t new_offset, const char *model)
{
    struct err err = {0};

    r->state.offset = new_offset;
    if (model != NULL) {
        snprintf(r->state.model, sizeof(r->state.model), "%s", model);
    }
    if (r->cfg->state_file != NULL && runner_state_save(r->cfg->state_file, &r->state, &err)) {
        runner_say("usage state: %s", err.msg);
        return RUNNER_EXIT_CONFIG;
    }
    return -1;
}

/* Sends CALL and acts on the answer: -1 to go on, else the exit code to stop with. */
static int meter_one(struct run *r, const struct runner_meter_call *call, uint64_t end_offset,
                     bool zero)
{
    struct runner_meter_answer a;
    int ret = -1;

    runner_meter_send(&a, r->cfg, call);
    if (a.next == RUNNER_METER_CONTINUE || a.next == RUNNER_METER_PAUSED) {
        if (a.guidance != NULL) {
            free(r->guidance);
            r->guidance = a.guidance;
            a.guidance = NULL;
        }
        if (!zero) {
            ret = commit_offset(r, end_offset, call->model);
        }
    }
    if (ret == -1 && a.next != RUNNER_METER_CONTINUE) {
        if (a.next == RUNNER_METER_FORBIDDEN && zero) {
            /* A heartbeat reports no usage: a model restriction is not the agent's fault. */
            runner_say("meter: heartbeat refused (403): %s", a.reason ? a.reason : "forbidden");
        } else {
            runner_say("meter: %s%s (HTTP %ld) for %s: stopping",
                       a.next == RUNNER_METER_PAUSED ? "task paused: " : "",
                       a.reason != NULL ? a.reason : "no answer", a.status, call->request_id);
            ret = (int)runner_exit_for(a.next);
        }
    }
    runner_meter_answer_cleanup(&a);
    return ret;
}

/* Meters one usage line at OFFSET (LEN bytes, ADVANCE with its newline). */
static int meter_line(struct run *r, const char *line, size_t len, size_t advance, uint64_t offset,
                      long iteration, int *sent)
{
    struct runner_usage u;
    struct runner_meter_call call;
    char rid[RUNNER_REQUEST_ID_MAX + 1];
    struct err err = {0};
    size_t k = 0;

    while (k < len && (line[k] == ' ' || line[k] == '\t' || line[k] == '\r')) {
        k++;
    }
    if (k == len) {
        return commit_offset(r, offset + advance, NULL); /* a blank line */
    }
    if (runner_usage_parse(&u, line, len, &err) != E_OK) {
        runner_say("usage line at offset %llu ignored: %s", (unsigned long long)offset, err.msg);
        return commit_offset(r, offset + advance, NULL);
    }
    if (runner_request_id_usage(rid, sizeof(rid), r->cfg->id_prefix, offset) != E_OK) {
        return RUNNER_EXIT_CONFIG;
    }
    call = (struct runner_meter_call){.request_id = rid,
                                      .iteration = iteration,
                                      .model = u.has_model ? u.model : NULL,
                                      .tokens = u.tokens,
                                      .cost_micros = u.cost_micros};
    (*sent)++;
    return meter_one(r, &call, offset + advance, false);
}

/* Meters every new usage line; *metered_out counts the lines sent. */
static int meter_usage(struct run *r, long iteration, bool final, int *metered_out)
{
    struct stat sb;
    char *chunk;
    int fd, ret = -1;

    *metered_out = 0;
    if (r->cfg->usage_file == NULL) {
        return -1;
    }
    fd = open(r->cfg->usage_file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        return -1; /* nothing written yet */
    }
    if (fstat(fd, &sb) == 0 && (uint64_t)sb.st_size < r->state.offset) {
        /* Rewritten from scratch? Lines at offsets already metered would reuse their
         * requestIds and never be charged: say so instead of guessing. */
        runner_say("usage file is shorter (%lld bytes) than what was metered (%llu): "
                   "append to it, never truncate it",
                   (long long)sb.st_size, (unsigned long long)r->state.offset);
    }
    chunk = xmalloc(RUNNER_CHUNK);
    while (ret == -1) {
        ssize_t n = pread(fd, chunk, RUNNER_CHUNK, (off_t)r->state.offset);
        size_t pos = 0, len, adv;
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            break;
        }
        while (ret == -1 && runner_usage_next(&len, &adv, chunk + pos, (size_t)n - pos,
                                              final && (size_t)n < RUNNER_CHUNK)) {
            ret = meter_line(r, chunk + pos, len, adv, r->state.offset, iteration, metered_out);
            pos += adv;
        }
        if (ret == -1 && pos == 0) {
            if ((size_t)n < RUNNER_CHUNK) {
                break; /* an unterminated last line: metered when complete */
            }
            /* A whole chunk without a newline: longer than any usage line. */
            runner_say("usage line at offset %llu ignored: longer than %d bytes",
                       (unsigned long long)r->state.offset, RUNNER_USAGE_LINE_MAX);
            ret = commit_offset(r, r->state.offset + (uint64_t)n, NULL);
        }
    }
    free(chunk);
    close(fd);
    return ret;
}

/* The heartbeat before ITERATION (or after it when FINAL): -1 to go on, else an exit. */
static int heartbeat(struct run *r, long iteration, bool final)
{
    char rid[RUNNER_REQUEST_ID_MAX + 1];
    struct runner_meter_call call = {.request_id = rid, .iteration = iteration};
    char *token = NULL, *model = NULL;
    int metered = 0, ret;

    free(r->guidance);
    r->guidance = NULL;
    ret = meter_usage(r, iteration, final, &metered);
    if (ret != -1 || metered > 0) {
        return ret;
    }
    if (runner_request_id_heartbeat(rid, sizeof(rid), r->cfg->id_prefix, iteration, final) !=
        E_OK) {
        return RUNNER_EXIT_CONFIG;
    }
    /* No usage: report the iteration (and fetch guidance) with the last model seen, or
     * the token's first allowed one, so a task that restricts models accepts it. */
    if (r->state.model[0] != '\0') {
        call.model = r->state.model;
    } else if (runner_token_read(&token, r->cfg, NULL) == E_OK) {
        model = runner_token_model(token);
        call.model = model;
    }
    ret = meter_one(r, &call, 0, true);
    runner_token_free(token);
    free(model);
    return ret;
}

/* Runs CMD with /bin/sh -c in the workspace, extra environment SET; returns its status. */
static int run_shell(const struct runner_config *cfg, const char *cmd, const char *const *set,
                     struct runner_tail *tail)
{
    /* The runner's own per-iteration variables, and the LLM ones (SPEC §13: the relay is
     * the agent's endpoint, whatever the sandbox's environment said). */
    static const char *const unset[] = {"DIVERGE_LAST_FAILURE",
                                        "DIVERGE_GUIDANCE",
                                        "DIVERGE_ITERATION",
                                        "DIVERGE_LLM_URL",
                                        "ANTHROPIC_BASE_URL",
                                        "OPENAI_BASE_URL",
                                        "GOOGLE_GEMINI_BASE_URL",
                                        "ANTHROPIC_API_KEY",
                                        "OPENAI_API_KEY",
                                        "GEMINI_API_KEY",
                                        NULL};
    const char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    char **env = runner_env_build(environ, unset, set);
    struct runner_spawn sp = {.argv = argv, .cwd = cfg->workspace, .envp = env, .tail = tail};
    struct err err = {0};
    int status = 127;

    tail->len = 0;
    if (runner_spawn_run(&status, &sp, &err) != E_OK) {
        runner_say("cannot run a command: %s", err.msg);
    }
    runner_env_free(env);
    return status;
}

/* One iteration: agent, verify, preview. Fills *it; true on success. */
static bool iterate(struct run *r, struct runner_iteration *it, long iteration)
{
    const struct runner_config *cfg = r->cfg;
    struct runner_tail *tail = xcalloc(1, sizeof(*tail));
    const char *set[4 + RUNNER_LLM_ENV_COUNT];
    size_t n = 0;
    char *v_iter = xasprintf("DIVERGE_ITERATION=%ld", iteration);
    char *v_fail = r->last_failure ? xasprintf("DIVERGE_LAST_FAILURE=%s", r->last_failure) : NULL;
    char *v_guid = r->guidance ? xasprintf("DIVERGE_GUIDANCE=%s", r->guidance) : NULL;
    char line[256];
    bool ok;

    set[n++] = v_iter;
    if (v_fail != NULL) {
        set[n++] = v_fail;
    }
    if (v_guid != NULL) {
        set[n++] = v_guid;
    }
    for (size_t i = 0; r->llm_env[i] != NULL; i++) {
        set[n++] = r->llm_env[i];
    }
    set[n] = NULL;
    memset(it, 0, sizeof(*it));
    it->iteration = iteration;
    runner_say("iteration %ld/%ld: running the agent", iteration, cfg->max_iterations);
    it->agent_status = run_shell(cfg, cfg->agent_cmd, set, tail);
    if (it->agent_status == 0 && cfg->verify_cmd != NULL) {
        it->verify_ran = true;
        it->verify_status = run_shell(cfg, cfg->verify_cmd, set, tail);
    }
    if (it->agent_status == 0 && (!it->verify_ran || it->verify_status == 0) &&
        cfg->preview_url != NULL) {
        it->preview_ran = true;
        it->preview_status = runner_preview_check(cfg);
    }
    runner_iteration_line(line, sizeof(line), it, cfg->max_iterations);
    runner_say("%s", line);
    ok = runner_iteration_ok(it);
    free(r->last_failure);
    r->last_failure = ok ? NULL : runner_failure_text(it, tail->data, tail->len);
    free(tail);
    free(v_iter);
    free(v_fail);
    free(v_guid);
    return ok;
}

static enum runner_exit finish(struct run *r, bool ok, long last)
{
    struct err err = {0};
    int ret = heartbeat(r, last, true);

    if (ret != -1) {
        return (enum runner_exit)ret;
    }
    if (!ok) {
        runner_say("every iteration failed");
        return RUNNER_EXIT_FAILED;
    }
    if (runner_git_publish(r->cfg, &err) != E_OK) {
        runner_say("publishing failed: %s", err.msg);
        return RUNNER_EXIT_GIT;
    }
    runner_say("done");
    return RUNNER_EXIT_OK;
}

enum runner_exit runner_run(const struct runner_config *cfg)
{
    struct run r = {.cfg = cfg};
    struct runner_iteration it;
    struct err err = {0};
    enum runner_exit ex;
    long i, last;
    bool ok = false;
    int ret = -1;
    uint16_t llm_port = 0;

    if (runner_egress_relay_start(cfg, &err) != E_OK) {
        runner_say("egress relay: %s", err.msg);
        return RUNNER_EXIT_CONFIG;
    }
    if (cfg->state_file != NULL && runner_state_load(&r.state, cfg->state_file, &err) != E_OK) {
        runner_say("usage state: %s", err.msg);
        return RUNNER_EXIT_CONFIG;
    }
    if (runner_git_prepare(cfg, &err) != E_OK) {
        runner_say("workspace: %s", err.msg);
        return RUNNER_EXIT_GIT;
    }
    if (runner_llm_relay_start(&llm_port, cfg, &err) != E_OK) {
        runner_say("llm relay: %s", err.msg);
        return RUNNER_EXIT_CONFIG;
    }
    if (llm_port != 0) {
        runner_llm_env(r.llm_env, llm_port);
    }
    last = cfg->start_iteration > cfg->max_iterations ? cfg->max_iterations : cfg->start_iteration;
    for (i = cfg->start_iteration; i <= cfg->max_iterations && !ok; i++) {
        ret = heartbeat(&r, i, false);
        if (ret != -1) {
            break;
        }
        ok = iterate(&r, &it, i);
        last = i;
    }
    ex = ret != -1 ? (enum runner_exit)ret : finish(&r, ok, last);
    free(r.guidance);
    free(r.last_failure);
    for (size_t k = 0; r.llm_env[k] != NULL; k++) {
        free(r.llm_env[k]);
    }
    return ex;
}
