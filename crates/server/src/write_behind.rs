//! Write-behind queues for storage writes off the critical path (archive,
//! inbox).
//!
//! Producers [`WriteBehind::push`] items into a bounded queue; one writer
//! task per queue takes whatever is waiting (up to `max_batch`), collects
//! for at most `max_delay` more, and hands the batch to its [`BatchSink`]
//! in one call (one transaction). While a batch is being written the next
//! one accumulates, so batches grow with load (group commit) and a quiet
//! server still writes within `max_delay`. A flush request ends the
//! collection at once.
//!
//! - Back-pressure: when the database falls behind and the queue is full,
//!   `push` waits. The producer is the sending session's task, so a slow
//!   database slows senders down (and, through TCP, their clients) instead
//!   of growing memory without bound.
//! - Read-your-writes: [`WriteBehind::flush`] returns once everything pushed
//!   before it is written; queries call it first (an archive query sees the
//!   message that was just sent).
//! - Failures: a failed batch is retried with backoff (`RETRIES` times over
//!   about 3 s); then it is dropped and logged at error level with the row
//!   count, so an operator can grep for `write-behind batch dropped`.
//! - Shutdown: [`WriteBehind::close`] stops accepting items, drains the queue
//!   and waits for the writer, before storage is closed.

use starling_core::async_trait;
use starling_core::storage::StorageResult;
use starling_core::QueueMetrics;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Mutex};
use tokio::task::JoinHandle;

/// Where a queue's batches go.
#[async_trait]
pub trait BatchSink<T: Sync>: Send + Sync + 'static {
    /// Writes one batch durably (one transaction), or fails as a whole.
    async fn write(&self, batch: &[T]) -> StorageResult<()>;
}

/// Sizing of a queue.
#[derive(Clone, Copy, Debug)]
pub struct WriteBehindConfig {
    /// Items waiting at most; `push` waits beyond this.
    pub capacity: usize,
    /// Items per batch at most.
    pub max_batch: usize,
    /// How long a small batch waits for more items.
    pub max_delay: Duration,
}

enum Cmd<T> {
    Item(T),
    Flush(oneshot::Sender<()>),
}

/// A write-behind queue feeding one [`BatchSink`].
pub struct WriteBehind<T: Send + Sync + 'static> {
    name: &'static str,
    tx: mpsc::Sender<Cmd<T>>,
    task: Mutex<Option<JoinHandle<()>>>,
    /// Its metrics (`starling_write_behind_*{queue="name"}`).
    pub stats: QueueMetrics,
}

const RETRIES: u32 = 5;

impl<T: Send + Sync + 'static> WriteBehind<T> {
    /// Starts the writer task; `stats` are its metric handles.
    pub fn spawn(
        name: &'static str,
        sink: Arc<dyn BatchSink<T>>,
        cfg: WriteBehindConfig,
        stats: QueueMetrics,
    ) -> Self {
        let (tx, rx) = mpsc::channel(cfg.capacity.max(1));
        let task = tokio::spawn(writer(name, rx, sink, cfg, stats.clone()));
        WriteBehind {
            name,
            tx,
            task: Mutex::new(Some(task)),
            stats,
        }
    }

    /// Queues an item, waiting while the queue is full. After
    /// [`WriteBehind::close`] the item is dropped with a warning.
    pub async fn push(&self, item: T) {
        self.stats.queued.inc();
        if self.tx.send(Cmd::Item(item)).await.is_err() {
            self.stats.queued.dec();
            tracing::warn!(queue = self.name, "write-behind queue closed; item dropped");
        }
    }

    /// Waits until every item pushed before this call is written (or
    /// dropped after failed retries).
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Cmd::Flush(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }

    /// Writes what is queued and stops the writer.
    pub async fn close(&self) {
        self.flush().await;
        if let Some(task) = self.task.lock().await.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

async fn writer<T: Send + Sync + 'static>(
    name: &'static str,
    mut rx: mpsc::Receiver<Cmd<T>>,
    sink: Arc<dyn BatchSink<T>>,
    cfg: WriteBehindConfig,
    stats: QueueMetrics,
) {
    let max_batch = cfg.max_batch.max(1);
    let mut cmds: Vec<Cmd<T>> = Vec::with_capacity(max_batch);
    let mut batch: Vec<T> = Vec::with_capacity(max_batch);
    loop {
        cmds.clear();
        if rx.recv_many(&mut cmds, max_batch).await == 0 {
            return; // every sender is gone
        }
        // A small batch waits a little for company, unless someone is
        // waiting on a flush.
        let flush_requested = cmds.iter().any(|c| matches!(c, Cmd::Flush(_)));
        if cmds.len() < max_batch && !flush_requested && !cfg.max_delay.is_zero() {
            let deadline = tokio::time::Instant::now() + cfg.max_delay;
            while cmds.len() < max_batch {
                let room = max_batch - cmds.len();
                let seen = cmds.len();
                match tokio::time::timeout_at(deadline, rx.recv_many(&mut cmds, room)).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if cmds[seen..].iter().any(|c| matches!(c, Cmd::Flush(_))) {
                            break; // someone waits: write now
                        }
                    }
                }
            }
        }
        let mut acks = Vec::new();
        for c in cmds.drain(..) {
            match c {
                Cmd::Item(t) => batch.push(t),
                Cmd::Flush(ack) => {
                    // Everything before the flush is in `batch`: write it now.
                    write_batch(name, sink.as_ref(), &mut batch, &stats).await;
                    acks.push(ack);
                }
            }
        }
        write_batch(name, sink.as_ref(), &mut batch, &stats).await;
        for ack in acks {
            let _ = ack.send(());
        }
    }
}

async fn write_batch<T: Send + Sync + 'static>(
    name: &'static str,
    sink: &dyn BatchSink<T>,
    batch: &mut Vec<T>,
    stats: &QueueMetrics,
) {
    if batch.is_empty() {
        return;
    }
    let mut delay = Duration::from_millis(100);
    for attempt in 1..=RETRIES {
        let started = std::time::Instant::now();
        match sink.write(batch).await {
            Ok(()) => {
                tracing::trace!(
                    queue = name,
                    rows = batch.len(),
                    micros = started.elapsed().as_micros() as u64,
                    "write-behind batch written"
                );
                stats.written.inc_by(batch.len() as u64);
                stats.batches.inc();
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

    fn cfg(capacity: usize, max_batch: usize, delay_ms: u64) -> WriteBehindConfig {
        WriteBehindConfig {
            capacity,
            max_batch,
            max_delay: Duration::from_millis(delay_ms),
        }
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
        let q = WriteBehind::spawn("t", sink.clone(), cfg(10, 100, 30), QueueMetrics::default());
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
        let all: Vec<u32> = sink
            .batches
            .lock()
            .unwrap()
            .iter()
            .flatten()
            .copied()
            .collect();
        assert_eq!(all, vec![0, 1, 2, 3, 4, 5, 100]);
    }

    #[tokio::test]
    async fn failed_batches_are_retried() {
        let sink = open_recorder();
        sink.fail_first.store(2, Ordering::SeqCst);
        let q = WriteBehind::spawn("t", sink.clone(), cfg(10, 10, 0), QueueMetrics::default());
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
        );
        for i in 0..25 {
            q.push(i).await;
        }
        q.close().await;
        let n: usize = sink.batches.lock().unwrap().iter().map(Vec::len).sum();
        assert_eq!(n, 25);
        q.push(1).await; // closed: dropped, no panic, no hang
    }
}
