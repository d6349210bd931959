// @xmpp/client over XMPP-over-WebSocket (RFC 7395) against the server at
// XMPP_WS_URL: registration, login, chat with a TCP client both ways, and
// XEP-0198 stream management — the WebSocket is dropped without <close/>,
// the client reconnects and resumes, and no message is lost or duplicated.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";

import {
  STARTTLS,
  TEST_TIMEOUT_MS,
  WEBSOCKET,
  WS_URL,
  startClient,
  stopClient,
  uniquePassword,
  uniqueUser,
  waitFor,
  withTimeout,
  xml,
} from "../lib/harness.js";

const opts = { timeout: TEST_TIMEOUT_MS };

function requireWs() {
  assert.ok(WS_URL, "XMPP_WS_URL is not set (tests/interop/run-starling.sh sets it)");
  assert.equal(typeof WebSocket, "function", "this Node.js has no WebSocket (run with --experimental-websocket)");
}

async function send(from, to, body) {
  await from.xmpp.send(
    xml("message", { to, type: "chat", id: randomUUID() }, xml("body", {}, body)),
  );
}

test("websocket: register, log in and chat with a TCP client both ways", opts, async () => {
  requireWs();
  let web, tcp;
  try {
    web = await startClient({ username: uniqueUser("ws"), password: uniquePassword(), transport: WEBSOCKET, register: true });
    tcp = await startClient({ username: uniqueUser("tcp"), password: uniquePassword(), transport: STARTTLS, register: true });
    assert.equal(web.xmpp.status, "online");
    assert.ok(!web.rec.starttlsAdvertised, "no STARTTLS inside a WebSocket (RFC 7395 §3.2)");
    await send(web, tcp.xmpp.jid.toString(), "web→tcp");
    const m1 = await waitFor(tcp.rec, "messages", (m) => m.getChildText("body") === "web→tcp", "message at tcp");
    assert.equal(m1.attrs.from, web.xmpp.jid.toString());
    await send(tcp, web.xmpp.jid.toString(), "tcp→web");
    const m2 = await waitFor(web.rec, "messages", (m) => m.getChildText("body") === "tcp→web", "message at web");
    assert.equal(m2.attrs.from, tcp.xmpp.jid.toString());
  } finally {
    await stopClient(web);
    await stopClient(tcp);
  }
});

test("websocket: stream management resumes after the socket drops, nothing lost or doubled", opts, async () => {
  requireWs();
  let web, tcp;
  try {
    web = await startClient({ username: uniqueUser("wsm"), password: uniquePassword(), transport: WEBSOCKET, register: true });
    tcp = await startClient({ username: uniqueUser("tsm"), password: uniquePassword(), transport: STARTTLS, register: true });
    const sm = web.xmpp.streamManagement;
    await waitFor({ sm: [sm] }, "sm", (s) => s.enabled && s.id, "stream management enabled with an id");
    const full = web.xmpp.jid.toString();
    await send(tcp, full, "before");
    await waitFor(web.rec, "messages", (m) => m.getChildText("body") === "before", "first message");

    const resumed = new Promise((resolve) => sm.once("resumed", resolve));
    web.xmpp.reconnect.delay = 200;
    web.xmpp.reconnect.start();
    // Drop the WebSocket without <close/> (a lost connection), then send
    // while the session is detached.
    web.xmpp.socket.socket.close();
    await new Promise((r) => setTimeout(r, 100));
    await send(tcp, full, "while-away");
    await withTimeout(resumed, TEST_TIMEOUT_MS / 2, "stream resumed");
    assert.equal(web.xmpp.jid.toString(), full, "same full JID after resumption");
    await waitFor(web.rec, "messages", (m) => m.getChildText("body") === "while-away", "message sent while away");
    await send(tcp, full, "after");
    await waitFor(web.rec, "messages", (m) => m.getChildText("body") === "after", "message after resumption");
    const bodies = web.rec.messages.map((m) => m.getChildText("body")).filter(Boolean);
    assert.deepEqual(bodies, ["before", "while-away", "after"], "each message exactly once, in order");
    web.xmpp.reconnect.stop();
  } finally {
    await stopClient(web);
    await stopClient(tcp);
  }
});
