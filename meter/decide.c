/* SPDX-License-Identifier: Apache-2.0 */
/* The metering decision (SPEC §7, checks in order), a pure function over plain structs. */
#include <stdbool.h>
#include <string.h>

#include "meter/meter.h"

void meter_effective_budgets(struct meter_decision *out, const struct meter_state *st)
{
    out->has_budget_usd = st->spec_budget_usd > 0 || st->grant.has_max_cost;
    out->budget_usd = st->spec_budget_usd > 0 ? st->spec_budget_usd : st->grant.max_cost_micros;
    out->has_budget_tokens = st->spec_budget_tokens > 0 || st->grant.has_max_tokens;
    out->budget_tokens = st->spec_budget_tokens > 0 ? st->spec_budget_tokens : st->grant.max_tokens;
}

static void refuse(struct meter_decision *out, enum meter_outcome o, int status, const char *reason)
{
    out->outcome = o;
    out->status = status;
    out->reason = reason;
}

/* Checks 1-3 of SPEC §7: who is asking, for what task in what state, with what body and
 * model. Returns whether it refused (OUT then says why). */
static bool refused_request(struct meter_decision *out, const struct meter_state *st,
                            const struct meter_request *req)
{
    if (!st->task_found) {
        refuse(out, METER_UNAUTHORIZED, 401, "token's task does not exist");
        return true;
    }
    if (!st->token_current) {
        refuse(out, METER_UNAUTHORIZED, 401, "token revoked");
        return true;
    }
    if (!st->caveats_ok) {
        refuse(out, METER_UNAUTHORIZED, 401, "token caveat not satisfied");
        return true;
    }
    if (st->phase != TASK_ACTIVE) {
        refuse(out, METER_UNAUTHORIZED, 401, "task is not Active");
        return true;
    }
    if (!st->body_ok || req == NULL) {
        refuse(out, METER_BAD_REQUEST, 400, "bad request");
        return true;
    }
    if (!st->model_ok) {
        refuse(out, METER_FORBIDDEN, 403, "model not allowed");
        return true;
    }
    return false;
}

static int64_t add_saturating(int64_t a, int64_t b)
{
    return a > INT64_MAX - b ? INT64_MAX : a + b;
}

/* Charges REQ to the namespace's headroom in OUT; whether that takes it past a quota. */
static bool over_quota(struct meter_decision *out, const struct meter_state *st,
                       const struct meter_request *req)
{
    if (st->has_quota_usd) {
        out->quota_usd_left = st->quota_usd_left - req->cost_micros;
    }
    if (st->has_quota_tokens) {
        out->quota_tokens_left = st->quota_tokens_left - req->tokens_used;
    }
    return (st->has_quota_usd && out->quota_usd_left < 0) ||
           (st->has_quota_tokens && out->quota_tokens_left < 0);
}

void meter_decide(struct meter_decision *out, const struct meter_state *st,
                  const struct meter_request *req)
{
    memset(out, 0, sizeof(*out));
    meter_effective_budgets(out, st);
    out->total_tokens = st->tokens_consumed;
    out->total_cost_micros = st->cost_micros;
    out->iteration = st->iteration;
    out->reason = "";
    out->has_quota_usd = st->has_quota_usd;
    out->quota_usd_left = st->quota_usd_left;
    out->has_quota_tokens = st->has_quota_tokens;
    out->quota_tokens_left = st->quota_tokens_left;
    /* 1-3. Who is asking, for what task, in what state; the body; models. */
    if (refused_request(out, st, req)) {
        return;
    }
    /* 4. Retries are free. */
    if (st->seen) {
        out->outcome = METER_DUPLICATE;
        out->status = 200;
        return;
    }
    /* 5. Charge (overflow is impossible: both deltas are capped far below INT64_MAX and a
     * task stops at its budget; saturate anyway rather than wrap). */
    out->total_tokens = add_saturating(st->tokens_consumed, req->tokens_used);
    out->total_cost_micros = add_saturating(st->cost_micros, req->cost_micros);
    /* status.iteration never goes back: a lower iteration is charged but leaves it where
     * it is, so an agent cannot reset the counter and run past maxIterations. */
    if (req->has_iteration && req->iteration > st->iteration) {
        out->iteration = req->iteration;
    }
    /* 6. Limits. The project's quota first (SPEC §15): a bigger task budget cannot help
     * there, so the answer names what has to change. Then the budget, so both at once
     * reads "budget exceeded". */
    if (over_quota(out, st, req)) {
        refuse(out, METER_OVER_QUOTA, 429, "project quota exceeded");
        return;
    }
    if ((out->has_budget_usd && out->total_cost_micros > out->budget_usd) ||
        (out->has_budget_tokens && out->total_tokens > out->budget_tokens)) {
        refuse(out, METER_OVER_BUDGET, 429, "budget exceeded");
        return;
    }
    if (st->max_iterations > 0 && out->iteration > st->max_iterations) {
        refuse(out, METER_OVER_ITERATIONS, 429, "max iterations exceeded");
        return;
    }
    out->outcome = METER_ALLOWED;
    out->status = 200;
}
