// Group chat (XEP-0045) in the web chat Starling serves, in Debian's headless
// chromium driven by playwright-core, through Converse.js's own UI: alice
// enters a new room with the rooms list's "Add groupchat" dialog (Converse
// creates it and, seeing status 201, submits the empty configuration form
// that makes an instant room, §10.1.2); bob enters the same room the same
// way, which only works once the room is unlocked (§7.2.10 otherwise); they
// see each other among the occupants and exchange a message each way, each
// shown in the room view from the sender's occupant JID. Then bob closes his
// browser, logs in again in a fresh profile (nothing in the browser's
// storage) and enters again: he still sees the conversation, which can only
// come from the server (Converse asks a room that advertises urn:xmpp:mam:2
// for its archive, XEP-0313 on the room JID, and no history on entering),
// and can still talk in the room. Screenshots of every page are written to
// ARTIFACTS when the test fails.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { URL, STEP, closeBrowser, login, screenshots } from "../lib/converse.js";

after(closeBrowser);

/** The message box of the room `jid`: shown only once the room is entered
 * and we may speak in it. */
function messageBox(page, jid) {
  return page.locator(`converse-muc[jid="${jid}"] textarea.chat-textarea:visible`).first();
}

/** Enters (creating it if it does not exist) the room `jid` as `nick`
 * through Converse's "Add groupchat" dialog ("Enter a new Groupchat"),
 * and waits until the room is entered. */
async function enterRoom(page, jid, nick) {
  await page.click("converse-rooms-list converse-dropdown button.dropdown-toggle", { timeout: STEP });
  await page.click("converse-rooms-list a.show-add-muc-modal", { timeout: STEP });
  const dialog = page.locator("converse-add-muc-modal form.add-chatroom");
  await dialog.locator("input[name=chatroom]").fill(jid, { timeout: STEP });
  await dialog.locator("input[name=nickname]").fill(nick);
  await dialog.locator("input[type=submit]").click();
  await messageBox(page, jid).waitFor({ timeout: STEP }).catch((err) => {
    throw new Error(`${page.who}: could not enter ${jid} as ${nick}`, { cause: err });
  });
}

async function say(page, jid, text) {
  const box = messageBox(page, jid);
  await box.fill(text);
  await box.press("Enter");
}

/** Waits until the room view of `jid` shows a message from the occupant
 * `nick` (its `from`, room@service/nick, as Converse received it) whose
 * text is exactly `text`. */
async function waitForRoomMessage(page, jid, nick, text) {
  await page.waitForFunction(
    ([jid, from, text]) =>
      [...document.querySelectorAll(`converse-muc[jid="${jid}"] .chat-msg`)].some(
        (m) => m.dataset.from === from && m.querySelector(".chat-msg__text")?.textContent.trim() === text,
      ),
    [jid, `${jid}/${nick}`, text],
    { timeout: STEP },
  ).catch((err) => {
    throw new Error(`${page.who}: no message "${text}" from ${jid}/${nick} in the room view`, { cause: err });
  });
}

/** Waits until `nick` is listed among the occupants of the room `jid`. */
async function waitForOccupant(page, jid, nick) {
  await page.waitForFunction(
    ([jid, nick]) =>
      [...document.querySelectorAll(`converse-muc[jid="${jid}"] .occupant-nick`)].some(
        (e) => e.textContent.trim() === nick,
      ),
    [jid, nick],
    { timeout: STEP },
  ).catch((err) => {
    throw new Error(`${page.who}: ${nick} is not listed among the occupants of ${jid}`, { cause: err });
  });
}

test("group chat: create a room, chat both ways, history after a new login", { timeout: 120000 }, async (t) => {
  assert.ok(URL, "WEBCHAT_URL is not set (run tests/browser/run.sh)");
  const room = `lobby-${Date.now().toString(36)}@conference.localhost`;
  try {
    const alice = await login("alice");
    await enterRoom(alice, room, "Alice");

    const bob = await login("bob");
    await enterRoom(bob, room, "Bob");
    await waitForOccupant(bob, room, "Alice");
    await waitForOccupant(alice, room, "Bob");

    const hello = `hello room ${Date.now()}`;
    await say(alice, room, hello);
    await waitForRoomMessage(bob, room, "Alice", hello);
    await waitForRoomMessage(alice, room, "Alice", hello); // (Converse shows its own at once: not a reflection check)
    const reply = `hi alice ${Date.now()}`;
    await say(bob, room, reply);
    await waitForRoomMessage(alice, room, "Bob", reply);
    await waitForRoomMessage(bob, room, "Bob", reply);

    // Bob closes his browser (his session ends, and with it his presence in
    // the room) and comes back on a new device.
    await bob.context().close();
    const again = await login("bob");
    await enterRoom(again, room, "Bob");
    await waitForRoomMessage(again, room, "Alice", hello);
    await waitForRoomMessage(again, room, "Bob", reply);
    const back = `back again ${Date.now()}`;
    await say(again, room, back);
    await waitForRoomMessage(alice, room, "Bob", back);
  } catch (err) {
    await screenshots(t.name.replace(/\W+/g, "_"));
    throw err;
  }
});
