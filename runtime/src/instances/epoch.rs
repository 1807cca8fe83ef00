//! The epoch ticker: the clock that lets a running Worker be interrupted.
//!
//! # The model
//!
//! wasmtime checks a store's epoch deadline at function entries and loop
//! back-edges; hearth sets each store's deadline one tick ahead, and its
//! deadline callback checks the Worker's [CPU meter](crate::instances::cpu).
//! Something must advance the epoch: one thread per engine bumps it every
//! [`EPOCH_TICK`] (never one bump per request).
//!
//! A ticker that ticks forever wakes its thread a thousand times a second
//! on a node with nothing to run (three nodes of a loopback cluster: ~2,800
//! wake-ups/s, ~3 % of a core), and those wake-ups crowd the low-rate
//! traffic sharding exists for. So the ticker ticks only while guest code
//! may be running: every poll of a metered Worker future holds a
//! `Running` mark, and a ticker that has seen no mark for
//! [`IDLE_TICKS`] ticks parks its thread until the next mark appears.
//!
//! The rule that keeps limits sound: **while a guest poll is in progress,
//! its engine's ticker is awake**. A poll announces itself (a count on its
//! engine's `Ticker`, found once when the instance starts) before it
//! enters the guest and wakes the ticker if it is parked; a ticker
//! announces that it is about to park, then checks the count once more, so
//! one of the two always sees the other (both use sequentially consistent
//! atomics). An awake ticker costs a poll two atomic operations; a parked
//! one adds an `unpark`, which never delays the poll.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::Thread;
use std::time::Duration;

use wasmtime::Engine;

/// How often the epoch advances while guests run: the granularity of CPU
/// limit checks.
pub const EPOCH_TICK: Duration = Duration::from_millis(1);

/// Ticks without a guest poll after which a ticker parks: an idle node
/// sleeps at once, and a Worker polled again within a tick finds its
/// ticker still awake.
pub const IDLE_TICKS: u32 = 2;

/// The live tickers, by engine, so each instance finds its engine's once
/// (at start), not on every poll.
static TICKERS: Mutex<Vec<(Engine, Arc<Ticker>)>> = Mutex::new(Vec::new());

/// What a ticker thread and the polls of its engine's guests share.
#[derive(Debug)]
pub(crate) struct Ticker {
    /// Guest polls in progress on this engine.
    running: AtomicUsize,
    /// The ticker is parked or about to park.
    parked: AtomicBool,
    /// Set when the [`EpochTicker`] is dropped.
    stop: AtomicBool,
    thread: Thread,
}

impl Ticker {
    /// The ticker of `engine`, if one runs.
    pub(crate) fn of(engine: &Engine) -> Option<Arc<Ticker>> {
        TICKERS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|(e, _)| Engine::same(e, engine))
            .map(|(_, t)| t.clone())
    }
}

/// Held for the length of one poll of guest code (see the module docs).
pub(crate) struct Running<'a>(Option<&'a Ticker>);

impl<'a> Running<'a> {
    /// Marks a guest poll of `ticker`'s engine as started, waking the
    /// ticker if it is parked. A poll whose engine has no known ticker
    /// (`None`) wakes every parked ticker instead: a limit may be slow to
    /// apply, never skipped.
    pub(crate) fn start(ticker: Option<&'a Ticker>) -> Self {
        match ticker {
            Some(t) => {
                t.running.fetch_add(1, Ordering::SeqCst);
                if t.parked.load(Ordering::SeqCst) {
                    t.thread.unpark();
                }
            }
            None => {
                for (_, t) in TICKERS
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .iter()
                {
                    t.thread.unpark();
                }
            }
        }
        Running(ticker)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if let Some(t) = self.0 {
            t.running.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// An engine's epoch ticker thread; stops when dropped.
pub(crate) struct EpochTicker {
    ticker: Arc<Ticker>,
}

impl EpochTicker {
    /// Starts a ticker thread for `engine`.
    pub(crate) fn start(engine: &Engine) -> std::io::Result<Self> {
        let weak = engine.weak();
        let (tx, rx) = std::sync::mpsc::channel::<Arc<Ticker>>();
        let handle = std::thread::Builder::new()
            .name("hearth-epoch".into())
            .spawn(move || {
                let Ok(t) = rx.recv() else { return };
                let mut idle = 0;
                while !t.stop.load(Ordering::Relaxed) {
                    if t.running.load(Ordering::SeqCst) > 0 {
                        idle = 0;
                    } else {
                        idle += 1;
                    }
                    if idle >= IDLE_TICKS {
                        t.parked.store(true, Ordering::SeqCst);
                        // Checked again after announcing the park: a poll
                        // that started before this saw no parked ticker.
                        while t.running.load(Ordering::SeqCst) == 0
                            && !t.stop.load(Ordering::Relaxed)
                        {
                            std::thread::park();
                        }
                        t.parked.store(false, Ordering::SeqCst);
                        idle = 0;
                    }
                    std::thread::sleep(EPOCH_TICK);
                    match weak.upgrade() {
                        Some(e) => e.increment_epoch(),
                        None => break,
                    }
                }
            })?;
        let ticker = Arc::new(Ticker {
            running: AtomicUsize::new(0),
            parked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            thread: handle.thread().clone(),
        });
        TICKERS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((engine.clone(), ticker.clone()));
        // The thread runs only once the ticker is registered.
        let _ = tx.send(ticker.clone());
        Ok(EpochTicker { ticker })
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.ticker.stop.store(true, Ordering::Relaxed);
        self.ticker.thread.unpark();
        TICKERS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(_, t)| !Arc::ptr_eq(t, &self.ticker));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A guest that starts after the ticker parked is still interrupted:
    /// the epoch advances within a few ticks of the poll starting.
    #[test]
    fn a_parked_ticker_wakes_for_the_next_guest() {
        let mut config = wasmtime::Config::new();
        config.epoch_interruption(true);
        let engine = Engine::new(&config).expect("engine");
        let _ticker = EpochTicker::start(&engine).expect("ticker");
        // Long enough for the ticker to park (other tests may be running
        // guests meanwhile; then it simply stays awake).
        std::thread::sleep(EPOCH_TICK * (IDLE_TICKS * 5));
        let module =
            wasmtime::Module::new(&engine, "(module (func (export \"spin\") (loop (br 0))))")
                .expect("module");
        let (done, ended) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut store = wasmtime::Store::new(&engine, ());
            store.set_epoch_deadline(3);
            let instance = wasmtime::Instance::new(&mut store, &module, &[]).expect("instance");
            let spin = instance
                .get_typed_func::<(), ()>(&mut store, "spin")
                .expect("spin");
            let ticker = Ticker::of(&engine).expect("the engine's ticker is registered");
            let _running = Running::start(Some(&ticker));
            let _ = done.send(spin.call(&mut store, ()).is_err());
        });
        // Far beyond the 3 ticks the deadline is: only a ticker that never
        // woke would miss it.
        let trapped = ended
            .recv_timeout(Duration::from_secs(30))
            .expect("the loop was interrupted: the parked ticker woke");
        assert!(trapped, "the loop ended by the epoch deadline");
    }
}
