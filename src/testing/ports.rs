//! Free loopback ports for servers a test starts in child processes.
//!
//! A child `hearth serve` (or Garage) must be told its ports before it
//! starts, so a test asks the kernel for a free one (bind port 0, read it,
//! close). Closing it makes the port free again: the next ask may get the
//! very same port, and two nodes of one test then fight over it ("Address
//! already in use", seen in CI). So every port handed out here is
//! remembered for the life of the process and never handed out twice, to
//! this test or any other running beside it in the same test binary.
//!
//! ```
//! let (http, admin) = (hearth::testing::tcp_port()?, hearth::testing::tcp_port()?);
//! assert_ne!(http, admin);
//! # Ok::<(), std::io::Error>(())
//! ```

use std::collections::BTreeSet;
use std::io;
use std::net::{TcpListener, UdpSocket};
use std::sync::{Mutex, PoisonError};

/// Every port this process has handed out, TCP and UDP alike.
static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// How many kernel picks may repeat a handed-out port before giving up.
const TRIES: usize = 256;

/// A free TCP port on 127.0.0.1 that this process has not handed out
/// before.
pub fn tcp_port() -> io::Result<u16> {
    fresh(|| TcpListener::bind("127.0.0.1:0")?.local_addr())
}

/// A free UDP port on 127.0.0.1 (for gossip) that this process has not
/// handed out before.
pub fn udp_port() -> io::Result<u16> {
    fresh(|| UdpSocket::bind("127.0.0.1:0")?.local_addr())
}

/// A base port such that it and the `len - 1` ports after it are free TCP
/// ports now, none handed out before, for a command that takes one base
/// port and counts up from it (`hearth cluster --base-port`).
pub fn tcp_port_block(len: u16) -> io::Result<u16> {
    for _ in 0..TRIES {
        let base = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let Some(last) = base.checked_add(len.saturating_sub(1)) else {
            continue;
        };
        let free = (base..=last).all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok());
        if free && claim(base..=last) {
            return Ok(base);
        }
    }
    Err(exhausted())
}

/// Asks the kernel via `pick` until it names a port not handed out yet.
fn fresh(pick: impl Fn() -> io::Result<std::net::SocketAddr>) -> io::Result<u16> {
    for _ in 0..TRIES {
        let port = pick()?.port();
        if claim(port..=port) {
            return Ok(port);
        }
    }
    Err(exhausted())
}

/// Records `ports` as handed out if none of them was; whether it did.
fn claim(ports: std::ops::RangeInclusive<u16>) -> bool {
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
        "no free loopback port left that this process has not handed out",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_port_is_handed_out_twice() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..500 {
            assert!(seen.insert(tcp_port().expect("tcp")));
            assert!(seen.insert(udp_port().expect("udp")));
        }
        let base = tcp_port_block(4).expect("block");
        assert!((base..base + 4).all(|p| seen.insert(p)));
    }
}
