// A scriptable @xmpp/client peer used by the Python cross-library test
// (python/test_slixmpp.py::test_cross_library_chat_with_xmpp_client_succeeds).
//
// Env: the usual XMPP_* variables plus PEER_USER and PEER_PASSWORD.
// It registers PEER_USER via XEP-0077, logs in with SCRAM-SHA-1 over
// STARTTLS, sends initial presence, then speaks JSON lines:
//   stdout: {"event":"online","jid":"..."}            once online
//           {"event":"message","from":"...","body":"...","type":"..."}
//           {"event":"error","error":"..."}            then exits 1
//   stdin:  {"cmd":"send","to":"...","body":"..."}   send a chat message
//           {"cmd":"stop"}                           close and exit 0
import readline from "node:readline";

import { startClient, stopClient, waitFor, xml, SCRAM } from "./harness.js";

const out = (obj) => process.stdout.write(`${JSON.stringify(obj)}\n`);
const fail = (err) => {
  out({ event: "error", error: String(err?.stack || err) });
  process.exit(1);
};
// the parent test has its own timeout; never outlive it by much
setTimeout(() => fail("peer timeout"), 60_000).unref();

let c;
try {
  c = await startClient({
    username: process.env.PEER_USER,
    password: process.env.PEER_PASSWORD,
    register: true,
  });
  if (JSON.stringify(c.rec.authSent) !== JSON.stringify([SCRAM])) {
    throw new Error(`unexpected SASL: ${c.rec.authSent}`);
  }
  c.xmpp.on("stanza", (st) => {
    if (st.is("message") && st.getChild("body")) {
      out({
        event: "message",
        from: st.attrs.from,
        type: st.attrs.type,
        body: st.getChildText("body"),
      });
    }
  });
  await c.xmpp.send(xml("presence"));
  const own = c.xmpp.jid.toString();
  await waitFor(c.rec, "presences", (p) => p.attrs.from === own && !p.attrs.type, "presence echo");
  out({ event: "online", jid: own });
} catch (err) {
  fail(err);
}

const rl = readline.createInterface({ input: process.stdin });
rl.on("line", async (line) => {
  try {
    const cmd = JSON.parse(line);
    if (cmd.cmd === "send") {
      await c.xmpp.send(
        xml("message", { to: cmd.to, type: "chat" }, xml("body", {}, cmd.body)),
      );
      out({ event: "sent" });
    } else if (cmd.cmd === "stop") {
      await stopClient(c);
      process.exit(0);
    }
  } catch (err) {
    fail(err);
  }
});
rl.on("close", async () => {
  await stopClient(c);
  process.exit(0);
});
