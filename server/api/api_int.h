/* SPDX-License-Identifier: Apache-2.0 */
/* Declarations shared inside server/api/: the handlers of the route table and the kubectl
 * pieces of the task API. */
#ifndef DIVERGE_SERVER_API_API_INT_H
#define DIVERGE_SERVER_API_API_INT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/err.h"
#include "server/api/api.h"
#include "server/http/http.h"

/* --- handlers (api_*.c) --- */
int api_task_list(struct request *r);
int api_task_list_all(struct request *r);
int api_task_create(struct request *r);
/* E_INVALID (field spec.repository.url) when the task DOC's repository is a file:// URL
 * inside DATA_DIR (controller_url_in_data_dir): every path that creates or changes a task
 * checks this. */
int api_task_repo_check(const char *data_dir, const json_t *doc, struct err *err);
int api_task_get(struct request *r);
int api_task_patch(struct request *r);
int api_task_put(struct request *r);
int api_task_delete(struct request *r);
int api_task_status_get(struct request *r);
int api_task_status_patch(struct request *r);
int api_task_status_put(struct request *r);
int api_task_token(struct request *r);
int api_task_log(struct request *r);
int api_meter(struct request *r);
int api_agent_complete(struct request *r);
int api_webhook_github(struct request *r);
/* Runs when the headers of a GitHub delivery are in, before any body byte is read:
 * answers 503/401/400 at once when no secret is configured or the signature or event
 * header is missing or malformed; else starts r->gh_mac and leaves r->status 0. */
int api_webhook_github_begin(struct request *r);
int api_webhook_gitlab(struct request *r);
/* A comment TEXT on its way to the inbox: when it asks for a `fix`, the embedded controller
 * is told a start may come (controller_start_coming) before the durable insert and the
 * bot's gathering, so the sandbox provider gets ready meanwhile. */
void api_comment_hint(struct server *srv, const char *text);
/* Runs when the headers of a GitLab delivery are in: 503 when neither a token nor a
 * signing secret is configured, 401 at once when X-Gitlab-Token is wrong or neither it
 * nor a well-formed, fresh Standard Webhooks header set is there (api_webhooks_gitlab.c). */
int api_webhook_gitlab_begin(struct request *r);
int api_local_comment(struct request *r);
int api_local_thread(struct request *r);
int api_local_pull_put(struct request *r);
int api_local_pull_get(struct request *r);
int api_env_list(struct request *r);
/* SpendQuotas (api_quotas.c, SPEC §15). */
int api_quota_list(struct request *r);
int api_quota_list_all(struct request *r);
int api_quota_get(struct request *r);
int api_quota_create(struct request *r);
int api_quota_patch(struct request *r);
int api_quota_put(struct request *r);
int api_quota_status_patch(struct request *r);
int api_quota_status_put(struct request *r);
int api_quota_delete(struct request *r);
int api_env_get(struct request *r);
int api_discovery_api(struct request *r);
int api_discovery_apis(struct request *r);
int api_discovery_group(struct request *r);
/* ConnectRPC (api_connect.c): checks the admin token itself, so that every error,
 * 401 included, is Connect error JSON. */
int api_connect(struct request *r);
/* The Kubernetes validating admission webhook for AgentTasks (api_admission.c). */
int api_admission_validate(struct request *r);
/* The dashboard (api_ui.c): each checks ui_auth_ok itself and answers a 401 page. */
int api_ui_index(struct request *r);
int api_ui_file(struct request *r);
int api_ui_login(struct request *r);
/* The dashboard's JSON (api_ui_data.c): GET /ui/api/history/{ns}/{name} (the task's spend
 * over time) and GET /ui/api/spendquotas; a 401 JSON error without auth. */
int api_ui_history(struct request *r);
int api_ui_quotas(struct request *r);
/* POST /ui/logout: ends the cookie's session (api_ui.c). */
int api_ui_logout(struct request *r);
/* The admin token as a bearer header, or a live session id in the diverge_token cookie
 * (__Host-diverge_token over TLS) that /ui/login set. */
bool ui_auth_ok(struct request *r);
/* False when the request has an Origin header that is not http(s)://<its Host>. */
bool ui_same_origin(struct request *r);
/* The request's dashboard session id (borrowed from the cookie) when it names a live
 * session, else NULL. */
const char *ui_session_id(struct request *r);
/* Sends HTML (copied) with STATUS and the dashboard's headers (CSP, no framing, no
 * referrer, no caching). */
int ui_send_html(struct request *r, int status, const char *html);
/* The one-click GitHub App (setup/api_setup.c): GET /setup/github-app and its callback;
 * admin auth (header or dashboard cookie) checked by the handlers. */
int api_setup_github_app(struct request *r);
int api_setup_github_app_callback(struct request *r);

/* Health and metrics (api_health.c): /healthz, /readyz, /metrics. */
int api_healthz(struct request *r);
int api_readyz(struct request *r);
int api_metrics(struct request *r);

/* --- what kubectl asks beyond plain objects (api_kube.c, api_kube_openapi.c) --- */
enum kube_include {
    KUBE_INCLUDE_METADATA, /* Table rows carry PartialObjectMetadata (the default) */
    KUBE_INCLUDE_OBJECT,   /* includeObject=Object: the whole object */
    KUBE_INCLUDE_NONE,     /* includeObject=None */
};
#define KUBE_LABEL_TERMS_MAX 16
/* How a request wants tasks shown, and which (fieldSelector, labelSelector). */
struct kube_view {
    bool table;                /* Accept asked for a meta.k8s.io Table */
    const char *table_version; /* "v1" or "v1beta1" (static) when TABLE */
    enum kube_include include; /* includeObject */
    char *ns;                  /* owned; fieldSelector metadata.namespace=, or NULL */
    char *name;                /* owned; fieldSelector metadata.name=, or NULL */
    struct kube_label_term {
        char *key;                  /* owned */
        char *value;                /* owned; NULL for the exists / not-exists terms */
        bool negate;                /* != or !key */
    } labels[KUBE_LABEL_TERMS_MAX]; /* labelSelector, all must hold */
    int nlabels;
};
#define KUBE_AGE_MAX 32
/* Whether the Accept header value ACCEPT (may be NULL) asks for a Table (the first media
 * range that does: application/json;as=Table;g=meta.k8s.io;v=v1|v1beta1); *version_out
 * gets "v1"/"v1beta1" then. */
bool kube_accept_table(const char *accept, const char **version_out);
/* Adds the terms of the field selector SEL ("metadata.name=x,metadata.namespace=y") to V;
 * E_INVALID (message in ERR) for any other field or operator. */
int kube_field_selector_parse(struct kube_view *v, const char *sel, struct err *err);
/* Adds the terms of the label selector SEL ("a=b,c!=d,e,!f"; = and == alike) to V;
 * E_INVALID for set-based terms (in, notin) or more than KUBE_LABEL_TERMS_MAX terms. */
int kube_label_selector_parse(struct kube_view *v, const char *sel, struct err *err);
/* kubectl's age text (duration.HumanDuration) of SECONDS: "61s", "5m3s", "3h", "12d". */
void kube_age(char out[KUBE_AGE_MAX], int64_t seconds);
/* Fills V from the request's Accept, fieldSelector and includeObject; on a bad selector
 * sends 400, sets *mhd_ret and returns E_INVALID. kube_view_cleanup() releases V. */
int kube_view_init(struct kube_view *v, struct request *r, int *mhd_ret);
void kube_view_cleanup(struct kube_view *v);
/* True when V shows plain objects, unfiltered. */
bool kube_view_plain(const struct kube_view *v);
bool kube_view_match(const struct kube_view *v, const char *ns, const char *name);
/* Sends OBJ (stolen) as V wants it: itself or a one-row Table. */
int kube_send_object(struct request *r, const struct kube_view *v, json_t *obj);
/* Sends the tasks of NS (NULL: all) that V selects, as an AgentTaskList or a Table. */
int kube_send_list(struct request *r, const struct kube_view *v, const char *ns);
/* Appends the watch line {"type": TYPE, "object": ...} for the stored object text JSON
 * (LEN bytes) to OUT when V selects it; the object is a one-row Table when V wants one. */
void kube_watch_line(struct buf *out, const struct kube_view *v, const char *type, const char *json,
                     size_t len);
/* GET /openapi/v3 and /openapi/v3/apis/divergedev.com/v1alpha1 (api_kube_openapi.c). */
int api_openapi_v3(struct request *r);
int api_openapi_v3_group(struct request *r);
/* The group/version document (openapi_v1alpha1.json, embedded at build time by
 * openapi_embed.cmake), NUL-terminated. */
extern const unsigned char api_openapi_group_json[];

#endif
