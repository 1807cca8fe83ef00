//! The gossip driver: one task that owns foca's SWIM state machine, the
//! UDP socket and the timers, and the gossip identity it spreads.
//!
//! Each member's [`GossipIdentity`] carries what the live set needs (node
//! ID, RPC address, weight, generation, draining flag), so a change of
//! state is a change of identity: drain gossips a draining identity, a
//! restart a newer generation, and foca keeps the identity of higher
//! [`GossipIdentity::precedence`]. The [`Driver`] handles one event at a
//! time, in order, and after each carries out what foca asked for
//! (datagrams, timers, a ring rebuild). Why foca and not chitchat, and the
//! failure-detection bound this gives, are in the
//! [membership docs](super).

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use foca::{AccumulatingRuntime, Foca, NoCustomBroadcast, OwnedNotification, PostcardCodec, Timer};
use futures::{FutureExt as _, StreamExt as _};
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, sleep_until};
use tokio_util::time::DelayQueue;
use tokio_util::time::delay_queue::Expired;

use super::auth::{open, seal};
use super::identity::{Identity, Verdict};
use super::view::View;
use super::{
    Command, FailureDetection, GossipConfig, GossipCounters, IdentityCheck, MembershipError,
};
use crate::ring::{Member, NodeId};

/// Largest weight accepted from gossip: a peer's typo must not blow up
/// everyone's ring (points grow with weight).
pub const MAX_GOSSIP_WEIGHT: u32 = 100;

/// Largest gossip datagram sent or accepted.
pub(super) const MAX_PACKET: usize = 1400;

/// A gossip identity: who a member is, how to reach it, and its state.
/// Foca treats identities with the same gossip address as one member and
/// keeps the one with the higher [`GossipIdentity::precedence`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct GossipIdentity {
    pub(super) gossip: SocketAddr,
    pub(super) generation: u64,
    pub(super) draining: bool,
    pub(super) id: NodeId,
    pub(super) rpc: SocketAddr,
    pub(super) weight: u32,
}

impl GossipIdentity {
    /// Newer generation wins; within one, draining wins; the rest only makes
    /// the order total so every node picks the same.
    pub(super) fn precedence(&self) -> (u64, bool, &NodeId, SocketAddr, u32, SocketAddr) {
        (
            self.generation,
            self.draining,
            &self.id,
            self.rpc,
            self.weight,
            self.gossip,
        )
    }

    pub(super) fn ring_member(&self) -> Member {
        Member {
            id: self.id.clone(),
            rpc_addr: self.rpc,
            weight: self.weight,
        }
    }

    /// Stand-in identity for a seed we have not met: foca accepts an
    /// announce addressed to any identity with its gossip address.
    fn seed(gossip: SocketAddr) -> Self {
        Self {
            gossip,
            generation: 0,
            draining: false,
            id: NodeId::new(""),
            rpc: gossip,
            weight: 0,
        }
    }
}

impl foca::Identity for GossipIdentity {
    type Addr = SocketAddr;

    fn renew(&self) -> Option<Self> {
        Some(Self {
            generation: self.generation.wrapping_add(1),
            ..self.clone()
        })
    }

    fn addr(&self) -> SocketAddr {
        self.gossip
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        self.precedence() > adversary.precedence()
    }
}

/// A timer foca asked for, numbered in submission order: timers due at the
/// same instant are handed to foca in the order it asked for them.
struct Due {
    seq: u64,
    timer: Timer<GossipIdentity>,
}

type Swim = Foca<GossipIdentity, PostcardCodec, StdRng, NoCustomBroadcast>;

/// Drives foca: one task owns the SWIM state machine, the socket and the
/// timers, so events are handled strictly one at a time and in order.
///
/// [`Driver::run`] waits for the next [`Event`] and hands it to its handler:
/// a command from the handle ([`Driver::on_command`]), an identity check's
/// verdict ([`Driver::verdict`]), a datagram ([`Driver::on_datagram`]),
/// foca's due timers ([`Driver::on_timers`]), the announce tick
/// ([`Driver::on_announce`]) or the drain deadline. After each, what foca
/// asked for is carried out ([`Driver::flush`]).
pub(super) struct Driver {
    pub(super) view: View,
    pub(super) me: GossipIdentity,
    pub(super) foca: Swim,
    out: AccumulatingRuntime<GossipIdentity>,
    socket: UdpSocket,
    /// foca's timers, by due time.
    timers: DelayQueue<Due>,
    seq: u64,
    /// A drain waiting for the draining state to be gossiped out, and its
    /// deadline.
    pending_drain: Option<(oneshot::Sender<()>, Instant)>,
    seeds: Vec<SocketAddr>,
    timing: FailureDetection,
    /// Set once we said goodbye: our own "down" is expected from then on.
    leaving: bool,
    key: Option<[u8; 32]>,
    pub(super) counters: GossipCounters,
    /// When the last "cannot authenticate" warning was logged, and the
    /// drops since.
    pub(super) last_warning: Option<Instant>,
    pub(super) unwarned: u64,
    /// Proves members' node IDs; `None` trusts gossip.
    pub(super) verify: Option<IdentityCheck>,
    /// What is known of each gossiped (node ID, RPC address).
    pub(super) identities: HashMap<(NodeId, SocketAddr), Identity>,
    pub(super) verdicts_tx: mpsc::UnboundedSender<Verdict>,
    verdicts: mpsc::UnboundedReceiver<Verdict>,
}

/// What the driver's loop woke up for.
enum Event {
    Command(Option<Command>),
    Verdict(Option<Verdict>),
    Datagram(io::Result<(usize, SocketAddr)>),
    Timer(Expired<Due>),
    Announce,
    DrainDeadline,
}

impl Driver {
    /// Binds the gossip socket; `seeds` are the configured seeds resolved.
    pub(super) async fn bind(
        view: View,
        gossip: GossipConfig,
        seeds: Vec<SocketAddr>,
        counters: GossipCounters,
    ) -> Result<Self, MembershipError> {
        let GossipConfig {
            listen,
            advertise,
            seeds: _,
            timing,
            key,
            verify,
        } = gossip;
        timing.validate()?;
        if view.me.weight > MAX_GOSSIP_WEIGHT {
            return Err(MembershipError::WeightTooLarge {
                weight: view.me.weight,
                max: MAX_GOSSIP_WEIGHT,
            });
        }
        if listen.ip().is_unspecified() {
            return Err(MembershipError::UnspecifiedGossipAddr(listen));
        }
        let bind_error = |source| MembershipError::Bind {
            addr: listen,
            source,
        };
        if let Some(a) = advertise
            && (a.ip().is_unspecified() || a.port() == 0)
        {
            return Err(MembershipError::InvalidAdvertiseAddr(a));
        }
        let socket = UdpSocket::bind(listen).await.map_err(bind_error)?;
        let bound = socket.local_addr().map_err(bind_error)?;
        // What peers send to: the advertised address if there is one.
        let gossip_addr = advertise.unwrap_or(bound);
        let generation = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let me = GossipIdentity {
            gossip: gossip_addr,
            generation,
            draining: false,
            id: view.me.id.clone(),
            rpc: view.me.rpc_addr,
            weight: view.me.weight,
        };
        let rng: StdRng = rand::make_rng();
        let foca = Foca::new(me.clone(), timing.foca_config(), rng, PostcardCodec);
        let seeds = seeds
            .into_iter()
            .filter(|s| *s != gossip_addr && *s != bound)
            .collect();
        let (verdicts_tx, verdicts) = mpsc::unbounded_channel();
        Ok(Self {
            view,
            me,
            foca,
            out: AccumulatingRuntime::new(),
            socket,
            timers: DelayQueue::new(),
            seq: 0,
            pending_drain: None,
            seeds,
            timing,
            leaving: false,
            key,
            counters,
            last_warning: None,
            unwarned: 0,
            verify,
            identities: HashMap::new(),
            verdicts_tx,
            verdicts,
        })
    }

    pub(super) async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        let mut buf = vec![0u8; MAX_PACKET];
        let mut announce = tokio::time::interval(self.timing.announce_interval);
        announce.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let drain_deadline = self.pending_drain.as_ref().map_or_else(far_future, |p| p.1);
            let event = tokio::select! {
                command = commands.recv() => Event::Command(command),
                verdict = self.verdicts.recv() => Event::Verdict(verdict),
                received = self.socket.recv_from(&mut buf) => {
                    Event::Datagram(received)
                }
                // Disabled while no timer is set (the queue yields `None`).
                Some(due) = self.timers.next() => Event::Timer(due),
                _ = announce.tick() => Event::Announce,
                _ = sleep_until(drain_deadline) => Event::DrainDeadline,
            };
            match event {
                Event::Command(None) => return,
                Event::Command(Some(command)) => {
                    if self.on_command(command).await.is_break() {
                        return;
                    }
                }
                // The sender half lives in `self`: never closed.
                Event::Verdict(None) => {}
                Event::Verdict(Some(verdict)) => self.verdict(verdict),
                Event::Datagram(received) => self.on_datagram(received, &buf).await,
                Event::Timer(first) => self.on_timers(first),
                Event::Announce => self.on_announce(),
                Event::DrainDeadline => {
                    if let Some((drained, _)) = self.pending_drain.take() {
                        tracing::warn!(node = %self.me.id, "drain: gossip not fully sent before the timeout");
                        let _ = drained.send(());
                    }
                }
            }
            self.flush().await;
            // Drained once the draining state has been gossiped out (or
            // there is nobody to tell).
            let announced = self.foca.updates_backlog() == 0 || self.foca.num_members() == 0;
            if announced && let Some((drained, _)) = self.pending_drain.take() {
                let _ = drained.send(());
            }
        }
    }

    /// A command from the [`Membership`](super::Membership) handle: shut
    /// down (say goodbye, then stop) or drain (leave the ring, answer once
    /// that is gossiped). `Break` stops the driver.
    async fn on_command(&mut self, command: Command) -> ControlFlow<()> {
        match command {
            Command::Shutdown(reply) => {
                self.leaving = true;
                if self.foca.num_members() > 0 {
                    let left = self.foca.leave_cluster(&mut self.out);
                    log_foca("leave", left);
                    self.flush().await;
                }
                if let Some((drained, _)) = self.pending_drain.take() {
                    let _ = drained.send(());
                }
                let _ = reply.send(());
                ControlFlow::Break(())
            }
            Command::Drain(reply) => {
                if self.me.draining {
                    let _ = reply.send(());
                } else {
                    tracing::info!(node = %self.me.id, "draining: leaving the ring");
                    self.me.draining = true;
                    self.view.draining = true;
                    let changed = self.foca.change_identity(self.me.clone(), &mut self.out);
                    log_foca("drain", changed);
                    self.rebuild();
                    let deadline = Instant::now() + self.timing.drain_timeout;
                    self.pending_drain = Some((reply, deadline));
                }
                ControlFlow::Continue(())
            }
            Command::Resolved(resolved) => {
                let own = self.me.gossip;
                self.seeds = resolved.seeds.into_iter().filter(|s| *s != own).collect();
                self.view.set_statics(resolved.statics);
                self.rebuild();
                ControlFlow::Continue(())
            }
        }
    }

    /// A datagram (or a receive error): authenticated gossip goes to foca,
    /// the rest is counted.
    async fn on_datagram(&mut self, received: io::Result<(usize, SocketAddr)>, buf: &[u8]) {
        match received {
            Ok((len, from)) => match open(self.key.as_ref(), &buf[..len]) {
                Some(payload) => {
                    let handled = self.foca.handle_data(payload, &mut self.out);
                    log_foca("datagram", handled);
                }
                None => self.unauthenticated(from),
            },
            Err(error) => {
                // ICMP errors from peers that went away surface here on
                // some platforms; they are not ours to handle.
                tracing::debug!(%error, "gossip receive error");
                if !matches!(
                    error.kind(),
                    io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset
                ) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }

    /// `first` and every other timer already due, handed to foca in due
    /// order, and in the order foca set them when due together.
    fn on_timers(&mut self, first: Expired<Due>) {
        let mut due = vec![first];
        while let Some(Some(more)) = self.timers.next().now_or_never() {
            due.push(more);
        }
        due.sort_by_key(|e| (e.deadline(), e.get_ref().seq));
        for expired in due {
            let handled = self
                .foca
                .handle_timer(expired.into_inner().timer, &mut self.out);
            log_foca("timer", handled);
        }
    }

    /// The announce tick: retry refused identities that are due, and
    /// announce to the seeds while no peer is known.
    fn on_announce(&mut self) {
        let now = Instant::now();
        if self
            .identities
            .values()
            .any(|i| matches!(i, Identity::Refused { retry_at } if *retry_at <= now))
        {
            self.rebuild();
        }
        if self.foca.num_members() == 0 {
            for seed in &self.seeds {
                let sent = self
                    .foca
                    .announce(GossipIdentity::seed(*seed), &mut self.out);
                log_foca("announce", sent);
            }
        }
    }

    /// Carries out what foca asked for: datagrams, timers, and — when the
    /// membership changed — a ring rebuild.
    async fn flush(&mut self) {
        while let Some((to, data)) = self.out.to_send() {
            let datagram = seal(self.key.as_ref(), data.to_vec());
            if let Err(error) = self.socket.send_to(&datagram, to.gossip).await {
                tracing::debug!(%error, to = %to.gossip, "gossip send error");
            }
        }
        let now = Instant::now();
        while let Some((after, timer)) = self.out.to_schedule() {
            self.seq += 1;
            self.timers.insert_at(
                Due {
                    seq: self.seq,
                    timer,
                },
                now + after,
            );
        }
        let mut changed = false;
        while let Some(notification) = self.out.to_notify() {
            match notification {
                OwnedNotification::MemberUp(_)
                | OwnedNotification::MemberDown(_)
                | OwnedNotification::Rename(..) => changed = true,
                OwnedNotification::Rejoin(me) => {
                    tracing::warn!(node = %me.id, generation = me.generation,
                        "declared down by the cluster; rejoined with a renewed identity");
                    self.me = me;
                }
                OwnedNotification::Defunct if !self.leaving => {
                    tracing::error!(node = %self.me.id, "declared down by the cluster");
                }
                OwnedNotification::Idle => {
                    tracing::info!(node = %self.me.id, "no live peers");
                }
                _ => {}
            }
        }
        if changed {
            self.rebuild();
        }
    }
}

/// A deadline that never comes in practice: what `select!` waits on while
/// no drain is pending.
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(3600)
}

/// Logs (at debug) an error foca returned for `what`: foca reports
/// datagrams and timers it ignores as errors, which are not ours to act on.
fn log_foca(what: &str, result: Result<(), foca::Error>) {
    if let Err(error) = result {
        tracing::debug!(%error, "foca {what}");
    }
}
