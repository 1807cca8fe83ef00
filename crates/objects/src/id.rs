//! Object IDs and namespaces.
//!
//! An ID is 32 bytes, written as 64 lowercase hex digits (as Cloudflare's;
//! parsing also takes uppercase, as the WIT's `id-from-string` does, and
//! `Display` gives the one lowercase spelling back).
//! The first 24 bytes are its *body*: derived from the name for
//! [`Namespace::id_from_name`] (so every node computes the same ID), random
//! for [`Namespace::new_unique_id`]. The last 8 bytes are a *check* derived
//! from the namespace and the body, so [`Namespace::id_from_string`]
//! refuses an ID made by another script or class instead of silently
//! addressing an object that no one created.

use std::fmt;
use std::str::FromStr;

use crate::error::IdError;

/// Bytes of an ID that identify the object within its namespace.
const BODY_LEN: usize = 24;
/// blake3 `derive_key` context of names' IDs.
const NAME_CONTEXT: &str = "hearth objects 2026-12 id from name";
/// blake3 `derive_key` context of IDs' check parts.
const CHECK_CONTEXT: &str = "hearth objects 2026-12 id check";

/// A Durable Object's ID: 32 bytes, shown as 64 lowercase hex digits.
///
/// `FromStr` checks the form only; [`Namespace::id_from_string`] also checks
/// that the ID belongs to the namespace.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId([u8; 32]);

impl ObjectId {
    /// The ID's 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjectId({self})")
    }
}

impl FromStr for ObjectId {
    type Err = IdError;

    /// Parses 64 hex digits, either case (`Display` writes lowercase: an
    /// ID has one spelling once parsed, so it has one ring key).
    fn from_str(s: &str) -> Result<Self, IdError> {
        if s.len() != 64 {
            return Err(IdError::Malformed(format!(
                "expected 64 hex digits, got {} characters",
                s.chars().count()
            )));
        }
        let digit = |c: u8| match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            b'A'..=b'F' => Ok(c - b'A' + 10),
            _ => Err(IdError::Malformed(
                "expected hex digits (0-9, a-f)".to_owned(),
            )),
        };
        let mut bytes = [0u8; 32];
        for (byte, pair) in bytes.iter_mut().zip(s.as_bytes().chunks_exact(2)) {
            *byte = digit(pair[0])? << 4 | digit(pair[1])?;
        }
        Ok(ObjectId(bytes))
    }
}

/// A Durable Object namespace: the Worker's script and the exported class
/// whose instances the namespace's IDs address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Namespace {
    /// The script (Worker) name that exports the class.
    pub script: String,
    /// The exported class name.
    pub class: String,
}

impl Namespace {
    /// A namespace of `class` exported by `script`.
    pub fn new(script: impl Into<String>, class: impl Into<String>) -> Self {
        Self {
            script: script.into(),
            class: class.into(),
        }
    }

    /// The ID of the object called `name` in this namespace: the same on
    /// every node and every run (blake3 `derive_key` of script, class and
    /// name), so `idFromName("global")` reaches one object cluster-wide.
    pub fn id_from_name(&self, name: &str) -> ObjectId {
        let mut hasher = blake3::Hasher::new_derive_key(NAME_CONTEXT);
        self.hash_into(&mut hasher);
        hash_field(&mut hasher, name.as_bytes());
        let digest = hasher.finalize();
        let mut body = [0u8; BODY_LEN];
        body.copy_from_slice(&digest.as_bytes()[..BODY_LEN]);
        self.seal(body)
    }

    /// A new random ID in this namespace (192 random bits), for an object
    /// no name addresses (`newUniqueId`).
    pub fn new_unique_id(&self) -> ObjectId {
        self.seal(rand::random())
    }

    /// Parses an ID written by `Display` and checks that this namespace
    /// made it (`idFromString`): [`IdError::Malformed`] for anything but
    /// 64 hex digits (either case), [`IdError::OtherNamespace`] for an ID of
    /// another script or class.
    pub fn id_from_string(&self, s: &str) -> Result<ObjectId, IdError> {
        let id: ObjectId = s.parse()?;
        let mut body = [0u8; BODY_LEN];
        body.copy_from_slice(&id.0[..BODY_LEN]);
        if self.seal(body) == id {
            Ok(id)
        } else {
            Err(IdError::OtherNamespace)
        }
    }

    /// The ID of `body` in this namespace: the body and its check part.
    fn seal(&self, body: [u8; BODY_LEN]) -> ObjectId {
        let mut hasher = blake3::Hasher::new_derive_key(CHECK_CONTEXT);
        self.hash_into(&mut hasher);
        hash_field(&mut hasher, &body);
        let check = hasher.finalize();
        let mut id = [0u8; 32];
        id[..BODY_LEN].copy_from_slice(&body);
        id[BODY_LEN..].copy_from_slice(&check.as_bytes()[..32 - BODY_LEN]);
        ObjectId(id)
    }

    fn hash_into(&self, hasher: &mut blake3::Hasher) {
        hash_field(hasher, self.script.as_bytes());
        hash_field(hasher, self.class.as_bytes());
    }
}

/// Hashes a length-prefixed field, so ("ab", "c") and ("a", "bc") differ.
fn hash_field(hasher: &mut blake3::Hasher, field: &[u8]) {
    hasher.update(&(field.len() as u64).to_le_bytes());
    hasher.update(field);
}

/// The prefix of every ring key ([`ObjectKey::ring_key`]). No Worker's
/// script ID can start with it (they have no `:`), so a key the node
/// routes names a Worker or an object, never both.
pub const RING_KEY_PREFIX: &str = "do:";

/// An object: its namespace and its ID. The unit of placement, ownership
/// and storage.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectKey {
    /// The object's namespace (script and class).
    pub namespace: Namespace,
    /// The object's ID in that namespace.
    pub id: ObjectId,
}

impl ObjectKey {
    /// The key the consistent-hash ring places the object by, and under
    /// which the fence keeps its head: `do:<script>/<class>/<id>`.
    pub fn ring_key(&self) -> String {
        format!(
            "{RING_KEY_PREFIX}{}/{}/{}",
            self.namespace.script, self.namespace.class, self.id
        )
    }

    /// The object a ring key names: the inverse of [`ObjectKey::ring_key`],
    /// for a key that crossed the shard hop. The ID must be one its
    /// namespace made ([`Namespace::id_from_string`]) and the key spelled as
    /// `ring_key` spells it (lowercase ID), so one object has one key;
    /// anything else is [`IdError::Malformed`] or
    /// [`IdError::OtherNamespace`].
    pub fn from_ring_key(key: &str) -> Result<ObjectKey, IdError> {
        let malformed = || IdError::Malformed(format!("not a ring key: {key:?}"));
        let rest = key.strip_prefix(RING_KEY_PREFIX).ok_or_else(malformed)?;
        let (script, rest) = rest.split_once('/').ok_or_else(malformed)?;
        let (class, id) = rest.rsplit_once('/').ok_or_else(malformed)?;
        if script.is_empty() || class.is_empty() {
            return Err(malformed());
        }
        let namespace = Namespace::new(script, class);
        let id = namespace.id_from_string(id)?;
        let object = ObjectKey { namespace, id };
        if object.ring_key() != key {
            return Err(malformed());
        }
        Ok(object)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_give_the_same_id_and_namespaces_differ() {
        let counter = Namespace::new("app", "Counter");
        let id = counter.id_from_name("global");
        assert_eq!(id, counter.id_from_name("global"));
        assert_ne!(id, counter.id_from_name("other"));
        assert_ne!(id, Namespace::new("app", "Room").id_from_name("global"));
        // Length-prefixed fields: moving a character between fields
        // changes the ID.
        assert_ne!(
            Namespace::new("ab", "c").id_from_name("x"),
            Namespace::new("a", "bc").id_from_name("x")
        );
    }

    #[test]
    fn ring_keys_round_trip_and_are_checked() {
        let ns = Namespace::new("app", "Counter");
        let key = ObjectKey {
            id: ns.id_from_name("global"),
            namespace: ns,
        };
        let text = key.ring_key();
        assert_eq!(ObjectKey::from_ring_key(&text), Ok(key.clone()));
        // Another namespace's ID, a key in capitals, and non-keys.
        let other = format!("do:app/Room/{}", key.id);
        assert_eq!(
            ObjectKey::from_ring_key(&other),
            Err(IdError::OtherNamespace)
        );
        for bad in [
            text.to_uppercase(),
            format!("do:app/Counter/{}", key.id.to_string().to_uppercase()),
            "app".to_string(),
            "do:app/Counter".to_string(),
            format!("do:/Counter/{}", key.id),
            format!("do:app//{}", key.id),
        ] {
            assert!(
                matches!(ObjectKey::from_ring_key(&bad), Err(IdError::Malformed(_))),
                "{bad} must be refused"
            );
        }
    }

    #[test]
    fn ids_round_trip_and_are_checked_against_their_namespace() {
        let counter = Namespace::new("app", "Counter");
        let room = Namespace::new("app", "Room");
        for id in [counter.id_from_name("global"), counter.new_unique_id()] {
            let text = id.to_string();
            assert_eq!(text.len(), 64);
            assert!(
                text.bytes()
                    .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
            );
            assert_eq!(counter.id_from_string(&text), Ok(id));
            // Uppercase is the same ID, shown lowercase again.
            assert_eq!(counter.id_from_string(&text.to_uppercase()), Ok(id));
            assert_eq!(room.id_from_string(&text), Err(IdError::OtherNamespace));
        }
        assert_ne!(counter.new_unique_id(), counter.new_unique_id());
    }

    #[test]
    fn malformed_ids_are_refused() {
        let counter = Namespace::new("app", "Counter");
        let good = counter.id_from_name("global").to_string();
        for bad in [
            String::new(),
            good[..63].to_owned(),
            format!("{good}0"),
            format!("{}g", &good[..63]),
            format!("{}é", &good[..62]),
        ] {
            assert!(
                matches!(counter.id_from_string(&bad), Err(IdError::Malformed(_))),
                "{bad:?} was accepted"
            );
        }
        // A flipped body bit breaks the check part.
        let mut flipped = good.into_bytes();
        flipped[0] = if flipped[0] == b'0' { b'1' } else { b'0' };
        let flipped = String::from_utf8(flipped).expect("hex is ASCII");
        assert_eq!(
            counter.id_from_string(&flipped),
            Err(IdError::OtherNamespace)
        );
    }

    #[test]
    fn ring_key_names_the_object() {
        let namespace = Namespace::new("app", "Counter");
        let id = namespace.id_from_name("global");
        let key = ObjectKey { namespace, id };
        assert_eq!(key.ring_key(), format!("do:app/Counter/{id}"));
    }
}
