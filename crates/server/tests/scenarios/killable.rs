//! The real `starling` binary for tests that kill it with SIGKILL.
#![allow(dead_code)]

use starling_proto::sasl::Mechanism;
use starling_testkit::{poll_for, Client};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_starling"))
}

pub fn add_user(cfg: &Path, jid: &str, password: &str) {
    let mut add = bin()
        .arg("--config")
        .arg(cfg)
        .args(["user", "add", jid])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    add.stdin
        .take()
        .unwrap()
        .write_all(format!("{password}\n").as_bytes())
        .unwrap();
    assert!(add.wait().unwrap().success());
}

/// Starts the binary with `cfg` and returns once it accepts connections on
/// `port` (polled for at most 10 s; an early exit fails at once).
pub async fn start_binary(cfg: &Path, port: u16) -> std::process::Child {
    let mut child = bin()
        .arg("--config")
        .arg(cfg)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let accepted = poll_for(Duration::from_secs(10), async || {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Some(());
        }
        let exited = child.try_wait().unwrap();
        assert!(
            exited.is_none(),
            "the server exited before accepting on {addr}: {exited:?}"
        );
        None
    })
    .await;
    if accepted.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(
        accepted.is_some(),
        "the server did not accept connections on {addr} within 10 s"
    );
    child
}

pub async fn connect(port: u16, user: &str, password: &str) -> Client {
    let mut c = Client::connect(format!("127.0.0.1:{port}").parse().unwrap()).await;
    c.negotiate_tls().await;
    c.auth(Mechanism::ScramSha256, user, password)
        .await
        .unwrap();
    c.bind(None).await;
    c
}

/// A server process that is killed when the test ends, also by a failed
/// assertion (an orphan would keep the test harness's pipes open).
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
