//! The writer: a bounded channel in front of a dedicated thread that appends to the wal of
//! the open segment and rolls segments into Parquet (converted on a second thread).
//!
//! The request path only ever calls [`PredictionLogHandle::record`], a `try_send`: when the
//! channel is full the record is dropped and counted (`mesh_log_dropped_records_total`, and
//! a warning with the count at the next flush tick). Nothing on the request path waits for
//! the disk.

use crate::config::LogConfig;
use crate::error::{LogError, Result};
use crate::record::{date_of_us, now_us, FeatureLogging, PredictionRecord};
use crate::segment::{self, RecoveryReport};
use crate::wal::WalWriter;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch};

enum Msg {
    Record(Box<PredictionRecord>),
    Flush(oneshot::Sender<u64>),
    Shutdown,
}

/// Counters shared by the handles and the writer thread.
#[derive(Default)]
struct Shared {
    accepted: AtomicU64,
    dropped: AtomicU64,
    written: AtomicU64,
    flushed: AtomicU64,
    lost: AtomicU64,
    segments: AtomicU64,
}

/// A snapshot of the writer's counters (since this process started the log).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct LogStats {
    /// Records accepted into the channel.
    pub accepted: u64,
    /// Records dropped because the channel was full (or the writer had stopped).
    pub dropped: u64,
    /// Records appended to a wal.
    pub written: u64,
    /// Records handed to the OS (they survive a kill of this process).
    pub flushed: u64,
    /// Records lost to write errors (disk full, permissions), logged as errors.
    pub lost: u64,
    /// Segments closed into Parquet files.
    pub segments: u64,
}

impl Shared {
    fn stats(&self) -> LogStats {
        LogStats {
            accepted: self.accepted.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            written: self.written.load(Ordering::Relaxed),
            flushed: self.flushed.load(Ordering::Acquire),
            lost: self.lost.load(Ordering::Relaxed),
            segments: self.segments.load(Ordering::Relaxed),
        }
    }
}

/// Cheap, cloneable sender of prediction records.
#[derive(Clone)]
pub struct PredictionLogHandle {
    tx: SyncSender<Msg>,
    shared: Arc<Shared>,
    done: watch::Receiver<bool>,
    features: FeatureLogging,
}

/// Entry point: `PredictionLog::start(config)`.
pub struct PredictionLog;

/// The writer thread; [`PredictionLogHandle::shutdown`] stops it, [`WriterTask::join`] waits.
pub struct WriterTask {
    thread: JoinHandle<()>,
    /// What recovery found in `dir` before the writer started.
    pub recovered: RecoveryReport,
}

impl WriterTask {
    /// Blocks until the writer thread has exited (after a shutdown, or once every handle has
    /// been dropped).
    pub fn join(self) -> Result<()> {
        self.thread.join().map_err(|_| LogError::WriterPanicked)
    }

    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }
}

impl PredictionLog {
    /// Takes the directory's lock (a second writer is refused, naming the holder),
    /// recovers leftovers of a previous run in `config.dir` (wal files -> Parquet), then
    /// starts the writer threads. The lock is held until the writer thread ends.
    pub fn start(config: LogConfig) -> Result<(PredictionLogHandle, WriterTask)> {
        config.validate()?;
        let lock = crate::lock::DirLock::acquire(&config.dir)?;
        let wdir = segment::wal_dir(&config.dir);
        std::fs::create_dir_all(&wdir).map_err(|e| LogError::io(&wdir, e))?;
        let recovered = segment::recover(&config.dir)?;
        if recovered.wal_files > 0 {
            tracing::info!(
                wal_files = recovered.wal_files,
                records = recovered.records,
                torn_bytes = recovered.torn_bytes,
                "prediction log recovered segments left by a previous run"
            );
            metrics::counter!("mesh_log_recovered_records_total")
                .increment(recovered.records as u64);
        }
        // Exported at zero from the start, so dashboards show them and an `increase()`
        // alert sees the first drop (a counter born at 5 has no increase).
        metrics::counter!("mesh_log_dropped_records_total").increment(0);
        metrics::counter!("mesh_log_lost_records_total").increment(0);
        let (tx, rx) = mpsc::sync_channel(config.channel_capacity);
        let (done_tx, done_rx) = watch::channel(false);
        let shared = Arc::new(Shared::default());
        let features = config.features;
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("prediction-log".into())
                .spawn(move || {
                    writer_main(config, rx, &shared);
                    // Released only after the last segment is closed and converted.
                    drop(lock);
                    let _ = done_tx.send(true);
                })
                .map_err(|e| LogError::io("prediction-log thread", e))?
        };
        Ok((
            PredictionLogHandle {
                tx,
                shared,
                done: done_rx,
                features,
            },
            WriterTask { thread, recovered },
        ))
    }
}

impl PredictionLogHandle {
    /// Queues a record without waiting. Returns false (and counts the drop) when the channel
    /// is full or the writer has stopped. Applies the feature logging mode.
    pub fn record(&self, mut rec: PredictionRecord) -> bool {
        if rec.features.is_some() && !self.features.keeps(&rec.request_id) {
            rec.features = None;
        }
        match self.tx.try_send(Msg::Record(Box::new(rec))) {
            Ok(()) => {
                self.shared.accepted.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.shared.dropped.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("mesh_log_dropped_records_total").increment(1);
                false
            }
        }
    }

    /// Queues a record, waiting for room in the channel. For tools and tests (back-fills,
    /// load generators); the request path uses [`record`](Self::record).
    pub async fn record_wait(&self, mut rec: PredictionRecord) -> Result<()> {
        if rec.features.is_some() && !self.features.keeps(&rec.request_id) {
            rec.features = None;
        }
        let mut msg = Msg::Record(Box::new(rec));
        loop {
            match self.tx.try_send(msg) {
                Ok(()) => {
                    self.shared.accepted.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                Err(TrySendError::Full(m)) => {
                    msg = m;
                    tokio::time::sleep(Duration::from_micros(200)).await;
                }
                Err(TrySendError::Disconnected(_)) => return Err(LogError::Closed),
            }
        }
    }

    /// Asks the writer to flush now; returns the number of records flushed so far.
    pub async fn flush(&self) -> Result<u64> {
        let (tx, rx) = oneshot::channel();
        let mut msg = Msg::Flush(tx);
        loop {
            match self.tx.try_send(msg) {
                Ok(()) => break,
                Err(TrySendError::Full(m)) => {
                    msg = m;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err(TrySendError::Disconnected(_)) => return Err(LogError::Closed),
            }
        }
        rx.await.map_err(|_| LogError::Closed)
    }

    /// Records handed to the OS so far by this process. Records are written in the order
    /// they were accepted, so the first `flushed_count()` accepted records survive a kill.
    pub fn flushed_count(&self) -> u64 {
        self.shared.flushed.load(Ordering::Acquire)
    }

    pub fn stats(&self) -> LogStats {
        self.shared.stats()
    }

    /// Drains every record accepted before this call, closes the open segment into Parquet
    /// and stops the writer. Safe to call from several handles and more than once.
    pub async fn shutdown(&self) -> Result<LogStats> {
        let mut msg = Msg::Shutdown;
        loop {
            match self.tx.try_send(msg) {
                Ok(()) | Err(TrySendError::Disconnected(_)) => break,
                Err(TrySendError::Full(m)) => {
                    msg = m;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        }
        let mut done = self.done.clone();
        // An error here means the writer thread is gone, which is what we wait for.
        let _ = done.wait_for(|d| *d).await;
        Ok(self.stats())
    }

    /// [`shutdown`](Self::shutdown) for code outside an async runtime.
    pub fn shutdown_blocking(&self) -> LogStats {
        let mut msg = Msg::Shutdown;
        loop {
            match self.tx.try_send(msg) {
                Ok(()) | Err(TrySendError::Disconnected(_)) => break,
                Err(TrySendError::Full(m)) => {
                    msg = m;
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        while !*self.done.borrow() {
            std::thread::sleep(Duration::from_millis(2));
        }
        self.stats()
    }
}

struct OpenSegment {
    id: String,
    date: String,
    wal: WalWriter,
    records: Vec<PredictionRecord>,
    opened: Instant,
}

struct ConvertJob {
    id: String,
    wal: PathBuf,
    records: Vec<PredictionRecord>,
}

struct Writer<'a> {
    cfg: LogConfig,
    shared: &'a Shared,
    open: Option<OpenSegment>,
    seq: u64,
    written: u64,
    convert_tx: Option<SyncSender<ConvertJob>>,
    error_reported: bool,
}

impl Writer<'_> {
    fn append(&mut self, rec: PredictionRecord) {
        let date = date_of_us(rec.ts_us);
        if self.open.as_ref().is_some_and(|s| s.date != date) {
            self.roll();
        }
        if self.open.is_none() {
            let id = segment::segment_id(now_us(), self.seq);
            self.seq += 1;
            match WalWriter::create(&segment::wal_path(&self.cfg.dir, &id)) {
                Ok(wal) => {
                    self.open = Some(OpenSegment {
                        id,
                        date,
                        wal,
                        records: Vec::new(),
                        opened: Instant::now(),
                    })
                }
                Err(e) => return self.lose(1, &e),
            }
        }
        let Some(seg) = self.open.as_mut() else {
            return;
        };
        if let Err(e) = seg.wal.append(&rec) {
            // The wal keeps what it had; recovery at the next start converts it.
            self.open = None;
            return self.lose(1, &e);
        }
        seg.records.push(rec);
        self.written += 1;
        self.shared.written.store(self.written, Ordering::Relaxed);
        if seg.wal.bytes() >= self.cfg.segment_max_bytes {
            self.roll();
        }
    }

    fn lose(&mut self, n: u64, e: &LogError) {
        self.shared.lost.fetch_add(n, Ordering::Relaxed);
        metrics::counter!("mesh_log_lost_records_total").increment(n);
        if !self.error_reported {
            tracing::error!(error = %e, "prediction log write failed; records are being lost");
            self.error_reported = true;
        }
    }

    fn flush(&mut self) {
        if let Some(seg) = self.open.as_mut() {
            if let Err(e) = seg.wal.flush(self.cfg.fsync) {
                // Records since the last good flush may not be on disk: count them as lost
                // (recovery may still find some in the abandoned wal) and start a new segment.
                let n = self.written
                    - self
                        .shared
                        .flushed
                        .load(Ordering::Acquire)
                        .min(self.written);
                self.open = None;
                self.written -= n;
                self.shared.written.store(self.written, Ordering::Relaxed);
                return self.lose(n, &e);
            }
        }
        self.shared.flushed.store(self.written, Ordering::Release);
        // What a kill cannot take back: the records handed to the OS so far.
        metrics::gauge!("mesh_log_flushed_records").set(self.written as f64);
    }

    fn roll(&mut self) {
        self.flush();
        let Some(seg) = self.open.take() else { return };
        let job = ConvertJob {
            id: seg.id,
            wal: seg.wal.path().to_path_buf(),
            records: seg.records,
        };
        drop(seg.wal);
        if let Some(tx) = &self.convert_tx {
            if tx.send(job).is_err() {
                tracing::error!("prediction log converter stopped; the wal stays for recovery");
            }
        }
    }
}

fn convert_main(dir: PathBuf, rx: Receiver<ConvertJob>, shared: &Shared) {
    while let Ok(job) = rx.recv() {
        match segment::write_segment(&dir, &job.id, &job.records) {
            Ok(path) => {
                if let Err(e) = std::fs::remove_file(&job.wal) {
                    tracing::warn!(error = %e, wal = %job.wal.display(), "could not remove converted wal");
                }
                shared.segments.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("mesh_log_segments_total").increment(1);
                if let Some(p) = path {
                    tracing::debug!(path = %p.display(), records = job.records.len(), "segment closed");
                }
            }
            Err(e) => {
                metrics::counter!("mesh_log_convert_errors_total").increment(1);
                tracing::error!(error = %e, wal = %job.wal.display(),
                    "could not convert a segment to Parquet; its wal stays and is converted at the next start");
            }
        }
    }
}

fn writer_main(cfg: LogConfig, rx: Receiver<Msg>, shared: &Shared) {
    let (convert_tx, convert_rx) = mpsc::sync_channel::<ConvertJob>(2);
    let dir = cfg.dir.clone();
    let flush_interval = cfg.flush_interval;
    let max_age = cfg.segment_max_age;
    std::thread::scope(|scope| {
        let converter = std::thread::Builder::new()
            .name("prediction-log-convert".into())
            .spawn_scoped(scope, move || convert_main(dir, convert_rx, shared));
        let mut w = Writer {
            cfg,
            shared,
            open: None,
            seq: 0,
            written: 0,
            convert_tx: Some(convert_tx),
            error_reported: false,
        };
        if converter.is_err() {
            tracing::error!(
                "could not start the prediction log converter thread; segments stay as wal files"
            );
            w.convert_tx = None;
        }
        let mut reported = MetricsReported::default();
        let mut next_tick = Instant::now() + flush_interval;
        loop {
            let now = Instant::now();
            let msg = if now >= next_tick {
                match rx.try_recv() {
                    Ok(m) => Some(m),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => break,
                }
            } else {
                match rx.recv_timeout(next_tick - now) {
                    Ok(m) => Some(m),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            };
            match msg {
                Some(Msg::Record(r)) => w.append(*r),
                Some(Msg::Flush(ack)) => {
                    w.flush();
                    let _ = ack.send(w.written);
                }
                Some(Msg::Shutdown) => break,
                None => {}
            }
            if Instant::now() >= next_tick {
                w.flush();
                if w.open
                    .as_ref()
                    .is_some_and(|s| s.opened.elapsed() >= max_age)
                {
                    w.roll();
                }
                reported.report(shared);
                w.error_reported = false;
                next_tick = Instant::now() + flush_interval;
            }
        }
        // Drain: everything accepted before the shutdown message is already processed (FIFO);
        // records still queued behind it are written too rather than lost.
        while let Ok(m) = rx.try_recv() {
            match m {
                Msg::Record(r) => w.append(*r),
                Msg::Flush(ack) => {
                    w.flush();
                    let _ = ack.send(w.written);
                }
                Msg::Shutdown => {}
            }
        }
        w.roll();
        w.convert_tx = None; // closes the converter's channel; the scope joins it
        reported.report(shared);
    });
    let s = shared.stats();
    tracing::info!(
        written = s.written,
        dropped = s.dropped,
        lost = s.lost,
        segments = s.segments,
        "prediction log closed"
    );
}

/// Pushes counter deltas to the metrics facade once per tick (not per record), and warns
/// about drops since the last tick.
#[derive(Default)]
struct MetricsReported {
    written: u64,
    dropped: u64,
}

impl MetricsReported {
    fn report(&mut self, shared: &Shared) {
        let s = shared.stats();
        metrics::counter!("mesh_log_written_records_total")
            .increment(s.written.saturating_sub(self.written));
        metrics::gauge!("mesh_log_queued_records")
            .set(s.accepted.saturating_sub(s.written + s.lost) as f64);
        if s.dropped > self.dropped {
            tracing::warn!(
                dropped = s.dropped - self.dropped,
                dropped_total = s.dropped,
                "prediction log channel full: records dropped"
            );
        }
        self.written = s.written;
        self.dropped = s.dropped;
    }
}
