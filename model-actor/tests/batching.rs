//! The batching actors with a fake model (no candle): admission, batch formation,
//! deadlines and cancelled callers.
#![allow(clippy::unwrap_used)] // tests may unwrap
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh_model_actor::device::DeviceLock;
use mesh_model_actor::{
    ActorSystem, Batch, Forward, Model, ModelConfig, ModelError, ModelFactory, Output,
    VersionHandle,
};
use parking_lot::Mutex;

/// Sums each row; sleeps `delay` per batch; records every batch it sees.
struct Fake {
    delay: Duration,
    seen: Arc<Mutex<Vec<Vec<f32>>>>,
}

impl Model for Fake {
    fn input_width(&self) -> usize {
        2
    }
    fn output_width(&self) -> usize {
        1
    }
    fn forward(&mut self, b: &Batch) -> Result<Forward, ModelError> {
        // Recorded as the batch starts, so a test can wait for a runner to take it.
        self.seen.lock().push(b.data.clone());
        std::thread::sleep(self.delay);
        Ok(Forward {
            data: b.data.chunks(2).map(|r| r[0] + r[1]).collect(),
            cols: 1,
            ..Default::default()
        })
    }
}

fn config(max_batch: usize, delay_us: u64, capacity: usize, runners: usize) -> Arc<ModelConfig> {
    config_with(max_batch, delay_us, capacity, runners, "")
}

/// `config` with `extra` lines added to its `[batching]` table.
fn config_with(
    max_batch: usize,
    delay_us: u64,
    capacity: usize,
    runners: usize,
    extra: &str,
) -> Arc<ModelConfig> {
    let text = format!(
        r#"
        kind = "mlp"
        [[inputs]]
        name = "x"
        datatype = "FP32"
        dims = [2]
        [[outputs]]
        name = "y"
        datatype = "FP32"
        dims = [1]
        [mlp]
        activations = []
        output_activation = "none"
        [batching]
        max_batch_size = {max_batch}
        max_queue_delay_us = {delay_us}
        queue_capacity = {capacity}
        runner_instances = {runners}
        default_timeout_ms = 5000
        {extra}
        "#
    );
    Arc::new(ModelConfig::parse(&text, "fake").unwrap())
}

/// The rows of every batch the fake model ran, in order.
type Seen = Arc<Mutex<Vec<Vec<f32>>>>;

/// Version 1 of a model built by `factory`, started on an actor system of its own
/// and ready.
fn spawn_ready(cfg: Arc<ModelConfig>, factory: ModelFactory) -> Arc<VersionHandle> {
    spawn_version(cfg, 1, factory)
}

/// `spawn_ready` of version `version`.
fn spawn_version(cfg: Arc<ModelConfig>, version: u64, factory: ModelFactory) -> Arc<VersionHandle> {
    let h = VersionHandle::spawn(&ActorSystem::start().unwrap(), cfg, version, 0, factory).unwrap();
    h.mark_ready();
    Arc::new(h)
}

fn start(cfg: Arc<ModelConfig>, delay: Duration) -> (Arc<VersionHandle>, Seen) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let factory = Arc::new(move || {
        Box::new(Fake {
            delay,
            seen: s.clone(),
        }) as Box<dyn Model>
    });
    (spawn_ready(cfg, factory), seen)
}

fn row(a: f32) -> Batch {
    Batch {
        rows: 1,
        cols: 2,
        data: vec![a, 1.0],
    }
}

fn in_secs(s: u64) -> Option<Instant> {
    Some(Instant::now() + Duration::from_secs(s))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_delay_gathers_separate_callers_into_one_batch() {
    let (h, seen) = start(config(8, 50_000, 64, 1), Duration::ZERO);
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let h = h.clone();
            tokio::spawn(async move { h.infer(row(i as f32), in_secs(5)).await })
        })
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        let out = t.await.unwrap().unwrap();
        // Each caller gets its own row back, not a neighbour's.
        assert_eq!(out.data, vec![i as f32 + 1.0]);
    }
    let batches = seen.lock();
    let biggest = batches.iter().map(|b| b.len() / 2).max().unwrap();
    assert!(
        biggest > 1,
        "no batch formed: {:?}",
        batches.iter().map(|b| b.len() / 2).collect::<Vec<_>>()
    );
    assert!(batches.iter().all(|b| b.len() / 2 <= 8));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_fails_fast_with_overloaded() {
    let (h, _) = start(config(1, 0, 3, 1), Duration::from_millis(300));
    let tasks: Vec<_> = (0..10)
        .map(|i| {
            let h = h.clone();
            tokio::spawn(async move {
                let t = Instant::now();
                (h.infer(row(i as f32), in_secs(10)).await, t.elapsed())
            })
        })
        .collect();
    let mut overloaded = 0;
    let mut ok = 0;
    for t in tasks {
        match t.await.unwrap() {
            (Err(ModelError::Overloaded { capacity: 3, .. }), took) => {
                overloaded += 1;
                // Rejected at admission, not after waiting behind the 300 ms batches.
                assert!(took < Duration::from_millis(250), "overload took {took:?}");
            }
            (Ok(_), _) => ok += 1,
            (other, _) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(ok, 3);
    assert_eq!(overloaded, 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_answer_after_the_deadline() {
    let (h, _) = start(config(1, 0, 16, 1), Duration::from_millis(400));
    let t = Instant::now();
    let r = h
        .infer(row(1.0), Some(Instant::now() + Duration::from_millis(50)))
        .await;
    assert!(matches!(r, Err(ModelError::DeadlineExceeded(_))), "{r:?}");
    assert!(
        t.elapsed() < Duration::from_millis(350),
        "answered after {:?}",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_whose_caller_left_are_not_computed() {
    let (h, seen) = start(config(1, 0, 16, 1), Duration::from_millis(150));
    // The first request occupies the only runner (and a second fills the ready slot).
    let h1 = h.clone();
    let first = tokio::spawn(async move { h1.infer(row(1.0), in_secs(5)).await });
    let h2 = h.clone();
    let second = tokio::spawn(async move { h2.infer(row(2.0), in_secs(5)).await });
    tokio::time::sleep(Duration::from_millis(20)).await;
    // This one waits in the queue; its caller gives up before a runner is free.
    let h3 = h.clone();
    let gone = tokio::spawn(async move { h3.infer(row(77.0), in_secs(5)).await });
    tokio::time::sleep(Duration::from_millis(20)).await;
    gone.abort();
    let h4 = h.clone();
    let last = tokio::spawn(async move { h4.infer(row(4.0), in_secs(5)).await });
    for t in [first, second, last] {
        t.await.unwrap().unwrap();
    }
    let computed: Vec<f32> = seen.lock().iter().map(|b| b[0]).collect();
    assert!(
        !computed.contains(&77.0),
        "a cancelled request was computed: {computed:?}"
    );
    assert!(computed.contains(&4.0));
}

/// Waits until the handle has admitted `n` requests (waiting or running).
async fn until_in_flight(h: &VersionHandle, n: usize) {
    let t = Instant::now();
    while h.in_flight() < n {
        assert!(t.elapsed() < Duration::from_secs(5), "never reached {n}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Waits until the fake model has started `n` batches. A request counts as in flight
/// from its admission permit, before it is pushed onto the queue, so one sent after
/// it may still be queued ahead of it: a test that needs a request to be running, not
/// waiting, waits for this.
async fn until_taken(seen: &Seen, n: usize) {
    let t = Instant::now();
    while seen.lock().len() < n {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the runner never took batch {n}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_refuses_at_once_what_cannot_be_answered_in_time() {
    // One runner, one row a batch, 100 ms a batch.
    let (h, seen) = start(config(1, 0, 64, 1), Duration::from_millis(100));
    // The first batch teaches the group its batch time.
    h.infer(row(0.0), in_secs(5)).await.unwrap();
    assert!(h.batch_time() >= Duration::from_millis(100));
    // One running (about 100 ms left), one waiting: a third request's answer is
    // expected in about 300 ms.
    let h1 = h.clone();
    let running = tokio::spawn(async move { h1.infer(row(1.0), in_secs(5)).await });
    // Taken by the runner, so that only the next one waits in the queue: in flight
    // alone, it may still be queued, and two batches would be ahead.
    until_taken(&seen, 2).await;
    let h2 = h.clone();
    let waiting = tokio::spawn(async move { h2.infer(row(2.0), in_secs(5)).await });
    until_in_flight(&h, 2).await;
    let t = Instant::now();
    let tight = h
        .infer(row(3.0), Some(Instant::now() + Duration::from_millis(150)))
        .await;
    let took = t.elapsed();
    match &tight {
        Err(
            e @ ModelError::CannotMeetDeadline {
                expected,
                remaining,
                batches_ahead: 1,
                runners: 1,
                ..
            },
        ) => {
            assert!(*expected > Duration::from_millis(250), "{e}");
            assert!(*remaining <= Duration::from_millis(150), "{e}");
            let msg = e.to_string();
            assert!(
                msg.starts_with(
                    "model 'fake' version 1 cannot answer in time: expected answer in "
                ),
                "{msg}"
            );
            assert!(msg.contains("(1 full batches ahead of "), "{msg}");
            assert!(msg.contains("of the request's deadline is left"), "{msg}");
            assert_eq!(e.code(), "resource_exhausted");
        }
        other => panic!("expected CannotMeetDeadline, got {other:?}"),
    }
    // Refused at admission, not after waiting behind the 100 ms batches.
    assert!(took < Duration::from_millis(50), "refusal took {took:?}");
    // A request with time enough is still admitted behind them.
    let ok = h.infer(row(4.0), in_secs(5)).await.unwrap();
    assert_eq!(ok.data, vec![5.0]);
    running.await.unwrap().unwrap();
    waiting.await.unwrap().unwrap();
    let computed: Vec<f32> = seen.lock().iter().map(|b| b[0]).collect();
    assert!(
        !computed.contains(&3.0),
        "a refused request was computed: {computed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_expires_in_the_queue_is_not_computed_nor_counted_ok() {
    // A fresh group knows no batch time yet, so a request with a short deadline
    // is admitted behind a 300 ms batch, and its deadline passes while it waits.
    let (h, seen) = start(config(1, 0, 64, 1), Duration::from_millis(300));
    let h1 = h.clone();
    let first = tokio::spawn(async move { h1.infer(row(1.0), in_secs(5)).await });
    // Running, not only in flight: one not yet queued could be queued after the
    // short-deadline request, which the runner would then compute first.
    until_taken(&seen, 1).await;
    let t = Instant::now();
    let r = h
        .infer(row(55.0), Some(Instant::now() + Duration::from_millis(60)))
        .await;
    assert!(matches!(r, Err(ModelError::DeadlineExceeded(_))), "{r:?}");
    assert!(
        t.elapsed() < Duration::from_millis(250),
        "{:?}",
        t.elapsed()
    );
    first.await.unwrap().unwrap();
    // The runner, free again, drops it instead of computing it.
    let after = h.infer(row(2.0), in_secs(5)).await.unwrap();
    assert_eq!(after.data, vec![3.0]);
    let computed: Vec<f32> = seen.lock().iter().map(|b| b[0]).collect();
    assert_eq!(computed, vec![1.0, 2.0], "the expired request was computed");
    // Two answered, one failed: the expired request is not a success.
    assert_eq!(h.stats.success.get().0, 2);
    assert_eq!(h.stats.fail.get().0, 1);
}

/// Released by the test that holds a forward pass open (rows whose first value is 7).
static RELEASE_SEVENS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Answers each row with its first value; records the name of the thread each batch
/// ran on; sleeps `delay` per batch; panics on a row whose first value is 666, fails on
/// one whose first value is 404; holds a batch whose first value is 7 until
/// `RELEASE_SEVENS` (10 s at most).
struct Where {
    delay: Duration,
    threads: Arc<Mutex<Vec<String>>>,
}

impl Model for Where {
    fn input_width(&self) -> usize {
        2
    }
    fn output_width(&self) -> usize {
        1
    }
    fn forward(&mut self, b: &Batch) -> Result<Forward, ModelError> {
        let name = std::thread::current().name().unwrap_or("").to_owned();
        self.threads.lock().push(name);
        assert!(b.data[0] != 666.0, "the model's own bug");
        if b.data[0] == 404.0 {
            return Err(ModelError::Compute("row 404 refused".into()));
        }
        if b.data[0] == 7.0 {
            let give_up = Instant::now() + Duration::from_secs(10);
            while !RELEASE_SEVENS.load(std::sync::atomic::Ordering::Acquire) {
                assert!(Instant::now() < give_up, "never released");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        std::thread::sleep(self.delay);
        Ok(Forward {
            data: b.data.chunks(2).map(|r| r[0]).collect(),
            cols: 1,
            ..Default::default()
        })
    }
}

/// The names of the threads the batches of a `Where` model ran on, in order.
type Threads = Arc<Mutex<Vec<String>>>;

/// A version of the `Where` model with one runner.
fn start_where(inline_below_us: u64, delay: Duration) -> (Arc<VersionHandle>, Threads) {
    let threads = Arc::new(Mutex::new(Vec::new()));
    let t = threads.clone();
    let factory = Arc::new(move || {
        Box::new(Where {
            delay,
            threads: t.clone(),
        }) as Box<dyn Model>
    });
    let cfg = config_with(8, 0, 64, 1, &format!("inline_below_us = {inline_below_us}"));
    (spawn_ready(cfg, factory), threads)
}

fn last_thread(threads: &Threads) -> String {
    threads.lock().last().cloned().unwrap()
}

#[tokio::test]
async fn inline_computes_on_the_callers_thread_when_on_and_the_model_is_cheap() {
    let caller = std::thread::current().name().unwrap().to_owned();
    // Off (the default): every batch runs on a runner thread.
    let (h, threads) = start_where(0, Duration::ZERO);
    for i in 0..3 {
        let out = h.infer(row(i as f32), in_secs(5)).await.unwrap();
        assert_eq!(out.data, vec![i as f32]);
        assert_eq!(last_thread(&threads), "mesh-runner");
    }
    // On: a request that finds the queue empty is computed where it was made.
    let (h, threads) = start_where(1_000, Duration::ZERO);
    for i in 0..3 {
        let out = h.infer(row(i as f32), in_secs(5)).await.unwrap();
        assert_eq!(out.data, vec![i as f32]);
        assert_eq!(out.queue, Duration::ZERO);
        assert_eq!(out.batch_rows, 1);
        assert_eq!(last_thread(&threads), caller);
    }
    assert_eq!(
        h.stats
            .inference_count
            .load(std::sync::atomic::Ordering::Relaxed),
        3
    );
}

#[tokio::test]
async fn a_model_slower_than_the_inline_limit_goes_back_to_its_runners() {
    let caller = std::thread::current().name().unwrap().to_owned();
    // Before any batch ran, the cost is a guess within the limit; the first batch
    // shows it takes 5 ms, over the 1 ms limit: later requests queue.
    let (h, threads) = start_where(1_000, Duration::from_millis(5));
    h.infer(row(1.0), in_secs(5)).await.unwrap();
    assert_eq!(last_thread(&threads), caller);
    for i in 0..3 {
        let out = h.infer(row(i as f32), in_secs(5)).await.unwrap();
        assert_eq!(out.data, vec![i as f32]);
        assert_eq!(last_thread(&threads), "mesh-runner");
    }
}

/// A model's error reaches the caller as the model gave it, on either path, once.
#[tokio::test]
async fn a_model_error_reaches_the_caller_as_the_model_gave_it() {
    for (inline, thread) in [(0, "mesh-runner"), (1_000, "")] {
        let (h, threads) = start_where(inline, Duration::ZERO);
        let err = h.infer(row(404.0), in_secs(5)).await.unwrap_err();
        assert!(matches!(err, ModelError::Compute(_)), "{err:?}");
        assert_eq!(err.to_string(), "model execution failed: row 404 refused");
        if !thread.is_empty() {
            assert_eq!(last_thread(&threads), thread);
        }
        // The version serves on.
        assert_eq!(h.infer(row(3.0), in_secs(5)).await.unwrap().data, vec![3.0]);
    }
}

#[tokio::test]
async fn a_panic_on_the_callers_thread_is_an_error_and_turns_inline_off() {
    let caller = std::thread::current().name().unwrap().to_owned();
    let (h, threads) = start_where(1_000, Duration::ZERO);
    let err = h.infer(row(666.0), in_secs(5)).await.unwrap_err();
    assert!(matches!(err, ModelError::Compute(_)), "{err:?}");
    assert!(err.to_string().contains("panicked"), "{err}");
    assert_eq!(last_thread(&threads), caller);
    // The caller's thread lived on, and the version serves through its runners.
    for i in 0..3 {
        let out = h.infer(row(i as f32), in_secs(5)).await.unwrap();
        assert_eq!(out.data, vec![i as f32]);
        assert_eq!(last_thread(&threads), "mesh-runner");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_kept_instance_computes_the_next_request_queues_for_a_runner() {
    let (h, threads) = start_where(1_000, Duration::ZERO);
    // The first request is computed on a serving thread and held there.
    let first = {
        let h = h.clone();
        tokio::spawn(async move { h.infer(row(7.0), in_secs(20)).await })
    };
    let give_up = Instant::now() + Duration::from_secs(10);
    while threads.lock().is_empty() {
        assert!(Instant::now() < give_up, "the first request never started");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // The queue is empty but the kept instance is busy: the next request does not
    // wait for it, a runner answers it.
    let out = h.infer(row(3.0), in_secs(5)).await.unwrap();
    assert_eq!(out.data, vec![3.0]);
    assert_eq!(last_thread(&threads), "mesh-runner");
    RELEASE_SEVENS.store(true, std::sync::atomic::Ordering::Release);
    let out = first.await.unwrap().unwrap();
    assert_eq!(out.data, vec![7.0]);
    assert_eq!(out.queue, Duration::ZERO);
    let seen = threads.lock().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_ne!(seen[0], "mesh-runner", "{seen:?}");
}

/// What `OnDevice` models saw: passes running now, the most at once, all passes, and
/// the rows they computed.
#[derive(Default)]
struct Tally {
    running: AtomicUsize,
    most: AtomicUsize,
    passes: AtomicUsize,
    rows: AtomicUsize,
}

/// Answers each row with its first value after `delay`, counting its passes in
/// `tally` (shared by every model that shares it); says it computes on `device`.
struct OnDevice {
    delay: Duration,
    device: Option<Arc<DeviceLock>>,
    tally: Arc<Tally>,
}

impl Model for OnDevice {
    fn input_width(&self) -> usize {
        2
    }
    fn output_width(&self) -> usize {
        1
    }
    fn forward(&mut self, b: &Batch) -> Result<Forward, ModelError> {
        let t = &self.tally;
        let now = t.running.fetch_add(1, Ordering::SeqCst) + 1;
        t.most.fetch_max(now, Ordering::SeqCst);
        t.passes.fetch_add(1, Ordering::SeqCst);
        t.rows.fetch_add(b.rows, Ordering::SeqCst);
        std::thread::sleep(self.delay);
        t.running.fetch_sub(1, Ordering::SeqCst);
        Ok(Forward {
            data: b.data.chunks(2).map(|r| r[0]).collect(),
            cols: 1,
            ..Default::default()
        })
    }
    fn device_lock(&self) -> Option<Arc<DeviceLock>> {
        self.device.clone()
    }
}

/// A group (one runner, batches of up to 8) of an `OnDevice` model.
fn on_device(
    delay: Duration,
    device: Option<Arc<DeviceLock>>,
    tally: &Arc<Tally>,
) -> Arc<VersionHandle> {
    on_device_version(1, delay, device, tally)
}

/// `on_device` of version `version`.
fn on_device_version(
    version: u64,
    delay: Duration,
    device: Option<Arc<DeviceLock>>,
    tally: &Arc<Tally>,
) -> Arc<VersionHandle> {
    let tally = tally.clone();
    let factory = Arc::new(move || {
        Box::new(OnDevice {
            delay,
            device: device.clone(),
            tally: tally.clone(),
        }) as Box<dyn Model>
    });
    spawn_version(config(8, 0, 256, 1), version, factory)
}

/// `h`'s answer to a row of `value`, whose batch waits `hold` for `device`, held here.
async fn infer_behind(
    h: &Arc<VersionHandle>,
    device: &DeviceLock,
    value: f32,
    hold: Duration,
) -> Output {
    let held = device.lock();
    let call = tokio::spawn({
        let h = h.clone();
        async move { h.infer(row(value), in_secs(5)).await }
    });
    until_waiting(device, 1).await;
    tokio::time::sleep(hold).await;
    drop(held);
    call.await.unwrap().unwrap()
}

/// Polls until `device` has `n` passes waiting (5 s at most).
async fn until_waiting(device: &DeviceLock, n: u64) {
    let give_up = Instant::now() + Duration::from_secs(5);
    while device.waiting() < n {
        assert!(Instant::now() < give_up, "never {n} waiting for the device");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_on_one_device_take_turns_and_the_wait_for_it_is_queueing() {
    // Two groups, 40 callers each, all at once: without a device lock their runners
    // compute at the same time (the control), with a shared one never.
    for shared in [false, true] {
        let device = shared.then(|| Arc::new(DeviceLock::new("test")));
        let tally = Arc::new(Tally::default());
        let groups: Vec<_> = (0..2)
            .map(|_| on_device(Duration::from_millis(2), device.clone(), &tally))
            .collect();
        let calls: Vec<_> = groups
            .iter()
            .flat_map(|h| {
                (0..40).map(move |i| {
                    let h = h.clone();
                    tokio::spawn(async move { (i, h.infer(row(i as f32), in_secs(10)).await) })
                })
            })
            .collect();
        for c in calls {
            let (i, out) = c.await.unwrap();
            assert_eq!(out.unwrap().data, vec![i as f32]);
        }
        let most = tally.most.load(Ordering::SeqCst);
        if shared {
            assert_eq!(most, 1, "two passes ran at once on one device");
        } else {
            assert_eq!(most, 2, "the control never overlapped: it shows nothing");
        }
    }
    // A request waits 30 ms for a device held elsewhere: that is queueing, and its
    // compute is its own pass alone.
    let device = Arc::new(DeviceLock::new("test"));
    let h = on_device(Duration::ZERO, Some(device.clone()), &Arc::default());
    let out = infer_behind(&h, &device, 5.0, Duration::from_millis(30)).await;
    assert_eq!(out.data, vec![5.0]);
    assert!(
        out.queue >= Duration::from_millis(30),
        "queue {:?}",
        out.queue
    );
    assert!(
        out.compute < Duration::from_millis(30),
        "compute {:?}",
        out.compute
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_callers_gave_up_waiting_for_the_device_is_not_computed() {
    let device = Arc::new(DeviceLock::new("test"));
    let tally = Arc::new(Tally::default());
    let h = on_device(Duration::ZERO, Some(device.clone()), &tally);
    let held = device.lock();
    let deadline = Instant::now() + Duration::from_millis(20);
    let call = tokio::spawn({
        let h = h.clone();
        async move { h.infer(row(1.0), Some(deadline)).await }
    });
    until_waiting(&device, 1).await;
    let gave_up = call.await.unwrap();
    assert!(
        matches!(gave_up, Err(ModelError::DeadlineExceeded(_))),
        "{gave_up:?}"
    );
    drop(held);
    // The runner goes on to the next batch, whose caller waits.
    let next = h.infer(row(2.0), in_secs(5)).await.unwrap();
    assert_eq!(next.data, vec![2.0]);
    assert_eq!(
        tally.passes.load(Ordering::SeqCst),
        1,
        "the abandoned batch was computed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rows_of_callers_who_gave_up_waiting_for_the_device_are_left_out_of_the_pass() {
    let device = Arc::new(DeviceLock::new("test"));
    let tally = Arc::new(Tally::default());
    let h = on_device(Duration::ZERO, Some(device.clone()), &tally);
    let call = |value: f32, deadline: Instant| {
        let h = h.clone();
        tokio::spawn(async move { h.infer(row(value), Some(deadline)).await })
    };
    // The runner waits for the device with a first batch; two callers queue behind it,
    // one of whom gives up in 100 ms.
    let held = device.lock();
    let first = call(1.0, Instant::now() + Duration::from_secs(5));
    until_waiting(&device, 1).await;
    let impatient = Instant::now() + Duration::from_millis(100);
    let (quitter, stayer) = (
        call(2.0, impatient),
        call(3.0, Instant::now() + Duration::from_secs(5)),
    );
    until_in_flight(&h, 3).await;
    // Another user of the device takes its turn after the first batch's pass and keeps
    // the device past the impatient caller's deadline, while their batch waits for it.
    let other = std::thread::spawn({
        let device = device.clone();
        move || {
            let _turn = device.lock();
            std::thread::sleep(impatient.saturating_duration_since(Instant::now()));
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    // The runner and the other user.
    until_waiting(&device, 2).await;
    drop(held);
    assert_eq!(first.await.unwrap().unwrap().data, vec![1.0]);
    let gave_up = quitter.await.unwrap();
    assert!(
        matches!(gave_up, Err(ModelError::DeadlineExceeded(_))),
        "{gave_up:?}"
    );
    let out = stayer.await.unwrap().unwrap();
    other.join().unwrap();
    assert_eq!(out.data, vec![3.0]);
    assert_eq!(
        out.batch_rows, 1,
        "the pass computed the row of a caller who left"
    );
    assert_eq!(tally.passes.load(Ordering::SeqCst), 2);
    assert_eq!(tally.rows.load(Ordering::SeqCst), 2);
}

/// A Prometheus recorder with this crate's buckets, for a test to read what a group
/// made under it records, as `/metrics` would show it.
fn prometheus() -> metrics_exporter_prometheus::PrometheusRecorder {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    let mut b = PrometheusBuilder::new();
    for (name, buckets) in mesh_model_actor::stats::buckets() {
        b = b
            .set_buckets_for_metric(Matcher::Full(name.to_owned()), &buckets)
            .unwrap();
    }
    b.build_recorder()
}

/// The value of the sample `series` (name and labels as rendered) in `text`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wait_for_a_device_and_the_runners_taking_turns_are_in_the_metrics() {
    let recorder = prometheus();
    let metrics = recorder.handle();
    let tally = Arc::new(Tally::default());
    // Two models on one device (a runner each), and one on the CPU, whose metrics are
    // labelled apart by the version (the fake's name is the same).
    let device = metrics::with_local_recorder(&recorder, || Arc::new(DeviceLock::new("test:7")));
    let (first, second, cpu) = metrics::with_local_recorder(&recorder, || {
        let group = |version, device| on_device_version(version, Duration::ZERO, device, &tally);
        (
            group(1, Some(device.clone())),
            group(2, Some(device.clone())),
            group(3, None),
        )
    });
    let until_runners = |n: f64| {
        let metrics = metrics.clone();
        async move {
            let give_up = Instant::now() + Duration::from_secs(5);
            while sample(&metrics.render(), r#"mesh_device_runners{device="test:7"}"#) != Some(n) {
                assert!(Instant::now() < give_up, "{}", metrics.render());
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    };
    until_runners(2.0).await;
    // A batch of the first waits 30 ms for the device; the second's passes do not wait.
    let out = infer_behind(&first, &device, 1.0, Duration::from_millis(30)).await;
    assert_eq!(out.data, vec![1.0]);
    for i in 0..3 {
        assert_eq!(
            second.infer(row(i as f32), in_secs(5)).await.unwrap().data,
            vec![i as f32]
        );
        assert_eq!(
            cpu.infer(row(i as f32), in_secs(5)).await.unwrap().data,
            vec![i as f32]
        );
    }
    let text = metrics.render();
    let wait = |version: u64, part: &str| {
        sample(
            &text,
            &format!(
                r#"mesh_model_device_wait_seconds_{part}{{model="fake",version="{version}",replica="0"}}"#
            ),
        )
    };
    assert_eq!(wait(1, "count"), Some(1.0), "{text}");
    assert!(wait(1, "sum").unwrap() >= 0.030, "{text}");
    assert_eq!(wait(2, "count"), Some(3.0), "{text}");
    assert!(wait(2, "sum").unwrap() < 0.030, "{text}");
    // A model on the CPU takes no turns, and has no such series.
    assert_eq!(wait(3, "count"), None, "{text}");
    assert!(
        sample(
            &text,
            r#"mesh_model_queue_wait_seconds_count{model="fake",version="3",replica="0"}"#
        ) == Some(3.0),
        "{text}"
    );
    // A group that stops gives its runner's seat up.
    drop(second);
    until_runners(1.0).await;
}
