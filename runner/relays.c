/* SPDX-License-Identifier: Apache-2.0 */
/* The runner's loopback listeners inside the sandbox, each on a thread of its own until
 * the runner exits: the egress relay (`proxy` mode, 127.0.0.1:3128) and the LLM relay
 * (127.0.0.1:3129, SPEC §13). Both are egress_listener underneath. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "egress/egress.h"
#include "runner/runner_int.h"

#define METER_PATH "/api/v1/agenttask/meter"

/* A started listener: how to stop and free it. */
struct relay_thread {
    const char *what;             /* for log lines */
    struct egress_listener *l;    /* owned */
    struct runner_llm_relay *llm; /* owned for the LLM relay, else NULL */
    pthread_t thread;
};

static struct relay_thread g_relays[2];
static size_t g_nrelays;

static void *relay_main(void *arg)
{
    struct relay_thread *t = arg;
    struct err err = {0};

    if (egress_listener_run(t->l, &err) != E_OK) {
        runner_say("%s: %s", t->what, err.msg);
    }
    return NULL;
}

static void llm_relay_free(struct runner_llm_relay *r)
{
    if (r != NULL) {
        free(r->base);
        free(r);
    }
}

/* Runs L on a thread of its own (taking ownership of L and LLM). */
static int start(const char *what, struct egress_listener *l, struct runner_llm_relay *llm,
                 struct err *err)
{
    struct relay_thread *t;

    ASSERT(g_nrelays < ARRAY_LEN(g_relays));
    t = &g_relays[g_nrelays];
    t->what = what;
    t->l = l;
    t->llm = llm;
    if (pthread_create(&t->thread, NULL, relay_main, t) != 0) {
        egress_listener_free(l);
        llm_relay_free(llm);
        return err_set(err, E_FAIL, "cannot start the %s thread", what);
    }
    g_nrelays++;
    return E_OK;
}

int runner_egress_relay_start(const struct runner_config *cfg, struct err *err)
{
    struct egress_listener *l = NULL;
    int rc;

    if (strcmp(cfg->network, "proxy") != 0) {
        return E_OK;
    }
    if (strlen(cfg->egress_socket) >= EGRESS_RELAY_SOCKET_MAX) {
        return err_set(err, E_INVALID, "the egress proxy socket path is too long");
    }
    rc = egress_listener_open(&l, "127.0.0.1", EGRESS_RELAY_PORT, EGRESS_RELAY_CONNS_MAX,
                              egress_relay_conn, (void *)(uintptr_t)cfg->egress_socket, err);
    if (rc == E_OK) {
        rc = start("egress relay", l, NULL, err);
    }
    if (rc == E_OK) {
        runner_say("network proxy: relaying 127.0.0.1:%u to the server's egress proxy",
                   (unsigned)EGRESS_RELAY_PORT);
    }
    return rc;
}

char *runner_llm_url_base(const char *meter_url)
{
    size_t n = meter_url != NULL ? strlen(meter_url) : 0, m = strlen(METER_PATH);

    if (n <= m || strcmp(meter_url + n - m, METER_PATH) != 0 ||
        (strncmp(meter_url, "http://", 7) != 0 && strncmp(meter_url, "https://", 8) != 0)) {
        return NULL;
    }
    return xstrndup(meter_url, n - m);
}

int runner_llm_relay_start(uint16_t *port_out, const struct runner_config *cfg, struct err *err)
{
    struct runner_llm_relay *r = xcalloc(1, sizeof(*r));
    struct egress_listener *l = NULL;
    int rc;

    *port_out = 0;
    r->cfg = cfg;
    r->unix_socket = cfg->meter_socket;
    r->base = cfg->meter_socket != NULL ? xstrdup("http://localhost")
                                        : runner_llm_url_base(cfg->meter_url);
    if (r->base == NULL) {
        runner_say("llm relay: not started: DIVERGE_METER_URL does not end in " METER_PATH);
        llm_relay_free(r);
        return E_OK;
    }
    rc = egress_listener_open(&l, "127.0.0.1", RUNNER_LLM_PORT, RUNNER_LLM_CONNS_MAX,
                              runner_llm_conn, r, err);
    if (rc == E_CONFLICT) {
        /* A process sandbox shares the host's loopback with other tasks: any free port
         * (the agent's variables name it). */
        rc =
            egress_listener_open(&l, "127.0.0.1", 0, RUNNER_LLM_CONNS_MAX, runner_llm_conn, r, err);
    }
    if (rc != E_OK) {
        llm_relay_free(r);
        return rc;
    }
    *port_out = egress_listener_port(l);
    rc = start("llm relay", l, r, err);
    if (rc != E_OK) {
        *port_out = 0;
        return rc;
    }
    runner_say("llm relay: 127.0.0.1:%u to the server's %s" RUNNER_LLM_PREFIX, (unsigned)*port_out,
               cfg->meter_socket != NULL ? "socket, " : "public URL, ");
    return E_OK;
}

void runner_relays_stop(void)
{
    for (size_t i = 0; i < g_nrelays; i++) {
        struct relay_thread *t = &g_relays[i];
        if (t->llm != NULL) {
            atomic_store(&t->llm->stopping, 1); /* cancels calls in flight */
        }
        egress_listener_stop(t->l);
    }
    for (size_t i = 0; i < g_nrelays; i++) {
        struct relay_thread *t = &g_relays[i];
        pthread_join(t->thread, NULL); /* every connection closed and joined */
        egress_listener_free(t->l);
        llm_relay_free(t->llm);
    }
    g_nrelays = 0;
}
