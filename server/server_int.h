/* SPDX-License-Identifier: Apache-2.0 */
/* Declarations shared inside server/: the request context handlers see, the response
 * helpers, routes, metrics and the running server's state. */
#ifndef DIVERGE_SERVER_SERVER_INT_H
#define DIVERGE_SERVER_SERVER_INT_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/err.h"
#include "common/tlscert.h"
#include "bot/bot.h"
#include "controller/controller.h"
#include "scm/scm.h"
#include "meter/meter.h"
#include "store/store.h"

#define SERVER_BODY_MAX (1024u * 1024u)               /* API and meter bodies */
#define SERVER_WEBHOOK_BODY_MAX (25u * 1024u * 1024u) /* webhook deliveries */
#define SERVER_ROUTE_PARAMS 4
/* A client has this long to send a whole request (headers and body) on a connection,
 * counted from the connection's start or the end of its previous response. Answers being
 * sent (watch streams, logs) are not limited. DIVERGE_REQUEST_DEADLINE_MS overrides it
 * (undocumented: for tests). */
#define SERVER_REQUEST_DEADLINE_MS (30 * 1000)
/* ... and this long for the request head (request line and headers); an idle keep-alive
 * connection is closed after it too. DIVERGE_HEAD_DEADLINE_MS overrides it (tests). */
#define SERVER_HEAD_DEADLINE_MS (5 * 1000)
#define SERVER_CONN_MAX 1024           /* general connections (one thread each) */
#define SERVER_PER_IP_CONN_MAX 128     /* general connections from one client address */
#define SERVER_PER_PREFIX_CONN_MAX 256 /* ... from one IPv4 /24 or IPv6 /64 */
/* Connections over those limits that may still ask for /healthz, /readyz or the meter. */
#define SERVER_RESERVE_CONN_MAX 64
/* Connections in all, refused ones still closing included; libmicrohttpd's own limit is
 * above it, so that the listener never stops accepting. */
#define SERVER_CONN_HARD_MAX (SERVER_CONN_MAX + SERVER_RESERVE_CONN_MAX + 128)
#define SERVER_IDLE_TIMEOUT_S 120 /* libmicrohttpd's idle timeout */
/* A task's own meter socket (local and process sandboxes): the meter route only, few
 * connections (the runner and SDKs make one call at a time), an idle timeout instead of
 * the shared whole-request deadline. What one sandbox does there touches no other task. */
#define SERVER_TASK_METER_CONN_MAX 16
#define SERVER_UNIX_IDLE_TIMEOUT_S 30

struct server_config {
    char *listen;                 /* "host:port" */
    char *data_dir;               /* created 0700 when absent */
    char *public_url;             /* NULL: http://<bound listen address> */
    char *root_key_file;          /* NULL: <data-dir>/macaroon-root-key */
    char *api_token_file;         /* NULL: <data-dir>/api-token */
    char *store;                  /* "sqlite" */
    char *log_format;             /* "text" | "json"; NULL: text on a terminal */
    char *sandbox_provider;       /* local | process | none | agent-sandbox */
    char *default_budget_usd;     /* decimal dollars for tasks without spec.budgetUSD */
    char *default_budget_tokens;  /* tokens for tasks without spec.budgetTokens */
    char *default_max_iterations; /* for comment-made tasks */
    char *github_webhook_secret;  /* comma-separated; NULL: GitHub deliveries get 503 */
    char *github_api_url;         /* REST base */
    char *github_app_id;          /* GitHub App auth, with github_app_key_file */
    char *github_app_key_file;
    char *bot_login;         /* the bot's own login; NULL: asked from the API */
    char *namespace_;        /* namespace of comment-made tasks; NULL: per project */
    char *notifier_provider; /* github | gitlab | none; NULL: every one with creds */
    char *github_min_fix;    /* permission tiers */
    char *github_min_budget;
    char *notifier_min_interval; /* seconds between spend-only sticky edits */
    char *sandbox_user;          /* local sandboxes' host user; NULL: SPEC §2 default */
    char *sandbox_network;       /* none | proxy (SPEC §9 "Network") */
    char *sandbox_allow_hosts;   /* egress rules, comma-joined (--sandbox-allow-host) */
    char *sandbox_memory, *sandbox_pids, *sandbox_cpus; /* per-sandbox limits */
    char *git_push_max;                                 /* receive-pack body cap ("64M") */
    char *agent_cmd, *verify_cmd;                       /* the runner's commands; NULL: none */
    char *preview_base_url;      /* the preview router; NULL: no linked previews */
    char *gitlab_webhook_token;  /* expected X-Gitlab-Token(s), comma-separated */
    char *gitlab_signing_secret; /* Standard Webhooks whsec_<base64>, comma-separated */
    char *gitlab_url;            /* GitLab base URL (API under /api/v4) */
    char *gitlab_min_fix;        /* GitLab access levels of the tiers */
    char *gitlab_min_budget;
    char *tls_listen;    /* "host:port" of the HTTPS listener; NULL: none */
    char *tls_cert_file; /* PEM files; NULL: generated into the data dir */
    char *tls_key_file;
    char *kubeconfig;     /* --store kubernetes: kubeconfig path; NULL: $KUBECONFIG, in-cluster */
    char *kube_namespace; /* namespace of the Lease, token index and queues; NULL: the config's */
    char *lease_name;     /* the leader election Lease ("diverge-leader") */
    char *sandbox_warm_pool; /* agent-sandbox: the SandboxWarmPool claims name */
    char *leader_elect;      /* "true": take part in the election; "false": never lead */
    char *sandbox_disk;      /* bytes a task's files may take (local, process) */
    char *data_dir_reserve;  /* bytes kept free on the data dir's filesystem */
    char *max_push_bytes;    /* largest push to a repository */
};

struct serve_kube; /* serve_kube.c */

struct MHD_Daemon;

struct server {
    struct server_config cfg;
    struct task_store *store;      /* owned */
    char *api_token;               /* owned; wiped on exit */
    struct ui_sessions *sessions;  /* owned; dashboard logins */
    unsigned char root_key[32];    /* macaroon root key; wiped on exit */
    char *base_url;                /* owned; public base URL */
    struct meter_service *meter;   /* owned */
    struct controller *controller; /* owned */
    struct scm_registry scm;       /* owned providers */
    struct scm_outbox *outbox;     /* owned */
    struct bot *bot;               /* owned */
    struct scm_notifier *notifier; /* owned */
    int64_t default_budget_usd;    /* micro-dollars, parsed from the config */
    int64_t default_budget_tokens;
    int64_t default_max_iterations;
    enum scm_level min_fix; /* permission tiers of the bot */
    enum scm_level min_budget;
    enum scm_level gitlab_min_fix; /* GitLab's tiers */
    enum scm_level gitlab_min_budget;
    int64_t notifier_min_interval_ms;
    int64_t sandbox_memory;         /* bytes, 0: none */
    int64_t sandbox_pids;           /* 0: none */
    int64_t sandbox_cpus_milli;     /* 1000 = one CPU, 0: none */
    int64_t git_push_max;           /* bytes of a git receive-pack body (--git-push-max) */
    int64_t sandbox_disk;           /* bytes, 0: none */
    int64_t data_dir_reserve;       /* bytes, 0: none */
    int64_t max_push_bytes;         /* bytes, 0: none */
    atomic_bool shutting_down;      /* set on SIGTERM: watch streams end */
    struct http_guard *guard;       /* owned by http_start/http_stop */
    struct MHD_Daemon *daemon;      /* owned; the running HTTP server */
    struct MHD_Daemon *unix_daemon; /* owned; the same on the meter socket, or NULL */
    char *meter_socket;             /* owned: its path, or NULL */
    struct MHD_Daemon *tls_daemon;  /* owned; the same routes over HTTPS, or NULL */
    char *tls_url;                  /* owned; https://<bound tls address>, or NULL */
    struct tlscert tls_pem;         /* owned; kept while tls_daemon runs */
    struct serve_kube *kube;        /* owned; --store kubernetes: the Lease and leader's workers */
};

/* One HTTP request; lives from the first access-handler call to the completion callback. */
struct request {
    struct server *srv;                      /* borrowed */
    struct MHD_Connection *conn;             /* borrowed */
    const char *method;                      /* borrowed from MHD */
    const char *url;                         /* borrowed from MHD (path only) */
    struct buf body;                         /* capped request body */
    bool too_big;                            /* body went over its cap */
    size_t discarded;                        /* bytes of an oversized body thrown away */
    int route;                               /* index into the route table, -1 none */
    const char *params[SERVER_ROUTE_PARAMS]; /* path parameters, owned (param_store) */
    char *param_store;                       /* owned copy of the path, split */
    int64_t start_ns;                        /* monotonic start */
    int status;                              /* status sent, for logs and metrics */
    bool kube_errors;                        /* errors as metav1.Status (under /apis/) */
    struct github_webhook_mac *gh_mac;       /* owned; HMAC of the body as it arrives */
    /* A route's begin hook may spool the body to a file instead of BODY (git pushes):
     * http.c writes each piece there as it arrives, up to the route's cap. */
    size_t body_max;            /* the begin hook's body cap; 0: the route's */
    int body_fd;                /* owned; >= 0: the spool file; -1: none */
    size_t body_spooled;        /* bytes written to body_fd */
    bool body_failed;           /* writing the spool failed (answered 503) */
    void (*on_done)(void *arg); /* called once when the request ends (completion), or NULL */
    void *on_done_arg;
};

/* --- responses (http.c) --- each returns the MHD result of queueing. */
int http_send_json(struct request *r, int status, json_t *body); /* steals BODY */
int http_send_text(struct request *r, int status, const char *content_type, const char *text);
/* Sends the error body for CODE (an enum err_code or an HTTP status when >= 100). Under
 * /apis/ the body is a metav1.Status. */
int http_send_error(struct request *r, int status, const char *reason, const struct err *err,
                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Maps an enum err_code to the HTTP status (the one translation table). */
int http_status_of(int code);
/* Sends the error for an err from the store/model layers: status from http_status_of. */
int http_send_err(struct request *r, const struct err *err);
const char *http_query(struct request *r, const char *key);
/* True when the request carries the admin bearer token (compared in constant time). */
bool http_admin_ok(struct request *r);
/* True when TOKEN is the admin token (compared in constant time). */
bool http_admin_token_is(struct request *r, const char *token);
const char *http_header(struct request *r, const char *key);
/* How many request headers are named KEY (case-insensitive). */
int http_header_count(struct request *r, const char *key);
bool http_query_true(struct request *r, const char *key);
/* Parses the request body as JSON; on failure sends 400 and returns NULL. */
json_t *http_body_json(struct request *r, int *mhd_ret_out);
/* Starts a streaming chunked response; READ is called in the connection's thread and may
 * block. Returns the MHD result. */
typedef long (*http_stream_fn)(void *cls, uint64_t pos, char *buf, size_t max);
int http_send_stream(struct request *r, int status, const char *content_type, http_stream_fn read,
                     void *cls, void (*free_cls)(void *));

/* --- handlers (api_tasks.c, server.c) --- */
typedef int (*route_fn)(struct request *r);

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
int api_webhook_github(struct request *r);
/* Runs when the headers of a GitHub delivery are in, before any body byte is read:
 * answers 503/401/400 at once when no secret is configured or the signature or event
 * header is missing or malformed; else starts r->gh_mac and leaves r->status 0. */
int api_webhook_github_begin(struct request *r);
int api_webhook_gitlab(struct request *r);
/* Runs when the headers of a GitLab delivery are in: 503 when neither a token nor a
 * signing secret is configured, 401 at once when X-Gitlab-Token is wrong or neither it
 * nor a well-formed, fresh Standard Webhooks header set is there (api_webhooks_gitlab.c). */
int api_webhook_gitlab_begin(struct request *r);
int api_local_comment(struct request *r);
int api_local_thread(struct request *r);
int api_local_pull_put(struct request *r);
int api_local_pull_get(struct request *r);
int api_env_list(struct request *r);
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
/* POST /ui/logout: ends the cookie's session (api_ui.c). */
int api_ui_logout(struct request *r);
/* The admin token as a bearer header, or a live session id in the diverge_token cookie
 * (__Host-diverge_token over TLS) that /ui/login set. */
bool ui_auth_ok(struct request *r);
/* False when the request has an Origin header that is not http(s)://<its Host>. */
bool ui_same_origin(struct request *r);

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

/* --- metrics (metrics.c) --- */
void metrics_observe(int route, int status, int64_t duration_ns);
/* Renders the Prometheus text exposition into OUT. */
void metrics_render(struct buf *out, struct server *srv);

/* --- in-process server (serve.c), for fuzzing and tests --- */
/* Parses ARGV like `diverge serve` (ARGV[0] is skipped), starts everything it runs and
 * returns at once; srv->cfg.listen then holds the bound address. Logging is left as it
 * is. E_INVALID for bad flags (printed on stderr). Stop with server_stop(). */
int server_start(struct server **out, int argc, char **argv, struct err *err);
void server_stop(struct server *srv);

/* --- routing (http.c) --- */
/* Starts the HTTP daemon on SRV->cfg.listen; *port_out gets the bound port. */
int http_start(struct MHD_Daemon **out, uint16_t *port_out, struct server *srv, struct err *err);
void http_stop(struct MHD_Daemon *d, struct server *srv);
/* Serves the meter route, and nothing else (every other path is 404), on LISTEN_FD (a
 * listening unix socket, taken over) with at most CONN_MAX connections. With GUARDED the
 * whole-request deadline of a started http_start() applies (stop the daemon before
 * http_stop()); without it only the idle timeout (a daemon that may outlive the guard:
 * the per-task meter sockets). */
int http_start_unix(struct MHD_Daemon **out, struct server *srv, int listen_fd,
                    unsigned int conn_max, bool guarded, struct err *err);
void http_stop_unix(struct MHD_Daemon *d);
/* Serves every route over HTTPS on LISTEN ("host:port") with the PEM certificate and key;
 * *port_out gets the bound port. Needs the guard of a started http_start(); stop it with
 * http_stop_unix() before http_stop(). No HTTP/2 (no ALPN). */
int http_start_tls(struct MHD_Daemon **out, uint16_t *port_out, struct server *srv,
                   const char *listen, const char *cert_pem, const char *key_pem, struct err *err);

/* --- the TLS listener (serve_tls.c) --- */
/* With --tls-listen: loads or generates the certificate, starts the HTTPS daemon, sets
 * srv->tls_url and writes it with the certificate's path to <data-dir>/tls-endpoint (what
 * `diverge kubeconfig` reads). Without: removes a stale tls-endpoint. */
int serve_tls_start(struct server *srv, struct err *err);
void serve_tls_stop(struct server *srv);

/* Fills CFG from ARGV and the environment (flags win; SPEC §2). Returns 0, -1 after
 * --help (printed), or 2 on a usage error (said on stderr). */
int serve_parse_flags(struct server_config *cfg, int argc, char **argv);
/* Frees the strings serve_parse_flags() stored in CFG. */
void serve_config_cleanup(struct server_config *cfg);

/* --- sandbox wiring (serve_sandbox.c) --- */
/* Parses "2G"/"512M"/"1048576" (bytes) or, with MILLI, "1"/"0.5" CPUs into milli-CPUs;
 * prints the usage error and returns 2 when it cannot. */
int serve_parse_size(int64_t *out, const char *flag, const char *v, bool milli);
/* Makes srv->controller (threads not started yet). */
int serve_controller_new(struct server *srv, struct err *err);
/* As serve_controller_new, into *out (the cluster mode's leader makes its own). */
int serve_controller_make(struct controller **out, struct server *srv, struct err *err);

/* --- cluster mode (serve_kube.c): --store kubernetes ---------------------------------- */

/* Opens the Kubernetes store into srv->store (kubeconfig flag, $KUBECONFIG, in-cluster). */
int serve_kube_open_store(struct server *srv, struct err *err);
/* The namespace of the Lease, token index and queues (borrowed). */
const char *serve_kube_namespace(const struct server *srv);
/* Starts Lease leader election: the controller and the bot, outbox and notifier workers run
 * on the leader only, started and stopped by one thread as leadership changes. */
int serve_kube_elect_start(struct server *srv, struct err *err);
/* Stops the leader's workers (waiting for their current step), then releases the Lease so
 * another replica takes over at once. NULL srv->kube is a no-op. */
void serve_kube_elect_stop(struct server *srv);
/* The SCM workers (outbox, bot, notifier) over srv->scm (serve.c). */
int serve_scm_workers_start(struct server *srv, struct scm_outbox **outbox, struct bot **bot,
                            struct scm_notifier **notifier, struct err *err);
/* Opens the meter socket <data-dir>/sock/meter.sock and starts the controller's threads
 * with the meter URL of the bound listener. */
int serve_sandbox_start(struct server *srv, struct err *err);
/* Tells controller C every TCP listener of SRV (--listen and, when it runs, --tls-listen,
 * with their bound ports) as addresses egress proxies always refuse. E_INVALID / E_FAIL. */
int serve_egress_own(struct server *srv, struct controller *c, struct err *err);
/* Stops serving the meter socket and removes it. */
void serve_sandbox_stop(struct server *srv);

/* --- connection admission and deadlines (http_guard.c) --- */
struct MHD_Connection;
struct http_guard;
struct http_guard_limits {
    int64_t head_ms;    /* the request head must be in this long after the request began */
    int64_t request_ms; /* and the whole request */
    int conn_max;       /* general pool: connections in all */
    int per_addr_max;   /* ... from one client address */
    int per_prefix_max; /* ... from one IPv4 /24 or IPv6 /64 */
    int reserve_max;    /* reserve pool (health and meter routes only) */
    int hard_max;       /* TCP connections in all, refused ones still closing included */
};
#define HTTP_GUARD_LIMITS_DEFAULTS                                                                 \
    {                                                                                              \
        .head_ms = SERVER_HEAD_DEADLINE_MS, .request_ms = SERVER_REQUEST_DEADLINE_MS,              \
        .conn_max = SERVER_CONN_MAX, .per_addr_max = SERVER_PER_IP_CONN_MAX,                       \
        .per_prefix_max = SERVER_PER_PREFIX_CONN_MAX, .reserve_max = SERVER_RESERVE_CONN_MAX,      \
        .hard_max = SERVER_CONN_HARD_MAX,                                                          \
    }
/* Starts the reaper thread that shuts down connections past their deadline (LIM is
 * copied). Free with http_guard_free() after MHD_stop_daemon() of every daemon using it. */
int http_guard_new(struct http_guard **out, const struct http_guard_limits *lim, struct err *err);
void http_guard_free(struct http_guard *g);
/* The MHD_OPTION_NOTIFY_CONNECTION callback (CLS is the guard); CODE is an
 * enum MHD_ConnectionNotificationCode. A new TCP connection is admitted to the general or
 * the reserve pool, or refused (its socket shut down at once). */
void http_guard_notify(void *cls, struct MHD_Connection *conn, void **socket_context, int code);
/* The head of the request on CONN is in; RESERVED_ROUTE says whether it asks for a route
 * the reserve pool serves. False: the connection holds a reserve slot and the route is
 * another; the caller answers 503. */
bool http_guard_head(struct MHD_Connection *conn, bool reserved_route);
/* The request on CONN is complete: no deadline while it is answered. */
void http_guard_answering(struct MHD_Connection *conn);
/* The response on CONN ended: the next request's clock starts now. */
void http_guard_request_done(struct MHD_Connection *conn);
/* Connections shut down so far for missing a deadline. */
long long http_guard_reaped(struct http_guard *g);
/* Connections refused or pushed out of the reserve so far for being over the limits. */
long long http_guard_refused(struct http_guard *g);
/* Name of ROUTE for logs and metrics ("tasks.get"); "none" for -1. */
const char *http_route_name(int route);
int http_route_count(void);

#endif
