//! `mesh bench`: a load generator for a running mesh. Closed loop (a fixed number
//! of callers, each sending as soon as its last answer arrived) or open loop (a
//! fixed rate; latency counts from the intended send time, so queueing in the
//! client or server is not hidden). Drives `Decide`, OIP `ModelInfer` or
//! the feature store's `GetOnlineFeatures`.
//!
//! Modules, each depending only on those before it: [`report`] (what is
//! reported), [`args`] (the command line), `tally` (counting while the load
//! runs), [`html`] (the HTML page, from [`report`] only), `load` (sending the
//! requests); this module runs them in order.
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use parking_lot::Mutex;

pub mod args;
pub mod html;
mod load;
pub mod report;
mod tally;
mod unary;

pub use args::{BenchArgs, GrpcClient, Target};
pub use report::{Bucket, Report, ServerSeconds, Window};

use load::{Clients, ServerStats};
use tally::Tally;

pub async fn run(args: BenchArgs) -> anyhow::Result<Report> {
    // Bad arguments fail before any connection is tried.
    args.check()?;
    let load_s = args.load_seconds()?;
    let mut clients =
        Clients::connect(&args.addr, args.tls_ca.as_deref(), args.grpc_client).await?;
    if args.target == Target::Infer {
        clients.shape = Arc::new(load::InferShape::fetch(&clients, &args.model).await?);
    }
    if args.target == Target::Lookup {
        clients.lookup = Arc::new(load::LookupShape::fetch(&clients, &args.view).await?);
    }
    let max_requests = args.requests.unwrap_or(u64::MAX);
    // `--connections` channels, the callers spread over them.
    let conns = connections(clients.clone(), &args.addr, &args).await?;
    // `--alternate-addr`: as many connections to the other server, with the same
    // shapes (the two are to serve the same model or view).
    let alternate = match &args.alternate_addr {
        None => Vec::new(),
        Some(b) => {
            let mut first = Clients::connect(b, args.tls_ca.as_deref(), args.grpc_client).await?;
            first.shape = clients.shape.clone();
            first.lookup = clients.lookup.clone();
            connections(first, b, &args).await?
        }
    };
    if args.warmup > 0.0 {
        let warmup = Arc::new(BenchArgs {
            warming_up: true,
            ..args.clone()
        });
        let started = Instant::now();
        let tally = Arc::new(Mutex::new(
            Tally::new(started, args.warmup)?.with_deadline(args.deadline()),
        ));
        eprint!("warm-up, {} s, not counted ... ", args.warmup);
        load(
            (&conns, &alternate),
            &warmup,
            &tally,
            (started, args.warmup),
            u64::MAX,
        )
        .await?;
        eprintln!("done");
    }
    // The model's statistics say what one server did: not asked of two.
    let server_before = match args.alternate_addr {
        None => ServerStats::fetch(&clients, &args).await,
        Some(_) => None,
    };
    let started = Instant::now();
    let tally = Arc::new(Mutex::new(
        Tally::new(started, load_s)?.with_deadline(args.deadline()),
    ));
    let args = Arc::new(args);
    let progress = spawn_progress(tally.clone(), started);
    load(
        (&conns, &alternate),
        &args,
        &tally,
        (started, load_s),
        max_requests,
    )
    .await?;
    progress.abort();
    eprintln!();
    let secs = started.elapsed().as_secs_f64();
    let server = match server_before {
        Some(a) => ServerStats::fetch(&clients, &args)
            .await
            .map(|b| b.per_inference_since(&a))
            .unwrap_or_default(),
        None => BTreeMap::new(),
    };
    let mut report = tally
        .lock()
        .report(args.target_name(), args.mode(), secs, server);
    if let Some(b) = &args.alternate_addr {
        for (k, w) in report.windows.iter_mut().enumerate() {
            let to_b = load::to_alternate(k as u64);
            w.sent_to = Some(if to_b { b } else { &args.addr }.clone());
        }
    }
    if let Some(path) = &args.html {
        write_html(path, &report)?;
    }
    Ok(report)
}

/// `first` and `--connections` - 1 more channels like it to `addr`.
async fn connections(first: Clients, addr: &str, args: &BenchArgs) -> anyhow::Result<Vec<Clients>> {
    let mut conns = Vec::with_capacity(args.connections);
    for _ in 1..args.connections {
        conns.push(
            first
                .another(addr, args.tls_ca.as_deref(), args.grpc_client)
                .await?,
        );
    }
    conns.insert(0, first);
    Ok(conns)
}

/// The load of `args` from `started` for `secs` seconds (or `max_requests`), on
/// `conns` (and, alternating by the second, `alternate`).
async fn load(
    (conns, alternate): (&[Clients], &[Clients]),
    args: &Arc<BenchArgs>,
    tally: &Arc<Mutex<Tally>>,
    (started, secs): (Instant, f64),
    max_requests: u64,
) -> anyhow::Result<()> {
    let end = started + Duration::from_secs_f64(secs);
    match args.rate {
        None => load::closed_loop(conns, args, tally, end, max_requests).await,
        Some(rate) => {
            load::open_loop(
                (conns, alternate),
                args,
                tally,
                (started, end),
                rate,
                max_requests,
            )
            .await?
        }
    }
    Ok(())
}

/// Once a second, how far the load is (on stderr, one line rewritten).
fn spawn_progress(tally: Arc<Mutex<Tally>>, started: Instant) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let t = tally.lock();
            eprint!(
                "\r{:>5.1} s  {:>8} requests  p99 {:>7} µs   ",
                started.elapsed().as_secs_f64(),
                t.hist.len(),
                t.hist.value_at_quantile(0.99)
            );
        }
    })
}

/// `--html`: the report page, written to `path`.
fn write_html(path: &Path, report: &Report) -> anyhow::Result<()> {
    std::fs::write(path, html::render(report))
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bench_refuses_bad_arguments_before_connecting() {
        // Nothing listens on port 1: had it tried to connect, the error would say so.
        let a = args::tests::parse(&["--addr", "http://127.0.0.1:1", "--requests", "0"]);
        let e = run(a).await.unwrap_err();
        assert!(
            e.to_string().contains("--requests must be at least 1"),
            "{e:#}"
        );
        let a = args::tests::parse(&["--addr", "http://127.0.0.1:1", "--requests", "1"]);
        let e = run(a).await.unwrap_err();
        assert!(
            e.to_string().contains("connecting to http://127.0.0.1:1"),
            "{e:#}"
        );
    }

    #[test]
    fn bench_html_is_written_where_asked() {
        let d = tempfile::tempdir().unwrap();
        let r = tally::Tally::new(Instant::now(), 1.0).unwrap().report(
            "infer".into(),
            "closed loop, 1 callers".into(),
            1.0,
            BTreeMap::new(),
        );
        let path = d.path().join("r.html");
        write_html(&path, &r).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), html::render(&r));
        let e = write_html(&d.path().join("no/such/dir.html"), &r).unwrap_err();
        assert!(e.to_string().contains("no/such/dir.html"), "{e:#}");
    }
}
