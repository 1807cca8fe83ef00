//! The keys this release deprecates, still read one last time: the next
//! release deletes this file.
//!
//! The keys that carried their unit in their name became durations
//! (`"5m"`) and sizes (`"1GiB"`): `idle_timeout_s`, `memory_budget_mb` and
//! `[limits]` `write_timeout_s`, `drain_timeout_s`, `body_idle_timeout_s`,
//! `slot_wait_ms`, `instance_memory_mb`. A plan's time limits, bare
//! milliseconds before, became durations too. For this release the old
//! spellings are still read, each with a warning that names its
//! replacement and the value to write there; a file that sets an old key
//! and its new one is refused.
//!
//! The renamed keys are one table per struct (`renamed_keys!`), which
//! makes the `Deserialize` impls of [`NodeConfig`] and [`ClientLimits`]:
//! they parse the struct as written (`serde(remote = "Self")`), then move
//! each old key's value into its replacement ([`move_renamed`]). The plans' times go through [`plan_duration`].
//!
//! Deleting this file next release also deletes the old keys' fields in
//! `file` (marked there) and those structs' `remote = "Self"`, and turns
//! the plans' `deserialize_with` into `with = "humantime_serde"`. The one
//! other deprecated key, `[s3] timeout_ms`, is read the same way by
//! `hearth_runtime::S3Settings`.

use std::time::Duration;

use bytesize::ByteSize;
use serde::Deserialize;

use super::{ClientLimits, NodeConfig};

/// A struct's renamed keys, as a table: `renamed_keys!(Struct, "section",
/// old => new as Unit, ...)` implements `Deserialize` for `Struct` as the
/// struct written (its `remote = "Self"` derive) with each old key's number
/// taken out of field `old` and moved into field `new` ([`move_renamed`]),
/// the fields being named as the keys and `Unit` the [`Unit`] the old
/// name carried.
macro_rules! renamed_keys {
    ($ty:ident, $section:literal, $($old:ident => $new:ident as $unit:ident),+ $(,)?) => {
        impl<'de> Deserialize<'de> for $ty {
            /// As written, with its deprecated keys moved into their
            /// replacements.
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let mut c = $ty::deserialize(d)?;
                move_renamed(
                    $section,
                    [$((stringify!($old), c.$old.take(), stringify!($new), Unit::$unit(&mut c.$new))),+],
                )
                .map_err(serde::de::Error::custom)?;
                Ok(c)
            }
        }
    };
}

// The top level (the sections do their own).
renamed_keys!(NodeConfig, "",
    memory_budget_mb => memory_budget as Mib,
    idle_timeout_s => idle_timeout as Secs,
);

renamed_keys!(ClientLimits, "limits",
    write_timeout_s => write_timeout as Secs,
    drain_timeout_s => drain_timeout as Secs,
    body_idle_timeout_s => body_idle_timeout as Secs,
    slot_wait_ms => slot_wait as Millis,
    instance_memory_mb => instance_memory as Mib,
);

/// One renamed key: its old name, the number it was set to there (taken
/// out of the struct), its new name, and the new key's field in the unit
/// the old name carried.
type Rename<'a> = (&'static str, Option<u64>, &'static str, Unit<'a>);

/// The field a renamed key's number goes into, and what unit the number
/// was in.
enum Unit<'a> {
    /// Seconds, now a duration.
    Secs(&'a mut Option<Duration>),
    /// Milliseconds, now a duration.
    Millis(&'a mut Option<Duration>),
    /// MiB, now a size.
    Mib(&'a mut Option<ByteSize>),
}

/// Moves the value of each old key of `keys` that is set into its new key,
/// with a warning; an old key set beside its new one is an error. `section`
/// is where the keys are, for messages (empty for the top level).
fn move_renamed<'a>(
    section: &str,
    keys: impl IntoIterator<Item = Rename<'a>>,
) -> Result<(), String> {
    let place = if section.is_empty() {
        String::new()
    } else {
        format!("[{section}] ")
    };
    for (old, value, new, unit) in keys {
        let Some(n) = value else { continue };
        match unit {
            Unit::Secs(slot) => moved(&place, old, new, slot, written(Duration::from_secs(n))),
            Unit::Millis(slot) => moved(&place, old, new, slot, written(Duration::from_millis(n))),
            Unit::Mib(slot) => moved(
                &place,
                old,
                new,
                slot,
                (ByteSize::mib(n), format!("\"{n}MiB\"")),
            ),
        }?;
    }
    Ok(())
}

/// Puts `value` of the old key `old` (in `place`) into `slot`, the new key
/// `new`, with a warning that says to write `written` there instead; an
/// error if `new` is set too.
fn moved<U>(
    place: &str,
    old: &str,
    new: &str,
    slot: &mut Option<U>,
    (value, written): (U, String),
) -> Result<(), String> {
    if slot.is_some() {
        return Err(format!(
            "{place}sets both {old} and {new}; {old} is the deprecated spelling of {new}: remove it"
        ));
    }
    tracing::warn!(
        "config: {place}{old} is deprecated and will be removed in the next release; \
         write {new} = {written} instead"
    );
    *slot = Some(value);
    Ok(())
}

/// `d` and how to write it in a config file (`"5m"`, `"250ms"`).
fn written(d: Duration) -> (Duration, String) {
    (
        d,
        format!("\"{}\"", humantime_serde::re::humantime::format_duration(d)),
    )
}

/// `[plans.*] startup_cpu`: see [`plan_duration`].
pub(super) fn startup_cpu<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Duration>, D::Error> {
    plan_duration(d, "startup_cpu")
}

/// `[plans.*] request_cpu`: see [`plan_duration`].
pub(super) fn request_cpu<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Duration>, D::Error> {
    plan_duration(d, "request_cpu")
}

/// `[plans.*] request_wall`: see [`plan_duration`].
pub(super) fn request_wall<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Duration>, D::Error> {
    plan_duration(d, "request_wall")
}

/// A plan's time limit `key`: a duration (`"400ms"`), or, as before this
/// release, a bare number of milliseconds (read with a deprecation
/// warning).
fn plan_duration<'de, D: serde::Deserializer<'de>>(
    d: D,
    key: &'static str,
) -> Result<Option<Duration>, D::Error> {
    struct PlanDuration(&'static str);
    impl serde::de::Visitor<'_> for PlanDuration {
        type Value = Duration;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a duration such as \"400ms\" or \"30s\"")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Duration, E> {
            humantime_serde::re::humantime::parse_duration(v)
                .map_err(|e| E::custom(format!("{}: {e} in {v:?}", self.0)))
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Duration, E> {
            let ms = u64::try_from(v).map_err(|_| E::custom(format!("{} is negative", self.0)))?;
            self.visit_u64(ms)
        }
        fn visit_u64<E: serde::de::Error>(self, ms: u64) -> Result<Duration, E> {
            let (d, written) = written(Duration::from_millis(ms));
            tracing::warn!(
                "config: [plans.…] {key} = {ms} (a bare number of milliseconds) is deprecated and \
                 will be refused in the next release; write {key} = {written} instead",
                key = self.0
            );
            Ok(d)
        }
    }
    d.deserialize_any(PlanDuration(key)).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keys_of_the_last_release_still_parse_to_the_same_values() {
        let old: NodeConfig = toml::from_str(
            "memory_budget_mb = 512\nidle_timeout_s = 90\n\
             [limits]\nwrite_timeout_s = 5\ndrain_timeout_s = 60\nbody_idle_timeout_s = 2\n\
             slot_wait_ms = 250\ninstance_memory_mb = 2048\n\
             [s3]\ntimeout_ms = 1500\n\
             [plans.free]\nmax_script_size = 3145728\nstartup_cpu = 400\nrequest_cpu = 30000\n\
             request_wall = 60000\nmemory = 134217728\n",
        )
        .expect("old keys parse");
        let new: NodeConfig = toml::from_str(
            "memory_budget = \"512MiB\"\nidle_timeout = \"90s\"\n\
             [limits]\nwrite_timeout = \"5s\"\ndrain_timeout = \"60s\"\nbody_idle_timeout = \"2s\"\n\
             slot_wait = \"250ms\"\ninstance_memory = \"2GiB\"\n\
             [s3]\ntimeout = \"1500ms\"\n\
             [plans.free]\nmax_script_size = \"3MiB\"\nstartup_cpu = \"400ms\"\nrequest_cpu = \"30s\"\n\
             request_wall = \"60s\"\nmemory = \"128MiB\"\n",
        )
        .expect("new keys parse");
        // Debug shows every field, the deprecated ones too (emptied once
        // moved), so equal output means equal settings.
        assert_eq!(format!("{old:?}"), format!("{new:?}"));
        assert_eq!(old.memory_budget, Some(ByteSize::mib(512)));
        assert_eq!(old.limits.slot_wait, Some(Duration::from_millis(250)));
        assert_eq!(old.plans.free.request_cpu, Some(Duration::from_secs(30)));
        assert_eq!(
            old.s3.as_ref().and_then(|s| s.timeout),
            Some(Duration::from_millis(1500))
        );

        // An old key next to its replacement is a mistake, not a choice.
        for both in [
            "idle_timeout_s = 1\nidle_timeout = \"1s\"\n",
            "[limits]\nslot_wait_ms = 1\nslot_wait = \"1ms\"\n",
            "[s3]\ntimeout_ms = 1\ntimeout = \"1ms\"\n",
        ] {
            let err = toml::from_str::<NodeConfig>(both).expect_err(both);
            assert!(err.to_string().contains("deprecated spelling"), "{err}");
        }
    }
}
