//! Writer configuration.

use crate::error::{LogError, Result};
use crate::record::FeatureLogging;
use std::path::PathBuf;
use std::time::Duration;

/// How the prediction log writes. `LogConfig::new(dir)` gives the defaults below.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// Root directory of the log (`date=YYYY-MM-DD/` partitions and `_wal/` under it).
    /// One writer per directory.
    pub dir: PathBuf,
    /// Records that may wait for the writer; past this, `record` drops and counts.
    /// Default 65 536 (about 1 s of traffic at 65k predictions/s). They wait as encoded
    /// wal frames: about 360 bytes for the example fraud model's decision of 29
    /// features (their names travel once per segment), so about 24 MiB when full; about
    /// 1 KB for such a record whose names do not fit the log's name sets (a record
    /// larger than a frame may be, 64 MiB, is refused).
    pub channel_capacity: usize,
    /// Roll the open segment when its wal reaches this many bytes. Default 64 MiB.
    /// (The Parquet file is smaller: 257 against 359 bytes a record for the example
    /// fraud model. A segment whose Parquet file is built
    /// from its wal at close, see `encoder_backlog`, is read one frame at a time: that
    /// takes a slice of rows and one encoded row group in memory, not the segment.)
    pub segment_max_bytes: u64,
    /// Roll the open segment when it is this old. Default 5 minutes.
    pub segment_max_age: Duration,
    /// How often buffered wal frames are handed to the OS. This is the loss window of a
    /// process crash. Default 200 ms.
    pub flush_interval: Duration,
    /// Also fsync the wal at every flush, so records survive a power loss / kernel crash,
    /// not only a process crash. Default false.
    pub fsync: bool,
    /// Which features are logged. Default all.
    pub features: FeatureLogging,
    /// How many nice steps the writer thread (and the encoder and closer, where they do
    /// not run under `SCHED_IDLE`, `encoder_idle`) runs below the serving threads
    /// (Linux, where nice is per thread; the sum is capped at 19): 0 runs them like the
    /// serving threads. Default 10: the log's CPU work waits for the serving threads, yet
    /// still gets about a tenth of a busy core's time against each of them, so it keeps up
    /// near saturation instead of falling behind and dropping. Above 0 they also run under
    /// Linux's `SCHED_BATCH`, which keeps that share but never lets a log thread that
    /// wakes preempt the serving thread on its CPU: it waits for a free CPU or that
    /// thread's turn to end (`priority::set_current_thread_batch`).
    pub writer_nice: i32,
    /// Run the writer thread under Linux's `SCHED_IDLE` too, instead of `writer_nice`
    /// (the encoder and closer run there by default, `encoder_idle`): it takes only
    /// CPU time no other thread wants, and a serving thread that wakes takes the CPU back
    /// at once. Under `writer_nice`, a serving thread that wakes while the writer works
    /// may wait for the next scheduler tick (up to 4 ms on a 250 Hz kernel), but the
    /// writer never preempts one when it wakes (`SCHED_BATCH`), and its own work is small
    /// (the wal frames, about 1.3% of a core at 15,000 records/s). The cost: under a
    /// load that leaves no CPU idle the writer itself falls behind, and once
    /// `channel_capacity` records wait, records are dropped and counted (`mesh demo`,
    /// both cores busy, dropped 29% of its records when this applied to the whole log).
    /// A thread cannot leave `SCHED_IDLE` without `CAP_SYS_NICE`, so it is set once, at
    /// start. Where it cannot be set, `writer_nice` applies. Default false.
    pub writer_idle: bool,
    /// Run the log's Parquet work under Linux's `SCHED_IDLE`: the encoder thread (column
    /// builders, slice encoding and compression, the footer at close) and the closer
    /// thread (which converts a segment whose Parquet file could not be written from its
    /// wal, a long burst of CPU at the roll). That work then takes only CPU time no other thread wants, and a
    /// serving thread that wakes takes the CPU back at once. At a nice value instead, a
    /// thread in a long burst keeps the CPU for the rest of its scheduler slice: with the
    /// closer at `writer_nice`, serving threads waited up to 3 ms to run (`perf sched`,
    /// the server on a core of its own at 85% busy). The writer thread, which appends
    /// every record to the wal (a few µs each) and so decides what is kept, stays at
    /// `writer_nice`: a starved encoder or closer never drops a record, nor holds up the
    /// writer (see `encoder_backlog`). Where `SCHED_IDLE` cannot be set, `writer_nice`
    /// applies. Default true.
    pub encoder_idle: bool,
    /// Let the serving runtime's workers build the Parquet columns in short turns
    /// ([`crate::WORKER_TURN`], 20 µs) when they have nothing else to do (the runtime
    /// calls [`crate::worker_turn`] before a worker parks; `mesh serve` does). The
    /// encoder thread then does only what they leave: the steps that write to the file
    /// (a row group, the footer and fsync at a roll), and all of it on a server whose
    /// workers are never idle. Default false here, since it needs a runtime that calls
    /// [`crate::worker_turn`]; `mesh serve`'s does, and leaves them off unless its
    /// `[prediction_log] worker_turns = true`.
    pub worker_turns: bool,
    /// Records that may wait in memory for the Parquet encoder. When the encoder falls
    /// this far behind (a machine with no idle CPU starves a `SCHED_IDLE` thread), the
    /// writer passes it nothing more of the open segment, and the encoder reads the rest
    /// of the segment from its wal, as the writer appends it: the backlog waits on disk,
    /// the work done on the segment is kept, no record is lost. Counted in
    /// `mesh_log_encoder_behind_segments_total`. Segments the closer converts (a Parquet
    /// file that could not be written) wait for it as
    /// wal files, in order, as long as it is busy or starved
    /// (`mesh_log_segments_waiting_for_closer`; on disk, not in memory), and a shutdown
    /// converts them all. Default 8 192 (16 slices); at least 1.
    pub encoder_backlog: usize,
    /// When the Parquet files are built. Default [`ParquetMode::Inline`].
    pub parquet: ParquetMode,
    /// With [`ParquetMode::Deferred`]: the most bytes of closed segments that may wait
    /// as wal files in `_wal/closed/` for a converter. Past it, the writer hands the
    /// oldest to its own closer (under `SCHED_IDLE`), so the disk a log without a
    /// converter takes stays bounded. Default 1 GiB (16 segments of the default size);
    /// at least `segment_max_bytes`.
    pub deferred_max_bytes: u64,
    /// The CPUs the log's threads (writer, encoder, closer) run on, by index; empty (the
    /// default): wherever the process may run. On a machine with cores to spare, start
    /// the server on the others (`taskset -c 1-7 mesh serve ...`) and give the log one
    /// (`[0]`): its work then never preempts a serving thread nor shares its caches,
    /// which on a core shared with the serving threads cost them about as much CPU
    /// again as the log's own work (prediction-log/README.md). Linux only; refused at
    /// start when the kernel takes none of them (a CPU that does not exist, or one
    /// outside the cgroup's cpuset). Worker turns (`worker_turns`) run on the serving
    /// workers, wherever they are. [`priority::reserve_cpus`](crate::priority::reserve_cpus)
    /// makes the split without CPU numbers (`mesh serve`'s `[prediction_log]
    /// reserved_cpus`): the last CPUs the process is given for the log, the rest for
    /// every other thread.
    pub cpus: Vec<usize>,
}

/// When the log builds its Parquet files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ParquetMode {
    /// As records arrive, by the encoder thread of the serving process (the file is in
    /// place when the segment rolls). The default.
    #[default]
    Inline,
    /// Not in the serving process: a rolled segment stays as its wal file, in
    /// `_wal/closed/`, until `mesh logs convert` (or
    /// [`convert_closed`](crate::convert_closed)) converts it, in another process, on
    /// this machine or on one that shares the directory. The serving process then does
    /// only the wal's share of the log's work (a fifth of it). Past
    /// [`LogConfig::deferred_max_bytes`] waiting, the writer's own closer converts the
    /// oldest. Records in closed segments are read by `include_wal` readers, `mesh logs
    /// tail` and `mesh logs join --include-wal`, not yet by Parquet readers.
    Deferred,
}

impl std::str::FromStr for ParquetMode {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "inline" => Ok(Self::Inline),
            "deferred" => Ok(Self::Deferred),
            other => Err(format!(
                "{other:?} is not a Parquet mode: \"inline\" (the serving process builds the files) or \"deferred\" (`mesh logs convert` does)"
            )),
        }
    }
}

impl LogConfig {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            channel_capacity: 65_536,
            segment_max_bytes: 64 << 20,
            segment_max_age: Duration::from_secs(300),
            flush_interval: Duration::from_millis(200),
            fsync: false,
            features: FeatureLogging::All,
            writer_nice: 10,
            writer_idle: false,
            encoder_idle: true,
            worker_turns: false,
            encoder_backlog: 8192,
            parquet: ParquetMode::Inline,
            deferred_max_bytes: 1 << 30,
            cpus: Vec::new(),
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.channel_capacity == 0 {
            return Err(LogError::Config(
                "channel_capacity must be at least 1".into(),
            ));
        }
        if self.encoder_backlog == 0 {
            return Err(LogError::Config(
                "encoder_backlog must be at least 1".into(),
            ));
        }
        if self.segment_max_bytes == 0 {
            return Err(LogError::Config(
                "segment_max_bytes must be at least 1".into(),
            ));
        }
        if self.deferred_max_bytes < self.segment_max_bytes {
            return Err(LogError::Config(format!(
                "deferred_max_bytes {} is below segment_max_bytes {}: at least one closed segment must fit",
                self.deferred_max_bytes, self.segment_max_bytes
            )));
        }
        if self.segment_max_age.is_zero() || self.flush_interval.is_zero() {
            return Err(LogError::Config(
                "segment_max_age and flush_interval must be positive".into(),
            ));
        }
        if !(0..=19).contains(&self.writer_nice) {
            return Err(LogError::Config(format!(
                "writer_nice {} is not in 0..=19",
                self.writer_nice
            )));
        }
        if self.worker_turns && !self.cpus.is_empty() {
            return Err(LogError::Config(format!(
                "worker_turns and cpus {:?}: the turns would build the Parquet columns on the serving workers, off the CPUs the log is given; set one of them",
                self.cpus
            )));
        }
        if !self.cpus.is_empty() {
            crate::priority::check_log_cpus(&self.cpus)
                .map_err(|e| LogError::Config(format!("cpus {:?}: {e}", self.cpus)))?;
        }
        if let FeatureLogging::Sample(r) = self.features {
            if !(0.0..=1.0).contains(&r) {
                return Err(LogError::Config(format!(
                    "feature sample rate {r} is not in [0, 1]"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each bound is refused at start, naming its field; the defaults pass.
    #[test]
    fn out_of_range_settings_are_refused_naming_the_field() {
        LogConfig::new("d").validate().unwrap();
        type Set = fn(&mut LogConfig);
        let cases: [(&str, Set); 6] = [
            ("deferred_max_bytes", |c| {
                c.deferred_max_bytes = c.segment_max_bytes - 1
            }),
            ("worker_turns and cpus [0]", |c| {
                c.worker_turns = true;
                c.cpus = vec![0];
            }),
            ("channel_capacity", |c| c.channel_capacity = 0),
            ("encoder_backlog", |c| c.encoder_backlog = 0),
            ("segment_max_bytes", |c| c.segment_max_bytes = 0),
            ("writer_nice", |c| c.writer_nice = 20),
        ];
        for (field, set) in cases {
            let mut c = LogConfig::new("d");
            set(&mut c);
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{field}: {e}");
        }
    }

    #[test]
    fn parquet_modes_parse_and_an_unknown_one_is_named() {
        assert_eq!("inline".parse::<ParquetMode>(), Ok(ParquetMode::Inline));
        assert_eq!("deferred".parse::<ParquetMode>(), Ok(ParquetMode::Deferred));
        assert_eq!(ParquetMode::default(), ParquetMode::Inline);
        let e = "later".parse::<ParquetMode>().unwrap_err();
        assert!(e.contains("\"later\"") && e.contains("deferred"), "{e}");
    }
}
