//! Ids for the lists of feature names that records share (name sets), so that a wal
//! frame carries a model's feature names once per segment, in a name-set frame, rather
//! than once per record (see [`crate::codec`]).
//!
//! The request path finds the id of a record's names in a cache of its own thread (the
//! last few sets it used, compared name by name: no lock, no allocation, no hashing),
//! and only on a miss in the log's registry, under a lock (compared the same way with
//! each set it holds: a server has a set per model and feature list, so a few; the
//! names are copied only to register a new set). The registry is bounded: at
//! most [`MAX_NAME_SETS`] sets, [`MAX_SET_NAMES`] names in one, [`MAX_NAME_BYTES`]
//! bytes of names in all. A record whose names do not fit names its features itself,
//! as every record did before: a caller that sends new feature names with each
//! request costs the log bytes, never memory.

use crate::codec::{Names, MAX_NAME_SETS};
use crate::record::LoggedFeature;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// Most names in one set; a longer list is named in its records.
pub(crate) const MAX_SET_NAMES: usize = 4096;
/// Most bytes of names across the sets of one log.
pub(crate) const MAX_NAME_BYTES: usize = 1 << 20;
/// Sets a thread keeps at hand.
const RECENT: usize = 8;

/// Tells the logs of one process apart in the threads' caches.
static NEXT_LOG: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The sets this thread used last, newest first: (log, id, names).
    static CACHE: RefCell<Vec<(u64, u32, Names)>> = const { RefCell::new(Vec::new()) };
}

/// The name sets of one log.
pub(crate) struct NameRegistry {
    log: u64,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// By id - 1.
    sets: Vec<Names>,
    bytes: usize,
}

/// Whether `names` are the names of `features`, in order.
fn same<F: LoggedFeature>(names: &[Box<str>], features: &[F]) -> bool {
    names.len() == features.len() && names.iter().zip(features).all(|(n, f)| **n == *f.name())
}

impl NameRegistry {
    pub(crate) fn new() -> Self {
        Self {
            log: NEXT_LOG.fetch_add(1, Ordering::Relaxed),
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Nothing panics while the lock is held but an allocation failure; the maps
        // are whole at every step.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The id of the set of `features`' names, in order; 0 when they have none (an
    /// empty list, or a list that does not fit the registry's bounds).
    pub(crate) fn id_of<F: LoggedFeature>(&self, features: &[F]) -> u32 {
        if features.is_empty() || features.len() > MAX_SET_NAMES {
            return 0;
        }
        let cached = CACHE.with(|c| {
            let c = c.try_borrow().ok()?;
            c.iter()
                .find(|(log, _, names)| *log == self.log && same(names, features))
                .map(|(_, id, _)| *id)
        });
        if let Some(id) = cached {
            return id;
        }
        let Some((id, names)) = self.register(features) else {
            return 0;
        };
        CACHE.with(|c| {
            if let Ok(mut c) = c.try_borrow_mut() {
                if c.len() == RECENT {
                    c.pop();
                }
                c.insert(0, (self.log, id, names));
            }
        });
        id
    }

    /// The registry's id of these names, given one if they have none and fit.
    fn register<F: LoggedFeature>(&self, features: &[F]) -> Option<(u32, Names)> {
        let mut inner = self.lock();
        if let Some(i) = inner.sets.iter().position(|names| same(names, features)) {
            return Some((i as u32 + 1, inner.sets[i].clone()));
        }
        let bytes: usize = features.iter().map(|f| f.name().len()).sum();
        if inner.sets.len() >= MAX_NAME_SETS as usize || inner.bytes + bytes > MAX_NAME_BYTES {
            return None;
        }
        let names: Names = features.iter().map(|f| Box::from(f.name())).collect();
        inner.sets.push(names.clone());
        inner.bytes += bytes;
        Some((inner.sets.len() as u32, names))
    }

    /// The names of set `id`.
    pub(crate) fn names(&self, id: u32) -> Option<Names> {
        let i = usize::try_from(id).ok()?.checked_sub(1)?;
        self.lock().sets.get(i).cloned()
    }

    /// Appends the frame of set `id` to `buf` (see [`crate::wal::push_name_set_frame`]);
    /// false when there is no such set.
    pub(crate) fn push_frame(&self, id: u32, buf: &mut Vec<u8>) -> bool {
        let Some(names) = self.names(id) else {
            return false;
        };
        crate::wal::push_name_set_frame(buf, id, &names);
        true
    }
}

/// Which name sets a segment's wal holds the frames of.
pub(crate) struct Defined(Vec<u64>);

impl Defined {
    pub(crate) fn new() -> Self {
        Self(vec![0; MAX_NAME_SETS as usize / 64 + 1])
    }

    pub(crate) fn contains(&self, id: u32) -> bool {
        let i = id as usize;
        self.0.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    pub(crate) fn insert(&mut self, id: u32) {
        let i = id as usize;
        if let Some(w) = self.0.get_mut(i / 64) {
            *w |= 1 << (i % 64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{status, FeatureUsed};

    fn features(names: &[&str]) -> Vec<FeatureUsed> {
        names
            .iter()
            .map(|n| FeatureUsed {
                name: (*n).into(),
                value: Some(1.0),
                status: status::PRESENT.into(),
                event_time_us: None,
            })
            .collect()
    }

    #[test]
    fn a_list_of_names_keeps_its_id_and_the_registry_stays_bounded() {
        let reg = NameRegistry::new();
        let a = features(&["card:a", "card:b"]);
        let b = features(&["card:a", "card:c"]);
        let (ia, ib) = (reg.id_of(&a), reg.id_of(&b));
        assert_eq!((ia, ib), (1, 2));
        // Again, from this thread's cache and from another thread's registry lookup.
        assert_eq!(reg.id_of(&a), ia);
        let a2 = a.clone();
        let other = std::thread::scope(|s| s.spawn(|| reg.id_of(&a2)).join().unwrap());
        assert_eq!(other, ia);
        assert_eq!(
            reg.names(ib).unwrap()[..],
            [Box::from("card:a"), Box::from("card:c")]
        );
        assert_eq!((reg.names(0), reg.names(3).is_none()), (None, true));
        // Order matters, and a list that is empty or too long has no id.
        assert_eq!(reg.id_of(&features(&["card:b", "card:a"])), 3);
        assert_eq!(reg.id_of(&features(&[])), 0);
        let long: Vec<String> = (0..=MAX_SET_NAMES).map(|i| format!("f{i}")).collect();
        let long: Vec<&str> = long.iter().map(String::as_str).collect();
        assert_eq!(reg.id_of(&features(&long)), 0);
        // Another log's ids are its own, whatever this thread's cache holds.
        let reg2 = NameRegistry::new();
        assert_eq!(reg2.id_of(&b), 1);
        // Past the bound on sets, new lists go without an id; known ones keep theirs.
        for i in 4..=MAX_NAME_SETS {
            assert_eq!(reg.id_of(&features(&[&format!("x{i}")])), i);
        }
        assert_eq!(reg.id_of(&features(&["one too many"])), 0);
        assert_eq!(reg.id_of(&b), ib);
        // And past the bound on bytes.
        let reg3 = NameRegistry::new();
        let big = "n".repeat(MAX_NAME_BYTES / 2);
        assert_eq!(reg3.id_of(&features(&[&big])), 1);
        assert_eq!(reg3.id_of(&features(&[&big, "b"])), 0);
    }

    #[test]
    fn a_segment_knows_which_sets_it_defined() {
        let mut d = Defined::new();
        assert!(!d.contains(1) && !d.contains(MAX_NAME_SETS));
        d.insert(1);
        d.insert(MAX_NAME_SETS);
        assert!(d.contains(1) && d.contains(MAX_NAME_SETS) && !d.contains(2));
    }
}
