// HTTP File Upload (XEP-0363) from the web chat Starling serves, in Debian's
// headless chromium driven by playwright-core, through Converse.js's own UI:
// alice and bob, each in a browser profile of their own, open a one-to-one
// chat; Converse finds the upload service in the server's disco#items (§3:
// the paperclip button only appears when it does), alice picks a freshly
// generated PNG with that button's file input, Converse asks the service for
// a slot (§4: the <request/> carries the file's name, size and type; the
// <slot/> answer has the PUT and GET URLs), PUTs the file to the PUT URL
// (§7; the URL is on the same origin as the page, Starling's HTTP listener)
// and sends the GET URL to bob as the body and XEP-0066 out-of-band data.
// Bob's chat view shows the picture: an <img> whose src is that URL, loaded
// by the browser (naturalWidth > 0). Last, the test downloads the URL itself
// (GET, §7) and compares the bytes with the file. Screenshots of every page
// are written to ARTIFACTS when the test fails.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, writeFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { deflateSync } from "node:zlib";
import {
  URL, STEP, closeBrowser, login, screenshots, openChat, attr, waitForFrame, waitForIqResult,
} from "../lib/converse.js";

after(closeBrowser);

/** A `w`×`h` PNG (RGB, 8 bits) of a random colour, so that every run
 * uploads different bytes. */
function png(w = 12, h = 8) {
  const crcTable = Array.from({ length: 256 }, (_, n) => {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    return c >>> 0;
  });
  const crc32 = (buf) => {
    let c = 0xffffffff;
    for (const b of buf) c = crcTable[(c ^ b) & 0xff] ^ (c >>> 8);
    return (c ^ 0xffffffff) >>> 0;
  };
  const chunk = (type, data) => {
    const len = Buffer.alloc(4);
    len.writeUInt32BE(data.length);
    const body = Buffer.concat([Buffer.from(type, "latin1"), data]);
    const crc = Buffer.alloc(4);
    crc.writeUInt32BE(crc32(body));
    return Buffer.concat([len, body, crc]);
  };
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(w, 0);
  ihdr.writeUInt32BE(h, 4);
  ihdr[8] = 8; // bit depth
  ihdr[9] = 2; // RGB
  const rgb = [0, 1, 2].map(() => Math.floor(Math.random() * 256));
  const row = Buffer.from([0, ...Array.from({ length: w }, () => rgb).flat()]); // filter 0, then pixels
  const raw = Buffer.concat(Array.from({ length: h }, () => row));
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk("IHDR", ihdr),
    chunk("IDAT", deflateSync(raw)),
    chunk("IEND", Buffer.alloc(0)),
  ]);
}

/** The XML text `s` with the five predefined entities decoded. */
const unescape = (s) =>
  s.replace(/&(lt|gt|quot|apos|amp);/g, (_, e) => ({ lt: "<", gt: ">", quot: '"', apos: "'", amp: "&" })[e]);

test("file upload: alice sends a picture, bob's chat shows it", { timeout: 120000 }, async (t) => {
  assert.ok(URL, "WEBCHAT_URL is not set (run tests/browser/run.sh)");
  const dir = await mkdtemp(path.join(tmpdir(), "starling-upload-"));
  try {
    const bytes = png();
    const name = `dot-${Date.now().toString(36)}.png`;
    const file = path.join(dir, name);
    await writeFile(file, bytes);

    const alice = await login("alice");
    const bob = await login("bob");
    await openChat(alice, "bob@localhost");

    // Converse renders the paperclip and its (hidden) file input only once
    // disco has found a service with urn:xmpp:http:upload:0 (§3).
    const input = alice.locator(
      'converse-chat:has(converse-chat-heading[jid="bob@localhost"]) converse-chat-toolbar input.fileupload',
    ).first();
    await input.waitFor({ state: "attached", timeout: STEP }).catch((err) => {
      throw new Error("alice: no file-upload button in the chat toolbar (Converse found no XEP-0363 service)", { cause: err });
    });
    await input.setInputFiles(file);

    // §4: the slot request names the file, its size and its type, and the
    // answer gives the URLs.
    const request = await waitForFrame(
      alice, "sent", (f) => /^<iq\b/.test(f) && /xmlns=["']urn:xmpp:http:upload:0["']/.test(f), "slot request (§4)",
    );
    const req = request.match(/<request\b[^>]*>/)?.[0] ?? "";
    assert.equal(attr(req, "filename"), name, `slot request names the file: ${request}`);
    assert.equal(attr(req, "size"), String(bytes.length), `slot request has the file's size: ${request}`);
    assert.equal(attr(req, "content-type"), "image/png", `slot request has the file's type: ${request}`);
    const slot = await waitForIqResult(alice, request, "the slot request (§4)");
    const put = unescape(slot.match(/<put\b[^>]*\burl=(["'])(.*?)\1/)?.[2] ?? "");
    const get = unescape(slot.match(/<get\b[^>]*\burl=(["'])(.*?)\1/)?.[2] ?? "");
    assert.ok(get && put, `the slot has a PUT and a GET URL: ${slot}`);
    assert.ok(get.startsWith(URL), `the GET URL ${get} is on the page's origin ${URL} (the default base_url)`);
    assert.ok(get.endsWith(`/${name}`), `the GET URL ${get} keeps the file name (§4)`);

    // After the PUT, Converse sends the GET URL as the body and as XEP-0066 data.
    const sent = await waitForFrame(
      alice, "sent", (f) => /^<message\b/.test(f) && f.includes("jabber:x:oob"), "message with the file's URL",
    );
    assert.equal(unescape(sent.match(/<url>(.*?)<\/url>/)?.[1] ?? ""), get, `the message's out-of-band URL: ${sent}`);
    assert.equal(unescape(sent.match(/<body>(.*?)<\/body>/)?.[1] ?? ""), get, `the message's body: ${sent}`);

    // Bob sees the picture, loaded from the server.
    await openChat(bob, "alice@localhost");
    await bob.waitForFunction(
      (url) => [...document.querySelectorAll('converse-chat:has(converse-chat-heading[jid="alice@localhost"]) img')]
        .some((img) => img.src === url && img.complete && img.naturalWidth > 0),
      get,
      { timeout: STEP },
    ).catch(async (err) => {
      const imgs = await bob.evaluate(() =>
        [...document.querySelectorAll("converse-chat img")].map((i) => `${i.src} (${i.naturalWidth}px)`));
      throw new Error(`bob: no loaded <img src="${get}"> in the chat with alice; images: ${imgs.join(", ") || "none"}`, { cause: err });
    });

    // §7: the GET URL serves the bytes that were uploaded.
    const res = await fetch(get);
    assert.equal(res.status, 200, `GET ${get}`);
    assert.equal(res.headers.get("content-type"), "image/png", `GET ${get}: Content-Type`);
    assert.deepEqual(Buffer.from(await res.arrayBuffer()), bytes, `GET ${get} returns the uploaded bytes`);
  } catch (err) {
    await screenshots(t.name.replace(/\W+/g, "_"));
    throw err;
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
