//! Running the log's threads below the serving threads: the writer and the closer take
//! CPU only when the serving threads leave some, so a burst of log work delays the log,
//! never a request.

/// Lowers the calling thread's scheduling priority to `nice` (1..=19; 0 leaves it as it
/// is). Never raises it: a process already running nicer keeps its own value. On Linux,
/// where nice is per thread; elsewhere nothing (there it would apply to the whole process).
pub(crate) fn lower_current_thread(nice: i32) {
    if nice <= 0 {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        use rustix::process::{getpriority_process, setpriority_process};
        let tid = Some(rustix::thread::gettid());
        let current = getpriority_process(tid).unwrap_or(0);
        if current >= nice {
            return;
        }
        if let Err(e) = setpriority_process(tid, nice) {
            tracing::warn!(error = %e, nice,
                "could not lower the priority of a prediction log thread; it runs at the serving threads' priority");
        }
    }
}

/// The calling thread's nice value (for tests and diagnostics); `None` where not known.
#[cfg(test)]
pub(crate) fn current_nice() -> Option<i32> {
    #[cfg(target_os = "linux")]
    {
        rustix::process::getpriority_process(Some(rustix::thread::gettid())).ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowers_only_the_calling_thread_and_never_raises() {
        let before = current_nice();
        let (lowered, again) = std::thread::spawn(|| {
            lower_current_thread(7);
            let lowered = current_nice();
            lower_current_thread(3); // would raise it: left alone
            (lowered, current_nice())
        })
        .join()
        .unwrap();
        if cfg!(target_os = "linux") {
            let base = before.unwrap();
            assert_eq!(lowered, Some(base.max(7)));
            assert_eq!(again, lowered);
            assert_eq!(current_nice(), before, "other threads keep theirs");
        }
    }
}
