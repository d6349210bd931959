//! Latency histograms that survive a trip between processes.
//!
//! Worker processes serialise their HDR histograms in the standard V2 format
//! (uncompressed) and base64-encode them into their JSON result; the
//! coordinator decodes and adds them. Adding HDR histograms is exact, so
//! merged percentiles are the percentiles of all samples.

use anyhow::Context as _;
use base64::Engine as _;
use hdrhistogram::serialization::{Deserializer, Serializer, V2Serializer};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Highest trackable latency: 10 minutes in microseconds.
const MAX_US: u64 = 600_000_000;

/// A latency histogram in microseconds.
#[derive(Clone, Debug)]
pub struct Latency {
    h: Histogram<u64>,
}

impl Default for Latency {
    fn default() -> Self {
        Latency::new()
    }
}

impl Latency {
    /// An empty histogram (1 µs to 10 min, 3 significant figures).
    pub fn new() -> Latency {
        Latency {
            h: Histogram::new_with_bounds(1, MAX_US, 3).expect("valid histogram bounds"),
        }
    }

    /// Records one sample in microseconds (clamped into range).
    pub fn record_us(&mut self, us: u64) {
        self.h.saturating_record(us.clamp(1, MAX_US));
    }

    /// Number of samples.
    pub fn len(&self) -> u64 {
        self.h.len()
    }

    /// Whether no samples were recorded.
    pub fn is_empty(&self) -> bool {
        self.h.is_empty()
    }

    /// Adds all samples of `other`.
    pub fn merge(&mut self, other: &Latency) {
        self.h
            .add(&other.h)
            .expect("histograms with identical bounds merge");
    }

    /// The value at `q` (0..=1) in milliseconds.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        self.h.value_at_quantile(q) as f64 / 1000.0
    }

    /// The largest sample in milliseconds.
    pub fn max_ms(&self) -> f64 {
        self.h.max() as f64 / 1000.0
    }

    /// V2 serialisation, base64 (standard alphabet).
    pub fn to_base64(&self) -> String {
        let mut buf = Vec::new();
        V2Serializer::new()
            .serialize(&self.h, &mut buf)
            .expect("serialising into a Vec cannot fail");
        base64::engine::general_purpose::STANDARD.encode(buf)
    }

    /// Inverse of [`Latency::to_base64`].
    pub fn from_base64(s: &str) -> anyhow::Result<Latency> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(s)
            .context("histogram is not base64")?;
        let h: Histogram<u64> = Deserializer::new()
            .deserialize(&mut bytes.as_slice())
            .map_err(|e| anyhow::anyhow!("bad V2 histogram: {e:?}"))?;
        let mut out = Latency::new();
        out.h.add(&h).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        Ok(out)
    }

    /// Percentile summary plus the serialised histogram.
    pub fn summary(&self) -> LatencySummary {
        LatencySummary {
            count: self.len(),
            p50_ms: self.quantile_ms(0.50),
            p90_ms: self.quantile_ms(0.90),
            p99_ms: self.quantile_ms(0.99),
            max_ms: self.max_ms(),
            hdr_v2_base64: self.to_base64(),
        }
    }
}

/// Percentiles as they appear in the JSON result.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LatencySummary {
    /// Samples.
    pub count: u64,
    /// Median, ms.
    pub p50_ms: f64,
    /// 90th percentile, ms.
    pub p90_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Maximum, ms.
    pub max_ms: f64,
    /// The full histogram (HDR V2, base64) for exact merging.
    pub hdr_v2_base64: String,
}

impl LatencySummary {
    /// Decodes the embedded histogram.
    pub fn histogram(&self) -> anyhow::Result<Latency> {
        if self.hdr_v2_base64.is_empty() {
            return Ok(Latency::new());
        }
        Latency::from_base64(&self.hdr_v2_base64)
    }

    /// Merges summaries exactly via their histograms.
    pub fn merge_all<'a>(
        parts: impl IntoIterator<Item = &'a LatencySummary>,
    ) -> anyhow::Result<LatencySummary> {
        let mut h = Latency::new();
        for p in parts {
            h.merge(&p.histogram()?);
        }
        Ok(h.summary())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_preserves_percentiles() {
        let mut h = Latency::new();
        for v in 1..=10_000u64 {
            h.record_us(v * 10);
        }
        let back = Latency::from_base64(&h.to_base64()).unwrap();
        assert_eq!(back.len(), 10_000);
        assert_eq!(back.summary(), h.summary());
    }

    #[test]
    fn merging_workers_equals_one_histogram_of_all_samples() {
        // Three "workers" with very different distributions.
        let mut all = Latency::new();
        let mut parts = Vec::new();
        for w in 0..3u64 {
            let mut h = Latency::new();
            for i in 0..(1000 * (w + 1)) {
                let v = 100 + i * (w * 37 + 1) % 250_000;
                h.record_us(v);
                all.record_us(v);
            }
            parts.push(h.summary());
        }
        let merged = LatencySummary::merge_all(&parts).unwrap();
        let expect = all.summary();
        assert_eq!(merged.count, 6000);
        assert_eq!(merged.p50_ms, expect.p50_ms);
        assert_eq!(merged.p90_ms, expect.p90_ms);
        assert_eq!(merged.p99_ms, expect.p99_ms);
        assert_eq!(merged.max_ms, expect.max_ms);
        // Averaging per-worker p99s would be wrong: check it differs here.
        let naive = parts.iter().map(|p| p.p99_ms).sum::<f64>() / 3.0;
        assert_ne!(naive, merged.p99_ms);
    }

    #[test]
    fn empty_summary_merges() {
        let empty = LatencySummary::default();
        let merged = LatencySummary::merge_all([&empty]).unwrap();
        assert_eq!(merged.count, 0);
    }
}
