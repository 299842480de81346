/* SPDX-License-Identifier: Apache-2.0 */
/* The `local` sandbox provider (bubblewrap). */
#include <stdlib.h>

#include "controller/controller_int.h"
#include "controller/sandbox_int.h"

int sandbox_local_new(struct sandbox_provider **out, const struct sandbox_local_opts *o,
                      struct err *err)
{
    (void)o;
    (void)err;
    *out = NULL;
    return E_OK;
}
