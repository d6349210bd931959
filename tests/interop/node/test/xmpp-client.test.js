// Interop tests driving the real @xmpp/client (xmpp.js) library against an
// XMPP server given by environment variables (see ../../README.md).
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";

import {
  DIRECT_TLS,
  DOMAIN,
  SCRAM,
  STARTTLS,
  TEST_TIMEOUT_MS,
  makeClient,
  pingServer,
  startClient,
  stopClient,
  tlsSocketOf,
  uniquePassword,
  uniqueUser,
  waitFor,
  withTimeout,
  xml,
} from "../lib/harness.js";

const opts = { timeout: TEST_TIMEOUT_MS };

function assertSecureSession({ xmpp, rec }, mechanism) {
  assert.equal(xmpp.status, "online");
  assert.deepEqual(rec.authSent, [mechanism], "exactly one auth with the forced mechanism");
  assert.ok(
    rec.offeredMechanisms.includes(mechanism),
    `server offered ${rec.offeredMechanisms}`,
  );
  assert.ok(xmpp.isSecure(), "stream is not TLS-protected");
  const sock = tlsSocketOf(xmpp);
  assert.ok(sock, "no TLS socket under the stream");
  assert.ok(sock.encrypted);
  assert.match(sock.getProtocol(), /^TLSv1\.[23]$/);
  if (rec.transport === STARTTLS) {
    assert.ok(rec.starttlsAdvertised, "STARTTLS not advertised on the STARTTLS port");
  } else {
    assert.ok(!rec.starttlsAdvertised, "STARTTLS advertised inside a direct-TLS stream");
  }
  assert.equal(xmpp.jid.bare().toString(), `${rec.username}@${DOMAIN}`);
  assert.ok(xmpp.jid.resource, "no resource bound");
}

async function sendInitialPresence(c) {
  await c.xmpp.send(xml("presence"));
  // RFC 6121 §4.2.2: the server MUST deliver the initial presence to all of
  // the user's available resources, including the sending one.
  const own = c.xmpp.jid.toString();
  await waitFor(c.rec, "presences", (p) => p.attrs.from === own && !p.attrs.type,
    `${own} initial presence echo`);
}

async function exchange(from, to, toAddress, body) {
  await from.xmpp.send(
    xml("message", { to: toAddress, type: "chat", id: randomUUID() }, xml("body", {}, body)),
  );
  const msg = await waitFor(to.rec, "messages", (m) => m.getChildText("body") === body,
    `message "${body}" at ${to.xmpp.jid}`);
  assert.equal(msg.attrs.from, from.xmpp.jid.toString(), "server must stamp the sender's full JID");
  assert.equal(msg.attrs.type, "chat");
}

async function assertPing(xmpp) {
  const reply = await pingServer(xmpp);
  assert.equal(reply.attrs.type, "result");
  assert.equal(reply.attrs.from, DOMAIN);
}

async function registerLoginChatPing(transport) {
  const clients = [];
  try {
    const [alice, bob] = await Promise.all(
      ["alice", "bob"].map((who) =>
        startClient({
          username: uniqueUser(who),
          password: uniquePassword(),
          transport,
          register: true,
        }),
      ),
    );
    clients.push(alice, bob);
    for (const c of clients) {
      assert.ok(c.rec.registered, "IBR did not complete");
      assertSecureSession(c, SCRAM);
    }
    await Promise.all(clients.map(sendInitialPresence));

    // alice -> bob's BARE JID, bob -> alice's FULL JID
    await exchange(alice, bob, bob.xmpp.jid.bare().toString(), `hi bob ${randomUUID()}`);
    await exchange(bob, alice, alice.xmpp.jid.toString(), `hi alice ${randomUUID()} <&> ünïcode`);

    await Promise.all(clients.map((c) => assertPing(c.xmpp)));
  } finally {
    await Promise.all(clients.map(stopClient));
  }
}

test("starttls_ibr_scram_sha_1_chat_ping_succeeds", opts, () =>
  registerLoginChatPing(STARTTLS));

test("direct_tls_ibr_scram_sha_1_chat_ping_succeeds", opts, () =>
  registerLoginChatPing(DIRECT_TLS));

for (const transport of [STARTTLS, DIRECT_TLS]) {
  test(`wrong_password_auth_fails[${transport}]`, opts, async () => {
    const username = uniqueUser("wrongpw");
    const password = uniquePassword();
    // the account exists and the right password works ...
    const good = await startClient({ username, password, transport, register: true });
    assertSecureSession(good, SCRAM);
    await stopClient(good);

    // ... the wrong one is refused with a SASL <failure/>, not a hang
    const bad = makeClient({
      username,
      password: `${password}-wrong`,
      transport,
      expectAuthFailure: true,
    });
    try {
      bad.xmpp.start().catch(() => {}); // never goes online; asserted below
      const deadline = Date.now() + TEST_TIMEOUT_MS / 2;
      while (!bad.rec.authFailure && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 20));
      }
      const err = bad.rec.authFailure;
      assert.ok(err, "no SASL failure within the time limit");
      assert.equal(err.name, "SASLError", `got ${err}`);
      assert.equal(err.condition, "not-authorized");
      assert.deepEqual(bad.rec.authSent, [SCRAM]);
      assert.notEqual(bad.xmpp.status, "online");
      assert.equal(bad.xmpp.jid, null, "no JID may be bound after failed auth");
    } finally {
      await stopClient(bad);
    }
  });
}

test("register_existing_username_conflict", opts, async () => {
  const username = uniqueUser("dup");
  const first = await startClient({ username, password: uniquePassword(), register: true });
  await stopClient(first);

  const second = makeClient({ username, password: uniquePassword(), register: true });
  try {
    await assert.rejects(
      withTimeout(second.xmpp.start(), TEST_TIMEOUT_MS / 2, "IBR conflict"),
      (err) => {
        assert.equal(err.name, "StanzaError", `got ${err}`);
        assert.equal(err.condition, "conflict");
        return true;
      },
    );
    assert.equal(second.rec.registered, false);
    assert.deepEqual(second.rec.authSent, [], "must not authenticate after failed IBR");
  } finally {
    await stopClient(second);
  }
});

// --- IM core (RFC 6121) -----------------------------------------------------

const ROSTER = "jabber:iq:roster";

function recordIqs(c) {
  c.rec.iqs = [];
  c.xmpp.on("stanza", (st) => {
    if (st.is("iq")) c.rec.iqs.push(st);
  });
}

function pushItem(iq, jid) {
  if (iq.attrs.type !== "set" || iq.attrs.from) return null;
  const item = iq.getChild("query", ROSTER)?.getChild("item");
  return item && item.attrs.jid === jid ? item : null;
}

async function expectPush(c, jid, pred, what) {
  return waitFor(c.rec, "iqs", (iq) => {
    const item = pushItem(iq, jid);
    return item !== null && pred(item.attrs);
  }, `${what} at ${c.xmpp.jid}`);
}

async function expectPresence(c, pred, what) {
  return waitFor(c.rec, "presences", pred, `${what} at ${c.xmpp.jid}`);
}

test("subscription_handshake_presence_and_chat_succeeds", opts, async () => {
  const clients = [];
  try {
    const [alice, bob] = await Promise.all(
      ["alice", "bob"].map((who) =>
        startClient({
          username: uniqueUser(who),
          password: uniquePassword(),
          transport: STARTTLS,
          register: true,
        }),
      ),
    );
    clients.push(alice, bob);
    for (const c of clients) {
      recordIqs(c);
      // RFC 6121 §2.2: request the roster (interested resource), then presence.
      const q = await c.xmpp.iqCaller.get(xml("query", { xmlns: ROSTER }));
      assert.equal(q.getChildren("item").length, 0);
    }
    await Promise.all(clients.map(sendInitialPresence));
    const a = alice.xmpp.jid.bare().toString();
    const b = bob.xmpp.jid.bare().toString();

    // §3.1: alice → bob.
    await alice.xmpp.send(xml("presence", { to: b, type: "subscribe" }));
    await expectPush(alice, b, (i) => i.ask === "subscribe" && i.subscription === "none", "ask push");
    await expectPresence(bob, (p) => p.attrs.type === "subscribe" && p.attrs.from === a, "request");
    await bob.xmpp.send(xml("presence", { to: a, type: "subscribed" }));
    await expectPresence(alice, (p) => p.attrs.type === "subscribed" && p.attrs.from === b, "approval");
    await expectPush(alice, b, (i) => i.subscription === "to", "'to' push");
    await expectPush(bob, a, (i) => i.subscription === "from", "'from' push");
    // §3.1.5: bob's current presence reaches alice.
    await expectPresence(alice, (p) => p.attrs.from === bob.xmpp.jid.toString() && !p.attrs.type,
      "bob's presence");

    // bob → alice.
    await bob.xmpp.send(xml("presence", { to: a, type: "subscribe" }));
    await expectPresence(alice, (p) => p.attrs.type === "subscribe" && p.attrs.from === b, "request");
    await alice.xmpp.send(xml("presence", { to: b, type: "subscribed" }));
    await expectPush(alice, b, (i) => i.subscription === "both", "'both' push");
    await expectPush(bob, a, (i) => i.subscription === "both", "'both' push");

    // §4.4: presence changes.
    await alice.xmpp.send(xml("presence", {}, xml("show", {}, "away"), xml("status", {}, "brb")));
    const p = await expectPresence(bob, (p) => p.attrs.from === alice.xmpp.jid.toString()
      && p.getChildText("show") === "away", "alice away");
    assert.equal(p.getChildText("status"), "brb");
    await bob.xmpp.send(xml("presence", {}, xml("show", {}, "xa")));
    await expectPresence(alice, (p) => p.attrs.from === bob.xmpp.jid.toString()
      && p.getChildText("show") === "xa", "bob xa");

    await exchange(alice, bob, b, `hi bob ${randomUUID()}`);
    await exchange(bob, alice, alice.xmpp.jid.toString(), `hi alice ${randomUUID()}`);

    // The roster lists the contact with a mutual subscription.
    const q = await alice.xmpp.iqCaller.get(xml("query", { xmlns: ROSTER }));
    const item = q.getChildren("item").find((i) => i.attrs.jid === b);
    assert.equal(item?.attrs.subscription, "both");

    // §4.5.2: logout → unavailable at the contact.
    const bobFull = bob.xmpp.jid.toString();
    await stopClient(bob);
    clients.pop();
    await expectPresence(alice, (p) => p.attrs.from === bobFull && p.attrs.type === "unavailable",
      "bob unavailable");
  } finally {
    await Promise.all(clients.map(stopClient));
  }
});
