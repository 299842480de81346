# SPDX-License-Identifier: Apache-2.0
"""Every example payload of @octokit/webhooks-examples (npm, pinned) — GitHub's own
documented deliveries of every event — signed and delivered to the real server: none may
get a 4xx/5xx other than by design; pings answer 200; issue_comment examples on issues are
ignored (204); the same comments moved onto a pull request and carrying a command are
accepted (202) exactly once."""
import json
import os
import subprocess

from github_helpers import deliver, new_fake, server_args, server_env
from harness import Server, run_tests
import npm_pin

PACKAGE, VERSION = npm_pin.OCTOKIT_EXAMPLES


def load_examples():
    modules = npm_pin.install(PACKAGE, VERSION)
    path = os.path.join(modules, PACKAGE, "api.github.com", "index.json")
    with open(path) as f:
        return json.load(f)


def test_every_documented_payload():
    events = load_examples()
    gh = new_fake()
    counts = {}
    try:
        with Server(server_args(gh), env=server_env()) as srv:
            total = 0
            for ev in events:
                for ex in ev["examples"]:
                    body = json.dumps(ex).encode()
                    st, _, ans = deliver(srv, body, event=ev["name"])
                    total += 1
                    counts[(ev["name"], st)] = counts.get((ev["name"], st), 0) + 1
                    if ev["name"] == "ping":
                        assert st == 200, (ev["name"], st, ans)
                    else:
                        assert st in (202, 204), (ev["name"], ex.get("action"), st, ans)
            assert total > 100, total
            # issue_comment examples carried onto a pull request, with a command.
            ic = [e for e in events if e["name"] == "issue_comment"][0]["examples"]
            accepted = 0
            for i, ex in enumerate(ic):
                if ex.get("action") != "created":
                    continue
                ex = json.loads(json.dumps(ex))
                ex["issue"]["pull_request"] = {"url": "x", "html_url": "y"}
                ex["comment"]["body"] = "/diverge help"
                ex["comment"]["id"] = 9000 + i
                ex["comment"]["user"]["type"] = "User"
                st, _, ans = deliver(srv, json.dumps(ex).encode())
                assert st == 202, (st, ans)
                st, _, ans = deliver(srv, json.dumps(ex).encode())
                assert st == 200 and ans == {"duplicate": True}
                accepted += 1
            assert accepted >= 1
            print("delivered %d documented payloads of %d events" % (total, len(events)))
    finally:
        gh.stop()


if __name__ == "__main__":
    run_tests([test_every_documented_payload])
