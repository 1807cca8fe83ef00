//! Free loopback ports for servers a test starts in child processes.
//!
//! A child `hearth serve` (or Garage) must be told its ports before it
//! starts, and a node restarted by a test must get the same ones again. Two
//! ways that goes wrong, both seen in CI as "Address already in use":
//!
//! * Asking the kernel (bind port 0, read it, close) hands out a port that
//!   is free again once closed, so the next ask may return the very same
//!   port: two nodes of one test then fight over it. So every port handed
//!   out here is remembered for the life of the process and never handed
//!   out twice, to this test or any other running beside it.
//! * A port from the kernel's ephemeral range (`ip_local_port_range`,
//!   32768–60999 by default) may meanwhile become the local end of some
//!   outgoing connection, and a node restarted on it cannot listen. So
//!   ports are drawn at random from below that range, where the kernel
//!   never places an outgoing connection, and checked free by binding.
//!
//! ```
//! let (http, admin) = (hearth::testing::tcp_port()?, hearth::testing::tcp_port()?);
//! assert_ne!(http, admin);
//! # Ok::<(), std::io::Error>(())
//! ```

use std::collections::BTreeSet;
use std::io;
use std::net::{TcpListener, UdpSocket};
use std::ops::RangeInclusive;
use std::sync::{Mutex, PoisonError};

/// Every port this process has handed out, TCP and UDP alike.
static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// The lowest port drawn: above the registered services most machines run.
const LOWEST: u16 = 10_000;

/// How many draws may find a port taken before giving up.
const TRIES: usize = 1024;

/// A free TCP port on 127.0.0.1 that this process has not handed out
/// before.
pub fn tcp_port() -> io::Result<u16> {
    tcp_port_block(1)
}

/// A free UDP port on 127.0.0.1 (for gossip) that this process has not
/// handed out before.
pub fn udp_port() -> io::Result<u16> {
    draw(1, |p| UdpSocket::bind(("127.0.0.1", p)).is_ok())
}

/// A base port such that it and the `len - 1` ports after it are free TCP
/// ports now, none handed out before, for a command that takes one base
/// port and counts up from it (`hearth cluster --base-port`).
pub fn tcp_port_block(len: u16) -> io::Result<u16> {
    draw(len, |p| TcpListener::bind(("127.0.0.1", p)).is_ok())
}

/// Draws base ports below the ephemeral range until `len` ports from one
/// are all `free` and none was handed out; claims and returns it.
fn draw(len: u16, free: impl Fn(u16) -> bool) -> io::Result<u16> {
    let len = len.max(1);
    let top = below_ephemeral().saturating_sub(len);
    if top <= LOWEST {
        return Err(exhausted());
    }
    for _ in 0..TRIES {
        let base = rand::random_range(LOWEST..top);
        let ports = base..=base + (len - 1);
        if !taken(ports.clone()) && ports.clone().all(&free) && claim(ports) {
            return Ok(base);
        }
    }
    Err(exhausted())
}

/// The first port of the kernel's ephemeral range (32768 if it cannot be
/// read).
fn below_ephemeral() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// Whether any of `ports` was handed out.
fn taken(ports: RangeInclusive<u16>) -> bool {
    let set = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner);
    ports.into_iter().any(|p| set.contains(&p))
}

/// Records `ports` as handed out if none of them was; whether it did.
fn claim(ports: RangeInclusive<u16>) -> bool {
    let mut set = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner);
    if ports.clone().any(|p| set.contains(&p)) {
        return false;
    }
    set.extend(ports);
    true
}

fn exhausted() -> io::Error {
    io::Error::new(
        io::ErrorKind::AddrNotAvailable,
        "no free loopback port below the ephemeral range that this process \
         has not handed out",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_free_distinct_and_below_the_ephemeral_range() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..500 {
            let (t, u) = (tcp_port().expect("tcp"), udp_port().expect("udp"));
            assert!(seen.insert(t) && seen.insert(u), "{t} or {u} twice");
        }
        let base = tcp_port_block(4).expect("block");
        assert!((base..base + 4).all(|p| seen.insert(p)));
        assert!(seen.iter().all(|&p| p >= LOWEST && p < below_ephemeral()));
        // A handed-out port is free to listen on (nothing else took it).
        assert!(TcpListener::bind(("127.0.0.1", base)).is_ok());
    }
}
