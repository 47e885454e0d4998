//! `mesh bench`'s command line, and the checks on it that need no connection.
use std::path::PathBuf;

use anyhow::bail;
use clap::{Args, ValueEnum};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Target {
    /// mesh.v1.Decisions/Decide with random card/merchant keys and request features.
    Decide,
    /// inference.GRPCInferenceService/ModelInfer with one random row, shaped as the
    /// model's metadata says (its input's name, datatype and width; integer codes in
    /// the categorical columns its config names).
    Infer,
    /// mesh.v1.FeatureStore/GetOnlineFeatures: `--keys` random entities of `--view`
    /// per call, every feature of the view (int64 keys 1..=--cards; string keys
    /// m000001..=--merchants, as the demo names merchants).
    Lookup,
}

/// How the bench sends each unary call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GrpcClient {
    /// One HEADERS and one DATA frame that ends the stream, as grpc-go, gRPC C++
    /// and h2load send a unary call.
    Lean,
    /// tonic's client (`tonic::client::Grpc`, what its generated clients call),
    /// which ends the stream with a second, empty DATA
    /// frame written on its own (one more write for the client, one more read and
    /// wake-up for the server, and a tonic server's handler waits for it).
    Tonic,
}

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// gRPC address of the mesh.
    #[arg(long, default_value = "http://127.0.0.1:8001")]
    pub addr: String,
    /// For an https:// address: the CA certificate (PEM) that signed the mesh's
    /// certificate. The name checked is the address's host.
    #[arg(long)]
    pub tls_ca: Option<std::path::PathBuf>,
    /// A second server, for an A/B comparison under one load: the open loop sends
    /// each second's requests to one server, alternating (the even seconds of the
    /// run to --addr, the odd ones to this one, counted from the run's start, the
    /// warm-up's likewise), so both see the same rate and the same machine, and
    /// the machine's drift over minutes lands on both alike. The report names the
    /// server of each second (`sent_to` in each window) and gives each server's
    /// median per-second p99. Needs --rate. Same --tls-ca for both.
    #[arg(long, value_name = "ADDR")]
    pub alternate_addr: Option<String>,
    #[arg(long, value_enum, default_value_t = Target::Decide)]
    pub target: Target,
    #[arg(long, default_value = "fraud_mlp")]
    pub model: String,
    /// Open loop at this many requests per second (otherwise closed loop).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Callers in flight (closed loop); the open loop keeps at most 64 times this
    /// many requests outstanding. 1 to 10,000.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// HTTP/2 connections to the mesh, 1 to --concurrency; the callers (closed
    /// loop) or requests (open loop) take them in turn.
    #[arg(long, default_value_t = 1)]
    pub connections: usize,
    /// How each call is sent (see `mesh bench --help`): `lean` measures the server
    /// as grpc-go and h2load drive it; `tonic` as a Rust tonic client does.
    #[arg(long, value_enum, default_value_t = GrpcClient::Lean)]
    pub grpc_client: GrpcClient,
    /// Threads of the load generator's runtime, 1 to 64. One, as h2load and wrk
    /// drive a connection, costs the least: on a machine shared with the server each
    /// more takes CPU from it and adds wake-ups between the threads (2 cores, 15,000
    /// Decide/s: p99 96-106 ms with two, of which the generator's own send lag
    /// 7.5-22 ms; 2.2-4.4 ms with one). One thread runs tokio's current-thread
    /// runtime, more its multi-thread one.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Seconds of load (default 10 unless --requests is given).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Seconds of the same load (same rate or callers, same connections) before
    /// the measured run, not counted: a fresh load generator and a server that
    /// has just changed pace both answer their first second slowly (2 cores,
    /// 14,000 Decide/s: first-second p99 5-250 ms against 1-2 ms after). 0 to 600;
    /// its requests are named `bench-warmup-<n>`.
    #[arg(long, default_value_t = 0.0, value_name = "SECONDS")]
    pub warmup: f64,
    /// Set while the warm-up runs (names its requests).
    #[arg(skip)]
    pub warming_up: bool,
    /// Stop after this many requests (with --seconds too: whichever comes first).
    #[arg(long)]
    pub requests: Option<u64>,
    /// Give every request this deadline (its grpc-timeout), counted from when it was
    /// due (open loop) or sent (closed loop); the report then counts the useful
    /// answers: model answers that arrived within it.
    #[arg(long, value_name = "MS")]
    pub deadline_ms: Option<u64>,
    /// Entity key range for Decide and Lookup (int64 keys, e.g. card_id, 1..=N;
    /// merchants m000001..=--merchants).
    #[arg(long, default_value_t = 10_000)]
    pub cards: i64,
    #[arg(long, default_value_t = 1_000)]
    pub merchants: u64,
    /// Lookup: the feature view read.
    #[arg(long, default_value = "card")]
    pub view: String,
    /// Lookup: entities per call, 1 to 4,096 (the store's default limit).
    #[arg(long, default_value_t = 10)]
    pub keys: usize,
    /// Lookup: ask for each view's event times once (`event_times_per_view`)
    /// instead of in every column.
    #[arg(long)]
    pub event_times_per_view: bool,
    /// Lookup: decode each whole answer, values and event times too, as a client
    /// library does (by default the bench reads each column's statuses and skips the
    /// rest by its length, as redis-benchmark reads an MGET reply's framing).
    #[arg(long)]
    pub decode_values: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also write a self-contained HTML report (summary, latency histogram,
    /// percentiles and throughput per second) to this file.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
}

/// The most `--concurrency`: callers are tasks, and the open loop's outstanding
/// limit (64 times it) is a semaphore's permits.
pub const MAX_CONCURRENCY: usize = 10_000;
/// The most `--threads`.
pub const MAX_THREADS: usize = 64;
/// The most `--keys`: the feature store's default `max_keys_per_lookup`.
pub const MAX_KEYS: usize = 4096;
/// The most `--warmup` seconds.
pub const MAX_WARMUP_SECONDS: f64 = 600.0;

impl BenchArgs {
    /// Refuses arguments out of their range, naming them.
    pub fn check(&self) -> anyhow::Result<()> {
        for (flag, value, max) in [
            ("--concurrency", self.concurrency, MAX_CONCURRENCY),
            ("--threads", self.threads, MAX_THREADS),
            ("--keys", self.keys, MAX_KEYS),
            ("--connections", self.connections, self.concurrency.max(1)),
        ] {
            if !(1..=max).contains(&value) {
                bail!("{flag} {value}: must be 1 to {max}");
            }
        }
        if self.alternate_addr.is_some() && self.rate.is_none() {
            bail!("--alternate-addr needs --rate: it alternates an open loop's seconds between two servers");
        }
        if !(0.0..=MAX_WARMUP_SECONDS).contains(&self.warmup) {
            bail!(
                "--warmup {}: must be 0 to {MAX_WARMUP_SECONDS} seconds",
                self.warmup
            );
        }
        self.load_seconds().map(|_| ())
    }

    /// Seconds the load may last: `--seconds`, else unbounded with `--requests`, else 10.
    pub fn load_seconds(&self) -> anyhow::Result<f64> {
        if self.requests == Some(0) {
            bail!("--requests must be at least 1");
        }
        Ok(match (self.seconds, self.requests) {
            (Some(s), _) if !(s > 0.0 && s.is_finite()) => {
                bail!("--seconds {s}: must be a positive number")
            }
            (Some(s), _) => s,
            (None, Some(_)) => 365.0 * 86_400.0,
            (None, None) => 10.0,
        })
    }

    /// The target as the report names it: `decide`, `infer` or `lookup`.
    pub fn target_name(&self) -> String {
        format!("{:?}", self.target).to_lowercase()
    }

    /// How the load was driven, as the report says it.
    pub fn mode(&self) -> String {
        format!(
            "{}{}{}{}",
            match self.rate {
                Some(r) => format!("open loop at {r} req/s"),
                None => format!("closed loop, {} callers", self.concurrency),
            },
            self.alternate_addr
                .as_ref()
                .map(|b| format!(", each second to {} or {b} in turn", self.addr))
                .unwrap_or_default(),
            self.requests
                .map(|n| format!(", {n} requests"))
                .unwrap_or_default(),
            self.deadline_ms
                .map(|d| format!(", {d} ms deadline"))
                .unwrap_or_default()
        )
    }

    /// `--deadline-ms` as a duration.
    pub fn deadline(&self) -> Option<std::time::Duration> {
        self.deadline_ms.map(std::time::Duration::from_millis)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(super) mod tests {
    use super::*;

    pub fn parse(args: &[&str]) -> BenchArgs {
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            a: BenchArgs,
        }
        use clap::Parser;
        P::parse_from(std::iter::once("bench").chain(args.iter().copied())).a
    }

    #[test]
    fn bench_bounds_by_time_or_count_and_names_bad_values() {
        assert_eq!(parse(&[]).load_seconds().unwrap(), 10.0);
        assert_eq!(parse(&["--seconds", "2.5"]).load_seconds().unwrap(), 2.5);
        assert!(parse(&["--requests", "5"]).load_seconds().unwrap() > 1e6);
        let e = parse(&["--requests", "0"]).load_seconds().unwrap_err();
        assert!(e.to_string().contains("--requests"), "{e}");
        let e = parse(&["--seconds=-1"]).load_seconds().unwrap_err();
        assert!(e.to_string().contains("--seconds -1"), "{e}");
        let e = parse(&["--seconds", "inf"]).load_seconds().unwrap_err();
        assert!(e.to_string().contains("must be a positive number"), "{e}");
        for (flag, max, over) in [
            ("--concurrency", "10000", "10001"),
            ("--threads", "64", "65"),
            ("--keys", "4096", "4097"),
            ("--connections", "8", "9"),
        ] {
            parse(&[flag, max]).check().unwrap();
            for bad in ["0", over] {
                let e = parse(&[flag, bad]).check().unwrap_err();
                let want = format!("{flag} {bad}: must be 1 to {max}");
                assert!(e.to_string().contains(&want), "{e}");
            }
        }
        assert!(parse(&["--requests", "0"]).check().is_err());
        parse(&["--warmup", "600"]).check().unwrap();
        parse(&["--warmup", "0"]).check().unwrap();
        for bad in ["-1", "600.5", "NaN"] {
            let e = parse(&[&format!("--warmup={bad}")]).check().unwrap_err();
            assert!(e.to_string().contains("must be 0 to 600 seconds"), "{e}");
        }
    }

    #[test]
    fn bench_mode_and_target_name_the_run() {
        let a = parse(&["--concurrency", "3"]);
        assert_eq!(
            (a.target_name(), a.mode()),
            ("decide".into(), "closed loop, 3 callers".into())
        );
        let a = parse(&["--target", "infer", "--rate", "500", "--requests", "100"]);
        assert_eq!(a.target_name(), "infer");
        assert_eq!(a.mode(), "open loop at 500 req/s, 100 requests");
        let a = parse(&["--rate", "500", "--deadline-ms", "50"]);
        assert_eq!(a.mode(), "open loop at 500 req/s, 50 ms deadline");
        assert_eq!(a.deadline(), Some(std::time::Duration::from_millis(50)));
    }
}
