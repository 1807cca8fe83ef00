//! One latency summary: count, mean, min, nearest-rank percentiles and max
//! of a set of request latencies, plus a histogram in fixed logarithmic
//! buckets for a text view.
//!
//! Percentiles come from an HDR histogram ([`hdrhistogram`]) recorded in
//! nanoseconds with 3 significant digits: each is the middle of the
//! histogram bucket holding the nearest-rank sample (the smallest sample
//! with at least a fraction `p` of all samples at or below it), so it is
//! within 0.1% of that sample. Count, mean, min and max are exact.

use hdrhistogram::Histogram;
use serde::Serialize;

/// Upper bounds (ms) of the text histogram's buckets; one more bucket holds
/// everything above the last.
pub const BUCKETS_MS: [f64; 16] = [
    0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0,
    10000.0,
];

/// Significant digits the percentiles keep.
const SIGNIFICANT_DIGITS: u8 = 3;

/// A latency distribution, in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Distribution {
    /// Number of samples.
    pub count: u64,
    /// Mean.
    pub mean_ms: f64,
    /// Smallest.
    pub min_ms: f64,
    /// Median (nearest rank).
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest.
    pub max_ms: f64,
    /// Samples per bucket of [`BUCKETS_MS`] (upper bound inclusive), the
    /// last bucket (`le_ms: None`) above the largest bound.
    pub histogram: Vec<Bucket>,
}

/// One histogram bucket.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Bucket {
    /// Upper bound in ms (inclusive); `None` for the overflow bucket.
    pub le_ms: Option<f64>,
    /// Samples in the bucket.
    pub count: u64,
}

impl Distribution {
    /// The distribution of `samples` (ms; order does not matter; samples
    /// that are not finite numbers are left out, negative ones count as 0).
    pub fn of(samples: &[f64]) -> Self {
        let v: Vec<f64> = samples
            .iter()
            .copied()
            .filter(|x| x.is_finite())
            .map(|x| x.max(0.0))
            .collect();
        let mut histogram: Vec<Bucket> = BUCKETS_MS
            .iter()
            .map(|&b| Bucket {
                le_ms: Some(b),
                count: 0,
            })
            .chain(std::iter::once(Bucket {
                le_ms: None,
                count: 0,
            }))
            .collect();
        for &x in &v {
            let i = BUCKETS_MS.partition_point(|&b| b < x);
            if let Some(b) = histogram.get_mut(i) {
                b.count += 1;
            }
        }
        let hdr = Self::hdr(&v);
        let (Some(hdr), false) = (hdr, v.is_empty()) else {
            return Distribution {
                histogram,
                ..Distribution::default()
            };
        };
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(0.0, f64::max);
        let at = |p: f64| hdr.median_equivalent(hdr.value_at_quantile(p)) as f64 / 1e6;
        Distribution {
            count: v.len() as u64,
            mean_ms: v.iter().sum::<f64>() / v.len() as f64,
            min_ms: min,
            // The bucket middle can lie a little outside the samples.
            p50_ms: at(0.50).clamp(min, max),
            p90_ms: at(0.90).clamp(min, max),
            p99_ms: at(0.99).clamp(min, max),
            max_ms: max,
            histogram,
        }
    }

    /// The samples in an HDR histogram of nanoseconds.
    fn hdr(samples_ms: &[f64]) -> Option<Histogram<u64>> {
        let mut h = Histogram::<u64>::new(SIGNIFICANT_DIGITS).ok()?;
        for &x in samples_ms {
            // Saturates at u64::MAX ns (584 years).
            h.record((x * 1e6).round() as u64).ok()?;
        }
        Some(h)
    }

    /// `p50 / p99` in ms with two decimals, or `-` without samples: the
    /// cell every tool prints under "p50 / p99 (ms)".
    pub fn p50_p99(&self) -> String {
        if self.count == 0 {
            "-".to_string()
        } else {
            format!("{:.2} / {:.2}", self.p50_ms, self.p99_ms)
        }
    }

    /// A text histogram, one line per bucket from the first non-empty one
    /// to the last, bars scaled to the fullest bucket.
    pub fn text_histogram(&self) -> String {
        const WIDTH: u64 = 40;
        let first = self.histogram.iter().position(|b| b.count > 0);
        let last = self.histogram.iter().rposition(|b| b.count > 0);
        let (Some(first), Some(last)) = (first, last) else {
            return "  (no samples)\n".to_string();
        };
        let top = self.histogram.iter().map(|b| b.count).max().unwrap_or(1);
        let mut out = String::new();
        for b in &self.histogram[first..=last] {
            let label = match b.le_ms {
                Some(le) => format!("<= {le:>7} ms"),
                None => format!(" > {:>7} ms", BUCKETS_MS[BUCKETS_MS.len() - 1]),
            };
            let len = (b.count * WIDTH).div_ceil(top.max(1)) as usize;
            out.push_str(&format!(
                "  {label} |{:<w$}| {}\n",
                "#".repeat(len),
                b.count,
                w = WIDTH as usize
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= b.abs() * 1e-3
    }

    #[test]
    fn percentiles_are_nearest_rank_within_a_thousandth() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let d = Distribution::of(&v);
        assert_eq!(d.count, 100);
        for (got, want) in [(d.p50_ms, 50.0), (d.p90_ms, 90.0), (d.p99_ms, 99.0)] {
            assert!(close(got, want), "{got} vs {want}");
        }
        assert_eq!((d.min_ms, d.max_ms, d.mean_ms), (1.0, 100.0, 50.5));
        assert_eq!(d.histogram.iter().map(|b| b.count).sum::<u64>(), 100);
        let empty = Distribution::of(&[]);
        assert_eq!(empty.count, 0);
        assert_eq!(empty.p50_p99(), "-");
        assert!(empty.text_histogram().contains("no samples"));
    }

    #[test]
    fn sub_millisecond_latencies_keep_their_digits() {
        let d = Distribution::of(&[0.317, 0.317, 0.912]);
        assert_eq!(d.p50_p99(), "0.32 / 0.91");
        let one = Distribution::of(&[0.05]);
        assert_eq!((one.p50_ms, one.p99_ms), (0.05, 0.05));
    }

    #[test]
    fn histogram_buckets_are_inclusive_upper_bounds() {
        let d = Distribution::of(&[0.1, 0.15, 1.0, 20000.0]);
        let count = |le: Option<f64>| {
            d.histogram
                .iter()
                .find(|b| b.le_ms == le)
                .map_or(0, |b| b.count)
        };
        assert_eq!(count(Some(0.1)), 1);
        assert_eq!(count(Some(0.2)), 1);
        assert_eq!(count(Some(1.0)), 1);
        assert_eq!(count(None), 1);
        let text = d.text_histogram();
        assert_eq!(text.lines().count(), BUCKETS_MS.len() + 1);
    }
}
