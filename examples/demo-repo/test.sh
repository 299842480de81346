#!/bin/sh
# The demo's test: greeting.txt must hold exactly "Hello, world!".
want='Hello, world!'
got=$(cat greeting.txt 2>/dev/null || true)
if [ "$got" = "$want" ]; then
    echo "ok: greeting.txt says '$want'"
    exit 0
fi
echo "FAIL: greeting.txt says '$got', want '$want'"
exit 1
