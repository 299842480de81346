/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer harness for the kubeconfig loader: any bytes load or fail cleanly; a loaded
 * config always has an http(s) server and a namespace that is a DNS label. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kube/kube_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(c_)                                                                             \
    do {                                                                                           \
        if (!(c_)) {                                                                               \
            assert_fail(#c_, __FILE__, __LINE__);                                                  \
        }                                                                                          \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kube_config *cfg = NULL;
    struct err err = {0};
    int rc = kube_config_load_kubeconfig(&cfg, "kc", "/nonexistent", (const char *)data, size, NULL,
                                         &err);

    if (rc != E_OK) {
        FUZZ_CHECK(cfg == NULL && err.msg[0] != '\0');
        return 0;
    }
    FUZZ_CHECK(cfg != NULL);
    FUZZ_CHECK(strncmp(kube_config_server(cfg), "http", 4) == 0);
    FUZZ_CHECK(kube_name_ok(kube_config_namespace(cfg)));
    FUZZ_CHECK(cfg->ca_data == NULL || cfg->ca_len > 0);
    kube_config_free(cfg);
    return 0;
}
