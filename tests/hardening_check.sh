#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Checks that the built binaries are hardened (BIND_NOW, GNU_RELRO, PIE, a stack that is
# not executable, the stack protector and _FORTIFY_SOURCE's checked calls), and that the
# images build with an optimised, hardened build type.
# Usage: hardening_check.sh SOURCE_DIR BINARY...
set -u
src=$1
shift
fail=0
bad() {
    echo "FAIL: $*"
    fail=1
}
for bin in "$@"; do
    [ -f "$bin" ] || { bad "$bin: no such file"; continue; }
    dyn=$(readelf -dW "$bin")
    hdr=$(readelf -hW "$bin")
    seg=$(readelf -lW "$bin")
    syms=$(readelf -sW --dyn-syms "$bin")
    grep -Eq 'FLAGS.*BIND_NOW|FLAGS_1.*NOW' <<<"$dyn" || bad "$bin: not linked with -z now"
    grep -q 'GNU_RELRO' <<<"$seg" || bad "$bin: no GNU_RELRO segment"
    grep -Eq 'Type:[[:space:]]+DYN' <<<"$hdr" || bad "$bin: not a PIE (ELF type is not DYN)"
    stack=$(grep 'GNU_STACK' <<<"$seg")
    [ -n "$stack" ] || bad "$bin: no GNU_STACK segment"
    # The flags column of GNU_STACK: RW, never RWE.
    grep -Eq 'GNU_STACK.* RWE ' <<<"$stack" && bad "$bin: executable stack"
    grep -q '__stack_chk_fail' <<<"$syms" || bad "$bin: no stack protector (__stack_chk_fail)"
    grep -Eq '__[a-z0-9_]+_chk(@|[[:space:]]|$)' <<<"$(grep -v __stack_chk <<<"$syms")" ||
        bad "$bin: no _FORTIFY_SOURCE checked call (__*_chk)"
    [ $fail -eq 0 ] && echo "ok: $bin"
done
for df in "$src"/Dockerfile "$src"/Dockerfile.agent-runner; do
    types=$(grep -o 'CMAKE_BUILD_TYPE=[A-Za-z]*' "$df" | sort -u)
    [ -n "$types" ] || bad "$df: no CMAKE_BUILD_TYPE"
    for t in $types; do
        case "${t#CMAKE_BUILD_TYPE=}" in
        Release | RelWithDebInfo | MinSizeRel) ;;
        *) bad "$df: $t is not a hardened build type" ;;
        esac
    done
    grep -q 'SANITIZE\|FUZZ' "$df" && bad "$df: a sanitizer or fuzz build"
done
exit $fail
