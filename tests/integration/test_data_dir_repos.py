# SPDX-License-Identifier: Apache-2.0
"""A task's repository is never a file:// path inside the server's data directory (security
review 2026-12-01, 13): another project's mirror, a staging repository or a workspace. The
task API (POST, PATCH, PUT), ConnectRPC CreateTask, the MCP tool diverge_create_task, a
local PR binding and the admission webhook refuse it with an error naming spec.repository.url; nothing is stored. The
demo repository of `diverge local demo` (<data-dir>/demo) stays allowed."""
import json
import os
import subprocess

from harness import API, Server, run_tests, task_obj
from test_admission import admit, denied, review, task
from test_connect import rpc_json
from test_mcp import Mcp

NS = API + "/namespaces/default/agenttasks"
FIELD = "spec.repository.url"


def bare(path):
    if os.path.isdir(path):
        return path
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", path], check=True)
    return path


def refused_urls(srv):
    dd = srv.data_dir
    mirror = bare(os.path.join(dd, "mirrors", "0123456789abcdef.git"))
    return ["file://" + mirror,
            "file://localhost" + mirror,
            "file://" + mirror.replace("/mirrors/", "/%6dirrors/"),
            "file:///tmp/../" + mirror.lstrip("/"),
            "file://" + os.path.join(dd, "staging", "other", "t.git")]


def test_task_api_refuses_data_dir_repositories():
    with Server(["--sandbox-provider", "none"]) as srv:
        for i, url in enumerate(refused_urls(srv)):
            st, _, b = srv.request("POST", NS, task_obj("in-%d" % i, repository={"url": url}))
            assert st == 422, (url, st, b)
            assert FIELD in json.dumps(b), b
            assert "data directory" in b["message"], b
        st, _, b = srv.request("GET", NS)
        assert st == 200 and b["items"] == [], b
        # An existing task cannot be moved there either (PATCH, PUT).
        ok = "https://example.com/acme/shop.git"
        st, _, b = srv.request("POST", NS, task_obj("t1", repository={"url": ok}))
        assert st == 201, b
        bad = refused_urls(srv)[0]
        st, _, b = srv.request("PATCH", NS + "/t1", {"spec": {"repository": {"url": bad}}},
                               headers={"Content-Type": "application/merge-patch+json"})
        assert st == 422 and FIELD in json.dumps(b), (st, b)
        put = task_obj("t1", repository={"url": bad})
        st, _, b = srv.request("PUT", NS + "/t1", put)
        assert st == 422 and FIELD in json.dumps(b), (st, b)
        st, _, b = srv.request("GET", NS + "/t1")
        assert b["spec"]["repository"]["url"] == ok, b
        # The demo repository under <data-dir>/demo is fine.
        demo = bare(os.path.join(srv.data_dir, "demo", "greeting.git"))
        st, _, b = srv.request("POST", NS, task_obj("demo", repository={"url": "file://" + demo}))
        assert st == 201, (st, b)


def test_connect_mcp_and_local_pr_refuse_data_dir_repositories():
    with Server(["--sandbox-provider", "none"]) as srv:
        url = refused_urls(srv)[0]
        st, r = rpc_json(srv, "CreateTask", {"name": "c1", "objective": "o",
                                             "repository": {"url": url}})
        assert (st, r.get("code")) == (400, "invalid_argument"), (st, r)
        assert FIELD in r["message"], r
        with Mcp(srv) as m:
            m.initialize()
            msg = m.fails("diverge_create_task", "Invalid", name="m1", objective="o",
                          repository=url)
            assert FIELD in msg, msg
        st, _, b = srv.request("PUT", "/api/v1/local/pulls/octo/repo/1",
                               {"repository": url, "head": "feature", "base": "main"})
        assert st == 422 and "data directory" in json.dumps(b), (st, b)
        st, _, b = srv.request("GET", NS)
        assert st == 200 and b["items"] == [], b


def test_admission_refuses_data_dir_repositories():
    with Server(["--sandbox-provider", "none"]) as srv:
        url = refused_urls(srv)[0]
        bad = task(repository={"url": url, "baseBranch": "main"})
        st = denied(admit(srv, review("CREATE", bad)), FIELD)
        assert "data directory" in st["message"], st
        denied(admit(srv, review("UPDATE", bad, old=task(), uid="u-2")), FIELD)


if __name__ == "__main__":
    run_tests([test_task_api_refuses_data_dir_repositories,
               test_connect_mcp_and_local_pr_refuse_data_dir_repositories,
               test_admission_refuses_data_dir_repositories])
