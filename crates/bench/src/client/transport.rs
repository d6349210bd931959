//! The byte stream under the XML: TCP, TLS, or WebSocket (RFC 7395) framing.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// Plain or TLS transport.
pub enum Transport {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP (boxed: the rustls state is large).
    Tls(Box<TlsStream<TcpStream>>),
    /// RFC 7395 over either of the above, as a byte stream: each write is
    /// one text message (the callers write whole elements), reads return
    /// the text of the messages received.
    Ws(Box<WsIo>),
    /// XEP-0124/0206 BOSH as a byte stream (see [`crate::bosh`]).
    Bosh(Box<crate::bosh::BoshIo>),
}

/// A WebSocket seen as a byte stream (see [`Transport::Ws`]). Writes are
/// made RFC 7395-conformant here, so the scenarios can write what they
/// write on TCP: each top-level element becomes its own text message
/// (§3.3.3; ejabberd refuses a message holding several), a stanza without
/// a namespace gets `xmlns='jabber:client'` (standalone elements have no
/// stream default namespace; Prosody refuses them), and
/// `</stream:stream>` becomes `<close/>` (§3.3.2).
pub struct WsIo {
    ws: tokio_tungstenite::WebSocketStream<Transport>,
    /// Received text not yet read.
    rest: Vec<u8>,
    /// Messages accepted by `poll_write` and not yet handed to the socket.
    out: std::collections::VecDeque<String>,
}

impl WsIo {
    pub(super) fn new(ws: tokio_tungstenite::WebSocketStream<Transport>) -> WsIo {
        WsIo {
            ws,
            rest: Vec::new(),
            out: std::collections::VecDeque::new(),
        }
    }

    /// Hands queued messages to the WebSocket until it is full.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        use futures_util::Sink;
        use tokio_tungstenite::tungstenite::Message;
        while let Some(text) = self.out.pop_front() {
            match Pin::new(&mut self.ws).poll_ready(cx) {
                Poll::Pending => {
                    self.out.push_front(text);
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(io::Error::other(e))),
                Poll::Ready(Ok(())) => {}
            }
            if let Err(e) = Pin::new(&mut self.ws).start_send(Message::Text(text.into())) {
                return Poll::Ready(Err(io::Error::other(e)));
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// Splits XML written for a stream into RFC 7395 messages (see [`WsIo`]).
/// The input holds whole elements; text between them is dropped.
pub fn ws_messages(xml: &str) -> Vec<String> {
    let b = xml.as_bytes();
    let mut out = Vec::new();
    let (mut depth, mut start, mut i) = (0usize, None::<usize>, 0usize);
    // The end of the tag starting at `at` (the index of its '>'),
    // skipping quoted attribute values.
    let tag_end = |at: usize| -> Option<usize> {
        let mut quote = None;
        for (k, &c) in b.iter().enumerate().skip(at + 1) {
            match (quote, c) {
                (None, b'"' | b'\'') => quote = Some(c),
                (Some(q), _) if c == q => quote = None,
                (None, b'>') => return Some(k),
                _ => {}
            }
        }
        None
    };
    while i < b.len() {
        if b[i] != b'<' {
            i += 1;
            continue;
        }
        let Some(end) = tag_end(i) else { break };
        match b.get(i + 1) {
            Some(b'?' | b'!') => {}
            Some(b'/') => {
                if depth == 0 {
                    // The stream's own end tag.
                    out.push("<close xmlns='urn:ietf:params:xml:ns:xmpp-framing'/>".to_owned());
                } else {
                    depth -= 1;
                    if depth == 0 {
                        out.push(qualify(&xml[start.take().unwrap_or(i)..=end]));
                    }
                }
            }
            _ => {
                let self_closing = b[end - 1] == b'/';
                if depth == 0 {
                    start = Some(i);
                }
                if self_closing {
                    if depth == 0 {
                        out.push(qualify(&xml[i..=end]));
                        start = None;
                    }
                } else {
                    depth += 1;
                }
            }
        }
        i = end + 1;
    }
    out
}

/// Adds `xmlns='jabber:client'` to a stanza whose start tag has no
/// default namespace.
fn qualify(el: &str) -> String {
    let name_end = el[1..]
        .find(|c: char| c.is_whitespace() || c == '/' || c == '>')
        .map_or(el.len(), |k| k + 1);
    let name = &el[1..name_end];
    let tag_end = el.find('>').unwrap_or(el.len());
    let has_ns = el[..tag_end].contains("xmlns=");
    if has_ns || !matches!(name, "message" | "presence" | "iq") {
        return el.to_owned();
    }
    format!(
        "{} xmlns='jabber:client'{}",
        &el[..name_end],
        &el[name_end..]
    )
}

impl AsyncRead for WsIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        use futures_util::Stream;
        use tokio_tungstenite::tungstenite::Message;
        let this = self.get_mut();
        loop {
            if !this.rest.is_empty() {
                let n = this.rest.len().min(buf.remaining());
                buf.put_slice(&this.rest[..n]);
                this.rest.drain(..n);
                return Poll::Ready(Ok(()));
            }
            match Pin::new(&mut this.ws).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) | Poll::Ready(Some(Ok(Message::Close(_)))) => {
                    return Poll::Ready(Ok(()))
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(io::Error::other(e))),
                Poll::Ready(Some(Ok(Message::Text(t)))) => this.rest = t.as_bytes().to_vec(),
                Poll::Ready(Some(Ok(_))) => continue,
            }
        }
    }
}

impl AsyncWrite for WsIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        // What was accepted before goes out first (back-pressure).
        match this.drain(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Ready(Ok(())) => {}
        }
        this.out.extend(ws_messages(&String::from_utf8_lossy(buf)));
        match this.drain(cx) {
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            // Accepted: the rest is handed over by later writes or flush.
            _ => Poll::Ready(Ok(buf.len())),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        use futures_util::Sink;
        let this = self.get_mut();
        match this.drain(cx) {
            Poll::Ready(Ok(())) => {}
            other => return other,
        }
        Pin::new(&mut this.ws)
            .poll_flush(cx)
            .map_err(io::Error::other)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        use futures_util::Sink;
        let this = self.get_mut();
        match this.drain(cx) {
            Poll::Ready(Ok(())) => {}
            other => return other,
        }
        Pin::new(&mut this.ws)
            .poll_close(cx)
            .map_err(io::Error::other)
    }
}

impl AsyncRead for Transport {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Transport::Ws(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Transport::Bosh(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Transport {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Transport::Ws(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Transport::Bosh(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_flush(cx),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Transport::Ws(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Transport::Bosh(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Transport::Ws(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Transport::Bosh(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod ws_tests {
    use super::ws_messages;

    /// RFC 7395 §3.3.3: one element per message, stanzas qualified;
    /// §3.3.2: the stream end is `<close/>`.
    #[test]
    fn writes_become_one_qualified_element_per_message() {
        let m = ws_messages(
            "<message to='a@b' type='chat'><body>x &gt; y, a/b</body></message>\
             <r xmlns='urn:xmpp:sm:3'/><presence/>\
             <iq xmlns='jabber:client' type='get' id='1'><ping xmlns='urn:xmpp:ping'/></iq>\
             <message to='c@d' id='q\"&apos;>'/></stream:stream>",
        );
        assert_eq!(
            m,
            [
                "<message xmlns='jabber:client' to='a@b' type='chat'><body>x &gt; y, a/b</body></message>",
                "<r xmlns='urn:xmpp:sm:3'/>",
                "<presence xmlns='jabber:client'/>",
                "<iq xmlns='jabber:client' type='get' id='1'><ping xmlns='urn:xmpp:ping'/></iq>",
                "<message xmlns='jabber:client' to='c@d' id='q\"&apos;>'/>",
                "<close xmlns='urn:ietf:params:xml:ns:xmpp-framing'/>",
            ]
        );
        let open =
            "<open xmlns='urn:ietf:params:xml:ns:xmpp-framing' to='localhost' version='1.0'/>";
        assert_eq!(ws_messages(open), [open]);
    }
}
