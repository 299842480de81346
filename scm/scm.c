/* SPDX-License-Identifier: Apache-2.0 */
/* Shared pieces of the SCM interface: permission levels and the provider registry. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/buf.h"

#include "scm/scm.h"

static const struct {
    enum scm_level level;
    const char *name;
} g_levels[] = {
    {SCM_LEVEL_NONE, "none"},   {SCM_LEVEL_READ, "read"},         {SCM_LEVEL_TRIAGE, "triage"},
    {SCM_LEVEL_WRITE, "write"}, {SCM_LEVEL_MAINTAIN, "maintain"}, {SCM_LEVEL_ADMIN, "admin"},
};

const char *scm_level_name(enum scm_level level)
{
    for (size_t i = 0; i < ARRAY_LEN(g_levels); i++) {
        if (g_levels[i].level == level) {
            return g_levels[i].name;
        }
    }
    return "none";
}

const char *scm_level_name_for(const char *provider, enum scm_level level)
{
    static const char *const gitlab[] = {"no access (0)",  "Guest (10)",      "Reporter (20)",
                                         "Developer (30)", "Maintainer (40)", "Owner (50)"};
    int i = (int)level / 10;

    if (provider == NULL || strcmp(provider, "gitlab") != 0 || i < 0 || i > 5) {
        return scm_level_name(level);
    }
    return gitlab[i];
}

int scm_level_parse(enum scm_level *out, const char *s)
{
    char *end = NULL;
    long n;

    for (size_t i = 0; i < ARRAY_LEN(g_levels); i++) {
        if (strcmp(g_levels[i].name, s) == 0) {
            *out = g_levels[i].level;
            return E_OK;
        }
    }
    n = strtol(s, &end, 10);
    if (end != s && *end == '\0' && n >= 0 && n <= 50) {
        *out = (enum scm_level)(n >= 50 ? 50 : n - n % 10);
        return E_OK;
    }
    return E_INVALID;
}

void scm_comments_free(struct scm_comment *c, size_t n)
{
    for (size_t i = 0; c != NULL && i < n; i++) {
        free(c[i].id);
        free(c[i].author);
        free(c[i].body);
    }
    free(c);
}

void scm_pull_cleanup(struct scm_pull *p)
{
    free(p->head_ref);
    free(p->base_ref);
    free(p->clone_url);
    free(p->html_url);
    free(p->base_url);
    memset(p, 0, sizeof(*p));
}

struct scm_provider *scm_registry_get(const struct scm_registry *r, const char *name)
{
    size_t n = atomic_load_explicit(&r->n, memory_order_acquire);

    for (size_t i = 0; i < n; i++) {
        if (strcmp(r->providers[i]->ops->name, name) == 0) {
            return r->providers[i];
        }
    }
    return NULL;
}

void scm_registry_add(struct scm_registry *r, struct scm_provider *p)
{
    size_t n = atomic_load_explicit(&r->n, memory_order_relaxed);

    ASSERT(n < SCM_PROVIDERS_MAX);
    r->providers[n] = p;
    atomic_store_explicit(&r->n, n + 1, memory_order_release);
}

void scm_registry_cleanup(struct scm_registry *r)
{
    size_t n = atomic_load_explicit(&r->n, memory_order_relaxed);

    for (size_t i = 0; i < n; i++) {
        scm_provider_free(r->providers[i]);
    }
    atomic_store_explicit(&r->n, 0, memory_order_relaxed);
}

int64_t scm_rate_wait(const struct scm_rate *r, int cap, int64_t now_ms)
{
    /* The call CAP calls ago must be a full window old. */
    int64_t oldest = r->sent_ms[(r->next + SCM_RATE_SLOTS - (size_t)cap) % SCM_RATE_SLOTS];

    return oldest != 0 && now_ms - oldest < SCM_RATE_WINDOW_MS
               ? SCM_RATE_WINDOW_MS - (now_ms - oldest)
               : 0;
}

void scm_rate_note(struct scm_rate *r, int64_t now_ms)
{
    r->sent_ms[r->next] = now_ms;
    r->next = (r->next + 1) % SCM_RATE_SLOTS;
}

static bool unreserved(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '.' || c == '_' || c == '~';
}

/* Appends the encoded segment S[0..n) to B. */
static void escape_segment(struct buf *b, const char *s, size_t n)
{
    bool dots = n > 0;

    for (size_t i = 0; i < n; i++) {
        dots = dots && s[i] == '.';
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        /* The buffer has no cap: appends cannot fail. */
        (void)(unreserved(c) && !dots ? buf_append(b, &c, 1)
                                      : buf_printf(b, "%%%02X", (unsigned)c));
    }
}

char *scm_path_escape(const char *s, bool keep_slash)
{
    struct buf b;
    const char *seg = s;

    buf_init(&b, 0);
    for (;;) {
        const char *slash = keep_slash ? strchr(seg, '/') : NULL;
        size_t n = slash != NULL ? (size_t)(slash - seg) : strlen(seg);
        escape_segment(&b, seg, n);
        if (slash == NULL) {
            break;
        }
        (void)buf_append(&b, "/", 1);
        seg = slash + 1;
    }
    return buf_take(&b);
}

char *scm_repo_url(const char *api_base, const char *project, const char *tail)
{
    char *p = scm_path_escape(project, true);
    char *url = xasprintf("%s/repos/%s%s", api_base, p, tail);

    free(p);
    return url;
}

/* The parts of an absolute http(s) URL; pointers into it. */
struct url_parts {
    const char *scheme; /* "http" or "https" */
    size_t scheme_len;
    const char *host; /* host or [v6], without the port */
    size_t host_len;
    char port[8];     /* the port, explicit or the scheme's default */
    const char *path; /* from the first '/', '?' or '#' after the authority; may be "" */
};

/* True for the scheme "http" or "https" (any case), the LEN bytes at S. */
static bool http_scheme(const char *s, size_t len)
{
    return (len == 4 && strncasecmp(s, "http", 4) == 0) ||
           (len == 5 && strncasecmp(s, "https", 5) == 0);
}

/* The ':' before the port in the authority [AUTH, END), or END when it names no port. */
static const char *port_colon(const char *auth, const char *end)
{
    size_t n = (size_t)(end - auth);
    const char *c;

    if (auth < end && *auth == '[') {
        const char *close = memchr(auth, ']', n);
        return close != NULL && close + 1 < end && close[1] == ':' ? close + 1 : end;
    }
    c = memchr(auth, ':', n);
    return c != NULL ? c : end;
}

/* Sets U's port to what follows COLON up to END, or the scheme's default when COLON is
 * END. False when it does not fit. */
static bool set_port(struct url_parts *u, const char *colon, const char *end)
{
    size_t len = colon < end ? (size_t)(end - colon - 1) : 0;

    if (len >= sizeof(u->port)) {
        return false;
    }
    if (len > 0) {
        memcpy(u->port, colon + 1, len);
    } else {
        snprintf(u->port, sizeof(u->port), "%s", u->scheme_len == 5 ? "443" : "80");
    }
    return true;
}

static bool url_split(struct url_parts *u, const char *url)
{
    const char *sep = strstr(url, "://"), *auth, *end, *colon;

    memset(u, 0, sizeof(*u));
    if (sep == NULL) {
        return false;
    }
    u->scheme = url;
    u->scheme_len = (size_t)(sep - url);
    if (!http_scheme(url, u->scheme_len)) {
        return false;
    }
    auth = sep + 3;
    end = auth + strcspn(auth, "/?#");
    if (memchr(auth, '@', (size_t)(end - auth)) != NULL ||
        memchr(auth, '\\', (size_t)(end - auth)) != NULL) {
        return false; /* user info: never sent credentials to whatever it hides */
    }
    colon = port_colon(auth, end);
    u->host = auth;
    u->host_len = (size_t)(colon - auth);
    if (u->host_len == 0 || !set_port(u, colon, end)) {
        return false;
    }
    u->path = end;
    return true;
}

static bool strcasestr_ascii(const char *hay, const char *needle)
{
    size_t n = strlen(needle);

    for (; *hay != '\0'; hay++) {
        if (strncasecmp(hay, needle, n) == 0) {
            return true;
        }
    }
    return false;
}

/* True when A and B have the same scheme, host and port (case-insensitively). */
static bool same_origin(const struct url_parts *a, const struct url_parts *b)
{
    return a->scheme_len == b->scheme_len &&
           strncasecmp(a->scheme, b->scheme, a->scheme_len) == 0 && a->host_len == b->host_len &&
           strncasecmp(a->host, b->host, a->host_len) == 0 && strcmp(a->port, b->port) == 0;
}

/* The length of PATH without its query, fragment and trailing '/'s. */
static size_t base_path_len(const char *path)
{
    size_t len = strcspn(path, "?#");

    while (len > 0 && path[len - 1] == '/') {
        len--;
    }
    return len;
}

/* True when PATH is the base path (its first BLEN bytes of BASE) or goes below it. */
static bool path_under(const char *path, const char *base, size_t blen)
{
    if (strstr(path, "/.") != NULL || strcasestr_ascii(path, "%2e")) {
        return false; /* a dot segment, plain or encoded, could climb out of the base */
    }
    return strncmp(path, base, blen) == 0 &&
           (path[blen] == '\0' || path[blen] == '/' || path[blen] == '?' || path[blen] == '#');
}

bool scm_url_under(const char *api_base, const char *url)
{
    struct url_parts b, u;

    if (!url_split(&b, api_base) || !url_split(&u, url) || !same_origin(&b, &u)) {
        return false;
    }
    return path_under(u.path, b.path, base_path_len(b.path));
}
