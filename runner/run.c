/* SPDX-License-Identifier: Apache-2.0 */
/* The runner's main loop (SPEC §9 steps 3-4): heartbeat (meter every new usage line once,
 * remembering the offset only after the meter answered), agent, verify, preview; then
 * the final heartbeat and, on success, commit and push. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
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
    struct runner_state_file state_file;     /* its file, kept open once written */
    struct runner_wip_memo wip;              /* what the last checkpoint found */
    char *guidance;                          /* owned: guidance of the last heartbeat, or NULL */
    char *last_failure;                      /* owned: DIVERGE_LAST_FAILURE for the next try */
    char *noted;                             /* owned: the failure file's text as written ... */
    struct stat noted_st;                    /* ... and its status then; NULL: not written */
    bool note_cleared;                       /* the failure file was removed since */
    char *llm_env[RUNNER_LLM_ENV_COUNT + 1]; /* owned: the agent's LLM variables, or {NULL} */
    long iteration;                          /* the one running */
    int stop;                                /* -1, or the exit a meter answer asked for */
    char *same_failure;                      /* owned: the verify failure repeated, or NULL */
    long same_count;                         /* iterations in a row that failed so */
    bool gate_later;                         /* the start gate said "c": "g" comes later */
    bool beat_done;                          /* the first iteration's heartbeat went out ... */
    int beat_ret;                            /* ... while the workspace was prepared: its result */
};

/* Records a 200 (or 429: charged too) for a usage line ending at NEW_OFFSET. */
static int commit_offset(struct run *r, uint64_t new_offset, const char *model)
{
    struct err err = {0};

    r->state.offset = new_offset;
    if (model != NULL) {
        snprintf(r->state.model, sizeof(r->state.model), "%s", model);
    }
    if (r->cfg->state_file != NULL &&
        runner_state_store(&r->state_file, r->cfg->state_file, &r->state, &err)) {
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

/* While the agent runs: meters every usage line as soon as it is complete (SPEC §14
 * "spend is live"), so a budget stops a long iteration in its middle. False (the agent
 * is killed) once the meter asked the runner to stop. */
static bool follow_usage(void *userdata)
{
    struct run *r = userdata;
    int metered = 0;

    if (r->stop == -1) {
        r->stop = meter_usage(r, r->iteration, false, &metered);
    }
    return r->stop == -1;
}

/* Runs CMD with /bin/sh -c in the workspace, extra environment SET; returns its status. */
static int run_shell(struct run *r, const char *cmd, const char *const *set,
                     struct runner_tail *tail, bool follow)
{
    const struct runner_config *cfg = r->cfg;
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

    if (follow && cfg->usage_file != NULL) {
        sp.follow = follow_usage;
        sp.follow_userdata = r;
        sp.follow_ms = cfg->follow_ms;
        sp.follow_path = cfg->usage_file;
    }
    tail->len = 0;
    if (runner_spawn_run(&status, &sp, &err) != E_OK) {
        runner_say("cannot run a command: %s", err.msg);
    }
    runner_env_free(env);
    return status;
}

/* After the agent of ITERATION: its last usage lines are charged now, not after verify
 * and the checkpoint (the next heartbeat would). True when the meter stopped the run. */
static bool agent_stopped(struct run *r, long iteration)
{
    int metered = 0;

    if (r->stop != -1) {
        runner_say("iteration %ld/%ld: the agent was stopped (the meter paused the task)",
                   iteration, r->cfg->max_iterations);
        return true;
    }
    r->stop = meter_usage(r, iteration, false, &metered);
    if (r->stop != -1) {
        runner_say("iteration %ld/%ld: the meter paused the task after the agent", iteration,
                   r->cfg->max_iterations);
    }
    return r->stop != -1;
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
    r->iteration = iteration;
    it->agent_status = run_shell(r, cfg->agent_cmd, set, tail, true);
    if (agent_stopped(r, iteration)) {
        free(tail);
        free(v_iter);
        free(v_fail);
        free(v_guid);
        return false;
    }
    if (it->agent_status == 0 && cfg->verify_cmd != NULL) {
        it->verify_ran = true;
        it->verify_status = run_shell(r, cfg->verify_cmd, set, tail, false);
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

/* Writes TEXT to PATH through PATH.tmp and a rename (the server reads it). */
static bool write_note(const char *path, const char *text)
{
    char *tmp = xasprintf("%s.tmp", path);
    size_t len = strlen(text);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    bool ok = fd >= 0 && write(fd, text, len) == (ssize_t)len;

    if (fd >= 0) {
        close(fd);
    }
    if (!ok || rename(tmp, path) != 0) {
        runner_say("cannot write %s: %s", path, strerror(errno));
        (void)unlink(tmp);
        ok = false;
    }
    free(tmp);
    return ok;
}

/* Whether the failure file still holds what this runner wrote there last. */
static bool same_stat(const struct stat *a, const struct stat *b)
{
    return a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
           a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

/* The last failure for the server (SPEC §14: quoted with the checkpoint), or none. A
 * failure repeated word for word leaves the file as it is (no new file and rename per
 * iteration) while it is still the one this runner wrote. */
static void note_failure(struct run *r, const char *text)
{
    const char *path = r->cfg->failure_file;
    struct stat now;

    if (text == NULL) {
        if (r->noted != NULL || !r->note_cleared) {
            (void)unlink(path);
        }
        free(r->noted);
        r->noted = NULL;
        r->note_cleared = true;
        return;
    }
    if (r->noted != NULL && strcmp(r->noted, text) == 0 && lstat(path, &now) == 0 &&
        same_stat(&now, &r->noted_st)) {
        return;
    }
    free(r->noted);
    r->noted = NULL;
    r->note_cleared = false;
    if (write_note(path, text) && lstat(path, &r->noted_st) == 0) {
        r->noted = xstrdup(text);
    }
}

/* After an iteration: the last failure for the server (SPEC §14: quoted with the
 * checkpoint) and the checkpoint of the workspace. */
static void after_iteration(struct run *r, long iteration, bool ok)
{
    struct err err = {0};

    if (r->cfg->failure_file != NULL) {
        note_failure(r, ok ? NULL : r->last_failure);
    }
    if (runner_git_checkpoint(r->cfg, iteration, &r->wip, &err) != E_OK) {
        runner_say("checkpoint failed: %s", err.msg);
    }
}

/* Counts verify failures that repeat; true when the last NO_PROGRESS_AFTER were the same. */
static bool no_progress(struct run *r, const struct runner_iteration *it)
{
    if (!it->verify_ran || it->verify_status == 0 || r->last_failure == NULL) {
        free(r->same_failure);
        r->same_failure = NULL;
        r->same_count = 0;
        return false;
    }
    if (runner_same_failure(r->same_failure, r->last_failure)) {
        r->same_count++;
    } else {
        free(r->same_failure);
        r->same_failure = xstrdup(r->last_failure);
        r->same_count = 1;
    }
    return r->cfg->no_progress_after > 0 && r->same_count >= r->cfg->no_progress_after;
}

/* Asks the server to pause the task (reason NoProgress) and waits until it was resumed:
 * the server freezes the sandbox meanwhile, and a resume writes a fresh token. */
static void ask_pause(struct run *r)
{
    const struct runner_config *cfg = r->cfg;
    char *before = NULL, *now = NULL;

    r->same_count = 0;
    if (cfg->no_progress_file == NULL || cfg->token_env != NULL ||
        runner_token_read(&before, cfg, NULL) != E_OK) {
        runner_say("no progress: the same verify failure %ld times in a row",
                   cfg->no_progress_after);
        return;
    }
    (void)write_note(cfg->no_progress_file, r->last_failure);
    runner_say("no progress: the same verify failure %ld times in a row; waiting for guidance "
               "and a resume",
               cfg->no_progress_after);
    for (;;) {
        (void)poll(NULL, 0, RUNNER_REVOKED_POLL_MS);
        if (runner_token_read(&now, cfg, NULL) == E_OK && strcmp(now, before) != 0) {
            break;
        }
        runner_token_free(now);
        now = NULL;
    }
    runner_token_free(now);
    runner_token_free(before);
    (void)unlink(cfg->no_progress_file);
    runner_say("resumed: continuing");
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

/* The iterations (SPEC §9 step 3): -1 with *OK and the LAST one run, or an exit code. */
static int iterations(struct run *r, bool *ok, long *last)
{
    const struct runner_config *cfg = r->cfg;
    struct runner_iteration it;
    int ret = -1;

    *ok = false;
    *last = cfg->start_iteration > cfg->max_iterations ? cfg->max_iterations : cfg->start_iteration;
    for (long i = cfg->start_iteration; i <= cfg->max_iterations && !*ok; i++) {
        ret = r->beat_done && i == cfg->start_iteration ? r->beat_ret : heartbeat(r, i, false);
        if (ret != -1) {
            break;
        }
        *ok = iterate(r, &it, i);
        *last = i;
        after_iteration(r, i, *ok);
        if (r->stop != -1) {
            return r->stop;
        }
        if (!*ok && i < cfg->max_iterations && no_progress(r, &it)) {
            ask_pause(r);
        }
    }
    return ret;
}

static void *beat_main(void *arg)
{
    struct run *r = arg;
    struct err err = {0};

    if (r->gate_later && runner_gate_go(r->cfg, &err) != E_OK) {
        runner_say("%s", err.msg);
        r->beat_ret = RUNNER_EXIT_CONFIG;
        return NULL;
    }
    r->beat_ret = heartbeat(r, r->cfg->start_iteration, false);
    return NULL;
}

static void beat_job(void *arg)
{
    (void)beat_main(arg);
}

/* Prepares the workspace (runner_git_prepare) while the first iteration's heartbeat goes
 * out beside it (after the start gate's "g" when it said "c" first): it needs nothing of
 * the workspace, and the agent starts after both. The heartbeat goes to the early thread
 * (early.c: a new thread would wait for libcurl's load before the checkout could start),
 * else to a thread of its own. -1 to go on, else an exit (reported). */
static int prepare_and_beat(struct run *r)
{
    struct err err = {0};
    pthread_t t;
    bool early = false, beat = false;
    int rc;

    if (r->cfg->start_iteration <= r->cfg->max_iterations) {
        early = runner_early_then(beat_job, r);
        beat = early || pthread_create(&t, NULL, beat_main, r) == 0;
    }
    rc = runner_git_prepare(r->cfg, &err);
    if (rc != E_OK) {
        runner_say("workspace: %s", err.msg);
    }
    if (early) {
        runner_early_wait();
        r->beat_done = true;
    } else if (beat) {
        pthread_join(t, NULL);
        r->beat_done = true;
    } else if (r->gate_later && runner_gate_go(r->cfg, &err) != E_OK) {
        runner_say("%s", err.msg);
        return RUNNER_EXIT_CONFIG;
    }
    return rc == E_OK ? -1 : RUNNER_EXIT_GIT;
}

enum runner_exit runner_run(const struct runner_config *cfg)
{
    struct run r = {.cfg = cfg, .stop = -1, .state_file = {.fd = -1}};
    struct err err = {0};
    enum runner_exit ex;
    long last;
    bool ok = false;
    int ret;
    uint16_t llm_port = 0;

    if (runner_egress_relay_start(cfg, &err) != E_OK) {
        runner_say("egress relay: %s", err.msg);
        return RUNNER_EXIT_CONFIG;
    }
    if (cfg->state_file != NULL && runner_state_load(&r.state, cfg->state_file, &err) != E_OK) {
        runner_say("usage state: %s", err.msg);
        return RUNNER_EXIT_CONFIG;
    }
    if (runner_gate_wait(cfg, &r.gate_later, &err) != E_OK) {
        runner_say("%s", err.msg);
        return RUNNER_EXIT_CONFIG;
    }
    ret = prepare_and_beat(&r);
    if (ret != -1) {
        return (enum runner_exit)ret;
    }
    if (runner_llm_relay_start(&llm_port, cfg, &err) != E_OK) {
        runner_say("llm relay: %s", err.msg);
        return RUNNER_EXIT_CONFIG;
    }
    if (llm_port != 0) {
        runner_llm_env(r.llm_env, llm_port);
    }
    ret = iterations(&r, &ok, &last);
    ex = ret != -1 ? (enum runner_exit)ret : finish(&r, ok, last);
    free(r.guidance);
    free(r.last_failure);
    free(r.noted);
    free(r.same_failure);
    runner_wip_memo_cleanup(&r.wip);
    runner_state_file_close(&r.state_file);
    for (size_t k = 0; r.llm_env[k] != NULL; k++) {
        free(r.llm_env[k]);
    }
    return ex;
}
