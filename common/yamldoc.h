/* SPDX-License-Identifier: Apache-2.0 */
/* YAML documents, read-only, over libyaml's document loader (yamldoc.c is the only file that
 * includes yaml.h). A reader hands out the documents of one text in order; each document is
 * a tree of nodes (scalars, sequences, mappings) that keep their line and, for scalars,
 * whether they were written plain (unquoted), so callers can resolve and report exactly. */
#ifndef DIVERGE_COMMON_YAMLDOC_H
#define DIVERGE_COMMON_YAMLDOC_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"

/* A parser over one text; opaque. */
struct yamldoc_reader;
/* One loaded document; opaque. */
struct yamldoc;
/* One node, borrowed from its document (valid until yamldoc_free); opaque. */
struct yamldoc_node;

enum yamldoc_kind {
    YAMLDOC_SCALAR,
    YAMLDOC_SEQUENCE,
    YAMLDOC_MAPPING,
};

/* Why yamldoc_next failed: the parser's own words. */
struct yamldoc_syntax {
    bool out_of_memory;  /* the parser ran out of memory (nothing else below is set) */
    size_t line;         /* 1-based line of the problem */
    const char *problem; /* static text ("did not find expected key"), or NULL */
    const char *context; /* static text ("while parsing a block mapping"), or NULL */
};

/* A reader over DATA[0..len), which stays borrowed until yamldoc_reader_free. Returns E_FAIL
 * when libyaml cannot initialise a parser. */
int yamldoc_reader_new(struct yamldoc_reader **out, const char *data, size_t len);
/* Releases R; NULL is a no-op. Documents already loaded stay valid. */
void yamldoc_reader_free(struct yamldoc_reader *r);

/* Loads the next document of R into *out (caller frees with yamldoc_free). After the last
 * document, *out is a document without a root node. E_INVALID on a syntax error (or running
 * out of memory), described in *SYN (which may be NULL). */
int yamldoc_next(struct yamldoc **out, struct yamldoc_reader *r, struct yamldoc_syntax *syn);
/* Releases D and all its nodes; NULL is a no-op. */
void yamldoc_free(struct yamldoc *d);

/* D's root node, or NULL for an empty document (or the end of the stream). */
const struct yamldoc_node *yamldoc_root(const struct yamldoc *d);
/* The 1-based line where D starts. */
size_t yamldoc_line_of_doc(const struct yamldoc *d);

enum yamldoc_kind yamldoc_kind(const struct yamldoc_node *n);
/* The 1-based line where N starts. */
size_t yamldoc_line(const struct yamldoc_node *n);

/* Scalar N's text, NUL-terminated (it may hold a NUL byte of its own: compare
 * yamldoc_scalar_len with strlen). NULL when N is not a scalar. */
const char *yamldoc_scalar(const struct yamldoc_node *n);
/* Bytes of scalar N's text; 0 when N is not a scalar. */
size_t yamldoc_scalar_len(const struct yamldoc_node *n);
/* Whether scalar N was written plain (unquoted, not a block scalar). */
bool yamldoc_plain(const struct yamldoc_node *n);

/* Items of sequence N, pairs of mapping N; 0 for a scalar. */
size_t yamldoc_count(const struct yamldoc_node *n);
/* Item I (< yamldoc_count) of sequence N in D. */
const struct yamldoc_node *yamldoc_item(const struct yamldoc *d, const struct yamldoc_node *n,
                                        size_t i);
/* Key and value of pair I (< yamldoc_count) of mapping N in D. */
void yamldoc_pair(const struct yamldoc_node **key_out, const struct yamldoc_node **value_out,
                  const struct yamldoc *d, const struct yamldoc_node *n, size_t i);
/* The value of the first pair of mapping N whose key is the scalar KEY (exactly, bytes
 * compared); NULL when N is not a mapping or has no such key. */
const struct yamldoc_node *yamldoc_get(const struct yamldoc *d, const struct yamldoc_node *n,
                                       const char *key);

#endif
