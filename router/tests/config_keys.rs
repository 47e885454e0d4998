//! mesh.toml's keys: the example file is in the current spelling, old
//! spellings still load with a deprecation notice each, and an old and a new
//! spelling that disagree refuse the file, naming both keys.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use mesh_router::config::MeshConfig;

fn example() -> MeshConfig {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/mesh.toml");
    MeshConfig::from_file(&path).unwrap()
}

#[test]
fn the_example_loads_without_deprecations() {
    let c = example();
    assert!(c.deprecations.is_empty(), "{:?}", c.deprecations);
    c.decisions.validate().unwrap();
    assert_eq!(c.decisions.deadline(), Duration::from_millis(50));
    assert_eq!(c.decisions.stack.per_try_timeout, Duration::from_millis(20));
    let log = c.prediction_log.unwrap();
    assert_eq!(log.flush_interval, Duration::from_millis(200));
}

#[test]
fn defaults_without_a_file() {
    let c = MeshConfig::from_toml("").unwrap();
    assert!(c.deprecations.is_empty());
    assert_eq!(c.decisions.deadline(), Duration::from_millis(50));
    assert_eq!(c.server.max_timeout(), Duration::from_secs(30));
    assert!(c.prediction_log.is_none());
    let c = MeshConfig::from_toml("[prediction_log]\ndir = \"x\"\n").unwrap();
    assert_eq!(
        c.prediction_log.unwrap().flush_interval,
        Duration::from_millis(200)
    );
}

#[test]
fn every_duration_takes_a_unit() {
    let c = MeshConfig::from_toml(
        r#"
        [server]
        max_timeout = "2s"
        [prediction_log]
        dir = "x"
        flush_interval = "50ms"
        [decisions]
        deadline = "1500us"
        [decisions.stack]
        per_try_timeout = "250us"
        load_default_rtt = "1ms"
        load_decay = "1m"
        [decisions.stack.retry_budget]
        ttl = "5s"
        [decisions.stack.breaker]
        backoff = "0.5s"
        max_backoff = "1m"
        "#,
    )
    .unwrap();
    assert!(c.deprecations.is_empty(), "{:?}", c.deprecations);
    assert_eq!(c.server.max_timeout(), Duration::from_secs(2));
    assert_eq!(
        c.prediction_log.unwrap().flush_interval,
        Duration::from_millis(50)
    );
    assert_eq!(c.decisions.deadline(), Duration::from_micros(1500));
    let s = &c.decisions.stack;
    assert_eq!(s.per_try_timeout, Duration::from_micros(250));
    assert_eq!(s.load_default_rtt, Duration::from_millis(1));
    assert_eq!(s.load_decay, Duration::from_secs(60));
    assert_eq!(s.retry_budget.ttl, Duration::from_secs(5));
    assert_eq!(s.breaker.backoff, Duration::from_millis(500));
    assert_eq!(s.breaker.max_backoff, Duration::from_secs(60));

    // The new keys have no unitless spelling.
    for (text, key) in [
        ("[decisions]\ndeadline = 50\n", "deadline"),
        ("[server]\nmax_timeout = 30000\n", "max_timeout"),
        (
            "[prediction_log]\ndir = \"x\"\nflush_interval = 200\n",
            "flush_interval",
        ),
    ] {
        let err = MeshConfig::from_toml(text).unwrap_err();
        assert!(err.contains(key) && err.contains("unit"), "{err}");
    }
    let err = MeshConfig::from_toml("[decisions]\ndeadline = \"50 parsecs\"\n").unwrap_err();
    assert!(err.contains("parsecs"), "{err}");
    let err = MeshConfig::from_toml("[decisions]\ndeadline = \"0ms\"\n")
        .unwrap()
        .decisions
        .validate()
        .unwrap_err();
    assert!(err.contains("deadline"), "{err}");
}

#[test]
fn old_spellings_load_with_a_notice_each() {
    let c = MeshConfig::from_toml(
        r#"
        [server]
        max_timeout_ms = 2000
        [prediction_log]
        dir = "x"
        flush_interval_ms = 50
        [decisions]
        deadline_ms = 40
        [decisions.stack]
        deadline = "40ms"
        per_try_timeout = 20
        [decisions.stack.breaker]
        backoff = 250
        "#,
    )
    .unwrap();
    assert_eq!(c.server.max_timeout(), Duration::from_secs(2));
    assert_eq!(
        c.prediction_log.as_ref().unwrap().flush_interval,
        Duration::from_millis(50)
    );
    assert_eq!(c.decisions.deadline(), Duration::from_millis(40));
    assert_eq!(c.decisions.stack.per_try_timeout, Duration::from_millis(20));
    assert_eq!(
        c.decisions.stack.breaker.backoff,
        Duration::from_millis(250)
    );
    let want = [
        "[server] max_timeout_ms is deprecated; write [server] max_timeout = \"2s\"",
        "[prediction_log] flush_interval_ms is deprecated; write [prediction_log] flush_interval = \"50ms\"",
        "[decisions] deadline_ms is deprecated; write [decisions] deadline = \"40ms\"",
        "[decisions.stack] deadline is deprecated; write [decisions] deadline = \"40ms\"",
        "[decisions.stack] per_try_timeout = 20 (bare milliseconds) is deprecated; write per_try_timeout = \"20ms\"",
        "[decisions.stack] breaker.backoff = 250 (bare milliseconds) is deprecated; write breaker.backoff = \"250ms\"",
    ];
    for w in want {
        assert!(
            c.deprecations.iter().any(|d| d == w),
            "missing {w:?} in {:#?}",
            c.deprecations
        );
    }
    assert_eq!(c.deprecations.len(), want.len(), "{:#?}", c.deprecations);
}

#[test]
fn the_stack_deadline_alone_is_the_decision_deadline() {
    // It used to be accepted and ignored; now it is read as [decisions] deadline.
    let c = MeshConfig::from_toml("[decisions.stack]\ndeadline = \"80ms\"\n").unwrap();
    assert_eq!(c.decisions.deadline(), Duration::from_millis(80));
    assert_eq!(c.deprecations.len(), 1);
    // It also took bare milliseconds.
    let c = MeshConfig::from_toml("[decisions.stack]\ndeadline = 80\n").unwrap();
    assert_eq!(c.decisions.deadline(), Duration::from_millis(80));
    assert_eq!(
        c.deprecations,
        ["[decisions.stack] deadline is deprecated; write [decisions] deadline = \"80ms\""]
    );
    // An old and the new spelling that agree: read, with a notice to drop the old.
    let c = MeshConfig::from_toml("[decisions]\ndeadline = \"50ms\"\ndeadline_ms = 50\n").unwrap();
    assert_eq!(c.decisions.deadline(), Duration::from_millis(50));
    assert!(
        c.deprecations[0].contains("remove [decisions] deadline_ms"),
        "{:?}",
        c.deprecations
    );
}

#[test]
fn disagreeing_spellings_are_refused_naming_both() {
    for (text, a, b) in [
        (
            "[decisions]\ndeadline = \"50ms\"\ndeadline_ms = 80\n",
            "[decisions] deadline (50ms)",
            "[decisions] deadline_ms (80ms)",
        ),
        (
            "[decisions]\ndeadline = \"50ms\"\n[decisions.stack]\ndeadline = \"80ms\"\n",
            "[decisions] deadline (50ms)",
            "[decisions.stack] deadline (80ms)",
        ),
        (
            "[decisions]\ndeadline_ms = 50\n[decisions.stack]\ndeadline = \"80ms\"\n",
            "[decisions] deadline_ms (50ms)",
            "[decisions.stack] deadline (80ms)",
        ),
        (
            "[server]\nmax_timeout = \"1s\"\nmax_timeout_ms = 30000\n",
            "[server] max_timeout (1s)",
            "[server] max_timeout_ms (30s)",
        ),
        (
            "[prediction_log]\ndir = \"x\"\nflush_interval = \"1s\"\nflush_interval_ms = 200\n",
            "[prediction_log] flush_interval (1s)",
            "[prediction_log] flush_interval_ms (200ms)",
        ),
    ] {
        let err = MeshConfig::from_toml(text).unwrap_err();
        assert!(err.contains(a) && err.contains(b), "{text}\n=> {err}");
    }
}

#[test]
fn typos_in_the_stack_table_are_still_named() {
    let err = MeshConfig::from_toml("[decisions.stack]\nper_try_timout = \"20ms\"\n").unwrap_err();
    assert!(err.contains("per_try_timout"), "{err}");
    let err = MeshConfig::from_toml("[decisions.stack.breaker]\nbackof = \"1s\"\n").unwrap_err();
    assert!(err.contains("backof"), "{err}");
}

#[test]
fn from_file_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mesh.toml");
    std::fs::write(&path, "[decisions]\ndeadline = 50\n").unwrap();
    let err = MeshConfig::from_file(&path).unwrap_err();
    assert!(
        err.contains("mesh.toml") && err.contains("deadline"),
        "{err}"
    );
}

/// The password comes from a file, read at start (the config parses where the file is
/// not there); its errors name the file and never show the password.
#[test]
fn the_redis_password_comes_from_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("redis-password");
    let text = format!(
        "[features]\nbackend = \"redis\"\nredis_url = \"redis://127.0.0.1:6379\"\nviews = \"v.toml\"\nredis_password_file = {:?}\n",
        file.display().to_string()
    );
    let c = MeshConfig::from_toml(&text).unwrap();
    let e = c.features.read_redis_password().unwrap_err();
    assert!(
        e.contains("redis_password_file") && e.contains("redis-password"),
        "{e}"
    );
    std::fs::write(&file, "hunter2-but-longer\n").unwrap();
    let p = c.features.read_redis_password().unwrap().unwrap();
    assert_eq!(
        p,
        mesh_feature_store::RedisPassword::from_file_contents("hunter2-but-longer").unwrap()
    );
    assert!(!format!("{p:?}").contains("hunter2"));
    std::fs::write(&file, "two\nlines\n").unwrap();
    let e = c.features.read_redis_password().unwrap_err();
    assert!(
        e.contains("control character") && !e.contains("lines"),
        "{e}"
    );
    std::fs::write(&file, vec![b'x'; 10_000]).unwrap();
    let e = c.features.read_redis_password().unwrap_err();
    assert!(e.contains("more than"), "{e}");
    // Only with the Redis backend.
    let e = MeshConfig::from_toml("[features]\npath = \"db\"\nredis_password_file = \"p\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("backend is \"sled\""), "{e}");
}

#[test]
fn the_redis_backend_keys_parse_and_refuse_what_cannot_work() {
    let c = MeshConfig::from_toml(
        "[features]\nbackend = \"redis\"\nredis_cluster = [\"redis://127.0.0.1:7000\", \"redis://127.0.0.1:7001\"]\nviews = \"v.toml\"\nlookup_budget = \"15ms\"\ncache_max_bytes = 0\ncache_max_age = \"250ms\"\n",
    )
    .unwrap();
    let r = c.features.redis_options().unwrap().unwrap();
    assert_eq!(r.lookup_budget, Duration::from_millis(15));
    assert_eq!(r.cache_max_bytes, 0);
    assert_eq!(r.cache_max_age, Duration::from_millis(250));
    assert_eq!(
        r.target,
        mesh_feature_store::RedisTarget::Cluster(vec![
            "redis://127.0.0.1:7000".into(),
            "redis://127.0.0.1:7001".into()
        ])
    );
    assert!(c.features.configured());
    assert_eq!(r.password, None);
    assert_eq!(c.features.read_redis_password(), Ok(None));
    // sled stays the default, and has no Redis options.
    let c = MeshConfig::from_toml("[features]\npath = \"db\"\nviews = \"v.toml\"\n").unwrap();
    assert!(c.features.redis_options().unwrap().is_none());
    assert_eq!(
        c.features.store_options().row_cache_max_bytes,
        mesh_feature_store::DEFAULT_ROW_CACHE_MAX_BYTES
    );
    // cache_max_bytes is the sled row cache's bound too; cache_max_age is Redis's.
    let c = MeshConfig::from_toml(
        "[features]\npath = \"db\"\nviews = \"v.toml\"\ncache_max_bytes = 1048576\n",
    )
    .unwrap();
    assert!(c.features.redis_options().unwrap().is_none());
    assert_eq!(c.features.store_options().row_cache_max_bytes, 1 << 20);
    let e = MeshConfig::from_toml("[features]\npath = \"db\"\ncache_max_age = \"1s\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cache_max_age") && e.contains("backend is \"sled\""),
        "{e}"
    );

    for (text, says) in [
        ("[features]\npath = \"db\"\nredis_url = \"redis://h:1\"\n", "backend is \"sled\""),
        ("[features]\nbackend = \"redis\"\n", "needs redis_url"),
        (
            "[features]\nbackend = \"redis\"\nredis_url = \"redis://h:1\"\nredis_cluster = [\"redis://h:2\"]\n",
            "both redis_url and redis_cluster",
        ),
        (
            "[features]\nbackend = \"redis\"\nredis_url = \"redis://h:1\"\npath = \"db\"\n",
            "remove it",
        ),
        (
            "[features]\nbackend = \"redis\"\nredis_url = \"redis://h:1\"\nlookup_budget = \"50ms\"\n",
            "must be below [decisions] deadline",
        ),
        (
            "[features]\nbackend = \"redis\"\nredis_url = \"redis://h:1\"\nredis_key_prefix = \"a b\"\n",
            "redis_key_prefix",
        ),
        ("[features]\nbackend = \"memcached\"\n", "memcached"),
        (
            "[features]\nbackend = \"redis\"\nredis_url = \"redis://h:1\"\nremote = \"http://h:2\"\n",
            "not both",
        ),
    ] {
        let e = MeshConfig::from_toml(text).unwrap_err().to_string();
        assert!(e.contains(says), "{text}: {e}");
    }
}

#[test]
fn worker_threads_default_to_one_per_core_and_are_bounded() {
    assert_eq!(MeshConfig::from_toml("").unwrap().server.worker_threads, 0);
    let c = MeshConfig::from_toml("[server]\nworker_threads = 1\n").unwrap();
    assert_eq!(c.server.worker_threads, 1);
    let max = mesh_router::config::MAX_WORKER_THREADS;
    MeshConfig::from_toml(&format!("[server]\nworker_threads = {max}\n")).unwrap();
    let e =
        MeshConfig::from_toml(&format!("[server]\nworker_threads = {}\n", max + 1)).unwrap_err();
    assert!(
        e.contains("[server] worker_threads = 1025: must be 0 (one per CPU core) to 1024"),
        "{e}"
    );
}
