//! The calling thread's CPU time, for the benches that measure what work takes from
//! the serving threads rather than how long it lasts (`#[path = "support/cpu.rs"] mod
//! cpu;`). Elsewhere than Linux, the wall time since the first call.

use std::time::Duration;

#[cfg(target_os = "linux")]
pub fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

#[cfg(not(target_os = "linux"))]
pub fn thread_cpu() -> Duration {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed()
}
