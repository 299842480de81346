/* SPDX-License-Identifier: Apache-2.0 */
/* The meter service: request threads check the token's signature and parse the body in
 * parallel, then queue a job; one committer thread (common/gcommit.h) takes every queued
 * job, applies them in ONE write transaction and answers them all after the single
 * fsync'd COMMIT: group commit. */
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/gcommit.h"
#include "common/jsonw.h"
#include "common/log.h"
#include "common/money.h"
#include "common/secret.h"
#include "meter/meter_int.h"
#include "store/quota.h"

/* What a job asks of the committer. */
enum meter_job_kind {
    METER_JOB_METER,     /* a meter call (SPEC §7) */
    METER_JOB_CHECK,     /* the gateway's checks 1-3 and the totals, nothing written */
    METER_JOB_SETTLE,    /* the gateway's charge of a call it let through */
    METER_JOB_EXHAUSTED, /* the gateway found no budget: pause as a meter 429 does */
    METER_JOB_COMPLETE,  /* an external agent ends its task (SPEC §14) */
    METER_JOB_QUOTA_OUT, /* the gateway found no quota left: pause QuotaExceeded */
    METER_JOB_RESERVE,   /* the gateway's record of a call it let through (its reservation) */
    METER_JOB_RESV_DROP, /* that record removed without a charge (the call was not charged) */
};

struct meter_job {
    enum meter_job_kind kind;
    const struct token *tok;     /* borrowed from the request thread; signature verified */
    struct verified_token *vt;   /* borrowed: the cache entry holding tok */
    const char *ns;              /* borrowed from tok's namespace caveat */
    const char *name;            /* borrowed from tok's task_id caveat */
    int64_t max_iterations;      /* out: for the totals body */
    char *guidance;              /* out: owned copy of the guidance annotation */
    char *preview;               /* out: owned copy of status.previewUrl */
    struct meter_decision d;     /* out: the decision, when it carries totals */
    char quota[64];              /* out: the SpendQuota that binds (METER_OVER_QUOTA), or "" */
    bool totals;                 /* out: answer with the totals body (built by the caller) */
    bool guidance_sent;          /* the charged call carried the task's guidance to the agent */
    bool keeps_resv;             /* SETTLE: the store keeps reservation records (drop its own) */
    const char *provider;        /* RESERVE: the call's provider name (static) */
    struct meter_request req;    /* parsed body (when body_ok) */
    struct meter_completion fin; /* METER_JOB_COMPLETE: the parsed body (when body_ok) */
    bool body_ok;
    char body_err[ERR_MSG_MAX]; /* why the body was refused */
    bool excluded;              /* failed alone: answered 503, left out of the retry */
    int status;                 /* out: HTTP status */
    char *body;                 /* out: owned JSON text */
    struct gcommit_item link;   /* the committer's queue; link.next: the batch */
};

/* The job queued as IT, or NULL. */
static struct meter_job *queued_job(struct gcommit_item *it)
{
    return it != NULL ? container_of(it, struct meter_job, link) : NULL;
}

struct meter_service {
    struct task_store *store; /* borrowed */
    bool keeps_resv;          /* the store keeps the gateway's reservation records */
    unsigned char root_key[TOKEN_ROOT_KEY_LEN];
    struct gcommit *committer; /* owned: the group commit of every job */
    struct token_cache tokens; /* verified tokens by text */
};

/* --- response bodies --------------------------------------------------------------- */

static void put_json_string(struct buf *b, const char *s)
{
    json_t *j = json_string(s != NULL ? s : "");
    char *text = j != NULL ? json_dumps(j, JSON_ENCODE_ANY) : NULL;

    buf_puts(b, text != NULL ? text : "\"\"");
    free(text);
    json_decref(j);
}

static char *error_body(const char *msg, const char *reason)
{
    struct buf b;

    buf_init(&b, 0);
    buf_puts(&b, "{\"error\":");
    put_json_string(&b, msg);
    buf_puts(&b, ",\"reason\":");
    put_json_string(&b, reason);
    buf_puts(&b, "}");
    return buf_take(&b);
}

/* Money goes out as a JSON number written from the exact decimal, never via a double. */
static char *totals_body(const struct meter_decision *d, const char *guidance, const char *preview,
                         int64_t max_iter, const char *quota)
{
    bool allowed = d->outcome == METER_ALLOWED || d->outcome == METER_DUPLICATE;
    char cost[MONEY_STR_MAX], budget[MONEY_STR_MAX];
    struct buf b;

    money_format(cost, d->total_cost_micros);
    money_format(budget, d->budget_usd);
    buf_init(&b, 0);
    buf_reserve(&b, 256);
    /* Appends, no printf: every meter call answers with this body. */
    buf_puts(&b, allowed ? "{\"allowed\":true,\"suspended\":false,"
                         : "{\"allowed\":false,\"suspended\":true,");
    if (!allowed) {
        buf_puts(&b, "\"reason\":");
        put_json_string(&b, d->reason);
        buf_puts(&b, ",\"error\":");
        put_json_string(&b, d->reason);
        buf_puts(&b, ",");
    }
    if (d->outcome == METER_DUPLICATE) {
        buf_puts(&b, "\"duplicate\":true,");
    }
    if (d->outcome == METER_OVER_QUOTA && quota != NULL && quota[0] != '\0') {
        buf_puts(&b, "\"quota\":");
        put_json_string(&b, quota);
        buf_puts(&b, ",");
    }
    buf_puts(&b, "\"totalTokensUsed\":");
    jsonw_int(&b, d->total_tokens);
    buf_puts(&b, ",\"totalCostUSD\":");
    buf_puts(&b, cost);
    buf_puts(&b, ",\"iteration\":");
    jsonw_int(&b, d->iteration);
    buf_puts(&b, ",\"maxIterations\":");
    jsonw_int(&b, max_iter);
    buf_puts(&b, ",");
    if (d->has_budget_usd) {
        buf_puts(&b, "\"budgetUSD\":");
        buf_puts(&b, budget);
        buf_puts(&b, ",");
    }
    if (d->has_budget_tokens) {
        buf_puts(&b, "\"budgetTokens\":");
        jsonw_int(&b, d->budget_tokens);
        buf_puts(&b, ",");
    }
    /* Both come from the task's document (jansson keeps valid UTF-8 only). */
    buf_puts(&b, "\"guidance\":");
    jsonw_string(&b, guidance != NULL ? guidance : "");
    buf_puts(&b, ",\"previewUrl\":");
    jsonw_string(&b, preview != NULL ? preview : "");
    buf_puts(&b, "}");
    return buf_take(&b);
}

/* --- applying one job inside the batch transaction ------------------------------------ */

static bool capabilities_allow(const json_t *caps, const char *model)
{
    size_t i;
    const json_t *c;

    if (!json_is_array(caps) || json_array_size(caps) == 0) {
        return true;
    }
    json_array_foreach(caps, i, c)
    {
        if (json_is_string(c) && token_model_match(json_string_value(c), model)) {
            return true;
        }
    }
    return false;
}

static void push_request_id(json_t *status, const char *id)
{
    json_t *ring = json_object_get(status, "lastMeterRequestIds");

    if (!json_is_array(ring)) {
        ring = json_array();
        json_object_set_new(status, "lastMeterRequestIds", ring);
    }
    json_array_append_new(ring, json_string(id));
    while (json_array_size(ring) > TASK_METER_RING) {
        json_array_remove(ring, 0);
    }
}

struct batch {
    struct meter_job *jobs;   /* the list */
    struct meter_job *failed; /* out: the job whose own step failed */
    struct err err;           /* out: why */
    json_t **dirty;           /* tasks charged in this batch, written once at the end */
    size_t ndirty, capdirty;
    json_t *quotas;       /* namespace -> its SpendQuotas as this batch sees them */
    json_t *quotas_dirty; /* namespace -> true: quotas charged, written at the end */
    /* Whether each verified token seen in this batch is its task's current active token:
     * read once per token and batch, forgotten when the batch revokes a token. */
    struct tok_seen {
        const struct verified_token *vt;
        bool current;
    } * seen;
    size_t nseen, capseen;
};

/* Whether J's token is its task's current, active one (SPEC §7 step 1), as this batch's
 * transaction sees it: read once per batch, or once until the store's tokens change where
 * the store counts their changes. */
static bool token_is_current(struct batch *b, struct task_txn *tx, const struct meter_job *j,
                             struct err *err)
{
    struct token_record rec;
    struct verified_token *vt = j->vt;
    bool current = false, counted;
    uint64_t epoch = 0;
    int rc;

    counted = task_txn_token_epoch(&epoch, tx) == E_OK;
    if (counted && vt->cur_known && vt->cur_epoch == epoch) {
        return vt->cur_value;
    }
    for (size_t i = 0; i < b->nseen; i++) {
        if (b->seen[i].vt == j->vt) {
            return b->seen[i].current;
        }
    }
    rc = task_txn_token_current(&rec, tx, j->ns, j->name, err);
    if (rc == E_OK) {
        current = rec.active && strcmp(rec.token_id, token_identifier(j->tok)) == 0;
        free(rec.token);
    }
    if (counted && (rc == E_OK || rc == E_NOTFOUND)) { /* never a failed read */
        vt->cur_epoch = epoch;
        vt->cur_known = true;
        vt->cur_value = current;
    }
    if (b->nseen == b->capseen) {
        b->capseen = b->capseen == 0 ? 64 : b->capseen * 2;
        b->seen = xrealloc(b->seen, b->capseen * sizeof(*b->seen));
    }
    b->seen[b->nseen++] = (struct tok_seen){.vt = j->vt, .current = current};
    return current;
}

/* Revokes the token of J's task inside TX; the batch reads every token state again. */
static int revoke_token(struct batch *b, struct task_txn *tx, const struct meter_job *j,
                        struct err *err)
{
    b->nseen = 0;
    return task_txn_token_revoke(tx, j->ns, j->name, err);
}

/* The SpendQuotas of NS, read once per batch and rolled into the current month (a new
 * month's first charge starts from zero). Borrowed from the batch; NULL on a read error. */
static json_t *batch_quotas(struct batch *b, struct task_txn *tx, const char *ns, struct err *err)
{
    json_t *items = json_object_get(b->quotas, ns), *q;
    int64_t now = clock_now_ms(task_txn_clock(tx));
    size_t i;

    if (items != NULL) {
        return items;
    }
    if (task_txn_quota_list(&items, tx, ns, err) != E_OK) {
        return NULL;
    }
    json_array_foreach(items, i, q)
    {
        (void)quota_roll(q, now);
    }
    json_object_set_new(b->quotas, ns, items);
    return items;
}

/* Adds the job's charge to every quota of its namespace: the same transaction as the
 * task's, so exactly once with the task's request id. */
static void charge_quotas(struct batch *b, const struct meter_job *j)
{
    json_t *items = json_object_get(b->quotas, j->ns), *q;
    size_t i;

    if (json_array_size(items) == 0) {
        return;
    }
    json_array_foreach(items, i, q)
    {
        quota_add(q, j->req.tokens_used, j->req.cost_micros);
    }
    json_object_set_new(b->quotas_dirty, j->ns, json_true());
}

/* Marks DOC to be written at the end of the batch: several charges of one task in one
 * batch cost one write (and one MODIFIED event) instead of one each. */
static void mark_dirty(struct batch *b, json_t *doc)
{
    for (size_t i = 0; i < b->ndirty; i++) {
        if (b->dirty[i] == doc) {
            return;
        }
    }
    if (b->ndirty == b->capdirty) {
        b->capdirty = b->capdirty == 0 ? 64 : b->capdirty * 2;
        b->dirty = xrealloc(b->dirty, b->capdirty * sizeof(*b->dirty));
    }
    b->dirty[b->ndirty++] = json_incref(doc);
}

static void clear_dirty(struct batch *b)
{
    for (size_t i = 0; i < b->ndirty; i++) {
        json_decref(b->dirty[i]);
    }
    b->ndirty = 0;
}

/* Records that the task's current guidance reached the agent (status.guidanceDeliveredAt,
 * and guidanceHash naming which text), once per guidance text: the sticky comment shows it. */
static void note_guidance(json_t *status, const json_t *doc, int64_t now_ms)
{
    const char *g = json_string_value(json_object_get(
        json_object_get(json_object_get(doc, "metadata"), "annotations"), TASK_ANN_GUIDANCE));
    const char *had = json_string_value(json_object_get(status, "guidanceHash"));
    char hash[TASK_GUIDANCE_HASH_LEN], when[CLOCK_RFC3339_MAX];

    if (g == NULL || g[0] == '\0') {
        return;
    }
    task_guidance_hash(hash, g);
    if (had != NULL && strcmp(had, hash) == 0) {
        return;
    }
    clock_rfc3339(when, now_ms);
    json_object_set_new(status, "guidanceHash", json_string(hash));
    json_object_set_new(status, "guidanceDeliveredAt", json_string(when));
}

/* Recomputes the spend forecast (SPEC §15) into STATUS from the totals after this charge.
 * Only a call that reports an iteration does it (the runner's heartbeats and usage lines):
 * the forecast then stands for the iterations before the current one, and the gateway's
 * charges during an iteration do not tilt it. */
static void update_forecast(json_t *status, const struct meter_decision *d, int64_t max_iter)
{
    struct task_forecast f;

    task_forecast_compute(&f, d->total_cost_micros, d->iteration, max_iter, d->has_budget_usd,
                          d->budget_usd);
    task_forecast_store(status, &f);
}

/* Writes the charge (and, over a limit, the pause and the revocation) into DOC/TX. DOC is
 * the transaction's shared object of the task (see task_txn_get), so a later job of the
 * same batch sees this charge. */
static int charge(struct batch *b, struct task_txn *tx, json_t *doc, const struct meter_job *j,
                  const struct meter_decision *d, int64_t max_iter, struct err *err)
{
    json_t *status = json_object_get(doc, "status");
    json_t *md = json_object_get(doc, "metadata");
    char cost[MONEY_STR_MAX];
    int rc;

    (void)md;
    money_format(cost, d->total_cost_micros);
    json_object_set_new(status, "tokensConsumed", json_integer(d->total_tokens));
    json_object_set_new(status, "costUSD", json_string(cost));
    json_object_set_new(status, "iteration", json_integer(d->iteration));
    push_request_id(status, j->req.request_id);
    if (j->req.has_iteration) {
        update_forecast(status, d, max_iter);
    }
    /* The budgets this charge was held to (SPEC §14: spec, else the token's caveat). */
    task_set_effective_limits(
        doc, d->has_budget_usd ? d->budget_usd : 0, d->has_budget_tokens ? d->budget_tokens : 0,
        json_integer_value(json_object_get(status, "effectiveMaxIterations")));
    if (j->guidance_sent) {
        note_guidance(status, doc, clock_now_ms(task_txn_clock(tx)));
    }
    charge_quotas(b, j);
    if (d->outcome == METER_OVER_QUOTA) {
        char *msg = xasprintf("project quota exceeded: spendquota %s of namespace %s is used up "
                              "for this month; an operator raises it, then resume the task",
                              j->quota, j->ns);
        task_set_phase(doc, TASK_PAUSED, "QuotaExceeded", msg);
        free(msg);
    } else if (d->outcome == METER_OVER_BUDGET || d->outcome == METER_OVER_ITERATIONS) {
        bool budget = d->outcome == METER_OVER_BUDGET;
        task_set_phase(doc, TASK_PAUSED, budget ? "BudgetExceeded" : "MaxIterationsExceeded",
                       budget ? "budget exceeded: add budget with /diverge budget or "
                                "diverge task resume --budget"
                              : "max iterations exceeded");
    }
    if (d->outcome == METER_OVER_BUDGET || d->outcome == METER_OVER_ITERATIONS ||
        d->outcome == METER_OVER_QUOTA) {
        json_object_set_new(json_object_get(doc, "spec"), "suspended", json_true());
        rc = revoke_token(b, tx, j, err);
        if (rc != E_OK) {
            return rc;
        }
        log_kv(LOG_INFO, "task_paused", "namespace", j->ns, "name", j->name, "reason", d->reason,
               "cost", cost, NULL);
    }
    mark_dirty(b, doc);
    return E_OK;
}

static void read_state(struct meter_state *st, struct batch *b, struct task_txn *tx,
                       const json_t *doc, struct meter_job *j, struct err *err)
{
    const json_t *spec = json_object_get(doc, "spec");
    const json_t *repo = json_object_get(spec, "repository");
    struct task_view v;
    struct token_context ctx = {
        .task = j->name,
        .ns = j->ns,
        .repo = json_string_value(json_object_get(repo, "url")),
        .branch = json_string_value(json_object_get(repo, "workingBranch")),
        .model = j->body_ok ? j->req.model : NULL,
        .now_ms = clock_now_ms(task_txn_clock(tx)),
    };

    task_view_spend_of(&v, doc);
    st->task_found = true;
    st->token_current = token_is_current(b, tx, j, err);
    st->caveats_ok = token_cache_check(&st->grant, j->vt, &ctx) == E_OK;
    st->phase = v.phase;
    st->body_ok = j->body_ok;
    st->model_ok = st->grant.model_allowed &&
                   capabilities_allow(json_object_get(spec, "capabilities"), ctx.model);
    st->spec_budget_usd = v.budget_usd;
    st->spec_budget_tokens = v.budget_tokens;
    st->max_iterations = v.max_iterations;
    st->tokens_consumed = v.tokens_consumed;
    st->cost_micros = v.cost_usd;
    st->iteration = v.iteration;
}

/* The guidance for the agent: the reviewer's (annotation), after "N minutes left: commit
 * what works." once the controller set status.timeoutAt (80 % of sandbox.timeoutSeconds
 * passed, SPEC §14). New string or NULL. */
static char *guidance_of(const json_t *doc, const char *guidance, int64_t now_ms)
{
    const char *at =
        json_string_value(json_object_get(json_object_get(doc, "status"), "timeoutAt"));
    int64_t deadline = 0, mins;

    if (at == NULL || clock_parse_rfc3339(&deadline, at) != E_OK || deadline <= now_ms) {
        return guidance != NULL ? xstrdup(guidance) : NULL;
    }
    mins = (deadline - now_ms + 59999) / 60000;
    return xasprintf("%lld minute%s left: commit what works.%s%s", (long long)mins,
                     mins == 1 ? "" : "s", guidance != NULL ? "\n\n" : "",
                     guidance != NULL ? guidance : "");
}

/* Keeps what the totals body needs; the request thread builds it (off the committer). */
static void keep_totals(struct meter_job *j, const struct meter_decision *d, const json_t *doc,
                        int64_t max_iter, int64_t now_ms)
{
    const char *guidance = json_string_value(json_object_get(
        json_object_get(json_object_get(doc, "metadata"), "annotations"), TASK_ANN_GUIDANCE));
    const char *preview =
        json_string_value(json_object_get(json_object_get(doc, "status"), "previewUrl"));

    j->d = *d;
    j->totals = true;
    j->max_iterations = max_iter;
    free(j->guidance);
    free(j->preview);
    j->guidance = guidance_of(doc, guidance, now_ms);
    j->preview = preview != NULL ? xstrdup(preview) : NULL;
}

/* What the gateway's jobs change in the meter's decision D: a check only reads; an
 * exhausted budget pauses the task as a 429 would (nothing added); a settled call on a
 * task that is no longer Active (paused meanwhile) is recorded without pausing it again. */
static void gate_outcome(struct meter_decision *d, enum meter_job_kind kind, enum task_phase phase)
{
    bool refused = d->outcome == METER_UNAUTHORIZED || d->outcome == METER_BAD_REQUEST ||
                   d->outcome == METER_FORBIDDEN;

    if (kind == METER_JOB_EXHAUSTED && !refused) {
        d->outcome = METER_OVER_BUDGET;
        d->status = 429;
        d->reason = "budget exceeded";
    }
    if (kind == METER_JOB_QUOTA_OUT && !refused) {
        d->outcome = METER_OVER_QUOTA;
        d->status = 429;
        d->reason = "project quota exceeded";
    }
    if (kind == METER_JOB_SETTLE && phase != TASK_ACTIVE &&
        (d->outcome == METER_OVER_BUDGET || d->outcome == METER_OVER_ITERATIONS ||
         d->outcome == METER_OVER_QUOTA)) {
        d->outcome = METER_ALLOWED;
        d->status = 200;
        d->reason = "";
    }
}

/* Carries out decision D for J: the error body, or the charge and the totals. */
static int answer_job(struct batch *b, struct task_txn *tx, json_t *doc, struct meter_job *j,
                      const struct meter_decision *d, int64_t max_iter, struct err *err)
{
    int rc = E_OK;

    /* The gateway's jobs read the outcome and its reason from here, refusals too. */
    j->d = *d;
    switch (d->outcome) {
    case METER_UNAUTHORIZED:
        j->body = error_body(d->reason, "Unauthorized");
        break;
    case METER_BAD_REQUEST:
        j->body = error_body(j->body_err, "BadRequest");
        break;
    case METER_FORBIDDEN:
        j->body = error_body(j->req.model != NULL ? "model not allowed for this task"
                                                  : "model required: this task restricts models",
                             "Forbidden");
        break;
    case METER_ALLOWED:
    case METER_OVER_BUDGET:
    case METER_OVER_ITERATIONS:
    case METER_OVER_QUOTA:
        if (j->kind != METER_JOB_CHECK) {
            rc = charge(b, tx, doc, j, d, max_iter, err);
        }
        if (rc == E_OK) {
            keep_totals(j, d, doc, max_iter, clock_now_ms(task_txn_clock(tx)));
        }
        break;
    case METER_DUPLICATE:
        keep_totals(j, d, doc, max_iter, clock_now_ms(task_txn_clock(tx)));
        break;
    }
    if (rc == E_OK) {
        j->status = d->status;
    }
    return rc;
}

/* Reads the headroom of J's namespace quotas into ST; *room_out keeps the quotas' names. */
static int quota_state(struct quota_room *room_out, struct meter_state *st, struct batch *b,
                       struct task_txn *tx, const struct meter_job *j, struct err *err)
{
    json_t *items = batch_quotas(b, tx, j->ns, err);

    if (items == NULL) {
        return E_FAIL;
    }
    quota_room_of(room_out, items);
    st->has_quota_usd = room_out->has_usd;
    st->quota_usd_left = room_out->usd_left;
    st->has_quota_tokens = room_out->has_tokens;
    st->quota_tokens_left = room_out->tokens_left;
    return E_OK;
}

/* Names in J the quota that stopped it (the USD one when both did). */
static void name_quota(struct meter_job *j, const struct quota_room *room,
                       const struct meter_decision *d)
{
    const char *name = d->has_quota_usd && (d->quota_usd_left < 0 || !d->has_quota_tokens ||
                                            d->quota_tokens_left >= 0)
                           ? room->usd_name
                           : room->tokens_name;

    snprintf(j->quota, sizeof(j->quota), "%s", name != NULL ? name : "");
}

/* The answer of a completion: the phase it left the task in. */
static char *completion_body(const json_t *doc, bool duplicate)
{
    const json_t *status = json_object_get(doc, "status");
    json_t *o =
        json_pack("{s:O?,s:O?,s:O?}", "phase", json_object_get(status, "phase"), "reason",
                  json_object_get(status, "reason"), "message", json_object_get(status, "message"));
    char *text;

    if (duplicate) {
        json_object_set_new(o, "duplicate", json_true());
    }
    text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return text;
}

/* Whether J's token already finished its task the way J asks: a retry of a completion
 * whose answer was lost (the token is revoked by then). */
static bool completed_before(struct task_txn *tx, const json_t *doc, const struct meter_job *j)
{
    const json_t *status = json_object_get(doc, "status");
    const char *reason = json_string_value(json_object_get(status, "reason"));
    struct task_view v;
    struct token_record rec;
    bool same = false;

    task_view_of(&v, doc);
    if (v.phase != (j->fin.succeeded ? TASK_COMPLETED : TASK_FAILED) || reason == NULL ||
        strcmp(reason, "AgentReported") != 0) {
        return false;
    }
    if (task_txn_token_current(&rec, tx, j->ns, j->name, NULL) == E_OK) {
        same = !rec.active && strcmp(rec.token_id, token_identifier(j->tok)) == 0;
        free(rec.token);
    }
    return same;
}

/* METER_JOB_COMPLETE: checks the token as the meter's step 1 does, then ends the task
 * (phase, reason AgentReported, message, completionTime) and revokes its token. */
static int apply_complete(struct batch *b, struct task_txn *tx, json_t *doc, struct meter_job *j,
                          const struct meter_state *st, struct err *err)
{
    struct meter_decision d;
    char when[CLOCK_RFC3339_MAX];
    int rc;

    if (st->task_found && st->caveats_ok && !st->token_current && completed_before(tx, doc, j)) {
        j->status = 200;
        j->body = completion_body(doc, true);
        return E_OK;
    }
    meter_decide(&d, st, NULL); /* steps 1 and 2 only: refused either way */
    if (d.outcome == METER_UNAUTHORIZED) {
        j->status = 401;
        j->body = error_body(d.reason, "Unauthorized");
        return E_OK;
    }
    if (!j->body_ok) {
        j->status = 400;
        j->body = error_body(j->body_err, "BadRequest");
        return E_OK;
    }
    rc = revoke_token(b, tx, j, err);
    if (rc != E_OK) {
        return rc;
    }
    task_set_phase(doc, j->fin.succeeded ? TASK_COMPLETED : TASK_FAILED, "AgentReported",
                   j->fin.message);
    clock_rfc3339(when, clock_now_ms(task_txn_clock(tx)));
    json_object_set_new(json_object_get(doc, "status"), "completionTime", json_string(when));
    mark_dirty(b, doc);
    log_kv(LOG_INFO, "task_completed_by_agent", "namespace", j->ns, "name", j->name, "result",
           j->fin.succeeded ? "succeeded" : "failed", NULL);
    j->status = 200;
    j->body = completion_body(doc, false);
    return E_OK;
}

/* Remembers J's requestId when the call passes steps 1-3 (every later outcome charges);
 * an id already there is a retry (SPEC §7 step 4): ST->seen. */
static int claim_request(struct meter_state *st, struct task_txn *tx, const json_t *doc,
                         const struct meter_job *j, struct err *err)
{
    bool fresh = false;
    int rc;

    if (j->kind == METER_JOB_CHECK || !st->task_found || !st->token_current || !st->caveats_ok ||
        st->phase != TASK_ACTIVE || !st->body_ok || !st->model_ok) {
        return E_OK;
    }
    /* Every later outcome charges, so remember the id now; an id already there is a
     * retry (SPEC §7 step 4). */
    rc = task_txn_meter_claim(
        &fresh, tx, json_string_value(json_object_get(json_object_get(doc, "metadata"), "uid")),
        j->req.request_id, j->req.tokens_used, j->req.cost_micros, err);
    st->seen = !fresh;
    return rc;
}

/* METER_JOB_RESERVE and METER_JOB_RESV_DROP: the gateway's reservation record of a call
 * (SPEC §13), written or removed; nothing else is read or changed. */
static int apply_resv(struct task_txn *tx, struct meter_job *j, struct err *err)
{
    struct store_resv r = {
        .request_id = j->req.request_id,
        .ns = j->ns,
        .name = j->name,
        .token = j->vt->text,
        .model = j->req.model != NULL ? j->req.model : "",
        .provider = j->provider != NULL ? j->provider : "",
        .tokens = j->req.tokens_used,
        .cost_micros = j->req.cost_micros,
    };
    int rc = j->kind == METER_JOB_RESERVE ? task_txn_resv_put(tx, &r, err)
                                          : task_txn_resv_drop(tx, j->req.request_id, err);

    if (rc == E_OK) {
        j->status = 200;
    }
    return rc;
}

static int apply_job(struct batch *b, struct task_txn *tx, struct meter_job *j, struct err *err)
{
    struct quota_room room;
    struct meter_state st;
    struct meter_decision d;
    enum task_phase phase;
    json_t *doc = NULL;
    int rc;

    memset(&st, 0, sizeof(st));
    free(j->body); /* a retried batch decides again */
    j->body = NULL;
    j->totals = false;
    rc = task_txn_get(&doc, tx, j->ns, j->name, err);
    if (rc != E_OK && rc != E_NOTFOUND) {
        return rc;
    }
    memset(&room, 0, sizeof(room));
    j->quota[0] = '\0';
    if (rc == E_OK) {
        read_state(&st, b, tx, doc, j, err);
        rc = quota_state(&room, &st, b, tx, j, err);
        if (rc != E_OK) {
            goto out;
        }
    }
    if (j->kind == METER_JOB_COMPLETE) {
        rc = apply_complete(b, tx, doc, j, &st, err);
        goto out;
    }
    phase = st.phase;
    if (j->kind == METER_JOB_SETTLE && st.task_found) {
        /* The gateway let this call through while the task was Active and its token
         * valid: what it cost is charged even when the task paused meanwhile. */
        st.token_current = st.caveats_ok = st.model_ok = true;
        st.phase = TASK_ACTIVE;
    }
    rc = claim_request(&st, tx, doc, j, err);
    if (rc != E_OK) {
        goto out;
    }
    meter_decide(&d, &st, j->body_ok ? &j->req : NULL);
    gate_outcome(&d, j->kind, phase);
    if (d.outcome == METER_OVER_QUOTA) {
        name_quota(j, &room, &d);
    }
    rc = answer_job(b, tx, doc, j, &d, st.max_iterations, err);
    if (rc == E_OK && j->kind == METER_JOB_SETTLE && j->keeps_resv) {
        /* The call's record goes with its charge: never charged again at a restart. */
        rc = task_txn_resv_drop(tx, j->req.request_id, err);
    }
out:
    json_decref(doc);
    return rc;
}

/* Applies every job of the batch in one transaction. No savepoints on this hot path: when
 * one job fails, the whole transaction is rolled back and the committer runs the batch
 * again without that job (failures are rare; savepoints would cost every job). */
static int apply_jobs(struct task_txn *tx, struct batch *b)
{
    const char *ns;
    json_t *v;

    b->nseen = 0;           /* a rerun batch reads the tokens again */
    json_decref(b->quotas); /* a rerun batch reads the quotas again */
    json_decref(b->quotas_dirty);
    b->quotas = json_object();
    b->quotas_dirty = json_object();
    for (struct meter_job *j = b->jobs; j != NULL; j = queued_job(j->link.next)) {
        if (j->excluded) {
            continue;
        }
        bool resv = j->kind == METER_JOB_RESERVE || j->kind == METER_JOB_RESV_DROP;
        if ((resv ? apply_resv(tx, j, &b->err) : apply_job(b, tx, j, &b->err)) != E_OK) {
            b->failed = j;
            return E_FAIL;
        }
    }
    for (size_t i = 0; i < b->ndirty; i++) {
        if (task_txn_put(tx, b->dirty[i], &b->err) != E_OK) {
            return E_FAIL;
        }
    }
    json_object_foreach(b->quotas_dirty, ns, v)
    {
        json_t *q;
        size_t i;
        json_array_foreach(json_object_get(b->quotas, ns), i, q)
        {
            if (task_txn_quota_put(tx, q, &b->err) != E_OK) {
                return E_FAIL;
            }
        }
    }
    return E_OK;
}

static int apply_batch(struct task_txn *tx, void *userdata)
{
    struct batch *b = userdata;
    int rc = apply_jobs(tx, b);

    /* The dirty documents are the store's cached objects, which other writers use once
     * this transaction ends: drop our references while we still hold the writer lock. */
    clear_dirty(b);
    return rc;
}

static void fail_job(struct meter_job *j)
{
    j->totals = false;
    memset(&j->d, 0, sizeof(j->d)); /* no decision holds: the gateway says "retry" */
    free(j->body);
    j->body = error_body("could not record the charge; retry", "ServiceUnavailable");
    j->status = 503;
}

/* Commits BATCH durably, retrying without any job that fails on its own. */
static void commit_batch(struct meter_service *m, struct meter_job *jobs)
{
    struct batch b = {.jobs = jobs};

    for (;;) {
        int rc;
        b.failed = NULL;
        rc = task_store_txn(m->store, apply_batch, &b, &b.err);
        if (rc == E_OK) {
            free(b.dirty);
            free(b.seen);
            json_decref(b.quotas);
            json_decref(b.quotas_dirty);
            return;
        }
        if (b.failed == NULL) {
            break; /* BEGIN or COMMIT failed: nothing of this batch is durable */
        }
        log_kv(LOG_ERROR, "meter_job_failed", "name", b.failed->name, "error", b.err.msg, NULL);
        b.failed->excluded = true;
        fail_job(b.failed);
    }
    free(b.dirty);
    free(b.seen);
    json_decref(b.quotas);
    json_decref(b.quotas_dirty);
    log_kv(LOG_ERROR, "meter_batch_failed", "error", b.err.msg, NULL);
    for (struct meter_job *j = jobs; j != NULL; j = queued_job(j->link.next)) {
        fail_job(j);
    }
}

/* --- the committer ----------------------------------------------------------------- */

static void commit_jobs(struct gcommit_item *batch, void *userdata)
{
    commit_batch(userdata, queued_job(batch));
}

int meter_service_new(struct meter_service **out, struct task_store *store,
                      const unsigned char root_key[TOKEN_ROOT_KEY_LEN], struct err *err)
{
    struct meter_service *m = xcalloc(1, sizeof(*m));
    int rc;

    *out = NULL;
    m->store = store;
    m->keeps_resv = task_store_keeps_resv(store);
    memcpy(m->root_key, root_key, TOKEN_ROOT_KEY_LEN);
    token_cache_init(&m->tokens);
    rc = gcommit_new(&m->committer, "meter-commit", GCOMMIT_WAKE_TREE, commit_jobs, m, err);
    if (rc != E_OK) {
        token_cache_cleanup(&m->tokens);
        secret_wipe(m->root_key, sizeof(m->root_key));
        free(m);
        return rc;
    }
    *out = m;
    return E_OK;
}

void meter_service_free(struct meter_service *m)
{
    if (m == NULL) {
        return;
    }
    gcommit_free(m->committer);
    token_cache_cleanup(&m->tokens);
    secret_wipe(m->root_key, sizeof(m->root_key));
    free(m);
}

void meter_service_stats(struct meter_stats *out, struct meter_service *m)
{
    gcommit_stats(&out->batches, &out->requests, m->committer);
}

static void respond(int *status_out, char **body_out, int status, const char *msg,
                    const char *reason)
{
    *status_out = status;
    *body_out = error_body(msg, reason);
}

/* Queues J (its token set) and waits until the committer answered it. */
static void run_job(struct meter_service *m, struct meter_job *j)
{
    gcommit_run(m->committer, &j->link);
}

/* Checks the Authorization header as the meter does: the verified token into *vt_out, or
 * the 401 answer. */
static bool bearer_token(struct verified_token **vt_out, int *status_out, char **body_out,
                         struct meter_service *m, const char *auth, int auth_count)
{
    struct err err = {0};

    *vt_out = NULL;
    if (auth == NULL || auth_count == 0) {
        respond(status_out, body_out, 401, "missing Authorization: Bearer <token>", "Unauthorized");
        return false;
    }
    if (auth_count > 1) {
        respond(status_out, body_out, 401, "more than one Authorization header", "Unauthorized");
        return false;
    }
    if (strncmp(auth, "Bearer ", 7) != 0) {
        respond(status_out, body_out, 401, "malformed token", "Unauthorized");
        return false;
    }
    if (token_cache_get(vt_out, &m->tokens, auth + 7, m->root_key, &err) != E_OK) {
        respond(status_out, body_out, 401, err.msg, "Unauthorized");
        return false;
    }
    return true;
}

/* J for the verified token VT (borrowed until J is answered): its task. */
static void job_of(struct meter_job *j, struct verified_token *vt)
{
    j->tok = vt->tok;
    j->vt = vt;
    j->name = vt->name;
    j->ns = vt->ns;
}

void meter_service_handle(int *status_out, char **body_out, struct meter_service *m,
                          const char *auth, int auth_count, const char *body, size_t len)
{
    struct meter_job j;
    struct verified_token *vt = NULL;
    struct err err = {0};

    memset(&j, 0, sizeof(j));
    if (!bearer_token(&vt, status_out, body_out, m, auth, auth_count)) {
        return;
    }
    job_of(&j, vt);
    j.guidance_sent = true; /* the answer carries the guidance to the runner */
    j.body_ok = meter_request_parse(&j.req, body, len, &err) == E_OK;
    if (!j.body_ok) {
        snprintf(j.body_err, sizeof(j.body_err), "%s", err.msg);
    }
    run_job(m, &j);
    *status_out = j.status;
    if (j.totals) {
        *body_out = totals_body(&j.d, j.guidance, j.preview, j.max_iterations, j.quota);
        free(j.body);
    } else {
        *body_out = j.body;
    }
    free(j.guidance);
    free(j.preview);
    meter_request_cleanup(&j.req);
    token_cache_release(&m->tokens, vt);
}

void meter_service_complete(int *status_out, char **body_out, struct meter_service *m,
                            const char *auth, int auth_count, const char *body, size_t len)
{
    struct meter_job j;
    struct verified_token *vt = NULL;
    struct err err = {0};

    memset(&j, 0, sizeof(j));
    if (!bearer_token(&vt, status_out, body_out, m, auth, auth_count)) {
        return;
    }
    job_of(&j, vt);
    j.kind = METER_JOB_COMPLETE;
    j.body_ok = meter_completion_parse(&j.fin, body, len, &err) == E_OK;
    if (!j.body_ok) {
        snprintf(j.body_err, sizeof(j.body_err), "%s", err.msg);
    }
    run_job(m, &j);
    *status_out = j.status;
    *body_out = j.body;
    free(j.guidance);
    free(j.preview);
    meter_completion_cleanup(&j.fin);
    token_cache_release(&m->tokens, vt);
}

/* --- the LLM gateway's jobs (SPEC §13) ----------------------------------------------- */

/* Sets up J as a gateway job of KIND for TOKEN with a request built from the arguments,
 * *vt_out its verified token; false when TOKEN does not verify (401). */
static bool gate_job_init(struct meter_job *j, struct verified_token **vt_out,
                          struct meter_service *m, enum meter_job_kind kind, const char *token,
                          const char *request_id, const char *model, int64_t tokens,
                          int64_t cost_micros)
{
    struct err err = {0};

    memset(j, 0, sizeof(*j));
    *vt_out = NULL;
    if (token == NULL || token_cache_get(vt_out, &m->tokens, token, m->root_key, &err) != E_OK) {
        return false;
    }
    job_of(j, *vt_out);
    j->kind = kind;
    j->keeps_resv = m->keeps_resv;
    j->body_ok = true;
    j->req.request_id = xstrdup(request_id != NULL ? request_id : "gateway-check");
    j->req.model = model != NULL ? xstrdup(model) : NULL;
    j->req.tokens_used = tokens;
    j->req.cost_micros = cost_micros;
    return true;
}

static void gate_job_cleanup(struct meter_service *m, struct meter_job *j,
                             struct verified_token *vt)
{
    free(j->body);
    free(j->guidance);
    free(j->preview);
    meter_request_cleanup(&j->req);
    token_cache_release(&m->tokens, vt);
}

/* Runs a gateway job of KIND for TOKEN with a request built from the arguments; fills
 * OUT when it is not NULL. Returns the job's HTTP status. */
static int run_gate_job(struct meter_gate *out, struct meter_service *m, enum meter_job_kind kind,
                        const char *token, const char *request_id, const char *model,
                        int64_t tokens, int64_t cost_micros, bool guidance_sent)
{
    struct meter_job j;
    struct verified_token *vt = NULL;
    int status;

    if (!gate_job_init(&j, &vt, m, kind, token, request_id, model, tokens, cost_micros)) {
        if (out != NULL) {
            out->status = 401;
            out->reason = token == NULL ? "missing token" : "malformed token or bad signature";
        }
        return 401;
    }
    j.guidance_sent = guidance_sent;
    run_job(m, &j);
    status = j.status;
    if (out != NULL) {
        out->status = status;
        out->reason = j.d.reason != NULL ? j.d.reason : "could not read the task; retry";
        out->d = j.d;
        out->ns = xstrdup(vt->ns);
        out->name = xstrdup(vt->name);
        out->guidance = j.guidance;
        j.guidance = NULL;
    }
    gate_job_cleanup(m, &j, vt);
    return status;
}

void meter_gate_check(struct meter_gate *out, struct meter_service *m, const char *token,
                      const char *model)
{
    memset(out, 0, sizeof(*out));
    run_gate_job(out, m, METER_JOB_CHECK, token, NULL, model, 0, 0, false);
    if (out->status == 429) {
        out->status = 200; /* already over: the gateway finds nothing left and refuses */
    }
}

void meter_gate_cleanup(struct meter_gate *g)
{
    free(g->ns);
    free(g->name);
    free(g->guidance);
    memset(g, 0, sizeof(*g));
}

int meter_gate_settle(struct meter_decision *out, struct meter_service *m, const char *token,
                      const char *request_id, const char *model, int64_t tokens,
                      int64_t cost_micros, bool guidance_sent)
{
    struct meter_gate g;
    int status;

    memset(&g, 0, sizeof(g));
    status = run_gate_job(&g, m, METER_JOB_SETTLE, token, request_id, model, tokens, cost_micros,
                          guidance_sent);
    if (out != NULL) {
        *out = g.d;
    }
    meter_gate_cleanup(&g);
    return status;
}

int meter_gate_exhausted(struct meter_service *m, const char *token, const char *request_id,
                         const char *model)
{
    return run_gate_job(NULL, m, METER_JOB_EXHAUSTED, token, request_id, model, 0, 0, false);
}

int meter_gate_quota_exhausted(struct meter_service *m, const char *token, const char *request_id,
                               const char *model)
{
    return run_gate_job(NULL, m, METER_JOB_QUOTA_OUT, token, request_id, model, 0, 0, false);
}

/* --- reservation records (SPEC §13) ----------------------------------------------- */

struct meter_pending {
    struct meter_service *m;
    struct verified_token *vt;
    struct meter_job j;
};

bool meter_keeps_resv(const struct meter_service *m)
{
    return m->keeps_resv;
}

struct meter_pending *meter_gate_reserve_post(struct meter_service *m, const char *token,
                                              const char *request_id, const char *model,
                                              const char *provider, int64_t tokens,
                                              int64_t cost_micros)
{
    struct meter_pending *p;

    if (!m->keeps_resv) {
        return NULL;
    }
    p = xcalloc(1, sizeof(*p));
    p->m = m;
    if (!gate_job_init(&p->j, &p->vt, m, METER_JOB_RESERVE, token, request_id, model, tokens,
                       cost_micros)) {
        free(p);
        return NULL;
    }
    p->j.provider = provider;
    gcommit_post(m->committer, &p->j.link);
    return p;
}

int meter_gate_reserve_wait(struct meter_pending *p)
{
    int status;

    if (p == NULL) {
        return 503;
    }
    gcommit_wait(&p->j.link);
    status = p->j.status;
    gate_job_cleanup(p->m, &p->j, p->vt);
    free(p);
    return status;
}

int meter_gate_resv_drop(struct meter_service *m, const char *token, const char *request_id)
{
    if (!m->keeps_resv) {
        return 200;
    }
    return run_gate_job(NULL, m, METER_JOB_RESV_DROP, token, request_id, NULL, 0, 0, false);
}
