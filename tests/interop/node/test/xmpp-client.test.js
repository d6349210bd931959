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
