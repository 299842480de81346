/* SPDX-License-Identifier: Apache-2.0 */
/* The protocols the server speaks (task API, kube discovery and OpenAPI, ConnectRPC, git
 * smart HTTP, events, admission, webhooks, meter, local SCM, dashboard), as one route
 * table for server/http/, and what the serve wiring makes for them. */
#ifndef DIVERGE_SERVER_API_API_H
#define DIVERGE_SERVER_API_API_H

#include <stdbool.h>
#include <stdint.h>

#include "server/http/http.h"

/* Every route the server serves (api_routes.c). */
extern const struct http_routes api_routes;

/* --- dashboard login sessions (ui_session.c), in memory: a restart ends them --- */
#define UI_SESSION_ID_LEN 64                   /* hex of 32 random bytes */
#define UI_SESSION_TTL_MS (12LL * 3600 * 1000) /* a login lasts 12 hours */
#define UI_SESSIONS_MAX 256                    /* more logins evict the oldest */
struct ui_sessions;
/* Makes an empty session table; free with ui_sessions_free() (NULL is a no-op). */
void ui_sessions_new(struct ui_sessions **out);
void ui_sessions_free(struct ui_sessions *s);
/* Starts a session at NOW_MS (monotonic milliseconds) and writes its new random id to OUT.
 * Thread-safe. */
void ui_session_create(char out[UI_SESSION_ID_LEN + 1], struct ui_sessions *s, int64_t now_ms);
/* True when ID names a session of S that has not expired or ended (constant time in the
 * ids). ID may be NULL. Thread-safe. */
bool ui_session_valid(struct ui_sessions *s, const char *id, int64_t now_ms);
/* Ends the session ID; false when it was not a live session. Thread-safe. */
bool ui_session_end(struct ui_sessions *s, const char *id, int64_t now_ms);
/* --- pending one-click GitHub App setups (setup/setup_state.c), in memory --- */
#define GH_SETUP_STATE_LEN 64                 /* hex of 32 random bytes */
#define GH_SETUP_STATE_TTL_MS (3600LL * 1000) /* GitHub's codes last an hour too */
#define GH_SETUP_STATES_MAX 16                /* more evict the oldest */
struct gh_setup;
/* Makes an empty table; free with gh_setup_free() (NULL is a no-op). */
void gh_setup_new(struct gh_setup **out);
void gh_setup_free(struct gh_setup *s);
/* A new random state value in OUT, bound to BINDING (the dashboard session id, or "" for
 * the bearer header), valid from NOW_MS (monotonic ms) for GH_SETUP_STATE_TTL_MS.
 * Thread-safe. */
void gh_setup_state_create(char out[GH_SETUP_STATE_LEN + 1], struct gh_setup *s,
                           const char *binding, int64_t now_ms);
/* True, and the state is used up, when STATE is live and bound to BINDING (constant time
 * in the values). Thread-safe. */
bool gh_setup_state_take(struct gh_setup *s, const char *state, const char *binding,
                         int64_t now_ms);
/* Marks a callback in progress: false when one is already. gh_setup_end() ends it. */
bool gh_setup_begin(struct gh_setup *s);
void gh_setup_end(struct gh_setup *s);

/* GET /api/v1/events, the dashboard's Server-Sent Events stream (api_events.c). */
int api_events(struct request *r);

#endif
