//! Hand-made RFC 6455 WebSocket upgrades and frames, for tests that write
//! what a WebSocket library would not.

use crate::TIMEOUT;
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Upgrades a plain TCP connection to the RFC 7395 endpoint of the HTTP
/// listener at `addr` (`xmpp` subprotocol) by hand, for tests that write
/// frames a WebSocket library would not (floods that never read,
/// unfinished fragments). `buffers` sets the socket's kernel send and
/// receive buffers first (small ones make a stalled peer visible sooner).
/// Returns the socket after the `101` response; the stream is not opened.
pub async fn raw_websocket(addr: SocketAddr, buffers: Option<u32>) -> TcpStream {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .expect("socket");
    if let Some(n) = buffers {
        socket.set_send_buffer_size(n).expect("SO_SNDBUF");
        socket.set_recv_buffer_size(n).expect("SO_RCVBUF");
    }
    let mut tcp = socket.connect(addr).await.expect("connect");
    tcp.write_all(
        format!(
            "GET /xmpp-websocket HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: xmpp\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .expect("write");
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        let n = tokio::time::timeout(TIMEOUT, tcp.read(&mut b))
            .await
            .expect("upgrade answered in time")
            .expect("read");
        assert_eq!(n, 1, "connection closed during the upgrade: {head:?}");
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    // RFC 6455 §1.3's example key and its answer.
    assert!(
        head.contains("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
        "Sec-WebSocket-Accept: {head}"
    );
    tcp
}

/// The header of a masked client frame (RFC 6455 §5.2) announcing `len`
/// payload bytes, with a zero masking key so the payload can be written
/// as is (and in as many pieces as wanted).
pub fn ws_frame_header(fin: bool, opcode: u8, len: u64) -> Vec<u8> {
    let mut h = vec![if fin { 0x80 } else { 0 } | (opcode & 0x0f)];
    match len {
        0..=125 => h.push(0x80 | len as u8),
        126..=0xffff => {
            h.push(0x80 | 126);
            h.extend_from_slice(&(len as u16).to_be_bytes());
        }
        _ => {
            h.push(0x80 | 127);
            h.extend_from_slice(&len.to_be_bytes());
        }
    }
    h.extend_from_slice(&[0, 0, 0, 0]);
    h
}

/// A whole masked client frame carrying `payload`.
pub fn ws_frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = ws_frame_header(fin, opcode, payload.len() as u64);
    f.extend_from_slice(payload);
    f
}
