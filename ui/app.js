// SPDX-License-Identifier: Apache-2.0
// The Diverge dashboard: one EventSource (/api/v1/events) feeds a task table and a task
// page. Read-only. Text from tasks and logs is only ever set through textContent.
"use strict";

(function () {
  const PHASES = ["Pending", "Provisioning", "Active", "Pausing", "Paused", "Completed", "Failed"];
  const ANN = "divergedev.com/";
  const LOG_MAX_LINES = 20000;
  const tasks = new Map(); // "ns/name" -> task object
  let source = null;
  let current = null; // "ns/name" of the task page, null on the list
  let logLines = 0;
  let view = "list"; // "list", "projects" or "task"
  let history = null; // the task page's /ui/api/history answer
  let notFound = false;
  let quotas = null; // /ui/api/spendquotas items, null until loaded
  const timers = {}; // pending reloads by name
  // What the task page reads from the task log (the server's own lines, and the runner's
  // iteration lines): bounded, whatever the log holds.
  const TL_MAX = 300; // timeline entries kept (the newest)
  const MARKS_MAX = 200; // pause/resume marks kept
  const HOSTS_MAX = 200; // egress hosts counted one by one; the rest as "other hosts"
  let side = null;

  function freshSide() {
    return { tl: [], marks: [], iterStart: new Map(), pushed: null, allowed: 0, denied: 0,
             hosts: new Map(), pending: false };
  }

  const $ = (id) => document.getElementById(id);
  const key = (t) => t.metadata.namespace + "/" + t.metadata.name;

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  // Only http(s) URLs become links: a task cannot smuggle a javascript: URL in.
  function safeUrl(u) {
    if (typeof u !== "string") return null;
    try {
      const p = new URL(u, location.href);
      return p.protocol === "http:" || p.protocol === "https:" ? p.href : null;
    } catch (e) {
      return null;
    }
  }

  function link(url, text) {
    const safe = safeUrl(url);
    if (!safe) return el("span", null, text);
    const a = el("a", null, text);
    a.href = safe;
    a.rel = "noopener noreferrer";
    a.target = "_blank";
    return a;
  }

  const SVG_NS = "http://www.w3.org/2000/svg";

  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVG_NS, tag);
    for (const k of Object.keys(attrs || {})) e.setAttribute(k, String(attrs[k]));
    if (text !== undefined) e.textContent = String(text);
    return e;
  }

  // Decimal strings ("5.00", "0.0675") to integer micro-dollars: no float arithmetic.
  function micros(s) {
    if (typeof s === "number") s = String(s);
    if (typeof s !== "string" || !/^\d+(\.\d+)?$/.test(s)) return null;
    const [whole, frac = ""] = s.split(".");
    return Number(whole) * 1000000 + Number((frac + "000000").slice(0, 6));
  }

  // Exact, as the CLI and the sticky comment show it: at least two decimals, at most six,
  // never rounded ($0.036 stays $0.036).
  function usd(m) {
    if (m === null) return "—";
    let frac = String(m % 1000000).padStart(6, "0").replace(/0+$/, "");
    while (frac.length < 2) frac += "0";
    return "$" + Math.floor(m / 1000000) + "." + frac;
  }

  // The meter's forecast (status.forecast*), worded as the sticky comment words it.
  function forecastText(st) {
    const f = micros(st.forecastUSD), per = micros(st.forecastPerIterationUSD);
    const left = st.forecastIterationsLeft;
    if (f === null || per === null || !Number.isInteger(left)) return "—";
    let s = "≈ " + usd(f) + " more to finish at " + usd(per) + "/iteration · " + left +
      (left === 1 ? " iteration" : " iterations") + " left";
    if (st.forecastBudgetHolds === true) s += " · budget holds";
    else if (st.forecastBudgetHolds === false && Number.isInteger(st.forecastRunsOutIteration)) {
      s += " · ⚠️ at this rate the budget runs out in iteration " + st.forecastRunsOutIteration +
        " of " + ((st.iteration || 0) - 1 + left);
    }
    return s;
  }

  function pct(used, budget) {
    if (!budget || used === null) return null;
    return Math.round((used * 100) / budget);
  }

  // The limit that applies to task T: status.effective<KIND> (what the server enforces:
  // spec, token caveat or server default), else spec (a task not started yet); or null.
  function limit(t, kind) {
    const st = t.status || {}, sp = t.spec || {};
    const spec = { MaxIterations: sp.maxIterations, BudgetTokens: sp.budgetTokens,
                   BudgetUSD: sp.budgetUSD }[kind];
    return st["effective" + kind] || spec || null;
  }

  function meterCell(used, budget, fmt) {
    const td = el("td", "num");
    const p = pct(used, budget);
    const m = document.createElement("meter");
    m.min = 0;
    m.max = 100;
    m.low = 70;
    m.high = 90;
    m.optimum = 0;
    m.value = p === null ? 0 : Math.min(p, 100);
    td.appendChild(m);
    let text = fmt(used) + " / " + (budget ? fmt(budget) : "default");
    if (p !== null) text += " · " + p + "%";
    td.appendChild(el("div", "spend-text", text));
    return td;
  }

  function age(ts) {
    const t = Date.parse(ts);
    if (isNaN(t)) return "";
    const s = Math.max(0, Math.floor((Date.now() - t) / 1000));
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m";
    if (s < 86400) return Math.floor(s / 3600) + "h";
    return Math.floor(s / 86400) + "d";
  }

  function prLink(t) {
    const a = t.metadata.annotations || {};
    const repo = ((t.spec && t.spec.repository && t.spec.repository.url) || "")
      .replace(/\/+$/, "").replace(/\.git$/, "");
    const project = a[ANN + "project"];
    if (a[ANN + "pr-number"]) {
      const n = a[ANN + "pr-number"];
      const base = repo || (project ? "https://github.com/" + project : "");
      return link(base ? base.replace(/\/+$/, "") + "/pull/" + n : null,
                  (project || "") + "#" + n);
    }
    if (a[ANN + "mr-iid"]) {
      const n = a[ANN + "mr-iid"];
      const base = repo || (project ? "https://gitlab.com/" + project : "");
      return link(base ? base.replace(/\/+$/, "") + "/-/merge_requests/" + n : null,
                  (project || "") + "!" + n);
    }
    return el("span", "muted", "—");
  }

  function phaseOf(t) {
    return (t.status && t.status.phase) || "Pending";
  }

  function badge(phase) {
    return el("span", "badge phase-" + (PHASES.includes(phase) ? phase : "Pending"), phase);
  }

  // The phase badge, and the queue position of a task waiting for a sandbox slot.
  function phaseCell(t) {
    const f = document.createDocumentFragment();
    const pos = Number((t.status || {}).queuePosition || 0);
    f.appendChild(badge(phaseOf(t)));
    if (pos > 0) f.appendChild(el("span", "queued", " · queued #" + pos));
    return f;
  }

  function row(t) {
    const tr = document.createElement("tr");
    const st = t.status || {};
    const sp = t.spec || {};
    tr.dataset.key = key(t);
    tr.dataset.phase = phaseOf(t);
    tr.dataset.ns = t.metadata.namespace;
    tr.appendChild(el("td", null, t.metadata.namespace));
    const name = el("td", "name");
    const a = el("a", null, t.metadata.name);
    a.href = "#/task/" + encodeURIComponent(t.metadata.namespace) + "/" +
      encodeURIComponent(t.metadata.name);
    name.appendChild(a);
    tr.appendChild(name);
    const ph = el("td", "phase");
    ph.appendChild(phaseCell(t));
    tr.appendChild(ph);
    const pr = el("td");
    pr.appendChild(prLink(t));
    tr.appendChild(pr);
    tr.appendChild(el("td", "objective", sp.objective || ""));
    tr.appendChild(el("td", "num iteration",
                      (st.iteration || 0) + " / " + (limit(t, "MaxIterations") || "—")));
    const tok = meterCell(Number(st.tokensConsumed || 0), Number(limit(t, "BudgetTokens") || 0),
                          (n) => Number(n).toLocaleString("en-US"));
    tok.classList.add("tokens");
    tr.appendChild(tok);
    const cost = meterCell(micros(st.costUSD || "0"), micros(limit(t, "BudgetUSD") || "0"), usd);
    cost.classList.add("spend");
    tr.appendChild(cost);
    const ag = el("td", "num age", age(t.metadata.creationTimestamp));
    ag.dataset.ts = t.metadata.creationTimestamp || "";
    tr.appendChild(ag);
    return tr;
  }

  function fillSelect(sel, values) {
    const keep = sel.value;
    while (sel.options.length > 1) sel.remove(1);
    for (const v of values) sel.add(new Option(v, v));
    sel.value = values.includes(keep) ? keep : "";
  }

  function renderList(changedKey) {
    const body = $("task-rows");
    const fp = $("f-phase").value;
    const fn = $("f-ns").value;
    const keys = Array.from(tasks.keys()).sort();
    const frag = document.createDocumentFragment();
    let shown = 0;
    for (const k of keys) {
      const t = tasks.get(k);
      if ((fp && phaseOf(t) !== fp) || (fn && t.metadata.namespace !== fn)) continue;
      const tr = row(t);
      if (k === changedKey) tr.classList.add("changed");
      frag.appendChild(tr);
      shown++;
    }
    body.replaceChildren(frag);
    $("empty").hidden = shown > 0;
    $("count").textContent = shown + " of " + tasks.size + " tasks";
    fillSelect($("f-ns"), Array.from(new Set(keys.map((k) => tasks.get(k).metadata.namespace))));
  }

  function renderTask(deleted) {
    if (!current) return;
    const t = tasks.get(current);
    $("t-title").textContent = current;
    $("t-deleted").hidden = !deleted;
    if (!t) return;
    const st = t.status || {};
    const sp = t.spec || {};
    const dl = $("t-status");
    const rows = [
      ["Phase", phaseCell(t)],
      ["Reason", st.reason || "—"],
      ["Message", st.message || "—"],
      ["Iteration", (st.iteration || 0) + " / " + (limit(t, "MaxIterations") || "—")],
      ["Tokens", Number(st.tokensConsumed || 0).toLocaleString("en-US") + " / " +
        (limit(t, "BudgetTokens") ? Number(limit(t, "BudgetTokens")).toLocaleString("en-US")
          : "default")],
      ["Spend", usd(micros(st.costUSD || "0")) + " / " +
        (limit(t, "BudgetUSD") ? usd(micros(limit(t, "BudgetUSD"))) : "default")],
      ["Forecast", forecastText(st)],
      ["PR/MR", prLink(t)],
      ["Started", st.startTime || "—"],
      ["Finished", st.completionTime || "—"],
    ];
    const frag = document.createDocumentFragment();
    for (const [k, v] of rows) {
      frag.appendChild(el("dt", null, k));
      const dd = el("dd");
      if (v instanceof Node) dd.appendChild(v);
      else dd.textContent = v;
      frag.appendChild(dd);
    }
    dl.replaceChildren(frag);
    $("t-spec").textContent = JSON.stringify(sp, null, 2);
    if (notFound) {
      notFound = false;
      showNotFound();
    }
    later("history", 1000, loadHistory);
    scheduleSide();
    const prev = $("t-preview");
    const url = safeUrl(st.previewUrl || (t.metadata.annotations || {})[ANN + "preview-url"]);
    if (url) {
      const exit = new URL(url);
      exit.searchParams.set("_diverge_env", "clear");
      prev.className = "";
      prev.replaceChildren(link(url, "Open preview (magic link)"), el("span", null, " · "),
                           link(exit.href, "Exit preview"));
    } else {
      prev.className = "muted";
      prev.textContent = "No preview.";
    }
  }

  function appendLog(text) {
    const pre = $("log");
    const frag = document.createDocumentFragment();
    for (const line of text.split("\n")) {
      const span = el("span", "line", line);
      // "<time> [sandbox] …": what task code printed. Never styled as the server's own
      // lines, whatever it says (an agent can print "egress … allowed" or "[diverge] …").
      if (/^\S+ \[sandbox\] /.test(line)) {
        span.classList.add("sandbox");
      // "<time> egress host:port allowed|denied …"
      } else if (/^\S+\s+(\[[^\]]*\]\s+)?egress\s/.test(line)) {
        span.classList.add(/\sdenied(\s|$)/.test(line) ? "egress-denied" : "egress");
      } else if (/^\S+\s+\[log\]\s/.test(line)) {
        span.classList.add("marker");
      }
      frag.appendChild(span);
      logLines++;
      if (side) readLine(line);
    }
    scheduleSide();
    pre.appendChild(frag);
    while (logLines > LOG_MAX_LINES && pre.firstChild) {
      pre.removeChild(pre.firstChild);
      logLines--;
    }
    if ($("follow").checked) pre.scrollTop = pre.scrollHeight;
  }

  // --- The task page's side panels, from the task log ------------------------------------

  function pushCapped(arr, item, max) {
    arr.push(item);
    if (arr.length > max) arr.splice(0, arr.length - max);
  }

  // "<n>/<max>: …" of a runner line "diverge-agent-runner: iteration <n>/<max>: …".
  function iterationLine(t, s) {
    let m = /^(\d{1,9})\/(\d{1,9}): running the agent$/.exec(s);
    if (m) {
      if (side.iterStart.size >= 64) side.iterStart.clear();
      side.iterStart.set(m[1], t);
      return;
    }
    m = /^(\d{1,9})\/(\d{1,9}): (?:agent exit (-?\d{1,4})(?:, verify exit (-?\d{1,4}))?|(the agent was stopped))/.exec(s);
    if (!m) return;
    const start = side.iterStart.get(m[1]);
    side.iterStart.delete(m[1]);
    pushCapped(side.tl, {
      t, kind: "iter", n: Number(m[1]), max: Number(m[2]),
      agent: m[3] === undefined ? null : Number(m[3]),
      verify: m[4] === undefined ? null : Number(m[4]), stopped: !!m[5],
      dur: start !== undefined && t >= start ? t - start : null,
    }, TL_MAX);
  }

  // The server's own "[diverge] …" lines that change the task's course.
  const PHASE_LINE = /^(provisioned|started|resumed|paused|failed|pushed|timeout|no progress|run \d+ requested|restarted|draft pull request|task deleted|disk limit)\b/;

  function serverLine(t, s) {
    const m = PHASE_LINE.exec(s);
    if (!m) return;
    if (m[1] === "paused" || m[1] === "resumed") {
      pushCapped(side.marks, {t, kind: m[1] === "paused" ? "pause" : "resume"}, MARKS_MAX);
    }
    const p = /^pushed refs\/heads\/(\S+) at ([0-9a-f]{40})$/.exec(s);
    if (p) side.pushed = {branch: p[1], commit: p[2]};
    pushCapped(side.tl, {t, kind: "phase", text: s.length > 300 ? s.slice(0, 300) + "…" : s},
               TL_MAX);
  }

  function egressLine(host, verdict, rest) {
    if (/ closed bytes_out=/.test(rest)) return; // the end of a tunnel already counted
    const allowed = verdict === "allowed";
    if (allowed) side.allowed++;
    else side.denied++;
    let h = side.hosts.get(host);
    if (!h) {
      if (side.hosts.size >= HOSTS_MAX) host = "(other hosts)";
      h = side.hosts.get(host) || {allowed: 0, denied: 0};
      side.hosts.set(host, h);
    }
    if (allowed) h.allowed++;
    else h.denied++;
  }

  // One task log line "<RFC 3339 time> …". Sandbox output ("[sandbox] …") is never read
  // as the server's; only the runner's iteration lines are taken from it (the runner
  // shares the sandbox with the agent: what they say is the runner's report).
  function readLine(line) {
    const sp = line.indexOf(" ");
    if (sp < 10 || sp > 40) return;
    const t = Date.parse(line.slice(0, sp));
    if (isNaN(t)) return;
    const rest = line.slice(sp + 1);
    const RUNNER = "[sandbox] diverge-agent-runner: iteration ";
    if (rest.startsWith(RUNNER)) {
      iterationLine(t, rest.slice(RUNNER.length));
    } else if (rest.startsWith("[diverge] ")) {
      serverLine(t, rest.slice(10));
    } else {
      const m = /^egress (\S{1,300}) (allowed|denied)(?: |$)/.exec(rest);
      if (m) egressLine(m[1], m[2], rest);
    }
  }

  function fmtTime(ms) {
    return new Date(ms).toISOString().replace("T", " ").slice(0, 19) + " UTC";
  }

  function fmtDuration(ms) {
    if (ms === null || ms === undefined) return "—";
    const s = Math.round(ms / 1000);
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
  }

  function verifyCell(e) {
    if (e.stopped) return el("span", "fail", "stopped (paused)");
    if (e.verify !== null) {
      return e.verify === 0 ? el("span", "pass", "✓ pass")
        : el("span", "fail", "✗ fail (exit " + e.verify + ")");
    }
    if (e.agent !== null && e.agent !== 0) return el("span", "fail", "agent exit " + e.agent);
    return el("span", "muted", "no verify");
  }

  function renderTimeline() {
    const frag = document.createDocumentFragment();
    const newest = side.tl.map((e, i) => [e, i]).sort((a, b) => (b[0].t - a[0].t) || (b[1] - a[1]));
    for (const [e] of newest) {
      const tr = el("tr", "tl-" + e.kind);
      tr.appendChild(el("td", "time", fmtTime(e.t)));
      if (e.kind === "iter") {
        tr.dataset.verify = e.verify === null ? "none" : e.verify === 0 ? "pass" : "fail";
        tr.appendChild(el("td", "event", "Iteration " + e.n + " / " + e.max));
        const v = el("td", "verify");
        v.appendChild(verifyCell(e));
        tr.appendChild(v);
        tr.appendChild(el("td", "duration", fmtDuration(e.dur)));
      } else {
        tr.appendChild(el("td", "event", e.text));
        tr.appendChild(el("td"));
        tr.appendChild(el("td"));
      }
      frag.appendChild(tr);
    }
    $("timeline-rows").replaceChildren(frag);
    $("timeline-empty").hidden = side.tl.length > 0;
  }

  function renderEgress() {
    const total = side.allowed + side.denied;
    $("egress-summary").className = total ? "" : "muted";
    $("egress-summary").textContent = total
      ? side.allowed + " allowed · " + side.denied + " denied" : "No egress.";
    const rows = Array.from(side.hosts.entries())
      .sort((a, b) => (b[1].denied - a[1].denied) || (b[1].allowed - a[1].allowed)).slice(0, 50);
    const frag = document.createDocumentFragment();
    for (const [host, c] of rows) {
      const tr = el("tr");
      tr.appendChild(el("td", "host", host));
      tr.appendChild(el("td", "num", c.allowed));
      tr.appendChild(el("td", "num" + (c.denied ? " fail" : ""), c.denied));
      frag.appendChild(tr);
    }
    $("egress-rows").replaceChildren(frag);
    $("egress-hosts").hidden = rows.length === 0;
  }

  function renderSide() {
    side.pending = false;
    if (view !== "task") return;
    renderTimeline();
    renderEgress();
    renderLinks();
    renderChart();
  }

  function scheduleSide() {
    if (side.pending) return;
    side.pending = true;
    setTimeout(renderSide, 50);
  }

  // --- Links: the PR/MR, the pushed commit, the work-in-progress branch -------------------

  // The web page of the task's repository (https only, ".git" dropped), and its kind.
  function repoWeb(t) {
    const url = safeUrl(((t.spec || {}).repository || {}).url || "");
    if (!url) return null;
    const base = url.replace(/\/+$/, "").replace(/\.git$/, "");
    const prov = (t.metadata.annotations || {})[ANN + "provider"] || "";
    const gitlab = prov === "gitlab" || (prov !== "github" && /gitlab/.test(new URL(base).host));
    return {base, gitlab};
  }

  function renderLinks() {
    const t = tasks.get(current);
    const box = $("t-links");
    if (!t) {
      box.replaceChildren();
      return;
    }
    const a = t.metadata.annotations || {};
    const web = repoWeb(t);
    const frag = document.createDocumentFragment();
    const add = (label, node) => {
      const span = el("span", "link-item");
      span.appendChild(el("span", "muted", label + " "));
      span.appendChild(node);
      frag.appendChild(span);
    };
    if (a[ANN + "pr-number"] || a[ANN + "mr-iid"]) add("PR/MR", prLink(t));
    if (a[ANN + "pull-request-url"]) add("Pull request", link(a[ANN + "pull-request-url"],
                                                             a[ANN + "pull-request-url"]));
    if (side.pushed) {
      const c = side.pushed;
      const text = c.commit.slice(0, 12) + " on " + c.branch;
      const href = web ? web.base + (web.gitlab ? "/-/commit/" : "/commit/") + c.commit : null;
      const node = link(href, text);
      node.classList.add("commit-link");
      add("Pushed commit", node);
    }
    if (a[ANN + "wip-branch"]) {
      const b = a[ANN + "wip-branch"];
      const href = web ? web.base + (web.gitlab ? "/-/tree/" : "/tree/") +
        b.split("/").map(encodeURIComponent).join("/") : null;
      const node = link(href, b);
      node.classList.add("wip-link");
      add("Work in progress", node);
    }
    box.replaceChildren(frag);
    box.hidden = !box.firstChild;
  }

  // --- The spend chart (SVG drawn here: no library) ---------------------------------------

  // [time ms, micro-dollars] points: 0 at creation, then the recorded charges; the task's
  // current total when the charges are not kept (or a charge came after the answer).
  function spendSeries(t) {
    const st = t.status || {};
    const created = Date.parse(t.metadata.creationTimestamp || "");
    const pts = [];
    for (const p of (history && history.charges) || []) {
      const m = micros(p.costUSD);
      if (Number.isFinite(p.timeMs) && m !== null) pts.push([p.timeMs, m]);
    }
    const t0 = Math.min(isNaN(created) ? Infinity : created, pts.length ? pts[0][0] : Infinity);
    const series = [[Number.isFinite(t0) ? t0 : Date.now(), 0]].concat(pts);
    const cost = micros(st.costUSD || "0") || 0;
    const last = series[series.length - 1];
    if (cost > last[1]) {
      const end = Date.parse(st.completionTime || "") || Date.now();
      series.push([Math.max(end, last[0]), cost]);
    }
    return series;
  }

  // The forecast's end: the cost per iteration times the iterations left, at the pace of
  // the iterations so far (their measured durations, else the time spent per iteration).
  function forecastEnd(t, series) {
    const st = t.status || {};
    const f = micros(st.forecastUSD);
    const left = st.forecastIterationsLeft;
    if (f === null || !Number.isInteger(left) || left < 1) return null;
    const last = series[series.length - 1];
    const durs = side.tl.filter((e) => e.kind === "iter" && e.dur !== null).map((e) => e.dur);
    let per = durs.length ? durs.reduce((x, y) => x + y, 0) / durs.length : 0;
    if (!per) per = (last[0] - series[0][0]) / Math.max(1, (st.iteration || 2) - 1);
    return [last[0] + Math.max(per, 1000) * left, last[1] + f];
  }

  function renderChart() {
    const box = $("chart");
    const t = tasks.get(current);
    if (!t) {
      box.replaceChildren();
      return;
    }
    const W = 460, H = 210, L = 56, R = 12, T = 12, B = 26;
    const series = spendSeries(t);
    const fc = forecastEnd(t, series);
    const budget = micros(limit(t, "BudgetUSD") || "0") || 0;
    const t0 = series[0][0];
    let t1 = Math.max(series[series.length - 1][0], fc ? fc[0] : 0, t0 + 1000);
    for (const m of side.marks) t1 = Math.max(t1, m.t);
    const ymax = Math.max(budget, series[series.length - 1][1], fc ? fc[1] : 0, 1) * 1.08;
    const x = (ms) => L + ((ms - t0) / (t1 - t0)) * (W - L - R);
    const y = (m) => T + (1 - m / ymax) * (H - T - B);
    const path = (pts) => pts.map((p, i) => (i ? "L" : "M") + x(p[0]).toFixed(1) + " " +
                                  y(p[1]).toFixed(1)).join(" ");
    const s = svg("svg", {id: "spend-chart", viewBox: "0 0 " + W + " " + H, role: "img",
                          "aria-label": "spend over time"});
    s.appendChild(svg("line", {class: "axis-line", x1: L, y1: y(0), x2: W - R, y2: y(0),
                               stroke: "#c5cad3"}));
    s.appendChild(svg("text", {class: "axis", x: L - 4, y: y(0), "text-anchor": "end"}, "$0"));
    s.appendChild(svg("text", {class: "axis", x: L, y: H - 8}, fmtTime(t0).slice(11, 16)));
    s.appendChild(svg("text", {class: "axis", x: W - R, y: H - 8, "text-anchor": "end"},
                      fmtTime(t1).slice(11, 16) + " UTC"));
    if (budget > 0) {
      s.appendChild(svg("line", {class: "budget", x1: L, y1: y(budget), x2: W - R, y2: y(budget),
                                 stroke: "#b3261e", "stroke-width": 1.5}));
      s.appendChild(svg("text", {class: "axis budget-label", x: L - 4, y: y(budget) + 3,
                                 "text-anchor": "end"}, usd(budget)));
    }
    for (const m of side.marks) {
      const line = svg("line", {class: "mark mark-" + m.kind, x1: x(m.t), y1: T, x2: x(m.t),
                                y2: y(0), stroke: m.kind === "pause" ? "#c28a00" : "#1f8a4c",
                                "stroke-width": 1.5});
      line.appendChild(svg("title", {}, (m.kind === "pause" ? "paused " : "resumed ") +
                           fmtTime(m.t)));
      s.appendChild(line);
    }
    const cost = svg("path", {class: "cost", d: path(series), fill: "none", stroke: "#2f6fde",
                              "stroke-width": 2});
    cost.dataset.points = String(series.length);
    s.appendChild(cost);
    const last = series[series.length - 1];
    s.appendChild(svg("text", {class: "axis", x: L - 4, y: y(last[1]) + 3, "text-anchor": "end"},
                      Math.abs(y(last[1]) - y(budget)) > 10 && y(0) - y(last[1]) > 10
                        ? usd(last[1]) : ""));
    if (fc) {
      s.appendChild(svg("path", {class: "forecast", d: path([last, fc]), fill: "none",
                                 stroke: "#2f6fde", "stroke-width": 2,
                                 "stroke-dasharray": "6 4"}));
    }
    box.replaceChildren(s);
    const legend = [["spent " + usd(last[1]), "cost"]];
    if (budget > 0) legend.push(["budget " + usd(budget), "budget"]);
    if (fc) legend.push(["forecast +" + usd(fc[1] - last[1]) + " (dashed)", "forecast"]);
    if (side.marks.length) legend.push(["pause/resume marks", "marks"]);
    if (history && history.chargesKept === false) legend.push(["charge times not kept by this store", "nokept"]);
    $("chart-legend").replaceChildren(...legend.map(([text, cls]) => el("span", cls, text)));
  }

  // --- Data the page fetches (same-origin, the session cookie) ----------------------------

  function later(name, ms, fn) {
    if (timers[name]) return;
    timers[name] = setTimeout(() => {
      timers[name] = null;
      fn();
    }, ms);
  }

  function loadHistory() {
    const want = current;
    if (!want) return;
    const [ns, name] = want.split("/");
    fetch("/ui/api/history/" + encodeURIComponent(ns) + "/" + encodeURIComponent(name),
          {credentials: "same-origin", cache: "no-store"})
      .then((r) => (r.status === 404 ? {notFound: true} : r.ok ? r.json() : null))
      .then((j) => {
        if (current !== want || !j) return;
        if (j.notFound) {
          notFound = !tasks.has(want);
        } else {
          history = j;
          notFound = false;
        }
        showNotFound();
        scheduleSide();
      })
      .catch(() => {});
  }

  function showNotFound() {
    $("t-notfound").hidden = !notFound;
    $("t-notfound").textContent = "Task " + current + " not found.";
    $("t-body").hidden = notFound;
  }

  function loadQuotas() {
    fetch("/ui/api/spendquotas", {credentials: "same-origin", cache: "no-store"})
      .then((r) => (r.ok ? r.json() : null))
      .then((j) => {
        if (j && Array.isArray(j.items)) quotas = j.items;
        renderProjects();
      })
      .catch(() => {});
  }

  // --- Projects: per namespace, this month's spend against its SpendQuotas ----------------

  const RUNNING = ["Provisioning", "Active", "Pausing"];

  function quotaLines(qs, kind) {
    const td = el("td", "num quota-" + kind);
    if (!qs.length) {
      td.appendChild(el("span", "muted no-quota", "no quota"));
      return td;
    }
    for (const q of qs) {
      const sp = q.spec || {}, st = q.status || {};
      const usedN = kind === "usd" ? micros(st.usedUSD || "0") : Number(st.usedTokens || 0);
      const limRaw = kind === "usd" ? sp.monthlyUSD : sp.monthlyTokens;
      const lim = limRaw === undefined || limRaw === null ? null
        : kind === "usd" ? micros(limRaw) : Number(limRaw);
      const fmt = kind === "usd" ? usd : (n) => Number(n).toLocaleString("en-US");
      const div = el("div", "quota-line");
      let text = q.metadata.name + ": " + fmt(usedN);
      if (lim !== null) {
        const p = lim > 0 ? Math.round((usedN * 100) / lim) : 100;
        const m = document.createElement("meter");
        m.min = 0; m.max = 100; m.low = 70; m.high = 90; m.optimum = 0;
        m.value = Math.min(p, 100);
        div.appendChild(m);
        text += " / " + fmt(lim) + " · " + p + "%";
      } else {
        text += " (no limit)";
      }
      div.appendChild(el("span", "quota-text", text));
      td.appendChild(div);
    }
    return td;
  }

  function renderProjects() {
    if (view !== "projects") return;
    const byNs = new Map();
    const ns = (n) => {
      if (!byNs.has(n)) byNs.set(n, {running: 0, queued: 0, tasks: 0, quotas: []});
      return byNs.get(n);
    };
    for (const t of tasks.values()) {
      const p = ns(t.metadata.namespace), st = t.status || {};
      p.tasks++;
      if (RUNNING.includes(phaseOf(t))) p.running++;
      if (Number(st.queuePosition || 0) > 0 || st.reason === "Queued") p.queued++;
    }
    for (const q of quotas || []) ns(q.metadata.namespace).quotas.push(q);
    const frag = document.createDocumentFragment();
    for (const n of Array.from(byNs.keys()).sort()) {
      const p = byNs.get(n);
      const tr = el("tr");
      tr.dataset.ns = n;
      tr.appendChild(el("td", "ns", n));
      tr.appendChild(el("td", "num running", p.running));
      tr.appendChild(el("td", "num queued", p.queued));
      tr.appendChild(el("td", "num tasks", p.tasks));
      tr.appendChild(quotaLines(p.quotas, "usd"));
      tr.appendChild(quotaLines(p.quotas, "tokens"));
      const caps = p.quotas.map((q) => (q.spec || {}).maxRunningTasks)
        .filter((v) => Number.isInteger(v));
      tr.appendChild(el("td", "num max-running", caps.length ? Math.min(...caps) : "—"));
      frag.appendChild(tr);
    }
    $("project-rows").replaceChildren(frag);
    $("projects-empty").hidden = byNs.size > 0;
  }

  function setConn(cls, text) {
    const c = $("conn");
    c.className = "conn " + cls;
    c.textContent = text;
  }

  function parse(ev) {
    try {
      return JSON.parse(ev.data);
    } catch (e) {
      return null;
    }
  }

  function connect() {
    if (source) source.close();
    tasks.clear();
    const url = "/api/v1/events" + (current ? "?task=" + encodeURIComponent(current) : "");
    source = new EventSource(url);
    setConn("conn-wait", "connecting…");
    source.onopen = () => setConn("conn-ok", "live");
    source.onerror = () => setConn(source.readyState === 2 ? "conn-bad" : "conn-wait",
                                   source.readyState === 2 ? "disconnected" : "reconnecting…");
    source.addEventListener("task", (ev) => {
      const t = parse(ev);
      if (!t || !t.metadata) return;
      const k = key(t);
      const deleted = !!t.metadata.deletionTimestamp;
      if (deleted) tasks.delete(k);
      else tasks.set(k, t);
      if (view === "list") renderList(k);
      else if (view === "projects") {
        renderProjects();
        later("quotas", 1000, loadQuotas);
      } else if (k === current) renderTask(deleted);
    });
    source.addEventListener("reset", () => {
      tasks.clear();
      if (view === "list") renderList(null);
      if (view === "projects") renderProjects();
    });
    source.addEventListener("log", (ev) => appendLog(ev.data));
    source.addEventListener("end", () => {
      $("log-state").textContent = "(finished)";
    });
  }

  function route() {
    const m = /^#\/task\/([^/]+)\/([^/]+)$/.exec(location.hash);
    let next = null;
    try {
      next = m ? decodeURIComponent(m[1]) + "/" + decodeURIComponent(m[2]) : null;
    } catch (e) {
      next = null;
    }
    view = next !== null ? "task" : location.hash === "#/projects" ? "projects" : "list";
    $("list-view").hidden = view !== "list";
    $("projects-view").hidden = view !== "projects";
    $("task-view").hidden = view !== "task";
    $("nav-tasks").className = view === "list" ? "current" : "";
    $("nav-projects").className = view === "projects" ? "current" : "";
    if (view === "projects") {
      renderProjects();
      loadQuotas();
    }
    if (view === "list") renderList(null);
    if (next === current && source) return;
    current = next;
    $("log").replaceChildren();
    logLines = 0;
    side = freshSide();
    history = null;
    notFound = false;
    $("log-state").textContent = "";
    $("t-spec").textContent = "";
    $("t-status").replaceChildren();
    $("t-links").replaceChildren();
    $("chart").replaceChildren();
    $("chart-legend").replaceChildren();
    $("t-deleted").hidden = true;
    showNotFound();
    if (current) {
      $("t-title").textContent = current;
      loadHistory();
    }
    renderList(null);
    connect();
  }

  document.addEventListener("DOMContentLoaded", () => {
    for (const p of PHASES) $("f-phase").add(new Option(p, p));
    $("f-phase").addEventListener("change", () => renderList(null));
    $("f-ns").addEventListener("change", () => renderList(null));
    window.addEventListener("hashchange", route);
    setInterval(() => {
      for (const td of document.querySelectorAll("td.age")) td.textContent = age(td.dataset.ts);
    }, 30000);
    route();
  });
})();
