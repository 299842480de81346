/* SPDX-License-Identifier: Apache-2.0 */
/* Capability tokens: macaroons (libmacaroons construction) in the V2 binary format,
 * encoded as unpadded URL-safe base64, with Diverge's first-party caveat language
 * ("name = value"). Everything here fails closed: what is not understood is refused. */
#ifndef DIVERGE_TOKEN_TOKEN_H
#define DIVERGE_TOKEN_TOKEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/err.h"

#define TOKEN_ROOT_KEY_LEN 32 /* bytes of the server's root key */
#define TOKEN_SIG_LEN 32      /* bytes of an HMAC-SHA256 signature */
#define TOKEN_LOCATION "diverge"
#define TOKEN_ENCODED_MAX 8192 /* cap on an encoded token's length, in characters */
#define TOKEN_CAVEATS_MAX 64   /* cap on the number of caveats of one token */
#define TOKEN_FIELD_MAX 2048   /* cap on one identifier, location or caveat, in bytes */

/* A parsed or freshly minted macaroon. Opaque; caller frees with token_free(). */
struct token;

/* Creates a macaroon with LOCATION (may be NULL: none) and IDENTIFIER, signed with
 * ROOT_KEY, and no caveats. *out is a new token the caller frees with token_free().
 * Returns E_INVALID when a string is empty (identifier), too long or holds a NUL. */
int token_mint(struct token **out, const unsigned char root_key[TOKEN_ROOT_KEY_LEN],
               const char *location, const char *identifier, struct err *err);

/* Attenuates T: appends the first-party caveat PREDICATE and advances the signature.
 * Needs no key. Returns E_INVALID for an empty or over-long predicate, E_TOOBIG past
 * TOKEN_CAVEATS_MAX caveats. */
int token_add_caveat(struct token *t, const char *predicate, struct err *err);

/* Serializes T (V2 binary, unpadded URL-safe base64). *out is a new NUL-terminated
 * string the caller frees with free(). Never fails. */
void token_encode(char **out, const struct token *t);

/* Parses the encoded token S[0..len) (standard or URL-safe base64, padded or not) without
 * checking its signature. *out is a new token the caller frees with token_free().
 * Returns E_INVALID on malformed input (bad base64, truncated or unknown fields, trailing
 * bytes, third-party caveats, NUL bytes in a field, version other than 2) and E_TOOBIG
 * over the caps above. */
int token_decode(struct token **out, const char *s, size_t len, struct err *err);

/* Releases T and wipes its signature. NULL is a no-op. */
void token_free(struct token *t);

/* Borrowed views of T, valid until token_free(T). The location is NULL when absent. */
const char *token_location(const struct token *t);
const char *token_identifier(const struct token *t);
size_t token_caveat_count(const struct token *t);
/* The caveat at INDEX (< token_caveat_count()). */
const char *token_caveat(const struct token *t, size_t index);
/* Copies T's signature into OUT. */
void token_signature(unsigned char out[TOKEN_SIG_LEN], const struct token *t);

/* Checks only the signature chain of T against ROOT_KEY, in constant time.
 * Returns E_DENIED on mismatch. */
int token_verify_signature(const struct token *t, const unsigned char root_key[TOKEN_ROOT_KEY_LEN],
                           struct err *err);

/* What a request presents, matched against the caveats. Strings are borrowed. */
struct token_context {
    const char *task;   /* task name, for task_id; NULL fails any task_id caveat */
    const char *ns;     /* namespace; NULL fails any namespace caveat */
    const char *repo;   /* NULL fails any repo caveat */
    const char *branch; /* NULL fails any branch caveat */
    const char *model;  /* model of the request; NULL = missing */
    int64_t now_ms;     /* wall clock, epoch milliseconds */
};

/* The effective limits of a verified token: the narrowest of every repeated caveat. */
struct token_grant {
    bool has_max_cost;       /* a max_cost_usd caveat exists */
    int64_t max_cost_micros; /* smallest max_cost_usd, micro-dollars (0 when none) */
    bool has_max_tokens;     /* a max_tokens caveat exists */
    int64_t max_tokens;      /* smallest max_tokens (0 when none) */
    bool has_expires;        /* an expires caveat exists */
    int64_t expires_ms;      /* earliest expires, epoch ms (0 when none) */
    bool models_restricted;  /* at least one models caveat exists */
    bool model_allowed;      /* CTX->model matches every models caveat (true if none) */
};

/* Verifies T against ROOT_KEY and CTX: the signature, then every caveat. Fills *out
 * (caller storage; zeroed first) with the effective limits. A model mismatch is NOT a
 * failure here: it is reported in out->model_allowed, because it answers 403 where
 * everything else answers 401. Returns E_DENIED on a bad signature, an unknown,
 * malformed or unmet caveat, or expiry (now_ms >= expires); E_FAIL if HMAC fails. */
int token_verify(struct token_grant *out, const struct token *t,
                 const unsigned char root_key[TOKEN_ROOT_KEY_LEN], const struct token_context *ctx,
                 struct err *err);

/* The caveat half of token_verify(): checks every caveat of T against CTX and fills *out,
 * WITHOUT checking the signature. Only for a token whose signature already passed
 * token_verify_signature() (the meter checks signatures in parallel request threads and
 * caveats inside its transaction, against the task as stored there). Returns E_DENIED as
 * token_verify() does. */
int token_check_caveats(struct token_grant *out, const struct token *t,
                        const struct token_context *ctx, struct err *err);

/* token_decode() then token_verify(). Returns E_DENIED for every failure, including
 * malformed input. When id_out is not NULL and the token verified, *id_out is a copy of
 * its identifier the caller frees with free(). */
int token_verify_string(struct token_grant *out, char **id_out, const char *s,
                        const unsigned char root_key[TOKEN_ROOT_KEY_LEN],
                        const struct token_context *ctx, struct err *err);

/* True when MODEL (NULL = missing) matches every models caveat of T: exactly or by a
 * prefix wildcard ("claude-*"). True when T has no models caveat; false when a models
 * caveat is malformed. Does not check the signature. */
bool token_models_allow(const struct token *t, const char *model);

/* True when TOOL is listed in every tools caveat of T (true when there is none). */
bool token_tools_allow(const struct token *t, const char *tool);

/* True when MODEL matches one entry of the comma list PATTERNS ("a,claude-*"): exactly,
 * or, for an entry ending in '*', by prefix. False for NULL MODEL. Shared with the
 * meter's check of spec.capabilities. */
bool token_model_match(const char *patterns, const char *model);

/* What the server mints for a task. Strings are borrowed. Build with
 * TOKEN_MINT_OPTS_DEFAULTS and set the fields you have. */
struct token_mint_opts {
    const char *task;          /* task name: task_id caveat and identifier; required */
    const char *ns;            /* namespace caveat; NULL or "" omits it */
    int64_t generation;        /* mint generation of the task, part of the identifier */
    const char *repo;          /* repo caveat; NULL or "" omits it */
    const char *branch;        /* branch caveat; NULL or "" omits it */
    const char *const *tools;  /* tools caveat entries; n_tools == 0 omits it */
    size_t n_tools;            /* entries in tools */
    const char *const *models; /* models caveat entries ("claude-*" ok); 0 omits it */
    size_t n_models;           /* entries in models */
    int64_t max_cost_micros;   /* max_cost_usd caveat; <= 0 omits it */
    int64_t max_tokens;        /* max_tokens caveat; <= 0 omits it */
    int64_t expires_ms;        /* expires caveat, epoch ms; 0 omits it */
};

#define TOKEN_MINT_OPTS_DEFAULTS                                                                   \
    {                                                                                              \
        .task = NULL, .ns = NULL, .generation = 0, .repo = NULL, .branch = NULL, .tools = NULL,    \
        .n_tools = 0, .models = NULL, .n_models = 0, .max_cost_micros = 0, .max_tokens = 0,        \
        .expires_ms = 0,                                                                           \
    }

/* Mints a task token: location "diverge", identifier "<ns>/<task>/<generation>/<32 random
 * hex>" (without "<ns>/" when ns is empty), caveats in the fixed order task_id,
 * namespace, repo, branch, tools, models, max_cost_usd, max_tokens, expires.
 * *token_out and *id_out (may be NULL) are new strings the caller frees with free().
 * Returns E_INVALID when task is missing or a value holds a control character, or a
 * list entry is empty or holds ',' or whitespace; E_FAIL when randomness fails. */
int token_mint_task(char **token_out, char **id_out,
                    const unsigned char root_key[TOKEN_ROOT_KEY_LEN],
                    const struct token_mint_opts *opts, struct err *err);

#define TOKEN_FINGERPRINT_BYTES 8 /* bytes of SHA-256(signature) shown: 16 hex digits */
#define TOKEN_FINGERPRINT_MAX 32  /* "sha256:" + 16 hex + NUL, rounded up */

/* Writes "sha256:<first 16 hex digits of SHA-256(signature of T)>" to OUT: tells tokens
 * apart without revealing the signature (which, with the caveats, rebuilds the token). */
void token_fingerprint(char out[TOKEN_FINGERPRINT_MAX], const struct token *t);

/* Prints T for humans to F: "location: …", "identifier: …", one "caveat: …" per caveat,
 * then "fingerprint: sha256:<16 hex> (…)". Never the signature: location, identifier,
 * caveats and signature are the whole bearer token (SPEC §8 "no secret"). Bytes outside
 * printable ASCII are written as \xNN. */
void token_print(FILE *f, const struct token *t);

/* Reads the root key from PATH (64 hex chars, optionally followed by a newline) into
 * KEY_OUT; when PATH does not exist, generates a random key and creates the file with
 * mode 0600 (atomically: a concurrent creator's key wins and is loaded). Returns
 * E_INVALID for a file that is not 64 hex chars, E_FAIL on I/O errors. */
int token_root_key_load_or_create(unsigned char key_out[TOKEN_ROOT_KEY_LEN], const char *path,
                                  struct err *err);

/* Parses 64 hex chars (exactly) into KEY_OUT; E_INVALID otherwise. */
int token_root_key_parse(unsigned char key_out[TOKEN_ROOT_KEY_LEN], const char *hex,
                         struct err *err);

/* --- push grants ------------------------------------------------------------------- */

/* "v1." and 64 hex digits. */
#define TOKEN_PUSH_GRANT_LEN 67

/* What a push grant binds: the task (namespace, name), where its working branch is pushed
 * (spec.repository.url, workingBranch), and the repository and base branch of the pull
 * request it was made from. All borrowed; a NULL field makes no grant. */
struct token_push_target {
    const char *ns, *name;
    const char *url, *working;
    const char *pr_base_url, *pr_base_ref;
};

/* Writes to OUT the grant of T under ROOT_KEY: "v1." and the hex HMAC-SHA256, under
 * ROOT_KEY, of a domain string and the fields of T, each with its length in front.
 * False (and OUT empty) when a field of T is NULL. */
bool token_push_grant(char out[TOKEN_PUSH_GRANT_LEN + 1],
                      const unsigned char root_key[TOKEN_ROOT_KEY_LEN],
                      const struct token_push_target *t);

/* Whether GRANT (may be NULL) is the grant of T under ROOT_KEY, compared in constant
 * time. */
bool token_push_grant_ok(const char *grant, const unsigned char root_key[TOKEN_ROOT_KEY_LEN],
                         const struct token_push_target *t);

#endif
