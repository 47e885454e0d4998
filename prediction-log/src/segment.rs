//! Files on disk: names, partitions, wal -> Parquet conversion and crash recovery.
//!
//! ```text
//! <dir>/_wal/seg-<id>.wal                         the open segment (and, after a crash, leftovers)
//! <dir>/_wal/closed/seg-<id>.wal                  rolled segments waiting for conversion
//!                                                 (`parquet = deferred`)
//! <dir>/date=YYYY-MM-DD/part-<id>.parquet         closed segments, one date each
//! <dir>/date=YYYY-MM-DD/.part-<id>.parquet.tmp    the open segment's Parquet file
//! <dir>/date=YYYY-MM-DD/.part-<id>.wal.parquet.tmp a conversion from the wal in progress
//! ```
//! `<id>` is `<open time µs, 16 digits>-<pid>-<sequence>`, so names sort by time and never
//! collide between restarts. A wal and the Parquet file made from it share the id, which
//! makes conversion idempotent: if the Parquet file exists, the wal is already converted.
//! Readers that skip names starting with `_` or `.` (Spark, Hive, DuckDB globs on
//! `*.parquet`) never see anything but closed segments.

use crate::error::{LogError, Result};
use crate::parquet_write::OpenParquet;
use crate::record::date_of_us;
use crate::wal::scan_wal;
use std::fs;
use std::path::{Path, PathBuf};

pub(crate) const WAL_DIR: &str = "_wal";

pub(crate) fn wal_dir(dir: &Path) -> PathBuf {
    dir.join(WAL_DIR)
}

pub(crate) fn segment_id(open_us: i64, seq: u64) -> String {
    format!("{:016}-{}-{:06}", open_us.max(0), std::process::id(), seq)
}

pub(crate) fn wal_path(dir: &Path, id: &str) -> PathBuf {
    wal_dir(dir).join(format!("seg-{id}.wal"))
}

/// Where rolled segments wait for their conversion when it is deferred
/// ([`crate::ParquetMode::Deferred`]): a segment there is closed, and no writer appends
/// to it again, so another process may convert it ([`convert_closed`]).
pub(crate) fn closed_dir(dir: &Path) -> PathBuf {
    wal_dir(dir).join(CLOSED_DIR)
}

pub(crate) const CLOSED_DIR: &str = "closed";

pub(crate) fn closed_wal_path(dir: &Path, id: &str) -> PathBuf {
    closed_dir(dir).join(format!("seg-{id}.wal"))
}

/// Id of a wal file name `seg-<id>.wal`.
pub(crate) fn id_of_wal(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    Some(name.strip_prefix("seg-")?.strip_suffix(".wal")?.to_string())
}

/// Id of a closed segment's file name `part-<id>.parquet`.
pub(crate) fn id_of_parquet(path: &Path) -> Option<&str> {
    path.file_name()?
        .to_str()?
        .strip_prefix("part-")?
        .strip_suffix(".parquet")
}

pub(crate) fn parquet_path(dir: &Path, date: &str, id: &str) -> PathBuf {
    dir.join(format!("date={date}"))
        .join(format!("part-{id}.parquet"))
}

fn sync_dir(dir: &Path) -> Result<()> {
    let d = fs::File::open(dir).map_err(|e| LogError::io(dir, e))?;
    d.sync_all().map_err(|e| LogError::io(dir, e))
}

/// The temp name of segment `id`'s Parquet file while it is written (a dot file, which
/// readers skip), creating its partition directory.
fn temp_path(dir: &Path, date: &str, id: &str) -> Result<PathBuf> {
    let part_dir = dir.join(format!("date={date}"));
    fs::create_dir_all(&part_dir).map_err(|e| LogError::io(&part_dir, e))?;
    Ok(part_dir.join(format!(".part-{id}.parquet.tmp")))
}

/// Starts the Parquet file of an open segment (under its temp name): the writer fills it
/// as records arrive, and [`close_parquet`] puts it into place.
pub(crate) fn open_parquet(dir: &Path, date: &str, id: &str) -> Result<OpenParquet> {
    OpenParquet::create(&temp_path(dir, date, id)?)
}

/// Finishes the Parquet file of segment `id` (fsynced), renames it into place and fsyncs
/// the directory. Returns the final path.
pub(crate) fn close_parquet(
    dir: &Path,
    date: &str,
    id: &str,
    file: OpenParquet,
) -> Result<PathBuf> {
    let tmp = file.path().to_path_buf();
    file.finish()?;
    let final_path = parquet_path(dir, date, id);
    fs::rename(&tmp, &final_path).map_err(|e| LogError::io(&final_path, e))?;
    let part_dir = final_path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| dir.to_path_buf());
    sync_dir(&part_dir)?;
    Ok(final_path)
}

/// What [`convert`] did with one wal.
struct Converted {
    /// The Parquet file written; `None` for a wal without a record, or when the segment
    /// was already converted.
    path: Option<PathBuf>,
    /// Records read from the wal (when `already`, only the first).
    records: usize,
    /// Bytes after the wal's last whole frame.
    trailing_bytes: u64,
    /// The segment's Parquet file existed already (a crash between rename and delete).
    already: bool,
}

/// Converts the wal of segment `id` into its Parquet file (temp name, fsync, atomic
/// rename, fsync of the directory), up to its last whole frame, one frame at a time: the
/// memory it takes is a slice of rows and the encoded row group, not the segment. With
/// `skip_existing`, a segment whose Parquet file exists is left as it is.
fn convert(
    dir: &Path,
    id: &str,
    wal: &Path,
    skip_existing: bool,
    between: &mut dyn FnMut(),
) -> Result<Converted> {
    let mut open: Option<(String, OpenParquet)> = None;
    let mut already = false;
    let scanned = scan_wal(wal, 0, &mut crate::codec::NameSets::default(), |rec| {
        let file = match open.as_mut() {
            Some((_, f)) => f,
            None => {
                // The partition is the first record's date (a segment holds one date).
                let date = date_of_us(rec.ts_us);
                if skip_existing && parquet_path(dir, &date, id).exists() {
                    already = true;
                    return Ok(false);
                }
                // A temp name of its own: the encoder may still hold the open segment's
                // temp file of a segment it gave up, and removes it when it sees that.
                let f = OpenParquet::create(&temp_path(dir, &date, &format!("{id}.wal"))?)?;
                &mut open.insert((date, f)).1
            }
        };
        file.append(&rec.view())?;
        between();
        Ok(true)
    });
    let scanned = match scanned {
        Ok(s) => s,
        Err(e) => {
            if let Some((_, f)) = open {
                f.discard();
            }
            return Err(e);
        }
    };
    let path = match open {
        Some((date, f)) => Some(close_parquet(dir, &date, id, f)?),
        None => None,
    };
    Ok(Converted {
        path,
        records: scanned.records,
        trailing_bytes: scanned.trailing_bytes,
        already,
    })
}

/// Converts the wal of segment `id` into its Parquet file, up to its last whole frame;
/// `None` when it holds no record. For a segment whose Parquet file was not written while
/// it was open.
pub(crate) fn convert_wal(
    dir: &Path,
    id: &str,
    wal: &Path,
    between: &mut dyn FnMut(),
) -> Result<Option<PathBuf>> {
    convert(dir, id, wal, false, between).map(|c| c.path)
}

/// What [`recover`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RecoveryReport {
    /// Leftover wal files found.
    pub wal_files: usize,
    /// Records converted into Parquet segments.
    pub records: usize,
    /// Bytes dropped from torn wal tails (a frame half-written when the process died).
    pub torn_bytes: u64,
    /// Wal files whose Parquet segment already existed (crash between rename and delete).
    pub already_converted: usize,
    /// Half-written `.parquet.tmp` files removed.
    pub temp_files_removed: usize,
}

/// Converts every leftover wal file of `dir` into a Parquet segment and removes half-written
/// temp files. Run at start (by `PredictionLog::start`) while no other writer uses `dir`.
/// Rolled segments waiting in `_wal/closed/` (deferred conversion) are converted too; one
/// that another process is converting right now is left to it.
pub fn recover(dir: &Path) -> Result<RecoveryReport> {
    recover_keeping(dir, false)
}

/// [`recover`], leaving the closed segments of a deferred conversion in place with
/// `keep_closed` (they wait for `mesh logs convert` or the writer's bound).
pub(crate) fn recover_keeping(dir: &Path, keep_closed: bool) -> Result<RecoveryReport> {
    let mut report = RecoveryReport::default();
    let mut wals = list_wals(&wal_dir(dir))?;
    if !keep_closed {
        wals.extend(list_wals(&closed_dir(dir))?);
    }
    for wal in wals {
        let Some(id) = id_of_wal(&wal) else { continue };
        let Some(_lock) = lock_segment(&wal)? else {
            continue;
        };
        report.wal_files += 1;
        let c = convert(dir, &id, &wal, true, &mut || ())?;
        if c.already {
            report.already_converted += 1;
        } else {
            report.torn_bytes += c.trailing_bytes;
            report.records += c.records;
        }
        fs::remove_file(&wal).map_err(|e| LogError::io(&wal, e))?;
    }
    for part_dir in partition_dirs(dir)? {
        for entry in fs::read_dir(&part_dir).map_err(|e| LogError::io(&part_dir, e))? {
            let Ok(entry) = entry else { continue };
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(".part-") && name.ends_with(".parquet.tmp") {
                // A conversion of a closed segment by another process (`mesh logs
                // convert`) holds that segment's lock while it writes its temp file.
                let converting = name
                    .strip_prefix(".part-")
                    .and_then(|n| n.strip_suffix(".wal.parquet.tmp"))
                    .map(|id| closed_wal_path(dir, id))
                    .is_some_and(|w| w.exists() && matches!(lock_segment(&w), Ok(None)));
                if converting {
                    continue;
                }
                let p = entry.path();
                fs::remove_file(&p).map_err(|e| LogError::io(&p, e))?;
                report.temp_files_removed += 1;
            }
        }
    }
    Ok(report)
}

/// The `seg-*.wal` files of one directory, sorted; none when it does not exist.
fn list_wals(wdir: &Path) -> Result<Vec<PathBuf>> {
    if !wdir.is_dir() {
        return Ok(Vec::new());
    }
    let mut wals: Vec<PathBuf> = fs::read_dir(wdir)
        .map_err(|e| LogError::io(wdir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "wal") && p.is_file())
        .collect();
    wals.sort();
    Ok(wals)
}

/// Takes the conversion lock of a segment's wal (an exclusive `flock` on the file
/// itself, released when the returned file is dropped, or by the OS when the holder
/// dies). `None` when another process holds it, or when the wal is gone (converted
/// and removed by whoever held it).
fn lock_segment(wal: &Path) -> Result<Option<fs::File>> {
    let file = match fs::File::open(wal) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(LogError::io(wal, e)),
    };
    match file.try_lock() {
        Ok(()) => {}
        Err(fs::TryLockError::WouldBlock) => return Ok(None),
        Err(fs::TryLockError::Error(e)) => return Err(LogError::io(wal, e)),
    }
    // Locked the file, but was it removed while we waited for the lock? Then the
    // holder converted it already.
    match fs::metadata(wal) {
        Ok(_) => Ok(Some(file)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(LogError::io(wal, e)),
    }
}

/// One closed segment converted by `convert_closed_segment`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ConvertedSegment {
    /// The segment's id (its wal's and its Parquet file's names carry it).
    pub id: String,
    /// The Parquet file written; `None` for a wal without a record, or one whose
    /// Parquet file existed already.
    pub path: Option<PathBuf>,
    /// Records written into the Parquet file.
    pub records: usize,
    /// The wal's size.
    pub wal_bytes: u64,
    /// Bytes after the wal's last whole frame (dropped).
    pub torn_bytes: u64,
}

/// Converts one closed segment's wal into its Parquet file and removes the wal, under
/// the segment's lock: `None` when another process is converting it or has done so
/// (the wal is gone). Safe to run from several processes at once: each segment is
/// converted once.
pub(crate) fn convert_closed_segment(
    dir: &Path,
    id: &str,
    wal: &Path,
    between: &mut dyn FnMut(),
) -> Result<Option<ConvertedSegment>> {
    let Some(_lock) = lock_segment(wal)? else {
        return Ok(None);
    };
    let wal_bytes = fs::metadata(wal).map(|m| m.len()).unwrap_or(0);
    let c = convert(dir, id, wal, true, between)?;
    fs::remove_file(wal).map_err(|e| LogError::io(wal, e))?;
    Ok(Some(ConvertedSegment {
        id: id.to_string(),
        path: c.path,
        records: if c.already { 0 } else { c.records },
        wal_bytes,
        torn_bytes: c.trailing_bytes,
    }))
}

/// Converts every closed segment waiting in `dir`'s `_wal/closed/` (deferred
/// conversion), oldest first, calling `each` with what became of each one. Runs beside
/// a serving writer, and beside other converters: a segment another one holds is
/// skipped. The open segment is never touched (it is not in `_wal/closed/` until it
/// rolls). A segment that cannot be converted (its wal unreadable, a full disk) is
/// passed to `each` with its error and left as it is, and the others are still
/// converted; the error is `Err` only when `_wal/closed/` cannot be listed.
pub fn convert_closed(
    dir: &Path,
    each: impl FnMut(std::result::Result<&ConvertedSegment, (&Path, &LogError)>),
) -> Result<Vec<ConvertedSegment>> {
    convert_closed_with(dir, &mut || (), each)
}

/// [`convert_closed`], calling `between` after each record (where `mesh logs convert
/// --idle` naps, as the log's encoder does).
pub(crate) fn convert_closed_with(
    dir: &Path,
    between: &mut dyn FnMut(),
    mut each: impl FnMut(std::result::Result<&ConvertedSegment, (&Path, &LogError)>),
) -> Result<Vec<ConvertedSegment>> {
    let mut done = Vec::new();
    for wal in list_wals(&closed_dir(dir))? {
        let Some(id) = id_of_wal(&wal) else { continue };
        match convert_closed_segment(dir, &id, &wal, between) {
            Ok(Some(c)) => {
                each(Ok(&c));
                done.push(c);
            }
            Ok(None) => {}
            Err(e) => each(Err((&wal, &e))),
        }
    }
    Ok(done)
}

/// The closed segments waiting for conversion in `dir` (deferred conversion), oldest
/// first, with their sizes.
pub(crate) fn closed_segments(dir: &Path) -> Result<Vec<(String, PathBuf, u64)>> {
    Ok(list_wals(&closed_dir(dir))?
        .into_iter()
        .filter_map(|w| {
            let id = id_of_wal(&w)?;
            let len = fs::metadata(&w).map(|m| m.len()).ok()?;
            Some((id, w, len))
        })
        .collect())
}

/// The `date=...` directories of `dir`, sorted.
pub(crate) fn partition_dirs(dir: &Path) -> Result<Vec<PathBuf>> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let mut out: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(|e| LogError::io(dir, e))?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("date=") && e.path().is_dir())
        .map(|e| e.path())
        .collect();
    out.sort();
    Ok(out)
}

/// Every closed segment of `dir`, oldest first (by partition, then by name = open time).
pub fn parquet_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for part_dir in partition_dirs(dir)? {
        let mut files: Vec<PathBuf> = fs::read_dir(&part_dir)
            .map_err(|e| LogError::io(&part_dir, e))?
            .filter_map(|e| e.ok())
            .filter(|e| {
                let n = e.file_name();
                let n = n.to_string_lossy();
                n.starts_with("part-") && n.ends_with(".parquet")
            })
            .map(|e| e.path())
            .collect();
        files.sort();
        out.extend(files);
    }
    Ok(out)
}

/// Wal files of `dir` (the open segment, closed segments waiting for a deferred
/// conversion, leftovers of a crash), oldest first (by segment id).
pub fn wal_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = list_wals(&wal_dir(dir))?;
    out.extend(list_wals(&closed_dir(dir))?);
    out.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::record::{now_us, numbered, PredictionRecord, Role};
    use crate::wal::write_wal;

    /// A wal of `n` records with its last frame torn in half.
    fn torn_wal(dir: &Path, id: &str, n: usize) -> (PathBuf, Vec<PredictionRecord>) {
        fs::create_dir_all(wal_dir(dir)).unwrap();
        let wal = wal_path(dir, id);
        let recs = numbered(n, Role::Primary);
        write_wal(&wal, &recs);
        let len = fs::metadata(&wal).unwrap().len();
        fs::File::options()
            .write(true)
            .open(&wal)
            .unwrap()
            .set_len(len - 5)
            .unwrap();
        (wal, recs)
    }

    /// A conversion streams the wal frame by frame into the Parquet file, across many
    /// slices, up to the last whole frame, with a call between records (where the
    /// closer naps); it skips a segment already converted after reading only its first
    /// record.
    #[test]
    fn a_wal_converts_frame_by_frame_up_to_its_last_whole_frame() {
        let dir = tempfile::tempdir().unwrap();
        let id = segment_id(now_us(), 0);
        let n = 3 * 128 + 11;
        let (wal, recs) = torn_wal(dir.path(), &id, n);
        let mut between = 0;
        let c = convert(dir.path(), &id, &wal, true, &mut || between += 1).unwrap();
        assert_eq!(between, n - 1, "one call after each record");
        assert!(!c.already);
        assert_eq!(c.records, n - 1);
        assert!(c.trailing_bytes > 0);
        let path = c.path.unwrap();
        assert_eq!(
            crate::parquet_io::read_parquet(&path).unwrap(),
            recs[..n - 1]
        );
        let again = convert(dir.path(), &id, &wal, true, &mut || ()).unwrap();
        assert!(again.already && again.path.is_none());
        assert_eq!(again.records, 1, "stopped at the first record");
        // No temp file is left in the partition.
        let names: Vec<String> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }
}
