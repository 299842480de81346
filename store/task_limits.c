/* SPDX-License-Identifier: Apache-2.0 */
/* The limits that apply to a task (SPEC §14 status.effectiveBudgetUSD,
 * effectiveBudgetTokens, effectiveMaxIterations), and the two readers of the task's JSON
 * that they and the task view share. Depends on nothing else of the task model. */
#include "common/money.h"
#include "store/store.h"

int64_t task_json_int(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);

    return json_is_integer(v) ? (int64_t)json_integer_value(v) : 0;
}

int64_t task_json_money(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    int64_t m = 0;

    if (json_is_string(v) && money_parse(&m, NULL, json_string_value(v), NULL) != E_OK) {
        m = 0;
    }
    return m;
}

/* Sets (VALUE > 0) or removes status.KEY; money as an exact decimal string. */
static void set_limit(json_t *status, const char *key, int64_t value, bool money)
{
    char text[MONEY_STR_MAX];

    if (value <= 0) {
        json_object_del(status, key);
    } else if (money) {
        money_format(text, value);
        json_object_set_new(status, key, json_string(text));
    } else {
        json_object_set_new(status, key, json_integer(value));
    }
}

void task_set_effective_limits(json_t *obj, int64_t usd, int64_t tokens, int64_t iterations)
{
    json_t *status = json_object_get(obj, "status");
    const json_t *spec = json_object_get(obj, "spec");
    int64_t spec_usd = task_json_money(spec, "budgetUSD");
    int64_t spec_tokens = task_json_int(spec, "budgetTokens");
    int64_t spec_iterations = task_json_int(spec, "maxIterations");

    if (!json_is_object(status)) {
        return;
    }
    set_limit(status, "effectiveBudgetUSD", spec_usd > 0 ? spec_usd : usd, true);
    set_limit(status, "effectiveBudgetTokens", spec_tokens > 0 ? spec_tokens : tokens, false);
    set_limit(status, "effectiveMaxIterations", spec_iterations > 0 ? spec_iterations : iterations,
              false);
}

void task_sync_effective_limits(json_t *obj)
{
    json_t *status = json_object_get(obj, "status");

    task_set_effective_limits(obj, task_json_money(status, "effectiveBudgetUSD"),
                              task_json_int(status, "effectiveBudgetTokens"),
                              task_json_int(status, "effectiveMaxIterations"));
}
