//! Bounded polls for effects that no stanza announces (a gauge, an admin
//! listing, a file, a process): [`eventually`] and, outside a runtime,
//! [`eventually_blocking`].
//!
//! Prefer a wait on what the protocol says when there is one: the stanza
//! that results, or [`Client::barrier`](crate::Client::barrier) (a round
//! trip that everything routed to the session before it precedes). Poll
//! only what shows nowhere on a stream.

use std::time::{Duration, Instant};

/// The first pause between two polls; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(1);

/// The longest pause between two polls.
const MAX_PAUSE: Duration = Duration::from_millis(50);

/// Calls `f` until it returns `Some`, and returns that value; between
/// calls it pauses 1 ms, then twice as long each time up to 50 ms. Panics
/// with `what` (what was awaited, e.g. "the kicked session leaves the
/// listing") once `deadline` has passed since the first call and `f`
/// still answered `None`: `f` is always called at least once, and once
/// more after the deadline is reached.
///
/// ```no_run
/// # use starling_testkit::{eventually, TestServer};
/// # use std::time::Duration;
/// # async fn scenario(server: &TestServer) {
/// let storage = &server.server.env.storage;
/// let jid = starling_proto::BareJid::new("bob@localhost").unwrap();
/// let n = eventually("a message is stored for bob", Duration::from_secs(10), async || {
///     let n = storage.offline.count(&jid).await.unwrap();
///     (n > 0).then_some(n)
/// })
/// .await;
/// # }
/// ```
pub async fn eventually<T>(what: &str, deadline: Duration, f: impl AsyncFnMut() -> Option<T>) -> T {
    match poll_for(deadline, f).await {
        Some(v) => v,
        None => panic!("not within {deadline:?}: {what}"),
    }
}

/// [`eventually`] that answers `None` past the deadline instead of
/// panicking, for callers that must clean up first (a child process to
/// kill) or say more.
pub async fn poll_for<T>(deadline: Duration, mut f: impl AsyncFnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    let mut pause = FIRST_PAUSE;
    loop {
        let past = start.elapsed() >= deadline;
        if let Some(v) = f().await {
            return Some(v);
        }
        if past {
            return None;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

/// [`eventually`] for code outside an async runtime (tests that drive the
/// real binary): `f` is a plain closure and the pauses block the thread.
pub fn eventually_blocking<T>(what: &str, deadline: Duration, f: impl FnMut() -> Option<T>) -> T {
    match poll_for_blocking(deadline, f) {
        Some(v) => v,
        None => panic!("not within {deadline:?}: {what}"),
    }
}

/// [`poll_for`] outside an async runtime: `None` past the deadline.
pub fn poll_for_blocking<T>(deadline: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    let mut pause = FIRST_PAUSE;
    loop {
        let past = start.elapsed() >= deadline;
        if let Some(v) = f() {
            return Some(v);
        }
        if past {
            return None;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(MAX_PAUSE);
    }
}
