/* SPDX-License-Identifier: Apache-2.0 */
/* Declarations shared by the sticky-comment renderer's files (scm/render*.c) only. */
#ifndef DIVERGE_SCM_RENDER_INT_H
#define DIVERGE_SCM_RENDER_INT_H

/* The last line of a sticky comment starts with this; scm_render_hash() skips it. No other
 * line can start with '<': user text never starts a line and its '<' is escaped. */
#define UPDATED_PREFIX "<sub>Last updated "
/* The preview router's query parameter (SPEC §4). */
#define DIVERGE_ENV "_diverge_env"

#endif
