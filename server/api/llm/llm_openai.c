/* SPDX-License-Identifier: Apache-2.0 */
/* The OpenAI routes of the gateway (SPEC §13): Responses and Chat Completions (streamed or
 * not) and the model list. The task token comes in Authorization: Bearer; upstream gets
 * the server's key the same way, and never the client's OpenAI-Organization or
 * OpenAI-Project (the server's key decides those). */
#include <stdlib.h>
#include <string.h>

#include "server/api/llm/llm_call.h"

#define CHAT_CHOICES_MAX 128 /* n above this is not believed */

/* --- Responses --------------------------------------------------------------------- */

static int64_t responses_output_of(const json_t *body)
{
    return llm_body_limit(body, "max_output_tokens");
}

static void responses_set_output(json_t *body, int64_t n)
{
    json_object_set_new(body, "max_output_tokens", json_integer(n));
}

/* Appends TEXT to the request's instructions (a string), creating them when absent; any
 * other value is not a Responses request, which the upstream refuses as it is. */
static void responses_add_guidance(json_t *body, const char *text)
{
    (void)llm_append_text(body, "instructions", text);
}

/* A Responses request that points at state kept upstream: its input is not bounded by the
 * body (the budget could not hold) and, since every task shares the server's key, it
 * could read another task's stored conversation. */
static const char *responses_refuse(const json_t *body)
{
    static const char *const fields[] = {"previous_response_id", "conversation", "prompt"};

    for (size_t i = 0; i < ARRAY_LEN(fields); i++) {
        const json_t *v = json_object_get(body, fields[i]);
        if (v != NULL && !json_is_null(v)) {
            return "diverge: previous_response_id, conversation and prompt are not served "
                   "through the gateway: send the whole input (as with store: false)";
        }
    }
    return NULL;
}

static void finish(struct llm_call *c, struct request *r, const char *path)
{
    c->key_header = xasprintf("Authorization: Bearer %s", c->gw->key[LLM_OPENAI]);
    llm_pass_header(c, r, "accept", NULL);
    c->url = xasprintf("%s%s", c->gw->upstream[LLM_OPENAI], path);
}

static void finish_responses(struct llm_call *c, struct request *r)
{
    finish(c, r, "/v1/responses");
}

/* --- Chat Completions -------------------------------------------------------------- */

/* The choices the request asks for (n), 1 when it names none. */
static int64_t chat_choices(const json_t *body)
{
    const json_t *v = json_object_get(body, "n");

    if (json_is_integer(v) && json_integer_value(v) > 1 &&
        json_integer_value(v) <= CHAT_CHOICES_MAX) {
        return (int64_t)json_integer_value(v);
    }
    return 1;
}

/* The most output the call can produce: every choice's limit, max_completion_tokens or
 * the legacy max_tokens (the lower when both are sent). */
static int64_t chat_output_of(const json_t *body)
{
    int64_t mct = llm_body_limit(body, "max_completion_tokens"),
            mt = llm_body_limit(body, "max_tokens");
    int64_t per = mct > 0 && (mt == 0 || mct < mt) ? mct : mt;

    return per * chat_choices(body);
}

/* Sets the limit the client used (both when it sent both; max_completion_tokens when it
 * sent none) so that all choices together stay within N; fewer choices when N cannot pay
 * one token for each. */
static void chat_set_output(json_t *body, int64_t n)
{
    int64_t choices = chat_choices(body), per;
    bool has_mct = json_object_get(body, "max_completion_tokens") != NULL;
    bool has_mt = json_object_get(body, "max_tokens") != NULL;

    if (choices > n) {
        choices = n > 0 ? n : 1;
        json_object_set_new(body, "n", json_integer(choices));
    }
    per = n / choices > 0 ? n / choices : 1;
    if (has_mt) {
        json_object_set_new(body, "max_tokens", json_integer(per));
    }
    if (has_mct || !has_mt) {
        json_object_set_new(body, "max_completion_tokens", json_integer(per));
    }
}

/* The guidance as a leading system message of its own: the client's own first system or
 * developer message stays as it was. */
static void chat_add_guidance(json_t *body, const char *text)
{
    json_t *msgs = json_object_get(body, "messages");

    if (json_is_array(msgs)) {
        json_array_insert_new(msgs, 0, json_pack("{s:s, s:s}", "role", "system", "content", text));
    }
}

/* A stream gets its usage in a last chunk only when asked: the gateway asks when the
 * client did not, and then keeps that chunk from the client. */
static bool chat_rewrite(struct llm_call *c, json_t *body)
{
    json_t *opts = json_object_get(body, "stream_options");

    if (!c->stream || json_is_true(json_object_get(opts, "include_usage"))) {
        return false;
    }
    if (!json_is_object(opts)) {
        opts = json_object();
        json_object_set_new(body, "stream_options", opts);
    }
    json_object_set_new(opts, "include_usage", json_true());
    c->strip_usage_chunk = true;
    return true;
}

static void finish_chat(struct llm_call *c, struct request *r)
{
    finish(c, r, "/v1/chat/completions");
}

static const struct llm_route g_responses = {
    .provider = LLM_OPENAI,
    .dialect = LLM_DIALECT_RESPONSES,
    .metered = true,
    .token_of = llm_bearer_token,
    .model_of = llm_body_model,
    .stream_of = llm_body_stream,
    .output_of = responses_output_of,
    .set_output = responses_set_output,
    .add_guidance = responses_add_guidance,
    .refuse = responses_refuse,
    .finish = finish_responses,
};

static const struct llm_route g_chat = {
    .provider = LLM_OPENAI,
    .dialect = LLM_DIALECT_CHAT,
    .metered = true,
    .token_of = llm_bearer_token,
    .model_of = llm_body_model,
    .stream_of = llm_body_stream,
    .output_of = chat_output_of,
    .set_output = chat_set_output,
    .add_guidance = chat_add_guidance,
    .rewrite = chat_rewrite,
    .finish = finish_chat,
};

int api_llm_openai_responses(struct request *r)
{
    return llm_route_call(r, &g_responses);
}

int api_llm_openai_chat(struct request *r)
{
    return llm_route_call(r, &g_chat);
}

/* --- the model list ---------------------------------------------------------------- */

/* The model name a price row stands for: the match itself when it has no glob character,
 * else the match without its one trailing '*' (a family: "gpt-5*" lists "gpt-5"); NULL
 * for any other pattern. Owned by the caller. */
static char *listed_name(const char *match)
{
    size_t n = strlen(match);

    if (n > 0 && match[n - 1] == '*') {
        n--;
    }
    if (n == 0 || memchr(match, '*', n) != NULL || memchr(match, '?', n) != NULL) {
        return NULL;
    }
    return xasprintf("%.*s", (int)n, match);
}

/* Adds NAME to LIST when it is new, its first match is ROW, and the token may call it. */
static int list_model(json_t *list, const struct llm_gateway *gw, const struct llm_price *row,
                      struct request *r, const char *token, const char *name)
{
    struct meter_gate g;
    size_t i;
    json_t *m;
    int status;

    if (llm_prices_find(&gw->prices, name) != row) {
        return 200; /* an earlier row prices it */
    }
    json_array_foreach(list, i, m)
    {
        if (strcmp(json_string_value(json_object_get(m, "id")), name) == 0) {
            return 200;
        }
    }
    meter_gate_check(&g, r->srv->meter, token, name);
    status = g.status;
    meter_gate_cleanup(&g);
    if (status == 200) {
        json_array_append_new(list, json_pack("{s:s, s:s, s:i, s:s}", "id", name, "object", "model",
                                              "created", 0, "owned_by", "diverge"));
    }
    return status == 403 ? 200 : status;
}

int api_llm_openai_models(struct request *r)
{
    const struct llm_gateway *gw = r->srv->llm;
    const char *token = llm_bearer_token(r);
    json_t *list;
    struct meter_gate g;
    int status;

    if (token == NULL) {
        return llm_send_error(r, LLM_OPENAI, LLM_ERR_AUTH,
                              "diverge: the task token is required as the API key");
    }
    /* The token first, for the task it names (a model-restricted task answers 403). */
    meter_gate_check(&g, r->srv->meter, token, NULL);
    status = g.status == 403 ? 200 : g.status;
    meter_gate_cleanup(&g);
    list = json_array();
    for (size_t i = 0; i < gw->prices.count && status == 200; i++) {
        char *name = listed_name(gw->prices.rows[i].match);
        if (name != NULL) {
            status = list_model(list, gw, &gw->prices.rows[i], r, token, name);
        }
        free(name);
    }
    if (status != 200) {
        json_decref(list);
        return llm_send_error(r, LLM_OPENAI, status == 401 ? LLM_ERR_AUTH : LLM_ERR_UNAVAILABLE,
                              status == 401 ? "diverge: the task token was refused"
                                            : "diverge: could not read the task; retry");
    }
    return http_send_json(r, 200, json_pack("{s:s, s:o}", "object", "list", "data", list));
}
