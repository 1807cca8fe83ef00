//! The event loop a request runs on: QuickJS's job queue (promise
//! reactions), the timers ([`crate::timers`]) and the outgoing fetches
//! ([`crate::fetch`]), until what the request waits for has settled.
//!
//! ## The model
//!
//! [`run`] turns the loop until a condition holds (the Worker's `fetch`
//! promise settled, its `Response` read, the `ctx.waitUntil` promises
//! settled). One turn: run the job queue empty (a microtask checkpoint);
//! if the condition holds, stop; else fire the timers that are due, each
//! followed by a checkpoint; else move the fetches in flight forward. When
//! none of that did anything, block in `wasi:io/poll` on the nearest
//! timer's instant (`monotonic-clock.subscribe-instant`) and every fetch's
//! pollable, so a waiting request spins no CPU; when there is nothing to
//! wait for either, the condition can never hold and [`run`] says so.
//!
//! A request that uses neither timers nor fetches costs one checkpoint and
//! two `RefCell` checks here: the clock and the poll machinery are only
//! touched when a timer or a fetch exists.
//!
//! Also here, because the loop's owner (`request.rs`) reads them when the
//! request ends: the promises `ctx.waitUntil` was given ([`wait_until`],
//! [`waits_settled`]) and the promise rejections no handler took
//! ([`tracker`], [`report_unhandled`]).

use std::cell::{Cell, RefCell};

use hearth_sdk::wasi::clocks::monotonic_clock;
use hearth_sdk::wasi::io::poll;
use rquickjs::promise::PromiseState;
use rquickjs::runtime::RejectionTracker;
use rquickjs::{Coerced, Ctx, FromJs, Function, Persistent, Promise, Value, qjs};

use crate::{fetch, timers};

thread_local! {
    /// Whether a request is being served (its answer, its `waitUntil`
    /// work): timers and fetches exist only then.
    static IN_REQUEST: Cell<bool> = const { Cell::new(false) };
    /// The promises `ctx.waitUntil` was given during the current request.
    static WAITS: RefCell<Vec<Persistent<Promise<'static>>>> = const { RefCell::new(Vec::new()) };
    /// Rejected promises no handler has taken (yet), with their reasons.
    static UNHANDLED: RefCell<Vec<(Persistent<Value<'static>>, Persistent<Value<'static>>)>> =
        const { RefCell::new(Vec::new()) };
}

/// Marks the start (`true`) or the end of a request.
pub(crate) fn set_in_request(on: bool) {
    IN_REQUEST.with(|r| r.set(on));
}

/// Refuses `what` (a timer, a fetch) outside a request, as workerd does:
/// the module's top level runs when the Worker is built (the engine is
/// snapshotted then), where a timer would fire in no request and a fetch
/// has no network.
pub(crate) fn in_request_only(ctx: &Ctx<'_>, what: &str) -> rquickjs::Result<()> {
    if IN_REQUEST.with(Cell::get) {
        return Ok(());
    }
    Err(rquickjs::Exception::throw_message(
        ctx,
        &format!(
            "{what} is not allowed in the module's top level (global scope): \
             timers and fetch run only while a request is handled; \
             call it inside fetch()"
        ),
    ))
}

/// Defines the loop's natives on `ctx`'s global object: the timer
/// functions, `__hearth_fetch` and `__hearth_wait_until` (`runtime.js`
/// builds `fetch` and `ctx` on the last two).
pub(crate) fn define(ctx: &Ctx<'_>) -> rquickjs::Result<()> {
    timers::define(ctx)?;
    fetch::define(ctx)?;
    ctx.globals().set(
        "__hearth_wait_until",
        Function::new(ctx.clone(), wait_until)?,
    )
}

/// The runtime's promise rejection tracker: records a rejection no handler
/// takes, forgets it when one is attached later. [`report_unhandled`]
/// writes what is left at the end of a request, and at the end of the
/// module's start (the build's log). A start that fails leaks its runtime
/// (see `engine::start`), so what this holds then never outlives it.
pub(crate) fn tracker() -> RejectionTracker {
    Box::new(|ctx, promise, reason, handled| {
        if handled {
            // Dropped after the borrow ends: freeing JS values can run
            // finalizers.
            let gone = UNHANDLED.with(|u| {
                let mut u = u.borrow_mut();
                let at = u
                    .iter()
                    .position(|(p, _)| p.clone().restore(&ctx).ok() == Some(promise.clone()));
                at.map(|i| u.swap_remove(i))
            });
            drop(gone);
        } else {
            let entry = (
                Persistent::save(&ctx, promise),
                Persistent::save(&ctx, reason),
            );
            UNHANDLED.with(|u| u.borrow_mut().push(entry));
        }
    })
}

/// Forgets `promise`'s rejection: the request itself handles it (the
/// Worker's `fetch` failing answers 500).
pub(crate) fn handled<'js>(ctx: &Ctx<'js>, promise: &Promise<'js>) {
    let promise = promise.clone().into_value();
    let gone = UNHANDLED.with(|u| {
        let mut u = u.borrow_mut();
        let at = u
            .iter()
            .position(|(p, _)| p.clone().restore(ctx).ok().as_ref() == Some(&promise));
        at.map(|i| u.swap_remove(i))
    });
    drop(gone);
}

/// Writes one line on stderr for each rejection no handler took, and
/// forgets them.
pub(crate) fn report_unhandled(ctx: &Ctx<'_>) {
    let all = UNHANDLED.with(|u| std::mem::take(&mut *u.borrow_mut()));
    for (_, reason) in all {
        let text = match reason.restore(ctx) {
            Ok(r) => describe(ctx, r),
            Err(e) => e.to_string(),
        };
        log(&format!("Uncaught (in promise) {text}"));
    }
}

/// A thrown or rejected value as text: `String(value)` (`Name: message`
/// for an error), then an error's stack.
pub(crate) fn describe<'js>(ctx: &Ctx<'js>, value: Value<'js>) -> String {
    let stack = value
        .as_object()
        .and_then(|o| o.get::<_, Option<String>>("stack").ok().flatten());
    let text = Coerced::<String>::from_js(ctx, value)
        .map(|c| c.0)
        .unwrap_or_else(|_| "(a value that cannot be shown)".into());
    match stack {
        Some(stack) => format!("{text} {}", stack.trim()),
        None => text,
    }
}

/// An error from a call into JS as text: the exception it threw
/// ([`describe`]), or what went wrong in the call itself.
pub(crate) fn error_text(ctx: &Ctx<'_>, e: rquickjs::Error) -> String {
    match e {
        rquickjs::Error::Exception => describe(ctx, ctx.catch()),
        e => e.to_string(),
    }
}

/// Writes `text` on stderr as one line (the Worker's log is read line by
/// line: a stack's lines are joined with spaces).
pub(crate) fn log(text: &str) {
    let line: Vec<&str> = text
        .split('\n')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    crate::engine::write_log(&line.join(" "));
}

/// `ctx.waitUntil(promise)`: the request's end waits for it to settle.
fn wait_until<'js>(ctx: Ctx<'js>, value: Value<'js>) {
    // Anything else has settled already.
    if let Some(p) = value.into_promise() {
        let p = Persistent::save(&ctx, p);
        WAITS.with(|w| w.borrow_mut().push(p));
    }
}

/// Whether every promise given to `ctx.waitUntil` has settled.
pub(crate) fn waits_settled(ctx: &Ctx<'_>) -> bool {
    WAITS.with(|w| {
        w.borrow().iter().all(|p| {
            p.clone()
                .restore(ctx)
                .is_ok_and(|p| p.state() != PromiseState::Pending)
        })
    })
}

/// Whether the request gave `ctx.waitUntil` anything.
pub(crate) fn any_waits() -> bool {
    WAITS.with(|w| !w.borrow().is_empty())
}

/// Forgets the request's `ctx.waitUntil` promises.
pub(crate) fn clear_waits() {
    let gone = WAITS.with(|w| std::mem::take(&mut *w.borrow_mut()));
    drop(gone);
}

/// Runs the job queue until it is empty (a microtask checkpoint). A job
/// that throws (a `queueMicrotask` callback; promise reactions reject
/// their promise instead) is reported on stderr, as a browser reports it.
pub(crate) fn checkpoint(ctx: &Ctx<'_>) {
    // QuickJS's own call, not `Ctx::execute_pending_job`, which drops a
    // job's exception without a word. The engine has one context, so the
    // exception is pending on `ctx`.
    // SAFETY: `ctx` is a live context.
    let rt = unsafe { qjs::JS_GetRuntime(ctx.as_raw().as_ptr()) };
    loop {
        let mut ran_in = std::mem::MaybeUninit::<*mut qjs::JSContext>::uninit();
        // SAFETY: `rt` is this context's runtime, alive while `ctx` is.
        match unsafe { qjs::JS_ExecutePendingJob(rt, ran_in.as_mut_ptr()) } {
            0 => return,
            n if n < 0 => log(&format!(
                "Uncaught exception in a microtask: {}",
                error_text(ctx, rquickjs::Error::Exception)
            )),
            _ => {}
        }
    }
}

/// How [`run`] ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Ran {
    /// The condition holds.
    Done,
    /// It does not, and nothing is left that could make it: no job, no
    /// timer, no fetch in flight.
    Stuck,
}

/// Turns the loop until `done` holds (see the module docs).
pub(crate) fn run(ctx: &Ctx<'_>, mut done: impl FnMut() -> bool) -> Ran {
    loop {
        checkpoint(ctx);
        if done() {
            return Ran::Done;
        }
        let have_timers = timers::any();
        if have_timers && timers::fire_due(ctx, monotonic_clock::now(), checkpoint) {
            continue;
        }
        let have_fetches = fetch::in_flight() > 0;
        if have_fetches && fetch::progress(ctx) {
            continue;
        }
        if !have_timers && !have_fetches {
            return Ran::Stuck;
        }
        block();
    }
}

/// Blocks until the nearest timer is due or a fetch in flight can move.
fn block() {
    let timer = timers::next_due().map(monotonic_clock::subscribe_instant);
    fetch::with_pollables(|fetches| {
        let mut all: Vec<&poll::Pollable> = Vec::with_capacity(fetches.len() + 1);
        all.extend_from_slice(fetches);
        all.extend(timer.as_ref());
        if !all.is_empty() {
            poll::poll(&all);
        }
    });
}
