/* SPDX-License-Identifier: Apache-2.0 */
/* The demo repository's files (examples/demo-repo/ and the demo agent), built into the
 * binary by cli/demo_embed.cmake for `diverge local demo`. */
#ifndef DIVERGE_CLI_DEMO_FILES_H
#define DIVERGE_CLI_DEMO_FILES_H

#include <stddef.h>

struct demo_file {
    const char *path;          /* relative to the repository: "test.sh", ".diverge/agent.yaml" */
    const unsigned char *data; /* LEN bytes (and a NUL after them) */
    size_t len;
    unsigned mode; /* 0644, or 0755 for *.sh */
};

/* Ends with a row whose path is NULL. */
extern const struct demo_file demo_files[];

#endif
