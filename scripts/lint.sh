#!/usr/bin/env bash
# The source checks STYLE.md promises, run by `make test` before anything is built.
# Today: banned calls (STYLE.md §8) in every C file, tests and bench included.
# Still to come (issue 16): clang-format --dry-run --Werror and pmccabe complexity > 15.
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
exit "$status"
