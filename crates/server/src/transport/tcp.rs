//! The byte stream under a session: plain TCP or TLS over TCP.
//!
//! Reads use a buffer that lives on the stack only for the duration of one
//! poll, so an idle session holds no read buffer at all (the largest cost
//! per idle connection after the socket itself).

use super::tls::TlsStream;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

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
