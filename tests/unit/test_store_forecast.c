/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of the spend forecast (store/task_forecast.c, SPEC §15): the pure rule on
 * recorded spend and iterations, its status fields, and reading them back. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/money.h"
#include "store/store.h"
#include "tests/t_check.h"

#define USD(d_) ((int64_t)(d_)*MONEY_MICROS_PER_USD)

TEST(absent_before_two_iterations_are_done)
{
    struct task_forecast f;

    /* status.iteration 2: the runner is on iteration 2, only iteration 1 is done. */
    task_forecast_compute(&f, 450000, 2, 8, true, USD(5));
    CHECK(!f.present);
    CHECK_EQ_INT(f.forecast_micros, 0);
    task_forecast_compute(&f, 0, 0, 8, true, USD(5));
    CHECK(!f.present);
    task_forecast_compute(&f, 900000, 3, 8, true, USD(5));
    CHECK(f.present);
    CHECK_EQ_INT(f.iterations_done, 2);
}

TEST(absent_without_iterations_left_to_count)
{
    struct task_forecast f;

    task_forecast_compute(&f, 900000, 3, 0, true, USD(5)); /* no maxIterations */
    CHECK(!f.present);
    task_forecast_compute(&f, 900000, 9, 8, true, USD(5)); /* past maxIterations */
    CHECK(!f.present);
    task_forecast_compute(&f, -1, 3, 8, true, USD(5));
    CHECK(!f.present);
}

/* The example: $0.45 an iteration, 4 left of 8, a $5.00 budget. */
TEST(flat_spend_budget_holds)
{
    struct task_forecast f;

    /* Iteration 5 running: 4 done at $0.45 = $1.80. */
    task_forecast_compute(&f, 1800000, 5, 8, true, USD(5));
    CHECK(f.present);
    CHECK_EQ_INT(f.per_iteration, 450000);
    CHECK_EQ_INT(f.iterations_done, 4);
    CHECK_EQ_INT(f.iterations_left, 4);
    CHECK_EQ_INT(f.max_iterations, 8);
    CHECK_EQ_INT(f.forecast_micros, 1800000);
    CHECK(f.has_budget && f.budget_holds);
    CHECK_EQ_INT(f.runs_out, 0);
}

TEST(budget_runs_out_in_a_later_iteration)
{
    struct task_forecast f;

    /* 4 done at $0.60 = $2.40; $3.50 budget: 2.40 + 0.60 = 3.00 holds iteration 5,
     * 3.60 > 3.50 in iteration 6. */
    task_forecast_compute(&f, 2400000, 5, 8, true, 3500000);
    CHECK(f.present && f.has_budget && !f.budget_holds);
    CHECK_EQ_INT(f.forecast_micros, 2400000);
    CHECK_EQ_INT(f.runs_out, 6);
    /* Exactly at the budget holds (over means more than the budget, as the meter says). */
    task_forecast_compute(&f, 2400000, 5, 8, true, 4800000);
    CHECK(f.budget_holds);
    task_forecast_compute(&f, 2400000, 5, 8, true, 4799999);
    CHECK(!f.budget_holds);
    CHECK_EQ_INT(f.runs_out, 8);
    /* The budget allows not even the current iteration. */
    task_forecast_compute(&f, 2400000, 5, 8, true, 2500000);
    CHECK_EQ_INT(f.runs_out, 5);
    /* Already over it (a paused task): it ran out in the current one. */
    task_forecast_compute(&f, 2400000, 5, 8, true, 2000000);
    CHECK(!f.budget_holds);
    CHECK_EQ_INT(f.runs_out, 5);
}

TEST(rising_spend_is_averaged_exactly)
{
    struct task_forecast f;

    /* $0.10, $0.20, $0.30 in iterations 1-3: $0.60 over 3 = $0.20; 5 left of 8. */
    task_forecast_compute(&f, 600000, 4, 8, true, USD(2));
    CHECK_EQ_INT(f.per_iteration, 200000);
    CHECK_EQ_INT(f.iterations_left, 5);
    CHECK_EQ_INT(f.forecast_micros, 1000000);
    CHECK(f.budget_holds); /* 0.60 + 1.00 <= 2.00 */
    /* $1.00: 0.60 + 0.20 * 2 = 1.00 holds through iteration 5, 1.20 in iteration 6 not. */
    task_forecast_compute(&f, 600000, 4, 8, true, USD(1));
    CHECK(!f.budget_holds);
    CHECK_EQ_INT(f.runs_out, 6);
}

TEST(uneven_division_rounds_up_to_the_micro_dollar)
{
    struct task_forecast f;

    /* $1.000001 over 3 iterations: 333333.67 micro-dollars, shown as 333334. */
    task_forecast_compute(&f, 1000001, 4, 6, false, 0);
    CHECK_EQ_INT(f.per_iteration, 333334);
    CHECK_EQ_INT(f.iterations_left, 3);
    CHECK_EQ_INT(f.forecast_micros, 1000002);
    CHECK(!f.has_budget && !f.budget_holds);
    CHECK_EQ_INT(f.runs_out, 0);
}

TEST(free_iterations_and_the_last_one)
{
    struct task_forecast f;

    task_forecast_compute(&f, 0, 3, 8, true, 0);
    CHECK(f.present && f.budget_holds);
    CHECK_EQ_INT(f.forecast_micros, 0);
    /* On the last iteration: one left. */
    task_forecast_compute(&f, 700000, 8, 8, true, USD(1));
    CHECK_EQ_INT(f.iterations_left, 1);
    CHECK_EQ_INT(f.per_iteration, 100000);
    CHECK(f.budget_holds);
}

TEST(huge_values_saturate)
{
    struct task_forecast f;

    task_forecast_compute(&f, INT64_MAX - 1, 3, INT64_MAX, true, USD(1));
    CHECK(f.present);
    CHECK_EQ_INT(f.forecast_micros, INT64_MAX);
    CHECK(!f.budget_holds);
    CHECK_EQ_INT(f.runs_out, 3);
}

TEST(status_fields_round_trip)
{
    json_t *status = json_pack("{s:i}", "iteration", 5);
    struct task_forecast f, back;

    task_forecast_compute(&f, 2400000, 5, 8, true, 3500000);
    task_forecast_store(status, &f);
    CHECK_EQ_STR(json_string_value(json_object_get(status, "forecastUSD")), "2.40");
    CHECK_EQ_STR(json_string_value(json_object_get(status, "forecastPerIterationUSD")), "0.60");
    CHECK_EQ_INT(json_integer_value(json_object_get(status, "forecastIterationsLeft")), 4);
    CHECK(json_is_false(json_object_get(status, "forecastBudgetHolds")));
    CHECK_EQ_INT(json_integer_value(json_object_get(status, "forecastRunsOutIteration")), 6);
    CHECK(task_forecast_read(&back, status));
    CHECK_EQ_INT(back.forecast_micros, 2400000);
    CHECK_EQ_INT(back.per_iteration, 600000);
    CHECK_EQ_INT(back.iterations_left, 4);
    CHECK_EQ_INT(back.max_iterations, 8);
    CHECK(back.has_budget && !back.budget_holds);
    CHECK_EQ_INT(back.runs_out, 6);
    /* The budget holds now: the run-out field goes. */
    task_forecast_compute(&f, 2400000, 5, 8, true, USD(5));
    task_forecast_store(status, &f);
    CHECK(json_is_true(json_object_get(status, "forecastBudgetHolds")));
    CHECK(json_object_get(status, "forecastRunsOutIteration") == NULL);
    /* No budget: neither budget field. */
    task_forecast_compute(&f, 2400000, 5, 8, false, 0);
    task_forecast_store(status, &f);
    CHECK(json_object_get(status, "forecastBudgetHolds") == NULL);
    CHECK(task_forecast_read(&back, status) && !back.has_budget);
    /* Not applicable: every field goes, the rest of the status stays. */
    task_forecast_compute(&f, 2400000, 2, 8, true, USD(5));
    task_forecast_store(status, &f);
    CHECK_EQ_INT(json_object_size(status), 1);
    CHECK(!task_forecast_read(&back, status));
    json_decref(status);
}

TEST(read_refuses_a_status_that_does_not_add_up)
{
    json_t *status = json_pack("{s:i, s:s, s:s, s:i, s:b, s:i}", "iteration", 5, "forecastUSD",
                               "2.40", "forecastPerIterationUSD", "0.60", "forecastIterationsLeft",
                               4, "forecastBudgetHolds", 0, "forecastRunsOutIteration", 6);
    struct task_forecast f;

    CHECK(task_forecast_read(&f, status));
    json_object_set_new(status, "forecastRunsOutIteration", json_integer(9)); /* past 8 */
    CHECK(!task_forecast_read(&f, status));
    json_object_del(status, "forecastRunsOutIteration");
    CHECK(!task_forecast_read(&f, status));
    json_object_set_new(status, "forecastBudgetHolds", json_true());
    CHECK(task_forecast_read(&f, status));
    json_object_set_new(status, "forecastIterationsLeft", json_integer(0));
    CHECK(!task_forecast_read(&f, status));
    json_object_set_new(status, "forecastIterationsLeft", json_integer(4));
    json_object_set_new(status, "forecastUSD", json_string("lots"));
    CHECK(!task_forecast_read(&f, status));
    json_decref(status);
}

TEST(finishing_clears_the_forecast)
{
    json_t *task = json_pack("{s:{s:s, s:i}}", "status", "phase", "Active", "iteration", 5);
    json_t *status = json_object_get(task, "status");
    struct task_forecast f;

    task_forecast_compute(&f, 2400000, 5, 8, true, USD(5));
    task_forecast_store(status, &f);
    task_set_phase(task, TASK_PAUSED, "BudgetExceeded", "");
    CHECK(json_object_get(status, "forecastUSD") != NULL); /* still useful when paused */
    task_set_phase(task, TASK_COMPLETED, "", "");
    CHECK(json_object_get(status, "forecastUSD") == NULL);
    CHECK(json_object_get(status, "forecastPerIterationUSD") == NULL);
    CHECK(json_object_get(status, "forecastIterationsLeft") == NULL);
    CHECK(json_object_get(status, "forecastBudgetHolds") == NULL);
    json_decref(task);
}

T_MAIN
