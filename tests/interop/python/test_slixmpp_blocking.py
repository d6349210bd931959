"""Blocking (XEP-0191) with slixmpp's own xep_0191 plugin against the server
under test: block a contact, see their messages bounced with
service-unavailable and ours refused, read the block list back, unblock,
talk again."""

from __future__ import annotations

import asyncio
import uuid

from test_slixmpp import (
    STARTTLS, STEP, TEST_TIMEOUT, expect_message, online_client,
    send_initial_presence, unique_password, unique_user,
)


async def _error_from(c, jid_bare: str) -> str:
    """The condition of the next message error from `jid_bare`."""
    fut = asyncio.get_running_loop().create_future()

    def on_error(msg):
        if msg["from"].bare == jid_bare and not fut.done():
            fut.set_result(msg["error"]["condition"])

    c.add_event_handler("message_error", on_error)
    try:
        return await asyncio.wait_for(fut, STEP)
    finally:
        c.del_event_handler("message_error", on_error)


async def test_block_unblock_contact_with_xep0191_plugin():
    async def run():
        alice = bob = None
        try:
            alice, bob = await asyncio.gather(
                online_client(unique_user("blk-a"), unique_password(), transport=STARTTLS, mechs=set()),
                online_client(unique_user("blk-b"), unique_password(), transport=STARTTLS, mechs=set()),
            )
            for c in (alice, bob):
                c.register_plugin("xep_0191")
            await asyncio.gather(send_initial_presence(alice), send_initial_presence(bob))
            bob_bare = bob.boundjid.bare

            await alice.plugin["xep_0191"].block([bob_bare], timeout=STEP)
            blocked = await alice.plugin["xep_0191"].get_blocked_jids(timeout=STEP)
            assert {j.bare for j in blocked} == {bob_bare}, blocked

            # bob -> alice is bounced (XEP-0191 §3.5)
            err = asyncio.ensure_future(_error_from(bob, alice.boundjid.bare))
            bob.send_message(mto=alice.boundjid.full, mbody="let me in", mtype="chat")
            assert await err == "service-unavailable"
            # alice -> bob is refused (§3.6)
            err = asyncio.ensure_future(_error_from(alice, bob_bare))
            alice.send_message(mto=bob.boundjid.full, mbody="psst", mtype="chat")
            assert await err == "not-acceptable"

            await alice.plugin["xep_0191"].unblock([bob_bare], timeout=STEP)
            assert not await alice.plugin["xep_0191"].get_blocked_jids(timeout=STEP)
            body = f"friends again {uuid.uuid4().hex}"
            bob.send_message(mto=alice.boundjid.full, mbody=body, mtype="chat")
            await expect_message(alice, body, bob)
        finally:
            for c in (alice, bob):
                if c is not None:
                    await c.close()

    await asyncio.wait_for(run(), TEST_TIMEOUT)
