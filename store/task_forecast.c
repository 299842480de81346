/* SPDX-License-Identifier: Apache-2.0 */
/* The spend forecast of a task (SPEC §15): a pure function of its recorded spend and
 * iterations, and its status fields. Integer micro-dollars only, never a double. */
#include <string.h>

#include "common/money.h"
#include "store/store.h"

#define F_USD "forecastUSD"
#define F_PER "forecastPerIterationUSD"
#define F_LEFT "forecastIterationsLeft"
#define F_HOLDS "forecastBudgetHolds"
#define F_RUNS_OUT "forecastRunsOutIteration"

static int64_t mul_saturating(int64_t a, int64_t b)
{
    int64_t r;

    return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

static int64_t add_saturating(int64_t a, int64_t b)
{
    return a > INT64_MAX - b ? INT64_MAX : a + b;
}

/* Whether the budget holds, and when not, the iteration it runs out in. */
static void budget_check(struct task_forecast *f, int64_t cost, int64_t budget)
{
    int64_t m;

    f->has_budget = true;
    f->budget_holds = add_saturating(cost, f->forecast_micros) <= budget;
    if (f->budget_holds) {
        return;
    }
    /* cost + forecast > budget, so per_iteration > 0 unless cost alone is over it. The
     * first m >= 1 with cost + per * m > budget; m <= iterations_left. */
    m = cost > budget || f->per_iteration == 0 ? 1 : (budget - cost) / f->per_iteration + 1;
    f->runs_out = f->iterations_done + m;
}

void task_forecast_compute(struct task_forecast *out, int64_t cost_micros, int64_t iteration,
                           int64_t max_iterations, bool has_budget, int64_t budget_micros)
{
    int64_t done;

    memset(out, 0, sizeof(*out));
    if (cost_micros < 0 || max_iterations <= 0 || iteration < 3 || iteration > max_iterations) {
        return;
    }
    done = iteration - 1;
    out->present = true;
    out->iterations_done = done;
    out->iterations_left = max_iterations - iteration + 1;
    out->max_iterations = max_iterations;
    /* Rounded up to the micro-dollar, so per iteration * left is the forecast shown. */
    out->per_iteration = cost_micros / done + (cost_micros % done != 0 ? 1 : 0);
    out->forecast_micros = mul_saturating(out->per_iteration, out->iterations_left);
    if (has_budget && budget_micros >= 0) {
        budget_check(out, cost_micros, budget_micros);
    }
}

static void clear_fields(json_t *status)
{
    static const char *const keys[] = {F_USD, F_PER, F_LEFT, F_HOLDS, F_RUNS_OUT};

    for (size_t i = 0; i < ARRAY_LEN(keys); i++) {
        json_object_del(status, keys[i]);
    }
}

void task_forecast_store(json_t *status, const struct task_forecast *f)
{
    char money[MONEY_STR_MAX];

    clear_fields(status);
    if (!f->present) {
        return;
    }
    money_format(money, f->forecast_micros);
    json_object_set_new(status, F_USD, json_string(money));
    money_format(money, f->per_iteration);
    json_object_set_new(status, F_PER, json_string(money));
    json_object_set_new(status, F_LEFT, json_integer(f->iterations_left));
    if (f->has_budget) {
        json_object_set_new(status, F_HOLDS, json_boolean(f->budget_holds));
        if (!f->budget_holds) {
            json_object_set_new(status, F_RUNS_OUT, json_integer(f->runs_out));
        }
    }
}

static bool money_of(int64_t *out, const json_t *status, const char *key)
{
    const char *s = json_string_value(json_object_get(status, key));

    return s != NULL && money_parse(out, NULL, s, NULL) == E_OK;
}

static bool count_of(int64_t *out, const json_t *status, const char *key)
{
    const json_t *v = json_object_get(status, key);

    *out = json_is_integer(v) ? (int64_t)json_integer_value(v) : 0;
    return json_is_integer(v);
}

bool task_forecast_read(struct task_forecast *out, const json_t *status)
{
    const json_t *holds = json_object_get(status, F_HOLDS);
    struct task_forecast f = {.present = true};
    int64_t iteration = 0;

    memset(out, 0, sizeof(*out));
    if (!money_of(&f.forecast_micros, status, F_USD) ||
        !money_of(&f.per_iteration, status, F_PER) ||
        !count_of(&f.iterations_left, status, F_LEFT) || f.iterations_left < 1 ||
        !count_of(&iteration, status, "iteration") || iteration < 3 ||
        (holds != NULL && !json_is_boolean(holds))) {
        return false;
    }
    f.iterations_done = iteration - 1;
    f.max_iterations = add_saturating(f.iterations_done, f.iterations_left);
    f.has_budget = holds != NULL;
    f.budget_holds = json_is_true(holds);
    if (f.has_budget && !f.budget_holds &&
        (!count_of(&f.runs_out, status, F_RUNS_OUT) || f.runs_out <= f.iterations_done ||
         f.runs_out > f.max_iterations)) {
        return false;
    }
    *out = f;
    return true;
}
