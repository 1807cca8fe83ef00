//! Durable Objects: the natives `objects.js` builds Cloudflare's API on
//! (`env.X.idFromName`, `ctx.storage`, ...), each one host call of
//! `hearth:objects` (`wit/hearth-objects/objects.wit`), and the question
//! `request.rs` asks of every request of a Worker that exports a class:
//! which object, if any, it runs as ([`this_object`]).
//!
//! ## The model
//!
//! - **IDs** are the host's (`ids`): the same name gives the same ID in
//!   every language; an unknown binding or a malformed ID comes back as
//!   `[kind, message]` for `objects.js` to throw (kind 0: no such binding,
//!   1: not an ID of the namespace).
//! - **Storage** calls are synchronous host calls on the object this
//!   request runs as; keys are strings, values the bytes of `objects.js`'s
//!   storage format. A refused call throws an `Error` with the host's
//!   message (a limit, a malformed call, an object taken over by another
//!   node, the store unreachable); `ctx.storage`'s methods are `async`, so
//!   the caller sees a rejected promise, as on Cloudflare.
//! - Both refuse to run outside a request (the module's top level runs at
//!   build time, where no object exists).

use rquickjs::{Array, Ctx, Exception, Function, Object, TypedArray, Value};

use crate::event_loop;
use crate::init::{ids, storage};

/// The object a request runs as: (class, ID, the name the ID was made
/// from), or `None` for a plain Worker request.
pub(crate) fn this_object() -> Option<(String, String, Option<String>)> {
    storage::this_object().map(|o| (o.class, o.id, o.name))
}

/// A JS string as a key: refused (a `TypeError`) if it holds a lone
/// surrogate, which a WIT string cannot carry (two keys must not become
/// one by a lossy conversion).
fn key(ctx: &Ctx<'_>, s: &rquickjs::String<'_>) -> rquickjs::Result<String> {
    s.to_string().map_err(|_| {
        Exception::throw_type(
            ctx,
            "a Durable Object storage key must be well-formed Unicode (it holds a lone surrogate)",
        )
    })
}

/// Every key of `keys` ([`key`]).
fn keys(ctx: &Ctx<'_>, keys: &[rquickjs::String<'_>]) -> rquickjs::Result<Vec<String>> {
    keys.iter().map(|k| key(ctx, k)).collect()
}

/// An optional key ([`key`]).
fn opt_key(ctx: &Ctx<'_>, k: Option<rquickjs::String<'_>>) -> rquickjs::Result<Option<String>> {
    k.map(|k| key(ctx, &k)).transpose()
}

/// A refused storage call as the exception it throws.
fn storage_error(ctx: &Ctx<'_>, e: storage::StorageError) -> rquickjs::Error {
    use storage::StorageError as E;
    let message = match e {
        E::NotAnObject => {
            "ctx.storage is only usable while a Durable Object serves a request".to_string()
        }
        E::Limit(m) => format!("Durable Object storage limit: {m}"),
        E::Invalid(m) => format!("Durable Object storage: {m}"),
        E::Superseded => "this Durable Object was taken over by another node: its instance is \
                          shut down and nothing it writes is kept"
            .to_string(),
        E::Unavailable(m) => format!("Durable Object storage unavailable: {m}"),
    };
    Exception::throw_message(ctx, &message)
}

/// `__hearth_objects.ids(op, binding, arg)`: 0 `id-from-name(binding,
/// arg)`, 1 `new-unique-id(binding)`, 2 `id-from-string(binding, arg)`.
/// The ID, or `[kind, message]` (0 unknown binding, 1 invalid ID).
fn id_call<'js>(
    ctx: Ctx<'js>,
    op: u8,
    binding: rquickjs::String<'js>,
    arg: rquickjs::String<'js>,
) -> rquickjs::Result<Value<'js>> {
    event_loop::in_request_only(&ctx, "a Durable Object namespace")?;
    let binding = crate::web::usv(&binding)?;
    let arg = crate::web::usv(&arg)?;
    let answer = match op {
        0 => ids::id_from_name(&binding, &arg),
        1 => ids::new_unique_id(&binding),
        _ => ids::id_from_string(&binding, &arg),
    };
    match answer {
        Ok(id) => Ok(rquickjs::String::from_str(ctx, &id)?.into_value()),
        Err(e) => {
            let (kind, message) = match e {
                ids::IdError::UnknownBinding(m) => (0, m),
                ids::IdError::InvalidId(m) => (1, m),
            };
            let pair = Array::new(ctx)?;
            pair.set(0, kind)?;
            pair.set(1, message)?;
            Ok(pair.into_value())
        }
    }
}

/// `__hearth_objects.get(keys)`: each key's value (a `Uint8Array`) or
/// `undefined`, in order.
fn get<'js>(ctx: Ctx<'js>, list: Vec<rquickjs::String<'js>>) -> rquickjs::Result<Array<'js>> {
    event_loop::in_request_only(&ctx, "ctx.storage")?;
    let list = keys(&ctx, &list)?;
    let values = storage::get(&list).map_err(|e| storage_error(&ctx, e))?;
    let out = Array::new(ctx.clone())?;
    for (i, v) in values.into_iter().enumerate() {
        let v = match v {
            Some(bytes) => TypedArray::<u8>::new(ctx.clone(), bytes)?.into_value(),
            None => Value::new_undefined(ctx.clone()),
        };
        out.set(i, v)?;
    }
    Ok(out)
}

/// `__hearth_objects.put(keys, values)`: writes every entry, all or none.
fn put<'js>(
    ctx: Ctx<'js>,
    list: Vec<rquickjs::String<'js>>,
    values: Vec<TypedArray<'js, u8>>,
) -> rquickjs::Result<()> {
    event_loop::in_request_only(&ctx, "ctx.storage")?;
    let list = keys(&ctx, &list)?;
    let entries: Vec<(String, Vec<u8>)> = list
        .into_iter()
        .zip(values.iter())
        // SAFETY: copied at once.
        .map(|(k, v)| (k, unsafe { v.as_bytes() }.unwrap_or(&[]).to_vec()))
        .collect();
    storage::put(&entries).map_err(|e| storage_error(&ctx, e))
}

/// `__hearth_objects.delete(keys)`: how many had a value.
fn delete<'js>(ctx: Ctx<'js>, list: Vec<rquickjs::String<'js>>) -> rquickjs::Result<u32> {
    event_loop::in_request_only(&ctx, "ctx.storage")?;
    let list = keys(&ctx, &list)?;
    storage::delete(&list).map_err(|e| storage_error(&ctx, e))
}

/// `__hearth_objects.list(start, startAfter, end, prefix, reverse, limit)`:
/// the entries selected, as `[key, value, key, value, ...]`.
#[allow(clippy::too_many_arguments)]
fn list<'js>(
    ctx: Ctx<'js>,
    start: Option<rquickjs::String<'js>>,
    start_after: Option<rquickjs::String<'js>>,
    end: Option<rquickjs::String<'js>>,
    prefix: Option<rquickjs::String<'js>>,
    reverse: bool,
    limit: Option<u32>,
) -> rquickjs::Result<Array<'js>> {
    event_loop::in_request_only(&ctx, "ctx.storage")?;
    let options = storage::ListOptions {
        start: opt_key(&ctx, start)?,
        start_after: opt_key(&ctx, start_after)?,
        end: opt_key(&ctx, end)?,
        prefix: opt_key(&ctx, prefix)?,
        reverse,
        limit,
    };
    let entries = storage::list(&options).map_err(|e| storage_error(&ctx, e))?;
    let out = Array::new(ctx.clone())?;
    for (i, (k, v)) in entries.into_iter().enumerate() {
        out.set(2 * i, k)?;
        out.set(2 * i + 1, TypedArray::<u8>::new(ctx.clone(), v)?)?;
    }
    Ok(out)
}

/// `__hearth_objects.deleteAll()`.
fn delete_all(ctx: Ctx<'_>) -> rquickjs::Result<()> {
    event_loop::in_request_only(&ctx, "ctx.storage")?;
    storage::delete_all().map_err(|e| storage_error(&ctx, e))
}

/// `__hearth_objects.txn(op)`: 0 begin, 1 commit, 2 roll back.
fn txn(ctx: Ctx<'_>, op: u8) -> rquickjs::Result<()> {
    event_loop::in_request_only(&ctx, "ctx.storage")?;
    let done = match op {
        0 => storage::transaction_begin(),
        1 => storage::transaction_commit(),
        _ => storage::transaction_rollback(),
    };
    done.map_err(|e| storage_error(&ctx, e))
}

/// `__hearth_objects.alarm(op, at)`: 0 `get-alarm` (the time in ms since
/// the epoch, or `null`), 1 `set-alarm(at)`, 2 `delete-alarm`. `at` is a
/// JS number (objects.js checks it is finite and not negative).
fn alarm<'js>(ctx: Ctx<'js>, op: u8, at: f64) -> rquickjs::Result<Value<'js>> {
    event_loop::in_request_only(&ctx, "ctx.storage")?;
    let done = match op {
        0 => storage::get_alarm().map(|at| match at {
            // Alarm times are far below 2^53 ms: exact as a JS number.
            Some(at) => Value::new_float(ctx.clone(), at as f64),
            None => Value::new_null(ctx.clone()),
        }),
        // Saturating: a time past u64::MAX ms is refused by the host.
        1 => storage::set_alarm(at.max(0.0) as u64).map(|()| Value::new_undefined(ctx.clone())),
        _ => storage::delete_alarm().map(|()| Value::new_undefined(ctx.clone())),
    };
    done.map_err(|e| storage_error(&ctx, e))
}

/// `__hearth_objects.sync()`: every write so far made durable.
fn sync(ctx: Ctx<'_>) -> rquickjs::Result<()> {
    event_loop::in_request_only(&ctx, "ctx.storage")?;
    storage::sync().map_err(|e| storage_error(&ctx, e))
}

/// Defines `__hearth_objects` (`objects.js` takes it off the global
/// object).
pub(crate) fn define(ctx: &Ctx<'_>) -> rquickjs::Result<()> {
    let o = Object::new(ctx.clone())?;
    o.set("ids", Function::new(ctx.clone(), id_call)?)?;
    o.set("get", Function::new(ctx.clone(), get)?)?;
    o.set("put", Function::new(ctx.clone(), put)?)?;
    o.set("delete", Function::new(ctx.clone(), delete)?)?;
    o.set("list", Function::new(ctx.clone(), list)?)?;
    o.set("deleteAll", Function::new(ctx.clone(), delete_all)?)?;
    o.set("txn", Function::new(ctx.clone(), txn)?)?;
    o.set("sync", Function::new(ctx.clone(), sync)?)?;
    o.set("alarm", Function::new(ctx.clone(), alarm)?)?;
    ctx.globals().set("__hearth_objects", o)
}
