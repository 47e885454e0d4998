//! Running the log's threads below the serving threads: the writer and the closer take
//! CPU only when the serving threads leave some, so a burst of log work delays the log,
//! never a request. [`set_current_thread_idle`] is also how the router runs its other
//! housekeeping threads (the metrics upkeep).

/// Lowers the calling thread below the serving threads as `LogConfig` asks: under
/// `SCHED_IDLE` when `idle` (falling back to `nice` where that cannot be set), else
/// `nice` steps down (see [`lower_current_thread`]) and, when `nice` is above 0, under
/// `SCHED_BATCH` ([`set_current_thread_batch`]).
pub(crate) fn lower_for_log(nice: i32, idle: bool) {
    if idle {
        match set_current_thread_idle() {
            Ok(()) => return,
            Err(e) => tracing::warn!(error = %e, nice,
                "could not run a prediction log thread under SCHED_IDLE; it runs at writer_nice"),
        }
    }
    lower_current_thread(nice);
    if nice > 0 {
        if let Err(e) = set_current_thread_batch() {
            tracing::warn!(error = %e, nice,
                "could not run a prediction log thread under SCHED_BATCH; a serving thread may wait for it when it wakes");
        }
    }
}

/// Puts the calling thread under `SCHED_BATCH` (Linux), keeping its nice value: when it
/// wakes it never preempts the thread running on its CPU, but waits for a free CPU or
/// for that thread's turn to end (at the latest the next scheduler tick). It still gets
/// its share of a busy CPU by its nice value, so unlike `SCHED_IDLE` it cannot be
/// starved; and any thread may set it, without privileges.
///
/// Why, for the log's writer: it wakes every few milliseconds to write the wal. Under
/// the default policy a waking thread with time owed may preempt the running one, and
/// on this project's 2-core machine (Decide at 15,000/s, `perf sched`, four runs each)
/// the writer took the CPU from a serving thread 34-47 times a second, holding it up
/// to 0.4 ms; under `SCHED_BATCH`, 5-14 times (at scheduler ticks), and the serving
/// threads' time waiting for it fell from 1.5-2.8 to 0.2-0.8 ms a second.
/// Elsewhere than Linux, an error that says so.
pub(crate) fn set_current_thread_batch() -> Result<(), String> {
    #[cfg(target_os = "linux")]
    {
        use thread_priority::{
            set_thread_priority_and_policy, thread_native_id, NormalThreadSchedulePolicy,
            ThreadPriority, ThreadPriorityValue, ThreadSchedulePolicy,
        };
        let policy = ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Batch);
        let tid = Some(rustix::thread::gettid());
        let nice = rustix::process::getpriority_process(tid).map_err(|e| e.to_string())?;
        // The crate sets a normal policy's nice value with it, from a 0-99 scale: the
        // value on that scale that is this thread's nice, so that the policy alone
        // changes.
        let same = (0..=*ThreadPriorityValue::MAX)
            .filter_map(|p| ThreadPriorityValue::try_from(p).ok())
            .map(ThreadPriority::Crossplatform)
            .find(|p| p.to_posix(policy).ok() == Some(nice))
            .ok_or_else(|| format!("no SCHED_BATCH priority for nice {nice}"))?;
        set_thread_priority_and_policy(thread_native_id(), same, policy)
            .map_err(|e| format!("{e:?}"))?;
        let now = rustix::process::getpriority_process(tid).map_err(|e| e.to_string())?;
        if now != nice {
            return Err(format!("the nice value moved from {nice} to {now}"));
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        Err("SCHED_BATCH is Linux only".into())
    }
}

/// Confines the calling thread, and the threads it starts from then on, to `cpus`
/// ([`LogConfig::cpus`](crate::LogConfig::cpus)); nothing when empty.
pub(crate) fn pin_for_log(cpus: &[usize]) {
    if cpus.is_empty() {
        return;
    }
    if let Err(e) = pin_current_thread(cpus) {
        tracing::warn!(error = %e, ?cpus,
            "could not confine the prediction log's threads to [prediction_log] cpus; they run wherever the process may");
    }
}

/// How [`reserve_cpus`] split the CPUs the process may run on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuSplit {
    /// The CPUs set aside for the log's threads (for [`LogConfig::cpus`](crate::LogConfig::cpus)).
    pub log: Vec<usize>,
    /// The CPUs left to every other thread: the calling thread, and the threads it
    /// starts from then on.
    pub serving: Vec<usize>,
    /// The serving CPUs that share a core with one of the log's (its hyperthreads):
    /// empty when the log has whole cores of its own.
    pub shared_cores: Vec<usize>,
}

/// Splits `allowed` (the CPUs a process may run on, in any order) into `n` for the log
/// and the rest for the serving threads, taking the log's core by core from the end:
/// every allowed CPU of the last core (the one with the highest-numbered CPU), then of
/// the core before it, until `n` are taken. `siblings(cpu)` names the CPUs that share
/// `cpu`'s core (its hyperthreads). So on a machine with two threads per core an even
/// `n` gives the log whole cores, and an odd one leaves one CPU beside the log's to the
/// serving threads ([`CpuSplit::shared_cores`]). Refuses, saying why, an `n` that would
/// leave the serving threads no CPU.
pub fn split_cpus(
    allowed: &[usize],
    n: usize,
    siblings: impl Fn(usize) -> Vec<usize>,
) -> Result<CpuSplit, String> {
    let mut all = allowed.to_vec();
    all.sort_unstable();
    all.dedup();
    if n >= all.len() {
        return Err(format!(
            "this process may run on {} CPU{} ({}); setting {n} aside for the log would leave the serving threads none",
            all.len(),
            if all.len() == 1 { "" } else { "s" },
            cpu_list(&all),
        ));
    }
    // Each core's allowed CPUs, highest first, the cores in the order of their highest.
    let core_of = |c: usize| {
        let mut core: Vec<usize> = siblings(c)
            .into_iter()
            .chain([c])
            .filter(|x| all.binary_search(x).is_ok())
            .collect();
        core.sort_unstable_by(|a, b| b.cmp(a));
        core.dedup();
        core
    };
    let mut log = Vec::with_capacity(n);
    let mut taken = std::collections::BTreeSet::new();
    for &c in all.iter().rev() {
        if log.len() == n {
            break;
        }
        if taken.contains(&c) {
            continue;
        }
        for x in core_of(c) {
            taken.insert(x);
            if log.len() < n {
                log.push(x);
            }
        }
    }
    log.sort_unstable();
    let serving: Vec<usize> = all
        .iter()
        .copied()
        .filter(|c| log.binary_search(c).is_err())
        .collect();
    let mut shared_cores: Vec<usize> = log
        .iter()
        .flat_map(|&c| core_of(c))
        .filter(|c| log.binary_search(c).is_err())
        .collect();
    shared_cores.sort_unstable();
    shared_cores.dedup();
    Ok(CpuSplit {
        log,
        serving,
        shared_cores,
    })
}

/// The CPUs that share `cpu`'s core, as Linux lists them
/// (`/sys/devices/system/cpu/cpuN/topology/thread_siblings_list`); just `cpu` where
/// that cannot be read.
pub fn core_siblings(cpu: usize) -> Vec<usize> {
    std::fs::read_to_string(format!(
        "/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
    ))
    .ok()
    .and_then(|s| parse_cpu_list(&s))
    .unwrap_or_else(|| vec![cpu])
}

/// A list as `taskset -c` and the kernel write it ("0-3,6") as CPUs; `None` when it is
/// not one.
pub fn parse_cpu_list(s: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.trim().parse().ok()?, b.trim().parse().ok()?),
            None => {
                let c: usize = part.trim().parse().ok()?;
                (c, c)
            }
        };
        if b < a || b - a > 1 << 16 {
            return None;
        }
        out.extend(a..=b);
    }
    Some(out)
}

/// CPUs as `taskset -c` and `Cpus_allowed_list` write them: "0-3,6".
pub fn cpu_list(cpus: &[usize]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        if j == i {
            out.push_str(&cpus[i].to_string());
        } else {
            out.push_str(&format!("{}-{}", cpus[i], cpus[j]));
        }
        i = j + 1;
    }
    out
}

/// The CPUs the calling thread may run on, in order (Linux); elsewhere an error that
/// says so.
pub fn current_cpus() -> Result<Vec<usize>, String> {
    #[cfg(target_os = "linux")]
    {
        use rustix::thread::{sched_getaffinity, CpuSet};
        let set = sched_getaffinity(None)
            .map_err(|e| format!("could not read the CPUs this process may run on: {e}"))?;
        Ok((0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect())
    }
    #[cfg(not(target_os = "linux"))]
    {
        Err("CPU affinity is read on Linux only".into())
    }
}

/// Sets `n` of the CPUs the calling thread may run on aside for the log, the last ones
/// core by core ([`split_cpus`], with the kernel's [`core_siblings`]), and confines the
/// calling thread, and every thread it starts from then on, to the others (Linux).
/// Call it before any other thread exists (`mesh serve` does, for `[prediction_log]
/// reserved_cpus`), then give the log [`CpuSplit::log`] as its `cpus`: the log's
/// threads and the serving threads then never share a core. `n` = 0 changes nothing.
/// Elsewhere than Linux, an error that says so.
pub fn reserve_cpus(n: usize) -> Result<CpuSplit, String> {
    let split = split_cpus(&current_cpus()?, n, core_siblings)?;
    if n > 0 {
        pin_current_thread(&split.serving)?;
    }
    Ok(split)
}

/// Whether the kernel lets a thread of this process run on `cpus` (a short-lived thread
/// tries it): the check at start behind [`LogConfig::cpus`](crate::LogConfig::cpus).
pub(crate) fn check_log_cpus(cpus: &[usize]) -> Result<(), String> {
    let cpus = cpus.to_vec();
    std::thread::Builder::new()
        .name("plog-cpus".into())
        .spawn(move || pin_current_thread(&cpus))
        .map_err(|e| format!("could not start a thread to try them: {e}"))?
        .join()
        .map_err(|_| "the thread that tried them panicked".to_string())?
}

/// Sets the calling thread's CPU affinity to `cpus` (Linux); elsewhere an error that
/// says so.
fn pin_current_thread(cpus: &[usize]) -> Result<(), String> {
    #[cfg(target_os = "linux")]
    {
        use rustix::thread::{sched_setaffinity, CpuSet};
        let mut set = CpuSet::new();
        for &c in cpus {
            if c >= CpuSet::MAX_CPU {
                return Err(format!(
                    "CPU {c} is past the last one a CPU set holds ({})",
                    CpuSet::MAX_CPU - 1
                ));
            }
            set.set(c);
        }
        sched_setaffinity(None, &set).map_err(|e| {
            format!("the kernel runs this process on none of them ({e}); see /sys/devices/system/cpu/online and the process's cpuset")
        })
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = cpus;
        Err("CPU affinity is set on Linux only".into())
    }
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

/// Work in short spells, with a nap between them. The log's encoder and closer call
/// [`Pace::tick`] between records: once a spell has lasted [`Pace::SPELL`], the thread
/// sleeps [`Pace::NAP`].
///
/// Why: a core that never goes idle never pulls waiting threads from the other cores
/// (Linux balances a core's run queue against the others when it goes idle, and
/// otherwise only every few milliseconds). A thread under `SCHED_IDLE` that computes
/// for milliseconds keeps its core from going idle just as a busy thread would, while
/// a request's threads queue behind each other on the other core. Measured on this
/// project's 2-core machine, Decide at 18,000/s with the load generator on the same
/// cores, the log off: an idle-class busy loop on one core took the p99 from 1.25 to
/// 2.2-4.2 ms; the same loop working 150 µs and sleeping 50 µs (75% of that core)
/// left it at 1.28-1.35 ms.
pub(crate) struct Pace {
    spell: std::time::Instant,
    naps: u64,
}

impl Pace {
    /// Longest spell of work between naps. 50 µs (it was 200): with two servers side
    /// by side under one alternating open loop (`bench/plog_alt.sh`, 2 shared cores,
    /// 14,602 Decide/s, 16 runs against 10 in the same hour), the log's p99 over log
    /// off went from 1.105 to 1.038 on the client's clock and from 1.120 to 1.051 on
    /// the server's, for about 1 µs more of the encoder's CPU a record (its naps).
    /// 25 µs measured no better in the next hour (8 runs against 8). Over 32 runs in
    /// three hours the 50 µs spells came out at 1.067 and 1.075, and at 1.095 and
    /// 1.067 over 32 more (bench/RESULTS.md).
    pub(crate) const SPELL: std::time::Duration = std::time::Duration::from_micros(50);
    /// How long each nap is asked to last (the timer's slack may add as much again).
    pub(crate) const NAP: std::time::Duration = std::time::Duration::from_micros(50);

    pub(crate) fn new() -> Self {
        Self {
            spell: std::time::Instant::now(),
            naps: 0,
        }
    }

    /// Between two pieces of work: naps if this spell has lasted [`Pace::SPELL`].
    pub(crate) fn tick(&mut self) {
        if self.spell_over() {
            self.nap();
        }
    }

    /// This spell has lasted [`Pace::SPELL`]: time for a nap.
    pub(crate) fn spell_over(&self) -> bool {
        self.spell.elapsed() >= Self::SPELL
    }

    /// Naps [`Pace::NAP`], then starts a new spell.
    pub(crate) fn nap(&mut self) {
        std::thread::sleep(Self::NAP);
        self.naps += 1;
        self.rest();
    }

    /// The thread waited for work anyway (a sleep, a blocking receive): a new spell.
    pub(crate) fn rest(&mut self) {
        self.spell = std::time::Instant::now();
    }

    /// Naps taken so far.
    #[cfg(test)]
    pub(crate) fn naps(&self) -> u64 {
        self.naps
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
    use std::time::{Duration, Instant};

    #[test]
    fn work_goes_in_spells_with_a_nap_between_them() {
        let mut pace = Pace::new();
        // A tick early in a spell does not nap.
        pace.tick();
        assert_eq!(pace.naps(), 0);
        // Ticks through 20 ms of work, one every 10 µs, nap once a spell.
        let start = Instant::now();
        let mut worked = Duration::ZERO;
        while worked < Duration::from_millis(20) {
            let t = Instant::now();
            while t.elapsed() < Duration::from_micros(10) {
                std::hint::spin_loop();
            }
            worked += t.elapsed();
            pace.tick();
        }
        // About 20 ms / SPELL (twice that where the machine preempts the loop often),
        // against the 2,000 ticks.
        let most = 2 * (20_000 / Pace::SPELL.as_micros()) as u64 + 1;
        assert!(
            (1..=most).contains(&pace.naps()),
            "{} naps in 20 ms of work",
            pace.naps()
        );
        assert!(
            start.elapsed() >= worked + Pace::NAP * pace.naps() as u32,
            "each nap sleeps at least {:?}",
            Pace::NAP
        );
        // After a rest, a new spell starts.
        let before = pace.naps();
        pace.rest();
        pace.tick();
        assert_eq!(pace.naps(), before);
    }

    #[test]
    fn the_last_cpus_go_to_the_log_and_the_rest_to_the_serving_threads() {
        let alone = |c: usize| vec![c];
        let s = split_cpus(&[3, 0, 1, 2], 1, alone).unwrap();
        assert_eq!((s.log, s.serving), (vec![3], vec![0, 1, 2]));
        assert!(s.shared_cores.is_empty());
        let s = split_cpus(&[0, 2, 4, 6, 7], 2, alone).unwrap();
        assert_eq!((s.log, s.serving), (vec![6, 7], vec![0, 2, 4]));
        let s = split_cpus(&[5, 9], 0, alone).unwrap();
        assert_eq!((s.log, s.serving), (vec![], vec![5, 9]));
        // Never all of them, nor more.
        let e = split_cpus(&[0, 1], 2, alone).unwrap_err();
        assert!(e.contains("2 CPUs (0-1)") && e.contains("none"), "{e}");
        let e = split_cpus(&[4], 3, alone).unwrap_err();
        assert!(e.contains("1 CPU (4)"), "{e}");
    }

    /// With hyperthreads the log's CPUs are taken a core at a time, so an even count on
    /// two threads per core gives it whole cores, and a CPU left beside the log's is
    /// named.
    #[test]
    fn the_logs_cpus_are_taken_core_by_core() {
        // 8 cores of 2 threads, numbered as x86 servers do: CPU c and c + 8 share a core.
        let smt = |c: usize| vec![c % 8, c % 8 + 8];
        let all: Vec<usize> = (0..16).collect();
        let s = split_cpus(&all, 2, smt).unwrap();
        assert_eq!(
            s.log,
            [7, 15],
            "both threads of the last core, not CPUs 14 and 15"
        );
        assert!(s.shared_cores.is_empty());
        assert_eq!(s.serving.len(), 14);
        let s = split_cpus(&all, 1, smt).unwrap();
        assert_eq!((s.log, s.shared_cores), (vec![15], vec![7]));
        let s = split_cpus(&all, 3, smt).unwrap();
        assert_eq!((s.log, s.shared_cores), (vec![7, 14, 15], vec![6]));
        // A container given whole cores (CPUs 3, 4, 11 and 12): the last core is 4/12.
        let s = split_cpus(&[3, 11, 4, 12], 2, smt).unwrap();
        assert_eq!((s.log, s.serving), (vec![4, 12], vec![3, 11]));
        assert!(s.shared_cores.is_empty());
        // A sibling the process may not use is neither taken nor named.
        let s = split_cpus(&[0, 1, 2, 15], 1, smt).unwrap();
        assert_eq!((s.log, s.serving), (vec![15], vec![0, 1, 2]));
        assert!(s.shared_cores.is_empty());
    }

    #[test]
    fn cpu_lists_read_and_write_as_the_kernel_does() {
        assert_eq!(cpu_list(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(cpu_list(&[]), "");
        assert_eq!(parse_cpu_list("0-2,5,7-8\n"), Some(vec![0, 1, 2, 5, 7, 8]));
        assert_eq!(parse_cpu_list("3"), Some(vec![3]));
        for bad in ["x", "3-1", "1,,a", "0-999999999"] {
            assert_eq!(parse_cpu_list(bad), None, "{bad}");
        }
        // This machine's own topology reads, and names the CPU itself.
        assert!(core_siblings(0).contains(&0));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn reserving_cpus_confines_the_calling_thread_and_its_children_to_the_rest() {
        let here = current_cpus().unwrap().len();
        let (split, child) = std::thread::spawn(|| {
            let split = reserve_cpus(1);
            let child = std::thread::spawn(|| current_cpus().unwrap())
                .join()
                .unwrap();
            (split, child)
        })
        .join()
        .unwrap();
        if here < 2 {
            assert!(split.unwrap_err().contains("none"));
            return;
        }
        let split = split.unwrap();
        assert_eq!(split.log.len(), 1);
        assert_eq!(split.serving.len(), here - 1);
        assert_eq!(
            child, split.serving,
            "a thread started after inherits the rest"
        );
        assert_eq!(
            current_cpus().unwrap().len(),
            here,
            "other threads keep theirs"
        );
        // Nothing to set aside: nothing changes.
        let all = std::thread::spawn(|| reserve_cpus(0).unwrap())
            .join()
            .unwrap();
        assert!(all.log.is_empty());
        assert_eq!(all.serving.len(), here);
    }

    /// Field 41 of a thread's stat line: its scheduling policy (3 is `SCHED_BATCH`).
    #[cfg(target_os = "linux")]
    fn policy() -> i64 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        let after = stat.rsplit_once(") ").unwrap().1;
        after
            .split_whitespace()
            .nth(41 - 3)
            .unwrap()
            .parse()
            .unwrap()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn batch_changes_the_policy_of_the_calling_thread_only_and_keeps_its_nice() {
        let (before, after) = std::thread::spawn(|| {
            lower_current_thread(3);
            let before = (current_nice(), policy());
            set_current_thread_batch().unwrap();
            (before, (current_nice(), policy()))
        })
        .join()
        .unwrap();
        assert_eq!(before.1, 0, "SCHED_OTHER before");
        assert_eq!(after, (before.0, 3), "SCHED_BATCH, nice unchanged");
        assert_eq!(policy(), 0, "other threads keep theirs");
    }

    /// The log's threads: `SCHED_BATCH` below the serving threads, nothing at nice 0,
    /// `SCHED_IDLE` when asked.
    #[cfg(target_os = "linux")]
    #[test]
    fn lower_for_log_sets_what_the_config_asks() {
        let base = current_nice().unwrap();
        let run = |nice, idle| {
            std::thread::spawn(move || {
                lower_for_log(nice, idle);
                (current_nice().unwrap(), policy())
            })
            .join()
            .unwrap()
        };
        assert_eq!(run(4, false), ((base + 4).min(19), 3));
        assert_eq!(run(0, false), (base, 0));
        assert_eq!(run(4, true).1, 5);
    }

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
