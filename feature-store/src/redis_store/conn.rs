//! Connections and batched round trips: one server through a reconnecting
//! `ConnectionManager`, a cluster through the `redis` crate's async cluster
//! client. A batch of per-key commands goes out as one pipeline to a single
//! server, and as one pipeline per master to a cluster (keys grouped by the slot
//! map this module keeps), all masters at once; each pipeline ends by the
//! caller's deadline, so one slow or dead master costs only its own keys.
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, Pipeline, Value};

/// Slots in a Redis Cluster.
const SLOTS: usize = 16384;
/// The slot map is re-read at most this often (after a failed or redirected batch).
const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// Why one key's command has no answer.
#[derive(Debug, Clone)]
pub(crate) enum Failure {
    /// Its pipeline did not answer by the deadline.
    Timeout,
    /// Its pipeline failed, or the server answered this command with an error.
    Error(Arc<str>),
}

impl Failure {
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Failure::Timeout => "timeout",
            Failure::Error(_) => "error",
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Timeout => f.write_str("no answer within the budget"),
            Failure::Error(e) => f.write_str(e),
        }
    }
}

/// Which master serves each slot (cluster only), from `CLUSTER SLOTS`.
struct SlotMap {
    /// Index into `nodes` per slot; `u16::MAX` where no master was listed.
    owner: Vec<u16>,
    /// `(host, port)` of each master.
    nodes: Vec<(String, u16)>,
}

pub(crate) struct ClusterState {
    conn: ClusterConnection,
    map: Mutex<Arc<SlotMap>>,
    last_refresh: Mutex<Option<Instant>>,
}

#[derive(Clone)]
pub(crate) enum Conn {
    Single(redis::aio::ConnectionManager),
    Cluster(Arc<ClusterState>),
}

impl Conn {
    pub(crate) async fn cluster(conn: ClusterConnection) -> redis::RedisResult<Self> {
        let map = read_slot_map(&conn).await?;
        Ok(Conn::Cluster(Arc::new(ClusterState {
            conn,
            map: Mutex::new(Arc::new(map)),
            last_refresh: Mutex::new(Some(Instant::now())),
        })))
    }

    /// Runs one command (routed by its key on a cluster).
    pub(crate) async fn query(&self, cmd: &Cmd) -> redis::RedisResult<Value> {
        match self {
            Conn::Single(c) => c.clone().req_packed_command(cmd).await,
            Conn::Cluster(s) => s.conn.clone().req_packed_command(cmd).await,
        }
    }

    /// Sends `cmds[i]` (each about `keys[i]`) as pipelines, preceded on every
    /// connection by `prelude` (whose answer is dropped), and returns each command's
    /// answer in order. Every pipeline ends by `deadline`.
    pub(crate) async fn batch(
        &self,
        keys: &[Vec<u8>],
        cmds: Vec<Cmd>,
        prelude: Option<&Cmd>,
        deadline: tokio::time::Instant,
    ) -> Vec<Result<Value, Failure>> {
        match self {
            Conn::Single(c) => {
                let mut conn = c.clone();
                let idx: Vec<usize> = (0..cmds.len()).collect();
                send_group(&idx, &cmds, prelude, deadline, |p, off, n| async move {
                    conn.req_packed_commands(&p, off, n).await
                })
                .await
                .into_iter()
                .map(|(_, r)| r)
                .collect()
            }
            Conn::Cluster(s) => s.batch(keys, cmds, prelude, deadline).await,
        }
    }

    /// The masters of a cluster (`host`, `port`); empty for a single server.
    pub(crate) fn masters(&self) -> Vec<(String, u16)> {
        match self {
            Conn::Single(_) => Vec::new(),
            Conn::Cluster(s) => s.map.lock().nodes.clone(),
        }
    }

    /// Runs `cmd` on one master of a cluster (SCAN).
    pub(crate) async fn query_node(
        &self,
        host: &str,
        port: u16,
        cmd: Cmd,
    ) -> redis::RedisResult<Value> {
        match self {
            Conn::Single(c) => c.clone().req_packed_command(&cmd).await,
            Conn::Cluster(s) => {
                s.conn
                    .clone()
                    .route_command(
                        cmd,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                            host: host.to_owned(),
                            port,
                        }),
                    )
                    .await
            }
        }
    }
}

impl ClusterState {
    async fn batch(
        self: &Arc<Self>,
        keys: &[Vec<u8>],
        cmds: Vec<Cmd>,
        prelude: Option<&Cmd>,
        deadline: tokio::time::Instant,
    ) -> Vec<Result<Value, Failure>> {
        let map = self.map.lock().clone();
        // Group by master; keys of a slot no master was listed for go alone, by slot.
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
        let mut group_of: std::collections::HashMap<u32, usize> = Default::default();
        for (i, k) in keys.iter().enumerate() {
            let slot_no = key_slot(k);
            let owner = map.owner[slot_no as usize];
            let gk = if owner == u16::MAX {
                (1 << 16) | u32::from(slot_no)
            } else {
                u32::from(owner)
            };
            let g = *group_of.entry(gk).or_insert_with(|| {
                groups.push((slot_no, Vec::new()));
                groups.len() - 1
            });
            groups[g].1.push(i);
        }
        let cmds = &cmds;
        let sends = groups.iter().map(|(slot, idx)| {
            let mut conn = self.conn.clone();
            let route = SingleNodeRoutingInfo::SpecificNode(Route::new(*slot, SlotAddr::Master));
            send_group(idx, cmds, prelude, deadline, move |p, off, n| async move {
                conn.route_pipeline(p, off, n, route).await
            })
        });
        let parts = futures::future::join_all(sends).await;
        let mut out: Vec<Result<Value, Failure>> =
            (0..keys.len()).map(|_| Err(Failure::Timeout)).collect();
        let mut refresh = false;
        for part in parts {
            for (i, r) in part {
                if let Err(Failure::Error(e)) = &r {
                    refresh |= moved(e);
                }
                if matches!(r, Err(Failure::Timeout)) {
                    refresh = true;
                }
                out[i] = r;
            }
        }
        if refresh {
            self.refresh_soon();
        }
        out
    }

    /// Re-reads the slot map in the background, at most every [`REFRESH_EVERY`].
    fn refresh_soon(self: &Arc<Self>) {
        {
            let mut last = self.last_refresh.lock();
            if last.is_some_and(|t| t.elapsed() < REFRESH_EVERY) {
                return;
            }
            *last = Some(Instant::now());
        }
        let me = self.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(Duration::from_secs(5), read_slot_map(&me.conn)).await {
                Ok(Ok(map)) => *me.map.lock() = Arc::new(map),
                Ok(Err(e)) => tracing::warn!(error = %e, "re-reading the redis cluster slot map"),
                Err(_) => tracing::warn!("re-reading the redis cluster slot map timed out"),
            }
        });
    }
}

/// The cluster slot of `key`: CRC16 (XMODEM) of its hash tag (the text between
/// the first `{` and the next `}`, when not empty) or of the whole key, mod 16384.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16_xmodem(tagged.unwrap_or(key)) % SLOTS as u16
}

fn crc16_xmodem(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

fn moved(e: &str) -> bool {
    [
        "MOVED",
        "ASK",
        "CLUSTERDOWN",
        "TRYAGAIN",
        "connection",
        "Connection",
    ]
    .iter()
    .any(|w| e.contains(w))
}

/// Sends the commands `idx` of `cmds` as one pipeline through `send(pipeline,
/// offset, count)`, ending by `deadline`; pairs each index with its answer.
async fn send_group<F, Fut>(
    idx: &[usize],
    cmds: &[Cmd],
    prelude: Option<&Cmd>,
    deadline: tokio::time::Instant,
    send: F,
) -> Vec<(usize, Result<Value, Failure>)>
where
    F: FnOnce(Pipeline, usize, usize) -> Fut,
    Fut: std::future::Future<Output = redis::RedisResult<Vec<Value>>>,
{
    let mut pipe = redis::pipe();
    let offset = usize::from(prelude.is_some());
    if let Some(p) = prelude {
        pipe.add_command(p.clone());
    }
    for &i in idx {
        pipe.add_command(cmds[i].clone());
    }
    let fail_all = |f: Failure| idx.iter().map(|&i| (i, Err(f.clone()))).collect();
    match tokio::time::timeout_at(deadline, send(pipe, offset, idx.len())).await {
        Err(_) => fail_all(Failure::Timeout),
        Ok(Err(e)) => fail_all(Failure::Error(e.to_string().into())),
        Ok(Ok(values)) if values.len() != idx.len() => fail_all(Failure::Error(
            format!("{} answers to {} commands", values.len(), idx.len()).into(),
        )),
        Ok(Ok(values)) => idx
            .iter()
            .zip(values)
            .map(|(&i, v)| match v {
                Value::ServerError(e) => (i, Err(Failure::Error(format!("{e:?}").into()))),
                v => (i, Ok(v)),
            })
            .collect(),
    }
}

/// `CLUSTER SLOTS` from any reachable master.
async fn read_slot_map(conn: &ClusterConnection) -> redis::RedisResult<SlotMap> {
    let mut last_err = None;
    for _ in 0..3 {
        let r = conn
            .clone()
            .route_command(
                redis::cmd("CLUSTER").arg("SLOTS").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await;
        match r {
            Ok(v) => return parse_slots(&v),
            Err(e) => last_err = Some(e),
        }
    }
    Err(last_err.unwrap_or_else(|| {
        redis::RedisError::from((redis::ErrorKind::Io, "CLUSTER SLOTS had no answer"))
    }))
}

fn parse_slots(v: &Value) -> redis::RedisResult<SlotMap> {
    let bad =
        || redis::RedisError::from((redis::ErrorKind::Parse, "unexpected CLUSTER SLOTS answer"));
    let mut map = SlotMap {
        owner: vec![u16::MAX; SLOTS],
        nodes: Vec::new(),
    };
    let Value::Array(ranges) = v else {
        return Err(bad());
    };
    for r in ranges {
        let Value::Array(parts) = r else {
            return Err(bad());
        };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
            (parts.first(), parts.get(1), parts.get(2))
        else {
            return Err(bad());
        };
        let host = match master.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => return Err(bad()),
        };
        let Some(Value::Int(port)) = master.get(1) else {
            return Err(bad());
        };
        let node = (host, u16::try_from(*port).map_err(|_| bad())?);
        let idx = match map.nodes.iter().position(|n| *n == node) {
            Some(i) => i,
            None => {
                map.nodes.push(node);
                map.nodes.len() - 1
            }
        };
        let (start, end) = (
            usize::try_from(*start).map_err(|_| bad())?,
            usize::try_from(*end).map_err(|_| bad())?,
        );
        if start > end || end >= SLOTS {
            return Err(bad());
        }
        for s in &mut map.owner[start..=end] {
            *s = idx as u16;
        }
    }
    Ok(map)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_hash_tag() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"mesh:1:{foo}"), 12182);
        assert_eq!(key_slot(b"x{}y"), key_slot(b"x{}y"));
        assert_ne!(key_slot(b"x{}y"), crc16_xmodem(b"") % 16384);
    }
}
