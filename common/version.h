/* SPDX-License-Identifier: Apache-2.0 */
/* The one place the release version is written: `diverge version` prints it and the HTTP
 * client sends it in its User-Agent. */
#ifndef DIVERGE_COMMON_VERSION_H
#define DIVERGE_COMMON_VERSION_H

#define DIVERGE_VERSION "0.1.0"

#endif
