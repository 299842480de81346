/* SPDX-License-Identifier: Apache-2.0 */
/* The Anthropic routes of the gateway (SPEC §13): Messages (streamed or not, ?beta=true),
 * count_tokens (forwarded, not charged) and Claude Code's connectivity probe. The task
 * token comes in x-api-key or Authorization: Bearer; upstream gets the server's key. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/api/llm/llm_call.h"

#define ANTHROPIC_VERSION_DEFAULT "2023-06-01"
#define LLM_HEADER_VALUE_MAX 1024
#define GUIDANCE_PREFIX "Reviewer guidance from the pull request: "

static int deny(struct request *r, int status, const char *type, const char *msg)
{
    return llm_send_error(r, LLM_ANTHROPIC, status, type, msg);
}

/* The task token of R: one x-api-key, or one Authorization: Bearer, not both. */
static const char *token_of(struct request *r)
{
    int nkey = http_header_count(r, "x-api-key");
    int nauth = http_header_count(r, "Authorization");
    const char *auth = http_header(r, "Authorization");

    if (nkey + nauth != 1) {
        return NULL;
    }
    if (nkey == 1) {
        return http_header(r, "x-api-key");
    }
    return auth != NULL && strncmp(auth, "Bearer ", 7) == 0 ? auth + 7 : NULL;
}

static void pass_header(struct llm_call *c, size_t *n, struct request *r, const char *name,
                        const char *def)
{
    const char *v = http_header(r, name);

    if (v == NULL) {
        v = def;
    }
    if (v != NULL && strlen(v) < LLM_HEADER_VALUE_MAX && *n < LLM_EXTRA_HEADERS) {
        c->extra_headers[(*n)++] = xasprintf("%s: %s", name, v);
    }
}

/* Appends the task's guidance to the request's system prompt (SPEC §13). */
static void add_guidance(json_t *body, const char *guidance)
{
    json_t *sys = json_object_get(body, "system");
    char *text = xasprintf(GUIDANCE_PREFIX "%s", guidance);

    if (sys == NULL || json_is_null(sys)) {
        json_object_set_new(body, "system", json_string(text));
    } else if (json_is_string(sys)) {
        char *joined = xasprintf("%s\n\n%s", json_string_value(sys), text);
        json_object_set_new(body, "system", json_string(joined));
        free(joined);
    } else if (json_is_array(sys)) {
        json_array_append_new(sys, json_pack("{s:s, s:s}", "type", "text", "text", text));
    }
    free(text);
}

/* The output limit the request asks for, else the table's, else the default. */
static int64_t wanted_output(const json_t *body, const struct llm_price *p)
{
    const json_t *v = json_object_get(body, "max_tokens");

    if (json_is_integer(v) && json_integer_value(v) > 0 &&
        json_integer_value(v) <= LLM_TOKENS_MAX) {
        return (int64_t)json_integer_value(v);
    }
    return p->max_output > 0 ? p->max_output : LLM_DEFAULT_MAX_OUTPUT;
}

static int refuse_admission(struct request *r, struct llm_call *c, enum llm_admit verdict)
{
    char msg[256];
    int ret;

    if (verdict == LLM_ADMIT_EXHAUSTED) {
        llm_call_pause(c);
        ret = deny(r, 402, "billing_error",
                   "diverge: budget exceeded: the task is paused; add budget with /diverge "
                   "budget or diverge task resume --budget");
    } else if (verdict == LLM_ADMIT_BUSY) {
        ret = deny(r, 402, "billing_error",
                   "diverge: budget exceeded: what remains is held by this task's calls in "
                   "flight");
    } else if (c->gate_status == 401 || c->gate_status == 403) {
        snprintf(msg, sizeof(msg), "diverge: %s", c->gate_reason);
        ret = deny(r, c->gate_status,
                   c->gate_status == 401 ? "authentication_error" : "permission_error", msg);
    } else {
        ret = deny(r, 503, "api_error", "diverge: could not read the task's budget; retry");
    }
    llm_call_free(c);
    return ret;
}

/* Checks R, admits it and rewrites its BODY; answers and returns true when refused. */
static bool prepare(struct request *r, struct llm_call *c, json_t *body, int *ret)
{
    int64_t want = wanted_output(body, &c->price), allowed = want;
    bool changed = false;

    if (c->metered) {
        enum llm_admit v = llm_call_admit(&allowed, c, want);
        if (v != LLM_ADMIT_OK) {
            *ret = refuse_admission(r, c, v);
            return true;
        }
    } else {
        struct meter_gate g;
        meter_gate_check(&g, r->srv->meter, c->token, c->model);
        c->gate_status = g.status;
        c->gate_reason = g.reason;
        meter_gate_cleanup(&g);
        if (c->gate_status != 200) {
            *ret = refuse_admission(r, c, LLM_ADMIT_DENIED);
            return true;
        }
    }
    if (c->metered && (allowed < want || json_object_get(body, "max_tokens") == NULL)) {
        json_object_set_new(body, "max_tokens", json_integer(allowed));
        changed = true;
    }
    if (c->metered && c->guidance != NULL) {
        add_guidance(body, c->guidance);
        changed = true;
    }
    if (changed) {
        c->body = json_dumps(body, JSON_COMPACT);
    }
    if (c->body == NULL) {
        c->body = xmalloc(r->body.len + 1);
        memcpy(c->body, r->body.data != NULL ? r->body.data : "", r->body.len);
    }
    c->send_len = changed ? strlen(c->body) : r->body.len;
    return false;
}

static int anthropic_call(struct request *r, const char *path, bool metered)
{
    struct llm_gateway *gw = r->srv->llm;
    const char *token = token_of(r), *model;
    const struct llm_price *price;
    struct llm_call *c;
    json_t *body;
    size_t nh = 0;
    int ret;

    if (token == NULL) {
        return deny(r, 401, "authentication_error",
                    "diverge: the task token is required in x-api-key or Authorization: Bearer");
    }
    body = json_loadb(r->body.data != NULL ? r->body.data : "", r->body.len, 0, NULL);
    model = json_string_value(json_object_get(body, "model"));
    if (!json_is_object(body) || model == NULL || strlen(model) > LLM_MODEL_MAX) {
        json_decref(body);
        return deny(r, 400, "invalid_request_error",
                    "diverge: the body must be a JSON object with a model");
    }
    price = llm_prices_find(&gw->prices, model);
    c = xcalloc(1, sizeof(*c));
    c->srv = r->srv;
    c->gw = gw;
    c->provider = LLM_ANTHROPIC;
    c->dialect = LLM_DIALECT_ANTHROPIC;
    c->token = xstrdup(token);
    c->metered = metered;
    c->body_len = r->body.len;
    llm_call_set_model(c, model);
    if (price == NULL || gw->key[LLM_ANTHROPIC] == NULL) {
        char msg[LLM_MODEL_MAX];
        snprintf(msg, sizeof(msg), "diverge: no price for model %s", c->model_safe);
        ret = price == NULL ? deny(r, 403, "permission_error", msg)
                            : deny(r, 503, "api_error",
                                   "diverge: no Anthropic API key is configured on the server");
        llm_call_free(c);
        json_decref(body);
        return ret;
    }
    c->price = *price;
    c->stream = json_is_true(json_object_get(body, "stream"));
    if (prepare(r, c, body, &ret)) {
        json_decref(body);
        return ret;
    }
    json_decref(body);
    c->key_header = xasprintf("x-api-key: %s", gw->key[LLM_ANTHROPIC]);
    pass_header(c, &nh, r, "anthropic-version", ANTHROPIC_VERSION_DEFAULT);
    pass_header(c, &nh, r, "anthropic-beta", NULL);
    pass_header(c, &nh, r, "accept", NULL);
    c->url = xasprintf("%s%s%s", gw->upstream[LLM_ANTHROPIC], path,
                       http_query(r, "beta") != NULL ? "?beta=true" : "");
    return llm_forward(r, c);
}

int api_llm_anthropic_messages(struct request *r)
{
    return anthropic_call(r, "/v1/messages", true);
}

int api_llm_anthropic_count_tokens(struct request *r)
{
    return anthropic_call(r, "/v1/messages/count_tokens", false);
}

int api_llm_anthropic_hello(struct request *r)
{
    return http_send_text(r, 200, "application/json", "{}");
}
