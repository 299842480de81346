/* SPDX-License-Identifier: Apache-2.0 */
/* The flow every gateway route shares (SPEC §13): the task token, the model and its
 * price, the admission against the task's budget, the body's output limit and guidance,
 * then the forwarding. What differs between providers comes from struct llm_route. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sandbox/sandbox.h"
#include "server/api/llm/llm_call.h"

#define LLM_HEADER_VALUE_MAX 1024
#define GUIDANCE_PREFIX "Reviewer guidance from the pull request: "

void llm_pass_header(struct llm_call *c, struct request *r, const char *name, const char *def)
{
    const char *v = http_header(r, name);
    size_t n = 0;

    if (v == NULL) {
        v = def;
    }
    while (n < LLM_EXTRA_HEADERS && c->extra_headers[n] != NULL) {
        n++;
    }
    if (v != NULL && strlen(v) < LLM_HEADER_VALUE_MAX && n < LLM_EXTRA_HEADERS) {
        c->extra_headers[n] = xasprintf("%s: %s", name, v);
    }
}

const char *llm_bearer_token(struct request *r)
{
    const char *auth = http_header(r, "Authorization");

    if (http_header_count(r, "Authorization") != 1 || auth == NULL ||
        strncmp(auth, "Bearer ", 7) != 0 || auth[7] == '\0') {
        return NULL;
    }
    return auth + 7;
}

const char *llm_body_model(struct request *r, const json_t *body)
{
    (void)r;
    return json_string_value(json_object_get(body, "model"));
}

bool llm_body_stream(struct request *r, const json_t *body)
{
    (void)r;
    return json_is_true(json_object_get(body, "stream"));
}

int64_t llm_body_limit(const json_t *body, const char *field)
{
    const json_t *v = json_object_get(body, field);

    if (json_is_integer(v) && json_integer_value(v) > 0 &&
        json_integer_value(v) <= LLM_TOKENS_MAX) {
        return (int64_t)json_integer_value(v);
    }
    return 0;
}

bool llm_append_text(json_t *body, const char *field, const char *text)
{
    json_t *v = json_object_get(body, field);

    if (v == NULL || json_is_null(v)) {
        json_object_set_new(body, field, json_string(text));
    } else if (json_is_string(v)) {
        char *joined = xasprintf("%s\n\n%s", json_string_value(v), text);
        json_object_set_new(body, field, json_string(joined));
        free(joined);
    } else {
        return false;
    }
    return true;
}

static int refuse_admission(struct request *r, struct llm_call *c, enum llm_admit verdict)
{
    enum llm_provider p = c->provider;
    char msg[256];
    int ret;

    if (verdict == LLM_ADMIT_QUOTA) {
        llm_call_pause(c, true);
        ret = llm_send_error(r, p, LLM_ERR_BUDGET,
                             "diverge: project quota exceeded: the namespace's SpendQuota is used "
                             "up for this month; the task is paused");
    } else if (verdict == LLM_ADMIT_EXHAUSTED) {
        llm_call_pause(c, false);
        ret = llm_send_error(r, p, LLM_ERR_BUDGET,
                             "diverge: budget exceeded: the task is paused; add budget with "
                             "/diverge budget or diverge task resume --budget");
    } else if (verdict == LLM_ADMIT_BUSY) {
        ret = llm_send_error(r, p, LLM_ERR_BUDGET,
                             "diverge: budget exceeded: what remains is held by this task's "
                             "calls in flight");
    } else if (c->gate_status == 401 || c->gate_status == 403) {
        snprintf(msg, sizeof(msg), "diverge: %s", c->gate_reason);
        ret = llm_send_error(r, p, c->gate_status == 401 ? LLM_ERR_AUTH : LLM_ERR_PERMISSION, msg);
    } else {
        ret = llm_send_error(r, p, LLM_ERR_UNAVAILABLE,
                             "diverge: could not read the task's budget; retry");
    }
    llm_call_free(c);
    return ret;
}

/* An unmetered call (count_tokens) still needs a token the meter accepts for its model. */
static enum llm_admit check_only(struct request *r, struct llm_call *c)
{
    struct meter_gate g;

    meter_gate_check(&g, r->srv->meter, c->token, c->model);
    c->gate_status = g.status;
    c->gate_reason = g.reason;
    meter_gate_cleanup(&g);
    return c->gate_status == 200 ? LLM_ADMIT_OK : LLM_ADMIT_DENIED;
}

/* Takes the provider-run tools out of BODY and says so in C's task log. */
static bool drop_hosted(const struct llm_call *c, json_t *body)
{
    char names[200];
    char *path;

    if (llm_drop_hosted_tools(body, c->dialect, names, sizeof(names)) == 0) {
        return false;
    }
    if (c->ns != NULL) {
        path = sandbox_log_path(c->srv->cfg.data_dir, c->ns, c->name);
        sandbox_log_event(path,
                          "llm %s %s: provider-run tools removed from the request (%s): their "
                          "cost is not bounded by the request and they reach the network "
                          "outside the sandbox",
                          llm_provider_name(c->provider), c->model_safe, names);
        free(path);
    }
    return true;
}

/* The route's own last changes and the removal of provider-run tools (a charged call);
 * whether BODY changed. */
static bool last_changes(const struct llm_route *rt, struct llm_call *c, json_t *body)
{
    bool changed = rt->rewrite != NULL && rt->rewrite(c, body);

    if (c->metered && drop_hosted(c, body)) {
        changed = true;
    }
    return changed;
}

/* Admits C and rewrites BODY into c->body; answers and returns true when refused. */
static bool prepare(struct request *r, const struct llm_route *rt, struct llm_call *c, json_t *body,
                    int *ret)
{
    int64_t asked = rt->output_of(body);
    int64_t want = asked > 0                 ? asked
                   : c->price.max_output > 0 ? c->price.max_output
                                             : LLM_DEFAULT_MAX_OUTPUT;
    int64_t allowed = want;
    enum llm_admit v = c->metered ? llm_call_admit(&allowed, c, want) : check_only(r, c);
    bool changed = false;

    if (v != LLM_ADMIT_OK) {
        *ret = refuse_admission(r, c, v);
        return true;
    }
    if (c->metered && (allowed < want || asked == 0)) {
        rt->set_output(body, allowed);
        changed = true;
    }
    if (c->metered && c->guidance != NULL) {
        char *text = xasprintf(GUIDANCE_PREFIX "%s", c->guidance);
        rt->add_guidance(body, text);
        free(text);
        changed = true;
    }
    if (last_changes(rt, c, body)) {
        changed = true;
    }
    if (changed) {
        c->body = json_dumps(body, JSON_COMPACT);
        c->send_len = strlen(c->body);
    } else {
        c->body = xmalloc(r->body.len + 1);
        memcpy(c->body, r->body.data != NULL ? r->body.data : "", r->body.len);
        c->send_len = r->body.len;
    }
    return false;
}

/* Whether TOKEN is refused (R answered 401): asked before any other refusal of a call, so
 * that a refused token is 401 whatever else is wrong, as at the meter (SPEC §13, §7). */
static bool token_refused(struct request *r, const struct llm_route *rt, const char *token,
                          int *ret)
{
    struct meter_gate g;
    char msg[256];
    bool refused;

    meter_gate_check(&g, r->srv->meter, token, NULL);
    refused = g.status == 401;
    if (refused) {
        snprintf(msg, sizeof(msg), "diverge: %s", g.reason);
        *ret = llm_send_error(r, rt->provider, LLM_ERR_AUTH, msg);
    }
    meter_gate_cleanup(&g);
    return refused;
}

/* A new call of RT for R with TOKEN and MODEL, or NULL after answering R. */
static struct llm_call *new_call(struct request *r, const struct llm_route *rt, const char *token,
                                 const char *model, int *ret)
{
    struct llm_gateway *gw = r->srv->llm;
    const struct llm_price *price = llm_prices_find(&gw->prices, model);
    struct llm_call *c = xcalloc(1, sizeof(*c));
    char msg[LLM_MODEL_MAX];

    c->srv = r->srv;
    c->gw = gw;
    c->provider = rt->provider;
    c->dialect = rt->dialect;
    c->token = xstrdup(token);
    c->metered = rt->metered;
    c->body_len = r->body.len;
    llm_call_set_model(c, model);
    if (price != NULL && gw->key[rt->provider] != NULL) {
        c->price = *price;
        return c;
    }
    if (token_refused(r, rt, token, ret)) {
        /* answered 401: a refused token comes before the call's own refusal */
    } else if (price == NULL) {
        snprintf(msg, sizeof(msg), "diverge: no price for model %s", c->model_safe);
        *ret = llm_send_error(r, rt->provider, LLM_ERR_PERMISSION, msg);
    } else {
        snprintf(msg, sizeof(msg), "diverge: no %s API key is configured on the server",
                 llm_provider_name(rt->provider));
        *ret = llm_send_error(r, rt->provider, LLM_ERR_UNAVAILABLE, msg);
    }
    llm_call_free(c);
    return NULL;
}

int llm_route_call(struct request *r, const struct llm_route *rt)
{
    const char *token = rt->token_of(r), *model, *why;
    struct llm_call *c;
    json_t *body;
    int ret = 0;

    if (token == NULL) {
        return llm_send_error(r, rt->provider, LLM_ERR_AUTH,
                              "diverge: the task token is required as the API key");
    }
    body = json_loadb(r->body.data != NULL ? r->body.data : "", r->body.len, 0, NULL);
    model = json_is_object(body) ? rt->model_of(r, body) : NULL;
    if (model == NULL || *model == '\0' || strlen(model) > LLM_MODEL_MAX) {
        json_decref(body);
        return token_refused(r, rt, token, &ret)
                   ? ret
                   : llm_send_error(r, rt->provider, LLM_ERR_INVALID,
                                    "diverge: the body must be a JSON object and name a model");
    }
    if (rt->refuse != NULL && (why = rt->refuse(body)) != NULL) {
        json_decref(body);
        return token_refused(r, rt, token, &ret)
                   ? ret
                   : llm_send_error(r, rt->provider, LLM_ERR_INVALID, why);
    }
    c = new_call(r, rt, token, model, &ret);
    if (c == NULL) {
        json_decref(body);
        return ret;
    }
    c->stream = rt->stream_of(r, body);
    if (prepare(r, rt, c, body, &ret)) {
        json_decref(body);
        return ret;
    }
    json_decref(body);
    rt->finish(c, r);
    return llm_forward(r, c);
}
