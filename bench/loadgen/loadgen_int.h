/* SPDX-License-Identifier: Apache-2.0 */
/* Declarations shared by the files of bench/loadgen: the options, the request template, the
 * per-thread connection state and the run clock. Nothing outside bench/loadgen includes it. */
#ifndef LOADGEN_INT_H
#define LOADGEN_INT_H

#define _GNU_SOURCE
#define OPENSSL_SUPPRESS_DEPRECATED /* SHA256_Init/Update/Final: the cheapest midstate copy */
#include <openssl/sha.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define RBUF 16384
#define HDR_ROOM 1024 /* request headers are written right-aligned before the body */

/* --- options (loadgen.c) ----------------------------------------------------------- */

struct options {
    const char *url;
    int connections, threads;
    double duration, warmup, timeout;
    uint64_t requests; /* 0: unlimited */
    const char *secret, *template_path, *mode, *body_text, *event;
    bool raw_get, bad_signature, full_hmac, gitlab;
    uint64_t id_base;
    bool id_base_set;
};

extern struct options opt;
extern char host_hdr[300], path[2048];
extern struct sockaddr_storage addr;
extern socklen_t addr_len;

void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
uint64_t now_ns(void);

/* --- template and signing (loadgen_template.c) -------------------------------------- */

extern char *tmpl;
extern size_t const_prefix;  /* bytes of the template before the first placeholder */
extern size_t body_max;      /* the longest body a request can have */
extern size_t mid_aligned;   /* template bytes already in the HMAC midstate */
extern char hdr_const[1024]; /* request line .. X-GitHub-Event */
extern size_t hdr_const_len;
extern char raw_req[2600];
extern size_t raw_req_len;
extern uint32_t nonce32;
extern uint16_t nonce16;

/* Lower-case hex of the 32 bytes D into OUT (64 characters, not terminated). */
void hex32(char out[64], const uint8_t d[32]);
/* Sets the comment text: TEXT JSON-escaped. */
void json_escape(const char *text);
/* Reads opt.template_path and splits it at its placeholders. */
void load_template(void);
/* The HMAC midstates for opt.secret (after load_template). */
void hmac_setup(void);

/* --- connections (loadgen_conn.c) ---------------------------------------------------- */

enum cstate { C_CONNECTING, C_WRITING, C_READING };
enum rstate {
    R_HDR,
    R_BODY_CL,
    R_CHUNK_SIZE,
    R_CHUNK_DATA,
    R_CHUNK_CRLF,
    R_TRAILER,
    R_UNTIL_CLOSE
};

struct stats {
    uint64_t done, bytes_out;
    uint64_t status[600];
    uint64_t e_connect, e_read, e_write, e_timeout, e_closed, e_parse, reconnects;
    uint64_t *lat; /* ns */
    size_t nlat, caplat;
};

struct worker;
struct conn {
    struct worker *w;
    int fd;
    enum cstate st;
    char *buf; /* HDR_ROOM + body_max */
    const char *wp;
    size_t wleft;
    uint64_t t0, seq;
    bool busy;
    char rbuf[RBUF];
    size_t rlen;
    enum rstate rs;
    uint64_t remaining;
    int status;
    bool close_after;
};

struct worker {
    pthread_t th;
    int idx, epfd, nconns;
    struct conn *conns;
    uint64_t seq, limit; /* requests started by this thread; 0: no limit */
    struct stats s;
};

extern volatile sig_atomic_t g_stop;
extern uint64_t g_start_ns, g_measure_ns, g_end_ns;

/* Builds the next request into c->buf; returns false when the thread's quota is used up
 * (loadgen_template.c). */
bool build_request(struct conn *c);
/* One worker thread: runs its connections until the end of the run. */
void *worker_main(void *arg);

#endif
