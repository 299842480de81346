/* SPDX-License-Identifier: Apache-2.0 */
/* The credential git uses over http(s) on the GitHub web host (SPEC §9): with a GitHub App
 * an installation access token of the repository's installation (from the App's token
 * cache in auth.c), with a PAT the PAT. */
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/secret.h"
#include "scm/github/github.h"
#include "scm/github/github_int.h"

#define BEARER "Bearer "

int github_repo_installation(int64_t *id_out, struct github_auth *a, const char *api_url,
                             const char *project, struct err *err)
{
    size_t n = strlen(api_url);
    char *base = xstrndup(api_url, n > 0 && api_url[n - 1] == '/' ? n - 1 : n);
    char *url = scm_repo_url(base, project, "/installation");
    json_t *ans = NULL, *id;
    int rc;

    *id_out = 0;
    /* The app JWT itself (installation 0) asks which installation covers the repository. */
    rc = github_rest_call(&ans, NULL, a, "GET", url, 0, NULL, NULL, err);
    id = json_object_get(ans, "id");
    if (rc == E_OK) {
        if (json_is_integer(id) && json_integer_value(id) > 0) {
            *id_out = json_integer_value(id);
        } else {
            rc = err_set(err, E_FAIL, "github answered no installation id for %s", project);
        }
    }
    json_decref(ans);
    free(url);
    free(base);
    return rc;
}

int github_git_token(char **token_out, struct github_auth *a, const char *api_url,
                     const char *project, int64_t installation_id, struct err *err)
{
    char *header = NULL;
    int64_t id = installation_id;
    int rc = E_OK;

    *token_out = NULL;
    if (github_auth_is_app(a) && id <= 0) {
        rc = github_repo_installation(&id, a, api_url, project, err);
    }
    if (rc == E_OK) {
        rc = github_auth_header(&header, a, github_auth_is_app(a) ? id : 0, err);
    }
    if (rc == E_OK) {
        if (strncmp(header, BEARER, strlen(BEARER)) == 0 && header[strlen(BEARER)] != '\0') {
            *token_out = xstrdup(header + strlen(BEARER));
        } else {
            rc = err_set(err, E_FAIL, "github credentials gave no bearer token");
        }
    }
    if (header != NULL) {
        secret_wipe(header, strlen(header));
        free(header);
    }
    return rc;
}
