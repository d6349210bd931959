"""Message Archive Management (XEP-0313) with slixmpp's own xep_0313 and
xep_0059 plugins against the server under test: bob sends alice a
conversation; alice's delivered copies carry a XEP-0359 stanza-id by her
bare JID (§3.1); her archive returns the conversation filtered by `with`,
in order, with delay stamps (§4.2); slixmpp's RSM iterator pages through it
backwards (§4.3.3); and the archive metadata (§6) names the first and last
ids."""

from __future__ import annotations

import asyncio
import uuid

from test_slixmpp import (
    STARTTLS, STEP, TEST_TIMEOUT, expect_message, online_client,
    send_initial_presence, unique_password, unique_user,
)

NS_SID = "urn:xmpp:sid:0"
N = 15


async def test_mam_history_paging_and_metadata_with_xep0313_plugin():
    async def run():
        alice = bob = None
        try:
            alice, bob = await asyncio.gather(
                online_client(unique_user("mam-a"), unique_password(), transport=STARTTLS, mechs=set()),
                online_client(unique_user("mam-b"), unique_password(), transport=STARTTLS, mechs=set()),
            )
            for c in (alice, bob):
                c.register_plugin("xep_0059")
                c.register_plugin("xep_0313")
            await asyncio.gather(*(send_initial_presence(c) for c in (alice, bob)))

            tag = uuid.uuid4().hex[:8]
            bodies = [f"history {tag} {i}" for i in range(N)]
            stanza_ids = []
            for body in bodies:
                bob.send_message(mto=alice.boundjid.bare, mbody=body, mtype="chat")
                while True:
                    msg = await asyncio.wait_for(alice.messages.get(), STEP)
                    if msg["body"] == body:
                        break
                assert msg["from"] == bob.boundjid
                sid = msg.xml.find(f"{{{NS_SID}}}stanza-id")
                assert sid is not None, f"no stanza-id on {msg}"
                assert sid.get("by") == alice.boundjid.bare, sid.get("by")
                stanza_ids.append(sid.get("id"))

            # One query with `with` and a large page: everything, in order.
            mam = alice.plugin["xep_0313"]
            iq = await mam.retrieve(with_jid=bob.boundjid.bare, rsm={"max": 50}, timeout=STEP)
            assert iq["type"] == "result", iq
            results = iq["mam"]["results"]
            got = [r["mam_result"]["forwarded"]["stanza"]["body"] for r in results]
            assert got == bodies, got
            assert [r["mam_result"]["id"] for r in results] == stanza_ids
            for r in results:
                assert r["mam_result"]["forwarded"]["delay"]["stamp"] is not None
            assert iq["mam_fin"]["complete"] in (True, "true"), iq

            # slixmpp's RSM iterator, newest first, 4 per page.
            seen = []
            async for m in mam.iterate(with_jid=bob.boundjid.bare, reverse=True, rsm={"max": 4}):
                seen.append(m["mam_result"]["forwarded"]["stanza"]["body"])
            assert seen == list(reversed(bodies)), seen

            # Metadata (§6): first and last archive ids.
            md = await mam.get_archive_metadata(jid=alice.boundjid.bare, timeout=STEP)
            assert md["type"] == "result", md
            assert md["mam_metadata"]["start"]["id"] == stanza_ids[0]
            assert md["mam_metadata"]["end"]["id"] == stanza_ids[-1]

            # Bob's side was archived too, as outgoing messages.
            iq = await bob.plugin["xep_0313"].retrieve(with_jid=alice.boundjid.bare, rsm={"max": 50}, timeout=STEP)
            sent = [r["mam_result"]["forwarded"]["stanza"] for r in iq["mam"]["results"]]
            assert [s["body"] for s in sent] == bodies
            assert all(s["to"].bare == alice.boundjid.bare for s in sent)
        finally:
            for c in (alice, bob):
                if c is not None:
                    await c.close()

    await asyncio.wait_for(run(), TEST_TIMEOUT)
