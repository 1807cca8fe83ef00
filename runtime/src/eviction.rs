//! Eviction: which warm Workers leave this node's memory, and when.
//!
//! # The model
//!
//! A warm Worker costs real bytes: its compiled code plus the linear
//! memories of its live instances. The runtime keeps its warm Workers in a
//! [`Residency`] under the node's memory budget
//! ([`RuntimeConfig::memory_budget`]), in least-recently-used order. A
//! Worker leaves it
//!
//! * **under pressure**, at once: when loading a Worker, or the growth of
//!   an instance, takes the total over budget, the least recently used
//!   Workers go until it fits again (never the Worker being served);
//! * **when idle**, by the **idle sweep**: a Worker unused for the idle
//!   timeout ([`RuntimeConfig::idle_timeout`], default 5 minutes) is removed
//!   by a background thread of the runtime that sweeps every
//!   [`IDLE_SWEEP_EVERY`], off the request path (a request never waits for
//!   a sweep, nor frees an idle Worker's memory). With
//!   [`RuntimeConfig::idle_sweep_above`] the sweep runs only while that
//!   fraction of the budget is in use: with memory to spare an idle Worker
//!   costs nothing and saves a cold start later. Between sweeps a Worker
//!   idle past the timeout already counts as cold to the router
//!   ([`crate::Runtime::is_warm`]), so when the sweep runs changes no
//!   routing decision;
//! * **when replaced**: a redeploy (on this node, announced by another, or
//!   found by revalidation) drops the old version;
//! * **when asked**: [`crate::Runtime::evict`] (the admin API, `hearth
//!   bench --cold`).
//!
//! Each eviction is counted by its [`EvictionCause`] (`/metrics`:
//! `hearth_evictions_total`). A Worker evicted with requests in flight is
//! not cut off: they hold their own reference and finish, and its memory is
//! freed when they do.
//!
//! # Where the code is
//!
//! The data structure and its rules (LRU under a byte budget, the idle
//! sweep, "fits without evicting a busy Worker") are the `hearth-residency`
//! crate, re-exported here, so the data-center simulator (`hearth-simulate`)
//! runs the same code without wasmtime. This module adds the runtime's
//! side: the idle rule read from the configuration (`IdleRule`) and the
//! sweep thread (`IdleSweeper`). The sweep is a thread, like the epoch
//! ticker, not a tokio task: it runs whether or not the runtime was built
//! inside tokio, and the Workers it drops are freed there, not on a
//! request's task. It stops when the runtime is dropped.

use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use tokio::sync::watch;

pub use hearth_residency::{Evicted, EvictionCause, Residency};

use crate::config::RuntimeConfig;

/// How often the idle sweep runs.
pub const IDLE_SWEEP_EVERY: Duration = Duration::from_secs(1);

/// The idle rule of a runtime's configuration: a Worker unused for
/// `idle_ms` goes, but only while at least `min_used` bytes are resident.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IdleRule {
    idle_ms: u64,
    min_used: u64,
}

impl IdleRule {
    /// The rule of `cfg` ([`RuntimeConfig::idle_timeout`] and
    /// [`RuntimeConfig::idle_sweep_above`] of its memory budget).
    pub(crate) fn of(cfg: &RuntimeConfig) -> Self {
        IdleRule {
            idle_ms: cfg.idle_timeout.as_millis() as u64,
            min_used: (cfg.idle_sweep_above * cfg.memory_budget as f64) as u64,
        }
    }

    /// One sweep of `r` at `now_ms`: what it evicts.
    pub(crate) fn sweep<K: Hash + Eq + Clone, V>(
        &self,
        r: &mut Residency<K, V>,
        now_ms: u64,
    ) -> Vec<Evicted<K, V>> {
        r.evict_idle_above(now_ms, self.idle_ms, self.min_used)
    }

    /// Whether the next sweep keeps an entry unused for `idle_ms` while
    /// `used` bytes are resident (the rule [`IdleRule::sweep`] applies).
    pub(crate) fn keeps(&self, idle_ms: u64, used: u64) -> bool {
        idle_ms < self.idle_ms || used < self.min_used
    }
}

/// The thread that runs the idle sweep periodically; it ends when this is
/// dropped (at once: dropping wakes it) or when the sweep says the runtime
/// is gone.
pub(crate) struct IdleSweeper {
    /// Dropped with the sweeper, which wakes the thread and ends it.
    _stop: mpsc::Sender<()>,
    /// Sweeps started so far.
    started: Arc<AtomicU64>,
    /// The number of the last sweep that finished.
    finished: watch::Receiver<u64>,
}

impl IdleSweeper {
    /// Starts a thread that calls `sweep` every `every` until this is
    /// dropped or `sweep` returns `false`.
    pub(crate) fn start(
        every: Duration,
        mut sweep: impl FnMut() -> bool + Send + 'static,
    ) -> std::io::Result<Self> {
        let (stop, stopped) = mpsc::channel::<()>();
        let started = Arc::new(AtomicU64::new(0));
        let (finished_tx, finished) = watch::channel(0);
        let count = started.clone();
        std::thread::Builder::new()
            .name("hearth-idle-sweep".into())
            .spawn(move || {
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                    let n = count.fetch_add(1, Ordering::SeqCst) + 1;
                    if !sweep() {
                        break;
                    }
                    finished_tx.send_replace(n);
                }
            })?;
        Ok(IdleSweeper {
            _stop: stop,
            started,
            finished,
        })
    }

    /// Waits until a sweep that started after this call has finished (so it
    /// saw everything that happened before the call).
    pub(crate) async fn next(&self) {
        let target = self.started.load(Ordering::SeqCst) + 1;
        let mut finished = self.finished.clone();
        // An error: the thread has ended (its runtime is going away).
        let _ = finished.wait_for(|&n| n >= target).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idle_rule_is_the_residency_sweep() {
        let rule = IdleRule {
            idle_ms: 1000,
            min_used: 50,
        };
        let mut r = Residency::new(100);
        r.insert("a", (), 30, 0);
        assert!(rule.keeps(5000, r.used()), "30 of 100 used: kept");
        assert!(rule.sweep(&mut r, 5000).is_empty());
        r.insert("b", (), 30, 4500);
        assert!(!rule.keeps(5000, r.used()) && rule.keeps(500, r.used()));
        let gone = rule.sweep(&mut r, 5000);
        assert_eq!(gone.iter().map(|e| e.key).collect::<Vec<_>>(), vec!["a"]);
        assert_eq!(gone[0].cause, EvictionCause::Idle);
    }

    #[tokio::test]
    async fn the_sweeper_sweeps_until_dropped() {
        let (alive, gone) = mpsc::channel::<()>();
        let sweeps = Arc::new(AtomicU64::new(0));
        let counted = sweeps.clone();
        let sweeper = IdleSweeper::start(Duration::from_millis(1), move || {
            let _alive = &alive;
            counted.fetch_add(1, Ordering::SeqCst);
            true
        })
        .expect("thread");
        sweeper.next().await;
        sweeper.next().await;
        assert!(sweeps.load(Ordering::SeqCst) >= 2);
        drop(sweeper);
        // The thread ends, dropping the closure and with it `alive`. The
        // bound only keeps a broken stop from hanging the test.
        assert_eq!(
            gone.recv_timeout(Duration::from_secs(30)),
            Err(RecvTimeoutError::Disconnected)
        );
    }

    #[test]
    fn the_sweeper_stops_when_its_runtime_is_gone() {
        let (alive, gone) = mpsc::channel::<()>();
        let sweeper = IdleSweeper::start(Duration::from_millis(1), move || {
            let _alive = &alive;
            false
        })
        .expect("thread");
        assert_eq!(
            gone.recv_timeout(Duration::from_secs(30)),
            Err(RecvTimeoutError::Disconnected)
        );
        drop(sweeper);
    }
}
