//! Shared helpers: a request type, fake replicas and a metrics recorder.
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mesh_stack::{HasDeadline, ReplicaId, StackError};
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use parking_lot::Mutex;
use tokio::time::Instant;

/// The request of the tests: an id and a deadline.
#[derive(Debug, Clone)]
pub struct Req {
    pub id: u64,
    pub deadline: Instant,
}

impl HasDeadline for Req {
    fn deadline(&self) -> Instant {
        self.deadline
    }
}

pub fn req(id: u64, within: Duration) -> Req {
    Req {
        id,
        deadline: Instant::now() + within,
    }
}

/// What a fake replica does with each call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Answers at once with its name.
    Ok,
    /// Fails at once with `ReplicaUnavailable`.
    Unavailable,
    /// Never answers.
    Hang,
    /// Answers after the given delay.
    Delay(Duration),
}

/// A fake replica whose behaviour can be changed while it runs; counts calls.
#[derive(Clone)]
pub struct Fake {
    pub name: &'static str,
    pub mode: Arc<Mutex<Mode>>,
    pub calls: Arc<AtomicU64>,
}

impl Fake {
    pub fn new(name: &'static str, mode: Mode) -> Self {
        Fake {
            name,
            mode: Arc::new(Mutex::new(mode)),
            calls: Arc::new(AtomicU64::new(0)),
        }
    }

    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    pub fn set(&self, mode: Mode) {
        *self.mode.lock() = mode;
    }

    pub fn entry(&self) -> (ReplicaId, Fake) {
        (ReplicaId::from(self.name), self.clone())
    }
}

impl tower::Service<Req> for Fake {
    type Response = &'static str;
    type Error = StackError;
    type Future = Pin<Box<dyn Future<Output = Result<&'static str, StackError>> + Send>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), StackError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Req) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let name = self.name;
        let mode = *self.mode.lock();
        Box::pin(async move {
            match mode {
                Mode::Ok => Ok(name),
                Mode::Unavailable => Err(StackError::ReplicaUnavailable(
                    format!("{name} is down").into(),
                )),
                Mode::Hang => futures::future::pending().await,
                Mode::Delay(d) => {
                    tokio::time::sleep(d).await;
                    Ok(name)
                }
            }
        })
    }
}

/// A recorder that keeps counters and gauges by `name{label=value,...}`.
#[derive(Default, Clone)]
pub struct TestRecorder {
    values: Arc<Mutex<HashMap<String, Arc<AtomicU64>>>>,
}

fn key_string(key: &Key) -> String {
    let mut labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    labels.sort();
    if labels.is_empty() {
        key.name().to_string()
    } else {
        format!("{}{{{}}}", key.name(), labels.join(","))
    }
}

impl TestRecorder {
    /// Installs a fresh recorder for this thread (tokio tests run on one thread).
    pub fn install() -> TestRecorder {
        let rec = TestRecorder::default();
        let leaked: &'static TestRecorder = Box::leak(Box::new(rec.clone()));
        std::mem::forget(metrics::set_default_local_recorder(leaked));
        rec
    }

    fn cell(&self, key: &Key) -> Arc<AtomicU64> {
        self.values
            .lock()
            .entry(key_string(key))
            .or_insert_with(|| Arc::new(AtomicU64::new(0)))
            .clone()
    }

    /// Counter value; `name` includes labels, e.g. `x{replica=a,to=open}`.
    pub fn counter(&self, name: &str) -> u64 {
        self.values
            .lock()
            .get(name)
            .map(|c| c.load(Ordering::SeqCst))
            .unwrap_or(0)
    }

    /// Gauge value (None if never set).
    pub fn gauge(&self, name: &str) -> Option<f64> {
        self.values
            .lock()
            .get(name)
            .map(|c| f64::from_bits(c.load(Ordering::SeqCst)))
    }
}

impl Recorder for TestRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.cell(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.cell(key))
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}
