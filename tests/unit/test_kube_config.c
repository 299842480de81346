/* SPDX-License-Identifier: Apache-2.0 */
/* kube/ settings: kubeconfig parsing (contexts, CA data, token files, refusals) and the
 * in-cluster service account, including a rotated token being picked up. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kube/kube_int.h"
#include "tests/t_check.h"

static const char *const two_contexts = "apiVersion: v1\n"
                                        "kind: Config\n"
                                        "current-context: b\n"
                                        "clusters:\n"
                                        "- name: one\n"
                                        "  cluster:\n"
                                        "    server: https://one.example:6443/\n"
                                        "    insecure-skip-tls-verify: true\n"
                                        "- name: two\n"
                                        "  cluster:\n"
                                        "    server: https://10.0.0.2:443\n"
                                        "    certificate-authority: certs/ca.pem\n"
                                        "contexts:\n"
                                        "- name: a\n"
                                        "  context: {cluster: one, user: ua, namespace: team-a}\n"
                                        "- name: b\n"
                                        "  context: {cluster: two, user: ub}\n"
                                        "users:\n"
                                        "- name: ua\n"
                                        "  user: {token: tok-a}\n"
                                        "- name: ub\n"
                                        "  user: {tokenFile: tok/b}\n";

static int load(struct kube_config **out, const char *text, const char *ctx, struct err *err)
{
    return kube_config_load_kubeconfig(out, "kc.yaml", "/cfg", text, strlen(text), ctx, err);
}

TEST(kubeconfig_current_context)
{
    struct kube_config *cfg = NULL;
    struct err err = {0};

    CHECK_OK(load(&cfg, two_contexts, NULL, &err));
    if (cfg == NULL) {
        return;
    }
    CHECK_EQ_STR(kube_config_server(cfg), "https://10.0.0.2:443");
    CHECK_EQ_STR(kube_config_namespace(cfg), "default");
    CHECK_EQ_STR(cfg->ca_file, "/cfg/certs/ca.pem"); /* relative to the file's folder */
    CHECK_EQ_STR(cfg->token_file, "/cfg/tok/b");
    CHECK(!cfg->insecure);
    kube_config_free(cfg);
}

TEST(kubeconfig_named_context)
{
    struct kube_config *cfg = NULL;
    struct err err = {0};
    char *tok = NULL;

    CHECK_OK(load(&cfg, two_contexts, "a", &err));
    if (cfg == NULL) {
        return;
    }
    CHECK_EQ_STR(kube_config_server(cfg), "https://one.example:6443"); /* slash dropped */
    CHECK_EQ_STR(kube_config_namespace(cfg), "team-a");
    CHECK(cfg->insecure);
    CHECK_OK(kube_config_token_dup(&tok, cfg, &err));
    CHECK_EQ_STR(tok, "tok-a");
    free(tok);
    kube_config_free(cfg);
}

/* "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n" in base64. */
#define CA_B64 "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUIKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo="

TEST(kubeconfig_ca_data)
{
    const char *text = "current-context: c\n"
                       "clusters: [{name: k, cluster: {server: 'https://k:1',\n"
                       "  certificate-authority-data: " CA_B64 "}}]\n"
                       "contexts: [{name: c, context: {cluster: k}}]\n";
    struct kube_config *cfg = NULL;
    struct err err = {0};
    char *tok = NULL;

    CHECK_OK(load(&cfg, text, NULL, &err));
    if (cfg == NULL) {
        return;
    }
    CHECK_EQ_STR(cfg->ca_data, "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n");
    CHECK_EQ_INT(cfg->ca_len, 59);
    CHECK_OK(kube_config_token_dup(&tok, cfg, &err)); /* no user: no token */
    CHECK(tok == NULL);
    kube_config_free(cfg);
}

struct bad_case {
    const char *text;   /* kubeconfig */
    int code;           /* expected error */
    const char *needle; /* expected in the message */
};

static const struct bad_case bad_cases[] = {
    {"current-context: [", E_INVALID, "malformed yaml"},
    {"- a\n- b\n", E_INVALID, "no top-level mapping"},
    {"clusters: []\n", E_INVALID, "no current-context"},
    {"current-context: x\ncontexts: []\n", E_INVALID, "context \"x\" not found"},
    {"current-context: x\ncontexts: [{name: x, context: {cluster: k}}]\n", E_INVALID,
     "cluster \"k\" not found"},
    {"current-context: x\ncontexts: [{name: x, context: {cluster: k, user: u}}]\n"
     "clusters: [{name: k, cluster: {server: 'https://k'}}]\n"
     "users: [{name: u, user: {exec: {command: aws}}}]\n",
     E_INVALID, "exec credential plugins"},
    {"current-context: x\ncontexts: [{name: x, context: {cluster: k, user: u}}]\n"
     "clusters: [{name: k, cluster: {server: 'https://k'}}]\n"
     "users: [{name: u, user: {client-certificate-data: AAAA}}]\n",
     E_INVALID, "client certificates"},
    {"current-context: x\ncontexts: [{name: x, context: {cluster: k}}]\n"
     "clusters: [{name: k, cluster: {server: 'ftp://k'}}]\n",
     E_INVALID, "server must be an http(s) url"},
    {"current-context: x\ncontexts: [{name: x, context: {cluster: k}}]\n"
     "clusters: [{name: k, cluster: {server: 'https://k', certificate-authority-data: '@@'}}]\n",
     E_INVALID, "not base64"},
    {"current-context: x\ncontexts: [{name: x, context: {cluster: k}}]\n"
     "clusters: [{name: k, cluster: {server: 'https://k', certificate-authority-data: "
     "aGVsbG8=}}]\n",
     E_INVALID, "not a PEM certificate"},
    {"current-context: x\ncontexts: [{name: x, context: {cluster: k, namespace: 'A/B'}}]\n"
     "clusters: [{name: k, cluster: {server: 'https://k'}}]\n",
     E_INVALID, "namespace is not a dns label"},
    {"current-context: \"x\\ny\"\ncontexts: []\n", E_INVALID, "context \"x?y\" not found"},
};

TEST(kubeconfig_bad_files_name_the_problem)
{
    for (size_t i = 0; i < ARRAY_LEN(bad_cases); i++) {
        struct kube_config *cfg = NULL;
        struct err err = {0};

        CHECK_EQ_INT(load(&cfg, bad_cases[i].text, NULL, &err), bad_cases[i].code);
        CHECK(cfg == NULL);
        if (strstr(err.msg, bad_cases[i].needle) == NULL || strncmp(err.msg, "kc.yaml", 7)) {
            t_fail(__FILE__, __LINE__, "case %zu: message \"%s\" lacks \"%s\"", i, err.msg,
                   bad_cases[i].needle);
        }
    }
}

TEST(kubeconfig_too_big)
{
    size_t n = KUBE_CONFIG_MAX + 1;
    char *big = xmalloc(n);
    struct kube_config *cfg = NULL;
    struct err err = {0};

    memset(big, ' ', n);
    CHECK_EQ_INT(kube_config_load_kubeconfig(&cfg, "kc.yaml", ".", big, n, NULL, &err), E_TOOBIG);
    free(big);
}

static void write_file(const char *dir, const char *name, const char *text)
{
    char *p = xasprintf("%s/%s", dir, name);
    FILE *f = fopen(p, "w");

    ASSERT(f != NULL);
    fputs(text, f);
    fclose(f);
    free(p);
}

TEST(incluster_reads_the_service_account_and_rotated_tokens)
{
    char dir[] = "/tmp/kube-sa-XXXXXX";
    struct kube_config *cfg = NULL;
    struct err err = {0};
    char *tok = NULL, *path;

    ASSERT(mkdtemp(dir) != NULL);
    CHECK_EQ_INT(kube_config_load_incluster(&cfg, dir, "10.96.0.1", "443", &err), E_NOTFOUND);
    write_file(dir, "token", "first-token\n");
    write_file(dir, "namespace", "diverge-system");
    write_file(dir, "ca.crt", "-----BEGIN CERTIFICATE-----\n");
    CHECK_EQ_INT(kube_config_load_incluster(&cfg, dir, "10.96.0.1", "0", &err), E_INVALID);
    CHECK_EQ_INT(kube_config_load_incluster(&cfg, dir, "a/b", "443", &err), E_INVALID);
    CHECK_OK(kube_config_load_incluster(&cfg, dir, "fd00::1", "6443", &err));
    if (cfg == NULL) {
        return;
    }
    CHECK_EQ_STR(kube_config_server(cfg), "https://[fd00::1]:6443");
    CHECK_EQ_STR(kube_config_namespace(cfg), "diverge-system");
    CHECK(cfg->ca_file != NULL && strstr(cfg->ca_file, "/ca.crt") != NULL);
    CHECK_OK(kube_config_token_dup(&tok, cfg, &err));
    CHECK_EQ_STR(tok, "first-token");
    free(tok);
    /* kubelet rotates the token by swapping files: a new inode and size. */
    write_file(dir, "token.new", "second-token-longer\n");
    path = xasprintf("%s/token", dir);
    char *tmp = xasprintf("%s/token.new", dir);
    CHECK_OK(rename(tmp, path));
    CHECK_OK(kube_config_token_dup(&tok, cfg, &err));
    CHECK_EQ_STR(tok, "second-token-longer");
    free(tok);
    /* A token file that turns into garbage is an error, not a header injection. */
    write_file(dir, "token", "bad\r\nX-Evil: 1\n");
    CHECK_EQ_INT(kube_config_token_dup(&tok, cfg, &err), E_FAIL);
    CHECK(tok == NULL);
    unlink(path);
    CHECK_EQ_INT(kube_config_token_dup(&tok, cfg, &err), E_FAIL);
    kube_config_free(cfg);
    free(tmp);
    free(path);
    write_file(dir, "x", "");
    const char *const cmd[] = {"token", "namespace", "ca.crt", "x"};
    for (size_t i = 0; i < ARRAY_LEN(cmd); i++) {
        char *p = xasprintf("%s/%s", dir, cmd[i]);
        unlink(p);
        free(p);
    }
    rmdir(dir);
}

TEST(load_order_flag_then_env)
{
    char dir[] = "/tmp/kube-cfg-XXXXXX";
    struct kube_config *cfg = NULL;
    struct err err = {0};
    char *path, *env;

    ASSERT(mkdtemp(dir) != NULL);
    write_file(dir, "config", two_contexts);
    path = xasprintf("%s/config", dir);
    CHECK_OK(kube_config_load(&cfg, path, &err));
    CHECK(cfg != NULL && strstr(cfg->ca_file, dir) == cfg->ca_file);
    kube_config_free(cfg);
    env = xasprintf("%s/missing:%s", dir, path);
    setenv("KUBECONFIG", env, 1);
    CHECK_OK(kube_config_load(&cfg, NULL, &err));
    CHECK(cfg != NULL && strcmp(kube_config_server(cfg), "https://10.0.0.2:443") == 0);
    kube_config_free(cfg);
    setenv("KUBECONFIG", "/nonexistent/kc", 1);
    CHECK_EQ_INT(kube_config_load(&cfg, NULL, &err), E_NOTFOUND);
    unsetenv("KUBECONFIG");
    CHECK_EQ_INT(kube_config_load(&cfg, "/nonexistent/kc", &err), E_NOTFOUND);
    unlink(path);
    rmdir(dir);
    free(path);
    free(env);
}

T_MAIN
