#!/usr/bin/env bash
# The test stages of `make test` (docs/testing.md says what runs where, and why).
#
#   scripts/test.sh normal|asan|tsan|fuzz   one stage: configure and build its tree, run it
#   scripts/test.sh all                     every stage after lint and test-deps, in order,
#                                           stopping at the first failure
#
# `all` builds the ASan, TSan and fuzz trees in the background at the lowest CPU priority
# (nice 19) while the normal and sanitizer test stages run: the integration tests spend most
# of their time waiting on servers, fakes and child processes, and a build at nice 19 takes
# only the CPU they leave idle. Each stage then waits for its tree. The fuzzers run in the
# background too, at nice 10, during the TSan stage (each target still for its
# FUZZ_SECONDS), whose tests leave more CPU idle than the ASan stage's (docs/testing.md);
# `all` waits for them after the TSan stage.
#
# Environment: JOBS (build jobs, default the CPUs), TEST_JOBS (tests the normal stage runs at
# once) and SANITIZE_TEST_JOBS (the same for the sanitizer stages), default JOBS + 1 and JOBS + 2
# (the tests mostly wait; test_slow_sources runs last, by itself: docs/testing.md),
# BUILD (the normal tree, default build), FUZZ_SECONDS (default 10), ASAN_TESTS and
# TSAN_TESTS (ctest arguments choosing the sanitizer stages' tests, default `-L sanitize|asan`
# and `-L sanitize|tsan`: docs/testing.md), SANITIZE_TESTS (when set, both of them; empty
# runs every test there too).
# Each stage prints its wall time and the CPU time it used.
set -euo pipefail
cd "$(dirname "$0")/.."

# New trees are Ninja's (scripts/deps.sh installs it): on this kind of machine the Makefile
# generator's own processes (a cmake per object for its progress line, per-target dependency
# scans, recursive makes) cost a third of a tree's build CPU (docs/testing.md). A tree that
# exists keeps the generator it was made with; CMAKE_GENERATOR chooses another.
if [ -z "${CMAKE_GENERATOR:-}" ] && command -v ninja >/dev/null; then
    export CMAKE_GENERATOR=Ninja
fi
# New trees compile through ccache when it is installed and its cache directory is writable
# (CMAKE_C_COMPILER_LAUNCHER= turns it off). The cache is the machine's, outside the checkout:
# a fresh clone's trees reuse what an earlier run on this machine compiled. Paths under the
# checkout are hashed relative to it and compiled in relative (__FILE__, debug info), so two
# clones in different folders share the objects; ccache checks every input's content.
if [ -z "${CMAKE_C_COMPILER_LAUNCHER+x}" ] && command -v ccache >/dev/null &&
    ccache_dir=$(ccache -k cache_dir 2>/dev/null) && mkdir -p "$ccache_dir" 2>/dev/null &&
    [ -w "$ccache_dir" ]; then
    export CMAKE_C_COMPILER_LAUNCHER=ccache CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
    export CFLAGS="${CFLAGS:+$CFLAGS }-ffile-prefix-map=$PWD/="
fi

# The tests' temporary files (servers' data directories, repositories, fakes' state) go to a
# folder of their own on /dev/shm when that is a tmpfs with room (TMPDIR, when set, is kept):
# the servers' SQLite and meter commits fsync, and on a virtual disk those waits were an
# eighth of the normal stage (docs/testing.md). The folder is removed at the end. Nothing
# of a test depends on it: the fsyncs still run, they just return at once.
TMP_MIN_KB=$((4 * 1024 * 1024))
tests_tmp=""
if [ -z "${TMPDIR:-}" ] && [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ] &&
    [ -w /dev/shm ] &&
    [ "$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 { print $4 }')" -ge "$TMP_MIN_KB" ] &&
    tests_tmp=$(mktemp -d /dev/shm/diverge-tests.XXXXXX 2>/dev/null); then
    chmod 1777 "$tests_tmp" # as /tmp: the sandbox user reaches the folders tests open to it
    export TMPDIR=$tests_tmp
fi

JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
TEST_JOBS=${TEST_JOBS:-$((JOBS + 1))}
SANITIZE_TEST_JOBS=${SANITIZE_TEST_JOBS:-$((JOBS + 2))}
BUILD=${BUILD:-build}
FUZZ_SECONDS=${FUZZ_SECONDS:-10}
ASAN_TESTS=${SANITIZE_TESTS-${ASAN_TESTS--L sanitize|asan}}
TSAN_TESTS=${SANITIZE_TESTS-${TSAN_TESTS--L sanitize|tsan}}

# configure TREE: the tree's CMake configuration (kept when it exists with the same options).
configure() {
    case "$1" in
    normal) cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWERROR=ON >/dev/null ;;
    asan)
        cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DWERROR=ON \
            -DSANITIZE=address,undefined >/dev/null
        ;;
    tsan)
        cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DWERROR=ON \
            -DSANITIZE=thread >/dev/null
        ;;
    fuzz) CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DWERROR=ON -DFUZZ=ON >/dev/null ;;
    esac
}

dir_of() {
    case "$1" in
    normal) echo "$BUILD" ;;
    *) echo "build-$1" ;;
    esac
}

build() {
    configure "$1" && bash scripts/build.sh "$(dir_of "$1")" "$JOBS"
}

# run TREE: the stage's tests on a built tree.
run() {
    case "$1" in
    normal) (cd "$BUILD" && ctest --output-on-failure -j "$TEST_JOBS") ;;
    asan)
        # shellcheck disable=SC2086 # ASAN_TESTS is a list of ctest arguments
        (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
            UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
            ctest --output-on-failure -j "$SANITIZE_TEST_JOBS" $ASAN_TESTS)
        ;;
    tsan)
        # halt_on_error: the first race fails its test.
        # shellcheck disable=SC2086
        (cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
            ctest --output-on-failure -j "$SANITIZE_TEST_JOBS" $TSAN_TESTS)
        ;;
    fuzz) bash scripts/run_fuzz.sh build-fuzz "$FUZZ_SECONDS" "$JOBS" ;;
    esac
}

since() {
    echo $(($(date +%s) - $1))
}

# timed WHAT CMD...: runs CMD, then prints "test: WHAT: <wall> s, <user>+<system> s CPU": the
# CPU time of CMD's processes only. CMD runs in a subshell whose `times` counts its own
# children; bash's `time` would also count any background job of this shell reaped while
# CMD ran (the build chain that ends during the TSan stage counted as that stage's CPU).
timed() {
    local what=$1 rc=0 t0 cpu
    shift
    t0=$(date +%s)
    cpu=$(mktemp)
    (
        rc=0
        "$@" || rc=$?
        times >"$cpu"
        exit "$rc"
    ) || rc=$?
    echo "test: $what: $(since "$t0") s, $(awk 'NR == 2 { print cpu_s($1) "+" cpu_s($2) }
        function cpu_s(t,  m) { m = t; sub(/m.*/, "", m); sub(/^[0-9]+m/, "", t)
                                return sprintf("%.0f", m * 60 + t) }' "$cpu") s CPU"
    rm -f "$cpu"
    return "$rc"
}

one() {
    timed "$1 build" build "$1"
    timed "$1 tests" run "$1"
}

# The background builds: one chain, each tree's log in $bg/<tree>.log and its exit status
# in $bg/<tree>.rc once done. The chain stops at the first failed build.
bg=""
bg_pid=""
fuzz_pid=""
stop_background() {
    local pid
    for pid in "$bg_pid" "$fuzz_pid"; do
        if [ -n "$pid" ]; then
            kill -TERM -- "-$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
    done
    if [ -n "$bg" ]; then
        rm -rf "$bg"
    fi
    if [ -n "$tests_tmp" ]; then
        rm -rf "$tests_tmp"
    fi
}
trap stop_background EXIT

start_background() {
    bg=$(mktemp -d)
    # Its own process group (job control on while forking), so stop_background can end the
    # whole chain, cmake and compilers included.
    set -m
    (
        set +m
        renice -n 19 -p "$BASHPID" >/dev/null # and so every build of the chain
        for t in "$@"; do
            rc=0
            { TIMEFORMAT="%0R s, %0U+%0S s CPU" && time build "$t" >"$bg/$t.log" 2>&1; } \
                2>"$bg/$t.secs" || rc=$?
            echo "$rc" >"$bg/$t.rc"
            [ "$rc" -eq 0 ] || exit "$rc"
        done
    ) &
    bg_pid=$!
    set +m
}

# wait_background TREE: until its build is done; prints the build's log on failure.
wait_background() {
    local t0
    t0=$(date +%s)
    while [ ! -f "$bg/$1.rc" ]; do
        if ! kill -0 "$bg_pid" 2>/dev/null && [ ! -f "$bg/$1.rc" ]; then
            echo "test: the background build of $1 did not run" >&2
            return 1
        fi
        sleep 1
    done
    if [ "$(cat "$bg/$1.rc")" != 0 ]; then
        cat "$bg/$1.log" >&2
        echo "test: $1 build FAILED" >&2
        return 1
    fi
    echo "test: $1 build: $(cat "$bg/$1.secs") in the background; the stage waited $(since "$t0") s for it"
}

# start_fuzz: once the TSan and fuzz trees are built, the fuzzers run in the background at
# nice 10 (their own process group, for stop_background), output in $bg/fuzz.out.
start_fuzz() {
    set -m
    (
        set +m
        wait_background tsan >/dev/null && wait_background fuzz || exit 1
        renice -n 10 -p "$BASHPID" >/dev/null
        timed "fuzz run (in the background, nice 10)" run fuzz
    ) >"$bg/fuzz.out" 2>&1 &
    fuzz_pid=$!
    set +m
}

wait_fuzz() {
    local t0 rc=0
    t0=$(date +%s)
    wait "$fuzz_pid" || rc=$?
    fuzz_pid=""
    cat "$bg/fuzz.out"
    echo "test: fuzz: the stage waited $(since "$t0") s for the background fuzzers"
    return "$rc"
}

all() {
    local start
    start=$(date +%s)
    timed "normal build" build normal
    start_background asan tsan fuzz
    timed "normal tests" run normal
    wait_background asan
    timed "asan tests" run asan
    wait_background tsan
    start_fuzz
    timed "tsan tests" run tsan
    wait_fuzz
    echo "test: all stages passed in $(since "$start") s"
}

case "${1:-}" in
normal | asan | tsan | fuzz) one "$1" ;;
all) all ;;
*)
    echo "usage: scripts/test.sh normal|asan|tsan|fuzz|all" >&2
    exit 2
    ;;
esac
