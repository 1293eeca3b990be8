//! Deterministic simulation of the cluster protocol (ADR 0006).
//!
//! N nodes run in one process on a current-thread tokio runtime whose clock
//! is paused: time is virtual and jumps ahead whenever every task waits, so
//! minutes of cluster life take milliseconds. Each node runs the real
//! `wasmkeep-cluster` leases, observers, peers and ownership records and the
//! real `wasmkeep-store` actor store, over its own client of one in-memory
//! bucket. Every source of nondeterminism is drawn from the seed: the
//! clients' events, the faults (bucket latency, unavailability, lost replies,
//! partitions, crashes, heartbeat pauses), node incarnations, forwarding
//! delays. There is no real I/O and no other thread, and the harness keeps
//! its state in ordered maps, so a seed replays its run exactly
//! ([`SimReport::digest`]).
//!
//! Checkers ([`truth`]) run after every commit and at the end.
//!
//! Modules: `clock` (a node's skewed clock), `bucket` (a node's bucket client
//! and the ground-truth taps), `node` (a node: heartbeat loop and the counter
//! actor's mailbox), `truth` (ground truth, trace, checkers).

pub mod bucket;
pub mod clock;
pub mod node;
pub mod truth;

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use wasmkeep_bucket::{Bucket, MemoryBucket};
use wasmkeep_types::{ActorId, AppName, Keys, NodeId};

use crate::bucket::SimBucket;
use crate::node::{Event, Node};
use crate::truth::Truth;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the simulation runtime could not start: {0}")]
    Runtime(#[from] std::io::Error),
    #[error("SIM_SEEDS must look like `a..b` with a < b, got {0:?}")]
    SeedRange(String),
    #[error("SIM_SEED must be a number, got {0:?}")]
    Seed(String),
}

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
    /// Latencies during a slow-bucket episode.
    pub slow_request_latency_max: Duration,
    pub slow_reply_latency_max: Duration,
    /// Probabilities during a flaky-bucket episode.
    pub unavailable_probability_max: f64,
    pub reply_lost_probability_max: f64,
    /// A forwarded event is lost with this probability, else delayed.
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
            slow_request_latency_max: Duration::from_millis(1500),
            slow_reply_latency_max: Duration::from_millis(1500),
            unavailable_probability_max: 0.3,
            reply_lost_probability_max: 0.2,
            forward_loss_probability: 0.05,
            forward_delay_max: Duration::from_millis(50),
        }
    }
}

#[derive(Debug, Clone)]
pub struct SimConfig {
    pub seed: u64,
    pub nodes: usize,
    pub actors: usize,
    /// Increments sent by clients, one at a time at random gaps.
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
        }
    }
}

/// What one seed's run showed.
#[derive(Debug, Clone)]
pub struct SimReport {
    pub seed: u64,
    /// sha256 of the whole trace: equal for equal seeds.
    pub digest: String,
    pub trace: Vec<String>,
    pub violations: Vec<String>,
    pub violations_total: u64,
    pub acknowledged: u64,
    pub committed: u64,
    /// Virtual time the run covered.
    pub simulated: Duration,
}

impl SimReport {
    pub fn passed(&self) -> bool {
        self.violations_total == 0
    }

    /// The kept violations of one checker (`truth::ONE_OWNER`, ...).
    pub fn violations_of(&self, checker: &str) -> Vec<&String> {
        self.violations
            .iter()
            .filter(|v| v.contains(checker))
            .collect()
    }

    /// The seed, the one command that replays it, the violations and the
    /// end of the trace.
    pub fn failure_message(&self, test_binary: &str, test_name: &str) -> String {
        let tail: Vec<&String> = self.trace.iter().rev().take(40).rev().collect();
        let first_violation = self
            .trace
            .iter()
            .position(|l| l.contains("VIOLATION"))
            .unwrap_or(self.trace.len());
        let from = first_violation.saturating_sub(40);
        let around: Vec<&String> = self.trace[from..(first_violation + 1).min(self.trace.len())]
            .iter()
            .collect();
        format!(
            "seed {seed} failed ({total} violations)\nreproduce: {cmd}\n\nviolations:\n  {v}\n\ntrace before the first violation:\n{around}\n\nend of trace:\n{tail}",
            seed = self.seed,
            total = self.violations_total,
            cmd = repro_command(self.seed, test_binary, test_name),
            v = self.violations.join("\n  "),
            around = around
                .iter()
                .map(|l| l.as_str())
                .collect::<Vec<_>>()
                .join("\n"),
            tail = tail
                .iter()
                .map(|l| l.as_str())
                .collect::<Vec<_>>()
                .join("\n"),
        )
    }
}

/// The command that replays one seed of one test.
pub fn repro_command(seed: u64, test_binary: &str, test_name: &str) -> String {
    format!(
        "SIM_SEED={seed} cargo test --release -p wasmkeep-sim --test {test_binary} -- {test_name}"
    )
}

/// The seeds to run: `SIM_SEED=n` (one), `SIM_SEEDS=a..b` (a range), or
/// `default`.
pub fn seeds_from_env(default: Range<u64>) -> Result<Vec<u64>, Error> {
    if let Ok(one) = std::env::var("SIM_SEED") {
        let seed = one.trim().parse().map_err(|_| Error::Seed(one.clone()))?;
        return Ok(vec![seed]);
    }
    if let Ok(range) = std::env::var("SIM_SEEDS") {
        return parse_seed_range(&range).map(|r| r.collect());
    }
    Ok(default.collect())
}

pub fn parse_seed_range(text: &str) -> Result<Range<u64>, Error> {
    let bad = || Error::SeedRange(text.to_owned());
    let (a, b) = text.trim().split_once("..").ok_or_else(bad)?;
    let a: u64 = a.trim().parse().map_err(|_| bad())?;
    let b: u64 = b.trim().parse().map_err(|_| bad())?;
    if a >= b {
        return Err(bad());
    }
    Ok(a..b)
}

/// A well-mixed seed for one purpose, so the clients, the faults and each
/// node draw from independent streams (one more draw in one stream does not
/// shift the others).
pub fn sub_seed(seed: u64, purpose: u64) -> u64 {
    // splitmix64
    let mut z = seed
        .wrapping_add(purpose.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

const PURPOSE_CLIENTS: u64 = 1;
const PURPOSE_FAULTS: u64 = 2;
const PURPOSE_FORWARD: u64 = 3;
const PURPOSE_SETUP: u64 = 4;
/// Node `i`'s `k`-th start draws from purposes `1000 + 1000 * i + 2k (+1)`.
const PURPOSE_NODES: u64 = 1000;

struct Slot {
    node: Option<Arc<Node>>,
    starts: u64,
    skew_ms: i64,
}

/// Everything the simulated nodes share: the bucket, the ground truth, the
/// slots that say which process of each node is running.
pub struct World {
    pub config: SimConfig,
    pub start: Instant,
    pub truth: Arc<Mutex<Truth>>,
    pub keys: Keys,
    root: MemoryBucket,
    slots: Vec<Mutex<Slot>>,
    forward_rng: Mutex<StdRng>,
    healing: AtomicBool,
}

impl World {
    fn new(config: SimConfig) -> Arc<Self> {
        let start = Instant::now();
        let mut setup = StdRng::seed_from_u64(sub_seed(config.seed, PURPOSE_SETUP));
        let skew_max_ms = i64::try_from(config.skew_max.as_millis()).unwrap_or(i64::MAX);
        let slots = (0..config.nodes)
            .map(|_| {
                Mutex::new(Slot {
                    node: None,
                    starts: 0,
                    skew_ms: setup.random_range(-skew_max_ms..=skew_max_ms),
                })
            })
            .collect();
        Arc::new(Self {
            truth: Arc::new(Mutex::new(Truth::new(start, config.lease_ttl))),
            keys: Keys::new(&AppName::default_app()),
            root: MemoryBucket::with_seed(sub_seed(config.seed, PURPOSE_SETUP)),
            slots,
            forward_rng: Mutex::new(StdRng::seed_from_u64(sub_seed(
                config.seed,
                PURPOSE_FORWARD,
            ))),
            healing: AtomicBool::new(false),
            start,
            config,
        })
    }

    pub fn skew_ms(&self, index: usize) -> i64 {
        self.slots[index].lock().skew_ms
    }

    pub fn actor(&self, index: usize) -> ActorId {
        ActorId::parse(&format!("t/counter/c{index}")).expect("a valid actor id")
    }

    pub fn index_of(&self, node: &NodeId) -> Option<usize> {
        let index: usize = node.as_str().strip_prefix('n')?.parse().ok()?;
        (index < self.slots.len()).then_some(index)
    }

    pub fn node(&self, index: usize) -> Option<Arc<Node>> {
        self.slots[index].lock().node.clone()
    }

    /// Starts node `index` unless it runs: a new process, a new bucket
    /// client, a new incarnation.
    fn start_node(self: &Arc<Self>, index: usize) {
        let starts = {
            let mut slot = self.slots[index].lock();
            if slot.node.is_some() {
                return;
            }
            slot.starts += 1;
            slot.starts
        };
        let purpose = PURPOSE_NODES + 1000 * index as u64 + 2 * starts;
        let client = self.root.new_client(sub_seed(self.config.seed, purpose));
        let faults = &self.config.faults;
        let mut setup = StdRng::seed_from_u64(sub_seed(self.config.seed, purpose + 1));
        let latency = draw(&mut setup, faults.request_latency_max);
        client.faults().set_latency(latency, latency);
        let bucket = Arc::new(SimBucket::new(
            client,
            &format!("n{index}"),
            self.keys.clone(),
            self.truth.clone(),
            setup.random(),
        ));
        bucket.set_reply_latency_max(draw(&mut setup, faults.reply_latency_max));
        let node = Node::start(self, index, bucket, setup.random());
        self.slots[index].lock().node = Some(node);
    }

    fn crash_node(&self, index: usize) -> bool {
        let node = self.slots[index].lock().node.take();
        match node {
            Some(node) => {
                node.crash();
                true
            }
            None => false,
        }
    }

    /// Hands an event to node `index`, as a client or a forwarding peer would.
    pub fn deliver(&self, index: usize, event: Event) {
        let who = format!("n{index}");
        match self.node(index) {
            Some(node) => {
                if !node.deliver(event.clone()) {
                    self.truth.lock().log(
                        &who,
                        format!(
                            "event {} {}: refused: mailbox full (503)",
                            event.id, event.actor
                        ),
                    );
                }
            }
            None => self.truth.lock().log(
                &who,
                format!("event {} {}: refused: node down", event.id, event.actor),
            ),
        }
    }

    /// Whether the next forward is lost, and its delay.
    pub fn forward_draw(&self) -> (bool, Duration) {
        let faults = &self.config.faults;
        let mut rng = self.forward_rng.lock();
        let lost = faults.forward_loss_probability > 0.0
            && rng.random_bool(faults.forward_loss_probability.clamp(0.0, 1.0));
        (lost, draw(&mut rng, faults.forward_delay_max))
    }

    fn log(&self, what: impl AsRef<str>) {
        self.truth.lock().log("SIM", what);
    }
}

fn draw(rng: &mut StdRng, max: Duration) -> Duration {
    let max_ms = u64::try_from(max.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(rng.random_range(0..=max_ms))
}

/// Runs one seed on a fresh current-thread runtime with paused time.
pub fn run(config: &SimConfig) -> Result<SimReport, Error> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()?;
    Ok(runtime.block_on(run_in_runtime(config.clone())))
}

async fn run_in_runtime(config: SimConfig) -> SimReport {
    let world = World::new(config);
    for index in 0..world.config.nodes {
        world.start_node(index);
    }
    let clients = tokio::spawn(client_driver(world.clone()));
    let faults = tokio::spawn(fault_driver(world.clone()));
    let _ = clients.await;
    world.healing.store(true, Ordering::SeqCst);
    let _ = faults.await;
    heal_all(&world);
    tokio::time::sleep(world.config.settle).await;
    world.log("stop every node");
    for index in 0..world.config.nodes {
        world.crash_node(index);
    }
    // Let aborted tasks and failing flushers finish before the final read.
    tokio::time::sleep(world.config.lease_ttl).await;
    for index in 0..world.config.actors {
        let actor = world.actor(index);
        let bucket: Arc<dyn Bucket> = Arc::new(world.root.new_client(0));
        match node::read_counter(bucket, &world.keys, &actor).await {
            Ok(found) => world.truth.lock().check_counter(&actor.to_string(), found),
            Err(e) => world
                .truth
                .lock()
                .violation(format!("{} {actor}: {e}", truth::RESTORE_FAILED)),
        }
    }
    let simulated = Instant::now().saturating_duration_since(world.start);
    let truth = world.truth.lock();
    SimReport {
        seed: world.config.seed,
        digest: truth.digest_hex(),
        trace: truth.trace().to_vec(),
        violations: truth.violations().to_vec(),
        violations_total: truth.violations_total(),
        acknowledged: truth.acked.values().sum(),
        committed: truth.attempted.values().sum(),
        simulated,
    }
}

/// Clients send increments of random actors to random nodes.
async fn client_driver(world: Arc<World>) {
    let mut rng = StdRng::seed_from_u64(sub_seed(world.config.seed, PURPOSE_CLIENTS));
    for id in 0..world.config.client_events as u64 {
        tokio::time::sleep(draw(&mut rng, world.config.client_gap_max)).await;
        let actor = world.actor(rng.random_range(0..world.config.actors));
        let index = rng.random_range(0..world.config.nodes);
        world.deliver(
            index,
            Event {
                id,
                actor,
                forwarded: false,
            },
        );
    }
    world.log("clients done");
}

/// Injects faults at random gaps until the clients are done.
async fn fault_driver(world: Arc<World>) {
    let faults = world.config.faults.clone();
    let mut rng = StdRng::seed_from_u64(sub_seed(world.config.seed, PURPOSE_FAULTS));
    let mut kinds = Vec::new();
    for (on, kind) in [
        (faults.crashes, 0),
        (faults.partitions, 1),
        (faults.pauses, 2),
        (faults.slow_bucket, 3),
        (faults.flaky_bucket, 4),
    ] {
        if on {
            kinds.push(kind);
        }
    }
    if kinds.is_empty() {
        return;
    }
    for _ in 0..faults.steps {
        tokio::time::sleep(draw(&mut rng, faults.gap_max)).await;
        if world.healing.load(Ordering::SeqCst) {
            return;
        }
        let index = rng.random_range(0..world.config.nodes);
        let kind = kinds[rng.random_range(0..kinds.len())];
        let lasting = draw(&mut rng, faults.duration_max).max(Duration::from_millis(100));
        let lasting_ms = lasting.as_millis();
        match kind {
            0 => {
                if world.crash_node(index) {
                    world.log(format!("fault: crash n{index} for {lasting_ms} ms"));
                    let w = world.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(lasting).await;
                        if !w.healing.load(Ordering::SeqCst) {
                            w.log(format!("fault over: restart n{index}"));
                            w.start_node(index);
                        }
                    });
                }
            }
            1 => {
                if let Some(node) = world.node(index) {
                    world.log(format!(
                        "fault: partition n{index} from the bucket for {lasting_ms} ms"
                    ));
                    node.bucket.faults().set_partitioned(true);
                    let w = world.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(lasting).await;
                        // A crash meanwhile partitioned this client for good.
                        if w.node(index).is_some_and(|n| Arc::ptr_eq(&n, &node)) {
                            w.log(format!("fault over: n{index} reaches the bucket"));
                            node.bucket.faults().set_partitioned(false);
                        }
                    });
                }
            }
            2 => {
                if let Some(node) = world.node(index) {
                    world.log(format!(
                        "fault: pause n{index}'s heartbeat for {lasting_ms} ms"
                    ));
                    node.pause_until(Instant::now() + lasting);
                }
            }
            3 => {
                if let Some(node) = world.node(index) {
                    let request = draw(&mut rng, faults.slow_request_latency_max);
                    let reply = draw(&mut rng, faults.slow_reply_latency_max);
                    world.log(format!(
                        "fault: slow bucket for n{index} (request up to {} ms, reply up to {} ms) for {lasting_ms} ms",
                        (request * 2).as_millis(),
                        reply.as_millis()
                    ));
                    node.bucket.faults().set_latency(request, request);
                    node.bucket.set_reply_latency_max(reply);
                    let w = world.clone();
                    let base = (
                        draw(&mut rng, faults.request_latency_max),
                        draw(&mut rng, faults.reply_latency_max),
                    );
                    tokio::spawn(async move {
                        tokio::time::sleep(lasting).await;
                        w.log(format!("fault over: n{index}'s bucket is fast again"));
                        node.bucket.faults().set_latency(base.0, base.0);
                        node.bucket.set_reply_latency_max(base.1);
                    });
                }
            }
            _ => {
                if let Some(node) = world.node(index) {
                    let unavailable = rng.random_range(0.0..=faults.unavailable_probability_max);
                    let lost = rng.random_range(0.0..=faults.reply_lost_probability_max);
                    world.log(format!(
                        "fault: flaky bucket for n{index} (unavailable {unavailable:.2}, reply lost {lost:.2}) for {lasting_ms} ms"
                    ));
                    node.bucket
                        .faults()
                        .set_unavailable_probability(unavailable);
                    node.bucket.faults().set_reply_lost_probability(lost);
                    let w = world.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(lasting).await;
                        w.log(format!("fault over: n{index}'s bucket is reliable again"));
                        node.bucket.faults().set_unavailable_probability(0.0);
                        node.bucket.faults().set_reply_lost_probability(0.0);
                    });
                }
            }
        }
    }
}

/// Ends every fault: restarts crashed nodes, reconnects and unpauses the
/// others, takes the latency away.
fn heal_all(world: &Arc<World>) {
    world.log("heal every fault");
    for index in 0..world.config.nodes {
        match world.node(index) {
            Some(node) => {
                node.bucket.heal();
                node.unpause();
            }
            None => world.start_node(index),
        }
    }
}
