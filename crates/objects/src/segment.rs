//! Segments: the writes of one flush, in order, as one blob.
//!
//! Encoded with postcard (already in the tree; compact binary, values are
//! raw bytes rather than JSON arrays of numbers), behind a version byte so a
//! later format can be told apart.

use serde::{Deserialize, Serialize};

use crate::error::ObjectsError;

/// The first byte of every segment blob.
const FORMAT_V1: u8 = 1;

/// One write, replayed in order on restore.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Op {
    /// `key` now holds `value`.
    Put(String, Vec<u8>),
    /// `key` holds nothing.
    Delete(String),
    /// No key holds anything.
    DeleteAll,
}

/// The blob of a segment holding `ops`.
pub(crate) fn encode(ops: &[Op]) -> Result<Vec<u8>, ObjectsError> {
    let mut blob = vec![FORMAT_V1];
    let body = postcard::to_allocvec(ops)
        .map_err(|e| ObjectsError::Corrupt(format!("encoding a segment: {e}")))?;
    blob.extend_from_slice(&body);
    Ok(blob)
}

/// The writes a segment blob holds.
pub(crate) fn decode(blob: &[u8]) -> Result<Vec<Op>, ObjectsError> {
    match blob.split_first() {
        Some((&FORMAT_V1, body)) => postcard::from_bytes(body)
            .map_err(|e| ObjectsError::Corrupt(format!("decoding a segment: {e}"))),
        Some((version, _)) => Err(ObjectsError::Corrupt(format!(
            "segment format {version} is not known"
        ))),
        None => Err(ObjectsError::Corrupt("empty segment".to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_round_trip_and_refuse_unknown_formats() {
        let ops = vec![
            Op::Put("a".into(), vec![0, 255, 7]),
            Op::Delete("b".into()),
            Op::DeleteAll,
            Op::Put("".into(), vec![]),
        ];
        let blob = encode(&ops).expect("encodes");
        assert_eq!(decode(&blob).expect("decodes"), ops);
        let mut other = blob.clone();
        other[0] = 2;
        assert!(matches!(decode(&other), Err(ObjectsError::Corrupt(_))));
        assert!(matches!(decode(&[]), Err(ObjectsError::Corrupt(_))));
        assert!(matches!(
            decode(&blob[..blob.len() - 1]),
            Err(ObjectsError::Corrupt(_))
        ));
    }
}
