/* SPDX-License-Identifier: Apache-2.0 */
/* A small Kubernetes API client: connection settings (in-cluster or kubeconfig), the
 * resource calls the cluster mode needs (get, list, watch, create, merge patch, replace,
 * status update, delete) and Lease leader election. Every byte from the API server is
 * hostile: bodies and watch events are capped and must be valid JSON objects. */
#ifndef DIVERGE_KUBE_KUBE_H
#define DIVERGE_KUBE_KUBE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/clock.h"
#include "common/err.h"

#define KUBE_BODY_MAX (16u << 20)  /* bytes of one response body (lists included) */
#define KUBE_EVENT_MAX (4u << 20)  /* bytes of one watch event line */
#define KUBE_CONFIG_MAX (1u << 20) /* bytes of a kubeconfig file */
#define KUBE_TOKEN_MAX (16u << 10) /* bytes of a bearer token (file) */
#define KUBE_CA_MAX (1u << 20)     /* bytes of CA certificates (file or data) */
#define KUBE_RV_MAX 64             /* bytes of a resourceVersion, NUL included */
#define KUBE_SA_DIR "/var/run/secrets/kubernetes.io/serviceaccount"

/* ---- configuration ---------------------------------------------------------------- */

/* Where the API server is and how to authenticate to it. Opaque; thread-safe. */
struct kube_config;

/* Loads the settings the way controller-runtime does: the kubeconfig at PATH when
 * non-NULL (the --kubeconfig flag), else the first file of $KUBECONFIG, else the in-cluster
 * service account when KUBERNETES_SERVICE_HOST is set, else ~/.kube/config. On success
 * *out is a new config the caller frees with kube_config_free(). Errors: E_NOTFOUND (no
 * configuration anywhere), E_INVALID (a file we cannot use; the message names the file and
 * the problem, e.g. an exec plugin), E_TOOBIG. */
int kube_config_load(struct kube_config **out, const char *path, struct err *err);

/* Parses the kubeconfig text DATA[0..len); NAME is used in messages and DIR resolves
 * relative file paths (certificate-authority, tokenFile) as kubectl does. Uses CONTEXT
 * when non-NULL, else current-context. Errors as kube_config_load. */
int kube_config_load_kubeconfig(struct kube_config **out, const char *name, const char *dir,
                                const char *data, size_t len, const char *context, struct err *err);

/* The in-cluster settings: token, ca.crt and namespace files in SA_DIR (KUBE_SA_DIR in a
 * pod) and the server https://HOST:PORT (from KUBERNETES_SERVICE_HOST/PORT). The token file
 * is re-read whenever it changes (kubelet rotates it). E_NOTFOUND when the token file is
 * missing, E_INVALID on a bad host or port. */
int kube_config_load_incluster(struct kube_config **out, const char *sa_dir, const char *host,
                               const char *port, struct err *err);

/* Releases CFG; NULL is a no-op. */
void kube_config_free(struct kube_config *cfg);

/* The server base URL ("https://10.96.0.1:443"), borrowed from CFG. */
const char *kube_config_server(const struct kube_config *cfg);

/* The default namespace (the context's, the service account's, else "default"). */
const char *kube_config_namespace(const struct kube_config *cfg);

/* The bearer token to send now, or NULL when there is none; a token file is re-read when
 * its modification time, size or inode changed since the last read. Caller frees *out with
 * free() after wiping it. E_FAIL when the token file cannot be read, E_TOOBIG when over
 * KUBE_TOKEN_MAX. */
int kube_config_token_dup(char **out, struct kube_config *cfg, struct err *err);

/* Decodes standard base64 with padding (whitespace skipped): *out a new NUL-terminated buffer
 * of *len_out bytes (Secret data). E_INVALID on anything else. */
int kube_base64_decode(char **out, size_t *len_out, const char *s);

/* ---- client ----------------------------------------------------------------------- */

/* A resource type: "" group is the core API (/api/v1). */
struct kube_resource {
    const char *group;   /* API group, "" for core */
    const char *version; /* "v1", "v1alpha1", ... */
    const char *plural;  /* URL path segment: "agenttasks" */
    const char *kind;    /* object kind: "AgentTask" */
};

extern const struct kube_resource KUBE_AGENTTASKS;    /* divergedev.com/v1alpha1 */
extern const struct kube_resource KUBE_ENVIRONMENTS;  /* divergedev.com/v1alpha1 */
extern const struct kube_resource KUBE_SPENDQUOTAS;   /* divergedev.com/v1alpha1 */
extern const struct kube_resource KUBE_SECRETS;       /* v1 */
extern const struct kube_resource KUBE_CONFIGMAPS;    /* v1 */
extern const struct kube_resource KUBE_EVENTS;        /* events.k8s.io/v1 */
extern const struct kube_resource KUBE_LEASES;        /* coordination.k8s.io/v1 */
extern const struct kube_resource KUBE_SANDBOXCLAIMS; /* extensions.agents.x-k8s.io/v1beta1 */
extern const struct kube_resource KUBE_SANDBOXES;     /* agents.x-k8s.io/v1beta1 */

struct kube_client;

/* A client over CFG, which it takes ownership of (also on failure). Caller frees with
 * kube_client_free(). Thread-safe: every call uses its own connection. */
int kube_client_new(struct kube_client **out, struct kube_config *cfg, struct err *err);
void kube_client_free(struct kube_client *c);
/* The client's configuration, borrowed. */
struct kube_config *kube_client_config(struct kube_client *c);

/* Every call below: *out (when there is one) is a new jansson object the caller releases
 * with json_decref(). Errors from a metav1.Status body become err->msg "<reason>: <message>"
 * (message escaped and cut). Codes: E_NOTFOUND (404), E_CONFLICT (409: AlreadyExists on
 * create, Conflict on a stale resourceVersion: re-read and retry), E_INVALID (400, 422),
 * E_DENIED (401, 403), E_TOOBIG (413, or a response over KUBE_BODY_MAX), E_AGAIN (network,
 * 429, 5xx, 410 Expired outside a watch), E_FAIL (anything else, or a malformed body). */

int kube_get(json_t **out, struct kube_client *c, const struct kube_resource *res, const char *ns,
             const char *name, struct err *err);

/* Lists RES in NS (NULL: every namespace), optionally filtered by LABEL_SELECTOR. *items_out
 * is the items array, *rv_out (KUBE_RV_MAX bytes) the list's resourceVersion to watch from. */
int kube_list(json_t **items_out, char rv_out[KUBE_RV_MAX], struct kube_client *c,
              const struct kube_resource *res, const char *ns, const char *label_selector,
              struct err *err);

int kube_create(json_t **out, struct kube_client *c, const struct kube_resource *res,
                const char *ns, const json_t *obj, struct err *err);

/* RFC 7386 merge patch of the main resource (metadata and spec). A metadata.resourceVersion
 * in PATCH makes it conditional (E_CONFLICT when stale). */
int kube_merge_patch(json_t **out, struct kube_client *c, const struct kube_resource *res,
                     const char *ns, const char *name, const json_t *patch, struct err *err);

/* PUT of the whole object OBJ (named by its metadata.name), guarded by its
 * metadata.resourceVersion: E_CONFLICT when stale. */
int kube_replace(json_t **out, struct kube_client *c, const struct kube_resource *res,
                 const char *ns, const json_t *obj, struct err *err);

/* PUT …/{name}/status: as kube_replace, for the status subresource (only status changes). */
int kube_update_status(json_t **out, struct kube_client *c, const struct kube_resource *res,
                       const char *ns, const json_t *obj, struct err *err);

/* Deletes NAME (propagationPolicy Background). With EXPECT_RV non-NULL only when the object
 * still has that resourceVersion (DeleteOptions.preconditions): else E_CONFLICT. */
int kube_delete(struct kube_client *c, const struct kube_resource *res, const char *ns,
                const char *name, const char *expect_rv, struct err *err);

/* ---- watch ------------------------------------------------------------------------ */

enum kube_event {
    KUBE_EVENT_ADDED,
    KUBE_EVENT_MODIFIED,
    KUBE_EVENT_DELETED,
    KUBE_EVENT_BOOKMARK, /* OBJ carries only metadata.resourceVersion */
};

/* Called for each event; OBJ is borrowed for the call. Returning non-zero stops the watch
 * (kube_watch then returns E_OK with KUBE_WATCH_STOPPED). */
typedef int (*kube_watch_fn)(enum kube_event type, const json_t *obj, void *userdata);

/* Why a watch ended without an error. */
enum kube_watch_end {
    KUBE_WATCH_CLOSED,  /* the server ended the stream: watch again from rv */
    KUBE_WATCH_GONE,    /* 410 Expired: rv is too old, list again and watch from the list */
    KUBE_WATCH_STOPPED, /* the callback asked to stop, or *cancel became non-zero */
};

struct kube_watch_opts {
    const char *label_selector; /* or NULL */
    long timeout_s;             /* server-side timeoutSeconds (the client drops the stream
                                   30 s later); 0: the server's default, no client limit */
    const atomic_int *cancel;   /* checked about once a second; non-zero stops; or NULL */
};

/* Watches RES in NS from the resourceVersion in RV (KUBE_RV_MAX bytes, updated in place
 * with every event and bookmark, so the caller resumes from it) with allowWatchBookmarks.
 * Sets *end_out when it returns E_OK. Errors as the calls above (a malformed event is
 * E_FAIL). */
int kube_watch(enum kube_watch_end *end_out, char rv[KUBE_RV_MAX], struct kube_client *c,
               const struct kube_resource *res, const char *ns, const struct kube_watch_opts *opts,
               kube_watch_fn fn, void *userdata, struct err *err);

/* ---- informer --------------------------------------------------------------------- */

/* Called on the informer's thread for every change; OBJ is borrowed for the call. After a
 * relist the differences to the cache arrive as ADDED/MODIFIED/DELETED (never BOOKMARK). */
typedef void (*kube_informer_fn)(enum kube_event type, const json_t *obj, void *userdata);

struct kube_informer_opts {
    const struct kube_resource *res; /* what to follow */
    const char *ns;                  /* namespace, or NULL for all */
    const char *label_selector;      /* or NULL */
    long watch_timeout_s;            /* timeoutSeconds of each watch; 0: the server's */
    int64_t retry_ms;                /* pause after a failed list or watch */
    kube_informer_fn on_event;       /* or NULL (read the cache only) */
    void *userdata;                  /* for on_event */
};

#define KUBE_INFORMER_OPTS_DEFAULTS                                                                \
    {                                                                                              \
        .res = NULL, .ns = NULL, .label_selector = NULL, .watch_timeout_s = 300, .retry_ms = 1000, \
        .on_event = NULL, .userdata = NULL                                                         \
    }

struct kube_informer;

/* Starts a thread that lists OPTS->res and watches from the list's resourceVersion, keeping
 * a cache: a closed watch resumes from the last resourceVersion, 410 Expired relists (the
 * differences become events), failures are retried after retry_ms. C is borrowed and must
 * outlive the informer; OPTS strings are copied. E_INVALID on bad options. */
int kube_informer_start(struct kube_informer **out, struct kube_client *c,
                        const struct kube_informer_opts *opts, struct err *err);
/* Whether the first list has completed. Thread-safe. */
bool kube_informer_synced(struct kube_informer *inf);
/* A copy of the cached object NS/NAME (new reference), or E_NOTFOUND. Thread-safe. */
int kube_informer_get(json_t **out, struct kube_informer *inf, const char *ns, const char *name);
/* A copy of every cached object (new array, unordered), the resourceVersion the cache is at
 * and (RELISTS_OUT may be NULL) how many lists were done so far. Thread-safe. */
json_t *kube_informer_list(char rv_out[KUBE_RV_MAX], int64_t *relists_out,
                           struct kube_informer *inf);
/* Stops the thread (an open watch is cancelled within about a second) and frees INF; NULL is
 * a no-op. */
void kube_informer_stop(struct kube_informer *inf);

/* ---- leader election -------------------------------------------------------------- */

/* What an elector should do next, from the Lease it read. */
enum kube_lease_action {
    KUBE_LEASE_CREATE,  /* no Lease: create it holding it */
    KUBE_LEASE_RENEW,   /* we hold it: bump renewTime */
    KUBE_LEASE_ACQUIRE, /* free (released or expired): take it, leaseTransitions + 1 */
    KUBE_LEASE_WAIT,    /* another holder's lease is still valid */
};

/* The pure decision: LEASE (NULL when absent) read at NOW_MS by IDENTITY. A Lease whose
 * holderIdentity is empty is free; one whose renewTime + leaseDurationSeconds is before
 * NOW_MS is expired. A malformed renewTime or duration counts as expired (nobody could be
 * relying on it). */
enum kube_lease_action kube_lease_decide(const json_t *lease, int64_t now_ms, const char *identity);

/* The Lease object to write for ACTION (CREATE, RENEW or ACQUIRE) given the read LEASE
 * (NULL for CREATE): keeps its resourceVersion so the write is conditional. New reference. */
json_t *kube_lease_build(enum kube_lease_action action, const json_t *lease, const char *ns,
                         const char *name, const char *identity, int64_t now_ms, int duration_s);

/* The release record client-go writes on a graceful stop: holderIdentity cleared,
 * leaseDurationSeconds 1, renewTime now; resourceVersion kept. New reference. */
json_t *kube_lease_build_release(const json_t *lease, int64_t now_ms);

/* Called on the elector's thread when leadership is gained (true) or lost (false). */
typedef void (*kube_lease_fn)(bool leader, void *userdata);

struct kube_lease_opts {
    const char *ns;            /* namespace of the Lease */
    const char *name;          /* Lease name */
    const char *identity;      /* this replica's holderIdentity (pod name, host+pid) */
    int duration_s;            /* leaseDurationSeconds written (client-go default 15) */
    int64_t renew_deadline_ms; /* a leader that cannot renew for this long steps down */
    int64_t retry_ms;          /* period between attempts */
    const struct clock *clock; /* wall clock for renewTime; NULL: clock_system() */
    kube_lease_fn on_change;   /* or NULL (poll kube_lease_is_leader) */
    void *userdata;            /* for on_change */
};

#define KUBE_LEASE_OPTS_DEFAULTS                                                                   \
    {                                                                                              \
        .ns = "default", .name = "diverge-leader", .identity = NULL, .duration_s = 15,             \
        .renew_deadline_ms = 10000, .retry_ms = 2000, .clock = NULL, .on_change = NULL,            \
        .userdata = NULL                                                                           \
    }

struct kube_lease;

/* Starts an elector thread on C (borrowed; must outlive the elector). OPTS strings are
 * copied. E_INVALID on bad options (empty identity, duration < 1, deadline >= duration,
 * retry >= deadline). Caller stops it with kube_lease_stop(). */
int kube_lease_start(struct kube_lease **out, struct kube_client *c,
                     const struct kube_lease_opts *opts, struct err *err);

/* Whether this elector currently leads. Thread-safe. */
bool kube_lease_is_leader(struct kube_lease *l);

/* Stops the elector, waits for its thread and frees it. With RELEASE, a leader writes the
 * release record so another replica takes over at once; without it the Lease is left to
 * expire (as when the process dies). NULL is a no-op. */
void kube_lease_stop(struct kube_lease *l, bool release);

#endif
