//! TLS over TCP on rustls' *unbuffered* API, so that an idle connection
//! holds no buffer.
//!
//! rustls' usual `ServerConnection` (and tokio-rustls on top of it) keeps
//! an input buffer of at least 4 KiB for the life of the connection once
//! it has read anything, which was the largest part of what an idle TLS
//! session cost over a plain one (docs/benchmarks.md, 2026-11-25 09:30).
//! Here the stream owns the buffers: encrypted input is kept only while a
//! record is incomplete, decrypted input only until the reader takes it,
//! and encrypted output only until the socket accepts it. Each is freed
//! when empty, as `XmlStream` does with its own buffers.
//!
//! The unbuffered API has no `export_keying_material`, which SCRAM's
//! `tls-exporter` channel binding (RFC 9266) needs. rustls reports the
//! TLS 1.3 exporter master secret to the config's [`KeyLog`] during the
//! handshake; [`ExporterCapture`] keeps it for the connection being
//! processed on this thread (the handshake step is synchronous), and
//! [`TlsStream::tls_exporter`] derives the binding from it as RFC 8446
//! §7.5 specifies. A test checks it against rustls' own exporter on the
//! client side.

use hmac::{Hmac, KeyInit, Mac};
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{ConnectionState, EncodeError, EncryptError, InsufficientSizeError};
use rustls::{CipherSuite, KeyLog, ProtocolVersion, ServerConfig};
use sha2::{Digest, Sha256, Sha384};
use std::cell::RefCell;
use std::future::poll_fn;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Bytes read from the socket per poll at most (on the stack).
const READ_CHUNK: usize = 8192;

/// Plaintext encrypted per `poll_write` at most.
const WRITE_CHUNK: usize = 64 * 1024;

/// Encrypted input buffered at most: a handshake flight may join records
/// into messages of up to 64 KiB (rustls' own limit); an application data
/// record is at most 16 KiB plus overhead.
const MAX_INCOMING: usize = 80 * 1024;

thread_local! {
    /// The exporter master secret rustls just reported on this thread.
    static EXPORTER_SECRET: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
    /// The tls-server-end-point hash of the certificate the SNI resolver
    /// (`tls::SniResolver`) just chose on this thread.
    static CHOSEN_CERTIFICATE: RefCell<Option<Arc<[u8]>>> = const { RefCell::new(None) };
}

/// Called by the certificate resolver during a handshake step: the
/// certificate this connection presents (its tls-server-end-point hash),
/// taken by the stream whose step is running, as the exporter secret is.
pub(crate) fn note_chosen_certificate(end_point: Arc<[u8]>) {
    CHOSEN_CERTIFICATE.with(|c| *c.borrow_mut() = Some(end_point));
}

/// The [`KeyLog`] that keeps the TLS 1.3 exporter master secret of the
/// handshake being processed on this thread, and nothing else.
#[derive(Debug, Default)]
pub struct ExporterCapture;

impl KeyLog for ExporterCapture {
    fn will_log(&self, label: &str) -> bool {
        label == "EXPORTER_SECRET"
    }

    fn log(&self, label: &str, _client_random: &[u8], secret: &[u8]) {
        if label == "EXPORTER_SECRET" {
            EXPORTER_SECRET.with(|s| *s.borrow_mut() = Some(secret.to_vec()));
        }
    }
}

/// Accepts TLS connections with one server configuration.
#[derive(Clone)]
pub struct TlsAcceptor {
    config: Arc<ServerConfig>,
}

impl TlsAcceptor {
    /// An acceptor for `config` (whose `key_log` should be
    /// [`ExporterCapture`] for [`TlsStream::tls_exporter`] to work).
    pub fn new(config: Arc<ServerConfig>) -> Self {
        TlsAcceptor { config }
    }

    /// Runs the server side of the handshake on `io`.
    pub async fn accept(&self, io: TcpStream) -> io::Result<TlsStream> {
        let conn = UnbufferedServerConnection::new(self.config.clone()).map_err(tls_error)?;
        let mut s = TlsStream {
            io,
            conn,
            incoming: Vec::new(),
            outgoing: Vec::new(),
            written: 0,
            plain: Vec::new(),
            taken: 0,
            exporter_secret: None,
            end_point: None,
            established: false,
            eof: false,
            peer_closed: false,
            close_sent: false,
        };
        poll_fn(|cx| s.poll_handshake(cx)).await?;
        Ok(s)
    }
}

/// A server-side TLS connection over TCP (see the module documentation).
pub struct TlsStream {
    io: TcpStream,
    conn: UnbufferedServerConnection,
    /// Encrypted bytes read and not yet processed.
    incoming: Vec<u8>,
    /// Encrypted bytes to send; `written` of them are sent.
    outgoing: Vec<u8>,
    written: usize,
    /// Decrypted bytes not yet read; `taken` of them are read.
    plain: Vec<u8>,
    taken: usize,
    /// TLS 1.3's exporter master secret, kept until the channel binding is
    /// derived from it.
    exporter_secret: Option<Vec<u8>>,
    /// The tls-server-end-point hash of the certificate presented (it
    /// depends on the SNI name).
    end_point: Option<Arc<[u8]>>,
    established: bool,
    /// The socket reached end of file.
    eof: bool,
    /// The peer sent close_notify.
    peer_closed: bool,
    close_sent: bool,
}

/// What one round of record processing led to.
enum Step {
    /// Something was done; process again.
    Again,
    /// More input is needed (during the handshake), or nothing is left to
    /// process (after it).
    Idle,
    /// The plaintext given was encrypted into `outgoing`.
    Encrypted,
    /// The peer closed its side cleanly.
    PeerClosed,
    /// Both sides are closed.
    Closed,
}

/// What to do when the connection can send application data.
#[derive(Clone, Copy)]
enum Send<'a> {
    Nothing,
    Data(&'a [u8]),
    CloseNotify,
}

fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// The room a record needs, when `encode` found the buffer too small.
fn encode_room(err: &EncodeError) -> Option<usize> {
    match err {
        EncodeError::InsufficientSize(InsufficientSizeError { required_size }) => {
            Some(*required_size)
        }
        _ => None,
    }
}

/// The room a record needs, when `encrypt` found the buffer too small.
fn encrypt_room(err: &EncryptError) -> Option<usize> {
    match err {
        EncryptError::InsufficientSize(InsufficientSizeError { required_size }) => {
            Some(*required_size)
        }
        _ => None,
    }
}

/// Runs `write` into the free tail of `out`, growing it to the size the
/// record needs when it is too small.
fn append<E>(
    out: &mut Vec<u8>,
    mut write: impl FnMut(&mut [u8]) -> Result<usize, E>,
    needs: impl Fn(&E) -> Option<usize>,
    what: &'static str,
) -> io::Result<()> {
    let start = out.len();
    let mut room = 512;
    loop {
        out.resize(start + room, 0);
        match write(&mut out[start..]) {
            Ok(n) => {
                out.truncate(start + n);
                return Ok(());
            }
            Err(e) => match needs(&e) {
                Some(required) if required > room => room = required,
                _ => {
                    out.truncate(start);
                    return Err(io::Error::other(what));
                }
            },
        }
    }
}

impl TlsStream {
    /// Processes buffered records once. `send` is encrypted if the
    /// connection reaches the state where application data may be sent.
    fn step(&mut self, send: Send<'_>) -> io::Result<Step> {
        // During the handshake, only a secret rustls reports during this
        // call is this connection's: clear what an earlier connection on
        // this thread may have left (one whose handshake failed midway).
        let handshaking = !self.established;
        if handshaking {
            EXPORTER_SECRET.with(|s| s.borrow_mut().take());
            CHOSEN_CERTIFICATE.with(|c| c.borrow_mut().take());
        }
        let status = self.conn.process_tls_records(&mut self.incoming);
        if handshaking {
            if let Some(secret) = EXPORTER_SECRET.with(|s| s.borrow_mut().take()) {
                self.exporter_secret = Some(secret);
            }
            if let Some(chosen) = CHOSEN_CERTIFICATE.with(|c| c.borrow_mut().take()) {
                self.end_point = Some(chosen);
            }
        }
        let mut discard = status.discard;
        let step = match status.state.map_err(tls_error)? {
            ConnectionState::ReadTraffic(mut r) => {
                while let Some(rec) = r.next_record() {
                    let rec = rec.map_err(tls_error)?;
                    discard += rec.discard;
                    if self.taken == self.plain.len() {
                        self.plain.clear();
                        self.taken = 0;
                    }
                    self.plain.extend_from_slice(rec.payload);
                }
                Step::Again
            }
            ConnectionState::EncodeTlsData(mut e) => {
                append(
                    &mut self.outgoing,
                    |buf| e.encode(buf),
                    encode_room,
                    "TLS record could not be encoded",
                )?;
                Step::Again
            }
            // The records are in `outgoing`, which is sent before any wait
            // for the peer.
            ConnectionState::TransmitTlsData(t) => {
                t.done();
                Step::Again
            }
            ConnectionState::BlockedHandshake => Step::Idle,
            ConnectionState::WriteTraffic(mut w) => {
                self.established = true;
                match send {
                    Send::Nothing => Step::Idle,
                    Send::Data(data) => {
                        append(
                            &mut self.outgoing,
                            |buf| w.encrypt(data, buf),
                            encrypt_room,
                            "TLS record could not be encrypted",
                        )?;
                        Step::Encrypted
                    }
                    Send::CloseNotify => {
                        append(
                            &mut self.outgoing,
                            |buf| w.queue_close_notify(buf),
                            encrypt_room,
                            "TLS close_notify could not be encrypted",
                        )?;
                        self.close_sent = true;
                        Step::Encrypted
                    }
                }
            }
            ConnectionState::PeerClosed => Step::PeerClosed,
            ConnectionState::Closed => Step::Closed,
            // Early data is not enabled in the configuration.
            ConnectionState::ReadEarlyData(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "unexpected TLS early data",
                ))
            }
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "unexpected TLS connection state",
                ))
            }
        };
        self.incoming.drain(..discard);
        if self.incoming.is_empty() {
            self.incoming = Vec::new();
        }
        Ok(step)
    }

    /// Reads what the socket has into `incoming`.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.incoming.len() >= MAX_INCOMING {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "TLS record too large",
            )));
        }
        let mut buf = [MaybeUninit::<u8>::uninit(); READ_CHUNK];
        let mut rb = ReadBuf::uninit(&mut buf);
        ready!(Pin::new(&mut self.io).poll_read(cx, &mut rb))?;
        if rb.filled().is_empty() {
            self.eof = true;
        } else {
            self.incoming.extend_from_slice(rb.filled());
        }
        Poll::Ready(Ok(()))
    }

    /// Sends `outgoing` to the socket; frees it once sent.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.outgoing.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.outgoing[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.outgoing = Vec::new();
        self.written = 0;
        Poll::Ready(Ok(()))
    }

    /// [`step`](Self::step); when it fails, rustls has queued an alert
    /// for the peer (handshake_failure, decode_error, …): the next step
    /// encodes it, and it is sent if the socket takes it now, so the
    /// client learns why.
    fn step_or_alert(&mut self, cx: &mut Context<'_>) -> io::Result<Step> {
        self.step(Send::Nothing).inspect_err(|_| {
            let _ = self.step(Send::Nothing);
            let _ = self.poll_send(cx);
        })
    }

    fn poll_handshake(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            match self.step_or_alert(cx)? {
                Step::Again | Step::Encrypted => {}
                Step::Idle if self.established => {
                    ready!(self.poll_send(cx))?;
                    return Poll::Ready(Ok(()));
                }
                Step::Idle => {
                    ready!(self.poll_send(cx))?;
                    if self.eof {
                        return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into()));
                    }
                    ready!(self.poll_fill(cx))?;
                }
                Step::PeerClosed | Step::Closed => {
                    return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into()));
                }
            }
        }
    }

    /// The tls-server-end-point hash (RFC 5929) of the certificate this
    /// connection presented.
    pub fn server_end_point(&self) -> Option<&[u8]> {
        self.end_point.as_deref()
    }

    /// The negotiated protocol version.
    pub fn protocol_version(&self) -> Option<ProtocolVersion> {
        self.conn.protocol_version()
    }

    /// The `tls-exporter` channel binding (RFC 9266: 32 bytes exported with
    /// the label `EXPORTER-Channel-Binding` and no context), on TLS 1.3
    /// only. The exporter secret is dropped once this is called.
    pub fn tls_exporter(&mut self) -> Option<Vec<u8>> {
        let secret = self.exporter_secret.take()?;
        if self.protocol_version() != Some(ProtocolVersion::TLSv1_3) {
            return None;
        }
        let suite = self.conn.negotiated_cipher_suite()?.suite();
        Some(tls13_export(
            suite,
            &secret,
            b"EXPORTER-Channel-Binding",
            b"",
            32,
        ))
    }
}

/// RFC 8446 §7.5: `HKDF-Expand-Label(Derive-Secret(secret, label, ""),
/// "exporter", Hash(context), len)`, with the hash of the cipher suite.
fn tls13_export(
    suite: CipherSuite,
    secret: &[u8],
    label: &[u8],
    context: &[u8],
    len: usize,
) -> Vec<u8> {
    if suite == CipherSuite::TLS13_AES_256_GCM_SHA384 {
        export_with::<Hmac<Sha384>, Sha384>(secret, label, context, len)
    } else {
        export_with::<Hmac<Sha256>, Sha256>(secret, label, context, len)
    }
}

fn export_with<M: Mac + KeyInit, H: Digest>(
    secret: &[u8],
    label: &[u8],
    context: &[u8],
    len: usize,
) -> Vec<u8> {
    let derived = expand_label::<M>(secret, label, &H::digest(b""), <H as Digest>::output_size());
    expand_label::<M>(&derived, b"exporter", &H::digest(context), len)
}

/// RFC 8446 §7.1 HKDF-Expand-Label, for outputs of at most one hash block
/// (`len` ≤ the hash's size).
fn expand_label<M: Mac + KeyInit>(
    secret: &[u8],
    label: &[u8],
    context: &[u8],
    len: usize,
) -> Vec<u8> {
    let mut mac = <M as KeyInit>::new_from_slice(secret).expect("HMAC takes any key length");
    for part in [
        &(len as u16).to_be_bytes()[..],
        &[(6 + label.len()) as u8],
        b"tls13 ",
        label,
        &[context.len() as u8],
        context,
        // HKDF-Expand's T(1) = HMAC(PRK, info || 0x01).
        &[1],
    ] {
        Mac::update(&mut mac, part);
    }
    mac.finalize().into_bytes()[..len].to_vec()
}

impl AsyncRead for TlsStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.taken < this.plain.len() {
                let n = buf.remaining().min(this.plain.len() - this.taken);
                buf.put_slice(&this.plain[this.taken..this.taken + n]);
                this.taken += n;
                if this.taken == this.plain.len() {
                    this.plain = Vec::new();
                    this.taken = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.peer_closed {
                return Poll::Ready(Ok(()));
            }
            match this.step_or_alert(cx)? {
                Step::Again | Step::Encrypted => {}
                Step::PeerClosed | Step::Closed => this.peer_closed = true,
                Step::Idle => {
                    // Post-handshake messages (a key update) may have
                    // queued records: send them if the socket takes them
                    // now, else with the next write.
                    if !this.outgoing.is_empty() {
                        if let Poll::Ready(Err(e)) = this.poll_send(cx) {
                            return Poll::Ready(Err(e));
                        }
                    }
                    if this.eof {
                        if this.incoming.is_empty() {
                            // End of file without close_notify: the end of
                            // the stream all the same for XMPP.
                            return Poll::Ready(Ok(()));
                        }
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "TLS record truncated",
                        )));
                    }
                    ready!(this.poll_fill(cx))?;
                }
            }
        }
    }
}

impl AsyncWrite for TlsStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        // Bounded output: what was encrypted earlier goes first.
        ready!(this.poll_send(cx))?;
        let data = &buf[..buf.len().min(WRITE_CHUNK)];
        loop {
            match this.step(Send::Data(data))? {
                Step::Again | Step::PeerClosed => {}
                Step::Encrypted => {
                    // Best effort now; the rest goes with the next write
                    // or flush.
                    if let Poll::Ready(Err(e)) = this.poll_send(cx) {
                        return Poll::Ready(Err(e));
                    }
                    return Poll::Ready(Ok(data.len()));
                }
                Step::Idle | Step::Closed => {
                    return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
                }
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.close_sent {
            ready!(this.poll_send(cx))?;
            // Until it is encrypted, or nothing can be sent any more.
            while let Ok(Step::Again | Step::PeerClosed) = this.step(Send::CloseNotify) {}
            this.close_sent = true;
        }
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::TlsContext;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Each message: a 4-byte length, then that many bytes; echoed back.
    async fn echo_until_eof(s: &mut TlsStream) -> usize {
        let mut rounds = 0;
        loop {
            let mut len = [0u8; 4];
            if s.read_exact(&mut len).await.is_err() {
                return rounds;
            }
            let mut data = vec![0u8; u32::from_be_bytes(len) as usize];
            s.read_exact(&mut data).await.unwrap();
            s.write_all(&len).await.unwrap();
            s.write_all(&data).await.unwrap();
            s.flush().await.unwrap();
            // The client waits for the echo: nothing is in flight, so the
            // connection holds no buffer.
            assert_eq!(
                (
                    s.incoming.capacity(),
                    s.outgoing.capacity(),
                    s.plain.capacity()
                ),
                (0, 0, 0),
                "buffers kept after {} bytes",
                data.len()
            );
            rounds += 1;
        }
    }

    /// A TLS context with a fresh self-signed certificate in a directory
    /// of its own, and a loopback listener.
    async fn setup(tag: &str) -> (std::path::PathBuf, TlsContext, tokio::net::TcpListener) {
        let dir = std::env::temp_dir().join(format!("starling-tls-{tag}-{}", std::process::id()));
        let ctx = TlsContext::load_or_generate(None, None, &dir, &["localhost".into()]).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        (dir, ctx, listener)
    }

    /// Accepts one connection and runs the server's handshake on it.
    fn handshake_once(
        ctx: TlsContext,
        listener: tokio::net::TcpListener,
    ) -> tokio::task::JoinHandle<io::Result<()>> {
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            ctx.starttls.accept(tcp).await.map(|_| ())
        })
    }

    #[tokio::test]
    async fn echoes_any_size_frees_its_buffers_and_exports_the_binding_rustls_does() {
        let (dir, ctx, listener) = setup("echo").await;
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut s = ctx.starttls.accept(tcp).await.unwrap();
            let exporter = ctx.bindings(&mut s).tls_exporter;
            let rounds = echo_until_eof(&mut s).await;
            s.shutdown().await.unwrap();
            (exporter, rounds)
        });
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut c = starling_testkit::insecure_tls_connector()
            .connect(name, tcp)
            .await
            .unwrap();
        let sizes = [1usize, 100, 5_000, 16_384, 20_000, 200_000, 7, 70_000];
        for (i, &n) in sizes.iter().enumerate() {
            if i == 6 {
                // RFC 8446 §4.6.3: the client updates its keys and asks the
                // server to update its own; both directions go on.
                c.get_mut().1.refresh_traffic_keys().unwrap();
            }
            let data: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
            c.write_all(&(n as u32).to_be_bytes()).await.unwrap();
            c.write_all(&data).await.unwrap();
            c.flush().await.unwrap();
            let mut len = [0u8; 4];
            c.read_exact(&mut len).await.unwrap();
            assert_eq!(u32::from_be_bytes(len) as usize, n);
            let mut back = vec![0u8; n];
            c.read_exact(&mut back).await.unwrap();
            assert_eq!(back, data, "{n} bytes echoed");
        }
        // RFC 9266 §2: the client's exporter with the same label and no
        // context, as rustls computes it.
        let want = c
            .get_ref()
            .1
            .export_keying_material([0u8; 32], b"EXPORTER-Channel-Binding", None)
            .unwrap()
            .to_vec();
        // close_notify: the server reads the end of the stream, then
        // closes its side, which the client reads as the end too.
        c.shutdown().await.unwrap();
        let mut rest = Vec::new();
        c.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
        let (exporter, rounds) = server.await.unwrap();
        assert_eq!(rounds, sizes.len());
        assert_eq!(exporter.as_deref(), Some(&want[..]));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn garbage_instead_of_a_handshake_is_an_error() {
        let (dir, ctx, listener) = setup("garbage").await;
        let addr = listener.local_addr().unwrap();
        let server = handshake_once(ctx, listener);
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"<stream:stream to='localhost'>\r\n\r\n")
            .await
            .unwrap();
        let r = server.await.unwrap();
        assert!(r.is_err(), "a non-TLS client is refused");
        // With a TLS alert record (content type 21, RFC 8446 §6), so a
        // client can say why.
        let mut first = [0u8; 1];
        tcp.read_exact(&mut first).await.unwrap();
        assert_eq!(first[0], 21, "an alert record");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn end_of_file_in_the_middle_of_a_record_is_an_error() {
        let (dir, ctx, listener) = setup("eof").await;
        let addr = listener.local_addr().unwrap();
        let server = handshake_once(ctx, listener);
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        // A handshake record header announcing 512 bytes, then the end.
        tcp.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
            .await
            .unwrap();
        drop(tcp);
        let r = server.await.unwrap();
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
        let _ = std::fs::remove_dir_all(dir);
    }
}
