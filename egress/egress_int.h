/* SPDX-License-Identifier: Apache-2.0 */
/* Declarations shared inside egress/ only: the policy's storage, host:port helpers, and
 * the byte pump and listener helpers the proxy and the relay share. */
#ifndef DIVERGE_EGRESS_EGRESS_INT_H
#define DIVERGE_EGRESS_EGRESS_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "egress/egress.h"

struct egress_own {
    struct egress_addr addr;
    uint16_t port; /* 0: every port */
};

struct egress_policy {
    struct egress_rule *rules; /* owned, nrules of them */
    size_t nrules;
    struct egress_own *own; /* owned, nown of them */
    size_t nown;
};

bool egress_addr_equal(const struct egress_addr *a, const struct egress_addr *b);
/* The IPv4 address inside an IPv4-mapped IPv6 one, else A unchanged. */
struct egress_addr egress_addr_unmap(const struct egress_addr *a);

/* Parses a decimal port 1..65535 of N bytes (no sign, at most 5 digits). E_INVALID. */
int egress_port_parse(uint16_t *out, const char *s, size_t n);

/* Splits "host", "host:port", "[v6]" or "[v6]:port" (LEN bytes at S, not NUL-terminated):
 * *HOST, *HOST_LEN (brackets kept), *PORT, *PORT_LEN (NULL/0 when absent). E_INVALID for
 * more than one colon outside brackets or junk after "]". */
int egress_split_hostport(const char **host, size_t *host_len, const char **port, size_t *port_len,
                          const char *s, size_t len);

/* Writes PREFIX HOST :PORT, HOST in brackets when BRACKETS. */
void egress_hostport_format(char *out, size_t cap, const char *prefix, const char *host,
                            bool brackets, uint16_t port);

/* Copies bytes both ways between A and B (non-blocking afterwards) until both directions
 * reached end of file or an error, or STOP_FD becomes readable. Passes a half-close on
 * with shutdown(SHUT_WR). *A_TO_B / *B_TO_A count the bytes written. Closes neither fd.
 * PENDING/PENDING_LEN are bytes already read from A, written to B first. */
void egress_pump(int a, int b, int stop_fd, const char *pending, size_t pending_len,
                 uint64_t *a_to_b, uint64_t *b_to_a);

/* After accept() failed with ERRNO_: when descriptors or memory ran out, waits up to
 * 100 ms (or until STOP_FD is readable) so the accept loop does not spin; else returns. */
void egress_accept_backoff(int errno_, int stop_fd);

/* Sets O_NONBLOCK on FD. */
int egress_set_nonblock(int fd);

/* A fixed set of joinable worker threads: the owner starts a worker in a free slot and
 * reaps finished ones; stop joins them all. Guarded by its own mutex. */
struct egress_workers;

struct egress_workers *egress_workers_new(size_t max);
/* Starts FN(ARG) in a free slot (joining finished workers to make room), after storing
 * the slot index in *SLOT_FIELD (which lives in ARG). FN must call egress_workers_done(W,
 * slot) as its last act. E_AGAIN when every slot is busy, E_FAIL when the thread cannot
 * be created. */
int egress_workers_start(struct egress_workers *w, void *(*fn)(void *), void *arg,
                         size_t *slot_field);
/* Marks SLOT finished (called by the worker itself as its last act). */
void egress_workers_done(struct egress_workers *w, size_t slot);
/* Joins every finished worker. */
void egress_workers_reap(struct egress_workers *w);
/* Joins every worker (finished or not: the caller has told them to stop) and frees W. */
void egress_workers_free(struct egress_workers *w);

#endif
