//! The benchmark datasets of BENCHMARKS.md, generated deterministically (fixed seed) so any
//! system can be loaded with the same points. Every sample is a pure function of its index, so
//! any slice of a dataset can be generated on its own, in any order, on any thread.
//!
//! - `pmu` bus `b`, sample `i`: `ts = T0 + i * 1e9 / 60` (integer division), value
//!   `round3(50 * sin(2π * 0.05 * (ts - T0) / 1e9) + 0.05 * z)` where `z` is a standard normal
//!   from Box-Muller over `u1 = unit(seed_b + 2i)`, `u2 = unit(seed_b + 2i + 1)`;
//!   `seed_b = SEED + b * 0x9E3779B97F4A7C15`, `unit(x) = ((splitmix64(x) >> 11) + 1) / 2^53`.
//!   (`T0` is a multiple of the 20 s period, so the phase is the same as with Unix seconds.)
//! - `counter` id `c`, sample `i`: `ts = T0 + i * 1e9`, value 0 at `i = 0`, then increasing by
//!   `splitmix64(seed_c + i) % 11` each second, `seed_c = SEED + 0xC0FFEE00 + c * 0x9E3779B97F4A7C15`.

use timeshard_proto::{Point, SeriesKey, Timestamp};

/// Seed of both datasets.
pub const SEED: u64 = 0x7469_6D65_7368_6172;
/// First timestamp of both datasets: 1,700,000,000 s after the Unix epoch, in nanoseconds.
pub const T0: Timestamp = 1_700_000_000 * 1_000_000_000;
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The SplitMix64 output function of `x` (a stateless mixer).
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(GOLDEN);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform number in `(0, 1]` from `x`.
fn unit(x: u64) -> f64 {
    ((splitmix64(x) >> 11) + 1) as f64 / (1u64 << 53) as f64
}

/// Series key of `pmu` bus `bus`: `pmu.phase{bus=<bus>,site=atl}`.
pub fn pmu_series(bus: u32) -> SeriesKey {
    SeriesKey::new("pmu.phase", [("bus", bus.to_string().as_str()), ("site", "atl")]).expect("valid key")
}

/// Series key of `counter` meter `id`: `meter.energy{id=<id>}`.
pub fn counter_series(id: u32) -> SeriesKey {
    SeriesKey::new("meter.energy", [("id", id.to_string().as_str())]).expect("valid key")
}

/// Timestamp of sample `i` of a 60 Hz PMU.
pub fn pmu_ts(i: u64) -> Timestamp {
    T0 + (i as i64) * 1_000_000_000 / 60
}

/// Sample `i` of `pmu` bus `bus`.
pub fn pmu_point(bus: u32, i: u64) -> Point {
    let ts = pmu_ts(i);
    let t = (ts - T0) as f64 / 1e9;
    let seed = SEED.wrapping_add(u64::from(bus).wrapping_mul(GOLDEN));
    let (u1, u2) = (unit(seed.wrapping_add(2 * i)), unit(seed.wrapping_add(2 * i + 1)));
    let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
    let v = 50.0 * (std::f64::consts::TAU * 0.05 * t).sin() + 0.05 * z;
    Point::new(ts, (v * 1000.0).round() / 1000.0)
}

/// Samples `first..first + n` of `pmu` bus `bus`.
pub fn pmu_points(bus: u32, first: u64, n: usize) -> impl Iterator<Item = Point> {
    (first..first + n as u64).map(move |i| pmu_point(bus, i))
}

/// All of `pmu` bus `bus`, from sample 0 on (endless).
pub fn pmu(bus: u32) -> impl Iterator<Item = Point> {
    (0u64..).map(move |i| pmu_point(bus, i))
}

/// The first `n` samples of `counter` meter `id`.
pub fn counter_points(id: u32, n: usize) -> impl Iterator<Item = Point> {
    let seed = SEED.wrapping_add(0xC0FF_EE00).wrapping_add(u64::from(id).wrapping_mul(GOLDEN));
    let mut value = 0u64;
    (0..n as u64).map(move |i| {
        if i > 0 {
            value += splitmix64(seed.wrapping_add(i)) % 11;
        }
        Point::new(T0 + i as i64 * 1_000_000_000, value as f64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pmu_matches_its_definition() {
        let p: Vec<Point> = pmu_points(3, 0, 601).collect();
        assert_eq!(p[0].ts, T0);
        assert_eq!(p[1].ts - p[0].ts, 16_666_666);
        assert_eq!(p[60].ts, T0 + 1_000_000_000);
        assert_eq!(p[600].ts, T0 + 10_000_000_000);
        assert_eq!(pmu_points(3, 60, 1).next(), Some(p[60]));
        assert_eq!(pmu(3).nth(60), Some(p[60]));
        assert_ne!(pmu_point(4, 0), pmu_point(3, 0));
        assert!(p.iter().all(|q| q.value.abs() < 51.0 && ((q.value * 1000.0).round() - q.value * 1000.0).abs() < 1e-6));
        // 5 s in: sin(pi/2) = 1, so the value is near 50.
        assert!((p[300].value - 50.0).abs() < 0.3, "{}", p[300].value);
        assert_eq!(pmu_series(7).as_str(), "pmu.phase{bus=7,site=atl}");
    }

    #[test]
    fn noise_is_gaussian_with_sigma_005() {
        let residuals: Vec<f64> = pmu_points(1, 0, 60_000)
            .map(|p| p.value - 50.0 * (std::f64::consts::TAU * 0.05 * (p.ts - T0) as f64 / 1e9).sin())
            .collect();
        let mean = residuals.iter().sum::<f64>() / residuals.len() as f64;
        let sd = (residuals.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / residuals.len() as f64).sqrt();
        assert!(mean.abs() < 0.002, "mean {mean}");
        assert!((sd - 0.05).abs() < 0.003, "sd {sd}");
    }

    #[test]
    fn counter_is_monotone() {
        let c: Vec<Point> = counter_points(1, 1000).collect();
        assert_eq!(c[0].value, 0.0);
        assert!(c.windows(2).all(|w| w[1].value >= w[0].value && w[1].value - w[0].value <= 10.0));
        assert_eq!(c[1].ts - c[0].ts, 1_000_000_000);
        assert_eq!(counter_series(2).as_str(), "meter.energy{id=2}");
    }
}
