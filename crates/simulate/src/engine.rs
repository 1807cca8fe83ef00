//! The event loop of one simulated data center in one mode.
//!
//! State per server: a [`Residency`] (the live node's LRU under a byte
//! budget), the time of its last idle sweep, and — on homes — the counters of
//! the admission control. Requests are handled in arrival order; the only
//! other events are request completions, kept in a binary heap and applied
//! before each arrival, because they are all that in-flight counters need.
//! Idle eviction is the live runtime's sweep (the same
//! [`Residency::evict_idle_above`]), run lazily: the runtime sweeps every
//! second in the background, the simulator sweeps a server when it serves a
//! request and its last sweep is more than a second old. A request meets
//! the same residency either way (swept within the last second); only a
//! server without traffic holds its idle Workers, in the memory gauges,
//! until its next request, which saves an event per server per second.
//!
//! A request for Worker `w` received by server `r`:
//!
//! * **unsharded** — served on `r`;
//! * **sharded** — [`decide`]`(r, home(w), r has w resident)`:
//!   `Serve(route)` is served on `r`; `Forward(h)` asks `h`'s admission
//!   control (the live gate's rule, [`hearth_sharding::admission::admit`], with
//!   `can_host` = resident or [`Residency::fits_without_evicting_busy`] as in
//!   the runtime), and [`after_forward`] of the answer gives
//!   [`Route::Sharded`] (served on `h`, counted in flight there until it
//!   completes) or [`Route::Fallback`] (served on `r`, which keeps it warm).
//!
//! Serving on server `s` at time `t`: a resident Worker whose load finished
//! is a warm request ([`Residency::get`] counts the use); one still loading
//! makes the request wait for it (a cold request, as the runtime counts
//! requests that wait on a load); otherwise it is a cold start: the Worker is
//! inserted ([`Residency::insert`], evicting LRU entries under pressure) and
//! is ready `cold_start_ms` later. Memory is charged from the start of the
//! load.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use hearth_residency::{Evicted, EvictionCause, Residency};
use hearth_sharding::admission::{self, OverloadConfig, RefusalReason};
use hearth_sharding::routing::{Decision, HomeAnswer, Route, after_forward, decide};
use serde::Serialize;

use super::model::Request;

/// Idle sweeps run at most this often per server, as in the runtime
/// (`hearth_runtime::eviction::IDLE_SWEEP_EVERY`).
const SWEEP_EVERY_MS: u64 = 1000;

/// Largest `servers × workers` for which each cold start is attributed to
/// why the Worker was last evicted from that server (one byte per pair).
const MAX_ATTRIBUTION_CELLS: u64 = 1 << 28;

/// Which data center is simulated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// A plain load balancer: every server serves what it receives.
    Unsharded,
    /// Worker sharding with the live node's routing decision.
    Sharded,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Unsharded => "unsharded",
            Mode::Sharded => "sharded",
        }
    }
}

/// What all modes share: the Workers and the policy parameters.
pub(crate) struct World<'a> {
    /// Home server of each Worker, from the ring.
    pub home: &'a [u32],
    /// Memory size of each Worker, bytes.
    pub size: &'a [u64],
    pub servers: u32,
    pub memory_bytes: u64,
    pub idle_ms: u64,
    pub busy_ms: u64,
    pub cold_start_ms: u64,
    pub overload: OverloadConfig,
    pub prewarm_home: bool,
    /// The idle sweep runs only on a server holding at least this many
    /// bytes (0: always, as the runtime does).
    pub idle_sweep_above: u64,
    /// Requests simulated before counting starts.
    pub warmup_requests: u64,
}

/// Requests (or cold starts) by the route that served them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RouteCounts {
    /// Warm on the receiving server ([`Route::Local`]).
    pub local: u64,
    /// The receiving server is the home ([`Route::Home`]).
    pub home: u64,
    /// Forwarded to and served by the home ([`Route::Sharded`]).
    pub sharded: u64,
    /// Forwarded, refused, served by the receiving server ([`Route::Fallback`]).
    pub fallback: u64,
}

impl RouteCounts {
    fn bump(&mut self, route: Route) {
        *match route {
            Route::Local => &mut self.local,
            Route::Home => &mut self.home,
            Route::Sharded => &mut self.sharded,
            Route::Fallback => &mut self.fallback,
        } += 1;
    }
}

/// Refusals by the home, by reason (sharded mode).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Refusals {
    /// The Worker had `max_in_flight_per_worker` sharded requests in flight.
    pub worker_busy: u64,
    /// The home had `max_in_flight_node` sharded requests in flight.
    pub node_busy: u64,
    /// The home could not host the Worker without evicting a busy one.
    pub no_memory: u64,
}

impl Refusals {
    /// All refusals.
    pub fn total(&self) -> u64 {
        self.worker_busy + self.node_busy + self.no_memory
    }
}

/// Why a cold start happened: what the server knew of the Worker before.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ColdCauses {
    /// The Worker had never been loaded anywhere in the data center: no
    /// policy short of prewarming can avoid these.
    pub first_in_dc: u64,
    /// Loaded elsewhere before, never on this server.
    pub first_on_server: u64,
    /// Last left this server under memory pressure.
    pub after_pressure: u64,
    /// Last left this server after the idle timeout.
    pub after_idle: u64,
    /// Whether causes were recorded (off when servers × Workers exceeds
    /// 2^28, to bound memory; then only `first_in_dc` is counted).
    pub attributed: bool,
}

/// The measured outcome of one mode.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModeReport {
    /// `unsharded` or `sharded`.
    pub mode: &'static str,
    /// Requests counted (after the warm-up).
    pub requests: u64,
    /// Requests served by a ready, resident Worker.
    pub warm_requests: u64,
    /// Requests that waited for a load: the one that caused it and any that
    /// arrived at the same server while it ran.
    pub cold_requests: u64,
    /// `warm_requests / requests`.
    pub warm_rate: f64,
    /// `warm_requests / (requests - cold_start_causes.first_in_dc)`: the
    /// warm rate if every Worker had been loaded once before the run, i.e.
    /// without compulsory first loads. Meaningful when the idle timeout
    /// exceeds the warm-up (otherwise first loads are steady-state cold
    /// starts and [`ModeReport::warm_rate`] is the number).
    pub warm_rate_after_first_loads: f64,
    /// Loads caused by requests (cold starts).
    pub cold_starts: u64,
    /// Cold starts by what preceded them.
    pub cold_start_causes: ColdCauses,
    /// Loads at the home without a request (`--prewarm-home`).
    pub prewarm_loads: u64,
    /// Evictions under memory pressure.
    pub evictions_pressure: u64,
    /// Evictions after the idle timeout.
    pub evictions_idle: u64,
    /// All evictions per server per hour of virtual time.
    pub evictions_per_server_hour: f64,
    /// Requests by route (all zero when unsharded).
    pub routes: RouteCounts,
    /// Cold requests by route (all zero when unsharded).
    pub cold_by_route: RouteCounts,
    /// `routes.sharded / requests`: requests served by the home for another
    /// server.
    pub fraction_sharded: f64,
    /// The home's refusals.
    pub refusals: Refusals,
    /// Resident bytes per server, averaged over servers and virtual time.
    pub mean_resident_bytes_per_server: f64,
    /// Most bytes resident on any server at any time.
    pub peak_resident_bytes_per_server: u64,
    /// Resident Workers per server, averaged over servers and virtual time.
    pub mean_resident_workers_per_server: f64,
    /// Virtual time counted, from the first counted request to the last.
    pub virtual_seconds: f64,
}

impl ModeReport {
    /// All evictions (pressure and idle).
    pub fn evictions(&self) -> u64 {
        self.evictions_pressure + self.evictions_idle
    }
}

/// Raw counters of the measured part of a run.
#[derive(Default)]
struct Counters {
    requests: u64,
    warm: u64,
    cold: u64,
    loads: u64,
    causes: ColdCauses,
    prewarm_loads: u64,
    pressure: u64,
    idle: u64,
    routes: RouteCounts,
    cold_by_route: RouteCounts,
    refusals: Refusals,
}

/// Cause codes in the attribution table.
const NEVER: u8 = 0;
const LEFT_PRESSURE: u8 = 1;
const LEFT_IDLE: u8 = 2;
const LEFT_OTHER: u8 = 3;

struct Sim<'w> {
    mode: Mode,
    w: &'w World<'w>,
    /// Per server: Worker index → when its load finishes (virtual ms).
    resident: Vec<Residency<u32, u64>>,
    last_sweep_ms: Vec<u64>,
    /// Sharded requests in flight on each home / for each Worker (always on
    /// its home, so one counter per Worker suffices).
    node_in_flight: Vec<usize>,
    worker_in_flight: Vec<usize>,
    /// (end time, Worker) of sharded requests in flight.
    completions: BinaryHeap<Reverse<(u64, u32)>>,
    /// `servers × workers` bytes: why Worker `w` last left server `s`.
    left_because: Option<Vec<u8>>,
    ever_loaded: Vec<bool>,
    workers: usize,
    // Gauges, integrated over virtual time while measuring.
    total_used: u64,
    total_entries: u64,
    area_bytes: u128,
    area_entries: u128,
    peak_used: u64,
    measuring: bool,
    measure_start_ms: u64,
    last_ms: u64,
    c: Counters,
}

/// What serving one request did.
struct Served {
    /// How long the request waited for its Worker to be ready.
    wait_ms: u64,
    /// Whether this request caused a load.
    loaded: bool,
}

impl<'w> Sim<'w> {
    fn new(mode: Mode, w: &'w World<'w>) -> Self {
        let servers = w.servers as usize;
        let workers = w.size.len();
        let cells = servers as u64 * workers as u64;
        Sim {
            mode,
            w,
            resident: (0..servers)
                .map(|_| Residency::new(w.memory_bytes))
                .collect(),
            last_sweep_ms: vec![0; servers],
            node_in_flight: vec![0; servers],
            worker_in_flight: vec![0; workers],
            completions: BinaryHeap::new(),
            left_because: (cells <= MAX_ATTRIBUTION_CELLS).then(|| vec![NEVER; cells as usize]),
            ever_loaded: vec![false; workers],
            workers,
            total_used: 0,
            total_entries: 0,
            area_bytes: 0,
            area_entries: 0,
            peak_used: 0,
            measuring: false,
            measure_start_ms: 0,
            last_ms: 0,
            c: Counters::default(),
        }
    }

    fn start_measuring(&mut self, now: u64) {
        self.measuring = true;
        self.measure_start_ms = now;
        self.last_ms = now;
        self.peak_used = self.resident.iter().map(Residency::used).max().unwrap_or(0);
    }

    /// Moves virtual time to `now`: integrates the gauges and completes the
    /// sharded requests that ended by then.
    fn advance(&mut self, now: u64) {
        if self.measuring && now > self.last_ms {
            let dt = u128::from(now - self.last_ms);
            self.area_bytes += u128::from(self.total_used) * dt;
            self.area_entries += u128::from(self.total_entries) * dt;
            self.last_ms = now;
        }
        while let Some(&Reverse((end, worker))) = self.completions.peek() {
            if end > now {
                break;
            }
            self.completions.pop();
            let home = self.w.home[worker as usize] as usize;
            self.worker_in_flight[worker as usize] -= 1;
            self.node_in_flight[home] -= 1;
        }
    }

    fn handle(&mut self, req: Request) {
        let Request {
            t_ms: now,
            worker,
            server: here,
            duration_ms,
        } = req;
        if self.measuring {
            self.c.requests += 1;
        }
        match self.mode {
            Mode::Unsharded => {
                self.serve(here, worker, now, None);
            }
            Mode::Sharded => {
                let home = self.w.home[worker as usize];
                let warm_here = self.resident[here as usize].contains(&worker);
                match decide(&here, Some(&home), warm_here) {
                    Decision::Serve(route) => {
                        self.serve(here, worker, now, Some(route));
                    }
                    Decision::Forward(&home) => {
                        let answer = match self.admit(home, worker, now) {
                            Ok(()) => HomeAnswer::Accepted,
                            Err(reason) => {
                                if self.measuring {
                                    *match reason {
                                        RefusalReason::WorkerBusy => {
                                            &mut self.c.refusals.worker_busy
                                        }
                                        RefusalReason::NodeBusy => &mut self.c.refusals.node_busy,
                                        RefusalReason::NoMemory => &mut self.c.refusals.no_memory,
                                    } += 1;
                                }
                                HomeAnswer::Refused
                            }
                        };
                        let route = after_forward(answer);
                        if route == Route::Sharded {
                            let served = self.serve(home, worker, now, Some(route));
                            self.worker_in_flight[worker as usize] += 1;
                            self.node_in_flight[home as usize] += 1;
                            let end = now + served.wait_ms + duration_ms;
                            self.completions.push(Reverse((end, worker)));
                        } else {
                            let served = self.serve(here, worker, now, Some(route));
                            if self.w.prewarm_home && served.loaded {
                                self.prewarm(home, worker, now);
                            }
                        }
                    }
                }
            }
        }
    }

    /// The home's admission control: the live gate's rule
    /// ([`hearth_sharding::admission::admit`]) on the simulated counters.
    fn admit(&self, home: u32, worker: u32, now: u64) -> Result<(), RefusalReason> {
        let r = &self.resident[home as usize];
        admission::admit(
            &self.w.overload,
            self.node_in_flight[home as usize],
            self.worker_in_flight[worker as usize],
            || {
                r.contains(&worker)
                    || r.fits_without_evicting_busy(
                        self.w.size[worker as usize],
                        now,
                        self.w.busy_ms,
                    )
            },
        )
    }

    /// Serves a request for `worker` on `server`; `route` is `None` when
    /// unsharded.
    fn serve(&mut self, server: u32, worker: u32, now: u64, route: Option<Route>) -> Served {
        let s = server as usize;
        if now.saturating_sub(self.last_sweep_ms[s]) > SWEEP_EVERY_MS {
            self.sweep(server, now);
        }
        let ready = self.resident[s].get(&worker, now).copied();
        let served = match ready {
            Some(ready) if ready <= now => {
                if self.measuring {
                    self.c.warm += 1;
                }
                Served {
                    wait_ms: 0,
                    loaded: false,
                }
            }
            Some(ready) => Served {
                wait_ms: ready - now,
                loaded: false,
            },
            None => {
                self.load(server, worker, now, false);
                Served {
                    wait_ms: self.w.cold_start_ms,
                    loaded: true,
                }
            }
        };
        if self.measuring {
            let cold = ready.is_none_or(|ready| ready > now);
            if cold {
                self.c.cold += 1;
            }
            if let Some(route) = route {
                self.c.routes.bump(route);
                if cold {
                    self.c.cold_by_route.bump(route);
                }
            }
        }
        served
    }

    /// `--prewarm-home`: after a fallback cold start, also load the Worker at
    /// its home if the home can take it without evicting busy Workers.
    fn prewarm(&mut self, home: u32, worker: u32, now: u64) {
        let r = &self.resident[home as usize];
        if r.contains(&worker)
            || !r.fits_without_evicting_busy(self.w.size[worker as usize], now, self.w.busy_ms)
        {
            return;
        }
        self.load(home, worker, now, true);
    }

    /// Cold-starts `worker` on `server`: makes it resident, ready after the
    /// cold-start time, and counts what that evicted.
    fn load(&mut self, server: u32, worker: u32, now: u64, prewarm: bool) {
        let s = server as usize;
        let cell = s * self.workers + worker as usize;
        if self.measuring {
            if prewarm {
                self.c.prewarm_loads += 1;
            } else {
                self.c.loads += 1;
                let causes = &mut self.c.causes;
                if !self.ever_loaded[worker as usize] {
                    causes.first_in_dc += 1;
                } else if let Some(table) = &self.left_because {
                    match table[cell] {
                        LEFT_PRESSURE => causes.after_pressure += 1,
                        LEFT_IDLE => causes.after_idle += 1,
                        _ => causes.first_on_server += 1,
                    }
                }
            }
        }
        self.ever_loaded[worker as usize] = true;
        let bytes = self.w.size[worker as usize];
        let (used, len) = (self.resident[s].used(), self.resident[s].len());
        let evicted = self.resident[s].insert(worker, now + self.w.cold_start_ms, bytes, now);
        self.account(server, used, len, evicted);
        self.peak_used = self.peak_used.max(self.resident[s].used());
    }

    /// The runtime's idle sweep on `server` (skipped below
    /// `idle_sweep_above` bytes).
    fn sweep(&mut self, server: u32, now: u64) {
        let s = server as usize;
        self.last_sweep_ms[s] = now;
        let (used, len) = (self.resident[s].used(), self.resident[s].len());
        let evicted =
            self.resident[s].evict_idle_above(now, self.w.idle_ms, self.w.idle_sweep_above);
        self.account(server, used, len, evicted);
    }

    /// Updates gauges after an operation on `server` that had `used` bytes
    /// and `len` entries before, and records its evictions.
    fn account(&mut self, server: u32, used: u64, len: usize, evicted: Vec<Evicted<u32, u64>>) {
        let r = &self.resident[server as usize];
        self.total_used = self.total_used + r.used() - used;
        self.total_entries = self.total_entries + r.len() as u64 - len as u64;
        for e in evicted {
            let code = match e.cause {
                EvictionCause::Pressure => LEFT_PRESSURE,
                EvictionCause::Idle => LEFT_IDLE,
                EvictionCause::Replaced | EvictionCause::Manual => LEFT_OTHER,
            };
            if self.measuring {
                match e.cause {
                    EvictionCause::Pressure => self.c.pressure += 1,
                    EvictionCause::Idle => self.c.idle += 1,
                    EvictionCause::Replaced | EvictionCause::Manual => {}
                }
            }
            if let Some(table) = &mut self.left_because {
                table[server as usize * self.workers + e.key as usize] = code;
            }
        }
    }

    fn finish(self) -> ModeReport {
        let c = &self.c;
        let servers = f64::from(self.w.servers.max(1));
        let span_ms = self.last_ms.saturating_sub(self.measure_start_ms);
        let (mean_bytes, mean_entries) = if span_ms > 0 {
            let per = span_ms as f64 * servers;
            (self.area_bytes as f64 / per, self.area_entries as f64 / per)
        } else {
            (
                self.total_used as f64 / servers,
                self.total_entries as f64 / servers,
            )
        };
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        let hours = span_ms as f64 / 3_600_000.0;
        let evictions = c.pressure + c.idle;
        let mut causes = c.causes;
        causes.attributed = self.left_because.is_some();
        ModeReport {
            mode: self.mode.name(),
            requests: c.requests,
            warm_requests: c.warm,
            cold_requests: c.cold,
            warm_rate: ratio(c.warm, c.requests),
            warm_rate_after_first_loads: ratio(
                c.warm,
                c.requests.saturating_sub(c.causes.first_in_dc),
            ),
            cold_starts: c.loads,
            cold_start_causes: causes,
            prewarm_loads: c.prewarm_loads,
            evictions_pressure: c.pressure,
            evictions_idle: c.idle,
            evictions_per_server_hour: if hours > 0.0 {
                evictions as f64 / (servers * hours)
            } else {
                0.0
            },
            routes: c.routes,
            cold_by_route: c.cold_by_route,
            fraction_sharded: ratio(c.routes.sharded, c.requests),
            refusals: c.refusals,
            mean_resident_bytes_per_server: mean_bytes,
            peak_resident_bytes_per_server: self.peak_used,
            mean_resident_workers_per_server: mean_entries,
            virtual_seconds: span_ms as f64 / 1000.0,
        }
    }
}

/// Runs one mode over `arrivals` and reports what it measured.
pub(crate) fn run_mode(
    mode: Mode,
    world: &World<'_>,
    arrivals: impl Iterator<Item = Request>,
) -> ModeReport {
    let mut sim = Sim::new(mode, world);
    for (i, req) in (0u64..).zip(arrivals) {
        if i == world.warmup_requests {
            sim.start_measuring(req.t_ms);
        }
        sim.advance(req.t_ms);
        sim.handle(req);
    }
    sim.finish()
}
