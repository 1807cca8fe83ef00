//! The workload models: who is popular, how big, how long, and when
//! requests arrive.
//!
//! * **Popularity** — [`Zipf`]: Worker of rank `k` (1-based) is picked with
//!   probability `k^-s / H(n, s)`; the sampler is a precomputed CDF and a
//!   binary search, exact up to `f64` rounding.
//! * **Memory size** — log-normal per Worker (`rand_distr::LogNormal` with
//!   μ = ln `size_median_mb`, σ = `size_sigma`; σ = 0 is exactly the
//!   median), clamped to 1 MiB ..= 128 MiB (the per-instance
//!   memory limit). The defaults (8 MiB, 0.8) put 90% of Workers between
//!   about 2 and 30 MiB with a mean of about 11 MiB: "a few MB to tens of MB"
//!   of compiled code plus instance memory. Size is independent of
//!   popularity.
//! * **Request duration** — each Worker has a mean duration, log-normal
//!   (median `duration_ms`, shape `duration_sigma`); each request's duration
//!   is exponential around its Worker's mean (`rand_distr::Exp1` scaled by
//!   the mean), at least 1 ms. Durations only matter for in-flight
//!   accounting (the home's admission control).
//! * **Arrivals** — `Arrivals`: a Poisson process at a fixed rate over
//!   virtual time (gaps from `rand_distr::Exp`, λ = rate / 1000 per ms)
//!   with the Worker drawn from [`Zipf`] (the independent reference model),
//!   or the invocations of a [`Trace`](crate::trace::Trace). Each request is
//!   received by a server chosen by the load balancer (uniform random, or
//!   round-robin for hand-checkable scenarios).
//!
//! Every draw comes from a generator seeded from the run's seed, and both
//! modes of a run consume identical arrival streams (common random numbers),
//! so sharded and unsharded see exactly the same requests in the same
//! order at the same servers. The distributions are built once per run from
//! the flags, which `run` has already checked, so building one cannot fail
//! on a flag it let through (it would still be an `InvalidArgument`, not a
//! panic).

use rand::rngs::StdRng;
use rand::{Rng, RngExt, SeedableRng};
use rand_distr::{Distribution, Exp, Exp1, LogNormal};

use crate::SimulateError;
use crate::trace::TraceEvent;

/// Smallest Worker memory size drawn, in bytes (1 MiB).
pub const MIN_WORKER_BYTES: u64 = 1 << 20;
/// Largest Worker memory size drawn, in bytes (128 MiB: the per-instance
/// memory limit of the runtime).
pub const MAX_WORKER_BYTES: u64 = 128 << 20;
/// Longest mean request duration drawn, in ms (5 minutes: the CPU limit).
const MAX_DURATION_MS: f64 = 300_000.0;

/// Distinct seeds for the independent random streams of a run.
pub(crate) mod stream {
    /// Worker sizes and mean durations.
    pub(crate) const WORKERS: u64 = 0x776f_726b_6572_7300;
    /// Arrival times and popularity draws.
    pub(crate) const ARRIVALS: u64 = 0x6172_7269_7661_6c00;
    /// Receiving server and request duration.
    pub(crate) const REQUESTS: u64 = 0x7265_7175_6573_7400;
}

/// A generator for stream `stream` of the run seeded with `seed`.
pub(crate) fn rng_for(seed: u64, stream: u64) -> StdRng {
    StdRng::seed_from_u64(seed ^ stream)
}

/// Zipf (power-law) popularity over ranks `0..n` (rank 0 is the most
/// popular): `P(k) ∝ (k + 1)^-s`.
///
/// Not `rand_distr::Zipf` (a rejection sampler with no `pmf`): this is an
/// exact precomputed CDF, whose [`pmf`](Self::pmf) the tests check against.
#[derive(Debug, Clone)]
pub struct Zipf {
    /// `cdf[k]` = P(rank ≤ k); the last entry is exactly 1.
    cdf: Vec<f64>,
}

impl Zipf {
    /// The distribution over `n ≥ 1` ranks with exponent `s ≥ 0` (`s = 0`
    /// is uniform).
    pub fn new(n: usize, s: f64) -> Self {
        let mut cdf = Vec::with_capacity(n);
        let mut total = 0.0f64;
        for k in 1..=n {
            total += (k as f64).powf(-s);
            cdf.push(total);
        }
        for c in &mut cdf {
            *c /= total;
        }
        if let Some(last) = cdf.last_mut() {
            *last = 1.0;
        }
        Zipf { cdf }
    }

    /// Number of ranks.
    pub fn len(&self) -> usize {
        self.cdf.len()
    }

    /// Whether there are no ranks.
    pub fn is_empty(&self) -> bool {
        self.cdf.is_empty()
    }

    /// Probability of rank `k` (0-based); 0 outside the range.
    pub fn pmf(&self, k: usize) -> f64 {
        match k {
            0 => self.cdf.first().copied().unwrap_or(0.0),
            _ if k < self.cdf.len() => self.cdf[k] - self.cdf[k - 1],
            _ => 0.0,
        }
    }

    /// Draws a rank.
    pub fn sample(&self, rng: &mut impl Rng) -> u32 {
        let u: f64 = rng.random();
        let k = self.cdf.partition_point(|&c| c <= u);
        k.min(self.cdf.len().saturating_sub(1)) as u32
    }
}

/// A log-normal with a given median and shape (σ of the logarithm):
/// `LogNormal` with μ = ln(median), or exactly the median, without a draw,
/// when σ = 0 (`exp(ln m)` need not round back to `m`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum MedianLogNormal {
    /// σ = 0.
    Exactly(f64),
    /// σ > 0.
    Spread(LogNormal<f64>),
}

impl MedianLogNormal {
    /// The distribution with `median` (positive, finite) and `sigma`
    /// (finite, ≥ 0: `rand_distr` would take a negative σ as |σ|); `flags`
    /// names the two flags in the error.
    pub(crate) fn new(median: f64, sigma: f64, flags: &str) -> Result<Self, SimulateError> {
        if !(median.is_finite() && median > 0.0 && sigma.is_finite() && sigma >= 0.0) {
            return Err(SimulateError::InvalidArgument(format!(
                "{flags}: the median must be positive and σ at least 0, got {median} and {sigma}"
            )));
        }
        if sigma == 0.0 {
            return Ok(MedianLogNormal::Exactly(median));
        }
        LogNormal::new(median.ln(), sigma)
            .map(MedianLogNormal::Spread)
            .map_err(|e| SimulateError::InvalidArgument(format!("{flags}: {e}")))
    }
}

impl Distribution<f64> for MedianLogNormal {
    fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> f64 {
        match self {
            MedianLogNormal::Exactly(median) => *median,
            MedianLogNormal::Spread(d) => d.sample(rng),
        }
    }
}

/// The size and duration models of the Workers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WorkerModel {
    /// Memory size, MiB (before the clamp).
    pub(crate) size_mb: MedianLogNormal,
    /// Mean request duration, ms (before the clamp).
    pub(crate) duration_ms: MedianLogNormal,
}

impl WorkerModel {
    /// Draws `(bytes, mean duration in ms)` for `n` Workers.
    pub(crate) fn draw(&self, n: usize, seed: u64) -> (Vec<u64>, Vec<f32>) {
        let mut rng = rng_for(seed, stream::WORKERS);
        let mut sizes = Vec::with_capacity(n);
        let mut durations = Vec::with_capacity(n);
        for _ in 0..n {
            let mb = self.size_mb.sample(&mut rng);
            let bytes = (mb * (1u64 << 20) as f64).round();
            sizes.push((bytes as u64).clamp(MIN_WORKER_BYTES, MAX_WORKER_BYTES));
            let ms = self.duration_ms.sample(&mut rng);
            durations.push(ms.clamp(1.0, MAX_DURATION_MS) as f32);
        }
        (sizes, durations)
    }
}

/// The gaps between Poisson arrivals at `rate` per second, in ms:
/// exponential with λ = `rate` / 1000 per ms. `rate` must be positive and
/// finite.
pub(crate) fn arrival_gaps(rate: f64) -> Result<Exp<f64>, SimulateError> {
    if !(rate.is_finite() && rate > 0.0) {
        return Err(SimulateError::InvalidArgument(format!(
            "--rate must be positive, got {rate}"
        )));
    }
    Exp::new(rate / 1000.0).map_err(|e| SimulateError::InvalidArgument(format!("--rate: {e}")))
}

/// How the load balancer in front of the servers picks the receiving one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Balancer {
    /// Uniformly random, independently per request (what a data center's
    /// ECMP / L4 balancing amounts to).
    #[default]
    Random,
    /// Request `i` (0-based) goes to server `i mod servers`: deterministic,
    /// for scenarios checked by hand.
    RoundRobin,
}

/// One request as the data center receives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Arrival, virtual ms.
    pub t_ms: u64,
    /// Worker index.
    pub worker: u32,
    /// Receiving server index.
    pub server: u32,
    /// How long the request runs once its Worker is ready, ms.
    pub duration_ms: u64,
}

/// Where arrivals come from.
enum Source<'a> {
    Poisson {
        zipf: &'a Zipf,
        /// Current time, ms (kept as a float so gaps below 1 ms add up).
        t: f64,
        /// Gaps between arrivals, ms.
        gap_ms: Exp<f64>,
        left: u64,
    },
    Trace(std::slice::Iter<'a, TraceEvent>),
}

/// The request stream of one run: arrival time and Worker from the
/// [`Source`], receiving server and duration from a second generator.
pub(crate) struct Arrivals<'a> {
    source: Source<'a>,
    /// Arrival gaps and popularity draws (unused for a trace).
    arrival_rng: StdRng,
    /// Receiving server and duration.
    rng: StdRng,
    balancer: Balancer,
    servers: u32,
    next_index: u64,
    mean_duration_ms: &'a [f32],
}

impl<'a> Arrivals<'a> {
    /// `count` Poisson arrivals with gaps (ms) from `gap_ms` (see
    /// [`arrival_gaps`]), Workers from `zipf`.
    pub(crate) fn poisson(
        zipf: &'a Zipf,
        gap_ms: Exp<f64>,
        count: u64,
        seed: u64,
        balancer: Balancer,
        servers: u32,
        mean_duration_ms: &'a [f32],
    ) -> Self {
        Arrivals {
            source: Source::Poisson {
                zipf,
                t: 0.0,
                gap_ms,
                left: count,
            },
            arrival_rng: rng_for(seed, stream::ARRIVALS),
            rng: rng_for(seed, stream::REQUESTS),
            balancer,
            servers,
            next_index: 0,
            mean_duration_ms,
        }
    }

    /// The invocations in `events`, in order.
    pub(crate) fn trace(
        events: &'a [TraceEvent],
        seed: u64,
        balancer: Balancer,
        servers: u32,
        mean_duration_ms: &'a [f32],
    ) -> Self {
        Arrivals {
            source: Source::Trace(events.iter()),
            arrival_rng: rng_for(seed, stream::ARRIVALS),
            rng: rng_for(seed, stream::REQUESTS),
            balancer,
            servers,
            next_index: 0,
            mean_duration_ms,
        }
    }
}

impl Iterator for Arrivals<'_> {
    type Item = Request;

    fn next(&mut self) -> Option<Request> {
        let (t_ms, worker) = match &mut self.source {
            Source::Poisson {
                zipf,
                t,
                gap_ms,
                left,
            } => {
                let rng = &mut self.arrival_rng;
                if *left == 0 {
                    return None;
                }
                *left -= 1;
                *t += gap_ms.sample(rng);
                (*t as u64, zipf.sample(rng))
            }
            Source::Trace(events) => {
                let e = events.next()?;
                (e.t_ms, e.worker)
            }
        };
        let server = match self.balancer {
            Balancer::Random => self.rng.random_range(0..self.servers),
            Balancer::RoundRobin => (self.next_index % u64::from(self.servers)) as u32,
        };
        self.next_index += 1;
        let mean = self
            .mean_duration_ms
            .get(worker as usize)
            .copied()
            .unwrap_or(1.0);
        // Exponential with this mean: what `Exp::new(1 / mean)` draws,
        // without a fallible constructor per request.
        let exp1: f64 = self.rng.sample(Exp1);
        let duration_ms = (f64::from(mean) * exp1).round().max(1.0) as u64;
        Some(Request {
            t_ms,
            worker,
            server,
            duration_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_pmf_matches_the_power_law() {
        let z = Zipf::new(4, 1.0);
        let h = 1.0 + 0.5 + 1.0 / 3.0 + 0.25;
        for k in 0..4 {
            assert!((z.pmf(k) - 1.0 / ((k + 1) as f64 * h)).abs() < 1e-12);
        }
        assert_eq!(z.pmf(4), 0.0);
    }

    #[test]
    fn zipf_samples_follow_the_pmf() {
        let z = Zipf::new(10, 1.2);
        let mut rng = StdRng::seed_from_u64(7);
        let mut counts = [0u32; 10];
        let n = 200_000;
        for _ in 0..n {
            counts[z.sample(&mut rng) as usize] += 1;
        }
        for (k, &c) in counts.iter().enumerate() {
            let expect = z.pmf(k) * n as f64;
            assert!(
                (f64::from(c) - expect).abs() < 5.0 * expect.sqrt() + 5.0,
                "rank {k}"
            );
        }
    }

    fn model(size: (f64, f64), duration: (f64, f64)) -> WorkerModel {
        WorkerModel {
            size_mb: MedianLogNormal::new(size.0, size.1, "size").expect("valid"),
            duration_ms: MedianLogNormal::new(duration.0, duration.1, "duration").expect("valid"),
        }
    }

    #[test]
    fn log_normal_has_its_median_and_shape() {
        let d = MedianLogNormal::new(8.0, 0.8, "x").expect("valid");
        let mut rng = StdRng::seed_from_u64(3);
        let n = 100_000;
        let logs: Vec<f64> = (0..n).map(|_| d.sample(&mut rng).ln()).collect();
        // Half below the median: binomial(n, 1/2), sd √n / 2.
        let below = logs.iter().filter(|&&l| l < 8f64.ln()).count() as f64;
        assert!((below - n as f64 / 2.0).abs() < 5.0 * (n as f64).sqrt() / 2.0);
        // The logarithm's mean ln 8 (sd of the mean 0.8 / √n) and sd 0.8.
        let mean = logs.iter().sum::<f64>() / n as f64;
        assert!((mean - 8f64.ln()).abs() < 5.0 * 0.8 / (n as f64).sqrt());
        let var = logs.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / n as f64;
        assert!((var.sqrt() - 0.8).abs() < 0.01, "{}", var.sqrt());
    }

    #[test]
    fn poisson_gaps_and_durations_have_their_means() {
        let zipf = Zipf::new(1, 1.0);
        let n = 100_000u64;
        let gaps = arrival_gaps(250.0).expect("valid"); // mean gap 4 ms
        let requests: Vec<Request> =
            Arrivals::poisson(&zipf, gaps, n, 1, Balancer::Random, 4, &[20.0]).collect();
        assert_eq!(requests.len() as u64, n);
        // The last arrival: a sum of n gaps of mean 4 ms (sd 4 √n).
        let last = requests.last().expect("some").t_ms as f64;
        assert!((last - 4.0 * n as f64).abs() < 5.0 * 4.0 * (n as f64).sqrt());
        // Durations: exponential of mean 20 ms, rounded, at least 1.
        let mean = requests.iter().map(|r| r.duration_ms as f64).sum::<f64>() / n as f64;
        assert!(
            (mean - 20.0).abs() < 5.0 * 20.0 / (n as f64).sqrt() + 0.05,
            "{mean}"
        );
        assert!(requests.iter().all(|r| r.duration_ms >= 1 && r.server < 4));
    }

    #[test]
    fn invalid_parameters_are_errors() {
        let bad = [
            (0.0, 1.0),
            (-1.0, 1.0),
            (f64::NAN, 1.0),
            (f64::INFINITY, 1.0),
            (8.0, -0.5),
            (8.0, f64::NAN),
            (8.0, f64::INFINITY),
        ];
        for (median, sigma) in bad {
            assert!(
                MedianLogNormal::new(median, sigma, "x").is_err(),
                "{median} {sigma}"
            );
        }
        for rate in [0.0, -1.0, -0.0, f64::NAN, f64::INFINITY] {
            assert!(arrival_gaps(rate).is_err(), "{rate}");
        }
    }

    #[test]
    fn sizes_are_clamped_and_sigma_zero_is_exact() {
        let m = model((4.0, 0.0), (10.0, 0.0));
        let (sizes, durations) = m.draw(3, 1);
        assert_eq!(sizes, vec![4 << 20; 3]);
        assert_eq!(durations, vec![10.0; 3]);
        let m = model((8.0, 3.0), (10.0, 0.0));
        let (sizes, _) = m.draw(1000, 1);
        assert!(
            sizes
                .iter()
                .all(|&b| (MIN_WORKER_BYTES..=MAX_WORKER_BYTES).contains(&b))
        );
    }
}
