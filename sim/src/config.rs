//! What a simulation run is made of: the faults, the cluster's shape and
//! timings, the operator's actions, and the named scenarios the tests run
//! (one configuration per seed). Plain data; never runs anything.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Faults drawn from the seed. Durations are upper bounds of uniform draws.
#[derive(Debug, Clone)]
pub struct FaultConfig {
    /// Every node's usual request latency (before the operation applies)
    /// and reply latency (after it applied).
    pub request_latency_max: Duration,
    pub reply_latency_max: Duration,
    /// Faults injected one after another at random gaps...
    pub steps: usize,
    pub gap_max: Duration,
    /// ...each lasting up to this long (crash to restart, partition, ...).
    pub duration_max: Duration,
    /// Which faults may be drawn.
    pub crashes: bool,
    pub partitions: bool,
    pub pauses: bool,
    pub slow_bucket: bool,
    pub flaky_bucket: bool,
    /// Cuts one node off from the other nodes (not from the bucket).
    pub network_partitions: bool,
    /// Latencies during a slow-bucket episode.
    pub slow_request_latency_max: Duration,
    pub slow_reply_latency_max: Duration,
    /// Probabilities during a flaky-bucket episode.
    pub unavailable_probability_max: f64,
    pub reply_lost_probability_max: f64,
    /// A node call's request, and separately its answer, is lost with this
    /// probability; each way is delayed up to `forward_delay_max`.
    pub forward_loss_probability: f64,
    pub forward_delay_max: Duration,
}

impl Default for FaultConfig {
    fn default() -> Self {
        Self {
            request_latency_max: Duration::from_millis(80),
            reply_latency_max: Duration::from_millis(80),
            steps: 12,
            gap_max: Duration::from_secs(12),
            duration_max: Duration::from_secs(25),
            crashes: true,
            partitions: true,
            pauses: true,
            slow_bucket: true,
            flaky_bucket: true,
            network_partitions: true,
            slow_request_latency_max: Duration::from_millis(1500),
            slow_reply_latency_max: Duration::from_millis(1500),
            unavailable_probability_max: 0.3,
            reply_lost_probability_max: 0.2,
            forward_loss_probability: 0.02,
            forward_delay_max: Duration::from_millis(50),
        }
    }
}

#[derive(Debug, Clone)]
pub struct SimConfig {
    pub seed: u64,
    pub nodes: usize,
    pub actors: usize,
    /// Increments sent by clients at random gaps, each without waiting for
    /// the ones before it.
    pub client_events: usize,
    pub client_gap_max: Duration,
    pub lease_ttl: Duration,
    pub heartbeat_period: Duration,
    /// Each node's wall clock is off by up to this much either way.
    pub skew_max: Duration,
    pub faults: FaultConfig,
    /// After the last client event, faults heal and the cluster runs this
    /// long before the final check.
    pub settle: Duration,
    /// A resident actor without events hibernates after this long.
    pub idle_timeout: Duration,
    /// Each node lists the alarm index this often (the backstop for alarms
    /// of actors nobody holds).
    pub alarm_sweep_period: Duration,
    /// What the operator does meanwhile.
    pub operator: OperatorConfig,
    /// Check that acknowledged alarms run within this long of their due
    /// time (`truth::ALARM_LATE`): only for runs without clock skew and
    /// without faults that may delay an alarm that long.
    pub alarm_lateness_max: Option<Duration>,
    /// The counter class's retention window (ADR 0076): zero deletes all a
    /// snapshot covers; a window keeps the log of its length (virtual time).
    pub retention: Duration,
}

/// The operator's actions, drawn from the seed, as `wasmkeep node drain`,
/// `node undrain`, `actor move` and `actor delete` would do them (writing
/// and deleting the control keys), and clients setting alarms.
#[derive(Debug, Clone)]
pub struct OperatorConfig {
    pub steps: usize,
    pub gap_max: Duration,
    /// Drain a node (at most one at a time), or undrain the drained one.
    pub drains: bool,
    /// Move an actor to a node.
    pub moves: bool,
    /// Move an alarm actor to a node and drain that node a moment later.
    pub moves_then_drain: bool,
    /// Delete a counter actor (`wasmkeep actor delete`) while clients
    /// increment it.
    pub deletes: bool,
    /// Set an alarm on an alarm actor (one clients never increment), due
    /// up to `alarm_delay_max` ahead.
    pub alarms: bool,
    pub alarm_delay_max: Duration,
    /// Actors that only get alarms (`t/counter/a<k>`).
    pub alarm_actors: usize,
}

impl OperatorConfig {
    /// No operator at all.
    pub fn none() -> Self {
        Self {
            steps: 0,
            gap_max: Duration::from_secs(10),
            drains: false,
            moves: false,
            moves_then_drain: false,
            deletes: false,
            alarms: false,
            alarm_delay_max: Duration::from_secs(8),
            alarm_actors: 0,
        }
    }

    /// Deletes and moves of the clients' actors, nothing else.
    pub fn deletes_and_moves() -> Self {
        Self {
            drains: false,
            moves_then_drain: false,
            alarms: false,
            ..Self::mixed()
        }
    }

    /// Drains, moves, deletes and alarms mixed.
    pub fn mixed() -> Self {
        Self {
            steps: 30,
            gap_max: Duration::from_secs(8),
            drains: true,
            moves: true,
            moves_then_drain: true,
            deletes: true,
            alarms: true,
            alarm_delay_max: Duration::from_secs(8),
            alarm_actors: 2,
        }
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            seed: 0,
            nodes: 3,
            actors: 4,
            client_events: 400,
            client_gap_max: Duration::from_millis(800),
            lease_ttl: Duration::from_secs(10),
            heartbeat_period: Duration::from_secs(3),
            skew_max: Duration::from_secs(30),
            faults: FaultConfig::default(),
            settle: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(30),
            alarm_sweep_period: Duration::from_secs(30),
            operator: OperatorConfig::none(),
            alarm_lateness_max: None,
            retention: Duration::ZERO,
        }
    }
}

/// The named scenarios the simulation's tests run, one config per seed.
/// The tests (`tests/scenarios.rs`) and the digest recorder
/// (`examples/digests.rs`) share them, so a recorded digest names exactly
/// what a test runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// No operator: leases and ownership under every fault.
    Lease,
    /// Drains and undrains with alarms due.
    Drain,
    /// Moves with alarms due.
    Move,
    /// Deletes and moves of the clients' actors.
    Delete,
    /// Everything at once, with more fault steps.
    Mixed,
    /// The shape drawn from the seed too (swarm testing, issue 53): nodes,
    /// actors, client rate, heartbeat and TTL, clock skew, which faults and
    /// which operator actions, and their rates.
    Swarm,
}

impl Scenario {
    pub const ALL: [Scenario; 6] = [
        Scenario::Lease,
        Scenario::Drain,
        Scenario::Move,
        Scenario::Delete,
        Scenario::Mixed,
        Scenario::Swarm,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::Lease => "lease",
            Scenario::Drain => "drain",
            Scenario::Move => "move",
            Scenario::Delete => "delete",
            Scenario::Mixed => "mixed",
            Scenario::Swarm => "swarm",
        }
    }

    /// The scenario's configuration for one seed.
    pub fn config(self, seed: u64) -> SimConfig {
        if self == Scenario::Swarm {
            return swarm(seed);
        }
        let operator = match self {
            Scenario::Lease => OperatorConfig::none(),
            Scenario::Drain => OperatorConfig {
                moves: false,
                moves_then_drain: false,
                deletes: false,
                ..OperatorConfig::mixed()
            },
            Scenario::Move => OperatorConfig {
                drains: false,
                moves_then_drain: false,
                deletes: false,
                ..OperatorConfig::mixed()
            },
            Scenario::Delete => OperatorConfig::deletes_and_moves(),
            Scenario::Mixed | Scenario::Swarm => OperatorConfig::mixed(),
        };
        let faults = match self {
            Scenario::Mixed => FaultConfig {
                steps: 16,
                ..FaultConfig::default()
            },
            _ => FaultConfig::default(),
        };
        SimConfig {
            seed,
            operator,
            faults,
            ..SimConfig::default()
        }
    }
}

/// A configuration whose shape is drawn from the seed (its own stream, so
/// the run's other draws do not move with it).
fn swarm(seed: u64) -> SimConfig {
    let mut rng = StdRng::seed_from_u64(crate::sub_seed(seed, SWARM_PURPOSE));
    let ms = |rng: &mut StdRng, lo: u64, hi: u64| Duration::from_millis(rng.random_range(lo..=hi));
    let heartbeat_period = ms(&mut rng, 1000, 4000);
    // Three to five heartbeats per lease, as operators set them.
    let lease_ttl = heartbeat_period * rng.random_range(3..=5);
    let alarm_actors = rng.random_range(0..=3);
    let operator = OperatorConfig {
        steps: rng.random_range(0..=40),
        gap_max: ms(&mut rng, 2000, 12_000),
        drains: rng.random_bool(0.5),
        moves: rng.random_bool(0.5),
        moves_then_drain: alarm_actors > 0 && rng.random_bool(0.5),
        deletes: rng.random_bool(0.5),
        alarms: alarm_actors > 0 && rng.random_bool(0.5),
        alarm_delay_max: ms(&mut rng, 1000, 15_000),
        alarm_actors,
    };
    let faults = FaultConfig {
        request_latency_max: ms(&mut rng, 1, 200),
        reply_latency_max: ms(&mut rng, 1, 200),
        steps: rng.random_range(0..=20),
        gap_max: ms(&mut rng, 2000, 15_000),
        duration_max: ms(&mut rng, 1000, 30_000),
        crashes: rng.random_bool(0.5),
        partitions: rng.random_bool(0.5),
        pauses: rng.random_bool(0.5),
        slow_bucket: rng.random_bool(0.5),
        flaky_bucket: rng.random_bool(0.5),
        network_partitions: rng.random_bool(0.5),
        forward_loss_probability: rng.random_range(0.0..0.1),
        ..FaultConfig::default()
    };
    let config = SimConfig {
        seed,
        nodes: rng.random_range(2..=7),
        actors: rng.random_range(1..=64),
        client_events: 400,
        client_gap_max: ms(&mut rng, 50, 1500),
        lease_ttl,
        heartbeat_period,
        skew_max: ms(&mut rng, 0, 30_000),
        faults,
        operator,
        ..SimConfig::default()
    };
    // Drawn last, so the shapes drawn before it stay those of earlier seeds.
    let retention = [0, 2, 30, 7 * 86_400][rng.random_range(0..4)];
    SimConfig {
        retention: Duration::from_secs(retention),
        ..config
    }
}

/// The stream the swarm's shape is drawn from (`crate::sub_seed`).
const SWARM_PURPOSE: u64 = 6;
