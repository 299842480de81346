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
    const repo = (t.spec && t.spec.repository && t.spec.repository.url) || "";
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
    }
    pre.appendChild(frag);
    while (logLines > LOG_MAX_LINES && pre.firstChild) {
      pre.removeChild(pre.firstChild);
      logLines--;
    }
    if ($("follow").checked) pre.scrollTop = pre.scrollHeight;
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
      if (current === null) renderList(k);
      else if (k === current) renderTask(deleted);
    });
    source.addEventListener("reset", () => {
      tasks.clear();
      if (current === null) renderList(null);
    });
    source.addEventListener("log", (ev) => appendLog(ev.data));
    source.addEventListener("end", () => {
      $("log-state").textContent = "(finished)";
    });
  }

  function route() {
    const m = /^#\/task\/([^/]+)\/([^/]+)$/.exec(location.hash);
    const next = m ? decodeURIComponent(m[1]) + "/" + decodeURIComponent(m[2]) : null;
    $("list-view").hidden = next !== null;
    $("task-view").hidden = next === null;
    if (next === current && source) return;
    current = next;
    $("log").replaceChildren();
    logLines = 0;
    $("log-state").textContent = "";
    $("t-spec").textContent = "";
    $("t-status").replaceChildren();
    $("t-deleted").hidden = true;
    if (current) $("t-title").textContent = current;
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
