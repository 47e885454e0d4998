//! A lookup on the Redis backend: the cache first, then one batched round trip
//! for what it lacks (one pipeline, or one per master of a cluster), ending by the
//! lookup budget. An entity row Redis did not answer in time is served from the
//! cache, whatever the cached row's age, with every value `OutsideMaxAge` (never a
//! live value: the decision treats it as stale), or `Unavailable` when nothing is
//! cached. The response's `degraded` says which rows and why, and the metrics
//! count them; a lookup never fails for a slow or dead Redis.
use std::sync::Arc;
use std::time::Instant;

use crate::cache::{DecodedRow, Hit};
use crate::encoding;
use crate::error::{FeatureStoreError, Result};
use crate::lookup::{
    copy_duplicates, empty_columns, fill_decoded, mark_unavailable, Degraded, LookupRequest,
    LookupResponse, Plan,
};
use crate::metrics as m;
use crate::registry::ViewInfo;
use crate::store::Inner;
use crate::types::Micros;

use super::keys::entity_key;
use super::{Failure, RedisStore};

/// One entity row the cache did not answer.
struct Miss {
    group: usize,
    row: usize,
    epoch: u64,
}

fn decode(v: &ViewInfo, bytes: &[u8]) -> Result<DecodedRow> {
    let mut fields = Vec::with_capacity(v.features.len());
    let event_time = encoding::decode_value(bytes, |id, f| fields.push((id, f.to_value())))
        .map_err(|what| FeatureStoreError::Decode {
            view: v.name.clone(),
            what,
        })?;
    Ok(DecodedRow { event_time, fields })
}

pub(crate) async fn lookup(
    inner: &Inner,
    r: &RedisStore,
    req: &LookupRequest,
    plan: &Plan,
    now: Micros,
) -> Result<LookupResponse> {
    let started = Instant::now();
    let deadline = started + r.core.opts.lookup_budget;
    let prefix = &r.core.opts.key_prefix;
    let n = plan.rows;
    let mut cols = empty_columns(plan, n);
    let mut keys: Vec<Vec<u8>> = Vec::new();
    let mut misses: Vec<Miss> = Vec::new();
    let mut hits = 0u64;
    // Every key first, then the cache's answers for all of them at once (each
    // shard locked once: see `Cache::get_many`).
    let mut all: Vec<(usize, usize, Vec<u8>)> = Vec::with_capacity(n * plan.groups.len());
    for (gi, g) in plan.groups.iter().enumerate() {
        let v = &inner.views[g.view];
        let col = &req.entities[g.key_column].1;
        for i in 0..n {
            let mut k = Vec::with_capacity(24);
            entity_key(prefix, v.id, col.key_ref(i), &mut k);
            all.push((gi, i, k));
        }
    }
    let refs: Vec<&[u8]> = all.iter().map(|(_, _, k)| &k[..]).collect();
    let mut failed = None;
    let mut missed = Vec::new();
    r.cache.get_many(&refs, started, |j, hit, epoch| {
        let (gi, i, _) = &all[j];
        match hit {
            Some(Hit::Fresh(cached)) => {
                hits += 1;
                if let Some(row) = cached {
                    let g = &plan.groups[*gi];
                    let v = &inner.views[g.view];
                    if let Err(e) = fill_decoded(v, g, &mut cols, *i, row, now, false) {
                        failed.get_or_insert(e);
                    }
                }
            }
            // An old entry answers only when Redis fails: ask Redis.
            _ => missed.push((j, epoch)),
        }
    });
    if let Some(e) = failed {
        return Err(e);
    }
    for (j, epoch) in missed {
        let (group, row, key) = &mut all[j];
        misses.push(Miss {
            group: *group,
            row: *row,
            epoch,
        });
        keys.push(std::mem::take(key));
    }
    m::record_cache(hits, misses.len() as u64);

    let mut degraded_rows = vec![false; n];
    let mut first_failure: Option<Failure> = None;
    let mut from_cache = vec![0u64; plan.groups.len()];
    let mut unavailable = vec![0u64; plan.groups.len()];
    if !keys.is_empty() {
        let answers = r.fetch(keys.clone(), deadline).await;
        let filled = Instant::now();
        for ((miss, key), answer) in misses.iter().zip(&keys).zip(answers) {
            let g = &plan.groups[miss.group];
            let v = &inner.views[g.view];
            match answer {
                Ok(Some(bytes)) => {
                    let row = Arc::new(decode(v, &bytes)?);
                    fill_decoded(v, g, &mut cols, miss.row, &row, now, false)?;
                    r.cache.insert(key, Some(row), miss.epoch, filled);
                }
                Ok(None) => r.cache.insert(key, None, miss.epoch, filled),
                Err(f) => {
                    degraded_rows[miss.row] = true;
                    match r.cache.get(key, filled) {
                        Some(Hit::Fresh(Some(row)) | Hit::Old(Some(row))) => {
                            fill_decoded(v, g, &mut cols, miss.row, &row, now, true)?;
                            from_cache[miss.group] += 1;
                        }
                        _ => {
                            mark_unavailable(g, &mut cols, miss.row);
                            unavailable[miss.group] += 1;
                        }
                    }
                    first_failure.get_or_insert(f);
                }
            }
        }
    }
    for g in &plan.groups {
        copy_duplicates(plan, g, &mut cols);
    }
    let degraded = first_failure.map(|f| {
        m::record_backend_failure("lookup", f.reason());
        for (gi, g) in plan.groups.iter().enumerate() {
            let view = &inner.views[g.view].name;
            m::record_fallback_rows(view, "cache", from_cache[gi]);
            m::record_fallback_rows(view, "unavailable", unavailable[gi]);
        }
        let cached: u64 = from_cache.iter().sum();
        let none: u64 = unavailable.iter().sum();
        let reason = format!(
            "redis: {f} (lookup_budget {:?}); {cached} entity row{} served from the cache as \
             OUTSIDE_MAX_AGE, {none} unavailable",
            r.core.opts.lookup_budget,
            if cached == 1 { "" } else { "s" },
        );
        tracing::debug!(%reason, "feature lookup degraded");
        Degraded {
            reason,
            rows: degraded_rows,
        }
    });
    m::record_cache_bytes(r.cache.bytes());
    Ok(LookupResponse {
        rows: n,
        columns: cols,
        degraded,
    })
}
