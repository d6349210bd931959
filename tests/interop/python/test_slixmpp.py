"""Interop tests driving the real slixmpp client library against an XMPP server.

The server is given by environment variables (see ../README.md):

    XMPP_HOST (127.0.0.1)   XMPP_DOMAIN (localhost)
    XMPP_STARTTLS_PORT (5222)   XMPP_TLS_PORT (5223, XEP-0368 direct TLS)
    XMPP_CA_FILE (unset: certificate verification is disabled)
    XMPP_TEST_TIMEOUT (20, seconds per test; also enforced by pytest-timeout)
    XMPP_SKIP_TLS_UNIQUE (unset; "1" skips the SCRAM-SHA-256-PLUS tests)

Every test creates its own accounts with unique random names through
in-band registration (XEP-0077) on the same stream that then authenticates.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import ssl
import uuid
from pathlib import Path

import pytest
import slixmpp
from slixmpp.exceptions import IqError
from slixmpp.features.feature_mechanisms.stanza import Auth as SASLAuth

HOST = os.environ.get("XMPP_HOST", "127.0.0.1")
DOMAIN = os.environ.get("XMPP_DOMAIN", "localhost")
STARTTLS_PORT = int(os.environ.get("XMPP_STARTTLS_PORT", "5222"))
TLS_PORT = int(os.environ.get("XMPP_TLS_PORT", "5223"))
CA_FILE = os.environ.get("XMPP_CA_FILE") or None
TEST_TIMEOUT = float(os.environ.get("XMPP_TEST_TIMEOUT", "20"))
# Budget for one protocol step (connect+register+auth, one message, ...).
STEP = max(3.0, TEST_TIMEOUT / 2 - 1)

STARTTLS = "starttls"
DIRECT_TLS = "direct_tls"

# Hard per-test timeout: pytest-timeout (thread method) kills a hung test even
# if the event loop itself is wedged; asyncio.wait_for below fails faster with
# a better message.
pytestmark = pytest.mark.timeout(TEST_TIMEOUT + 5)


def unique_user(prefix: str) -> str:
    return f"interop-{prefix}-{uuid.uuid4().hex[:12]}"


def unique_password() -> str:
    return "pw-" + uuid.uuid4().hex


class Client(slixmpp.ClientXMPP):
    """A slixmpp client that records what happened on its stream.

    mechs:     the only SASL mechanisms slixmpp may choose from (empty set:
               slixmpp's own default choice, as a real user gets it)
    register:  perform XEP-0077 registration of (user, password) before SASL
    transport: STARTTLS (plain TCP + <starttls/>) or DIRECT_TLS (XEP-0368)
    tls_max:   optional ssl.TLSVersion ceiling (for tls-unique channel binding)
    """

    def __init__(self, user: str, password: str, *, mechs: set[str],
                 register: bool = False, transport: str = STARTTLS,
                 tls_max: ssl.TLSVersion | None = None) -> None:
        super().__init__(f"{user}@{DOMAIN}/interop-{uuid.uuid4().hex[:6]}", password)
        self.transport_kind = transport
        self.port = STARTTLS_PORT if transport == STARTTLS else TLS_PORT
        self.do_register = register

        # --- transport selection: exactly one way in, never plaintext -------
        self.enable_plaintext = False
        self.enable_starttls = transport == STARTTLS
        self.enable_direct_tls = transport == DIRECT_TLS

        # --- certificate handling ------------------------------------------
        ctx = ssl.create_default_context()
        if CA_FILE:
            ctx.load_verify_locations(cafile=CA_FILE)
            ctx.check_hostname = True  # against XMPP_DOMAIN (server_hostname)
            ctx.verify_mode = ssl.CERT_REQUIRED
        else:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if tls_max is not None:
            ctx.maximum_version = tls_max
        self.ssl_context = ctx

        # --- SASL: restrict the mechanisms slixmpp may pick -----------------
        if mechs:
            self.plugin["feature_mechanisms"].use_mechs = set(mechs)
        # (unencrypted_* stay False: SCRAM/PLAIN only ever run inside TLS)

        self.register_plugin("xep_0030")
        self.register_plugin("xep_0199")  # ping
        if register:
            self.register_plugin("xep_0077")  # in-band registration
            self.plugin["xep_0077"].create_account = True
            self.add_event_handler("register", self._on_register)

        loop = asyncio.get_running_loop()
        self.session_started: asyncio.Future = loop.create_future()
        self.registered: asyncio.Future = loop.create_future()
        self.auth_failed: asyncio.Future = loop.create_future()
        self.auth_failure_conditions: list[str] = []
        self.auth_mechanisms_sent: list[str] = []
        self.register_error: IqError | None = None
        self.presence_echo: asyncio.Future = loop.create_future()
        self.messages: asyncio.Queue = asyncio.Queue()

        self.add_event_handler("session_start", self._on_session_start)
        self.add_event_handler("failed_auth", self._on_failed_auth)
        self.add_event_handler("failed_all_auth", self._on_failed_all_auth)
        self.add_event_handler("no_auth", self._on_failed_all_auth)
        self.add_event_handler("connection_failed", self._on_connection_failed)
        self.add_event_handler("disconnected", self._on_disconnected)
        self.add_event_handler("message", self._on_message)
        self.add_event_handler("presence_available", self._on_presence)
        self.add_filter("out", self._record_auth)

    # -- recording -----------------------------------------------------------
    def _record_auth(self, stanza):
        # (slixmpp reports .namespace of nonzas as jabber:client: match the class)
        if isinstance(stanza, SASLAuth):
            self.auth_mechanisms_sent.append(stanza["mechanism"])
        return stanza

    @property
    def server_mechanisms(self) -> set[str]:
        """SASL mechanisms the server advertised (as parsed by slixmpp)."""
        return set(self.plugin["feature_mechanisms"].mech_list)

    # -- event handlers --------------------------------------------------------
    async def _on_register(self, _form) -> None:
        iq = self.Iq()
        iq["type"] = "set"
        iq["register"]["username"] = self.boundjid.user
        iq["register"]["password"] = self.password
        try:
            await iq.send(timeout=STEP)
        except IqError as err:
            self.register_error = err
            _fail(self.registered, AssertionError(
                f"IBR of {self.boundjid.bare} refused: {err.iq['error']['condition']}"))
            self.disconnect(wait=0)
            return
        except Exception as err:  # IqTimeout etc.
            _fail(self.registered, AssertionError(f"IBR of {self.boundjid.bare} failed: {err!r}"))
            self.disconnect(wait=0)
            return
        _done(self.registered, True)

    def _on_session_start(self, _event) -> None:
        _done(self.session_started, True)

    def _on_failed_auth(self, stanza) -> None:
        self.auth_failure_conditions.append(stanza["condition"])
        _done(self.auth_failed, stanza["condition"])

    def _on_failed_all_auth(self, _event=None) -> None:
        err = AssertionError(
            f"SASL failed for {self.boundjid.bare}: conditions={self.auth_failure_conditions} "
            f"server offered={sorted(self.server_mechanisms)} allowed={sorted(self.plugin['feature_mechanisms'].use_mechs)}")
        _fail(self.session_started, err)
        _done(self.auth_failed, self.auth_failure_conditions[-1] if self.auth_failure_conditions else "no-mechanism")

    def _on_connection_failed(self, err) -> None:
        # slixmpp would retry forever with back-off; fail fast instead.
        self.cancel_connection_attempt()
        exc = AssertionError(f"cannot connect to {HOST}:{self.port} ({self.transport_kind}): {err}")
        for fut in (self.session_started, self.registered, self.auth_failed):
            _fail(fut, exc)

    def _on_disconnected(self, reason) -> None:
        exc = AssertionError(f"stream closed before session start ({reason})")
        _fail(self.session_started, exc)
        if self.do_register:
            _fail(self.registered, AssertionError(f"stream closed before IBR completed ({reason})"))

    def _on_message(self, msg) -> None:
        if msg["type"] in ("chat", "normal"):
            self.messages.put_nowait(msg)

    def _on_presence(self, pres) -> None:
        if pres["from"] == self.boundjid:
            _done(self.presence_echo, True)

    # -- helpers ---------------------------------------------------------------
    def start(self) -> None:
        self.connect(HOST, self.port)

    async def wait_online(self) -> None:
        if self.do_register:
            await asyncio.wait_for(asyncio.shield(self.registered), STEP)
        await asyncio.wait_for(asyncio.shield(self.session_started), STEP)

    def tls_version(self) -> str | None:
        sock = self.socket
        return sock.version() if isinstance(sock, (ssl.SSLObject, ssl.SSLSocket)) else None

    async def close(self) -> None:
        if self.transport is not None:
            try:
                await asyncio.wait_for(self.disconnect(wait=1.0), 3)
            except Exception:
                if self.transport is not None:
                    self.transport.abort()
        self.cancel_connection_attempt()


def _done(fut: asyncio.Future, value) -> None:
    if not fut.done():
        fut.set_result(value)


def _fail(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
        fut.exception()  # mark retrieved: avoid "exception never retrieved" noise


async def online_client(user: str, password: str, *, transport: str, mechs: set[str],
                        register: bool = True, tls_max=None) -> Client:
    c = Client(user, password, mechs=mechs, register=register, transport=transport, tls_max=tls_max)
    c.start()
    try:
        await c.wait_online()
    except BaseException:
        await c.close()
        raise
    return c


def assert_secure_session(c: Client, mech: str) -> None:
    assert c.authenticated, "slixmpp did not mark the stream authenticated"
    assert c.auth_mechanisms_sent == [mech], (
        f"expected exactly one <auth mechanism='{mech}'/>, sent {c.auth_mechanisms_sent}")
    assert c.plugin["feature_mechanisms"].mech.name == mech
    assert mech in c.server_mechanisms, f"server did not offer {mech}: {sorted(c.server_mechanisms)}"
    assert c.tls_version() is not None, "stream is not TLS-protected"
    if c.transport_kind == STARTTLS:
        assert "starttls" in c.features, "STARTTLS was not negotiated on the STARTTLS port"
    else:
        assert "starttls" not in c.features, "direct TLS stream unexpectedly negotiated STARTTLS"
    bound = c.boundjid
    assert bound.bare == f"{c.requested_jid.user}@{DOMAIN}", f"bound JID {bound} does not match account"
    assert bound.resource, "no resource bound"


async def send_initial_presence(c: Client) -> None:
    c.send_presence()
    # RFC 6121 §4.2.2: the server MUST deliver the initial presence to all of
    # the user's available resources, including the one that sent it.
    await asyncio.wait_for(asyncio.shield(c.presence_echo), STEP)


async def expect_message(c: Client, body: str, sender: Client) -> None:
    while True:
        msg = await asyncio.wait_for(c.messages.get(), STEP)
        if msg["body"] == body:
            break
    assert msg["from"] == sender.boundjid, f"message 'from' {msg['from']} != sender {sender.boundjid}"
    assert msg["to"].bare == c.boundjid.bare
    assert msg["type"] == "chat"


async def ping_server(c: Client) -> None:
    iq = await c.plugin["xep_0199"].send_ping(DOMAIN, timeout=STEP)
    assert iq["type"] == "result", f"ping answered with {iq['type']}"
    assert iq["from"].full == DOMAIN, f"ping reply from {iq['from']!r}, expected {DOMAIN}"
    assert iq["id"]


async def scenario_register_login_chat_ping(transport: str, mech: str) -> None:
    alice_pw, bob_pw = unique_password(), unique_password()
    alice_user, bob_user = unique_user("alice"), unique_user("bob")
    alice = bob = None
    try:
        alice, bob = await asyncio.gather(
            online_client(alice_user, alice_pw, transport=transport, mechs={mech}),
            online_client(bob_user, bob_pw, transport=transport, mechs={mech}),
        )
        for c in (alice, bob):
            assert c.registered.result() is True
            assert_secure_session(c, mech)

        await asyncio.gather(send_initial_presence(alice), send_initial_presence(bob))

        # alice -> bob, addressed to the BARE JID (server picks the resource)
        body1 = f"hello bob {uuid.uuid4().hex}"
        alice.send_message(mto=bob.boundjid.bare, mbody=body1, mtype="chat")
        await expect_message(bob, body1, alice)

        # bob -> alice, addressed to the FULL JID
        body2 = f"hello alice {uuid.uuid4().hex} <&> ünïcode"
        bob.send_message(mto=alice.boundjid.full, mbody=body2, mtype="chat")
        await expect_message(alice, body2, bob)

        await asyncio.gather(ping_server(alice), ping_server(bob))
    finally:
        for c in (alice, bob):
            if c is not None:
                await c.close()


# --------------------------------------------------------------------------- tests


async def test_starttls_ibr_scram_sha_256_chat_ping_succeeds():
    """Scenario 1: IBR + SCRAM-SHA-256 over STARTTLS, chat both ways, ping."""
    await asyncio.wait_for(scenario_register_login_chat_ping(STARTTLS, "SCRAM-SHA-256"), TEST_TIMEOUT)


async def test_direct_tls_ibr_scram_sha_256_chat_ping_succeeds():
    """Scenario 2: same as 1 over XEP-0368 direct TLS on XMPP_TLS_PORT."""
    await asyncio.wait_for(scenario_register_login_chat_ping(DIRECT_TLS, "SCRAM-SHA-256"), TEST_TIMEOUT)


@pytest.mark.skipif(os.environ.get("XMPP_SKIP_TLS_UNIQUE") == "1",
                    reason="XMPP_SKIP_TLS_UNIQUE=1: server cannot do tls-unique channel binding")
@pytest.mark.parametrize("transport", [STARTTLS, DIRECT_TLS])
async def test_scram_sha_256_plus_tls_unique_login_succeeds(transport):
    """Scenario 3: SCRAM-SHA-256-PLUS.

    slixmpp 1.17 implements SCRAM-*-PLUS, but Python's ssl module only exposes
    the 'tls-unique' channel binding, which RFC 9266 forbids on TLS 1.3.  So
    the client is capped at TLS 1.2 and must send gs2 header 'p=tls-unique'.
    """
    async def run():
        mech = "SCRAM-SHA-256-PLUS"
        c = None
        try:
            c = await online_client(unique_user("plus"), unique_password(), transport=transport,
                                    mechs={mech}, tls_max=ssl.TLSVersion.TLSv1_2)
            assert_secure_session(c, mech)
            assert c.tls_version() == "TLSv1.2"
            used = c.plugin["feature_mechanisms"].mech
            assert used.use_channel_binding is True
            assert used.gs2_header.startswith(b"p=tls-unique,"), used.gs2_header
            cb = used.credentials["channel_binding"]
            assert isinstance(cb, bytes) and len(cb) >= 12, f"no tls-unique data: {cb!r}"
            assert used._mutual_auth is True, "server signature (v=) not verified"
            await ping_server(c)
        finally:
            if c is not None:
                await c.close()

    await asyncio.wait_for(run(), TEST_TIMEOUT)


@pytest.mark.skipif(os.environ.get("XMPP_SKIP_TLS_UNIQUE") == "1",
                    reason="XMPP_SKIP_TLS_UNIQUE=1: server cannot do tls-unique channel binding")
async def test_scram_sha_256_plus_forged_channel_binding_auth_fails():
    """Scenario 3b: the server must really check the tls-unique binding.

    Same account, right password, SCRAM-SHA-256-PLUS, but the client sends
    channel-binding data that does not belong to this TLS connection (what a
    man in the middle would do).  The server must answer with a SASL failure.
    """
    async def run():
        mech = "SCRAM-SHA-256-PLUS"
        user, pw = unique_user("forged"), unique_password()
        good = await online_client(user, pw, transport=STARTTLS, mechs={mech},
                                   tls_max=ssl.TLSVersion.TLSv1_2)
        assert_secure_session(good, mech)
        await good.close()

        bad = Client(user, pw, mechs={mech}, register=False, transport=STARTTLS,
                     tls_max=ssl.TLSVersion.TLSv1_2)
        fm = bad.plugin["feature_mechanisms"]
        real_callback = fm.sasl_callback

        def forged(required, optional):
            creds = real_callback(required, optional)
            if creds.get("channel_binding"):
                creds["channel_binding"] = bytes(len(creds["channel_binding"]))  # all zero
            return creds

        fm.sasl_callback = forged
        bad.start()
        try:
            condition = await asyncio.wait_for(asyncio.shield(bad.auth_failed), STEP)
            assert bad.auth_mechanisms_sent == [mech], bad.auth_mechanisms_sent
            assert fm.mech.gs2_header.startswith(b"p=tls-unique,")
            assert condition in ("not-authorized", "malformed-request"), condition
            with pytest.raises(AssertionError, match="SASL failed|stream closed"):
                await asyncio.wait_for(asyncio.shield(bad.session_started), STEP)
            assert not bad.authenticated
        finally:
            await bad.close()

    await asyncio.wait_for(run(), TEST_TIMEOUT)


@pytest.mark.parametrize("transport", [STARTTLS, DIRECT_TLS])
async def test_default_mechanism_login_chat_succeeds(transport):
    """What a real user gets: slixmpp picks the mechanism itself."""
    async def run():
        a = b = None
        try:
            a = await online_client(unique_user("dflt-a"), unique_password(), transport=transport, mechs=set())
            b = await online_client(unique_user("dflt-b"), unique_password(), transport=transport, mechs=set())
            assert a.authenticated and len(a.auth_mechanisms_sent) == 1, a.auth_mechanisms_sent
            assert a.auth_mechanisms_sent[0].startswith("SCRAM-SHA-"), a.auth_mechanisms_sent
            await ping_server(a)
        finally:
            for c in (a, b):
                if c is not None:
                    await c.close()

    await asyncio.wait_for(run(), TEST_TIMEOUT)


@pytest.mark.skipif(os.environ.get("XMPP_SKIP_TLS_UNIQUE") != "1",
                    reason="the server offers tls-unique: covered by the -PLUS success tests")
async def test_scram_plus_tls_unique_refused_cleanly_when_not_offered():
    """A server without tls-unique (RFC 9266; not defined for TLS 1.3) must
    refuse slixmpp's p=tls-unique with a SASL failure, not hang, and keep
    serving: the same account then logs in with SCRAM-SHA-256."""
    async def run():
        user, pw = unique_user("nounique"), unique_password()
        good = await online_client(user, pw, transport=STARTTLS, mechs={"SCRAM-SHA-256"})
        await good.close()
        bad = Client(user, pw, mechs={"SCRAM-SHA-256-PLUS"}, register=False,
                     transport=STARTTLS, tls_max=ssl.TLSVersion.TLSv1_2)
        bad.start()
        try:
            condition = await asyncio.wait_for(asyncio.shield(bad.auth_failed), STEP)
            assert condition == "not-authorized", condition
            assert bad.plugin["feature_mechanisms"].mech.gs2_header.startswith(b"p=tls-unique,")
            assert not bad.authenticated
        finally:
            await bad.close()
        again = await online_client(user, pw, transport=STARTTLS, mechs={"SCRAM-SHA-256"}, register=False)
        assert_secure_session(again, "SCRAM-SHA-256")
        await again.close()

    await asyncio.wait_for(run(), TEST_TIMEOUT)


@pytest.mark.parametrize("transport", [STARTTLS, DIRECT_TLS])
async def test_wrong_password_auth_fails(transport):
    """Scenario 4: a registered account with a wrong password -> SASL <failure/>."""
    async def run():
        mech = "SCRAM-SHA-256"
        user, pw = unique_user("wrongpw"), unique_password()
        # the account exists and the right password works ...
        good = await online_client(user, pw, transport=transport, mechs={mech})
        assert_secure_session(good, mech)
        await good.close()

        # ... but the wrong one is refused with a SASL failure, not a hang
        bad = Client(user, pw + "-wrong", mechs={mech}, register=False, transport=transport)
        bad.start()
        try:
            condition = await asyncio.wait_for(asyncio.shield(bad.auth_failed), STEP)
            assert condition == "not-authorized", f"unexpected SASL failure condition {condition!r}"
            assert bad.auth_mechanisms_sent == [mech]
            with pytest.raises(AssertionError, match="SASL failed|stream closed"):
                await asyncio.wait_for(asyncio.shield(bad.session_started), STEP)
            assert not bad.authenticated
            assert bad.tls_version() is not None or bad.transport is None
        finally:
            await bad.close()

    await asyncio.wait_for(run(), TEST_TIMEOUT)


async def test_register_existing_username_conflict():
    """XEP-0077: registering an already-taken username returns <conflict/>."""
    async def run():
        mech = "SCRAM-SHA-256"
        user = unique_user("dup")
        first = await online_client(user, unique_password(), transport=STARTTLS, mechs={mech})
        await first.close()

        second = Client(user, unique_password(), mechs={mech}, register=True, transport=STARTTLS)
        second.start()
        try:
            with pytest.raises(AssertionError, match="refused"):
                await asyncio.wait_for(asyncio.shield(second.registered), STEP)
            assert second.register_error is not None
            assert second.register_error.iq["error"]["condition"] == "conflict"
        finally:
            await second.close()

    await asyncio.wait_for(run(), TEST_TIMEOUT)


NODE_DIR = Path(__file__).resolve().parent.parent / "node"
NODE_PEER = NODE_DIR / "lib" / "peer.mjs"


@pytest.mark.skipif(shutil.which("node") is None or not (NODE_DIR / "node_modules" / "@xmpp" / "client").is_dir(),
                    reason="node or tests/interop/node/node_modules missing (run.sh installs them)")
async def test_cross_library_chat_with_xmpp_client_succeeds():
    """One message each way between slixmpp and an @xmpp/client peer (node)."""
    async def readline(proc) -> dict:
        line = await asyncio.wait_for(proc.stdout.readline(), STEP)
        assert line, "node peer exited: " + (await proc.stderr.read()).decode(errors="replace")
        event = json.loads(line)
        assert event.get("event") != "error", f"node peer failed: {event.get('error')}"
        return event

    async def run():
        peer_user, peer_pw = unique_user("jspeer"), unique_password()
        env = dict(os.environ, PEER_USER=peer_user, PEER_PASSWORD=peer_pw)
        proc = await asyncio.create_subprocess_exec(
            "node", str(NODE_PEER), cwd=str(NODE_DIR), env=env,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        py = None
        try:
            py, online = await asyncio.gather(
                online_client(unique_user("pypeer"), unique_password(), transport=STARTTLS,
                              mechs={"SCRAM-SHA-256"}),
                readline(proc))
            assert online["event"] == "online"
            js_jid = slixmpp.JID(online["jid"])
            assert js_jid.bare == f"{peer_user}@{DOMAIN}" and js_jid.resource
            await send_initial_presence(py)

            # slixmpp -> @xmpp/client (to its bare JID)
            body1 = f"from slixmpp {uuid.uuid4().hex}"
            py.send_message(mto=js_jid.bare, mbody=body1, mtype="chat")
            while True:
                event = await readline(proc)
                if event["event"] == "message":
                    break
            assert event["body"] == body1
            assert event["from"] == py.boundjid.full
            assert event["type"] == "chat"

            # @xmpp/client -> slixmpp (to its full JID)
            body2 = f"from @xmpp/client {uuid.uuid4().hex}"
            proc.stdin.write((json.dumps({"cmd": "send", "to": py.boundjid.full, "body": body2}) + "\n").encode())
            await proc.stdin.drain()
            while True:
                msg = await asyncio.wait_for(py.messages.get(), STEP)
                if msg["body"] == body2:
                    break
            assert msg["from"] == js_jid
            assert msg["type"] == "chat"
        finally:
            if py is not None:
                await py.close()
            if proc.returncode is None:
                try:
                    proc.stdin.write(b'{"cmd":"stop"}\n')
                    await asyncio.wait_for(proc.wait(), 3)
                except Exception:
                    proc.kill()
                    await proc.wait()

    await asyncio.wait_for(run(), TEST_TIMEOUT)


# --------------------------------------------------------------------------- IM core (RFC 6121)


async def wait_until(pred, what: str) -> None:
    """Polls `pred` until true (roster pushes are processed asynchronously)."""
    deadline = asyncio.get_running_loop().time() + STEP
    while not pred():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def test_subscription_handshake_presence_and_chat_succeeds():
    """RFC 6121 §3.1 handshake both ways between two slixmpp clients, then
    presence changes (§4.4) and messages flow; unavailable on logout (§4.5)."""

    async def run():
        alice = bob = None
        try:
            alice, bob = await asyncio.gather(
                online_client(unique_user("alice"), unique_password(), transport=STARTTLS, mechs=set()),
                online_client(unique_user("bob"), unique_password(), transport=STARTTLS, mechs=set()),
            )
            events: dict[str, asyncio.Queue] = {}
            for c in (alice, bob):
                # Drive the handshake explicitly: no auto-approval (None; False
                # would make slixmpp deny every request) and no auto-subscribe.
                c.roster.auto_authorize = None
                c.roster.auto_subscribe = False
                q: asyncio.Queue = asyncio.Queue()
                events[c.boundjid.bare] = q
                for ev in ("presence_subscribe", "presence_subscribed", "changed_status",
                           "presence_unavailable"):
                    c.add_event_handler(ev, lambda p, ev=ev, q=q: q.put_nowait((ev, p)))
                await c.get_roster(timeout=STEP)
            await asyncio.gather(send_initial_presence(alice), send_initial_presence(bob))

            async def expect(c: Client, ev: str, frm: str, pred=lambda p: True):
                q = events[c.boundjid.bare]
                while True:
                    got, p = await asyncio.wait_for(q.get(), STEP)
                    if got == ev and p["from"].bare == frm and pred(p):
                        return p

            a, b = alice.boundjid.bare, bob.boundjid.bare
            alice.send_presence(pto=b, ptype="subscribe")
            req = await expect(bob, "presence_subscribe", a)
            assert req["from"].full == a, "subscription requests carry the bare JID (§3.1.2)"
            await wait_until(lambda: b in alice.client_roster, "roster push of the new item")
            bob.send_presence(pto=a, ptype="subscribed")
            await expect(alice, "presence_subscribed", b)
            await wait_until(lambda: alice.client_roster[b]["subscription"] == "to", "alice 'to'")
            await wait_until(lambda: bob.client_roster[a]["subscription"] == "from", "bob 'from'")
            # …and back.
            bob.send_presence(pto=a, ptype="subscribe")
            await expect(alice, "presence_subscribe", b)
            alice.send_presence(pto=b, ptype="subscribed")
            await expect(bob, "presence_subscribed", a)
            await wait_until(lambda: alice.client_roster[b]["subscription"] == "both", "alice 'both'")
            await wait_until(lambda: bob.client_roster[a]["subscription"] == "both", "bob 'both'")

            # Presence changes are seen by the contact (§4.4).
            bob.send_presence(pshow="away", pstatus="lunch")
            p = await expect(alice, "changed_status", b, lambda p: p["show"] == "away")
            assert p["status"] == "lunch" and p["from"] == bob.boundjid
            alice.send_presence(pshow="dnd")
            await expect(bob, "changed_status", a, lambda p: p["show"] == "dnd")

            body = f"hi {uuid.uuid4().hex}"
            alice.send_message(mto=b, mbody=body, mtype="chat")
            await expect_message(bob, body, alice)
            bob.send_message(mto=alice.boundjid.full, mbody=body + "!", mtype="chat")
            await expect_message(alice, body + "!", bob)

            # A second roster get still lists the contact.
            await alice.get_roster(timeout=STEP)
            assert b in alice.client_roster

            # Logout → unavailable at the contact (§4.5.2).
            await bob.close()
            bob = None
            await expect(alice, "presence_unavailable", b)
        finally:
            for c in (alice, bob):
                if c is not None:
                    await c.close()

    await asyncio.wait_for(run(), TEST_TIMEOUT)
