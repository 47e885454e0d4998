//! Write-ahead file of the open segment.
//!
//! Layout: the 8-byte magic `MESHWAL1`, then frames of
//! `[u32 LE payload length][u32 LE crc32(payload)][payload: the record as JSON]`.
//! A crash can leave a torn last frame (short, or with a bad checksum); readers stop at the
//! first frame that is not whole and report how many bytes they skipped.

use crate::error::{LogError, Result};
use crate::record::PredictionRecord;
use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

pub(crate) const MAGIC: &[u8; 8] = b"MESHWAL1";
const FRAME_HEADER: usize = 8;
/// A frame larger than this is treated as corruption, not as a record.
const MAX_FRAME: usize = 64 << 20;

/// Appends records to one wal file.
pub(crate) struct WalWriter {
    path: PathBuf,
    out: BufWriter<File>,
    buf: Vec<u8>,
    bytes: u64,
}

impl WalWriter {
    pub(crate) fn create(path: &Path) -> Result<Self> {
        let file = File::options()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| LogError::io(path, e))?;
        let mut out = BufWriter::with_capacity(256 << 10, file);
        out.write_all(MAGIC).map_err(|e| LogError::io(path, e))?;
        Ok(Self {
            path: path.to_path_buf(),
            out,
            buf: Vec::with_capacity(1024),
            bytes: MAGIC.len() as u64,
        })
    }

    pub(crate) fn append(&mut self, rec: &PredictionRecord) -> Result<()> {
        self.buf.clear();
        self.buf.extend_from_slice(&[0u8; FRAME_HEADER]);
        serde_json::to_writer(&mut self.buf, rec)?;
        let len = self.buf.len() - FRAME_HEADER;
        let len32 = u32::try_from(len)
            .map_err(|_| LogError::Config(format!("record of {len} bytes is too large")))?;
        let crc = crc32fast::hash(&self.buf[FRAME_HEADER..]);
        self.buf[0..4].copy_from_slice(&len32.to_le_bytes());
        self.buf[4..8].copy_from_slice(&crc.to_le_bytes());
        self.out
            .write_all(&self.buf)
            .map_err(|e| LogError::io(&self.path, e))?;
        self.bytes += self.buf.len() as u64;
        Ok(())
    }

    /// Hands buffered frames to the OS (they then survive a process kill); with `fsync`, also
    /// waits until they are on disk (they then survive a power loss).
    pub(crate) fn flush(&mut self, fsync: bool) -> Result<()> {
        self.out.flush().map_err(|e| LogError::io(&self.path, e))?;
        if fsync {
            self.out
                .get_ref()
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
    /// Bytes after `valid_len` that do not form a whole frame (a torn tail, or a frame still
    /// being written when a live file is read).
    pub trailing_bytes: u64,
}

/// Reads whole frames of `path` starting at `offset` (0 = the start of the file).
pub(crate) fn read_wal_from(path: &Path, offset: u64) -> Result<WalContents> {
    let mut file = File::open(path).map_err(|e| LogError::io(path, e))?;
    let mut data = Vec::new();
    let start = offset;
    file.seek(SeekFrom::Start(start))
        .map_err(|e| LogError::io(path, e))?;
    file.read_to_end(&mut data)
        .map_err(|e| LogError::io(path, e))?;
    let mut pos = 0usize;
    if start == 0 {
        if data.len() < MAGIC.len() {
            // Created but the header never reached the disk: an empty segment.
            return Ok(WalContents {
                records: Vec::new(),
                valid_len: 0,
                trailing_bytes: data.len() as u64,
            });
        }
        if &data[..MAGIC.len()] != MAGIC {
            return Err(LogError::schema(
                path,
                "not a prediction log wal file (bad magic)",
            ));
        }
        pos = MAGIC.len();
    }
    let mut records = Vec::new();
    while data.len() - pos >= FRAME_HEADER {
        let len =
            u32::from_le_bytes([data[pos], data[pos + 1], data[pos + 2], data[pos + 3]]) as usize;
        let crc = u32::from_le_bytes([data[pos + 4], data[pos + 5], data[pos + 6], data[pos + 7]]);
        if len > MAX_FRAME || data.len() - pos - FRAME_HEADER < len {
            break;
        }
        let payload = &data[pos + FRAME_HEADER..pos + FRAME_HEADER + len];
        if crc32fast::hash(payload) != crc {
            break;
        }
        match serde_json::from_slice::<PredictionRecord>(payload) {
            Ok(r) => records.push(r),
            Err(_) => break,
        }
        pos += FRAME_HEADER + len;
    }
    Ok(WalContents {
        records,
        valid_len: start + pos as u64,
        trailing_bytes: (data.len() - pos) as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Role;

    #[test]
    fn torn_tail_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.wal");
        let mut w = WalWriter::create(&p).unwrap();
        for i in 0..5 {
            w.append(&PredictionRecord::new(
                format!("r{i}"),
                "m",
                "1",
                Role::Primary,
            ))
            .unwrap();
        }
        w.flush(true).unwrap();
        let full = std::fs::metadata(&p).unwrap().len();
        // Cut the last frame in half.
        let f = File::options().write(true).open(&p).unwrap();
        f.set_len(full - 10).unwrap();
        let c = read_wal_from(&p, 0).unwrap();
        assert_eq!(c.records.len(), 4);
        assert!(c.trailing_bytes > 0);
        // Corrupt a byte in the last whole frame: three survive.
        let mut data = std::fs::read(&p).unwrap();
        let third = c.valid_len as usize - 20;
        data[third] ^= 0xff;
        std::fs::write(&p, &data).unwrap();
        let c = read_wal_from(&p, 0).unwrap();
        assert_eq!(c.records.len(), 3);
        // Reading on from an offset continues where the last read stopped.
        let c2 = read_wal_from(&p, 8).unwrap();
        assert_eq!(c2.records.len(), 3);
    }
}
