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
//! stopped within about a tick of its limit. The same callback makes a guest
//! yield to the executor, but only once the poll in progress has itself run
//! for a tick (`CpuMeter::tick`): a long poll never holds a worker thread
//! much longer, and a short request that merely straddles a tick is not
//! suspended and polled again for nothing.
//!
//! # A flow's CPU for nested calls
//!
//! Each invocation has its own CPU limit, and a nested call's limit is at
//! most what its caller had left; but siblings do not share one: a Worker
//! calling its binding a thousand times (six at a time, see
//! [`crate::outbound::outgoing`]) would get a thousand callee limits. So every flow
//! (one client request and all the nested invocations it causes) has one
//! budget for the CPU of its **nested** invocations, a [`FlowCpu`]: at
//! most [`NESTED_CPU_FACTOR`] times the entry Worker's per-request CPU
//! limit. Why that size: it leaves a legitimate flow room for callees that
//! together work as hard as their entry Worker (twice over), while a
//! fan-out can never cost more than a small multiple of one request.
//!
//! The entry's node creates the budget at the flow's first nested call,
//! with a random flow ID. Every nested invocation of the flow on a node
//! draws from that node's budget for the flow (`FlowPools`, kept until
//! the flow's deadline): its meter charges the budget as it runs (checked
//! every epoch tick, so siblings running at once stop together when it is
//! spent), and its own limit is at most what the budget has left when it
//! starts. A call that crosses a shard hop carries the flow ID and what is
//! left ([`crate::flow::Flow::nested_cpu`], the context stack on the
//! wire); the receiving node starts its budget for the flow from that once
//! and draws every later arrival of the flow from it. So a flow's nested
//! invocations use at most the budget on each node they run on. When the
//! budget is spent a further nested call fails in the caller with a clear
//! `internal-error` message, and a callee still running is stopped (503).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// A flow's CPU budget for its nested invocations, as a multiple of its
/// entry Worker's per-request CPU limit (see the module docs).
pub const NESTED_CPU_FACTOR: u32 = 2;

/// A flow's CPU budget for nested invocations on one node (see the module
/// docs): drawn from by every nested invocation of the flow here.
#[derive(Debug)]
pub struct FlowCpu {
    left_ns: AtomicI64,
    budget: Duration,
}

impl FlowCpu {
    /// A budget of `budget`.
    pub fn new(budget: Duration) -> Self {
        FlowCpu {
            left_ns: AtomicI64::new(i64::try_from(budget.as_nanos()).unwrap_or(i64::MAX)),
            budget,
        }
    }

    /// What is left (zero once spent).
    pub fn left(&self) -> Duration {
        Duration::from_nanos(u64::try_from(self.left_ns.load(Ordering::Relaxed)).unwrap_or(0))
    }

    /// The budget it started with.
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// Marks the budget spent: another node of the flow found it spent
    /// there ([`crate::flow::FLOW_CPU_SPENT`]), so calls from here stop too.
    pub fn spend_all(&self) {
        self.left_ns.store(0, Ordering::Relaxed);
    }

    /// Charges `ns`; whether anything is left after it.
    fn charge(&self, ns: u64) -> bool {
        let ns = i64::try_from(ns).unwrap_or(i64::MAX);
        self.left_ns.fetch_sub(ns, Ordering::Relaxed) > ns
    }
}

/// One node's [`FlowCpu`] budgets, by flow ID, each kept until its flow's
/// deadline (a flow's later calls to this node draw from the same one).
#[derive(Debug, Default)]
pub(crate) struct FlowPools {
    inner: Mutex<PoolMap>,
}

#[derive(Debug, Default)]
struct PoolMap {
    pools: HashMap<u64, (Arc<FlowCpu>, Instant)>,
    /// Size at which expired budgets are swept out next.
    sweep_at: usize,
}

/// Budgets held before the first sweep of expired ones.
const POOLS_SWEEP_AT: usize = 1024;

impl FlowPools {
    /// The budget of flow `flow_id` here, started with `left` until `until`
    /// if this node has none for it yet.
    pub(crate) fn get_or_start(
        &self,
        flow_id: u64,
        left: Duration,
        until: Instant,
    ) -> Arc<FlowCpu> {
        let mut m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if m.pools.len() >= m.sweep_at.max(POOLS_SWEEP_AT) {
            let now = Instant::now();
            m.pools.retain(|_, (_, until)| *until > now);
            m.sweep_at = m.pools.len() * 2;
        }
        m.pools
            .entry(flow_id)
            .or_insert_with(|| (Arc::new(FlowCpu::new(left)), until))
            .0
            .clone()
    }

    /// Budgets held now (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().map(|m| m.pools.len()).unwrap_or(0)
    }
}

/// A flow's CPU budget for nested invocations as a call carries it: the
/// flow's ID and what the calling node's budget has left (see the module
/// docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NestedCpu {
    /// The flow's ID (never 0).
    pub flow_id: u64,
    /// CPU left of the budget on the calling node when it called.
    pub left: Duration,
}

/// An invocation's view of its flow's [`FlowCpu`] on this node: a nested
/// invocation draws from it for its own CPU and its calls; an entry creates
/// it at its first nested call (most requests make none).
pub(crate) struct FlowCpuHandle {
    pools: Arc<FlowPools>,
    pool: std::sync::OnceLock<(u64, Arc<FlowCpu>)>,
    /// The size of the budget an entry creates.
    budget: Duration,
    /// The flow's deadline: how long this node keeps the budget.
    until: Instant,
    nested: bool,
}

impl FlowCpuHandle {
    /// A flow's entry whose per-request CPU limit is `request_cpu`: its
    /// flow's budget will be [`NESTED_CPU_FACTOR`] times that.
    pub(crate) fn entry(pools: Arc<FlowPools>, request_cpu: Duration, until: Instant) -> Self {
        FlowCpuHandle {
            pools,
            pool: std::sync::OnceLock::new(),
            budget: request_cpu.saturating_mul(NESTED_CPU_FACTOR),
            until,
            nested: false,
        }
    }

    /// A nested invocation of the flow `n` names: its budget on this node.
    pub(crate) fn nested(pools: Arc<FlowPools>, n: NestedCpu, until: Instant) -> Self {
        let handle = FlowCpuHandle {
            pool: std::sync::OnceLock::new(),
            budget: n.left,
            until,
            nested: true,
            pools,
        };
        let pool = handle.pools.get_or_start(n.flow_id, n.left, until);
        let _ = handle.pool.set((n.flow_id, pool));
        handle
    }

    /// The flow's ID and budget here (an entry's is created now, once).
    pub(crate) fn pool(&self) -> (u64, Arc<FlowCpu>) {
        self.pool
            .get_or_init(|| {
                let id = new_flow_id();
                (id, self.pools.get_or_start(id, self.budget, self.until))
            })
            .clone()
    }

    /// The budget this invocation's own CPU is charged to: a nested
    /// invocation's flow budget (an entry's own CPU has its own limit).
    pub(crate) fn charged(&self) -> Option<Arc<FlowCpu>> {
        if self.nested {
            self.pool.get().map(|(_, p)| p.clone())
        } else {
            None
        }
    }
}

/// A new flow ID: 64 bits of (time, counter, process) through blake3, so
/// flows started on different nodes do not collide. Never 0.
pub(crate) fn new_flow_id() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = blake3::Hasher::new();
    h.update(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    crate::config::add_time_and_process(&mut h);
    let mut id = [0u8; 8];
    id.copy_from_slice(&h.finalize().as_bytes()[..8]);
    u64::from_le_bytes(id).max(1)
}

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

/// Told the script ID and handler CPU time of each invocation as it ends
/// ([`Runtime::observe_cpu`](crate::Runtime::observe_cpu)); runs on the
/// invocation's task, so it must be quick.
pub type CpuObserver = Arc<dyn Fn(&str, Duration) + Send + Sync>;

/// The CPU one instance has used against a budget, shared between the
/// future that runs it and its store's epoch callback.
#[derive(Debug, Default)]
pub struct CpuMeter {
    used_ns: AtomicU64,
    /// Thread CPU time at the start of the poll in progress; 0 when idle.
    poll_start_ns: AtomicU64,
    budget_ns: AtomicU64,
    /// The epoch ticker that must be awake while this meter's guest runs
    /// ([`crate::instances::epoch`]); set when the instance starts.
    ticker: std::sync::OnceLock<std::sync::Arc<crate::instances::epoch::Ticker>>,
    /// The flow budget this phase also draws from (a nested invocation's),
    /// and how much of `used` it has been charged.
    flow: Mutex<Option<(Arc<FlowCpu>, u64)>>,
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
    /// Set when what ran out is the flow's budget for nested invocations
    /// ([`FlowCpu`]), to its size.
    pub flow: Option<Duration>,
}

impl CpuMeter {
    /// Ties this meter to `engine`'s epoch ticker, which then stays awake
    /// while the meter's guest runs.
    pub(crate) fn attach_ticker(&self, engine: &wasmtime::Engine) {
        if let Some(t) = crate::instances::epoch::Ticker::of(engine) {
            let _ = self.ticker.set(t);
        }
    }

    /// Starts a new phase (startup or one request) with `budget`, from zero.
    pub fn reset(&self, budget: Duration) {
        self.reset_in_flow(budget, None);
    }

    /// [`CpuMeter::reset`] for a phase that also draws from `flow` (a
    /// nested invocation's flow budget, [`FlowCpu`]).
    pub fn reset_in_flow(&self, budget: Duration, flow: Option<Arc<FlowCpu>>) {
        self.used_ns.store(0, Ordering::Relaxed);
        self.budget_ns
            .store(budget.as_nanos() as u64, Ordering::Relaxed);
        *self.flow.lock().unwrap_or_else(|p| p.into_inner()) = flow.map(|f| (f, 0));
    }

    /// Charges the flow budget (if any) with what this phase used since it
    /// was last charged; whether the budget has anything left.
    pub fn settle_flow(&self) -> bool {
        let mut flow = self.flow.lock().unwrap_or_else(|p| p.into_inner());
        let Some((pool, charged)) = flow.as_mut() else {
            return true;
        };
        let used = self.used().as_nanos() as u64;
        let delta = used.saturating_sub(*charged);
        *charged = used.max(*charged);
        if delta == 0 {
            return !pool.left().is_zero();
        }
        pool.charge(delta)
    }

    /// The flow budget's size, if this phase draws from one.
    fn flow_budget(&self) -> Option<Duration> {
        self.flow
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|(f, _)| f.budget())
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

    /// What an epoch tick does while a guest runs
    /// ([`crate::instances::instance`]'s deadline callback): the check of
    /// [`CpuMeter::check`], then whether the guest should yield to the
    /// executor. It yields only once the poll in progress has run for at least
    /// [`EPOCH_TICK`](crate::instances::epoch::EPOCH_TICK) of CPU: a poll is
    /// still never longer than about two ticks, but a short request that merely
    /// straddles a tick (a quarter of those taking 250 µs) is not suspended,
    /// rescheduled and polled again for nothing.
    pub(crate) fn tick(&self) -> Result<bool, CpuExceeded> {
        // Read before `check`, which reads the clock itself: the poll ran
        // at least this long.
        let start = self.poll_start_ns.load(Ordering::Relaxed);
        self.check()?;
        if start == 0 {
            return Ok(true);
        }
        let ran = (thread_cpu_time().as_nanos() as u64).saturating_sub(start);
        Ok(ran >= crate::instances::epoch::EPOCH_TICK.as_nanos() as u64)
    }

    /// `Err` once the phase is over budget; called from the epoch callback.
    /// The flow budget it draws from (if any) is charged too, and spent
    /// is over budget as well.
    pub fn check(&self) -> Result<(), CpuExceeded> {
        let used = self.used();
        let budget = self.budget();
        if used > budget {
            self.settle_flow();
            return Err(CpuExceeded {
                used,
                budget,
                flow: None,
            });
        }
        if !self.settle_flow() {
            return Err(CpuExceeded {
                used,
                budget,
                flow: self.flow_budget(),
            });
        }
        Ok(())
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
        let _running =
            crate::instances::epoch::Running::start(this.meter.ticker.get().map(|t| &**t));
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

    #[tokio::test(flavor = "current_thread")]
    async fn a_tick_yields_only_once_the_poll_ran_a_tick_and_still_stops_an_overrun() {
        let meter = Arc::new(CpuMeter::default());
        meter.reset(Duration::from_secs(10));
        let m = meter.clone();
        let (early, late) = Metered::new(
            async move {
                let early = m.tick().expect("within budget");
                spin(crate::instances::epoch::EPOCH_TICK);
                (early, m.tick().expect("within budget"))
            },
            meter.clone(),
        )
        .await;
        assert!(!early, "yielded before the poll ran a tick");
        assert!(late, "did not yield after a tick");
        // Over budget, the tick stops the guest whatever the poll ran.
        meter.reset(Duration::from_millis(1));
        let m = meter.clone();
        let stopped = Metered::new(
            async move {
                spin(Duration::from_millis(2));
                m.tick()
            },
            meter,
        )
        .await;
        assert!(stopped.is_err());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn siblings_draw_from_one_flow_budget() {
        let pools = FlowPools::default();
        let until = Instant::now() + Duration::from_secs(60);
        let pool = pools.get_or_start(9, Duration::from_millis(30), until);
        // A later arrival of the same flow gets the same budget, whatever
        // it says is left.
        assert!(Arc::ptr_eq(
            &pool,
            &pools.get_or_start(9, Duration::from_secs(5), until)
        ));
        let mut stopped = 0;
        for _ in 0..5 {
            let meter = Arc::new(CpuMeter::default());
            meter.reset_in_flow(Duration::from_millis(20), Some(pool.clone()));
            Metered::new(async { spin(Duration::from_millis(10)) }, meter.clone()).await;
            if let Err(e) = meter.check() {
                assert_eq!(e.flow, Some(Duration::from_millis(30)));
                stopped += 1;
            }
        }
        assert!(pool.left().is_zero(), "{:?} left", pool.left());
        assert!(stopped >= 2, "{stopped} of 5 siblings stopped");
        assert_eq!(pools.len(), 1);
    }
}
