// Multi-user chat (XEP-0045) driven through @xmpp/client with raw stanzas
// (the library has no MUC plugin; `xml` and its iqCaller are all it takes):
// the service is found by service discovery (§6.1), alice creates a room
// (§10.1.1: her own presence carries 110 and 201, she is owner) which stays
// locked for bob (item-not-found) until she submits the empty configuration
// form that makes an instant room (§10.1.2); bob enters and gets alice's
// presence before his own (110, no 201; §7.2.3); a groupchat message reaches
// both from alice's occupant JID with the same XEP-0359 stanza id by the room
// (and alice's copy with her own id, §7.4); a private message (§7.5) reaches
// alice from bob's occupant JID; leaving (§7.14) gives each leaver an
// unavailable presence with 110 and the other occupant one without.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";

import {
  DOMAIN, STARTTLS, STEP_MS, TEST_TIMEOUT_MS, startClient, stopClient, uniquePassword, uniqueUser,
  waitFor, xml,
} from "../lib/harness.js";

const NS_MUC = "http://jabber.org/protocol/muc";
const NS_MUC_USER = `${NS_MUC}#user`;
const NS_MUC_OWNER = `${NS_MUC}#owner`;
const NS_DISCO_INFO = "http://jabber.org/protocol/disco#info";
const NS_DISCO_ITEMS = "http://jabber.org/protocol/disco#items";
const NS_SID = "urn:xmpp:sid:0";
const NS_STANZAS = "urn:ietf:params:xml:ns:xmpp-stanzas";

/** The status codes of a MUC presence or message (`<x xmlns=muc#user>`). */
function statusCodes(stanza) {
  const x = stanza.getChild("x", NS_MUC_USER);
  return x ? x.getChildren("status").map((s) => s.attrs.code).sort() : [];
}

function mucItem(stanza) {
  return stanza.getChild("x", NS_MUC_USER)?.getChild("item");
}

/** The server's MUC service: the item of its disco#items whose disco#info
 * has a conference identity and the MUC feature (§6.1, §6.2). */
async function findMucService(c) {
  const items = await c.xmpp.iqCaller.request(
    xml("iq", { type: "get", to: DOMAIN }, xml("query", { xmlns: NS_DISCO_ITEMS })), STEP_MS);
  for (const item of items.getChild("query", NS_DISCO_ITEMS).getChildren("item")) {
    const info = await c.xmpp.iqCaller.request(
      xml("iq", { type: "get", to: item.attrs.jid }, xml("query", { xmlns: NS_DISCO_INFO })), STEP_MS);
    const q = info.getChild("query", NS_DISCO_INFO);
    if (q.getChildren("identity").some((i) => i.attrs.category === "conference")
      && q.getChildren("feature").some((f) => f.attrs.var === NS_MUC)) {
      return item.attrs.jid;
    }
  }
  throw new Error(`no MUC service among the items of ${DOMAIN}: ${items}`);
}

/** Sends the entering presence (§7.2.2) and returns the index in
 * rec.presences from which the answers to it are recorded. */
async function enter(c, occupantJid) {
  const from = c.rec.presences.length;
  await c.xmpp.send(xml("presence", { to: occupantJid }, xml("x", { xmlns: NS_MUC })));
  return from;
}

/** The own presence (status 110) from `occupantJid` (available, or of
 * `type`) received since index `from` of rec.presences. */
function selfPresence(c, occupantJid, from, type = undefined) {
  return waitFor(c.rec, "presences",
    (p, i) => i >= from && p.attrs.from === occupantJid && p.attrs.type === type
      && statusCodes(p).includes("110"),
    `${type ?? "available"} self-presence (110) from ${occupantJid} at ${c.xmpp.jid}`);
}

test("muc_create_instant_room_enter_chat_private_message_leave_with_raw_stanzas", { timeout: TEST_TIMEOUT_MS }, async () => {
  const mk = (p) => startClient({ username: uniqueUser(p), password: uniquePassword(), transport: STARTTLS, register: true });
  const [alice, bob] = await Promise.all([mk("muc-a"), mk("muc-b")]);
  try {
    await Promise.all([alice, bob].map((c) => c.xmpp.send(xml("presence"))));
    const service = await findMucService(alice);
    const room = `interop-js-${randomUUID().slice(0, 8)}@${service}`;
    const aliceNick = `${room}/Alice`;
    const bobNick = `${room}/Bob`;

    // §10.1.1: creating the room by entering it.
    let mark = await enter(alice, aliceNick);
    const created = await selfPresence(alice, aliceNick, mark);
    assert.deepEqual(statusCodes(created).filter((c) => c === "110" || c === "201"), ["110", "201"],
      `creator's self-presence: ${created}`);
    assert.equal(mucItem(created)?.attrs.affiliation, "owner", `${created}`);
    assert.equal(mucItem(created)?.attrs.role, "moderator", `${created}`);

    // Locked until configured: others are refused with item-not-found.
    mark = await enter(bob, bobNick);
    const refused = await waitFor(bob.rec, "presences",
      (p, i) => i >= mark && p.attrs.from === bobNick && p.attrs.type === "error",
      "entering a locked room is refused");
    assert.ok(refused.getChild("error")?.getChild("item-not-found", NS_STANZAS), `${refused}`);

    // §10.1.2: an empty submit accepts the defaults (instant room).
    const configured = await alice.xmpp.iqCaller.request(
      xml("iq", { type: "set", to: room },
        xml("query", { xmlns: NS_MUC_OWNER }, xml("x", { xmlns: "jabber:x:data", type: "submit" }))),
      STEP_MS);
    assert.equal(configured.attrs.type, "result");

    // §7.2.3: bob gets the existing occupants' presence, then his own.
    const aliceMark = alice.rec.presences.length;
    mark = await enter(bob, bobNick);
    const own = await selfPresence(bob, bobNick, mark);
    const fromRoom = bob.rec.presences.slice(mark).filter((p) => p.attrs.from?.startsWith(`${room}/`));
    const aliceAt = fromRoom.findIndex((p) => p.attrs.from === aliceNick && !p.attrs.type);
    const ownAt = fromRoom.indexOf(own);
    assert.ok(aliceAt >= 0 && aliceAt < ownAt,
      `alice's presence must come before bob's own; got:\n${fromRoom.join("\n")}`);
    const aliceSeen = fromRoom[aliceAt];
    assert.ok(!statusCodes(aliceSeen).includes("110"), `${aliceSeen}`);
    assert.equal(mucItem(aliceSeen)?.attrs.affiliation, "owner", `${aliceSeen}`);
    assert.ok(!statusCodes(own).includes("201"), `only the creator gets 201: ${own}`);
    assert.equal(mucItem(own)?.attrs.role, "participant", `${own}`);
    const bobSeen = await waitFor(alice.rec, "presences",
      (p, i) => i >= aliceMark && p.attrs.from === bobNick && !p.attrs.type, "bob's presence at alice");
    assert.ok(!statusCodes(bobSeen).includes("110"), `${bobSeen}`);

    // §7.4: a message to all, reflected to the sender, with a stanza id by the room.
    const body = `hello room ${randomUUID()} <&> ünïcode`;
    const id = randomUUID();
    await alice.xmpp.send(xml("message", { to: room, type: "groupchat", id }, xml("body", {}, body)));
    const got = await Promise.all([alice, bob].map((c) => waitFor(c.rec, "messages",
      (m) => m.attrs.type === "groupchat" && m.getChildText("body") === body,
      `groupchat message at ${c.xmpp.jid}`)));
    const sids = got.map((m) => {
      assert.equal(m.attrs.from, aliceNick, `${m}`);
      const sid = m.getChildren("stanza-id", NS_SID).filter((s) => s.attrs.by === room);
      assert.equal(sid.length, 1, `one <stanza-id by='${room}'/>: ${m}`);
      assert.ok(sid[0].attrs.id, `${m}`);
      return sid[0].attrs.id;
    });
    assert.equal(sids[0], sids[1], "the same stanza id for every occupant");
    assert.equal(got[0].attrs.id, id, "the sender's copy keeps her message id");

    // §7.5: a private message to an occupant, from the sender's occupant JID.
    const pm = `just for you ${randomUUID()}`;
    await bob.xmpp.send(xml("message", { to: aliceNick, type: "chat", id: randomUUID() },
      xml("body", {}, pm), xml("x", { xmlns: NS_MUC_USER })));
    const priv = await waitFor(alice.rec, "messages", (m) => m.getChildText("body") === pm,
      "private message at alice");
    assert.equal(priv.attrs.from, bobNick, `${priv}`);
    assert.equal(priv.attrs.type, "chat", `${priv}`);
    assert.ok(!bob.rec.messages.some((m) => m.getChildText("body") === pm && m.attrs.type === "groupchat"),
      "a private message is not broadcast");

    // §7.14: leaving; the leaver's copy has 110, the others' not.
    const aliceLeaveMark = alice.rec.presences.length;
    mark = bob.rec.presences.length;
    await bob.xmpp.send(xml("presence", { to: bobNick, type: "unavailable" }));
    const left = await selfPresence(bob, bobNick, mark, "unavailable");
    assert.equal(mucItem(left)?.attrs.role, "none", `${left}`);
    const leftSeen = await waitFor(alice.rec, "presences",
      (p, i) => i >= aliceLeaveMark && p.attrs.from === bobNick && p.attrs.type === "unavailable",
      "bob's unavailable presence at alice");
    assert.ok(!statusCodes(leftSeen).includes("110"), `${leftSeen}`);
    mark = alice.rec.presences.length;
    await alice.xmpp.send(xml("presence", { to: aliceNick, type: "unavailable" }));
    await selfPresence(alice, aliceNick, mark, "unavailable");
  } finally {
    await Promise.all([alice, bob].map(stopClient));
  }
});
