#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
# Interop peer over pymacaroons (Debian python3-pymacaroons), driven by
# tests/integration/test_token_interop.py: one JSON request per stdin line, one JSON
# reply per stdout line. Tokens are V2 binary, URL-safe base64. Keys are hex root keys;
# pymacaroons derives the signing key itself (HMAC "macaroons-key-generator").
import binascii
import json
import sys

from pymacaroons import MACAROON_V2, Macaroon, Verifier


def text(b):
    return b.decode("utf-8") if isinstance(b, bytes) else b


def describe(m):
    return {
        "location": text(m.location),
        "identifier": text(m.identifier),
        "caveats": [text(c.caveat_id) for c in m.caveats],
    }


def handle(req):
    op = req["op"]
    if op == "mint":
        m = Macaroon(location="diverge", identifier=req["id"],
                     key=binascii.unhexlify(req["key"]), version=MACAROON_V2)
        for c in req["caveats"]:
            m.add_first_party_caveat(c)
        return {"token": m.serialize()}
    if op == "mint_third_party":
        m = Macaroon(location="diverge", identifier=req["id"],
                     key=binascii.unhexlify(req["key"]), version=MACAROON_V2)
        m.add_third_party_caveat("https://auth.example", b"3rd-party-secret-key-32-bytes-xx",
                                 "third-party-caveat-id")
        return {"token": m.serialize()}
    if op == "attenuate":
        m = Macaroon.deserialize(req["token"])
        for c in req["caveats"]:
            m.add_first_party_caveat(c)
        return {"token": m.serialize()}
    if op == "verify":
        m = Macaroon.deserialize(req["token"])
        v = Verifier()
        # Accept every predicate: only the format and the signature chain are under test.
        v.satisfy_general(lambda predicate: True)
        v.verify(m, binascii.unhexlify(req["key"]))
        return dict(ok=True, **describe(m))
    raise ValueError("unknown op " + op)


def main():
    for line in sys.stdin:
        try:
            reply = handle(json.loads(line))
        except Exception as e:  # report every failure to the driver, keep serving
            reply = {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
