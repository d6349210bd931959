// OMEMO end-to-end encryption (XEP-0384) between two Converse.js users in
// Debian's headless chromium, driven by playwright-core, over Starling's PEP
// (XEP-0163). Converse 14 enables its OMEMO plugin on a trusted device (the
// login form's default) unless clear_cache_on_logout is set; the test adds
// `omemo_default: true` to the page's settings so that a chat with a contact
// who has OMEMO devices starts encrypted. Converse 14 speaks both versions:
// OMEMO 0.3 (eu.siacs.conversations.axolotl, the one Conversations, Dino,
// Gajim and Monal speak) and OMEMO 2 (urn:xmpp:omemo:2, XEP-0384 0.8+), and
// between two devices that have both it encrypts with OMEMO 2. Section
// numbers are XEP-0384 0.9's (§5.x) and 0.3's (§4.x). Proven, from the
// WebSocket frames each browser sends and receives and from Converse's UI:
// - each browser announces its device in both versions (§5.3, §4.3): it
//   publishes its device list and its bundle to PEP with publish-options
//   (access model open, XEP-0060 §7.1.5; §7.1 "Server side requirements"),
//   and the server accepts all four publishes;
// - alice adds bob through Converse's "Add a contact" dialog, bob's
//   Converse (auto_subscribe) approves and asks back (RFC 6121 §3): both
//   end with a subscription of "both";
// - each has the other's device list from the server (§5.2, §4.2), naming
//   the device the other announced, and each chat has the closed lock
//   (OMEMO on);
// - alice's message leaves her browser with an OMEMO <encrypted/> payload
//   and without the plaintext (§5.5), reaches bob's browser in that form,
//   and bob's chat view shows the decrypted text, marked encrypted (§5.6);
//   bob's answer does the same the other way;
// - the server never had the plaintext: alice's archive (XEP-0313), read by
//   a raw XMPP client of her own, holds both messages, by id, each with its
//   <encrypted/> payload, and neither text appears anywhere in it.
// Screenshots of every page (and its XMPP frames) are written to ARTIFACTS
// when the test fails.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import {
  URL, STEP, closeBrowser, login, screenshots, openChat, say, attr, waitForText, waitForFrame,
  waitForIqResult, archiveOf,
} from "../lib/converse.js";

after(closeBrowser);

const AXOLOTL = "eu.siacs.conversations.axolotl";
const OMEMO2 = "urn:xmpp:omemo:2";
const re = (s) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
/** An OMEMO <encrypted/> payload of either version. */
const ENCRYPTED = new RegExp(`<encrypted\\b[^>]*\\sxmlns=["'](${re(AXOLOTL)}|${re(OMEMO2)})["']`);

/** Waits until `page` has published its OMEMO device list and bundle in
 * both versions (§4.3, §5.3) and the server accepted the four publishes;
 * returns the device id. */
async function waitForAnnouncement(page) {
  const publish = async (node, what) => {
    const iq = await waitForFrame(page, "sent",
      (f) => /^<iq\b/.test(f) && new RegExp(`<publish node=["']${node}["']`).test(f), `${what} publish`);
    assert.match(iq, /var=["']pubsub#access_model["'][^>]*>\s*<value>open<\/value>/,
      `${page.who} publishes the ${what} with access model open: ${iq}`);
    await waitForIqResult(page, iq, `publishing the ${what}`);
    return iq;
  };
  const bundle = await publish(`${re(AXOLOTL)}\\.bundles:\\d+`, "OMEMO 0.3 bundle (§4.3)");
  const id = bundle.match(/bundles:(\d+)/)[1];
  const device = new RegExp(`<device id=["']${id}["']`);
  const list = await publish(`${re(AXOLOTL)}\\.devicelist`, "OMEMO 0.3 device list (§4.3)");
  assert.match(list, device, `${page.who}'s OMEMO 0.3 device list names its device ${id}: ${list}`);
  const bundle2 = await publish(`${re(OMEMO2)}:bundles`, "OMEMO 2 bundle (§5.3.2)");
  assert.match(bundle2, new RegExp(`<item id=["']${id}["']`), `${page.who}'s OMEMO 2 bundle is item ${id}: ${bundle2}`);
  const list2 = await publish(`${re(OMEMO2)}:devices`, "OMEMO 2 device list (§5.3.1)");
  assert.match(list2, device, `${page.who}'s OMEMO 2 device list names its device ${id}: ${list2}`);
  return id;
}

/** `page` (alice) adds `jid` through Converse's "Add a contact" dialog. */
async function addContact(page, jid) {
  await page.click("converse-roster converse-dropdown.dropdown--contacts button.dropdown-toggle", { timeout: STEP });
  await page.click("converse-roster a.add-contact", { timeout: STEP });
  const form = page.locator("converse-add-contact-modal form.add-xmpp-contact");
  await form.locator("input[name=jid]").fill(jid, { timeout: STEP });
  await form.locator("button[type=submit]").click();
}

/** Waits for the roster push (RFC 6121 §2.1.6) saying `page`'s user and
 * `jid` are subscribed both ways. */
async function waitForBoth(page, jid) {
  await waitForFrame(
    page, "received",
    (f) => /^<iq\b/.test(f) && new RegExp(`<item\\b(?=[^>]*jid=["']${re(jid)}["'])(?=[^>]*subscription=["']both["'])`).test(f),
    `roster push with ${jid} subscription "both"`,
  );
}

/** Waits until the chat with `jid` on `page` has OMEMO on: the toolbar's
 * lock is closed. */
async function waitForLock(page, jid) {
  const lock = page.locator(
    `converse-chat:has(converse-chat-heading[jid="${jid}"]) converse-chat-toolbar button.toggle-omemo converse-icon.fa-lock`,
  );
  await lock.first().waitFor({ timeout: STEP }).catch(async (err) => {
    const title = await page.locator(`converse-chat:has(converse-chat-heading[jid="${jid}"]) button.toggle-omemo`)
      .first().getAttribute("title", { timeout: 1000 }).catch(() => "no OMEMO button");
    const errs = page.errors.length ? `; errors in its console: ${page.errors.slice(-5).join(" | ")}` : "";
    throw new Error(`${page.who}: OMEMO is not on in the chat with ${jid} (${title})${errs}`, { cause: err });
  });
}

/** Sends `text` from `from` and checks it travels encrypted to `to`, where
 * it is shown decrypted; returns the message's id. */
async function sendEncrypted(from, to, text) {
  const since = from.frames.length;
  await say(from, text);
  const sent = await waitForFrame(from, "sent", (f) => /^<message\b/.test(f) && /<body>/.test(f) && ENCRYPTED.test(f),
    `OMEMO-encrypted message (§5.5) to ${to.who}`, { since });
  assert.ok(!sent.includes(text), `${from.who} sent the plaintext: ${sent}`);
  const id = attr(sent, "id");
  const got = await waitForFrame(to, "received", (f) => /^<message\b/.test(f) && attr(f, "id") === id,
    `message ${id} from ${from.who}`);
  assert.match(got, ENCRYPTED, `${to.who} received message ${id} with its <encrypted/> payload: ${got}`);
  assert.ok(!got.includes(text), `${to.who} received the plaintext from the server: ${got}`);
  await waitForText(to, text).catch((err) => {
    const errs = to.errors.length ? `; errors in its console: ${to.errors.slice(-5).join(" | ")}` : "";
    throw new Error(`${to.who}: "${text}" is not shown decrypted${errs}`, { cause: err });
  });
  // Converse marks what it decrypted (data-encrypted, and a lock in the heading).
  const shown = to.locator(".chat-msg", { has: to.locator(".chat-msg__text", { hasText: text }) }).first();
  assert.equal(await shown.getAttribute("data-encrypted"), "true", `${to.who} shows "${text}" as an encrypted message`);
  return id;
}

test("OMEMO: two Converse users chat end-to-end encrypted", { timeout: 180000 }, async (t) => {
  assert.ok(URL, "WEBCHAT_URL is not set (run tests/browser/run.sh)");
  const settings = { omemo_default: true };
  try {
    const alice = await login("alice", { settings });
    // Converse 14.0.0's "Accept as contact" dialog approves the request and
    // then fails (it calls contact.authorize().subscribe(), a method
    // RosterContact no longer has: subscribeToPresence), so bob would never
    // subscribe back; its auto_subscribe setting does both.
    const bob = await login("bob", { settings: { ...settings, auto_subscribe: true } });
    const aliceDevice = await waitForAnnouncement(alice);
    const bobDevice = await waitForAnnouncement(bob);

    await addContact(alice, "bob@localhost");
    await waitForBoth(alice, "bob@localhost");
    await waitForBoth(bob, "alice@localhost");

    // Each knows the other's device: the other's device list reached them
    // from the server (an items query or a +notify event), naming the
    // device the other announced; and each chat starts encrypted.
    for (const [page, peer, device] of [[alice, "bob@localhost", bobDevice], [bob, "alice@localhost", aliceDevice]]) {
      await openChat(page, peer);
      await waitForFrame(page, "received",
        (f) => new RegExp(`from=["']${re(peer)}["']`).test(f) && new RegExp(`<device id=["']${device}["']`).test(f),
        `${peer}'s device list with the device ${device} (§5.2)`);
      await waitForLock(page, peer);
    }

    const secret = `omemo hello ${Date.now()}`;
    const first = await sendEncrypted(alice, bob, secret);
    const answer = `omemo reply ${Date.now()}`;
    const second = await sendEncrypted(bob, alice, answer);

    // What the server stored: alice's archive with bob, as a client of hers sees it.
    const archive = await archiveOf("alice@localhost", "bob@localhost");
    for (const [id, text] of [[first, secret], [second, answer]]) {
      const m = archive.find((m) => m.id === id);
      assert.ok(m, `message ${id} ("${text}") is in alice's archive (ids: ${archive.map((m) => m.id).join(", ")})`);
      assert.ok(m.encrypted.some((n) => [AXOLOTL, OMEMO2].includes(n)), `the archived message ${id} has its <encrypted/> payload: ${m.raw}`);
    }
    for (const m of archive) {
      for (const text of [secret, answer]) {
        assert.ok(!m.raw.includes(text), `the server archived the plaintext "${text}": ${m.raw}`);
      }
    }
  } catch (err) {
    await screenshots(t.name.replace(/\W+/g, "_"));
    throw err;
  }
});
