"""Stream Management (XEP-0198) with slixmpp's own xep_0198 plugin against
the server under test: the client enables resumption (§3), its TCP
connection is dropped mid-conversation without a closing handshake, a
message arrives while it is away, and it reconnects and resumes (§5): the
same full JID, the message sent while away delivered, nothing delivered
twice."""

from __future__ import annotations

import asyncio
import uuid

from test_slixmpp import (
    HOST, STARTTLS, STEP, TEST_TIMEOUT, Client, _done, expect_message,
    online_client, unique_password, unique_user,
)


async def test_resume_after_tcp_drop_loses_and_duplicates_nothing():
    async def run():
        a = bob = None
        try:
            user, password = unique_user("sm-a"), unique_password()
            first = await online_client(user, password, transport=STARTTLS, mechs=set())
            await first.close()

            a = Client(user, password, mechs=set(), register=False, transport=STARTTLS)
            a.register_plugin("xep_0198")
            loop = asyncio.get_running_loop()
            enabled, resumed = loop.create_future(), loop.create_future()
            a.add_event_handler("sm_enabled", lambda _e: _done(enabled, True))
            a.add_event_handler("session_resumed", lambda _e: _done(resumed, True))
            a.start()
            await a.wait_online()
            await asyncio.wait_for(enabled, STEP)
            assert a.plugin["xep_0198"].sm_id, "no resumption id (resume='true' not granted)"
            full = a.boundjid.full

            bob = await online_client(unique_user("sm-b"), unique_password(),
                                      transport=STARTTLS, mechs=set())
            bob.send_message(mto=full, mbody="before", mtype="chat")
            await expect_message(a, "before", bob)

            # The connection dies: no </stream:stream>, no final ack.
            a.transport.abort()
            await asyncio.sleep(0.3)
            away = f"while away {uuid.uuid4().hex}"
            bob.send_message(mto=full, mbody=away, mtype="chat")
            await asyncio.sleep(0.2)
            a.connect(HOST, a.port)
            await asyncio.wait_for(resumed, STEP)
            assert a.boundjid.full == full, f"resumed as {a.boundjid}, was {full}"
            await expect_message(a, away, bob)
            after = f"after {uuid.uuid4().hex}"
            bob.send_message(mto=full, mbody=after, mtype="chat")
            await expect_message(a, after, bob)
            # Nothing else (in particular no second copy) arrived.
            await asyncio.sleep(0.5)
            extra = []
            while not a.messages.empty():
                extra.append(a.messages.get_nowait()["body"])
            assert extra == [], f"delivered twice or unexpected: {extra}"
        finally:
            for c in (a, bob):
                if c is not None:
                    await c.close()

    await asyncio.wait_for(run(), TEST_TIMEOUT)
