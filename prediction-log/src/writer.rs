//! The writer: a bounded channel in front of a dedicated thread that appends each record
//! to the wal of the open segment (a compact binary frame) and to the segment's Parquet
//! file (column builders, encoded a slice of rows at a time), and a second thread that
//! closes rolled segments (last row group, footer, fsync, rename).
//!
//! The request path only ever calls [`PredictionLogHandle::record`], a `try_send`: when the
//! channel is full the record is dropped and counted (`mesh_log_dropped_records_total`, and
//! a warning with the count at the next flush tick). Nothing on the request path waits for
//! the disk, and nothing wakes the writer: it takes what is queued every few milliseconds
//! ([`DRAIN_INTERVAL`]), so records reach it in batches without a wake-up per record. Both
//! threads run below the serving threads ([`LogConfig::writer_nice`], or `SCHED_IDLE` with
//! [`LogConfig::writer_idle`]): their work, spread thin, uses the CPU the serving threads
//! leave.

use crate::config::LogConfig;
use crate::error::{LogError, Result};
use crate::parquet_io::OpenParquet;
use crate::record::{date_of_us, now_us, FeatureLogging, PredictionRecord};
use crate::segment::{self, RecoveryReport};
use crate::wal::WalWriter;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch};

/// How often the writer takes what is queued while records arrive. Bounds the wait of
/// `flush()` and `shutdown()` too.
const DRAIN_INTERVAL: Duration = Duration::from_millis(5);
/// How often it looks when nothing arrived in the last round (an idle server).
const IDLE_INTERVAL: Duration = Duration::from_millis(25);
/// Records taken in one round before the writer looks at its clock again.
const ROUND_RECORDS: usize = 4096;

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
    /// The segment's Parquet file, filled as records arrive; `None` after a write to it
    /// failed, and then the closer converts the wal instead.
    parquet: Option<OpenParquet>,
    opened: Instant,
}

/// A rolled segment for the closer thread.
struct CloseJob {
    id: String,
    date: String,
    wal: PathBuf,
    parquet: Option<OpenParquet>,
}

struct Writer<'a> {
    cfg: LogConfig,
    shared: &'a Shared,
    open: Option<OpenSegment>,
    seq: u64,
    written: u64,
    close_tx: Option<SyncSender<CloseJob>>,
    error_reported: bool,
}

impl Writer<'_> {
    fn append(&mut self, rec: PredictionRecord) {
        let date = date_of_us(rec.ts_us);
        if self.open.as_ref().is_some_and(|s| s.date != date) {
            self.roll();
        }
        if self.open.is_none() {
            if let Err(e) = self.open_segment(date) {
                return self.lose(1, &e);
            }
        }
        let Some(seg) = self.open.as_mut() else {
            return;
        };
        if let Err(e) = seg.wal.append(&rec) {
            // The wal keeps what it had; recovery at the next start converts it.
            if let Some(p) = self.open.take().and_then(|s| s.parquet) {
                let _ = std::fs::remove_file(p.path());
            }
            return self.lose(1, &e);
        }
        if let Some(p) = seg.parquet.as_mut() {
            if let Err(e) = p.append(&rec) {
                // The wal has every record: the closer converts it instead.
                tracing::error!(error = %e, "prediction log Parquet write failed; the segment will be converted from its wal");
                metrics::counter!("mesh_log_convert_errors_total").increment(1);
                if let Some(p) = seg.parquet.take() {
                    let _ = std::fs::remove_file(p.path());
                }
            }
        }
        self.written += 1;
        self.shared.written.store(self.written, Ordering::Relaxed);
        if seg.wal.bytes() >= self.cfg.segment_max_bytes {
            self.roll();
        }
    }

    /// Opens a new segment for records of `date`: its wal and its Parquet file.
    fn open_segment(&mut self, date: String) -> Result<()> {
        let id = segment::segment_id(now_us(), self.seq);
        self.seq += 1;
        let wal = WalWriter::create(&segment::wal_path(&self.cfg.dir, &id))?;
        let parquet = match segment::open_parquet(&self.cfg.dir, &date, &id) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::error!(error = %e, "could not start a Parquet file; the segment will be converted from its wal");
                None
            }
        };
        self.open = Some(OpenSegment {
            id,
            date,
            wal,
            parquet,
            opened: Instant::now(),
        });
        Ok(())
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
                if let Some(p) = self.open.take().and_then(|s| s.parquet) {
                    let _ = std::fs::remove_file(p.path());
                }
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
        let job = CloseJob {
            id: seg.id,
            date: seg.date,
            wal: seg.wal.path().to_path_buf(),
            parquet: seg.parquet,
        };
        drop(seg.wal);
        if let Some(tx) = &self.close_tx {
            if tx.send(job).is_err() {
                tracing::error!("prediction log closer stopped; the wal stays for recovery");
            }
        }
    }
}

/// Closes one rolled segment: its Parquet file into place (or, when that file could not
/// be written, a conversion of its wal), then removes the wal.
fn close_segment(dir: &std::path::Path, job: CloseJob) -> Result<Option<PathBuf>> {
    if let Some(p) = job.parquet {
        let tmp = p.path().to_path_buf();
        match segment::close_parquet(dir, &job.date, &job.id, p) {
            Ok(path) => return Ok(Some(path)),
            Err(e) => {
                tracing::error!(error = %e, "could not close a segment's Parquet file; converting its wal");
                let _ = std::fs::remove_file(tmp);
            }
        }
    }
    segment::convert_wal(dir, &job.id, &job.wal)
}

fn close_main(dir: PathBuf, rx: Receiver<CloseJob>, shared: &Shared, (nice, idle): (i32, bool)) {
    crate::priority::lower_for_log(nice, idle);
    while let Ok(job) = rx.recv() {
        let wal = job.wal.clone();
        match close_segment(&dir, job) {
            Ok(path) => {
                if let Err(e) = std::fs::remove_file(&wal) {
                    tracing::warn!(error = %e, wal = %wal.display(), "could not remove converted wal");
                }
                shared.segments.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("mesh_log_segments_total").increment(1);
                if let Some(p) = path {
                    tracing::debug!(path = %p.display(), "segment closed");
                }
            }
            Err(e) => {
                metrics::counter!("mesh_log_convert_errors_total").increment(1);
                tracing::error!(error = %e, wal = %wal.display(),
                    "could not convert a segment to Parquet; its wal stays and is converted at the next start");
            }
        }
    }
}

fn writer_main(cfg: LogConfig, rx: Receiver<Msg>, shared: &Shared) {
    let (close_tx, close_rx) = mpsc::sync_channel::<CloseJob>(2);
    let dir = cfg.dir.clone();
    let (nice, idle) = (cfg.writer_nice, cfg.writer_idle);
    std::thread::scope(|scope| {
        // The closer starts before the writer lowers itself: a thread inherits its
        // parent's nice value, and each lowers itself once from the serving level.
        let closer = std::thread::Builder::new()
            .name("prediction-log-close".into())
            .spawn_scoped(scope, move || {
                close_main(dir, close_rx, shared, (nice, idle))
            });
        crate::priority::lower_for_log(nice, idle);
        let mut w = Writer {
            cfg,
            shared,
            open: None,
            seq: 0,
            written: 0,
            close_tx: Some(close_tx),
            error_reported: false,
        };
        if closer.is_err() {
            tracing::error!(
                "could not start the prediction log closer thread; segments stay as wal files"
            );
            w.close_tx = None;
        }
        let mut reported = run(&mut w, &rx);
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
        w.close_tx = None; // closes the closer's channel; the scope joins it
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

/// The writer's loop until a shutdown message or every handle is gone: take what is
/// queued, then sleep a little (nothing on the request path wakes this thread); flush,
/// roll by age and report at every flush tick.
fn run(w: &mut Writer<'_>, rx: &Receiver<Msg>) -> MetricsReported {
    let flush_interval = w.cfg.flush_interval;
    let max_age = w.cfg.segment_max_age;
    let mut reported = MetricsReported::default();
    let mut next_tick = Instant::now() + flush_interval;
    loop {
        let mut taken = 0usize;
        while taken < ROUND_RECORDS {
            match rx.try_recv() {
                Ok(Msg::Record(r)) => {
                    w.append(*r);
                    taken += 1;
                }
                Ok(Msg::Flush(ack)) => {
                    w.flush();
                    let _ = ack.send(w.written);
                }
                Ok(Msg::Shutdown) | Err(TryRecvError::Disconnected) => return reported,
                Err(TryRecvError::Empty) => break,
            }
        }
        let now = Instant::now();
        if now >= next_tick {
            w.flush();
            if w.open
                .as_ref()
                .is_some_and(|s| s.opened.elapsed() >= max_age)
            {
                w.roll();
            }
            reported.report(w.shared);
            w.error_reported = false;
            next_tick = Instant::now() + flush_interval;
        }
        if taken < ROUND_RECORDS {
            let pause = if taken == 0 {
                IDLE_INTERVAL
            } else {
                DRAIN_INTERVAL
            };
            std::thread::sleep(pause.min(next_tick.saturating_duration_since(Instant::now())));
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Role;

    fn records(n: usize) -> Vec<PredictionRecord> {
        (0..n)
            .map(|i| PredictionRecord::new(format!("r{i}"), "m", "1", Role::Primary))
            .collect()
    }

    /// A segment whose Parquet file could not be written is converted from its wal.
    #[test]
    fn a_segment_without_its_parquet_file_is_converted_from_the_wal() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(segment::wal_dir(dir.path())).unwrap();
        let id = segment::segment_id(now_us(), 0);
        let wal = segment::wal_path(dir.path(), &id);
        let mut w = WalWriter::create(&wal).unwrap();
        let recs = records(700);
        for r in &recs {
            w.append(r).unwrap();
        }
        w.flush(false).unwrap();
        let date = date_of_us(recs[0].ts_us);
        let job = CloseJob {
            id: id.clone(),
            date: date.clone(),
            wal: wal.clone(),
            parquet: None,
        };
        let path = close_segment(dir.path(), job).unwrap().unwrap();
        assert_eq!(path, segment::parquet_path(dir.path(), &date, &id));
        assert_eq!(crate::parquet_io::read_parquet(&path).unwrap(), recs);
    }

    /// The Parquet file filled as records arrive reads back like one written at once,
    /// across slices and with a part-filled last slice.
    #[test]
    fn a_parquet_file_filled_slice_by_slice_holds_every_record_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let recs = records(crate::parquet_io::SLICE_ROWS * 3 + 17);
        let date = date_of_us(recs[0].ts_us);
        let mut p = segment::open_parquet(dir.path(), &date, "x").unwrap();
        assert!(p
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with('.'));
        for r in &recs {
            p.append(r).unwrap();
        }
        let path = segment::close_parquet(dir.path(), &date, "x", p).unwrap();
        assert_eq!(crate::parquet_io::read_parquet(&path).unwrap(), recs);
    }
}
