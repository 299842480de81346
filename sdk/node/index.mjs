// SPDX-License-Identifier: Apache-2.0
// Metering LLM usage against `POST /api/v1/agenttask/meter`, and ending the task with
// `POST /api/v1/agenttask/complete` (completeTask), with Node 20 built-ins only. The token, URL and socket come from the environment on every
// call (a token rotated by pause/resume is picked up without a restart):
//   token: DIVERGE_MACAROON_TOKEN when non-empty, else the first line of the file
//          DIVERGE_TOKEN_FILE (default /etc/diverge/token/token);
//   where: DIVERGE_METER_SOCKET (HTTP over a unix socket) when set, else
//          DIVERGE_METER_URL (the meter URL; a bare http://host:port gets the meter path).
// Network failures and 5xx answers are retried with exponential backoff and the same
// requestId (the server charges an id once); 4xx answers are never retried.
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import http from "node:http";
import https from "node:https";

export const METER_PATH = "/api/v1/agenttask/meter";
export const COMPLETE_PATH = "/api/v1/agenttask/complete";
export const DEFAULT_TOKEN_FILE = "/etc/diverge/token/token";
export const DEFAULT_MAX_ATTEMPTS = 5;
const DEFAULT_TIMEOUT_MS = 30000;
const DEFAULT_BACKOFF_MS = 250;
const MAX_BACKOFF_MS = 10000;
const MAX_RESPONSE = 1 << 20;
const VERSION = "0.1.0";

/** The meter refused the call (status 400/401/403/429), or could not be reached after
 * every retry (status 0 and reason "unreachable", or the last 5xx). */
export class LLMMeterError extends Error {
  constructor(status, reason, message, body = null, requestId = null, raw = "") {
    super(status ? `meter: ${message} (HTTP ${status})` : `meter: ${message}`);
    this.name = "LLMMeterError";
    this.status = status;
    this.reason = reason;
    this.body = body;
    this.requestId = requestId;
    // The totals a 429 carries (the task is paused now).
    this.result = status === 429 && body ? toResult(body, raw, requestId) : null;
  }

  get isBudgetExceeded() {
    return this.status === 429 && this.reason === "budget exceeded";
  }

  get isMaxIterationsExceeded() {
    return this.status === 429 && this.reason === "max iterations exceeded";
  }

  get isModelDisallowed() {
    return this.status === 403;
  }

  get isUnauthenticated() {
    return this.status === 401;
  }
}

// The raw text of each number member of the top-level object in TEXT, so that money
// keeps every digit (JSON.parse would turn it into a binary double).
function rawTopLevelNumbers(text) {
  const out = {};
  let depth = 0;
  let key = null;
  let lastString = null;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === '"') {
      let j = i + 1;
      while (j < text.length && text[j] !== '"') j += text[j] === "\\" ? 2 : 1;
      lastString = text.slice(i, j + 1);
      i = j;
    } else if (c === "{" || c === "[") {
      depth++;
    } else if (c === "}" || c === "]") {
      depth--;
    } else if (c === ":" && depth === 1 && lastString !== null) {
      key = JSON.parse(lastString);
      const m = /^\s*(-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)/.exec(text.slice(i + 1));
      if (m) out[key] = m[1];
    }
  }
  return out;
}

// Decimal text of the JSON number token S without an exponent ("1.5e-7" -> "0.00000015").
function plainDecimal(s) {
  const m = /^(-?)(\d+)(?:\.(\d+))?(?:[eE]([+-]?\d+))?$/.exec(s);
  if (!m) return s;
  const [, sign, int, frac = "", exp = "0"] = m;
  let digits = int + frac;
  let point = int.length + Number(exp);
  if (point <= 0) {
    digits = "0".repeat(1 - point) + digits;
    point = 1;
  } else if (point > digits.length) {
    digits += "0".repeat(point - digits.length);
  }
  const whole = digits.slice(0, point).replace(/^0+(?=\d)/, "");
  const rest = digits.slice(point);
  return sign + whole + (rest ? "." + rest : "");
}

function toResult(body, raw, requestId) {
  const nums = rawTopLevelNumbers(raw);
  const cost = nums.totalCostUSD ?? (typeof body.totalCostUSD === "string" ? body.totalCostUSD : "0");
  return {
    allowed: body.allowed === true,
    suspended: body.suspended === true,
    totalTokensUsed: Number(body.totalTokensUsed ?? 0),
    totalCostUSD: plainDecimal(String(cost)),
    iteration: Number(body.iteration ?? 0),
    maxIterations: Number(body.maxIterations ?? 0),
    guidance: body.guidance || null,
    previewUrl: body.previewUrl || null,
    duplicate: body.duplicate === true,
    requestId,
  };
}

function costText(costUSD) {
  if (typeof costUSD === "string") {
    if (!/^\d+(\.\d+)?$/.test(costUSD)) {
      throw new TypeError("costUSD must be a non-negative number or decimal string");
    }
    return costUSD;
  }
  if (typeof costUSD !== "number" || !Number.isFinite(costUSD)) {
    throw new TypeError("costUSD must be a finite number or a decimal string");
  }
  return plainDecimal(String(costUSD));
}

function readToken() {
  const env = (process.env.DIVERGE_MACAROON_TOKEN ?? "").trim();
  if (env) return env;
  const path = process.env.DIVERGE_TOKEN_FILE || DEFAULT_TOKEN_FILE;
  try {
    return readFileSync(path, "utf8").split("\n")[0].trim() || null;
  } catch {
    return null;
  }
}

class NotConfigured extends Error {}

// Where ROUTE (METER_PATH or COMPLETE_PATH) is reached: the completion goes to the meter
// URL with its last segment "meter" replaced by "complete".
function target(route = METER_PATH) {
  const socketPath = process.env.DIVERGE_METER_SOCKET;
  if (socketPath) return { mod: http, opts: { socketPath, path: route, host: "localhost" } };
  const raw = process.env.DIVERGE_METER_URL;
  if (!raw) throw new NotConfigured("neither DIVERGE_METER_SOCKET nor DIVERGE_METER_URL is set");
  let u;
  try {
    u = new URL(raw);
  } catch {
    throw new NotConfigured("DIVERGE_METER_URL must be an http(s) URL");
  }
  if (u.protocol !== "http:" && u.protocol !== "https:") {
    throw new NotConfigured("DIVERGE_METER_URL must be an http(s) URL");
  }
  let path = u.pathname === "/" || u.pathname === "" ? METER_PATH : u.pathname;
  if (route !== METER_PATH) path = path.endsWith("/meter") ? path.slice(0, -5) + "complete" : route;
  path += u.search;
  return {
    mod: u.protocol === "https:" ? https : http,
    opts: { protocol: u.protocol, hostname: u.hostname.replace(/^\[|\]$/g, ""), port: u.port, path },
  };
}

function sendOnce(body, timeoutMs, route) {
  const { mod, opts } = target(route);
  const headers = {
    "Content-Type": "application/json",
    Accept: "application/json",
    "Content-Length": Buffer.byteLength(body),
    "User-Agent": `diverge-sdk-node/${VERSION}`,
  };
  const token = readToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  return new Promise((resolve, reject) => {
    const req = mod.request({ ...opts, method: "POST", headers, agent: false }, (res) => {
      const chunks = [];
      let size = 0;
      res.on("data", (c) => {
        size += c.length;
        if (size <= MAX_RESPONSE) chunks.push(c);
      });
      res.on("end", () =>
        resolve({
          status: res.statusCode,
          text: Buffer.concat(chunks).toString("utf8"),
          retryAfter: Number(res.headers["retry-after"]) || null,
        }),
      );
      res.on("error", reject);
    });
    req.setTimeout(timeoutMs, () => req.destroy(new Error(`no answer within ${timeoutMs} ms`)));
    req.on("error", reject);
    req.end(body);
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * Reports one LLM call (tokensUsed and costUSD are this call's deltas) and resolves to
 * the task's totals, guidance and preview URL. Rejects with LLMMeterError.
 */
export async function meterLLMUsage({
  model,
  tokensUsed,
  costUSD,
  requestId,
  iteration,
  maxAttempts,
  timeoutMs = DEFAULT_TIMEOUT_MS,
  backoffMs = DEFAULT_BACKOFF_MS,
} = {}) {
  if (!Number.isSafeInteger(tokensUsed)) throw new TypeError("tokensUsed must be an integer");
  if (iteration !== undefined && iteration !== null && !Number.isSafeInteger(iteration)) {
    throw new TypeError("iteration must be an integer");
  }
  const id = requestId || randomUUID();
  const fields = { requestId: id, tokensUsed };
  if (model !== undefined && model !== null) fields.model = model;
  if (iteration !== undefined && iteration !== null) fields.iteration = iteration;
  const body = JSON.stringify(fields).slice(0, -1) + `,"costUSD":${costText(costUSD)}}`;
  const res = await post(body, METER_PATH, LLMMeterError, id, attempts(maxAttempts), timeoutMs, backoffMs);
  return toResult(res.parsed, res.text, id);
}

function attempts(maxAttempts) {
  return Math.max(
    1,
    maxAttempts ?? (Number.parseInt(process.env.DIVERGE_METER_MAX_ATTEMPTS ?? "", 10) || DEFAULT_MAX_ATTEMPTS),
  );
}

// POSTs BODY to ROUTE, retrying network failures and 5xx: resolves to the 2xx answer
// ({parsed, text}), rejects with an ErrorClass (a 4xx at once, else the last failure).
async function post(body, route, ErrorClass, id, tries, timeoutMs, backoffMs) {
  let last = null;
  for (let attempt = 0; attempt < tries; attempt++) {
    let retryAfter = null;
    try {
      const res = await sendOnce(body, timeoutMs, route);
      retryAfter = res.retryAfter;
      let parsed = null;
      try {
        parsed = res.text ? JSON.parse(res.text) : null;
      } catch {
        parsed = null;
      }
      if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) parsed = {};
      if (res.status >= 200 && res.status < 300) return { parsed, text: res.text };
      const reason = parsed.reason || http.STATUS_CODES[res.status] || "error";
      last = new ErrorClass(res.status, reason, parsed.error || reason, parsed, id, res.text);
      if (res.status < 500) throw last;
    } catch (e) {
      if (e instanceof ErrorClass && e.status < 500) throw e;
      if (e instanceof NotConfigured) throw new ErrorClass(0, "not configured", e.message, null, id);
      if (!(e instanceof ErrorClass)) {
        const what = route === METER_PATH ? "the meter" : "the server";
        last = new ErrorClass(0, "unreachable", `cannot reach ${what}: ${e.message}`, null, id);
        last.cause = e;
      }
    }
    if (attempt + 1 < tries) {
      let delay = Math.min(MAX_BACKOFF_MS, backoffMs * 2 ** attempt) * (0.5 + Math.random() / 2);
      if (retryAfter !== null) delay = Math.min(MAX_BACKOFF_MS, Math.max(delay, retryAfter * 1000));
      await sleep(delay);
    }
  }
  throw last;
}

/** completeTask was refused (status 400, or 401: token revoked, task not Active), or the
 * server could not be reached after every retry (status 0). */
export class TaskCompleteError extends LLMMeterError {
  constructor(status, reason, message, body = null, requestId = null) {
    super(status, reason, message, body, requestId);
    this.name = "TaskCompleteError";
    this.message = status ? `complete: ${message} (HTTP ${status})` : `complete: ${message}`;
    this.result = null;
  }
}

/**
 * Ends the agent's own task (POST /api/v1/agenttask/complete with the task token): result
 * "succeeded" makes it Completed, "failed" Failed, reason AgentReported, with message (at
 * most 4096 bytes) as its status message; the token is revoked. Network failures and 5xx
 * are retried like meter calls (a retry of a completion that went through answers
 * duplicate: true). Resolves to {phase, reason, message, duplicate}; rejects with
 * TaskCompleteError.
 */
export async function completeTask({
  result,
  message,
  maxAttempts,
  timeoutMs = DEFAULT_TIMEOUT_MS,
  backoffMs = DEFAULT_BACKOFF_MS,
} = {}) {
  if (result !== "succeeded" && result !== "failed") {
    throw new TypeError('result must be "succeeded" or "failed"');
  }
  if (message !== undefined && message !== null && typeof message !== "string") {
    throw new TypeError("message must be a string");
  }
  const fields = { result };
  if (message !== undefined && message !== null) fields.message = message;
  const res = await post(JSON.stringify(fields), COMPLETE_PATH, TaskCompleteError, null,
    attempts(maxAttempts), timeoutMs, backoffMs);
  return {
    phase: String(res.parsed.phase ?? ""),
    reason: String(res.parsed.reason ?? ""),
    message: String(res.parsed.message ?? ""),
    duplicate: res.parsed.duplicate === true,
  };
}
