#!/usr/bin/env python3
"""Chooses, by measured line coverage, the integration tests the sanitizer stages run
(docs/testing.md, "The sanitizer subset").

    scripts/sanitize_coverage.py run [--build build-cov] [--jobs N] [--out DIR] [--only RE]
        builds a gcc --coverage tree (Debug), runs every test of the suite there with its
        own GCOV_PREFIX (so each test's counters land in a folder of its own), and writes
        DIR/lines.json: for each test, the lines of our C code (not tests/) it executed,
        and its wall time.
    scripts/sanitize_coverage.py choose [--out DIR] [--target 0.99]
        from DIR/lines.json: starts from every unit test, then adds, greedily, the
        integration test that covers the most lines not yet covered per second of its
        wall time, until the subset covers --target of the lines the whole suite covers.
        Prints the figures (for TSan with the TSAN_ALSO list of tests/CMakeLists.txt added)
        and the chosen tests: the SANITIZED list of tests/CMakeLists.txt.
    scripts/sanitize_coverage.py cpu --build TREE [--label RE] [--jobs N] [--out DIR]
        runs the tests of TREE (those with a label matching RE: a sanitizer stage's), N at
        once as the stage does, the ones the stage runs last by themselves (a ctest DEPENDS)
        after the others, and writes DIR/cpu-<TREE>.json: each test's wall time and CPU
        seconds (user + system of the test and every process it waited for). The stage's
        environment (ASAN_OPTIONS, TSAN_OPTIONS) is the caller's. `choose --cost` weighs by it.
    scripts/sanitize_coverage.py check [--out DIR]
        the figures of what tests/CMakeLists.txt labels `sanitize` (both sanitizer stages),
        `asan` (the ASan+UBSan stage too) and `tsan` (the TSan stage too) now, in --build
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


def run_one(t, raw):
    prefix = os.path.join(raw, t["name"])
    shutil.rmtree(prefix, ignore_errors=True)
    os.makedirs(prefix)
    env = dict(os.environ, GCOV_PREFIX=prefix, GCOV_PREFIX_STRIP="0")
    for kv in t["env"]:
        k, _, v = kv.partition("=")
        env[k] = v
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
    env = dict(os.environ)
    for kv in t["env"]:
        k, _, v = kv.partition("=")
        env[k] = v
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


def cmake_list(name):
    """The names in set(<name> ...) of tests/CMakeLists.txt."""
    with open(os.path.join(SRC, "tests/CMakeLists.txt")) as f:
        text = f.read()
    m = re.search(r"set\(%s\s(.*?)\)" % name, text, re.S)
    body = re.sub(r"#[^\n]*", "", m.group(1)) if m else ""
    return ["integration." + w for w in body.split()]


def figures(data, chosen):
    full = set().union(*(d[0] for d in data.values()))
    sub = set().union(*(data[n][0] for n in chosen))
    secs = sum(data[n][1] for n in chosen)
    all_secs = sum(d[1] for d in data.values())
    print("lines the whole suite covers: %d (%d tests, %.0f s of test time)" %
          (len(full), len(data), all_secs))
    print("lines the subset covers:      %d = %.2f %% (%d tests, %.0f s of test time)" %
          (len(sub), 100.0 * len(sub) / len(full), len(chosen), secs))
    missed = full - sub
    per_file = {}
    for key in missed:
        per_file.setdefault(key.rsplit(":", 1)[0], 0)
        per_file[key.rsplit(":", 1)[0]] += 1
    print("not covered by the subset, by file (the 15 largest):")
    for path, n in sorted(per_file.items(), key=lambda kv: -kv[1])[:15]:
        print("  %5d %s" % (n, path))


def cmd_choose(args):
    data = load(args.out)
    full = set().union(*(d[0] for d in data.values()))
    chosen = [n for n in data if n.startswith("unit.")]
    have = set().union(*(data[n][0] for n in chosen))
    rest = [n for n in data if n.startswith("integration.")]
    while len(have) < args.target * len(full) and rest:
        best = max(rest, key=lambda n: len(data[n][0] - have) / max(data[n][1], 1.0))
        gain = len(data[best][0] - have)
        if gain == 0:
            break
        print("  + %-40s %5d new lines, %5.1f s" % (best, gain, data[best][1]))
        chosen.append(best)
        have |= data[best][0]
        rest.remove(best)
    print("ASan+UBSan (every unit test and the integration tests chosen above):")
    figures(data, chosen)
    print("TSan (those but the ASAN_ALSO list, and the concurrency tests of TSAN_ALSO):")
    asan_only = cmake_list("ASAN_ALSO")
    figures(data, [n for n in chosen if n not in asan_only] +
            [n for n in cmake_list("TSAN_ALSO") if n in data and n not in chosen])
    print("chosen integration tests (the SANITIZED list of tests/CMakeLists.txt):")
    print(" ".join(sorted(n[len("integration."):] for n in chosen
                          if n.startswith("integration."))))


def cmd_check(args):
    data = load(args.out)
    tests = list_tests(os.path.abspath(args.build))
    for stage, labels in (("ASan+UBSan", {"sanitize", "asan"}), ("TSan", {"sanitize", "tsan"})):
        print("%s (the tests labelled %s now):" % (stage, " or ".join(sorted(labels))))
        figures(data, [t["name"] for t in tests
                       if labels & set(t["labels"]) and t["name"] in data])


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["run", "choose", "check", "cpu"])
    ap.add_argument("--build", default="build-cov")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--out", default="/tmp/diverge-coverage")
    ap.add_argument("--target", type=float, default=0.99)
    ap.add_argument("--label", default=".*",
                    help="cpu: the tests with a label matching this regex")
    ap.add_argument("--only", default=".",
                    help="run, cpu: just the tests matching this regex (run keeps the others' lines)")
    args = ap.parse_args()
    {"run": cmd_run, "choose": cmd_choose, "check": cmd_check,
     "cpu": cmd_cpu}[args.what](args)


if __name__ == "__main__":
    sys.exit(main())
