/* SPDX-License-Identifier: Apache-2.0 */
/* `diverge serve`: the HTTP server (task API, webhooks, meter, health, metrics) and the
 * wiring of store, workers and configuration. */
#ifndef DIVERGE_SERVER_SERVER_H
#define DIVERGE_SERVER_SERVER_H

/* Runs `diverge serve` with ARGV[0] == "serve" and the serve flags after it (SPEC §2).
 * Blocks until SIGTERM/SIGINT, then shuts down gracefully. Returns the process exit
 * code: 0 after a clean shutdown, 1 when start-up failed, 2 on a usage error. */
int server_main(int argc, char **argv);

#endif
