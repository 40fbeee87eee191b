//! The benchmark datasets of BENCHMARKS.md, generated deterministically so any system can be
//! loaded with the same points.

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Normal, Uniform};
use timeshard_proto::{Point, SeriesKey, Timestamp};

/// Start of every dataset: 1,700,000,000 s after the Unix epoch, in nanoseconds.
pub const T0: Timestamp = 1_700_000_000 * 1_000_000_000;

/// The series key of PMU bus `bus`.
pub fn pmu_series(bus: u32) -> SeriesKey {
    format!("pmu.phase{{bus={bus},site=atl}}").parse().expect("a valid literal key")
}

/// The timestamp of the `i`-th sample of a 60 Hz PMU.
pub fn pmu_ts(i: u64) -> Timestamp {
    T0 + (i as i64) * 1_000_000_000 / 60
}

/// The `pmu` dataset for one bus: 60 Hz, `50 sin(2 pi 0.05 t) + N(0, 0.05)` rounded to 3
/// decimals, with `t` in seconds since [`T0`]. An endless iterator; the noise depends only on
/// the bus and the sample index, so any prefix is the same however it is consumed.
pub fn pmu(bus: u32) -> impl Iterator<Item = Point> {
    let mut rng = StdRng::seed_from_u64(0x7113_5a4d ^ u64::from(bus));
    let noise = Normal::new(0.0, 0.05).expect("valid sigma");
    (0u64..).map(move |i| {
        let ts = pmu_ts(i);
        let t = (ts - T0) as f64 / 1e9;
        let v = 50.0 * (2.0 * std::f64::consts::PI * 0.05 * t).sin() + noise.sample(&mut rng);
        Point::new(ts, (v * 1000.0).round() / 1000.0)
    })
}

/// The series key of energy meter `id`.
pub fn counter_series(id: u32) -> SeriesKey {
    format!("meter.energy{{id={id}}}").parse().expect("a valid literal key")
}

/// The `counter` dataset for one meter: 1 Hz, a monotone integer counter growing by a uniform
/// 0..=10 each second, stored as f64.
pub fn counter(id: u32) -> impl Iterator<Item = Point> {
    let mut rng = StdRng::seed_from_u64(0xc0_0e7e ^ u64::from(id));
    let step = Uniform::new_inclusive(0u32, 10).expect("valid range");
    let mut total = 0u64;
    (0u64..).map(move |i| {
        if i > 0 {
            total += u64::from(step.sample(&mut rng));
        }
        Point::new(T0 + (i as i64) * 1_000_000_000, total as f64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pmu_matches_its_definition() {
        let a: Vec<Point> = pmu(7).take(600).collect();
        let b: Vec<Point> = pmu(7).take(1000).collect();
        assert_eq!(a[..], b[..600], "deterministic");
        assert_eq!(a[0].ts, T0);
        assert_eq!(a[1].ts - a[0].ts, 16_666_666);
        assert_eq!(a[599].ts, T0 + 599 * 1_000_000_000 / 60);
        assert!(a.iter().all(|p| p.value.abs() < 51.0 && ((p.value * 1000.0).round() - p.value * 1000.0).abs() < 1e-6));
        // 5 s in: sin(pi/2) = 1, so the value is near 50.
        assert!((a[300].value - 50.0).abs() < 0.3, "{}", a[300].value);
        assert_ne!(pmu(8).next(), pmu(7).next());
        assert_eq!(pmu_series(7).as_str(), "pmu.phase{bus=7,site=atl}");
    }

    #[test]
    fn counter_is_monotone() {
        let c: Vec<Point> = counter(1).take(1000).collect();
        assert!(c.windows(2).all(|w| w[1].value >= w[0].value && w[1].value - w[0].value <= 10.0));
        assert_eq!(c[1].ts - c[0].ts, 1_000_000_000);
    }
}
