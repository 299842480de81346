/* SPDX-License-Identifier: Apache-2.0 */
/* Usage figures in provider responses (SPEC §13 "Token kinds"): whole bodies and SSE
 * streams fed in arbitrary pieces. Everything here reads hostile bytes: a figure that is
 * missing, negative, fractional or absurd leaves the usage incomplete, never wrong. */
#include <jansson.h>
#include <string.h>

#include "server/api/llm/llm_int.h"

/* The non-negative integer FIELD of OBJ into *out; false when absent or not believable. */
static bool count_of(int64_t *out, const json_t *obj, const char *field)
{
    const json_t *v = json_object_get(obj, field);

    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) > LLM_TOKENS_MAX) {
        return false;
    }
    *out = (int64_t)json_integer_value(v);
    return true;
}

/* As count_of, but an absent or null field is 0. */
static bool count_opt(int64_t *out, const json_t *obj, const char *field)
{
    const json_t *v = json_object_get(obj, field);

    if (v == NULL || json_is_null(v)) {
        *out = 0;
        return true;
    }
    return count_of(out, obj, field);
}

/* Field NAME of USAGE into *dst when present (required: must be present); false when it
 * is required and absent, or present and not a believable count. */
static bool take(int64_t *dst, const json_t *usage, const char *name, bool required)
{
    const json_t *v = json_object_get(usage, name);
    int64_t n;

    if (v == NULL || (json_is_null(v) && !required)) {
        return !required;
    }
    if (!count_of(&n, usage, name)) {
        return false;
    }
    *dst = n;
    return true;
}

/* Anthropic usage object: every kind it carries; output and input are required in a
 * whole body (REQUIRE_ALL), a message_delta may carry output alone. */
static bool anthropic_usage(struct llm_usage *u, const json_t *usage, bool require_all)
{
    return json_is_object(usage) && take(&u->input, usage, "input_tokens", require_all) &&
           take(&u->output, usage, "output_tokens", require_all) &&
           take(&u->cache_write, usage, "cache_creation_input_tokens", false) &&
           take(&u->cache_read, usage, "cache_read_input_tokens", false);
}

/* OpenAI usage: TOTAL_FIELD of input includes CACHED of DETAILS. */
static bool openai_usage(struct llm_usage *u, const json_t *usage, const char *in_field,
                         const char *out_field, const char *details_field)
{
    int64_t in = 0, out = 0, cached = 0;
    const json_t *details = json_object_get(usage, details_field);

    if (!json_is_object(usage) || !count_of(&in, usage, in_field) ||
        !count_of(&out, usage, out_field) ||
        (json_is_object(details) && !count_opt(&cached, details, "cached_tokens"))) {
        return false;
    }
    if (cached > in) {
        cached = in; /* hostile: never more cached than sent */
    }
    u->input = in - cached;
    u->cache_read = cached;
    u->output = out;
    u->cache_write = 0;
    return true;
}

/* Gemini usageMetadata: promptTokenCount is required (every answer has one); the others
 * are absent when zero (no cache, no candidates, no thinking, no tool). The tokens a
 * server-side tool put into the prompt (toolUsePromptTokenCount: search results, code
 * output) are billed as input but are not part of promptTokenCount, so they count as input
 * too (totalTokenCount is the sum of all four kinds). */
static bool gemini_usage(struct llm_usage *u, const json_t *meta)
{
    int64_t prompt = 0, cached = 0, cand = 0, thoughts = 0, tool = 0;

    if (!json_is_object(meta) || !count_of(&prompt, meta, "promptTokenCount") ||
        !count_opt(&cached, meta, "cachedContentTokenCount") ||
        !count_opt(&cand, meta, "candidatesTokenCount") ||
        !count_opt(&thoughts, meta, "thoughtsTokenCount") ||
        !count_opt(&tool, meta, "toolUsePromptTokenCount")) {
        return false;
    }
    if (cached > prompt) {
        cached = prompt;
    }
    u->input = prompt - cached + tool;
    u->cache_read = cached;
    u->output = cand + thoughts;
    u->cache_write = 0;
    return true;
}

void llm_usage_from_body(struct llm_usage *out, enum llm_dialect dialect, const char *body,
                         size_t len)
{
    json_t *j = json_loadb(body, len, 0, NULL);
    const json_t *usage;

    memset(out, 0, sizeof(*out));
    switch (dialect) {
    case LLM_DIALECT_ANTHROPIC:
        out->complete = anthropic_usage(out, json_object_get(j, "usage"), true);
        break;
    case LLM_DIALECT_RESPONSES:
        usage = json_object_get(j, "usage");
        out->complete =
            openai_usage(out, usage, "input_tokens", "output_tokens", "input_tokens_details");
        break;
    case LLM_DIALECT_CHAT:
        usage = json_object_get(j, "usage");
        out->complete =
            openai_usage(out, usage, "prompt_tokens", "completion_tokens", "prompt_tokens_details");
        break;
    case LLM_DIALECT_GEMINI:
        out->complete = gemini_usage(out, json_object_get(j, "usageMetadata"));
        break;
    }
    if (!out->complete) {
        memset(out, 0, sizeof(*out));
    }
    json_decref(j);
}

/* --- SSE --------------------------------------------------------------------------- */

void llm_sse_init(struct llm_sse *s, enum llm_dialect dialect)
{
    memset(s, 0, sizeof(*s));
    s->dialect = dialect;
    buf_init(&s->line, LLM_SSE_EVENT_MAX);
    buf_init(&s->data, LLM_SSE_EVENT_MAX);
    buf_init(&s->raw, LLM_SSE_EVENT_MAX);
}

void llm_sse_cleanup(struct llm_sse *s)
{
    buf_cleanup(&s->line);
    buf_cleanup(&s->data);
    buf_cleanup(&s->raw);
}

static void anthropic_event(struct llm_sse *s, const json_t *ev)
{
    const char *type = json_string_value(json_object_get(ev, "type"));
    struct llm_usage u = s->u;

    if (type == NULL) {
        return;
    }
    if (strcmp(type, "message_start") == 0) {
        memset(&u, 0, sizeof(u));
        if (anthropic_usage(&u, json_object_get(json_object_get(ev, "message"), "usage"), false)) {
            s->u = u;
            s->saw_start = true;
            s->saw_delta = false;
        }
    } else if (strcmp(type, "message_delta") == 0 && s->saw_start) {
        /* The last message_delta's figures are cumulative: they replace earlier ones. */
        if (anthropic_usage(&u, json_object_get(ev, "usage"), false) &&
            json_object_get(json_object_get(ev, "usage"), "output_tokens") != NULL) {
            s->u = u;
            s->saw_delta = true;
        }
    }
    s->u.complete = s->saw_start && s->saw_delta;
}

/* Whether a Gemini chunk EV is the last of its answer: a candidate has its finishReason,
 * or the prompt was blocked (no candidates then). */
static bool gemini_final(const json_t *ev)
{
    const json_t *cands = json_object_get(ev, "candidates");
    const char *why;

    for (size_t i = 0; i < json_array_size(cands); i++) {
        why = json_string_value(json_object_get(json_array_get(cands, i), "finishReason"));
        if (why != NULL && *why != '\0') {
            return true;
        }
    }
    return json_object_get(json_object_get(ev, "promptFeedback"), "blockReason") != NULL;
}

/* Every chunk carries the usage so far (the first one only the prompt's): the last one
 * wins, and the usage is complete only when it came with the final chunk. */
static void gemini_event(struct llm_sse *s, const json_t *ev)
{
    struct llm_usage u;

    memset(&u, 0, sizeof(u));
    if (gemini_usage(&u, json_object_get(ev, "usageMetadata"))) {
        s->u = u;
        s->u.complete = gemini_final(ev);
    }
}

void llm_sse_event(struct llm_sse *s, const char *text, size_t len)
{
    json_t *ev;
    struct llm_usage u;
    const json_t *usage;
    const char *type;

    if (len == 0 || (len == 6 && memcmp(text, "[DONE]", 6) == 0)) {
        return;
    }
    ev = json_loadb(text, len, 0, NULL);
    if (!json_is_object(ev)) {
        json_decref(ev);
        return;
    }
    memset(&u, 0, sizeof(u));
    switch (s->dialect) {
    case LLM_DIALECT_ANTHROPIC:
        anthropic_event(s, ev);
        break;
    case LLM_DIALECT_RESPONSES:
        type = json_string_value(json_object_get(ev, "type"));
        if (type != NULL && strcmp(type, "response.completed") == 0 &&
            openai_usage(&u, json_object_get(json_object_get(ev, "response"), "usage"),
                         "input_tokens", "output_tokens", "input_tokens_details")) {
            s->u = u;
            s->u.complete = true;
        }
        break;
    case LLM_DIALECT_CHAT:
        usage = json_object_get(ev, "usage");
        s->chat_usage_only = false;
        if (json_is_object(usage) && openai_usage(&u, usage, "prompt_tokens", "completion_tokens",
                                                  "prompt_tokens_details")) {
            s->u = u;
            s->u.complete = true;
            s->chat_usage_only = json_array_size(json_object_get(ev, "choices")) == 0;
        }
        break;
    case LLM_DIALECT_GEMINI:
        gemini_event(s, ev);
        break;
    }
    json_decref(ev);
}

/* One line of the stream (without its end of line). */
static void sse_line(struct llm_sse *s, const char *line, size_t len)
{
    if (len == 0) {
        s->events++;
        if (!s->overflow) {
            llm_sse_event(s, s->data.data != NULL ? s->data.data : "", s->data.len);
        }
        s->data.len = 0;
        s->overflow = false;
        return;
    }
    if (len >= 5 && memcmp(line, "data:", 5) == 0) {
        size_t skip = len > 5 && line[5] == ' ' ? 6 : 5;
        if ((s->data.len > 0 && buf_append(&s->data, "\n", 1) != E_OK) ||
            buf_append(&s->data, line + skip, len - skip) != E_OK) {
            s->overflow = true;
        }
    }
    /* event:, id:, retry: and comments carry nothing the meter needs. */
}

void llm_sse_feed(struct llm_sse *s, const char *data, size_t len)
{
    size_t start = 0;

    for (size_t i = 0; i < len; i++) {
        if (data[i] != '\n') {
            continue;
        }
        if (s->line.len > 0 || s->overflow) {
            if (buf_append(&s->line, data + start, i - start) != E_OK) {
                s->overflow = true;
            }
            if (s->line.len > 0 && s->line.data[s->line.len - 1] == '\r') {
                s->line.len--;
            }
            sse_line(s, s->line.data != NULL ? s->line.data : "", s->line.len);
            s->line.len = 0;
        } else {
            size_t n = i - start;
            if (n > 0 && data[i - 1] == '\r') {
                n--;
            }
            sse_line(s, data + start, n);
        }
        start = i + 1;
    }
    if (start < len && buf_append(&s->line, data + start, len - start) != E_OK) {
        s->overflow = true;
        s->line.len = 0;
    }
}

/* One piece of the stream holding at most one end of line, as its last byte. */
static int relay_piece(struct llm_sse *s, const char *piece, size_t n, struct buf *out)
{
    unsigned long before = s->events;
    int rc = E_OK;

    s->chat_usage_only = false;
    llm_sse_feed(s, piece, n);
    if (!s->raw_passing && buf_append(&s->raw, piece, n) != E_OK) {
        /* Too big to hold back (never a usage chunk): pass it on as it comes. */
        rc = buf_append(out, s->raw.data != NULL ? s->raw.data : "", s->raw.len);
        s->raw.len = 0;
        s->raw_passing = true;
    }
    if (s->raw_passing && rc == E_OK) {
        rc = buf_append(out, piece, n);
    }
    if (s->events != before) {
        if (!s->raw_passing && !s->chat_usage_only) {
            rc = buf_append(out, s->raw.data != NULL ? s->raw.data : "", s->raw.len);
        }
        s->raw.len = 0;
        s->raw_passing = false;
    }
    return rc;
}

int llm_sse_relay(struct llm_sse *s, const char *data, size_t len, struct buf *out)
{
    size_t start = 0;
    int rc = E_OK;

    for (size_t i = 0; i < len && rc == E_OK; i++) {
        if (data[i] == '\n') {
            rc = relay_piece(s, data + start, i + 1 - start, out);
            start = i + 1;
        }
    }
    if (rc == E_OK && start < len) {
        rc = relay_piece(s, data + start, len - start, out);
    }
    return rc;
}

int llm_sse_relay_end(struct llm_sse *s, struct buf *out)
{
    int rc = E_OK;

    if (!s->raw_passing && s->raw.len > 0) {
        rc = buf_append(out, s->raw.data, s->raw.len);
    }
    s->raw.len = 0;
    s->raw_passing = false;
    return rc;
}
