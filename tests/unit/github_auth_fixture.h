/* SPDX-License-Identifier: Apache-2.0 */
/* Fixtures shared by the scm/github credential tests (test_github_auth*.c): RSA, EC and
 * broken key files made once per test binary by the openssl tool in a temporary directory
 * (removed at exit), a settable clock and an App built on a fixture key. */
#ifndef DIVERGE_TESTS_UNIT_GITHUB_AUTH_FIXTURE_H
#define DIVERGE_TESTS_UNIT_GITHUB_AUTH_FIXTURE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/clock.h"
#include "common/err.h"
#include "scm/github/github_auth.h"
#include "tests/t_check.h"

#define T0 INT64_C(1764410400000) /* 2025-11-29T10:00:00Z */
#define APP_ID "12345"

/* ---- fixture: keys made once by the openssl tool in a temporary directory ---- */

static char g_dir[] = "/tmp/test_github_auth-XXXXXX";
static bool g_ready;

static inline void remove_dir(void)
{
    char *cmd = xasprintf("rm -rf '%s'", g_dir);

    if (system(cmd) != 0) {
        fprintf(stderr, "could not remove %s\n", g_dir);
    }
    free(cmd);
}

/* Runs CMD in the fixture directory. */
static inline void sh(const char *cmd)
{
    char *line = xasprintf("cd '%s' && %s 2>/dev/null", g_dir, cmd);

    if (system(line) != 0) {
        t_fail(__FILE__, __LINE__, "fixture command failed: %s", line);
    }
    free(line);
}

/* Path of fixture file NAME (caller frees); generates all keys on first use. */
static inline char *fixture(const char *name)
{
    if (!g_ready) {
        if (mkdtemp(g_dir) == NULL) {
            t_fail(__FILE__, __LINE__, "mkdtemp failed");
        }
        atexit(remove_dir);
        sh("openssl genrsa -out key8.pem 2048");                   /* OpenSSL 3 writes PKCS#8 */
        sh("openssl rsa -in key8.pem -traditional -out key1.pem"); /* PKCS#1 */
        sh("openssl pkey -in key8.pem -pubout -out pub.pem");
        sh("openssl genrsa -out small.pem 1024");
        sh("openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ec.pem");
        sh("openssl genrsa -aes256 -passout pass:x -out enc.pem 2048");
        sh("printf -- '-----BEGIN PRIVATE KEY-----\\nbm90IGEga2V5\\n-----END PRIVATE KEY-----\\n'"
           " > bad.pem && : > empty.pem");
        g_ready = true;
    }
    return xasprintf("%s/%s", g_dir, name);
}

static inline int64_t fake_now(void *userdata)
{
    return *(const int64_t *)userdata;
}

static inline int new_app(struct github_auth **out, const char *url, const char *key,
                          const struct clock *c, struct err *err)
{
    char *path = fixture(key);
    int rc = github_auth_new_app(out, url, APP_ID, path, c, err);

    free(path);
    return rc;
}

#endif
