//! A read-mostly cache per model and version (the model-call stacks, the input
//! specs). Each entry remembers the identity of what it was built from (the `Arc`
//! pointers of the actor groups or the model config); a reload replaces those, so
//! the next lookup sees a different identity and rebuilds the entry.
//!
//! Lookups are lock-free: the map is an immutable snapshot behind an `ArcSwap`,
//! read with one atomic load, a map lookup and a clone (a few `Arc` increments);
//! concurrent decisions never wait on each other or on a build. A build (first
//! use, after a reload) takes the build lock, so that one stack per version exists
//! (two stacks would mean two sets of breakers and retry budgets for one version),
//! and publishes a new snapshot with the entry added.
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;

type Snapshot<V> = HashMap<String, BTreeMap<u64, Arc<Entry<V>>>>;

struct Entry<V> {
    built_from: Vec<usize>,
    value: V,
}

pub struct VersionCache<V> {
    map: ArcSwap<Snapshot<V>>,
    /// Held while building and publishing an entry; never by a lookup.
    build: Mutex<()>,
}

impl<V> Default for VersionCache<V> {
    fn default() -> Self {
        Self {
            map: ArcSwap::from_pointee(HashMap::new()),
            build: Mutex::new(()),
        }
    }
}

impl<V: Clone> VersionCache<V> {
    /// The entry of `model`/`version` if it was built from `built_from`.
    fn lookup<I>(&self, model: &str, version: u64, built_from: I) -> Option<V>
    where
        I: IntoIterator<Item = usize>,
    {
        let map = self.map.load();
        let e = map.get(model)?.get(&version)?;
        e.built_from
            .iter()
            .copied()
            .eq(built_from)
            .then(|| e.value.clone())
    }

    /// The entry of `model`/`version` built from `built_from`, building (and keeping)
    /// it with `build` when there is none or it was built from something else.
    pub fn get_or_build<I, E>(
        &self,
        model: &str,
        version: u64,
        built_from: I,
        build: impl FnOnce() -> Result<V, E>,
    ) -> Result<V, E>
    where
        I: IntoIterator<Item = usize> + Clone,
    {
        if let Some(v) = self.lookup(model, version, built_from.clone()) {
            return Ok(v);
        }
        let _building = self.build.lock();
        let ids: Vec<usize> = built_from.into_iter().collect();
        let current = self.map.load_full();
        if let Some(e) = current
            .get(model)
            .and_then(|v| v.get(&version))
            .filter(|e| e.built_from == ids)
        {
            // Built by another caller while we waited for the build lock.
            return Ok(e.value.clone());
        }
        let value = build()?;
        let mut next: Snapshot<V> = (*current).clone();
        next.entry(model.to_owned()).or_default().insert(
            version,
            Arc::new(Entry {
                built_from: ids,
                value: value.clone(),
            }),
        );
        self.map.store(Arc::new(next));
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn builds_once_per_identity_and_rebuilds_after_a_reload() {
        let cache: VersionCache<usize> = VersionCache::default();
        let builds = AtomicUsize::new(0);
        let build = |v: usize| {
            let builds = &builds;
            move || -> Result<usize, ()> {
                builds.fetch_add(1, Ordering::Relaxed);
                Ok(v)
            }
        };
        assert_eq!(cache.get_or_build("m", 1, [10, 11], build(100)), Ok(100));
        assert_eq!(cache.get_or_build("m", 1, [10, 11], build(999)), Ok(100));
        assert_eq!(builds.load(Ordering::Relaxed), 1);
        // Another version and another model are other entries.
        assert_eq!(cache.get_or_build("m", 2, [10, 11], build(200)), Ok(200));
        assert_eq!(cache.get_or_build("n", 1, [10, 11], build(300)), Ok(300));
        // A reload (other actor groups, or one fewer) rebuilds, and the new entry stays.
        assert_eq!(cache.get_or_build("m", 1, [12, 11], build(101)), Ok(101));
        assert_eq!(cache.get_or_build("m", 1, [12], build(102)), Ok(102));
        assert_eq!(cache.get_or_build("m", 1, [12], build(999)), Ok(102));
        assert_eq!(builds.load(Ordering::Relaxed), 5);
        // A failed build keeps nothing.
        assert_eq!(
            cache.get_or_build("x", 1, [1], || Err::<usize, _>("no")),
            Err("no")
        );
        assert_eq!(cache.get_or_build("x", 1, [1], build(7)), Ok(7));
    }
}
