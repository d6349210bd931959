//! Keeping an account's messages in order while a closing session hands
//! its stanzas back to the router.
//!
//! When a session ends (its connection lost without stream management, a
//! detached session's resumption timeout, a conflict), what it still
//! holds — stanzas written but never acknowledged (XEP-0198 §4) and
//! stanzas queued in its mailbox — goes back to the router: to another
//! resource, or to offline storage. The session leaves the session table
//! first, so from that moment new messages for the account are routed
//! without it, and could reach the other resource or the offline store
//! *before* the older ones being handed back: a client would then receive
//! its messages out of order.
//!
//! The gate closes that window. A closing session calls
//! [`HandoverGate::begin`] *before* it leaves the table and runs its
//! hand-back inside [`HandoverGate::scope`]; the router calls
//! [`HandoverGate::wait`] before it picks where a message for an account
//! goes, so a message routed by anyone else while the hand-back runs
//! waits for it (a few offline writes). Stanzas routed from inside the
//! scope (the hand-back itself, and whatever it triggers) do not wait.
//! Two sessions of one account closing at once hand back one after the
//! other. With no hand-back in progress, `wait` is one atomic load.

use starling_proto::BareJid;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;

/// The longest a message waits for a hand-back.
pub const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

tokio::task_local! {
    /// The account whose hand-back the current task runs.
    static HANDING_BACK: BareJid;
}

/// Accounts whose closing session is handing stanzas back.
#[derive(Default)]
pub struct HandoverGate {
    active: AtomicUsize,
    owners: Mutex<HashMap<BareJid, Arc<Notify>>>,
}

/// Ends a hand-back when dropped; messages waiting for it go on.
#[must_use = "the hand-back ends when the guard is dropped"]
pub struct HandoverGuard<'a> {
    gate: &'a HandoverGate,
    owner: BareJid,
}

impl HandoverGate {
    /// A gate with no hand-back in progress.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<BareJid, Arc<Notify>>> {
        self.owners.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a hand-back for `owner`, after any other one for the same
    /// account has ended.
    pub async fn begin(&self, owner: &BareJid) -> HandoverGuard<'_> {
        loop {
            let waiting = {
                let mut owners = self.lock();
                match owners.get(owner) {
                    // Created under the lock: the guard's notify_waiters
                    // (after its removal under it) cannot be missed.
                    Some(n) => n.clone().notified_owned(),
                    None => {
                        owners.insert(owner.clone(), Arc::new(Notify::new()));
                        self.active.fetch_add(1, Ordering::AcqRel);
                        return HandoverGuard {
                            gate: self,
                            owner: owner.clone(),
                        };
                    }
                }
            };
            waiting.await;
        }
    }

    /// Runs `work` as the hand-back of `owner`: what it routes for that
    /// account does not wait for the hand-back (itself).
    pub async fn scope<F: Future>(owner: BareJid, work: F) -> F::Output {
        HANDING_BACK.scope(owner, work).await
    }

    /// What to await while a hand-back of `owner` runs (`None`: none
    /// does). Created under the lock: the guard's notify_waiters (after
    /// its removal under it) cannot be missed.
    fn running(&self, owner: &BareJid) -> Option<OwnedNotified> {
        self.lock().get(owner).map(|n| n.clone().notified_owned())
    }

    /// Waits while a session of `owner` hands stanzas back, unless the
    /// calling task is that hand-back; at most [`MAX_WAIT`] (a safety
    /// valve: order is given up rather than risk a stall).
    pub async fn wait(&self, owner: &BareJid) {
        if self.active.load(Ordering::Acquire) == 0 {
            return;
        }
        if HANDING_BACK.try_with(|o| o == owner).unwrap_or(false) {
            return;
        }
        // Only an account with a hand-back running arms a timer: the
        // others (during a shutdown, every account's) go on at once.
        let Some(first) = self.running(owner) else {
            return;
        };
        let held = async {
            let mut notified = first;
            loop {
                notified.await;
                match self.running(owner) {
                    Some(next) => notified = next,
                    None => return,
                }
            }
        };
        if tokio::time::timeout(MAX_WAIT, held).await.is_err() {
            tracing::warn!(account = %owner, "a closing session's hand-back took longer than {} s; routing a newer message without waiting for it", MAX_WAIT.as_secs());
        }
    }
}

impl Drop for HandoverGuard<'_> {
    fn drop(&mut self) {
        let n = self.gate.lock().remove(&self.owner);
        self.gate.active.fetch_sub(1, Ordering::AcqRel);
        if let Some(n) = n {
            n.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn jid(s: &str) -> BareJid {
        BareJid::new(s).unwrap()
    }

    #[tokio::test]
    async fn others_wait_for_a_hand_back_but_the_hand_back_itself_does_not() {
        let gate = Arc::new(HandoverGate::new());
        let alice = jid("alice@example.org");
        // Nothing in progress: no wait.
        tokio::time::timeout(Duration::from_millis(50), gate.wait(&alice))
            .await
            .expect("no hand-back: no wait");
        let guard = gate.begin(&alice).await;
        // Another account: no wait.
        tokio::time::timeout(
            Duration::from_millis(50),
            gate.wait(&jid("bob@example.org")),
        )
        .await
        .expect("other accounts are not held");
        // The hand-back's own routing: no wait.
        tokio::time::timeout(
            Duration::from_millis(50),
            HandoverGate::scope(alice.clone(), gate.wait(&alice)),
        )
        .await
        .expect("the hand-back does not wait for itself");
        // Anyone else: waits until the guard drops.
        let g = gate.clone();
        let a = alice.clone();
        let waiter = tokio::spawn(async move { g.wait(&a).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "held while the hand-back runs");
        drop(guard);
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("released when it ends")
            .unwrap();
    }

    #[tokio::test]
    async fn two_hand_backs_of_one_account_run_one_after_the_other() {
        let gate = Arc::new(HandoverGate::new());
        let alice = jid("alice@example.org");
        let first = gate.begin(&alice).await;
        let g = gate.clone();
        let a = alice.clone();
        let second = tokio::spawn(async move {
            let _guard = g.begin(&a).await;
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!second.is_finished(), "the second waits for the first");
        drop(first);
        tokio::time::timeout(Duration::from_secs(1), second)
            .await
            .expect("then runs")
            .unwrap();
        assert_eq!(gate.active.load(Ordering::Acquire), 0);
    }
}
