//! `wasi:config/store`: the Worker's vars and secrets by name, as the host
//! keeps them (hearth sets the same names in the environment, so
//! `std::env::var` reads them too).
//!
//! The interface is imported directly (its two functions through the
//! component model's canonical ABI), so a Worker that never calls these
//! does not import it and still runs on hosts without it.
//!
//! ```no_run
//! let base = hearth_sdk::config::get("API_BASE").ok().flatten();
//! ```

/// Why the host could not answer (`wasi:config/store`'s `error`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// The store behind the host failed.
    Upstream(String),
    /// An I/O error.
    Io(String),
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::Upstream(m) => write!(f, "config store upstream error: {m}"),
            ConfigError::Io(m) => write!(f, "config store I/O error: {m}"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// The WIT of the imported interface, for the component linker
/// (`wasm-component-ld` reads `component-type*` custom sections to type a
/// module's imports): `wasi:config/store@0.2.0-rc.1` as
/// `wit_component::metadata::encode` 0.254 encodes a world importing it
/// (the WIT is wasmtime-wasi-config 48's `wit/deps/config/store.wit`).
#[cfg(target_arch = "wasm32")]
#[unsafe(link_section = "component-type:hearth-sdk:wasi-config-store")]
#[used]
static COMPONENT_TYPE: [u8; 264] = *include_bytes!("config_component_type.bin");

#[cfg(target_arch = "wasm32")]
mod abi {
    #[link(wasm_import_module = "wasi:config/store@0.2.0-rc.1")]
    unsafe extern "C" {
        #[link_name = "get"]
        pub(super) fn get(key: *const u8, len: usize, ret: *mut u8);
        #[link_name = "get-all"]
        pub(super) fn get_all(ret: *mut u8);
    }
}

/// Takes ownership of a string the host allocated in this instance
/// (through `cabi_realloc`, with alignment 1).
///
/// # Safety
/// `ptr`/`len` must be a string the canonical ABI lifted into this
/// instance's memory.
#[cfg(target_arch = "wasm32")]
unsafe fn owned(ptr: *mut u8, len: usize) -> String {
    if len == 0 {
        return String::new();
    }
    // SAFETY: the host wrote `len` bytes of UTF-8 at `ptr`, allocated by
    // this instance's `cabi_realloc` (the global allocator, alignment 1).
    unsafe { String::from_raw_parts(ptr, len, len) }
}

/// Reads the `u32` at byte `at` of the return area `ret`.
#[cfg(target_arch = "wasm32")]
fn word(ret: &[u8; 16], at: usize) -> usize {
    u32::from_le_bytes([ret[at], ret[at + 1], ret[at + 2], ret[at + 3]]) as usize
}

/// The error case of a `result<_, error>` in `ret` (discriminant at 4,
/// string at 8).
#[cfg(target_arch = "wasm32")]
fn error_at(ret: &[u8; 16]) -> ConfigError {
    // SAFETY: the canonical ABI wrote an owned string at 8..16.
    let msg = unsafe { owned(word(ret, 8) as *mut u8, word(ret, 12)) };
    if ret[4] == 0 {
        ConfigError::Upstream(msg)
    } else {
        ConfigError::Io(msg)
    }
}

/// The value of `key`, if the host has one.
pub fn get(key: &str) -> Result<Option<String>, ConfigError> {
    #[cfg(target_arch = "wasm32")]
    {
        // result<option<string>, error>: discriminant at 0, payload at 4
        // (an option's or a variant's discriminant), string at 8 and 12.
        #[repr(align(4))]
        struct Ret([u8; 16]);
        let mut ret = Ret([0; 16]);
        // SAFETY: `key` is valid for its length; `ret` is the 16-byte,
        // 4-aligned return area the canonical ABI expects.
        unsafe { abi::get(key.as_ptr(), key.len(), ret.0.as_mut_ptr()) };
        let ret = &ret.0;
        if ret[0] != 0 {
            return Err(error_at(ret));
        }
        if ret[4] == 0 {
            return Ok(None);
        }
        // SAFETY: `some(string)`: an owned string at 8..16.
        Ok(Some(unsafe { owned(word(ret, 8) as *mut u8, word(ret, 12)) }))
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        let _ = key;
        Ok(None)
    }
}

/// Every name and value the host has.
pub fn get_all() -> Result<Vec<(String, String)>, ConfigError> {
    #[cfg(target_arch = "wasm32")]
    {
        // result<list<tuple<string, string>>, error>: discriminant at 0,
        // the list (pointer, length) at 4 and 8, or the error at 4..16.
        #[repr(align(4))]
        struct Ret([u8; 16]);
        let mut ret = Ret([0; 16]);
        // SAFETY: `ret` is the return area the canonical ABI expects.
        unsafe { abi::get_all(ret.0.as_mut_ptr()) };
        let ret = &ret.0;
        if ret[0] != 0 {
            return Err(error_at(ret));
        }
        let (base, n) = (word(ret, 4), word(ret, 8));
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            // Each tuple is 16 bytes: two (pointer, length) pairs.
            let at = (base + 16 * i) as *const u32;
            // SAFETY: the host wrote `n` tuples at `base`; each string is
            // owned by us now.
            unsafe {
                let k = owned(*at as *mut u8, *at.add(1) as usize);
                let v = owned(*at.add(2) as *mut u8, *at.add(3) as usize);
                out.push((k, v));
            }
        }
        if n > 0 {
            // SAFETY: the list itself was allocated with `cabi_realloc`
            // (alignment 4, 16 bytes per tuple).
            unsafe {
                std::alloc::dealloc(
                    base as *mut u8,
                    std::alloc::Layout::from_size_align_unchecked(16 * n, 4),
                );
            }
        }
        Ok(out)
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        Ok(Vec::new())
    }
}
