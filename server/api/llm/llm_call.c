/* SPDX-License-Identifier: Apache-2.0 */
/* One call through the gateway (SPEC §13): the budget reservation of a task's calls in
 * flight, the charge once the call ended (through the meter's exactly-once path) and the
 * task-log line. A reservation is released only after its charge is durable, so a
 * concurrent call never sees the spend of this one twice as small. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/money.h"
#include "common/secret.h"
#include "sandbox/sandbox.h"
#include "server/api/llm/llm_call.h"

/* --- the per-task table ------------------------------------------------------------ */

static struct llm_task *task_ref(struct llm_gateway *gw, const char *key)
{
    struct llm_task *t;

    pthread_mutex_lock(&gw->mu);
    for (t = gw->tasks; t != NULL; t = t->next) {
        if (strcmp(t->key, key) == 0) {
            break;
        }
    }
    if (t == NULL) {
        t = xcalloc(1, sizeof(*t));
        t->key = xstrdup(key);
        pthread_mutex_init(&t->mu, NULL);
        t->next = gw->tasks;
        gw->tasks = t;
    }
    t->refs++;
    pthread_mutex_unlock(&gw->mu);
    return t;
}

static void task_unref(struct llm_gateway *gw, struct llm_task *t)
{
    struct llm_task **pp;

    if (t == NULL) {
        return;
    }
    pthread_mutex_lock(&gw->mu);
    if (--t->refs > 0) {
        pthread_mutex_unlock(&gw->mu);
        return;
    }
    for (pp = &gw->tasks; *pp != t; pp = &(*pp)->next) {
    }
    *pp = t->next;
    pthread_mutex_unlock(&gw->mu);
    pthread_mutex_destroy(&t->mu);
    free(t->key);
    free(t);
}

/* The key of TOKEN's task ("ns/name") read from its caveats without verifying it: only a
 * lock's name; the meter verifies the token. NULL when it names no single task. */
static char *task_key_of(const char *token)
{
    struct token *t = NULL;
    const char *ns = NULL, *name = NULL;
    char *key = NULL;
    int nns = 0, nname = 0;

    if (token_decode(&t, token, strlen(token), NULL) != E_OK) {
        return NULL;
    }
    for (size_t i = 0; i < token_caveat_count(t); i++) {
        const char *c = token_caveat(t, i);
        if (strncmp(c, "namespace = ", 12) == 0) {
            ns = c + 12, nns++;
        } else if (strncmp(c, "task_id = ", 10) == 0) {
            name = c + 10, nname++;
        }
    }
    if (nns == 1 && nname == 1) {
        key = xasprintf("%s/%s", ns, name);
    }
    token_free(t);
    return key;
}

/* --- reservations ------------------------------------------------------------------ */

static int64_t max3(int64_t a, int64_t b, int64_t c)
{
    int64_t m = a > b ? a : b;
    return m > c ? m : c;
}

/* The most output tokens a call with IN_MAX input tokens can pay for out of AVAIL_USD
 * (micro-dollars; INT64_MAX: no USD budget) and AVAIL_TOK tokens, up to WANT. */
static int64_t output_fits(const struct llm_price *p, int64_t in_max, int64_t want,
                           int64_t avail_usd, int64_t avail_tok)
{
    struct llm_usage in = {.input = in_max};
    struct llm_price worst = *p;
    int64_t out = want;

    /* Input is priced at the dearest input kind: the call may write or read a cache. */
    worst.input = max3(p->input, p->cache_write, p->cache_read);
    if (avail_usd != INT64_MAX) {
        int64_t in_cost = llm_cost_micros(&worst, &in);
        __extension__ __int128 room = ((__int128)avail_usd - in_cost) * MONEY_MICROS_PER_USD;
        if (room < 0) {
            return -1;
        }
        if (p->output > 0 && room / p->output < out) {
            out = (int64_t)(room / p->output);
        }
        /* Rounding up per call may cost one micro-dollar more than the exact sum. */
        while (out > 0) {
            struct llm_usage u = {.input = in_max, .output = out};
            if (llm_cost_micros(&worst, &u) <= avail_usd) {
                break;
            }
            out--;
        }
    }
    if (avail_tok != INT64_MAX && avail_tok - in_max < out) {
        out = avail_tok - in_max;
    }
    return out;
}

static void reservation_of(struct llm_call *c, int64_t in_max, int64_t out)
{
    struct llm_price worst = c->price;
    struct llm_usage u = {.input = in_max, .output = out};

    worst.input = max3(c->price.input, c->price.cache_write, c->price.cache_read);
    c->reserved_micros = llm_cost_micros(&worst, &u);
    c->reserved_tokens = in_max + out;
}

/* What remains of G's budgets after the reservations RES_USD, RES_TOK. */
static void remaining(int64_t *usd, int64_t *tok, const struct meter_decision *d, int64_t res_usd,
                      int64_t res_tok)
{
    *usd = d->has_budget_usd ? d->budget_usd - d->total_cost_micros - res_usd : INT64_MAX;
    *tok = d->has_budget_tokens ? d->budget_tokens - d->total_tokens - res_tok : INT64_MAX;
}

/* What remains of the namespace's quotas after the reservations RES_USD, RES_TOK of its
 * calls in flight (SPEC §15: a gateway call cannot take a project past its quota). */
static void quota_remaining(int64_t *usd, int64_t *tok, const struct meter_decision *d,
                            int64_t res_usd, int64_t res_tok)
{
    *usd = d->has_quota_usd ? d->quota_usd_left - res_usd : INT64_MAX;
    *tok = d->has_quota_tokens ? d->quota_tokens_left - res_tok : INT64_MAX;
}

static int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/* The output C may ask for out of what both the task's budgets and its namespace's quotas
 * leave, counting the reservations of calls in flight when HELD. */
static int64_t room_for(const struct llm_call *c, const struct meter_decision *d, int64_t in_max,
                        int64_t want, bool held, bool budget, bool quota)
{
    int64_t usd = INT64_MAX, tok = INT64_MAX, qusd = INT64_MAX, qtok = INT64_MAX;

    pthread_mutex_lock(&c->gw->mu);
    if (budget) {
        remaining(&usd, &tok, d, held ? c->task->reserved_micros : 0,
                  held ? c->task->reserved_tokens : 0);
    }
    if (quota) {
        quota_remaining(&qusd, &qtok, d, held ? c->project->reserved_micros : 0,
                        held ? c->project->reserved_tokens : 0);
    }
    pthread_mutex_unlock(&c->gw->mu);
    return output_fits(&c->price, in_max, want, min64(usd, qusd), min64(tok, qtok));
}

/* Why nothing fits: the spend alone (no reservations) leaves no room in the quota, or in
 * the budget; else calls in flight hold what remains. */
static enum llm_admit no_room(const struct llm_call *c, const struct meter_decision *d,
                              int64_t in_max)
{
    if (room_for(c, d, in_max, 1, false, false, true) < 1) {
        return LLM_ADMIT_QUOTA;
    }
    if (room_for(c, d, in_max, 1, false, true, false) < 1) {
        return LLM_ADMIT_EXHAUSTED;
    }
    return LLM_ADMIT_BUSY;
}

/* The namespace part of the task key "ns/name" (a lock's name). */
static char *project_key_of(const char *task_key)
{
    const char *slash = strchr(task_key, '/');

    return xasprintf("%.*s", (int)(slash - task_key), task_key);
}

/* SNAP: how many calls of C's task and namespace had been answered before their charge. */
static void snapshot(int64_t snap[2], const struct llm_call *c)
{
    pthread_mutex_lock(&c->gw->mu);
    snap[0] = c->task->ended;
    snap[1] = c->project->ended;
    pthread_mutex_unlock(&c->gw->mu);
}

/* Whether fewer calls of C's task or namespace settled than had ended at SNAP. */
static bool unsettled_since(const struct llm_call *c, const int64_t snap[2])
{
    bool any;

    pthread_mutex_lock(&c->gw->mu);
    any = c->task->settled < snap[0] || c->project->settled < snap[1];
    pthread_mutex_unlock(&c->gw->mu);
    return any;
}

/* Waits until as many calls of C's task and namespace settled as had ended at SNAP (calls
 * settle in about the order they ended; one settling late only makes this wait shorter). */
static void wait_settled(const struct llm_call *c, const int64_t snap[2])
{
    pthread_mutex_lock(&c->gw->mu);
    while (c->task->settled < snap[0] || c->project->settled < snap[1]) {
        pthread_cond_wait(&c->gw->settled, &c->gw->mu);
    }
    pthread_mutex_unlock(&c->gw->mu);
}

void llm_call_ended(struct llm_call *c)
{
    pthread_mutex_lock(&c->gw->mu);
    if (c->held && !c->ended) {
        c->task->ended++;
        c->project->ended++;
        c->ended = true;
    }
    pthread_mutex_unlock(&c->gw->mu);
}

enum llm_admit llm_call_admit(int64_t *out_allowed, struct llm_call *c, int64_t want_out)
{
    struct meter_gate g;
    char *key = task_key_of(c->token);
    int64_t in_max = (int64_t)c->body_len, out, snap[2];
    enum llm_admit verdict;
    bool waited = false;

    *out_allowed = 0;
    if (key == NULL) {
        c->gate_status = 401;
        c->gate_reason = "malformed token";
        return LLM_ADMIT_DENIED;
    }
    c->task = task_ref(c->gw, key);
    {
        char *pkey = project_key_of(key);
        c->project = task_ref(c->gw, pkey);
        free(pkey);
    }
    free(key);
again:
    snapshot(snap, c);
    /* One task's checks and reservations in turn, and one namespace's (its quotas): the
     * totals read below and the reservations of the others are one consistent picture.
     * Lock order: the task, then its namespace. */
    pthread_mutex_lock(&c->task->mu);
    pthread_mutex_lock(&c->project->mu);
    meter_gate_check(&g, c->srv->meter, c->token, c->model);
    c->gate_status = g.status;
    c->gate_reason = g.reason;
    if (g.status != 200) {
        verdict = LLM_ADMIT_DENIED;
        goto out;
    }
    free(c->guidance);
    c->guidance = g.guidance != NULL && g.guidance[0] != '\0' ? xstrdup(g.guidance) : NULL;
    free(c->ns);
    free(c->name);
    c->ns = xstrdup(g.ns);
    c->name = xstrdup(g.name);
    if (c->guidance != NULL) {
        /* The guidance is sent too: its bytes and its prefix count as input. */
        in_max += (int64_t)strlen(c->guidance) + 64;
    }
    out = room_for(c, &g.d, in_max, want_out, true, true, true);
    if (out < want_out && !waited && unsettled_since(c, snap)) {
        /* The budget binds while calls that already ended hold their reservations: decide
         * on what they really cost, once they are charged (a moment). */
        pthread_mutex_unlock(&c->project->mu);
        pthread_mutex_unlock(&c->task->mu);
        meter_gate_cleanup(&g);
        wait_settled(c, snap);
        waited = true;
        in_max = (int64_t)c->body_len;
        goto again;
    }
    if (out < 1) {
        /* Pause only when the spend alone leaves no room: calls in flight may yet settle
         * below what they reserved. */
        verdict = no_room(c, &g.d, in_max);
        goto out;
    }
    reservation_of(c, in_max, out);
    pthread_mutex_lock(&c->gw->mu);
    c->task->reserved_micros += c->reserved_micros;
    c->task->reserved_tokens += c->reserved_tokens;
    c->project->reserved_micros += c->reserved_micros;
    c->project->reserved_tokens += c->reserved_tokens;
    c->held = true;
    pthread_mutex_unlock(&c->gw->mu);
    c->reserved = true;
    llm_call_new_request_id(c->request_id, c->provider);
    *out_allowed = out;
    verdict = LLM_ADMIT_OK;
out:
    pthread_mutex_unlock(&c->project->mu);
    pthread_mutex_unlock(&c->task->mu);
    meter_gate_cleanup(&g);
    return verdict;
}

void llm_call_new_request_id(char out[LLM_REQUEST_ID_LEN], enum llm_provider p)
{
    unsigned char rnd[12];
    char hex[sizeof(rnd) * 2 + 1];

    secret_random(rnd, sizeof(rnd));
    secret_hex(hex, rnd, sizeof(rnd));
    snprintf(out, LLM_REQUEST_ID_LEN, "llm-%s-%s", llm_provider_name(p), hex);
}

void llm_call_pause(struct llm_call *c, bool quota)
{
    char id[LLM_REQUEST_ID_LEN];
    int st;

    llm_call_new_request_id(id, c->provider);
    st = quota ? meter_gate_quota_exhausted(c->srv->meter, c->token, id, c->model)
               : meter_gate_exhausted(c->srv->meter, c->token, id, c->model);
    if (st == 429 && c->ns != NULL) {
        char *path = sandbox_log_path(c->srv->cfg.data_dir, c->ns, c->name);
        sandbox_log_event(path, "llm %s %s refused: %s, task paused",
                          llm_provider_name(c->provider), c->model_safe,
                          quota ? "project quota exceeded" : "budget exceeded");
        free(path);
    }
}

void llm_log_safe(char *out, size_t size, const char *s)
{
    size_t n = 0;

    for (; *s != '\0' && n + 1 < size; s++) {
        out[n++] = *s > 0x20 && *s < 0x7f ? *s : '?';
    }
    out[n] = '\0';
}

/* The model name fit for a log line: printable ASCII without spaces, cut. */
void llm_call_set_model(struct llm_call *c, const char *model)
{
    free(c->model);
    c->model = xstrdup(model);
    llm_log_safe(c->model_safe, sizeof(c->model_safe), model);
}

static void release_amounts(struct llm_call *c);

/* Sleeps MS milliseconds (the tests' settle delay). */
static void sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};

    while (nanosleep(&ts, &ts) != 0) {
        /* EINTR: sleep the rest */
    }
}

/* The task-log line of C's charge. */
static void log_charge(const struct llm_call *c, const struct llm_usage *u, int64_t tokens,
                       int64_t cost, bool capped)
{
    char usd[MONEY_STR_MAX], *path;

    money_format(usd, cost);
    path = sandbox_log_path(c->srv->cfg.data_dir, c->ns, c->name);
    if (u != NULL && u->complete) {
        sandbox_log_event(path,
                          "llm %s %s input=%lld output=%lld cache_write=%lld "
                          "cache_read=%lld usd=%s%s",
                          llm_provider_name(c->provider), c->model_safe, (long long)u->input,
                          (long long)u->output, (long long)u->cache_write, (long long)u->cache_read,
                          usd,
                          capped ? " (capped at the call's reservation: the upstream reported "
                                   "more than the call was allowed)"
                                 : "");
    } else {
        sandbox_log_event(path,
                          "llm %s %s ended before its usage arrived: charged the "
                          "reservation tokens=%lld usd=%s",
                          llm_provider_name(c->provider), c->model_safe, (long long)tokens, usd);
    }
    free(path);
}

void llm_call_settle(struct llm_call *c, const struct llm_usage *u)
{
    bool complete = u != NULL && u->complete, capped = false;
    char usd[MONEY_STR_MAX];
    int64_t cost, tokens;
    int st;

    if (!c->reserved) {
        return;
    }
    if (complete) {
        cost = llm_cost_micros(&c->price, u);
        tokens = llm_usage_tokens(u);
        /* Never more than reserved: an upstream reporting more output than the call's
         * limit would otherwise take the task past its budget by this call. */
        if (cost > c->reserved_micros || tokens > c->reserved_tokens) {
            capped = true;
            cost = min64(cost, c->reserved_micros);
            tokens = min64(tokens, c->reserved_tokens);
        }
    } else {
        /* Cut before its usage arrived: the reservation is what it may have cost. */
        cost = c->reserved_micros;
        tokens = c->reserved_tokens;
    }
    if (c->gw->settle_delay_ms > 0) {
        sleep_ms(c->gw->settle_delay_ms);
    }
    /* The charge and the release of the reservation are one step for the task's
     * admissions (they hold the same lock from their totals to their reservation): an
     * admission between the two would see the old totals without this reservation, and
     * let a concurrent call pass the budget (seen under load). The charge's request id is
     * the reservation record's, which the same transaction removes. */
    pthread_mutex_lock(&c->task->mu);
    pthread_mutex_lock(&c->project->mu);
    st = meter_gate_settle(NULL, c->srv->meter, c->token, c->request_id, c->model, tokens, cost,
                           c->guidance != NULL);
    c->reserved = false;
    release_amounts(c);
    pthread_mutex_unlock(&c->project->mu);
    pthread_mutex_unlock(&c->task->mu);
    log_charge(c, u, tokens, cost, capped);
    if (st != 200 && st != 429) {
        money_format(usd, cost);
        log_kv(LOG_ERROR, "llm_charge_failed", "namespace", c->ns, "name", c->name, "usd", usd,
               NULL);
    }
}

/* Takes C's reserved amounts out of its task's and namespace's calls in flight. */
static void release_amounts(struct llm_call *c)
{
    pthread_mutex_lock(&c->gw->mu);
    c->task->reserved_micros -= c->reserved_micros;
    c->task->reserved_tokens -= c->reserved_tokens;
    c->project->reserved_micros -= c->reserved_micros;
    c->project->reserved_tokens -= c->reserved_tokens;
    c->held = false;
    if (c->ended) {
        c->task->settled++;
        c->project->settled++;
        pthread_cond_broadcast(&c->gw->settled);
    }
    pthread_mutex_unlock(&c->gw->mu);
}

void llm_call_release(struct llm_call *c)
{
    if (!c->reserved) {
        return;
    }
    /* The record first: a restart between the two charges nothing, the other order could
     * charge a call that was not charged (an upstream error). */
    if (llm_call_recorded(c) &&
        meter_gate_resv_drop(c->srv->meter, c->token, c->request_id) != 200) {
        log_kv(LOG_ERROR, "llm_record_drop_failed", "namespace", c->ns, "name", c->name, NULL);
    }
    release_amounts(c);
    c->reserved = false;
}

void llm_call_record(struct llm_call *c)
{
    if (c->reserved && c->record == NULL && c->record_status == 0) {
        c->record = meter_gate_reserve_post(c->srv->meter, c->token, c->request_id, c->model,
                                            llm_provider_name(c->provider), c->reserved_tokens,
                                            c->reserved_micros);
        if (c->record == NULL) {
            c->record_status = 503; /* no record: the store keeps none */
        }
    }
}

bool llm_call_recorded(struct llm_call *c)
{
    if (c->record != NULL) {
        c->record_status = meter_gate_reserve_wait(c->record);
        c->record = NULL;
    }
    return c->record_status == 200;
}

struct finish {
    struct llm_call *call;
    struct llm_usage usage;
    bool has_usage, charge;
};

static void finish_now(struct finish *f)
{
    if (f->charge) {
        llm_call_settle(f->call, f->has_usage ? &f->usage : NULL);
    } else {
        llm_call_release(f->call);
    }
    llm_call_free(f->call);
}

int llm_gateway_thread(struct llm_gateway *gw, void *(*fn)(void *), void *arg)
{
    pthread_attr_t attr;
    pthread_t th;
    int rc;

    pthread_mutex_lock(&gw->mu);
    gw->active++;
    pthread_mutex_unlock(&gw->mu);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256u << 10);
    rc = pthread_create(&th, &attr, fn, arg);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        llm_gateway_idle_one(gw);
    }
    return rc;
}

void llm_gateway_idle_one(struct llm_gateway *gw)
{
    pthread_mutex_lock(&gw->mu);
    if (--gw->active == 0) {
        pthread_cond_broadcast(&gw->idle);
    }
    pthread_mutex_unlock(&gw->mu);
}

static void *finish_thread(void *arg)
{
    struct finish *f = arg;
    struct llm_gateway *gw = f->call->gw;

    finish_now(f);
    free(f);
    llm_gateway_idle_one(gw);
    return NULL;
}

void llm_call_finish_later(struct llm_call *c, const struct llm_usage *usage, bool charge)
{
    struct finish *f = xcalloc(1, sizeof(*f));
    struct llm_gateway *gw = c->gw;

    f->call = c;
    f->charge = charge;
    if (usage != NULL) {
        f->usage = *usage;
        f->has_usage = true;
    }
    if (!c->reserved || (!charge && c->record == NULL && c->record_status != 200)) {
        finish_now(f); /* nothing to commit */
        free(f);
        return;
    }
    if (llm_gateway_thread(gw, finish_thread, f) != 0) {
        finish_now(f);
        free(f);
    }
}

void llm_call_free(struct llm_call *c)
{
    if (c == NULL) {
        return;
    }
    llm_call_release(c);
    (void)llm_call_recorded(c); /* a record still being committed is collected */
    task_unref(c->gw, c->task);
    task_unref(c->gw, c->project);
    if (c->token != NULL) {
        secret_wipe(c->token, strlen(c->token));
    }
    free(c->token);
    if (c->key_header != NULL) {
        secret_wipe(c->key_header, strlen(c->key_header));
    }
    free(c->key_header);
    for (size_t i = 0; i < ARRAY_LEN(c->extra_headers); i++) {
        free(c->extra_headers[i]);
    }
    free(c->model);
    free(c->guidance);
    free(c->ns);
    free(c->name);
    free(c->url);
    free(c->body);
    free(c);
}
