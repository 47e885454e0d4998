//! Real `redis-server` processes for tests (Debian's `redis-server` and
//! `redis-tools`; `scripts/test` installs them): one server, or a 3-master Redis
//! Cluster made with `redis-cli --cluster create`, each on a free loopback port
//! with its own temp dir, no persistence, killed when dropped. Shared by the
//! feature-store and router tests (`#[path]`-included).
#![allow(dead_code)]
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One `redis-server` on 127.0.0.1.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Sends one inline command and reads what comes back within a short wait.
pub fn command(port: u16, line: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    s.write_all(format!("{line}\r\n").as_bytes()).ok()?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut out = String::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(500) {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                out.push_str(&String::from_utf8_lossy(&buf[..n]));
                if out.ends_with("\r\n") {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    Some(out)
}

impl RedisServer {
    /// A plain server.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A server with extra `--key value` arguments.
    pub fn start_with(extra: &[&str]) -> Self {
        let bin = which("redis-server");
        for _ in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let port = free_port();
            let log = std::fs::File::create(dir.path().join("redis.log")).unwrap();
            let mut cmd = Command::new(&bin);
            cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .args(["--dir", dir.path().to_str().unwrap()])
                .args(["--protected-mode", "no"])
                .args(extra)
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .stdin(Stdio::null());
            let child = cmd.spawn().expect("spawn redis-server");
            let mut server = RedisServer {
                port,
                child: Some(child),
                _dir: dir,
            };
            if server.wait_ready(Duration::from_secs(10)) {
                return server;
            }
            server.kill();
        }
        panic!("redis-server did not start on a free port in 5 tries");
    }

    fn wait_ready(&mut self, within: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < within {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                return false; // exited (port taken?)
            }
            // A server with requirepass answers NOAUTH: it is up all the same.
            if command(self.port, "PING")
                .is_some_and(|r| r.starts_with("+PONG") || r.starts_with("-NOAUTH"))
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn dir(&self) -> &Path {
        self._dir.path()
    }

    /// SIGKILL: the process is gone at once, as in a crash.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGSTOP / SIGCONT: the process holds its connections but answers nothing.
    pub fn pause(&self, stopped: bool) {
        if let Some(c) = &self.child {
            let sig = if stopped { "-STOP" } else { "-CONT" };
            let _ = Command::new("kill")
                .args([sig, &c.id().to_string()])
                .status();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.pause(false);
        self.kill();
    }
}

fn which(bin: &str) -> String {
    for dir in ["/usr/bin", "/usr/local/bin", "/usr/sbin"] {
        let p = format!("{dir}/{bin}");
        if Path::new(&p).exists() {
            return p;
        }
    }
    panic!("{bin} is not installed (apt-get install redis-server redis-tools; scripts/test does)");
}

/// A Redis Cluster of three masters and no replicas, made by
/// `redis-cli --cluster create`. `cluster-require-full-coverage no`: with a
/// master down, the others keep answering for their slots.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> Self {
        let extra = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "1000",
            "--cluster-require-full-coverage",
            "no",
        ];
        let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start_with(&extra)).collect();
        let mut args: Vec<String> = vec!["--cluster".into(), "create".into()];
        args.extend(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"].map(String::from));
        let out = Command::new(which("redis-cli"))
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = RedisCluster { nodes };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(20) {
            if cluster.nodes.iter().all(|n| {
                command(n.port, "CLUSTER INFO").is_some_and(|r| r.contains("cluster_state:ok"))
            }) {
                return cluster;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the redis cluster did not reach cluster_state:ok in 20 s");
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }
}
