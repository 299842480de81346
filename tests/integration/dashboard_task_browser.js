// SPDX-License-Identifier: Apache-2.0
// Drives Debian's chromium (headless) through puppeteer-core for test_dashboard.py's
// task page test and for scripts/dashboard_screenshot.py: the spend chart, the timeline,
// the egress summary and links of a task, the projects view, the "not found" page and the
// 390 px layout. Reads a JSON job on argv[2], prints one JSON result line on stdout.
"use strict";
const { launchBrowser, watchPage, runDriver } = require("./browser_common.js");

const job = JSON.parse(process.argv[2]);

async function main() {
  const out = {consoleErrors: [], pageErrors: [], dialogs: [], shots: []};
  const browser = await launchBrowser(job.profile);
  try {
    const page = await browser.newPage();
    // A 404 answer is the "not found" page's own fetch, not an error of the page.
    watchPage(page, out, /status of 404/);
    const shot = async (name) => {
      const path = job.outDir + "/" + name;
      await page.screenshot({path});
      out.shots.push(path);
    };
    const wide = async () => page.setViewport({width: 1400, height: 900});
    const narrow = async () => page.setViewport({width: 390, height: 844, isMobile: true,
                                                 hasTouch: true, deviceScaleFactor: 1});
    // The task page once the log, the chart and the timeline are in (a viewport change
    // to a mobile one reloads the page).
    const taskShown = () => page.waitForFunction((w) => {
      const c = document.querySelector("#spend-chart path.cost");
      const rows = document.querySelectorAll("#timeline-rows tr.tl-iter").length;
      return c && Number(c.dataset.points) >= 2 && rows >= w.iterations &&
        (!w.forecast || document.querySelector("#spend-chart path.forecast")) &&
        document.querySelectorAll("#spend-chart line.mark").length >= w.marks &&
        document.querySelectorAll("#log .line").length >= w.logLines;
    }, {timeout: 20000}, job.expect);
    const scrollWidth = () => page.evaluate(() => document.documentElement.scrollWidth);
    await wide();
    await page.goto(job.url + "/ui/login?token=" + job.token, {waitUntil: "domcontentloaded"});
    await page.waitForFunction(() => document.querySelectorAll("#task-rows tr").length > 0,
                               {timeout: 15000});
    if (!job.screenshotOnly) await page.waitForFunction(
      (n) => document.querySelectorAll("#task-rows tr").length === n, {timeout: 15000},
      job.taskCount);
    await shot(job.screenshotOnly ? "dashboard.png" : "dashboard-list-1400x900.png");
    out.listScrollWidthWide = await scrollWidth();

    // The task page.
    await page.goto(job.url + "/#/task/" + job.task, {waitUntil: "domcontentloaded"});
    await taskShown();
    out.chart = await page.evaluate(() => {
      const s = document.querySelector("#spend-chart");
      const f = s.querySelector("path.forecast");
      const b = s.querySelector("line.budget");
      return {
        points: Number(s.querySelector("path.cost").dataset.points),
        d: s.querySelector("path.cost").getAttribute("d"),
        forecastDash: f ? f.getAttribute("stroke-dasharray") : null,
        budget: b ? {y1: b.getAttribute("y1"), y2: b.getAttribute("y2")} : null,
        budgetLabel: (s.querySelector("text.budget-label") || {}).textContent || null,
        marks: Array.from(s.querySelectorAll("line.mark")).map((l) => l.getAttribute("class")),
        legend: document.querySelector("#chart-legend").textContent,
      };
    });
    out.timeline = await page.$$eval("#timeline-rows tr", (trs) => trs.map((tr) => ({
      cls: tr.className, verify: tr.dataset.verify || null,
      cells: Array.from(tr.querySelectorAll("td")).map((td) => td.textContent),
    })));
    out.egress = await page.$eval("#egress-summary", (p) => p.textContent);
    out.egressHosts = await page.$$eval("#egress-rows tr", (trs) => trs.map((tr) =>
      Array.from(tr.querySelectorAll("td")).map((td) => td.textContent)));
    out.links = await page.$$eval("#t-links a", (as) => as.map((a) => ({
      text: a.textContent, href: a.href, cls: a.className})));
    out.logBox = await page.$eval("#log", (p) => {
      const r = p.getBoundingClientRect();
      return {top: r.top, bottom: r.bottom};
    });
    out.statusRows = await page.$eval("#t-status", (dl) => {
      const o = {};
      for (const dt of dl.querySelectorAll("dt")) o[dt.textContent] = dt.nextElementSibling.textContent;
      return o;
    });
    out.imgs = await page.$$eval("main img", (x) => x.length);
    out.taskScrollWidthWide = await scrollWidth();
    await shot("dashboard-task-1400x900.png");
    await narrow();
    await taskShown();
    out.taskScrollWidthNarrow = await scrollWidth();
    out.tooWide = await page.evaluate(() => Array.from(document.querySelectorAll("body *"))
      .filter((e) => e.getBoundingClientRect().right > 391 && !e.closest(".scroll"))
      .slice(0, 5).map((e) => e.tagName + "#" + e.id + "." + e.className));
    await shot("dashboard-task-390x844.png");

    // The projects view.
    await wide();
    await page.goto(job.url + "/#/projects", {waitUntil: "domcontentloaded"});
    // Both of the row's sources: the quotas (fetched) and the task (from the event stream,
    // which can come after the fetch on a loaded box).
    await page.waitForFunction((ns) => {
      const tr = document.querySelector('#project-rows tr[data-ns="' + ns + '"]');
      return tr && !/no quota/.test(tr.querySelector("td.quota-usd").textContent) &&
        tr.querySelector("td.tasks").textContent !== "0";
    }, {timeout: 15000}, job.quotaNs).catch(async (e) => {
      throw new Error(e + ": " + await page.$eval("#projects-view", (v) => v.textContent));
    });
    out.projects = await page.$$eval("#project-rows tr", (trs) => trs.map((tr) => ({
      ns: tr.dataset.ns,
      running: tr.querySelector("td.running").textContent,
      queued: tr.querySelector("td.queued").textContent,
      tasks: tr.querySelector("td.tasks").textContent,
      usd: tr.querySelector("td.quota-usd").textContent,
      tokens: tr.querySelector("td.quota-tokens").textContent,
      maxRunning: tr.querySelector("td.max-running").textContent,
    })));
    await shot("dashboard-projects-1400x900.png");
    await narrow();
    await page.waitForFunction((ns) => {
      const tr = document.querySelector('#project-rows tr[data-ns="' + ns + '"]');
      return tr && !/no quota/.test(tr.querySelector("td.quota-usd").textContent);
    }, {timeout: 15000}, job.quotaNs);
    out.projectsScrollWidthNarrow = await scrollWidth();
    await shot("dashboard-projects-390x844.png");
    await page.goto(job.url + "/#/", {waitUntil: "domcontentloaded"});
    await page.waitForFunction(() => document.querySelectorAll("#task-rows tr").length > 0,
                               {timeout: 15000});
    out.listScrollWidthNarrow = await scrollWidth();
    await shot("dashboard-390x844.png");

    if (!job.screenshotOnly) {
      // An unknown task: "not found".
      await wide();
      await page.goto(job.url + "/#/task/default/no-such-task", {waitUntil: "domcontentloaded"});
      await page.waitForFunction(() => !document.querySelector("#t-notfound").hidden,
                                 {timeout: 15000});
      out.notFound = await page.$eval("#t-notfound", (p) => p.textContent);
      out.notFoundBodyHidden = await page.$eval("#t-body", (b) => b.hidden);
      await shot("dashboard-notfound.png");
    }
  } finally {
    await browser.close();
  }
  return out;
}

runDriver(main);
