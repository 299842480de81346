/* SPDX-License-Identifier: Apache-2.0 */
/* The route table: every method and path the server answers, with its handler, name (logs
 * and metrics) and admin auth, matched in this order by server/http/http_route.c; and what
 * some routes add (a begin hook, a body cap, the reserve pool, the meter sockets). */
#include <stddef.h>

#include "server/api/api_int.h"
#include "server/api/git/api_git.h"
#include "server/api/llm/llm.h"

#define LLM_PREFIX "/api/v1/llm"

#define API_PREFIX "/apis/divergedev.com/v1alpha1"

static const struct http_route g_routes[] = {
    {"GET", "/healthz", api_healthz, "healthz", HTTP_AUTH_NONE},
    {"GET", "/readyz", api_readyz, "readyz", HTTP_AUTH_NONE},
    {"GET", "/metrics", api_metrics, "metrics", HTTP_AUTH_NONE},
    {"GET", "/api", api_discovery_api, "discovery", HTTP_AUTH_NONE},
    {"GET", "/apis", api_discovery_apis, "discovery", HTTP_AUTH_NONE},
    {"GET", API_PREFIX, api_discovery_group, "discovery", HTTP_AUTH_NONE},
    {"GET", "/openapi/v3", api_openapi_v3, "openapi", HTTP_AUTH_NONE},
    {"GET", "/openapi/v3/apis/divergedev.com/v1alpha1", api_openapi_v3_group, "openapi",
     HTTP_AUTH_NONE},
    {"GET", API_PREFIX "/agenttasks", api_task_list_all, "tasks.list", HTTP_AUTH_ADMIN},
    {"GET", API_PREFIX "/namespaces/*/agenttasks", api_task_list, "tasks.list", HTTP_AUTH_ADMIN},
    {"POST", API_PREFIX "/namespaces/*/agenttasks", api_task_create, "tasks.create",
     HTTP_AUTH_ADMIN},
    {"GET", API_PREFIX "/namespaces/*/agenttasks/*", api_task_get, "tasks.get", HTTP_AUTH_ADMIN},
    {"PATCH", API_PREFIX "/namespaces/*/agenttasks/*", api_task_patch, "tasks.patch",
     HTTP_AUTH_ADMIN},
    {"PUT", API_PREFIX "/namespaces/*/agenttasks/*", api_task_put, "tasks.update", HTTP_AUTH_ADMIN},
    {"DELETE", API_PREFIX "/namespaces/*/agenttasks/*", api_task_delete, "tasks.delete",
     HTTP_AUTH_ADMIN},
    {"GET", API_PREFIX "/namespaces/*/agenttasks/*/status", api_task_status_get, "tasks.status",
     HTTP_AUTH_ADMIN},
    {"PATCH", API_PREFIX "/namespaces/*/agenttasks/*/status", api_task_status_patch,
     "tasks.status.patch", HTTP_AUTH_ADMIN},
    {"PUT", API_PREFIX "/namespaces/*/agenttasks/*/status", api_task_status_put,
     "tasks.status.update", HTTP_AUTH_ADMIN},
    {"GET", API_PREFIX "/namespaces/*/agenttasks/*/log", api_task_log, "tasks.log",
     HTTP_AUTH_ADMIN},
    {"GET", API_PREFIX "/namespaces/*/agenttasks/*/token", api_task_token, "tasks.token",
     HTTP_AUTH_ADMIN},
    {"POST", "/api/v1/agenttask/meter", api_meter, "meter", HTTP_AUTH_NONE},
    {"POST", "/api/v1/agenttask/complete", api_agent_complete, "agent.complete", HTTP_AUTH_NONE},
    /* The LLM gateway (SPEC §13): the task token in the provider's key header, checked by
     * the handlers. */
    {"POST", LLM_PREFIX "/anthropic/v1/messages", api_llm_anthropic_messages, "llm.anthropic",
     HTTP_AUTH_NONE},
    {"POST", LLM_PREFIX "/anthropic/v1/messages/count_tokens", api_llm_anthropic_count_tokens,
     "llm.anthropic.count", HTTP_AUTH_NONE},
    {"GET", LLM_PREFIX "/anthropic/api/hello", api_llm_anthropic_hello, "llm.hello",
     HTTP_AUTH_NONE},
    {"HEAD", LLM_PREFIX "/anthropic/api/hello", api_llm_anthropic_hello, "llm.hello",
     HTTP_AUTH_NONE},
    {"POST", LLM_PREFIX "/openai/v1/responses", api_llm_openai_responses, "llm.openai.responses",
     HTTP_AUTH_NONE},
    {"POST", LLM_PREFIX "/openai/v1/chat/completions", api_llm_openai_chat, "llm.openai.chat",
     HTTP_AUTH_NONE},
    {"GET", LLM_PREFIX "/openai/v1/models", api_llm_openai_models, "llm.openai.models",
     HTTP_AUTH_NONE},
    /* The model and the method share the last segment: '*' stops at the ':'. */
    {"POST", LLM_PREFIX "/gemini/v1beta/models/*:generateContent", api_llm_gemini_generate,
     "llm.gemini", HTTP_AUTH_NONE},
    {"POST", LLM_PREFIX "/gemini/v1beta/models/*:streamGenerateContent", api_llm_gemini_stream,
     "llm.gemini.stream", HTTP_AUTH_NONE},
    {"POST", "/api/v1/webhooks/github", api_webhook_github, "webhooks.github", HTTP_AUTH_NONE},
    {"POST", "/api/v1/webhooks/gitlab", api_webhook_gitlab, "webhooks.gitlab", HTTP_AUTH_NONE},
    {"POST", "/api/v1/local/comments", api_local_comment, "local.comment", HTTP_AUTH_ADMIN},
    {"GET", "/api/v1/local/threads/*/*/*", api_local_thread, "local.thread", HTTP_AUTH_ADMIN},
    {"PUT", "/api/v1/local/pulls/*/*/*", api_local_pull_put, "local.pull", HTTP_AUTH_ADMIN},
    {"GET", "/api/v1/local/pulls/*/*/*", api_local_pull_get, "local.pull", HTTP_AUTH_ADMIN},
    {"POST", "/api/v1/admission/validate", api_admission_validate, "admission", HTTP_AUTH_NONE},
    /* Admin auth in api_connect: its 401 is a Connect error. */
    {"POST", "/divergedev.agenttask.v1.AgentTaskService/*", api_connect, "connect", HTTP_AUTH_NONE},
    {"GET", API_PREFIX "/spendquotas", api_quota_list_all, "quotas.list", HTTP_AUTH_ADMIN},
    {"GET", API_PREFIX "/namespaces/*/spendquotas", api_quota_list, "quotas.list", HTTP_AUTH_ADMIN},
    {"POST", API_PREFIX "/namespaces/*/spendquotas", api_quota_create, "quotas.create",
     HTTP_AUTH_ADMIN},
    {"GET", API_PREFIX "/namespaces/*/spendquotas/*", api_quota_get, "quotas.get", HTTP_AUTH_ADMIN},
    {"PATCH", API_PREFIX "/namespaces/*/spendquotas/*", api_quota_patch, "quotas.patch",
     HTTP_AUTH_ADMIN},
    {"PUT", API_PREFIX "/namespaces/*/spendquotas/*", api_quota_put, "quotas.update",
     HTTP_AUTH_ADMIN},
    {"DELETE", API_PREFIX "/namespaces/*/spendquotas/*", api_quota_delete, "quotas.delete",
     HTTP_AUTH_ADMIN},
    {"GET", API_PREFIX "/namespaces/*/spendquotas/*/status", api_quota_get, "quotas.status",
     HTTP_AUTH_ADMIN},
    {"PATCH", API_PREFIX "/namespaces/*/spendquotas/*/status", api_quota_status_patch,
     "quotas.status.patch", HTTP_AUTH_ADMIN},
    {"PUT", API_PREFIX "/namespaces/*/spendquotas/*/status", api_quota_status_put,
     "quotas.status.update", HTTP_AUTH_ADMIN},
    {"GET", API_PREFIX "/namespaces/*/environments", api_env_list, "environments.list",
     HTTP_AUTH_ADMIN},
    {"GET", API_PREFIX "/namespaces/*/environments/*", api_env_get, "environments.get",
     HTTP_AUTH_ADMIN},
    /* Dashboard: admin token as bearer header or session cookie, checked by the handlers. */
    {"GET", "/", api_ui_index, "ui", HTTP_AUTH_NONE},
    {"GET", "/ui/login", api_ui_login, "ui.login", HTTP_AUTH_NONE},
    {"POST", "/ui/logout", api_ui_logout, "ui.logout", HTTP_AUTH_NONE},
    {"GET", "/ui/api/history/*/*", api_ui_history, "ui.history", HTTP_AUTH_NONE},
    {"GET", "/ui/api/spendquotas", api_ui_quotas, "ui.spendquotas", HTTP_AUTH_NONE},
    {"GET", "/ui/*", api_ui_file, "ui", HTTP_AUTH_NONE},
    {"GET", "/api/v1/events", api_events, "events", HTTP_AUTH_NONE},
    /* The one-click GitHub App: admin header or dashboard cookie, checked by the handlers
     * (their 401 is a page). */
    {"GET", "/setup/github-app", api_setup_github_app, "setup.github_app", HTTP_AUTH_NONE},
    {"GET", "/setup/github-app/callback", api_setup_github_app_callback,
     "setup.github_app.callback", HTTP_AUTH_NONE},
    /* Git smart HTTP for sandbox pods: the task's token, checked by the handlers. */
    {"GET", "/api/v1/git/*/*/info/refs", api_git_info_refs, "git.refs", HTTP_AUTH_NONE},
    {"POST", "/api/v1/git/*/*/git-upload-pack", api_git_upload_pack, "git.upload", HTTP_AUTH_NONE},
    {"POST", "/api/v1/git/*/*/git-receive-pack", api_git_receive_pack, "git.receive",
     HTTP_AUTH_NONE},
};

static const struct http_route_extra g_route_extras[] = {
    {api_healthz, NULL, 0, HTTP_ROUTE_RESERVED},
    {api_readyz, NULL, 0, HTTP_ROUTE_RESERVED},
    {api_meter, NULL, 0, HTTP_ROUTE_RESERVED | HTTP_ROUTE_UNIX},
    {api_agent_complete, NULL, 0, HTTP_ROUTE_RESERVED | HTTP_ROUTE_UNIX},
    {api_llm_anthropic_messages, NULL, LLM_BODY_LIMIT, HTTP_ROUTE_LLM},
    {api_llm_anthropic_count_tokens, NULL, LLM_BODY_LIMIT, HTTP_ROUTE_LLM},
    {api_llm_anthropic_hello, NULL, 0, HTTP_ROUTE_LLM},
    {api_llm_openai_responses, NULL, LLM_BODY_LIMIT, HTTP_ROUTE_LLM},
    {api_llm_openai_chat, NULL, LLM_BODY_LIMIT, HTTP_ROUTE_LLM},
    {api_llm_openai_models, NULL, 0, HTTP_ROUTE_LLM},
    {api_llm_gemini_generate, NULL, LLM_BODY_LIMIT, HTTP_ROUTE_LLM},
    {api_llm_gemini_stream, NULL, LLM_BODY_LIMIT, HTTP_ROUTE_LLM},
    {api_webhook_github, api_webhook_github_begin, SERVER_WEBHOOK_BODY_MAX, 0},
    {api_webhook_gitlab, api_webhook_gitlab_begin, SERVER_WEBHOOK_BODY_MAX, 0},
    {api_git_info_refs, api_git_begin, 0, 0},
    {api_git_upload_pack, api_git_begin, API_GIT_FETCH_BODY_MAX, 0},
    {api_git_receive_pack, api_git_begin, API_GIT_PUSH_BODY_MAX, 0},
};

const struct http_routes api_routes = {
    .routes = g_routes,
    .count = ARRAY_LEN(g_routes),
    .extras = g_route_extras,
    .extras_count = ARRAY_LEN(g_route_extras),
};
