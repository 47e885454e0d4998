//! The Redis key layout.
//!
//! One hash per (view, entity): `<prefix>:<view id>:{<entity>}`, where `<entity>`
//! is `i<decimal>` for an int64 key and `s<utf-8 bytes>` for a string key. The
//! braces are Redis Cluster's hash tag: the slot follows the entity alone, so one
//! entity's hashes of every view sit on one shard and a lookup never crosses
//! shards for one entity. Fields: `t`, the event time as 16 hex digits of the
//! sign-flipped value (string order is time order, exactly, so the write script
//! compares strings), and `v`, the row in the store's value encoding (the same
//! bytes sled holds; see `encoding.rs`). The registry is one key,
//! `<prefix>:registry` (JSON).
use crate::types::{EntityKey, Micros};

/// The hash field of the encoded row.
pub(crate) const FIELD_VALUE: &str = "v";

/// A borrowed entity key.
#[derive(Debug, Clone, Copy)]
pub(crate) enum KeyRef<'a> {
    Int(i64),
    Str(&'a str),
}

impl<'a> From<&'a EntityKey> for KeyRef<'a> {
    fn from(k: &'a EntityKey) -> Self {
        match k {
            EntityKey::Int64(v) => KeyRef::Int(*v),
            EntityKey::String(s) => KeyRef::Str(s),
        }
    }
}

/// Writes the key of `key`'s hash in view `view_id` to `out` (cleared first).
pub(crate) fn entity_key(prefix: &str, view_id: u32, key: KeyRef<'_>, out: &mut Vec<u8>) {
    use std::io::Write;
    out.clear();
    let _ = write!(out, "{prefix}:{view_id}:{{");
    match key {
        KeyRef::Int(v) => {
            let _ = write!(out, "i{v}");
        }
        KeyRef::Str(s) => {
            out.push(b's');
            out.extend_from_slice(s.as_bytes());
        }
    }
    out.push(b'}');
}

/// The SCAN pattern of every hash of a view. Prefixes are `[A-Za-z0-9_-]` (checked
/// in `RedisOptions::validate`), so nothing in it is a glob character but `*`.
pub(crate) fn view_pattern(prefix: &str, view_id: u32) -> String {
    format!("{prefix}:{view_id}:{{*")
}

/// Inverse of [`entity_key`] for keys of `view_id`; `None` for anything else.
pub(crate) fn decode_entity_key(prefix: &str, view_id: u32, key: &[u8]) -> Option<EntityKey> {
    let head = format!("{prefix}:{view_id}:{{");
    let body = key.strip_prefix(head.as_bytes())?.strip_suffix(b"}")?;
    let (tag, rest) = body.split_first()?;
    let text = std::str::from_utf8(rest).ok()?;
    match tag {
        b'i' => text.parse().ok().map(EntityKey::Int64),
        b's' if !text.is_empty() => Some(EntityKey::String(text.to_owned())),
        _ => None,
    }
}

/// The registry's key.
pub(crate) fn registry_key(prefix: &str) -> String {
    format!("{prefix}:registry")
}

/// An event time as 16 hex digits whose string order is numeric order.
pub(crate) fn time_field(t: Micros) -> String {
    format!("{:016x}", (t as u64) ^ (1 << 63))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn keys_roundtrip_and_share_a_tag_across_views() {
        let mut a = Vec::new();
        let mut b = Vec::new();
        for k in [
            EntityKey::Int64(-7),
            EntityKey::Int64(i64::MAX),
            EntityKey::String("m}0{1".into()),
        ] {
            entity_key("mesh", 3, (&k).into(), &mut a);
            assert_eq!(decode_entity_key("mesh", 3, &a), Some(k.clone()));
            assert_eq!(decode_entity_key("mesh", 4, &a), None);
            entity_key("mesh", 12, (&k).into(), &mut b);
            assert_eq!(
                super::super::conn::key_slot(&a),
                super::super::conn::key_slot(&b),
                "one entity, one slot, whatever the view"
            );
        }
        entity_key("mesh", 3, KeyRef::Int(42), &mut a);
        assert_eq!(a, b"mesh:3:{i42}");
    }

    #[test]
    fn time_fields_sort_like_times() {
        let times = [i64::MIN, -1, 0, 1, 1_700_000_000_000_000, i64::MAX];
        for w in times.windows(2) {
            assert!(time_field(w[0]) < time_field(w[1]), "{w:?}");
            assert_eq!(time_field(w[0]).len(), 16);
        }
    }
}
