# SPDX-License-Identifier: Apache-2.0
"""The spend forecast (SPEC §15) with the real meter and the fake GitHub: a flat and a
rising spend history metered the way the runner does it (the heartbeat of iteration K
carries what iteration K-1 used) give status.forecastUSD and its companions, the sticky
comment's "≈ $…" line and `diverge task status` the same numbers; a
charge without an iteration (the LLM gateway's) leaves the forecast as it was."""
import json

from github_helpers import BOT, new_fake, server_env, wait
from harness import API, Server, run_tests

NS = API + "/namespaces/octo-repo/agenttasks"
METER = "/api/v1/agenttask/meter"
MARKER = "<!-- diverge-agent-task -->"
ARGS = ["--sandbox-provider", "none", "--notifier-min-interval", "1"]
FIELDS = ("forecastUSD", "forecastPerIterationUSD", "forecastIterationsLeft",
          "forecastBudgetHolds", "forecastRunsOutIteration")


def make_task(srv, name, number):
    obj = {"apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
           "metadata": {"name": name, "annotations": {
               "divergedev.com/provider": "github", "divergedev.com/project": "octo/repo",
               "divergedev.com/pr-number": str(number)}},
           "spec": {"objective": "fix the N+1 query", "budgetUSD": "5.00", "maxIterations": 8,
                    "repository": {"url": "https://github.com/octo/repo.git",
                                   "workingBranch": "feature-%d" % number}}}
    st, _, b = srv.request("POST", NS, obj)
    assert st == 201, b
    wait(lambda: get(srv, name)["status"]["phase"] == "Active", what=name + " Active")
    st, _, tok = srv.request("GET", NS + "/" + name + "/token")
    assert st == 200, tok
    return tok.strip()


def get(srv, name):
    st, _, b = srv.request("GET", NS + "/" + name)
    assert st == 200, b
    return b


def meter(srv, token, rid, cost, iteration=None):
    body = {"requestId": rid, "tokensUsed": 1000, "costUSD": json.loads(cost)}
    if iteration is not None:
        body["iteration"] = iteration
    st, _, b = srv.request("POST", METER, json.dumps(body),
                           headers={"Authorization": "Bearer " + token}, auth=False)
    assert st == 200 and b["allowed"] is True, (st, b)
    return b


def forecast(srv, name):
    status = get(srv, name)["status"]
    return {k: status[k] for k in FIELDS if k in status}


def sticky(gh, number):
    got = [c["body"] for c in gh.comments("octo/repo", number)
           if c["user"]["login"] == BOT and c["body"].startswith(MARKER)]
    return got[0] if got else ""


def forecast_line(body):
    lines = [ln for ln in body.splitlines() if ln.startswith("≈ $")]
    return lines[0] if lines else None


def run_history(srv, token, name, costs):
    """Meters iterations 1..len(costs)+1: the heartbeat of iteration K carries costs[K-2]
    (what iteration K-1 used). Returns the forecast seen after each heartbeat."""
    seen = []
    meter(srv, token, name + "-hb1", "0", iteration=1)
    seen.append(forecast(srv, name))
    for k, cost in enumerate(costs, start=2):
        meter(srv, token, "%s-u%d" % (name, k), cost, iteration=k)
        seen.append(forecast(srv, name))
    return seen


def test_flat_and_rising_histories():
    gh = new_fake()
    gh.add_pull("octo/repo", 8, head_ref="feature-8")
    try:
        with Server(ARGS + ["--github-api-url", gh.url], env=server_env()) as srv:
            flat = make_task(srv, "flat", 7)
            rising = make_task(srv, "rising", 8)

            seen = run_history(srv, flat, "flat", ["0.45", "0.45", "0.45", "0.45"])
            # Iterations 1 and 2 running: fewer than two done, no forecast.
            assert seen[0] == {} and seen[1] == {}, seen
            assert seen[2] == {"forecastUSD": "2.70", "forecastPerIterationUSD": "0.45",
                               "forecastIterationsLeft": 6, "forecastBudgetHolds": True}, seen
            assert seen[4] == {"forecastUSD": "1.80", "forecastPerIterationUSD": "0.45",
                               "forecastIterationsLeft": 4, "forecastBudgetHolds": True}, seen
            line = "≈ $1.80 more to finish at $0.45/iteration · 4 iterations left · budget holds"
            wait(lambda: forecast_line(sticky(gh, 7)) == line, what="flat sticky line")

            seen = run_history(srv, rising, "rising", ["0.30", "0.60", "0.90", "1.20"])
            assert seen[1] == {}, seen
            # $0.90 over 2, 6 left: 0.90 + 2.70 <= 5.00.
            assert seen[2]["forecastUSD"] == "2.70" and seen[2]["forecastBudgetHolds"], seen
            # $1.80 over 3 = $0.60, 5 left: 1.80 + 3.00 <= 5.00, just.
            assert seen[3] == {"forecastUSD": "3.00", "forecastPerIterationUSD": "0.60",
                               "forecastIterationsLeft": 5, "forecastBudgetHolds": True}, seen
            # $3.00 over 4 = $0.75, 4 left: 3.00 + 0.75 * 3 > 5.00 in iteration 7.
            assert seen[4] == {"forecastUSD": "3.00", "forecastPerIterationUSD": "0.75",
                               "forecastIterationsLeft": 4, "forecastBudgetHolds": False,
                               "forecastRunsOutIteration": 7}, seen
            line = ("≈ $3.00 more to finish at $0.75/iteration · 4 iterations left · "
                    "⚠️ at this rate the budget runs out in iteration 7 of 8")
            wait(lambda: forecast_line(sticky(gh, 8)) == line, what="rising sticky line")
            assert "| USD | $3.00 | $5.00 |" in sticky(gh, 8)

            # A charge without an iteration (as the LLM gateway's) is added to the spend but
            # leaves the forecast of the finished iterations alone.
            meter(srv, rising, "rising-gw1", "0.50")
            st = get(srv, "rising")["status"]
            assert st["costUSD"] == "3.50" and forecast(srv, "rising") == seen[4], st
            # The next heartbeat counts it: $3.50 over 5 = $0.70, 3 left, 3.50 + 1.40 >
            # 5.00 in iteration 8.
            meter(srv, rising, "rising-u6", "0", iteration=6)
            assert forecast(srv, "rising") == {
                "forecastUSD": "2.10", "forecastPerIterationUSD": "0.70",
                "forecastIterationsLeft": 3, "forecastBudgetHolds": False,
                "forecastRunsOutIteration": 8}, forecast(srv, "rising")

            # The CLI and the MCP summary show the same numbers.
            r = srv.cli("task", "status", "-n", "octo-repo", "flat")
            assert r.returncode == 0, r.stderr
            row = [ln for ln in r.stdout.splitlines() if ln.startswith("Forecast (USD):")]
            assert row and row[0].split(":", 1)[1].strip() == (
                "1.80 more at 0.45/iteration, 4 iterations left, budget holds"), r.stdout
            r = srv.cli("task", "status", "-n", "octo-repo", "rising")
            row = [ln for ln in r.stdout.splitlines() if ln.startswith("Forecast (USD):")]
            assert row and row[0].split(":", 1)[1].strip() == (
                "2.10 more at 0.70/iteration, 3 iterations left, "
                "budget runs out in iteration 8 of 8"), r.stdout
    finally:
        gh.stop()


if __name__ == "__main__":
    run_tests([test_flat_and_rising_histories])
