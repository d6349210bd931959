// The web chat Starling serves (Converse.js over WebSocket) in Debian's
// chromium, headless, driven by playwright-core: two people log in in two
// pages, exchange messages both ways, and one of them logs in again in a
// fresh browser profile and still sees the conversation (history from the
// server's archive, XEP-0313, not from the browser's storage); a third
// person logs in over BOSH and chats with her. Screenshots
// of every page are written to ARTIFACTS when a test fails.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { URL, closeBrowser, login, openChat, say, screenshots, waitForText } from "../lib/converse.js";

after(closeBrowser);

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
