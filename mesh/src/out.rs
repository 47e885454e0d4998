//! Standard output for the commands that print a result (`mesh decide`, `mesh
//! features get`, `mesh bench`, `mesh logs join`, ...). When its reader has gone away
//! (`mesh features list | head -1`), the write fails with a broken pipe: the command
//! then stops with [`StdoutClosed`], and `main` exits 0 without a message, as a Unix
//! tool stopped by its reader does. `println!` would panic instead, with a message and
//! exit status 101. `mesh serve` writes its one line itself and keeps serving.
use std::io::Write;

/// The reader of standard output went away: what the command would print has nowhere
/// to go, so it stops.
#[derive(Debug)]
pub struct StdoutClosed;

impl std::fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("standard output was closed by its reader")
    }
}

impl std::error::Error for StdoutClosed {}

/// Whether `e` is (or was caused by) [`StdoutClosed`].
pub fn closed(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<StdoutClosed>())
}

/// Writes to standard output and flushes; a broken pipe is [`StdoutClosed`].
pub fn write(args: std::fmt::Arguments<'_>) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_fmt(args)
        .and_then(|()| out.flush())
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::BrokenPipe => anyhow::Error::new(StdoutClosed),
            _ => anyhow::Error::new(e).context("writing to standard output"),
        })
}

/// `print!` that stops the command when the reader has gone away ([`write()`]).
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out::write(format_args!($($arg)*))
    };
}

/// `println!` that stops the command when the reader has gone away ([`write()`]).
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::out::write(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// A writer (standard output, for commands that take one) that remembers whether a
/// write failed on a broken pipe, so that the command's error, whatever it wraps the
/// write's in, can be told apart from the reader going away ([`Tracked::finish`]).
pub struct Tracked<W> {
    inner: W,
    closed: bool,
}

impl<W: Write> Tracked<W> {
    pub fn new(inner: W) -> Self {
        Self {
            inner,
            closed: false,
        }
    }

    /// The command's result, with any error after a broken pipe made [`StdoutClosed`].
    pub fn finish<T, E>(&self, result: Result<T, E>) -> anyhow::Result<T>
    where
        E: Into<anyhow::Error>,
    {
        match result {
            Ok(v) => Ok(v),
            Err(_) if self.closed => Err(anyhow::Error::new(StdoutClosed)),
            Err(e) => Err(e.into()),
        }
    }

    fn note<T>(&mut self, r: std::io::Result<T>) -> std::io::Result<T> {
        if let Err(e) = &r {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                self.closed = true;
            }
        }
        r
    }
}

impl<W: Write> Write for Tracked<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let r = self.inner.write(buf);
        self.note(r)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let r = self.inner.flush();
        self.note(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer whose reader has gone away.
    struct Gone;

    impl Write for Gone {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A writer that fails for another reason.
    struct Full;

    impl Write for Full {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("no space left"))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn an_error_after_a_broken_pipe_is_stdout_closed_whatever_wraps_it() {
        let mut w = Tracked::new(Gone);
        let r = writeln!(w, "x").map_err(|e| anyhow::Error::new(e).context("printing rows"));
        let e = w.finish(r).unwrap_err();
        assert!(closed(&e), "{e:#}");
    }

    #[test]
    fn other_write_errors_stay_errors() {
        let mut w = Tracked::new(Full);
        let r = writeln!(w, "x").map_err(anyhow::Error::new);
        let e = w.finish(r).unwrap_err();
        assert!(!closed(&e));
        assert!(format!("{e:#}").contains("no space left"), "{e:#}");
    }

    #[test]
    fn closed_finds_stdout_closed_under_context() {
        let e = anyhow::Error::new(StdoutClosed).context("printing the report");
        assert!(closed(&e));
        assert!(!closed(&anyhow::anyhow!(
            "standard output was closed by its reader"
        )));
    }
}
