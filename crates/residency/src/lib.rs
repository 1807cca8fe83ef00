//! # hearth-residency
//!
//! Residency and eviction: which Workers stay warm in a node's memory.
//!
//! A warm Worker costs real bytes: its compiled code plus the linear
//! memories of its instances. [`Residency`] holds warm entries under a byte
//! budget in least-recently-used order (the `lru` crate) and evicts
//!
//! * under pressure: when an insert or growth takes the total over budget,
//!   least recently used entries go first, never the one being inserted;
//! * after idle time: [`Residency::evict_idle`] drops entries unused for
//!   longer than the idle timeout.
//!
//! Every eviction is returned to the caller with its [`EvictionCause`], so it
//! can be counted. The runtime's side (when the idle sweep runs: a
//! background thread, every second) is `hearth_runtime::eviction`. Time is a plain `u64` of milliseconds supplied by the
//! caller: the live node passes time since it started, the data-center
//! simulator passes virtual time, and both run this same code.
//!
//! An entry with requests in flight may be evicted; the requests keep their
//! own reference and finish, and its memory is freed when they do.
//!
//! Lookups take the key borrowed, as `HashMap` and `lru` do: a
//! `Residency<String, _>` is asked with a `&str`, so the request path does
//! not allocate a `String` to find a Worker.

use std::borrow::Borrow;
use std::hash::Hash;

use lru::LruCache;

/// Why an entry left residency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EvictionCause {
    /// Memory pressure: the budget was exceeded.
    Pressure,
    /// Unused for longer than the idle timeout.
    Idle,
    /// A new version was deployed.
    Replaced,
    /// Asked for explicitly (e.g. `hearth bench --cold`).
    Manual,
}

impl EvictionCause {
    /// A short lowercase name, for metrics labels and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            EvictionCause::Pressure => "pressure",
            EvictionCause::Idle => "idle",
            EvictionCause::Replaced => "replaced",
            EvictionCause::Manual => "manual",
        }
    }
}

/// An entry that was evicted, handed back to the caller.
#[derive(Debug)]
pub struct Evicted<K, V> {
    /// Its key.
    pub key: K,
    /// Its value.
    pub value: V,
    /// Bytes it was accounted at.
    pub bytes: u64,
    /// Why it went.
    pub cause: EvictionCause,
}

struct Slot<V> {
    value: V,
    bytes: u64,
    last_used_ms: u64,
}

/// Warm entries under a byte budget, evicted LRU-first.
pub struct Residency<K: Hash + Eq, V> {
    lru: LruCache<K, Slot<V>>,
    budget: u64,
    used: u64,
}

impl<K: Hash + Eq + Clone, V> Residency<K, V> {
    /// An empty residency with a budget of `budget` bytes.
    pub fn new(budget: u64) -> Self {
        Residency {
            lru: LruCache::unbounded(),
            budget,
            used: 0,
        }
    }

    /// The byte budget.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Bytes accounted to resident entries.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Number of resident entries.
    pub fn len(&self) -> usize {
        self.lru.len()
    }

    /// Whether nothing is resident.
    pub fn is_empty(&self) -> bool {
        self.lru.is_empty()
    }

    /// Whether `key` is resident (does not count as a use).
    pub fn contains<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.lru.contains(key)
    }

    /// How long `key` has been unused as of `now_ms`, if resident.
    pub fn idle_ms<Q>(&self, key: &Q, now_ms: u64) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.lru
            .peek(key)
            .map(|s| now_ms.saturating_sub(s.last_used_ms))
    }

    /// The entry for `key`, without counting a use.
    pub fn peek<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.lru.peek(key).map(|s| &s.value)
    }

    /// The entry for `key`, counted as a use at `now_ms` (moves it to the
    /// most-recently-used end).
    pub fn get<Q>(&mut self, key: &Q, now_ms: u64) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let slot = self.lru.get_mut(key)?;
        slot.last_used_ms = slot.last_used_ms.max(now_ms);
        Some(&slot.value)
    }

    /// Makes `key` resident at `bytes`, replacing any earlier entry (returned
    /// as [`EvictionCause::Replaced`]), then evicts least recently used
    /// entries until the budget holds. The new entry itself is never evicted
    /// here, even if it alone is over budget: a Worker that was just started
    /// is serving a request.
    pub fn insert(&mut self, key: K, value: V, bytes: u64, now_ms: u64) -> Vec<Evicted<K, V>> {
        let mut out = Vec::new();
        if let Some(old) = self.lru.pop(&key) {
            self.used -= old.bytes;
            out.push(Evicted {
                key: key.clone(),
                value: old.value,
                bytes: old.bytes,
                cause: EvictionCause::Replaced,
            });
        }
        self.used += bytes;
        self.lru.put(
            key,
            Slot {
                value,
                bytes,
                last_used_ms: now_ms,
            },
        );
        self.shrink(&mut out);
        out
    }

    /// Re-accounts `key` at `bytes` (its instances grew or shrank), evicting
    /// others if that takes the total over budget.
    pub fn set_bytes<Q>(&mut self, key: &Q, bytes: u64) -> Vec<Evicted<K, V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let mut out = Vec::new();
        if let Some(slot) = self.lru.peek_mut(key) {
            self.used = self.used - slot.bytes + bytes;
            slot.bytes = bytes;
            self.shrink(&mut out);
        }
        out
    }

    /// Removes `key`, recording `cause`.
    pub fn remove<Q>(&mut self, key: &Q, cause: EvictionCause) -> Option<Evicted<K, V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (key, slot) = self.lru.pop_entry(key)?;
        self.used -= slot.bytes;
        Some(Evicted {
            key,
            value: slot.value,
            bytes: slot.bytes,
            cause,
        })
    }

    /// Evicts every entry unused for at least `idle_ms` as of `now_ms`.
    pub fn evict_idle(&mut self, now_ms: u64, idle_ms: u64) -> Vec<Evicted<K, V>> {
        let mut out = Vec::new();
        while let Some((_, slot)) = self.lru.peek_lru() {
            if now_ms.saturating_sub(slot.last_used_ms) < idle_ms {
                break;
            }
            if let Some((key, slot)) = self.lru.pop_lru() {
                self.used -= slot.bytes;
                out.push(Evicted {
                    key,
                    value: slot.value,
                    bytes: slot.bytes,
                    cause: EvictionCause::Idle,
                });
            }
        }
        out
    }

    /// The memory-aware idle sweep: like [`Residency::evict_idle`], but only
    /// once `min_used` bytes are in use. With plenty of memory an idle Worker
    /// costs nothing, so keeping it saves a cold start later; under pressure
    /// it goes. `min_used = 0` is the plain idle sweep.
    pub fn evict_idle_above(
        &mut self,
        now_ms: u64,
        idle_ms: u64,
        min_used: u64,
    ) -> Vec<Evicted<K, V>> {
        if self.used < min_used {
            return Vec::new();
        }
        self.evict_idle(now_ms, idle_ms)
    }

    /// Whether `bytes` more fit without evicting any entry used within the
    /// last `busy_ms` (a shard server refuses rather than evict Workers
    /// busier than the newcomer).
    pub fn fits_without_evicting_busy(&self, bytes: u64, now_ms: u64, busy_ms: u64) -> bool {
        let need = (self.used + bytes).saturating_sub(self.budget);
        if need == 0 {
            return true;
        }
        let mut freed = 0u64;
        for (_, slot) in self.lru.iter().rev() {
            if now_ms.saturating_sub(slot.last_used_ms) < busy_ms {
                return false;
            }
            freed += slot.bytes;
            if freed >= need {
                return true;
            }
        }
        false
    }

    /// Keys from least to most recently used.
    pub fn keys_lru_first(&self) -> impl Iterator<Item = &K> {
        self.lru.iter().rev().map(|(k, _)| k)
    }

    fn shrink(&mut self, out: &mut Vec<Evicted<K, V>>) {
        // Never evict the most recently used entry (the one just touched).
        while self.used > self.budget && self.lru.len() > 1 {
            let Some((key, slot)) = self.lru.pop_lru() else {
                break;
            };
            self.used -= slot.bytes;
            out.push(Evicted {
                key,
                value: slot.value,
                bytes: slot.bytes,
                cause: EvictionCause::Pressure,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pressure_evicts_least_recently_used_first() {
        let mut r = Residency::new(100);
        assert!(r.insert("a", (), 40, 0).is_empty());
        assert!(r.insert("b", (), 40, 1).is_empty());
        r.get(&"a", 2); // a is now more recent than b
        let ev = r.insert("c", (), 40, 3);
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].key, "b");
        assert_eq!(ev[0].cause, EvictionCause::Pressure);
        assert_eq!(r.used(), 80);
        assert!(r.contains(&"a") && r.contains(&"c"));
    }

    #[test]
    fn growth_and_idle_and_replace() {
        let mut r = Residency::new(100);
        r.insert("a", 1, 10, 0);
        r.insert("b", 2, 10, 50);
        let ev = r.set_bytes(&"b", 95);
        assert_eq!(ev.iter().map(|e| e.key).collect::<Vec<_>>(), vec!["a"]);
        let ev = r.insert("b", 3, 5, 60);
        assert_eq!(ev[0].cause, EvictionCause::Replaced);
        assert_eq!(ev[0].value, 2);
        assert_eq!(r.used(), 5);
        r.insert("c", 4, 5, 100);
        let ev = r.evict_idle(1060, 1000);
        assert_eq!(ev.iter().map(|e| e.key).collect::<Vec<_>>(), vec!["b"]);
        assert_eq!(ev[0].cause, EvictionCause::Idle);
        assert!(r.contains(&"c"));
    }

    #[test]
    fn memory_aware_idle_sweep_waits_for_pressure() {
        let mut r = Residency::new(100);
        r.insert("a", (), 30, 0);
        assert!(
            r.evict_idle_above(10_000, 1000, 50).is_empty(),
            "30 of 100 used: keep it"
        );
        r.insert("b", (), 30, 9_999);
        let ev = r.evict_idle_above(10_000, 1000, 50);
        assert_eq!(ev.iter().map(|e| e.key).collect::<Vec<_>>(), vec!["a"]);
    }

    #[test]
    fn string_keys_are_looked_up_by_str() {
        let mut r: Residency<String, u32> = Residency::new(100);
        r.insert("a".to_string(), 1, 10, 0);
        let key: &str = "a";
        assert_eq!(r.get(key, 5), Some(&1));
        assert_eq!(r.idle_ms(key, 7), Some(2));
        assert!(r.contains(key) && r.peek(key).is_some());
        assert!(r.set_bytes(key, 20).is_empty());
        assert_eq!(r.used(), 20);
        let gone = r.remove(key, EvictionCause::Manual).expect("resident");
        assert_eq!(
            (gone.key.as_str(), gone.cause),
            ("a", EvictionCause::Manual)
        );
        assert!(r.is_empty());
    }

    #[test]
    fn oversized_newcomer_stays_and_busy_entries_block_hosting() {
        let mut r = Residency::new(10);
        r.insert("a", (), 5, 0);
        let ev = r.insert("big", (), 50, 1);
        assert_eq!(ev.len(), 1);
        assert!(r.contains(&"big"));
        let mut r = Residency::new(10);
        r.insert("a", (), 8, 100);
        assert!(r.fits_without_evicting_busy(2, 100, 10));
        assert!(!r.fits_without_evicting_busy(5, 105, 10));
        assert!(r.fits_without_evicting_busy(5, 200, 10));
    }
}
