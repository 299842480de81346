/* SPDX-License-Identifier: Apache-2.0 */
/* Declarations shared inside bot/ only: the byte-level helpers of the grammar
 * (slashcmd_text.c). */
#ifndef DIVERGE_BOT_BOT_INT_H
#define DIVERGE_BOT_BOT_INT_H

#include <stdbool.h>
#include <stddef.h>

/* An argument echoed in a message: at most SHOW_IN_MAX input bytes, each one at most four
 * output bytes ("\xNN"), then "..." and a NUL. */
#define SHOW_IN_MAX 48
#define SHOW_MAX (SHOW_IN_MAX * 4 + 4)

/* ASCII lower case of C; other bytes unchanged. */
char slashcmd_lower(char c);
/* Whether S[0..n) equals the lower-case NAME, ignoring ASCII case. */
bool slashcmd_ieq(const char *s, size_t n, const char *name);
/* Writes S[0..n) into OUT for a message: valid UTF-8 is kept, '"' and '\' are escaped,
 * control and invalid bytes become \xNN, and a long argument is cut with "...". */
void slashcmd_show_arg(char out[SHOW_MAX], const char *s, size_t n);
/* Whether S[0..n) is valid UTF-8 without control characters other than tab. */
bool slashcmd_text_ok(const char *s, size_t n);
/* Trims grammar whitespace from both ends of *S[0..*n). */
void slashcmd_trim(const char **s, size_t *n);
/* Splits the next whitespace-separated token off *S[0..*n); false when none is left. */
bool slashcmd_next_token(const char **tok_out, size_t *tlen_out, const char **s, size_t *n);

#endif
