/* SPDX-License-Identifier: Apache-2.0 */
/* Declarations shared by every part of server/ (http/, api/ and the serve wiring): the
 * limits, the configuration and the running server's state. Nothing here is a function:
 * each part declares its own in its header (http/http.h, api/api.h, serve_int.h). */
#ifndef DIVERGE_SERVER_SERVER_INT_H
#define DIVERGE_SERVER_SERVER_INT_H

#include <pthread.h>
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
/* libmicrohttpd's idle timeout on the TCP listener; DIVERGE_IDLE_TIMEOUT_S (seconds)
 * overrides it (undocumented: for tests). */
#define SERVER_IDLE_TIMEOUT_S 120
/* Descriptors the server wants (RLIMIT_NOFILE): a streamed LLM call holds four (the
 * client's connection, the upstream's, libcurl's wake-up pair), so every connection may
 * be one, plus the store, logs and task sockets. The soft limit is raised towards it at
 * start (many hosts and container runtimes default to a soft 1024 under a hard limit of
 * 524288 or more: about 250 concurrent streams). */
#define SERVER_NOFILE_WANT (4 * SERVER_CONN_HARD_MAX + 1024)
#define SERVER_NOFILE_RAISE_MAX 65536 /* never asks for more than this */
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
    char *sandbox_tools;         /* host folder bound read-only into sandboxes, or NULL */
    char *sandbox_allow_hosts;   /* egress rules, comma-joined (--sandbox-allow-host) */
    char *sandbox_memory, *sandbox_pids, *sandbox_cpus; /* per-sandbox limits */
    char *sandbox_warm_slots;                           /* local: warm sandboxes ("2") */
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
    char *max_running_tasks; /* sandboxes at once; NULL: the number of CPUs */
    char *push_wip;          /* "true": push a failed run's checkpoint as diverge/wip/<task> */
    char *stall_after;       /* --stall-after duration */
    char *no_progress_after; /* --no-progress-after count */
    char *llm_upstreams;     /* --llm-upstream NAME=URL, comma-joined; NULL: public APIs */
    char *llm_key_files;     /* --llm-key-file NAME=PATH, comma-joined */
    char *llm_prices;        /* --llm-prices FILE; NULL: the built-in table */
};

/* The one-click GitHub App's files in the data dir (mode 0600), used when the flags are
 * absent. */
#define SERVER_GH_APP_ID_FILE "github-app-id"
#define SERVER_GH_APP_KEY_FILE "github-app-key.pem"
#define SERVER_GH_SECRET_FILE "github-webhook-secret"

struct serve_kube;  /* serve_kube.c */
struct github_auth; /* scm/github/github_auth.h */
struct gh_setup;    /* server/api/setup/: the pending one-click setups */
struct llm_gateway; /* server/api/llm/llm.h */
struct http_routes; /* server/http/http.h */

struct MHD_Daemon;

struct server {
    struct server_config cfg;
    struct task_store *store;      /* owned */
    char *api_token;               /* owned; wiped on exit */
    struct ui_sessions *sessions;  /* owned; dashboard logins */
    unsigned char root_key[32];    /* macaroon root key; wiped on exit */
    char *base_url;                /* owned; public base URL */
    struct meter_service *meter;   /* owned */
    struct llm_gateway *llm;       /* owned: the LLM gateway (SPEC §13) */
    struct controller *controller; /* owned */
    struct scm_registry scm;       /* owned providers */
    struct scm_outbox *outbox;     /* owned */
    struct bot *bot;               /* owned */
    struct scm_notifier *notifier; /* owned */
    int64_t default_budget_usd;    /* micro-dollars, parsed from the config */
    int64_t default_budget_tokens;
    int64_t default_max_iterations;
    int data_lock_fd;       /* <data-dir>/serve.lock, locked for the server's life; -1 */
    enum scm_level min_fix; /* permission tiers of the bot */
    enum scm_level min_budget;
    enum scm_level gitlab_min_fix; /* GitLab's tiers */
    enum scm_level gitlab_min_budget;
    int64_t notifier_min_interval_ms;
    int64_t sandbox_memory;         /* bytes, 0: none */
    int64_t sandbox_pids;           /* 0: none */
    int64_t sandbox_warm_slots;     /* local: warm sandboxes at most, 0: none */
    int64_t sandbox_cpus_milli;     /* 1000 = one CPU, 0: none */
    int64_t git_push_max;           /* bytes of a git receive-pack body (--git-push-max) */
    int64_t sandbox_disk;           /* bytes, 0: none */
    int64_t data_dir_reserve;       /* bytes, 0: none */
    int64_t max_push_bytes;         /* bytes, 0: none */
    int64_t max_running_tasks;      /* sandboxes at once (SPEC §14), 0: no limit */
    int64_t stall_after_ms;         /* --stall-after, 0: never */
    int64_t no_progress_after;      /* --no-progress-after, 0: never */
    atomic_bool shutting_down;      /* set on SIGTERM: watch streams end */
    atomic_bool started;            /* every listener and worker is up: /readyz may say ok */
    struct http_guard *guard;       /* owned by http_start/http_stop */
    struct MHD_Daemon *daemon;      /* owned; the running HTTP server */
    struct MHD_Daemon *unix_daemon; /* owned; the same on the meter socket, or NULL */
    char *meter_socket;             /* owned: its path, or NULL */
    struct MHD_Daemon *tls_daemon;  /* owned; the same routes over HTTPS, or NULL */
    char *tls_url;                  /* owned; https://<bound tls address>, or NULL */
    struct tlscert tls_pem;         /* owned; kept while tls_daemon runs */
    struct serve_kube *kube;        /* owned; --store kubernetes: the Lease and leader's workers */
    const struct http_routes *routes; /* borrowed (static): what the daemons serve */
    /* GitHub credentials, which the one-click App setup may change while serving. */
    pthread_mutex_t gh_mu;       /* guards cfg.github_webhook_secret after start, the
                                  * files below and the registry's late github add */
    bool gh_mu_ready;            /* gh_mu is initialised */
    struct github_auth *gh_auth; /* one reference; none, a PAT or an App; shared by the
                                  * REST provider and the controller's git */
    bool gh_app_stored;          /* the App came from the data dir files, not flags */
    bool gh_secret_stored;       /* so did the webhook secret */
    struct gh_setup *gh_setup;   /* owned: pending setups (state values) */
};

#endif
