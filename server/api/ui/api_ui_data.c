/* SPDX-License-Identifier: Apache-2.0 */
/* The dashboard's own JSON routes (SPEC §12 "/ui/…"), authenticated as the page is (the
 * admin bearer header or a live session cookie) and read-only:
 *
 *   GET /ui/api/history/{ns}/{name}  the task's spend over time, from the charges the
 *                                    store recorded (meter and LLM gateway): at most
 *                                    UI_HISTORY_POINTS cumulative points (the charges'
 *                                    time span cut into that many equal slices, one point
 *                                    per slice with a charge, at its last charge), so the
 *                                    answer stays small whatever a task was charged.
 *                                    404 for an unknown task.
 *   GET /ui/api/spendquotas          every SpendQuota, rolled to this month (the
 *                                    projects view).
 *
 * The page reads the rest (phases, iterations, egress) from the task log it already
 * streams, and the tasks from /api/v1/events. */
#include <stdio.h>
#include <stdlib.h>

#include "common/money.h"
#include "server/api/api_int.h"
#include "store/quota.h"

#define UI_HISTORY_POINTS 400 /* <= TASK_CHARGE_POINTS_MAX */

static int send_unauthorized(struct request *r)
{
    return http_send_error(r, 401, "Unauthorized", NULL,
                           "log in at /ui/login?token=… or send the admin bearer token");
}

static json_t *charges_json(const struct task_charge_point *p, size_t n)
{
    json_t *a = json_array();
    char usd[MONEY_STR_MAX];

    for (size_t i = 0; i < n; i++) {
        money_format(usd, p[i].cost_micros);
        json_array_append_new(a, json_pack("{s:I, s:I, s:s}", "timeMs", (json_int_t)p[i].t_ms,
                                           "tokens", (json_int_t)p[i].tokens, "costUSD", usd));
    }
    return a;
}

int api_ui_history(struct request *r)
{
    const char *ns = r->params[0], *name = r->params[1];
    struct task_charge_point *points;
    struct err err = {0};
    json_t *obj = NULL, *body;
    int64_t count = 0;
    size_t n = 0;
    int rc;

    if (!ui_auth_ok(r)) {
        return send_unauthorized(r);
    }
    if (task_store_get(&obj, r->srv->store, ns, name, &err) != E_OK) {
        return http_send_err(r, &err);
    }
    points = xcalloc(UI_HISTORY_POINTS, sizeof(*points));
    rc = task_store_charges(
        points, UI_HISTORY_POINTS, &n, &count, r->srv->store,
        json_string_value(json_object_get(json_object_get(obj, "metadata"), "uid")), &err);
    json_decref(obj);
    if (rc != E_OK && rc != E_INVALID) {
        free(points);
        return http_send_err(r, &err);
    }
    body = json_pack("{s:s, s:s, s:b, s:o, s:I, s:i}", "namespace", ns, "name", name, "chargesKept",
                     rc == E_OK, "charges", charges_json(points, n), "chargeCount",
                     (json_int_t)count, "pointsMax", UI_HISTORY_POINTS);
    free(points);
    return http_send_json(r, 200, body);
}

int api_ui_quotas(struct request *r)
{
    struct err err = {0};
    json_t *items = NULL;

    if (!ui_auth_ok(r)) {
        return send_unauthorized(r);
    }
    if (task_store_quota_list(&items, r->srv->store, NULL, &err) != E_OK) {
        return http_send_err(r, &err);
    }
    return http_send_json(r, 200,
                          json_pack("{s:s, s:o}", "kind", "SpendQuotaList", "items", items));
}
