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
/* GET /api/v1/events, the dashboard's Server-Sent Events stream (api_events.c). */
int api_events(struct request *r);

#endif
