//! Plain HTTP/1.1 helpers: BOSH posts, admin API requests, response
//! parsing.

use starling_xml::{Element, Limits, StreamEvent, StreamParser};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// POSTs `body` to the BOSH endpoint (`/http-bind`, XEP-0124/0206) of the
/// HTTP listener at `addr`, one request per connection, and parses the
/// `<body/>` it answers (panics unless it is a 200 within 30 s).
pub async fn bosh_post(addr: SocketAddr, body: &str) -> Element {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(
        format!(
            "POST /http-bind HTTP/1.1\r\nHost: {addr}\r\nContent-Type: text/xml; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), tcp.read_to_end(&mut raw))
        .await
        .expect("answered in time")
        .unwrap();
    let text = String::from_utf8(raw).unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let xml = text.split_once("\r\n\r\n").unwrap().1;
    let mut p = StreamParser::for_elements(Limits::default());
    let mut input = xml.as_bytes();
    match p.push(&mut input) {
        Ok(Some(StreamEvent::Stanza(el))) => el,
        other => panic!("not a body: {other:?} in {xml}"),
    }
}

/// One HTTP/1.1 request (`Connection: close`) to `addr` with an optional
/// bearer token and JSON body, as the admin API's tests send them:
/// status, content type, body (de-chunked).
pub async fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, String, String) {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let body = body.unwrap_or("");
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(t) = token {
        req.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    if !body.is_empty() {
        req.push_str("Content-Type: application/json\r\n");
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    tcp.write_all(req.as_bytes()).await.unwrap();
    tcp.write_all(body.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let _ = tcp.read_to_end(&mut raw).await;
    let (status, headers, body) = parse_http_response(&raw);
    let content_type = headers
        .into_iter()
        .find(|(k, _)| k == "content-type")
        .map(|(_, v)| v)
        .unwrap_or_default();
    (status, content_type, body)
}

/// A whole HTTP/1.1 response as read until the server closed: status,
/// headers (names lower-cased, values trimmed), body (de-chunked).
pub fn parse_http_response(raw: &[u8]) -> (u16, Vec<(String, String)>, String) {
    let text = String::from_utf8_lossy(raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").expect("an HTTP response");
    let status: u16 = head[9..12].parse().unwrap();
    let headers: Vec<(String, String)> = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    let body = if chunked {
        let mut out = String::new();
        let mut r = rest;
        loop {
            let (size, after) = r.split_once("\r\n").unwrap();
            let size = usize::from_str_radix(size.trim(), 16).unwrap();
            if size == 0 {
                break;
            }
            out.push_str(&after[..size]);
            r = &after[size + 2..];
        }
        out
    } else {
        rest.to_owned()
    };
    (status, headers, body)
}
