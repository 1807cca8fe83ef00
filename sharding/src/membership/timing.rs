//! Failure-detection and dissemination timing.
//!
//! [`FailureDetection`] holds SWIM's constants: the probe period `P`, the
//! suspicion timeout `S`, the gossip interval `G`, and the announce and
//! drain timings around them. The detection bound of the
//! [module docs](super#failure-detection-bound), `2(N − 1)·P + S + G`, is a
//! function of these alone ([`FailureDetection::detection_bound`]); this
//! file also checks them and turns them into foca's own config, keeping
//! every datagram within one MAC-carrying packet.

use std::num::{NonZeroU8, NonZeroUsize};
use std::time::Duration;

use super::MembershipError;
use super::gossip::MAX_PACKET;

/// Failure-detection and dissemination timing. Defaults suit a data center
/// LAN (and loopback); see the [membership docs](super#failure-detection-bound)
/// for the detection bound they give.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailureDetection {
    /// How often each node probes one peer (SWIM protocol period `P`).
    pub probe_period: Duration,
    /// How long a direct probe may take before indirect probes are sent.
    /// Must be less than `probe_period`.
    pub probe_rtt: Duration,
    /// How long a suspected node has to refute before it is declared down
    /// (`S`).
    pub suspect_to_down: Duration,
    /// How often pending updates are gossiped to a few random peers (`G`).
    pub gossip_interval: Duration,
    /// How often to re-announce to the seeds while no peer is known, and a
    /// tenth as often to random peers afterwards (roster catch-up).
    pub announce_interval: Duration,
    /// The longest [`Membership::drain`](super::Membership::drain) waits
    /// for the draining state to be gossiped before returning.
    pub drain_timeout: Duration,
}

impl Default for FailureDetection {
    fn default() -> Self {
        Self {
            probe_period: Duration::from_millis(500),
            probe_rtt: Duration::from_millis(200),
            suspect_to_down: Duration::from_millis(1500),
            gossip_interval: Duration::from_millis(100),
            announce_interval: Duration::from_millis(500),
            drain_timeout: Duration::from_secs(2),
        }
    }
}

impl FailureDetection {
    /// The documented bound on how long a node that dies abruptly stays on a
    /// survivor's ring, in a cluster of `cluster_size` nodes:
    /// `2(N − 1)·P + S + G`.
    pub fn detection_bound(&self, cluster_size: usize) -> Duration {
        let peers = cluster_size.saturating_sub(1).max(1) as u32;
        self.probe_period * (2 * peers) + self.suspect_to_down + self.gossip_interval
    }

    pub(super) fn validate(&self) -> Result<(), MembershipError> {
        let nonzero = [
            ("probe_period", self.probe_period),
            ("probe_rtt", self.probe_rtt),
            ("suspect_to_down", self.suspect_to_down),
            ("gossip_interval", self.gossip_interval),
            ("announce_interval", self.announce_interval),
        ];
        if let Some((name, _)) = nonzero.iter().find(|(_, d)| d.is_zero()) {
            return Err(MembershipError::InvalidTiming(format!(
                "{name} must not be zero"
            )));
        }
        if self.probe_rtt >= self.probe_period {
            return Err(MembershipError::InvalidTiming(
                "probe_rtt must be less than probe_period".into(),
            ));
        }
        Ok(())
    }

    pub(super) fn foca_config(&self) -> foca::Config {
        let three = NonZeroUsize::MIN.saturating_add(2);
        let mut config = foca::Config::simple();
        config.probe_period = self.probe_period;
        config.probe_rtt = self.probe_rtt;
        config.suspect_to_down_after = self.suspect_to_down;
        config.num_indirect_probes = three;
        config.max_transmissions = NonZeroU8::MIN.saturating_add(9);
        // Room for the MAC within one MAX_PACKET datagram.
        config.max_packet_size = NonZeroUsize::MIN.saturating_add(MAX_PACKET - blake3::OUT_LEN - 1);
        // A node wrongly declared down hears so and rejoins (with a renewed
        // identity) instead of staying cut off.
        config.notify_down_members = true;
        config.periodic_gossip = Some(foca::PeriodicParams {
            frequency: self.gossip_interval,
            num_members: three,
        });
        config.periodic_announce = Some(foca::PeriodicParams {
            frequency: self.announce_interval * 10,
            num_members: NonZeroUsize::MIN,
        });
        config.periodic_announce_to_down_members = Some(foca::PeriodicParams {
            frequency: self.announce_interval * 10,
            num_members: NonZeroUsize::MIN.saturating_add(1),
        });
        config
    }
}
