/* SPDX-License-Identifier: Apache-2.0 */
/* Test-only program: one Lease elector as its own process, so a test can SIGKILL the
 * holder (it stops renewing without a word) or SIGTERM it (it releases the lease).
 *   kube_elector KUBECONFIG LEASE IDENTITY DURATION_S
 * Prints "leader" / "follower" on every change and "stopped" after a SIGTERM release. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kube/kube.h"

static void say(const char *line)
{
    size_t n = strlen(line);

    /* one write per line, so a reader never sees half of one */
    if (write(1, line, n) != (ssize_t)n) {
        _exit(3);
    }
}

static void on_change(bool leader, void *userdata)
{
    (void)userdata;
    say(leader ? "leader\n" : "follower\n");
}

int main(int argc, char **argv)
{
    struct kube_lease_opts o = KUBE_LEASE_OPTS_DEFAULTS;
    struct kube_config *cfg = NULL;
    struct kube_client *c = NULL;
    struct kube_lease *l = NULL;
    struct err err = {0};
    sigset_t set;
    int sig = 0;

    if (argc != 5) {
        fprintf(stderr, "usage: kube_elector KUBECONFIG LEASE IDENTITY DURATION_S\n");
        return 2;
    }
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* before any thread starts */
    if (kube_config_load(&cfg, argv[1], &err) != E_OK || kube_client_new(&c, cfg, &err) != E_OK) {
        fprintf(stderr, "kube_elector: %s\n", err.msg);
        return 1;
    }
    o.ns = kube_config_namespace(kube_client_config(c));
    o.name = argv[2];
    o.identity = argv[3];
    o.duration_s = (int)strtol(argv[4], NULL, 10);
    o.renew_deadline_ms = (int64_t)o.duration_s * 2000 / 3; /* client-go: 10 s of 15 s */
    o.retry_ms = 200;
    o.on_change = on_change;
    if (kube_lease_start(&l, c, &o, &err) != E_OK) {
        fprintf(stderr, "kube_elector: %s\n", err.msg);
        kube_client_free(c);
        return 1;
    }
    sigwait(&set, &sig);
    kube_lease_stop(l, true);
    say("stopped\n");
    kube_client_free(c);
    return 0;
}
