# SPDX-License-Identifier: Apache-2.0
"""The controller's repository mirror fetches from an http(s) GitLab remote with the
server's GitLab token as `oauth2:<token>` through git's credential helper (SPEC §9, issue
10): never in a URL or an argv, never in the sandbox. A loopback git server (dumb HTTP
over a bare repository) demands Basic auth; with the token the mirror is cloned, without
it the task fails and the server saw no credentials."""
import base64
import http.server
import os
import shutil
import threading

from harness import Server, run_tests
from sandbox_helpers import (FAKE_RUNNER, bare_repo, create, git, task, task_log, wait_log,
                             wait_phase)

TOKEN = "glpat-test-0123456789"


class GitServer:
    """Serves BARE read-only at /group/project.git over dumb HTTP, behind Basic auth."""

    def __init__(self, bare):
        self.bare = bare
        self.auth = []  # every Authorization header seen
        self.paths = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                outer.paths.append(self.path)
                got = self.headers.get("Authorization")
                outer.auth.append(got)
                want = "Basic " + base64.b64encode(("oauth2:" + TOKEN).encode()).decode()
                if got != want:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="gitlab"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                rel = self.path.split("?", 1)[0]
                prefix = "/group/project.git/"
                path = os.path.normpath(os.path.join(outer.bare, rel[len(prefix):]))
                if not rel.startswith(prefix) or not path.startswith(outer.bare) or \
                        not os.path.isfile(path):
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                with open(path, "rb") as f:
                    data = f.read()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def serve(gitlab_url, token):
    env = {"DIVERGE_RUNNER_PATH": FAKE_RUNNER, "DIVERGE_GITLAB_TOKEN": token,
           "GITLAB_TOKEN": None, "DIVERGE_NOTIFIER_TOKEN": None, "GITHUB_TOKEN": None,
           "DIVERGE_GITLAB_URL": None}
    return Server(args=["--sandbox-provider", "process", "--agent-cmd", "true",
                        "--gitlab-url", gitlab_url], env=env)


def test_mirror_fetches_with_the_gitlab_token():
    bare = bare_repo()
    git("--git-dir", bare, "update-server-info")
    gs = GitServer(bare)
    try:
        with serve(gs.url, TOKEN) as srv:
            create(srv, task("gl1", gs.url + "/group/project.git"))
            wait_log(srv, "gl1", "repository mirror cloned")
            good = "Basic " + base64.b64encode(("oauth2:" + TOKEN).encode()).decode()
            assert good in gs.auth, gs.auth
            assert all(TOKEN not in p for p in gs.paths), gs.paths
            # The token never reaches the task log (git's output is logged).
            wait_phase(srv, "gl1", ("Completed", "Failed"))
            assert TOKEN not in task_log(srv, "gl1")
        gs.auth.clear()
        with serve(gs.url, "") as srv:
            create(srv, task("gl2", gs.url + "/group/project.git"))
            body = wait_phase(srv, "gl2", ("Completed", "Failed"))
            assert body["status"]["phase"] == "Failed", body["status"]
            assert "repository mirror cloned" not in task_log(srv, "gl2")
            assert all(a is None for a in gs.auth), gs.auth
    finally:
        gs.close()
        shutil.rmtree(os.path.dirname(bare), ignore_errors=True)


def test_token_only_for_the_gitlab_host():
    """Another host's remote never gets the GitLab token."""
    bare = bare_repo()
    git("--git-dir", bare, "update-server-info")
    gs = GitServer(bare)
    try:
        with serve("http://127.0.0.1:1", TOKEN) as srv:
            create(srv, task("gl3", gs.url + "/group/project.git"))
            wait_phase(srv, "gl3", ("Completed", "Failed"))
            assert all(a is None for a in gs.auth), gs.auth
    finally:
        gs.close()
        shutil.rmtree(os.path.dirname(bare), ignore_errors=True)


if __name__ == "__main__":
    run_tests([test_mirror_fetches_with_the_gitlab_token, test_token_only_for_the_gitlab_host])
