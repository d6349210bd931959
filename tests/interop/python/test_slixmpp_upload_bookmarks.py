"""HTTP File Upload (XEP-0363) and bookmarks (XEP-0048 over XEP-0049,
XEP-0402 in PEP) with slixmpp's own plugins against the server under test:
xep_0363 finds the upload service, requests a slot and PUTs a file, which
a GET returns byte for byte (XEP-0363 §4, §7); bookmarks stored by an old
client in private storage (xep_0048 with xep_0049) appear as XEP-0402
items in PEP, and a room a new client publishes there appears in the old
client's private storage (XEP-0402 §5.3 "compat")."""

from __future__ import annotations

import asyncio
import io
import os
import ssl
import uuid

import aiohttp
from slixmpp.plugins.xep_0048.stanza import Bookmarks
from slixmpp.plugins.xep_0402.stanza import Conference
from test_slixmpp import (
    DOMAIN, STARTTLS, STEP, TEST_TIMEOUT, online_client, send_initial_presence,
    unique_password, unique_user,
)

NS_BOOKMARKS = "urn:xmpp:bookmarks:1"


async def test_a_file_uploaded_with_xep0363_is_served_back():
    async def run():
        alice = None
        try:
            alice = await online_client(unique_user("up"), unique_password(), transport=STARTTLS, mechs=set())
            for p in ("xep_0030", "xep_0363"):
                alice.register_plugin(p)
            await send_initial_presence(alice)
            data = os.urandom(200_000)
            name = f"photo-{uuid.uuid4().hex[:6]}.jpg"
            url = await alice.plugin["xep_0363"].upload_file(
                name, size=len(data), content_type="image/jpeg",
                input_file=io.BytesIO(data), timeout=STEP)
            assert f"/{name}" in url, url
            ctx = ssl.create_default_context(cafile=os.environ.get("XMPP_CA_FILE")) \
                if url.startswith("https:") else None
            async with aiohttp.ClientSession() as http:
                async with http.get(url, ssl=ctx) as r:
                    assert r.status == 200, r.status
                    assert r.headers.get("Content-Type", "").startswith("image/jpeg"), r.headers
                    assert await r.read() == data
                # An unknown slot is not found (§7: unguessable URLs).
                bad = url.rsplit("/", 2)[0] + "/" + "0" * 32 + "/" + name
                async with http.get(bad, ssl=ctx) as r:
                    assert r.status == 404, r.status
        finally:
            if alice is not None:
                await alice.close()

    await asyncio.wait_for(run(), TEST_TIMEOUT * 2)


async def test_old_and_new_bookmark_clients_share_one_list():
    async def run():
        old = new = None
        user, password = unique_user("bm"), unique_password()
        try:
            old = await online_client(user, password, transport=STARTTLS, mechs=set())
            new = await online_client(user, password, transport=STARTTLS, mechs=set(), register=False)
            for p in ("xep_0030", "xep_0049", "xep_0048"):
                old.register_plugin(p)
            for p in ("xep_0030", "xep_0060", "xep_0163", "xep_0402"):
                new.register_plugin(p)
            await asyncio.gather(send_initial_presence(old), send_initial_presence(new))
            info = await new.plugin["xep_0030"].get_info(new.boundjid.bare, timeout=STEP)
            assert f"{NS_BOOKMARKS}#compat" in info["disco_info"]["features"], info

            room = f"lobby-{uuid.uuid4().hex[:6]}@conference.{DOMAIN}"
            marks = Bookmarks()
            marks.add_conference(room, "oldnick", name="Lobby", autojoin=True)
            await old.plugin["xep_0048"].set_bookmarks(marks, method="xep_0049", timeout=STEP)

            r = await new.plugin["xep_0060"].get_items(new.boundjid.bare, NS_BOOKMARKS, timeout=STEP)
            items = list(r["pubsub"]["items"])
            assert [i["id"] for i in items] == [room], r
            conf = items[0]["conference"]
            assert conf["name"] == "Lobby" and conf["autojoin"] and conf["nick"] == "oldnick", conf

            other = f"dev-{uuid.uuid4().hex[:6]}@conference.{DOMAIN}"
            c = Conference()
            c["name"] = "Dev"
            c["autojoin"] = False
            c["nick"] = "newnick"
            await new.plugin["xep_0060"].publish(new.boundjid.bare, NS_BOOKMARKS, id=other,
                                                 payload=c, timeout=STEP)
            got = await old.plugin["xep_0048"].get_bookmarks(method="xep_0049", timeout=STEP)
            jids = {c["jid"] for c in got["private"]["bookmarks"]["conferences"]}
            assert jids == {room, other}, got
        finally:
            for c in (old, new):
                if c is not None:
                    await c.close()

    await asyncio.wait_for(run(), TEST_TIMEOUT * 2)
