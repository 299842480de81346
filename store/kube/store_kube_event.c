/* SPDX-License-Identifier: Apache-2.0 */
/* Kubernetes Events for the phase changes of AgentTasks (docs/cluster-mode.md "Events"):
 * every status write of this backend that changes status.phase (and the first status of a
 * new task) records a core/v1 Event on the task, which `kubectl describe agenttask` lists
 * (it selects core/v1 Events by involvedObject). Best effort: a failed create is logged and
 * never fails the write that changed the phase. */
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "store/kube/store_kube_int.h"

/* core/v1 rather than events.k8s.io/v1: the version kubectl describe reads. */
static const struct kube_resource core_events = {"", "v1", "events", "Event"};

static const char *status_str(const json_t *task, const char *key)
{
    const char *v = json_string_value(json_object_get(json_object_get(task, "status"), key));
    return v != NULL ? v : "";
}

static const char *meta_str(const json_t *task, const char *key)
{
    const char *v = json_string_value(json_object_get(json_object_get(task, "metadata"), key));
    return v != NULL ? v : "";
}

const char *kst_phase_of(const json_t *task)
{
    return status_str(task, "phase");
}

/* "phase OLD -> NEW: reason: message", each part only when set, as valid UTF-8 of at most
 * KST_EVENT_MESSAGE_MAX - 1 bytes (the status message comes from a sandbox's runner). */
static void event_message(char out[KST_EVENT_MESSAGE_MAX], const json_t *task,
                          const char *old_phase)
{
    const char *reason = status_str(task, "reason"), *message = status_str(task, "message");
    char raw[KST_EVENT_MESSAGE_MAX];
    int n;

    n = snprintf(raw, sizeof(raw), "phase %s%s%s%s%s%s%s", old_phase, old_phase[0] ? " -> " : "",
                 kst_phase_of(task), reason[0] ? ": " : "", reason, message[0] ? ": " : "",
                 message);
    err_utf8_copy(out, KST_EVENT_MESSAGE_MAX, raw,
                  n < 0                     ? 0
                  : (size_t)n < sizeof(raw) ? (size_t)n
                                            : sizeof(raw) - 1);
}

json_t *kst_event_build(const json_t *task, const char *old_phase, int64_t now_ms)
{
    const char *phase = kst_phase_of(task), *name = meta_str(task, "name");
    char ts[CLOCK_RFC3339_MAX], ev_name[96], message[KST_EVENT_MESSAGE_MAX];

    clock_rfc3339(ts, now_ms);
    /* One Event per write: the task's new resourceVersion names it (a rerun never adds a
     * second, and two replicas never collide). */
    snprintf(ev_name, sizeof(ev_name), "%s.%llx", name, (unsigned long long)kst_rv_of(task));
    event_message(message, task, old_phase);
    return json_pack("{s:s,s:s,s:{s:s,s:s},s:{s:s,s:s,s:s,s:s,s:s,s:s},s:s,s:s,s:s,s:{s:s},"
                     "s:s,s:s,s:i}",
                     "apiVersion", "v1", "kind", "Event", "metadata", "name", ev_name, "namespace",
                     meta_str(task, "namespace"), "involvedObject", "apiVersion", TASK_API_VERSION,
                     "kind", TASK_KIND, "name", name, "namespace", meta_str(task, "namespace"),
                     "uid", meta_str(task, "uid"), "resourceVersion",
                     meta_str(task, "resourceVersion"), "reason", phase[0] ? phase : "Unknown",
                     "message", message, "type",
                     strcmp(phase, "Failed") == 0 ? "Warning" : "Normal", "source", "component",
                     KST_EVENT_COMPONENT, "firstTimestamp", ts, "lastTimestamp", ts, "count", 1);
}

void kst_event_phase(struct kube_store *s, const json_t *task, const char *old_phase)
{
    json_t *ev, *made = NULL;
    struct err err = {0};

    if (strcmp(old_phase, kst_phase_of(task)) == 0) {
        return;
    }
    ev = kst_event_build(task, old_phase, clock_now_ms(s->base.clock));
    if (kube_create(&made, s->c, &core_events, meta_str(task, "namespace"), ev, &err) != E_OK) {
        log_kv(LOG_WARN, "task_event_failed", "namespace", meta_str(task, "namespace"), "task",
               meta_str(task, "name"), "phase", kst_phase_of(task), "error", err.msg, NULL);
    }
    json_decref(made);
    json_decref(ev);
}
