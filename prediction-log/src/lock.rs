//! One writer per directory: an exclusive advisory lock on `<dir>/LOCK`, held for as
//! long as the writer runs. A second process (or a second writer in this one) that
//! opens the same directory is refused with a message that names the holder, before
//! it recovers anything: recovery deletes write-ahead files, and those of a live
//! writer are not leftovers.
//!
//! The lock is `flock`-style (released by the OS when the holder exits, even on
//! SIGKILL), so a stale `LOCK` file never blocks a restart. The file's text (pid,
//! host, start time) is only there to name the holder.
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use crate::error::{LogError, Result};

/// Name of the lock file in a log directory.
pub const LOCK_FILE: &str = "LOCK";

/// An exclusive lock on a directory; released when dropped.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
    path: PathBuf,
}

impl DirLock {
    /// Takes the lock of `dir` (created if missing) or says who holds it.
    pub fn acquire(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| LogError::io(dir, e))?;
        let path = dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| LogError::io(&path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                return Err(LogError::Locked {
                    dir: dir.to_path_buf(),
                    holder: if holder.is_empty() {
                        "another writer (no details recorded)".to_owned()
                    } else {
                        holder.chars().take(200).collect()
                    },
                });
            }
            Err(TryLockError::Error(e)) => return Err(LogError::io(&path, e)),
        }
        let about = format!(
            "pid {} on {} since {} ({})",
            std::process::id(),
            hostname(),
            crate::record::date_of_us(crate::record::now_us()),
            std::env::args().next().unwrap_or_default()
        );
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| file.write_all(about.as_bytes()))
            .and_then(|()| file.flush())
            .map_err(|e| LogError::io(&path, e))?;
        Ok(Self { _file: file, path })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "this host".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_and_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path()).unwrap();
        let err = DirLock::acquire(dir.path()).unwrap_err().to_string();
        assert!(err.contains("is in use"), "{err}");
        assert!(
            err.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        drop(first);
        // Released on drop: the next writer gets it.
        let again = DirLock::acquire(dir.path()).unwrap();
        assert!(again.path().ends_with(LOCK_FILE));
    }
}
