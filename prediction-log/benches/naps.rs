//! What a nap costs the thread that takes it: the encoder and the closer work in spells
//! of 50 µs with a nap of 50 µs between them (`Pace` in src/priority.rs, a
//! `std::thread::sleep`), so that a core they keep busy goes idle often enough to pull a
//! waiting serving thread over from the other one. Each nap is a trip through the
//! kernel's timer and scheduler, paid in the napping thread's own CPU time; this
//! measures it on the machine at hand.
//!
//! Each cycle spins for 50 µs (a spell) and then naps; the thread's CPU time
//! (`CLOCK_THREAD_CPUTIME_ID`) beyond the spins, over the cycles, is the naps' cost.
//! Printed for naps asked to last 1, 50 and 200 µs, and for `std::thread::yield_now`
//! (which gives the core away only to a thread already waiting on it, so it pulls
//! nothing over and is not a nap; for comparison). Under the scheduling class the log's
//! threads use: `chrt --idle 0 cargo bench -p mesh-prediction-log --bench naps`.
//!
//! `cargo bench -p mesh-prediction-log --bench naps [-- CYCLES]` (default 10,000 a row).

#[cfg(target_os = "linux")]
use std::time::{Duration, Instant};

#[cfg(target_os = "linux")]
#[path = "support/cpu.rs"]
mod cpu;
#[cfg(target_os = "linux")]
use cpu::thread_cpu;

#[cfg(target_os = "linux")]
fn main() {
    const SPELL: Duration = Duration::from_micros(50);
    let cycles: u32 = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000)
        .max(1);
    let rows: [(&str, Option<Duration>); 4] = [
        ("sleep 1 µs", Some(Duration::from_micros(1))),
        ("sleep 50 µs (Pace::NAP)", Some(Duration::from_micros(50))),
        ("sleep 200 µs", Some(Duration::from_micros(200))),
        ("yield_now (not a nap)", None),
    ];
    println!("{cycles} cycles of a 50 µs spin and then:");
    println!(
        "{:<26} {:>22} {:>18}",
        "", "thread CPU a nap (µs)", "wall a nap (µs)"
    );
    for (name, nap) in rows {
        let (cpu0, wall0) = (thread_cpu(), Instant::now());
        let mut spun = Duration::ZERO;
        for _ in 0..cycles {
            let s = Instant::now();
            while s.elapsed() < SPELL {
                std::hint::spin_loop();
            }
            spun += s.elapsed();
            match nap {
                Some(d) => std::thread::sleep(d),
                None => std::thread::yield_now(),
            }
        }
        let cpu = thread_cpu().saturating_sub(cpu0);
        let wall = wall0.elapsed();
        let per = |d: Duration| d.as_secs_f64() * 1e6 / f64::from(cycles);
        println!(
            "{name:<26} {:>22.1} {:>18.1}",
            per(cpu.saturating_sub(spun)),
            per(wall.saturating_sub(spun))
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("naps: Linux only (the thread's CPU clock through rustix)");
}
