//! Running the log's threads below the serving threads: the writer and the closer take
//! CPU only when the serving threads leave some, so a burst of log work delays the log,
//! never a request. [`set_current_thread_idle`] is also how the router runs its other
//! housekeeping threads (the metrics upkeep).

/// Lowers the calling thread below the serving threads as `LogConfig` asks: under
/// `SCHED_IDLE` when `idle` (falling back to `nice` where that cannot be set), else
/// `nice` steps down (see [`lower_current_thread`]).
pub(crate) fn lower_for_log(nice: i32, idle: bool) {
    if idle {
        match set_current_thread_idle() {
            Ok(()) => return,
            Err(e) => tracing::warn!(error = %e, nice,
                "could not run a prediction log thread under SCHED_IDLE; it runs at writer_nice"),
        }
    }
    lower_current_thread(nice);
}

/// Puts the calling thread under `SCHED_IDLE` (Linux): it runs only when no other thread
/// of the machine wants the CPU, and any thread that wakes preempts it at once. (Not
/// starved outright: under contention it keeps a sliver of a core, about 0.3% against
/// each busy thread.) A thread cannot leave `SCHED_IDLE` again without `CAP_SYS_NICE`.
/// Elsewhere than Linux, an error that says so.
pub fn set_current_thread_idle() -> Result<(), String> {
    #[cfg(target_os = "linux")]
    {
        use thread_priority::{
            set_thread_priority_and_policy, thread_native_id, NormalThreadSchedulePolicy,
            ThreadPriority, ThreadSchedulePolicy,
        };
        set_thread_priority_and_policy(
            thread_native_id(),
            ThreadPriority::Min,
            ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Idle),
        )
        .map_err(|e| format!("{e:?}"))
    }
    #[cfg(not(target_os = "linux"))]
    {
        Err("SCHED_IDLE is Linux only".into())
    }
}

/// Lowers the calling thread's scheduling priority by `nice` steps below the thread that
/// started it (nice values add up to 19 at most; 0 leaves it as it is): a mesh started
/// with `nice -n -5` runs its writer at 5 with the default 10. On Linux, where nice is per
/// thread; elsewhere nothing (there it would apply to the whole process).
pub(crate) fn lower_current_thread(nice: i32) {
    if nice <= 0 {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        use rustix::process::{getpriority_process, setpriority_process};
        let tid = Some(rustix::thread::gettid());
        let current = getpriority_process(tid).unwrap_or(0);
        let target = current.saturating_add(nice).min(19);
        if target <= current {
            return;
        }
        if let Err(e) = setpriority_process(tid, target) {
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
    fn lowers_only_the_calling_thread_relative_to_its_own() {
        let before = current_nice();
        let (lowered, again, capped) = std::thread::spawn(|| {
            lower_current_thread(7);
            let lowered = current_nice();
            lower_current_thread(0); // nothing
            let again = current_nice();
            lower_current_thread(19);
            (lowered, again, current_nice())
        })
        .join()
        .unwrap();
        if cfg!(target_os = "linux") {
            let base = before.unwrap();
            assert_eq!(lowered, Some((base + 7).min(19)));
            assert_eq!(again, lowered);
            assert_eq!(capped, Some(19));
            assert_eq!(current_nice(), before, "other threads keep theirs");
        }
    }
}
