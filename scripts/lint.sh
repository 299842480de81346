#!/usr/bin/env bash
# The source checks STYLE.md promises, run by `make test` before anything is built.
# Banned calls (STYLE.md §8) in every C file, tests and bench included; the layout
# clang-format decides (.clang-format, `clang-format --dry-run --Werror`); cyclomatic
# complexity over 15 (pmccabe) unless scripts/complexity-allow.txt lists it.
set -euo pipefail
cd "$(dirname "$0")/.."

status=0
# strcpy/strcat/sprintf/gets/strtok/atoi, as calls (snprintf, strtok_r etc. are fine).
banned='(^|[^A-Za-z0-9_])(strcpy|strcat|sprintf|vsprintf|gets|strtok|atoi)[[:space:]]*\('
if hits=$(git ls-files -z --cached --others --exclude-standard -- '*.c' '*.h' | xargs -0 grep -nE "$banned" 2>/dev/null); then
    echo "lint: banned calls (STYLE.md §8; use snprintf, memcpy with a length, strtol):" >&2
    echo "$hits" >&2
    status=1
fi
if [ "$status" -eq 0 ]; then
    echo "lint: banned calls: none"
fi

# Layout (STYLE.md §8): clang-format (Debian's 14) with the repository's .clang-format.
# `clang-format -i FILE` fixes a file.
if ! command -v clang-format >/dev/null 2>&1; then
    echo "lint: clang-format not installed (scripts/deps.sh installs it)" >&2
    exit 1
fi
mapfile -d '' fmtfiles < <(git ls-files -z --cached --others --exclude-standard -- '*.c' '*.h')
# One clang-format per batch of 32 files, one batch per CPU at a time. A batch that fails
# names its unformatted files in its diagnostics (FILE:LINE:COL: error: ...); one that fails
# without naming any is checked again file by file.
# shellcheck disable=SC2317 # called through xargs
check_batch() {
    local out names f
    if out=$(clang-format --dry-run --Werror "$@" 2>&1 >/dev/null); then
        return 0
    fi
    names=$(printf '%s\n' "$out" | sed -n 's/^\(.*\):[0-9]*:[0-9]*: error: .*/\1/p' | sort -u)
    if [ -n "$names" ]; then
        printf '%s\n' "$names"
        return 0
    fi
    for f in "$@"; do
        clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || echo "$f"
    done
}
export -f check_batch
mapfile -t unformatted < <(for f in "${fmtfiles[@]}"; do [ -f "$f" ] && printf '%s\0' "$f"; done |
    xargs -0 -r -n 32 -P "$(nproc 2>/dev/null || echo 2)" bash -c 'check_batch "$@"' check_batch |
    sort -u)
if [ "${#unformatted[@]}" -gt 0 ]; then
    echo "lint: not clang-formatted (run clang-format -i on them):" >&2
    printf '  %s\n' "${unformatted[@]}" >&2
    status=1
else
    echo "lint: clang-format: ${#fmtfiles[@]} files clean"
fi

# Complexity (STYLE.md §8): Debian's pmccabe over every C file, tracked or untracked and not
# ignored. The measure is pmccabe's FIRST column, the modified McCabe complexity, in which a
# whole switch counts once (a table-like switch is not penalised per case). Exceptions go in
# scripts/complexity-allow.txt as `path function  # why`.
max_cc=15
allow=scripts/complexity-allow.txt
if ! command -v pmccabe >/dev/null 2>&1; then
    echo "lint: pmccabe not installed (scripts/deps.sh installs it)" >&2
    exit 1
fi
mapfile -d '' cfiles < <(git ls-files -z --cached --others --exclude-standard -- '*.c')
# pmccabe prints: modified  traditional  statements  first-line  lines  file(line): function
if ! report=$(pmccabe "${cfiles[@]}"); then
    echo "lint: pmccabe failed" >&2
    exit 1
fi
offenders=$(printf '%s\n' "$report" | awk -F'\t' -v max="$max_cc" -v allow="$allow" '
    BEGIN {
        while ((getline line < allow) > 0) {
            sub(/#.*/, "", line)
            if (split(line, f, " ") >= 2) {
                ok[f[1] " " f[2]] = 1
            }
        }
    }
    $1 + 0 > max {
        where = $6
        fn = where
        sub(/^.*\): /, "", fn)
        file = where
        sub(/\(.*$/, "", file)
        line = where
        sub(/^[^(]*\(/, "", line)
        sub(/\).*$/, "", line)
        if (!((file " " fn) in ok)) {
            printf "%s:%s: %s complexity %d (max %d)\n", file, line, fn, $1, max
        }
    }')
if [ -n "$offenders" ]; then
    echo "lint: functions over complexity $max_cc (STYLE.md §8; split them, or add" \
        "\`path function  # why\` to $allow):" >&2
    echo "$offenders" >&2
    status=1
else
    echo "lint: complexity: nothing over $max_cc outside $allow"
fi
exit "$status"
