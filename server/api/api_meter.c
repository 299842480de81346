/* SPDX-License-Identifier: Apache-2.0 */
/* POST /api/v1/agenttask/meter, POST /api/v1/agenttask/complete and GET
 * …/agenttasks/{name}/token: thin HTTP shells over meter/ and the token index. */
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>

#include "server/api/api_int.h"

int api_meter(struct request *r)
{
    int status = 500;
    char *body = NULL;
    int ret;

    if (atomic_load(&r->srv->shutting_down)) {
        return http_send_error(r, 503, NULL, NULL, "shutting down; retry");
    }
    meter_service_handle(
        &status, &body, r->srv->meter, http_header(r, MHD_HTTP_HEADER_AUTHORIZATION),
        http_header_count(r, MHD_HTTP_HEADER_AUTHORIZATION), r->body.data, r->body.len);
    ret = http_send_text(r, status, "application/json", body);
    free(body);
    return ret;
}

int api_agent_complete(struct request *r)
{
    int status = 500;
    char *body = NULL;
    int ret;

    if (atomic_load(&r->srv->shutting_down)) {
        return http_send_error(r, 503, NULL, NULL, "shutting down; retry");
    }
    meter_service_complete(
        &status, &body, r->srv->meter, http_header(r, MHD_HTTP_HEADER_AUTHORIZATION),
        http_header_count(r, MHD_HTTP_HEADER_AUTHORIZATION), r->body.data, r->body.len);
    ret = http_send_text(r, status, "application/json", body);
    free(body);
    return ret;
}

int api_task_token(struct request *r)
{
    struct token_record rec;
    json_t *obj = NULL;
    struct err err = {0};
    int ret;

    if (task_store_get(&obj, r->srv->store, r->params[0], r->params[1], &err) != E_OK) {
        return http_send_err(r, &err);
    }
    json_decref(obj);
    if (task_store_token_current(&rec, r->srv->store, r->params[0], r->params[1], &err) != E_OK) {
        return http_send_error(r, 404, NULL, NULL,
                               "agenttasks \"%s\" has no token yet (the controller mints one "
                               "when the task starts)",
                               r->params[1]);
    }
    if (!rec.active) {
        free(rec.token);
        return http_send_error(r, 404, NULL, NULL,
                               "the token of agenttasks \"%s\" is revoked (task paused or "
                               "finished); resume the task for a fresh one",
                               r->params[1]);
    }
    ret = http_send_text(r, 200, "text/plain", rec.token);
    free(rec.token);
    return ret;
}
