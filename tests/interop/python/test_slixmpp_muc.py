"""Multi-User Chat (XEP-0045) with slixmpp's own xep_0045 plugin against the
server under test: alice creates a room and configures it with the
plugin's config-form calls (§10.1.3), bob joins with a history request and
gets occupants → own presence → history → subject in the order the plugin
waits for (§7.2), they chat, alice kicks bob (§8.2, status 307), bans him
(§9.1), and the plugin reads the ban list (§9.2); bob entering again is
refused with forbidden (§7.2.7)."""

from __future__ import annotations

import asyncio
import uuid

from slixmpp.exceptions import PresenceError
from test_slixmpp import (
    STARTTLS, STEP, TEST_TIMEOUT, DOMAIN, online_client, send_initial_presence,
    unique_password, unique_user,
)

NS_MUC_USER = "http://jabber.org/protocol/muc#user"


async def test_muc_create_configure_chat_kick_and_ban_with_xep0045_plugin():
    async def run():
        alice = bob = None
        try:
            alice, bob = await asyncio.gather(
                online_client(unique_user("muc-a"), unique_password(), transport=STARTTLS, mechs=set()),
                online_client(unique_user("muc-b"), unique_password(), transport=STARTTLS, mechs=set()),
            )
            for c in (alice, bob):
                c.register_plugin("xep_0004")
                c.register_plugin("xep_0045")
            await asyncio.gather(*(send_initial_presence(c) for c in (alice, bob)))
            muc_a = alice.plugin["xep_0045"]
            muc_b = bob.plugin["xep_0045"]
            room = f"interop-{uuid.uuid4().hex[:8]}@conference.{DOMAIN}"

            # §10.1.1: the creator's own presence carries 201; the room is
            # locked until configured (§10.1.3).
            own, _subject, _occupants, _history = await muc_a.join_muc_wait(room, "Alice", timeout=STEP)
            codes = {s for s in own["muc"]["status_codes"]}
            assert 110 in codes and 201 in codes, codes
            assert own["muc"]["affiliation"] == "owner", own
            form = await muc_a.get_room_config(room, timeout=STEP)
            fields = form.get_fields()
            for var in ("muc#roomconfig_roomname", "muc#roomconfig_persistentroom",
                        "muc#roomconfig_membersonly", "muc#roomconfig_moderatedroom"):
                assert var in fields, f"{var} missing from {list(fields)}"
            submit = alice.plugin["xep_0004"].make_form(ftype="submit")
            submit.add_field(var="FORM_TYPE", ftype="hidden",
                             value="http://jabber.org/protocol/muc#roomconfig")
            submit.add_field(var="muc#roomconfig_roomname", value="Interop room")
            await muc_a.set_room_config(room, submit, timeout=STEP)

            got_messages: asyncio.Queue = asyncio.Queue()
            bob.add_event_handler("groupchat_message", got_messages.put_nowait)
            alice.send_message(mto=room, mbody="before bob", mtype="groupchat")
            await asyncio.sleep(0.3)

            # §7.2: occupants, own presence, history, subject.
            own, _subject, occupants, history = await muc_b.join_muc_wait(
                room, "Bob", maxstanzas=5, timeout=STEP)
            assert 110 in {s for s in own["muc"]["status_codes"]}, own
            assert own["muc"]["role"] == "participant", own
            # (the plugin lists the own presence among the occupants, last)
            assert [p["from"].resource for p in occupants] == ["Alice", "Bob"], occupants
            assert [m["body"] for m in history] == ["before bob"], history

            alice.send_message(mto=room, mbody="hello bob", mtype="groupchat")
            while True:
                m = await asyncio.wait_for(got_messages.get(), STEP)
                if m["body"] == "hello bob":
                    break
            assert m["from"].resource == "Alice"

            # §8.2: kick; bob sees his unavailable presence with 307.
            kicked = asyncio.get_running_loop().create_future()

            def on_presence(p):
                if p["type"] == "unavailable" and p["from"].resource == "Bob" and not kicked.done():
                    kicked.set_result(p)
            bob.add_event_handler(f"muc::{room}::presence", on_presence)
            await muc_a.set_role(room, "Bob", "none", reason="testing", timeout=STEP)
            p = await asyncio.wait_for(kicked, STEP)
            assert 307 in {s for s in p["muc"]["status_codes"]}, p

            # §9.1, §9.2: ban, and the ban list names bob.
            await muc_a.set_affiliation(room, "outcast", jid=bob.boundjid.bare, timeout=STEP)
            banned = await muc_a.get_affiliation_list(room, "outcast", timeout=STEP)
            assert [str(j).split("/")[0] for j in banned] == [bob.boundjid.bare], banned
            # §7.2.7: entering again is forbidden.
            try:
                await muc_b.join_muc_wait(room, "Bob", timeout=STEP)
            except PresenceError as err:
                assert err.condition == "forbidden", err.condition
            else:
                raise AssertionError("a banned user entered the room")
        finally:
            for c in (alice, bob):
                if c is not None:
                    await c.close()

    await asyncio.wait_for(run(), TEST_TIMEOUT)
