//! Deterministic simulation of the cluster (ADR 0006).
//!
//! N nodes run in one process on a current-thread tokio runtime whose clock
//! is paused: time is virtual and jumps ahead whenever every task waits, so
//! minutes of cluster life take milliseconds. Each node is a real
//! `wasmkeep_server::Node`: its heartbeat loop, `ensure_owner`, mailboxes,
//! alarm timer and sweep, drain, move and delete code and signed node calls run
//! unchanged; time, randomness, the bucket, peer calls and the guest reach it
//! through the server's traits. Every source of nondeterminism is drawn from
//! the seed: the clients' events, the operator's drains, moves, deletes and alarms,
//! the faults (bucket latency, unavailability, lost replies, partitions from
//! the bucket and from the other nodes, crashes, pauses), node incarnations,
//! network delays and losses. There is no real I/O and no other thread, and
//! the harness and the node keep their state in ordered maps, so a seed
//! replays its run exactly ([`SimReport::digest`]).
//!
//! Checkers ([`truth`]) run at every commit and at the end.
//!
//! Modules: `clock` (a node's skewed clock), `bucket` (a node's bucket client
//! and the ground-truth taps), `guest` (the built-in counter actor),
//! `transport` (the network), `node` (a node process), `truth` (ground
//! truth, trace, checkers).

pub mod bucket;
pub mod clock;
pub mod config;
pub mod guest;
pub mod node;
pub mod transport;
pub mod truth;

use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use wasmkeep_bucket::{Bucket, MemoryBucket};
use wasmkeep_types::{ActorId, AppName, ClassName, Keys, NodeId};

pub use crate::config::{FaultConfig, OperatorConfig, Scenario, SimConfig};

use crate::bucket::SimBucket;
use crate::node::SimNode;
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

/// With `SIM_LOG=<filter>` set (a `tracing` filter such as
/// `wasmkeep_server=debug`), the nodes' own logs go to stderr: what a node
/// decided and why, next to the trace's record of what happened. Their
/// timestamps are the host's, not the simulation's; their order is the
/// run's. Does nothing without the variable or when a subscriber is set.
pub fn logs_from_env() {
    if let Ok(filter) = std::env::var("SIM_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
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
const PURPOSE_OPERATOR: u64 = 5;
/// Node `i`'s `k`-th start draws from purposes `1000 + 1000 * i + 2k (+1)`.
const PURPOSE_NODES: u64 = 1000;

struct Slot {
    node: Option<Arc<SimNode>>,
    /// A start is under way (it may wait for a flaky bucket).
    starting: bool,
    starts: u64,
    skew_ms: i64,
}

/// Everything the simulated nodes share: the bucket, the network, the ground
/// truth, the slots that say which process of each node is running.
pub struct World {
    pub config: SimConfig,
    pub start: Instant,
    pub truth: Arc<Mutex<Truth>>,
    pub keys: Keys,
    root: MemoryBucket,
    slots: Vec<Mutex<Slot>>,
    network_rng: Mutex<StdRng>,
    /// Nodes cut off from every other node (network partitions).
    cut: Mutex<BTreeSet<usize>>,
    healing: AtomicBool,
}

/// How long a node start that failed waits before the next try.
const START_RETRY_DELAY: Duration = Duration::from_secs(1);

impl World {
    fn new(config: SimConfig) -> Arc<Self> {
        let start = Instant::now();
        let mut setup = StdRng::seed_from_u64(sub_seed(config.seed, PURPOSE_SETUP));
        let skew_max_ms = i64::try_from(config.skew_max.as_millis()).unwrap_or(i64::MAX);
        let slots = (0..config.nodes)
            .map(|_| {
                Mutex::new(Slot {
                    node: None,
                    starting: false,
                    starts: 0,
                    skew_ms: setup.random_range(-skew_max_ms..=skew_max_ms),
                })
            })
            .collect();
        Arc::new(Self {
            truth: Arc::new(Mutex::new({
                let mut truth = Truth::new(start, config.lease_ttl);
                truth.alarm_lateness_max = config.alarm_lateness_max;
                truth
            })),
            keys: Keys::new(&AppName::default_app()),
            root: MemoryBucket::with_seed(sub_seed(config.seed, PURPOSE_SETUP)),
            slots,
            network_rng: Mutex::new(StdRng::seed_from_u64(sub_seed(
                config.seed,
                PURPOSE_FORWARD,
            ))),
            cut: Mutex::new(BTreeSet::new()),
            healing: AtomicBool::new(false),
            start,
            config,
        })
    }

    pub fn skew_ms(&self, index: usize) -> i64 {
        self.slots[index].lock().skew_ms
    }

    /// Counter actor `index` (clients increment it).
    pub fn actor(&self, index: usize) -> ActorId {
        ActorId::parse(&format!("t/counter/c{index}")).expect("a valid actor id")
    }

    /// Alarm actor `index` (only alarms are set on it).
    pub fn alarm_actor(&self, index: usize) -> ActorId {
        ActorId::parse(&format!("t/counter/a{index}")).expect("a valid actor id")
    }

    pub fn index_of(&self, node: &NodeId) -> Option<usize> {
        let index: usize = node.as_str().strip_prefix('n')?.parse().ok()?;
        (index < self.slots.len()).then_some(index)
    }

    /// The running process of node `index`, if any.
    pub fn node(&self, index: usize) -> Option<Arc<SimNode>> {
        self.slots[index].lock().node.clone()
    }

    /// The true wall clock (no skew), in ms.
    pub fn wall_ms(&self) -> i64 {
        let since = Instant::now().saturating_duration_since(self.start);
        clock::EPOCH_MS.saturating_add(i64::try_from(since.as_millis()).unwrap_or(i64::MAX))
    }

    /// Whether the network between `a` and `b` is cut.
    pub fn is_cut(&self, a: usize, b: usize) -> bool {
        let cut = self.cut.lock();
        a != b && (cut.contains(&a) || cut.contains(&b))
    }

    /// One node call's draws: request lost, answer lost, delay there, delay back.
    pub fn network_draw(&self) -> (bool, bool, Duration, Duration) {
        let faults = &self.config.faults;
        let mut rng = self.network_rng.lock();
        let p = faults.forward_loss_probability.clamp(0.0, 1.0);
        let lost_request = p > 0.0 && rng.random_bool(p);
        let lost_reply = p > 0.0 && rng.random_bool(p);
        let there = draw(&mut rng, faults.forward_delay_max);
        let back = draw(&mut rng, faults.forward_delay_max);
        (lost_request, lost_reply, there, back)
    }

    /// Starts node `index` unless it runs or is starting: a new process, a
    /// new bucket client, a new incarnation. A start the bucket refuses is
    /// tried again (as a supervisor would restart the process).
    fn start_node(self: &Arc<Self>, index: usize) {
        {
            let mut slot = self.slots[index].lock();
            if slot.node.is_some() || slot.starting {
                return;
            }
            slot.starting = true;
        }
        let world = self.clone();
        tokio::spawn(async move {
            loop {
                let starts = {
                    let mut slot = world.slots[index].lock();
                    slot.starts += 1;
                    slot.starts
                };
                let purpose = PURPOSE_NODES + 1000 * index as u64 + 2 * starts;
                let client = world.root.new_client(sub_seed(world.config.seed, purpose));
                let faults = &world.config.faults;
                let mut setup = StdRng::seed_from_u64(sub_seed(world.config.seed, purpose + 1));
                let latency = draw(&mut setup, faults.request_latency_max);
                client.faults().set_latency(latency, latency);
                let bucket = Arc::new(SimBucket::new(
                    client,
                    &format!("n{index}"),
                    world.keys.clone(),
                    world.truth.clone(),
                    setup.random(),
                ));
                bucket.set_reply_latency_max(draw(&mut setup, faults.reply_latency_max));
                let seed: u64 = setup.random();
                world.log(format!("start n{index} (start {starts})"));
                match SimNode::start(&world, index, bucket.clone(), seed).await {
                    Ok(node) => {
                        world.truth.lock().log(
                            node.name(),
                            format!(
                                "started, incarnation {}",
                                node.node.peering.lease.incarnation()
                            ),
                        );
                        let mut slot = world.slots[index].lock();
                        slot.node = Some(node);
                        slot.starting = false;
                        return;
                    }
                    Err(e) => {
                        // The failed process is gone: nothing of it writes again.
                        bucket.faults().set_partitioned(true);
                        world.log(format!("start of n{index} failed: {e}"));
                        tokio::time::sleep(START_RETRY_DELAY).await;
                    }
                }
            }
        });
    }

    fn crash_node(&self, index: usize) -> bool {
        let node = self.slots[index].lock().node.take();
        match node {
            Some(node) => {
                node.crash();
                self.truth.lock().log(node.name(), "crash");
                true
            }
            None => false,
        }
    }

    /// A client's request to node `index`, as HTTP would hand it to the
    /// node (no signature: an ordinary client request). `None` when the
    /// node is down.
    pub async fn client_request(
        &self,
        index: usize,
        actor: &ActorId,
        rest: &str,
        body: String,
    ) -> Option<wasmkeep_server::peering::peer::PeerReply> {
        let node = self.node(index)?;
        let path = format!(
            "{}{rest}",
            wasmkeep_server::peering::forward::actor_path(actor)
        );
        Some(
            wasmkeep_server::front::http::answer_call(
                &node.node,
                "POST",
                &path,
                "",
                Vec::new(),
                body.into_bytes(),
            )
            .await,
        )
    }

    fn log(&self, what: impl AsRef<str>) {
        self.truth.lock().log("SIM", what);
    }

    /// Node `target` answered a take of the actor at `path`, sent by node
    /// `from`, with 409 naming `from` as the holder: the old owner claimed
    /// the actor back after releasing it for its own move (ADR 0017 forwards
    /// its events to the target instead).
    pub fn take_found_sender_holding(&self, from: usize, target: usize, path: &str) {
        self.truth.lock().violation(format!(
            "{} n{from} moved {path} to n{target}, whose take found n{from} holding the actor again",
            truth::MOVE_UNDONE
        ));
    }

    /// Node `target` answered 200 to a take of the actor at `path`: the
    /// move is done, so `target` must hold the actor now.
    pub fn take_answered(&self, target: usize, path: &str) {
        let actor = match wasmkeep_server::front::route::route(path, None) {
            Ok(wasmkeep_server::front::route::Route::Actor { actor, .. }) => actor,
            _ => {
                self.truth.lock().violation(format!(
                    "{} a take of {path}, not an actor",
                    truth::MOVE_UNDONE
                ));
                return;
            }
        };
        self.truth.lock().check_taken(
            &format!("n{target}"),
            &self.keys.owner(&actor),
            &actor.to_string(),
        );
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

/// Deploys the built-in counter class, as `wasmkeep deploy` would.
async fn deploy(world: &World) {
    let class = ClassName::new("counter").expect("a valid class name");
    let limits = match wasmkeep_server::actor::classes::ClassLimits::default()
        .with_retention(Some(world.config.retention))
    {
        Ok(limits) => limits,
        Err(e) => {
            world.log(format!("deploy failed: {e}"));
            return;
        }
    };
    let bucket = node::checker_bucket(&world.root);
    let engine = guest::SimEngine::new(Arc::new(guest::GuestContext {
        node_name: "deploy".into(),
        truth: world.truth.clone(),
        keys: world.keys.clone(),
        alive: Arc::new(AtomicBool::new(true)),
        node: Mutex::new(std::sync::Weak::new()),
    }));
    if let Err(e) = wasmkeep_server::actor::classes::deploy_with(
        &*bucket,
        &world.keys,
        &class,
        guest::COUNTER_CLASS_BYTES.to_vec(),
        limits,
        &engine,
    )
    .await
    {
        world.log(format!("deploy failed: {e}"));
    }
}

async fn run_in_runtime(config: SimConfig) -> SimReport {
    let world = World::new(config);
    deploy(&world).await;
    for index in 0..world.config.nodes {
        world.start_node(index);
    }
    let clients = tokio::spawn(client_driver(world.clone()));
    let faults = tokio::spawn(fault_driver(world.clone()));
    let operator = tokio::spawn(operator_driver(world.clone()));
    let _ = clients.await;
    world.healing.store(true, Ordering::SeqCst);
    let _ = faults.await;
    let _ = operator.await;
    heal_all(&world);
    tokio::time::sleep(world.config.settle).await;
    check_drained(&world).await;
    {
        let mut truth = world.truth.lock();
        truth.stopped_ms = Some(truth.now_ms());
        // A node's wall clock is behind by up to the skew; its alarms fire
        // that much later.
        truth.clock_behind_max = world.config.skew_max + Duration::from_secs(2);
    }
    world.log("stop every node");
    for index in 0..world.config.nodes {
        world.crash_node(index);
    }
    // Let failing flushers finish before the final read.
    tokio::time::sleep(world.config.lease_ttl).await;
    let actors: Vec<ActorId> = (0..world.config.actors)
        .map(|i| world.actor(i))
        .chain((0..world.config.operator.alarm_actors).map(|i| world.alarm_actor(i)))
        .collect();
    for actor in actors {
        let bucket = node::checker_bucket(&world.root);
        match node::read_counter(bucket, &world.keys, &actor).await {
            Ok(found) => {
                let mut truth = world.truth.lock();
                truth.check_counter(&actor.to_string(), found.n, &found.events);
                truth.check_failed_writes(&actor.to_string(), &found.events);
                truth.check_history(&actor.to_string(), &found.events);
            }
            Err(e) => world
                .truth
                .lock()
                .violation(format!("{} {actor}: {e}", truth::RESTORE_FAILED)),
        }
    }
    world.truth.lock().check_alarms();
    let simulated = Instant::now().saturating_duration_since(world.start);
    let truth = world.truth.lock();
    SimReport {
        seed: world.config.seed,
        digest: truth.digest_hex(),
        trace: truth.trace().to_vec(),
        violations: truth.violations().to_vec(),
        violations_total: truth.violations_total(),
        acknowledged: truth.acknowledged_total(),
        committed: truth.committed_total(),
        simulated,
    }
}

/// At the end, faults healed: a node whose drain key is there reports
/// `drained` and holds no actor.
async fn check_drained(world: &Arc<World>) {
    let bucket = node::checker_bucket(&world.root);
    for index in 0..world.config.nodes {
        let Some(node) = world.node(index) else {
            continue;
        };
        let key = world.keys.drain(&node.id);
        if bucket.head(&key).await.is_err() {
            continue;
        }
        let state = node.node.peering.drain.state();
        let resident = node.node.residents.count();
        world.truth.lock().log(
            node.name(),
            format!("drain key present: state {state:?}, {resident} resident"),
        );
        if resident > 0 || state != wasmkeep_types::heartbeat::DrainState::Drained {
            world.truth.lock().violation(format!(
                "{} {} drains (state {state:?}) and still holds {resident} actors after the faults healed",
                truth::DRAINED_HOLDS,
                node.name()
            ));
        }
    }
}

/// Clients send increments of random actors to random nodes, each request
/// in its own task (clients do not wait for each other).
async fn client_driver(world: Arc<World>) {
    let mut rng = StdRng::seed_from_u64(sub_seed(world.config.seed, PURPOSE_CLIENTS));
    let mut requests = tokio::task::JoinSet::new();
    for id in 0..world.config.client_events as u64 {
        tokio::time::sleep(draw(&mut rng, world.config.client_gap_max)).await;
        while requests.try_join_next().is_some() {}
        let actor = world.actor(rng.random_range(0..world.config.actors));
        let index = rng.random_range(0..world.config.nodes);
        let w = world.clone();
        requests.spawn(async move {
            let who = format!("n{index}");
            let sent_ms = w.truth.lock().now_ms();
            let reply = w
                .client_request(index, &actor, "/inc", id.to_string())
                .await;
            let mut truth = w.truth.lock();
            match reply {
                Some(reply) if reply.status == 200 => {
                    truth.increment_acked(&actor.to_string(), sent_ms);
                    let answered = String::from_utf8_lossy(&reply.body).trim().parse().ok();
                    truth.increment_answered(&actor.to_string(), id, sent_ms, answered);
                    truth.log(
                        &who,
                        format!(
                            "event {id} {actor}: acknowledged ({})",
                            String::from_utf8_lossy(&reply.body)
                        ),
                    );
                }
                Some(reply) => {
                    if reply.status != 504 {
                        truth.increment_failed(&actor.to_string(), id, reply.status);
                    }
                    truth.log(
                        &who,
                        format!(
                            "event {id} {actor}: refused {} {}",
                            reply.status,
                            String::from_utf8_lossy(&reply.body).trim()
                        ),
                    );
                }
                None => truth.log(&who, format!("event {id} {actor}: refused: node down")),
            }
        });
    }
    // Requests still in flight end before the faults heal (each has a limit).
    while requests.join_next().await.is_some() {}
    world.log("clients done");
}

/// The operator drains and undrains nodes, moves and deletes actors and sets alarms,
/// at random gaps, until the clients are done.
async fn operator_driver(world: Arc<World>) {
    let op = world.config.operator.clone();
    let mut rng = StdRng::seed_from_u64(sub_seed(world.config.seed, PURPOSE_OPERATOR));
    let mut kinds = Vec::new();
    for (on, kind) in [
        (op.drains, 0),
        (op.moves, 1),
        (op.moves_then_drain && op.alarm_actors > 0, 2),
        (op.alarms && op.alarm_actors > 0, 3),
        (op.deletes, 4),
    ] {
        if on {
            kinds.push(kind);
        }
    }
    if kinds.is_empty() {
        return;
    }
    let root = node::checker_bucket(&world.root);
    let mut drained: Option<usize> = None;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..op.steps {
        tokio::time::sleep(draw(&mut rng, op.gap_max)).await;
        if world.healing.load(Ordering::SeqCst) {
            break;
        }
        let kind = kinds[rng.random_range(0..kinds.len())];
        let index = rng.random_range(0..world.config.nodes);
        match kind {
            0 => drained = drain_or_undrain(&world, &*root, drained, index).await,
            1 => {
                let actor = if op.alarm_actors > 0 && rng.random_bool(0.5) {
                    world.alarm_actor(rng.random_range(0..op.alarm_actors))
                } else {
                    world.actor(rng.random_range(0..world.config.actors))
                };
                write_move(&world, &*root, &actor, index).await;
            }
            2 => {
                // A move to a node that is asked to drain a moment later:
                // the take may meet the drain.
                let actor = world.alarm_actor(rng.random_range(0..op.alarm_actors));
                if write_move(&world, &*root, &actor, index).await && drained.is_none() {
                    tokio::time::sleep(draw(&mut rng, world.config.heartbeat_period)).await;
                    drained = drain_or_undrain(&world, &*root, None, index).await;
                }
            }
            4 => {
                let actor = world.actor(rng.random_range(0..world.config.actors));
                write_delete(&world, &*root, &actor).await;
            }
            _ => {
                let actor = world.alarm_actor(rng.random_range(0..op.alarm_actors));
                let delay = draw(&mut rng, op.alarm_delay_max);
                let at_ms = world.wall_ms() + i64::try_from(delay.as_millis()).unwrap_or(0);
                let w = world.clone();
                tasks.spawn(async move {
                    let who = format!("n{index}");
                    let reply = w
                        .client_request(index, &actor, "/alarm", at_ms.to_string())
                        .await;
                    let mut truth = w.truth.lock();
                    match reply {
                        Some(reply) if reply.status == 200 => {
                            truth.alarm_acked(&actor.to_string(), at_ms);
                            truth.log(&who, format!("alarm {at_ms} on {actor}: acknowledged"));
                        }
                        Some(reply) => truth.log(
                            &who,
                            format!("alarm {at_ms} on {actor}: refused {}", reply.status),
                        ),
                        None => truth.log(&who, format!("alarm {at_ms} on {actor}: node down")),
                    }
                });
            }
        }
    }
    while tasks.join_next().await.is_some() {}
}

/// Drains node `index` when no node drains (`wasmkeep node drain`), or
/// undrains the node that drains. Returns the node that drains now.
async fn drain_or_undrain(
    world: &World,
    root: &dyn Bucket,
    drained: Option<usize>,
    index: usize,
) -> Option<usize> {
    match drained {
        None => {
            let id = NodeId::new(format!("n{index}")).expect("a valid node id");
            let body = bytes::Bytes::from(format!("drain asked at {}\n", world.wall_ms()));
            match root.put(&world.keys.drain(&id), body).await {
                Ok(_) => {
                    world.log(format!("operator: drain n{index}"));
                    Some(index)
                }
                Err(e) => {
                    world.log(format!("operator: drain n{index} failed: {e}"));
                    None
                }
            }
        }
        Some(drained) => {
            let id = NodeId::new(format!("n{drained}")).expect("a valid node id");
            match root.delete(&world.keys.drain(&id)).await {
                Ok(()) => {
                    world.log(format!("operator: undrain n{drained}"));
                    None
                }
                Err(e) => {
                    world.log(format!("operator: undrain n{drained} failed: {e}"));
                    Some(drained)
                }
            }
        }
    }
}

/// Writes a delete key for `actor` (`wasmkeep actor delete`), unless one is
/// there already.
async fn write_delete(world: &World, root: &dyn Bucket, actor: &ActorId) {
    match root.list(&world.keys.delete_requests_prefix(actor)).await {
        Ok(pending) if pending.is_empty() => {}
        _ => return,
    }
    // Before the write: a node may carry the deletion out before the put
    // returns. Every request has a key of its own (ADR 0055).
    let request = world.truth.lock().next_delete_request();
    let key = world
        .keys
        .delete_key(actor, &format!("{request:x}"))
        .expect("a hex number is a valid request");
    world.truth.lock().delete_asked(&actor.to_string(), &key);
    let body = bytes::Bytes::from(format!("delete asked at {}\n", world.wall_ms()));
    match root.put_if_absent(&key, body).await {
        Ok(_) => world.log(format!("operator: delete {actor}")),
        Err(e) => {
            world.truth.lock().delete_not_asked(&actor.to_string());
            world.log(format!("operator: delete {actor} failed: {e}"));
        }
    }
}

/// Writes a move key for `actor` to node `target` (`wasmkeep actor move`),
/// unless a move of that actor is pending. Returns whether it wrote one.
async fn write_move(world: &World, root: &dyn Bucket, actor: &ActorId, target: usize) -> bool {
    let pending = match root.list(&world.keys.moves_prefix()).await {
        Ok(listed) => listed.iter().any(|meta| {
            world
                .keys
                .parse_move_key(&meta.key)
                .is_ok_and(|(a, _)| &a == actor)
        }),
        Err(_) => true,
    };
    if pending {
        return false;
    }
    let id = NodeId::new(format!("n{target}")).expect("a valid node id");
    let body = bytes::Bytes::from(format!("move asked at {}\n", world.wall_ms()));
    match root.put(&world.keys.move_key(actor, &id), body).await {
        Ok(_) => {
            world.log(format!("operator: move {actor} to n{target}"));
            true
        }
        Err(e) => {
            world.log(format!("operator: move {actor} to n{target} failed: {e}"));
            false
        }
    }
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
        (faults.network_partitions, 5),
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
                    world.log(format!("fault: pause n{index} for {lasting_ms} ms"));
                    node.bucket.stall_until(Instant::now() + lasting);
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
            4 => {
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
            _ => {
                world.log(format!(
                    "fault: cut n{index} off from the other nodes for {lasting_ms} ms"
                ));
                world.cut.lock().insert(index);
                let w = world.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(lasting).await;
                    w.log(format!("fault over: n{index} reaches the other nodes"));
                    w.cut.lock().remove(&index);
                });
            }
        }
    }
}

/// Ends every fault: restarts crashed nodes, reconnects and unpauses the
/// others, takes the latency away. Drains stay as the operator left them.
fn heal_all(world: &Arc<World>) {
    world.log("heal every fault");
    world.cut.lock().clear();
    for index in 0..world.config.nodes {
        match world.node(index) {
            Some(node) => node.bucket.heal(),
            None => world.start_node(index),
        }
    }
}
