//! Write-ahead file of the open segment.
//!
//! Layout: an 8-byte magic, then frames of
//! `[u32 LE payload length][u32 LE crc32(payload)][payload]`. The magic says what a
//! payload is:
//! - `MESHWAL2` (written now): one tag byte naming the layout, then the record in the
//!   compact binary layout of [`crate::codec`], or a name-set frame (the feature names
//!   the records after it refer to by id; a reader takes them in as it goes);
//! - `MESHWAL1` (written before): the record as JSON. Still read everywhere (recovery,
//!   `include_wal`, the tail), so a wal left by an older build converts at the next start.
//!
//! A crash can leave a torn last frame (short, or with a bad checksum); readers stop at the
//! first frame that is not whole and report how many bytes they skipped.

use crate::codec::{self, DecodeError};
use crate::error::{LogError, Result};
use crate::record::{LoggedFeature, PredictionRecord, RecordRef};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The magic of files this build writes: binary frames.
pub(crate) const MAGIC: &[u8; 8] = b"MESHWAL2";
/// The magic of files written before the binary frames: JSON frames.
pub(crate) const MAGIC_JSON: &[u8; 8] = b"MESHWAL1";
pub(crate) const FRAME_HEADER: usize = 8;
/// A frame larger than this is treated as corruption, not as a record.
pub(crate) const MAX_FRAME: usize = 64 << 20;
/// The most the log hands the OS in one `write`, to a wal or to a Parquet file: the
/// wal writer's buffer size, and the piece a longer write is cut into ([`PacedWrite`]).
/// A `write` to the page cache runs in the kernel without a point at which a serving
/// thread woken on the same CPU can have it; 256 KiB at a time held such a thread p90
/// 122 µs, 32 KiB 37-40 µs (prediction-log/README, "The wal written 32 KiB at a time").
pub(crate) const WRITE_BYTES: usize = 32 << 10;

/// A file the log writes at most [`WRITE_BYTES`] at a time, offering the CPU to any
/// thread that waits for it between two pieces: a `write_all` of a row group's column
/// chunk (megabytes) becomes many short writes, each a point at which a serving thread
/// can have the CPU back.
pub(crate) struct PacedWrite<W>(pub(crate) W);

impl<W: Write> Write for PacedWrite<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.0.write(&buf[..buf.len().min(WRITE_BYTES)])?;
        if n < buf.len() {
            // More follows in the caller's loop (`write_all`, a `BufWriter`'s flush).
            std::thread::yield_now();
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// Appends `rec` to `buf` as one frame, its length filled in and its checksum left for
/// [`checksum_frame`]; its features named by the name set `set` when that is not 0
/// (see [`codec::encode_by_names`]). When the payload is larger than a reader accepts
/// ([`MAX_FRAME`]): `buf` as it was, and the payload's size as the error.
pub(crate) fn push_frame<K: AsRef<str>, F: LoggedFeature>(
    buf: &mut Vec<u8>,
    set: u32,
    rec: &RecordRef<'_, K, F>,
) -> std::result::Result<(), usize> {
    let at = buf.len();
    buf.extend_from_slice(&[0u8; FRAME_HEADER]);
    codec::encode_by_names(set, rec, buf);
    let len = buf.len() - at - FRAME_HEADER;
    match u32::try_from(len) {
        Ok(l) if len <= MAX_FRAME => {
            buf[at..at + 4].copy_from_slice(&l.to_le_bytes());
            Ok(())
        }
        _ => {
            buf.truncate(at);
            Err(len)
        }
    }
}

/// [`push_frame`] then [`checksum_frame`]: a frame ready for a wal file as it is
/// (tests and the encoder's bench; the writer checksums the request path's frames
/// later, off that path).
pub(crate) fn push_sealed_frame<K: AsRef<str>, F: LoggedFeature>(
    buf: &mut Vec<u8>,
    set: u32,
    rec: &RecordRef<'_, K, F>,
) -> std::result::Result<(), usize> {
    let at = buf.len();
    push_frame(buf, set, rec)?;
    checksum_frame(buf, at);
    Ok(())
}

/// Appends the frame of name set `id` (its names), checksummed. A set takes far less
/// than a frame may hold: the log gives ids only to lists of names that fit
/// ([`crate::names`]).
pub(crate) fn push_name_set_frame(buf: &mut Vec<u8>, id: u32, names: &[Box<str>]) {
    let at = buf.len();
    buf.extend_from_slice(&[0u8; FRAME_HEADER]);
    codec::encode_name_set(id, names, buf);
    let len = (buf.len() - at - FRAME_HEADER) as u32;
    buf[at..at + 4].copy_from_slice(&len.to_le_bytes());
    checksum_frame(buf, at);
}

/// The payload of the frame at `at` in `buf` (frames made by [`push_frame`], one after
/// another) and where the next frame starts; `None` past the last whole frame.
pub(crate) fn frame_at(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let len = frame_len(buf.get(at..at.checked_add(FRAME_HEADER)?)?);
    let start = at + FRAME_HEADER;
    let end = start.checked_add(len)?;
    Some((buf.get(start..end)?, end))
}

/// The payload length the frame header at the start of `header` gives.
pub(crate) fn frame_len(header: &[u8]) -> usize {
    u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize
}

/// Whether the frame at `at` in `buf`, whose payload [`frame_at`] found, carries that
/// payload's checksum.
pub(crate) fn frame_checksum_ok(buf: &[u8], at: usize, payload: &[u8]) -> bool {
    let h = &buf[at + 4..at + FRAME_HEADER];
    crc32fast::hash(payload) == u32::from_le_bytes([h[0], h[1], h[2], h[3]])
}

/// Fills in the checksum of the frame at `at` (the writer does this, off the request
/// path).
pub(crate) fn checksum_frame(buf: &mut [u8], at: usize) {
    let len = frame_len(&buf[at..]);
    let start = at + FRAME_HEADER;
    let crc = crc32fast::hash(&buf[start..start + len]);
    buf[at + 4..at + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Appends records to one wal file.
pub(crate) struct WalWriter {
    path: PathBuf,
    out: BufWriter<PacedWrite<File>>,
    bytes: u64,
}

impl WalWriter {
    pub(crate) fn create(path: &Path) -> Result<Self> {
        let file = File::options()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| LogError::io(path, e))?;
        let mut out = BufWriter::with_capacity(WRITE_BYTES, PacedWrite(file));
        out.write_all(MAGIC).map_err(|e| LogError::io(path, e))?;
        Ok(Self {
            path: path.to_path_buf(),
            out,
            bytes: MAGIC.len() as u64,
        })
    }

    /// Appends one record as a frame (tools and tests; the writer appends whole runs of
    /// frames with [`append_frames`](Self::append_frames)).
    #[cfg(test)]
    pub(crate) fn append(&mut self, rec: &PredictionRecord) -> Result<()> {
        let mut buf = Vec::new();
        if push_sealed_frame(&mut buf, 0, &rec.view()).is_err() {
            return Err(LogError::Config("record too large for a wal frame".into()));
        }
        self.append_frames(&buf)
    }

    /// Appends frames that [`push_frame`] made and [`checksum_frame`] finished, as they are,
    /// [`WRITE_BYTES`] at a time: the buffer holds that much, and a longer run goes out in
    /// pieces no larger ([`PacedWrite`]).
    pub(crate) fn append_frames(&mut self, frames: &[u8]) -> Result<()> {
        self.out
            .write_all(frames)
            .map_err(|e| LogError::io(&self.path, e))?;
        self.bytes += frames.len() as u64;
        Ok(())
    }

    /// Hands buffered frames to the OS (they then survive a process kill); with `fsync`, also
    /// waits until they are on disk (they then survive a power loss).
    pub(crate) fn flush(&mut self, fsync: bool) -> Result<()> {
        self.out.flush().map_err(|e| LogError::io(&self.path, e))?;
        if fsync {
            self.out
                .get_ref()
                .0
                .sync_data()
                .map_err(|e| LogError::io(&self.path, e))?;
        }
        Ok(())
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

/// What reading a wal file found.
#[derive(Debug, Default)]
pub(crate) struct WalContents {
    pub records: Vec<PredictionRecord>,
    /// Offset just past the last whole frame.
    pub valid_len: u64,
}

/// How the payloads of a wal file are encoded, from its magic.
#[derive(Clone, Copy)]
enum Format {
    Binary,
    Json,
}

/// Reads the magic of `file`: `None` when the file is shorter than a magic (created, but
/// the header never reached the disk: an empty segment).
fn read_format(path: &Path, file: &mut File) -> Result<Option<Format>> {
    let mut magic = [0u8; 8];
    let mut got = 0;
    while got < magic.len() {
        match file.read(&mut magic[got..]) {
            Ok(0) => return Ok(None),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(LogError::io(path, e)),
        }
    }
    match &magic {
        m if m == MAGIC => Ok(Some(Format::Binary)),
        m if m == MAGIC_JSON => Ok(Some(Format::Json)),
        _ => Err(LogError::schema(
            path,
            "not a prediction log wal file (bad magic)",
        )),
    }
}

/// Decodes one checksummed payload. `Ok(None)`: the bytes do not form a record (treated
/// like a torn frame); `Err`: a layout this build does not know, which must not be
/// discarded as damage.
fn decode(
    path: &Path,
    format: Format,
    payload: &[u8],
    sets: &codec::NameSets,
) -> Result<Option<PredictionRecord>> {
    match format {
        Format::Json => Ok(serde_json::from_slice(payload).ok()),
        Format::Binary => match codec::decode(payload, sets) {
            Ok(r) => Ok(Some(r)),
            Err(DecodeError::Malformed(_)) => Ok(None),
            Err(DecodeError::UnknownTag(t)) => Err(LogError::schema(
                path,
                format!(
                    "wal frame of layout {t}, which this build does not know (written by a newer mesh); \
                     run that version to convert it"
                ),
            )),
        },
    }
}

/// Where a [`scan_wal`] stopped.
pub(crate) struct WalScan {
    /// Records handed over.
    pub records: usize,
    /// Bytes of whole frames from the start of the file (the offset to read on from).
    pub valid_len: u64,
    /// Bytes after the last whole frame (a torn frame, or one still being written).
    pub trailing_bytes: u64,
}

/// Fills `buf` from `r`; false when the file ends first (a torn frame).
fn read_full(path: &Path, r: &mut impl Read, buf: &mut [u8]) -> Result<bool> {
    match r.read_exact(buf) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(LogError::io(path, e)),
    }
}

/// Reads the whole frames of `path` from `offset` (0 = the start of the file; a non-zero
/// offset is the `valid_len` of an earlier read) one at a time, handing each record to
/// `f`, which returns false to stop. Holds one frame in memory, not the file. Frames
/// appended after the scan started are left for the next one. `sets`: the name-set
/// frames read so far (empty from the start of the file; an earlier read's from its
/// `valid_len`), to which the scan adds those it reads.
pub(crate) fn scan_wal(
    path: &Path,
    offset: u64,
    sets: &mut codec::NameSets,
    mut f: impl FnMut(PredictionRecord) -> Result<bool>,
) -> Result<WalScan> {
    let mut file = File::open(path).map_err(|e| LogError::io(path, e))?;
    let len = file.metadata().map_err(|e| LogError::io(path, e))?.len();
    let Some(format) = read_format(path, &mut file)? else {
        return Ok(WalScan {
            records: 0,
            valid_len: 0,
            trailing_bytes: len,
        });
    };
    let start = offset.max(MAGIC.len() as u64);
    file.seek(SeekFrom::Start(start))
        .map_err(|e| LogError::io(path, e))?;
    let mut r = BufReader::with_capacity(256 << 10, file);
    let (mut pos, mut records) = (start, 0usize);
    let mut header = [0u8; FRAME_HEADER];
    let mut payload = Vec::new();
    while len.saturating_sub(pos) >= FRAME_HEADER as u64 && read_full(path, &mut r, &mut header)? {
        let [l0, l1, l2, l3, c0, c1, c2, c3] = header;
        let frame = u32::from_le_bytes([l0, l1, l2, l3]) as usize;
        let crc = u32::from_le_bytes([c0, c1, c2, c3]);
        if frame > MAX_FRAME || len - pos - (FRAME_HEADER as u64) < frame as u64 {
            break;
        }
        payload.resize(frame, 0);
        if !read_full(path, &mut r, &mut payload)? || crc32fast::hash(&payload) != crc {
            break;
        }
        if matches!(format, Format::Binary) && codec::is_name_set(&payload) {
            if sets.define(&payload).is_err() {
                break;
            }
            pos += (FRAME_HEADER + frame) as u64;
            continue;
        }
        let Some(rec) = decode(path, format, &payload, sets)? else {
            break;
        };
        pos += (FRAME_HEADER + frame) as u64;
        records += 1;
        if !f(rec)? {
            break;
        }
    }
    Ok(WalScan {
        records,
        valid_len: pos,
        trailing_bytes: len.saturating_sub(pos),
    })
}

/// Reads whole frames of `path` starting at `offset` (see [`scan_wal`]) into memory.
pub(crate) fn read_wal_from(
    path: &Path,
    offset: u64,
    sets: &mut codec::NameSets,
) -> Result<WalContents> {
    let mut records = Vec::new();
    let scan = scan_wal(path, offset, sets, |r| {
        records.push(r);
        Ok(true)
    })?;
    Ok(WalContents {
        records,
        valid_len: scan.valid_len,
    })
}

/// Writes `recs` as a new wal file at `path`, flushed (for tests).
#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) fn write_wal(path: &Path, recs: &[PredictionRecord]) {
    let mut w = WalWriter::create(path).unwrap();
    for r in recs {
        w.append(r).unwrap();
    }
    w.flush(true).unwrap();
}

/// The calling thread's own write syscalls and bytes written (`/proc/thread-self/io`),
/// where the kernel keeps them (tests of [`PacedWrite`]'s pieces).
#[cfg(test)]
pub(crate) fn thread_writes() -> Option<(u64, u64)> {
    let io = std::fs::read_to_string("/proc/thread-self/io").ok()?;
    let field = |name: &str| {
        io.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    Some((field("syscw:")?, field("wchar:")?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Role;

    #[test]
    fn torn_tail_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.wal");
        write_wal(&p, &crate::record::numbered(5, Role::Primary));
        let full = std::fs::metadata(&p).unwrap().len();
        // Cut the last frame in half.
        let f = File::options().write(true).open(&p).unwrap();
        f.set_len(full - 10).unwrap();
        let c = read_wal_from(&p, 0, &mut codec::NameSets::default()).unwrap();
        assert_eq!(c.records.len(), 4);
        assert!(
            scan_wal(&p, 0, &mut codec::NameSets::default(), |_| Ok(true))
                .unwrap()
                .trailing_bytes
                > 0
        );
        // Corrupt a byte in the last whole frame: three survive.
        let mut data = std::fs::read(&p).unwrap();
        let third = c.valid_len as usize - 20;
        data[third] ^= 0xff;
        std::fs::write(&p, &data).unwrap();
        let c = read_wal_from(&p, 0, &mut codec::NameSets::default()).unwrap();
        assert_eq!(c.records.len(), 3);
        // Reading on from an offset continues where the last read stopped.
        let c2 = read_wal_from(&p, 8, &mut codec::NameSets::default()).unwrap();
        assert_eq!(c2.records.len(), 3);
    }

    /// Writes a wal as builds before the binary frames did: `MESHWAL1`, JSON payloads.
    fn json_wal(path: &Path, recs: &[PredictionRecord]) {
        let mut data = MAGIC_JSON.to_vec();
        for r in recs {
            let json = serde_json::to_vec(r).unwrap();
            data.extend_from_slice(&(json.len() as u32).to_le_bytes());
            data.extend_from_slice(&crc32fast::hash(&json).to_le_bytes());
            data.extend_from_slice(&json);
        }
        std::fs::write(path, data).unwrap();
    }

    #[test]
    fn a_wal_of_json_frames_from_an_older_build_still_reads() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("old.wal");
        let recs = crate::record::numbered(3, Role::Canary);
        json_wal(&p, &recs);
        let c = read_wal_from(&p, 0, &mut codec::NameSets::default()).unwrap();
        assert_eq!(c.records, recs);
        assert_eq!(
            scan_wal(&p, 0, &mut codec::NameSets::default(), |_| Ok(true))
                .unwrap()
                .trailing_bytes,
            0
        );
        assert_eq!(c.valid_len, std::fs::metadata(&p).unwrap().len());
        // From an offset too (the tail): the format comes from the magic, not the offset.
        let first = read_wal_from(&p, 0, &mut codec::NameSets::default()).unwrap();
        let mut data = std::fs::read(&p).unwrap();
        let one_frame = 8 + 8 + serde_json::to_vec(&recs[0]).unwrap().len();
        data.truncate(one_frame);
        std::fs::write(&p, &data).unwrap();
        let head = read_wal_from(&p, 0, &mut codec::NameSets::default()).unwrap();
        assert_eq!(head.records, recs[..1]);
        json_wal(&p, &recs);
        let rest = read_wal_from(&p, head.valid_len, &mut codec::NameSets::default()).unwrap();
        assert_eq!(rest.records, recs[1..]);
        assert_eq!(rest.valid_len, first.valid_len);
    }

    #[test]
    fn binary_frames_are_compact_and_a_newer_layout_is_an_error_not_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.wal");
        let mut rec = PredictionRecord::new("req-00000001", "fraud", "3", Role::Primary);
        rec.entity_keys = vec![("card_id".into(), "17".into())];
        rec.features = Some(
            (0..29)
                .map(|i| crate::record::FeatureUsed {
                    name: format!("card:feature_{i}").into(),
                    value: Some(i as f64 * 1.5),
                    status: crate::record::status::PRESENT.into(),
                    event_time_us: Some(rec.ts_us - 1_000_000),
                })
                .collect(),
        );
        let mut w = WalWriter::create(&p).unwrap();
        w.append(&rec).unwrap();
        w.flush(false).unwrap();
        let binary = w.bytes() as usize - MAGIC.len();
        let json = serde_json::to_vec(&rec).unwrap().len() + FRAME_HEADER;
        assert!(binary * 2 < json, "binary {binary} bytes, json {json}");
        assert_eq!(
            read_wal_from(&p, 0, &mut codec::NameSets::default())
                .unwrap()
                .records,
            vec![rec]
        );
        // Rewrite the frame with an unknown layout tag and a matching checksum.
        let mut data = std::fs::read(&p).unwrap();
        data[MAGIC.len() + FRAME_HEADER] = 7;
        let crc = crc32fast::hash(&data[MAGIC.len() + FRAME_HEADER..]);
        data[MAGIC.len() + 4..MAGIC.len() + 8].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(&p, &data).unwrap();
        let e = read_wal_from(&p, 0, &mut codec::NameSets::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("layout 7") && e.contains("newer"), "{e}");
    }

    #[test]
    fn long_runs_of_frames_go_out_in_pieces_and_read_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.wal");
        let recs: Vec<PredictionRecord> = (0..3000)
            .map(|i| {
                let mut r =
                    PredictionRecord::new(format!("req-{i:08}"), "fraud", "3", Role::Primary);
                r.entity_keys = vec![("card_id".into(), format!("{}", i * 7))];
                r.score = Some(f64::from(i) / 3000.0);
                r
            })
            .collect();
        // Runs of 1, 4, 13, 40, ... frames, the longest several pieces long.
        let mut runs: Vec<Vec<u8>> = Vec::new();
        let mut at = 0;
        let mut n = 1;
        while at < recs.len() {
            let mut buf = Vec::new();
            for r in &recs[at..(at + n).min(recs.len())] {
                push_sealed_frame(&mut buf, 0, &r.view()).unwrap();
            }
            runs.push(buf);
            at += n;
            n = n * 3 + 1;
        }
        let longest = runs.iter().map(Vec::len).max().unwrap();
        assert!(longest > 3 * WRITE_BYTES, "longest run {longest} bytes");
        let total: usize = runs.iter().map(Vec::len).sum();

        let mut w = WalWriter::create(&p).unwrap();
        let before = thread_writes();
        for run in &runs {
            w.append_frames(run).unwrap();
        }
        w.flush(false).unwrap();
        let after = thread_writes();
        assert_eq!(w.bytes(), (MAGIC.len() + total) as u64);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), w.bytes());
        let back = read_wal_from(&p, 0, &mut codec::NameSets::default()).unwrap();
        assert_eq!(back.records, recs);
        assert_eq!(back.valid_len, w.bytes());
        if let (Some((calls0, bytes0)), Some((calls1, bytes1))) = (before, after) {
            // What this thread wrote went out in at least as many writes as there are
            // pieces in it (one write a run, or a larger buffer, would be fewer). The
            // magic was still buffered when counting began.
            let (calls, bytes) = (calls1 - calls0, bytes1 - bytes0);
            assert_eq!(bytes, w.bytes());
            assert!(
                calls as usize >= total.div_ceil(WRITE_BYTES),
                "{bytes} bytes in {calls} writes, pieces of {WRITE_BYTES}"
            );
        }
    }
}
