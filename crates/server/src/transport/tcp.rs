//! The byte stream under a session: plain TCP or TLS over TCP.
//!
//! Reads use a buffer that lives on the stack only for the duration of one
//! poll, so an idle session holds no read buffer at all (the largest cost
//! per idle connection after the socket itself).

use super::tls::TlsStream;
use std::io;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// Binds a listening socket with SO_REUSEADDR and an accept queue of
/// `backlog`; `[::]` listens on both IP stacks whatever the host's
/// bindv6only default, and falls back to `0.0.0.0` (with a log line) on a
/// host without IPv6. Every listener of the server (c2s, HTTP, the
/// component and SOCKS5 ports) binds here. The error names the address
/// that failed.
pub(crate) fn bind(addr: SocketAddr, backlog: u32) -> Result<TcpListener, (SocketAddr, io::Error)> {
    fn bind_one(addr: SocketAddr, backlog: u32) -> io::Result<TcpListener> {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        if addr.is_ipv6() && addr.ip().is_unspecified() {
            socket2::SockRef::from(&socket).set_only_v6(false)?;
        }
        socket.bind(addr)?;
        socket.listen(backlog)
    }
    let no_ipv6 = |e: &io::Error| {
        // EAFNOSUPPORT (97 on Linux) or EADDRNOTAVAIL: no IPv6 stack here.
        e.raw_os_error() == Some(97) || e.kind() == io::ErrorKind::AddrNotAvailable
    };
    match bind_one(addr, backlog) {
        Err(e) if addr.is_ipv6() && addr.ip().is_unspecified() && no_ipv6(&e) => {
            let v4 = SocketAddr::from(([0, 0, 0, 0], addr.port()));
            tracing::warn!(address = %addr, fallback = %v4, error = %e, "IPv6 is not available on this host; listening on IPv4 only");
            bind_one(v4, backlog).map_err(|e| (v4, e))
        }
        r => r.map_err(|e| (addr, e)),
    }
}

/// The wait between failed accepts: 5 ms, doubling up to 1 s, back to
/// 5 ms after a success.
pub(crate) struct AcceptBackoff(Duration);

impl Default for AcceptBackoff {
    fn default() -> Self {
        AcceptBackoff(Duration::from_millis(5))
    }
}

/// The next connection of `listener`, with the peer's address canonical
/// (an IPv4-mapped IPv6 address becomes the IPv4 one). While accepting
/// fails (out of file descriptors, say) it backs off instead of spinning;
/// `what` names the listener in the log.
pub(crate) async fn accept(
    listener: &TcpListener,
    backoff: &mut AcceptBackoff,
    what: &str,
) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok((tcp, peer)) => {
                *backoff = AcceptBackoff::default();
                // On a dual-stack `[::]` listener an IPv4 client comes as
                // `::ffff:a.b.c.d`: everything downstream (loopback
                // checks, per-address limits, logs) sees `a.b.c.d`.
                return (tcp, SocketAddr::new(peer.ip().to_canonical(), peer.port()));
            }
            Err(e) => {
                tracing::warn!(listener = what, error = %e, "accept failed; backing off");
                tokio::time::sleep(backoff.0).await;
                backoff.0 = (backoff.0 * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// TCP keepalive on an accepted connection: probes after `idle` without
/// traffic, then every quarter of it (at least 1 s), 4 of them, so a
/// vanished peer is noticed below the protocol.
pub(crate) fn set_keepalive(tcp: &TcpStream, idle: Duration) {
    let ka = socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval(Duration::from_secs((idle.as_secs() / 4).max(1)))
        .with_retries(4);
    if let Err(e) = socket2::SockRef::from(tcp).set_tcp_keepalive(&ka) {
        tracing::debug!(error = %e, "cannot set TCP keepalive");
    }
}

/// Bytes read per poll at most.
const READ_CHUNK: usize = 8192;

/// A client connection.
pub enum Transport {
    /// Plain TCP (before STARTTLS, or when TLS is not required).
    Plain(TcpStream),
    /// TLS (after STARTTLS, or direct TLS). Boxed: a rustls connection is
    /// large and the enum should not make plain sessions pay for it.
    Tls(Box<TlsStream>),
    /// Transient state while upgrading to TLS.
    Upgrading,
}

impl Transport {
    /// Reads whatever is available (at most [`READ_CHUNK`] bytes). An empty
    /// vector means end of stream.
    pub async fn read_chunk(&mut self) -> io::Result<Vec<u8>> {
        std::future::poll_fn(|cx| {
            let mut buf = [MaybeUninit::<u8>::uninit(); READ_CHUNK];
            let mut rb = ReadBuf::uninit(&mut buf);
            match Pin::new(&mut *self).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) => Poll::Ready(Ok(rb.filled().to_vec())),
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            }
        })
        .await
    }
}

fn upgrading() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "transport is being upgraded")
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
            Transport::Upgrading => Poll::Ready(Err(upgrading())),
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
            Transport::Upgrading => Poll::Ready(Err(upgrading())),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_flush(cx),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Transport::Upgrading => Poll::Ready(Err(upgrading())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Transport::Upgrading => Poll::Ready(Ok(())),
        }
    }
}
