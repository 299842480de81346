/* SPDX-License-Identifier: Apache-2.0 */
/* The OpenAPI v3 documents kubectl reads (KUBECTL-PROTOCOL.md §3): the root lists the
 * group/version, whose document has the AgentTask schema (for `kubectl explain`, found by
 * x-kubernetes-group-version-kind) and a PATCH operation with the fieldValidation query
 * parameter (so that `kubectl apply` lets the server validate and never asks for the
 * protobuf /openapi/v2, which is not served: 404). The PATCH request body lists merge
 * patch only: kubectl then sends RFC 7386 merge patches, the one kind the task API takes.
 * The schema mirrors the rules of store/task_model.c (unknown fields are refused there).
 * The group/version document is openapi_v1alpha1.json beside this file, built into the
 * binary by openapi_embed.cmake; the root is short enough to stay here. */
#include "server/api/api_int.h"

static const char g_root[] =
    "{\"paths\": {\"apis/divergedev.com/v1alpha1\": "
    "{\"serverRelativeURL\": \"/openapi/v3/apis/divergedev.com/v1alpha1\"}}}\n";

int api_openapi_v3(struct request *r)
{
    return http_send_text(r, 200, "application/json", g_root);
}

int api_openapi_v3_group(struct request *r)
{
    return http_send_text(r, 200, "application/json", (const char *)api_openapi_group_json);
}
