// SPDX-License-Identifier: Apache-2.0
// Baseline for bench/webhook.sh: the usual way a Node GitHub bot takes deliveries.
// One process (no cluster, as a Probot-style bot is usually deployed), node:http, and
// @octokit/webhooks verifyAndReceive() on the raw body with the same secret as ours.
//   POST /api/v1/webhooks/github -> 202 verified and handled, 401 bad/missing signature,
//                                   400 anything else (bad JSON, missing headers)
//   GET  /healthz                -> 200 ok
// usage: WEBHOOK_SECRET=S node server.mjs [port]   (port 0 or absent: a free port;
// prints "listening on http://127.0.0.1:PORT")
import http from "node:http";
import { Webhooks } from "@octokit/webhooks";

const secret = process.env.WEBHOOK_SECRET;
if (!secret) {
  console.error("server.mjs: set WEBHOOK_SECRET");
  process.exit(2);
}
const port = Number(process.argv[2] ?? process.env.PORT ?? 0);

const webhooks = new Webhooks({ secret });
let commands = 0;
let comments = 0;
webhooks.on("issue_comment", ({ payload }) => {
  // What a bot does first: is there a command in this comment? (No I/O: the baseline
  // acknowledges without storing anything, so it is not durable.)
  comments++;
  if (typeof payload.comment?.body === "string" && payload.comment.body.includes("/diverge")) {
    commands++;
  }
});

function reply(res, status, body) {
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(body),
  });
  res.end(body);
}

const server = http.createServer((req, res) => {
  if (req.method === "GET" && req.url === "/healthz") {
    return reply(res, 200, "ok\n");
  }
  if (req.method !== "POST" || req.url !== "/api/v1/webhooks/github") {
    return reply(res, 404, '{"error":"not found"}');
  }
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", async () => {
    const id = req.headers["x-github-delivery"];
    const name = req.headers["x-github-event"];
    const signature = req.headers["x-hub-signature-256"];
    if (!id || !name) {
      return reply(res, 400, '{"error":"missing X-GitHub-Delivery or X-GitHub-Event"}');
    }
    if (!signature) {
      return reply(res, 401, '{"error":"missing X-Hub-Signature-256"}');
    }
    const payload = Buffer.concat(chunks).toString("utf8");
    try {
      await webhooks.verifyAndReceive({ id, name, signature, payload });
      reply(res, 202, '{"accepted":true}');
    } catch (err) {
      const first = err?.errors?.[0] ?? err;
      const msg = String(first?.message ?? err);
      const status = /signature does not match/.test(msg) ? 401 : 400;
      reply(res, status, JSON.stringify({ error: msg }));
    }
  });
  req.on("error", () => reply(res, 400, '{"error":"bad request"}'));
});
server.keepAliveTimeout = 60_000;
server.headersTimeout = 65_000;
server.listen(port, "127.0.0.1", () => {
  console.log(`listening on http://127.0.0.1:${server.address().port}`);
});
function stop() {
  console.error(`server.mjs: ${comments} comments, ${commands} with a command`);
  process.exit(0);
}
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
