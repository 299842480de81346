#!/usr/bin/env python3
"""Chooses, by measured line coverage, the integration tests the sanitizer stages run
(docs/testing.md, "The sanitizer subset").

    scripts/sanitize_coverage.py run [--build build-cov] [--jobs N] [--out DIR] [--only RE]
        builds a gcc --coverage tree (Debug), runs every test of the suite there with its
        own GCOV_PREFIX (so each test's counters land in a folder of its own), and writes
        DIR/lines.json: for each test, the lines of our C code (not tests/) it executed,
        and its wall time.
    scripts/sanitize_coverage.py choose [--out DIR] [--target 0.97]
                                        [--asan-cost FILE] [--tsan-cost FILE]
        from DIR/lines.json, for each sanitizer stage: starts from every unit test and the
        tests the stage runs whatever they add (ASAN_FORCED, TSAN_FORCED below), then adds,
        greedily, the integration test that covers the most lines not yet covered per
        second of its cost, until the stage covers --target of the lines the whole suite
        covers. A test's cost is its CPU seconds in that stage's tree (a `cpu` file), or
        without one its wall time in the coverage run. Prints each stage's figures and the
        three lists of tests/CMakeLists.txt: SANITIZED (in both), ASAN_ALSO, TSAN_ALSO.
    scripts/sanitize_coverage.py cpu --build TREE [--label RE] [--jobs N] [--out DIR]
        runs the tests of TREE (those with a label matching RE: a sanitizer stage's), N at
        once as the stage does, the ones the stage runs last by themselves (a ctest DEPENDS)
        after the others, and writes DIR/cpu-<TREE>.json: each test's wall time and CPU
        seconds (user + system of the test and every process it waited for). The stage's
        environment (ASAN_OPTIONS, TSAN_OPTIONS) is the caller's. `choose` weighs by it.
    scripts/sanitize_coverage.py check [--out DIR]
        the figures of what tests/CMakeLists.txt labels `sanitize` (both sanitizer stages),
        `asan` (the ASan+UBSan stage only) and `tsan` (the TSan stage only) now, in --build
        (any configured tree).

Lines run only by processes killed with SIGKILL, or inside a sandbox that cannot write
DIR, are counted by neither the suite nor the subset (gcov writes at a normal exit).
"""
import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import time

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sh(*cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def configure_and_build(build, jobs):
    sh("cmake", "-S", SRC, "-B", build, "-DCMAKE_BUILD_TYPE=Debug", "-DWERROR=ON",
       "-DCMAKE_C_FLAGS=--coverage", "-DCMAKE_EXE_LINKER_FLAGS=--coverage",
       stdout=subprocess.DEVNULL)
    sh("bash", os.path.join(SRC, "scripts/build.sh"), build, str(jobs))


def list_tests(build):
    out = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build, check=True,
                         capture_output=True, text=True).stdout
    tests = []
    for t in json.loads(out)["tests"]:
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        tests.append({"name": t["name"], "command": t["command"],
                      "env": props.get("ENVIRONMENT", []),
                      "labels": props.get("LABELS", []),
                      "timeout": props.get("TIMEOUT", 1500),
                      "cwd": props.get("WORKING_DIRECTORY", build),
                      "lock": props.get("RESOURCE_LOCK", []),
                      "depends": props.get("DEPENDS", [])})
    return tests


def test_env(t, **extra):
    """The environment a test runs in: ours, EXTRA, then the test's ctest ENVIRONMENT."""
    env = dict(os.environ, **extra)
    for kv in t["env"]:
        k, _, v = kv.partition("=")
        env[k] = v
    return env


def run_one(t, raw):
    prefix = os.path.join(raw, t["name"])
    shutil.rmtree(prefix, ignore_errors=True)
    os.makedirs(prefix)
    env = test_env(t, GCOV_PREFIX=prefix, GCOV_PREFIX_STRIP="0")
    start = time.monotonic()
    try:
        p = subprocess.run(t["command"], cwd=t["cwd"], env=env, timeout=t["timeout"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        rc, tail = p.returncode, p.stdout[-2000:].decode(errors="replace")
    except subprocess.TimeoutExpired:
        rc, tail = "timeout", ""
    secs = time.monotonic() - start
    print("%-45s %s %6.1f s" % (t["name"], "ok" if rc == 0 else "FAILED %s" % rc, secs),
          flush=True)
    if rc != 0:
        print(tail, flush=True)
    return t["name"], rc, secs


def run_all(tests, raw, jobs):
    # Tests sharing a RESOURCE_LOCK run one after the other, in one worker.
    groups, locked = [], {}
    for t in tests:
        if t["lock"]:
            locked.setdefault(t["lock"][0], []).append(t)
        else:
            groups.append([t])
    groups = list(locked.values()) + groups

    def run_group(g):
        return [run_one(t, raw) for t in g]

    results = {}
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for res in pool.map(run_group, groups):
            for name, rc, secs in res:
                results[name] = (rc, secs)
    return results


def cpu_one(t, logdir):
    """Runs one test; returns (wall seconds, CPU seconds, exit status)."""
    env = test_env(t)
    start = time.monotonic()
    with open(os.path.join(logdir, t["name"] + ".log"), "wb") as log:
        p = subprocess.Popen(t["command"], cwd=t["cwd"], env=env, stdout=log,
                             stderr=subprocess.STDOUT)
        try:
            # wait4: the rusage of the test and of every process it waited for.
            _, status, ru = os.wait4(p.pid, 0)
        finally:
            p.returncode = 0  # reaped above; keeps Popen from waiting again
    secs = time.monotonic() - start
    cpu = ru.ru_utime + ru.ru_stime
    rc = os.waitstatus_to_exitcode(status)
    print("%-45s %s %6.1f s wall %6.1f s CPU" % (t["name"], "ok" if rc == 0 else
                                                  "FAILED %s" % rc, secs, cpu), flush=True)
    return secs, cpu, rc


def cmd_cpu(args):
    build = os.path.abspath(args.build)
    tests = [t for t in list_tests(build)
             if any(re.fullmatch(args.label, lb) for lb in t["labels"])
             and re.search(args.only, t["name"])]
    logdir = os.path.join(os.path.abspath(args.out), "cpu-logs-" + os.path.basename(build))
    os.makedirs(logdir, exist_ok=True)
    names = {t["name"] for t in tests}
    # The tests the stage runs last, each by itself (a DEPENDS on others of the stage).
    last = [t for t in tests if set(t["depends"]) & names]
    last.sort(key=lambda t: len(t["depends"]))
    first = [t for t in tests if t not in last]
    results = {}
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futs = {pool.submit(cpu_one, t, logdir): t["name"] for t in first}
        for f in concurrent.futures.as_completed(futs):
            results[futs[f]] = f.result()
    for t in last:
        results[t["name"]] = cpu_one(t, logdir)
    wall = time.monotonic() - start
    out = os.path.join(args.out, "cpu-%s.json" % os.path.basename(build))
    with open(out, "w") as f:
        json.dump({n: {"wall": round(w, 2), "cpu": round(c, 2), "rc": rc}
                   for n, (w, c, rc) in results.items()}, f, indent=0, sort_keys=True)
    total = sum(c for _, c, _ in results.values())
    failed = sorted(n for n, (_, _, rc) in results.items() if rc != 0)
    print("%d tests in %.0f s at -j%d: %.0f CPU seconds; failed: %s; %s" %
          (len(results), wall, args.jobs, total, failed or "none", out))
    for n, (w, c, _) in sorted(results.items(), key=lambda kv: -kv[1][1])[:25]:
        print("  %6.1f s CPU %6.1f s wall  %s" % (c, w, n))


def covered_lines(prefix, build):
    """The lines of our C code (path relative to the source tree) run under prefix."""
    gcdas = []
    for root, _, files in os.walk(prefix):
        for f in files:
            if f.endswith(".gcda"):
                gcda = os.path.join(root, f)
                gcno = os.path.join("/", os.path.relpath(gcda, prefix))[:-5] + ".gcno"
                link = gcda[:-5] + ".gcno"
                if os.path.exists(gcno) and not os.path.exists(link):
                    os.symlink(gcno, link)
                gcdas.append(gcda)
    lines = set()
    skip = (os.path.join(SRC, "tests") + os.sep, os.path.abspath(build) + os.sep)
    for i in range(0, len(gcdas), 200):
        out = subprocess.run(["gcov", "--json-format", "--stdout"] + gcdas[i:i + 200],
                             cwd=prefix, capture_output=True, text=True).stdout
        for doc in out.splitlines():
            if not doc.startswith("{"):
                continue
            for f in json.loads(doc)["files"]:
                path = os.path.normpath(os.path.join(build, f["file"]))
                if not path.startswith(SRC + os.sep) or path.startswith(skip):
                    continue
                rel = os.path.relpath(path, SRC)
                lines.update("%s:%d" % (rel, ln["line_number"])
                             for ln in f["lines"] if ln["count"] > 0)
    return lines


def cmd_run(args):
    build = os.path.abspath(args.build)
    configure_and_build(build, args.jobs)
    tests = [t for t in list_tests(build) if re.search(args.only, t["name"])]
    raw = os.path.join(os.path.abspath(args.out), "raw")
    os.makedirs(raw, exist_ok=True)
    results = run_all(tests, raw, args.jobs)
    data = {}
    if args.only != "." and os.path.exists(os.path.join(args.out, "lines.json")):
        with open(os.path.join(args.out, "lines.json")) as f:
            data = json.load(f)
    for t in tests:
        rc, secs = results[t["name"]]
        lines = covered_lines(os.path.join(raw, t["name"]), build)
        data[t["name"]] = {"rc": rc, "secs": round(secs, 1), "labels": t["labels"],
                           "lines": sorted(lines)}
    with open(os.path.join(args.out, "lines.json"), "w") as f:
        json.dump(data, f)
    failed = [n for n, d in data.items() if d["rc"] != 0]
    print("%d tests, %d failed %s; %s" % (len(data), len(failed), failed,
                                          os.path.join(args.out, "lines.json")))


def load(out):
    with open(os.path.join(out, "lines.json")) as f:
        data = json.load(f)
    return {n: (set(d["lines"]), d["secs"], d["labels"]) for n, d in data.items()}


# The TSan stage runs these whatever lines they add: they drive our threads the hardest
# (concurrent requests and streams, the meter's group commit, the inbox, the controller and
# the runner, the sandbox table, replicas and Leases; the slow-client guard and the egress
# proxy, whose threads no cheaper test drives). test_slow_sources never runs there
# (docs/testing.md: its probes time out under TSan during its flood of threads).
TSAN_FORCED = ["integration." + n for n in (
    "test_llm_gateway_streams", "test_meter", "test_meter_socket", "test_github_bot",
    "test_controller_phases", "test_runs_live", "test_runs_wip", "test_queue",
    "test_sandbox_slots", "test_cluster_mode", "test_cluster_agent_sandbox",
    "test_kube_lease_processes", "test_security_http", "test_sandbox_egress")]
TSAN_NEVER = ["integration.test_slow_sources"]
# The ASan+UBSan stage runs these whatever lines they add: real third-party webhook
# payloads (the octokit examples) and a provider's streamed answers translated (Gemini's,
# the translator no cheaper test reaches) through our parsers of untrusted input.
ASAN_FORCED = ["integration.test_octokit_examples", "integration.test_llm_gemini"]


def load_cost(path, data):
    """Each test's cost: its CPU seconds from a `cpu` run's file, or without one (or for a
    test it lacks) its wall time in the coverage run."""
    cpu = {}
    if path:
        with open(path) as f:
            cpu = {n: d["cpu"] for n, d in json.load(f).items()}
    return {n: cpu.get(n, d[1]) for n, d in data.items()}


def figures(data, chosen, cost):
    full = set().union(*(d[0] for d in data.values()))
    sub = set().union(*(data[n][0] for n in chosen))
    print("lines the whole suite covers: %d (%d tests, %.0f s)" %
          (len(full), len(data), sum(cost.values())))
    print("lines the subset covers:      %d = %.2f %% (%d tests, %.0f s)" %
          (len(sub), 100.0 * len(sub) / len(full), len(chosen),
           sum(cost[n] for n in chosen)))
    missed = full - sub
    per_file = {}
    for key in missed:
        per_file.setdefault(key.rsplit(":", 1)[0], 0)
        per_file[key.rsplit(":", 1)[0]] += 1
    print("not covered by the subset, by file (the 15 largest):")
    for path, n in sorted(per_file.items(), key=lambda kv: -kv[1])[:15]:
        print("  %5d %s" % (n, path))


def greedy(data, cost, start, never, target):
    """From START, adds the integration test with the most lines not yet covered per
    second of its cost, until the subset covers TARGET of the whole suite's lines."""
    full = set().union(*(d[0] for d in data.values()))
    chosen = [n for n in start if n in data]
    have = set().union(*(data[n][0] for n in chosen))
    rest = [n for n in data if n.startswith("integration.") and n not in chosen + never]
    while len(have) < target * len(full) and rest:
        best = max(rest, key=lambda n: len(data[n][0] - have) / max(cost[n], 1.0))
        gain = len(data[best][0] - have)
        if gain == 0:
            break
        print("  + %-40s %5d new lines, %5.1f s" % (best, gain, cost[best]))
        chosen.append(best)
        have |= data[best][0]
        rest.remove(best)
    return chosen


def cmd_choose(args):
    data = load(args.out)
    units = [n for n in data if n.startswith("unit.")]
    stages = {}
    for stage, cost_file, start, never in (
            ("ASan+UBSan", args.asan_cost, units + ASAN_FORCED, []),
            ("TSan", args.tsan_cost, units + TSAN_FORCED, TSAN_NEVER)):
        cost = load_cost(cost_file, data)
        print("%s: every unit test and %s, then by lines per %s:" %
              (stage, "TSAN_FORCED" if never else "ASAN_FORCED",
               "CPU second" if cost_file else "second of the coverage run"))
        stages[stage] = set(greedy(data, cost, start, never, args.target))
        figures(data, sorted(stages[stage]), cost)
    asan, tsan = stages["ASan+UBSan"], stages["TSan"]

    def names(tests):
        return " ".join(sorted(n[len("integration."):] for n in tests
                               if n.startswith("integration.")))
    print("tests/CMakeLists.txt's lists:")
    print("SANITIZED (both stages): " + names(asan & tsan))
    print("ASAN_ALSO (ASan+UBSan only): " + names(asan - tsan))
    print("TSAN_ALSO (TSan only): " + names(tsan - asan))


def cmd_check(args):
    data = load(args.out)
    tests = list_tests(os.path.abspath(args.build))
    for stage, labels in (("ASan+UBSan", {"sanitize", "asan"}), ("TSan", {"sanitize", "tsan"})):
        print("%s (the tests labelled %s now):" % (stage, " or ".join(sorted(labels))))
        figures(data, [t["name"] for t in tests
                       if labels & set(t["labels"]) and t["name"] in data],
                load_cost(None, data))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["run", "choose", "check", "cpu"])
    ap.add_argument("--build", default="build-cov")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--out", default="/tmp/diverge-coverage")
    ap.add_argument("--target", type=float, default=0.97)
    ap.add_argument("--asan-cost", help="choose: a `cpu` file of the ASan tree (CPU seconds)")
    ap.add_argument("--tsan-cost", help="choose: a `cpu` file of the TSan tree (CPU seconds)")
    ap.add_argument("--label", default=".*",
                    help="cpu: the tests with a label matching this regex")
    ap.add_argument("--only", default=".",
                    help="run, cpu: just the tests matching this regex (run keeps the others' lines)")
    args = ap.parse_args()
    {"run": cmd_run, "choose": cmd_choose, "check": cmd_check,
     "cpu": cmd_cpu}[args.what](args)


if __name__ == "__main__":
    sys.exit(main())
