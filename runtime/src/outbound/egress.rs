//! Egress: a Worker's requests to origins on the network (any host that is
//! not one of its [bindings](crate::outbound::bindings)), denied unless its deploy
//! allows the origin, and sent by the node with SSRF protection and limits.
//!
//! # The model
//!
//! A Worker reaches no origin by default. At deploy (`allowed_hosts` in its
//! manifest, `hearth deploy --allow-host URL`, or the admin API's
//! `allow_host` query parameter) it may be given an **allow-list** of
//! origins, as in Spin: each entry is `scheme://host[:port]`, where
//!
//! * the scheme is `http` or `https`;
//! * the host is a DNS name, an IPv4 address, a bracketed IPv6 address, or
//!   `*.example.com`, which allows every subdomain of `example.com` (at any
//!   depth) but not `example.com` itself;
//! * the port, if absent, is the scheme's default (80 or 443), so
//!   `https://api.example.com` does not allow `https://api.example.com:8443`.
//!
//! A bare `*`, a path (`https://x.com/v1`), user info, or any other scheme
//! is refused at deploy with an error that says why. The allow-list is
//! stored with the script like its bindings and changes only by a deploy.
//!
//! Where an outgoing request goes, in order:
//!
//! 1. a host in `.internal` is a binding, or denied
//!    ([`crate::outbound::bindings`]);
//! 2. a subrequest of a user Worker that was dispatched to through an
//!    outbound Worker goes to that outbound Worker (which may itself fetch
//!    origins on *its* allow-list);
//! 3. an origin on the Worker's allow-list is fetched by the node;
//! 4. anything else is denied (`HTTP-request-denied`), as with no list.
//!
//! # How the node fetches an origin
//!
//! Over HTTP/1.1, or HTTPS with rustls (the `ring` provider) trusting the
//! Mozilla roots of `webpki-roots`; connections are kept alive and pooled,
//! one pool per node shared by every Worker, within the connection caps of
//! `outbound::connections`: open connections per node, connections
//! in use per Worker, idle ones closed after `idle_timeout` or whenever a
//! fetch needs the room. Redirects are **not** followed: the Worker sees the
//! 3xx and decides.
//!
//! **DNS.** Host names are resolved by an asynchronous stub resolver
//! (hickory-resolver) asking the name servers of `/etc/resolv.conf`, or
//! those of `[egress] dns_servers`, after `/etc/hosts`: a lookup is a
//! few UDP (or TCP) exchanges on the node's async runtime with its own
//! timeout (`[egress] dns_timeout`), never a `getaddrinfo` call parked on a
//! blocking-pool thread, so a slow or silent name server holds nothing
//! once the lookup gave up (before, each stalled lookup kept a thread of
//! the pool that also serves store reads and compiles).
//!
//! **SSRF protection.** The node resolves the host itself and refuses every
//! address that is loopback, private (RFC 1918, IPv6 ULA and site-local
//! `fec0::/10`, local-use NAT64 `64:ff9b:1::/48`), link-local, shared
//! (CGNAT, 100.64/10), unspecified, multicast, broadcast or reserved
//! (IETF protocol assignments 192.0.0/24, benchmarking 198.18/15,
//! documentation, discard-only), and cloud metadata addresses
//! (169.254.169.254, fd00:ec2::254) with them; an IPv6 address that embeds
//! a refused IPv4 address (IPv4-mapped, NAT64, 6to4, Teredo) is refused
//! too ([`forbidden_address`]). An IP literal in the URL is checked the
//! same way; `localhost` and the names under it (`api.localhost`) are
//! loopback without asking DNS (RFC 6761 §6.3). It then connects to a
//! checked address, never resolving the name a second time, so a DNS answer
//! that changes between check and connect (rebinding) cannot slip through.
//! Because redirects are not followed, a redirect to `127.0.0.1` reaches
//! nothing either. A node whose origins are private (a test, a service on
//! the same host) sets `[egress] allow_private_addresses = true`
//! ([`EgressConfig::allow_private_addresses`]).
//!
//! **Limits**, each failing the guest's request with a wasi:http error code
//! it can read, and counted by outcome ([`SubrequestOutcome`]):
//!
//! | limit | where set | error code | outcome |
//! |---|---|---|---|
//! | origin not on the allow-list | deploy | `HTTP-request-denied` | `denied` |
//! | private address | `[egress] allow_private_addresses` | `destination-IP-prohibited` | `private_address` |
//! | fetches per request (free 50, paid 1000) | `[plans.*] subrequests` | `connection-limit-reached` | `too_many` |
//! | DNS lookup (5 s) | `[egress] dns_timeout` | `DNS-timeout` | `timeout` |
//! | waiting for a connection under the caps, then TCP connect (10 s each) | `[egress] connect_timeout` | `connection-limit-reached`, `connection-timeout` | `connection_limit`, `timeout` |
//! | open connections to origins per node (1024) | `[egress] max_connections` | `connection-limit-reached` after the wait | `connection_limit` |
//! | connections one Worker uses at once, on a node (128) | `[egress] max_connections_per_worker` | `connection-limit-reached` after the wait | `connection_limit` |
//! | idle connection kept (10 s, 4 per origin) | `[egress] idle_timeout` | closed (also when the node needs the room, `hearth_egress_idle_closed_total`) | |
//! | request sent to response head (30 s) | `[egress] first_byte_timeout` | `HTTP-response-timeout` | `timeout` |
//! | the request's wall deadline | `[plans.*] request_wall` | `HTTP-response-timeout` | `timeout` |
//! | response body (32 MiB) | `[egress] max_response_size` | `HTTP-response-body-size` | `too_large` |
//!
//! Fetches per request are counted per invocation (each level of a flow has
//! its own count); calls to bindings are not counted, they are bounded by
//! the flow's depth. A fetch holds one of its invocation's subrequest slots
//! like a nested call ([`crate::outbound::outgoing`]), until its response body ends
//! or is dropped. A body that turns out larger than the cap while it
//! streams (no or a false `content-length`) fails the guest's read and is
//! counted as `too_large` besides the `ok` of its response head.
//!
//! **Memory.** What a fetch holds for the guest is bounded like a Worker's
//! outgoing bodies (`host.rs`): the request body the guest writes is
//! buffered in 4 KiB chunks, two at most; the response is read from the
//! connection into a buffer of at most [`MAX_READ_BUFFER`] bytes (which
//! also bounds the response head), and the guest reads it frame by frame
//! as it needs it, so a large or endless response costs a bounded buffer
//! and the response size cap, never the size of the body.
//!
//! Every fetch is a `subrequest` trace event for the flow's tail Workers
//! ([`crate::outbound::tail`]), with its URL and status or error.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body as _, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmtime_wasi_http::{Error, WasiBody};

use crate::body::Body;
use crate::limits::EGRESS_IDLE_PER_HOST;
use crate::outbound::connections::{CappedConnector, ConnHandle, Connections, NodeFull};

/// Most entries in one Worker's allow-list.
pub const MAX_ALLOWED_HOSTS: usize = 64;

/// The largest buffer the node reads a response into (the response head
/// must fit, and each body frame handed to the guest is at most this).
pub const MAX_READ_BUFFER: usize = 16 * 1024;

/// One allowed origin pattern: `scheme://host[:port]` (see the module
/// docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedOrigin {
    https: bool,
    host: HostPattern,
    port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    /// This host (lowercase, IPv6 without brackets).
    Exact(String),
    /// Any host ending in `.<suffix>`.
    Subdomains(String),
}

/// An allow-list entry that cannot be deployed, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("allowed host {entry:?}: {why}")]
pub struct AllowListError {
    entry: String,
    why: String,
}

impl AllowedOrigin {
    /// Parses one entry (`https://api.example.com`, `http://*.example.com:8080`).
    pub fn parse(entry: &str) -> Result<Self, AllowListError> {
        let err = |why: &str| AllowListError {
            entry: entry.to_string(),
            why: why.to_string(),
        };
        let Some((scheme, rest)) = entry.split_once("://") else {
            return Err(err(
                "expected scheme://host[:port], e.g. https://api.example.com",
            ));
        };
        let https = match scheme.to_ascii_lowercase().as_str() {
            "http" => false,
            "https" => true,
            _ => return Err(err("unknown scheme: expected http or https")),
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '?', '#']) {
            return Err(err(
                "has a path: an allowed host is scheme://host[:port] (every path is allowed)",
            ));
        }
        if rest.contains('@') {
            return Err(err(
                "has user info: an allowed host is scheme://host[:port]",
            ));
        }
        let (host, port) = split_host_port(rest).ok_or_else(|| err("invalid port"))?;
        let port = port.unwrap_or(if https { 443 } else { 80 });
        let host = host.to_ascii_lowercase();
        let host = host.trim_end_matches('.');
        let host = if host == "*" {
            return Err(err(
                "a bare * would allow every host: name the hosts, or *.example.com",
            ));
        } else if let Some(suffix) = host.strip_prefix("*.") {
            if !valid_dns_name(suffix) {
                return Err(err("*. must be followed by a DNS name (*.example.com)"));
            }
            HostPattern::Subdomains(suffix.to_string())
        } else if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            let ip: Ipv6Addr = v6.parse().map_err(|_| err("invalid IPv6 address"))?;
            HostPattern::Exact(ip.to_string())
        } else if host.parse::<Ipv4Addr>().is_ok() || valid_dns_name(host) {
            HostPattern::Exact(host.to_string())
        } else {
            return Err(err(
                "the host is not a DNS name or IP address (a wildcard is only *.name)",
            ));
        };
        Ok(AllowedOrigin { https, host, port })
    }

    /// Whether a request to `https`/`host`/`port` matches (`host` lowercase,
    /// IPv6 without brackets).
    fn matches(&self, https: bool, host: &str, port: u16) -> bool {
        self.https == https
            && self.port == port
            && match &self.host {
                HostPattern::Exact(h) => h == host,
                HostPattern::Subdomains(suffix) => host
                    .strip_suffix(suffix.as_str())
                    .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            }
    }
}

impl fmt::Display for AllowedOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.https { "https" } else { "http" };
        match &self.host {
            HostPattern::Exact(h) if h.contains(':') => write!(f, "{scheme}://[{h}]")?,
            HostPattern::Exact(h) => write!(f, "{scheme}://{h}")?,
            HostPattern::Subdomains(s) => write!(f, "{scheme}://*.{s}")?,
        }
        write!(f, ":{}", self.port)
    }
}

/// `host[:port]` → host and port (a bracketed IPv6 host keeps its
/// brackets); `None` if the port is not a number in 1..=65535.
fn split_host_port(s: &str) -> Option<(&str, Option<u16>)> {
    let colon = match s.rfind(':') {
        Some(i) if !s[i..].contains(']') => i,
        _ => return Some((s, None)),
    };
    let port: u16 = s[colon + 1..].parse().ok().filter(|p| *p != 0)?;
    Some((&s[..colon], Some(port)))
}

/// Whether `s` is a DNS name: dot-separated labels of 1-63 letters, digits
/// and `-` (not at either end), 253 bytes at most.
fn valid_dns_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// A Worker's allow-list of origins, parsed (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList(Vec<AllowedOrigin>);

impl AllowList {
    /// Parses a deploy's `allowed_hosts`; the first bad entry is the error.
    pub fn parse(entries: &[String]) -> Result<Self, AllowListError> {
        if entries.len() > MAX_ALLOWED_HOSTS {
            return Err(AllowListError {
                entry: format!("{} entries", entries.len()),
                why: format!("at most {MAX_ALLOWED_HOSTS} allowed hosts"),
            });
        }
        entries
            .iter()
            .map(|e| AllowedOrigin::parse(e))
            .collect::<Result<_, _>>()
            .map(AllowList)
    }

    /// Whether `uri` (absolute, as a guest sends it) is an allowed origin.
    pub fn allows(&self, uri: &http::Uri) -> bool {
        let https = match uri.scheme_str() {
            Some(s) if s.eq_ignore_ascii_case("https") => true,
            Some(s) if s.eq_ignore_ascii_case("http") => false,
            _ => return false,
        };
        let Some(host) = uri.host() else {
            return false;
        };
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .trim_end_matches('.')
            .to_ascii_lowercase();
        let host = match host.parse::<Ipv6Addr>() {
            Ok(ip) => ip.to_string(),
            Err(_) => host,
        };
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        self.0.iter().any(|o| o.matches(https, &host, port))
    }

    /// Whether no origin is allowed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Why an address is refused as a destination (see the module docs), or
/// `None` if it is a public unicast address.
///
/// An IPv6 address that carries an IPv4 address the network routes to
/// (IPv4-mapped, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`, Teredo
/// `2001::/32`, whose server and client addresses are both checked) is
/// refused if that IPv4 address is.
pub fn forbidden_address(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => forbidden_v6(v6),
    }
}

fn forbidden_v6(v6: Ipv6Addr) -> Option<&'static str> {
    if let Some(v4) = v6.to_ipv4_mapped() {
        return forbidden_v4(v4);
    }
    let s = v6.segments();
    let o = v6.octets();
    let v4_at = |i: usize| Ipv4Addr::new(o[i], o[i + 1], o[i + 2], o[i + 3]);
    // NAT64 (64:ff9b::/96) embeds an IPv4 address in its last 32 bits.
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return forbidden_v4(v4_at(12));
    }
    // 6to4 (2002::/16): the IPv4 address follows the prefix.
    if s[0] == 0x2002 {
        return forbidden_v4(v4_at(2));
    }
    // Teredo (2001::/32): the server's IPv4 address, then the client's,
    // inverted, in the last 32 bits.
    if s[..2] == [0x2001, 0] {
        let client = Ipv4Addr::from(!u32::from(v4_at(12)));
        return forbidden_v4(v4_at(4)).or(forbidden_v4(client));
    }
    if v6.is_loopback() {
        Some("loopback")
    } else if v6.is_unspecified() {
        Some("unspecified")
    } else if v6 == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) {
        Some("cloud metadata")
    } else if s[0] & 0xfe00 == 0xfc00 {
        Some("private (unique local)")
    } else if s[..3] == [0x64, 0xff9b, 1] {
        // RFC 8215: NAT64 prefixes of a local network.
        Some("private (local-use NAT64)")
    } else if s[0] & 0xffc0 == 0xfec0 {
        // Deprecated, but still private wherever it is used.
        Some("private (site-local)")
    } else if s[0] & 0xffc0 == 0xfe80 {
        Some("link-local")
    } else if v6.is_multicast() {
        Some("multicast")
    } else if s[0] == 0 {
        // Other addresses in ::/16 (IPv4-compatible, reserved).
        Some("reserved")
    } else if s[..4] == [0x100, 0, 0, 0] {
        Some("reserved (discard-only)")
    } else if s[..2] == [0x2001, 0xdb8] {
        Some("reserved (documentation)")
    } else {
        None
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let o = ip.octets();
    if ip == Ipv4Addr::new(169, 254, 169, 254) {
        Some("cloud metadata")
    } else if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_private() {
        Some("private")
    } else if ip.is_link_local() {
        Some("link-local")
    } else if o[0] == 100 && o[1] & 0xc0 == 64 {
        Some("shared (CGNAT)")
    } else if o[0] == 0 {
        Some("unspecified")
    } else if o[..3] == [192, 0, 0] {
        // IETF protocol assignments (DS-Lite's B4/AFTR, NAT64 discovery).
        Some("reserved (protocol assignments)")
    } else if o[0] == 198 && o[1] & 0xfe == 18 {
        Some("reserved (benchmarking)")
    } else if ip.is_documentation() {
        Some("reserved (documentation)")
    } else if o[..3] == [192, 88, 99] {
        Some("reserved (6to4 relay anycast)")
    } else if ip.is_multicast() {
        Some("multicast")
    } else if ip.is_broadcast() || o[0] >= 240 {
        Some("reserved")
    } else {
        None
    }
}

/// A node's egress settings (`[egress]` in its config file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressConfig {
    /// Whether Workers may reach loopback, private, link-local and
    /// metadata addresses (default false; for tests and private origins).
    pub allow_private_addresses: bool,
    /// How long a fetch may wait for a connection under the caps, and then
    /// how long the TCP connect may take (each).
    pub connect_timeout: Duration,
    /// How long one DNS lookup may take (every name server and attempt).
    pub dns_timeout: Duration,
    /// The name servers to ask (UDP, then TCP if an answer is truncated);
    /// empty: those of `/etc/resolv.conf`. `/etc/hosts` is read first
    /// either way.
    pub dns_servers: Vec<SocketAddr>,
    /// Open connections to origins the node keeps at most, idle ones
    /// included (`outbound::connections`).
    pub max_connections: usize,
    /// Connections one Worker may use at once on the node (a fetch uses
    /// one from sending its request until its response body is done).
    pub max_connections_per_worker: usize,
    /// How long an idle connection stays open for reuse.
    pub idle_timeout: Duration,
    /// How long from sending a request until its response head arrives
    /// (connect and TLS included).
    pub first_byte_timeout: Duration,
    /// The largest response body a Worker may read from an origin.
    pub max_response_size: u64,
    /// Certificate authorities trusted besides the Mozilla roots of
    /// `webpki-roots` (DER), for origins signed by a private CA: an
    /// embedder's, or a test's own (`tests/it/egress.rs`). Empty by default.
    pub extra_roots: Vec<rustls::pki_types::CertificateDer<'static>>,
}

impl Default for EgressConfig {
    /// Private addresses refused, 10 s connect, 30 s first byte, 32 MiB
    /// responses, and the connection and DNS limits of [`crate::limits`]
    /// (1024 connections per node, 128 per Worker, 10 s idle, 5 s DNS)
    /// with the system's name servers.
    fn default() -> Self {
        EgressConfig {
            allow_private_addresses: false,
            connect_timeout: Duration::from_secs(10),
            dns_timeout: crate::limits::EGRESS_DNS_TIMEOUT,
            dns_servers: Vec::new(),
            max_connections: crate::limits::EGRESS_MAX_CONNECTIONS,
            max_connections_per_worker: crate::limits::EGRESS_MAX_CONNECTIONS_PER_WORKER,
            idle_timeout: crate::limits::EGRESS_IDLE_TIMEOUT,
            first_byte_timeout: Duration::from_secs(30),
            max_response_size: 32 << 20,
            extra_roots: Vec::new(),
        }
    }
}

/// How one fetch of an origin ended, as counted in
/// `hearth_subrequests_total{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubrequestOutcome {
    /// A response came (whatever its status).
    Ok,
    /// The origin is not on the Worker's allow-list.
    Denied,
    /// Every address of the host is private (or the IP literal is).
    PrivateAddress,
    /// A connect, first-byte or deadline timeout.
    Timeout,
    /// Over the plan's fetches per request.
    TooMany,
    /// The response body is over the size cap.
    TooLarge,
    /// No connection came free under the node's or the Worker's
    /// connection cap in time (`outbound::connections`).
    ConnectionLimit,
    /// Any other failure (DNS, refused connection, TLS, protocol).
    Error,
}

impl SubrequestOutcome {
    /// Every outcome, in the order of [`SubrequestCounts`].
    pub const ALL: [SubrequestOutcome; 8] = [
        SubrequestOutcome::Ok,
        SubrequestOutcome::Denied,
        SubrequestOutcome::PrivateAddress,
        SubrequestOutcome::Timeout,
        SubrequestOutcome::TooMany,
        SubrequestOutcome::TooLarge,
        SubrequestOutcome::ConnectionLimit,
        SubrequestOutcome::Error,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            SubrequestOutcome::Ok => "ok",
            SubrequestOutcome::Denied => "denied",
            SubrequestOutcome::PrivateAddress => "private_address",
            SubrequestOutcome::Timeout => "timeout",
            SubrequestOutcome::TooMany => "too_many",
            SubrequestOutcome::TooLarge => "too_large",
            SubrequestOutcome::ConnectionLimit => "connection_limit",
            SubrequestOutcome::Error => "error",
        }
    }
}

/// Live fetch counters by outcome, and the connection gauges: the node's
/// client counts into them, and the node's [`crate::stats::Stats`] holds
/// them and reads them.
#[derive(Debug, Default)]
pub(crate) struct SubrequestCounters {
    by_outcome: [AtomicU64; SubrequestOutcome::ALL.len()],
    /// Connections to origins open now (`outbound::connections`).
    pub(crate) open: AtomicU64,
    /// Idle connections closed to make room under the node's cap.
    pub(crate) idle_closed: AtomicU64,
}

impl SubrequestCounters {
    fn slot(&self, outcome: SubrequestOutcome) -> &AtomicU64 {
        let i = SubrequestOutcome::ALL
            .iter()
            .position(|o| *o == outcome)
            .unwrap_or(SubrequestOutcome::ALL.len() - 1);
        &self.by_outcome[i]
    }

    pub(crate) fn bump(&self, outcome: SubrequestOutcome) {
        self.slot(outcome).fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> SubrequestCounts {
        let g = |o: SubrequestOutcome| self.slot(o).load(Ordering::Relaxed);
        SubrequestCounts {
            ok: g(SubrequestOutcome::Ok),
            denied: g(SubrequestOutcome::Denied),
            private_address: g(SubrequestOutcome::PrivateAddress),
            timeout: g(SubrequestOutcome::Timeout),
            too_many: g(SubrequestOutcome::TooMany),
            too_large: g(SubrequestOutcome::TooLarge),
            connection_limit: g(SubrequestOutcome::ConnectionLimit),
            error: g(SubrequestOutcome::Error),
            open_connections: self.open.load(Ordering::Relaxed),
            idle_closed: self.idle_closed.load(Ordering::Relaxed),
        }
    }
}

/// Fetches of origins by outcome (see [`SubrequestOutcome`]), and the
/// node's connections to origins.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SubrequestCounts {
    /// A response came.
    pub ok: u64,
    /// Not on the allow-list.
    pub denied: u64,
    /// A private address refused.
    pub private_address: u64,
    /// Timed out.
    pub timeout: u64,
    /// Over the fetches per request.
    pub too_many: u64,
    /// Response body over the cap.
    pub too_large: u64,
    /// No connection under the caps in time.
    pub connection_limit: u64,
    /// Any other failure.
    pub error: u64,
    /// Connections to origins open now (a gauge, not an outcome).
    pub open_connections: u64,
    /// Idle connections closed to make room under the node's cap.
    pub idle_closed: u64,
}

impl SubrequestCounts {
    /// The count of `outcome`.
    pub fn get(&self, outcome: SubrequestOutcome) -> u64 {
        match outcome {
            SubrequestOutcome::Ok => self.ok,
            SubrequestOutcome::Denied => self.denied,
            SubrequestOutcome::PrivateAddress => self.private_address,
            SubrequestOutcome::Timeout => self.timeout,
            SubrequestOutcome::TooMany => self.too_many,
            SubrequestOutcome::TooLarge => self.too_large,
            SubrequestOutcome::ConnectionLimit => self.connection_limit,
            SubrequestOutcome::Error => self.error,
        }
    }
}

/// Why the resolver gave no address to connect to.
#[derive(Debug, thiserror::Error)]
enum ResolveError {
    #[error("DNS lookup of {host} failed: {error}")]
    Lookup { host: String, error: String },
    #[error("DNS lookup of {host} timed out")]
    Timeout { host: String },
    #[error("{host} resolves only to refused addresses ({addr}: {why})")]
    Prohibited {
        host: String,
        addr: IpAddr,
        why: &'static str,
    },
}

/// The connector's DNS resolver: hickory's async stub resolver (see the
/// module docs), minus refused addresses.
#[derive(Clone)]
struct Resolver {
    dns: Arc<hickory_resolver::TokioResolver>,
    allow_private: bool,
    timeout: Duration,
}

impl Resolver {
    /// A resolver asking `cfg.dns_servers`, or the system's name servers
    /// if there are none; a system configuration that cannot be read
    /// leaves only `/etc/hosts` (every other lookup fails, and says why
    /// in the log once).
    fn new(cfg: &EgressConfig) -> Self {
        use hickory_resolver::config::{
            ConnectionConfig, NameServerConfig, ResolveHosts, ResolverConfig,
        };
        use hickory_resolver::net::runtime::TokioRuntimeProvider;
        let provider = TokioRuntimeProvider::default();
        let mut builder = if cfg.dns_servers.is_empty() {
            hickory_resolver::TokioResolver::builder_tokio().unwrap_or_else(|e| {
                tracing::warn!(error = %e,
                    "egress: the system's DNS configuration cannot be read; \
                     only /etc/hosts names resolve (set [egress] dns_servers)");
                hickory_resolver::TokioResolver::builder_with_config(
                    ResolverConfig::from_parts(None, Vec::new(), Vec::new()),
                    provider,
                )
            })
        } else {
            let servers = cfg
                .dns_servers
                .iter()
                .map(|a| {
                    let mut udp = ConnectionConfig::udp();
                    udp.port = a.port();
                    let mut tcp = ConnectionConfig::tcp();
                    tcp.port = a.port();
                    NameServerConfig::new(a.ip(), true, vec![udp, tcp])
                })
                .collect();
            hickory_resolver::TokioResolver::builder_with_config(
                ResolverConfig::from_parts(None, Vec::new(), servers),
                provider,
            )
        };
        let opts = builder.options_mut();
        // Each try at most half the budget, so a lost answer is asked
        // again (hickory's `attempts` are retries); the lookup as a whole
        // is bounded by `timeout` below whatever the name servers do.
        opts.timeout = cfg.dns_timeout / 2;
        opts.attempts = 2;
        opts.use_hosts_file = ResolveHosts::Always;
        let dns = builder.build().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "egress: DNS resolver not built; no name resolves");
            hickory_resolver::TokioResolver::builder_with_config(
                ResolverConfig::from_parts(None, Vec::new(), Vec::new()),
                TokioRuntimeProvider::default(),
            )
            .build()
            .expect("a resolver with no name servers needs nothing to build")
        });
        Resolver {
            dns: Arc::new(dns),
            allow_private: cfg.allow_private_addresses,
            timeout: cfg.dns_timeout,
        }
    }
}

impl tower_service::Service<Name> for Resolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = ResolveError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, ResolveError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), ResolveError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let (dns, allow_private, timeout) = (self.dns.clone(), self.allow_private, self.timeout);
        Box::pin(async move {
            let host = name.as_str().to_string();
            // `localhost` and the names under it are this machine, never
            // a question for DNS. Otherwise dropping the lookup at the
            // timeout drops its sockets and queries: nothing of it
            // outlives this future.
            let found: Vec<IpAddr> = if loopback_name(&host) {
                vec![Ipv4Addr::LOCALHOST.into(), Ipv6Addr::LOCALHOST.into()]
            } else {
                tokio::time::timeout(timeout, dns.lookup_ip(host.as_str()))
                    .await
                    .map_err(|_| ResolveError::Timeout { host: host.clone() })?
                    .map_err(|e| match e {
                        hickory_resolver::net::NetError::Timeout => {
                            ResolveError::Timeout { host: host.clone() }
                        }
                        e => ResolveError::Lookup {
                            host: host.clone(),
                            error: e.to_string(),
                        },
                    })?
                    .iter()
                    .collect()
            };
            let mut refused = None;
            let ok: Vec<SocketAddr> = found
                .into_iter()
                .filter(|ip| match forbidden_address(*ip) {
                    Some(why) if !allow_private => {
                        refused = Some((*ip, why));
                        false
                    }
                    _ => true,
                })
                .map(|ip| SocketAddr::new(ip, 0))
                .collect();
            match (ok.is_empty(), refused) {
                (true, Some((addr, why))) => Err(ResolveError::Prohibited { host, addr, why }),
                (true, None) => Err(ResolveError::Lookup {
                    host,
                    error: "no addresses".into(),
                }),
                (false, _) => Ok(ok.into_iter()),
            }
        })
    }
}

/// Whether `host` is `localhost` or a name under it, which the resolver
/// answers itself with the loopback addresses (RFC 6761 §6.3: such names
/// never go to DNS, and always mean this machine), whatever the system's
/// resolver would say. Loopback is then refused like any private address
/// unless the node allows those.
pub fn loopback_name(host: &str) -> bool {
    let host = host.trim_end_matches('.');
    let tail = host.len().saturating_sub("localhost".len());
    host.get(tail..)
        .is_some_and(|t| t.eq_ignore_ascii_case("localhost"))
        && (tail == 0 || host.as_bytes().get(tail - 1) == Some(&b'.'))
}

type Connector = CappedConnector<hyper_rustls::HttpsConnector<HttpConnector<Resolver>>>;

/// A fetch the node did not complete, with the code the guest reads.
pub(crate) struct Refused {
    pub(crate) outcome: SubrequestOutcome,
    pub(crate) error: Error,
}

impl Refused {
    pub(crate) fn new(outcome: SubrequestOutcome, error: Error) -> Self {
        Refused { outcome, error }
    }
}

/// The TLS settings a node uses to reach servers on the Internet (origins,
/// and an `https://` telemetry collector): rustls on `ring`, the Mozilla
/// roots of `webpki-roots`, plus `extra_roots` (CAs of private servers).
pub fn tls_client_config(
    extra_roots: &[rustls::pki_types::CertificateDer<'static>],
) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let (added, refused) = roots.add_parsable_certificates(extra_roots.iter().cloned());
    if refused > 0 {
        tracing::warn!(
            added,
            refused,
            "extra roots that are not CA certificates were left out"
        );
    }
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("the ring provider supports TLS 1.2 and 1.3")
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// The node's client for origins: one connection pool for every Worker,
/// within the node's connection cap.
pub(crate) struct Egress {
    client: Client<Connector, Body>,
    cfg: EgressConfig,
    /// Where fetches are counted by outcome (the node's stats hold it).
    counts: Arc<SubrequestCounters>,
    /// Each Worker's permits for connections in use, by script ID, while
    /// a loaded Worker holds them.
    workers: Mutex<HashMap<Arc<str>, Weak<Semaphore>>>,
}

impl Egress {
    /// A client configured by `cfg` (no connection is made yet), counting
    /// into `counts`.
    pub(crate) fn new(cfg: EgressConfig, counts: Arc<SubrequestCounters>) -> Self {
        let mut http = HttpConnector::new_with_resolver(Resolver::new(&cfg));
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(cfg.connect_timeout));
        let tls = tls_client_config(&cfg.extra_roots);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let conns = Connections::new(cfg.max_connections, cfg.connect_timeout, counts.clone());
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(cfg.idle_timeout)
            .pool_max_idle_per_host(EGRESS_IDLE_PER_HOST)
            .http1_max_buf_size(MAX_READ_BUFFER)
            .build(CappedConnector::new(https, conns));
        Egress {
            client,
            cfg,
            counts,
            workers: Mutex::new(HashMap::new()),
        }
    }

    /// The client as the Worker `script_id` uses it: with that Worker's
    /// cap on connections in use, shared by everything of the Worker
    /// loaded on this node (its versions, its instances).
    pub(crate) fn for_worker(self: &Arc<Self>, script_id: &Arc<str>) -> WorkerEgress {
        let mut workers = self.workers.lock().unwrap_or_else(|p| p.into_inner());
        let slots = match workers.get(script_id).and_then(Weak::upgrade) {
            Some(s) => s,
            None => {
                // Forget Workers no longer loaded before adding one.
                workers.retain(|_, w| w.strong_count() > 0);
                let s = Arc::new(Semaphore::new(self.cfg.max_connections_per_worker.max(1)));
                workers.insert(script_id.clone(), Arc::downgrade(&s));
                s
            }
        };
        WorkerEgress {
            node: self.clone(),
            slots,
        }
    }

    /// Sends `req` (an allowed origin's absolute URL) holding one of
    /// `slots` (its Worker's connections in use) until the response body
    /// is done, and returns its response head by `deadline`, with the body
    /// capped; the SSRF checks of the module docs apply.
    async fn send(
        &self,
        slots: &Arc<Semaphore>,
        req: http::Request<Body>,
        first_byte: Option<Duration>,
        deadline: Instant,
    ) -> Result<http::Response<WasiBody>, Refused> {
        if !self.cfg.allow_private_addresses
            && let Some(host) = req.uri().host()
            && let Ok(ip) = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<IpAddr>()
            && let Some(why) = forbidden_address(ip)
        {
            tracing::debug!(%ip, why, "fetch refused: a private address");
            return Err(Refused::new(
                SubrequestOutcome::PrivateAddress,
                Error::DestinationIpProhibited,
            ));
        }
        let now = Instant::now();
        let first_byte = first_byte.map_or(self.cfg.first_byte_timeout, |d| {
            d.min(self.cfg.first_byte_timeout)
        });
        let by = deadline.min(now + first_byte);
        let slot = self.worker_slot(slots, by).await?;
        let response = match tokio::time::timeout_at(by.into(), self.client.request(req)).await {
            Err(_) => {
                return Err(Refused::new(
                    SubrequestOutcome::Timeout,
                    Error::HttpResponseTimeout,
                ));
            }
            Ok(Err(e)) => return Err(classify(&e)),
            Ok(Ok(r)) => r,
        };
        let conn = response.extensions().get::<ConnHandle>().cloned();
        let cap = self.cfg.max_response_size;
        if let Some(len) = response.body().size_hint().exact()
            && len > cap
        {
            return Err(Refused::new(
                SubrequestOutcome::TooLarge,
                Error::HttpResponseBodySize(Some(len)),
            ));
        }
        Ok(response.map(|incoming| {
            Capped {
                inner: incoming,
                left: cap,
                cap,
                counts: self.counts.clone(),
                held: InUse {
                    conn,
                    _slot: Some(slot),
                },
            }
            .boxed_unsync()
        }))
    }

    /// One of the Worker's `slots`, waiting for it at most the connect
    /// timeout and never past `by`.
    async fn worker_slot(
        &self,
        slots: &Arc<Semaphore>,
        by: Instant,
    ) -> Result<OwnedSemaphorePermit, Refused> {
        if let Ok(p) = slots.clone().try_acquire_owned() {
            return Ok(p);
        }
        let wait_until = by.min(Instant::now() + self.cfg.connect_timeout);
        match tokio::time::timeout_at(wait_until.into(), slots.clone().acquire_owned()).await {
            Ok(Ok(p)) => Ok(p),
            Ok(Err(_)) | Err(_) if wait_until < by => {
                tracing::debug!(
                    cap = self.cfg.max_connections_per_worker,
                    "fetch refused: the Worker uses all its connections to origins"
                );
                Err(Refused::new(
                    SubrequestOutcome::ConnectionLimit,
                    Error::ConnectionLimitReached,
                ))
            }
            Ok(Err(_)) | Err(_) => Err(Refused::new(
                SubrequestOutcome::Timeout,
                Error::HttpResponseTimeout,
            )),
        }
    }
}

/// The node's client as one Worker uses it ([`Egress::for_worker`]): its
/// fetches count against the Worker's cap on connections in use.
#[derive(Clone)]
pub(crate) struct WorkerEgress {
    node: Arc<Egress>,
    slots: Arc<Semaphore>,
}

impl WorkerEgress {
    /// Sends `req` as [`Egress`] does, holding one of the Worker's
    /// connection slots until the response body is done.
    pub(crate) async fn send(
        &self,
        req: http::Request<Body>,
        first_byte: Option<Duration>,
        deadline: Instant,
    ) -> Result<http::Response<WasiBody>, Refused> {
        self.node.send(&self.slots, req, first_byte, deadline).await
    }
}

/// What a response body holds while the guest may still read it: its
/// Worker's connection slot, and the connection, marked idle when the body
/// is done (ended, failed or dropped).
struct InUse {
    conn: Option<ConnHandle>,
    _slot: Option<OwnedSemaphorePermit>,
}

impl InUse {
    /// The body is done: the connection is idle, the slot free.
    fn release(&mut self) {
        if let Some(c) = self.conn.take() {
            c.0.idle();
        }
        self._slot = None;
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        self.release();
    }
}

/// A response body that fails once more than `cap` bytes have come.
struct Capped {
    inner: hyper::body::Incoming,
    left: u64,
    cap: u64,
    /// Where the `too_large` outcome is counted.
    counts: Arc<SubrequestCounters>,
    /// Released when the body ends (or fails, or is dropped).
    held: InUse,
}

impl http_body::Body for Capped {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let len = data.len() as u64;
                    if len > this.left {
                        this.counts.bump(SubrequestOutcome::TooLarge);
                        this.held.release();
                        return Poll::Ready(Some(Err(Error::HttpResponseBodySize(Some(this.cap)))));
                    }
                    this.left -= len;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.held.release();
                Poll::Ready(Some(Err(Error::Hyper(e))))
            }
            Poll::Ready(None) => {
                this.held.release();
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The guest's error code for a failed request of the client, and its
/// outcome.
fn classify(e: &hyper_util::client::legacy::Error) -> Refused {
    use std::error::Error as _;
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(full) = s.downcast_ref::<NodeFull>() {
            tracing::debug!(error = %full, "fetch refused: no connection under the node's cap");
            return Refused::new(
                SubrequestOutcome::ConnectionLimit,
                Error::ConnectionLimitReached,
            );
        }
        if let Some(r) = s.downcast_ref::<ResolveError>() {
            tracing::debug!(error = %r, "fetch failed");
            return match r {
                ResolveError::Prohibited { .. } => Refused::new(
                    SubrequestOutcome::PrivateAddress,
                    Error::DestinationIpProhibited,
                ),
                ResolveError::Timeout { .. } => {
                    Refused::new(SubrequestOutcome::Timeout, Error::DnsTimeout)
                }
                ResolveError::Lookup { .. } => Refused::new(
                    SubrequestOutcome::Error,
                    Error::DnsError {
                        rcode: Some(r.to_string()),
                        info_code: None,
                    },
                ),
            };
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            if let Some(tls) = io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                return tls_refused(tls);
            }
            use std::io::ErrorKind as K;
            match io.kind() {
                K::TimedOut => {
                    return Refused::new(SubrequestOutcome::Timeout, Error::ConnectionTimeout);
                }
                K::ConnectionRefused => {
                    return Refused::new(SubrequestOutcome::Error, Error::ConnectionRefused);
                }
                _ => {}
            }
        }
        if let Some(tls) = s.downcast_ref::<rustls::Error>() {
            return tls_refused(tls);
        }
        source = s.source();
    }
    tracing::debug!(error = %e, source = ?e.source(), "fetch failed");
    if e.is_connect() {
        Refused::new(SubrequestOutcome::Error, Error::DestinationUnavailable)
    } else {
        Refused::new(SubrequestOutcome::Error, Error::HttpProtocolError)
    }
}

fn tls_refused(e: &rustls::Error) -> Refused {
    tracing::debug!(error = %e, "fetch failed: TLS");
    let code = match e {
        rustls::Error::InvalidCertificate(_) => Error::TlsCertificateError,
        rustls::Error::AlertReceived(a) => Error::TlsAlertReceived {
            alert_id: None,
            alert_message: Some(format!("{a:?}")),
        },
        _ => Error::TlsProtocolError,
    };
    Refused::new(SubrequestOutcome::Error, code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> AllowList {
        AllowList::parse(&entries.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .expect("valid allow-list")
    }

    fn uri(s: &str) -> http::Uri {
        s.parse().expect("uri")
    }

    #[test]
    fn origins_match_scheme_host_and_port() {
        let l = list(&["https://api.example.com", "http://*.example.com:8080"]);
        assert!(l.allows(&uri("https://api.example.com/v1?x=1")));
        assert!(l.allows(&uri("https://API.example.com:443/")));
        assert!(!l.allows(&uri("http://api.example.com/")), "scheme");
        assert!(!l.allows(&uri("https://api.example.com:8443/")), "port");
        assert!(!l.allows(&uri("https://other.example.com/")));
        assert!(l.allows(&uri("http://a.example.com:8080/")));
        assert!(l.allows(&uri("http://a.b.example.com:8080/")));
        assert!(!l.allows(&uri("http://example.com:8080/")), "not the apex");
        assert!(!l.allows(&uri("http://badexample.com:8080/")));
        assert!(!l.allows(&uri("http://a.example.com/")), "default port 80");
        let ips = list(&["http://127.0.0.1:9000", "http://[::1]:9000"]);
        assert!(ips.allows(&uri("http://127.0.0.1:9000/")));
        assert!(ips.allows(&uri("http://[0:0::1]:9000/")));
        assert!(!AllowList::default().allows(&uri("https://api.example.com/")));
    }

    #[test]
    fn bad_entries_are_refused_with_the_reason() {
        let why = |e: &str| AllowedOrigin::parse(e).expect_err("refused").to_string();
        assert!(why("*").contains("scheme://host"), "{}", why("*"));
        assert!(why("https://*").contains("bare *"));
        assert!(why("https://api.example.com/v1").contains("path"));
        assert!(why("ftp://example.com").contains("unknown scheme"));
        assert!(why("https://example.com:99999").contains("port"));
        assert!(why("https://a.*.example.com").contains("not a DNS name"));
        assert!(why("https://user@example.com").contains("user info"));
        assert!(AllowedOrigin::parse("https://api.example.com/").is_ok());
        let long: Vec<String> = (0..=MAX_ALLOWED_HOSTS)
            .map(|i| format!("https://h{i}.example.com"))
            .collect();
        assert!(AllowList::parse(&long).is_err());
    }

    #[test]
    fn localhost_names_are_loopback_without_dns() {
        for name in ["localhost", "LOCALHOST.", "loop.localhost", "a.b.Localhost"] {
            assert!(loopback_name(name), "{name}");
        }
        for name in ["notlocalhost", "localhost.example.com", "local", ""] {
            assert!(!loopback_name(name), "{name}");
        }
    }

    #[test]
    fn private_and_metadata_addresses_are_refused() {
        for a in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "169.254.1.1",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fd00:ec2::254",
            "fc00::1",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "64:ff9b::a00:1",
            "192.0.0.1",
            "192.0.0.170",
            "198.18.0.1",
            "198.19.255.255",
            "192.0.2.1",
            "198.51.100.1",
            "203.0.113.1",
            "192.88.99.1",
            "64:ff9b:1::1",
            "64:ff9b:1:ffff::808:808",
            "fec0::1",
            "feff::1",
            "100::1",
            "2001:db8::1",
            // 6to4 of 127.0.0.1, 10.0.0.1, 192.168.1.1, 169.254.169.254.
            "2002:7f00:1::1",
            "2002:a00:1::",
            "2002:c0a8:101:1::1",
            "2002:a9fe:a9fe::1",
            // Teredo: a private server (10.0.0.1), a loopback client
            // (127.0.0.1 inverted is 80ff:fffe), a metadata client.
            "2001:0:a00:1::808:808",
            "2001:0:808:808:0:0:80ff:fffe",
            "2001:0:808:808:8000:ffff:5601:5601",
        ] {
            let ip: IpAddr = a.parse().expect("ip");
            assert!(forbidden_address(ip).is_some(), "{a} must be refused");
        }
        for a in [
            "93.184.216.34",
            "8.8.8.8",
            "2606:4700::1111",
            "100.128.0.1",
            "192.0.1.1",
            "198.20.0.1",
            "198.17.255.255",
            "64:ff9b:2::1",
            "2002:808:808::1",
            "2001:0:808:808:0:0:f7f7:f7f7",
            "2001:db9::1",
        ] {
            let ip: IpAddr = a.parse().expect("ip");
            assert_eq!(forbidden_address(ip), None, "{a} is public");
        }
    }
}
