//! [`SkewedClock`]: one simulated node's clocks. Monotonic time is tokio's
//! (virtual under the paused runtime, the same rate on every node); wall time
//! is a fixed virtual epoch plus this node's skew, so two nodes disagree
//! about the wall clock by seconds, as real unsynchronized nodes do.

use tokio::time::Instant;
use wasmkeep_cluster::Clock;

/// Wall time at the simulation's start: 2026-01-01T00:00:00Z, so a run
/// never depends on the host's clock.
pub const EPOCH_MS: i64 = 1_767_225_600_000;

#[derive(Debug, Clone, Copy)]
pub struct SkewedClock {
    /// The virtual instant the simulation started.
    start: Instant,
    /// This node's wall clock minus the true wall clock.
    skew_ms: i64,
}

impl SkewedClock {
    pub fn new(start: Instant, skew_ms: i64) -> Self {
        Self { start, skew_ms }
    }

    pub fn skew_ms(&self) -> i64 {
        self.skew_ms
    }
}

impl Clock for SkewedClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn wall_ms(&self) -> i64 {
        let since_start = Instant::now().saturating_duration_since(self.start);
        let since_start_ms = i64::try_from(since_start.as_millis()).unwrap_or(i64::MAX);
        EPOCH_MS
            .saturating_add(since_start_ms)
            .saturating_add(self.skew_ms)
    }
}

/// Milliseconds of virtual time since `start` (for the trace).
pub fn virtual_ms(start: Instant) -> u128 {
    Instant::now().saturating_duration_since(start).as_millis()
}
