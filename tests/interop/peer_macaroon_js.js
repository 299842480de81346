// SPDX-License-Identifier: Apache-2.0
// Interop peer over npm macaroon@3.0.4, driven by tests/integration/test_token_interop.py:
// one JSON request per stdin line, one JSON reply per stdout line. MACAROON_JS_DIR names
// the npm prefix it was installed into. Minted tokens are returned as V2 JSON because
// 3.0.4's exportBinary() is broken past ~200 bytes (ByteBuffer._grow reads an unset
// _capacity and doubles on every append); the driver converts JSON to V2 binary.
'use strict';
const path = require('path');
const readline = require('readline');
const macaroon = require(path.join(process.env.MACAROON_JS_DIR, 'node_modules', 'macaroon'));

const hexBytes = hex => Uint8Array.from(Buffer.from(hex, 'hex'));
const text = b => Buffer.from(b).toString('utf8');

function describe(m) {
  return {
    location: m.location,
    identifier: text(m.identifier),
    caveats: m.caveats.map(c => text(c.identifier)),
  };
}

function handle(req) {
  switch (req.op) {
  case 'mint': {
    const m = macaroon.newMacaroon({identifier: req.id, location: 'diverge', rootKey: hexBytes(req.key)});
    req.caveats.forEach(c => m.addFirstPartyCaveat(c));
    return {json: m.exportJSON()};
  }
  case 'attenuate': {
    const m = macaroon.importMacaroon(req.token);
    req.caveats.forEach(c => m.addFirstPartyCaveat(c));
    return {json: m.exportJSON()};
  }
  case 'verify': {
    const m = macaroon.importMacaroon(req.token);
    // Accept every predicate: only the format and the signature chain are under test.
    m.verify(hexBytes(req.key), () => null);
    return Object.assign({ok: true}, describe(m));
  }
  default:
    throw new Error('unknown op ' + req.op);
  }
}

const rl = readline.createInterface({input: process.stdin, terminal: false});
rl.on('line', line => {
  let reply;
  try {
    reply = handle(JSON.parse(line));
  } catch (e) {
    reply = {ok: false, error: String(e && e.message ? e.message : e)};
  }
  process.stdout.write(JSON.stringify(reply) + '\n');
});
