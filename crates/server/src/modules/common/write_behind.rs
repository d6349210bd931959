//! Write-behind queues for storage writes off the critical path (archive,
//! inbox).
//!
//! Producers [`WriteBehind::push`] items into a bounded queue and get a
//! [`Ticket`]; one writer task per queue takes whatever is waiting (up to
//! `max_batch`), collects for at most `max_delay` more, and hands the batch
//! to its [`BatchSink`] in one call (one transaction). While a batch is
//! being written the next one accumulates, so batches grow with load (group
//! commit) and a quiet server still writes within `max_delay`.
//!
//! The contract (docs/durability.md builds on it):
//!
//! - Commit tickets: [`WriteBehind::committed`] returns once the item with
//!   that ticket is resolved — written, or dropped after failed retries
//!   (counted and logged). A caller that must not acknowledge before an item
//!   is durable (stream management acks, the offline path) waits on it;
//!   waiting cuts the collection window short, like a flush.
//! - Claims: [`WriteBehind::claim`] takes a queued item back out of the
//!   queue if the writer has not picked it up yet, so the caller can write
//!   it in a transaction of its own (the offline store writes the
//!   recipient's archive row with the offline message). If the writer
//!   already has it, the caller gets the ticket to wait on instead.
//! - Back-pressure: [`WriteBehind::congested`] is true from the moment more
//!   than `high_water` items, or more than half of `max_bytes`, wait until
//!   both are back under half of that; sessions stop reading from their
//!   sockets while any queue is congested ([`starling_core::Pressure`]), so
//!   a slow database slows senders down through TCP instead of growing
//!   memory or latency without bound. `push` itself waits only at
//!   `capacity` items or `max_bytes` bytes (hard bounds that the read
//!   throttling normally keeps it from reaching). Bytes are each item's
//!   [`Weigh::weight`], so the queue's memory is bounded whatever the size
//!   of the stanzas it holds (docs/memory.md).
//! - Read-your-writes: [`WriteBehind::flush`] returns once everything pushed
//!   before it is resolved; queries call it first (an archive query sees the
//!   message that was just sent).
//! - Failures: a failed batch is retried with backoff (`RETRIES` times over
//!   about 3 s); then it is dropped and logged at error level with the row
//!   count, so an operator can grep for `write-behind batch dropped`.
//! - Shutdown: [`WriteBehind::close`] drains the queue and stops the writer.
//!   Items pushed after it (a session that outlived the shutdown's wait) are
//!   written at once, one by one, never dropped silently.

use starling_core::async_trait;
use starling_core::storage::StorageResult;
use starling_core::{Pressure, QueueMetrics};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;
use tokio::sync::{watch, Mutex, Notify};
use tokio::task::JoinHandle;

/// Where a queue's batches go.
#[async_trait]
pub trait BatchSink<T: Sync>: Send + Sync + 'static {
    /// Writes one batch durably (one transaction), or fails as a whole.
    async fn write(&self, batch: &[T]) -> StorageResult<()>;
}

/// The memory an item holds while it waits in a queue: its own size and
/// what it owns on the heap (approximately: string lengths, not allocator
/// rounding).
pub trait Weigh {
    /// Bytes held.
    fn weight(&self) -> usize;
}

impl Weigh for starling_core::storage::ArchiveRecord {
    fn weight(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.owner.as_str().len()
            + self.with_bare.len()
            + self.remote.len()
            + self.origin_id.as_ref().map_or(0, String::len)
            + self.stanza.len()
    }
}

impl Weigh for starling_core::storage::InboxUpdate {
    fn weight(&self) -> usize {
        std::mem::size_of::<Self>() + self.owner.as_str().len() + self.remote.len()
    }
}

/// Sizing of a queue.
#[derive(Clone, Copy, Debug)]
pub struct WriteBehindConfig {
    /// Items waiting at most; `push` waits beyond this.
    pub capacity: usize,
    /// Bytes ([`Weigh::weight`]) waiting at most; `push` waits beyond
    /// this (an item is always admitted into an empty queue).
    pub max_bytes: usize,
    /// Items per batch at most.
    pub max_batch: usize,
    /// How long a small batch waits for more items.
    pub max_delay: Duration,
}

impl WriteBehindConfig {
    /// Waiting items above which the queue raises the pressure: one full
    /// batch waiting while another is written means the writer is
    /// saturated. Lowered again at half of it.
    pub fn high_water(&self) -> usize {
        self.max_batch.min(self.capacity / 2).max(1)
    }

    /// Waiting bytes above which the queue raises the pressure (lowered
    /// again at half of it).
    pub fn high_water_bytes(&self) -> usize {
        (self.max_bytes / 2).max(1)
    }
}

/// Identifies a pushed item for [`WriteBehind::committed`]. Ticket 0 is
/// always committed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ticket(pub u64);

/// What [`WriteBehind::claim`] found.
#[derive(Debug)]
pub enum Claim<T> {
    /// The item, taken out of the queue: the caller writes it.
    Taken(T),
    /// Not waiting in the queue (being written, written, or never pushed):
    /// wait on this ticket to know it is resolved.
    NotQueued(Ticket),
}

struct State<T> {
    /// Items not yet handed to the writer, in ticket order.
    pending: VecDeque<(u64, T)>,
    /// The sum of `pending`'s weights.
    pending_bytes: usize,
    /// The ticket of the next push.
    next: u64,
    /// Every ticket up to this is with the writer or resolved (written,
    /// dropped, or claimed by a caller): nothing at or below it is pending.
    taken_up_to: u64,
    /// The writer writes at once (no collection window) while a pending
    /// ticket is at most this: someone waits for it.
    urgent_up_to: u64,
    /// This queue currently raises the pressure.
    raised: bool,
    closed: bool,
}

struct Shared<T> {
    name: &'static str,
    cfg: WriteBehindConfig,
    state: StdMutex<State<T>>,
    /// Wakes the writer (new item, urgency, close).
    wake: Notify,
    /// Wakes pushers waiting for room.
    room: Notify,
    /// Every ticket up to this is resolved.
    committed: watch::Sender<u64>,
    sink: Arc<dyn BatchSink<T>>,
    stats: QueueMetrics,
    pressure: Arc<Pressure>,
}

impl<T> Shared<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps the pressure in step with `pending` (lock held).
    fn update_pressure(&self, st: &mut State<T>) {
        let len = st.pending.len();
        let bytes = st.pending_bytes;
        self.stats.bytes.set(bytes as i64);
        let high = self.cfg.high_water();
        let high_bytes = self.cfg.high_water_bytes();
        if !st.raised && (len > high || bytes > high_bytes) {
            st.raised = true;
            self.pressure.raise();
            tracing::debug!(
                queue = self.name,
                queued = len,
                bytes,
                "write-behind queue congested; sessions pause reading"
            );
        } else if st.raised && len <= high / 2 && bytes <= high_bytes / 2 {
            st.raised = false;
            self.pressure.lower();
        }
    }
}

/// A write-behind queue feeding one [`BatchSink`].
pub struct WriteBehind<T: Weigh + Send + Sync + 'static> {
    shared: Arc<Shared<T>>,
    task: Mutex<Option<JoinHandle<()>>>,
    /// Its metrics (`starling_write_behind_*{queue="name"}`).
    pub stats: QueueMetrics,
}

const RETRIES: u32 = 5;

impl<T: Weigh + Send + Sync + 'static> WriteBehind<T> {
    /// Starts the writer task; `stats` are its metric handles, `pressure`
    /// the gate it raises when congested.
    pub fn spawn(
        name: &'static str,
        sink: Arc<dyn BatchSink<T>>,
        cfg: WriteBehindConfig,
        stats: QueueMetrics,
        pressure: Arc<Pressure>,
    ) -> Self {
        let cfg = WriteBehindConfig {
            capacity: cfg.capacity.max(1),
            max_bytes: cfg.max_bytes.max(1),
            max_batch: cfg.max_batch.max(1),
            max_delay: cfg.max_delay,
        };
        let shared = Arc::new(Shared {
            name,
            cfg,
            state: StdMutex::new(State {
                pending: VecDeque::new(),
                pending_bytes: 0,
                next: 1,
                taken_up_to: 0,
                urgent_up_to: 0,
                raised: false,
                closed: false,
            }),
            wake: Notify::new(),
            room: Notify::new(),
            committed: watch::Sender::new(0),
            sink,
            stats: stats.clone(),
            pressure,
        });
        let task = tokio::spawn(writer(shared.clone()));
        WriteBehind {
            shared,
            task: Mutex::new(Some(task)),
            stats,
        }
    }

    /// Queues an item, waiting while the queue holds `capacity` items or
    /// has no room for its weight within `max_bytes`. After
    /// [`WriteBehind::close`] the item is written at once instead.
    pub async fn push(&self, item: T) -> Ticket {
        let sh = &self.shared;
        let weight = item.weight();
        let mut item = Some(item);
        loop {
            let room = sh.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let mut st = sh.lock();
                if st.closed {
                    break;
                }
                let fits = st.pending.is_empty()
                    || (st.pending.len() < sh.cfg.capacity
                        && st.pending_bytes + weight <= sh.cfg.max_bytes);
                if fits {
                    let t = st.next;
                    st.next += 1;
                    st.pending.push_back((t, item.take().expect("pushed once")));
                    st.pending_bytes += weight;
                    let was_raised = st.raised;
                    sh.update_pressure(&mut st);
                    // The writer needs waking only to start (first item)
                    // or to cut its window short (a full batch, or the
                    // queue just became congested).
                    let len = st.pending.len();
                    let congested_now = st.raised && !was_raised;
                    drop(st);
                    sh.stats.queued.inc();
                    if len == 1 || len >= sh.cfg.max_batch || congested_now {
                        sh.wake.notify_one();
                    }
                    return Ticket(t);
                }
            }
            room.await;
        }
        // Closed: a straggler after shutdown's wait. Written now, alone.
        let item = item.take().expect("not pushed");
        sh.stats.queued.inc();
        write_batch(sh, &mut vec![item]).await;
        Ticket(0)
    }

    /// Waits until the item with `ticket` is resolved (written, or dropped
    /// after failed retries), asking the writer not to wait for company.
    pub async fn committed(&self, ticket: Ticket) {
        let sh = &self.shared;
        if *sh.committed.borrow() >= ticket.0 {
            return;
        }
        let target = {
            let mut st = sh.lock();
            if st.pending.front().is_some_and(|(t, _)| *t <= ticket.0) {
                st.urgent_up_to = st.urgent_up_to.max(ticket.0);
                ticket.0
            } else {
                // Nothing pending at or below it: it is with the writer,
                // resolved, or was claimed (then its claimant writes it).
                ticket.0.min(st.taken_up_to)
            }
        };
        sh.wake.notify_one();
        let mut rx = sh.committed.subscribe();
        let _ = rx.wait_for(|c| *c >= target).await;
    }

    /// Waits until every item queued so far is resolved (see
    /// [`WriteBehind::committed`]): the barrier behind XEP-0198 acks.
    pub async fn committed_all(&self) {
        let last = self.shared.lock().next - 1;
        if last > 0 {
            self.committed(Ticket(last)).await;
        }
    }

    /// Takes the newest queued item matching `pred` back out of the queue
    /// (it is then the caller's to write), or says which ticket to wait on
    /// when no queued item matches. Items are searched newest first: the
    /// caller usually pushed its item moments ago.
    pub fn claim(&self, pred: impl Fn(&T) -> bool) -> Claim<T> {
        let sh = &self.shared;
        let mut st = sh.lock();
        if let Some(pos) = st.pending.iter().rposition(|(_, t)| pred(t)) {
            let (_, item) = st.pending.remove(pos).expect("position found");
            st.pending_bytes -= item.weight();
            sh.update_pressure(&mut st);
            drop(st);
            sh.stats.queued.dec();
            sh.room.notify_waiters();
            return Claim::Taken(item);
        }
        Claim::NotQueued(Ticket(st.taken_up_to))
    }

    /// Whether this queue currently raises the pressure: from the moment
    /// more than the high-water mark of items wait until they are back
    /// under half of it.
    pub fn congested(&self) -> bool {
        self.shared.lock().raised
    }

    /// Waits until every item pushed before this call is resolved.
    pub async fn flush(&self) {
        let last = self.shared.lock().next - 1;
        self.committed(Ticket(last)).await;
    }

    /// Writes what is queued and stops the writer. Later pushes are
    /// written one by one.
    pub async fn close(&self) {
        {
            let mut st = self.shared.lock();
            st.closed = true;
            st.urgent_up_to = st.next - 1;
        }
        self.shared.wake.notify_one();
        self.shared.room.notify_waiters();
        if let Some(task) = self.task.lock().await.take() {
            let _ = task.await;
        }
    }
}

async fn writer<T: Weigh + Send + Sync + 'static>(sh: Arc<Shared<T>>) {
    let max_batch = sh.cfg.max_batch;
    let mut batch: Vec<T> = Vec::new();
    loop {
        // Wait for work.
        loop {
            let wake = sh.wake.notified();
            tokio::pin!(wake);
            wake.as_mut().enable();
            {
                let st = sh.lock();
                if !st.pending.is_empty() {
                    break;
                }
                if st.closed {
                    return;
                }
            }
            wake.await;
        }
        // A small batch waits a little for company, unless someone waits
        // for one of its items, the queue is congested (sessions have
        // stopped reading: waiting longer would only stall them) or it is
        // closing.
        if !sh.cfg.max_delay.is_zero() {
            let deadline = tokio::time::Instant::now() + sh.cfg.max_delay;
            loop {
                let wake = sh.wake.notified();
                tokio::pin!(wake);
                wake.as_mut().enable();
                {
                    let st = sh.lock();
                    let front = st.pending.front().map_or(u64::MAX, |(t, _)| *t);
                    if st.pending.len() >= max_batch
                        || st.urgent_up_to >= front
                        || st.raised
                        || st.closed
                    {
                        break;
                    }
                }
                if tokio::time::timeout_at(deadline, wake).await.is_err() {
                    break;
                }
            }
        }
        let last = {
            let mut st = sh.lock();
            let n = st.pending.len().min(max_batch);
            batch.reserve(n);
            batch.extend(st.pending.drain(..n).map(|(_, item)| item));
            let taken: usize = batch.iter().map(Weigh::weight).sum();
            st.pending_bytes -= taken;
            // Tickets below the next pending one (or every ticket given so
            // far) are in this batch, in earlier ones, or were claimed.
            let last = st.pending.front().map_or(st.next, |(t, _)| *t) - 1;
            st.taken_up_to = last;
            sh.update_pressure(&mut st);
            last
        };
        sh.room.notify_waiters();
        write_batch(&sh, &mut batch).await;
        // Every ticket up to `last` is now resolved: written here, in an
        // earlier batch, or claimed by a caller who writes it itself.
        // (Claims made while this batch was written are covered by the
        // next round's `last`, or by `committed`'s look at the queue.)
        sh.committed.send_replace(last);
        // Do not keep a big batch's buffer while idle.
        if batch.capacity() > 1024 {
            batch = Vec::new();
        }
    }
}

async fn write_batch<T: Send + Sync + 'static>(sh: &Shared<T>, batch: &mut Vec<T>) {
    if batch.is_empty() {
        return;
    }
    let name = sh.name;
    let stats = &sh.stats;
    let mut delay = Duration::from_millis(100);
    for attempt in 1..=RETRIES {
        let started = std::time::Instant::now();
        match sh.sink.write(batch).await {
            Ok(()) => {
                tracing::trace!(
                    queue = name,
                    rows = batch.len(),
                    micros = started.elapsed().as_micros() as u64,
                    "write-behind batch written"
                );
                stats.written.inc_by(batch.len() as u64);
                stats.batches.inc();
                stats.commit_seconds.observe(started.elapsed());
                stats.queued.dec_by(batch.len() as i64);
                batch.clear();
                return;
            }
            Err(e) if attempt < RETRIES => {
                tracing::warn!(queue = name, attempt, rows = batch.len(), error = %e, "write-behind batch failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            Err(e) => {
                tracing::error!(queue = name, rows = batch.len(), error = %e, "write-behind batch dropped after {RETRIES} attempts");
                stats.dropped.inc_by(batch.len() as u64);
                stats.queued.dec_by(batch.len() as i64);
                batch.clear();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use starling_core::storage::StorageError;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex as StdMutex;

    struct Recorder {
        batches: StdMutex<Vec<Vec<u32>>>,
        fail_first: AtomicU64,
        gate: tokio::sync::Semaphore,
    }

    impl Default for Recorder {
        fn default() -> Self {
            Recorder {
                batches: StdMutex::new(Vec::new()),
                fail_first: AtomicU64::new(0),
                gate: tokio::sync::Semaphore::new(0),
            }
        }
    }

    #[async_trait]
    impl BatchSink<u32> for Recorder {
        async fn write(&self, batch: &[u32]) -> StorageResult<()> {
            let _permit = self.gate.acquire().await.unwrap();
            if self.fail_first.load(Ordering::SeqCst) > 0 {
                self.fail_first.fetch_sub(1, Ordering::SeqCst);
                return Err(StorageError::Backend("injected".into()));
            }
            self.batches.lock().unwrap().push(batch.to_vec());
            Ok(())
        }
    }

    /// Test items weigh 1 byte, except those from 1,000 up, which weigh
    /// their value in bytes.
    impl Weigh for u32 {
        fn weight(&self) -> usize {
            if *self < 1000 {
                1
            } else {
                *self as usize
            }
        }
    }

    fn cfg(capacity: usize, max_batch: usize, delay_ms: u64) -> WriteBehindConfig {
        WriteBehindConfig {
            capacity,
            max_bytes: 1 << 30,
            max_batch,
            max_delay: Duration::from_millis(delay_ms),
        }
    }

    /// Every item the sink received, in order.
    fn written(sink: &Recorder) -> Vec<u32> {
        sink.batches
            .lock()
            .unwrap()
            .iter()
            .flatten()
            .copied()
            .collect()
    }

    fn gate() -> Arc<Pressure> {
        Arc::new(Pressure::new())
    }

    fn open_recorder() -> Arc<Recorder> {
        let r = Arc::new(Recorder::default());
        r.gate.add_permits(1_000_000);
        r
    }

    #[tokio::test]
    async fn batches_keep_order_and_respect_max_batch() {
        let sink = open_recorder();
        let q = WriteBehind::spawn(
            "t",
            sink.clone(),
            cfg(1000, 64, 20),
            QueueMetrics::default(),
            gate(),
        );
        for i in 0..500 {
            q.push(i).await;
        }
        q.flush().await;
        let batches = sink.batches.lock().unwrap().clone();
        assert!(batches.iter().all(|b| b.len() <= 64));
        assert!(
            batches.len() < 500,
            "items were batched: {} batches",
            batches.len()
        );
        let all: Vec<u32> = batches.into_iter().flatten().collect();
        assert_eq!(all, (0..500).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_lone_item_is_written_within_max_delay() {
        let sink = open_recorder();
        let q = WriteBehind::spawn(
            "t",
            sink.clone(),
            cfg(10, 100, 30),
            QueueMetrics::default(),
            gate(),
        );
        q.push(7).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(*sink.batches.lock().unwrap(), vec![vec![7]]);
    }

    #[tokio::test]
    async fn flush_cuts_a_long_collection_window_short() {
        let sink = open_recorder();
        let q = WriteBehind::spawn(
            "t",
            sink.clone(),
            cfg(100, 100, 10_000),
            QueueMetrics::default(),
            gate(),
        );
        q.push(1).await;
        q.push(2).await;
        tokio::time::timeout(Duration::from_secs(2), q.flush())
            .await
            .expect("flush does not wait for the 10 s window");
        assert_eq!(*sink.batches.lock().unwrap(), vec![vec![1, 2]]);
    }

    #[tokio::test]
    async fn full_queue_applies_back_pressure() {
        let sink = Arc::new(Recorder::default()); // gate closed: writes block
        let q = Arc::new(WriteBehind::spawn(
            "t",
            sink.clone(),
            cfg(4, 2, 0),
            QueueMetrics::default(),
            gate(),
        ));
        // The writer takes up to 2 items and blocks in the sink; 4 more fill
        // the queue; the next push must wait.
        for i in 0..6 {
            tokio::time::timeout(Duration::from_secs(2), q.push(i))
                .await
                .expect("room in the queue");
        }
        let blocked = tokio::time::timeout(Duration::from_millis(200), q.push(99)).await;
        assert!(blocked.is_err(), "push must wait while the queue is full");
        sink.gate.add_permits(1_000);
        q.push(100).await;
        q.flush().await;
        let all = written(&sink);
        assert_eq!(all, vec![0, 1, 2, 3, 4, 5, 100]);
    }

    #[tokio::test]
    async fn failed_batches_are_retried() {
        let sink = open_recorder();
        sink.fail_first.store(2, Ordering::SeqCst);
        let q = WriteBehind::spawn(
            "t",
            sink.clone(),
            cfg(10, 10, 0),
            QueueMetrics::default(),
            gate(),
        );
        q.push(1).await;
        q.flush().await;
        assert_eq!(*sink.batches.lock().unwrap(), vec![vec![1]]);
        assert_eq!(q.stats.dropped.get(), 0);
        assert_eq!((q.stats.written.get(), q.stats.queued.get()), (1, 0));
    }

    #[tokio::test]
    async fn close_drains_the_queue() {
        let sink = open_recorder();
        let q = WriteBehind::spawn(
            "t",
            sink.clone(),
            cfg(1000, 10, 1000),
            QueueMetrics::default(),
            gate(),
        );
        for i in 0..25 {
            q.push(i).await;
        }
        q.close().await;
        let n: usize = sink.batches.lock().unwrap().iter().map(Vec::len).sum();
        assert_eq!(n, 25);
        q.push(1).await; // closed: written alone, no panic, no hang
    }

    #[tokio::test]
    async fn committed_waits_for_the_item_and_cuts_the_window_short() {
        let sink = open_recorder();
        let q = WriteBehind::spawn(
            "t",
            sink.clone(),
            cfg(100, 100, 10_000),
            QueueMetrics::default(),
            gate(),
        );
        let a = q.push(1).await;
        let b = q.push(2).await;
        assert!(a < b);
        tokio::time::timeout(Duration::from_secs(2), q.committed(b))
            .await
            .expect("waiting on a ticket does not wait for the 10 s window");
        assert_eq!(*sink.batches.lock().unwrap(), vec![vec![1, 2]]);
        // Already committed: returns at once; ticket 0 always is.
        q.committed(a).await;
        q.committed(Ticket(0)).await;
    }

    #[tokio::test]
    async fn claim_takes_a_queued_item_back_and_says_what_to_wait_for_otherwise() {
        let sink = Arc::new(Recorder::default()); // gate closed: writes block
        let q = WriteBehind::spawn(
            "t",
            sink.clone(),
            cfg(100, 2, 0),
            QueueMetrics::default(),
            gate(),
        );
        q.push(1).await;
        q.push(2).await;
        // Let the writer take the first batch (1, 2); it blocks in the sink.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let t3 = q.push(3).await;
        let _t4 = q.push(4).await;
        match q.claim(|i| *i == 3) {
            Claim::Taken(3) => {}
            other => panic!("3 is queued: {other:?}"),
        }
        assert_eq!(q.stats.queued.get(), 3, "1, 2 in flight, 4 queued");
        let t1 = match q.claim(|i| *i == 1) {
            Claim::NotQueued(t) => t,
            other => panic!("1 is being written: {other:?}"),
        };
        assert!(t1 < t3);
        let waiter = tokio::spawn({
            let q = Arc::new(q);
            let q2 = q.clone();
            async move {
                q2.committed(t1).await;
                q
            }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !waiter.is_finished(),
            "the batch holding 1 is not written yet"
        );
        sink.gate.add_permits(1_000);
        let q = tokio::time::timeout(Duration::from_secs(2), waiter)
            .await
            .expect("resolved once written")
            .unwrap();
        q.flush().await;
        let all = written(&sink);
        assert_eq!(
            all,
            vec![1, 2, 4],
            "the claimed item is the caller's to write"
        );
        assert_eq!(q.stats.queued.get(), 0);
    }

    #[tokio::test]
    async fn congestion_raises_the_pressure_until_drained() {
        let sink = Arc::new(Recorder::default()); // gate closed: writes block
        let pressure = gate();
        // high water = min(max_batch 4, capacity/2 50) = 4.
        let q = WriteBehind::spawn(
            "t",
            sink.clone(),
            cfg(100, 4, 0),
            QueueMetrics::default(),
            pressure.clone(),
        );
        for i in 0..4 {
            q.push(i).await; // the writer takes up to 4 and blocks
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        for i in 4..8 {
            q.push(i).await;
        }
        assert!(
            !pressure.is_high() && !q.congested(),
            "4 waiting: at the mark"
        );
        q.push(8).await;
        assert!(pressure.is_high() && q.congested(), "5 waiting: over it");
        sink.gate.add_permits(1_000);
        tokio::time::timeout(Duration::from_secs(2), pressure.relieved())
            .await
            .expect("drained");
        q.flush().await;
        assert!(!q.congested());
    }

    #[tokio::test]
    async fn bytes_bound_the_queue_whatever_the_item_count() {
        let sink = Arc::new(Recorder::default()); // gate closed: writes block
        let pressure = gate();
        let stats = QueueMetrics::default();
        let q = Arc::new(WriteBehind::spawn(
            "t",
            sink.clone(),
            WriteBehindConfig {
                max_bytes: 10_000,
                ..cfg(100, 100, 0)
            },
            stats.clone(),
            pressure.clone(),
        ));
        q.push(9_000).await; // taken by the writer, which blocks
        tokio::time::sleep(Duration::from_millis(50)).await;
        q.push(4_000).await;
        assert!(!q.congested(), "4,000 bytes waiting: under half of 10,000");
        q.push(1_001).await;
        assert!(
            q.congested() && pressure.is_high(),
            "5,001 bytes: over half"
        );
        assert_eq!(stats.bytes.get(), 5_001);
        q.push(4_999).await; // exactly 10,000: fits
        let blocked = tokio::time::timeout(Duration::from_millis(200), q.push(1_000)).await;
        assert!(blocked.is_err(), "no room for 1,000 more bytes: push waits");
        // An item heavier than the whole bound still gets in, alone.
        sink.gate.add_permits(1_000);
        q.flush().await;
        tokio::time::timeout(Duration::from_secs(2), q.push(20_000))
            .await
            .expect("an empty queue admits any item");
        q.flush().await;
        assert_eq!(
            written(&sink),
            vec![9_000, 4_000, 1_001, 4_999, 20_000],
            "the push that timed out was cancelled, the others kept their order"
        );
        assert_eq!(stats.bytes.get(), 0);
        assert!(!q.congested());
    }

    #[tokio::test]
    async fn pushes_after_close_are_written_not_dropped() {
        let sink = open_recorder();
        let q = WriteBehind::spawn(
            "t",
            sink.clone(),
            cfg(10, 10, 1000),
            QueueMetrics::default(),
            gate(),
        );
        q.push(1).await;
        q.close().await;
        let t = q.push(2).await;
        q.committed(t).await;
        assert_eq!(*sink.batches.lock().unwrap(), vec![vec![1], vec![2]]);
        assert_eq!(q.stats.dropped.get(), 0);
        assert_eq!(q.stats.queued.get(), 0);
    }

    #[tokio::test]
    async fn a_claimed_ticket_never_blocks_a_flush() {
        // Regression: claiming the last queued item left nothing for the
        // writer to write, and flush() waited for its ticket forever.
        let sink = open_recorder();
        let q = WriteBehind::spawn(
            "t",
            sink.clone(),
            cfg(100, 100, 10_000),
            QueueMetrics::default(),
            gate(),
        );
        q.push(1).await;
        q.flush().await;
        let t = q.push(2).await;
        assert!(matches!(q.claim(|i| *i == 2), Claim::Taken(2)));
        tokio::time::timeout(Duration::from_secs(2), q.flush())
            .await
            .expect("flush returns");
        tokio::time::timeout(Duration::from_secs(2), q.committed(t))
            .await
            .expect("a claimed ticket is the claimant's");
        // Claimed in the middle: the next batch's watermark covers it.
        q.push(3).await;
        q.push(4).await;
        q.push(5).await;
        assert!(matches!(q.claim(|i| *i == 4), Claim::Taken(4)));
        tokio::time::timeout(Duration::from_secs(2), q.flush())
            .await
            .expect("flush returns");
        let all = written(&sink);
        assert_eq!(all, vec![1, 3, 5]);
    }
}
