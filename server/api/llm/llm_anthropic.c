/* SPDX-License-Identifier: Apache-2.0 */
/* The Anthropic routes of the gateway (SPEC §13): Messages (streamed or not, ?beta=true),
 * count_tokens (forwarded, not charged) and Claude Code's connectivity probe. The task
 * token comes in x-api-key or Authorization: Bearer; upstream gets the server's key. */
#include <stdlib.h>
#include <string.h>

#include "server/api/llm/llm_call.h"

#define ANTHROPIC_VERSION_DEFAULT "2023-06-01"

/* The task token of R: one x-api-key, or one Authorization: Bearer, not both. */
static const char *token_of(struct request *r)
{
    int nkey = http_header_count(r, "x-api-key");

    if (nkey > 1 || (nkey == 1 && http_header_count(r, "Authorization") > 0)) {
        return NULL;
    }
    return nkey == 1 ? http_header(r, "x-api-key") : llm_bearer_token(r);
}

static int64_t output_of(const json_t *body)
{
    return llm_body_limit(body, "max_tokens");
}

static void set_output(json_t *body, int64_t n)
{
    json_object_set_new(body, "max_tokens", json_integer(n));
}

/* Appends TEXT to the request's system prompt: a string, or a list of text blocks. */
static void add_guidance(json_t *body, const char *text)
{
    json_t *sys = json_object_get(body, "system");

    if (!llm_append_text(body, "system", text) && json_is_array(sys)) {
        json_array_append_new(sys, json_pack("{s:s, s:s}", "type", "text", "text", text));
    }
}

static void finish(struct llm_call *c, struct request *r, const char *path)
{
    c->key_header = xasprintf("x-api-key: %s", c->gw->key[LLM_ANTHROPIC]);
    llm_pass_header(c, r, "anthropic-version", ANTHROPIC_VERSION_DEFAULT);
    llm_pass_header(c, r, "anthropic-beta", NULL);
    llm_pass_header(c, r, "accept", NULL);
    c->url = xasprintf("%s%s%s", c->gw->upstream[LLM_ANTHROPIC], path,
                       http_query(r, "beta") != NULL ? "?beta=true" : "");
}

static void finish_messages(struct llm_call *c, struct request *r)
{
    finish(c, r, "/v1/messages");
}

static void finish_count(struct llm_call *c, struct request *r)
{
    finish(c, r, "/v1/messages/count_tokens");
}

static const struct llm_route g_messages = {
    .provider = LLM_ANTHROPIC,
    .dialect = LLM_DIALECT_ANTHROPIC,
    .metered = true,
    .token_of = token_of,
    .model_of = llm_body_model,
    .stream_of = llm_body_stream,
    .output_of = output_of,
    .set_output = set_output,
    .add_guidance = add_guidance,
    .finish = finish_messages,
};

static const struct llm_route g_count_tokens = {
    .provider = LLM_ANTHROPIC,
    .dialect = LLM_DIALECT_ANTHROPIC,
    .metered = false,
    .token_of = token_of,
    .model_of = llm_body_model,
    .stream_of = llm_body_stream,
    .output_of = output_of,
    .set_output = set_output,
    .add_guidance = add_guidance,
    .finish = finish_count,
};

int api_llm_anthropic_messages(struct request *r)
{
    return llm_route_call(r, &g_messages);
}

int api_llm_anthropic_count_tokens(struct request *r)
{
    return llm_route_call(r, &g_count_tokens);
}

int api_llm_anthropic_hello(struct request *r)
{
    return http_send_text(r, 200, "application/json", "{}");
}
