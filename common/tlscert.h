/* SPDX-License-Identifier: Apache-2.0 */
/* The certificate and key of the TLS listener (SPEC §2 --tls-listen): given PEM files, or
 * a self-signed certificate for 127.0.0.1/localhost generated once into the data dir (key
 * 0600, read like the other generated secrets). Also base64 for kubeconfig files. */
#ifndef DIVERGE_COMMON_TLSCERT_H
#define DIVERGE_COMMON_TLSCERT_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"

#define TLSCERT_CERT_FILE "tls.crt"   /* the generated certificate, in the data dir */
#define TLSCERT_KEY_FILE "tls.key"    /* its private key (mode 0600) */
#define TLSCERT_PEM_MAX (64u * 1024u) /* bytes of a PEM file we read */

/* The PEM texts of a certificate (chain) and its private key. */
struct tlscert {
    char *cert_pem; /* owned, NUL-terminated */
    char *key_pem;  /* owned, NUL-terminated; wiped by tlscert_cleanup() */
};

/* Loads DIR/tls.crt and DIR/tls.key, generating what is missing: a new ECDSA P-256 key
 * (created 0600, never rewritten) and a self-signed certificate for IP 127.0.0.1, ::1 and
 * DNS localhost (CA:TRUE, so that the certificate is its own certificate authority),
 * valid ten years. The key is refused like a planted secret (symbolic link, other owner,
 * group or other bits: E_DENIED with the fix). *created_out (may be NULL) tells whether
 * anything was generated. E_FAIL on I/O or OpenSSL errors. */
int tlscert_load_or_create(struct tlscert *out, bool *created_out, const char *dir,
                           struct err *err);

/* Loads the given PEM files CERT_PATH and KEY_PATH as they are (symbolic links allowed:
 * Kubernetes mounts Secrets through them). E_FAIL when one cannot be read, E_INVALID when
 * one holds no PEM block. */
int tlscert_load_files(struct tlscert *out, const char *cert_path, const char *key_path,
                       struct err *err);

/* Reads the PEM file PATH (at most TLSCERT_PEM_MAX bytes) into *out (caller frees).
 * E_FAIL when it cannot be read, E_INVALID when it holds no PEM block; WHAT names the file
 * in messages. */
int tlscert_read_pem(char **out, const char *path, const char *what, struct err *err);

void tlscert_cleanup(struct tlscert *c);

/* LEN bytes of DATA as standard base64 with padding, no line breaks; caller frees. */
char *tlscert_base64(const void *data, size_t len);

#endif
