// The web chat Starling serves (Converse.js over WebSocket) in Debian's
// chromium, headless, driven by playwright-core: two people log in in two
// pages, exchange messages both ways, and one of them logs in again in a
// fresh browser profile and still sees the conversation (history from the
// server's archive, XEP-0313, not from the browser's storage); a third
// person logs in over BOSH and chats with her. Screenshots
// of every page are written to ARTIFACTS when a test fails.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { chromium } from "playwright-core";

const URL = process.env.WEBCHAT_URL;
const ARTIFACTS = process.env.ARTIFACTS || "artifacts";
const STEP = 20000;

let browser;
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

after(async () => { await browser?.close(); });

async function screenshots(name) {
  for (const [i, { who, page }] of pages.entries()) {
    await page.screenshot({ path: path.join(ARTIFACTS, `${name}-${i}-${who}.png`) }).catch(() => {});
  }
}

/** Logs `user` in, in a new browser profile (over BOSH if `bosh`), and
 * waits for the roster. */
async function login(user, { bosh = false } = {}) {
  const ctx = await (await launch()).newContext();
  const page = await ctx.newPage();
  pages.push({ who: user, page });
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

/** The message box of the chat with `jid`, once it is shown. */
function chatBox(page, jid) {
  return page
    .locator(`converse-chat:has(converse-chat-heading[jid="${jid}"]) textarea.chat-textarea:visible`)
    .first();
}

async function openChat(page, jid) {
  // Converse's own route; if the chat does not show (the route can race
  // with a chat box that an incoming message created), click the contact.
  await page.evaluate((j) => { location.hash = `converse/chat?jid=${j}`; }, jid);
  try {
    await chatBox(page, jid).waitFor({ timeout: 4000 });
  } catch {
    await page.locator("converse-roster a", { hasText: jid }).first().click({ timeout: STEP });
    await chatBox(page, jid).waitFor({ timeout: STEP });
  }
  page.chatWith = jid;
}

/** Sends `text` in the chat last opened with openChat. */
async function say(page, text) {
  const box = chatBox(page, page.chatWith);
  await box.fill(text);
  await box.press("Enter");
}

async function waitForText(page, text) {
  await page.waitForFunction(
    (t) => [...document.querySelectorAll(".chat-msg__text")].some((e) => e.textContent.includes(t)),
    text,
    { timeout: STEP },
  );
}

test("browsers chat over WebSocket and BOSH; history survives a new login", { timeout: 120000 }, async (t) => {
  assert.ok(URL, "WEBCHAT_URL is not set (run tests/browser/run.sh)");
  try {
    const alice = await login("alice");
    const bob = await login("bob");
    const hello = `hello bob ${Date.now()}`;
    await openChat(alice, "bob@localhost");
    await say(alice, hello);
    await openChat(bob, "alice@localhost");
    await waitForText(bob, hello);
    const reply = `hi alice ${Date.now()}`;
    await say(bob, reply);
    await waitForText(alice, reply);

    // Alice on a new device: nothing in this profile's storage, so what
    // she sees comes from her archive on the server.
    const again = await login("alice");
    await openChat(again, "bob@localhost");
    await waitForText(again, hello);
    await waitForText(again, reply);

    // A third person over BOSH (XEP-0206), chatting with alice.
    const carol = await login("carol", { bosh: true });
    assert.deepEqual(carol.sockets, [], "no WebSocket: the BOSH page uses /http-bind");
    const ping = `hello carol ${Date.now()}`;
    await openChat(again, "carol@localhost");
    await say(again, ping);
    await openChat(carol, "alice@localhost");
    await waitForText(carol, ping);
    const pong = `hi from bosh ${Date.now()}`;
    await say(carol, pong);
    await waitForText(again, pong);
  } catch (err) {
    await screenshots(t.name.replace(/\W+/g, "_"));
    throw err;
  }
});
