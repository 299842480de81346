// SPDX-License-Identifier: Apache-2.0
// What the dashboard's browser drivers (dashboard_browser.js, dashboard_task_browser.js)
// share: puppeteer-core driving Debian's chromium headless, the page's errors and dialogs
// collected into the result, and the one-JSON-line result on stdout.
"use strict";
const { pathToFileURL } = require("url");

// puppeteer-core is an ES module: found through NODE_PATH with require.resolve, loaded
// with import() (require() of an ES module needs Node 20.19+; this works on 18 too).
async function loadPuppeteer() {
  const mod = await import(pathToFileURL(require.resolve("puppeteer-core")).href);
  return mod.default || mod;
}

// Chromium headless with the profile dir PROFILE and EXTRA arguments.
async function launchBrowser(profile, extra = []) {
  const puppeteer = await loadPuppeteer();
  return puppeteer.launch({
    executablePath: "/usr/bin/chromium",
    headless: true,
    userDataDir: profile,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", ...extra],
  });
}

// Collects PAGE's console errors (those IGNORE does not match), page errors and dialogs
// (dismissed) into OUT.consoleErrors, OUT.pageErrors and OUT.dialogs.
function watchPage(page, out, ignore = null) {
  page.on("console", (m) => {
    if (m.type() === "error" && !(ignore && ignore.test(m.text()))) out.consoleErrors.push(m.text());
  });
  page.on("pageerror", (e) => out.pageErrors.push(String(e)));
  page.on("dialog", async (d) => {
    out.dialogs.push(d.message());
    await d.dismiss();
  });
}

// Runs MAIN (which returns the result object): prints it as one JSON line, or the error on
// stderr with exit status 1.
function runDriver(main) {
  main().then((out) => {
    process.stdout.write(JSON.stringify(out) + "\n");
  }).catch((e) => {
    process.stderr.write(String(e && e.stack || e) + "\n");
    process.exit(1);
  });
}

module.exports = { launchBrowser, watchPage, runDriver };
