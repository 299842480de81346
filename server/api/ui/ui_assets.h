/* SPDX-License-Identifier: Apache-2.0 */
/* The dashboard files (ui/), built into the binary by ui/embed.cmake. */
#ifndef DIVERGE_SERVER_UI_ASSETS_H
#define DIVERGE_SERVER_UI_ASSETS_H

#include <stddef.h>

struct ui_asset {
    const char *path; /* relative to ui/: "index.html", "app.js" */
    const char *content_type;
    const unsigned char *data; /* LEN bytes (and a NUL after them) */
    size_t len;
};

/* Ends with a row whose path is NULL. */
extern const struct ui_asset ui_assets[];

#endif
