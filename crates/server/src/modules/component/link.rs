//! One component's connection (XEP-0114 §3–§4): the listener's accept
//! loop, the stream header and handshake, and the connection task that
//! reads the component's stanzas and writes the ones queued for it. The
//! module's configuration, its service per domain and the hub of
//! connections are in `mod.rs`.

use super::*;

/// Our stream header (XEP-0114 §3, `jabber:component:accept`): `from` the
/// component's domain (none when its header named no domain we serve), no
/// `version`.
fn stream_header(id: &str, from: Option<&str>) -> String {
    // A configured domain; escaped all the same.
    let from = from
        .map(|f| {
            let f = f
                .replace('&', "&amp;")
                .replace('\'', "&apos;")
                .replace('<', "&lt;");
            format!(" from='{f}'")
        })
        .unwrap_or_default();
    format!(
        "<?xml version='1.0'?><stream:stream \
         xmlns:stream='http://etherx.jabber.org/streams' \
         xmlns='jabber:component:accept' id='{id}'{from}>"
    )
}

/// Accepts component connections until shutdown (`crate::listen`).
pub(super) async fn accept_loop(hub: Arc<Hub>, listener: TcpListener, tasks: mpsc::Sender<()>) {
    let stop = hub.stop.subscribe();
    let keepalive = Some(Duration::from_secs(60));
    crate::listen::accept_loop(listener, NAME, &hub.door, keepalive, Some(stop), |conn| {
        // Over a limit the connection was closed at once, counted and
        // logged by the gate.
        let Ok(conn) = conn else { return };
        let Some(env) = hub.env.get().and_then(Weak::upgrade) else {
            return;
        };
        tokio::spawn(run(
            hub.clone(),
            env,
            conn.tcp,
            conn.peer,
            conn.ticket,
            tasks.clone(),
        ));
    })
    .await
}

/// How a component stream ends.
#[derive(Debug)]
enum Exit {
    /// With this stream error.
    Error(StreamError),
    /// The component closed its stream: ours is closed too.
    Closed,
    /// The connection is gone (closed, failed, or a write timed out).
    Io(IoEnd),
}

impl Exit {
    fn error(c: StreamErrorCondition, text: impl Into<String>) -> Exit {
        Exit::Error(StreamError::with_text(c, text))
    }

    /// The `reason` of the "component disconnected" log line.
    fn reason(&self) -> String {
        match self {
            Exit::Error(e) => e.condition.as_str().to_owned(),
            Exit::Closed => "closed by the component".into(),
            Exit::Io(IoEnd::WriteTimeout) => "write timeout: the component stopped reading".into(),
            Exit::Io(end) => format!("{end:?}"),
        }
    }
}

/// One component connection: its task owns the socket.
struct Link {
    hub: Arc<Hub>,
    env: Arc<Env>,
    conn: Connection,
    peer: SocketAddr,
    stream_id: String,
    /// The component named by the stream header.
    slot: Option<Arc<Slot>>,
    /// After a successful handshake: its registry id and its mailbox.
    live: Option<(u64, Mailbox)>,
}

/// What woke the connection task.
enum Wake {
    Stop,
    NegotiationTimeout,
    Mail(SessionMsg),
    Read(Result<(), IoEnd>),
    Governor,
}

/// Runs one component connection to its end.
async fn run(
    hub: Arc<Hub>,
    env: Arc<Env>,
    tcp: TcpStream,
    peer: SocketAddr,
    _ticket: Ticket,
    _task: mpsc::Sender<()>,
) {
    let conn = Connection::Stream(XmlStream::new(
        Transport::Plain(tcp),
        hub.limits,
        hub.read_limits,
    ));
    let mut stop = hub.stop.subscribe();
    let mut link = Box::new(Link {
        hub,
        env,
        conn,
        peer,
        stream_id: random_id(16),
        slot: None,
        live: None,
    });
    tracing::debug!(module = NAME, %peer, "component connection");
    let exit = link.serve(&mut stop).await;
    link.finish(exit).await;
}

impl Link {
    async fn serve(&mut self, stop: &mut watch::Receiver<bool>) -> Exit {
        let negotiation_deadline = Instant::now() + self.hub.negotiation_timeout;
        loop {
            // Everything read so far, in order.
            loop {
                match self.conn.next_event() {
                    Err(e) => return Exit::Error(e),
                    Ok(None) => break,
                    Ok(Some(ev)) => {
                        if let Err(exit) = self.on_event(ev).await {
                            return exit;
                        }
                    }
                }
            }
            if let Err(end) = self.conn.flush(self.hub.write_timeout).await {
                return Exit::Io(end);
            }
            let governor = self.conn.deadline().map(Instant::from_std);
            let can_read = self.conn.can_read();
            let wake = {
                let mail = async {
                    match &self.live {
                        Some((_, mb)) => mb.recv().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => Wake::Stop,
                    _ = sleep_until(negotiation_deadline), if self.live.is_none() => Wake::NegotiationTimeout,
                    m = mail => Wake::Mail(m),
                    r = self.conn.read(), if can_read => Wake::Read(r),
                    _ = sleep_until(governor.unwrap_or(negotiation_deadline)), if governor.is_some() => Wake::Governor,
                }
            };
            match wake {
                Wake::Stop => {
                    return Exit::error(
                        StreamErrorCondition::SystemShutdown,
                        "the server is shutting down",
                    )
                }
                Wake::NegotiationTimeout => {
                    return Exit::error(
                        StreamErrorCondition::ConnectionTimeout,
                        format!(
                            "no successful handshake within {} s",
                            self.hub.negotiation_timeout.as_secs()
                        ),
                    )
                }
                Wake::Mail(m) => {
                    if let Err(exit) = self.on_mail(m) {
                        return exit;
                    }
                    // Whatever else waits goes out with the same flush.
                    for _ in 1..WRITE_BATCH {
                        let Some(m) = self.live.as_ref().and_then(|(_, mb)| mb.try_recv()) else {
                            break;
                        };
                        if let Err(exit) = self.on_mail(m) {
                            return exit;
                        }
                    }
                }
                Wake::Read(Err(end)) => return Exit::Io(end),
                Wake::Read(Ok(())) => {}
                Wake::Governor => self.conn.on_deadline(std::time::Instant::now()),
            }
        }
    }

    async fn on_event(&mut self, ev: Inbound) -> Result<(), Exit> {
        match ev {
            Inbound::Open(h) => self.on_header(&h),
            Inbound::Close => Err(Exit::Closed),
            Inbound::Element(el) if el.is("error", ns::STREAMS) => {
                let domain = self.slot.as_ref().map(|s| &s.domain);
                let error = el.to_string_in(ns::STREAMS);
                if self.live.is_some() {
                    tracing::info!(module = NAME, peer = %self.peer, domain = ?domain, error = %error, "the component sent a stream error");
                } else {
                    starling_core::log_throttled!(info, module = NAME, peer = %self.peer, domain = ?domain, error = %error, "the component sent a stream error");
                }
                Err(Exit::Closed)
            }
            Inbound::Element(el) if self.live.is_none() => self.on_handshake(el).await,
            Inbound::Element(el) => self.on_stanza(el).await,
        }
    }

    /// XEP-0114 §3: the component's stream header names its domain.
    fn on_header(&mut self, h: &StreamHeader) -> Result<(), Exit> {
        let to = h.attr("to");
        let slot = to
            .and_then(normalized_domain)
            .and_then(|d| self.hub.slot(&d).cloned());
        // Our header whatever the outcome (RFC 6120 §4.9.1.2, XEP-0114 §3).
        let header = stream_header(&self.stream_id, slot.as_ref().map(|s| s.domain.as_str()));
        self.conn.open_stream_with(header.as_bytes());
        if h.default_ns.as_deref() != Some(NS_COMPONENT_ACCEPT) {
            return Err(Exit::error(
                StreamErrorCondition::InvalidNamespace,
                "a component stream's default namespace is jabber:component:accept",
            ));
        }
        let Some(to) = to else {
            return Err(Exit::error(
                StreamErrorCondition::ImproperAddressing,
                "the stream header needs a 'to' naming the component's domain",
            ));
        };
        let Some(slot) = slot else {
            return Err(Exit::error(
                StreamErrorCondition::HostUnknown,
                format!("{to} is not a configured component"),
            ));
        };
        self.slot = Some(slot);
        Ok(())
    }

    /// XEP-0114 §3: `<handshake>` with hex(SHA-1(stream id + secret)).
    async fn on_handshake(&mut self, el: Element) -> Result<(), Exit> {
        let slot = self.slot.clone().ok_or_else(|| {
            Exit::error(StreamErrorCondition::NotAuthorized, "stream header first")
        })?;
        if !el.is("handshake", NS_COMPONENT_ACCEPT) {
            return Err(Exit::error(
                StreamErrorCondition::NotAuthorized,
                "authenticate with <handshake/> first",
            ));
        }
        let supplied = el.text();
        let matches = el.children().next().is_none()
            && slot
                .secret
                .as_deref()
                .is_some_and(|s| handshake_matches(&self.stream_id, s, &supplied));
        if !matches {
            return Err(Exit::error(
                StreamErrorCondition::NotAuthorized,
                "the handshake does not match the secret",
            ));
        }
        // Prosody's default (kick_new): the connected component stays and
        // the newcomer is refused — after its handshake, so only a holder
        // of the secret learns that the component is connected.
        let id = self.hub.next_id.fetch_add(1, Ordering::Relaxed);
        let (handle, mb) = mailbox(id, self.hub.mailbox_size, self.hub.mailbox_bytes);
        {
            let mut local = slot.local.lock().unwrap_or_else(|e| e.into_inner());
            if local.is_some() {
                return Err(Exit::error(
                    StreamErrorCondition::Conflict,
                    format!("the component {} is already connected", slot.domain),
                ));
            }
            if let Some(e) = self.env.sessions.get(&slot.jid) {
                if e.session.node != self.hub.node {
                    return Err(Exit::error(
                        StreamErrorCondition::Conflict,
                        format!(
                            "the component {} is already connected (to cluster node {})",
                            slot.domain, e.session.node
                        ),
                    ));
                }
            }
            *local = Some(handle.clone());
        }
        // The registry entry: the conflict check above on every node, and
        // where the other nodes send its stanzas.
        // One JID per component: the per-account resource limit is moot.
        let _ = self
            .env
            .router
            .bind(&self.env, &slot.jid, handle, usize::MAX)
            .await;
        self.live = Some((id, mb));
        self.hub.metrics.connected.inc();
        self.conn
            .send(&Element::new("handshake", NS_COMPONENT_ACCEPT));
        tracing::info!(module = NAME, domain = %slot.domain, peer = %self.peer, session = id, "component connected");
        Ok(())
    }

    /// XEP-0114 §3: a stanza from the authenticated component.
    async fn on_stanza(&mut self, mut el: Element) -> Result<(), Exit> {
        let slot = self
            .slot
            .clone()
            .expect("authenticated: the header named it");
        if el.ns() != NS_COMPONENT_ACCEPT || !matches!(el.name(), "message" | "presence" | "iq") {
            if el.is("handshake", NS_COMPONENT_ACCEPT) {
                return Ok(()); // a second one: nothing to do
            }
            return Err(Exit::error(
                StreamErrorCondition::UnsupportedStanzaType,
                format!("unknown element {{{}}}{}", el.ns(), el.name()),
            ));
        }
        self.hub.metrics.stanzas_in.inc();
        // 'from' is required and in the component's domain; it may name
        // any JID there.
        let from = match el.attr("from").map(Jid::new) {
            None => {
                return Err(Exit::error(
                    StreamErrorCondition::ImproperAddressing,
                    "stanzas from a component need a 'from' (XEP-0114 §3)",
                ))
            }
            Some(Err(e)) => {
                return Err(Exit::error(
                    StreamErrorCondition::ImproperAddressing,
                    format!("malformed 'from': {e}"),
                ))
            }
            Some(Ok(j)) => j,
        };
        if from.domain().as_str() != slot.domain {
            return Err(Exit::error(
                StreamErrorCondition::InvalidFrom,
                format!("{from} is not in the component's domain {}", slot.domain),
            ));
        }
        to_client_ns(&mut el);
        let (name, id, ty) = (
            el.name().to_owned(),
            el.attr("id").map(str::to_owned),
            el.attr("type").map(str::to_owned),
        );
        if el.attr("to").is_none() {
            // As Prosody does: answered, the stream goes on.
            self.error_to_component(
                &name,
                id.as_deref(),
                ty.as_deref(),
                &from,
                StanzaError::new(StanzaErrorCondition::BadRequest)
                    .with_text("stanzas from a component need a 'to' (XEP-0114 §3)"),
            );
            return Ok(());
        }
        let stanza = match Stanza::from_element(el) {
            Ok(s) => s,
            Err(StanzaParseError::MalformedTo(why)) => {
                self.error_to_component(
                    &name,
                    id.as_deref(),
                    ty.as_deref(),
                    &from,
                    StanzaError::new(StanzaErrorCondition::JidMalformed).with_text(why),
                );
                return Ok(());
            }
            Err(StanzaParseError::BadIq) => {
                self.error_to_component(
                    &name,
                    id.as_deref(),
                    ty.as_deref(),
                    &from,
                    StanzaError::new(StanzaErrorCondition::BadRequest)
                        .with_text("an iq needs an id and a type of get, set, result or error"),
                );
                return Ok(());
            }
            Err(e) => {
                return Err(Exit::error(
                    StreamErrorCondition::ImproperAddressing,
                    e.to_string(),
                ))
            }
        };
        self.env.metrics.stanza_in(stanza.kind());
        self.env.route(stanza).await;
        Ok(())
    }

    /// Writes an error about a stanza that could not be routed back to
    /// the component (from the server's first domain), unless it was an
    /// error or an iq result.
    fn error_to_component(
        &mut self,
        name: &str,
        id: Option<&str>,
        ty: Option<&str>,
        to: &Jid,
        err: StanzaError,
    ) {
        if ty == Some("error") || (name == "iq" && ty == Some("result")) {
            return;
        }
        let mut reply = Element::new(name, ns::CLIENT);
        reply.set_attr("type", "error");
        if let Some(id) = id {
            reply.set_attr("id", id);
        }
        reply.set_attr("to", to.as_str());
        if let Some(server) = self.env.hosts.list().into_iter().next() {
            reply.set_attr("from", server);
        }
        reply.append_child(err.to_element());
        self.conn.send(&reply);
    }

    /// A message of the component's mailbox.
    fn on_mail(&mut self, msg: SessionMsg) -> Result<(), Exit> {
        match msg {
            SessionMsg::Stanza(s) => {
                self.conn.send_stanza(&s);
                self.hub.metrics.stanzas_out.inc();
                self.env.metrics.stanza_out(s.kind());
                Ok(())
            }
            // The registry settled two connections of one domain on two
            // nodes at once: this one lost.
            SessionMsg::Close(CloseReason::Replaced) => Err(Exit::error(
                StreamErrorCondition::Conflict,
                "another connection of this component replaced this one",
            )),
            SessionMsg::Close(CloseReason::Error(e)) => Err(Exit::Error(*e)),
            SessionMsg::Attach(_) | SessionMsg::Notify(_) => Ok(()),
        }
    }

    /// Leaves the registry (first: once the component sees its stream
    /// close, the domain is free for its next connection), closes the
    /// stream as `exit` says, and answers for what was still queued.
    async fn finish(mut self: Box<Self>, exit: Exit) {
        let close_timeout = self.hub.write_timeout.min(Duration::from_secs(5));
        let domain = self.slot.as_ref().map(|s| s.domain.clone());
        let was_live = self.live.is_some();
        let mut queued = None;
        if let (Some((id, mb)), Some(slot)) = (self.live.take(), self.slot.clone()) {
            {
                let mut local = slot.local.lock().unwrap_or_else(|e| e.into_inner());
                if local.as_ref().is_some_and(|h| h.id == id) {
                    *local = None;
                }
            }
            mb.close();
            self.env.sessions.unregister(&slot.jid, id);
            self.hub.metrics.connected.dec();
            tracing::info!(module = NAME, domain = %slot.domain, peer = %self.peer, session = id, reason = %exit.reason(), "component disconnected");
            queued = Some((slot, mb));
        }
        match &exit {
            Exit::Error(e) => {
                let header = stream_header(&self.stream_id, domain.as_deref());
                self.conn.open_stream_with(header.as_bytes());
                self.env.metrics.stream_errors.inc();
                if !was_live {
                    self.hub.metrics.refused.inc();
                }
                let text = e.text.as_deref().unwrap_or("");
                if was_live {
                    tracing::info!(module = NAME, peer = %self.peer, domain = ?domain,
                        condition = %e.condition, text, "closing component stream with error");
                } else {
                    // Before the handshake anyone who reaches the port
                    // can cause it: throttled, counted by the metric.
                    starling_core::log_throttled!(info, module = NAME, peer = %self.peer, domain = ?domain,
                        condition = %e.condition, text, "closing component stream with error");
                }
                self.conn.close(Closing::Error(e), close_timeout).await;
            }
            Exit::Closed => self.conn.close(Closing::Close, close_timeout).await,
            Exit::Io(_) => self.conn.discard_output(),
        }
        if let Some((slot, mb)) = queued {
            while let Some(msg) = mb.try_recv() {
                if let SessionMsg::Stanza(s) = msg {
                    not_connected(&self.env, &slot.domain, *s).await;
                }
            }
        }
    }
}

/// Moves the elements of `jabber:component:accept` in `el` (the stanza and
/// its core children: body, subject, thread, error…) to `jabber:client`,
/// the namespace the rest of the server reads stanzas in. Elements of
/// other namespaces (payloads, a forwarded `jabber:client` message) stay
/// as they are. The way out needs no such step: a `jabber:client` element
/// written into the component's stream carries no `xmlns` and so takes
/// the stream's default namespace.
fn to_client_ns(el: &mut Element) {
    if el.ns() == NS_COMPONENT_ACCEPT {
        let mut moved = Element::new(el.name(), ns::CLIENT);
        for (k, v) in el.attrs() {
            moved.set_attr(k, v);
        }
        *moved.nodes_mut() = std::mem::take(el.nodes_mut());
        *el = moved;
    }
    for n in el.nodes_mut() {
        if let Node::Element(child) = n {
            to_client_ns(child);
        }
    }
}

/// XEP-0114 §3: the handshake is the lowercase hex SHA-1 of the stream id
/// followed by the secret; compared in constant time (upper-case hex is
/// accepted, surrounding whitespace ignored).
fn handshake_matches(stream_id: &str, secret: &str, supplied: &str) -> bool {
    use sha1::Digest as _;
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = sha1::Sha1::digest(format!("{stream_id}{secret}").as_bytes());
    let mut expected = [0u8; 40];
    for (i, b) in digest.iter().enumerate() {
        expected[2 * i] = HEX[usize::from(b >> 4)];
        expected[2 * i + 1] = HEX[usize::from(b & 0xf)];
    }
    let supplied = supplied.trim().to_ascii_lowercase();
    constant_time_eq(&expected, supplied.as_bytes())
}

/// Equal slices, in time that depends only on their lengths.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y));
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// XEP-0114 §3's algorithm: hex SHA-1 of the id, then the secret.
    #[test]
    fn component_handshake_is_lowercase_hex_sha1_of_id_and_secret() {
        use sha1::Digest as _;
        let hex: String = sha1::Sha1::digest(b"abcsecret")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert!(handshake_matches("abc", "secret", &hex));
        assert!(handshake_matches("abc", "secret", &hex.to_uppercase()));
        assert!(handshake_matches("abc", "secret", &format!(" {hex}\n")));
        assert!(!handshake_matches("abd", "secret", &hex));
        assert!(!handshake_matches("abc", "secreT", &hex));
        assert!(!handshake_matches("abc", "secret", &hex[..39]));
        assert!(!handshake_matches("abc", "secret", ""));
    }

    #[test]
    fn component_elements_move_to_jabber_client_but_payloads_stay() {
        let mut m = Element::builder("message", NS_COMPONENT_ACCEPT)
            .attr("to", "a@b")
            .append(
                Element::builder("body", NS_COMPONENT_ACCEPT)
                    .text("hi")
                    .build(),
            )
            .append(
                Element::builder("forwarded", "urn:xmpp:forward:0")
                    .append(Element::new("message", ns::CLIENT))
                    .build(),
            )
            .build();
        to_client_ns(&mut m);
        assert!(m.is("message", ns::CLIENT));
        assert_eq!(m.attr("to"), Some("a@b"));
        assert_eq!(
            m.get_child("body", ns::CLIENT).map(|b| b.text()),
            Some("hi".into())
        );
        let fwd = m.get_child("forwarded", "urn:xmpp:forward:0").unwrap();
        assert!(fwd.has_child("message", ns::CLIENT));
        // Written into the component's stream: no xmlns on jabber:client.
        let out = m.to_string_in(ns::CLIENT);
        assert!(
            out.starts_with("<message to='a@b'><body>hi</body>"),
            "{out}"
        );
    }
}
