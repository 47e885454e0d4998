//! Replica discovery by DNS name, as a Kubernetes headless service gives it: a
//! `remote` entry whose host is a name (`http://model.mesh.svc:8001`) stands for
//! every address the name resolves to. The name is resolved at start and again
//! every `[decisions] resolve_interval`; each address is one replica (with its own
//! breaker) in the model-call stacks, new addresses join, vanished ones leave, and
//! calls already sent to a leaving replica finish. A failed or empty resolution
//! keeps the last good set; more than `[decisions] max_addresses_per_name`
//! addresses keeps that many (the lowest, so every router keeps the same ones).
//!
//! A `remote` entry with an IP address is one fixed replica, never resolved.
use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use mesh_stack::{ReplicaId, ReplicaUpdates};
use metrics::{counter, gauge};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::telemetry::names;

/// The longest one resolution may take (a slow resolver is a failed resolution:
/// the last good set stays).
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// The addresses of one name, sorted.
pub type AddrSet = Arc<BTreeSet<SocketAddr>>;

/// Turns a host name into addresses (`tokio::net::lookup_host`, i.e. the system
/// resolver and /etc/hosts, in [`SystemResolver`]; a fake in tests).
pub trait Resolve: Send + Sync + 'static {
    fn resolve(&self, host: &str, port: u16)
        -> BoxFuture<'static, Result<Vec<SocketAddr>, String>>;
}

/// The system resolver (getaddrinfo: /etc/hosts, then DNS, as nsswitch says).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(
        &self,
        host: &str,
        port: u16,
    ) -> BoxFuture<'static, Result<Vec<SocketAddr>, String>> {
        let host = host.to_owned();
        Box::pin(async move {
            tokio::net::lookup_host((host.as_str(), port))
                .await
                .map(Iterator::collect)
                .map_err(|e| e.to_string())
        })
    }
}

/// A `remote` URL, taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The URL as configured.
    pub url: String,
    /// The host as written (a name, or an IP address without brackets).
    pub host: String,
    pub port: u16,
    /// Set when the host is an IP address: one fixed replica.
    pub ip: Option<IpAddr>,
}

impl Target {
    /// Parses `http://host:port` or `https://host:port` (the port defaults to 80
    /// or 443); anything else is refused with a message naming the URL.
    pub fn parse(url: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("remote '{url}': {why}");
        let uri: http::Uri = url.parse().map_err(|e| bad(&format!("not a URL ({e})")))?;
        let default_port = match uri.scheme_str() {
            Some("http") => 80,
            Some("https") => 443,
            _ => return Err(bad("the scheme must be http:// or https://")),
        };
        let host = uri
            .host()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| bad("no host"))?;
        if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
            return Err(bad("a remote is host and port only, without a path"));
        }
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        Ok(Self {
            url: url.to_owned(),
            ip: host.parse().ok(),
            port: uri.port_u16().unwrap_or(default_port),
            host,
        })
    }
}

/// How names are kept fresh (`[decisions] resolve_interval`, `max_addresses_per_name`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiscoveryConfig {
    pub interval: Duration,
    pub max_addresses: usize,
}

/// What one resolution does to the set.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// The set to use from now on, and how many addresses past the limit were left out.
    Use(BTreeSet<SocketAddr>, usize),
    /// The resolution failed (or found nothing): the last good set stays.
    Keep(String),
}

/// The next set from one resolution's result.
pub fn step(result: Result<Vec<SocketAddr>, String>, max: usize) -> Step {
    match result {
        Err(e) => Step::Keep(e),
        Ok(addrs) if addrs.is_empty() => Step::Keep("no addresses".into()),
        Ok(addrs) => {
            let all: BTreeSet<SocketAddr> = addrs.into_iter().collect();
            let dropped = all.len().saturating_sub(max);
            Step::Use(all.into_iter().take(max).collect(), dropped)
        }
    }
}

/// The address set of one name, kept fresh by a task that ends once nothing
/// holds a [`Discovery`] or a subscription any more.
#[derive(Clone)]
pub struct Discovery {
    rx: watch::Receiver<AddrSet>,
}

/// Resolves `host` once (within [`RESOLVE_TIMEOUT`]).
async fn resolve_once(
    resolver: &dyn Resolve,
    host: &str,
    port: u16,
) -> Result<Vec<SocketAddr>, String> {
    tokio::time::timeout(RESOLVE_TIMEOUT, resolver.resolve(host, port))
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {RESOLVE_TIMEOUT:?}")))
}

/// Applies one resolution to `tx`; returns whether it failed.
fn apply(
    tx: &watch::Sender<AddrSet>,
    host: &str,
    r: Result<Vec<SocketAddr>, String>,
    max: usize,
    failing: bool,
) -> bool {
    match step(r, max) {
        Step::Use(set, dropped) => {
            if dropped > 0 {
                tracing::warn!(
                    name = host,
                    kept = set.len(),
                    dropped,
                    "the name has more addresses than max_addresses_per_name; the lowest are used"
                );
            }
            if failing {
                tracing::info!(
                    name = host,
                    addresses = set.len(),
                    "the name resolves again"
                );
            }
            gauge!(names::RESOLVED_ADDRESSES, "name" => host.to_owned()).set(set.len() as f64);
            tx.send_if_modified(|cur| {
                if **cur == set {
                    return false;
                }
                tracing::info!(name = host, addresses = ?set, "replica addresses changed");
                *cur = Arc::new(set);
                true
            });
            false
        }
        Step::Keep(e) => {
            counter!(names::RESOLVE_FAILURES, "name" => host.to_owned()).increment(1);
            if !failing {
                let kept = tx.borrow().len();
                tracing::warn!(name = host, error = %e, kept, "resolving a remote's name failed; keeping the last good addresses");
            }
            true
        }
    }
}

impl Discovery {
    /// Resolves `host` now (waiting at most [`RESOLVE_TIMEOUT`]), then keeps it
    /// fresh. A first resolution that fails starts with no address, and a warning.
    pub async fn start(
        host: &str,
        port: u16,
        resolver: Arc<dyn Resolve>,
        cfg: DiscoveryConfig,
    ) -> Self {
        let (tx, rx) = watch::channel(AddrSet::default());
        counter!(names::RESOLVE_FAILURES, "name" => host.to_owned()).increment(0);
        let r = resolve_once(resolver.as_ref(), host, port).await;
        let failing = apply(&tx, host, r, cfg.max_addresses, false);
        tokio::spawn(refresh(host.to_owned(), port, resolver, cfg, tx, failing));
        Self { rx }
    }

    /// Like [`Discovery::start`] without waiting: the set is empty until the first
    /// resolution, which runs at once in the task.
    pub fn spawn(host: &str, port: u16, resolver: Arc<dyn Resolve>, cfg: DiscoveryConfig) -> Self {
        let (tx, rx) = watch::channel(AddrSet::default());
        let host = host.to_owned();
        tokio::spawn(async move {
            let r = resolve_once(resolver.as_ref(), &host, port).await;
            let failing = apply(&tx, &host, r, cfg.max_addresses, false);
            refresh(host, port, resolver, cfg, tx, failing).await;
        });
        Self { rx }
    }

    /// The addresses now.
    pub fn current(&self) -> AddrSet {
        self.rx.borrow().clone()
    }

    /// The addresses now, and a receiver that sees every later change.
    pub fn subscribe(&self) -> (AddrSet, watch::Receiver<AddrSet>) {
        let mut rx = self.rx.clone();
        let now = rx.borrow_and_update().clone();
        (now, rx)
    }
}

/// Re-resolves every `cfg.interval` until nothing listens.
async fn refresh(
    host: String,
    port: u16,
    resolver: Arc<dyn Resolve>,
    cfg: DiscoveryConfig,
    tx: watch::Sender<AddrSet>,
    mut failing: bool,
) {
    loop {
        tokio::select! {
            _ = tx.closed() => return,
            _ = tokio::time::sleep(cfg.interval) => {}
        }
        let r = resolve_once(resolver.as_ref(), &host, port).await;
        failing = apply(&tx, &host, r, cfg.max_addresses, failing);
    }
}

/// How a follower turns an address into a replica of one stack, and back.
pub trait ReplicaMaker<S>: Send + 'static {
    /// The replica for `addr` (None: it cannot be made; said in the log).
    fn make(&self, addr: SocketAddr) -> Option<(ReplicaId, S)>;
    /// The id of `addr`'s replica, which is leaving.
    fn retire(&self, addr: SocketAddr) -> ReplicaId;
}

/// Keeps one stack's replicas of one name equal to the name's addresses: starts
/// from `current` (the set the stack was built with), inserts what appears,
/// removes what vanishes. Ends when the stack or the discovery is gone.
pub fn follow<S, M>(
    mut rx: watch::Receiver<AddrSet>,
    mut current: AddrSet,
    updates: ReplicaUpdates<S>,
    maker: M,
) -> JoinHandle<()>
where
    S: Send + 'static,
    M: ReplicaMaker<S>,
{
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = updates.closed() => return,
                changed = rx.changed() => if changed.is_err() { return },
            }
            let next = rx.borrow_and_update().clone();
            for addr in next.difference(&current) {
                if let Some((id, svc)) = maker.make(*addr) {
                    if updates.insert(id, svc).is_err() {
                        return;
                    }
                }
            }
            for addr in current.difference(&next) {
                if updates.remove(maker.retire(*addr)).is_err() {
                    return;
                }
            }
            current = next;
        }
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// A resolver that answers what the test sets, counting calls.
    struct Fake {
        answer: Mutex<Result<Vec<SocketAddr>, String>>,
        calls: AtomicUsize,
    }

    impl Default for Fake {
        fn default() -> Self {
            Self {
                answer: Mutex::new(Err("not set".into())),
                calls: AtomicUsize::new(0),
            }
        }
    }

    impl Fake {
        fn set(&self, r: Result<Vec<&str>, &str>) {
            *self.answer.lock() = r
                .map(|v| v.into_iter().map(addr).collect())
                .map_err(str::to_owned);
        }
    }

    impl Resolve for Arc<Fake> {
        fn resolve(&self, _: &str, _: u16) -> BoxFuture<'static, Result<Vec<SocketAddr>, String>> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            let r = self.answer.lock().clone();
            Box::pin(async move { r })
        }
    }

    fn cfg(max: usize) -> DiscoveryConfig {
        DiscoveryConfig {
            interval: Duration::from_secs(1),
            max_addresses: max,
        }
    }

    fn set(v: &[&str]) -> BTreeSet<SocketAddr> {
        v.iter().map(|s| addr(s)).collect()
    }

    #[test]
    fn targets_are_names_or_fixed_addresses() {
        let t = Target::parse("http://model.mesh.svc:8001").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.ip),
            ("model.mesh.svc", 8001, None)
        );
        let t = Target::parse("https://10.1.2.3").unwrap();
        assert_eq!((t.port, t.ip), (443, Some("10.1.2.3".parse().unwrap())));
        let t = Target::parse("http://[fd00::7]:9").unwrap();
        assert_eq!(
            (t.host.as_str(), t.ip),
            ("fd00::7", Some("fd00::7".parse().unwrap()))
        );
        for (bad, why) in [
            ("model:8001", "scheme"),
            ("ftp://model:1", "scheme"),
            ("http://model:8001/v2", "without a path"),
            ("http://", "not a URL"),
        ] {
            let e = Target::parse(bad).unwrap_err();
            assert!(e.contains(why) && e.contains(bad), "{bad}: {e}");
        }
    }

    #[test]
    fn a_step_keeps_the_last_set_on_failure_and_bounds_the_set() {
        assert_eq!(
            step(Err("nxdomain".into()), 4),
            Step::Keep("nxdomain".into())
        );
        assert_eq!(step(Ok(vec![]), 4), Step::Keep("no addresses".into()));
        let r = vec![
            addr("10.0.0.3:1"),
            addr("10.0.0.1:1"),
            addr("10.0.0.3:1"),
            addr("10.0.0.2:1"),
        ];
        assert_eq!(
            step(Ok(r.clone()), 4),
            Step::Use(set(&["10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"]), 0)
        );
        // Past the limit: the lowest addresses, and how many were left out.
        assert_eq!(
            step(Ok(r), 2),
            Step::Use(set(&["10.0.0.1:1", "10.0.0.2:1"]), 1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_set_follows_the_name_and_survives_failures() {
        let fake = Arc::new(Fake::default());
        fake.set(Ok(vec!["10.0.0.1:80", "10.0.0.2:80"]));
        let d = Discovery::start("m", 80, Arc::new(fake.clone()), cfg(8)).await;
        assert_eq!(*d.current(), set(&["10.0.0.1:80", "10.0.0.2:80"]));
        let (_, mut rx) = d.subscribe();
        // A new address appears at the next resolution.
        fake.set(Ok(vec!["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"]));
        tokio::time::timeout(Duration::from_secs(2), rx.changed())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(d.current().len(), 3);
        // Failures and empty answers keep it.
        fake.set(Err("SERVFAIL"));
        tokio::time::sleep(Duration::from_millis(2500)).await;
        fake.set(Ok(vec![]));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(d.current().len(), 3);
        assert!(!rx.has_changed().unwrap(), "a failure is no change");
        // One vanishes.
        fake.set(Ok(vec!["10.0.0.3:80"]));
        tokio::time::timeout(Duration::from_secs(2), rx.changed())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(*d.current(), set(&["10.0.0.3:80"]));
        // Nothing listens: the task stops resolving.
        drop((d, rx));
        tokio::time::sleep(Duration::from_secs(2)).await;
        let calls = fake.calls.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(fake.calls.load(Ordering::Relaxed), calls);
    }

    #[tokio::test(start_paused = true)]
    async fn a_first_failure_starts_empty_and_fills_later() {
        let fake = Arc::new(Fake::default());
        fake.set(Err("NXDOMAIN"));
        let d = Discovery::start("m", 80, Arc::new(fake.clone()), cfg(8)).await;
        assert!(d.current().is_empty());
        fake.set(Ok(vec!["10.0.0.9:80"]));
        let (_, mut rx) = d.subscribe();
        tokio::time::timeout(Duration::from_secs(2), rx.changed())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(*d.current(), set(&["10.0.0.9:80"]));
        // spawn() resolves in its task, without waiting.
        let s = Discovery::spawn("m", 80, Arc::new(fake.clone()), cfg(8));
        let (_, mut rx) = s.subscribe();
        tokio::time::timeout(Duration::from_secs(2), rx.changed())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(*s.current(), set(&["10.0.0.9:80"]));
    }

    /// Replicas that answer their address; the one at `slow` takes 1.5 s.
    struct Maker {
        slow: SocketAddr,
        made: Arc<Mutex<Vec<SocketAddr>>>,
    }

    #[derive(Clone, Debug)]
    struct Call(tokio::time::Instant);
    impl mesh_stack::HasDeadline for Call {
        fn deadline(&self) -> tokio::time::Instant {
            self.0
        }
    }

    type Svc = tower::util::BoxService<Call, SocketAddr, mesh_stack::StackError>;

    impl ReplicaMaker<Svc> for Maker {
        fn make(&self, a: SocketAddr) -> Option<(ReplicaId, Svc)> {
            self.made.lock().push(a);
            let slow = a == self.slow;
            let svc = tower::service_fn(move |_: Call| async move {
                if slow {
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                }
                Ok::<_, mesh_stack::StackError>(a)
            });
            Some((ReplicaId::from(a.to_string()), Svc::new(svc)))
        }
        fn retire(&self, a: SocketAddr) -> ReplicaId {
            ReplicaId::from(a.to_string())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_follower_adds_and_retires_replicas_without_cutting_calls_in_flight() {
        use tower::ServiceExt;
        let (a, b) = (addr("10.0.0.1:80"), addr("10.0.0.2:80"));
        let fake = Arc::new(Fake::default());
        fake.set(Ok(vec!["10.0.0.1:80"]));
        let d = Discovery::start("m", 80, Arc::new(fake.clone()), cfg(8)).await;
        let made = Arc::new(Mutex::new(Vec::new()));
        let maker = Maker {
            slow: a,
            made: made.clone(),
        };
        let (now, rx) = d.subscribe();
        let initial: Vec<(ReplicaId, Svc)> = now.iter().filter_map(|x| maker.make(*x)).collect();
        let stack_cfg = mesh_stack::StackConfig {
            per_try_timeout: Duration::from_secs(3),
            ..Default::default()
        };
        let (stack, updates) =
            mesh_stack::model_call_stack_with_updates(initial, &stack_cfg).unwrap();
        let task = follow(rx, now, updates, maker);
        let deadline = || Call(tokio::time::Instant::now() + Duration::from_secs(5));

        // A call in flight on `a` (slow, until 1.5 s) ...
        let in_flight = tokio::spawn(stack.clone().oneshot(deadline()));
        tokio::time::sleep(Duration::from_millis(10)).await;
        // ... while the name moves from a to b (the next resolution, at 1 s).
        fake.set(Ok(vec!["10.0.0.2:80"]));
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert_eq!(*made.lock(), vec![a, b]);
        assert!(!in_flight.is_finished());
        assert_eq!(
            in_flight.await.unwrap().unwrap(),
            a,
            "the call sent to a finished"
        );
        // The balancer takes the changes when next asked for a replica.
        for _ in 0..5 {
            assert_eq!(stack.clone().oneshot(deadline()).await.unwrap(), b);
        }
        let ids: Vec<String> = stack
            .breaker_states()
            .iter()
            .map(|(id, _)| id.to_string())
            .collect();
        assert_eq!(ids, vec![b.to_string()], "a left the balancer");
        // Both again: a comes back as a new replica (its breaker starts closed).
        fake.set(Ok(vec!["10.0.0.1:80", "10.0.0.2:80"]));
        tokio::time::sleep(Duration::from_millis(1100)).await;
        stack.clone().oneshot(deadline()).await.unwrap();
        assert_eq!(stack.breaker_states().len(), 2);
        // The stack is dropped: the follower ends.
        drop(stack);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
    }
}
