//! Which Workers stay here: eviction, revalidation against the store, and
//! what the router asks before it routes.
//!
//! Workers are resident under the memory budget and evicted by pressure,
//! by the idle sweep ([`crate::eviction`]) or when asked. A warm Worker is
//! checked against the store in the background at most every
//! [`REVALIDATE_MS`], and at once when a deploy elsewhere is announced. The
//! router asks whether a Worker is warm, whether this node can host it
//! without evicting a busy one, and whether its name is known to be
//! missing; none of these answers reads the store on the caller's path.

use std::sync::Arc;

use crate::eviction::EvictionCause;
use crate::instances::worker::Worker;

use super::{Runtime, lock};

/// Source sizes [`Runtime::can_host`] remembers before it starts over.
const MAX_CACHED_SIZES: usize = 100_000;

/// How often a warm Worker is checked against the store for a redeploy
/// (in the background: the request that notices goes on with the copy it
/// has). A backstop: a deploy through a node announces itself to every
/// member at once ([`Runtime::revalidate`]).
pub const REVALIDATE_MS: u64 = 1000;

impl Runtime {
    /// Drops the resident copy of `script_id` (after a redeploy elsewhere),
    /// so the next request loads the current version.
    pub fn invalidate(&self, script_id: &str) {
        self.inner.lookups.forget(script_id);
        lock(&self.inner.sizes).remove(script_id);
        let ev = lock(&self.inner.resident).remove(script_id, EvictionCause::Replaced);
        self.count(ev);
    }

    /// Evicts `script_id` now (counted as manual); whether it was resident.
    pub fn evict(&self, script_id: &str) -> bool {
        let ev = lock(&self.inner.resident).remove(script_id, EvictionCause::Manual);
        let was = ev.is_some();
        self.count(ev);
        was
    }

    /// Runs the idle sweep now: evicts Workers idle for the idle timeout (see
    /// [`crate::eviction`]); returns how many. The runtime also runs it by
    /// itself every [`IDLE_SWEEP_EVERY`](crate::eviction::IDLE_SWEEP_EVERY), in
    /// the background.
    pub fn sweep_idle(&self) -> usize {
        self.inner.sweep_idle()
    }

    /// Waits until the background idle sweep has run once after this call
    /// (for tests and tools that watch idle eviction happen by itself).
    pub async fn next_idle_sweep(&self) {
        self.sweeper.next().await;
    }

    /// Script IDs resident now, least recently used first.
    pub fn resident(&self) -> Vec<String> {
        lock(&self.inner.resident)
            .keys_lru_first()
            .cloned()
            .collect()
    }

    /// Whether `script_id` is warm (resident) here.
    /// A Worker idle past the timeout counts as gone even before the next
    /// sweep removes it, so the router sends it to its home instead of
    /// cold-starting a stale copy here.
    pub fn is_warm(&self, script_id: &str) -> bool {
        let r = lock(&self.inner.resident);
        r.idle_ms(script_id, self.now_ms())
            .is_some_and(|idle| self.inner.idle.keeps(idle, r.used()))
    }

    /// Whether this node can host `script_id` without evicting a Worker used
    /// within the busy window (always true if it is already warm). The size
    /// of a Worker not yet loaded is estimated from its source size, which
    /// is cached: this is asked under the shard server's admission lock, so
    /// it never reads the store itself. On a miss it answers yes and looks
    /// the size up on the blocking pool for next time.
    pub fn can_host(&self, script_id: &str) -> bool {
        if self.is_warm(script_id) {
            return true;
        }
        if self.inner.lookups.is_known_missing(script_id) {
            // Admitted: its 404 costs no store read and no memory.
            return true;
        }
        let cached = lock(&self.inner.sizes).get(script_id).copied();
        let Some(size) = cached else {
            self.learn_size(script_id);
            return true;
        };
        self.fits(size)
    }

    /// Whether a Worker with a source of `size` bytes fits without evicting
    /// a Worker used within the busy window (its resident size estimated
    /// as twice its source).
    pub(super) fn fits(&self, size: u64) -> bool {
        let estimate = size.saturating_mul(2);
        let busy = self.inner.config.busy_window.as_millis() as u64;
        lock(&self.inner.resident).fits_without_evicting_busy(estimate, self.now_ms(), busy)
    }

    /// Reads the source size of `script_id` off the async path into the
    /// cache [`Runtime::can_host`] uses.
    fn learn_size(&self, script_id: &str) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let rt = self.clone();
        let id = script_id.to_string();
        handle.spawn(async move {
            if let Ok(Some(m)) = rt.store_meta(&id).await {
                let mut sizes = lock(&rt.inner.sizes);
                if sizes.len() >= MAX_CACHED_SIZES {
                    sizes.clear();
                }
                sizes.insert(id, m.size);
            }
        });
    }

    /// Whether `script_id` is in this node's negative cache: its store had
    /// no Worker under it within the TTL and no deploy of it was seen since
    /// ([`crate::store::misses`]). A router asks this before a shard hop: the
    /// answer here is the same 404, without the hop.
    pub fn is_known_missing(&self, script_id: &str) -> bool {
        self.inner.lookups.is_known_missing(script_id)
    }

    /// The negative cache's generation now: take it before asking another
    /// node about a name, and hand it to [`Runtime::remember_missing`].
    pub fn miss_generation(&self) -> u64 {
        self.inner.lookups.generation()
    }

    /// Another node (the name's home) answered that no Worker is deployed
    /// under `script_id`: remember it here too, unless a deploy of the name
    /// was seen since `generation` ([`Runtime::miss_generation`]).
    pub fn remember_missing(&self, script_id: &str, generation: u64) {
        self.inner.lookups.remember_missing(script_id, generation);
    }

    /// A deploy of `script_id` at `revision`
    /// ([`ScriptMeta::revision`](crate::ScriptMeta::revision): its source hash,
    /// and its vars and secrets) was announced (by another node of the
    /// cluster): a warm copy of another version is checked against the store
    /// and dropped if the store agrees it is stale, so the next request loads
    /// the new version. The store is read only when this node holds a copy that
    /// differs from the announced revision, so a member cannot make a node drop
    /// a current Worker, nor read the store for Workers it does not hold.
    /// Whether a copy was dropped.
    pub async fn revalidate(&self, script_id: &str, revision: &str) -> bool {
        self.inner.lookups.forget(script_id);
        lock(&self.inner.sizes).remove(script_id);
        let warm = lock(&self.inner.resident).peek(script_id).cloned();
        match warm {
            Some(w) if w.meta.revision() != revision => self.check_against_store(&w).await,
            _ => false,
        }
    }

    /// Checks a warm Worker against the store at most once per
    /// [`REVALIDATE_MS`], in the background (the caller goes on with `w`):
    /// a redeploy through a node that could not announce it still reaches
    /// this one within about that time.
    pub(super) fn revalidate_in_background(&self, w: &Arc<Worker>, now: u64) {
        if !w.due_for_check(now, REVALIDATE_MS) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let rt = self.clone();
        let w = w.clone();
        handle.spawn(async move {
            rt.check_against_store(&w).await;
        });
    }

    /// Drops `w` if the store holds another version of it (or none); a
    /// store that cannot be read is no reason to drop a working Worker.
    /// Whether it was dropped.
    async fn check_against_store(&self, w: &Arc<Worker>) -> bool {
        let id = &w.meta.script_id;
        match self.store_meta(id).await {
            Ok(Some(m)) if m.revision() == w.meta.revision() => false,
            Ok(_) => self.invalidate_worker(w),
            Err(e) => {
                tracing::debug!(script = %id, error = %e, "revalidation skipped: store unreadable");
                false
            }
        }
    }

    /// Drops `w` if it is still the resident copy of its script (a newer
    /// copy loaded meanwhile stays); whether it was dropped.
    fn invalidate_worker(&self, w: &Arc<Worker>) -> bool {
        let id = w.meta.script_id.as_str();
        lock(&self.inner.sizes).remove(id);
        let ev = {
            let mut r = lock(&self.inner.resident);
            if r.peek(id).is_some_and(|cur| Arc::ptr_eq(cur, w)) {
                r.remove(id, EvictionCause::Replaced)
            } else {
                None
            }
        };
        let dropped = ev.is_some();
        self.count(ev);
        dropped
    }
}
