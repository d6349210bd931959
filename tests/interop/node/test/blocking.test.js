// Blocking (XEP-0191) driven through @xmpp/client (no blocking plugin in the
// library: the iqs are sent with its own iqCaller).
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import {
  xml, STARTTLS, TEST_TIMEOUT_MS, startClient, stopClient, uniqueUser, uniquePassword, waitFor,
} from "../lib/harness.js";

const NS = "urn:xmpp:blocking";

const itemList = (jids) => jids.map((jid) => xml("item", { jid }));

async function blocklist(c) {
  const res = await c.xmpp.iqCaller.request(xml("iq", { type: "get" }, xml("blocklist", { xmlns: NS })));
  return res.getChild("blocklist", NS).getChildren("item").map((i) => i.attrs.jid);
}

test("block_unblock_contact_with_raw_xep0191_iqs", { timeout: TEST_TIMEOUT_MS }, async () => {
  const mk = (p) => startClient({ username: uniqueUser(p), password: uniquePassword(), transport: STARTTLS, register: true });
  const [alice, bob] = await Promise.all([mk("js-blk-a"), mk("js-blk-b")]);
  try {
    await Promise.all([alice, bob].map((c) => c.xmpp.send(xml("presence"))));
    const bobBare = bob.xmpp.jid.bare().toString();
    await alice.xmpp.iqCaller.request(xml("iq", { type: "set" }, xml("block", { xmlns: NS }, itemList([bobBare]))));
    assert.deepEqual(await blocklist(alice), [bobBare]);

    // bob -> alice bounces with service-unavailable (XEP-0191 §3.5)
    const id = randomUUID();
    await bob.xmpp.send(xml("message", { to: alice.xmpp.jid.toString(), type: "chat", id }, xml("body", {}, "hi")));
    const err = await waitFor(bob.rec, "messages", (m) => m.attrs.id === id && m.attrs.type === "error", "bounce");
    assert.ok(err.getChild("error").getChild("service-unavailable", "urn:ietf:params:xml:ns:xmpp-stanzas"), err.toString());

    await alice.xmpp.iqCaller.request(xml("iq", { type: "set" }, xml("unblock", { xmlns: NS }, itemList([bobBare]))));
    assert.deepEqual(await blocklist(alice), []);
    const body = `again ${randomUUID()}`;
    await bob.xmpp.send(xml("message", { to: alice.xmpp.jid.toString(), type: "chat" }, xml("body", {}, body)));
    await waitFor(alice.rec, "messages", (m) => m.getChildText("body") === body, "message after unblock");
  } finally {
    await Promise.all([alice, bob].map(stopClient));
  }
});
