// Shared harness for the @xmpp/client interop tests (see ../../README.md).
// Lives outside test/ so that `node --test` does not run it as a test file.
//
// Environment (same contract as the Python tests):
//   XMPP_HOST (127.0.0.1)  XMPP_DOMAIN (localhost)
//   XMPP_STARTTLS_PORT (5222)  XMPP_TLS_PORT (5223, XEP-0368 direct TLS)
//   XMPP_CA_FILE (unset: certificate verification is disabled)
//   XMPP_TEST_TIMEOUT (20, seconds per test)

import fs from "node:fs";
import tls from "node:tls";
import { randomUUID } from "node:crypto";

import { client, xml } from "@xmpp/client";

export { xml };

export const HOST = process.env.XMPP_HOST || "127.0.0.1";
export const DOMAIN = process.env.XMPP_DOMAIN || "localhost";
export const STARTTLS_PORT = Number(process.env.XMPP_STARTTLS_PORT || 5222);
export const TLS_PORT = Number(process.env.XMPP_TLS_PORT || 5223);
export const CA_FILE = process.env.XMPP_CA_FILE || "";
export const TEST_TIMEOUT_MS =
  Number(process.env.XMPP_TEST_TIMEOUT || 20) * 1000;
// Budget for one protocol step (connect+register+auth, one message, ...).
export const STEP_MS = Math.max(3000, TEST_TIMEOUT_MS / 2 - 1000);

export const STARTTLS = "starttls";
export const DIRECT_TLS = "direct_tls";
export const WEBSOCKET = "websocket";
// RFC 7395 endpoint (unset: the WebSocket tests are reported as failed, not
// skipped, by the test file that needs it).
export const WS_URL = process.env.XMPP_WS_URL || "";

// The strongest SASL mechanism @xmpp/client 0.14 ships (it has SCRAM-SHA-1,
// PLAIN, ANONYMOUS and HT-SHA-256-NONE for FAST tokens; no SCRAM-SHA-256).
export const SCRAM = "SCRAM-SHA-1";

const NS_SASL = "urn:ietf:params:xml:ns:xmpp-sasl";
const NS_SASL2 = "urn:xmpp:sasl:2";
const NS_STREAM = "http://etherx.jabber.org/streams";
const NS_REGISTER = "jabber:iq:register";

// ---------------------------------------------------------------------------
// TLS: @xmpp/client 0.14 exposes no TLS options (no ca / rejectUnauthorized /
// servername); both its direct-TLS transport and its STARTTLS upgrade call
// node:tls.connect().  Wrap that (process-local, this test file only) so that
//  - the certificate is verified against XMPP_CA_FILE and XMPP_DOMAIN if the
//    CA file is given, and not verified at all otherwise (self-signed certs);
//  - SNI carries the XMPP domain (XEP-0368) even when XMPP_HOST is an IP.
// Every TLS socket is recorded so tests can assert on the negotiated version.
export const tlsSockets = [];
const ca = CA_FILE ? fs.readFileSync(CA_FILE) : undefined;
const realTlsConnect = tls.connect;
tls.connect = function connect(options, ...rest) {
  if (options && typeof options === "object") {
    options = {
      servername: DOMAIN,
      ...(ca ? { ca, rejectUnauthorized: true } : { rejectUnauthorized: false }),
      ...options,
    };
    if (ca) {
      // verify the name against the XMPP domain, not the connect address
      options.checkServerIdentity = (_host, cert) =>
        tls.checkServerIdentity(DOMAIN, cert);
    }
  }
  const sock = realTlsConnect.call(this, options, ...rest);
  tlsSockets.push(sock);
  return sock;
};

export function uniqueUser(prefix) {
  return `interop-js-${prefix}-${randomUUID().slice(0, 12)}`;
}

export function uniquePassword() {
  return `pw-${randomUUID()}`;
}

function withTimeout(promise, ms, what) {
  let timer;
  return Promise.race([
    promise,
    new Promise((_, reject) => {
      timer = setTimeout(
        () => reject(new Error(`timeout after ${ms} ms: ${what}`)),
        ms,
      );
    }),
  ]).finally(() => clearTimeout(timer));
}
export { withTimeout };

// XEP-0077 on the not-yet-authenticated stream: @xmpp/client has no IBR
// helper, so send the two iqs through its own iqCaller on its own stream.
async function registerInBand(xmpp, username, password) {
  const form = await xmpp.iqCaller.request(
    xml("iq", { type: "get" }, xml("query", { xmlns: NS_REGISTER })),
    STEP_MS,
  );
  const query = form.getChild("query", NS_REGISTER);
  if (!query || !query.getChild("username") || !query.getChild("password")) {
    throw new Error(`IBR form lacks username/password fields: ${form}`);
  }
  await xmpp.iqCaller.request(
    xml(
      "iq",
      { type: "set" },
      xml(
        "query",
        { xmlns: NS_REGISTER },
        xml("username", {}, username),
        xml("password", {}, password),
      ),
    ),
    STEP_MS,
  );
}

/**
 * Build (not start) an @xmpp/client client.
 * rec: what happened on the stream (mechanisms, registration, stanzas).
 */
export function makeClient({
  username,
  password,
  transport = STARTTLS,
  register = false,
  mechanism = SCRAM,
  expectAuthFailure = false,
}) {
  const port = transport === STARTTLS ? STARTTLS_PORT : TLS_PORT;
  const scheme = transport === STARTTLS ? "xmpp" : "xmpps";
  const service = transport === WEBSOCKET ? WS_URL : `${scheme}://${HOST}:${port}`;
  const rec = {
    username,
    transport,
    offeredMechanisms: [], // everything the server advertised (raw)
    usableMechanisms: [], // offered ∩ supported by @xmpp/client
    authSent: [], // mechanism attribute of every <auth/>/<authenticate/> sent
    registered: false,
    registerAdvertised: false,
    starttlsAdvertised: false,
    messages: [],
    presences: [],
    errors: [],
    authFailure: null, // the SASLError when expectAuthFailure is set
  };

  const xmpp = client({
    service,
    domain: DOMAIN,
    resource: `interop-${randomUUID().slice(0, 6)}`,
    timeout: STEP_MS,
    // A function instead of {username,password}: runs once the server's SASL
    // (or SASL2) mechanisms are known, i.e. after TLS, before auth.  That is
    // where XEP-0077 registration must happen; then force the mechanism.
    credentials: async (authenticate, mechanisms) => {
      rec.usableMechanisms = [...mechanisms];
      // Once: a reconnection (stream resumption) authenticates again.
      if (register && !rec.registered) {
        await registerInBand(xmpp, username, password);
        rec.registered = true;
      }
      if (!mechanisms.includes(mechanism)) {
        throw new Error(
          `server does not offer ${mechanism}; offered ${rec.offeredMechanisms}`,
        );
      }
      try {
        await authenticate({ username, password }, mechanism);
      } catch (err) {
        if (!expectAuthFailure) throw err;
        // Record the failure where it is raised and park the negotiation:
        // rethrowing lets @xmpp/client's middleware chain reject a promise
        // that nobody awaits (an unhandled rejection whose timing varies).
        rec.authFailure = err;
        return new Promise(() => {});
      }
    },
  });
  // a failing server must fail the test, not be retried forever
  xmpp.reconnect.stop();

  xmpp.on("error", (err) => rec.errors.push(err));
  xmpp.on("send", (el) => {
    if (el.is("auth", NS_SASL) || el.is("authenticate", NS_SASL2)) {
      rec.authSent.push(el.attrs.mechanism);
    }
  });
  xmpp.on("nonza", (el) => {
    if (!el.is("features", NS_STREAM)) return;
    const sasl = el.getChild("mechanisms", NS_SASL);
    const sasl2 = el.getChild("authentication", NS_SASL2);
    const list = sasl || sasl2;
    if (list) {
      rec.offeredMechanisms = list
        .getChildren("mechanism")
        .map((m) => m.text());
    }
    if (el.getChild("register", "http://jabber.org/features/iq-register")) {
      rec.registerAdvertised = true;
    }
    if (el.getChild("starttls", "urn:ietf:params:xml:ns:xmpp-tls")) {
      rec.starttlsAdvertised = true;
    }
  });
  xmpp.on("stanza", (st) => {
    if (st.is("message")) rec.messages.push(st);
    if (st.is("presence")) rec.presences.push(st);
  });
  return { xmpp, rec };
}

// Waits for the "online" event rather than for start()'s promise alone:
// @xmpp/client 0.14's Connection.start() registers its "open" listener only
// after the stream header's write callback, so when the server's header
// arrives first and no stream restart follows (SASL2, XEP-0388, over direct
// TLS) start() rejects with a TimeoutError although the client is online
// (the same symptom as xmppjs/xmpp.js#592). Any other error from start()
// still fails at once.
function online(xmpp) {
  const isOnline = new Promise((resolve) => xmpp.once("online", resolve));
  const started = xmpp.start().then(
    () => undefined,
    (err) => {
      if (err && err.name === "TimeoutError") return isOnline;
      throw err;
    },
  );
  return Promise.race([isOnline, started]);
}

export async function startClient(opts) {
  const c = makeClient(opts);
  try {
    await withTimeout(online(c.xmpp), STEP_MS, `${opts.username} online`);
  } catch (err) {
    await stopClient(c);
    throw err;
  }
  return c;
}

export async function stopClient(c) {
  if (!c) return;
  const { xmpp } = c;
  // Graceful </stream> close only on a live stream; a half-open or hung one
  // is torn down at once so that cleanup never eats the test's time budget.
  if (xmpp.status === "online" || xmpp.status === "open") {
    try {
      await withTimeout(xmpp.stop(), 2000, "stop");
    } catch {
      // fall through to a hard close
    }
  }
  try {
    xmpp.socket?.socket?.destroy?.();
  } catch {}
}

/** The TLS socket under the client's stream (STARTTLS-upgraded or direct). */
export function tlsSocketOf(xmpp) {
  const s = xmpp.socket?.socket;
  return s instanceof tls.TLSSocket ? s : null;
}

export async function waitFor(rec, list, pred, what) {
  const deadline = Date.now() + STEP_MS;
  for (;;) {
    const hit = rec[list].find(pred);
    if (hit) return hit;
    if (Date.now() > deadline) {
      throw new Error(`timeout after ${STEP_MS} ms: ${what}`);
    }
    await new Promise((r) => setTimeout(r, 20));
  }
}

export async function pingServer(xmpp) {
  const reply = await xmpp.iqCaller.request(
    xml("iq", { type: "get", to: DOMAIN }, xml("ping", { xmlns: "urn:xmpp:ping" })),
    STEP_MS,
  );
  return reply;
}
