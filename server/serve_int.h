/* SPDX-License-Identifier: Apache-2.0 */
/* Declarations shared by the `serve` wiring (serve*.c): flags, the TLS listener, the
 * sandbox wiring and cluster mode, and the in-process server tests start. */
#ifndef DIVERGE_SERVER_SERVE_INT_H
#define DIVERGE_SERVER_SERVE_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "server/http/http.h"
#include "server/server_int.h"

/* --- in-process server (serve.c), for fuzzing and tests --- */
/* Parses ARGV like `diverge serve` (ARGV[0] is skipped), starts everything it runs and
 * returns at once; srv->cfg.listen then holds the bound address. Logging is left as it
 * is. E_INVALID for bad flags (printed on stderr). Stop with server_stop(). */
int server_start(struct server **out, int argc, char **argv, struct err *err);
void server_stop(struct server *srv);

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

/* --- GitHub credentials (serve_github.c) --- */
/* Initialises srv->gh_mu and the setup table, takes from the data dir what the GitHub
 * flags leave unset (the one-click App's github-app-id with github-app-key.pem, and
 * github-webhook-secret; each checked as a secret file: 0600, ours, no symbolic link)
 * and makes srv->gh_auth (none when there are no credentials). E_INVALID, E_DENIED,
 * E_FAIL with the fix in the message. */
int serve_github_open(struct server *srv, struct err *err);
/* Releases what serve_github_open made; safe after a failed or no open. */
void serve_github_close(struct server *srv);

/* --- sandbox wiring (serve_sandbox.c) --- */
/* Parses "2G"/"512M"/"1048576" (bytes) or, with MILLI, "1"/"0.5" CPUs into milli-CPUs;
 * prints the usage error and returns 2 when it cannot. */
int serve_parse_size(int64_t *out, const char *flag, const char *v, bool milli);
/* Makes srv->controller (threads not started yet). */
int serve_controller_new(struct server *srv, struct err *err);
/* As serve_controller_new, into *out (the cluster mode's leader makes its own). */
int serve_controller_make(struct controller **out, struct server *srv, struct err *err);

/* Opens the meter socket <data-dir>/sock/meter.sock and starts the controller's threads
 * with the meter URL of the bound listener (and, in cluster mode, the election:
 * serve_kube_elect_start). */
int serve_sandbox_start(struct server *srv, struct err *err);
/* Tells controller C every TCP listener of SRV (--listen and, when it runs, --tls-listen,
 * with their bound ports) as addresses egress proxies always refuse. E_INVALID / E_FAIL. */
int serve_egress_own(struct server *srv, struct controller *c, struct err *err);
/* Stops serving the meter socket and removes it. */
void serve_sandbox_stop(struct server *srv);

/* --- the SCM workers (serve.c) --- */
/* The SCM workers (outbox, bot, notifier) over srv->scm. */
int serve_scm_workers_start(struct server *srv, struct scm_outbox **outbox, struct bot **bot,
                            struct scm_notifier **notifier, struct err *err);

/* --- cluster mode (serve_kube.c): --store kubernetes ---------------------------------- */

/* How the leader makes and starts its workers: handed to serve_kube_open_store() by
 * serve.c (serve_controller_make, serve_egress_own, serve_scm_workers_start), so that the
 * election calls no other serve file. */
struct serve_kube_workers {
    int (*controller_make)(struct controller **out, struct server *srv, struct err *err);
    int (*egress_own)(struct server *srv, struct controller *c, struct err *err);
    int (*scm_start)(struct server *srv, struct scm_outbox **outbox, struct bot **bot,
                     struct scm_notifier **notifier, struct err *err);
};

/* Opens the Kubernetes store into srv->store (kubeconfig flag, $KUBECONFIG, in-cluster);
 * the leader's workers are made with W (copied). */
int serve_kube_open_store(struct server *srv, const struct serve_kube_workers *w, struct err *err);
/* The namespace of the Lease, token index and queues (borrowed). */
const char *serve_kube_namespace(const struct server *srv);
/* Starts Lease leader election: the controller and the bot, outbox and notifier workers run
 * on the leader only, started and stopped by one thread as leadership changes. */
int serve_kube_elect_start(struct server *srv, struct err *err);
/* Stops the leader's workers (waiting for their current step), then releases the Lease so
 * another replica takes over at once. NULL srv->kube is a no-op. */
void serve_kube_elect_stop(struct server *srv);

#endif
