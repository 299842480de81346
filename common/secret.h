/* SPDX-License-Identifier: Apache-2.0 */
/* Randomness and generated secret files (admin token, macaroon root key): created once
 * with mode 0600 and never rewritten. Also hex helpers. */
#ifndef DIVERGE_COMMON_SECRET_H
#define DIVERGE_COMMON_SECRET_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"

/* Fills OUT with N cryptographically random bytes (getrandom); aborts if the kernel
 * cannot provide them. */
void secret_random(void *out, size_t n);

/* Writes N bytes of IN as 2N lower-case hex characters plus a NUL into OUT. */
void secret_hex(char *out, const unsigned char *in, size_t n);

/* The value of the hex digit C (either case), or -1. */
int secret_hex_digit(char c);
/* Decodes exactly 2N hex characters of IN into OUT; E_INVALID otherwise. */
int secret_unhex(unsigned char *out, size_t n, const char *in);

/* Reads the secret in PATH (surrounding whitespace trimmed) into *out (caller frees,
 * after wiping). When PATH does not exist, creates it (O_EXCL, mode 0600, fsync'd) with
 * NBYTES random bytes as hex, and *created_out (may be NULL) is set. PATH is opened with
 * O_NOFOLLOW; E_DENIED (the message says how to fix it) when it is a symbolic link, not a
 * regular file, owned by another user than the effective one, or has any group or other
 * permission bit. E_FAIL on I/O errors, E_INVALID when the file is empty. */
int secret_file_load_or_create(char **out, bool *created_out, const char *path, size_t nbytes,
                               struct err *err);

/* Creates PATH (which must not exist) holding the LEN bytes of DATA, mode 0600,
 * atomically: written to a private temporary file, fsync'd, then link(2)ed into place, so
 * no reader sees a half-written file and concurrent creators agree on one. E_AGAIN when
 * PATH already exists (nothing is changed), E_FAIL on I/O errors. */
int secret_file_write(const char *path, const void *data, size_t len, struct err *err);

/* Reads the whole secret file PATH (checked as secret_file_load_or_create checks it:
 * O_NOFOLLOW, regular, ours, no group or other bits) into *out, NUL-terminated, *len_out
 * bytes (caller wipes and frees). E_NOTFOUND (no message) when PATH does not exist,
 * E_DENIED, E_TOOBIG when it has MAX bytes or more, E_FAIL. */
int secret_file_read(char **out, size_t *len_out, const char *path, size_t max, struct err *err);

/* Overwrites N bytes at P with zeros in a way the compiler keeps. */
void secret_wipe(void *p, size_t n);

/* The value of the first of the N environment variables NAMES that is set and non-empty
 * (borrowed from the environment), or NULL: how tokens are found (SPEC §2 "X, else Y"). */
const char *secret_env_first(const char *const *names, size_t n);

#endif
