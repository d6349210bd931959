"""Personal eventing (XEP-0163) with slixmpp's own plugins against the
server under test: bob tells his interest in avatars through entity
capabilities (xep_0115 computes the hash the server checks, XEP-0115 §5),
alice publishes an avatar with xep_0084 (data, then metadata: XEP-0084
§4.1–§4.2), bob's client gets the metadata notification (XEP-0163 §4.2.1,
filtered by `+notify`) and fetches the data; a stranger reads an open
node (an OMEMO-style device list, XEP-0060 §4.5 access model `open`)
with xep_0060 and is refused the presence-only avatar."""

from __future__ import annotations

import asyncio
import base64
import hashlib

from slixmpp.exceptions import IqError
from slixmpp.xmlstream import ET
from test_slixmpp import (
    STARTTLS, STEP, TEST_TIMEOUT, online_client, send_initial_presence,
    unique_password, unique_user, wait_until,
)

NS_AVATAR_META = "urn:xmpp:avatar:metadata"
NS_OMEMO = "eu.siacs.conversations.axolotl"
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


async def befriend(alice, bob) -> None:
    """Mutual presence subscription, approved automatically."""
    for c in (alice, bob):
        c.roster.auto_authorize = True
        c.roster.auto_subscribe = True
        await c.get_roster(timeout=STEP)
    a, b = alice.boundjid.bare, bob.boundjid.bare
    alice.send_presence(pto=b, ptype="subscribe")
    await wait_until(lambda: b in alice.client_roster and alice.client_roster[b]["subscription"] == "both",
                     "alice and bob subscribed both ways")
    await wait_until(lambda: a in bob.client_roster and bob.client_roster[a]["subscription"] == "both",
                     "bob sees alice both ways")


async def test_avatar_published_with_xep0084_reaches_an_interested_contact():
    async def run():
        alice = bob = stranger = None
        try:
            alice, bob, stranger = await asyncio.gather(
                online_client(unique_user("pep-a"), unique_password(), transport=STARTTLS, mechs=set()),
                online_client(unique_user("pep-b"), unique_password(), transport=STARTTLS, mechs=set()),
                online_client(unique_user("pep-s"), unique_password(), transport=STARTTLS, mechs=set()),
            )
            for c in (alice, bob, stranger):
                for p in ("xep_0004", "xep_0030", "xep_0060", "xep_0115", "xep_0163", "xep_0084"):
                    c.register_plugin(p)
            metadata: asyncio.Queue = asyncio.Queue()
            bob.add_event_handler("avatar_metadata_publish", metadata.put_nowait)
            # bob's +notify interest: the caps plugin puts it in his presence
            # and answers the server's disco#info query (XEP-0115 §6.3).
            bob.plugin["xep_0163"].add_interest(NS_AVATAR_META)
            await asyncio.gather(*(send_initial_presence(c) for c in (alice, bob, stranger)))
            await befriend(alice, bob)
            await asyncio.sleep(1.0)

            avatar_id = hashlib.sha1(PNG).hexdigest()
            await alice.plugin["xep_0084"].publish_avatar(PNG, timeout=STEP)
            await alice.plugin["xep_0084"].publish_avatar_metadata(
                items=[{"id": avatar_id, "type": "image/png", "bytes": len(PNG)}], timeout=STEP)

            msg = await asyncio.wait_for(metadata.get(), STEP)
            assert msg["from"].bare == alice.boundjid.bare, msg
            info = msg["pubsub_event"]["items"]["item"]["avatar_metadata"]["info"]
            assert info["id"] == avatar_id, msg
            data = await bob.plugin["xep_0084"].retrieve_avatar(alice.boundjid.bare, avatar_id, timeout=STEP)
            got = data["pubsub"]["items"]["item"]["avatar_data"]["value"]
            assert got == PNG

            # An OMEMO-style device list, open to anyone (publish-options).
            devices = ET.Element(f"{{{NS_OMEMO}}}list")
            ET.SubElement(devices, f"{{{NS_OMEMO}}}device", {"id": "4242"})
            form = alice.plugin["xep_0004"].make_form(ftype="submit")
            form.add_field(var="FORM_TYPE", ftype="hidden",
                           value="http://jabber.org/protocol/pubsub#publish-options")
            form.add_field(var="pubsub#access_model", value="open")
            await alice.plugin["xep_0060"].publish(
                alice.boundjid.bare, f"{NS_OMEMO}.devicelist", id="current",
                payload=devices, options=form, timeout=STEP)
            r = await stranger.plugin["xep_0060"].get_items(
                alice.boundjid.bare, f"{NS_OMEMO}.devicelist", timeout=STEP)
            assert "4242" in str(r), r
            # The avatar's access model is presence: the stranger is refused.
            try:
                await stranger.plugin["xep_0060"].get_items(
                    alice.boundjid.bare, NS_AVATAR_META, timeout=STEP)
                raise AssertionError("a stranger read a presence-only node")
            except IqError as e:
                assert e.condition == "not-authorized", e
        finally:
            for c in (alice, bob, stranger):
                if c is not None:
                    await c.close()

    await asyncio.wait_for(run(), TEST_TIMEOUT * 3)
