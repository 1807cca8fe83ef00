//! Durable Object alarms on this node: the scheduler that fires them.
//!
//! # The model
//!
//! An object's alarm is part of its durable state
//! ([`hearth_objects::ObjectStorage::set_alarm`]): a write like the others,
//! made durable by the output gate's flush, in the object's head. The fence
//! indexes heads by alarm time, so every node can ask which alarms are due
//! without loading objects ([`hearth_objects::Objects::due_alarms`]).
//!
//! Each node runs one scheduler task. Every [`ALARM_POLL`] (or at once when
//! an object here just made durable an alarm due before then) it asks the
//! fence for the alarms due before the next poll, keeps those of objects
//! whose ring home is this node ([`NodeObjects::set_home_check`]; a runtime
//! without a node is every object's home), and for each one not already
//! under way waits until its time and fires it: the object is called
//! through its input gate like any request ([`NodeObjects::serve_alarm`]),
//! on its home only, with the header [`ALARM_HEADER`] carrying the retry
//! count (`0` on the first try). The handler answers 2xx when it
//! succeeded.
//!
//! - **Once the gate is taken** the object's alarm must still be the time
//!   that fired, or nothing runs (it was deleted or moved meanwhile).
//! - **After a 2xx**, the alarm is deleted unless the handler set another
//!   time, and that is flushed with the handler's writes.
//! - **Anything else** (an error status, a failure) is retried after
//!   [`ALARM_FIRST_BACKOFF`], doubling each time, up to
//!   [`ALARM_MAX_RETRIES`] retries (Cloudflare's numbers); the last try
//!   deletes the alarm whatever it answers.
//! - **At least once, at its home:** until that deletion is durable, the
//!   alarm stays in the head. If the home dies with an alarm pending (or
//!   mid-retry), the object's new home finds it at its next poll and fires
//!   it there (its retry count starts again at 0). A handler may run again
//!   after a success whose deletion did not become durable.
//! - **Lateness:** an alarm known at a poll fires at its time; one set
//!   between polls is found when its object's flush wakes the scheduler
//!   (same node) or at the next poll, so it fires at most about
//!   [`ALARM_POLL`] late (plus the fence's answer time).
//!
//! An alarm whose last try failed before its handler could run (its
//! script or storage unavailable) cannot be deleted; this node then leaves
//! it alone (it stays in storage, and a new home would try it again).
//!
//! One alarm time of one object is fired by one task of a node at a time;
//! the input gate serializes it with the object's other requests.
//!
//! [`ALARM_HEADER`] is the host's: it is removed from every request that
//! reaches a Worker any other way ([`crate::flow::strip_host_headers`]).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hearth_objects::ObjectKey;

use crate::objects::NodeObjects;
use crate::objects::resident::AlarmTry;
use crate::stats::Stats;

/// The request header on an alarm's call to its object: the retry count
/// (`0` on the first try). Only the host sets it.
pub const ALARM_HEADER: &str = "hearth-object-alarm";
/// How often the scheduler asks the fence for due alarms: what bounds the
/// lateness of an alarm set on another node or just before a failover.
pub const ALARM_POLL: Duration = Duration::from_secs(1);
/// Retries of a failing alarm handler (Cloudflare: 6).
pub const ALARM_MAX_RETRIES: u32 = 6;
/// The wait before the first retry, doubled before each next one
/// (Cloudflare: 2 s).
pub const ALARM_FIRST_BACKOFF: Duration = Duration::from_secs(2);
/// Alarms one poll reads at most (the earliest ones).
const ALARMS_PER_POLL: usize = 1000;
/// The least time between two polls, however often objects wake the
/// scheduler.
const MIN_POLL_GAP: Duration = Duration::from_millis(50);

/// The alarms under way on this node: (ring key, time).
type Running = Arc<Mutex<HashSet<(String, u64)>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Milliseconds since the Unix epoch now.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Whether an alarm at `at_ms` is due before the scheduler's next regular
/// poll: then an object that just made it durable wakes the scheduler.
pub(crate) fn due_before_next_poll(at_ms: u64) -> bool {
    at_ms <= now_ms().saturating_add(ALARM_POLL.as_millis() as u64)
}

/// Starts the node's alarm scheduler (see the module docs). It holds the
/// table weakly and ends with it; outside a tokio runtime there is none.
pub(crate) fn start(objects: &Arc<NodeObjects>) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let weak = Arc::downgrade(objects);
    let nudge = objects.alarm_nudge.clone();
    handle.spawn(async move {
        let running = Running::default();
        let mut failing = false;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(ALARM_POLL) => {}
                _ = nudge.notified() => {}
            }
            let Some(objects) = weak.upgrade() else {
                return;
            };
            match poll(&objects, &weak, &running).await {
                Ok(()) => failing = false,
                Err(error) if !failing => {
                    failing = true;
                    tracing::warn!(%error, "cannot read due Durable Object alarms (retrying every poll)");
                }
                Err(error) => tracing::debug!(%error, "cannot read due Durable Object alarms"),
            }
            drop(objects);
            tokio::time::sleep(MIN_POLL_GAP).await;
        }
    });
}

/// One poll: starts a firing task for each alarm due before the next poll
/// whose object is homed here and not under way already.
async fn poll(
    objects: &NodeObjects,
    weak: &Weak<NodeObjects>,
    running: &Running,
) -> Result<(), String> {
    let storage = objects.objects_storage().await?;
    let horizon = now_ms().saturating_add(ALARM_POLL.as_millis() as u64);
    let due = storage
        .due_alarms(horizon, ALARMS_PER_POLL)
        .await
        .map_err(|e| e.to_string())?;
    for (ring_key, at) in due {
        if !objects.is_home(&ring_key) {
            continue;
        }
        let Ok(key) = ObjectKey::from_ring_key(&ring_key) else {
            continue;
        };
        if !lock(running).insert((ring_key, at)) {
            continue;
        }
        tokio::spawn(fire(weak.clone(), key, at, running.clone()));
    }
    Ok(())
}

/// Fires the alarm `at` of `key` at its time, with retries (see the module
/// docs), while this node stays its home.
async fn fire(weak: Weak<NodeObjects>, key: ObjectKey, at: u64, running: Running) {
    let ring_key = key.ring_key();
    tokio::time::sleep(Duration::from_millis(at.saturating_sub(now_ms()))).await;
    let mut backoff = ALARM_FIRST_BACKOFF;
    for retry in 0..=ALARM_MAX_RETRIES {
        let Some(objects) = weak.upgrade() else {
            break;
        };
        if !objects.is_home(&ring_key) {
            // Its new home fires it.
            break;
        }
        let last = retry == ALARM_MAX_RETRIES;
        match try_once(&objects, &key, at, retry, last).await {
            Ok(None) => break,
            Ok(Some(status)) if status.is_success() => {
                Stats::bump(&objects.stats().object_alarms_fired);
                break;
            }
            outcome => {
                Stats::bump(&objects.stats().object_alarms_failed);
                let error = match outcome {
                    Ok(Some(status)) => format!("the alarm handler answered {status}"),
                    Err(e) => e.to_string(),
                    Ok(None) => String::new(),
                };
                if last {
                    tracing::warn!(object = %ring_key, %error, retries = retry,
                        "a Durable Object alarm failed its last retry: it is deleted");
                    // Stays marked as under way: if its deletion could not
                    // be made (the object could not even be loaded), this
                    // node does not start over on it.
                    return;
                }
                tracing::info!(object = %ring_key, %error, retry, next_in = ?backoff,
                    "a Durable Object alarm failed: retrying");
            }
        }
        drop(objects);
        tokio::time::sleep(backoff).await;
        backoff = backoff.saturating_mul(2);
    }
    lock(&running).remove(&(ring_key, at));
}

/// One try: the object called with [`ALARM_HEADER`]; the handler's status,
/// or `None` when the alarm was no longer `at` (nothing ran).
async fn try_once(
    objects: &NodeObjects,
    key: &ObjectKey,
    at: u64,
    retry: u32,
    last: bool,
) -> Result<Option<http::StatusCode>, crate::error::RuntimeError> {
    let request = http::Request::builder()
        .method(http::Method::POST)
        .uri("http://alarm.object.internal/")
        .header(ALARM_HEADER, retry)
        .body(crate::body::empty())
        .map_err(|e| crate::error::RuntimeError::ObjectUnavailable {
            object: key.ring_key(),
            message: format!("cannot build the alarm request: {e}"),
        })?;
    let deadline = Instant::now()
        + crate::limits::PlanLimits::default_for(crate::limits::Plan::default()).request_wall;
    let response = objects
        .serve_alarm(key.clone(), request, deadline, AlarmTry { at, last })
        .await?;
    Ok(response.map(|r| r.status()))
}
