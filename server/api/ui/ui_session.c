/* SPDX-License-Identifier: Apache-2.0 */
/* Dashboard login sessions (SPEC §12): the cookie carries a random session id, never the
 * admin token. Sessions live in memory only (a restart logs every browser out), expire
 * UI_SESSION_TTL_MS after the login, and at most UI_SESSIONS_MAX exist: a new login
 * evicts the oldest. Ids are compared in constant time against every live session. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/secret.h"
#include "server/api/api_int.h"

struct ui_session {
    char id[UI_SESSION_ID_LEN + 1]; /* hex of 32 random bytes; "" when the slot is free */
    int64_t created_ms;             /* the clock's time of the login */
};

struct ui_sessions {
    pthread_mutex_t mu;
    struct ui_session slots[UI_SESSIONS_MAX]; /* under mu */
};

void ui_sessions_new(struct ui_sessions **out)
{
    struct ui_sessions *s = xcalloc(1, sizeof(*s));

    pthread_mutex_init(&s->mu, NULL);
    *out = s;
}

void ui_sessions_free(struct ui_sessions *s)
{
    if (s == NULL) {
        return;
    }
    secret_wipe(s->slots, sizeof(s->slots));
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static bool live(const struct ui_session *x, int64_t now_ms)
{
    return x->id[0] != '\0' && now_ms - x->created_ms < UI_SESSION_TTL_MS &&
           now_ms >= x->created_ms;
}

void ui_session_create(char out[UI_SESSION_ID_LEN + 1], struct ui_sessions *s, int64_t now_ms)
{
    unsigned char raw[UI_SESSION_ID_LEN / 2];
    size_t victim = 0;

    secret_random(raw, sizeof(raw));
    secret_hex(out, raw, sizeof(raw));
    secret_wipe(raw, sizeof(raw));
    pthread_mutex_lock(&s->mu);
    /* A free or expired slot, else the oldest login. */
    for (size_t i = 0; i < UI_SESSIONS_MAX; i++) {
        if (!live(&s->slots[i], now_ms)) {
            victim = i;
            break;
        }
        if (s->slots[i].created_ms < s->slots[victim].created_ms) {
            victim = i;
        }
    }
    memcpy(s->slots[victim].id, out, UI_SESSION_ID_LEN + 1);
    s->slots[victim].created_ms = now_ms;
    pthread_mutex_unlock(&s->mu);
}

/* Constant time in the id: every byte of every slot is compared. */
static bool id_equal(const char *a, const char *b)
{
    unsigned char diff = 0;

    for (size_t i = 0; i < UI_SESSION_ID_LEN; i++) {
        diff |= (unsigned char)(a[i] ^ b[i]);
    }
    return diff == 0;
}

/* The slot holding ID, or -1; ID must be UI_SESSION_ID_LEN characters. Under s->mu. */
static int find(struct ui_sessions *s, const char *id, int64_t now_ms)
{
    int found = -1;

    for (size_t i = 0; i < UI_SESSIONS_MAX; i++) {
        bool eq = id_equal(s->slots[i].id, id);
        if (eq && live(&s->slots[i], now_ms)) {
            found = (int)i;
        }
    }
    return found;
}

static bool well_formed(const char *id)
{
    return id != NULL && strlen(id) == UI_SESSION_ID_LEN;
}

bool ui_session_valid(struct ui_sessions *s, const char *id, int64_t now_ms)
{
    bool ok;

    if (s == NULL || !well_formed(id)) {
        return false;
    }
    pthread_mutex_lock(&s->mu);
    ok = find(s, id, now_ms) >= 0;
    pthread_mutex_unlock(&s->mu);
    return ok;
}

bool ui_session_end(struct ui_sessions *s, const char *id, int64_t now_ms)
{
    int i;

    if (s == NULL || !well_formed(id)) {
        return false;
    }
    pthread_mutex_lock(&s->mu);
    i = find(s, id, now_ms);
    if (i >= 0) {
        secret_wipe(&s->slots[i], sizeof(s->slots[i]));
    }
    pthread_mutex_unlock(&s->mu);
    return i >= 0;
}
