//! The web chat page and its files (`[http] web_client`): the page is
//! configured for our domain and WebSocket, files come only from the
//! configured directory (path traversal refused), and a missing install
//! says how to fix it.

use starling_testkit::TestServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut raw = Vec::new();
    tcp.read_to_end(&mut raw).await.unwrap();
    let out = String::from_utf8_lossy(&raw).into_owned();
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|x| x.1)
        .unwrap_or("")
        .to_owned();
    (status, body)
}

#[tokio::test]
async fn page_and_files_are_served_and_nothing_outside_the_directory() {
    let root = std::env::temp_dir().join(format!("starling-web-{}", starling_proto::random_id(8)));
    let dist = root.join("dist");
    std::fs::create_dir_all(dist.join("webfonts")).unwrap();
    std::fs::write(dist.join("converse.min.js"), "window.converse = {};").unwrap();
    std::fs::write(dist.join("webfonts/x.woff2"), "font").unwrap();
    std::fs::write(root.join("secret.txt"), "do not serve").unwrap();
    let d = dist.clone();
    let server = TestServer::start_with(move |c| c.http.web_client_dir = d).await;
    let addr = server.http_addr(false);

    let (status, page) = get(addr, "/").await;
    assert_eq!(status, 200);
    assert!(page.contains("converse.initialize"), "{page}");
    assert!(page.contains(r#"locked_domain: "localhost""#), "{page}");
    assert!(page.contains("/xmpp-websocket"), "{page}");
    let (status, js) = get(addr, "/converse/converse.min.js").await;
    assert_eq!((status, js.as_str()), (200, "window.converse = {};"));
    assert_eq!(get(addr, "/converse/webfonts/x.woff2").await.0, 200);
    assert_eq!(get(addr, "/converse/missing.js").await.0, 404);
    for bad in [
        "/converse/../secret.txt",
        "/converse/%2e%2e/secret.txt",
        "/converse/webfonts/..%2f..%2fsecret.txt",
        "/converse/.%2e/secret.txt",
        "/converse/%2fetc%2fpasswd",
    ] {
        let (status, body) = get(addr, bad).await;
        assert!(
            (400..=404).contains(&status) && !body.contains("do not serve"),
            "{bad}: {status} {body}"
        );
    }
    server.stop().await;
    let _ = std::fs::remove_dir_all(&root);
}

#[tokio::test]
async fn missing_files_get_a_page_that_says_what_to_run() {
    let server = TestServer::start_with(|c| {
        c.http.web_client_dir = std::env::temp_dir().join("starling-no-such-web-client")
    })
    .await;
    let (status, page) = get(server.http_addr(false), "/").await;
    assert_eq!(status, 503);
    assert!(page.contains("scripts/fetch-webclient.sh"), "{page}");
    server.stop().await;
}

#[tokio::test]
async fn web_client_off_serves_no_page() {
    let server = TestServer::start_with(|c| c.http.web_client = false).await;
    assert_eq!(get(server.http_addr(false), "/").await.0, 404);
    server.stop().await;
}
