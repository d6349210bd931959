// Shared helpers for the browser tests: Debian's chromium (headless, through
// playwright-core, nothing downloaded) on the Converse.js web chat Starling
// serves at WEBCHAT_URL (run.sh starts the server and sets it). Lives outside
// test/ so that `node --test` does not run it as a test file. Each test file
// runs in its own process, so the browser and the page list are per file.
import path from "node:path";
import { chromium } from "playwright-core";

export const URL = process.env.WEBCHAT_URL;
export const ARTIFACTS = process.env.ARTIFACTS || "artifacts";
/** Budget for one step (a login, a message showing up). */
export const STEP = 20000;

let browser;
/** Every page opened by login(), for screenshots(). */
const pages = [];

async function launch() {
  browser ??= await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    // No sandbox as root; no background traffic to hosts this machine cannot reach.
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  return browser;
}

export async function closeBrowser() {
  await browser?.close();
}

/** Writes a screenshot of every page opened so far to ARTIFACTS. */
export async function screenshots(name) {
  for (const [i, { who, page }] of pages.entries()) {
    await page.screenshot({ path: path.join(ARTIFACTS, `${name}-${i}-${who}.png`) }).catch(() => {});
  }
}

/** Logs `user` in, in a new browser profile (over BOSH if `bosh`), and
 * waits for the roster. */
export async function login(user, { bosh = false } = {}) {
  const ctx = await (await launch()).newContext();
  const page = await ctx.newPage();
  pages.push({ who: user, page });
  page.who = user;
  const sockets = [];
  page.on("websocket", (ws) => sockets.push(ws.url()));
  page.sockets = sockets;
  await page.goto(bosh ? `${URL}?bosh` : URL);
  await page.fill("#converse-login-jid", user, { timeout: STEP });
  await page.fill("#converse-login-password", `pw-${user}`);
  await page.click("button[type=submit]");
  await page.waitForSelector("converse-roster", { timeout: STEP });
  return page;
}

/** Waits until a message whose text contains `text` is shown on `page`. */
export async function waitForText(page, text) {
  await page.waitForFunction(
    (t) => [...document.querySelectorAll(".chat-msg__text")].some((e) => e.textContent.includes(t)),
    text,
    { timeout: STEP },
  );
}
