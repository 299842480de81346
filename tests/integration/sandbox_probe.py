# SPDX-License-Identifier: Apache-2.0
"""Runs inside a sandbox as the agent command (committed into the test repository and
cloned into /workspace): probes the network from there and prints one `probe ...` line
per check into the task log. Only loopback addresses and `.invalid` names, never DNS.

usage: python3 sandbox_probe.py ALLOWED_PORT DENIED_PORT [SERVER_PORT]
       python3 sandbox_probe.py targets NAME=HOST:PORT...
(the second form: CONNECT each target through the proxy, sending a line when allowed;
`probe NAME no-proxy direct=...` when the sandbox has no proxy)"""
import os
import socket
import sys

TARGETS = sys.argv[1] == "targets"
ALLOWED = DENIED = SERVER = 0
if not TARGETS:
    ALLOWED, DENIED = int(sys.argv[1]), int(sys.argv[2])
    SERVER = int(sys.argv[3]) if len(sys.argv) > 3 else 0


def say(*parts):
    print("probe", *parts, flush=True)


def direct(port):
    """A plain TCP connect to 127.0.0.1:PORT, without the proxy."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError as e:
        return "refused(%s)" % e.__class__.__name__
    s.close()
    return "connected"


def proxy_addr():
    url = os.environ.get("HTTPS_PROXY", "")
    assert url.startswith("http://"), url
    host, port = url[len("http://"):].rstrip("/").rsplit(":", 1)
    return host, int(port)


def connect_via_proxy(target):
    """CONNECT TARGET through $HTTPS_PROXY: (status, x-proxy-error, socket or None)."""
    s = socket.create_connection(proxy_addr(), timeout=10)
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(1)
        if not chunk:
            break
        head += chunk
    lines = head.decode(errors="replace").split("\r\n")
    status = int(lines[0].split()[1]) if lines and len(lines[0].split()) > 1 else 0
    xerr = ""
    for l in lines[1:]:
        if l.lower().startswith("x-proxy-error:"):
            xerr = l.split(":", 1)[1].strip()
    if status != 200:
        s.close()
        return status, xerr, None
    return status, xerr, s


def ping(s):
    """Sends a line on the tunnel S and returns the answer line."""
    s.sendall(b"ping\n")
    got = b""
    while not got.endswith(b"\n"):
        chunk = s.recv(64)
        if not chunk:
            break
        got += chunk
    s.close()
    return got.decode(errors="replace").strip()


def targets(args):
    for arg in args:
        name, target = arg.split("=", 1)
        if not os.environ.get("HTTPS_PROXY"):
            say(name, "no-proxy", "direct=" + direct(int(target.rsplit(":", 1)[1])))
            continue
        st, xerr, s = connect_via_proxy(target)
        say(name, st, ping(s) if s is not None else "x-proxy-error=" + (xerr or "<none>"))
    with open("probe-done.txt", "w") as f:
        f.write("done\n")


def main():
    if TARGETS:
        targets(sys.argv[2:])
        return
    for k in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy",
              "all_proxy", "NO_PROXY", "no_proxy", "DIVERGE_EGRESS_SOCKET"):
        say("env", k + "=" + os.environ.get(k, "<unset>"))
    say("direct-allowed", direct(ALLOWED))
    say("direct-denied", direct(DENIED))
    st, xerr, s = connect_via_proxy("127.0.0.1:%d" % ALLOWED)
    if s is not None:
        s.sendall(b"ping\n")
        got = b""
        while not got.endswith(b"\n"):
            chunk = s.recv(64)
            if not chunk:
                break
            got += chunk
        s.close()
        say("proxy-allowed", st, got.decode(errors="replace").strip())
    else:
        say("proxy-allowed", st, xerr)
    for name, target in (("proxy-denied-port", "127.0.0.1:%d" % DENIED),
                         ("proxy-localhost", "localhost:%d" % ALLOWED),
                         ("proxy-invalid-name", "nowhere.invalid:443"),
                         ("proxy-server", "127.0.0.1:%d" % SERVER)):
        if name == "proxy-server" and not SERVER:
            continue
        st, xerr, s = connect_via_proxy(target)
        if s is not None:
            s.close()
        say(name, st, "x-proxy-error=" + (xerr or "<none>"))
    with open("probe-done.txt", "w") as f:
        f.write("done\n")


if __name__ == "__main__":
    main()
