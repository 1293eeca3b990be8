//! Time and randomness, behind traits so the simulation can drive them.
//!
//! Monotonic time is `tokio::time::Instant`: under a paused tokio runtime
//! (the simulation) it is virtual and advances only when every task waits.
//! Wall time (milliseconds since the Unix epoch) is only used for alarms and
//! for the freshness window of signed calls, never to judge a lease.

use std::fmt::Debug;
use std::sync::atomic::{AtomicI64, Ordering};

use parking_lot::Mutex;
use rand::{RngCore, SeedableRng, rngs::StdRng};
use tokio::time::Instant;

pub trait Clock: Send + Sync + Debug + 'static {
    fn now(&self) -> Instant;
    fn wall_ms(&self) -> i64;
}

/// The real clocks.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn wall_ms(&self) -> i64 {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX)
    }
}

/// A wall clock a test moves (ADR 0073: the test harness and `wasmkeep
/// dev --test-routes`): the system's wall clock plus what the test added.
/// Monotonic time (leases, timeouts) is the system's: only the wall clock,
/// which alarms are set on, is the test's.
#[derive(Debug, Default)]
pub struct TestClock {
    offset_ms: AtomicI64,
}

impl TestClock {
    /// Moves the wall clock forward by `by` (it never moves back).
    pub fn advance(&self, by: std::time::Duration) {
        let by_ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        let _ = self
            .offset_ms
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |offset| {
                Some(offset.saturating_add(by_ms))
            });
    }

    /// Milliseconds since the Unix epoch, as the node reads them.
    pub fn now_ms(&self) -> i64 {
        self.wall_ms()
    }
}

impl Clock for TestClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn wall_ms(&self) -> i64 {
        SystemClock
            .wall_ms()
            .saturating_add(self.offset_ms.load(Ordering::SeqCst))
    }
}

pub trait Random: Send + Sync + Debug + 'static {
    fn next_u64(&self) -> u64;

    /// A random token of `bytes` bytes, hex-encoded.
    fn token_hex(&self, bytes: usize) -> String {
        let mut out = String::with_capacity(bytes * 2);
        while out.len() < bytes * 2 {
            out.push_str(&format!("{:016x}", self.next_u64()));
        }
        out.truncate(bytes * 2);
        out
    }
}

/// The operating system's generator.
#[derive(Debug, Default, Clone, Copy)]
pub struct OsRandom;

impl Random for OsRandom {
    fn next_u64(&self) -> u64 {
        rand::rng().next_u64()
    }
}

/// A seeded generator: the same seed gives the same sequence.
#[derive(Debug)]
pub struct SeededRandom(Mutex<StdRng>);

impl SeededRandom {
    pub fn new(seed: u64) -> Self {
        Self(Mutex::new(StdRng::seed_from_u64(seed)))
    }
}

impl Random for SeededRandom {
    fn next_u64(&self) -> u64 {
        self.0.lock().next_u64()
    }
}
