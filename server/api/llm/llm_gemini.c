/* SPDX-License-Identifier: Apache-2.0 */
/* The Gemini routes of the gateway (SPEC §13): models/{model}:generateContent and
 * :streamGenerateContent (SSE, ?alt=sse). The model is the path's, checked to be a plain
 * name before it goes into the upstream URL; the task token comes in x-goog-api-key or
 * ?key= (one of them); upstream gets the server's key in x-goog-api-key and no query but
 * alt=sse. A stream without alt=sse (Gemini's JSON array) is refused: its usage could not
 * be read as it arrives, and the Gemini clients stream SSE. */
#include <stdlib.h>
#include <string.h>

#include "server/api/llm/llm_call.h"

#define GEMINI_MODEL_MAX 128 /* bytes of a model name in the path */

/* The task token of R: one x-goog-api-key header, or one ?key=, not both. */
static const char *token_of(struct request *r)
{
    int nhdr = http_header_count(r, "x-goog-api-key");
    int nquery = http_query_count(r, "key");

    if (nhdr + nquery != 1) {
        return NULL;
    }
    return nhdr == 1 ? http_header(r, "x-goog-api-key") : http_query(r, "key");
}

/* Whether MODEL is a plain model name: letters, digits, '.', '_', '-', no "..", bounded.
 * It goes into the upstream URL as a path segment, so nothing else may pass. */
static bool model_ok(const char *model)
{
    size_t n = strlen(model);

    if (n == 0 || n > GEMINI_MODEL_MAX || strstr(model, "..") != NULL) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        char ch = model[i];
        bool plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                     (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-';
        if (!plain) {
            return false;
        }
    }
    return true;
}

static const char *model_of(struct request *r, const json_t *body)
{
    (void)body;
    return r->params[0];
}

static bool stream_no(struct request *r, const json_t *body)
{
    (void)r;
    (void)body;
    return false;
}

static bool stream_yes(struct request *r, const json_t *body)
{
    (void)r;
    (void)body;
    return true;
}

/* BODY's member NAME, or its snake_case spelling SNAKE (the API takes both). */
static json_t *member(const json_t *body, const char *name, const char *snake)
{
    json_t *v = json_object_get(body, name);

    return v != NULL ? v : json_object_get(body, snake);
}

/* Whether OBJ names field NAME in both spellings: which one the API heeds is not ours to
 * guess, so such a request is treated as naming no limit (set_output then writes one). */
static bool both(const json_t *obj, const char *name, const char *snake)
{
    return json_object_get(obj, name) != NULL && json_object_get(obj, snake) != NULL;
}

/* generationConfig.candidateCount when it is a plain count the API takes (1 to 8). */
static int64_t candidates_of(const json_t *cfg)
{
    const json_t *v = member(cfg, "candidateCount", "candidate_count");

    return json_is_integer(v) && json_integer_value(v) >= 1 && json_integer_value(v) <= 8
               ? (int64_t)json_integer_value(v)
               : 0;
}

/* The output limit BODY asks for: maxOutputTokens (thinking included) per candidate, times
 * the candidates; 0 when none or anything about it is unclear. */
static int64_t output_of(const json_t *body)
{
    const json_t *cfg = member(body, "generationConfig", "generation_config");
    const json_t *v = member(cfg, "maxOutputTokens", "max_output_tokens");
    int64_t count =
        member(cfg, "candidateCount", "candidate_count") != NULL ? candidates_of(cfg) : 1;

    if (both(body, "generationConfig", "generation_config") ||
        both(cfg, "maxOutputTokens", "max_output_tokens") ||
        both(cfg, "candidateCount", "candidate_count") || count == 0 || !json_is_integer(v) ||
        json_integer_value(v) <= 0 || json_integer_value(v) > LLM_TOKENS_MAX / 8) {
        return 0;
    }
    return (int64_t)json_integer_value(v) * count;
}

/* Sets FIELD of OBJ (in the spelling the client used: both at once would be a duplicate
 * field; the snake_case one is dropped when both came) to V. */
static void set_field(json_t *obj, const char *name, const char *snake, json_t *v)
{
    if (both(obj, name, snake)) {
        json_object_del(obj, snake);
    }
    json_object_set_new(obj, json_object_get(obj, snake) != NULL ? snake : name, v);
}

/* Sets BODY's output limit to N tokens in all: N / candidates each (fewer candidates when
 * N cannot give each one token), so that all of them together stay within N. */
static void set_output(json_t *body, int64_t n)
{
    json_t *cfg = member(body, "generationConfig", "generation_config");
    int64_t count;

    if (both(body, "generationConfig", "generation_config")) {
        json_object_del(body, "generation_config");
        cfg = json_object_get(body, "generationConfig");
    }
    if (!json_is_object(cfg)) {
        set_field(body, "generationConfig", "generation_config", json_object());
        cfg = member(body, "generationConfig", "generation_config");
    }
    if (member(cfg, "candidateCount", "candidate_count") != NULL) {
        count = candidates_of(cfg);
        count = count == 0 ? 1 : count > n ? n : count;
        set_field(cfg, "candidateCount", "candidate_count", json_integer(count));
    } else {
        count = 1;
    }
    set_field(cfg, "maxOutputTokens", "max_output_tokens", json_integer(n / count));
}

/* Appends TEXT to the request's systemInstruction (a Content: {"parts":[{"text":…}]}),
 * creating it when absent; the snake_case spelling is kept when the client used it. */
static void add_guidance(json_t *body, const char *text)
{
    const char *name = json_object_get(body, "systemInstruction") == NULL &&
                               json_object_get(body, "system_instruction") != NULL
                           ? "system_instruction"
                           : "systemInstruction";
    json_t *sys = json_object_get(body, name);
    json_t *part = json_pack("{s:s}", "text", text);
    json_t *parts;

    if (json_is_string(sys)) {
        /* Not a Content, but plainly a text: keep it as the first part. */
        parts = json_pack("[{s:s}]", "text", json_string_value(sys));
        json_object_set_new(body, name, json_pack("{s:o}", "parts", parts));
        sys = json_object_get(body, name);
    }
    if (!json_is_object(sys)) {
        json_object_set_new(body, name, json_pack("{s:[o]}", "parts", part));
        return;
    }
    parts = json_object_get(sys, "parts");
    if (!json_is_array(parts)) {
        parts = json_array();
        json_object_set_new(sys, "parts", parts);
    }
    json_array_append_new(parts, part);
}

static void finish(struct llm_call *c, struct request *r, const char *method, const char *query)
{
    c->key_header = xasprintf("x-goog-api-key: %s", c->gw->key[LLM_GEMINI]);
    llm_pass_header(c, r, "x-goog-api-client", NULL);
    /* c->model passed model_ok: a plain path segment. */
    c->url =
        xasprintf("%s/v1beta/models/%s:%s%s", c->gw->upstream[LLM_GEMINI], c->model, method, query);
}

static void finish_generate(struct llm_call *c, struct request *r)
{
    finish(c, r, "generateContent", "");
}

static void finish_stream(struct llm_call *c, struct request *r)
{
    finish(c, r, "streamGenerateContent", "?alt=sse");
}

static const struct llm_route g_generate = {
    .provider = LLM_GEMINI,
    .dialect = LLM_DIALECT_GEMINI,
    .metered = true,
    .token_of = token_of,
    .model_of = model_of,
    .stream_of = stream_no,
    .output_of = output_of,
    .set_output = set_output,
    .add_guidance = add_guidance,
    .finish = finish_generate,
};

static const struct llm_route g_stream = {
    .provider = LLM_GEMINI,
    .dialect = LLM_DIALECT_GEMINI,
    .metered = true,
    .token_of = token_of,
    .model_of = model_of,
    .stream_of = stream_yes,
    .output_of = output_of,
    .set_output = set_output,
    .add_guidance = add_guidance,
    .finish = finish_stream,
};

/* Checks what the path and query say before the shared flow; answers R and returns true
 * when they are refused. ALT is the only alt= the method takes (NULL: none or json). */
static bool refuse_request(struct request *r, const char *alt, int *ret)
{
    const char *model = r->params[0];
    const char *got = http_query(r, "alt");

    if (model == NULL || !model_ok(model)) {
        *ret = llm_send_error(r, LLM_GEMINI, LLM_ERR_INVALID,
                              "diverge: the model in the path must be a plain model name "
                              "(letters, digits, '.', '_', '-')");
        return true;
    }
    if (http_query_count(r, "alt") > 1 || (alt != NULL ? got == NULL || strcmp(got, alt) != 0
                                                       : got != NULL && strcmp(got, "json") != 0)) {
        *ret = llm_send_error(r, LLM_GEMINI, LLM_ERR_INVALID,
                              alt != NULL ? "diverge: streamGenerateContent is served as SSE "
                                            "only: add alt=sse to the query"
                                          : "diverge: generateContent answers JSON: alt must "
                                            "be absent or json");
        return true;
    }
    return false;
}

int api_llm_gemini_generate(struct request *r)
{
    int ret = 0;

    if (refuse_request(r, NULL, &ret)) {
        return ret;
    }
    return llm_route_call(r, &g_generate);
}

int api_llm_gemini_stream(struct request *r)
{
    int ret = 0;

    if (refuse_request(r, "sse", &ret)) {
        return ret;
    }
    return llm_route_call(r, &g_stream);
}
