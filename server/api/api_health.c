/* SPDX-License-Identifier: Apache-2.0 */
/* The health routes (/healthz: the process answers; /readyz: the store answers and the
 * data dir's filesystem has its reserve) and the Prometheus /metrics route. */
#include <stdatomic.h>
#include <stdint.h>
#include <sys/statvfs.h>

#include "server/api/api_int.h"

int api_healthz(struct request *r)
{
    return http_send_json(r, 200, json_pack("{s:s}", "status", "ok"));
}

/* Whether the data dir's filesystem has less than the reserve free (*avail_out bytes): the
 * database may soon fail every write, so the server is not ready. */
static bool low_disk(const struct server *srv, int64_t *avail_out)
{
    struct statvfs sv;

    *avail_out = 0;
    if (srv->data_dir_reserve <= 0 || srv->cfg.data_dir == NULL ||
        statvfs(srv->cfg.data_dir, &sv) != 0) {
        return false;
    }
    *avail_out = (int64_t)sv.f_bavail * (int64_t)sv.f_frsize;
    return *avail_out < srv->data_dir_reserve;
}

int api_readyz(struct request *r)
{
    int64_t counts[TASK_PHASE_COUNT], avail;

    if (atomic_load(&r->srv->shutting_down)) {
        return http_send_error(r, 503, NULL, NULL, "shutting down");
    }
    if (!atomic_load(&r->srv->started)) {
        /* The HTTP listener answers before the TLS listener, its endpoint file and the
         * sandbox are up: a client that waits for ready may then use all of them. */
        return http_send_error(r, 503, NULL, NULL, "starting");
    }
    if (task_store_count_phases(counts, r->srv->store, NULL) != E_OK) {
        return http_send_error(r, 503, NULL, NULL, "database not available");
    }
    if (low_disk(r->srv, &avail)) {
        return http_send_error(r, 503, "LowDisk", NULL,
                               "the data dir's filesystem has %lld MiB free, less than the "
                               "reserve of %lld MiB (--data-dir-reserve)",
                               (long long)(avail >> 20),
                               (long long)(r->srv->data_dir_reserve >> 20));
    }
    if (controller_sandbox_problem(r->srv->controller) != NULL) {
        /* Still ready for the API; tasks that need a sandbox fail with SandboxError. */
        return http_send_json(r, 200,
                              json_pack("{s:s, s:s}", "status", "ok", "sandbox",
                                        controller_sandbox_problem(r->srv->controller)));
    }
    return http_send_json(r, 200, json_pack("{s:s}", "status", "ok"));
}

int api_metrics(struct request *r)
{
    struct buf out;
    int ret;

    buf_init(&out, 0);
    metrics_render(&out, r->srv);
    ret = http_send_text(r, 200, "text/plain; version=0.0.4; charset=utf-8",
                         out.data != NULL ? out.data : "");
    buf_cleanup(&out);
    return ret;
}
