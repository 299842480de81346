#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Macaroon interop: tokens from token/ (through tests/interop/token_tool) against three
third-party implementations, in both directions.

Peers, installed here when missing (pinned):
  pymacaroons    Debian python3-pymacaroons (run with /usr/bin/python3)
  libmacaroons   Debian libmacaroons-dev (V1 format only: transcoded V1 <-> V2 here)
  npm macaroon   macaroon@3.0.4 in the shared test cache (npm_pin.py) (binary export is broken:
                 minted tokens come back as V2 JSON and are converted here)

Checks: the SPEC reference vector from every minter; the same token minted by every
implementation is byte-identical; every token verifies everywhere (and ours applies the
full caveat check); attenuation by every holder verifies everywhere; a tampered caveat,
a dropped caveat, the wrong key and trailing bytes fail everywhere (pymacaroons 0.13
ignores trailing bytes: reported, see KNOWN_LENIENT); a third-party caveat fails closed in
ours. A peer that cannot be installed is a failure, not a skip.
"""
import base64
import json
import os
import secrets
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import npm_pin  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("DIVERGE_SOURCE_DIR") or os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("DIVERGE_BUILD_DIR") or os.path.join(SRC, "build")
INTEROP = os.path.join(SRC, "tests", "interop")
CACHE = os.path.join(BUILD, "interop-cache")
SYSTEM_PYTHON = "/usr/bin/python3"
APT_PINS = {p: npm_pin.APT[p] for p in ("python3-pymacaroons", "libmacaroons-dev")}

REF_KEY = bytes(range(32)).hex()
REF_TOKEN = ("AgEHZGl2ZXJnZQIIdGFzay0xMjMAAhJ0YXNrX2lkID0gdGFzay0xMjMAAhNtYXhfY29zdF91c2QgPSA1"
             "LjAwAAAGINK-JhAmYkGspdMojx9f3ildDI80uEXIHF3q5jq8itwQ")
REF_CAVEATS = ["task_id = task-123", "max_cost_usd = 5.00"]
# Verifier -> mutations it is known to accept (upstream leniency, not ours to fix).
KNOWN_LENIENT = {("pymacaroons", "trailing bytes")}

failures = []


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what, flush=True)
    if not cond:
        failures.append(what)


def die(msg):
    print("FAIL  " + msg, flush=True)
    sys.exit(1)


def run(cmd, timeout=120, env=None, check_rc=False):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except FileNotFoundError:
        die("%s: command not found" % cmd[0])
    if check_rc and r.returncode != 0:
        die("%s failed (%d): %s" % (" ".join(cmd), r.returncode, (r.stderr or r.stdout)[-800:]))
    return r


# ---- installing the peers ----

def apt_install():
    try:
        npm_pin.apt_ensure(APT_PINS)
    except RuntimeError as e:
        die(str(e))
    for p, want in APT_PINS.items():
        have = npm_pin.dpkg_version(p)
        print("peer  %s %s%s" % (p, have, "" if have == want else " (pinned %s)" % want))


def npm_install():
    """The npm prefix holding the pinned macaroon package (the shared test cache)."""
    try:
        return os.path.dirname(npm_pin.install(*npm_pin.MACAROON))
    except RuntimeError as e:
        die(str(e))


def build_lib_peer():
    src = os.path.join(INTEROP, "peer_libmacaroons.c")
    exe = os.path.join(CACHE, "peer_libmacaroons")
    if not os.path.exists(exe) or os.path.getmtime(exe) < os.path.getmtime(src):
        flags = run(["pkg-config", "--cflags", "--libs", "libmacaroons"], check_rc=True).stdout
        run(["cc", "-std=c11", "-O1", "-Wall", "-o", exe, src] + flags.split(), check_rc=True)
    return exe


def token_tool():
    exe = os.path.join(BUILD, "tests", "interop", "token_tool")
    if not os.path.exists(exe):
        run(["cmake", "--build", BUILD, "--target", "token_tool"], timeout=300)
    if not os.path.exists(exe):
        die("token_tool not built: cmake --build %s --target token_tool" % BUILD)
    return exe


# ---- V2 binary, V1 and V2 JSON, done by hand so no peer converts for another ----

def b64d(s):
    s = s.replace("-", "+").replace("_", "/")
    return base64.b64decode(s + "=" * (-len(s) % 4), validate=True)


def b64u(b):
    return base64.urlsafe_b64encode(b).decode().rstrip("=")


def varint(n):
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def read_varint(b, i):
    n = shift = 0
    while True:
        c = b[i]
        i += 1
        n |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return n, i


def v2_parse(b):
    """Strict V2 parse of first-party macaroons into (location, id, [caveats], sig)."""
    assert b[0] == 2, "not V2"
    i, sections, fields = 1, [], []
    while True:
        t, i = read_varint(b, i)
        if t == 0:
            if not fields and sections:
                break
            sections.append(fields)
            fields = []
            continue
        n, i = read_varint(b, i)
        fields.append((t, b[i:i + n]))
        i += n
    t, i = read_varint(b, i)
    n, i = read_varint(b, i)
    assert t == 6 and n == 32 and i + n == len(b), "bad signature or trailing bytes"
    head = dict(sections[0])
    cavs = []
    for s in sections[1:]:
        assert [t for t, _ in s] == [2], "not a first-party caveat"
        cavs.append(s[0][1].decode())
    return {"location": head.get(1, b"").decode(), "identifier": head[2].decode(),
            "caveats": cavs, "sig": b[i:i + n]}


def v2_build(m):
    out = bytearray([2])
    field = lambda t, d: varint(t) + varint(len(d)) + d
    if m["location"]:
        out += field(1, m["location"].encode())
    out += field(2, m["identifier"].encode()) + b"\0"
    for c in m["caveats"]:
        out += field(2, c.encode()) + b"\0"
    return bytes(out + b"\0" + field(6, m["sig"]))


def v1_packet(key, value):
    body = key.encode() + b" " + value + b"\n"
    return b"%04x" % (len(body) + 4) + body


def v1_build(m):
    out = v1_packet("location", m["location"].encode())
    out += v1_packet("identifier", m["identifier"].encode())
    for c in m["caveats"]:
        out += v1_packet("cid", c.encode())
    return out + v1_packet("signature", m["sig"])


def v1_parse(b):
    m = {"location": "", "identifier": None, "caveats": [], "sig": None}
    i = 0
    while i < len(b):
        n = int(b[i:i + 4], 16)
        key, value = b[i + 4:i + n - 1].split(b" ", 1)
        assert b[i + n - 1:i + n] == b"\n", "bad V1 packet"
        i += n
        if key == b"location":
            m["location"] = value.decode()
        elif key == b"identifier":
            m["identifier"] = value.decode()
        elif key == b"cid":
            m["caveats"].append(value.decode())
        elif key == b"signature":
            m["sig"] = value
        else:
            raise AssertionError("unexpected V1 field %r" % key)
    return m


def json_field(obj, key):
    return obj[key].encode() if key in obj else b64d(obj[key + "64"])


def json_v2_parse(obj):
    assert obj.get("v", 2) == 2
    cavs = []
    for c in obj.get("c", []):
        assert "v" not in c and "v64" not in c, "third-party caveat"
        cavs.append(json_field(c, "i").decode())
    return {"location": obj.get("l", ""), "identifier": json_field(obj, "i").decode(),
            "caveats": cavs, "sig": json_field(obj, "s")}


def tok(m):
    return b64u(v2_build(m))


def model(token):
    m = v2_parse(b64d(token))
    assert tok(m) == token, "transcoder round trip"
    return m


# ---- the four implementations behind one interface ----

class JsonPeer:
    def __init__(self, name, cmd, env=None):
        self.name = name
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)

    def call(self, **req):
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            die("%s peer exited" % self.name)
        return json.loads(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


class Ours:
    name = "ours"

    def __init__(self, exe):
        self.exe = exe

    def mint(self, key, ident, caveats):
        r = run([self.exe, "mint", key, ident] + caveats, check_rc=True)
        return r.stdout.strip()

    def attenuate(self, token, caveats):
        return run([self.exe, "attenuate", token] + caveats, check_rc=True).stdout.strip()

    def verify(self, key, token):
        r = run([self.exe, "verify", key, token])
        if r.returncode != 0:
            return None
        out = run([self.exe, "inspect", token], check_rc=True).stdout.splitlines()
        get = lambda p: [l[len(p):] for l in out if l.startswith(p)]
        return {"location": get("location: ")[0], "identifier": get("identifier: ")[0],
                "caveats": get("caveat: ")}


class PyMacaroons:
    name = "pymacaroons"

    def __init__(self):
        self.peer = JsonPeer(self.name, [SYSTEM_PYTHON, os.path.join(INTEROP, "peer_pymacaroons.py")])

    def mint(self, key, ident, caveats):
        return self.peer.call(op="mint", key=key, id=ident, caveats=caveats)["token"]

    def attenuate(self, token, caveats):
        return self.peer.call(op="attenuate", token=token, caveats=caveats)["token"]

    def verify(self, key, token):
        r = self.peer.call(op="verify", key=key, token=token)
        return r if r.get("ok") else None


class MacaroonJs:
    name = "npm macaroon"

    def __init__(self, prefix):
        env = dict(os.environ, MACAROON_JS_DIR=prefix)
        self.peer = JsonPeer(self.name, ["node", os.path.join(INTEROP, "peer_macaroon_js.js")], env)

    def mint(self, key, ident, caveats):
        return tok(json_v2_parse(self.peer.call(op="mint", key=key, id=ident, caveats=caveats)["json"]))

    def attenuate(self, token, caveats):
        return tok(json_v2_parse(self.peer.call(op="attenuate", token=token, caveats=caveats)["json"]))

    def verify(self, key, token):
        r = self.peer.call(op="verify", key=key, token=token)
        return r if r.get("ok") else None


class LibMacaroons:
    """V1 only: tokens are transcoded field by field; verify() takes V2 or raw V1 bytes."""
    name = "libmacaroons"

    def __init__(self, exe):
        self.exe = exe

    def mint(self, key, ident, caveats):
        out = run([self.exe, "mint", key, ident] + caveats, check_rc=True).stdout.strip()
        return tok(v1_parse(b64d(out)))

    def attenuate(self, token, caveats):
        v1 = b64u(v1_build(model(token)))
        out = run([self.exe, "attenuate", v1] + caveats, check_rc=True).stdout.strip()
        return tok(v1_parse(b64d(out)))

    def verify(self, key, token=None, v1_bytes=None):
        v1 = b64u(v1_bytes if v1_bytes is not None else v1_build(model(token)))
        r = run([self.exe, "verify", key, v1])
        if r.returncode != 0:
            return None
        lines = r.stdout.split("\n")[:-1]
        return {"location": lines[1], "identifier": lines[2], "caveats": lines[3:]}


# ---- the checks ----

def same_view(view, m):
    return view is not None and (view["location"], view["identifier"], view["caveats"]) == \
        (m["location"], m["identifier"], m["caveats"])


def check_reference(impls):
    for impl in impls:
        check(impl.mint(REF_KEY, "task-123", REF_CAVEATS) == REF_TOKEN,
              "%s mints the SPEC reference token (same key derivation)" % impl.name)
        check(same_view(impl.verify(REF_KEY, REF_TOKEN), model(REF_TOKEN)),
              "%s verifies the SPEC reference token" % impl.name)


def mint_task(exe, key):
    r = run([exe, "mint-task", key, "task-1", "ns", "3", "acme/api", "main", "git,go",
             "claude-*,gemini-2.5-pro", "5.00", "1000000", "2099-01-01T00:00:00Z"], check_rc=True)
    token, ident = r.stdout.split()
    return token, ident


def check_full_context(exe, key, token, who):
    r = run([exe, "verify", key, token, "task=task-1", "ns=ns", "repo=acme/api", "branch=main",
             "model=claude-3-7-sonnet"])
    check(r.returncode == 0 and r.stdout.startswith("ok max_cost_usd="),
          "ours verifies the %s token with every caveat checked (%s)" % (who, r.stdout.strip()))
    return r.stdout


def mutations(m):
    tampered = dict(m, caveats=[c.replace("5.00", "9.00") for c in m["caveats"]])
    assert tampered["caveats"] != m["caveats"]
    return [("tampered caveat", tok(tampered)),
            ("dropped caveat", tok(dict(m, caveats=m["caveats"][:-1])))]


def check_negative(impls, key, wrong_key, token):
    m = model(token)
    for impl in impls:
        # The control: the untouched token passes, so each rejection below is the mutation's.
        check(impl.verify(key, token) is not None, "%s accepts the unmutated token" % impl.name)
        for what, bad in mutations(m):
            check(impl.verify(key, bad) is None, "%s rejects a %s" % (impl.name, what))
        check(impl.verify(wrong_key, token) is None, "%s rejects the wrong key" % impl.name)
        if impl.name == "libmacaroons":
            v1 = v1_build(m) + b"\0junk"
            accepted = impl.verify(key, v1_bytes=v1) is not None
        else:
            accepted = impl.verify(key, b64u(b64d(token) + b"\0")) is not None
        if (impl.name, "trailing bytes") in KNOWN_LENIENT:
            print("note  %s accepts trailing bytes after the signature: %s (upstream "
                  "leniency; ours rejects)" % (impl.name, accepted), flush=True)
        else:
            check(not accepted, "%s rejects trailing bytes" % impl.name)


def check_third_party_rejected(exe, py, key):
    t = py.peer.call(op="mint_third_party", key=key, id="tp")["token"]
    r = run([exe, "verify", key, t])
    check(r.returncode != 0 and "third-party" in r.stdout,
          "ours rejects a pymacaroons third-party caveat (%s)" % r.stdout.strip())


def main():
    start = time.monotonic()
    os.makedirs(CACHE, exist_ok=True)
    apt_install()
    prefix = npm_install()
    exe = token_tool()
    py = PyMacaroons()
    js = MacaroonJs(prefix)
    impls = [Ours(exe), py, js, LibMacaroons(build_lib_peer())]
    print("setup %.1fs" % (time.monotonic() - start), flush=True)

    check_reference(impls)

    key, wrong_key = secrets.token_bytes(32).hex(), secrets.token_bytes(32).hex()
    ours_token, ident = mint_task(exe, key)
    m = model(ours_token)
    check(m["identifier"] == ident and len(m["caveats"]) == 9, "ours mints a task token")

    # The same token from every minter, byte for byte; every verifier accepts every one.
    tokens = {"ours (token_mint_task)": ours_token}
    for impl in impls:
        tokens[impl.name] = impl.mint(key, ident, m["caveats"])
        check(tokens[impl.name] == ours_token, "%s mints the identical token" % impl.name)
    for impl in impls:
        attenuated = impl.attenuate(ours_token, ["max_cost_usd = 1.00"])
        tokens["attenuated by " + impl.name] = attenuated
        check(model(attenuated)["caveats"] == m["caveats"] + ["max_cost_usd = 1.00"],
              "%s attenuates our token" % impl.name)
    for who, t in tokens.items():
        want = model(t)
        for impl in impls:
            check(same_view(impl.verify(key, t), want),
                  "%s verifies the token from %s" % (impl.name, who))
        out = check_full_context(exe, key, t, who)
        if who.startswith("attenuated"):
            check("max_cost_usd=1.00" in out, "the attenuation by %s narrows the budget" % who[14:])

    for who in ("ours (token_mint_task)", "attenuated by pymacaroons"):
        check_negative(impls, key, wrong_key, tokens[who])
    check_third_party_rejected(exe, py, key)

    py.peer.close()
    js.peer.close()
    print("%d failed, %.1fs" % (len(failures), time.monotonic() - start), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
