//! The prediction log in the serving paths: every decision (primary, canary,
//! shadow) and every OIP prediction becomes one record, handed to the log's
//! bounded queue without waiting (a full queue drops and counts).
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use mesh_prediction_log::{
    now_us, source, FeatureLogging, FeatureUsed, LogConfig, LogError, ParquetMode, PredictionLog,
    PredictionLogHandle, Protocol, RecordRef, Role, StageMicros, VersionText, WriterTask,
};
use serde::Deserialize;

use crate::decide::{Outcome, OutcomeSink};
use crate::error::RouterError;

/// `[prediction_log]` of mesh.toml.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "PredictionLogFile")]
pub struct PredictionLogConfig {
    /// Directory of the Parquet files (partitioned by date).
    pub dir: PathBuf,
    /// Which features each record carries: "all", "none" or a sample rate ("0.1").
    pub features: String,
    /// How often the write-ahead file is flushed (the crash loss window).
    /// `flush_interval = "200ms"`; was `flush_interval_ms`.
    pub flush_interval: Duration,
    /// Records that may wait for the writer before new ones are dropped.
    pub channel_capacity: usize,
    /// Nice value of the log's writer threads (0..=19; 0 = the serving threads' own),
    /// when they do not run under SCHED_IDLE; above 0 they run under SCHED_BATCH too
    /// (waking, they never preempt a serving thread).
    pub writer_nice: i32,
    /// The log's writer threads run under SCHED_IDLE instead (see
    /// `LogConfig::writer_idle`; off by default).
    pub writer_idle: bool,
    /// The Parquet encoder thread runs under SCHED_IDLE (`LogConfig::encoder_idle`; on
    /// by default).
    pub encoder_idle: bool,
    /// The serving runtime's workers build the Parquet columns in short turns when they
    /// have nothing else to do (`LogConfig::worker_turns`; off by default). `mesh
    /// serve`'s runtime takes the turns when a log asks.
    pub worker_turns: bool,
    /// Records that may wait in memory for the encoder; past them it reads the rest of
    /// the open segment from its wal (`LogConfig::encoder_backlog`).
    pub encoder_backlog: usize,
    /// When the Parquet files are built: "inline" (by the serving process, the default)
    /// or "deferred" (closed segments wait as wal files for `mesh logs convert`;
    /// `LogConfig::parquet`).
    pub parquet: ParquetMode,
    /// With `parquet = "deferred"`: bytes of closed segments that may wait for a
    /// converter before the server converts the oldest itself
    /// (`LogConfig::deferred_max_bytes`).
    pub deferred_max_bytes: u64,
    /// Roll the open segment into its Parquet file when its wal reaches this many
    /// bytes (`LogConfig::segment_max_bytes`; 64 MiB; 1 MiB to 4 GiB).
    pub segment_max_bytes: u64,
    /// ... or when it is this old (`LogConfig::segment_max_age`; 5 minutes; 1 s to 24
    /// h): how long a record may wait before a reader of the Parquet files alone sees it.
    pub segment_max_age: Duration,
    /// The CPUs the log's threads run on (`LogConfig::cpus`); empty (the default):
    /// wherever the process may run.
    pub cpus: Vec<usize>,
    /// How many of the process's CPUs to set aside for the log's threads: the last
    /// ones, with every other thread of the server confined to the rest. 0 (the
    /// default): none. `mesh serve` splits the CPUs before any other thread starts
    /// ([`PredictionLogConfig::reserve_cpus`]); a router embedded elsewhere sets
    /// `cpus` itself.
    pub reserved_cpus: usize,
}

/// `[prediction_log]` as written, old spellings included.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PredictionLogFile {
    dir: PathBuf,
    #[serde(default = "default_features")]
    features: String,
    #[serde(default, deserialize_with = "mesh_stack::config::duration::option")]
    flush_interval: Option<Duration>,
    #[serde(default)]
    flush_interval_ms: Option<u64>,
    #[serde(default = "default_capacity")]
    channel_capacity: usize,
    #[serde(default = "default_writer_nice")]
    writer_nice: i32,
    #[serde(default = "default_writer_idle")]
    writer_idle: bool,
    #[serde(default = "default_encoder_idle")]
    encoder_idle: bool,
    #[serde(default = "default_worker_turns")]
    worker_turns: bool,
    #[serde(default = "default_encoder_backlog")]
    encoder_backlog: usize,
    #[serde(default)]
    parquet: Option<String>,
    #[serde(default = "default_deferred_max_bytes")]
    deferred_max_bytes: u64,
    #[serde(default = "default_segment_max_bytes")]
    segment_max_bytes: u64,
    #[serde(default, deserialize_with = "mesh_stack::config::duration::option")]
    segment_max_age: Option<Duration>,
    #[serde(default)]
    cpus: Vec<usize>,
    #[serde(default)]
    reserved_cpus: usize,
}

impl TryFrom<PredictionLogFile> for PredictionLogConfig {
    type Error = String;

    fn try_from(f: PredictionLogFile) -> Result<Self, String> {
        let flush_interval = crate::config::resolve_renamed(
            ("[prediction_log] flush_interval", f.flush_interval),
            &[(
                "[prediction_log] flush_interval_ms",
                crate::config::millis(f.flush_interval_ms),
            )],
        )?;
        if !(0..=19).contains(&f.writer_nice) {
            return Err(format!(
                "[prediction_log] writer_nice = {}: must be 0 (the serving threads' priority) to 19 (lowest)",
                f.writer_nice
            ));
        }
        if f.encoder_backlog == 0 {
            return Err(
                "[prediction_log] encoder_backlog = 0: must be at least 1 (records waiting for the Parquet encoder)"
                    .into(),
            );
        }
        let parquet = match f.parquet.as_deref() {
            None => ParquetMode::default(),
            Some(p) => p
                .parse::<ParquetMode>()
                .map_err(|e| format!("[prediction_log] parquet = {p:?}: {e}"))?,
        };
        if !SEGMENT_BYTES.contains(&f.segment_max_bytes) {
            return Err(format!(
                "[prediction_log] segment_max_bytes = {}: must be {} (1 MiB) to {} (4 GiB); a segment's wal becomes one Parquet file when it reaches this size",
                f.segment_max_bytes,
                SEGMENT_BYTES.start(),
                SEGMENT_BYTES.end()
            ));
        }
        let segment_max_age = f.segment_max_age.unwrap_or_else(default_segment_max_age);
        if !SEGMENT_AGE.contains(&segment_max_age) {
            return Err(format!(
                "[prediction_log] segment_max_age = {segment_max_age:?}: must be 1s to 24h; a segment becomes a Parquet file when it is this old"
            ));
        }
        if f.deferred_max_bytes < f.segment_max_bytes {
            return Err(format!(
                "[prediction_log] deferred_max_bytes = {}: must be at least one segment (segment_max_bytes, {} bytes)",
                f.deferred_max_bytes, f.segment_max_bytes
            ));
        }
        if f.reserved_cpus > 0 && !f.cpus.is_empty() {
            return Err(format!(
                "[prediction_log] cpus = {:?} and reserved_cpus = {}: set one of them (cpus names the log's CPUs; reserved_cpus sets the last of the process's CPUs aside for it)",
                f.cpus, f.reserved_cpus
            ));
        }
        if f.worker_turns && f.reserved_cpus > 0 {
            return Err(format!(
                "[prediction_log] worker_turns = true and reserved_cpus = {}: the turns would build the Parquet columns on the serving CPUs that reserved_cpus keeps the log off; set one of them",
                f.reserved_cpus
            ));
        }
        Ok(Self {
            dir: f.dir,
            features: f.features,
            flush_interval: flush_interval.unwrap_or_else(default_flush_interval),
            channel_capacity: f.channel_capacity,
            writer_nice: f.writer_nice,
            writer_idle: f.writer_idle,
            encoder_idle: f.encoder_idle,
            worker_turns: f.worker_turns,
            encoder_backlog: f.encoder_backlog,
            parquet,
            deferred_max_bytes: f.deferred_max_bytes,
            segment_max_bytes: f.segment_max_bytes,
            segment_max_age,
            cpus: f.cpus,
            reserved_cpus: f.reserved_cpus,
        })
    }
}

impl PredictionLogConfig {
    /// `reserved_cpus`: sets the last `reserved_cpus` of the CPUs the calling thread may
    /// run on aside for the log (its `cpus` from then on) and confines the calling
    /// thread, and every thread it starts from then on, to the others. Call it before
    /// any other thread exists (`mesh serve` does). `None` when nothing is set aside;
    /// an error, naming the setting, when the process has no CPU to spare.
    pub fn reserve_cpus(
        &mut self,
    ) -> Result<Option<mesh_prediction_log::priority::CpuSplit>, String> {
        if self.reserved_cpus == 0 || !self.cpus.is_empty() {
            return Ok(None);
        }
        let split =
            mesh_prediction_log::priority::reserve_cpus(self.reserved_cpus).map_err(|e| {
                format!(
                    "[prediction_log] reserved_cpus = {}: {e}",
                    self.reserved_cpus
                )
            })?;
        self.cpus = split.log.clone();
        Ok(Some(split))
    }
}

fn default_features() -> String {
    "all".into()
}
fn default_flush_interval() -> Duration {
    Duration::from_millis(200)
}
fn default_capacity() -> usize {
    65_536
}
fn default_writer_nice() -> i32 {
    LogConfig::new("").writer_nice
}
fn default_writer_idle() -> bool {
    LogConfig::new("").writer_idle
}
fn default_encoder_idle() -> bool {
    LogConfig::new("").encoder_idle
}
/// Off: the encoder thread alone, under `SCHED_IDLE`, which a waking serving thread
/// preempts at once; a request that arrives during a turn waits for it. Turns halve
/// the log's CPU, but the server's own p99 was lower or equal with the thread alone in
/// most of this project's runs (prediction-log/README.md, "Worker turns"). `mesh serve` builds its runtime with the
/// hook that takes the turns (`mesh_prediction_log::worker_turn`) for a log that sets
/// `worker_turns = true`; without the hook (a router embedded elsewhere) the encoder
/// thread does the work as with turns off.
fn default_worker_turns() -> bool {
    false
}
fn default_encoder_backlog() -> usize {
    LogConfig::new("").encoder_backlog
}
fn default_deferred_max_bytes() -> u64 {
    LogConfig::new("").deferred_max_bytes
}
fn default_segment_max_bytes() -> u64 {
    LogConfig::new("").segment_max_bytes
}
fn default_segment_max_age() -> Duration {
    LogConfig::new("").segment_max_age
}
/// `segment_max_bytes`: from 1 MiB (smaller makes many small files, each with its
/// footer and fsync) to 4 GiB.
const SEGMENT_BYTES: std::ops::RangeInclusive<u64> = (1 << 20)..=(4 << 30);
/// `segment_max_age`: from a second to a day (segments also roll at each UTC midnight).
const SEGMENT_AGE: std::ops::RangeInclusive<Duration> =
    Duration::from_secs(1)..=Duration::from_secs(86_400);

/// Starts the writer.
pub fn start(cfg: &PredictionLogConfig) -> Result<(PredictionLogHandle, WriterTask), RouterError> {
    if cfg.reserved_cpus > 0 && cfg.cpus.is_empty() {
        // Too late to split the CPUs here: the serving threads exist and run anywhere.
        return Err(RouterError::InvalidArgument(format!(
            "[prediction_log] reserved_cpus = {}: the CPUs must be split before the server's threads start (`mesh serve` does it); a router embedded elsewhere sets [prediction_log] cpus and confines its own threads",
            cfg.reserved_cpus
        )));
    }
    let mut c = LogConfig::new(&cfg.dir);
    c.features = cfg
        .features
        .parse::<FeatureLogging>()
        .map_err(|e| RouterError::InvalidArgument(format!("[prediction_log] features: {e}")))?;
    c.flush_interval = cfg.flush_interval;
    c.channel_capacity = cfg.channel_capacity;
    c.writer_nice = cfg.writer_nice;
    c.writer_idle = cfg.writer_idle;
    c.encoder_idle = cfg.encoder_idle;
    c.worker_turns = cfg.worker_turns;
    c.encoder_backlog = cfg.encoder_backlog;
    c.parquet = cfg.parquet;
    c.deferred_max_bytes = cfg.deferred_max_bytes;
    c.segment_max_bytes = cfg.segment_max_bytes;
    c.segment_max_age = cfg.segment_max_age;
    c.cpus = cfg.cpus.clone();
    PredictionLog::start(c).map_err(|e| match e {
        LogError::Config(m) => RouterError::InvalidArgument(format!("[prediction_log] {m}")),
        e => RouterError::Internal(format!("prediction log at {}: {e}", cfg.dir.display())),
    })
}

/// Sends decision outcomes to the log. Runs on the request path: the outcome is encoded
/// straight into the log's queue from references (no record is built, nothing is
/// allocated per feature).
pub struct LogSink(pub PredictionLogHandle);

impl OutcomeSink for LogSink {
    fn record(&self, o: &Outcome) {
        let version = VersionText::new(o.version);
        self.0.record_ref(&RecordRef {
            request_id: &o.request_id,
            ts_us: now_us(),
            model: &o.model,
            version: version.as_str(),
            role: o.role,
            protocol: Protocol::Decide,
            entity_keys: &o.entities,
            features: Some(&o.features),
            score: o.score.map(f64::from),
            decision: Some(o.decision.as_str()),
            source: o.source.as_str(),
            // The engine's timings are the log's stage list (`StageMicros`), as they are.
            stages: o.timings,
        });
    }
}

/// One record per row of an OIP prediction (first output value as the score).
/// `protocol` is the transport, `"grpc"` or `"http"` (logged as `oip_grpc` / `oip_http`).
#[allow(clippy::too_many_arguments)]
pub fn record_oip(
    log: &PredictionLogHandle,
    protocol: &str,
    request_id: &str,
    model: &str,
    version: u64,
    outputs: &[f32],
    cols: usize,
    stages: StageMicros,
) {
    let protocol = Protocol::oip(protocol);
    let version = VersionText::new(Some(version));
    let ts_us = now_us();
    let rows = outputs.len() / cols.max(1);
    let mut id = String::new();
    for (i, row) in outputs.chunks(cols.max(1)).enumerate() {
        let request_id = if rows == 1 {
            request_id
        } else {
            id.clear();
            let _ = write!(id, "{request_id}#{i}");
            &id
        };
        log.record_ref(&RecordRef::<String, FeatureUsed> {
            request_id,
            ts_us,
            model,
            version: version.as_str(),
            role: Role::Primary,
            protocol,
            entity_keys: &[],
            features: Some(&[]),
            score: row.first().map(|x| f64::from(*x)),
            decision: None,
            source: source::MODEL,
            stages,
        });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<PredictionLogConfig, String> {
        toml::from_str::<PredictionLogConfig>(text).map_err(|e| e.to_string())
    }

    #[test]
    fn writer_nice_defaults_to_the_logs_and_is_bounded() {
        let c = parse("dir = \"d\"").unwrap();
        assert_eq!(c.writer_nice, LogConfig::new("d").writer_nice);
        assert_eq!(
            parse("dir = \"d\"\nwriter_nice = 0").unwrap().writer_nice,
            0
        );
        assert_eq!(
            parse("dir = \"d\"\nwriter_nice = 19").unwrap().writer_nice,
            19
        );
        for bad in ["-1", "20"] {
            let e = parse(&format!("dir = \"d\"\nwriter_nice = {bad}")).unwrap_err();
            assert!(e.contains("writer_nice") && e.contains(bad), "{e}");
        }
    }

    /// `cpus` passes through to the log, which refuses at start, naming the setting, a
    /// list the kernel runs the process on none of.
    #[test]
    fn cpus_default_to_anywhere_and_a_cpu_the_machine_lacks_is_refused_at_start() {
        assert!(parse("dir = \"d\"").unwrap().cpus.is_empty());
        assert_eq!(parse("dir = \"d\"\ncpus = [0]").unwrap().cpus, [0]);
        assert!(parse("dir = \"d\"\ncpus = [-1]").is_err());
        let dir = tempfile::tempdir().unwrap();
        let mut c = parse(&format!("dir = {:?}\ncpus = [1023]", dir.path())).unwrap();
        let e = start(&c).err().expect("refused").to_string();
        assert!(e.contains("[prediction_log] cpus [1023]"), "{e}");
        c.cpus = vec![0];
        let (log, writer) = start(&c).unwrap();
        log.shutdown_blocking();
        writer.join().unwrap();
    }

    /// `reserved_cpus`: 0 by default, never with `cpus`, and refused by a start that
    /// comes after the server's threads (a router embedded elsewhere) instead of being
    /// ignored. `mesh serve`'s split is tested with the binary (mesh/tests/log_cpus.rs).
    #[test]
    fn reserved_cpus_is_off_by_default_exclusive_with_cpus_and_split_before_start() {
        assert_eq!(parse("dir = \"d\"").unwrap().reserved_cpus, 0);
        assert_eq!(
            parse("dir = \"d\"\nreserved_cpus = 1")
                .unwrap()
                .reserved_cpus,
            1
        );
        assert!(parse("dir = \"d\"\nreserved_cpus = -1").is_err());
        let e = parse("dir = \"d\"\ncpus = [0]\nreserved_cpus = 1").unwrap_err();
        assert!(e.contains("cpus = [0] and reserved_cpus = 1"), "{e}");
        let e = parse("dir = \"d\"\nworker_turns = true\nreserved_cpus = 1").unwrap_err();
        assert!(
            e.contains("worker_turns = true and reserved_cpus = 1"),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        let c = parse(&format!("dir = {:?}\nreserved_cpus = 1", dir.path())).unwrap();
        let e = start(&c).err().expect("refused").to_string();
        assert!(
            e.contains("reserved_cpus = 1") && e.contains("mesh serve"),
            "{e}"
        );
        // Nothing set aside: nothing to split, the calling thread keeps its CPUs.
        let mut c = parse(&format!("dir = {:?}", dir.path())).unwrap();
        assert_eq!(c.reserve_cpus().unwrap(), None);
        // More than the process has: refused, naming the setting.
        let mut c = parse(&format!("dir = {:?}\nreserved_cpus = 100000", dir.path())).unwrap();
        let e = std::thread::spawn(move || c.reserve_cpus().unwrap_err())
            .join()
            .unwrap();
        assert!(
            e.contains("[prediction_log] reserved_cpus = 100000") && e.contains("none"),
            "{e}"
        );
    }

    #[test]
    fn parquet_is_inline_unless_deferred_and_the_bound_holds_a_segment() {
        let c = parse("dir = \"d\"").unwrap();
        assert_eq!(c.parquet, ParquetMode::Inline);
        assert_eq!(c.deferred_max_bytes, LogConfig::new("d").deferred_max_bytes);
        let c =
            parse("dir = \"d\"\nparquet = \"deferred\"\ndeferred_max_bytes = 134217728").unwrap();
        assert_eq!(c.parquet, ParquetMode::Deferred);
        assert_eq!(c.deferred_max_bytes, 128 << 20);
        let e = parse("dir = \"d\"\nparquet = \"later\"").unwrap_err();
        assert!(e.contains("parquet") && e.contains("later"), "{e}");
        let e = parse("dir = \"d\"\ndeferred_max_bytes = 1000").unwrap_err();
        assert!(e.contains("deferred_max_bytes = 1000"), "{e}");
        // The bound is against the configured segment size.
        let c = parse("dir = \"d\"\nsegment_max_bytes = 8388608\ndeferred_max_bytes = 8388608")
            .unwrap();
        assert_eq!(c.deferred_max_bytes, 8 << 20);
        let e = parse("dir = \"d\"\nsegment_max_bytes = 8388608\ndeferred_max_bytes = 8388607")
            .unwrap_err();
        assert!(
            e.contains("deferred_max_bytes = 8388607") && e.contains("8388608"),
            "{e}"
        );
    }

    #[test]
    fn segment_size_and_age_default_to_the_logs_and_are_bounded() {
        let c = parse("dir = \"d\"").unwrap();
        let lib = LogConfig::new("d");
        assert_eq!(
            (c.segment_max_bytes, c.segment_max_age),
            (lib.segment_max_bytes, lib.segment_max_age)
        );
        let c =
            parse("dir = \"d\"\nsegment_max_bytes = 1048576\nsegment_max_age = \"30s\"").unwrap();
        assert_eq!(
            (c.segment_max_bytes, c.segment_max_age),
            (1 << 20, Duration::from_secs(30))
        );
        for (text, key) in [
            ("segment_max_bytes = 1048575", "segment_max_bytes = 1048575"),
            (
                "segment_max_bytes = 4294967297",
                "segment_max_bytes = 4294967297",
            ),
            ("segment_max_age = \"999ms\"", "segment_max_age = 999ms"),
            ("segment_max_age = \"25h\"", "segment_max_age = 90000s"),
        ] {
            let e = parse(&format!("dir = \"d\"\n{text}")).unwrap_err();
            assert!(e.contains(key), "{text}: {e}");
        }
    }

    #[test]
    fn writer_idle_is_off_unless_turned_on() {
        assert!(!parse("dir = \"d\"").unwrap().writer_idle);
        assert!(
            parse("dir = \"d\"\nwriter_idle = true")
                .unwrap()
                .writer_idle
        );
        let e = parse("dir = \"d\"\nwriter_idle = \"sometimes\"").unwrap_err();
        assert!(e.contains("writer_idle") || e.contains("bool"), "{e}");
    }

    #[test]
    fn the_encoder_runs_idle_by_default_with_a_bounded_backlog() {
        let c = parse("dir = \"d\"").unwrap();
        let log = LogConfig::new("d");
        assert!(c.encoder_idle && log.encoder_idle);
        assert_eq!(c.encoder_backlog, log.encoder_backlog);
        assert!(
            !c.worker_turns && !log.worker_turns,
            "the encoder thread alone"
        );
        let c =
            parse("dir = \"d\"\nencoder_idle = false\nencoder_backlog = 100\nworker_turns = true")
                .unwrap();
        assert!(!c.encoder_idle);
        assert!(c.worker_turns);
        let e = parse("dir = \"d\"\nworker_turns = 1").unwrap_err();
        assert!(e.contains("worker_turns") || e.contains("bool"), "{e}");
        assert_eq!(c.encoder_backlog, 100);
        let e = parse("dir = \"d\"\nencoder_backlog = 0").unwrap_err();
        assert!(e.contains("encoder_backlog"), "{e}");
        let e = parse("dir = \"d\"\nencoder_backlog = -5").unwrap_err();
        assert!(e.contains("encoder_backlog") || e.contains("-5"), "{e}");
    }
}
