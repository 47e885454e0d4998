//! One forward pass at a time on a GPU, in the order the runners asked.
//!
//! Every runner thread owns its copy of its model, and on a GPU each issues its
//! kernels on its own stream. Measured on an H200 with the fraud MLP at 32 callers,
//! passes from several runners at once did not share the GPU well: a pass (batches of
//! 3-8 rows) took 137-174 µs with one replica, 462-502 µs with two and 932-1,096 µs
//! with four, so two replicas answered 0.69-0.78 of one replica's requests a second.
//! Taken one at a time, a pass took 132-157 µs however many replicas there were. So the
//! runners of every model and replica on one GPU share that GPU's [`DeviceLock`] (see
//! [`gpu`]), and a runner holds it for its forward pass only: the batch is assembled
//! before and answered after.
//!
//! The lock hands the device over in ticket order, so a runner that finishes a pass
//! and at once asks again queues behind those already waiting. A plain mutex let a
//! runner that always had work take the device again and again; with four replicas
//! some requests then waited up to 100 ms. The runner next in line watches for the
//! pass ahead to end ([`HANDOFF_SPIN`]) rather than sleeping, so that the device does
//! not wait for a thread to wake between two passes. On the H200 this lock kept a pass
//! at 136-167 µs with one, two or four replicas; four answered 22,852-24,277 requests a
//! second (16,328-16,622 with passes at once), none of them later than 3.4 ms, and each
//! batch waited under 2.5 ms for its turn (README, GPUs).
//!
//! What the turns cost shows in two metrics: `mesh_model_device_wait_seconds`, how long
//! each batch waited for its device once assembled, and `mesh_device_runners`, how
//! many runners (of every model, version and replica) take turns at each device.
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// How long the runner next in line watches for the pass ahead of it to end before it
/// sleeps, giving up its CPU to any other thread that wants it between two looks
/// (`sched_yield`). On this project's 2-core machine, two runners taking turns with
/// 130 µs passes took 132.7-133.1 µs a pass this way, and 156.1-158.3 µs with a plain
/// mutex, whose waiter sleeps (`cargo bench -p mesh-model-actor --bench device_lock`):
/// a thread's wake-up, about 25 µs, is a fifth of a small model's pass on a GPU. A
/// pass longer than this pays the wake-up once, which is little beside it.
pub const HANDOFF_SPIN: Duration = Duration::from_micros(200);

/// Metric names of this module.
pub mod names {
    /// Gauge, by `device` (`cuda:0`): runner threads whose passes take turns at it.
    pub const RUNNERS: &str = "mesh_device_runners";
}

/// Serialises forward passes on one device, first come first served.
#[derive(Debug)]
pub struct DeviceLock {
    /// The device, as metrics name it (`cuda:0`).
    name: String,
    /// The gauge of the runner threads that take turns here (see [`DeviceLock::join`]),
    /// registered with the lock, from the recorder in force where it is made.
    runners: metrics::Gauge,
    /// The ticket the next caller of `lock` takes.
    next: AtomicU64,
    /// The ticket whose pass may run now.
    serving: AtomicU64,
    /// Where a waiter sleeps when it is not next in line, or has watched long enough.
    sleepers: Mutex<()>,
    turn: Condvar,
}

/// The right to run one forward pass on the device; the next in line gets it when
/// this is dropped (also when the pass panics).
#[must_use = "the device is released as soon as the pass is dropped"]
#[derive(Debug)]
pub struct DevicePass<'a> {
    lock: &'a DeviceLock,
}

/// One runner thread's place among those taking turns at a device, from its start to
/// its end (counted in [`names::RUNNERS`]).
#[must_use = "the runner counts as gone as soon as this is dropped"]
#[derive(Debug)]
pub struct Seat {
    runners: metrics::Gauge,
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.runners.decrement(1.0);
    }
}

impl DeviceLock {
    /// A lock for the device that metrics call `name`.
    pub fn new(name: impl Into<String>) -> Self {
        let name = name.into();
        Self {
            runners: metrics::gauge!(names::RUNNERS, "device" => name.clone()),
            name,
            next: AtomicU64::new(0),
            serving: AtomicU64::new(0),
            sleepers: Mutex::new(()),
            turn: Condvar::new(),
        }
    }

    /// The device's name (`cuda:0`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Counts a runner thread among those taking turns here until the seat is dropped.
    pub fn join(&self) -> Seat {
        // A step rather than a value set, so that runners joining and leaving at once
        // cannot leave the gauge at a count one of them saw before the other's step.
        self.runners.increment(1.0);
        Seat {
            runners: self.runners.clone(),
        }
    }

    /// Waits until every pass that asked before has finished, then holds the device.
    /// Next in line, the caller watches for the pass ahead to end for up to
    /// [`HANDOFF_SPIN`]; otherwise it sleeps until the pass ahead of it ends.
    pub fn lock(&self) -> DevicePass<'_> {
        let mine = self.next.fetch_add(1, Ordering::Relaxed);
        let mut watched = false;
        loop {
            let serving = self.serving.load(Ordering::Acquire);
            if serving == mine {
                return DevicePass { lock: self };
            }
            if serving + 1 == mine && !watched {
                watched = true;
                let since = Instant::now();
                while self.serving.load(Ordering::Acquire) != mine && since.elapsed() < HANDOFF_SPIN
                {
                    std::thread::yield_now();
                }
                continue;
            }
            let guard = self.sleepers.lock().unwrap_or_else(PoisonError::into_inner);
            // Checked again under the lock: a pass that ends moves `serving` on before
            // it takes this lock to wake the sleepers, so either this sees the move or
            // the wake-up finds this thread asleep.
            let now = self.serving.load(Ordering::Acquire);
            if now == serving {
                drop(
                    self.turn
                        .wait(guard)
                        .unwrap_or_else(PoisonError::into_inner),
                );
            }
        }
    }

    /// Passes waiting for the device, not counting the one that holds it.
    pub fn waiting(&self) -> u64 {
        let next = self.next.load(Ordering::Relaxed);
        let serving = self.serving.load(Ordering::Acquire);
        next.saturating_sub(serving).saturating_sub(1)
    }
}

impl Drop for DevicePass<'_> {
    fn drop(&mut self) {
        self.lock.serving.fetch_add(1, Ordering::Release);
        drop(
            self.lock
                .sleepers
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        // Every sleeper wakes and checks its ticket: a GPU has a few runners at most.
        self.lock.turn.notify_all();
    }
}

/// The lock of GPU `ordinal`, shared by every model in this process that runs on it.
pub fn gpu(ordinal: usize) -> Arc<DeviceLock> {
    static LOCKS: OnceLock<Mutex<HashMap<usize, Arc<DeviceLock>>>> = OnceLock::new();
    LOCKS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(ordinal)
        .or_insert_with(|| Arc::new(DeviceLock::new(format!("cuda:{ordinal}"))))
        .clone()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    /// Polls until `lock` has `n` passes waiting (5 s at most).
    fn wait_for_waiters(lock: &DeviceLock, n: u64) {
        let give_up = Instant::now() + Duration::from_secs(5);
        while lock.waiting() < n {
            assert!(
                Instant::now() < give_up,
                "{} waiting, not {n}",
                lock.waiting()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn passes_run_one_at_a_time_in_the_order_they_asked() {
        let lock = Arc::new(DeviceLock::new("test"));
        let order = Arc::new(Mutex::new(Vec::new()));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let held = lock.lock();
        assert_eq!(lock.waiting(), 0);
        let mut threads = Vec::new();
        for id in 1..=4u64 {
            let (l, order, running, most) =
                (lock.clone(), order.clone(), running.clone(), most.clone());
            threads.push(std::thread::spawn(move || {
                let _pass = l.lock();
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                order.lock().unwrap().push(id);
                std::thread::sleep(Duration::from_millis(2));
                running.fetch_sub(1, Ordering::SeqCst);
            }));
            // Each asks only once the one before is in line: the tickets' order is known.
            wait_for_waiters(&lock, id);
        }
        // The holder asks again as it lets go: it goes behind the four, not first.
        drop(held);
        let again = lock.lock();
        assert_eq!(*order.lock().unwrap(), vec![1, 2, 3, 4]);
        assert_eq!(most.load(Ordering::SeqCst), 1, "two passes ran at once");
        drop(again);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(lock.waiting(), 0);
    }

    #[test]
    fn a_pass_that_panics_gives_the_device_back() {
        let lock = Arc::new(DeviceLock::new("test"));
        let l = lock.clone();
        let panicked = std::thread::spawn(move || {
            let _pass = l.lock();
            panic!("the model's own bug");
        })
        .join();
        assert!(panicked.is_err());
        // Not held: a pass gets the device at once.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _pass = lock.lock();
            tx.send(()).unwrap();
        });
        rx.recv_timeout(Duration::from_secs(5))
            .expect("the device stayed held after a panic");
    }

    #[test]
    fn many_short_passes_by_many_threads_never_overlap_and_all_finish() {
        // Passes far shorter than a wake-up, so that threads watch, sleep and wake in
        // every order: a lost wake-up hangs this test (it fails after 60 s).
        let lock = Arc::new(DeviceLock::new("test"));
        let running = Arc::new(AtomicUsize::new(0));
        let passes = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..4 {
            let (lock, running, passes, tx) =
                (lock.clone(), running.clone(), passes.clone(), tx.clone());
            std::thread::spawn(move || {
                for i in 0..2_000 {
                    let _pass = lock.lock();
                    assert_eq!(
                        running.fetch_add(1, Ordering::SeqCst),
                        0,
                        "two passes at once"
                    );
                    if i % 100 == 0 {
                        std::thread::sleep(Duration::from_micros(300));
                    }
                    running.fetch_sub(1, Ordering::SeqCst);
                    passes.fetch_add(1, Ordering::SeqCst);
                }
                tx.send(()).unwrap();
            });
        }
        for _ in 0..4 {
            rx.recv_timeout(Duration::from_secs(60))
                .expect("a thread never got the device (or a pass overlapped another)");
        }
        assert_eq!(passes.load(Ordering::SeqCst), 8_000);
        assert_eq!(lock.waiting(), 0);
    }

    #[test]
    fn each_gpu_has_one_lock() {
        assert!(Arc::ptr_eq(&gpu(0), &gpu(0)));
        assert!(!Arc::ptr_eq(&gpu(0), &gpu(1)));
        assert_eq!(gpu(1).name(), "cuda:1");
    }

    #[test]
    fn a_seat_counts_its_runner_until_it_is_dropped() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let metrics = recorder.handle();
        let lock = metrics::with_local_recorder(&recorder, || DeviceLock::new("test"));
        let runners = || {
            let text = metrics.render();
            text.lines()
                .find_map(|l| l.strip_prefix(r#"mesh_device_runners{device="test"} "#))
                .map(str::to_owned)
                .unwrap_or_else(|| panic!("no runners gauge in {text}"))
        };
        let first = lock.join();
        let second = lock.join();
        assert_eq!(runners(), "2");
        drop(first);
        assert_eq!(runners(), "1");
        drop(second);
        assert_eq!(runners(), "0");
    }
}
