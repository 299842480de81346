/* SPDX-License-Identifier: Apache-2.0 */
/* `diverge kubeconfig` (SPEC §10): prints a kubeconfig for kubectl against the embedded
 * server's TLS listener. `diverge serve --tls-listen` writes <data-dir>/tls-endpoint (the
 * HTTPS URL and the certificate's path); the certificate becomes the cluster's CA (the
 * generated one is self-signed, its own CA) and the admin token the user's token. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_int.h"
#include "common/tlscert.h"

#define ENDPOINT_FILE "tls-endpoint"

/* The endpoint the server recorded in DIR: *server_out and *ca_path_out (caller frees). */
static int read_endpoint(char **server_out, char **ca_path_out, const char *dir, struct err *err)
{
    char *path = xasprintf("%s/%s", dir, ENDPOINT_FILE);
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    const char *server = json_string_value(json_object_get(j, "server"));
    const char *ca = json_string_value(json_object_get(j, "certificateAuthority"));
    int rc = E_OK;

    *server_out = NULL;
    *ca_path_out = NULL;
    if (j == NULL) {
        rc = err_set(err, E_NOTFOUND,
                     "no TLS listener recorded in %s: start the server with --tls-listen "
                     "127.0.0.1:8443 (and the same DIVERGE_DATA_DIR)",
                     path);
    } else if (server == NULL || ca == NULL || strncmp(server, "https://", 8) != 0) {
        rc = err_set(err, E_INVALID,
                     "%s: expected {\"server\": \"https://...\", "
                     "\"certificateAuthority\": \"PATH\"}",
                     path);
    } else {
        *server_out = xstrdup(server);
        *ca_path_out = xstrdup(ca);
    }
    json_decref(j);
    free(path);
    return rc;
}

/* S as a YAML double-quoted scalar (JSON string syntax is valid YAML); caller frees. */
static char *yaml_quote(const char *s)
{
    json_t *j = json_string(s);
    char *q = j != NULL ? json_dumps(j, JSON_ENCODE_ANY) : NULL;

    json_decref(j);
    return q != NULL ? q : xstrdup("\"\"");
}

static void print_kubeconfig(const char *server, const char *ca_b64, const char *token,
                             const char *ns)
{
    char *qs = yaml_quote(server), *qt = yaml_quote(token), *qn = yaml_quote(ns);

    printf("apiVersion: v1\n"
           "kind: Config\n"
           "clusters:\n"
           "- name: diverge\n"
           "  cluster:\n"
           "    server: %s\n"
           "    certificate-authority-data: %s\n"
           "users:\n"
           "- name: diverge-admin\n"
           "  user:\n"
           "    token: %s\n"
           "contexts:\n"
           "- name: diverge\n"
           "  context:\n"
           "    cluster: diverge\n"
           "    user: diverge-admin\n"
           "    namespace: %s\n"
           "current-context: diverge\n",
           qs, ca_b64, qt, qn);
    free(qs);
    free(qt);
    free(qn);
}

int cli_kubeconfig(struct cli_ctx *ctx, const struct cli_args *args)
{
    const char *dir = getenv("DIVERGE_DATA_DIR");
    char *server = NULL, *ca_path = NULL, *pem = NULL, *b64 = NULL;
    struct err err = {0};
    int rc;

    (void)args;
    if (dir == NULL || dir[0] == '\0') {
        dir = "./var";
    }
    if (ctx->token == NULL) {
        cli_errorf("kubeconfig: no admin token: %s/api-token is missing (set DIVERGE_DATA_DIR "
                   "or DIVERGE_API_TOKEN)",
                   dir);
        return CLI_EXIT_FAILED;
    }
    rc = read_endpoint(&server, &ca_path, dir, &err);
    if (rc == E_OK) {
        rc = tlscert_read_pem(&pem, ca_path, "certificate", &err);
    }
    if (rc != E_OK) {
        cli_errorf("kubeconfig: %s", err.msg);
        free(server);
        free(ca_path);
        return CLI_EXIT_FAILED;
    }
    b64 = tlscert_base64(pem, strlen(pem));
    print_kubeconfig(server, b64, ctx->token, ctx->ns);
    free(b64);
    free(pem);
    free(server);
    free(ca_path);
    return CLI_EXIT_OK;
}
