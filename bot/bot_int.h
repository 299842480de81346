/* SPDX-License-Identifier: Apache-2.0 */
/* Declarations shared inside bot/ only: the byte-level helpers of the grammar
 * (slashcmd_text.c). */
#ifndef DIVERGE_BOT_BOT_INT_H
#define DIVERGE_BOT_BOT_INT_H

#include <stdbool.h>
#include <stddef.h>

/* Replies quote user text (a bad argument, a branch name, a parser message) as a Markdown
 * code span that nothing inside can end. SLASHCMD_QUOTE_SIZE(chars) bytes hold one of at
 * most CHARS characters: each takes at most 4 bytes, and each backtick among them (1 byte)
 * adds at most 2 to the fences, so CHARS * 4, plus the two shortest fences, two padding
 * spaces, an ellipsis (3) and a NUL. */
#define SLASHCMD_QUOTE_SIZE(chars_) ((chars_)*4 + 2 + 2 + 3 + 1)
/* Arguments echoed in a message: at most this many characters. */
#define SHOW_CHARS 80
#define SHOW_MAX SLASHCMD_QUOTE_SIZE(SHOW_CHARS)

/* ASCII lower case of C; other bytes unchanged. */
char slashcmd_lower(char c);
/* Whether S[0..n) equals the lower-case NAME, ignoring ASCII case. */
bool slashcmd_ieq(const char *s, size_t n, const char *name);
/* Writes S[0..n) (any bytes) into OUT (SIZE >= SLASHCMD_QUOTE_SIZE(MAX_CHARS) bytes) as a
 * code span safe in any reply: a backtick fence longer than any backtick run inside; valid
 * UTF-8 kept, but line separators and bidi controls become U+FFFD and control and invalid
 * bytes "\xNN" (so the span stays on one line, in order); "@" is followed by U+200D (no
 * mention, team ping or notification); "<", ">" and "&" become their
 * fullwidth forms (entities would show literally inside a code span, and no renderer that
 * ignores the span can read HTML in it); at most MAX_CHARS characters, then "…". */
void slashcmd_quote(char *out, size_t size, const char *s, size_t n, size_t max_chars);
/* slashcmd_quote with SHOW_CHARS, into SHOW_MAX bytes. */
void slashcmd_show_arg(char out[SHOW_MAX], const char *s, size_t n);
/* Whether S[0..n) is valid UTF-8 without control characters other than tab. */
bool slashcmd_text_ok(const char *s, size_t n);
/* Trims grammar whitespace from both ends of *S[0..*n). */
void slashcmd_trim(const char **s, size_t *n);
/* Splits the next whitespace-separated token off *S[0..*n); false when none is left. */
bool slashcmd_next_token(const char **tok_out, size_t *tlen_out, const char **s, size_t *n);

#endif
