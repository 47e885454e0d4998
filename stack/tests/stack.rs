//! The composed stack over fake replicas, in paused time.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{req, Fake, Mode, TestRecorder};
use mesh_stack::{
    model_call_stack, model_call_stack_with_updates, BreakerConfig, BreakerPhase, ErrorKind,
    ModelCallStack, ReplicaId, RetryBudgetConfig, StackConfig, StackError,
};
use tokio::time::Instant;
use tower::{Service, ServiceExt};

type Stack = ModelCallStack<common::Req, &'static str>;

fn cfg() -> StackConfig {
    StackConfig {
        per_try_timeout: Duration::from_millis(30),
        balance_seed: Some(7),
        ..StackConfig::default()
    }
}

async fn send(stack: &mut Stack, id: u64, within: Duration) -> Result<&'static str, StackError> {
    stack.ready().await.unwrap().call(req(id, within)).await
}

#[tokio::test(start_paused = true)]
async fn retries_stay_within_the_budget_against_a_failing_backend() {
    let rec = TestRecorder::install();
    let a = Fake::new("a", Mode::Unavailable);
    let b = Fake::new("b", Mode::Unavailable);
    let cfg = StackConfig {
        retry_budget: RetryBudgetConfig {
            ratio: 0.2,
            min_per_sec: 10,
            ttl: Duration::from_secs(10),
        },
        // Keep the breakers out of the way: this is about the budget.
        breaker: BreakerConfig {
            failure_threshold: u32::MAX,
            ..BreakerConfig::default()
        },
        ..cfg()
    };
    let mut stack = model_call_stack(vec![a.entry(), b.entry()], &cfg).unwrap();
    let mut futs = Vec::new();
    for i in 0..1000 {
        futs.push(
            stack
                .ready()
                .await
                .unwrap()
                .call(req(i, Duration::from_secs(1))),
        );
    }
    let results = futures::future::join_all(futs).await;
    assert!(results
        .iter()
        .all(|r| matches!(r, Err(StackError::ReplicaUnavailable(_)))));
    let attempts = a.calls() + b.calls();
    let floor = 10 * 10; // min_per_sec * ttl
    assert!(
        attempts >= 1000,
        "every request tried at least once: {attempts}"
    );
    assert!(
        attempts <= 1000 + 1000 / 5 + floor,
        "attempts {attempts} exceed 20% + floor"
    );
    assert!(attempts > 1000, "some retries happened: {attempts}");
    assert_eq!(
        rec.counter("mesh_router_retries_total{reason=replica_unavailable}"),
        attempts - 1000
    );
    assert!(rec.counter("mesh_router_retry_budget_exhausted_total") > 0);
}

#[tokio::test(start_paused = true)]
async fn a_backend_that_never_answers_gives_deadline_exceeded_at_the_deadline() {
    let hang = Fake::new("hang", Mode::Hang);
    let cfg = StackConfig {
        per_try_timeout: Duration::from_secs(5),
        ..cfg()
    };
    let mut stack = model_call_stack(vec![hang.entry()], &cfg).unwrap();
    let start = Instant::now();
    let err = send(&mut stack, 1, Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(matches!(err, StackError::DeadlineExceeded), "{err}");
    assert_eq!(err.kind(), ErrorKind::DeadlineExceeded);
    assert_eq!(start.elapsed(), Duration::from_millis(100));
    assert_eq!(hang.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn retries_end_at_the_deadline_not_after() {
    // Per-try 40 ms: tries at 0, 40, 80; the third is cut by the 100 ms deadline.
    let hang = Fake::new("hang", Mode::Hang);
    let cfg = StackConfig {
        per_try_timeout: Duration::from_millis(40),
        ..cfg()
    };
    let mut stack = model_call_stack(vec![hang.entry()], &cfg).unwrap();
    let start = Instant::now();
    let err = send(&mut stack, 1, Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(matches!(err, StackError::DeadlineExceeded), "{err}");
    assert_eq!(start.elapsed(), Duration::from_millis(100));
    assert_eq!(hang.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn an_answer_ready_only_at_the_deadline_is_not_delivered() {
    let slow = Fake::new("slow", Mode::Delay(Duration::from_millis(100)));
    let cfg = StackConfig {
        per_try_timeout: Duration::from_secs(5),
        ..cfg()
    };
    let mut stack = model_call_stack(vec![slow.entry()], &cfg).unwrap();
    let start = Instant::now();
    let err = send(&mut stack, 1, Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(matches!(err, StackError::DeadlineExceeded), "{err}");
    assert_eq!(start.elapsed(), Duration::from_millis(100));
    // One millisecond more and it answers.
    let ok = send(&mut stack, 2, Duration::from_millis(101))
        .await
        .unwrap();
    assert_eq!(ok, "slow");
}

#[tokio::test(start_paused = true)]
async fn an_expired_request_is_not_sent() {
    let ok = Fake::new("ok", Mode::Ok);
    let mut stack = model_call_stack(vec![ok.entry()], &cfg()).unwrap();
    let err = send(&mut stack, 1, Duration::ZERO).await.unwrap_err();
    assert!(matches!(err, StackError::DeadlineExceeded));
    assert_eq!(ok.calls(), 0);
}

#[tokio::test(start_paused = true)]
async fn per_try_timeout_retries_onto_the_healthy_replica() {
    let rec = TestRecorder::install();
    let slow = Fake::new("slow", Mode::Hang);
    let fast = Fake::new("fast", Mode::Ok);
    let cfg = StackConfig {
        // Keep the slow replica in rotation, so that many requests hit it first.
        breaker: BreakerConfig {
            failure_threshold: 1000,
            ..BreakerConfig::default()
        },
        ..cfg()
    };
    let mut stack = model_call_stack(vec![slow.entry(), fast.entry()], &cfg).unwrap();
    let mut timed_out_first = 0;
    for i in 0..40 {
        let start = Instant::now();
        let before = slow.calls();
        let answer = send(&mut stack, i, Duration::from_millis(100))
            .await
            .unwrap();
        assert_eq!(answer, "fast");
        let elapsed = start.elapsed();
        if slow.calls() > before {
            // It went to the slow one first, timed out after exactly 30 ms and
            // was answered by the fast one.
            timed_out_first += 1;
            assert_eq!(elapsed, Duration::from_millis(30));
        } else {
            assert_eq!(elapsed, Duration::ZERO);
        }
    }
    assert!(timed_out_first > 0, "p2c never picked the slow replica");
    assert_eq!(
        rec.counter("mesh_router_retries_total{reason=try_timeout}"),
        timed_out_first
    );
}

#[tokio::test(start_paused = true)]
async fn p2c_avoids_a_replica_whose_breaker_is_open() {
    let rec = TestRecorder::install();
    let bad = Fake::new("bad", Mode::Unavailable);
    // A realistic latency, so "good" never looks free to the load metric.
    let good = Fake::new("good", Mode::Delay(Duration::from_millis(1)));
    let cfg = StackConfig {
        breaker: BreakerConfig {
            failure_threshold: 3,
            backoff: Duration::from_secs(3600),
            max_backoff: Duration::from_secs(7200),
            multiplier: 2.0,
        },
        // Requests below are 1 s apart, so the load metric's failure penalty
        // (which alone steers traffic away for a while) has faded each time:
        // what keeps "bad" out afterwards is its breaker.
        load_decay: Duration::from_millis(100),
        ..cfg()
    };
    let space = Duration::from_secs(1);
    let mut stack = model_call_stack(vec![bad.entry(), good.entry()], &cfg).unwrap();

    // Until the breaker opens, p2c sends "bad" its share; every failure there
    // is retried onto "good".
    let mut sent = 0;
    while bad.calls() < 3 {
        assert!(sent < 100, "bad never reached 3 failures");
        assert_eq!(
            send(&mut stack, sent, Duration::from_millis(100))
                .await
                .unwrap(),
            "good"
        );
        tokio::time::advance(space).await;
        sent += 1;
    }
    assert_eq!(
        stack.breaker_states()[0],
        (ReplicaId::from("bad"), BreakerPhase::Open)
    );

    // Open: no more traffic to it.
    for i in 0..200 {
        assert_eq!(
            send(&mut stack, i, Duration::from_millis(100))
                .await
                .unwrap(),
            "good"
        );
        tokio::time::advance(space).await;
    }
    assert_eq!(
        bad.calls(),
        3,
        "bad replica got traffic after its breaker opened"
    );
    // ...because p2c never picked it, not because its breaker failed calls fast.
    assert_eq!(
        rec.counter("mesh_router_retries_total{reason=breaker_open}"),
        0
    );
    assert_eq!(
        stack.breaker_states(),
        vec![
            (ReplicaId::from("bad"), BreakerPhase::Open),
            (ReplicaId::from("good"), BreakerPhase::Closed)
        ]
    );

    // After the backoff exactly one probe reaches it; it fails and re-opens.
    tokio::time::advance(Duration::from_secs(3600)).await;
    for i in 0..100 {
        assert_eq!(
            send(&mut stack, i, Duration::from_millis(100))
                .await
                .unwrap(),
            "good"
        );
        tokio::time::advance(space).await;
    }
    assert_eq!(bad.calls(), 4, "exactly one probe");
    assert_eq!(stack.breaker_states()[0].1, BreakerPhase::Open);

    // It recovers: after the (doubled) backoff the probe succeeds and it closes.
    bad.set(Mode::Ok);
    tokio::time::advance(Duration::from_secs(7200)).await;
    let mut from_bad = 0;
    for i in 0..100 {
        if send(&mut stack, i, Duration::from_millis(100))
            .await
            .unwrap()
            == "bad"
        {
            from_bad += 1;
        }
        tokio::time::advance(space).await;
    }
    assert_eq!(stack.breaker_states()[0].1, BreakerPhase::Closed);
    assert!(
        from_bad > 1,
        "closed breaker takes traffic again ({from_bad})"
    );
}

#[tokio::test(start_paused = true)]
async fn all_breakers_open_fails_fast_with_unavailable() {
    let rec = TestRecorder::install();
    let bad = Fake::new("bad", Mode::Unavailable);
    let cfg = StackConfig {
        breaker: BreakerConfig {
            failure_threshold: 2,
            ..BreakerConfig::default()
        },
        ..cfg()
    };
    let mut stack = model_call_stack(vec![bad.entry()], &cfg).unwrap();
    // Two attempts open the breaker; the third attempt finds no replica.
    let err = send(&mut stack, 1, Duration::from_millis(100))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert_eq!(bad.calls(), 2);
    assert!(!stack.any_replica_available());
    // Later requests fail at once, without waiting for their deadline.
    let start = Instant::now();
    let err = send(&mut stack, 2, Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(matches!(err, StackError::NoReplica(_)), "{err}");
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(bad.calls(), 2);
    assert!(rec.counter("mesh_router_no_replica_total") >= 2);
}

#[tokio::test(start_paused = true)]
async fn no_replicas_fails_fast() {
    let mut stack = model_call_stack::<Fake, _>(vec![], &cfg()).unwrap();
    let start = Instant::now();
    let err = send(&mut stack, 1, Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(matches!(err, StackError::NoReplica(_)), "{err}");
    assert_eq!(start.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn sheds_with_overloaded_when_saturated() {
    let rec = TestRecorder::install();
    let hang = Fake::new("hang", Mode::Hang);
    let cfg = StackConfig {
        max_in_flight: 2,
        per_try_timeout: Duration::from_secs(5),
        ..cfg()
    };
    let mut stack = model_call_stack(vec![hang.entry()], &cfg).unwrap();
    let f1 = stack
        .ready()
        .await
        .unwrap()
        .call(req(1, Duration::from_secs(1)));
    let f2 = stack
        .ready()
        .await
        .unwrap()
        .call(req(2, Duration::from_secs(1)));
    let start = Instant::now();
    let err = send(&mut stack, 3, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StackError::Overloaded { in_flight: 2, .. }),
        "{err}"
    );
    assert_eq!(err.kind(), ErrorKind::Overloaded);
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(rec.counter("mesh_router_shed_total"), 1);
    // Finishing (here: dropping) a call frees its slot.
    drop(f1);
    let mut f4 = stack
        .ready()
        .await
        .unwrap()
        .call(req(4, Duration::from_secs(1)));
    assert!(
        futures::poll!(&mut f4).is_pending(),
        "admitted, waiting on the replica"
    );
    assert_eq!(rec.counter("mesh_router_shed_total"), 1);
    drop((f2, f4));
}

#[tokio::test(start_paused = true)]
async fn replicas_can_be_added_and_removed() {
    let a = Fake::new("a", Mode::Unavailable);
    let b = Fake::new("b", Mode::Ok);
    let cfg = StackConfig {
        max_attempts: 1,
        ..cfg()
    };
    let (mut stack, updates) = model_call_stack_with_updates(vec![a.entry()], &cfg).unwrap();
    assert!(send(&mut stack, 1, Duration::from_millis(100))
        .await
        .is_err());
    updates.insert(ReplicaId::from("b"), b.clone()).unwrap();
    updates.remove(ReplicaId::from("a")).unwrap();
    let before = a.calls();
    for i in 0..20 {
        assert_eq!(
            send(&mut stack, i, Duration::from_millis(100))
                .await
                .unwrap(),
            "b"
        );
    }
    assert_eq!(a.calls(), before);
    assert_eq!(stack.breaker_states().len(), 1);
}

#[tokio::test]
async fn replica_updates_say_when_the_stack_is_gone() {
    let a = Fake::new("a", Mode::Ok);
    let (stack, updates) = model_call_stack_with_updates(vec![a.entry()], &cfg()).unwrap();
    let copy = stack.clone();
    drop(stack);
    // A clone still holds the balancer: the handle is live.
    assert!(!updates.is_closed());
    drop(copy);
    // The balancer stops with its last clone; whoever feeds it learns so.
    tokio::time::timeout(Duration::from_secs(5), updates.closed())
        .await
        .expect("closed() resolves once the stack is dropped");
    assert!(updates.is_closed());
    assert!(updates.insert(ReplicaId::from("b"), a.clone()).is_err());
}

#[tokio::test(start_paused = true)]
async fn invalid_config_is_rejected() {
    let cfg = StackConfig {
        max_attempts: 5,
        ..cfg()
    };
    let err = model_call_stack::<Fake, common::Req>(vec![], &cfg).unwrap_err();
    assert!(matches!(err, StackError::InvalidConfig(_)));
}
