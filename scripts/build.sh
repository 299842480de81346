#!/usr/bin/env bash
# `cmake --build` with short output: compiler messages and errors as they come, progress as
# one line per 10 % (rewritten in place on a terminal) instead of a line per object (make's
# "[ 42%]" or Ninja's "[113/270]") and make's "Entering directory" chatter. Exit status:
# cmake's.
# Usage: scripts/build.sh BUILD_DIR JOBS [TARGET...]
set -uo pipefail

dir=$1
jobs=$2
shift 2
args=(--build "$dir" -j "$jobs")
if [ "$#" -gt 0 ]; then
    args+=(--target "$@")
fi
tty=0
if [ -t 1 ]; then
    tty=1
fi

cmake "${args[@]}" 2>&1 | awk -v tty="$tty" '
    function progress(p) {
        if (tty) { printf "\rbuild: %3d%%", p; open_line = 1 }
        else if (p >= shown + 10 || (p == 100 && shown < 100)) { printf "build: %d%%\n", p; shown = p - p % 10 }
        fflush()
    }
    BEGIN { shown = -10; open_line = 0 }
    /^g?make(\[[0-9]+\])?: (Entering|Leaving) directory/ { next }
    /^\[ *[0-9]+%\] / {
        p = $0; sub(/^\[ */, "", p); sub(/%.*/, "", p)
        progress(p + 0)
        next
    }
    /^\[[0-9]+\/[0-9]+\] / {
        p = $0; sub(/^\[/, "", p); sub(/\].*/, "", p); split(p, nm, "/")
        progress(nm[2] > 0 ? int(100 * nm[1] / nm[2]) : 100)
        next
    }
    /^ninja: no work to do\.$/ { next }
    /^(Consolidate compiler generated dependencies|Scanning dependencies) / { next }
    {
        if (open_line) { printf "\n"; open_line = 0 }
        print; fflush()
    }
    END { if (open_line) printf "\n" }
'
rc=${PIPESTATUS[0]}
if [ "$rc" -eq 0 ]; then
    echo "build: done ($dir)"
fi
exit "$rc"
