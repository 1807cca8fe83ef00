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

/// A node's live-tail hub: the subscribers of each script.
#[derive(Debug, Default)]
pub struct LiveTail {
    /// Subscribers on the node, all scripts: the one check a request
    /// makes when nobody watches.
    active: AtomicUsize,
    subscribers: Mutex<HashMap<String, Vec<Arc<Subscriber>>>>,
}

#[derive(Debug)]
struct Subscriber {
    filter: StatusFilter,
    requested: f64,
    tx: tokio::sync::mpsc::Sender<RequestEvent>,
    dropped: AtomicU64,
    sampler: Mutex<Sampler>,
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

    /// Offers a finished request to its script's subscribers: each that
    /// wants it (filter, sampling) gets a copy if its queue has room, or
    /// counts it as dropped. Never waits.
    pub fn publish(&self, event: RequestEvent) {
        let subs = match self.lock().get(&event.script_id) {
            Some(s) => s.clone(),
            None => return,
        };
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
            let mut e = event.clone();
            e.sample_rate = rate;
            e.dropped = sub.dropped.load(Ordering::Relaxed);
            if sub.tx.try_send(e).is_err() {
                sub.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Subscribers on this node, all scripts.
    pub fn subscribers(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }
}

/// One watcher's stream of [`RequestEvent`]s; dropping it unsubscribes.
#[derive(Debug)]
pub struct Subscription {
    rx: tokio::sync::mpsc::Receiver<RequestEvent>,
    sub: Arc<Subscriber>,
    hub: Arc<LiveTail>,
    script_id: String,
}

impl Subscription {
    /// The next event (waits for one).
    pub async fn next(&mut self) -> Option<RequestEvent> {
        self.rx.recv().await
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
        while let Ok(e) = slow.rx.try_recv() {
            assert_eq!(e.status, 500);
            got += 1;
        }
        assert_eq!(got, QUEUE_EVENTS);
        // The next event it gets says how many it lost.
        let mut next = None;
        for _ in 0..2000 {
            hub.publish(event(500, "ok"));
            if let Ok(e) = slow.rx.try_recv() {
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
        while let Ok(e) = sub.rx.try_recv() {
            got.push(e);
        }
        assert_eq!(got.len(), 10);
        assert!(got.iter().all(|e| (e.sample_rate - 0.25).abs() < 1e-9));
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
