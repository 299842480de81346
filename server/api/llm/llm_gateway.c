/* SPDX-License-Identifier: Apache-2.0 */
/* The gateway's configuration (upstreams, keys, prices: SPEC §13) and its per-task table
 * of reservations. Keys live only here: never logged, never in an error message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/secret.h"
#include "server/api/llm/llm_int.h"

#define LLM_KEY_FILE_MAX 8192 /* bytes of a key file */
#define LLM_PRICES_FILE_MAX (1u << 20)

static const char *const g_names[LLM_PROVIDER_COUNT] = {"anthropic", "openai", "gemini"};
static const char *const g_default_urls[LLM_PROVIDER_COUNT] = {
    "https://api.anthropic.com", "https://api.openai.com",
    "https://generativelanguage.googleapis.com"};
static const char *const g_key_env[LLM_PROVIDER_COUNT] = {
    "DIVERGE_ANTHROPIC_API_KEY", "DIVERGE_OPENAI_API_KEY", "DIVERGE_GEMINI_API_KEY"};

const char *llm_provider_name(enum llm_provider p)
{
    return p < LLM_PROVIDER_COUNT ? g_names[p] : "unknown";
}

static int provider_of(enum llm_provider *out, const char *name, size_t len)
{
    for (int i = 0; i < LLM_PROVIDER_COUNT; i++) {
        if (strlen(g_names[i]) == len && strncmp(g_names[i], name, len) == 0) {
            *out = (enum llm_provider)i;
            return E_OK;
        }
    }
    return E_INVALID;
}

static void wipe_free(char *s)
{
    if (s != NULL) {
        secret_wipe(s, strlen(s));
        free(s);
    }
}

/* Calls FN for each "NAME=VALUE" item of the comma list CSV (NULL: none). */
static int each_pair(struct llm_gateway *gw, const char *csv, const char *flag,
                     int (*fn)(struct llm_gateway *gw, enum llm_provider p, const char *value,
                               const char *flag, struct err *err),
                     struct err *err)
{
    char *copy = csv != NULL ? xstrdup(csv) : NULL;
    char *item = copy;
    int rc = E_OK;

    while (item != NULL && rc == E_OK) {
        char *comma = strchr(item, ',');
        char *eq;
        enum llm_provider p;
        if (comma != NULL) {
            *comma = '\0';
        }
        eq = strchr(item, '=');
        if (item[0] != '\0') {
            if (eq == NULL || eq[1] == '\0' || provider_of(&p, item, (size_t)(eq - item)) != E_OK) {
                rc = err_set(err, E_INVALID, "%s: NAME=VALUE with NAME anthropic, openai or gemini",
                             flag);
                break;
            }
            rc = fn(gw, p, eq + 1, flag, err);
        }
        item = comma != NULL ? comma + 1 : NULL;
    }
    free(copy);
    return rc;
}

static int set_upstream(struct llm_gateway *gw, enum llm_provider p, const char *url,
                        const char *flag, struct err *err)
{
    size_t n = strlen(url);

    if ((strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0) ||
        strchr(url, '?') != NULL || strchr(url, '#') != NULL || n > 1024) {
        return err_set(err, E_INVALID, "%s: %s needs an http:// or https:// base URL", flag,
                       g_names[p]);
    }
    while (n > 0 && url[n - 1] == '/') {
        n--;
    }
    free(gw->upstream[p]);
    gw->upstream[p] = xasprintf("%.*s", (int)n, url);
    return E_OK;
}

static int set_key_file(struct llm_gateway *gw, enum llm_provider p, const char *path,
                        const char *flag, struct err *err)
{
    char *data = NULL;
    size_t len = 0, start = 0;
    struct err ferr = {0};
    int rc = secret_file_read(&data, &len, path, LLM_KEY_FILE_MAX, &ferr);

    if (rc != E_OK) {
        return err_set(err, rc == E_NOTFOUND ? E_INVALID : rc, "%s %s: %s", flag, g_names[p],
                       rc == E_NOTFOUND ? "no such file" : ferr.msg);
    }
    while (len > 0 && (data[len - 1] == '\n' || data[len - 1] == '\r' || data[len - 1] == ' ')) {
        len--;
    }
    while (start < len && data[start] == ' ') {
        start++;
    }
    for (size_t i = start; i < len; i++) {
        if ((unsigned char)data[i] < 0x21 || (unsigned char)data[i] > 0x7e) {
            secret_wipe(data, len);
            free(data);
            return err_set(err, E_INVALID, "%s %s: the key must be one line of printable ASCII",
                           flag, g_names[p]);
        }
    }
    wipe_free(gw->key[p]);
    gw->key[p] = len > start ? xasprintf("%.*s", (int)(len - start), data + start) : NULL;
    secret_wipe(data, len);
    free(data);
    return gw->key[p] != NULL
               ? E_OK
               : err_set(err, E_INVALID, "%s %s: the file is empty", flag, g_names[p]);
}

static int load_prices(struct llm_gateway *gw, const char *path, struct err *err)
{
    FILE *f;
    struct buf b;
    char chunk[4096];
    size_t n;
    int rc = E_OK;

    if (path == NULL) {
        llm_prices_default(&gw->prices);
        return E_OK;
    }
    f = fopen(path, "re");
    if (f == NULL) {
        return err_set(err, E_INVALID, "--llm-prices: cannot read the file");
    }
    buf_init(&b, LLM_PRICES_FILE_MAX);
    while (rc == E_OK && (n = fread(chunk, 1, sizeof(chunk), f)) > 0) {
        rc = buf_append(&b, chunk, n);
    }
    fclose(f);
    if (rc != E_OK) {
        buf_cleanup(&b);
        return err_set(err, E_INVALID, "--llm-prices: the file is over 1 MiB");
    }
    rc = llm_prices_parse(&gw->prices, b.data != NULL ? b.data : "", b.len, err);
    buf_cleanup(&b);
    if (rc != E_OK) {
        struct err e2 = *err;
        return err_set(err, rc, "--llm-prices: %s", e2.msg);
    }
    return E_OK;
}

void llm_gateway_free(struct llm_gateway *gw)
{
    if (gw == NULL) {
        return;
    }
    pthread_mutex_lock(&gw->mu);
    while (gw->active > 0) {
        pthread_cond_wait(&gw->idle, &gw->mu);
    }
    pthread_mutex_unlock(&gw->mu);
    for (int i = 0; i < LLM_PROVIDER_COUNT; i++) {
        free(gw->upstream[i]);
        wipe_free(gw->key[i]);
    }
    llm_prices_cleanup(&gw->prices);
    httpc_pool_free(gw->pool);
    pthread_mutex_destroy(&gw->mu);
    pthread_cond_destroy(&gw->idle);
    pthread_cond_destroy(&gw->settled);
    free(gw);
}

int llm_gateway_new(struct llm_gateway **out, const char *upstreams, const char *key_files,
                    const char *prices_file, struct err *err)
{
    struct llm_gateway *gw = xcalloc(1, sizeof(*gw));
    int rc;

    *out = NULL;
    pthread_mutex_init(&gw->mu, NULL);
    pthread_cond_init(&gw->idle, NULL);
    pthread_cond_init(&gw->settled, NULL);
    gw->pool = httpc_pool_new(LLM_POOL_IDLE);
    {
        /* Tests only (docs/testing.md): hold each charge back, to kill the server before
         * it commits. */
        const char *d = getenv("DIVERGE_TEST_LLM_SETTLE_DELAY_MS");
        gw->settle_delay_ms = d != NULL ? strtol(d, NULL, 10) : 0;
        if (gw->settle_delay_ms < 0 || gw->settle_delay_ms > 600000) {
            gw->settle_delay_ms = 0;
        }
    }
    for (int i = 0; i < LLM_PROVIDER_COUNT; i++) {
        const char *k = getenv(g_key_env[i]);
        gw->upstream[i] = xstrdup(g_default_urls[i]);
        gw->key[i] = k != NULL && k[0] != '\0' ? xstrdup(k) : NULL;
        /* No child (sandbox, agent, git) may inherit a provider key. */
        unsetenv(g_key_env[i]);
    }
    rc = each_pair(gw, upstreams, "--llm-upstream", set_upstream, err);
    if (rc == E_OK) {
        rc = each_pair(gw, key_files, "--llm-key-file", set_key_file, err);
    }
    if (rc == E_OK) {
        rc = load_prices(gw, prices_file, err);
    }
    if (rc != E_OK) {
        llm_gateway_free(gw);
        return rc;
    }
    *out = gw;
    return E_OK;
}
