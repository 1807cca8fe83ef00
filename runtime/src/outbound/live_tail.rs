//! The live tail: every finished request of a Worker on this node, as it
//! happens, to whoever is watching (`hearth tail`, the admin API's
//! `GET /v1/scripts/{id}/tail`).
//!
//! # The model
//!
//! A node keeps one [`LiveTail`] hub. A watcher [`LiveTail::subscribe`]s
//! to one script ID with a [`StatusFilter`] and a requested sampling rate,
//! and gets a [`Subscription`]: a bounded queue of [`RequestEvent`]s.
//! While a script has a subscriber, each of its invocations on this node
//! records the same trace events a tail Worker would get (logs,
//! subrequests, exception, outcome: [`crate::outbound::tail`]), whether or not a
//! tail Worker is attached, and when the invocation ends the request
//! becomes one [`RequestEvent`] (method, URL, status, outcome, CPU and
//! wall time, those events) offered to each subscriber. A request that
//! fails before its Worker runs (busy, no such Worker) has no event.
//!
//! * **Nobody watching costs nothing**: a request asks the hub one atomic
//!   counter ([`LiveTail::wants`]) and records nothing more when it is 0.
//! * **A slow watcher never slows a request**: an event is offered with
//!   `try_send` to the subscriber's queue of [`QUEUE_EVENTS`]; when it is
//!   full the event is dropped and counted, and the count travels in the
//!   next event it gets ([`RequestEvent::dropped`]).
//! * **Bounded in bytes, not only in events** ([`TailBudget`], the node
//!   config's `[live_tail]`): one event is at most `event_bytes` of JSON
//!   (default 256 KiB): a request that logged more keeps its first trace
//!   events, a `truncated` mark saying how many were left out, and its
//!   exception and outcome; one watcher's queue holds at most
//!   `queue_bytes` (default 4 MiB); everything the node holds for its
//!   watchers at most `node_bytes` (default 32 MiB). An event goes into a
//!   queue with a [`Charge`] of its JSON size against both budgets, given
//!   back when the bytes are gone (written to the watcher's connection,
//!   or dropped); one that does not fit is dropped and counted like one
//!   that found the queue full (`/metrics`: `hearth_live_tail_dropped`
//!   by `reason`, `hearth_live_tail_truncated`,
//!   `hearth_live_tail_queued_bytes`). So a Worker that logs hard while
//!   an operator tails it costs the node at most `node_bytes` of queued
//!   events, plus the events being recorded: at most
//!   [`crate::outbound::tail::MAX_LEVEL_BYTES`] per request in flight.
//!   A node gathering the cluster's tail charges the members' events to
//!   the same budgets, waiting for room rather than dropping them (the
//!   member's own queue then fills, and it counts what it drops).
//! * **Sampling**: a subscriber asks for a fraction of its matching
//!   requests (`1.0` is all). On top of that, when a script's matching
//!   requests come faster than [`MAX_EVENTS_PER_SEC`] the node samples
//!   them down to about that rate. The fraction in effect is in every
//!   event ([`RequestEvent::sample_rate`]). Sampling is by count, not by
//!   chance: at rate 0.25 every fourth matching request is sent.
//!
//! The hub is per node: gathering a cluster's events (one stream per
//! node) is the client's job, see `hearth tail`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use hearth_trace_event::RequestEvent;
use hearth_trace_event::TraceEvent;

use crate::limits::{MIN_TAIL_EVENT_BYTES, TAIL_EVENT_BYTES, TAIL_NODE_BYTES, TAIL_QUEUE_BYTES};
use crate::outbound::tail::TRUNCATED;
use crate::stats::Stats;

/// Events a subscriber's queue holds before new ones are dropped.
pub const QUEUE_EVENTS: usize = 256;
/// The rate of events per second per subscriber past which the node
/// samples on its own.
pub const MAX_EVENTS_PER_SEC: f64 = 100.0;

/// Which requests a subscriber wants, by how they ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StatusFilter {
    /// Every request.
    #[default]
    All,
    /// Status in `100 * n .. 100 * n + 100` (`5xx` is `Class(5)`).
    Class(u16),
    /// This exact status.
    Exact(u16),
    /// The Worker answered without an exception (any status).
    Ok,
    /// An exception (trap, limit, no response) or a 5xx.
    Error,
}

/// A `status=` value that is none of the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("status filter {0:?}: expected 2xx..5xx, a status code (e.g. 404), ok or error")]
pub struct BadStatusFilter(pub String);

impl std::str::FromStr for StatusFilter {
    type Err = BadStatusFilter;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadStatusFilter(s.to_string());
        match s.to_ascii_lowercase().as_str() {
            "" | "all" => Ok(StatusFilter::All),
            "ok" => Ok(StatusFilter::Ok),
            "error" => Ok(StatusFilter::Error),
            l => match l.as_bytes() {
                [c @ b'1'..=b'5', b'x', b'x'] => Ok(StatusFilter::Class(u16::from(c - b'0'))),
                _ => match l.parse::<u16>() {
                    Ok(n) if (100..600).contains(&n) => Ok(StatusFilter::Exact(n)),
                    _ => Err(bad()),
                },
            },
        }
    }
}

impl StatusFilter {
    /// Whether a request that ended with `status` and `outcome` passes.
    pub fn matches(&self, status: u16, outcome: &str) -> bool {
        match *self {
            StatusFilter::All => true,
            StatusFilter::Class(c) => status / 100 == c,
            StatusFilter::Exact(n) => status == n,
            StatusFilter::Ok => outcome == "ok",
            StatusFilter::Error => outcome != "ok" || status >= 500,
        }
    }
}

/// A requested sampling rate outside `(0, 1]`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("sampling rate {0}: expected a fraction in (0, 1], e.g. 0.1")]
pub struct BadSampleRate(pub String);

/// Parses a requested sampling rate: a number in `(0, 1]`.
pub fn parse_sample_rate(s: &str) -> Result<f64, BadSampleRate> {
    s.parse::<f64>()
        .ok()
        .and_then(|r| sample_rate(r).ok())
        .ok_or_else(|| BadSampleRate(s.to_string()))
}

/// `rate` if it is a sampling rate, a fraction in `(0, 1]`: what
/// [`parse_sample_rate`] accepts, for a rate that came as a number (a
/// peer's `ShardServer.tail`).
pub fn sample_rate(rate: f64) -> Result<f64, BadSampleRate> {
    if rate > 0.0 && rate <= 1.0 {
        Ok(rate)
    } else {
        Err(BadSampleRate(rate.to_string()))
    }
}

/// The live tail's byte budgets on one node (see the module docs); all
/// count bytes of JSON, escaping included
/// ([`RequestEvent::json_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TailBudget {
    /// Most bytes of one event (default [`TAIL_EVENT_BYTES`], at least
    /// [`MIN_TAIL_EVENT_BYTES`]); a larger one is cut, with a mark.
    pub event_bytes: usize,
    /// Most bytes queued for one watcher (default [`TAIL_QUEUE_BYTES`], at
    /// least `event_bytes`); more are dropped and counted.
    pub queue_bytes: usize,
    /// Most bytes queued for all watchers on the node (default
    /// [`TAIL_NODE_BYTES`], at least `queue_bytes`); more are dropped and
    /// counted.
    pub node_bytes: usize,
}

impl Default for TailBudget {
    fn default() -> Self {
        TailBudget {
            event_bytes: TAIL_EVENT_BYTES,
            queue_bytes: TAIL_QUEUE_BYTES,
            node_bytes: TAIL_NODE_BYTES,
        }
    }
}

impl TailBudget {
    /// Checks the budgets nest: an event fits its watcher's queue, a
    /// queue fits the node's, and an event has room for what it always
    /// keeps ([`MIN_TAIL_EVENT_BYTES`]).
    pub fn validate(&self) -> Result<(), crate::ConfigError> {
        let bad = |why: String| Err(crate::ConfigError::Limit(why));
        if self.event_bytes < MIN_TAIL_EVENT_BYTES {
            return bad(format!(
                "live tail event budget {} bytes: at least {MIN_TAIL_EVENT_BYTES}",
                self.event_bytes
            ));
        }
        if self.queue_bytes < self.event_bytes {
            return bad(format!(
                "live tail queue budget {} bytes is smaller than one event's ({})",
                self.queue_bytes, self.event_bytes
            ));
        }
        if self.node_bytes < self.queue_bytes {
            return bad(format!(
                "live tail node budget {} bytes is smaller than one queue's ({})",
                self.node_bytes, self.queue_bytes
            ));
        }
        Ok(())
    }
}

/// A node's live-tail hub: the subscribers of each script.
#[derive(Debug)]
pub struct LiveTail {
    /// Subscribers on the node, all scripts: the one check a request
    /// makes when nobody watches.
    active: AtomicUsize,
    subscribers: Mutex<HashMap<String, Vec<Arc<Subscriber>>>>,
    accounts: Arc<Accounts>,
}

impl Default for LiveTail {
    /// A hub with the default budgets and counters of its own.
    fn default() -> Self {
        LiveTail::new(TailBudget::default(), Arc::default())
    }
}

/// What every charge of the node counts against.
#[derive(Debug)]
struct Accounts {
    budget: TailBudget,
    /// The node's counters; `live_tail_queued_bytes` is the node's
    /// running total.
    stats: Arc<Stats>,
    /// Woken whenever queued bytes are given back (members' events wait
    /// for room).
    freed: tokio::sync::Notify,
}

#[derive(Debug)]
struct Subscriber {
    filter: StatusFilter,
    requested: f64,
    tx: tokio::sync::mpsc::Sender<(RequestEvent, Charge)>,
    dropped: AtomicU64,
    sampler: Mutex<Sampler>,
    /// Bytes charged to this watcher now.
    queued: AtomicUsize,
    accounts: Arc<Accounts>,
}

/// Which budget had no room.
#[derive(Debug, Clone, Copy)]
enum Full {
    Queue,
    Node,
}

impl Subscriber {
    /// Charges `bytes` to this watcher and the node, if both have room.
    fn reserve(self: &Arc<Self>, bytes: usize) -> Result<Charge, Full> {
        let budget = &self.accounts.budget;
        let add = |limit: usize| move |now: usize| now.checked_add(bytes).filter(|n| *n <= limit);
        if self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, add(budget.queue_bytes))
            .is_err()
        {
            return Err(Full::Queue);
        }
        let node = &self.accounts.stats.live_tail_queued_bytes;
        let (bytes64, limit) = (bytes as u64, budget.node_bytes as u64);
        if node
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                now.checked_add(bytes64).filter(|n| *n <= limit)
            })
            .is_err()
        {
            self.queued.fetch_sub(bytes, Ordering::AcqRel);
            return Err(Full::Node);
        }
        Ok(Charge {
            sub: self.clone(),
            bytes,
        })
    }

    /// Counts an event this watcher lost.
    fn lost(&self, why: Full) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
        let stats = &self.accounts.stats;
        Stats::bump(match why {
            Full::Queue => &stats.live_tail_dropped_queue,
            Full::Node => &stats.live_tail_dropped_node,
        });
    }
}

/// Bytes held for one watcher, counted against its queue's and the
/// node's budgets ([`TailBudget`]) until this is dropped: keep it with
/// the bytes until they are gone (written out, or discarded).
#[derive(Debug)]
pub struct Charge {
    sub: Arc<Subscriber>,
    bytes: usize,
}

impl Charge {
    /// The bytes charged.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.sub.queued.fetch_sub(self.bytes, Ordering::AcqRel);
        let accounts = &self.sub.accounts;
        accounts
            .stats
            .live_tail_queued_bytes
            .fetch_sub(self.bytes as u64, Ordering::AcqRel);
        accounts.freed.notify_waiters();
    }
}

/// A watcher's budgets, for bytes a node holds for it besides its own
/// events: the other members' events it gathers (`hearth`'s
/// `live_tail`).
#[derive(Debug, Clone)]
pub struct QueueBudget(Arc<Subscriber>);

impl QueueBudget {
    /// Charges `bytes` to the watcher and the node, waiting until both
    /// have room; `None` (counted as dropped) for more than the watcher's
    /// whole queue budget, which never fits.
    pub async fn charge(&self, bytes: usize) -> Option<Charge> {
        let sub = &self.0;
        if bytes > sub.accounts.budget.queue_bytes {
            sub.lost(Full::Queue);
            return None;
        }
        loop {
            let freed = sub.accounts.freed.notified();
            let mut freed = std::pin::pin!(freed);
            // Registered before the check, so a release in between wakes it.
            freed.as_mut().enable();
            match sub.reserve(bytes) {
                Ok(charge) => return Some(charge),
                Err(_) => freed.await,
            }
        }
    }
}

/// Counts matching requests per second and decides which are sent.
#[derive(Debug)]
struct Sampler {
    window_start: Instant,
    in_window: u64,
    last_rate: f64,
    credit: f64,
}

impl Sampler {
    fn new() -> Self {
        Sampler {
            window_start: Instant::now(),
            in_window: 0,
            last_rate: 0.0,
            credit: 0.0,
        }
    }

    /// One more matching request at `now`: the rate in effect, and
    /// whether this one is sent.
    fn admit(&mut self, requested: f64, now: Instant) -> (f64, bool) {
        let elapsed = now.duration_since(self.window_start);
        if elapsed >= Duration::from_secs(1) {
            self.last_rate = self.in_window as f64 / elapsed.as_secs_f64();
            // A quiet gap of more than one window means the rate fell.
            if elapsed >= Duration::from_secs(2) {
                self.last_rate = 0.0;
            }
            self.window_start = now;
            self.in_window = 0;
        }
        self.in_window += 1;
        // This window's count so far is a lower bound on its rate.
        let rate = self.last_rate.max(self.in_window as f64);
        let node = if rate > MAX_EVENTS_PER_SEC {
            MAX_EVENTS_PER_SEC / rate
        } else {
            1.0
        };
        let effective = requested * node;
        self.credit += effective;
        if self.credit >= 1.0 - 1e-9 {
            self.credit -= 1.0;
            (effective, true)
        } else {
            (effective, false)
        }
    }
}

impl LiveTail {
    /// A hub held to `budget`, counting into `stats` (which also holds the
    /// node's queued bytes).
    pub fn new(budget: TailBudget, stats: Arc<Stats>) -> Self {
        LiveTail {
            active: AtomicUsize::new(0),
            subscribers: Mutex::default(),
            accounts: Arc::new(Accounts {
                budget,
                stats,
                freed: tokio::sync::Notify::new(),
            }),
        }
    }

    /// The budgets this hub holds to.
    pub fn budget(&self) -> &TailBudget {
        &self.accounts.budget
    }

    /// Whether any subscriber watches `script_id` here. With none on the
    /// node at all, this is one atomic load.
    pub fn wants(&self, script_id: &str) -> bool {
        self.active.load(Ordering::Relaxed) > 0 && self.lock().contains_key(script_id)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Arc<Subscriber>>>> {
        self.subscribers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts watching `script_id`'s requests that pass `filter`, a
    /// `sample` fraction of them (`1.0`: all; see the module docs).
    /// Watching ends when the subscription is dropped.
    pub fn subscribe(
        self: &Arc<Self>,
        script_id: &str,
        filter: StatusFilter,
        sample: f64,
    ) -> Subscription {
        let (tx, rx) = tokio::sync::mpsc::channel(QUEUE_EVENTS);
        let sub = Arc::new(Subscriber {
            filter,
            requested: sample.clamp(f64::MIN_POSITIVE, 1.0),
            tx,
            dropped: AtomicU64::new(0),
            sampler: Mutex::new(Sampler::new()),
            queued: AtomicUsize::new(0),
            accounts: self.accounts.clone(),
        });
        self.lock()
            .entry(script_id.to_string())
            .or_default()
            .push(sub.clone());
        self.active.fetch_add(1, Ordering::Relaxed);
        Subscription {
            rx,
            sub,
            hub: self.clone(),
            script_id: script_id.to_string(),
        }
    }

    /// Offers a finished request to its script's subscribers, cut to the
    /// per-event budget: each that wants it (filter, sampling) gets a copy
    /// if its queue and the node have room (by count and bytes), or counts
    /// it as dropped. Never waits.
    pub fn publish(&self, event: RequestEvent) {
        let subs = match self.lock().get(&event.script_id) {
            Some(s) => s.clone(),
            None => return,
        };
        let event = self.fit(event);
        let bytes = event.json_bytes();
        let now = Instant::now();
        for sub in subs {
            if !sub.filter.matches(event.status, &event.outcome) {
                continue;
            }
            let (rate, send) = sub
                .sampler
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .admit(sub.requested, now);
            if !send {
                continue;
            }
            let charge = match sub.reserve(bytes) {
                Ok(c) => c,
                Err(full) => {
                    sub.lost(full);
                    continue;
                }
            };
            let mut e = event.clone();
            e.sample_rate = rate;
            e.dropped = sub.dropped.load(Ordering::Relaxed);
            if sub.tx.try_send((e, charge)).is_err() {
                sub.lost(Full::Queue);
            }
        }
    }

    /// `event` within the per-event budget: if its JSON is larger, its
    /// first trace events that fit, a `truncated` mark of the rest, and
    /// its last ones that say how it ended (exception, outcome, and a mark
    /// the level made), which are always kept.
    fn fit(&self, mut event: RequestEvent) -> RequestEvent {
        let budget = self.accounts.budget.event_bytes;
        if event.json_bytes() <= budget {
            return event;
        }
        let ending = event
            .events
            .iter()
            .rposition(|e| !matches!(e.kind.as_str(), "exception" | "outcome" | TRUNCATED))
            .map_or(0, |last| last + 1);
        let ends = event.events.split_off(ending);
        let mark = |left: usize, bytes: usize| TraceEvent {
            script_id: event.script_id.clone(),
            node: event.node.clone(),
            timestamp_unix_ms: event.timestamp_unix_ms,
            kind: TRUNCATED.into(),
            message: format!(
                "{left} events ({bytes} bytes of JSON) left out of this live tail event: \
                 at most {budget} bytes per event"
            ),
        };
        let fixed = event.frame_json_bytes()
            + ends.iter().map(TraceEvent::json_bytes).sum::<usize>()
            + mark(usize::MAX, usize::MAX).json_bytes();
        let mut room = budget.saturating_sub(fixed);
        let kept = event
            .events
            .iter()
            .take_while(|e| match room.checked_sub(e.json_bytes()) {
                Some(r) => {
                    room = r;
                    true
                }
                None => false,
            })
            .count();
        let left = event.events.split_off(kept);
        let bytes = left.iter().map(TraceEvent::json_bytes).sum();
        let mark = mark(left.len(), bytes);
        drop(left);
        event.events.push(mark);
        event.events.extend(ends);
        Stats::bump(&self.accounts.stats.live_tail_truncated);
        event
    }

    /// Subscribers on this node, all scripts.
    pub fn subscribers(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }
}

/// One watcher's stream of [`RequestEvent`]s; dropping it unsubscribes.
#[derive(Debug)]
pub struct Subscription {
    rx: tokio::sync::mpsc::Receiver<(RequestEvent, Charge)>,
    sub: Arc<Subscriber>,
    hub: Arc<LiveTail>,
    script_id: String,
}

impl Subscription {
    /// The next event (waits for one), with its charge against the
    /// budgets: keep that until the event's bytes are written out.
    pub async fn next(&mut self) -> Option<(RequestEvent, Charge)> {
        self.rx.recv().await
    }

    /// This watcher's budgets, for what else the node holds for it (the
    /// other members' events it gathers).
    pub fn budget(&self) -> QueueBudget {
        QueueBudget(self.sub.clone())
    }

    /// Events dropped so far because this subscriber's queue was full.
    pub fn dropped(&self) -> u64 {
        self.sub.dropped.load(Ordering::Relaxed)
    }

    /// The script watched.
    pub fn script_id(&self) -> &str {
        &self.script_id
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut subs = self.hub.lock();
        if let Some(list) = subs.get_mut(&self.script_id) {
            list.retain(|s| !Arc::ptr_eq(s, &self.sub));
            if list.is_empty() {
                subs.remove(&self.script_id);
            }
        }
        self.hub.active.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(status: u16, outcome: &str) -> RequestEvent {
        RequestEvent {
            script_id: "w".into(),
            status,
            outcome: outcome.into(),
            ..RequestEvent::default()
        }
    }

    #[test]
    fn status_filters_parse_and_match() {
        let f = |s: &str| s.parse::<StatusFilter>().expect(s);
        assert!(f("5xx").matches(503, "ok") && !f("5xx").matches(404, "ok"));
        assert!(f("4XX").matches(404, "ok") && !f("4xx").matches(200, "ok"));
        assert!(f("404").matches(404, "ok") && !f("404").matches(400, "ok"));
        assert!(f("ok").matches(500, "ok") && !f("ok").matches(500, "exception"));
        assert!(f("error").matches(500, "exception") && f("error").matches(502, "ok"));
        assert!(!f("error").matches(200, "ok"));
        for bad in ["6xx", "x", "99", "5x"] {
            assert!(bad.parse::<StatusFilter>().is_err(), "{bad}");
        }
        assert!(parse_sample_rate("0").is_err() && parse_sample_rate("1.5").is_err());
        assert_eq!(parse_sample_rate("0.1"), Ok(0.1));
    }

    #[test]
    fn nobody_watching_is_free_and_unsubscribing_is_clean() {
        let hub = Arc::new(LiveTail::default());
        assert!(!hub.wants("w"));
        let sub = hub.subscribe("w", StatusFilter::All, 1.0);
        assert!(hub.wants("w") && !hub.wants("other"));
        drop(sub);
        assert!(!hub.wants("w"));
        assert_eq!(hub.subscribers(), 0);
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_without_waiting() {
        let hub = Arc::new(LiveTail::default());
        let mut slow = hub.subscribe("w", StatusFilter::Class(5), 1.0);
        // A burst the node samples down, still more than the queue holds.
        for _ in 0..2000 {
            hub.publish(event(500, "ok"));
            hub.publish(event(200, "ok"));
        }
        let dropped = slow.dropped();
        assert!(dropped > 0);
        let mut got = 0;
        while let Ok((e, _)) = slow.rx.try_recv() {
            assert_eq!(e.status, 500);
            got += 1;
        }
        assert_eq!(got, QUEUE_EVENTS);
        // The next event it gets says how many it lost.
        let mut next = None;
        for _ in 0..2000 {
            hub.publish(event(500, "ok"));
            if let Ok((e, _)) = slow.rx.try_recv() {
                next = Some(e);
                break;
            }
        }
        assert_eq!(next.expect("sampled one").dropped, dropped);
    }

    #[tokio::test]
    async fn requested_sampling_sends_that_fraction_and_says_so() {
        let hub = Arc::new(LiveTail::default());
        let mut sub = hub.subscribe("w", StatusFilter::All, 0.25);
        for _ in 0..40 {
            hub.publish(event(200, "ok"));
        }
        let mut got = Vec::new();
        while let Ok((e, _)) = sub.rx.try_recv() {
            got.push(e);
        }
        assert_eq!(got.len(), 10);
        assert!(got.iter().all(|e| (e.sample_rate - 0.25).abs() < 1e-9));
    }

    /// A request of `lines` log lines of `bytes` each, then its outcome.
    fn logged(lines: usize, bytes: usize) -> RequestEvent {
        let mut e = event(200, "ok");
        let line = |kind: &str, message: String| TraceEvent {
            script_id: "w".into(),
            kind: kind.into(),
            message,
            ..TraceEvent::default()
        };
        e.events = (0..lines)
            .map(|i| line("log", format!("{i} {}", "\u{1b}".repeat(bytes))))
            .collect();
        e.events.push(line("outcome", "ok 200".into()));
        e
    }

    fn budget(queue_kib: usize, node_kib: usize) -> TailBudget {
        TailBudget {
            event_bytes: MIN_TAIL_EVENT_BYTES,
            queue_bytes: queue_kib << 10,
            node_bytes: node_kib << 10,
        }
    }

    #[test]
    fn an_event_over_its_budget_is_cut_with_a_mark_and_keeps_its_end() {
        let stats = Arc::new(Stats::default());
        let hub = LiveTail::new(budget(1024, 1024), stats.clone());
        // 1,000 lines of 100 escape characters: 600 KB of JSON.
        let big = logged(1000, 100);
        assert!(big.json_bytes() > 600_000);
        let cut = hub.fit(big);
        let json = serde_json::to_string(&cut).expect("json");
        assert!(json.len() <= cut.json_bytes(), "the charge bounds the JSON");
        assert!(
            cut.json_bytes() <= MIN_TAIL_EVENT_BYTES,
            "{}",
            cut.json_bytes()
        );
        let n = cut.events.len();
        assert_eq!(cut.events[n - 1].kind, "outcome");
        assert_eq!(cut.events[n - 2].kind, TRUNCATED);
        let kept = n - 2;
        assert!(kept > 50, "{kept}");
        assert!(
            cut.events[n - 2]
                .message
                .starts_with(&format!("{} events (", 1000 - kept)),
            "{}",
            cut.events[n - 2].message
        );
        assert_eq!(stats.live_tail_truncated.load(Ordering::Relaxed), 1);
        // One within its budget is left as it is.
        let small = logged(3, 10);
        assert_eq!(hub.fit(small.clone()), small);
    }

    #[tokio::test]
    async fn queues_and_the_node_are_bounded_in_bytes_and_give_back_what_is_read() {
        let stats = Arc::new(Stats::default());
        // Two watchers of 256 KiB each, 384 KiB for the node.
        let hub = Arc::new(LiveTail::new(budget(256, 384), stats.clone()));
        let e = logged(100, 100);
        let each = e.json_bytes();
        // One watcher fills its own queue; then a second fills the node.
        let mut a = hub.subscribe("w", StatusFilter::All, 1.0);
        for _ in 0..10 {
            hub.publish(e.clone());
        }
        let mut b = hub.subscribe("w", StatusFilter::All, 1.0);
        for _ in 0..10 {
            hub.publish(e.clone());
        }
        let queued = stats.live_tail_queued_bytes.load(Ordering::Relaxed) as usize;
        assert!(queued <= 384 << 10, "{queued}");
        assert!(
            queued + each > 384 << 10,
            "filled to the node's budget: {queued}"
        );
        assert!(a.sub.queued.load(Ordering::Relaxed) <= 256 << 10);
        assert!(b.sub.queued.load(Ordering::Relaxed) <= 256 << 10);
        let by_queue = stats.live_tail_dropped_queue.load(Ordering::Relaxed);
        let by_node = stats.live_tail_dropped_node.load(Ordering::Relaxed);
        assert!(by_queue > 0 && by_node > 0, "{by_queue} {by_node}");
        assert_eq!(a.dropped() + b.dropped(), by_queue + by_node);

        // Read and written out: the bytes come back, and a member's event
        // waiting for room gets it.
        let waiting = tokio::spawn({
            let budget = a.budget();
            async move { budget.charge(200 << 10).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "no room yet");
        let mut read = Vec::new();
        while let Ok(x) = a.rx.try_recv() {
            read.push(x);
        }
        assert!(!read.is_empty());
        drop(read);
        let charge = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken when bytes were given back")
            .expect("task")
            .expect("fits");
        assert_eq!(charge.bytes(), 200 << 10);
        // More than a whole queue never fits: dropped, not waited for.
        assert!(a.budget().charge(257 << 10).await.is_none());
        drop((charge, a, b.next().await));
        drop(b);
        assert_eq!(stats.live_tail_queued_bytes.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn budgets_must_nest() {
        assert!(TailBudget::default().validate().is_ok());
        assert!(budget(1024, 512).validate().is_err());
        assert!(
            budget(32, 512).validate().is_err(),
            "a queue under one event"
        );
        let tiny = TailBudget {
            event_bytes: 1024,
            ..TailBudget::default()
        };
        assert!(tiny.validate().is_err());
    }

    #[test]
    fn over_the_rate_the_node_samples_on_its_own() {
        let mut s = Sampler::new();
        let now = Instant::now();
        let sent = (0..1000).filter(|_| s.admit(1.0, now).1).count();
        // The first MAX_EVENTS_PER_SEC all pass; then about that many more
        // over the rest of the burst (rate ~ MAX / count).
        assert!(sent < 400, "{sent}");
        assert!(sent >= MAX_EVENTS_PER_SEC as usize, "{sent}");
        let (rate, _) = s.admit(1.0, now);
        assert!(rate < 0.2, "{rate}");
    }
}
