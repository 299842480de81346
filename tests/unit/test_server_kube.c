/* SPDX-License-Identifier: Apache-2.0 */
/* The kubectl pieces of the task API (server/api_kube.c): which Accept headers ask for a
 * meta.k8s.io Table, the fieldSelector terms, and the Age column's text. */
#include <stdlib.h>
#include <string.h>

#include "server/api/api_int.h"
#include "tests/t_check.h"

/* What kubectl 1.33 sends for `get` (KUBECTL-PROTOCOL.md §5). */
#define KUBECTL_TABLE_ACCEPT                                                                       \
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g="          \
    "meta.k8s.io,application/json"

TEST(accept_table_as_kubectl_sends_it)
{
    const char *v = NULL;

    CHECK(kube_accept_table(KUBECTL_TABLE_ACCEPT, &v));
    CHECK_EQ_STR(v, "v1");
    CHECK(kube_accept_table("application/json ; as=Table ; g=meta.k8s.io ; v=v1beta1", &v));
    CHECK_EQ_STR(v, "v1beta1");
    CHECK(kube_accept_table("text/html, APPLICATION/JSON;as=Table;g=meta.k8s.io;v=v1", &v));
    CHECK_EQ_STR(v, "v1");
}

TEST(accept_without_a_whole_table_range_is_plain)
{
    const char *v = "x";

    CHECK(!kube_accept_table(NULL, &v));
    CHECK(v == NULL);
    CHECK(!kube_accept_table("", &v));
    CHECK(!kube_accept_table("application/json", &v));
    CHECK(!kube_accept_table("*/*", &v));
    /* Parameters spread over two ranges, another group or version, another type. */
    CHECK(!kube_accept_table("application/json;as=Table,application/json;g=meta.k8s.io;v=v1", &v));
    CHECK(!kube_accept_table("application/json;as=Table;g=meta.k8s.io;v=v2", &v));
    CHECK(!kube_accept_table("application/json;as=Table;g=other.io;v=v1", &v));
    CHECK(!kube_accept_table("application/yaml;as=Table;g=meta.k8s.io;v=v1", &v));
    CHECK(!kube_accept_table("application/json;as=Table;g=meta.k8s.io;v=v1x", &v));
    CHECK(!kube_accept_table(";;;,,,;", &v));
    CHECK(v == NULL);
}

TEST(field_selector_name_and_namespace)
{
    struct kube_view v;
    struct err err = {0};

    memset(&v, 0, sizeof(v));
    CHECK_OK(kube_field_selector_parse(&v, "metadata.name=demo", &err));
    CHECK_EQ_STR(v.name, "demo");
    CHECK(v.ns == NULL);
    CHECK_OK(kube_field_selector_parse(&v, "metadata.namespace==team-a,metadata.name=x", &err));
    CHECK_EQ_STR(v.ns, "team-a");
    CHECK_EQ_STR(v.name, "x");
    CHECK(kube_view_match(&v, "team-a", "x"));
    CHECK(!kube_view_match(&v, "team-a", "y"));
    CHECK(!kube_view_match(&v, "default", "x"));
    CHECK(!kube_view_match(&v, NULL, "x"));
    CHECK(!kube_view_plain(&v));
    kube_view_cleanup(&v);
    CHECK(kube_view_plain(&v) && kube_view_match(&v, "a", "b"));
    CHECK_OK(kube_field_selector_parse(&v, "", &err));
    CHECK_OK(kube_field_selector_parse(&v, ",,", &err));
    CHECK_OK(kube_field_selector_parse(&v, "metadata.name=", &err)); /* matches no task */
    CHECK_EQ_STR(v.name, "");
    kube_view_cleanup(&v);
}

TEST(field_selector_refuses_what_it_cannot_do)
{
    struct kube_view v;
    struct err err = {0};

    memset(&v, 0, sizeof(v));
    CHECK_EQ_INT(kube_field_selector_parse(&v, "status.phase=Active", &err), E_INVALID);
    CHECK(strstr(err.msg, "metadata.name") != NULL);
    CHECK_EQ_INT(kube_field_selector_parse(&v, "metadata.name!=x", &err), E_INVALID);
    CHECK_EQ_INT(kube_field_selector_parse(&v, "metadata.name", &err), E_INVALID);
    CHECK_EQ_INT(kube_field_selector_parse(&v, "=x", &err), E_INVALID);
    CHECK(strstr(err.msg, "=x") == NULL); /* request bytes are not echoed */
    kube_view_cleanup(&v);
}

TEST(label_selector_equality_terms)
{
    struct kube_view v;
    struct err err = {0};

    memset(&v, 0, sizeof(v));
    CHECK_OK(kube_label_selector_parse(&v, "team=a, tier==web,env!=prod,owner,!temp", &err));
    CHECK_EQ_INT(v.nlabels, 5);
    CHECK_EQ_STR(v.labels[0].key, "team");
    CHECK_EQ_STR(v.labels[0].value, "a");
    CHECK(!v.labels[0].negate);
    CHECK_EQ_STR(v.labels[1].key, "tier");
    CHECK_EQ_STR(v.labels[1].value, "web");
    CHECK_EQ_STR(v.labels[2].key, "env");
    CHECK_EQ_STR(v.labels[2].value, "prod");
    CHECK(v.labels[2].negate);
    CHECK_EQ_STR(v.labels[3].key, "owner");
    CHECK(v.labels[3].value == NULL && !v.labels[3].negate);
    CHECK_EQ_STR(v.labels[4].key, "temp");
    CHECK(v.labels[4].value == NULL && v.labels[4].negate);
    CHECK(!kube_view_plain(&v));
    kube_view_cleanup(&v);
    CHECK_EQ_INT(v.nlabels, 0);
}

TEST(label_selector_refuses_set_terms_and_garbage)
{
    static const char *const bad[] = {
        "env in (a,b)", "=x", "!", "a!b", "a=b=c", "a=!b", "a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q"};
    struct kube_view v;
    struct err err = {0};

    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        memset(&v, 0, sizeof(v));
        CHECK_EQ_INT(kube_label_selector_parse(&v, bad[i], &err), E_INVALID);
        kube_view_cleanup(&v);
    }
}

TEST(age_reads_like_kubectl)
{
    static const struct {
        int64_t s;
        const char *want;
    } cases[] = {
        {-5, "<invalid>"},
        {-1, "0s"},
        {0, "0s"},
        {61, "61s"},
        {119, "119s"},
        {120, "2m"},
        {303, "5m3s"},
        {600, "10m"},
        {179 * 60 + 59, "179m"},
        {3 * 3600, "3h"},
        {3 * 3600 + 5 * 60, "3h5m"},
        {8 * 3600 + 5 * 60, "8h"},
        {47 * 3600, "47h"},
        {50 * 3600, "2d2h"},
        {72 * 3600, "3d"},
        {10 * 86400, "10d"},
        {729 * 86400LL, "729d"},
        {730 * 86400LL, "2y"},
        {740 * 86400LL, "2y10d"},
        {9 * 365 * 86400LL + 86400, "9y"},
    };
    char out[KUBE_AGE_MAX];

    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        kube_age(out, cases[i].s);
        CHECK_EQ_STR(out, cases[i].want);
    }
}

T_MAIN
