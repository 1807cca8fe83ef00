//! CPU time metering: how hearth knows how much CPU a Worker used.
//!
//! A Worker runs inside a future that tokio polls on some worker thread. A
//! [`Metered`] future reads the thread's CPU clock
//! (`CLOCK_THREAD_CPUTIME_ID`, ≈0.5 µs a read) before and after each poll
//! and adds the difference to a [`CpuMeter`], so time spent waiting between
//! polls is never charged. Reading the clock on every host call would cost
//! more than many host calls, so it is read per poll only.
//!
//! A loop that never returns to the executor is caught by epoch
//! interruption: the engine's ticker bumps the epoch every millisecond, and
//! the store's deadline callback ([`CpuMeter::check`]) adds the CPU of the
//! poll in progress and stops the Worker once it is over budget, so a loop is
//! stopped within about a tick of its limit.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

/// CPU time used by the calling thread so far.
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID is
    // supported on every Linux and macOS hearth runs on.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The CPU one instance has used against a budget, shared between the
/// future that runs it and its store's epoch callback.
#[derive(Debug, Default)]
pub struct CpuMeter {
    used_ns: AtomicU64,
    /// Thread CPU time at the start of the poll in progress; 0 when idle.
    poll_start_ns: AtomicU64,
    budget_ns: AtomicU64,
    /// The epoch ticker that must be awake while this meter's guest runs
    /// ([`crate::epoch`]); set when the instance starts.
    ticker: std::sync::OnceLock<std::sync::Arc<crate::epoch::Ticker>>,
}

/// A budget was exceeded: the error a store's epoch callback raises, which
/// surfaces as the Worker's trap.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("CPU budget exceeded: used {used:?} of {budget:?}")]
pub struct CpuExceeded {
    /// CPU used when the Worker was stopped.
    pub used: Duration,
    /// The budget that applied.
    pub budget: Duration,
}

impl CpuMeter {
    /// Ties this meter to `engine`'s epoch ticker, which then stays awake
    /// while the meter's guest runs.
    pub(crate) fn attach_ticker(&self, engine: &wasmtime::Engine) {
        if let Some(t) = crate::epoch::Ticker::of(engine) {
            let _ = self.ticker.set(t);
        }
    }

    /// Starts a new phase (startup or one request) with `budget`, from zero.
    pub fn reset(&self, budget: Duration) {
        self.used_ns.store(0, Ordering::Relaxed);
        self.budget_ns
            .store(budget.as_nanos() as u64, Ordering::Relaxed);
    }

    /// CPU used in this phase, including the poll in progress.
    pub fn used(&self) -> Duration {
        let mut ns = self.used_ns.load(Ordering::Relaxed);
        let start = self.poll_start_ns.load(Ordering::Relaxed);
        if start != 0 {
            ns += (thread_cpu_time().as_nanos() as u64).saturating_sub(start);
        }
        Duration::from_nanos(ns)
    }

    /// The budget of this phase.
    pub fn budget(&self) -> Duration {
        Duration::from_nanos(self.budget_ns.load(Ordering::Relaxed))
    }

    /// `Err` once the phase is over budget; called from the epoch callback.
    pub fn check(&self) -> Result<(), CpuExceeded> {
        let used = self.used();
        let budget = self.budget();
        if used > budget {
            Err(CpuExceeded { used, budget })
        } else {
            Ok(())
        }
    }
}

/// A future whose polls are charged to a [`CpuMeter`].
pub struct Metered<F> {
    inner: Pin<Box<F>>,
    meter: Arc<CpuMeter>,
}

impl<F> Metered<F> {
    /// Wraps `inner` so each of its polls is charged to `meter`.
    pub fn new(inner: F, meter: Arc<CpuMeter>) -> Self {
        Metered {
            inner: Box::pin(inner),
            meter,
        }
    }
}

impl<F: Future> Future for Metered<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        // The epoch ticker stays awake while this poll runs guest code.
        let _running = crate::epoch::Running::start(this.meter.ticker.get().map(|t| &**t));
        let start = (thread_cpu_time().as_nanos() as u64).max(1);
        this.meter.poll_start_ns.store(start, Ordering::Relaxed);
        let out = this.inner.as_mut().poll(cx);
        let end = thread_cpu_time().as_nanos() as u64;
        this.meter.poll_start_ns.store(0, Ordering::Relaxed);
        this.meter
            .used_ns
            .fetch_add(end.saturating_sub(start), Ordering::Relaxed);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spin(d: Duration) {
        let t0 = thread_cpu_time();
        while thread_cpu_time() - t0 < d {
            std::hint::black_box(0u64);
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn charges_cpu_not_sleep() {
        let meter = Arc::new(CpuMeter::default());
        meter.reset(Duration::from_millis(15));
        Metered::new(
            async {
                spin(Duration::from_millis(20));
                tokio::time::sleep(Duration::from_millis(100)).await;
            },
            meter.clone(),
        )
        .await;
        let used = meter.used();
        assert!(used >= Duration::from_millis(20), "{used:?}");
        assert!(
            used < Duration::from_millis(90),
            "sleep was charged: {used:?}"
        );
        assert!(meter.check().is_err());
    }
}
