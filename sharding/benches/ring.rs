//! Ring benchmark: prints markdown tables (saved in `sharding/BENCH-ring.md`).
//!
//! Run: `CARGO_TARGET_DIR=/work/target-ring cargo bench -p hearth-sharding --bench ring`
//!
//! 1. Lookup cost for 3, 30 and 300 nodes at the default vnode count, beside
//!    jump consistent hash (Lamping & Veach 2014) and rendezvous (HRW)
//!    hashing measured in the same run on the same pre-hashed keys.
//! 2. Time to rebuild the ring for 300 nodes.
//! 3. Balance curve: the most and least loaded of 300 equal nodes relative to
//!    the mean, against vnodes, both exactly (share of the hash space) and on
//!    a sample of 10^6 script IDs — what `DEFAULT_VNODES` was chosen from.
//!
//! Plain `Instant` timing over many iterations with `black_box`; numbers are
//! for comparison within one run, on whatever machine ran it.

use std::hint::black_box;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hearth_sharding::ring::{DEFAULT_VNODES, Member, Ring, RingConfig, key_position};

const LOOKUP_KEYS: usize = 1 << 16;
const LOOKUP_ROUNDS: usize = 32;
const BALANCE_KEYS: usize = 1_000_000;

fn nodes(n: usize) -> Vec<Member> {
    let addr: SocketAddr = ([127, 0, 0, 1], 7000).into();
    (0..n)
        .map(|i| Member::new(format!("node-{i}"), addr))
        .collect()
}

fn ring(n: usize, vnodes: u32) -> Ring {
    match Ring::new(nodes(n), RingConfig::with_vnodes(vnodes)) {
        Ok(ring) => ring,
        Err(e) => panic!("bench ring: {e}"),
    }
}

/// Jump consistent hash, Lamping & Veach, "A Fast, Minimal Memory,
/// Consistent Hash Algorithm" (2014), figure 1.
fn jump(mut key: u64, buckets: u32) -> u32 {
    let (mut b, mut j) = (-1i64, 0i64);
    while j < i64::from(buckets) {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b as u32
}

/// SplitMix64's finalizer: a fast, well-mixing 64-bit hash for HRW scores.
fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Rendezvous (highest random weight) hashing: the node with the highest
/// `mix(key ^ node_hash)` wins. O(nodes) per lookup.
fn hrw(key: u64, node_hashes: &[u64]) -> usize {
    let mut best = (0u64, 0usize);
    for (i, &h) in node_hashes.iter().enumerate() {
        let score = mix(key ^ h);
        if score >= best.0 {
            best = (score, i);
        }
    }
    best.1
}

/// Nanoseconds per call of `f` over every key, best of `LOOKUP_ROUNDS`.
fn ns_per_op<T>(keys: &[T], mut f: impl FnMut(&T) -> usize) -> f64 {
    let mut best = Duration::MAX;
    for _ in 0..LOOKUP_ROUNDS {
        let start = Instant::now();
        let mut acc = 0usize;
        for k in keys {
            acc = acc.wrapping_add(f(black_box(k)));
        }
        black_box(acc);
        best = best.min(start.elapsed());
    }
    best.as_nanos() as f64 / keys.len() as f64
}

fn lookups() {
    let ids: Vec<String> = (0..LOOKUP_KEYS)
        .map(|i| format!("script-{i:08x}"))
        .collect();
    let positions: Vec<u64> = ids.iter().map(|k| key_position(k)).collect();
    println!("## Lookup (ns/op, best of {LOOKUP_ROUNDS} rounds over {LOOKUP_KEYS} keys)\n");
    println!("vnodes = {DEFAULT_VNODES} (default). \"ring home\" includes hashing the script ID");
    println!("with blake3; the other columns take the same pre-hashed 64-bit key.\n");
    println!(
        "| nodes | points | ring `home(id)` | blake3 key hash | ring search only | jump hash | rendezvous (HRW) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for n in [3usize, 30, 300] {
        let r = ring(n, DEFAULT_VNODES);
        let node_hashes: Vec<u64> = r
            .members()
            .iter()
            .map(|n| key_position(n.id.as_str()))
            .collect();
        let home = ns_per_op(&ids, |k| r.home(k).map_or(0, |n| n.weight as usize));
        let hash = ns_per_op(&ids, |k| key_position(k) as usize);
        let search = ns_per_op(&positions, |&p| {
            r.home_at(p).map_or(0, |n| n.weight as usize)
        });
        let jmp = ns_per_op(&positions, |&p| jump(p, n as u32) as usize);
        let rdv = ns_per_op(&positions, |&p| hrw(p, &node_hashes));
        println!(
            "| {n} | {} | {home:.1} | {hash:.1} | {search:.1} | {jmp:.1} | {rdv:.1} |",
            r.num_points()
        );
    }
    println!();
}

fn rebuild() {
    let members = nodes(300);
    println!("## Rebuild (300 nodes)\n");
    println!("| vnodes | points | build time (ms, best of 10) |");
    println!("|---:|---:|---:|");
    for vnodes in [256u32, 1024, 2048, 4096] {
        let mut best = Duration::MAX;
        for _ in 0..10 {
            let input = members.clone();
            let start = Instant::now();
            let r = Ring::new(black_box(input), RingConfig::with_vnodes(vnodes));
            best = best.min(start.elapsed());
            black_box(r.ok());
        }
        println!(
            "| {vnodes}{} | {} | {:.2} |",
            if vnodes == DEFAULT_VNODES {
                " (default)"
            } else {
                ""
            },
            300 * vnodes,
            best.as_secs_f64() * 1e3
        );
    }
    println!();
}

fn balance() {
    const N: usize = 300;
    let positions: Vec<u64> = (0..BALANCE_KEYS)
        .map(|i| key_position(&format!("script-{i}")))
        .collect();
    println!("## Balance: {N} equal nodes\n");
    println!("Exact = each node's share of the hash space (an infinite number of");
    println!("Workers); sample = counts of {BALANCE_KEYS} script IDs (adds sampling");
    println!("noise of about 1/sqrt(keys per node) = 1.7%).\n");
    println!(
        "| vnodes | exact max/mean | exact min/mean | sample max/mean | sample min/mean | memory (MB) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for vnodes in [16u32, 32, 64, 128, 256, 512, 1024, 2048, 4096] {
        let r = ring(N, vnodes);
        let shares: Vec<f64> = r
            .ownership()
            .into_iter()
            .map(|(_, s)| s * N as f64)
            .collect();
        let exact_max = shares.iter().cloned().fold(f64::MIN, f64::max);
        let exact_min = shares.iter().cloned().fold(f64::MAX, f64::min);
        let mut counts = vec![0u32; N];
        for &p in &positions {
            if let Some(node) = r.home_at(p) {
                // Node IDs are node-<index>; recover the index without a map.
                let index = node.id.as_str()[5..].parse::<usize>().unwrap_or(0);
                counts[index] += 1;
            }
        }
        let mean = BALANCE_KEYS as f64 / N as f64;
        let max = f64::from(counts.iter().copied().max().unwrap_or(0)) / mean;
        let min = f64::from(counts.iter().copied().min().unwrap_or(0)) / mean;
        let mb = r.num_points() as f64 * 12.0 / 1e6;
        println!(
            "| {vnodes}{} | {exact_max:.3} | {exact_min:.3} | {max:.3} | {min:.3} | {mb:.1} |",
            if vnodes == DEFAULT_VNODES {
                " (default)"
            } else {
                ""
            }
        );
    }
    println!();
}

/// How much the balance depends on the particular node IDs: the sample
/// max/mean of 300 equal nodes over 10^6 keys for several independent sets
/// of node IDs, at vnode counts near the default.
fn spread() {
    const N: usize = 300;
    const TRIALS: usize = 16;
    let positions: Vec<u64> = (0..BALANCE_KEYS)
        .map(|i| key_position(&format!("script-{i}")))
        .collect();
    let addr: SocketAddr = ([127, 0, 0, 1], 7000).into();
    println!("## Balance spread: {TRIALS} different sets of 300 node IDs, {BALANCE_KEYS} keys\n");
    println!("| vnodes | sample max/mean: best | median | worst | trials over 1.10 |");
    println!("|---:|---:|---:|---:|---:|");
    for vnodes in [1024u32, 2048, 3072, 4096] {
        let mut maxima: Vec<f64> = (0..TRIALS)
            .map(|t| {
                let members = (0..N).map(|i| Member::new(format!("dc{t}-host{i}"), addr));
                let r = match Ring::new(members, RingConfig::with_vnodes(vnodes)) {
                    Ok(r) => r,
                    Err(e) => panic!("bench ring: {e}"),
                };
                let mut counts = vec![0u32; N];
                for &p in &positions {
                    if let Some(node) = r.home_at(p) {
                        let index = node
                            .id
                            .as_str()
                            .rsplit("host")
                            .next()
                            .and_then(|i| i.parse::<usize>().ok())
                            .unwrap_or(0);
                        counts[index] += 1;
                    }
                }
                f64::from(counts.iter().copied().max().unwrap_or(0)) * N as f64
                    / BALANCE_KEYS as f64
            })
            .collect();
        maxima.sort_by(f64::total_cmp);
        let over = maxima.iter().filter(|&&m| m > 1.10).count();
        println!(
            "| {vnodes}{} | {:.3} | {:.3} | {:.3} | {over}/{TRIALS} |",
            if vnodes == DEFAULT_VNODES {
                " (default)"
            } else {
                ""
            },
            maxima[0],
            maxima[TRIALS / 2],
            maxima[TRIALS - 1]
        );
    }
    println!();
}

fn main() {
    // `cargo bench` passes `--bench`; any other argument filters sections.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wants = |name: &str| args.is_empty() || args.iter().any(|a| name.contains(a.as_str()));
    println!("# hearth-sharding ring benchmark\n");
    if wants("lookup") {
        lookups();
    }
    if wants("rebuild") {
        rebuild();
    }
    if wants("balance") {
        balance();
    }
    if wants("spread") {
        spread();
    }
}
