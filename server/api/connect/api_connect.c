/* SPDX-License-Identifier: Apache-2.0 */
/* ConnectRPC (SPEC §10): the unary methods of divergedev.agenttask.v1.AgentTaskService at
 * POST /divergedev.agenttask.v1.AgentTaskService/<Method>, Connect protocol, JSON and
 * binary protobuf. Every error is Connect error JSON with its HTTP status. The methods do
 * what the `diverge mcp` tools do through the task API, with the same validation
 * (store/: task_normalize_new, task_apply_merge_patch). */
#include <microhttpd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/log.h"
#include "common/money.h"
#include "server/api/connect/connect_pb.h"
#include "server/api/api_int.h"

#define DEFAULT_NS "default"
#define CT_JSON "application/json"
#define CT_PROTO "application/proto"
#define ANN_PREVIEW_URL "divergedev.com/preview-url"

/* Connect error codes and their HTTP statuses (an unknown method is 404, as a Connect
 * server's router answers a procedure it does not serve). */
static const struct {
    const char *code;
    int status;
} g_codes[] = {
    {"invalid_argument", 400}, {"failed_precondition", 400},
    {"unauthenticated", 401},  {"permission_denied", 403},
    {"not_found", 404},        {"already_exists", 409},
    {"aborted", 409},          {"unimplemented", 501},
    {"internal", 500},         {"unavailable", 503},
    {"unknown", 500},
};

static int connect_error(struct request *r, const char *code, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int connect_error(struct request *r, const char *code, int status, const char *fmt, ...)
{
    char msg[ERR_MSG_MAX];
    va_list ap;

    va_start(ap, fmt);
    err_vformat(msg, fmt, ap);
    va_end(ap);
    if (status == 0) {
        status = 500;
        for (size_t i = 0; i < ARRAY_LEN(g_codes); i++) {
            if (strcmp(g_codes[i].code, code) == 0) {
                status = g_codes[i].status;
                break;
            }
        }
    }
    return http_send_json(r, status, json_pack("{s:s, s:s}", "code", code, "message", msg));
}

/* The Connect code of an error from the store and model layers. */
static const char *code_of(const struct err *err)
{
    switch (err->code) {
    case E_INVALID:
    case E_TOOBIG:
        return "invalid_argument";
    case E_NOTFOUND:
        return "not_found";
    case E_CONFLICT:
        return strstr(err->msg, "already exists") != NULL ? "already_exists" : "aborted";
    case E_DENIED:
        return "permission_denied";
    case E_AGAIN:
        return "unavailable";
    default:
        return "internal";
    }
}

static int send_err(struct request *r, const struct err *err)
{
    const char *code = code_of(err);

    if (strcmp(code, "internal") == 0) {
        log_kv(LOG_ERROR, "internal_error", "path", r->url, "error", err->msg, NULL);
    }
    return connect_error(r, code, 0, "%s", err->msg);
}

static int send_bytes(struct request *r, int status, const char *ct, const void *data, size_t len)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, (void *)(uintptr_t)data, MHD_RESPMEM_MUST_COPY);
    enum MHD_Result ret;

    if (resp == NULL) {
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ct);
    http_guard_answering(r->conn);
    r->status = status;
    ret = MHD_queue_response(r->conn, (unsigned int)status, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* --- task <-> messages ------------------------------------------------------------- */

static void copy_string(json_t *dst, const char *key, const json_t *src, const char *from)
{
    const json_t *v = json_object_get(src, from);

    if (json_is_string(v) && json_string_length(v) > 0) {
        json_object_set_new(dst, key, json_string(json_string_value(v)));
    }
}

static void copy_int(json_t *dst, const char *key, const json_t *src)
{
    const json_t *v = json_object_get(src, key);

    if (json_is_integer(v)) {
        json_object_set_new(dst, key, json_integer(json_integer_value(v)));
    }
}

/* The canonical Task message of the stored AgentTask OBJ (new object). */
static json_t *task_msg(const json_t *obj)
{
    const json_t *md = json_object_get(obj, "metadata");
    const json_t *ann = json_object_get(md, "annotations");
    const json_t *spec = json_object_get(obj, "spec");
    const json_t *st = json_object_get(obj, "status");
    const json_t *repo = json_object_get(spec, "repository");
    json_t *t = json_object(), *r = json_object();
    static const char *const md_keys[] = {"name", "namespace", "resourceVersion"};
    static const char *const st_keys[] = {
        "phase", "reason", "message", "costUSD", "previewUrl", "forecastUSD", "effectiveBudgetUSD"};
    static const char *const repo_keys[] = {"url", "baseBranch", "workingBranch"};

    for (size_t i = 0; i < ARRAY_LEN(md_keys); i++) {
        copy_string(t, md_keys[i], md, md_keys[i]);
    }
    copy_string(t, "objective", spec, "objective");
    copy_string(t, "budgetUSD", spec, "budgetUSD");
    copy_int(t, "maxIterations", spec);
    copy_int(t, "budgetTokens", spec);
    json_object_set_new(t, "suspended",
                        json_boolean(json_is_true(json_object_get(spec, "suspended"))));
    for (size_t i = 0; i < ARRAY_LEN(st_keys); i++) {
        copy_string(t, st_keys[i], st, st_keys[i]);
    }
    copy_int(t, "iteration", st);
    copy_int(t, "tokensConsumed", st);
    copy_int(t, "effectiveBudgetTokens", st);
    copy_int(t, "effectiveMaxIterations", st);
    if (json_object_get(t, "previewUrl") == NULL) {
        copy_string(t, "previewUrl", ann, ANN_PREVIEW_URL);
    }
    copy_string(t, "guidance", ann, TASK_ANN_GUIDANCE);
    for (size_t i = 0; i < ARRAY_LEN(repo_keys); i++) {
        copy_string(r, repo_keys[i], repo, repo_keys[i]);
    }
    json_object_set_new(t, "repository", r);
    return t;
}

/* {"task": Task} of the stored OBJ (borrowed). */
static json_t *task_resp(const json_t *obj)
{
    return json_pack("{s:o}", "task", task_msg(obj));
}

static const char *str_of(const json_t *req, const char *key)
{
    const char *s = json_string_value(json_object_get(req, key));
    return s != NULL ? s : "";
}

/* The namespace (default "default") and, when NAME_OUT is not NULL, the required name of
 * REQ; both must be DNS labels. */
static int req_target(const char **ns_out, const char **name_out, const json_t *req,
                      struct err *err)
{
    const char *ns = str_of(req, "namespace");

    *ns_out = ns[0] != '\0' ? ns : DEFAULT_NS;
    if (!task_name_valid(*ns_out)) {
        return err_set_field(err, E_INVALID, "namespace",
                             "namespace: must be a DNS label ([a-z0-9]([-a-z0-9]*[a-z0-9])?, at "
                             "most 63 characters)");
    }
    if (name_out == NULL) {
        return E_OK;
    }
    *name_out = str_of(req, "name");
    if ((*name_out)[0] == '\0') {
        return err_set_field(err, E_INVALID, "name", "name: required");
    }
    if (!task_name_valid(*name_out)) {
        return err_set_field(err, E_INVALID, "name",
                             "name: must be a DNS label ([a-z0-9]([-a-z0-9]*[a-z0-9])?, at most "
                             "63 characters)");
    }
    return E_OK;
}

static void log_change(const char *what, const json_t *obj)
{
    const json_t *md = json_object_get(obj, "metadata");

    log_kv(LOG_INFO, "task_changed", "change", what, "via", "connect", "namespace",
           json_string_value(json_object_get(md, "namespace")), "name",
           json_string_value(json_object_get(md, "name")), "resourceVersion",
           json_string_value(json_object_get(md, "resourceVersion")), NULL);
}

/* --- the methods ------------------------------------------------------------------- */

typedef int (*method_fn)(json_t **resp_out, struct server *srv, const json_t *req, struct err *err);

static int m_create(json_t **resp_out, struct server *srv, const json_t *req, struct err *err)
{
    const json_t *repo = json_object_get(req, "repository");
    json_t *task, *spec, *obj = NULL, *stored = NULL, *r = json_object();
    static const char *const repo_keys[] = {"url", "baseBranch", "workingBranch"};
    static const char *const counts[] = {"budgetTokens", "maxIterations"};
    const char *ns;
    int rc = req_target(&ns, NULL, req, err);

    if (rc != E_OK) {
        json_decref(r);
        return rc;
    }
    /* The AgentTask the MCP tool would POST; the model checks and defaults it. */
    task = json_pack("{s:s, s:s, s:{s:s, s:s}, s:{s:s}}", "apiVersion", TASK_API_VERSION, "kind",
                     TASK_KIND, "metadata", "name", str_of(req, "name"), "namespace", ns, "spec",
                     "objective", str_of(req, "objective"));
    spec = json_object_get(task, "spec");
    if (str_of(req, "budgetUSD")[0] != '\0') {
        json_object_set_new(spec, "budgetUSD", json_string(str_of(req, "budgetUSD")));
    }
    for (size_t i = 0; i < ARRAY_LEN(counts); i++) {
        copy_int(spec, counts[i], req);
    }
    for (size_t i = 0; i < ARRAY_LEN(repo_keys); i++) {
        copy_string(r, repo_keys[i], repo, repo_keys[i]);
    }
    json_object_set_new(spec, "repository", r);
    rc = task_normalize_new(&obj, task, ns, err);
    if (rc == E_OK) {
        rc = api_task_repo_check(srv->cfg.data_dir, obj, err);
    }
    if (rc == E_OK) {
        rc = task_store_create(&stored, srv->store, obj, err);
    }
    if (rc == E_OK) {
        log_change("created", stored);
        *resp_out = task_resp(stored);
    }
    json_decref(task);
    json_decref(obj);
    json_decref(stored);
    return rc;
}

static int m_get(json_t **resp_out, struct server *srv, const json_t *req, struct err *err)
{
    const char *ns, *name;
    json_t *obj = NULL;
    int rc = req_target(&ns, &name, req, err);

    if (rc == E_OK) {
        rc = task_store_get(&obj, srv->store, ns, name, err);
    }
    if (rc == E_OK) {
        *resp_out = task_resp(obj);
    }
    json_decref(obj);
    return rc;
}

static int m_list(json_t **resp_out, struct server *srv, const json_t *req, struct err *err)
{
    bool all = json_is_true(json_object_get(req, "allNamespaces"));
    json_t *items = NULL, *tasks, *item;
    int64_t rv = 0;
    const char *ns;
    size_t i;
    int rc = req_target(&ns, NULL, req, err);

    if (rc == E_OK) {
        rc = task_store_list(&items, &rv, srv->store, all ? NULL : ns, err);
    }
    if (rc != E_OK) {
        return rc;
    }
    tasks = json_array();
    json_array_foreach(items, i, item)
    {
        json_array_append_new(tasks, task_msg(item));
    }
    json_decref(items);
    *resp_out = json_pack("{s:o}", "tasks", tasks);
    return E_OK;
}

/* A change made through the task API's merge patch, inside one store transaction. */
struct change {
    struct server *srv; /* borrowed */
    const json_t *req;  /* borrowed */
    json_t *patch;      /* owned; NULL: built by the callback (resume) */
};

static int apply_change(json_t *doc, struct err *err, void *userdata)
{
    struct change *c = userdata;
    return task_apply_merge_patch(doc, c->patch, TASK_PATCH_MAIN, err);
}

static int run_change(json_t **resp_out, struct server *srv, const json_t *req, task_mutate_fn fn,
                      struct change *c, const char *what, struct err *err)
{
    const char *ns, *name;
    json_t *stored = NULL;
    int rc = req_target(&ns, &name, req, err);

    if (rc == E_OK) {
        rc = task_store_mutate(&stored, srv->store, ns, name, fn, c, err);
    }
    if (rc == E_OK) {
        log_change(what, stored);
        *resp_out = task_resp(stored);
    }
    json_decref(stored);
    json_decref(c->patch);
    return rc;
}

static int m_guide(json_t **resp_out, struct server *srv, const json_t *req, struct err *err)
{
    const char *hint = str_of(req, "guidance");
    /* In a merge patch null deletes the key: an empty hint clears the guidance. */
    struct change c = {
        .srv = srv,
        .req = req,
        .patch = json_pack("{s:{s:{s:o}}}", "metadata", "annotations", TASK_ANN_GUIDANCE,
                           hint[0] != '\0' ? json_string(hint) : json_null()),
    };

    return run_change(resp_out, srv, req, apply_change, &c,
                      hint[0] != '\0' ? "guidance set" : "guidance cleared", err);
}

static int m_pause(json_t **resp_out, struct server *srv, const json_t *req, struct err *err)
{
    struct change c = {
        .srv = srv, .req = req, .patch = json_pack("{s:{s:b}}", "spec", "suspended", 1)};

    return run_change(resp_out, srv, req, apply_change, &c, "paused", err);
}

/* Resume: the bumps are added to the effective budgets (the spec value, else the
 * server's default) read in the same transaction that writes them. */
static int apply_resume(json_t *doc, struct err *err, void *userdata)
{
    struct change *c = userdata;
    const char *budget = str_of(c->req, "budget");
    const json_t *tokens = json_object_get(c->req, "tokens");
    json_t *spec;
    struct task_view v;
    char money[MONEY_STR_MAX];
    int64_t bump = 0, sum = 0;
    int rc;

    task_view_of(&v, doc);
    if (v.phase == TASK_COMPLETED || v.phase == TASK_FAILED) {
        /* SPEC §14: nothing to resume; a new run raises spec.run. */
        return err_set(err, E_INVALID,
                       "task %s is finished (%s): there is nothing to resume; raise spec.run "
                       "(`diverge task rerun`) to start a new run",
                       v.name, task_phase_name(v.phase));
    }
    c->patch = json_pack("{s:{s:b}}", "spec", "suspended", 0);
    spec = json_object_get(c->patch, "spec");
    if (budget[0] != '\0') {
        struct err perr = {0};
        if (money_parse(&bump, NULL, budget, &perr) != E_OK) {
            return err_set_field(err, E_INVALID, "budget",
                                 "budget: %s (expected USD to add, such as \"+15.00\")", perr.msg);
        }
        rc = money_add(&sum, v.budget_usd > 0 ? v.budget_usd : c->srv->default_budget_usd, bump,
                       err);
        if (rc != E_OK) {
            return rc;
        }
        money_format(money, sum);
        json_object_set_new(spec, "budgetUSD", json_string(money));
    }
    if (tokens != NULL) {
        if (json_integer_value(tokens) < 0) {
            return err_set_field(err, E_INVALID, "tokens", "tokens: must not be negative");
        }
        rc = money_add(&sum, v.budget_tokens > 0 ? v.budget_tokens : c->srv->default_budget_tokens,
                       json_integer_value(tokens), err);
        if (rc != E_OK) {
            return err_set_field(err, E_INVALID, "tokens", "tokens: the sum is too large");
        }
        json_object_set_new(spec, "budgetTokens", json_integer(sum));
    }
    return task_apply_merge_patch(doc, c->patch, TASK_PATCH_MAIN, err);
}

static int resume_change(json_t *doc, struct err *err, void *userdata)
{
    struct change *c = userdata;

    /* The store may call this again after a retried transaction: start afresh. */
    json_decref(c->patch);
    c->patch = NULL;
    return apply_resume(doc, err, c);
}

static int m_resume(json_t **resp_out, struct server *srv, const json_t *req, struct err *err)
{
    struct change c = {.srv = srv, .req = req, .patch = NULL};

    return run_change(resp_out, srv, req, resume_change, &c, "resumed", err);
}

struct method {
    const char *name;
    const struct pb_message *req;
    const struct pb_message *resp;
    method_fn fn;
};

static const struct method g_methods[] = {
    {"CreateTask", &connect_msg_create_req, &connect_msg_task_resp, m_create},
    {"GetTask", &connect_msg_get_req, &connect_msg_task_resp, m_get},
    {"ListTasks", &connect_msg_list_req, &connect_msg_list_resp, m_list},
    {"GuideTask", &connect_msg_guide_req, &connect_msg_task_resp, m_guide},
    {"PauseTask", &connect_msg_pause_req, &connect_msg_task_resp, m_pause},
    {"ResumeTask", &connect_msg_resume_req, &connect_msg_task_resp, m_resume},
};

/* --- the protocol ------------------------------------------------------------------ */

static const struct method *method_of(const struct request *r)
{
    for (size_t i = 0; r->params[0] != NULL && i < ARRAY_LEN(g_methods); i++) {
        if (strcmp(g_methods[i].name, r->params[0]) == 0) {
            return &g_methods[i];
        }
    }
    return NULL;
}

/* 1: application/json (charset utf-8 allowed), 2: application/proto, 0: anything else. */
static int codec_of(struct request *r)
{
    const char *ct = http_header(r, MHD_HTTP_HEADER_CONTENT_TYPE);
    size_t n;

    if (ct == NULL) {
        return 0;
    }
    n = strcspn(ct, ";");
    while (n > 0 && (ct[n - 1] == ' ' || ct[n - 1] == '\t')) {
        n--;
    }
    if (n == strlen(CT_PROTO) && strncasecmp(ct, CT_PROTO, n) == 0 &&
        ct[strcspn(ct, ";")] == '\0') {
        return 2;
    }
    if (n == strlen(CT_JSON) && strncasecmp(ct, CT_JSON, n) == 0) {
        const char *param = ct + strcspn(ct, ";");
        if (*param == '\0') {
            return 1;
        }
        param++;
        param += strspn(param, " \t");
        return strcasecmp(param, "charset=utf-8") == 0 ? 1 : 0;
    }
    return 0;
}

/* The checks of the headers. They run once the body is in, not before: an answer sent
 * while a client is still sending its body makes the server close the connection, and
 * clients that write the whole body first (connect-node) then see a broken pipe instead
 * of the error. The body is capped at SERVER_BODY_MAX all the same. Returns false when
 * the request may go on, else true with *ret_out the MHD result of the error sent. */
static bool refused(int *ret_out, struct request *r)
{
    const char *v;

    if (!http_admin_ok(r)) {
        *ret_out = connect_error(r, "unauthenticated", 0, "missing or wrong admin bearer token");
    } else if (method_of(r) == NULL) {
        /* The method name is request bytes: not echoed. */
        *ret_out = connect_error(r, "unimplemented", 404,
                                 "no such method in divergedev.agenttask.v1.AgentTaskService");
    } else if (codec_of(r) == 0) {
        *ret_out = connect_error(r, "unknown", 415,
                                 "unsupported content type: use application/json or "
                                 "application/proto");
    } else if ((v = http_header(r, "Connect-Protocol-Version")) != NULL && strcmp(v, "1") != 0) {
        *ret_out = connect_error(r, "invalid_argument", 0, "connect-protocol-version must be 1");
    } else if ((v = http_header(r, MHD_HTTP_HEADER_CONTENT_ENCODING)) != NULL &&
               strcasecmp(v, "identity") != 0) {
        *ret_out = connect_error(r, "unimplemented", 0,
                                 "request compression is not supported: send identity");
    } else {
        return false;
    }
    return true;
}

static int decode_request(json_t **out, struct request *r, const struct pb_message *msg, bool json,
                          struct err *err)
{
    json_error_t jerr;
    json_t *in;
    int rc;

    *out = NULL;
    if (!json) {
        return pb_decode(out, msg, r->body.data, r->body.len, err);
    }
    if (r->body.len == 0) {
        return err_set(err, E_INVALID, "the request body is empty: send a JSON object");
    }
    in = json_loadb(r->body.data, r->body.len, JSON_REJECT_DUPLICATES, &jerr);
    if (in == NULL) {
        /* jansson's text may quote the input: only the position is reported. */
        return err_set(err, E_INVALID, "invalid JSON at line %d column %d", jerr.line, jerr.column);
    }
    rc = pb_json_read(out, msg, in, err);
    json_decref(in);
    return rc;
}

int api_connect(struct request *r)
{
    const struct method *m = method_of(r);
    bool json = codec_of(r) == 1;
    json_t *req = NULL, *resp = NULL;
    struct err err = {0};
    struct buf out;
    int ret;

    if (refused(&ret, r)) {
        return ret;
    }
    if (decode_request(&req, r, m->req, json, &err) != E_OK) {
        return connect_error(r, "invalid_argument", 0, "%s", err.msg);
    }
    if (m->fn(&resp, r->srv, req, &err) != E_OK) {
        json_decref(req);
        return send_err(r, &err);
    }
    json_decref(req);
    if (json) {
        json_t *w = pb_json_write(m->resp, resp);
        json_decref(resp);
        return http_send_json(r, 200, w);
    }
    buf_init(&out, 0);
    if (pb_encode(&out, m->resp, resp, &err) != E_OK) {
        ret = send_err(r, &err);
    } else {
        ret = send_bytes(r, 200, CT_PROTO, out.data != NULL ? out.data : "", out.len);
    }
    buf_cleanup(&out);
    json_decref(resp);
    return ret;
}
