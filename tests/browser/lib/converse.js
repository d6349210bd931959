// Shared helpers for the browser tests: Debian's chromium (headless, through
// playwright-core, nothing downloaded) on the Converse.js web chat Starling
// serves at WEBCHAT_URL (run.sh starts the server and sets it). Lives outside
// test/ so that `node --test` does not run it as a test file. Each test file
// runs in its own process, so the browser and the page list are per file.
import path from "node:path";
import { writeFile } from "node:fs/promises";
import { chromium } from "playwright-core";

export const URL = process.env.WEBCHAT_URL;
export const ARTIFACTS = process.env.ARTIFACTS || "artifacts";
/** Budget for one step (a login, a message showing up). */
export const STEP = 20000;

let browser;
/** Every page opened by login(), for screenshots(). */
const pages = [];

/** The shared headless chromium (launched on first use). */
export async function launch() {
  browser ??= await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    // No sandbox as root; no background traffic to hosts this machine cannot reach.
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  return browser;
}

export async function closeBrowser() {
  await browser?.close();
}

/** Writes a screenshot of every page opened so far to ARTIFACTS, and
 * beside it the XMPP frames the page sent and received (`.xmpp.txt`). */
export async function screenshots(name) {
  for (const [i, { who, page }] of pages.entries()) {
    await page.screenshot({ path: path.join(ARTIFACTS, `${name}-${i}-${who}.png`) }).catch(() => {});
    if (page.frames?.length) {
      const log = page.frames.map((f) => `${f.dir === "sent" ? ">>" : "<<"} ${f.data}\n`).join("");
      await writeFile(path.join(ARTIFACTS, `${name}-${i}-${who}.xmpp.txt`), log).catch(() => {});
    }
  }
}

/** Logs `user` in, in a new browser profile (over BOSH if `bosh`), and
 * waits for the roster. `settings` are Converse settings added to (or
 * replacing) those of the page Starling serves, e.g. `{ omemo_default: true }`:
 * they are merged into the page's own `converse.initialize(…)` call.
 * The page records the URLs of its WebSockets (`page.sockets`) and every
 * XMPP frame it sends and receives over them (`page.frames`, entries
 * `{ dir: "sent" | "received", data }`, in order). */
export async function login(user, { bosh = false, settings = null } = {}) {
  const ctx = await (await launch()).newContext();
  if (settings) {
    // Converse announces itself with the `converse-loaded` event (its
    // documented hook for plugins) before the page's script calls
    // converse.initialize: wrap that call.
    await ctx.addInitScript((extra) => {
      addEventListener("converse-loaded", (ev) => {
        const converse = ev.detail.converse;
        const initialize = converse.initialize;
        converse.initialize = (s, ...rest) => initialize.call(converse, { ...s, ...extra }, ...rest);
      }, { once: true });
    }, settings);
  }
  const page = await ctx.newPage();
  pages.push({ who: user, page });
  page.who = user;
  const sockets = [];
  const frames = [];
  page.on("websocket", (ws) => {
    sockets.push(ws.url());
    ws.on("framesent", (f) => frames.push({ dir: "sent", data: String(f.payload) }));
    ws.on("framereceived", (f) => frames.push({ dir: "received", data: String(f.payload) }));
  });
  // BOSH carries the same frames in HTTP bodies: a request's body when it
  // is sent (a long poll's answer may come much later), its response's
  // body when that arrives.
  page.on("request", (req) => {
    if (req.url().includes("/http-bind") && req.postData()) frames.push({ dir: "sent", data: req.postData() });
  });
  page.on("requestfinished", async (req) => {
    if (!req.url().includes("/http-bind")) return;
    const res = await req.response().catch(() => null);
    const text = res ? await res.text().catch(() => "") : "";
    if (text) frames.push({ dir: "received", data: text });
  });
  page.sockets = sockets;
  page.frames = frames;
  // What the page logs as errors (Converse logs failures there), for
  // error messages; not the resources that cannot load here anyway (the
  // login page's logos on conversejs.org, a favicon).
  const errors = [];
  page.on("console", (m) => {
    if (m.type() !== "error") return;
    const where = m.location()?.url;
    if (m.text().startsWith("Failed to load resource") && where &&
      (!where.startsWith(URL) || new globalThis.URL(where).pathname === "/favicon.ico")) return;
    errors.push(where && !m.text().includes(where) ? `${m.text()} (${where})` : m.text());
  });
  page.on("pageerror", (e) => errors.push(String(e)));
  page.errors = errors;
  await page.goto(bosh ? `${URL}?bosh` : URL);
  await page.fill("#converse-login-jid", user, { timeout: STEP });
  await page.fill("#converse-login-password", `pw-${user}`);
  await page.click("button[type=submit]");
  await page.waitForSelector("converse-roster", { timeout: STEP });
  // Available to others only once the server has its initial presence
  // (RFC 6121 §4.2; a message sent to it before goes to its offline
  // store): the server's copy of that presence back to it (§4.2.2) says so.
  const own = new RegExp(String.raw`<presence\b(?![^>]*\btype=)[^>]*\bfrom=["']${user}@localhost/`);
  await waitForFrame(page, "received", (f) => own.test(f), "initial presence back from the server");
  return page;
}

/** Waits until a message whose text contains `text` is shown on `page`. */
export async function waitForText(page, text) {
  await page.waitForFunction(
    (t) => [...document.querySelectorAll(".chat-msg__text")].some((e) => e.textContent.includes(t)),
    text,
    { timeout: STEP },
  );
}

/** The message box of the one-to-one chat with `jid`, once it is shown. */
export function chatBox(page, jid) {
  return page
    .locator(`converse-chat:has(converse-chat-heading[jid="${jid}"]) textarea.chat-textarea:visible`)
    .first();
}

/** Opens the one-to-one chat with `jid` on `page`, as a user would:
 * by Converse's own route (`#converse/chat?jid=…`, its routeToChat on
 * `hashchange`) or, when the contact is in the roster, by clicking it.
 * The route alone can miss: before Converse has fetched its chats the
 * open waits, under load for seconds; and in the full-screen (one chat
 * at a time) view it does not replace a chat already shown. So the route
 * is set again (a `hashchange` needs a different hash first) and the
 * contact clicked if there is one, until the chat shows or STEP passes. */
export async function openChat(page, jid) {
  const box = chatBox(page, jid);
  const contact = page.locator("converse-roster a", { hasText: jid }).first();
  const deadline = Date.now() + STEP;
  for (;;) {
    await page.evaluate((j) => {
      location.hash = "";
      location.hash = `converse/chat?jid=${j}`;
    }, jid);
    try {
      await box.waitFor({ timeout: 3000 });
      break;
    } catch (err) {
      if (Date.now() > deadline) {
        const errs = page.errors.length ? `; errors in its console: ${page.errors.slice(-5).join(" | ")}` : "";
        throw new Error(`${page.who}: the chat with ${jid} did not open within ${STEP} ms${errs}`, { cause: err });
      }
    }
    if (await contact.count()) await contact.click({ timeout: 3000 }).catch(() => {});
  }
  page.chatWith = jid;
}

/** Sends `text` in the chat last opened with openChat. */
export async function say(page, text) {
  const box = chatBox(page, page.chatWith);
  await box.fill(text);
  await box.press("Enter");
}

/** The value of attribute `name` of the first element of `xml`. */
export function attr(xml, name) {
  return xml.match(new RegExp(String.raw`^<[^>]*?\s${name}=(["'])(.*?)\1`))?.[2];
}

/** Waits until `page` has sent (`dir` "sent") or received ("received") a
 * WebSocket frame for which `match(frame)` is true, and returns that frame.
 * `what` names it in the error; only frames from index `since` of
 * `page.frames` on are looked at. */
export async function waitForFrame(page, dir, match, what, { since = 0 } = {}) {
  const deadline = Date.now() + STEP;
  for (;;) {
    const f = page.frames.slice(since).find((f) => f.dir === dir && match(f.data));
    if (f) return f.data;
    if (Date.now() > deadline) {
      const errs = page.errors.length ? `; errors in its console: ${page.errors.slice(-5).join(" | ")}` : "";
      throw new Error(`${page.who}: no ${what} ${dir} within ${STEP} ms${errs}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Waits for the answer to the IQ `iq` that `page` sent, and returns it;
 * throws (with the answer) unless it is a result. */
export async function waitForIqResult(page, iq, what) {
  const id = attr(iq, "id");
  const answer = await waitForFrame(
    page, "received",
    (f) => /^<iq\b/.test(f) && attr(f, "id") === id && ["result", "error"].includes(attr(f, "type")),
    `answer to ${what} (iq ${id})`,
  );
  if (attr(answer, "type") !== "result") throw new Error(`${page.who}: ${what} failed: ${answer}`);
  return answer;
}

/** `user`'s message archive (XEP-0313) with `peer` as a client of its own
 * sees it: a raw XMPP-over-WebSocket client (RFC 7395) in a page of its
 * own logs in as `user` (SASL PLAIN, offered on loopback), binds a
 * resource, queries urn:xmpp:mam:2 with the `with` filter and returns the
 * archived messages: `{ raw, id, from, encrypted }` for each, `raw` being
 * the whole frame the server sent, `id` and `from` those of the archived
 * message, `encrypted` the namespaces of its <encrypted/> children. */
export async function archiveOf(user, peer) {
  const ctx = await (await launch()).newContext();
  try {
    const page = await ctx.newPage();
    const ws = `${URL.replace(/^http/, "ws")}xmpp-websocket`;
    return await page.evaluate(async ({ ws: url, user, password, peer, step }) => {
      const [local, domain] = user.split("@");
      const sock = new WebSocket(url, "xmpp");
      const inbox = [];
      let closed = null;
      sock.onmessage = (e) => inbox.push(e.data);
      sock.onclose = (e) => { closed = `closed (${e.code} ${e.reason})`; };
      await new Promise((ok, ko) => {
        sock.onopen = ok;
        sock.onerror = () => ko(new Error(`cannot open ${url}`));
      });
      const deadline = Date.now() + step;
      const next = async (match, what) => {
        for (;;) {
          const i = inbox.findIndex(match);
          if (i >= 0) return inbox.splice(i, 1)[0];
          if (closed) throw new Error(`archive client: stream ${closed} while waiting for ${what}`);
          if (Date.now() > deadline) throw new Error(`archive client: no ${what} within ${step} ms`);
          await new Promise((r) => setTimeout(r, 50));
        }
      };
      const open = `<open xmlns="urn:ietf:params:xml:ns:xmpp-framing" to="${domain}" version="1.0"/>`;
      sock.send(open);
      const features = await next((f) => f.includes("<mechanisms"), "stream features with SASL mechanisms");
      if (!/<mechanism>PLAIN<\/mechanism>/.test(features)) throw new Error(`archive client: no PLAIN in ${features}`);
      sock.send(`<auth xmlns="urn:ietf:params:xml:ns:xmpp-sasl" mechanism="PLAIN">${btoa(`\0${local}\0${password}`)}</auth>`);
      const auth = await next((f) => /^<(success|failure)\b/.test(f), "SASL outcome");
      if (!auth.startsWith("<success")) throw new Error(`archive client: login refused: ${auth}`);
      sock.send(open);
      await next((f) => f.includes("urn:ietf:params:xml:ns:xmpp-bind"), "stream features with bind");
      sock.send(`<iq xmlns="jabber:client" type="set" id="bind1"><bind xmlns="urn:ietf:params:xml:ns:xmpp-bind"><resource>archive-check</resource></bind></iq>`);
      const bound = await next((f) => /^<iq\b/.test(f) && /id=["']bind1["']/.test(f), "bind result");
      if (!/type=["']result["']/.test(bound)) throw new Error(`archive client: bind failed: ${bound}`);
      sock.send(`<iq xmlns="jabber:client" type="set" id="mam1"><query xmlns="urn:xmpp:mam:2" queryid="q1">` +
        `<x xmlns="jabber:x:data" type="submit"><field var="FORM_TYPE" type="hidden"><value>urn:xmpp:mam:2</value></field>` +
        `<field var="with"><value>${peer}</value></field></x>` +
        `<set xmlns="http://jabber.org/protocol/rsm"><max>500</max></set></query></iq>`);
      const out = [];
      for (;;) {
        const f = await next((f) => /queryid=["']q1["']/.test(f) || (/^<iq\b/.test(f) && /id=["']mam1["']/.test(f)), "archive results");
        if (f.startsWith("<iq")) {
          if (!/type=["']result["']/.test(f) || !/complete=["']true["']/.test(f)) {
            throw new Error(`archive client: query failed or incomplete: ${f}`);
          }
          break;
        }
        const doc = new DOMParser().parseFromString(f, "text/xml");
        const msg = doc.getElementsByTagNameNS("urn:xmpp:forward:0", "forwarded")[0]
          ?.getElementsByTagNameNS("jabber:client", "message")[0];
        out.push({
          raw: f,
          id: msg?.getAttribute("id"),
          from: msg?.getAttribute("from"),
          encrypted: [...(msg?.children ?? [])].filter((c) => c.localName === "encrypted").map((c) => c.namespaceURI),
        });
      }
      sock.send(`<close xmlns="urn:ietf:params:xml:ns:xmpp-framing"/>`);
      return out;
    }, { ws, user, password: `pw-${user.split("@")[0]}`, peer, step: STEP });
  } finally {
    await ctx.close();
  }
}
