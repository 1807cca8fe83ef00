//! Native helpers of the web APIs in `web.js`, defined as globals before it
//! runs.

use rquickjs::{Ctx, Function, TypedArray};

/// `__hearth_utf8(bytes)`: the bytes decoded as UTF-8 (invalid sequences as
/// U+FFFD), what `TextDecoder.decode` returns.
fn utf8<'js>(b: TypedArray<'js, u8>) -> String {
    // SAFETY: the bytes are copied before any JS runs again.
    let bytes = unsafe { b.as_bytes() }.unwrap_or(&[]);
    String::from_utf8_lossy(bytes).into_owned()
}

/// `__hearth_utf8_encode(string)`: the string's UTF-8 bytes, what
/// `TextEncoder.encode` returns.
fn utf8_encode<'js>(ctx: Ctx<'js>, s: String) -> rquickjs::Result<TypedArray<'js, u8>> {
    TypedArray::new(ctx, s.into_bytes())
}

/// Defines the natives `web.js` uses on `ctx`'s global object.
pub(crate) fn define(ctx: &Ctx<'_>) -> rquickjs::Result<()> {
    ctx.globals()
        .set("__hearth_utf8", Function::new(ctx.clone(), utf8)?)?;
    ctx.globals()
        .set("__hearth_utf8_encode", Function::new(ctx.clone(), utf8_encode)?)?;
    Ok(())
}

/// The web APIs' JS, evaluated after [`define`].
pub(crate) const WEB_JS: &str = include_str!("web.js");
