/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: the kubectl request pieces the task API parses itself
 * (server/api_kube.c), all untrusted: the Accept header (Table or not) and the
 * fieldSelector and labelSelector queries. Input: the Accept value, a newline, the
 * selector (tried as both). Checked: no
 * crash, a Table answer always names a version we serve, a selector either fails or
 * leaves NUL-terminated values no longer than the input. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/api/api_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nl = memchr(data, '\n', size);
    size_t alen = nl != NULL ? (size_t)(nl - data) : size;
    size_t slen = nl != NULL ? size - alen - 1 : 0;
    char *accept = malloc(alen + 1), *sel = malloc(slen + 1);
    const char *version = NULL;
    struct kube_view v;
    struct err err = {0};
    char age[KUBE_AGE_MAX];
    int64_t secs = 0;

    memcpy(accept, data, alen);
    accept[alen] = '\0';
    memcpy(sel, nl != NULL ? nl + 1 : data, slen);
    sel[slen] = '\0';
    if (kube_accept_table(accept, &version)) {
        ASSERT(version != NULL && (strcmp(version, "v1") == 0 || strcmp(version, "v1beta1") == 0));
    } else {
        ASSERT(version == NULL);
    }
    memset(&v, 0, sizeof(v));
    if (kube_field_selector_parse(&v, sel, &err) == E_OK) {
        ASSERT(v.name == NULL || strlen(v.name) <= slen);
        ASSERT(v.ns == NULL || strlen(v.ns) <= slen);
        (void)kube_view_match(&v, "default", "demo");
    } else {
        ASSERT(err.msg[0] != '\0');
    }
    kube_view_cleanup(&v);
    memset(&v, 0, sizeof(v));
    if (kube_label_selector_parse(&v, sel, &err) == E_OK) {
        ASSERT(v.nlabels <= KUBE_LABEL_TERMS_MAX);
    } else {
        ASSERT(err.msg[0] != '\0' && v.nlabels <= KUBE_LABEL_TERMS_MAX);
    }
    kube_view_cleanup(&v);
    memcpy(&secs, data, size < sizeof(secs) ? size : sizeof(secs));
    kube_age(age, secs);
    ASSERT(strlen(age) < sizeof(age));
    free(accept);
    free(sel);
    return 0;
}
