/* SPDX-License-Identifier: Apache-2.0 */
/* What the store backends (store/sqlite/, store/kube/) share, declared in store_backend.h:
 * filling a change-feed event, new uids, the queue's change counter and its wait, the claim
 * step of a queue's pick, and the release of queue entries. */
#include <stdlib.h>
#include <string.h>

#include "common/secret.h"
#include "store/store_backend.h"

void inbox_entry_cleanup(struct inbox_entry *e)
{
    free(e->delivery_id);
    free(e->project);
    free(e->comment_id);
    free(e->author);
    free(e->author_association);
    free(e->body);
    free(e->extra);
    memset(e, 0, sizeof(*e));
}

void outbox_entry_cleanup(struct outbox_entry *e)
{
    free(e->project);
    free(e->target);
    free(e->body);
    free(e->coalesce_key);
    memset(e, 0, sizeof(*e));
}

/* SRC into DST[CAP] as snprintf("%s") would put it: cut to CAP - 1 bytes. */
static void copy_cut(char *dst, size_t cap, const char *src)
{
    size_t n = strnlen(src, cap - 1);

    memcpy(dst, src, n);
    dst[n] = '\0';
}

void store_event_fill(struct event *e, int64_t rv, enum task_event_type type, const json_t *obj,
                      char *json)
{
    /* What task_view_of gives for these four, without its money parses (every task write
     * fills one event: the meter's committer one per charged task). */
    const json_t *md = json_object_get(obj, "metadata");
    const char *ns = json_string_value(json_object_get(md, "namespace"));
    const char *name = json_string_value(json_object_get(md, "name"));

    e->rv = rv;
    e->type = type;
    e->json = json;
    e->bytes = json != NULL ? strlen(json) : 0;
    copy_cut(e->ns, sizeof(e->ns), ns != NULL ? ns : "");
    copy_cut(e->name, sizeof(e->name), name != NULL ? name : "");
    e->phase = task_phase_of(json_object_get(obj, "status"));
    e->suspended = json_is_true(json_object_get(json_object_get(obj, "spec"), "suspended"));
    e->from_scm =
        json_object_get(json_object_get(md, "annotations"), "divergedev.com/provider") != NULL;
}

void store_new_uid(char out[37])
{
    unsigned char b[16];

    secret_random(b, sizeof(b));
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x40); /* version 4 */
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80); /* RFC 4122 variant */
    snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

int64_t store_gen_get(pthread_mutex_t *mu, const int64_t *gen)
{
    int64_t g;

    pthread_mutex_lock(mu);
    g = *gen;
    pthread_mutex_unlock(mu);
    return g;
}

void store_gen_wait(pthread_mutex_t *mu, pthread_cond_t *cv, const int64_t *gen, int64_t since_gen,
                    int64_t timeout_ms)
{
    struct timespec deadline;

    clock_deadline_in(&deadline, CLOCK_REALTIME, timeout_ms);
    pthread_mutex_lock(mu);
    while (*gen <= since_gen) {
        if (pthread_cond_timedwait(cv, mu, &deadline) != 0) {
            break;
        }
    }
    pthread_mutex_unlock(mu);
}

enum store_claim store_queue_claim(int64_t *wait_ms, bool closed, int64_t next_ms, int64_t now,
                                   bool held)
{
    if (closed) {
        return STORE_CLAIM_PASS; /* an older entry of this PR waits: this one too */
    }
    if (next_ms <= now && !held) {
        return STORE_CLAIM_TAKE;
    }
    if (next_ms > now && (*wait_ms < 0 || next_ms - now < *wait_ms)) {
        *wait_ms = next_ms - now;
    } else if (next_ms <= now && *wait_ms < 0) {
        *wait_ms = 0;
    }
    return STORE_CLAIM_CLOSE;
}
