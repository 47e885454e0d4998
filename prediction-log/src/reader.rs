//! Reading the log back: everything at once, file by file, or following new records (tail).

use crate::codec::NameSets;
use crate::error::Result;
use crate::parquet_io::read_parquet;
use crate::record::PredictionRecord;
use crate::segment::{id_of_parquet, id_of_wal, parquet_files, wal_files};
use crate::wal::read_wal_from;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

/// Which files a read covers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadOptions {
    /// Also read wal files (the open segment of a running writer, or leftovers of a crash
    /// not yet recovered), up to their last whole frame. Closed segments only when false,
    /// which is what DuckDB and the other Parquet readers see.
    pub include_wal: bool,
}

/// Calls `f` with every record of `dir`, file by file, oldest segment first: the
/// Parquet segments, then (with `include_wal`) the wal files. Each record comes once even
/// while a segment is converted beside the read (by the writer, or by `mesh logs
/// convert`): see `listing`; a wal removed before it could be read is read from its
/// Parquet file.
pub fn scan(dir: &Path, opts: ReadOptions, mut f: impl FnMut(PredictionRecord)) -> Result<()> {
    let (parquet, wals) = listing(dir, opts.include_wal)?;
    for p in &parquet {
        read_parquet(p)?.into_iter().for_each(&mut f);
    }
    for (id, w) in wals {
        match read_wal_from(&w, 0, &mut NameSets::default()) {
            Ok(c) => c.records.into_iter().for_each(&mut f),
            Err(crate::error::LogError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                // Converted and removed since the listing.
                if let Some(p) = parquet_files(dir)?
                    .into_iter()
                    .find(|p| id_of_parquet(p) == Some(id.as_str()))
                {
                    read_parquet(&p)?.into_iter().for_each(&mut f);
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A wal file with its segment id.
type UnconvertedWal = (String, PathBuf);

/// `dir`'s Parquet segments and (with `wals`) its wal files not yet converted, with
/// their ids. The wals are listed first and a wal whose Parquet file is listed is left
/// out: the file is renamed into place before the wal is removed, so a conversion
/// between the two listings shows its segment once.
fn listing(dir: &Path, wals: bool) -> Result<(Vec<PathBuf>, Vec<UnconvertedWal>)> {
    let wals = if wals { wal_files(dir)? } else { Vec::new() };
    let parquet = parquet_files(dir)?;
    let converted: HashSet<&str> = parquet.iter().filter_map(|p| id_of_parquet(p)).collect();
    let wals = wals
        .into_iter()
        .filter_map(|w| Some((id_of_wal(&w)?, w)))
        .filter(|(id, _)| !converted.contains(id.as_str()))
        .collect();
    Ok((parquet, wals))
}

/// Records in `dir`'s write-ahead files: written by a running writer (its open
/// segment), waiting for a deferred conversion, or left by a crash, and not yet in a
/// Parquet file, so readers of the Parquet files (and a join without `include_wal`) do
/// not see them.
pub fn wal_record_count(dir: &Path) -> Result<u64> {
    let mut n = 0u64;
    for (_, w) in listing(dir, true)?.1 {
        match read_wal_from(&w, 0, &mut NameSets::default()) {
            Ok(c) => n += c.records.len() as u64,
            Err(crate::error::LogError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Every record of `dir`.
pub fn read_all(dir: &Path, opts: ReadOptions) -> Result<Vec<PredictionRecord>> {
    let mut out = Vec::new();
    scan(dir, opts, |r| out.push(r))?;
    Ok(out)
}

/// Follows a log directory: yields records as the writer appends them to its wal.
///
/// Tracks a read offset per wal file; when a wal disappears (rolled into Parquet) the
/// records appended after the last poll are taken from its Parquet segment, so nothing is
/// missed across a roll.
pub struct Tailer {
    dir: PathBuf,
    /// wal id -> (bytes read, records seen, the name sets read so far)
    wals: HashMap<String, (u64, usize, NameSets)>,
    /// Closed segments already accounted for.
    known_parquet: HashSet<PathBuf>,
}

impl Tailer {
    /// Starts following `dir` and returns up to `backlog` of the newest records already
    /// there (oldest first).
    pub fn start(dir: &Path, backlog: usize) -> Result<(Self, Vec<PredictionRecord>)> {
        let known_parquet = parquet_files(dir)?.into_iter().collect();
        let mut t = Tailer {
            dir: dir.to_path_buf(),
            wals: HashMap::new(),
            known_parquet,
        };
        let mut newest = t.poll()?;
        if newest.len() < backlog {
            let mut older: Vec<PredictionRecord> = Vec::new();
            for p in parquet_files(dir)?.iter().rev() {
                let mut recs = match read_parquet(p) {
                    Ok(r) => r,
                    Err(_) => continue,
                };
                recs.append(&mut older);
                older = recs;
                if older.len() + newest.len() >= backlog {
                    break;
                }
            }
            older.append(&mut newest);
            newest = older;
        }
        let skip = newest.len().saturating_sub(backlog);
        newest.drain(..skip);
        Ok((t, newest))
    }

    /// Records appended since the last poll, in write order.
    pub fn poll(&mut self) -> Result<Vec<PredictionRecord>> {
        let mut out = Vec::new();
        let current: Vec<(String, PathBuf)> = wal_files(&self.dir)?
            .into_iter()
            .filter_map(|w| Some((id_of_wal(&w)?, w)))
            .collect();
        // Segments closed since the last poll come first. For a wal we were following, only
        // the records after the ones already yielded; a segment we never saw as a wal
        // (opened and rolled between two polls), all of it.
        let mut gone: Vec<String> = self
            .wals
            .keys()
            .filter(|id| !current.iter().any(|(c, _)| c == *id))
            .cloned()
            .collect();
        gone.sort();
        for p in parquet_files(&self.dir)? {
            if self.known_parquet.contains(&p) {
                continue;
            }
            let id = id_of_parquet(&p).unwrap_or_default().to_string();
            if current.iter().any(|(c, _)| *c == id) {
                continue; // renamed into place, wal not yet removed: next poll
            }
            let seen = if gone.contains(&id) {
                self.wals.remove(&id).map(|(_, s, _)| s).unwrap_or(0)
            } else {
                0
            };
            out.extend(read_parquet(&p)?.into_iter().skip(seen));
            self.known_parquet.insert(p);
        }
        // Gone wals without a Parquet file (conversion failed): nothing more to yield.
        for id in gone {
            self.wals.remove(&id);
        }
        for (id, w) in current {
            let (offset, seen, mut sets) = self.wals.remove(&id).unwrap_or_default();
            match read_wal_from(&w, offset, &mut sets) {
                Ok(c) => {
                    let n = c.records.len();
                    out.extend(c.records);
                    self.wals
                        .insert(id, (c.valid_len.max(offset), seen + n, sets));
                }
                // Rolled between listing and reading: its Parquet file is read by the next
                // poll. Stop here so newer wals do not overtake its last records.
                Err(crate::error::LogError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    self.wals.insert(id, (offset, seen, sets));
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }
}
