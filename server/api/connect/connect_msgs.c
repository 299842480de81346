/* SPDX-License-Identifier: Apache-2.0 */
/* The messages of proto/divergedev/agenttask/v1/agenttask.proto as codec tables. They must
 * match the .proto field for field (number, type, json name): the interop test generates
 * a client from the .proto and talks to these tables. */
#include "server/api/connect/connect_pb.h"

#define PKG "divergedev.agenttask.v1."
#define MSG(var_, name_, fields_)                                                                  \
    const struct pb_message var_ = {PKG name_, fields_, ARRAY_LEN(fields_)}

static const struct pb_field g_repository[] = {
    {1, PB_STRING, 0, "url", "url", NULL},
    {2, PB_STRING, 0, "baseBranch", "base_branch", NULL},
    {3, PB_STRING, 0, "workingBranch", "working_branch", NULL},
};
MSG(connect_msg_repository, "Repository", g_repository);

static const struct pb_field g_task[] = {
    {1, PB_STRING, 0, "name", "name", NULL},
    {2, PB_STRING, 0, "namespace", "namespace", NULL},
    {3, PB_STRING, 0, "objective", "objective", NULL},
    {4, PB_STRING, 0, "phase", "phase", NULL},
    {5, PB_STRING, 0, "reason", "reason", NULL},
    {6, PB_STRING, 0, "message", "message", NULL},
    {7, PB_INT64, 0, "iteration", "iteration", NULL},
    {8, PB_INT64, 0, "maxIterations", "max_iterations", NULL},
    {9, PB_INT64, 0, "tokensConsumed", "tokens_consumed", NULL},
    {10, PB_STRING, 0, "costUSD", "cost_usd", NULL},
    {11, PB_STRING, 0, "budgetUSD", "budget_usd", NULL},
    {12, PB_INT64, 0, "budgetTokens", "budget_tokens", NULL},
    {13, PB_MESSAGE, 0, "repository", "repository", &connect_msg_repository},
    {14, PB_BOOL, 0, "suspended", "suspended", NULL},
    {15, PB_STRING, 0, "previewUrl", "preview_url", NULL},
    {16, PB_STRING, 0, "resourceVersion", "resource_version", NULL},
    {17, PB_STRING, 0, "guidance", "guidance", NULL},
    {18, PB_STRING, 0, "effectiveBudgetUSD", "effective_budget_usd", NULL},
    {19, PB_INT64, 0, "effectiveBudgetTokens", "effective_budget_tokens", NULL},
    {20, PB_INT64, 0, "effectiveMaxIterations", "effective_max_iterations", NULL},
    {21, PB_STRING, 0, "forecastUSD", "forecast_usd", NULL},
};
MSG(connect_msg_task, "Task", g_task);

static const struct pb_field g_create_req[] = {
    {1, PB_STRING, 0, "namespace", "namespace", NULL},
    {2, PB_STRING, 0, "name", "name", NULL},
    {3, PB_STRING, 0, "objective", "objective", NULL},
    {4, PB_STRING, 0, "budgetUSD", "budget_usd", NULL},
    {5, PB_INT64, PB_OPTIONAL, "budgetTokens", "budget_tokens", NULL},
    {6, PB_INT64, PB_OPTIONAL, "maxIterations", "max_iterations", NULL},
    {7, PB_MESSAGE, 0, "repository", "repository", &connect_msg_repository},
};
MSG(connect_msg_create_req, "CreateTaskRequest", g_create_req);

/* GetTaskRequest and PauseTaskRequest: {namespace, name}. */
static const struct pb_field g_name_req[] = {
    {1, PB_STRING, 0, "namespace", "namespace", NULL},
    {2, PB_STRING, 0, "name", "name", NULL},
};
MSG(connect_msg_get_req, "GetTaskRequest", g_name_req);
MSG(connect_msg_pause_req, "PauseTaskRequest", g_name_req);

static const struct pb_field g_list_req[] = {
    {1, PB_STRING, 0, "namespace", "namespace", NULL},
    {2, PB_BOOL, 0, "allNamespaces", "all_namespaces", NULL},
};
MSG(connect_msg_list_req, "ListTasksRequest", g_list_req);

static const struct pb_field g_list_resp[] = {
    {1, PB_MESSAGE, PB_REPEATED, "tasks", "tasks", &connect_msg_task},
};
MSG(connect_msg_list_resp, "ListTasksResponse", g_list_resp);

static const struct pb_field g_guide_req[] = {
    {1, PB_STRING, 0, "namespace", "namespace", NULL},
    {2, PB_STRING, 0, "name", "name", NULL},
    {3, PB_STRING, 0, "guidance", "guidance", NULL},
};
MSG(connect_msg_guide_req, "GuideTaskRequest", g_guide_req);

static const struct pb_field g_resume_req[] = {
    {1, PB_STRING, 0, "namespace", "namespace", NULL},
    {2, PB_STRING, 0, "name", "name", NULL},
    {3, PB_STRING, 0, "budget", "budget", NULL},
    {4, PB_INT64, PB_OPTIONAL, "tokens", "tokens", NULL},
};
MSG(connect_msg_resume_req, "ResumeTaskRequest", g_resume_req);

/* CreateTaskResponse, GetTaskResponse, ...: {Task task = 1}. */
static const struct pb_field g_task_resp[] = {
    {1, PB_MESSAGE, 0, "task", "task", &connect_msg_task},
};
MSG(connect_msg_task_resp, "TaskResponse", g_task_resp);

const struct pb_message *const connect_request_msgs[] = {
    &connect_msg_create_req, &connect_msg_get_req,   &connect_msg_list_req,
    &connect_msg_guide_req,  &connect_msg_pause_req, &connect_msg_resume_req,
    &connect_msg_task_resp,  &connect_msg_list_resp, NULL,
};
