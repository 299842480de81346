/* SPDX-License-Identifier: Apache-2.0 */
/* The sticky status comment of a task (SPEC §6) as Markdown, rendered from the task object
 * alone: pure functions, no I/O, safe from any thread. User text is escaped and every field
 * has a byte cap, so a body is always smaller than SCM_STICKY_MAX. */
#ifndef DIVERGE_SCM_RENDER_H
#define DIVERGE_SCM_RENDER_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* The first line of every sticky comment; the notifier finds its comments by it. */
#define SCM_STICKY_MARKER "<!-- diverge-agent-task -->"
/* GitHub's comment limit, bytes. A rendered body is always shorter. */
#define SCM_STICKY_MAX 65536
/* Room for a task tag (scm_render_task_tag) and its NUL. */
#define SCM_RENDER_TAG_MAX 160

/* Renders the sticky comment of TASK (a normalized AgentTask object) into *out, a new
 * NUL-terminated string the caller frees with free(). NOW_MS (epoch ms) is shown as the
 * last update time on the last line. The first line is SCM_STICKY_MARKER, the second the
 * task tag. Returns E_INVALID when TASK lacks metadata.name or metadata.namespace, and
 * E_TOOBIG only if the field caps were wrong (a bug: they are checked at compile time). */
int scm_render_sticky(char **out, const json_t *task, int64_t now_ms, struct err *err);

/* As scm_render_sticky, with a "Task page" link to the task on the dashboard at
 * DASHBOARD_URL (the server's --public-url: `<url>/#/task/<namespace>/<name>`). NULL, or
 * a URL that is not plain http(s) (whitespace, quotes, brackets or parentheses in it),
 * renders no link. */
int scm_render_sticky_dashboard(char **out, const json_t *task, const char *dashboard_url,
                                int64_t now_ms, struct err *err);

/* Writes the task identity line that follows the marker, used to find a task's comment
 * among several: "<!-- diverge-task: <namespace>/<name> -->". Characters other than
 * [A-Za-z0-9._-] become '_' and each part is cut at 63 bytes, so the line always closes
 * its comment. N should be at least SCM_RENDER_TAG_MAX; when the line does not fit in N
 * bytes OUT gets "" instead of a cut line. */
void scm_render_task_tag(char *out, size_t n, const char *ns, const char *name);

/* Writes in OUT the 64-bit FNV-1a hash, as 16 lower-case hex digits and a NUL, of BODY
 * without its last-update line, so an unchanged task rendered later has the same hash. */
void scm_render_hash(char out[17], const char *body);

/* The Exit Preview URL: PREVIEW with its _diverge_env query parameter set to "clear",
 * added with '?' or '&' when absent; a later duplicate of the parameter and empty
 * parameters are dropped, a #fragment is kept at the end. Returns a new string the
 * caller frees with free(). */
char *scm_render_exit_url(const char *preview);

#endif
