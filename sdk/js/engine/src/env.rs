//! The Worker's `env`, the second argument of its `fetch`: every var and
//! secret by name, the service bindings and the dispatch namespaces.
//!
//! ## The model
//!
//! hearth gives an instance its vars, secrets and the names of its bindings
//! as its environment (`wasi:cli/environment`; the bindings in
//! `HEARTH_SERVICES`, `HEARTH_DISPATCH` and `HEARTH_DURABLE_OBJECTS`,
//! comma-separated). The
//! environment is read on the instance's **first request**, not when the
//! engine starts: the started engine is snapshotted at build time, where
//! the environment is the build machine's. An instance's environment never
//! changes (a deploy or a new secret loads the Worker anew, with new
//! instances), so that one read is a read at request time, and later
//! requests get the same object with no host call.
//!
//! `runtime.js` (`__hearth.makeEnv`) builds the object from the pairs:
//! vars and secrets as strings, minus the runtime's own `HEARTH_*` entries,
//! and an object with `fetch(input, init)` for each binding (`get(name)`
//! giving one for a namespace's user Worker), under the binding's name and
//! its upper-case form with `-` as `_`; `objects.js` adds a namespace for
//! each Durable Object binding `HEARTH_DURABLE_OBJECTS` names
//! ([`crate::objects`]).

use std::cell::RefCell;

use hearth_sdk::wasi::cli::environment;
use rquickjs::{Array, Ctx, Function, Object, Persistent, Value};

thread_local! {
    /// The instance's `env`, once built.
    static ENV: RefCell<Option<Persistent<Value<'static>>>> = const { RefCell::new(None) };
}

/// The instance's `env`, built from its environment on the first call.
/// `hearth` is `globalThis.__hearth` (`runtime.js`).
pub(crate) fn get<'js>(ctx: &Ctx<'js>, hearth: &Object<'js>) -> rquickjs::Result<Value<'js>> {
    if let Some(env) = ENV.with(|e| e.borrow().clone()) {
        return env.restore(ctx);
    }
    let pairs = Array::new(ctx.clone())?;
    for (i, (k, v)) in environment::get_environment().into_iter().enumerate() {
        pairs.set(2 * i, k)?;
        pairs.set(2 * i + 1, v)?;
    }
    let make: Function = hearth.get("makeEnv")?;
    let env: Value = make.call((pairs,))?;
    let saved = Persistent::save(ctx, env.clone());
    ENV.with(|e| *e.borrow_mut() = Some(saved));
    Ok(env)
}
