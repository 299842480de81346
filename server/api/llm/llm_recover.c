/* SPDX-License-Identifier: Apache-2.0 */
/* The charge of calls the server died in (SPEC §13): a call's reservation record is durable
 * before its answer ends and is removed by its charge's transaction, so a record found at
 * start is a call that was never charged. It is charged its reservation under its own
 * request id (a charge that did commit removed the record with it, and the id would refuse
 * a second one anyway). */
#include <stdlib.h>

#include "common/log.h"
#include "common/money.h"
#include "meter/meter.h"
#include "sandbox/sandbox.h"
#include "server/api/llm/llm_call.h"
#include "server/server_int.h"

struct drop {
    const char *request_id;
};

static int drop_one(struct task_txn *tx, void *userdata)
{
    const struct drop *d = userdata;

    return task_txn_resv_drop(tx, d->request_id, NULL);
}

/* Charges the record REC (one element of task_store_resv_list). */
static void recover_one(struct server *srv, const json_t *rec)
{
    const char *id = json_string_value(json_object_get(rec, "requestId"));
    const char *ns = json_string_value(json_object_get(rec, "namespace"));
    const char *name = json_string_value(json_object_get(rec, "name"));
    const char *token = json_string_value(json_object_get(rec, "token"));
    const char *model = json_string_value(json_object_get(rec, "model"));
    const char *provider = json_string_value(json_object_get(rec, "provider"));
    int64_t tokens = json_integer_value(json_object_get(rec, "tokens"));
    int64_t cost = json_integer_value(json_object_get(rec, "costMicros"));
    char usd[MONEY_STR_MAX], model_safe[LLM_MODEL_MAX / 2], prov_safe[32], *path;
    struct err err = {0};
    int st;

    st = meter_gate_settle(NULL, srv->meter, token, id, model, tokens, cost, false);
    money_format(usd, cost);
    if (st == 503) {
        log_kv(LOG_ERROR, "llm_recover_failed", "namespace", ns, "name", name, "usd", usd, NULL);
        return; /* the record stays: the next start tries again */
    }
    if (st == 401) {
        /* The token no longer verifies (another root key) or the task is gone: nothing
         * can be charged; the record would be found at every start. */
        struct drop d = {.request_id = id};
        if (task_store_txn(srv->store, drop_one, &d, &err) != E_OK) {
            log_kv(LOG_ERROR, "llm_recover_drop_failed", "error", err.msg, NULL);
        }
        log_kv(LOG_WARN, "llm_recover_uncharged", "namespace", ns, "name", name, "usd", usd, NULL);
        return;
    }
    llm_log_safe(model_safe, sizeof(model_safe), model);
    llm_log_safe(prov_safe, sizeof(prov_safe), provider);
    path = sandbox_log_path(srv->cfg.data_dir, ns, name);
    sandbox_log_event(path,
                      "llm %s %s: the server restarted during the call; charged the "
                      "reservation tokens=%lld usd=%s",
                      prov_safe, model_safe, (long long)tokens, usd);
    free(path);
    log_kv(LOG_INFO, "llm_recovered_call", "namespace", ns, "name", name, "usd", usd, NULL);
}

void llm_gateway_recover(struct server *srv)
{
    struct err err = {0};
    json_t *items = NULL, *rec;
    size_t i;

    if (!task_store_keeps_resv(srv->store)) {
        return;
    }
    if (task_store_resv_list(&items, srv->store, &err) != E_OK) {
        log_kv(LOG_ERROR, "llm_recover_failed", "error", err.msg, NULL);
        return;
    }
    json_array_foreach(items, i, rec)
    {
        const char *id = json_string_value(json_object_get(rec, "requestId"));
        const char *ns = json_string_value(json_object_get(rec, "namespace"));
        const char *name = json_string_value(json_object_get(rec, "name"));
        if (id != NULL && ns != NULL && name != NULL) {
            recover_one(srv, rec);
        }
    }
    json_decref(items);
}
