//! What `mesh logs join`, `mesh logs tail` and `mesh logs convert` do, as library
//! functions that write to any `Write` (the binary parses the command line into these
//! argument structs).

use crate::error::{LogError, Result};
use crate::join::{join, JoinOptions, JoinReport};
use crate::reader::Tailer;
use crate::record::{date_of_us, PredictionRecord, Protocol};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// `mesh logs join`: per model version, role and protocol, how the predictions did against
/// labels.
#[derive(Debug, Clone)]
pub struct JoinArgs {
    /// Prediction log directory (the writer's `dir`).
    pub logs: PathBuf,
    /// Labels file: CSV with a header row, or Parquet (by the `.parquet` extension).
    pub labels: PathBuf,
    /// Join key: `request_id`, or an entity key name; the labels file has a column of that name.
    pub key: String,
    /// Label column: 1/0, true/false, yes/no.
    pub label: String,
    /// Also report precision/recall when flagging `score >= T` (repeatable).
    pub thresholds: Vec<f64>,
    /// Include records of the open segment (wal files), not only closed Parquet segments.
    pub include_wal: bool,
    /// Keep only the records of this protocol (decide, oip_grpc, oip_http, unknown).
    pub protocol: Option<Protocol>,
    /// Print JSON instead of tables.
    pub json: bool,
}

/// Runs the join and prints the report to `out`.
pub fn run_join(args: &JoinArgs, out: &mut dyn Write) -> Result<()> {
    let opts = JoinOptions {
        key: args.key.clone(),
        label: args.label.clone(),
        score_thresholds: args.thresholds.clone(),
        include_wal: args.include_wal,
        protocol: args.protocol,
    };
    if !args.logs.is_dir() {
        return Err(LogError::NoLogDir(args.logs.clone()));
    }
    let report = join(&args.logs, &args.labels, &opts)?;
    let in_wal = if args.include_wal {
        0
    } else {
        crate::reader::wal_record_count(&args.logs)?
    };
    let io = |e| LogError::io("<output>", e);
    if args.json {
        let json = JsonReport {
            protocol: args.protocol,
            report: &report,
        };
        serde_json::to_writer_pretty(&mut *out, &json)?;
        writeln!(out).map_err(io)?;
        // The JSON stays the report; the note goes where a person reads it.
        if let Some(note) = wal_note(in_wal) {
            eprintln!("{note}");
        }
    } else {
        if let Some(p) = args.protocol {
            writeln!(
                out,
                "protocol:    {p} only (--protocol; records of other protocols are left out)"
            )
            .map_err(io)?;
        }
        write!(out, "{report}").map_err(io)?;
        if let Some(note) = wal_note(in_wal) {
            writeln!(out, "\n{note}").map_err(io)?;
        }
    }
    out.flush().map_err(io)
}

/// `mesh logs join --json`: the report, and the protocol `--protocol` kept (null: all).
#[derive(serde::Serialize)]
struct JsonReport<'a> {
    protocol: Option<Protocol>,
    #[serde(flatten)]
    report: &'a JoinReport,
}

/// What a join without `--include-wal` left out, when it left something out.
pub fn wal_note(in_wal: u64) -> Option<String> {
    (in_wal > 0).then(|| {
        format!(
            "note: {in_wal} record{} still in the write-ahead file (a running mesh's open segment, \
             or left by a crash) {} not joined; add --include-wal to join {}, or stop the mesh to close the segment",
            if in_wal == 1 { " is" } else { "s are" },
            if in_wal == 1 { "and was" } else { "and were" },
            if in_wal == 1 { "it" } else { "them" },
        )
    })
}

/// `mesh logs tail`: the newest records, then new ones as they are written.
#[derive(Debug, Clone)]
pub struct TailArgs {
    /// Prediction log directory (the writer's `dir`).
    pub logs: PathBuf,
    /// How many existing records to show first.
    pub lines: usize,
    /// Print the existing records and exit instead of following.
    pub no_follow: bool,
    /// Poll interval in milliseconds while following.
    pub interval_ms: u64,
    /// One JSON object per line instead of a summary line.
    pub json: bool,
}

/// Follows the log until `stop()` returns true (checked every poll) or the output closes
/// (e.g. piped into `head`). The binary passes `|| false` and lets Ctrl-C end the process.
pub fn run_tail(args: &TailArgs, out: &mut dyn Write, stop: &dyn Fn() -> bool) -> Result<()> {
    let (mut tailer, backlog) = Tailer::start(&args.logs, args.lines)?;
    if !print_records(&backlog, args.json, out)? || args.no_follow {
        return Ok(());
    }
    while !stop() {
        std::thread::sleep(Duration::from_millis(args.interval_ms.max(10)));
        let recs = tailer.poll()?;
        if !print_records(&recs, args.json, out)? {
            return Ok(());
        }
    }
    Ok(())
}

/// `mesh logs convert`: builds the Parquet files of the closed segments a writer with
/// `parquet = "deferred"` left in `_wal/closed/`.
#[derive(Debug, Clone)]
pub struct ConvertArgs {
    /// Prediction log directory (the writer's `dir`).
    pub logs: PathBuf,
    /// Keep converting new closed segments as they appear, until stopped.
    pub watch: bool,
    /// How often to look for new ones with `watch`, in milliseconds.
    pub interval_ms: u64,
    /// Run under Linux's `SCHED_IDLE` (only CPU time no other thread wants), working
    /// in spells of at most 50 µs with a 50 µs nap between them as the log's encoder
    /// does, for a converter on the serving machine.
    pub idle: bool,
    /// One JSON object per converted segment instead of a line of text.
    pub json: bool,
}

/// Converts every closed segment waiting in `args.logs` (oldest first), printing one
/// line per segment and a summary; with `watch`, again every `interval_ms` until
/// `stop()` returns true, and then once more (what closed meanwhile, such as the last
/// segment of a server that stopped first). A segment that cannot be converted is
/// logged as a warning (with `watch`, again at most every 10 minutes) and left
/// as it is while the others are converted; the run then ends in an error that names
/// it (with `watch`, only if the last pass still failed on it). Safe beside the serving
/// writer (it never touches the open segment) and beside other converters (each
/// segment's lock decides who converts it).
pub fn run_convert(args: &ConvertArgs, out: &mut dyn Write, stop: &dyn Fn() -> bool) -> Result<()> {
    if !args.logs.is_dir() {
        return Err(LogError::Config(format!(
            "{} is not a directory (the prediction log's `dir`)",
            args.logs.display()
        )));
    }
    if args.idle {
        if let Err(e) = crate::priority::set_current_thread_idle() {
            tracing::warn!(error = %e, "could not run under SCHED_IDLE; converting at normal priority");
        }
    }
    // Under SCHED_IDLE, work in spells with naps between them, as the log's encoder
    // does: a core an idle-class thread keeps busy never pulls the serving threads
    // waiting on the other one (`priority::Pace`).
    let mut pace = crate::priority::Pace::new();
    let mut between = || {
        if args.idle {
            pace.tick();
        }
    };
    let started = std::time::Instant::now();
    let (mut segments, mut records) = (0u64, 0u64);
    let mut bad: Vec<String> = Vec::new();
    let mut reports = Reports::default();
    let mut last = false;
    loop {
        let mut failed = None;
        bad.clear();
        crate::segment::convert_closed_with(&args.logs, &mut between, |c| {
            let c = match c {
                Ok(c) => c,
                Err((wal, e)) => {
                    // Left as it is; the others are converted, and the next pass (or
                    // run) tries it again.
                    if reports.due(wal, std::time::Instant::now()) {
                        tracing::warn!(wal = %wal.display(), error = %e,
                            "could not convert a closed segment; its wal stays as it is (with --watch it is tried again each pass, and this is said again at most every 10 minutes)");
                    }
                    bad.push(wal.display().to_string());
                    return;
                }
            };
            segments += 1;
            records += c.records as u64;
            let line = if args.json {
                serde_json::to_string(c).unwrap_or_default()
            } else {
                format!(
                    "converted {}: {} records, wal {} bytes -> {}",
                    c.id,
                    c.records,
                    c.wal_bytes,
                    c.path.as_ref().map_or_else(
                        || "no file (nothing to write)".to_string(),
                        |p| p.display().to_string()
                    )
                )
            };
            if failed.is_none() {
                if let Err(e) = writeln!(out, "{line}") {
                    failed = Some(e);
                }
            }
        })?;
        if let Some(e) = failed {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(());
            }
            return Err(LogError::io("stdout", e));
        }
        if !args.watch || last {
            break;
        }
        let until = std::time::Instant::now() + Duration::from_millis(args.interval_ms.max(10));
        while !stop() && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        // Stopped: one more pass, for what closed since this one began. A server
        // stopping beside the converter closes its open segment as it goes (in a pod,
        // the converter as a sidecar is stopped after the server).
        last = stop();
    }
    if !args.json {
        let secs = started.elapsed().as_secs_f64();
        writeln!(
            out,
            "{segments} segment{}, {records} records converted in {secs:.2} s{}",
            if segments == 1 { "" } else { "s" },
            if secs > 0.0 && records > 0 && !args.watch {
                format!(" ({:.0} records/s)", records as f64 / secs)
            } else {
                String::new()
            }
        )
        .map_err(|e| LogError::io("stdout", e))?;
    }
    if !bad.is_empty() {
        return Err(LogError::Config(format!(
            "{} closed segment(s) could not be converted and stay as wal files: {}",
            bad.len(),
            bad.join(", ")
        )));
    }
    Ok(())
}

/// Which failed segments `run_convert` has reported, and when: with `watch` a segment
/// that keeps failing is tried every pass (a full disk clears), but said again only
/// every [`Reports::REPEAT`], so that a bad wal does not fill the converter's log.
#[derive(Default)]
struct Reports(std::collections::HashMap<std::path::PathBuf, std::time::Instant>);

impl Reports {
    const REPEAT: Duration = Duration::from_secs(600);

    /// Whether this failure of `wal` is to be reported now (and, if so, noted).
    fn due(&mut self, wal: &std::path::Path, now: std::time::Instant) -> bool {
        let due = self
            .0
            .get(wal)
            .is_none_or(|t| now.saturating_duration_since(*t) >= Self::REPEAT);
        if due {
            self.0.insert(wal.to_path_buf(), now);
        }
        due
    }
}

/// Prints records; false when the output has gone away.
fn print_records(recs: &[PredictionRecord], json: bool, out: &mut dyn Write) -> Result<bool> {
    let mut write = || -> std::io::Result<()> {
        for r in recs {
            if json {
                serde_json::to_writer(&mut *out, r)?;
                writeln!(out)?;
            } else {
                writeln!(out, "{}", summary_line(r))?;
            }
        }
        out.flush()
    };
    match write() {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(LogError::io("<output>", e)),
    }
}

/// `2024-05-01T12:00:00.123456Z req-1 fraud v3 primary score=0.9100 decision=decline source=MODEL total=512us`
pub fn summary_line(r: &PredictionRecord) -> String {
    let score = r
        .score
        .map_or_else(|| "-".to_string(), |s| format!("{s:.4}"));
    format!(
        "{} {} {} v{} {} score={} decision={} source={} total={}us",
        format_ts(r.ts_us),
        r.request_id,
        r.model,
        r.version,
        r.role,
        score,
        r.decision.as_deref().unwrap_or("-"),
        r.source,
        r.stages.total
    )
}

/// RFC 3339 UTC with microseconds.
pub fn format_ts(ts_us: i64) -> String {
    let in_day = ts_us.rem_euclid(86_400_000_000);
    let (h, m) = (in_day / 3_600_000_000, (in_day / 60_000_000) % 60);
    let (s, us) = ((in_day / 1_000_000) % 60, in_day % 1_000_000);
    format!("{}T{h:02}:{m:02}:{s:02}.{us:06}Z", date_of_us(ts_us))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_that_keeps_failing_is_reported_again_only_after_the_repeat_interval() {
        let mut r = Reports::default();
        let (a, b) = (std::path::Path::new("a.wal"), std::path::Path::new("b.wal"));
        let t0 = std::time::Instant::now();
        assert!(r.due(a, t0));
        assert!(!r.due(a, t0 + Duration::from_secs(1)));
        // Another segment is its own report.
        assert!(r.due(b, t0 + Duration::from_secs(1)));
        assert!(!r.due(a, t0 + Reports::REPEAT - Duration::from_millis(1)));
        assert!(r.due(a, t0 + Reports::REPEAT));
        assert!(!r.due(a, t0 + Reports::REPEAT + Duration::from_secs(1)));
    }

    #[test]
    fn timestamps() {
        assert_eq!(format_ts(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            format_ts(1_709_208_000_000_001),
            "2024-02-29T12:00:00.000001Z"
        );
    }
}
