//! The writer: a bounded queue in front of three threads.
//!
//! - The request path encodes each record straight into the queue's buffer as a wal frame
//!   ([`PredictionLogHandle::record_ref`]: the compact binary layout of `codec`, built
//!   from references into what the caller holds; a thread-local scratch buffer, then one
//!   copy under a short lock). Nothing is allocated per record, and no record object
//!   crosses threads.
//! - The writer thread takes the whole buffer every few milliseconds (swapping in its
//!   own, emptied), fills in each frame's checksum, appends the frames to the wal of the
//!   open segment as they are, and passes a copy on to the encoder. The wal is what keeps
//!   a record; this thread runs at [`LogConfig::writer_nice`] (under `SCHED_BATCH`).
//! - The encoder thread decodes the frames (borrowing their text) into the segment's
//!   Parquet column builders, encodes and compresses a slice of rows at a time and, when
//!   the segment rolls, finishes the file (footer, fsync, rename) and removes the wal.
//!   This is most of the log's CPU work, and by default it runs under `SCHED_IDLE`
//!   ([`LogConfig::encoder_idle`]). When it falls [`LogConfig::encoder_backlog`] records
//!   behind, the writer stops passing that segment's frames on and the encoder reads the
//!   rest of them from the segment's wal itself, as the writer appends them: the work
//!   done on the segment is kept, and the backlog waits on disk, not in memory. With [`LogConfig::worker_turns`], the serving
//!   runtime's workers build the columns in short turns before they park
//!   ([`worker_turn`]), and the thread keeps the steps that write to the file.
//! - The closer thread converts the segments whose Parquet file could not be written
//!   (or whose start or finish the encoder's queue had no room for) from their wal, under `SCHED_IDLE` with the encoder. The writer never waits
//!   for it: rolled segments its queue has no room for wait in order, each with its wal.
//!
//! The request path never waits for the disk: when [`LogConfig::channel_capacity`]
//! records wait in the queue, a record is dropped and counted
//! (`mesh_log_dropped_records_total`, and a warning with the count at the next flush
//! tick). Nothing wakes the writer: it takes what is queued every few milliseconds
//! ([`DRAIN_INTERVAL`]), so records reach it in batches without a wake-up per record (the
//! encoder takes its queue the same way). All three threads run below the serving
//! threads: their work, spread thin, uses the CPU the serving threads leave.

use crate::codec;
use crate::config::{LogConfig, ParquetMode};
use crate::error::{LogError, Result};
use crate::names::{Defined, NameRegistry};
use crate::parquet_write::OpenParquet;
use crate::record::{
    date_of_us, now_us, FeatureLogging, LoggedFeature, PredictionRecord, RecordRef,
};
use crate::segment::{self, RecoveryReport};
use crate::wal::{self, WalWriter};
use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch};

/// How often the writer takes what is queued while records arrive. Bounds the wait of
/// `flush()` and `shutdown()` too.
const DRAIN_INTERVAL: Duration = Duration::from_millis(5);
/// How often it looks when nothing arrived in the last round (an idle server).
const IDLE_INTERVAL: Duration = Duration::from_millis(25);
/// A buffer that grew past this in a burst is not kept for reuse once it is done.
const KEEP_BUFFER_BYTES: usize = 8 << 20;
/// While writes keep failing, their error is logged at most this often (the metric
/// counts every record lost).
const ERROR_REPORT_INTERVAL: Duration = Duration::from_secs(10);
/// After a segment could not be opened, the writer tries again only this much later;
/// the records in between are lost, and counted.
const OPEN_RETRY: Duration = Duration::from_millis(100);
/// Microseconds in a day: segments hold the records of one UTC date.
const DAY_US: i64 = 86_400_000_000;

/// What the handles ask of the writer besides records (those go through [`Queue`]).
enum Msg {
    Flush(oneshot::Sender<u64>),
    Shutdown,
}

/// Why the queue refused a frame.
enum Refused {
    Full,
    Closed,
}

/// The frames waiting for the writer, in the order they were accepted.
struct Pending {
    frames: Vec<u8>,
    records: usize,
    /// Set when the writer has stopped: nothing more is taken.
    closed: bool,
}

/// The queue between the request path and the writer: one buffer of sealed wal frames
/// (checksums still empty) behind a lock held only to copy a frame in, or to swap the
/// buffer out. At most `capacity` records wait.
struct Queue {
    pending: Mutex<Pending>,
    capacity: usize,
}

impl Queue {
    fn new(capacity: usize) -> Self {
        Self {
            pending: Mutex::new(Pending {
                frames: Vec::new(),
                records: 0,
                closed: false,
            }),
            capacity,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        // Nothing can panic while the lock is held (a copy, a swap), and the state is
        // whole at every step, so a poisoned lock is still good.
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, frame: &[u8]) -> Result<(), Refused> {
        let mut p = self.lock();
        if p.closed {
            return Err(Refused::Closed);
        }
        if p.records >= self.capacity {
            return Err(Refused::Full);
        }
        p.frames.extend_from_slice(frame);
        p.records += 1;
        Ok(())
    }

    /// Takes every waiting frame, leaving `empty` (cleared) in their place; with `close`,
    /// refuses whatever comes after.
    fn take(&self, mut empty: Vec<u8>, close: bool) -> (Vec<u8>, usize) {
        empty.clear();
        let mut p = self.lock();
        p.closed |= close;
        let n = std::mem::take(&mut p.records);
        (std::mem::replace(&mut p.frames, empty), n)
    }
}

thread_local! {
    /// Where a serving thread encodes a record before copying it into the queue.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The queue and the counters shared by the handles and the writer's threads.
struct Shared {
    queue: Queue,
    /// Records passed to the encoder and not yet in its column builders.
    enc_queued: AtomicUsize,
    accepted: AtomicU64,
    dropped: AtomicU64,
    written: AtomicU64,
    flushed: AtomicU64,
    lost: AtomicU64,
    open_errors: AtomicU64,
    segments: AtomicU64,
    encoder_behind: AtomicU64,
    closer_segments: AtomicU64,
    deferred: AtomicU64,
    /// Records the serving runtime's workers put into the Parquet columns
    /// ([`worker_turn`]).
    on_workers: AtomicU64,
    /// The ids of the lists of feature names records share.
    names: NameRegistry,
}

/// A snapshot of the writer's counters (since this process started the log).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct LogStats {
    /// Records accepted into the queue.
    pub accepted: u64,
    /// Records dropped because the queue was full (or the writer had stopped, or the
    /// record was larger than a wal frame may be).
    pub dropped: u64,
    /// Records appended to a wal.
    pub written: u64,
    /// Records handed to the OS (they survive a kill of this process).
    pub flushed: u64,
    /// Records lost to write errors (disk full, permissions), logged as errors.
    pub lost: u64,
    /// Attempts to open a new segment that failed (its wal could not be created).
    /// After one, the writer tries again only 100 ms later; the records in between are
    /// lost, and counted in `lost`.
    pub open_errors: u64,
    /// Segments closed into Parquet files.
    pub segments: u64,
    /// Segments on which the encoder fell `encoder_backlog` records behind: it read the
    /// rest of each from its wal (or, when its queue could not take even that word,
    /// the segment was converted from its wal at close).
    pub encoder_behind: u64,
    /// Segments the closer converted from their wal: their Parquet file could not be
    /// written, or the encoder's queue had no room for their start or finish.
    pub closer_segments: u64,
    /// With `parquet = deferred`: closed segments waiting in `_wal/closed/` for a
    /// converter, as the writer last counted them (at a roll or a flush tick).
    pub deferred: u64,
    /// Records that the serving runtime's workers put into the Parquet columns in their
    /// turns ([`LogConfig::worker_turns`]); the encoder thread did the rest.
    pub on_workers: u64,
}

impl Shared {
    fn new(capacity: usize) -> Self {
        Self {
            queue: Queue::new(capacity),
            enc_queued: AtomicUsize::new(0),
            accepted: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            written: AtomicU64::new(0),
            flushed: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            open_errors: AtomicU64::new(0),
            segments: AtomicU64::new(0),
            encoder_behind: AtomicU64::new(0),
            closer_segments: AtomicU64::new(0),
            deferred: AtomicU64::new(0),
            on_workers: AtomicU64::new(0),
            names: NameRegistry::new(),
        }
    }

    fn stats(&self) -> LogStats {
        LogStats {
            accepted: self.accepted.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            written: self.written.load(Ordering::Relaxed),
            flushed: self.flushed.load(Ordering::Acquire),
            lost: self.lost.load(Ordering::Relaxed),
            open_errors: self.open_errors.load(Ordering::Relaxed),
            segments: self.segments.load(Ordering::Relaxed),
            encoder_behind: self.encoder_behind.load(Ordering::Relaxed),
            closer_segments: self.closer_segments.load(Ordering::Relaxed),
            deferred: self.deferred.load(Ordering::Relaxed),
            on_workers: self.on_workers.load(Ordering::Relaxed),
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
        let deferred = config.parquet == ParquetMode::Deferred;
        let wdir = if deferred {
            segment::closed_dir(&config.dir)
        } else {
            segment::wal_dir(&config.dir)
        };
        std::fs::create_dir_all(&wdir).map_err(|e| LogError::io(&wdir, e))?;
        let recovered = segment::recover_keeping(&config.dir, deferred)?;
        // Closed segments a previous run left for a converter count against the bound.
        let waiting = if deferred {
            segment::closed_segments(&config.dir)?
        } else {
            Vec::new()
        };
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
        metrics::counter!("mesh_log_open_errors_total").increment(0);
        metrics::counter!("mesh_log_encoder_behind_segments_total").increment(0);
        metrics::counter!("mesh_log_closer_segments_total").increment(0);
        metrics::gauge!("mesh_log_segments_waiting_for_closer").set(0.0);
        metrics::counter!("mesh_log_deferred_bound_segments_total").increment(0);
        metrics::gauge!("mesh_log_deferred_segments").set(waiting.len() as f64);
        metrics::gauge!("mesh_log_deferred_bytes")
            .set(waiting.iter().map(|(_, _, b)| *b).sum::<u64>() as f64);
        let (tx, rx) = mpsc::sync_channel(16);
        let (done_tx, done_rx) = watch::channel(false);
        let shared = Arc::new(Shared::new(config.channel_capacity));
        shared
            .deferred
            .store(waiting.len() as u64, Ordering::Relaxed);
        let features = config.features;
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("plog-writer".into())
                .spawn(move || {
                    writer_main(config, rx, &shared, waiting);
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
    /// Queues a record without waiting. Returns false (and counts the drop) when the queue
    /// is full or the writer has stopped. Applies the feature logging mode.
    pub fn record(&self, rec: PredictionRecord) -> bool {
        self.record_ref(&rec.view())
    }

    /// [`record`](Self::record) from references: encodes the record straight into the
    /// queue, so a caller that holds the data in its own types logs it without building a
    /// [`PredictionRecord`]. The request path's way to log.
    pub fn record_ref<K: AsRef<str>, F: LoggedFeature>(&self, rec: &RecordRef<'_, K, F>) -> bool {
        let pushed = SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
            Ok(mut buf) => {
                let pushed = self.encode(rec, &mut buf).is_ok() && self.push(&buf);
                if buf.capacity() > KEEP_BUFFER_BYTES {
                    *buf = Vec::new();
                }
                pushed
            }
            // Not reentrant; were it ever, a buffer of its own.
            Err(_) => {
                let mut buf = Vec::new();
                self.encode(rec, &mut buf).is_ok() && self.push(&buf)
            }
        });
        if !pushed {
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("mesh_log_dropped_records_total").increment(1);
        }
        pushed
    }

    /// Encodes `rec` as one wal frame into `buf` (cleared first), dropping its features
    /// when the logging mode does not keep them. The error is the payload's size, when
    /// the record is too large for a frame.
    fn encode<K: AsRef<str>, F: LoggedFeature>(
        &self,
        rec: &RecordRef<'_, K, F>,
        buf: &mut Vec<u8>,
    ) -> std::result::Result<(), usize> {
        buf.clear();
        match rec.features {
            Some(_) if !self.features.keeps(rec.request_id) => wal::push_frame(
                buf,
                0,
                &RecordRef {
                    features: None,
                    ..*rec
                },
            ),
            Some(fs) => wal::push_frame(buf, self.shared.names.id_of(fs), rec),
            None => wal::push_frame(buf, 0, rec),
        }
    }

    fn push(&self, frame: &[u8]) -> bool {
        let ok = self.shared.queue.push(frame).is_ok();
        if ok {
            self.shared.accepted.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    /// Queues a record, waiting for room in the queue. For tools and tests (back-fills,
    /// load generators); the request path uses [`record_ref`](Self::record_ref).
    pub async fn record_wait(&self, rec: PredictionRecord) -> Result<()> {
        let mut buf = Vec::new();
        if let Err(bytes) = self.encode(&rec.view(), &mut buf) {
            // The id may be what makes it large: name it by its start.
            let mut request_id: String = rec.request_id.chars().take(64).collect();
            if request_id.len() < rec.request_id.len() {
                request_id.push('…');
            }
            return Err(LogError::RecordTooLarge {
                request_id,
                bytes,
                limit: wal::MAX_FRAME,
            });
        }
        loop {
            match self.shared.queue.push(&buf) {
                Ok(()) => {
                    self.shared.accepted.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                Err(Refused::Full) => tokio::time::sleep(Duration::from_micros(200)).await,
                Err(Refused::Closed) => return Err(LogError::Closed),
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
    /// The UTC day of its records (days since the epoch).
    day: i64,
    wal: WalWriter,
    /// While the encoder builds this segment's Parquet file: the flag either side sets
    /// when that is given up (the encoder fell behind, or the file could not be written).
    /// `None` once given up: the closer converts the segment from its wal.
    encoding: Option<Arc<AtomicBool>>,
    /// The encoder fell behind on this segment: it reads the rest of it from the wal
    /// itself, and the writer passes nothing more on.
    from_wal: bool,
    opened: Instant,
    /// The name sets whose frames its wal holds.
    names: Defined,
}

/// Work for the encoder thread, in the order the writer made it.
enum EncMsg {
    /// A new segment: start its Parquet file.
    Start {
        id: String,
        date: String,
        gave_up: Arc<AtomicBool>,
    },
    /// Sealed, checksummed wal frames of the segment: `records` of them. The encoder
    /// hands the buffer back (`recycled`) when it is done with it.
    Frames { buf: Vec<u8>, records: usize },
    /// The encoder fell behind: the segment's frames from byte `offset` of its wal on
    /// are not passed on, and the encoder reads them from the wal itself, as the writer
    /// appends them, up to the end of the file once `Finish` comes.
    FromWal { wal: PathBuf, offset: u64 },
    /// The segment rolled: finish its Parquet file, put it into place, remove the wal.
    /// From here the encoder owns the segment (it hands it to the closer if the file
    /// fails).
    Finish { wal: PathBuf },
}

/// A rolled segment for the closer thread, to be converted from its wal.
struct CloseJob {
    id: String,
    wal: PathBuf,
    /// A closed segment of a deferred conversion (in `_wal/closed/`): converted under
    /// its lock, since `mesh logs convert` may be at it too.
    closed: bool,
}

struct Writer<'a> {
    cfg: LogConfig,
    shared: &'a Shared,
    open: Option<OpenSegment>,
    seq: u64,
    written: u64,
    enc_tx: Option<SyncSender<EncMsg>>,
    close_tx: Option<SyncSender<CloseJob>>,
    /// Rolled segments the closer's queue had no room for, oldest first: the writer
    /// never waits for a conversion (the closer runs idle, and may be starved for a
    /// while); each keeps its wal until the closer takes it.
    to_close: std::collections::VecDeque<CloseJob>,
    /// With `parquet = deferred`: closed segments waiting in `_wal/closed/` for a
    /// converter, oldest first, with their sizes.
    deferred: std::collections::VecDeque<(CloseJob, u64)>,
    /// When a write error was last logged.
    error_reported: Option<Instant>,
    /// When opening a segment last failed, until one opens.
    open_failed: Option<Instant>,
    /// The empty buffer the next take leaves in the queue.
    spare: Vec<u8>,
    /// Buffers the encoder is done with.
    recycled: Option<Receiver<Vec<u8>>>,
}

/// Tells the encoder to drop the Parquet file of a segment it was building.
fn give_up(encoding: Option<Arc<AtomicBool>>) {
    if let Some(flag) = encoding {
        flag.store(true, Ordering::Release);
    }
}

impl Writer<'_> {
    /// Counts a segment whose Parquet file is given up because the encoder is behind.
    fn encoder_behind(&self) {
        self.shared.encoder_behind.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("mesh_log_encoder_behind_segments_total").increment(1);
    }

    /// Takes what waits in the queue and writes it; with `close`, the queue refuses
    /// records from here on. Returns how many records were taken. The queue's buffer and
    /// the writer's trade places at each take, so the request path copies its frames
    /// into memory that is already there (no page faults, no reallocation once both have
    /// grown to a take's size).
    fn take(&mut self, close: bool) -> usize {
        let empty = std::mem::take(&mut self.spare);
        let (mut frames, n) = self.shared.queue.take(empty, close);
        if n > 0 {
            self.append_frames(&mut frames);
        }
        frames.clear();
        self.spare = if frames.capacity() > KEEP_BUFFER_BYTES {
            Vec::new()
        } else {
            frames
        };
        n
    }

    /// Writes the frames of `buf` (as the queue holds them) to the wal of the segment
    /// of their date, rolling by date and by size between frames, and passes each run
    /// of frames of one segment on to its encoder.
    fn append_frames(&mut self, buf: &mut [u8]) {
        let mut run = 0; // where the frames not yet written start
        let mut count = 0; // how many frames that is
        let mut at = 0;
        loop {
            // Frames are encoded by this crate; a timestamp that does not read cannot
            // happen, and would file the record under the epoch rather than lose it.
            let next = wal::frame_at(buf, at).map(|(payload, end)| {
                let day = codec::ts_of(payload).unwrap_or(0).div_euclid(DAY_US);
                (end, day, codec::name_set_of(payload))
            });
            let Some((end, day, set)) = next else { break };
            wal::checksum_frame(buf, at);
            if self.open.as_ref().is_some_and(|s| s.day != day) {
                self.write_run(&buf[run..at], count);
                (run, count) = (at, 0);
                self.roll();
            }
            if self.open.is_none() && !self.try_open(day) {
                // This frame cannot be kept.
                (run, at) = (end, end);
                continue;
            }
            if let Some(set) =
                set.filter(|s| self.open.as_ref().is_some_and(|o| !o.names.contains(*s)))
            {
                // Its names go into the wal first.
                self.write_run(&buf[run..at], count);
                (run, count) = (at, 0);
                if self.open.is_none() {
                    continue; // that write failed: this frame goes to a new segment
                }
                if !self.define_names(set) {
                    (run, at) = (end, end);
                    continue;
                }
            }
            count += 1;
            at = end;
            let size = self.open.as_ref().map_or(0, |s| s.wal.bytes()) + (at - run) as u64;
            if size >= self.cfg.segment_max_bytes {
                self.write_run(&buf[run..at], count);
                (run, count) = (at, 0);
                self.roll();
            }
        }
        self.write_run(&buf[run..], count);
    }

    /// A buffer the encoder is done with, or a new one.
    fn recycled_buffer(&mut self) -> Vec<u8> {
        let mut buf = self
            .recycled
            .as_ref()
            .and_then(|r| r.try_recv().ok())
            .unwrap_or_default();
        buf.clear();
        buf
    }

    /// Writes the frame of name set `set` into the open segment's wal, before the first
    /// record that uses it, and passes it on to the encoder. False when it could not be
    /// written (the record that needs it is lost, and counted).
    fn define_names(&mut self, set: u32) -> bool {
        let mut frame = Vec::new();
        if !self.shared.names.push_frame(set, &mut frame) {
            // Ids come from the registry; a record naming another cannot be read back.
            self.lose(
                1,
                &LogError::Config(format!("name set {set} is not registered")),
            );
            return false;
        }
        let Some(seg) = self.open.as_mut() else {
            return false;
        };
        if let Err(e) = seg.wal.append_frames(&frame) {
            self.write_failed(1, &e);
            return false;
        }
        seg.names.insert(set);
        self.pass_on(&frame, 0);
        true
    }

    /// Appends `count` frames to the open segment's wal and, while the segment's Parquet
    /// file is being built and the encoder's backlog has room, passes a copy on to the
    /// encoder.
    fn write_run(&mut self, frames: &[u8], count: usize) {
        if count == 0 {
            return;
        }
        let Some(seg) = self.open.as_mut() else {
            return;
        };
        if let Err(e) = seg.wal.append_frames(frames) {
            return self.write_failed(count as u64, &e);
        }
        self.written += count as u64;
        self.shared.written.store(self.written, Ordering::Relaxed);
        self.pass_on(frames, count);
    }

    /// Passes frames just written to the open segment's wal (`count` records among
    /// them) on to its encoder, while its Parquet file is being built and the encoder's
    /// backlog has room. Past the backlog, the encoder reads the rest of the segment
    /// from its wal instead (once the wal holds them: the frames may still be in its
    /// buffer), so the work it did on the segment is kept and nothing more is copied;
    /// only when its queue cannot take even that word is the segment's Parquet file
    /// given up, for the closer to convert from the wal at the roll.
    fn pass_on(&mut self, frames: &[u8], count: usize) {
        let Some(seg) = self.open.as_mut() else {
            return;
        };
        let Some(flag) = &seg.encoding else { return };
        if flag.load(Ordering::Acquire) || self.enc_tx.is_none() {
            return give_up(seg.encoding.take());
        }
        if seg.from_wal {
            return;
        }
        let backlog = self.shared.enc_queued.load(Ordering::Relaxed);
        if backlog + count > self.cfg.encoder_backlog {
            let msg = EncMsg::FromWal {
                wal: seg.wal.path().to_path_buf(),
                // These frames are the wal's last bytes.
                offset: seg.wal.bytes() - frames.len() as u64,
            };
            match self.enc_tx.as_ref().map(|tx| tx.try_send(msg)) {
                Some(Ok(())) => seg.from_wal = true,
                _ => give_up(seg.encoding.take()),
            }
            return self.encoder_behind();
        }
        self.shared.enc_queued.fetch_add(count, Ordering::Relaxed);
        let mut buf = self.recycled_buffer();
        buf.extend_from_slice(frames);
        let msg = EncMsg::Frames {
            buf,
            records: count,
        };
        let sent = self.enc_tx.as_ref().map(|tx| tx.try_send(msg));
        if !matches!(sent, Some(Ok(()))) {
            self.shared.enc_queued.fetch_sub(count, Ordering::Relaxed);
            give_up(self.open.as_mut().and_then(|s| s.encoding.take()));
            if matches!(sent, Some(Err(TrySendError::Full(_)))) {
                self.encoder_behind();
            }
        }
    }

    /// Counts `n` records lost; the total so far.
    fn count_lost(&self, n: u64) -> u64 {
        metrics::counter!("mesh_log_lost_records_total").increment(n);
        self.shared.lost.fetch_add(n, Ordering::Relaxed) + n
    }

    /// Opens a segment for records of `day`, none being open. After a failure it tries
    /// again only once [`OPEN_RETRY`] has passed, so that a directory that takes no new
    /// file (removed, full, read-only) costs an attempt (and a file created or not) per
    /// interval, not one per record. False when no segment is open: the record is lost,
    /// and counted.
    fn try_open(&mut self, day: i64) -> bool {
        if self.open_failed.is_some_and(|at| at.elapsed() < OPEN_RETRY) {
            self.count_lost(1);
            return false;
        }
        match self.open_segment(day) {
            Ok(()) => {
                self.open_failed = None;
                true
            }
            Err(e) => {
                self.open_failed = Some(Instant::now());
                self.shared.open_errors.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("mesh_log_open_errors_total").increment(1);
                self.lose(1, &e);
                false
            }
        }
    }

    /// Opens a new segment for records of `day`: its wal and its Parquet file.
    fn open_segment(&mut self, day: i64) -> Result<()> {
        let date = date_of_us(day.saturating_mul(DAY_US));
        let id = segment::segment_id(now_us(), self.seq);
        self.seq += 1;
        let wal = WalWriter::create(&segment::wal_path(&self.cfg.dir, &id))?;
        let mut encoding = None;
        if let Some(tx) = &self.enc_tx {
            let flag = Arc::new(AtomicBool::new(false));
            let start = EncMsg::Start {
                id: id.clone(),
                date,
                gave_up: flag.clone(),
            };
            match tx.try_send(start) {
                Ok(()) => encoding = Some(flag),
                Err(TrySendError::Full(_)) => self.encoder_behind(),
                Err(TrySendError::Disconnected(_)) => {}
            }
        }
        self.open = Some(OpenSegment {
            id,
            day,
            wal,
            encoding,
            from_wal: false,
            opened: Instant::now(),
            names: Defined::new(),
        });
        Ok(())
    }

    /// Counts `n` records lost to `e`, and logs it: at once, then at most once every
    /// [`ERROR_REPORT_INTERVAL`] while writes keep failing (a full disk fails every
    /// write), with the total lost so far.
    fn lose(&mut self, n: u64, e: &LogError) {
        let total = self.count_lost(n);
        if self
            .error_reported
            .is_none_or(|at| at.elapsed() >= ERROR_REPORT_INTERVAL)
        {
            tracing::error!(error = %e, lost_total = total, "prediction log write failed; records are being lost");
            self.error_reported = Some(Instant::now());
        }
    }

    /// A write to the open segment's wal failed (a full disk, say). The `count` records
    /// of that write are lost, and so may be every record since the last flush that
    /// succeeded: they were in the wal's buffer, or handed to the OS by a write whose
    /// data a failed fsync leaves in doubt. All of them are counted lost (the wal may
    /// still hold some, which then read back), and the segment is abandoned: its wal is
    /// closed up to its last whole frame, and the next record opens a new segment.
    fn write_failed(&mut self, count: u64, e: &LogError) {
        let unflushed = self.written
            - self
                .shared
                .flushed
                .load(Ordering::Acquire)
                .min(self.written);
        self.written -= unflushed;
        self.shared.written.store(self.written, Ordering::Relaxed);
        self.abandon();
        self.lose(count + unflushed, e);
    }

    fn flush(&mut self) {
        if let Some(seg) = self.open.as_mut() {
            if let Err(e) = seg.wal.flush(self.cfg.fsync) {
                return self.write_failed(0, &e);
            }
        }
        self.shared.flushed.store(self.written, Ordering::Release);
        // What a kill cannot take back: the records handed to the OS so far.
        metrics::gauge!("mesh_log_flushed_records").set(self.written as f64);
    }

    fn roll(&mut self) {
        self.flush();
        if let Some(seg) = self.open.take() {
            self.close(seg);
        }
    }

    /// Gives up the open segment after a failed write to its wal: it takes no more
    /// records (the next ones open a new segment), and it is closed as a rolled one is,
    /// from its wal up to the last whole frame, so that the records written to it reach
    /// a Parquet file in this run, not at the next start (if the disk is still full, that
    /// conversion fails and the wal waits for the next start).
    fn abandon(&mut self) {
        if let Some(mut seg) = self.open.take() {
            give_up(seg.encoding.take());
            self.close(seg);
        }
    }

    /// Closes a segment taken from `open`: its Parquet file finished by the encoder,
    /// or its wal handed to the closer (or, deferred, moved to `_wal/closed/`).
    fn close(&mut self, seg: OpenSegment) {
        let wal = seg.wal.path().to_path_buf();
        let bytes = seg.wal.bytes();
        drop(seg.wal);
        if self.cfg.parquet == ParquetMode::Deferred {
            // Closed: it moves to where converters look. The rename is atomic; if a
            // crash loses it, the segment is back among the open ones and the next start
            // converts it.
            let closed = segment::closed_wal_path(&self.cfg.dir, &seg.id);
            match std::fs::rename(&wal, &closed) {
                Ok(()) => {
                    let job = CloseJob {
                        id: seg.id,
                        wal: closed,
                        closed: true,
                    };
                    self.deferred.push_back((job, bytes));
                    return self.bound_deferred();
                }
                Err(e) => {
                    tracing::warn!(error = %e, wal = %wal.display(),
                        "could not move a rolled segment to _wal/closed; converting it here");
                }
            }
        }
        if let Some(flag) = seg.encoding {
            if !flag.load(Ordering::Acquire) {
                let finish = EncMsg::Finish { wal: wal.clone() };
                match self.enc_tx.as_ref().map(|tx| tx.try_send(finish)) {
                    Some(Ok(())) => return,
                    Some(Err(TrySendError::Full(_))) => self.encoder_behind(),
                    _ => {}
                }
            }
            give_up(Some(flag));
        }
        self.to_close.push_back(CloseJob {
            id: seg.id,
            wal,
            closed: false,
        });
        self.hand_to_closer(false);
    }

    /// Forgets the closed segments a converter has taken, and hands the oldest of the
    /// rest to the closer while they take more than `deferred_max_bytes`.
    fn bound_deferred(&mut self) {
        self.deferred.retain(|(job, _)| job.wal.exists());
        let mut total: u64 = self.deferred.iter().map(|(_, b)| b).sum();
        while total > self.cfg.deferred_max_bytes {
            let Some((job, bytes)) = self.deferred.pop_front() else {
                break;
            };
            total -= bytes;
            metrics::counter!("mesh_log_deferred_bound_segments_total").increment(1);
            self.to_close.push_back(job);
        }
        let n = self.deferred.len() as u64;
        self.shared.deferred.store(n, Ordering::Relaxed);
        metrics::gauge!("mesh_log_deferred_segments").set(n as f64);
        metrics::gauge!("mesh_log_deferred_bytes").set(total as f64);
        self.hand_to_closer(false);
    }

    /// Hands the closer the segments waiting for it: as many as its queue takes, or,
    /// with `wait` (at shutdown), all of them. Without a closer the wals stay, and the
    /// next start converts them.
    fn hand_to_closer(&mut self, wait: bool) {
        let Some(tx) = &self.close_tx else {
            self.to_close.clear();
            return;
        };
        while let Some(job) = self.to_close.pop_front() {
            let sent = if wait {
                tx.send(job).map_err(|e| TrySendError::Disconnected(e.0))
            } else {
                tx.try_send(job)
            };
            match sent {
                Ok(()) => {}
                Err(TrySendError::Full(job)) => {
                    self.to_close.push_front(job);
                    break;
                }
                Err(TrySendError::Disconnected(_)) => {
                    tracing::error!("prediction log closer stopped; the wal stays for recovery");
                    self.to_close.clear();
                }
            }
        }
        metrics::gauge!("mesh_log_segments_waiting_for_closer").set(self.to_close.len() as f64);
    }
}

/// Removes a closed segment's wal, now that its Parquet file is in place, and counts the
/// segment; a wal without a record (one abandoned at its first write) has no file and
/// is not counted.
fn segment_closed(shared: &Shared, wal: &std::path::Path, path: Option<PathBuf>) {
    if let Err(e) = std::fs::remove_file(wal) {
        tracing::warn!(error = %e, wal = %wal.display(), "could not remove converted wal");
    }
    if let Some(p) = path {
        shared.segments.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("mesh_log_segments_total").increment(1);
        tracing::debug!(path = %p.display(), "segment closed");
    }
}

/// The closer thread: converts rolled segments that have no Parquet file from their wal.
fn close_main(dir: PathBuf, rx: Receiver<CloseJob>, shared: &Shared, (nice, idle): (i32, bool)) {
    crate::priority::lower_for_log(nice, idle);
    let mut pace = crate::priority::Pace::new();
    while let Ok(job) = rx.recv() {
        pace.rest();
        if job.closed {
            match segment::convert_closed_segment(&dir, &job.id, &job.wal, &mut || pace.tick()) {
                Ok(Some(c)) => {
                    shared.segments.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!("mesh_log_segments_total").increment(1);
                    tracing::debug!(id = %c.id, records = c.records, "closed segment converted");
                }
                // Another process converts it, or has.
                Ok(None) => {}
                Err(e) => {
                    metrics::counter!("mesh_log_convert_errors_total").increment(1);
                    tracing::error!(error = %e, wal = %job.wal.display(),
                        "could not convert a closed segment to Parquet; its wal stays for `mesh logs convert` or the next start");
                }
            }
            continue;
        }
        match segment::convert_wal(&dir, &job.id, &job.wal, &mut || pace.tick()) {
            Ok(path) => {
                if path.is_some() {
                    shared.closer_segments.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!("mesh_log_closer_segments_total").increment(1);
                }
                segment_closed(shared, &job.wal, path);
            }
            Err(e) => {
                metrics::counter!("mesh_log_convert_errors_total").increment(1);
                tracing::error!(error = %e, wal = %job.wal.display(),
                    "could not convert a segment to Parquet; its wal stays and is converted at the next start");
            }
        }
    }
}

/// The segment whose Parquet file the encoder is building.
struct Encoding {
    id: String,
    date: String,
    gave_up: Arc<AtomicBool>,
    /// `None` once given up.
    file: Option<OpenParquet>,
    /// The name sets of its wal's frames, as they came.
    sets: codec::NameSets,
    /// After the encoder fell behind: the rest of the segment, read from its wal.
    tail: Option<WalTail>,
}

/// Bytes the encoder reads from a wal at a time when it reads a segment's frames from
/// there ([`EncMsg::FromWal`]).
const TAIL_READ: usize = 256 << 10;

/// A segment's frames that the encoder reads from its wal, as the writer appends them.
struct WalTail {
    path: PathBuf,
    file: std::fs::File,
    /// Bytes read and not yet appended from `at` on: whole frames up to `whole`, then
    /// the start of one the writer has not finished writing (or handing to the OS).
    buf: Vec<u8>,
    at: usize,
    whole: usize,
    /// The writer rolled the segment: its wal is complete.
    complete: bool,
}

/// What a read of a segment's wal ([`Encoding::read_tail`]) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tail {
    /// Appended every whole frame it read.
    Appended,
    /// `go_on` said stop before the last of them.
    Paused,
    /// Nothing more to append for now (or the file was given up).
    Empty,
}

impl WalTail {
    fn open(path: PathBuf, offset: u64) -> Result<Self> {
        use std::io::{Seek, SeekFrom};
        let mut file = std::fs::File::open(&path).map_err(|e| LogError::io(&path, e))?;
        file.seek(SeekFrom::Start(offset))
            .map_err(|e| LogError::io(&path, e))?;
        Ok(Self {
            path,
            file,
            buf: Vec::new(),
            at: 0,
            whole: 0,
            complete: false,
        })
    }

    /// Reads what the wal holds past the last read (up to [`TAIL_READ`] bytes, or the
    /// rest of a frame started), once every whole frame read before is appended.
    /// True when there are whole frames to append. Each frame's checksum is verified
    /// (a frame that fails it, or whose length no frame may have, is an error: the
    /// segment is then converted from its wal, which stops at such a frame).
    fn read_more(&mut self) -> Result<bool> {
        use std::io::Read;
        self.buf.drain(..self.whole);
        (self.at, self.whole) = (0, 0);
        // The rest of a frame whose start was read (its length checked then).
        let rest_of_frame = self
            .buf
            .get(..wal::FRAME_HEADER)
            .map_or(0, |h| wal::FRAME_HEADER + wal::frame_len(h))
            .saturating_sub(self.buf.len());
        let want = TAIL_READ.max(rest_of_frame) as u64;
        (&mut self.file)
            .take(want)
            .read_to_end(&mut self.buf)
            .map_err(|e| LogError::io(&self.path, e))?;
        let mut at = 0;
        while let Some((payload, next)) = wal::frame_at(&self.buf, at) {
            if !wal::frame_checksum_ok(&self.buf, at, payload) {
                return Err(LogError::schema(
                    &self.path,
                    "a frame whose checksum does not match, read back by the Parquet encoder",
                ));
            }
            at = next;
        }
        self.whole = at;
        if let Some(h) = self.buf.get(at..at + wal::FRAME_HEADER) {
            let len = wal::frame_len(h);
            if len > wal::MAX_FRAME {
                return Err(LogError::schema(
                    &self.path,
                    format!("a frame of {len} bytes, past the largest a wal frame may be"),
                ));
            }
        }
        Ok(at > 0)
    }

    /// Bytes read past the last whole frame: once the wal is complete, a torn frame.
    fn leftover(&self) -> usize {
        self.buf.len() - self.whole
    }
}

impl Encoding {
    /// At the segment's `Finish`: whether its file can be finished. While its frames
    /// come from the wal, not the first time: the writer flushed the wal before
    /// `Finish`, and the encoder reads it to its end first; then a torn frame at the
    /// end gives the file up.
    fn ready_to_finish(&mut self, wal: &std::path::Path) -> bool {
        let Some(t) = self.tail.as_mut() else {
            return true;
        };
        if !t.complete {
            t.complete = true;
            return false;
        }
        let torn = t.leftover();
        self.tail = None;
        if torn > 0 {
            self.failed(&LogError::schema(
                wal,
                format!("{torn} bytes after the last whole frame of a rolled segment"),
            ));
        }
        true
    }

    /// Appends the frames of the segment's wal past those appended before, as far as
    /// `go_on` allows (see [`OpenParquet::append_frames_from`]); gives the file up if
    /// the wal cannot be read or a frame does not append.
    fn read_tail(&mut self, go_on: &mut dyn FnMut() -> bool) -> Tail {
        if self.gave_up.load(Ordering::Acquire) || self.file.is_none() {
            self.tail = None;
            self.drop_file();
            return Tail::Empty;
        }
        let Some(t) = self.tail.as_mut() else {
            return Tail::Empty;
        };
        let appended = match t.at < t.whole {
            true => Ok(true),
            false => t.read_more(),
        }
        .and_then(|more| match (more, self.file.as_mut()) {
            (true, Some(f)) => f
                .append_frames_from(&t.buf[..t.whole], t.at, &mut self.sets, go_on, true)
                .map(|(at, _)| {
                    t.at = at;
                    if at < t.whole {
                        Tail::Paused
                    } else {
                        Tail::Appended
                    }
                }),
            _ => Ok(Tail::Empty),
        });
        appended.unwrap_or_else(|e| {
            self.tail = None;
            self.failed(&e);
            Tail::Empty
        })
    }

    /// Drops the Parquet file and its temp file (the segment is converted from its wal).
    fn drop_file(&mut self) {
        if let Some(f) = self.file.take() {
            f.discard();
        }
    }

    /// Decodes the frames of `frames` (sealed wal frames) from offset `at` on into the
    /// Parquet file's column builders, while `go_on` says so (see
    /// [`OpenParquet::append_frames_from`]). Returns where it stopped (`frames.len()` once
    /// every frame is done with: appended, or the file given up) and how many records it
    /// appended.
    fn append_frames(
        &mut self,
        frames: &[u8],
        at: usize,
        go_on: &mut dyn FnMut() -> bool,
        row_groups: bool,
    ) -> (usize, usize) {
        if self.gave_up.load(Ordering::Acquire) {
            self.drop_file();
            return (frames.len(), 0);
        }
        let Some(f) = self.file.as_mut() else {
            return (frames.len(), 0);
        };
        match f.append_frames_from(frames, at, &mut self.sets, go_on, row_groups) {
            Ok(done) => done,
            Err(e) => {
                self.failed(&e);
                (frames.len(), 0)
            }
        }
    }

    /// A write to the Parquet file failed: give it up, the wal has every record.
    fn failed(&mut self, e: &LogError) {
        tracing::error!(error = %e, "prediction log Parquet write failed; the segment will be converted from its wal");
        metrics::counter!("mesh_log_convert_errors_total").increment(1);
        self.gave_up.store(true, Ordering::Release);
        self.drop_file();
    }
}

/// How long a serving runtime's worker works on the encoder's queue in one turn
/// ([`worker_turn`]), checked between records: a request that arrives meanwhile waits at
/// most about this long (plus one page of a column, when a record fills one).
pub const WORKER_TURN: Duration = Duration::from_micros(20);

/// How often the encoder thread looks at its queue when the serving runtime's workers
/// take turns at it ([`LogConfig::worker_turns`]): it is then the backstop, for the
/// steps a turn leaves to it (a worker wakes it for those) and for a server whose
/// workers are never idle.
const BACKSTOP_INTERVAL: Duration = Duration::from_millis(20);

/// The encoder: its queue, the segment whose Parquet file it builds, and the frames it
/// is in the middle of. The encoder thread works on it and, with
/// [`LogConfig::worker_turns`], so do the serving runtime's workers in short turns
/// ([`worker_turn`]), each taking the lock only if it is free.
struct Encoder {
    dir: PathBuf,
    rx: Receiver<EncMsg>,
    close_tx: SyncSender<CloseJob>,
    recycle: SyncSender<Vec<u8>>,
    shared: Arc<Shared>,
    current: Option<Encoding>,
    /// A message taken and not done with: frames appended up to `at`, or a step left to
    /// the encoder thread.
    held: Option<EncMsg>,
    at: usize,
    /// The writer is gone and the queue is empty.
    stopped: bool,
    /// The encoder thread, which a worker's turn wakes for a step it leaves to it.
    thread: Option<std::thread::Thread>,
    /// A worker's turn failed (panicked): the workers leave this encoder alone.
    no_turns: bool,
    /// Tests: a worker's turn panics.
    #[cfg(test)]
    fail_turns: bool,
}

/// How a round of [`Encoder::work`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Worked {
    /// The queue is empty.
    Idle,
    /// `go_on` said stop.
    Paused,
    /// The next step is the encoder thread's (a turn on a worker stopped before it).
    ForThread,
    /// The writer is gone: nothing more will come.
    Stopped,
}

impl Encoder {
    /// Works through the queue while `go_on` (asked between records) says so, and at
    /// least one record or step. `thread`: the encoder thread, which also takes the
    /// steps that write to the file (a segment's start and finish, a full row group,
    /// 1-3 ms each); a worker's turn stops before those. Returns how it ended, and
    /// whether it did anything.
    fn work(&mut self, go_on: &mut dyn FnMut() -> bool, thread: bool) -> (Worked, bool) {
        #[cfg(test)]
        assert!(thread || !self.fail_turns, "a worker's turn failed (test)");
        let mut did = false;
        loop {
            if self.stopped {
                return (Worked::Stopped, did);
            }
            if did && !go_on() {
                return (Worked::Paused, did);
            }
            if self.current.as_ref().is_some_and(|c| c.tail.is_some()) {
                // The segment's frames come from its wal, which the thread reads.
                if !thread {
                    return (Worked::Idle, did);
                }
                match self.current.as_mut().map(|c| c.read_tail(go_on)) {
                    Some(Tail::Appended) => {
                        did = true;
                        continue;
                    }
                    Some(Tail::Paused) => return (Worked::Paused, true),
                    _ => {}
                }
            }
            let msg = match self.held.take() {
                Some(m) => m,
                None => match self.rx.try_recv() {
                    Ok(m) => m,
                    Err(TryRecvError::Empty) => return (Worked::Idle, did),
                    Err(TryRecvError::Disconnected) => {
                        // A segment the writer gave up and never finished.
                        if let Some(mut c) = self.current.take() {
                            c.drop_file();
                        }
                        self.stopped = true;
                        return (Worked::Stopped, did);
                    }
                },
            };
            match msg {
                EncMsg::Frames { mut buf, records } => {
                    let (at, appended) = match self.current.as_mut() {
                        Some(c) => c.append_frames(&buf, self.at, go_on, thread),
                        None => (buf.len(), 0),
                    };
                    did |= at > self.at;
                    if !thread {
                        self.shared
                            .on_workers
                            .fetch_add(appended as u64, Ordering::Relaxed);
                    }
                    if at < buf.len() {
                        self.at = at;
                        self.held = Some(EncMsg::Frames { buf, records });
                        let full = self
                            .current
                            .as_ref()
                            .and_then(|c| c.file.as_ref())
                            .is_some_and(OpenParquet::row_group_full);
                        let why = if full && !thread {
                            Worked::ForThread
                        } else {
                            Worked::Paused
                        };
                        return (why, did);
                    }
                    did = true;
                    self.at = 0;
                    self.shared.enc_queued.fetch_sub(records, Ordering::Relaxed);
                    if buf.capacity() <= KEEP_BUFFER_BYTES {
                        buf.clear();
                        let _ = self.recycle.try_send(buf);
                    }
                }
                m if !thread => {
                    self.held = Some(m);
                    return (Worked::ForThread, did);
                }
                EncMsg::Start { id, date, gave_up } => {
                    did = true;
                    self.start(id, date, gave_up);
                }
                EncMsg::FromWal { wal, offset } => {
                    did = true;
                    self.read_on_from_wal(wal, offset);
                }
                EncMsg::Finish { wal } => {
                    did = true;
                    if !self
                        .current
                        .as_mut()
                        .is_none_or(|c| c.ready_to_finish(&wal))
                    {
                        // The step above reads the wal to its end first.
                        self.held = Some(EncMsg::Finish { wal });
                        continue;
                    }
                    self.finish(wal);
                }
            }
        }
    }

    /// The encoder fell behind on the current segment: its frames from `offset` on
    /// are to be read from its wal.
    fn read_on_from_wal(&mut self, wal: PathBuf, offset: u64) {
        let Some(c) = self.current.as_mut() else {
            return;
        };
        if c.file.is_none() {
            return;
        }
        match WalTail::open(wal, offset) {
            Ok(t) => c.tail = Some(t),
            Err(e) => c.failed(&e),
        }
    }

    fn start(&mut self, id: String, date: String, gave_up: Arc<AtomicBool>) {
        if let Some(mut c) = self.current.take() {
            c.drop_file();
        }
        let mut c = Encoding {
            file: None,
            id,
            date,
            gave_up,
            sets: codec::NameSets::default(),
            tail: None,
        };
        // Given up before the encoder got to it: nothing to start.
        if !c.gave_up.load(Ordering::Acquire) {
            match segment::open_parquet(&self.dir, &c.date, &c.id) {
                Ok(f) => c.file = Some(f),
                Err(e) => c.failed(&e),
            }
        }
        self.current = Some(c);
    }

    fn finish(&mut self, wal: PathBuf) {
        let Some(mut c) = self.current.take() else {
            return;
        };
        if let Some(f) = c.file.take() {
            let tmp = f.path().to_path_buf();
            match segment::close_parquet(&self.dir, &c.date, &c.id, f) {
                Ok(path) => return segment_closed(&self.shared, &wal, Some(path)),
                Err(e) => {
                    let _ = std::fs::remove_file(tmp);
                    c.failed(&e);
                }
            }
        }
        // The writer handed this segment over: convert it from its wal.
        let job = CloseJob {
            id: c.id,
            wal,
            closed: false,
        };
        if self.close_tx.send(job).is_err() {
            tracing::error!("prediction log closer stopped; the wal stays for recovery");
        }
    }
}

/// The encoders that the serving runtime's workers take turns at
/// ([`LogConfig::worker_turns`]).
static TURNS: std::sync::RwLock<Vec<std::sync::Weak<Mutex<Encoder>>>> =
    std::sync::RwLock::new(Vec::new());

thread_local! {
    /// The metrics of the runtime this thread works for (none outside a runtime), so
    /// that its turns see work waiting for it.
    static RUNTIME: std::cell::OnceCell<Option<tokio::runtime::RuntimeMetrics>> =
        const { std::cell::OnceCell::new() };
}

/// Whether the runtime of the calling thread has tasks in its global queue: tasks woken
/// from outside it (a model's answer from its runner thread, a batch's reply) wait
/// there for a worker. An atomic load.
fn runtime_has_work() -> bool {
    RUNTIME.with(|m| {
        m.get_or_init(|| {
            tokio::runtime::Handle::try_current()
                .ok()
                .map(|h| h.metrics())
        })
        .as_ref()
        .is_some_and(|m| m.global_queue_depth() > 0)
    })
}

/// Whether a turn that started at `start` takes another step.
fn turn_goes_on(start: Instant) -> bool {
    start.elapsed() < WORKER_TURN && !runtime_has_work()
}

/// One turn of a serving runtime's worker at the Parquet work of each prediction log
/// started with [`LogConfig::worker_turns`]: for about [`WORKER_TURN`], and only if
/// the encoder is not busy already; it ends early, at the next record, when a task
/// woken from outside the runtime waits for a worker (its global queue). Meant for the
/// moment a worker has nothing else to do: `mesh serve` calls it from tokio's
/// `on_thread_park`. A worker then builds the columns on a thread that is running
/// anyway, so the encoder thread, which any waking serving thread preempts, has less
/// to do. The steps that write to the file stay with the encoder thread (a turn wakes
/// it for them). Without such a log, a read lock and an empty loop.
pub fn worker_turn() {
    let Ok(encoders) = TURNS.try_read() else {
        return;
    };
    for enc in encoders.iter() {
        if let Some(enc) = enc.upgrade() {
            take_turn(&enc);
        }
    }
}

/// One worker's turn at `enc`, if it is free and still open to turns.
fn take_turn(enc: &Mutex<Encoder>) {
    let Ok(mut e) = enc.try_lock() else { return };
    if e.no_turns {
        return;
    }
    let start = Instant::now();
    let turn = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        e.work(&mut || turn_goes_on(start), false)
    }));
    match turn {
        Ok((Worked::ForThread, _)) => {
            if let Some(t) = &e.thread {
                t.unpark();
            }
        }
        Ok(_) => {}
        // A fault in the column building must not take a serving worker down with it.
        // The segment's Parquet file, whose columns may hold half a record, is given up
        // (its wal has every record, and it is converted from there when it rolls), and
        // the encoder thread alone goes on from here.
        Err(_) => {
            e.no_turns = true;
            if let Some(c) = e.current.as_mut() {
                c.failed(&LogError::Config(
                    "a serving worker's turn at the Parquet columns panicked; worker turns are off for this log".into(),
                ));
            }
        }
    }
}

/// The encoder thread: builds each segment's Parquet file from the records the writer
/// passes on, and puts it into place when the segment rolls. Takes its queue every few
/// milliseconds, like the writer, so that passing a record on wakes nothing; works in
/// spells with a nap between ([`crate::priority::Pace`]), leaving the encoder to the
/// workers' turns meanwhile. With `turns` ([`LogConfig::worker_turns`]), it registers
/// the encoder for [`worker_turn`] and looks only every [`BACKSTOP_INTERVAL`], or when
/// a turn wakes it.
fn encode_main(
    dir: PathBuf,
    rx: Receiver<EncMsg>,
    (close_tx, recycle): (SyncSender<CloseJob>, SyncSender<Vec<u8>>),
    shared: Arc<Shared>,
    (nice, idle): (i32, bool),
    turns: bool,
) {
    crate::priority::lower_for_log(nice, idle);
    let enc = Arc::new(Mutex::new(Encoder {
        dir,
        rx,
        close_tx,
        recycle,
        shared,
        current: None,
        held: None,
        at: 0,
        stopped: false,
        thread: Some(std::thread::current()),
        no_turns: false,
        #[cfg(test)]
        fail_turns: false,
    }));
    if turns {
        let mut list = TURNS.write().unwrap_or_else(PoisonError::into_inner);
        list.retain(|e| e.strong_count() > 0);
        list.push(Arc::downgrade(&enc));
    }
    let lock = || enc.lock().unwrap_or_else(PoisonError::into_inner);
    let mut pace = crate::priority::Pace::new();
    loop {
        let (worked, did) = lock().work(&mut || !pace.spell_over(), true);
        match worked {
            Worked::Stopped => break,
            Worked::Paused => pace.nap(),
            Worked::Idle | Worked::ForThread => {
                std::thread::park_timeout(if turns {
                    BACKSTOP_INTERVAL
                } else if did {
                    DRAIN_INTERVAL
                } else {
                    IDLE_INTERVAL
                });
                pace.rest();
            }
        }
    }
    // Out of the workers' reach before the encoder goes.
    if turns {
        let mut list = TURNS.write().unwrap_or_else(PoisonError::into_inner);
        list.retain(|e| !std::ptr::eq(e.as_ptr(), Arc::as_ptr(&enc)) && e.strong_count() > 0);
    }
}

/// `waiting`: the closed segments a previous run left for a converter (deferred
/// conversion), oldest first, with their sizes.
fn writer_main(
    cfg: LogConfig,
    rx: Receiver<Msg>,
    shared: &Arc<Shared>,
    waiting: Vec<(String, PathBuf, u64)>,
) {
    let (close_tx, close_rx) = mpsc::sync_channel::<CloseJob>(2);
    // The backlog is bounded in records (`Shared::enc_queued`); each message carries at
    // least one, besides a segment's start and finish.
    // Runs of frames (each of at least one record, bounded by `encoder_backlog`, or a
    // name set's), and room beside them for the words about segments (start, read on
    // from the wal, finish) of a few rolls.
    let (enc_tx, enc_rx) = mpsc::sync_channel::<EncMsg>(cfg.encoder_backlog.min(1024) + 16);
    let (recycle_tx, recycle_rx) = mpsc::sync_channel::<Vec<u8>>(4);
    let dir = cfg.dir.clone();
    let (nice, idle) = (cfg.writer_nice, cfg.writer_idle);
    let encoder_idle = idle || cfg.encoder_idle;
    let turns = cfg.worker_turns;
    let inline = cfg.parquet == ParquetMode::Inline;
    // Before the closer and the encoder start: they inherit it.
    crate::priority::pin_for_log(&cfg.cpus);
    std::thread::scope(|scope| {
        // The closer and the encoder start before the writer lowers itself: a thread
        // inherits its parent's nice value, and each lowers itself once from the serving
        // level.
        let closer = {
            let dir = dir.clone();
            std::thread::Builder::new()
                .name("plog-closer".into())
                .spawn_scoped(scope, move || {
                    close_main(dir, close_rx, shared, (nice, encoder_idle))
                })
        };
        // Deferred conversion: no encoder; segments roll as their wal.
        let encoder = inline.then(|| {
            let close_tx = close_tx.clone();
            std::thread::Builder::new()
                .name("plog-encoder".into())
                .spawn_scoped(scope, move || {
                    encode_main(
                        dir,
                        enc_rx,
                        (close_tx, recycle_tx),
                        shared.clone(),
                        (nice, encoder_idle),
                        turns,
                    )
                })
        });
        crate::priority::lower_for_log(nice, idle);
        let mut w = Writer {
            cfg,
            shared,
            open: None,
            seq: 0,
            written: 0,
            enc_tx: Some(enc_tx),
            close_tx: Some(close_tx),
            to_close: std::collections::VecDeque::new(),
            deferred: std::collections::VecDeque::new(),
            error_reported: None,
            open_failed: None,
            spare: Vec::new(),
            recycled: Some(recycle_rx),
        };
        if closer.is_err() {
            tracing::error!(
                "could not start the prediction log closer thread; segments stay as wal files"
            );
            w.close_tx = None;
        }
        match encoder {
            Some(Ok(_)) => {}
            Some(Err(_)) => {
                tracing::error!(
                    "could not start the prediction log encoder thread; segments are converted from their wal when they roll"
                );
                w.enc_tx = None;
            }
            None => {
                w.enc_tx = None;
                w.recycled = None;
                w.deferred = waiting
                    .into_iter()
                    .map(|(id, wal, bytes)| {
                        let job = CloseJob {
                            id,
                            wal,
                            closed: true,
                        };
                        (job, bytes)
                    })
                    .collect();
                w.bound_deferred();
            }
        }
        let mut reported = run(&mut w, &rx);
        // Everything accepted before the shutdown is written, and whatever is still
        // queued: the queue is closed as it is taken, so nothing is accepted after.
        w.take(true);
        while let Ok(m) = rx.try_recv() {
            if let Msg::Flush(ack) = m {
                w.flush();
                let _ = ack.send(w.written);
            }
        }
        w.roll();
        w.hand_to_closer(true);
        // The roll above counted what waits (`bound_deferred`).
        if !w.deferred.is_empty() {
            tracing::info!(
                segments = w.deferred.len(),
                dir = %segment::closed_dir(&w.cfg.dir).display(),
                "prediction log: closed segments wait for `mesh logs convert`"
            );
        }
        // Closes the encoder's channel, then the closer's (once the encoder is done with
        // its copy); the scope joins both.
        w.enc_tx = None;
        w.close_tx = None;
        reported.report(shared);
    });
    let s = shared.stats();
    tracing::info!(
        written = s.written,
        dropped = s.dropped,
        lost = s.lost,
        open_errors = s.open_errors,
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
        let taken = w.take(false);
        loop {
            match rx.try_recv() {
                Ok(Msg::Flush(ack)) => {
                    // What was accepted before the flush was asked for is in the queue.
                    w.take(false);
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
            if w.deferred.is_empty() {
                w.hand_to_closer(false);
            } else {
                w.bound_deferred();
            }
            reported.report(w.shared);
            next_tick = Instant::now() + flush_interval;
        }
        let pause = if taken == 0 {
            IDLE_INTERVAL
        } else {
            DRAIN_INTERVAL
        };
        std::thread::sleep(pause.min(next_tick.saturating_duration_since(Instant::now())));
    }
}

/// Pushes counter deltas to the metrics facade once per tick (not per record), and warns
/// about drops since the last tick.
#[derive(Default)]
struct MetricsReported {
    /// Records flushed, as `mesh_log_written_records_total` has counted them so far
    /// (`flushed` never goes back; `written` can, after a failed write).
    flushed: u64,
    dropped: u64,
    on_workers: u64,
}

impl MetricsReported {
    fn report(&mut self, shared: &Shared) {
        let s = shared.stats();
        // Records handed to the OS: a count that never goes back (`written` does, when a
        // failed write takes back the records since the last good flush), and at a flush
        // tick, right after the flush, the same as `written`.
        metrics::counter!("mesh_log_written_records_total")
            .increment(s.flushed.saturating_sub(self.flushed));
        metrics::counter!("mesh_log_worker_turn_records_total")
            .increment(s.on_workers.saturating_sub(self.on_workers));
        metrics::gauge!("mesh_log_queued_records")
            .set(s.accepted.saturating_sub(s.written + s.lost) as f64);
        if s.dropped > self.dropped {
            tracing::warn!(
                dropped = s.dropped - self.dropped,
                dropped_total = s.dropped,
                "prediction log channel full: records dropped"
            );
        }
        self.flushed = s.flushed;
        self.dropped = s.dropped;
        self.on_workers = s.on_workers;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Role;

    use crate::record::numbered;
    use crate::wal::write_wal;

    fn records(n: usize) -> Vec<PredictionRecord> {
        numbered(n, Role::Primary)
    }

    /// A writer whose encoder takes a backlog of `backlog` records and whose closer
    /// queue the test reads, with nobody taking either.
    fn writer<'a>(
        dir: &std::path::Path,
        shared: &'a Shared,
        backlog: usize,
    ) -> (Writer<'a>, Receiver<EncMsg>, Receiver<CloseJob>) {
        std::fs::create_dir_all(segment::wal_dir(dir)).unwrap();
        let (enc_tx, enc_rx) = mpsc::sync_channel(backlog + 2);
        let (close_tx, close_rx) = mpsc::sync_channel(2);
        let mut cfg = LogConfig::new(dir);
        cfg.encoder_backlog = backlog;
        let w = Writer {
            cfg,
            shared,
            open: None,
            seq: 0,
            written: 0,
            enc_tx: Some(enc_tx),
            close_tx: Some(close_tx),
            to_close: std::collections::VecDeque::new(),
            deferred: std::collections::VecDeque::new(),
            error_reported: None,
            open_failed: None,
            spare: Vec::new(),
            recycled: None,
        };
        (w, enc_rx, close_rx)
    }

    /// Queues `recs` as the request path does and lets the writer take them, `per_take`
    /// at a time.
    fn feed(w: &mut Writer<'_>, recs: &[PredictionRecord], per_take: usize) {
        for chunk in recs.chunks(per_take) {
            for r in chunk {
                let mut buf = Vec::new();
                let set = r
                    .features
                    .as_deref()
                    .map_or(0, |fs| w.shared.names.id_of(fs));
                assert!(wal::push_frame(&mut buf, set, &r.view()).is_ok());
                assert!(w.shared.queue.push(&buf).is_ok());
            }
            assert_eq!(w.take(false), chunk.len());
        }
    }

    /// `recs` as the writer passes them to the encoder.
    fn frames_of(recs: &[PredictionRecord]) -> EncMsg {
        let mut buf = Vec::new();
        for r in recs {
            assert!(wal::push_sealed_frame(&mut buf, 0, &r.view()).is_ok());
        }
        EncMsg::Frames {
            buf,
            records: recs.len(),
        }
    }

    /// The Start of segment `id` for records of `recs[0]`'s date, and its flag.
    fn start(id: &str, recs: &[PredictionRecord], gave_up: bool) -> (EncMsg, Arc<AtomicBool>) {
        let flag = Arc::new(AtomicBool::new(gave_up));
        let msg = EncMsg::Start {
            id: id.into(),
            date: date_of_us(recs[0].ts_us),
            gave_up: flag.clone(),
        };
        (msg, flag)
    }

    /// Runs the encoder thread over `msgs` until they are all taken, then stops it.
    fn encode(dir: &std::path::Path, shared: &Arc<Shared>, msgs: Vec<EncMsg>) -> Vec<String> {
        let (tx, rx) = mpsc::sync_channel(msgs.len().max(1));
        let (close_tx, close_rx) = mpsc::sync_channel(8);
        for m in msgs {
            tx.send(m).unwrap();
        }
        drop(tx);
        let (recycle_tx, _recycled) = mpsc::sync_channel(8);
        encode_main(
            dir.to_path_buf(),
            rx,
            (close_tx, recycle_tx),
            shared.clone(),
            (0, false),
            false,
        );
        close_rx.try_iter().map(|j| j.id).collect()
    }

    fn files_under(dir: &std::path::Path) -> Vec<String> {
        let mut out = Vec::new();
        for p in segment::partition_dirs(dir).unwrap() {
            for e in std::fs::read_dir(p).unwrap() {
                out.push(e.unwrap().file_name().to_string_lossy().into_owned());
            }
        }
        out.sort();
        out
    }

    fn wal_of(dir: &std::path::Path, id: &str, recs: &[PredictionRecord]) -> PathBuf {
        std::fs::create_dir_all(segment::wal_dir(dir)).unwrap();
        let wal = segment::wal_path(dir, id);
        write_wal(&wal, recs);
        wal
    }

    /// Ten records whose features name two lists (the first five one, the rest the
    /// other), so that a wal holds a name-set frame in each half.
    fn records_with_features() -> Vec<PredictionRecord> {
        let mut recs = records(10);
        for (i, r) in recs.iter_mut().enumerate() {
            let names: &[&str] = if i < 5 { &["a"] } else { &["b", "c"] };
            r.features = Some(
                names
                    .iter()
                    .map(|n| crate::FeatureUsed {
                        name: (*n).into(),
                        value: Some(i as f64 * 0.5),
                        status: "PRESENT".into(),
                        event_time_us: Some(r.ts_us - 1_000),
                    })
                    .collect(),
            );
        }
        recs
    }

    /// A writer with an encoder backlog of four records, and a queue of 16 messages that
    /// nobody takes, fed `recs` one take each and rolled: the segment's id, the messages
    /// its encoder got, and the closer's queue.
    fn fed_behind(
        dir: &std::path::Path,
        shared: &Shared,
        recs: &[PredictionRecord],
    ) -> (String, Vec<EncMsg>, Receiver<CloseJob>) {
        let (mut w, _, close_rx) = writer(dir, shared, 4);
        let (tx, enc_rx) = mpsc::sync_channel(16);
        w.enc_tx = Some(tx);
        feed(&mut w, recs, 1);
        let seg = w.open.as_ref().unwrap();
        assert!(
            seg.from_wal && seg.encoding.is_some(),
            "the encoder reads on from the wal"
        );
        let id = seg.id.clone();
        w.roll();
        (id, enc_rx.try_iter().collect(), close_rx)
    }

    /// When the encoder falls `encoder_backlog` records behind, the writer passes it
    /// nothing more of the segment but where in the wal the rest starts, keeps writing
    /// the wal, and at the roll hands the segment over as usual. The encoder reads the
    /// rest from the wal (a name set defined there too): its file holds every record in
    /// order, the work before is kept, and the closer gets nothing.
    #[test]
    fn an_encoder_that_falls_behind_reads_the_rest_of_the_segment_from_its_wal() {
        let dir = tempfile::tempdir().unwrap();
        let shared = Arc::new(Shared::new(1024));
        let recs = records_with_features();
        let (_, queued, close_rx) = fed_behind(dir.path(), &shared, &recs);
        assert_eq!(shared.stats().encoder_behind, 1, "counted once per segment");
        // Start, the first name set, four records, the word, Finish.
        assert_eq!(queued.len(), 8);
        let passed: Vec<usize> = queued
            .iter()
            .filter_map(|m| match m {
                EncMsg::Frames { buf, records } => Some((buf.len(), *records)),
                _ => None,
            })
            .map(|(bytes, records)| {
                assert!(records <= 1);
                bytes
            })
            .collect();
        assert_eq!(passed.len(), 5);
        let EncMsg::FromWal { offset, .. } = &queued[6] else {
            panic!("the word to read on from the wal");
        };
        let expected = wal::MAGIC.len() + passed.iter().sum::<usize>();
        assert_eq!(*offset, expected as u64, "where the fifth record starts");
        assert!(matches!(queued[7], EncMsg::Finish { .. }));
        assert_eq!(shared.enc_queued.load(Ordering::Relaxed), 4);
        let closed = encode(dir.path(), &shared, queued);
        assert!(closed.is_empty(), "nothing for the closer: {closed:?}");
        assert!(close_rx.try_recv().is_err());
        let back = crate::read_all(dir.path(), crate::ReadOptions::default()).unwrap();
        assert_eq!(back, recs);
        assert_eq!(files_under(dir.path()).len(), 1, "no temp file left");
        assert_eq!(
            std::fs::read_dir(segment::wal_dir(dir.path()))
                .unwrap()
                .count(),
            0
        );
        assert_eq!(shared.stats().segments, 1);
    }

    /// A frame read back from the wal that fails its checksum gives the segment's
    /// Parquet file up: the closer converts the segment from its wal instead (which
    /// stops at that frame, as recovery does), and no half-built file is put in place.
    #[test]
    fn a_wal_frame_the_encoder_cannot_read_back_sends_the_segment_to_the_closer() {
        let dir = tempfile::tempdir().unwrap();
        let shared = Arc::new(Shared::new(1024));
        let (id, queued, _close_rx) = fed_behind(dir.path(), &shared, &records_with_features());
        let EncMsg::FromWal { wal, offset } = &queued[6] else {
            panic!("the word to read on from the wal");
        };
        let mut bytes = std::fs::read(wal).unwrap();
        let last = bytes.len() - 1;
        assert!(last > *offset as usize + wal::FRAME_HEADER);
        bytes[last] ^= 0xff;
        std::fs::write(wal, bytes).unwrap();
        let closed = encode(dir.path(), &shared, queued);
        assert_eq!(closed, vec![id]);
        assert!(
            files_under(dir.path()).is_empty(),
            "{:?}",
            files_under(dir.path())
        );
    }

    /// The encoder reads the frames the wal holds as they come: a frame cut in two by
    /// the writer's buffer is taken once its second part is there, and what follows the
    /// last whole frame is counted as left over.
    #[test]
    fn a_wal_read_takes_whole_frames_as_they_are_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.wal");
        let recs = records(3);
        let mut frames = Vec::new();
        let mut ends = Vec::new();
        for r in &recs {
            assert!(wal::push_sealed_frame(&mut frames, 0, &r.view()).is_ok());
            ends.push(frames.len());
        }
        let cut = ends[0] + 3; // inside the second frame's header
        let mut file = std::fs::File::create(&path).unwrap();
        use std::io::Write;
        file.write_all(wal::MAGIC).unwrap();
        file.write_all(&frames[..cut]).unwrap();
        let mut t = WalTail::open(path.clone(), wal::MAGIC.len() as u64).unwrap();
        assert!(t.read_more().unwrap());
        assert_eq!((t.at, t.whole, t.leftover()), (0, ends[0], 3));
        t.at = t.whole; // appended
        assert!(!t.read_more().unwrap(), "nothing whole yet");
        assert_eq!(t.leftover(), 3);
        file.write_all(&frames[cut..]).unwrap();
        assert!(t.read_more().unwrap());
        assert_eq!((t.whole, t.leftover()), (ends[2] - ends[0], 0));
        // A length no frame may have is an error, not a wait for more bytes.
        t.at = t.whole;
        file.write_all(&u32::MAX.to_le_bytes()).unwrap();
        file.write_all(&[0; 4]).unwrap();
        assert!(t.read_more().is_err());
    }

    /// A closer that falls behind (it runs idle, and a busy machine starves it) never
    /// holds up the writer: the segments its queue has no room for wait in roll order,
    /// each with its wal, and are handed over as room comes; at shutdown, all of them.
    #[test]
    fn a_closer_that_falls_behind_never_holds_up_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let shared = Arc::new(Shared::new(1024));
        // A backlog of one, and nobody takes the encoder's queue (three messages): once
        // it is full, no segment's start or finish fits in it, so every roll goes to
        // the closer, whose queue holds two.
        let (mut w, _enc_rx, close_rx) = writer(dir.path(), &shared, 1);
        let recs = records(21);
        let segments: Vec<&[PredictionRecord]> = recs.chunks(3).collect();
        for seg in &segments[..4] {
            feed(&mut w, seg, 1);
            w.roll();
        }
        assert_eq!(shared.stats().written, 12);
        assert_eq!(
            w.to_close.len(),
            2,
            "two wait while the closer's queue is full"
        );
        let mut jobs: Vec<CloseJob> = close_rx.try_iter().collect();
        assert_eq!(jobs.len(), 2);
        w.hand_to_closer(false);
        assert!(w.to_close.is_empty());
        jobs.extend(close_rx.try_iter());
        assert_eq!(jobs.len(), 4);
        // Three more with nobody taking: the shutdown hands over the one left waiting.
        for seg in &segments[4..] {
            feed(&mut w, seg, 1);
            w.roll();
        }
        assert_eq!(w.to_close.len(), 1);
        let taker = std::thread::spawn(move || close_rx.iter().take(3).collect::<Vec<_>>());
        w.hand_to_closer(true);
        jobs.extend(taker.join().unwrap());
        assert!(w.to_close.is_empty());
        assert_eq!(shared.stats().written, 21);
        for (job, seg) in jobs.iter().zip(&segments) {
            let path = segment::convert_wal(dir.path(), &job.id, &job.wal, &mut || ())
                .unwrap()
                .unwrap();
            assert_eq!(crate::parquet_io::read_parquet(&path).unwrap(), *seg);
        }
        assert_eq!(jobs.len(), segments.len());
    }

    /// One take whose frames cross a date and the segment size: each frame goes to the
    /// wal of its own segment, each segment's run to the encoder between its Start and
    /// Finish, and the files hold every record in order.
    #[test]
    fn one_take_across_a_date_and_a_size_roll_files_every_record_in_its_segment() {
        let dir = tempfile::tempdir().unwrap();
        let shared = Arc::new(Shared::new(1024));
        let (mut w, enc_rx, close_rx) = writer(dir.path(), &shared, 64);
        let mut recs = records(7);
        let base = 1_709_164_800_000_000i64; // 2024-02-29T00:00:00Z
        for (i, r) in recs.iter_mut().enumerate() {
            r.ts_us = base + if i < 5 { i as i64 } else { DAY_US };
        }
        // A segment rolls once its wal (magic and frames) reaches this: after two records.
        let mut one = Vec::new();
        codec::encode(&recs[0].view(), &mut one);
        w.cfg.segment_max_bytes = (8 + 2 * (wal::FRAME_HEADER + one.len())) as u64;
        feed(&mut w, &recs, recs.len());
        w.roll();
        assert!(close_rx.try_recv().is_err());
        let msgs: Vec<EncMsg> = enc_rx.try_iter().collect();
        let shape: Vec<String> = msgs
            .iter()
            .map(|m| match m {
                EncMsg::Start { date, .. } => format!("start {date}"),
                EncMsg::Frames { records, .. } => format!("{records}"),
                EncMsg::FromWal { offset, .. } => format!("from wal {offset}"),
                EncMsg::Finish { .. } => "finish".into(),
            })
            .collect();
        assert_eq!(
            shape,
            [
                "start 2024-02-29",
                "2",
                "finish",
                "start 2024-02-29",
                "2",
                "finish",
                "start 2024-02-29",
                "1",
                "finish",
                "start 2024-03-01",
                "2",
                "finish"
            ]
        );
        assert_eq!(shared.stats().written, 7);
        let handed = encode(dir.path(), &shared, msgs);
        assert!(handed.is_empty(), "{handed:?}");
        assert_eq!(shared.enc_queued.load(Ordering::Relaxed), 0);
        let back = crate::reader::read_all(dir.path(), crate::ReadOptions::default()).unwrap();
        assert_eq!(back, recs);
        assert_eq!(crate::segment::parquet_files(dir.path()).unwrap().len(), 4);
    }

    /// While the encoder keeps up, the roll hands it the segment (not the closer).
    #[test]
    fn a_segment_the_encoder_kept_up_with_is_finished_by_the_encoder() {
        let dir = tempfile::tempdir().unwrap();
        let shared = Arc::new(Shared::new(1024));
        let (mut w, enc_rx, close_rx) = writer(dir.path(), &shared, 64);
        let recs = records(10);
        feed(&mut w, &recs, 4);
        w.roll();
        assert!(close_rx.try_recv().is_err());
        let msgs: Vec<EncMsg> = enc_rx.try_iter().collect();
        // Start, one run of frames per take (4 + 4 + 2), Finish.
        assert_eq!(msgs.len(), 5);
        assert!(matches!(msgs.last(), Some(EncMsg::Finish { .. })));
        assert_eq!(shared.stats().encoder_behind, 0);
        // The encoder builds the file, puts it into place and removes the wal.
        let handed = encode(dir.path(), &shared, msgs);
        assert!(handed.is_empty(), "{handed:?}");
        let files = crate::segment::parquet_files(dir.path()).unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(crate::parquet_io::read_parquet(&files[0]).unwrap(), recs);
        assert!(crate::segment::wal_files(dir.path()).unwrap().is_empty());
        assert_eq!(files_under(dir.path()).len(), 1, "no temp file left");
        assert_eq!(shared.stats().segments, 1);
    }

    /// A segment given up while the encoder still held its file: the encoder removes its
    /// temp file and writes nothing in its place.
    #[test]
    fn the_encoder_drops_the_file_of_a_segment_given_up() {
        let dir = tempfile::tempdir().unwrap();
        let shared = Arc::new(Shared::new(1024));
        let recs = records(3);
        let (start, gave_up) = start("a", &recs, false);
        // Given up after the encoder opened its file: seen at the next record.
        let (tx, rx) = mpsc::sync_channel(8);
        let (close_tx, close_rx) = mpsc::sync_channel(2);
        tx.send(start).unwrap();
        tx.send(frames_of(&recs[..1])).unwrap();
        std::thread::scope(|s| {
            let (recycle_tx, _recycled) = mpsc::sync_channel(8);
            let t = s.spawn(|| {
                encode_main(
                    dir.path().to_path_buf(),
                    rx,
                    (close_tx, recycle_tx),
                    shared.clone(),
                    (0, false),
                    false,
                )
            });
            while files_under(dir.path()).is_empty() {
                std::thread::sleep(Duration::from_millis(5));
            }
            assert_eq!(
                files_under(dir.path()),
                vec![".part-a.parquet.tmp".to_string()]
            );
            gave_up.store(true, Ordering::Release);
            tx.send(frames_of(&recs[1..2])).unwrap();
            drop(tx);
            t.join().unwrap();
        });
        assert!(
            files_under(dir.path()).is_empty(),
            "{:?}",
            files_under(dir.path())
        );
        assert!(
            close_rx.try_recv().is_err(),
            "the writer hands that segment over itself"
        );
        assert_eq!(shared.stats().segments, 0);
    }

    /// A segment given up before the encoder got to its start: no file is made.
    #[test]
    fn a_segment_given_up_before_it_starts_makes_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let shared = Arc::new(Shared::new(1024));
        let recs = records(2);
        let msgs = vec![start("c", &recs, true).0, frames_of(&recs[..1])];
        let handed = encode(dir.path(), &shared, msgs);
        assert!(handed.is_empty(), "{handed:?}");
        // Not even its partition directory: the encoder never began the file.
        assert!(segment::partition_dirs(dir.path()).unwrap().is_empty());
    }

    /// When the encoder cannot write a segment it was handed, it passes the segment to the
    /// closer, which converts the wal.
    #[test]
    fn a_parquet_file_that_cannot_be_written_sends_the_segment_to_the_closer() {
        let dir = tempfile::tempdir().unwrap();
        let shared = Arc::new(Shared::new(1024));
        let recs = records(5);
        let date = date_of_us(recs[0].ts_us);
        // The partition directory cannot be made: a file has its name.
        std::fs::write(dir.path().join(format!("date={date}")), b"").unwrap();
        let wal = wal_of(dir.path(), "b", &recs);
        let (first, gave_up) = start("b", &recs, false);
        let mut msgs = vec![first];
        msgs.push(frames_of(&recs));
        msgs.push(EncMsg::Finish { wal: wal.clone() });
        let handed = encode(dir.path(), &shared, msgs);
        assert_eq!(handed, vec!["b".to_string()]);
        assert!(
            gave_up.load(Ordering::Acquire),
            "the writer stops passing records on"
        );
        assert!(wal.exists(), "the wal stays until the closer converted it");
    }

    /// The closer's conversion from a wal uses a temp name of its own.
    #[test]
    fn a_conversion_from_the_wal_does_not_share_the_encoders_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let recs = records(700);
        let date = date_of_us(recs[0].ts_us);
        let id = segment::segment_id(now_us(), 0);
        let wal = wal_of(dir.path(), &id, &recs);
        // The encoder's file of the same segment, still open.
        let held = segment::open_parquet(dir.path(), &date, &id).unwrap();
        let path = segment::convert_wal(dir.path(), &id, &wal, &mut || ())
            .unwrap()
            .unwrap();
        assert_eq!(path, segment::parquet_path(dir.path(), &date, &id));
        assert_eq!(crate::parquet_io::read_parquet(&path).unwrap(), recs);
        assert!(held.path().exists(), "the encoder's temp file is untouched");
    }

    /// The Parquet file filled as records arrive reads back like one written at once,
    /// across row groups and with a part-filled last one.
    #[test]
    fn a_parquet_file_filled_row_group_by_row_group_holds_every_record_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let recs = records(crate::parquet_write::ROW_GROUP_ROWS + 17);
        let date = date_of_us(recs[0].ts_us);
        let mut p = segment::open_parquet(dir.path(), &date, "x").unwrap();
        assert!(p
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with('.'));
        for r in &recs {
            p.append(&r.view()).unwrap();
        }
        let path = segment::close_parquet(dir.path(), &date, "x", p).unwrap();
        assert_eq!(crate::parquet_io::read_parquet(&path).unwrap(), recs);
    }

    /// The encoder as a worker's turns and its thread share it, over `msgs`.
    fn encoder_over(dir: &std::path::Path, shared: &Arc<Shared>, msgs: Vec<EncMsg>) -> Encoder {
        let (tx, rx) = mpsc::sync_channel(msgs.len());
        for m in msgs {
            tx.send(m).unwrap();
        }
        let (close_tx, _) = mpsc::sync_channel(2);
        let (recycle, _) = mpsc::sync_channel(8);
        Encoder {
            dir: dir.to_path_buf(),
            rx,
            close_tx,
            recycle,
            shared: shared.clone(),
            current: None,
            held: None,
            at: 0,
            stopped: false,
            thread: None,
            no_turns: false,
            fail_turns: false,
        }
    }

    /// A worker's turn stops at the next step when a task woken from outside the runtime
    /// waits for a worker (a model's answer, say), however much of its time is left.
    #[test]
    fn a_turn_stops_when_a_task_from_outside_waits_for_the_worker() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let handle = rt.handle().clone();
        // A turn started in the future has all of its time left.
        let fresh = || Instant::now() + Duration::from_secs(60);
        let on_the_worker = rt.spawn(async move {
            let before = turn_goes_on(fresh());
            // Spawned from another thread while this task holds the only worker: it
            // waits in the global queue.
            std::thread::scope(|s| {
                s.spawn(|| drop(handle.spawn(async {})));
            });
            let after = turn_goes_on(fresh());
            (before, after)
        });
        assert_eq!(rt.block_on(on_the_worker).unwrap(), (true, false));
        // Outside a runtime only the time counts.
        assert!(turn_goes_on(fresh()));
        assert!(!turn_goes_on(Instant::now() - WORKER_TURN));
    }

    /// Turns on a worker put records into the columns, as many as asked and never past
    /// a full row group; what writes to the file (the segment's start, a row group, the
    /// finish) waits for the encoder thread. The file is the one the thread alone makes.
    #[test]
    fn worker_turns_build_the_columns_and_leave_the_file_steps_to_the_thread() {
        let rows = crate::parquet_write::ROW_GROUP_ROWS;
        let recs = records(rows + 300);
        let msgs = |dir: &std::path::Path| {
            let mut m = vec![start("a", &recs, false).0];
            m.extend(recs.chunks(1000).map(frames_of));
            m.push(EncMsg::Finish {
                wal: wal_of(dir, "a", &recs),
            });
            m
        };
        let dir = tempfile::tempdir().unwrap();
        let shared = Arc::new(Shared::new(1024));
        shared.enc_queued.store(recs.len(), Ordering::Relaxed);
        let mut e = encoder_over(dir.path(), &shared, msgs(dir.path()));
        let on_workers = || shared.on_workers.load(Ordering::Relaxed) as usize;
        let turn = |e: &mut Encoder| e.work(&mut || true, false);

        // The segment's start opens a file: left to the thread.
        assert_eq!(turn(&mut e), (Worked::ForThread, false));
        assert!(files_under(dir.path()).is_empty());
        assert_eq!(e.work(&mut || false, true), (Worked::Paused, true));
        let tmp = dir
            .path()
            .join(format!("date={}", date_of_us(recs[0].ts_us)));
        let tmp = tmp.join(".part-a.parquet.tmp");
        assert!(tmp.exists());

        // A turn appends as many records as `go_on` lets it: the first, then one per yes.
        let mut yes = 4;
        let bounded = e.work(
            &mut || {
                yes -= 1;
                yes >= 0
            },
            false,
        );
        assert_eq!(bounded, (Worked::Paused, true));
        assert_eq!(on_workers(), 5);

        // Turns fill the row group, then stop before the record that would write it.
        let mut turns = 0;
        loop {
            turns += 1;
            match turn(&mut e) {
                (Worked::Paused, true) => {}
                (Worked::ForThread, _) => break,
                other => panic!("turn {turns}: {other:?}"),
            }
            assert!(turns < 100, "the turns never stopped");
        }
        assert_eq!(on_workers(), rows);
        let full = |e: &Encoder| {
            let file = e.current.as_ref().and_then(|c| c.file.as_ref());
            file.unwrap().row_group_full()
        };
        assert!(full(&e), "the row group is still in the columns");
        assert_eq!(
            turn(&mut e),
            (Worked::ForThread, false),
            "no progress past it"
        );

        // The thread writes the row group (and appends one record before it pauses).
        assert_eq!(e.work(&mut || false, true), (Worked::Paused, true));
        assert!(!full(&e));
        assert_eq!(on_workers(), rows);
        // The workers take the rest, then leave the finish to the thread.
        while turn(&mut e).0 == Worked::Paused {}
        assert_eq!(on_workers(), recs.len() - 1);
        assert_eq!(turn(&mut e), (Worked::ForThread, false));
        assert_eq!(shared.enc_queued.load(Ordering::Relaxed), 0);
        assert_eq!(shared.stats().segments, 0);
        // The queue's sender is gone (the writer stopped): the last message, then stop.
        assert_eq!(e.work(&mut || true, true), (Worked::Stopped, true));
        assert_eq!(shared.stats().segments, 1);

        let files = crate::segment::parquet_files(dir.path()).unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(crate::parquet_io::read_parquet(&files[0]).unwrap(), recs);
        assert!(crate::segment::wal_files(dir.path()).unwrap().is_empty());

        // The same messages through the encoder thread alone: the same bytes.
        let alone = tempfile::tempdir().unwrap();
        let shared = Arc::new(Shared::new(1024));
        shared.enc_queued.store(recs.len(), Ordering::Relaxed);
        assert!(encode(alone.path(), &shared, msgs(alone.path())).is_empty());
        let theirs = crate::segment::parquet_files(alone.path()).unwrap();
        assert_eq!(
            std::fs::read(&files[0]).unwrap(),
            std::fs::read(&theirs[0]).unwrap()
        );
    }

    /// A worker's turn that panics costs the segment its Parquet file, never the worker
    /// (the panic stops in the turn) nor a record: the workers leave that encoder alone
    /// from then on, and the thread hands the segment to the closer at its finish.
    #[test]
    fn a_worker_turn_that_panics_gives_up_the_file_and_leaves_the_encoder_to_its_thread() {
        let dir = tempfile::tempdir().unwrap();
        let recs = records(50);
        let (start_msg, gave_up) = start("a", &recs, false);
        let wal = wal_of(dir.path(), "a", &recs);
        let msgs = vec![start_msg, frames_of(&recs), EncMsg::Finish { wal }];
        let shared = Arc::new(Shared::new(1024));
        shared.enc_queued.store(recs.len(), Ordering::Relaxed);
        let (close_tx, close_rx) = mpsc::sync_channel(2);
        let mut e = encoder_over(dir.path(), &shared, msgs);
        e.close_tx = close_tx;
        assert_eq!(e.work(&mut || false, true), (Worked::Paused, true));
        e.fail_turns = true;
        let enc = Mutex::new(e);
        take_turn(&enc);
        assert!(gave_up.load(Ordering::Acquire), "the file is given up");
        let mut e = enc.into_inner().expect("the lock is not poisoned");
        assert!(e.no_turns);
        assert!(
            files_under(dir.path()).is_empty(),
            "{:?}",
            files_under(dir.path())
        );
        // Another turn leaves it alone (it would panic again).
        let enc = Mutex::new(e);
        take_turn(&enc);
        e = enc.into_inner().unwrap();
        // The thread goes on: the frames are let go, the segment goes to the closer.
        e.fail_turns = false;
        assert_eq!(e.work(&mut || true, true), (Worked::Stopped, true));
        assert_eq!(shared.enc_queued.load(Ordering::Relaxed), 0);
        assert_eq!(shared.stats().on_workers, 0);
        assert_eq!(close_rx.try_iter().map(|j| j.id).collect::<Vec<_>>(), ["a"]);
    }
}
