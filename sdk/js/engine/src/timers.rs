//! `setTimeout`, `setInterval`, `clearTimeout` and `clearInterval`: a timer
//! heap in Rust, the callbacks and their extra arguments held as
//! `Persistent`s.
//!
//! ## The model
//!
//! A timer is due at an instant of `wasi:clocks/monotonic-clock` (its
//! creation's `now` plus the delay). The event loop ([`crate::event_loop`])
//! fires every due timer in order of due instant, then creation, with a
//! microtask checkpoint (QuickJS's job queue run empty) after each callback,
//! as HTML's event loop does; when nothing else can run it blocks until the
//! nearest one is due. Timers created by a firing round wait for the next
//! round, so a callback that sets a 0 ms timer of itself cannot starve the
//! job queue, the other timers or outgoing fetches.
//!
//! The delay is converted as a browser converts it (WebIDL `long`:
//! `ToNumber`, then `ToInt32`, which wraps; a negative result is 0; there is
//! no 4 ms clamp for nested timers, as on workerd). Ids are positive integers
//! shared by timeouts and intervals; clearing an unknown id does nothing.
//!
//! A request's timers do not outlive it: [`cancel_all`] drops every one when
//! the request ends (`request.rs`), so neither their callbacks nor promises
//! waiting on them run during a later request. The heap is only touched
//! when a Worker uses timers: a request without any pays one `RefCell`
//! check.

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use hearth_sdk::wasi::clocks::monotonic_clock;
use rquickjs::function::{Opt, Rest};
use rquickjs::{Coerced, Ctx, Exception, FromJs, Function, Persistent, Value};

/// One timer waiting to fire.
struct Timer {
    /// The schedule entry that is current for this timer (an interval is
    /// scheduled again after each run; older heap entries are stale).
    seq: u64,
    /// `Some(period)` for an interval, in nanoseconds.
    period: Option<u64>,
    callback: Persistent<Function<'static>>,
    args: Vec<Persistent<Value<'static>>>,
}

/// The instance's timers.
#[derive(Default)]
struct Timers {
    /// `(due, seq, id)`, earliest first; entries whose timer is gone or
    /// rescheduled (another `seq`) are skipped when they come up.
    heap: BinaryHeap<Reverse<(u64, u64, u32)>>,
    /// The live timers by id.
    live: HashMap<u32, Timer>,
    /// The last id given out.
    last_id: u32,
    /// The last schedule sequence number given out.
    last_seq: u64,
}

impl Timers {
    fn schedule(&mut self, id: u32, due: u64) -> u64 {
        self.last_seq = self.last_seq.wrapping_add(1);
        self.heap.push(Reverse((due, self.last_seq, id)));
        self.last_seq
    }

    /// The earliest live entry, stale ones dropped on the way.
    fn peek(&mut self) -> Option<(u64, u64, u32)> {
        while let Some(&Reverse((due, seq, id))) = self.heap.peek() {
            if self.live.get(&id).is_some_and(|t| t.seq == seq) {
                return Some((due, seq, id));
            }
            self.heap.pop();
        }
        None
    }
}

thread_local! {
    static TIMERS: RefCell<Timers> = RefCell::new(Timers::default());
}

/// Nanoseconds per millisecond.
const MS: u64 = 1_000_000;

/// The delay argument as a browser converts it, in nanoseconds.
fn delay<'js>(ctx: &Ctx<'js>, v: Option<Value<'js>>) -> rquickjs::Result<u64> {
    let ms = match v {
        None => 0,
        Some(v) if v.is_undefined() => 0,
        Some(v) => Coerced::<i32>::from_js(ctx, v)?.0,
    };
    Ok(u64::try_from(ms).unwrap_or(0) * MS)
}

/// Adds a timer; its id.
fn add<'js>(
    ctx: Ctx<'js>,
    name: &str,
    callback: Value<'js>,
    ms: Opt<Value<'js>>,
    args: Rest<Value<'js>>,
    repeat: bool,
) -> rquickjs::Result<u32> {
    let Some(callback) = callback.into_function() else {
        return Err(Exception::throw_type(
            &ctx,
            &format!("{name}: the callback is not a function"),
        ));
    };
    crate::event_loop::in_request_only(&ctx, &format!("{name}()"))?;
    let wait = delay(&ctx, ms.0)?;
    let callback = Persistent::save(&ctx, callback);
    let args = args
        .0
        .into_iter()
        .map(|a| Persistent::save(&ctx, a))
        .collect();
    let due = monotonic_clock::now().saturating_add(wait);
    let (id, replaced) = TIMERS.with(|t| {
        let mut t = t.borrow_mut();
        t.last_id = t.last_id.checked_add(1).unwrap_or(1);
        let id = t.last_id;
        let seq = t.schedule(id, due);
        let replaced = t.live.insert(
            id,
            Timer {
                seq,
                period: repeat.then_some(wait),
                callback,
                args,
            },
        );
        (id, replaced)
    });
    // A timer whose id came round again (after 2^32 of them) is dropped
    // after the borrow ends: freeing JS values can run finalizers.
    drop(replaced);
    Ok(id)
}

/// `clearTimeout(id)` and `clearInterval(id)`.
fn clear<'js>(ctx: Ctx<'js>, id: Opt<Value<'js>>) -> rquickjs::Result<()> {
    let Some(id) = id.0.filter(|v| v.is_number()) else {
        return Ok(());
    };
    let id = Coerced::<f64>::from_js(&ctx, id)?.0;
    if id >= 1.0 && id <= f64::from(u32::MAX) && id.fract() == 0.0 {
        // Dropped after the borrow ends: freeing JS values can run finalizers.
        let gone = TIMERS.with(|t| t.borrow_mut().live.remove(&(id as u32)));
        drop(gone);
    }
    Ok(())
}

/// `setTimeout(callback, ms, ...args)`.
fn set_timeout<'js>(
    ctx: Ctx<'js>,
    callback: Value<'js>,
    ms: Opt<Value<'js>>,
    args: Rest<Value<'js>>,
) -> rquickjs::Result<u32> {
    add(ctx, "setTimeout", callback, ms, args, false)
}

/// `setInterval(callback, ms, ...args)`.
fn set_interval<'js>(
    ctx: Ctx<'js>,
    callback: Value<'js>,
    ms: Opt<Value<'js>>,
    args: Rest<Value<'js>>,
) -> rquickjs::Result<u32> {
    add(ctx, "setInterval", callback, ms, args, true)
}

/// Defines the four timer functions on `ctx`'s global object.
pub(crate) fn define(ctx: &Ctx<'_>) -> rquickjs::Result<()> {
    let g = ctx.globals();
    let f = Function::new(ctx.clone(), set_timeout)?.with_name("setTimeout")?;
    g.set("setTimeout", f)?;
    let f = Function::new(ctx.clone(), set_interval)?.with_name("setInterval")?;
    g.set("setInterval", f)?;
    let f = Function::new(ctx.clone(), clear)?.with_name("clearTimeout")?;
    g.set("clearTimeout", f)?;
    let f = Function::new(ctx.clone(), clear)?.with_name("clearInterval")?;
    g.set("clearInterval", f)?;
    Ok(())
}

/// Whether any timer is live.
pub(crate) fn any() -> bool {
    TIMERS.with(|t| !t.borrow().live.is_empty())
}

/// The due instant of the nearest live timer.
pub(crate) fn next_due() -> Option<u64> {
    TIMERS.with(|t| t.borrow_mut().peek().map(|(due, _, _)| due))
}

/// Fires every timer due at `now` that existed when the round began, each
/// followed by `checkpoint` (the job queue run empty); whether any fired.
/// A callback that throws is reported on stderr; the others still run.
pub(crate) fn fire_due(ctx: &Ctx<'_>, now: u64, checkpoint: impl Fn(&Ctx<'_>)) -> bool {
    let round = TIMERS.with(|t| t.borrow().last_seq);
    let mut fired = false;
    loop {
        // Take what the call needs out of the heap, then let go of it: the
        // callback may add or clear timers.
        let next = TIMERS.with(|t| {
            let mut t = t.borrow_mut();
            let (due, seq, id) = t.peek()?;
            if due > now || seq > round {
                return None;
            }
            t.heap.pop();
            let timer = t.live.get(&id)?;
            if let Some(period) = timer.period {
                let callback = timer.callback.clone();
                let args = timer.args.clone();
                let seq = t.schedule(id, now.saturating_add(period));
                if let Some(timer) = t.live.get_mut(&id) {
                    timer.seq = seq;
                }
                Some((callback, args))
            } else {
                t.live.remove(&id).map(|timer| (timer.callback, timer.args))
            }
        });
        let Some((callback, args)) = next else {
            return fired;
        };
        fired = true;
        call(ctx, callback, args);
        checkpoint(ctx);
    }
}

/// Runs one callback with its arguments.
fn call(
    ctx: &Ctx<'_>,
    callback: Persistent<Function<'static>>,
    args: Vec<Persistent<Value<'static>>>,
) {
    let run = || -> rquickjs::Result<()> {
        let f = callback.restore(ctx)?;
        let mut a = rquickjs::function::Args::new(ctx.clone(), args.len());
        for v in args {
            a.push_arg(v.restore(ctx)?)?;
        }
        f.call_arg::<()>(a)
    };
    if let Err(e) = run() {
        crate::event_loop::log(&format!(
            "Uncaught exception in a timer callback: {}",
            crate::event_loop::error_text(ctx, e)
        ));
    }
}

/// Drops every timer: the request they were set in has ended.
pub(crate) fn cancel_all() {
    let gone = TIMERS.with(|t| {
        let mut t = t.borrow_mut();
        t.heap.clear();
        std::mem::take(&mut t.live)
    });
    drop(gone);
}
