/* SPDX-License-Identifier: Apache-2.0 */
/* Declarations shared inside store/ only. */
#ifndef DIVERGE_STORE_STORE_INT_H
#define DIVERGE_STORE_STORE_INT_H

#include <jansson.h>

/* The status of a new task: Pending, zero spend. New reference. */
json_t *task_initial_status(void);

#endif
