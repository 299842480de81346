/* SPDX-License-Identifier: Apache-2.0 */
/* The state values of pending one-click GitHub App setups (the CSRF check of the
 * callback): random, bound to the admin's dashboard session (or to the bearer header),
 * used once, expiring after GH_SETUP_STATE_TTL_MS, at most GH_SETUP_STATES_MAX (a new one
 * evicts the oldest). In memory: a restart forgets them. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/secret.h"
#include "server/api/api.h"

#define BINDING_MAX 64 /* a session id; "" for the bearer header */

struct gh_state {
    char state[GH_SETUP_STATE_LEN + 1]; /* hex; "" when the slot is free */
    char binding[BINDING_MAX + 1];      /* the session id it was made for, or "" */
    int64_t created_ms;                 /* monotonic ms */
};

struct gh_setup {
    pthread_mutex_t mu;
    struct gh_state slots[GH_SETUP_STATES_MAX]; /* under mu */
    bool busy;                                  /* a callback is exchanging; under mu */
};

void gh_setup_new(struct gh_setup **out)
{
    struct gh_setup *s = xcalloc(1, sizeof(*s));

    pthread_mutex_init(&s->mu, NULL);
    *out = s;
}

void gh_setup_free(struct gh_setup *s)
{
    if (s == NULL) {
        return;
    }
    secret_wipe(s->slots, sizeof(s->slots));
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static bool live(const struct gh_state *x, int64_t now_ms)
{
    return x->state[0] != '\0' && now_ms >= x->created_ms &&
           now_ms - x->created_ms < GH_SETUP_STATE_TTL_MS;
}

void gh_setup_state_create(char out[GH_SETUP_STATE_LEN + 1], struct gh_setup *s,
                           const char *binding, int64_t now_ms)
{
    unsigned char raw[GH_SETUP_STATE_LEN / 2];
    size_t victim = 0;

    ASSERT(strlen(binding) <= BINDING_MAX);
    secret_random(raw, sizeof(raw));
    secret_hex(out, raw, sizeof(raw));
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < GH_SETUP_STATES_MAX; i++) {
        if (!live(&s->slots[i], now_ms)) {
            victim = i;
            break;
        }
        if (s->slots[i].created_ms < s->slots[victim].created_ms) {
            victim = i;
        }
    }
    memcpy(s->slots[victim].state, out, GH_SETUP_STATE_LEN + 1);
    memset(s->slots[victim].binding, 0, sizeof(s->slots[victim].binding)); /* compared whole */
    snprintf(s->slots[victim].binding, sizeof(s->slots[victim].binding), "%s", binding);
    s->slots[victim].created_ms = now_ms;
    pthread_mutex_unlock(&s->mu);
}

/* Compares the N bytes of A and B in constant time. */
static bool same(const char *a, const char *b, size_t n)
{
    unsigned char diff = 0;

    for (size_t i = 0; i < n; i++) {
        diff |= (unsigned char)(a[i] ^ b[i]);
    }
    return diff == 0;
}

bool gh_setup_state_take(struct gh_setup *s, const char *state, const char *binding, int64_t now_ms)
{
    char want[BINDING_MAX + 1] = {0};
    int found = -1;

    if (state == NULL || strlen(state) != GH_SETUP_STATE_LEN || strlen(binding) > BINDING_MAX) {
        return false;
    }
    memcpy(want, binding, strlen(binding));
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < GH_SETUP_STATES_MAX; i++) {
        bool eq = same(s->slots[i].state, state, GH_SETUP_STATE_LEN) &&
                  same(s->slots[i].binding, want, sizeof(want));
        if (eq && live(&s->slots[i], now_ms)) {
            found = (int)i;
        }
    }
    if (found >= 0) {
        secret_wipe(&s->slots[found], sizeof(s->slots[found]));
    }
    pthread_mutex_unlock(&s->mu);
    return found >= 0;
}

bool gh_setup_begin(struct gh_setup *s)
{
    bool ok;

    pthread_mutex_lock(&s->mu);
    ok = !s->busy;
    s->busy = true;
    pthread_mutex_unlock(&s->mu);
    return ok;
}

void gh_setup_end(struct gh_setup *s)
{
    pthread_mutex_lock(&s->mu);
    s->busy = false;
    pthread_mutex_unlock(&s->mu);
}
