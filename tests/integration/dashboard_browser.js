// SPDX-License-Identifier: Apache-2.0
// Drives Debian's chromium (headless) through puppeteer-core against a running
// `diverge serve`, for test_dashboard.py. Reads a JSON job on argv[2], prints one JSON
// result line on stdout: what the DOM showed, console errors, dialogs.
"use strict";
const fs = require("fs");
const { launchBrowser, watchPage, runDriver } = require("./browser_common.js");

const job = JSON.parse(process.argv[2]);
const API = job.url + "/apis/divergedev.com/v1alpha1/namespaces/";

async function patchStatus(ns, name, status) {
  const r = await fetch(API + ns + "/agenttasks/" + name + "/status", {
    method: "PATCH",
    headers: {"Authorization": "Bearer " + job.token,
              "Content-Type": "application/merge-patch+json"},
    body: JSON.stringify({status}),
  });
  if (r.status !== 200) throw new Error("PATCH status: " + r.status + " " + await r.text());
}

async function main() {
  const out = {consoleErrors: [], pageErrors: [], dialogs: [], failed: []};
  const browser = await launchBrowser(job.profile, ["--enable-logging=stderr", "--v=0"]);
  try {
    const page = await browser.newPage();
    await page.setViewport({width: 1400, height: 800});
    watchPage(page, out);
    page.on("requestfailed", (r) => out.failed.push(r.url()));

    // Log in the way a person does: the printed URL sets the cookie and redirects to /.
    const resp = await page.goto(job.url + "/ui/login?token=" + job.token,
                                 {waitUntil: "domcontentloaded"});
    out.landed = new URL(page.url()).pathname;
    out.csp = resp.headers()["content-security-policy"];
    const cookies = await page.cookies();
    const c = cookies.find((x) => x.name === "diverge_token") || {};
    out.cookie = {httpOnly: c.httpOnly, sameSite: c.sameSite, path: c.path};

    await page.waitForFunction((n) => document.querySelectorAll("#task-rows tr").length === n,
                               {timeout: 15000}, job.tasks.length);
    const rows = () => page.$$eval("#task-rows tr", (trs) => trs.map((tr) => ({
      key: tr.dataset.key,
      phase: tr.querySelector("td.phase").textContent,
      objective: tr.querySelector("td.objective").textContent,
      spend: tr.querySelector("td.spend .spend-text").textContent,
      tokens: tr.querySelector("td.tokens .spend-text").textContent,
      iteration: tr.querySelector("td.iteration").textContent,
      pr: (tr.querySelector("td:nth-child(4) a") || {}).href || null,
    })));
    out.rows = await rows();
    out.imgsInTable = await page.$$eval("#task-rows img", (x) => x.length);

    // A change while the page is open shows without a reload.
    const ch = job.change;
    await patchStatus(ch.ns, ch.name, ch.status);
    await page.waitForFunction(
      (key, text) => {
        const tr = document.querySelector('#task-rows tr[data-key="' + key + '"]');
        return tr && tr.querySelector("td.spend .spend-text").textContent === text;
      }, {timeout: 15000}, ch.ns + "/" + ch.name, ch.expectSpend);
    out.afterChange = await rows();
    out.navigations = await page.evaluate(() => performance.getEntriesByType("navigation").length);
    await page.screenshot({path: job.screenshots[0]});

    // Filter by phase.
    await page.select("#f-phase", "Failed");
    out.filtered = (await rows()).map((r) => r.key);
    await page.select("#f-phase", "");
    await page.select("#f-ns", "default");
    out.filteredNs = (await rows()).map((r) => r.key);
    await page.select("#f-ns", "");

    // The task page: spec, status, preview links, the live log.
    await page.click('#task-rows tr[data-key="' + job.logTask + '"] td.name a');
    await page.waitForFunction(() => document.querySelectorAll("#log .line").length >= 3,
                               {timeout: 15000});
    fs.appendFileSync(job.logFile, job.appendLine + "\n");
    await page.waitForFunction(
      (t) => Array.from(document.querySelectorAll("#log .line")).some((l) => l.textContent === t),
      {timeout: 15000}, job.appendLine);
    // Untick "follow": the view stays where it is while lines arrive; tick it: it follows.
    const more = [];
    for (let i = 0; i < 200; i++) more.push("2026-11-30T10:00:05Z filler " + i);
    fs.appendFileSync(job.logFile, more.join("\n") + "\n");
    const lastLine = (t) => page.waitForFunction(
      (x) => { const l = document.querySelector("#log .line:last-child");
               return l && l.textContent === x; }, {timeout: 15000}, t);
    await lastLine(more[more.length - 1]);
    out.followedBottom = await page.$eval("#log", (p) => p.scrollTop + p.clientHeight >= p.scrollHeight - 2);
    await page.click("#follow");
    await page.$eval("#log", (p) => { p.scrollTop = 0; });
    fs.appendFileSync(job.logFile, "2026-11-30T10:00:06Z paused view\n");
    await lastLine("2026-11-30T10:00:06Z paused view");
    out.pausedTop = await page.$eval("#log", (p) => p.scrollTop);
    await page.click("#follow");
    fs.appendFileSync(job.logFile, "2026-11-30T10:00:07Z following again\n");
    await lastLine("2026-11-30T10:00:07Z following again");
    out.followedAgain = await page.$eval("#log", (p) => p.scrollTop + p.clientHeight >= p.scrollHeight - 2);
    out.log = await page.$$eval("#log .line", (ls) => ls.map((l) => ({text: l.textContent,
                                                                      cls: l.className})));
    out.imgsInLog = await page.$$eval("#log img", (x) => x.length);
    out.preview = await page.$$eval("#t-preview a", (as) => as.map((a) => a.href));
    out.spec = await page.$eval("#t-spec", (p) => p.textContent);
    out.title = await page.$eval("#t-title", (p) => p.textContent);
    out.statusRows = await page.$eval("#t-status", (dl) => {
      const o = {};
      for (const dt of dl.querySelectorAll("dt")) o[dt.textContent] = dt.nextElementSibling.textContent;
      return o;
    });
    await page.screenshot({path: job.screenshots[1]});
  } finally {
    await browser.close();
  }
  return out;
}

runDriver(main);
