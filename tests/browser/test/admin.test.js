// The web admin page (/admin on the admin listener, docs/admin.md) in
// Debian's chromium, headless: a wrong token is refused, the right one logs
// in, a user is created through the page, that user logs in to the web chat
// (Converse.js, as webchat.test.js), the session shows on the sessions page,
// is kicked from there (the chat page gets the stream error) and is gone
// from the list; then logout. run.sh sets ADMIN_URL and ADMIN_TOKEN (a token
// made with `starling admin token create`).
import { test, after } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { ARTIFACTS, STEP, closeBrowser, launch, login, screenshots, waitForFrame } from "../lib/converse.js";

after(closeBrowser);

const ADMIN = process.env.ADMIN_URL;
const TOKEN = process.env.ADMIN_TOKEN;

/** The text of the page's one-time message (after an action or a login). */
async function flash(page, kind) {
  await page.waitForSelector(`#flash.${kind}`, { timeout: STEP });
  return page.textContent("#flash");
}

test("web admin: token login, create a user, see its session, kick it", { timeout: 120000 }, async (t) => {
  assert.ok(ADMIN && TOKEN, "ADMIN_URL / ADMIN_TOKEN are not set (run tests/browser/run.sh)");
  const ctx = await (await launch()).newContext();
  const admin = await ctx.newPage();
  try {
    // Not logged in: the login form.
    await admin.goto(`${ADMIN}/admin`);
    await admin.waitForURL(`${ADMIN}/admin/login`, { timeout: STEP });

    // A wrong token is refused, and no session cookie is set.
    await admin.fill("#login input[name=token]", "sta_not-a-valid-token");
    await admin.click("#login button");
    assert.match(await flash(admin, "err"), /invalid token/);
    assert.equal((await ctx.cookies()).filter((c) => c.name === "starling_admin").length, 0);

    // The right one: the dashboard; the cookie is HttpOnly, SameSite=Strict
    // and is not the token.
    await admin.fill("#login input[name=token]", TOKEN);
    await admin.click("#login button");
    await admin.waitForURL(`${ADMIN}/admin`, { timeout: STEP });
    await admin.waitForSelector("#sessions", { timeout: STEP });
    const [cookie] = (await ctx.cookies()).filter((c) => c.name === "starling_admin");
    assert.ok(cookie, "a session cookie");
    assert.equal(cookie.httpOnly, true);
    assert.equal(cookie.sameSite, "Strict");
    assert.notEqual(cookie.value, TOKEN);
    assert.ok(!(await admin.content()).includes(TOKEN), "the token is not in the page");

    // Create a user through the page.
    const user = `web${Date.now() % 1000000}`;
    await admin.click("header a[href='/admin/users']");
    await admin.waitForURL(`${ADMIN}/admin/users`, { timeout: STEP });
    const create = admin.locator("form[action='/admin/users/create']");
    await create.locator("input[name=jid]").fill(`${user}@localhost`);
    await create.locator("input[name=password]").fill(`pw-${user}`);
    await create.locator("button").click();
    assert.match(await flash(admin, "ok"), new RegExp(`created ${user}@localhost`));
    await admin.waitForSelector(`tr[data-jid="${user}@localhost"]`, { timeout: STEP });

    // That user logs in to the web chat (no automatic reconnection, so
    // that the kicked session stays gone).
    const chat = await login(user, { settings: { auto_reconnect: false } });
    const bound = await waitForFrame(chat, "received", (f) => f.includes("<jid>"), "bind result");
    const jid = bound.match(/<jid>([^<]+)<\/jid>/)[1];
    assert.ok(jid.startsWith(`${user}@localhost/`), jid);

    // The session is listed, with its address.
    await admin.click("header a[href='/admin/sessions']");
    const row = admin.locator(`tr[data-jid="${jid}"]`);
    await row.waitFor({ timeout: STEP });
    assert.match(await row.textContent(), /127\.0\.0\.1/);

    // Kick it: the page says so, the web chat gets the stream error, and
    // the session leaves the list.
    const since = chat.frames.length;
    await row.locator("input[name=reason]").fill("browser test");
    await row.locator("button", { hasText: "Kick" }).click();
    assert.match(await flash(admin, "ok"), new RegExp(`closed ${jid.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}`));
    const err = await waitForFrame(chat, "received", (f) => f.includes("policy-violation"), "stream error", { since });
    assert.match(err, /browser test/);
    const deadline = Date.now() + STEP;
    for (;;) {
      await admin.goto(`${ADMIN}/admin/sessions`);
      if ((await admin.locator(`tr[data-jid="${jid}"]`).count()) === 0) break;
      if (Date.now() > deadline) throw new Error(`${jid} is still listed after the kick`);
      await new Promise((r) => setTimeout(r, 250));
    }

    // Log out: back to the login form, and the pages need a login again.
    await admin.click("#logout");
    await admin.waitForURL(`${ADMIN}/admin/login`, { timeout: STEP });
    await admin.goto(`${ADMIN}/admin/users`);
    await admin.waitForURL(`${ADMIN}/admin/login`, { timeout: STEP });
  } catch (e) {
    const name = t.name.replace(/\W+/g, "_");
    await admin.screenshot({ path: path.join(ARTIFACTS, `${name}-admin.png`) }).catch(() => {});
    await screenshots(name);
    throw e;
  } finally {
    await ctx.close();
  }
});
