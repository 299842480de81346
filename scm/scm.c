/* SPDX-License-Identifier: Apache-2.0 */
/* Shared pieces of the SCM interface: permission levels and the provider registry. */
#include <stdlib.h>
#include <string.h>

#include "scm/scm.h"

static const struct {
    enum scm_level level;
    const char *name;
} g_levels[] = {
    {SCM_LEVEL_NONE, "none"},     {SCM_LEVEL_READ, "read"},         {SCM_LEVEL_TRIAGE, "triage"},
    {SCM_LEVEL_WRITE, "write"},   {SCM_LEVEL_MAINTAIN, "maintain"}, {SCM_LEVEL_ADMIN, "admin"},
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
    memset(p, 0, sizeof(*p));
}

struct scm_provider *scm_registry_get(const struct scm_registry *r, const char *name)
{
    for (size_t i = 0; i < r->n; i++) {
        if (strcmp(r->providers[i]->ops->name, name) == 0) {
            return r->providers[i];
        }
    }
    return NULL;
}

void scm_registry_add(struct scm_registry *r, struct scm_provider *p)
{
    ASSERT(r->n < SCM_PROVIDERS_MAX);
    r->providers[r->n++] = p;
}

void scm_registry_cleanup(struct scm_registry *r)
{
    for (size_t i = 0; i < r->n; i++) {
        scm_provider_free(r->providers[i]);
    }
    r->n = 0;
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
