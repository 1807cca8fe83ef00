//! Script lookups, and what a name no Worker is deployed under costs.
//!
//! # The model
//!
//! A request names its Worker by script ID (the first label of its `Host`).
//! A node that does not hold that Worker reads its metadata from the
//! [`crate::ScriptStore`]. For a name nobody deployed (a typo, a scanner,
//! an attacker cycling random names) that read finds nothing and the
//! answer is a 404. Three things keep such names cheap:
//!
//! * **A negative cache.** A name the store did not have is remembered for
//!   a short TTL ([`DEFAULT_MISS_TTL`], in a bounded LRU of
//!   [`DEFAULT_MISS_CAPACITY`] names; both set in [`crate::RuntimeConfig`]).
//!   Asked again within it, the name is a 404 with no store read (counted
//!   as `unknown_cached`). A deploy on this node ([`crate::Runtime::deploy`])
//!   or a deploy announcement from another ([`crate::Runtime::revalidate`],
//!   which every member receives) forgets the name at once, so the TTL
//!   only bounds how long a deploy nobody announced (one written straight
//!   into the store, a member that could not be told) stays unseen. A read
//!   that was under way when a name was forgotten does not remember its
//!   miss (a generation counter tells).
//! * **Single flight.** Concurrent lookups of one name, missing or cold,
//!   share one store read (`Lookups::meta`).
//! * **Rate-limited logging.** A request for an unknown name is logged as a
//!   warning at most once per [`UNKNOWN_WARN_EVERY`], with the number of
//!   such requests not logged since (`WarnEvery`); each is counted in
//!   `unknown_scripts`.
//!
//! A name with a store read in flight is not in the negative cache yet; a
//! name asked for the first time always costs one read (on the node that
//! looks it up: a Worker's home, for a request forwarded to it).
//!
//! In a cluster the node a request arrives at learns the miss too: when
//! its home answers "not deployed" (a 404 with
//! [`crate::flow::UNKNOWN_SCRIPT_HEADER`]), the forwarding node remembers the name
//! ([`crate::Runtime::remember_missing`]), and the router consults this
//! cache before the next hop ([`crate::Runtime::is_known_missing`]): a
//! known-unknown name is a 404 where it arrives, with no shard hop. Deploy
//! announcements reach every member, so each forgets the name at once.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lru::LruCache;
use tokio::sync::OnceCell;

use crate::error::StoreError;
use crate::store::meta::ScriptMeta;

/// How long a name the store did not have is answered 404 without reading
/// the store again (unless a deploy of it is seen first).
pub const DEFAULT_MISS_TTL: Duration = Duration::from_secs(5);
/// Names the negative cache holds at most (the least recently asked go
/// first): at most a few MiB.
pub const DEFAULT_MISS_CAPACITY: usize = 16_384;
/// How often at most a request for an unknown script is logged as a
/// warning (every one is counted).
pub const UNKNOWN_WARN_EVERY: Duration = Duration::from_secs(10);

/// What a metadata lookup found: the store's answer, shared by every
/// concurrent lookup of the name (an error too, so a failing store is not
/// asked once per waiter).
pub(crate) type MetaResult = Result<Option<ScriptMeta>, Arc<StoreError>>;

/// How a lookup was answered.
// A return value, moved once to its caller: boxing the read's result would
// allocate on every lookup to save a copy of a few hundred bytes.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Found {
    /// From the negative cache: not deployed, no store read.
    KnownMissing,
    /// By a store read (this lookup's or a concurrent one's).
    Read(MetaResult),
}

/// The negative cache and the lookups in flight of one runtime.
pub(crate) struct Lookups {
    misses: Mutex<Misses>,
    ttl: Duration,
    in_flight: Mutex<HashMap<String, Arc<OnceCell<MetaResult>>>>,
}

struct Misses {
    /// Name → when the store was found without it.
    names: Option<LruCache<String, Instant>>,
    /// Bumped by every [`Lookups::forget`].
    generation: u64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Lookups {
    /// Remembers up to `capacity` missing names for `ttl` each (either 0:
    /// no negative cache, lookups are still shared).
    pub(crate) fn new(capacity: usize, ttl: Duration) -> Self {
        let names = NonZeroUsize::new(capacity)
            .filter(|_| !ttl.is_zero())
            .map(LruCache::new);
        Lookups {
            misses: Mutex::new(Misses {
                names,
                generation: 0,
            }),
            ttl,
            in_flight: Mutex::new(HashMap::new()),
        }
    }

    /// Whether the store was found without `script_id` within the TTL and
    /// no deploy of it was seen since.
    pub(crate) fn is_known_missing(&self, script_id: &str) -> bool {
        let mut m = lock(&self.misses);
        let Some(names) = m.names.as_mut() else {
            return false;
        };
        match names.get(script_id) {
            Some(at) if at.elapsed() < self.ttl => true,
            Some(_) => {
                names.pop(script_id);
                false
            }
            None => false,
        }
    }

    /// A deploy of `script_id` was seen: it is no longer known missing, and
    /// a read under way now neither remembers a miss nor is joined by
    /// later lookups.
    pub(crate) fn forget(&self, script_id: &str) {
        {
            let mut m = lock(&self.misses);
            m.generation += 1;
            if let Some(names) = m.names.as_mut() {
                names.pop(script_id);
            }
        }
        lock(&self.in_flight).remove(script_id);
    }

    /// The metadata of `script_id`: [`Found::KnownMissing`] from the
    /// negative cache, else the result of `read`, run once for all the
    /// lookups of the name that arrive while it runs. A read that finds
    /// nothing puts the name in the negative cache.
    pub(crate) async fn meta<F, Fut>(&self, script_id: &str, read: F) -> Found
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Option<ScriptMeta>, StoreError>>,
    {
        if self.is_known_missing(script_id) {
            return Found::KnownMissing;
        }
        let cell = lock(&self.in_flight)
            .entry(script_id.to_string())
            .or_default()
            .clone();
        let result = cell
            .get_or_init(|| async {
                let generation = lock(&self.misses).generation;
                let result = read().await.map_err(Arc::new);
                if matches!(result, Ok(None)) {
                    self.remember_missing(script_id, generation);
                }
                result
            })
            .await
            .clone();
        let mut in_flight = lock(&self.in_flight);
        if in_flight
            .get(script_id)
            .is_some_and(|c| Arc::ptr_eq(c, &cell))
        {
            in_flight.remove(script_id);
        }
        Found::Read(result)
    }

    /// The generation now (bumped by every [`Lookups::forget`]).
    pub(crate) fn generation(&self) -> u64 {
        lock(&self.misses).generation
    }

    /// Puts `script_id` in the negative cache, unless a deploy was seen
    /// since the read that missed it began (`generation`).
    pub(crate) fn remember_missing(&self, script_id: &str, generation: u64) {
        let mut m = lock(&self.misses);
        if m.generation != generation {
            return;
        }
        if let Some(names) = m.names.as_mut() {
            names.put(script_id.to_string(), Instant::now());
        }
    }
}

/// A warning that is logged at most once per period; the rest are counted
/// and the count goes with the next one logged.
pub(crate) struct WarnEvery {
    every: Duration,
    state: Mutex<(Option<Instant>, u64)>,
}

impl WarnEvery {
    /// At most once per `every`.
    pub(crate) const fn new(every: Duration) -> Self {
        WarnEvery {
            every,
            state: Mutex::new((None, 0)),
        }
    }

    /// `Some(suppressed)` if this one is to be logged (`suppressed`: how
    /// many were not since the last one logged), else `None` (counted).
    pub(crate) fn allow(&self) -> Option<u64> {
        let mut s = lock(&self.state);
        let now = Instant::now();
        if s.0.is_some_and(|at| now.duration_since(at) < self.every) {
            s.1 += 1;
            return None;
        }
        s.0 = Some(now);
        Some(std::mem::take(&mut s.1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn a_miss_is_remembered_until_the_ttl_or_a_deploy() {
        let l = Lookups::new(8, Duration::from_secs(60));
        let reads = AtomicUsize::new(0);
        let read = || async {
            reads.fetch_add(1, Ordering::Relaxed);
            Ok(None)
        };
        assert!(matches!(l.meta("x", read).await, Found::Read(Ok(None))));
        assert!(matches!(l.meta("x", read).await, Found::KnownMissing));
        assert_eq!(reads.load(Ordering::Relaxed), 1);
        l.forget("x");
        assert!(matches!(l.meta("x", read).await, Found::Read(Ok(None))));
        assert_eq!(reads.load(Ordering::Relaxed), 2);

        let expired = Lookups::new(8, Duration::from_millis(1));
        assert!(matches!(expired.meta("x", read).await, Found::Read(_)));
        std::thread::sleep(Duration::from_millis(5));
        assert!(!expired.is_known_missing("x"));
    }

    #[tokio::test]
    async fn concurrent_lookups_share_one_read_and_a_forget_during_it_wins() {
        let l = Arc::new(Lookups::new(8, Duration::from_secs(60)));
        let reads = Arc::new(AtomicUsize::new(0));
        let (go, wait) = tokio::sync::watch::channel(false);
        let mut joined = Vec::new();
        for _ in 0..16 {
            let (l, reads, mut wait) = (l.clone(), reads.clone(), wait.clone());
            joined.push(tokio::spawn(async move {
                let found = l
                    .meta("y", || async move {
                        reads.fetch_add(1, Ordering::Relaxed);
                        let _ = wait.wait_for(|go| *go).await;
                        Ok(None)
                    })
                    .await;
                matches!(found, Found::Read(Ok(None)))
            }));
        }
        // One thread: every lookup has run up to its wait once this yields.
        tokio::task::yield_now().await;
        assert_eq!(reads.load(Ordering::Relaxed), 1, "one read for all 16");
        // A deploy of "y" is seen while the read is under way: its miss
        // must not be remembered.
        l.forget("y");
        go.send(true).expect("readers wait");
        for j in joined {
            assert!(j.await.expect("lookup"));
        }
        assert_eq!(reads.load(Ordering::Relaxed), 1);
        assert!(!l.is_known_missing("y"));
    }

    #[test]
    fn a_warning_every_period_carries_the_count_of_the_others() {
        let w = WarnEvery::new(Duration::from_secs(3600));
        assert_eq!(w.allow(), Some(0));
        assert_eq!(w.allow(), None);
        assert_eq!(w.allow(), None);
        let w2 = WarnEvery::new(Duration::ZERO);
        assert_eq!(w2.allow(), Some(0));
        assert_eq!(w2.allow(), Some(0));
    }
}
