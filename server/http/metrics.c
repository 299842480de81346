/* SPDX-License-Identifier: Apache-2.0 */
/* Prometheus metrics: request counts by route and status code, latency histograms by
 * route, tasks by phase. Counters are lock-free atomics; the exposition reads them. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "common/money.h"
#include "server/http/http_int.h"
#include "store/quota.h"

#define MAX_ROUTES 64
#define NUM_CODES 16

static const int g_codes[NUM_CODES] = {200, 201, 202, 204, 400, 401, 403, 404,
                                       405, 409, 410, 413, 415, 422, 429, 500};
/* Upper bounds in seconds, Prometheus "le". */
static const double g_buckets[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                   0.05,   0.1,   0.25,   0.5,   1,    2.5};
#define NUM_BUCKETS (sizeof(g_buckets) / sizeof(g_buckets[0]))

struct route_stats {
    atomic_llong count[NUM_CODES + 1]; /* last slot: other codes */
    atomic_llong bucket[NUM_BUCKETS + 1];
    atomic_llong sum_ns;
};

/* Index MAX_ROUTES - 1 collects requests that matched no route. */
static struct route_stats g_stats[MAX_ROUTES];

static int code_slot(int status)
{
    for (int i = 0; i < NUM_CODES; i++) {
        if (g_codes[i] == status) {
            return i;
        }
    }
    return NUM_CODES;
}

void metrics_observe(int route, int status, int64_t duration_ns)
{
    struct route_stats *s = &g_stats[route >= 0 && route < MAX_ROUTES - 1 ? route : MAX_ROUTES - 1];
    size_t b;

    atomic_fetch_add(&s->count[code_slot(status)], 1);
    for (b = 0; b < NUM_BUCKETS; b++) {
        if ((double)duration_ns / 1e9 <= g_buckets[b]) {
            break;
        }
    }
    atomic_fetch_add(&s->bucket[b], 1);
    atomic_fetch_add(&s->sum_ns, duration_ns);
}

static void render_route(struct buf *out, const char *name, const struct route_stats *s)
{
    long long total = 0, cum = 0;

    for (int c = 0; c <= NUM_CODES; c++) {
        long long n = atomic_load(&s->count[c]);
        if (n == 0) {
            continue;
        }
        if (c < NUM_CODES) {
            buf_printf(out, "diverge_http_requests_total{route=\"%s\",code=\"%d\"} %lld\n", name,
                       g_codes[c], n);
        } else {
            buf_printf(out, "diverge_http_requests_total{route=\"%s\",code=\"other\"} %lld\n", name,
                       n);
        }
        total += n;
    }
    if (total == 0) {
        return;
    }
    for (size_t b = 0; b <= NUM_BUCKETS; b++) {
        cum += atomic_load(&s->bucket[b]);
        if (b < NUM_BUCKETS) {
            buf_printf(
                out, "diverge_http_request_duration_seconds_bucket{route=\"%s\",le=\"%g\"} %lld\n",
                name, g_buckets[b], cum);
        } else {
            buf_printf(out,
                       "diverge_http_request_duration_seconds_bucket{route=\"%s\",le=\"+Inf\"} "
                       "%lld\n",
                       name, cum);
        }
    }
    buf_printf(out, "diverge_http_request_duration_seconds_sum{route=\"%s\"} %.6f\n", name,
               (double)atomic_load(&s->sum_ns) / 1e9);
    buf_printf(out, "diverge_http_request_duration_seconds_count{route=\"%s\"} %lld\n", name,
               total);
}

/* Spend this month per project (namespace) with a SpendQuota (SPEC §15): the largest
 * usedUSD of its quotas (a quota counts from its creation), and each quota's monthlyUSD. */
static void render_projects(struct buf *out, struct server *srv)
{
    json_t *items = NULL, *q;
    const char *last = "";
    char used[MONEY_STR_MAX], limit[MONEY_STR_MAX];
    int64_t top = -1;
    size_t i;

    if (task_store_quota_list(&items, srv->store, NULL, NULL) != E_OK) {
        return;
    }
    buf_puts(out, "# HELP diverge_project_spend_usd Spend this month of a namespace with a "
                  "SpendQuota, as its quotas count it.\n# TYPE diverge_project_spend_usd gauge\n");
    json_array_foreach(items, i, q)
    {
        struct quota_view v;
        quota_view_of(&v, q);
        if (strcmp(last, v.ns) != 0) {
            top = -1;
        }
        last = v.ns;
        top = v.used_usd > top ? v.used_usd : top;
        const json_t *next = json_array_get(items, i + 1);
        const char *nns =
            json_string_value(json_object_get(json_object_get(next, "metadata"), "namespace"));
        if (nns == NULL || strcmp(nns, v.ns) != 0) {
            money_format(used, top);
            buf_printf(out, "diverge_project_spend_usd{namespace=\"%s\"} %s\n", v.ns, used);
        }
    }
    buf_puts(out, "# HELP diverge_project_quota_usd spec.monthlyUSD of a SpendQuota.\n"
                  "# TYPE diverge_project_quota_usd gauge\n");
    json_array_foreach(items, i, q)
    {
        struct quota_view v;
        quota_view_of(&v, q);
        if (v.has_usd) {
            money_format(limit, v.monthly_usd);
            buf_printf(out, "diverge_project_quota_usd{namespace=\"%s\",quota=\"%s\"} %s\n", v.ns,
                       v.name, limit);
        }
    }
    json_decref(items);
}

/* Spend, queues, SCM calls and the meter's group commit. */
/* diverge_tasks_queued: tasks waiting for a sandbox slot (SPEC §14: reason Queued with a
 * queue position), read from the store so that every replica says the same. */
static void render_queued(struct buf *out, struct server *srv)
{
    json_t *items = NULL, *item;
    int64_t rv = 0, n = 0;
    size_t i;

    if (task_store_list(&items, &rv, srv->store, NULL, NULL) != E_OK) {
        return;
    }
    json_array_foreach(items, i, item)
    {
        struct task_view v;
        task_view_of(&v, item);
        n += v.queue_position > 0 ? 1 : 0;
    }
    json_decref(items);
    buf_printf(out,
               "# HELP diverge_tasks_queued AgentTasks waiting for a sandbox slot "
               "(--max-running-tasks).\n# TYPE diverge_tasks_queued gauge\n"
               "diverge_tasks_queued %lld\n",
               (long long)n);
}

static void render_pipeline(struct buf *out, struct server *srv)
{
    struct task_totals totals;
    struct scm_outbox_stats os = {0};
    struct meter_stats ms = {0};
    int64_t inbox = 0, outbox = 0;

    if (task_store_totals(&totals, srv->store, NULL) == E_OK) {
        buf_printf(out,
                   "# HELP diverge_spend_usd Spend recorded by the meter, all tasks.\n"
                   "# TYPE diverge_spend_usd gauge\ndiverge_spend_usd %.6f\n"
                   "# HELP diverge_tokens_consumed Tokens recorded by the meter.\n"
                   "# TYPE diverge_tokens_consumed gauge\ndiverge_tokens_consumed %lld\n",
                   totals.cost_usd, (long long)totals.tokens);
    }
    render_projects(out, srv);
    (void)task_store_inbox_depth(&inbox, srv->store, NULL);
    (void)task_store_outbox_depth(&outbox, srv->store, NULL);
    buf_printf(out,
               "# HELP diverge_inbox_pending Accepted comments not applied yet.\n"
               "# TYPE diverge_inbox_pending gauge\ndiverge_inbox_pending %lld\n"
               "# HELP diverge_outbox_pending SCM calls not made yet.\n"
               "# TYPE diverge_outbox_pending gauge\ndiverge_outbox_pending %lld\n",
               (long long)inbox, (long long)outbox);
    if (srv->outbox != NULL) {
        scm_outbox_stats(&os, srv->outbox);
    }
    buf_printf(out,
               "# HELP diverge_scm_calls_total SCM API calls made by the outbox.\n"
               "# TYPE diverge_scm_calls_total counter\ndiverge_scm_calls_total %lld\n"
               "# HELP diverge_scm_call_failures_total SCM API calls that failed.\n"
               "# TYPE diverge_scm_call_failures_total counter\n"
               "diverge_scm_call_failures_total %lld\n"
               "# HELP diverge_scm_rate_limit_waits_total Waits for SCM rate limits.\n"
               "# TYPE diverge_scm_rate_limit_waits_total counter\n"
               "diverge_scm_rate_limit_waits_total %lld\n",
               (long long)os.calls, (long long)os.failures, (long long)os.rate_waits);
    if (srv->meter != NULL) {
        meter_service_stats(&ms, srv->meter);
    }
    buf_printf(out,
               "# HELP diverge_meter_commits_total Meter group commits (transactions).\n"
               "# TYPE diverge_meter_commits_total counter\ndiverge_meter_commits_total %lld\n"
               "# HELP diverge_meter_requests_total Meter calls answered by the committer.\n"
               "# TYPE diverge_meter_requests_total counter\n"
               "diverge_meter_requests_total %lld\n",
               (long long)ms.batches, (long long)ms.requests);
}

void metrics_render(struct buf *out, struct server *srv)
{
    int64_t counts[TASK_PHASE_COUNT];
    int nroutes = http_route_count(srv);

    buf_puts(out, "# HELP diverge_http_requests_total HTTP requests by route and status code.\n"
                  "# TYPE diverge_http_requests_total counter\n");
    buf_puts(out, "# HELP diverge_http_request_duration_seconds HTTP request latency by route.\n"
                  "# TYPE diverge_http_request_duration_seconds histogram\n");
    /* Several routes share a name (GET and POST of one path differ); merge by name. */
    for (int i = 0; i < nroutes && i < MAX_ROUTES - 1; i++) {
        struct route_stats merged;
        bool first = true;
        for (int j = 0; j < i; j++) {
            if (strcmp(http_route_name(srv, j), http_route_name(srv, i)) == 0) {
                first = false;
            }
        }
        if (!first) {
            continue;
        }
        memset(&merged, 0, sizeof(merged));
        for (int j = i; j < nroutes && j < MAX_ROUTES - 1; j++) {
            if (strcmp(http_route_name(srv, j), http_route_name(srv, i)) != 0) {
                continue;
            }
            for (int c = 0; c <= NUM_CODES; c++) {
                merged.count[c] += atomic_load(&g_stats[j].count[c]);
            }
            for (size_t b = 0; b <= NUM_BUCKETS; b++) {
                merged.bucket[b] += atomic_load(&g_stats[j].bucket[b]);
            }
            merged.sum_ns += atomic_load(&g_stats[j].sum_ns);
        }
        render_route(out, http_route_name(srv, i), &merged);
    }
    render_route(out, "none", &g_stats[MAX_ROUTES - 1]);
    render_pipeline(out, srv);
    buf_printf(out,
               "# HELP diverge_http_request_deadline_exceeded_total Connections shut down for "
               "not sending a whole request within the deadline.\n"
               "# TYPE diverge_http_request_deadline_exceeded_total counter\n"
               "diverge_http_request_deadline_exceeded_total %lld\n"
               "# HELP diverge_http_connections_refused_total Connections refused or cut for "
               "being over the per-address, per-prefix or total limits.\n"
               "# TYPE diverge_http_connections_refused_total counter\n"
               "diverge_http_connections_refused_total %lld\n",
               http_guard_reaped(srv->guard), http_guard_refused(srv->guard));
    if (task_store_count_phases(counts, srv->store, NULL) == E_OK) {
        buf_puts(out, "# HELP diverge_tasks AgentTasks by phase.\n# TYPE diverge_tasks gauge\n");
        for (int p = 0; p < TASK_PHASE_COUNT; p++) {
            buf_printf(out, "diverge_tasks{phase=\"%s\"} %lld\n",
                       task_phase_name((enum task_phase)p), (long long)counts[p]);
        }
    }
    render_queued(out, srv);
}
