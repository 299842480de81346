/* SPDX-License-Identifier: Apache-2.0 */
/* One call through the gateway (SPEC §13): the budget reservation of a task's calls in
 * flight, the charge once the call ended (through the meter's exactly-once path) and the
 * task-log line. A reservation is released only after its charge is durable, so a
 * concurrent call never sees the spend of this one twice as small. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

enum llm_admit llm_call_admit(int64_t *out_allowed, struct llm_call *c, int64_t want_out)
{
    struct meter_gate g;
    char *key = task_key_of(c->token);
    int64_t in_max = (int64_t)c->body_len, out;
    enum llm_admit verdict;

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
    c->ns = xstrdup(g.ns);
    c->name = xstrdup(g.name);
    if (c->guidance != NULL) {
        /* The guidance is sent too: its bytes and its prefix count as input. */
        in_max += (int64_t)strlen(c->guidance) + 64;
    }
    out = room_for(c, &g.d, in_max, want_out, true, true, true);
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
    pthread_mutex_unlock(&c->gw->mu);
    c->reserved = true;
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

/* The model name fit for a log line: printable ASCII without spaces, cut. */
void llm_call_set_model(struct llm_call *c, const char *model)
{
    size_t n = 0;

    free(c->model);
    c->model = xstrdup(model);
    for (const char *m = model; *m != '\0' && n + 1 < sizeof(c->model_safe); m++) {
        c->model_safe[n++] = *m > 0x20 && *m < 0x7f ? *m : '?';
    }
    c->model_safe[n] = '\0';
}

void llm_call_settle(struct llm_call *c, const struct llm_usage *u)
{
    struct llm_usage used = {0};
    char id[LLM_REQUEST_ID_LEN], usd[MONEY_STR_MAX], *path;
    int64_t cost, tokens;
    int st;

    if (!c->reserved) {
        return;
    }
    if (u != NULL && u->complete) {
        used = *u;
        cost = llm_cost_micros(&c->price, &used);
        tokens = llm_usage_tokens(&used);
    } else {
        /* Cut before its usage arrived: the reservation is what it may have cost. */
        cost = c->reserved_micros;
        tokens = c->reserved_tokens;
    }
    llm_call_new_request_id(id, c->provider);
    /* The charge and the release of the reservation are one step for the task's
     * admissions (they hold the same lock from their totals to their reservation): an
     * admission between the two would see the old totals without this reservation, and
     * let a concurrent call pass the budget (seen under load). */
    pthread_mutex_lock(&c->task->mu);
    pthread_mutex_lock(&c->project->mu);
    st = meter_gate_settle(NULL, c->srv->meter, c->token, id, c->model, tokens, cost,
                           c->guidance != NULL);
    llm_call_release(c);
    pthread_mutex_unlock(&c->project->mu);
    pthread_mutex_unlock(&c->task->mu);
    money_format(usd, cost);
    path = sandbox_log_path(c->srv->cfg.data_dir, c->ns, c->name);
    if (u != NULL && u->complete) {
        sandbox_log_event(path,
                          "llm %s %s input=%lld output=%lld cache_write=%lld "
                          "cache_read=%lld usd=%s",
                          llm_provider_name(c->provider), c->model_safe, (long long)used.input,
                          (long long)used.output, (long long)used.cache_write,
                          (long long)used.cache_read, usd);
    } else {
        sandbox_log_event(path,
                          "llm %s %s ended before its usage arrived: charged the "
                          "reservation tokens=%lld usd=%s",
                          llm_provider_name(c->provider), c->model_safe, (long long)tokens, usd);
    }
    free(path);
    if (st != 200 && st != 429) {
        log_kv(LOG_ERROR, "llm_charge_failed", "namespace", c->ns, "name", c->name, "usd", usd,
               NULL);
    }
}

void llm_call_release(struct llm_call *c)
{
    if (c->reserved) {
        pthread_mutex_lock(&c->gw->mu);
        c->task->reserved_micros -= c->reserved_micros;
        c->task->reserved_tokens -= c->reserved_tokens;
        c->project->reserved_micros -= c->reserved_micros;
        c->project->reserved_tokens -= c->reserved_tokens;
        pthread_mutex_unlock(&c->gw->mu);
        c->reserved = false;
    }
}

void llm_call_free(struct llm_call *c)
{
    if (c == NULL) {
        return;
    }
    llm_call_release(c);
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
