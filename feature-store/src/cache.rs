//! The in-process cache of rows in front of the store.
//!
//! - Keyed by the entity's store key (one view, one entity). In front of Redis it
//!   holds the decoded row (event time and typed values), in front of sled the
//!   stored bytes (sled's own buffer, shared, not copied); either may be "not
//!   stored" (a negative entry).
//! - Bounded by size: an estimate of each entry's bytes, `max_bytes` in all; the
//!   oldest entries go first (FIFO by insertion, which is also the order in which
//!   entries age out).
//! - Bounded by age: an entry younger than `max_age` answers a lookup like the
//!   store would (statuses still follow the view's `max_age`); an older one is kept
//!   only to answer, marked, when Redis fails (see `redis_store::lookup`).
//! - Invalidated by this process's own writes: every key a write touches is
//!   dropped when the write starts and again when it ends, and while it runs its
//!   shards take nothing in. A lookup puts what it read back only if its shard's
//!   epoch, taken before the read, is unchanged and no write is under way there, so
//!   a row read before a write is never cached after it, and two lookups racing a
//!   write (one reading the row before, one after) cannot leave the older one
//!   behind for the next lookup.
//!   Writes by other processes are seen once the entry is older than `max_age`.
//!   sled allows one process per database, so in front of sled every write is this
//!   process's own and entries never age out (`max_age` unbounded).
use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hashbrown::HashTable;
use parking_lot::Mutex;

use crate::types::{Micros, Value};

/// Shards, each behind its own lock. Few enough that a lookup of 100 keys finds
/// several in each shard it locks (their memory loads overlap under one hold),
/// enough that a writer and two serving threads rarely meet on one.
const SHARDS: usize = 16;
/// Most keys [`Cache::get_many`] answers under one hold of a shard's lock.
const GET_MANY_HOLD: usize = 64;
/// Bookkeeping per entry (map slot, queue slot, Arc header), bytes.
const ENTRY_OVERHEAD: usize = 96;
/// An entry's estimate for a row of a few numeric features, bytes: the map and
/// queue are sized for `max_bytes` of those.
const TYPICAL_ENTRY: usize = 192;

/// One stored row, decoded: its event time and its non-null fields by feature id.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DecodedRow {
    pub event_time: Micros,
    pub fields: Vec<(u16, Value)>,
}

impl DecodedRow {
    fn bytes(&self) -> usize {
        16 + self
            .fields
            .iter()
            .map(|(_, v)| {
                32 + match v {
                    Value::String(s) => s.len(),
                    Value::F32Vector(xs) => xs.len() * 4,
                    _ => 0,
                }
            })
            .sum::<usize>()
    }
}

/// What the Redis cache holds for one entity: its row, or `None` (Redis had none).
pub(crate) type Cached = Option<Arc<DecodedRow>>;

/// What the sled cache holds for one entity: its stored bytes, or `None`.
pub(crate) type CachedBytes = Option<sled::IVec>;

/// A cached value's estimated size in bytes, beyond the entry's bookkeeping.
pub(crate) trait Weigh: Clone {
    fn weight(&self) -> usize;
    /// Reads the start of what the value points to, so that the memory loads of a
    /// batch of lookups are under way together (see [`Cache::get_many`]).
    fn touch(&self);
}

impl Weigh for Cached {
    fn weight(&self) -> usize {
        self.as_ref().map_or(0, |r| r.bytes())
    }

    fn touch(&self) {
        std::hint::black_box(self.as_ref().map(|r| r.event_time));
    }
}

impl Weigh for CachedBytes {
    fn weight(&self) -> usize {
        // sled keeps values of up to 22 bytes inline; longer ones behind an Arc.
        self.as_ref()
            .map_or(0, |b| if b.len() > 22 { b.len() + 16 } else { 0 })
    }

    fn touch(&self) {
        // A row of 16 f32 features spans two cache lines.
        std::hint::black_box(
            self.as_ref()
                .map(|b| (b.first().copied(), b.last().copied())),
        );
    }
}

/// A cache key, held in the map's slot when short (every int64 key and string keys
/// of up to 23 bytes): a hit then compares bytes already in the cache line it
/// loaded, instead of following a pointer to the key.
#[derive(Clone)]
enum Key {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Heap(Box<[u8]>),
}

const INLINE_KEY: usize = 23;

impl Key {
    fn new(key: &[u8]) -> Self {
        if key.len() <= INLINE_KEY {
            let mut bytes = [0; INLINE_KEY];
            bytes[..key.len()].copy_from_slice(key);
            Key::Inline {
                len: key.len() as u8,
                bytes,
            }
        } else {
            Key::Heap(key.into())
        }
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            Key::Inline { len, bytes } => &bytes[..*len as usize],
            Key::Heap(b) => b,
        }
    }
}

struct Entry<V> {
    key: Key,
    row: V,
    at: Instant,
    seq: u64,
    bytes: usize,
}

/// One shard: its entries, their order and its invalidation state.
struct Shard<V> {
    /// The entries, found by the key's hash (computed once per key, before the
    /// lock, by [`Cache::hash`]).
    map: HashTable<Entry<V>>,
    /// Insertion order: (key, seq); a key re-inserted later has a newer seq, and its
    /// older queue slot is skipped when popped.
    order: VecDeque<(Key, u64)>,
    bytes: usize,
    seq: u64,
    /// Bumped when a write starts and when it ends; see [`Cache::get_with_epoch`].
    epoch: u64,
    /// Writes under way on keys of this shard: no insert while above 0.
    writing: u32,
}

impl<V> Shard<V> {
    /// Room for `entries` from the start: growing a map of thousands of entries
    /// rehashes them all at once, a pause of milliseconds inside some lookup. The
    /// slots are reserved, not touched, so memory is used as they fill.
    fn with_capacity(entries: usize) -> Self {
        Shard {
            map: HashTable::with_capacity(entries),
            // Re-inserted keys leave stale slots: up to twice the live ones.
            order: VecDeque::with_capacity(2 * entries),
            bytes: 0,
            seq: 0,
            epoch: 0,
            writing: 0,
        }
    }

    fn find(&self, hash: u64, key: &[u8]) -> Option<&Entry<V>> {
        self.map.find(hash, |e| e.key.as_slice() == key)
    }

    /// Removes `key`'s entry, if any.
    fn remove(&mut self, hash: u64, key: &[u8]) {
        if let Ok(e) = self.map.find_entry(hash, |e| e.key.as_slice() == key) {
            let (gone, _) = e.remove();
            self.bytes -= gone.bytes;
        }
    }
}

/// A cache answer.
pub(crate) enum Hit<V = Cached> {
    /// Younger than `max_age`: answers like the store.
    Fresh(V),
    /// Older: only for answering a failed read, marked.
    Old(V),
}

/// The cache: [`SHARDS`] maps, each behind its own lock. A lookup of many keys
/// ([`Cache::get_many`]) locks each shard once for all of its keys there and takes
/// no reference count, so the processor has several keys' memory loads under way
/// at once (a hit on a map far larger than the processor's caches is three misses:
/// the map's control bytes, the entry, the row).
pub(crate) struct Cache<V = Cached> {
    shards: Vec<Mutex<Shard<V>>>,
    hasher: std::collections::hash_map::RandomState,
    max_bytes_per_shard: usize,
    max_age: Duration,
    bytes: AtomicUsize,
}

impl<V: Weigh> Cache<V> {
    /// A cache of at most `max_bytes` (0: nothing is cached) whose entries answer
    /// for `max_age`.
    pub(crate) fn new(max_bytes: usize, max_age: Duration) -> Self {
        Cache {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(Shard::with_capacity(max_bytes / SHARDS / TYPICAL_ENTRY)))
                .collect(),
            hasher: Default::default(),
            max_bytes_per_shard: max_bytes / SHARDS,
            max_age,
            bytes: AtomicUsize::new(0),
        }
    }

    /// Whether anything can be cached (`max_bytes` > 0).
    pub(crate) fn enabled(&self) -> bool {
        self.max_bytes_per_shard > 0
    }

    /// The key's hash: the map's, and its shard's.
    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    fn shard_of(hash: u64) -> usize {
        // The map takes its buckets from the low bits and its tags from the top
        // seven: the shard from the bits between.
        ((hash >> 32) as usize) % SHARDS
    }

    fn hit<'a>(&self, e: &'a Entry<V>, now: Instant) -> Hit<&'a V> {
        if now.saturating_duration_since(e.at) < self.max_age {
            Hit::Fresh(&e.row)
        } else {
            Hit::Old(&e.row)
        }
    }

    pub(crate) fn get(&self, key: &[u8], now: Instant) -> Option<Hit<V>> {
        self.get_with_epoch(key, now).0
    }

    /// [`Cache::get`] and the shard's invalidation epoch, under one lock: on a miss
    /// the caller reads the store and hands the epoch to [`Cache::insert`].
    pub(crate) fn get_with_epoch(&self, key: &[u8], now: Instant) -> (Option<Hit<V>>, u64) {
        let hash = self.hash(key);
        let shard = self.shards[Self::shard_of(hash)].lock();
        let hit = shard.find(hash, key).map(|e| match self.hit(e, now) {
            Hit::Fresh(r) => Hit::Fresh(r.clone()),
            Hit::Old(r) => Hit::Old(r.clone()),
        });
        (hit, shard.epoch)
    }

    /// Looks up `keys`, locking each shard once for its keys (once per
    /// [`GET_MANY_HOLD`] of them, so that a writer waits for no more), and calls
    /// `each(i, hit, epoch)` for key `i` (in shard order, not key order) with its
    /// answer (a reference, valid during the call: nothing is cloned) and its
    /// shard's invalidation epoch. `each` runs under the shard's lock: it should be
    /// short.
    pub(crate) fn get_many(
        &self,
        keys: &[&[u8]],
        now: Instant,
        mut each: impl FnMut(usize, Option<Hit<&V>>, u64),
    ) {
        let mut by_shard: Vec<(usize, usize, u64)> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let h = self.hash(k);
                (Self::shard_of(h), i, h)
            })
            .collect();
        by_shard.sort_unstable();
        let groups = by_shard
            .chunk_by(|a, b| a.0 == b.0)
            .flat_map(|g| g.chunks(GET_MANY_HOLD));
        for group in groups {
            let shard = self.shards[group[0].0].lock();
            // First every key's entry and its age, loading its row's bytes, so that
            // the misses of the next keys start while earlier ones are still waited
            // for; then the answers, from what is now in the processor's cache.
            let found: Vec<_> = group
                .iter()
                .map(|&(_, i, h)| {
                    shard.find(h, keys[i]).map(|e| {
                        e.row.touch();
                        self.hit(e, now)
                    })
                })
                .collect();
            for (&(_, i, _), hit) in group.iter().zip(found) {
                each(i, hit, shard.epoch);
            }
        }
    }

    /// The invalidation epoch of `key`'s shard alone (lookups take it with
    /// [`Cache::get_with_epoch`]).
    #[cfg(test)]
    pub(crate) fn epoch(&self, key: &[u8]) -> u64 {
        self.shards[Self::shard_of(self.hash(key))].lock().epoch
    }

    /// Caches what a read returned, unless a write invalidated the shard since
    /// `epoch` was taken (the read may predate it).
    pub(crate) fn insert(&self, key: &[u8], row: V, epoch: u64, now: Instant) {
        self.insert_many([(key, row, epoch)], now);
    }

    /// [`Cache::insert`] of several reads, locking each shard once.
    pub(crate) fn insert_many<'k>(
        &self,
        rows: impl IntoIterator<Item = (&'k [u8], V, u64)>,
        now: Instant,
    ) {
        if !self.enabled() {
            return;
        }
        let mut rows: Vec<_> = rows
            .into_iter()
            .map(|(k, row, epoch)| {
                let h = self.hash(k);
                (Self::shard_of(h), h, k, row, epoch)
            })
            .collect();
        rows.sort_unstable_by_key(|r| r.0);
        let mut rows = rows.into_iter().peekable();
        while let Some(first) = rows.peek() {
            let s = first.0;
            let mut guard = self.shards[s].lock();
            let before = guard.bytes;
            while let Some((_, hash, key, row, epoch)) = rows.next_if(|r| r.0 == s) {
                self.insert_locked(&mut guard, hash, key, row, epoch, now);
            }
            let after = guard.bytes;
            drop(guard);
            self.account(before, after);
        }
    }

    fn insert_locked(
        &self,
        shard: &mut Shard<V>,
        hash: u64,
        key: &[u8],
        row: V,
        epoch: u64,
        now: Instant,
    ) {
        let bytes = ENTRY_OVERHEAD + 2 * key.len() + row.weight();
        if bytes > self.max_bytes_per_shard || shard.epoch != epoch || shard.writing > 0 {
            return;
        }
        shard.seq += 1;
        let seq = shard.seq;
        shard.remove(hash, key);
        let hasher = &self.hasher;
        shard.map.insert_unique(
            hash,
            Entry {
                key: Key::new(key),
                row,
                at: now,
                seq,
                bytes,
            },
            |e| hasher.hash_one(e.key.as_slice()),
        );
        shard.bytes += bytes;
        shard.order.push_back((Key::new(key), seq));
        while shard.bytes > self.max_bytes_per_shard {
            let Some((k, s)) = shard.order.pop_front() else {
                break;
            };
            let h = self.hash(k.as_slice());
            if shard.find(h, k.as_slice()).is_some_and(|e| e.seq == s) {
                shard.remove(h, k.as_slice());
            }
        }
        // Re-inserted keys leave stale queue slots behind; drop them once they
        // outnumber the live ones (amortised: the queue at most doubles).
        if shard.order.len() > 2 * shard.map.len() + 16 {
            let Shard { map, order, .. } = shard;
            order.retain(|(k, s)| {
                let h = hasher.hash_one(k.as_slice());
                map.find(h, |e| e.key.as_slice() == k.as_slice())
                    .is_some_and(|e| e.seq == *s)
            });
        }
    }

    /// Marks a write of `keys` as under way, until the guard drops (also on an
    /// error or a cancelled write): call it before the store is written. Each
    /// shard is locked once per write, not once per key.
    pub(crate) fn begin_write<K: AsRef<[u8]>>(&self, keys: Vec<K>) -> WriteGuard<'_, V, K> {
        let mut by_shard = Vec::new();
        if self.enabled() {
            by_shard = keys
                .iter()
                .enumerate()
                .map(|(i, k)| {
                    let h = self.hash(k.as_ref());
                    (Self::shard_of(h), h, i)
                })
                .collect();
            by_shard.sort_unstable();
            self.touch(&keys, &by_shard, 1);
        }
        WriteGuard {
            cache: self,
            keys,
            by_shard,
        }
    }

    /// For each shard of `keys` (`by_shard`: (shard, hash, key index), sorted):
    /// drops its keys, bumps its epoch and moves its write count by `delta`.
    fn touch<K: AsRef<[u8]>>(&self, keys: &[K], by_shard: &[(usize, u64, usize)], delta: i32) {
        for group in by_shard.chunk_by(|a, b| a.0 == b.0) {
            let mut shard = self.shards[group[0].0].lock();
            shard.epoch += 1;
            shard.writing = shard.writing.saturating_add_signed(delta);
            let before = shard.bytes;
            for &(_, hash, i) in group {
                shard.remove(hash, keys[i].as_ref());
            }
            let after = shard.bytes;
            drop(shard);
            self.account(before, after);
        }
    }

    /// A whole write of `key`, started and ended at once.
    #[cfg(test)]
    pub(crate) fn invalidate(&self, key: &[u8]) {
        drop(self.begin_write(vec![key]));
    }

    fn account(&self, before: usize, after: usize) {
        if after >= before {
            self.bytes.fetch_add(after - before, Ordering::Relaxed);
        } else {
            self.bytes.fetch_sub(before - after, Ordering::Relaxed);
        }
    }

    /// Estimated bytes held.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }
}

/// A write under way on some keys (see [`Cache::begin_write`]); dropping it ends it.
pub(crate) struct WriteGuard<'a, V: Weigh, K: AsRef<[u8]>> {
    cache: &'a Cache<V>,
    keys: Vec<K>,
    by_shard: Vec<(usize, u64, usize)>,
}

impl<V: Weigh, K: AsRef<[u8]>> Drop for WriteGuard<'_, V, K> {
    fn drop(&mut self) {
        self.cache.touch(&self.keys, &self.by_shard, -1);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn row(t: Micros) -> Cached {
        Some(Arc::new(DecodedRow {
            event_time: t,
            fields: vec![(0, Value::F32(1.0))],
        }))
    }

    #[test]
    fn fresh_then_old_by_age() {
        let c = Cache::new(1 << 20, Duration::from_millis(100));
        let t0 = Instant::now();
        c.insert(b"k", row(5), c.epoch(b"k"), t0);
        assert!(matches!(c.get(b"k", t0), Some(Hit::Fresh(Some(r))) if r.event_time == 5));
        let later = t0 + Duration::from_millis(150);
        assert!(matches!(c.get(b"k", later), Some(Hit::Old(Some(_)))));
        assert!(c.get(b"other", t0).is_none());
    }

    #[test]
    fn a_write_between_read_and_insert_keeps_the_read_out() {
        let c = Cache::new(1 << 20, Duration::from_secs(1));
        let now = Instant::now();
        let epoch = c.epoch(b"k"); // a lookup starts reading Redis
        c.invalidate(b"k"); // this process writes k meanwhile
        c.insert(b"k", row(1), epoch, now); // the lookup's (older) read
        assert!(c.get(b"k", now).is_none());
        c.insert(b"k", row(2), c.epoch(b"k"), now);
        c.invalidate(b"k");
        assert!(c.get(b"k", now).is_none());
        assert_eq!(c.bytes(), 0);
    }

    #[test]
    fn an_unbounded_age_never_turns_old_and_a_miss_gives_the_epoch() {
        let c: Cache<CachedBytes> = Cache::new(1 << 20, Duration::MAX);
        let now = Instant::now();
        let (None, epoch) = c.get_with_epoch(b"k", now) else {
            panic!("empty cache")
        };
        c.insert(b"k", Some(sled::IVec::from(&[7u8; 40][..])), epoch, now);
        let much_later = now + Duration::from_secs(86_400 * 365);
        assert!(
            matches!(c.get_with_epoch(b"k", much_later), (Some(Hit::Fresh(Some(b))), e) if b.len() == 40 && e == epoch)
        );
        // 40 bytes live behind sled's Arc; a short value is inline.
        assert_eq!(c.bytes(), ENTRY_OVERHEAD + 2 + 40 + 16);
        c.invalidate(b"k");
        let (None, after) = c.get_with_epoch(b"k", now) else {
            panic!("invalidated")
        };
        assert_ne!(after, epoch);
        c.insert(b"k", Some(sled::IVec::from(&[7u8; 40][..])), epoch, now);
        assert!(
            c.get(b"k", now).is_none(),
            "an insert with the old epoch is refused"
        );
        assert!(!Cache::<CachedBytes>::new(0, Duration::MAX).enabled());
    }

    #[test]
    fn short_and_long_keys_are_told_apart() {
        let c = Cache::new(1 << 20, Duration::from_secs(60));
        let now = Instant::now();
        let long = [b'x'; 40];
        let short = &long[..INLINE_KEY];
        let just_over = &long[..INLINE_KEY + 1];
        c.insert(&long, row(1), c.epoch(&long), now);
        c.insert(short, row(2), c.epoch(short), now);
        c.insert(just_over, row(3), c.epoch(just_over), now);
        c.insert(b"", row(4), c.epoch(b""), now);
        for (k, t) in [(&long[..], 1), (short, 2), (just_over, 3), (b"", 4)] {
            assert!(
                matches!(c.get(k, now), Some(Hit::Fresh(Some(r))) if r.event_time == t),
                "key of {} bytes",
                k.len()
            );
        }
        assert!(c.get(&long[..30], now).is_none());
        c.invalidate(just_over);
        assert!(c.get(just_over, now).is_none());
        assert!(c.get(short, now).is_some());
    }

    #[test]
    fn nothing_is_cached_while_a_write_is_under_way() {
        let c = Cache::new(1 << 20, Duration::from_secs(60));
        let now = Instant::now();
        c.insert(b"k", row(1), c.epoch(b"k"), now);
        let guard = c.begin_write(vec![b"k".to_vec()]);
        assert!(c.get(b"k", now).is_none(), "dropped when the write starts");
        // Two lookups during the write: one read the old row, one the new; both
        // took the epoch after the start. Neither may stay cached.
        let during = c.epoch(b"k");
        c.insert(b"k", row(2), during, now);
        c.insert(b"k", row(1), during, now);
        assert!(c.get(b"k", now).is_none());
        drop(guard);
        assert!(c.get(b"k", now).is_none());
        c.insert(b"k", row(1), during, now);
        assert!(
            c.get(b"k", now).is_none(),
            "an epoch from during the write is refused"
        );
        c.insert(b"k", row(2), c.epoch(b"k"), now);
        assert!(matches!(c.get(b"k", now), Some(Hit::Fresh(Some(r))) if r.event_time == 2));
        assert_eq!(c.shards.iter().map(|s| s.lock().writing).sum::<u32>(), 0);
    }

    #[test]
    fn a_write_counts_each_shard_once_and_ends_clean() {
        let c = Cache::new(1 << 20, Duration::from_secs(60));
        let now = Instant::now();
        let key = |i: u64| i.to_be_bytes();
        for i in 0..200 {
            c.insert(&key(i), row(i as i64), c.epoch(&key(i)), now);
        }
        let guard = c.begin_write((0..100).map(key).collect::<Vec<_>>());
        let writing: u32 = c.shards.iter().map(|s| s.lock().writing).sum();
        let touched = (0..100)
            .map(|i| Cache::<Cached>::shard_of(c.hash(&key(i))))
            .collect::<std::collections::HashSet<_>>();
        assert_eq!(writing as usize, touched.len(), "one count per shard");
        assert!((0..100).all(|i| c.get(&key(i), now).is_none()));
        assert!((100..200).all(|i| c.get(&key(i), now).is_some()));
        // A key of a touched shard cannot be cached during the write.
        let k = key(0);
        c.insert(&k, row(0), c.epoch(&k), now);
        assert!(c.get(&k, now).is_none());
        drop(guard);
        assert_eq!(c.shards.iter().map(|s| s.lock().writing).sum::<u32>(), 0);
        c.insert(&k, row(0), c.epoch(&k), now);
        assert!(c.get(&k, now).is_some());
        // A cache of 0 bytes keeps no write state at all.
        let off: Cache = Cache::new(0, Duration::from_secs(1));
        drop(off.begin_write(vec![k.to_vec()]));
        assert_eq!(off.shards.iter().map(|s| s.lock().epoch).sum::<u64>(), 0);
    }

    #[test]
    fn get_many_answers_each_key_once_with_its_shards_epoch() {
        let c: Cache<CachedBytes> = Cache::new(16 << 20, Duration::MAX);
        let now = Instant::now();
        let key = |i: u64| i.to_be_bytes();
        // About 190 keys a shard: answered in several holds of its lock.
        const N: u64 = 3_000;
        // Even keys cached (odd ones stored as "not stored"), multiples of 3 never.
        for i in (0..N).filter(|i| i % 3 != 0) {
            let row = (i % 2 == 0).then(|| sled::IVec::from(&[i as u8; 40][..]));
            c.insert(&key(i), row, c.epoch(&key(i)), now);
        }
        // A write under way on key 4's shard: its epoch is what a miss must carry.
        let writing = c.begin_write(vec![key(4).to_vec()]);
        let keys: Vec<[u8; 8]> = (0..N).rev().map(key).collect();
        let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
        // Key 4's shard has been written (epoch 1), the others not (epoch 0).
        let epochs: Vec<u64> = keys.iter().map(|k| c.epoch(k)).collect();
        assert!(epochs.contains(&0) && epochs.contains(&1), "{epochs:?}");
        let mut seen = vec![0; keys.len()];
        c.get_many(&refs, now, |i, hit, epoch| {
            seen[i] += 1;
            let k = u64::from_be_bytes(keys[i]);
            assert_eq!(epoch, epochs[i], "key {k}");
            match hit {
                None => assert!(k.is_multiple_of(3) || k == 4, "key {k} was cached"),
                Some(Hit::Fresh(Some(b))) => {
                    assert!(k.is_multiple_of(2) && !k.is_multiple_of(3), "key {k}");
                    assert_eq!(b[..], [k as u8; 40], "key {k}");
                }
                Some(Hit::Fresh(None)) => assert!(k % 2 == 1 && !k.is_multiple_of(3), "key {k}"),
                Some(Hit::Old(_)) => panic!("key {k}: nothing ages with an unbounded max_age"),
            }
        });
        assert!(seen.iter().all(|n| *n == 1), "{seen:?}");
        // The miss of key 4 came with the epoch of a write under way: refused.
        let (None, epoch) = c.get_with_epoch(&key(4), now) else {
            panic!("key 4 is being written")
        };
        c.insert(&key(4), None, epoch, now);
        assert!(c.get(&key(4), now).is_none());
        drop(writing);
    }

    #[test]
    fn size_bound_evicts_the_oldest() {
        let per_entry = ENTRY_OVERHEAD + 2 * 8 + row(0).unwrap().bytes();
        // Room for about 4 entries per shard.
        let c = Cache::new(SHARDS * per_entry * 4, Duration::from_secs(60));
        let now = Instant::now();
        for i in 0..10_000u64 {
            let k = i.to_be_bytes();
            c.insert(&k, row(i as i64), c.epoch(&k), now);
        }
        assert!(c.bytes() <= SHARDS * per_entry * 4, "{}", c.bytes());
        let last = 9_999u64.to_be_bytes();
        assert!(c.get(&last, now).is_some(), "the newest entry stays");
        let kept = (0..10_000u64)
            .filter(|i| c.get(&i.to_be_bytes(), now).is_some())
            .count();
        assert!(kept <= SHARDS * 4, "{kept}");
        // Nothing fits in a zero-byte cache.
        let none = Cache::new(0, Duration::from_secs(1));
        none.insert(b"k", row(1), none.epoch(b"k"), now);
        assert!(none.get(b"k", now).is_none());
    }

    #[test]
    fn refreshing_the_same_keys_keeps_them_and_bounds_the_queue() {
        let c = Cache::new(1 << 20, Duration::from_secs(60));
        let now = Instant::now();
        for round in 0..50 {
            for i in 0..100u64 {
                let k = i.to_be_bytes();
                c.insert(&k, row(round), c.epoch(&k), now);
            }
        }
        for i in 0..100u64 {
            assert!(
                matches!(c.get(&i.to_be_bytes(), now), Some(Hit::Fresh(Some(r))) if r.event_time == 49),
                "key {i}"
            );
        }
        let queued: usize = c.shards.iter().map(|s| s.lock().order.len()).sum();
        assert!(queued <= 2 * 100 + 16 * SHARDS, "{queued}");
    }
}
