"""Message Carbons (XEP-0280) with slixmpp's own xep_0280 plugin against the
server under test: two resources of alice enable carbons; a message bob
sends to the first resource reaches the second as a received carbon (§7),
and a message the first resource sends to bob reaches the second as a sent
carbon (§8). Both copies come from alice's bare JID (§11)."""

from __future__ import annotations

import asyncio
import uuid

from test_slixmpp import (
    STARTTLS, STEP, TEST_TIMEOUT, expect_message, online_client,
    send_initial_presence, unique_password, unique_user,
)

NS_CARBONS = "urn:xmpp:carbons:2"
NS_FORWARD = "urn:xmpp:forward:0"


def _forwarded(msg, kind: str):
    """The forwarded <message/> element of a carbon."""
    inner = msg.xml.find(f"{{{NS_CARBONS}}}{kind}/{{{NS_FORWARD}}}forwarded/{{jabber:client}}message")
    assert inner is not None, f"no forwarded message in {msg}"
    return inner


async def _next_carbon(c, event: str, kind: str, body: str):
    """Waits for the carbon event whose forwarded message has `body`."""
    fut = asyncio.get_running_loop().create_future()

    def on_carbon(msg):
        inner = _forwarded(msg, kind)
        b = inner.find("{jabber:client}body")
        if b is not None and b.text == body and not fut.done():
            fut.set_result((msg, inner))

    c.add_event_handler(event, on_carbon)
    try:
        return await asyncio.wait_for(fut, STEP)
    finally:
        c.del_event_handler(event, on_carbon)


async def test_received_and_sent_carbons_with_xep0280_plugin():
    async def run():
        a1 = a2 = bob = None
        try:
            user, password = unique_user("cc-a"), unique_password()
            a1, bob = await asyncio.gather(
                online_client(user, password, transport=STARTTLS, mechs=set()),
                online_client(unique_user("cc-b"), unique_password(), transport=STARTTLS, mechs=set()),
            )
            # The second resource of the same account (already registered).
            a2 = await online_client(user, password, transport=STARTTLS, mechs=set(), register=False)
            assert a1.boundjid.bare == a2.boundjid.bare and a1.boundjid != a2.boundjid
            for c in (a1, a2):
                c.register_plugin("xep_0280")
            await asyncio.gather(*(send_initial_presence(c) for c in (a1, a2, bob)))
            # §4: both of alice's resources enable carbons.
            for c in (a1, a2):
                iq = await c.plugin["xep_0280"].enable(timeout=STEP)
                assert iq["type"] == "result", iq

            # §7: bob -> alice's first resource; the second gets a received carbon.
            body = f"to a1 {uuid.uuid4().hex}"
            got = asyncio.ensure_future(_next_carbon(a2, "carbon_received", "received", body))
            bob.send_message(mto=a1.boundjid.full, mbody=body, mtype="chat")
            await expect_message(a1, body, bob)
            msg, inner = await got
            assert msg["from"] == a2.boundjid.bare, msg["from"]
            assert msg["to"] == a2.boundjid, msg["to"]
            assert inner.get("from") == bob.boundjid.full, inner.get("from")

            # §8: alice's first resource -> bob; the second gets a sent carbon.
            body = f"to bob {uuid.uuid4().hex}"
            got = asyncio.ensure_future(_next_carbon(a2, "carbon_sent", "sent", body))
            a1.send_message(mto=bob.boundjid.full, mbody=body, mtype="chat")
            await expect_message(bob, body, a1)
            msg, inner = await got
            assert msg["from"] == a2.boundjid.bare, msg["from"]
            assert inner.get("to") == bob.boundjid.full, inner.get("to")
            assert inner.get("from") == a1.boundjid.full, inner.get("from")
        finally:
            for c in (a1, a2, bob):
                if c is not None:
                    await c.close()

    await asyncio.wait_for(run(), TEST_TIMEOUT)
