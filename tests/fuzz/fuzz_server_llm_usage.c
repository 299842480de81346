/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: the LLM gateway's usage parsers (SPEC §13), whole bodies and SSE
 * streams, in every dialect (Anthropic, Responses, Chat, Gemini). The first byte picks the
 * dialect and where the stream is split; a stream read in two pieces must give the same
 * usage as read whole, and every figure stays believable. The relay's filter
 * (llm_sse_relay, which drops Chat's usage-only chunk) must pass on the same bytes however
 * the stream was split, never more bytes than came, every byte for the other dialects,
 * and read the same usage as the plain parser. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "server/api/llm/llm_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const struct llm_usage *u)
{
    ASSERT(u->input >= 0 && u->input <= LLM_TOKENS_MAX);
    ASSERT(u->output >= 0 && u->output <= 2 * LLM_TOKENS_MAX);
    ASSERT(u->cache_write >= 0 && u->cache_write <= LLM_TOKENS_MAX);
    ASSERT(u->cache_read >= 0 && u->cache_read <= LLM_TOKENS_MAX);
}

/* What llm_sse_relay passes on of TEXT fed in the pieces cut at CUT, into OUT. */
static void relay(struct buf *out, struct llm_usage *u, enum llm_dialect dialect, const char *text,
                  size_t len, size_t cut)
{
    struct llm_sse s;

    llm_sse_init(&s, dialect);
    ASSERT(llm_sse_relay(&s, text, cut, out) == E_OK);
    ASSERT(llm_sse_relay(&s, text + cut, len - cut, out) == E_OK);
    ASSERT(llm_sse_relay_end(&s, out) == E_OK);
    *u = s.u;
    llm_sse_cleanup(&s);
}

static void check_relay(enum llm_dialect dialect, const char *text, size_t len, size_t cut)
{
    struct buf whole, split;
    struct llm_usage uw, us;
    struct llm_sse plain;

    buf_init(&whole, 0);
    buf_init(&split, 0);
    relay(&whole, &uw, dialect, text, len, 0);
    relay(&split, &us, dialect, text, len, cut);
    ASSERT(whole.len == split.len && whole.len <= len);
    ASSERT(whole.len == 0 || memcmp(whole.data, split.data, whole.len) == 0);
    ASSERT(memcmp(&uw, &us, sizeof(uw)) == 0);
    if (dialect != LLM_DIALECT_CHAT) {
        ASSERT(whole.len == len && (len == 0 || memcmp(whole.data, text, len) == 0));
    }
    llm_sse_init(&plain, dialect);
    llm_sse_feed(&plain, text, len);
    ASSERT(memcmp(&plain.u, &uw, sizeof(uw)) == 0);
    llm_sse_cleanup(&plain);
    buf_cleanup(&whole);
    buf_cleanup(&split);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    enum llm_dialect dialect;
    struct llm_usage body;
    struct llm_sse whole, split;
    struct llm_price p = {.input = LLM_PRICE_MAX_MICROS,
                          .output = LLM_PRICE_MAX_MICROS,
                          .cache_write = LLM_PRICE_MAX_MICROS,
                          .cache_read = LLM_PRICE_MAX_MICROS};
    const char *text;
    size_t len, cut;

    if (size < 1) {
        return 0;
    }
    dialect = (enum llm_dialect)(data[0] % 4);
    text = (const char *)data + 1;
    len = size - 1;
    cut = len > 0 ? (size_t)(data[0] >> 2) % (len + 1) : 0;
    llm_usage_from_body(&body, dialect, text, len);
    check(&body);
    ASSERT(llm_cost_micros(&p, &body) >= 0);
    llm_sse_init(&whole, dialect);
    llm_sse_init(&split, dialect);
    llm_sse_feed(&whole, text, len);
    llm_sse_feed(&split, text, cut);
    llm_sse_feed(&split, text + cut, len - cut);
    check(&whole.u);
    ASSERT(memcmp(&whole.u, &split.u, sizeof(whole.u)) == 0);
    ASSERT(llm_cost_micros(&p, &whole.u) >= 0);
    llm_sse_cleanup(&whole);
    llm_sse_cleanup(&split);
    check_relay(dialect, text, len, cut);
    return 0;
}
