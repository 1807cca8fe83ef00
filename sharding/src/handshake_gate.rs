//! The handshake gate: how many inbound TLS handshakes may be pending, and
//! which one gives way.
//!
//! Anyone who can reach the RPC port can open TCP connections and send
//! nothing. Each such socket waits for its TLS handshake until
//! [`crate::rpc::RpcConfig::handshake_timeout`], so without a bound a few
//! hundred idle sockets would fill every slot and the members' own
//! connections would be dropped: sharding switched off from outside. The
//! gate keeps three rules:
//!
//! * **per source**: one source has at most [`MAX_PENDING_PER_SOURCE`]
//!   handshakes pending; more from it are closed at once. A source is an
//!   IPv4 address, or an IPv6 /64 prefix: one host or network is handed a
//!   whole /64, so counting IPv6 addresses one by one would let a single
//!   attacker have as many shares as it likes;
//! * **in total**: at most [`MAX_PENDING_HANDSHAKES`] are pending; when a new
//!   connection arrives at a full gate, the *oldest* pending handshake gives
//!   way (it is closed), not the newcomer. A member's handshake takes a
//!   round trip or two, so to starve it a flood must replace every slot
//!   within that time, from many addresses;
//! * a slot is given back when its handshake ends, however it ends.
//!
//! The gate is a plain data structure behind a mutex; the accept loop
//! [`admit`](HandshakeGate::admit)s and the handshake holds its
//! [`Slot`] until it is over, racing it against [`Slot::evicted`].

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

/// Inbound TLS handshakes in progress at once, over all sources.
pub const MAX_PENDING_HANDSHAKES: usize = 256;

/// Inbound TLS handshakes in progress at once from one IP address.
pub const MAX_PENDING_PER_SOURCE: usize = 8;

/// Why a connection was not given a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its source already has [`MAX_PENDING_PER_SOURCE`] handshakes pending.
    SourceBusy,
}

#[derive(Default)]
struct State {
    next_id: u64,
    /// Pending handshakes, oldest first, with the sender whose drop tells
    /// that handshake to give way.
    pending: VecDeque<(u64, IpAddr, oneshot::Sender<()>)>,
    per_source: HashMap<IpAddr, usize>,
    evicted: u64,
}

/// The bound on pending inbound handshakes of one listener. Cheap to clone.
#[derive(Clone, Default)]
pub struct HandshakeGate {
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for HandshakeGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandshakeGate")
            .field("pending", &self.pending())
            .finish()
    }
}

/// A pending handshake's place in the gate, given back on drop.
pub struct Slot {
    gate: HandshakeGate,
    id: u64,
    source: IpAddr,
    evicted: Option<oneshot::Receiver<()>>,
}

impl HandshakeGate {
    /// A slot for a new connection from `source`, closing the oldest pending
    /// handshake if the gate is full.
    pub fn admit(&self, source: IpAddr) -> Result<Slot, Refusal> {
        let source = source_of(source);
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let from_source = state.per_source.get(&source).copied().unwrap_or(0);
        if from_source >= MAX_PENDING_PER_SOURCE {
            return Err(Refusal::SourceBusy);
        }
        if state.pending.len() >= MAX_PENDING_HANDSHAKES
            && let Some((_, oldest, give_way)) = state.pending.pop_front()
        {
            // Dropping the sender wakes that handshake, which then closes.
            drop(give_way);
            state.evicted += 1;
            release(&mut state.per_source, oldest);
        }
        let id = state.next_id;
        state.next_id += 1;
        let (tx, rx) = oneshot::channel();
        state.pending.push_back((id, source, tx));
        *state.per_source.entry(source).or_insert(0) += 1;
        Ok(Slot {
            gate: self.clone(),
            id,
            source,
            evicted: Some(rx),
        })
    }

    /// Handshakes pending now.
    pub fn pending(&self) -> usize {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.pending.len()
    }

    /// Pending handshakes closed so far to make room for newer ones.
    pub fn evicted(&self) -> u64 {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.evicted
    }
}

impl Slot {
    /// Resolves when this handshake must give way to a newer connection
    /// (at once if it was told so already).
    pub async fn evicted(&mut self) {
        if let Some(rx) = self.evicted.as_mut() {
            let _ = rx.await;
            self.evicted = None;
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut state = self
            .gate
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(at) = state.pending.iter().position(|(id, ..)| *id == self.id) {
            state.pending.remove(at);
            release(&mut state.per_source, self.source);
        }
    }
}

/// The source an address counts against: an IPv4 address (also when it
/// arrives IPv4-mapped), or the /64 prefix of an IPv6 one. The front
/// door's per-peer connection cap counts the same way.
pub fn source_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(std::net::Ipv6Addr::from(
                u128::from(v6) & !((1u128 << 64) - 1),
            )),
        },
    }
}

fn release(per_source: &mut HashMap<IpAddr, usize>, source: IpAddr) {
    if let Some(n) = per_source.get_mut(&source) {
        *n -= 1;
        if *n == 0 {
            per_source.remove(&source);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn one_source_gets_at_most_its_share_and_gets_it_back() {
        let gate = HandshakeGate::default();
        let mut slots: Vec<Slot> = (0..MAX_PENDING_PER_SOURCE)
            .map(|_| gate.admit(ip(1)).expect("within the share"))
            .collect();
        assert_eq!(gate.admit(ip(1)).err(), Some(Refusal::SourceBusy));
        assert!(gate.admit(ip(2)).is_ok(), "another source is not affected");
        slots.pop();
        assert!(
            gate.admit(ip(1)).is_ok(),
            "a finished handshake frees its slot"
        );
    }

    #[test]
    fn an_ipv6_source_is_its_64_prefix() {
        let gate = HandshakeGate::default();
        let addr = |host: u64| {
            IpAddr::from(std::net::Ipv6Addr::from(
                (0x2001_0db8_0000_0001u128 << 64) | u128::from(host),
            ))
        };
        let _slots: Vec<Slot> = (0..MAX_PENDING_PER_SOURCE as u64)
            .map(|host| gate.admit(addr(host)).expect("within the share"))
            .collect();
        assert_eq!(
            gate.admit(addr(0xdead_beef)).err(),
            Some(Refusal::SourceBusy),
            "another address of the same /64 is the same source"
        );
        let elsewhere = IpAddr::from(std::net::Ipv6Addr::from(0x2001_0db8_0000_0002u128 << 64));
        assert!(
            gate.admit(elsewhere).is_ok(),
            "another /64 is another source"
        );
        // An IPv4-mapped address counts as its IPv4 address.
        let v4: IpAddr = "192.0.2.7".parse().expect("ip");
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().expect("ip");
        let _v4: Vec<Slot> = (0..MAX_PENDING_PER_SOURCE)
            .map(|_| gate.admit(v4).expect("within the share"))
            .collect();
        assert_eq!(gate.admit(mapped).err(), Some(Refusal::SourceBusy));
    }

    #[tokio::test]
    async fn a_full_gate_closes_the_oldest_pending_handshake_not_the_newcomer() {
        let gate = HandshakeGate::default();
        let mut slots: Vec<Slot> = (0..MAX_PENDING_HANDSHAKES)
            .map(|i| {
                let source = IpAddr::from([10, 1, (i / 8) as u8, (i % 8) as u8]);
                gate.admit(source).expect("room")
            })
            .collect();
        let newcomer = gate.admit(ip(200)).expect("a newcomer always gets in");
        assert_eq!(gate.pending(), MAX_PENDING_HANDSHAKES);
        assert_eq!(gate.evicted(), 1);
        // The oldest was told to give way; the next oldest was not.
        tokio::time::timeout(std::time::Duration::from_secs(1), slots[0].evicted())
            .await
            .expect("the oldest handshake is told to close");
        let second = tokio::time::timeout(std::time::Duration::from_millis(20), slots[1].evicted());
        assert!(second.await.is_err());
        // The evicted slot's source share is back.
        drop(slots.remove(0));
        assert_eq!(gate.pending(), MAX_PENDING_HANDSHAKES);
        drop(newcomer);
        assert_eq!(gate.pending(), MAX_PENDING_HANDSHAKES - 1);
    }
}
