//! Handing a GPU from one runner to the next (`device::DeviceLock`), measured without a
//! GPU: two runner threads take turns, each pass a 130 µs busy wait (a small model's
//! pass on a GPU, whose thread waits for it spinning, as CUDA's default synchronisation
//! does) followed by 20 µs of work without the device (answering the callers, taking
//! the next batch). The time per pass over both threads is 130 µs plus what each
//! hand-over costs. The baseline is a plain `std::sync::Mutex` (whose waiter sleeps,
//! and which need not hand over in order).
//!
//!     cargo bench -p mesh-model-actor --bench device_lock
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use mesh_model_actor::device::DeviceLock;

const PASS: Duration = Duration::from_micros(130);
const BETWEEN: Duration = Duration::from_micros(20);
const RUNNERS: u64 = 2;

/// Takes the device, runs one pass, and gives the device back.
type Take = Arc<dyn Fn() + Send + Sync>;

fn busy(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// `iters` passes over `RUNNERS` threads, each taking the device with `take`; the
/// time they took.
fn turns(iters: u64, take: Take) -> Duration {
    let start = Instant::now();
    let threads: Vec<_> = (0..RUNNERS)
        .map(|_| {
            let take = take.clone();
            std::thread::spawn(move || {
                for _ in 0..iters.div_ceil(RUNNERS) {
                    take();
                    busy(BETWEEN);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a runner thread panicked");
    }
    start.elapsed()
}

fn handoff(c: &mut Criterion) {
    let mut g = c.benchmark_group("handoff");
    g.sample_size(20).measurement_time(Duration::from_secs(4));
    let lock = Arc::new(DeviceLock::new("test"));
    let mutex = Arc::new(Mutex::new(()));
    let takes: [(&str, Take); 2] = [
        (
            "device_lock",
            Arc::new(move || {
                let _pass = lock.lock();
                busy(PASS);
            }),
        ),
        (
            "std_mutex",
            Arc::new(move || {
                let _pass = mutex.lock().expect("not poisoned");
                busy(PASS);
            }),
        ),
    ];
    for (name, take) in takes {
        g.bench_function(name, |b| b.iter_custom(|iters| turns(iters, take.clone())));
    }
    g.finish();
}

criterion_group!(benches, handoff);
criterion_main!(benches);
