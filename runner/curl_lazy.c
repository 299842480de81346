/* SPDX-License-Identifier: Apache-2.0 */
/* The runner's libcurl, loaded at run time. libcurl and the libraries it needs (TLS,
 * Kerberos, LDAP, IDN, ...) cost ~4.5 ms of the dynamic loader's time, and the runner's
 * start lies on the way from a comment to the agent; the runner's first HTTP call (the
 * first heartbeat) comes only after its start gate. So the executable defines the few
 * libcurl functions common/httpc.c calls; each forwards to libcurl.so.4, which a thread
 * started once main() read its environment loads (dlopen) while the runner waits at its
 * gate and checks out; a call that comes earlier waits for the load. Linked into the
 * diverge-agent-runner executable only (with --as-needed, so libcurl is not a NEEDED
 * library of it); the unit tests link libcurl itself. The loading thread is the runner's
 * early thread (early.c), which then sends the start's first heartbeat. When the library cannot be
 * loaded, every request fails with the loader's reason (httpc reports it). The runner waits for the
 * load before it exits (runner_curl_settle): libraries must not be set up while the process tears
 * them down. */
#define CURL_DISABLE_TYPECHECK
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>

#include <curl/curl.h>

#include "runner/runner.h"

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static char g_why[256]; /* why libcurl is not there, or "" */
static struct {
    CURLcode (*global_init)(long flags);
    CURL *(*easy_init)(void);
    CURLcode (*easy_setopt)(CURL *h, CURLoption opt, ...);
    CURLcode (*easy_perform)(CURL *h);
    void (*easy_cleanup)(CURL *h);
    void (*easy_reset)(CURL *h);
    CURLcode (*easy_getinfo)(CURL *h, CURLINFO info, ...);
    const char *(*easy_strerror)(CURLcode code);
    struct curl_slist *(*slist_append)(struct curl_slist *list, const char *s);
    void (*slist_free_all)(struct curl_slist *list);
} g;

static void *sym(void *h, const char *name)
{
    void *p = dlsym(h, name);

    if (p == NULL && g_why[0] == '\0') {
        snprintf(g_why, sizeof(g_why), "libcurl.so.4 has no %s", name);
    }
    return p;
}

static void load(void)
{
    void *h = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);

    if (h == NULL) {
        const char *e = dlerror();
        snprintf(g_why, sizeof(g_why), "load libcurl: %s", e != NULL ? e : "not found");
        return;
    }
    /* POSIX allows the object pointer to function pointer conversion for dlsym. */
    *(void **)&g.global_init = sym(h, "curl_global_init");
    *(void **)&g.easy_init = sym(h, "curl_easy_init");
    *(void **)&g.easy_setopt = sym(h, "curl_easy_setopt");
    *(void **)&g.easy_perform = sym(h, "curl_easy_perform");
    *(void **)&g.easy_cleanup = sym(h, "curl_easy_cleanup");
    *(void **)&g.easy_reset = sym(h, "curl_easy_reset");
    *(void **)&g.easy_getinfo = sym(h, "curl_easy_getinfo");
    *(void **)&g.easy_strerror = sym(h, "curl_easy_strerror");
    *(void **)&g.slist_append = sym(h, "curl_slist_append");
    *(void **)&g.slist_free_all = sym(h, "curl_slist_free_all");
}

/* Whether libcurl is loaded (waits for a load under way). */
static bool ready(void)
{
    pthread_once(&g_once, load);
    return g_why[0] == '\0';
}

static void preload(void)
{
    (void)ready();
}

void runner_curl_preload(void)
{
    runner_early_start(preload);
}

void runner_curl_wait(void)
{
    (void)ready();
}

void runner_curl_settle(void)
{
    runner_early_stop();
}

CURLcode curl_global_init(long flags)
{
    return ready() ? g.global_init(flags) : CURLE_FAILED_INIT;
}

CURL *curl_easy_init(void)
{
    return ready() ? g.easy_init() : NULL;
}

/* The option's number says the argument's type (curl.h's CURLOPTTYPE_ ranges). */
CURLcode curl_easy_setopt(CURL *h, CURLoption opt, ...)
{
    va_list ap;
    CURLcode rc;

    if (!ready()) {
        return CURLE_FAILED_INIT;
    }
    va_start(ap, opt);
    if (opt < CURLOPTTYPE_OBJECTPOINT) {
        rc = g.easy_setopt(h, opt, va_arg(ap, long));
    } else if (opt < CURLOPTTYPE_FUNCTIONPOINT) {
        rc = g.easy_setopt(h, opt, va_arg(ap, void *));
    } else if (opt < CURLOPTTYPE_OFF_T) {
        rc = g.easy_setopt(h, opt, va_arg(ap, void (*)(void)));
    } else if (opt < CURLOPTTYPE_BLOB) {
        rc = g.easy_setopt(h, opt, va_arg(ap, curl_off_t));
    } else {
        rc = g.easy_setopt(h, opt, va_arg(ap, void *));
    }
    va_end(ap);
    return rc;
}

CURLcode curl_easy_perform(CURL *h)
{
    return ready() ? g.easy_perform(h) : CURLE_FAILED_INIT;
}

void curl_easy_cleanup(CURL *h)
{
    if (ready()) {
        g.easy_cleanup(h);
    }
}

void curl_easy_reset(CURL *h)
{
    if (ready()) {
        g.easy_reset(h);
    }
}

/* Every CURLINFO takes a pointer to where the value goes. */
CURLcode curl_easy_getinfo(CURL *h, CURLINFO info, ...)
{
    va_list ap;
    CURLcode rc;

    if (!ready()) {
        return CURLE_FAILED_INIT;
    }
    va_start(ap, info);
    rc = g.easy_getinfo(h, info, va_arg(ap, void *));
    va_end(ap);
    return rc;
}

const char *curl_easy_strerror(CURLcode code)
{
    return ready() ? g.easy_strerror(code) : g_why;
}

struct curl_slist *curl_slist_append(struct curl_slist *list, const char *s)
{
    return ready() ? g.slist_append(list, s) : NULL;
}

void curl_slist_free_all(struct curl_slist *list)
{
    if (ready()) {
        g.slist_free_all(list);
    }
}
