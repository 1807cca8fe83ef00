//! The build script really produced every sample Worker as a component.

use std::io::Write;

/// `\0asm` followed by the component-model binary version (layer 1).
const COMPONENT_HEADER: [u8; 8] = [0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];

const MIB: usize = 1024 * 1024;

/// The gzip size at level 6 (the measure the runtime's size limit uses).
fn gzip6_len(bytes: &[u8]) -> usize {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(6));
    gz.write_all(bytes).expect("gzip in memory");
    gz.finish().expect("gzip in memory").len()
}

#[test]
fn every_sample_is_a_component() {
    assert!(!hearth_sample_workers::NAMES.is_empty());
    for name in hearth_sample_workers::NAMES {
        let path = hearth_sample_workers::path(name)
            .unwrap_or_else(|| panic!("no path for sample {name}"));
        assert!(
            path.is_absolute(),
            "{name}: {} not absolute",
            path.display()
        );
        assert_eq!(
            path.parent(),
            Some(hearth_sample_workers::dir()),
            "{name} is not in dir()"
        );
        let bytes = hearth_sample_workers::bytes(name)
            .unwrap_or_else(|e| panic!("reading {name} at {}: {e}", path.display()));
        assert!(
            bytes.starts_with(&COMPONENT_HEADER),
            "{name} ({}) does not start with the component header: {:02x?}",
            path.display(),
            &bytes[..bytes.len().min(8)]
        );
    }
}

#[test]
fn expected_samples_are_listed() {
    for name in [
        "hello",
        "echo",
        "big",
        "size-1m",
        "size-10m",
        "slow-start",
        "cpu-hog",
        "mem-hog",
        "trap",
        "wstd-hello",
    ] {
        assert!(
            hearth_sample_workers::NAMES.contains(&name),
            "{name} missing from NAMES"
        );
    }
    assert_eq!(
        hearth_sample_workers::all().count(),
        hearth_sample_workers::NAMES.len()
    );
}

#[test]
fn unknown_sample_is_not_found() {
    assert!(hearth_sample_workers::path("no-such-worker").is_none());
    let err = hearth_sample_workers::bytes("no-such-worker").expect_err("unknown name");
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
}

#[test]
fn big_gzips_to_between_3_and_10_mib() {
    let bytes = hearth_sample_workers::bytes("big").expect("big is built");
    let compressed = gzip6_len(&bytes);
    assert!(
        compressed > 3 * MIB && compressed < 10 * MIB,
        "big: gzip size {compressed} bytes ({:.2} MiB) not strictly between 3 and 10 MiB (raw {})",
        compressed as f64 / MIB as f64,
        bytes.len()
    );
}

#[test]
fn size_1m_is_about_1_mb() {
    let len = hearth_sample_workers::bytes("size-1m")
        .expect("size-1m is built")
        .len();
    assert!(
        (800_000..=1_500_000).contains(&len),
        "size-1m: raw size {len} bytes not between 0.8 and 1.5 MB"
    );
}

#[test]
fn size_10m_is_about_10_mb_and_deploys_on_paid() {
    let bytes = hearth_sample_workers::bytes("size-10m").expect("size-10m is built");
    assert!(
        bytes.len() >= 8_000_000,
        "size-10m: raw size {} bytes under 8 MB",
        bytes.len()
    );
    let compressed = gzip6_len(&bytes);
    assert!(
        compressed < 10 * MIB,
        "size-10m: gzip size {compressed} bytes ({:.2} MiB) not under 10 MiB (raw {})",
        compressed as f64 / MIB as f64,
        bytes.len()
    );
}

#[test]
fn small_samples_stay_small() {
    // Everything but the sized samples and the JS and Python Workers (an
    // engine and an interpreter inside, paid plan) should be well under the
    // free plan's 3 MB limit.
    let sized = ["big", "size-1m", "size-10m", "js", "python"];
    for name in hearth_sample_workers::NAMES
        .iter()
        .filter(|n| !sized.contains(n))
    {
        let len = hearth_sample_workers::bytes(name).expect("built").len();
        assert!(len < MIB, "{name} is {len} bytes");
    }
}
