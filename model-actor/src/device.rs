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
//! some requests then waited up to 100 ms.
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};

/// Serialises forward passes on one device, first come first served.
#[derive(Debug, Default)]
pub struct DeviceLock {
    tickets: Mutex<Tickets>,
    turn: Condvar,
}

#[derive(Debug, Default)]
struct Tickets {
    /// The ticket the next caller of `lock` takes.
    next: u64,
    /// The ticket whose pass may run now.
    serving: u64,
}

/// The right to run one forward pass on the device; the next in line gets it when
/// this is dropped (also when the pass panics).
#[must_use = "the device is released as soon as the pass is dropped"]
#[derive(Debug)]
pub struct DevicePass<'a> {
    lock: &'a DeviceLock,
}

impl DeviceLock {
    /// Waits until every pass that asked before has finished, then holds the device.
    pub fn lock(&self) -> DevicePass<'_> {
        let mut t = self.tickets.lock().unwrap_or_else(PoisonError::into_inner);
        let mine = t.next;
        t.next += 1;
        while t.serving != mine {
            t = self.turn.wait(t).unwrap_or_else(PoisonError::into_inner);
        }
        DevicePass { lock: self }
    }

    /// Passes waiting for the device, not counting the one that holds it.
    pub fn waiting(&self) -> u64 {
        let t = self.tickets.lock().unwrap_or_else(PoisonError::into_inner);
        (t.next - t.serving).saturating_sub(1)
    }
}

impl Drop for DevicePass<'_> {
    fn drop(&mut self) {
        let mut t = self
            .lock
            .tickets
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        t.serving += 1;
        drop(t);
        // Every waiter wakes and checks its ticket: a GPU has a few runners at most.
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
        .or_default()
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
        let lock = Arc::new(DeviceLock::default());
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
        let lock = Arc::new(DeviceLock::default());
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
    fn each_gpu_has_one_lock() {
        assert!(Arc::ptr_eq(&gpu(0), &gpu(0)));
        assert!(!Arc::ptr_eq(&gpu(0), &gpu(1)));
    }
}
