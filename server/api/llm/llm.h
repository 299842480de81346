/* SPDX-License-Identifier: Apache-2.0 */
/* The LLM gateway of `diverge serve` (SPEC §13): provider-compatible routes that forward
 * an agent's calls with the server's keys, meter them from the provider's usage and
 * refuse what the budget cannot pay for. This header is what the serve wiring and the
 * route table see. */
#ifndef DIVERGE_SERVER_API_LLM_LLM_H
#define DIVERGE_SERVER_API_LLM_LLM_H

#include "common/err.h"
#include "server/http/http.h"

struct llm_gateway;

#define LLM_BODY_LIMIT (32u << 20) /* bytes of a request body the routes take */

/* Makes the gateway from the flags: UPSTREAMS "name=url,..." (--llm-upstream; NULL: the
 * providers' public endpoints), KEY_FILES "name=path,..." (--llm-key-file; each a secret
 * file: 0600, ours, no symlink), PRICES_FILE (--llm-prices; NULL: the built-in table).
 * Keys not in a file come from DIVERGE_ANTHROPIC_API_KEY, DIVERGE_OPENAI_API_KEY and
 * DIVERGE_GEMINI_API_KEY, which are then removed from the environment (so that no child
 * inherits them): call before any thread starts. E_INVALID (message names the flag),
 * E_DENIED (a key file others can read). Caller frees with llm_gateway_free(). */
int llm_gateway_new(struct llm_gateway **out, const char *upstreams, const char *key_files,
                    const char *prices_file, struct err *err);
/* Waits for the streams in flight (their connections are closed by then) and frees GW,
 * wiping the keys. NULL is a no-op. */
void llm_gateway_free(struct llm_gateway *gw);

/* Charges every call the server died in (SPEC §13): each reservation record left (a call
 * admitted but not charged: the server stopped mid-call or before its charge committed)
 * is charged its reservation exactly once, under its own request id, as any gateway charge
 * (budget and quota rules, pause), and the task log says so. Call once at start, with the
 * meter running and before tasks restart. A no-op on a store that keeps no records. */
void llm_gateway_recover(struct server *srv);

/* --- routes (server/api/llm/llm_routes.c) --- */
int api_llm_anthropic_messages(struct request *r);
int api_llm_anthropic_count_tokens(struct request *r);
int api_llm_anthropic_hello(struct request *r);
int api_llm_openai_responses(struct request *r);
int api_llm_openai_chat(struct request *r);
int api_llm_openai_models(struct request *r);
int api_llm_gemini_generate(struct request *r);
int api_llm_gemini_stream(struct request *r);

#endif
