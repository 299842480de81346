#!/usr/bin/env bash
# Installs the Debian packages Diverge needs to build and test, only those missing.
# Idempotent and quiet when everything is already present. Runs as root (or via sudo).
set -euo pipefail

PKGS=(
    build-essential cmake ninja-build ccache pkg-config git ca-certificates
    clang libclang-rt-14-dev
    libmicrohttpd-dev libjansson-dev libpcre2-dev libssl-dev
    libcurl4-openssl-dev libyaml-dev libsqlite3-dev sqlite3
    python3 curl openssl
    bubblewrap libseccomp-dev passwd
    pmccabe clang-format
)

missing=()
for p in "${PKGS[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done

if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
echo "deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
