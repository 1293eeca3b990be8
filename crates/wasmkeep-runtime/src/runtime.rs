//! [`Runtime`]: the one wasmtime `Engine` of the process, its pooling
//! allocator, the epoch ticker that bounds every event's time, and the
//! `Linker` holding every host import (the actor world and WASI p2).

use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use wasmkeep_types::ActorId;
use wasmtime::component::{HasSelf, Linker, ResourceTable};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, UpdateDeadline,
};
use wasmtime_wasi::WasiCtxBuilder;

use crate::bindings::Actor;
use crate::component::ClassComponent;
use crate::error::Error;
use crate::host::ActorHost;
use crate::outbound::{OutboundConfig, OutboundHooks, OutboundNode};
use crate::state::{Limits, State, TimeLimitExceeded};
use crate::stdio::{GuestOutput, StderrTail, Stream};

/// The wasmtime release this crate is built against (pinned with `=` in the
/// workspace); part of the precompiled-cache file names.
const WASMTIME_VERSION: &str = "48.0.8";
/// How often the ticker thread advances the engine's epoch. A running guest
/// checks its deadline (and yields to tokio) once per tick: the longest a
/// guest that computes keeps an async worker from the node's other tasks
/// (10 ms made every hop of a request wait that long behind a spinning
/// guest: ADR 0063).
pub(crate) const EPOCH_TICK: Duration = Duration::from_millis(2);
/// Core instances one component may contain (a Rust guest has a handful; a
/// componentize-js guest needs more).
const CORE_INSTANCES_PER_COMPONENT_MAX: u32 = 50;
/// Linear memories (and tables) one component may contain.
const MEMORIES_PER_COMPONENT_MAX: u32 = 10;
/// Pool slots for memories and tables per component instance: most guests
/// have one memory, so twice the instance count leaves room for a few
/// components with more.
const MEMORY_SLOTS_PER_INSTANCE: u32 = 2;
/// WASI resources (streams, pollables...) one instance may hold at once; the
/// table lives in host memory, outside the guest's memory limit.
const WASI_RESOURCES_MAX: usize = 10_000;
/// The smallest memory limit that makes sense: one wasm page.
const MEMORY_BYTES_MIN: usize = 64 * 1024;
/// The largest memory limit: a 32-bit linear memory.
const MEMORY_BYTES_LIMIT: usize = 4 << 30;

/// Limits and paths of a [`Runtime`].
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Where precompiled components (`.cwasm`) are kept; `None` compiles every
    /// component at each load.
    pub cache_dir: Option<PathBuf>,
    /// The most bytes one linear memory of one instance may grow to.
    pub memory_bytes_max: usize,
    /// The longest one event (or one instantiation) may run, wall clock,
    /// including the time its host calls take.
    pub event_time_max: Duration,
    /// How many component instances may be live at once (the pool's size).
    pub instances_max: u32,
    /// The most elements one table of one instance may hold.
    pub table_elements_max: usize,
    /// Outbound HTTP's limits and extra CA (ADR 0066).
    pub outbound: OutboundConfig,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            cache_dir: None,
            memory_bytes_max: 128 << 20,
            event_time_max: Duration::from_secs(30),
            instances_max: 1000,
            table_elements_max: 100_000,
            outbound: OutboundConfig::default(),
        }
    }
}

impl RuntimeConfig {
    fn check(&self) -> Result<(), Error> {
        if !(MEMORY_BYTES_MIN..=MEMORY_BYTES_LIMIT).contains(&self.memory_bytes_max) {
            return Err(Error::Config(format!(
                "memory_bytes_max is {} bytes; it must be between {MEMORY_BYTES_MIN} and {MEMORY_BYTES_LIMIT}",
                self.memory_bytes_max
            )));
        }
        if self.event_time_max < EPOCH_TICK {
            return Err(Error::Config(format!(
                "event_time_max is {:?}; it must be at least the epoch tick, {EPOCH_TICK:?}",
                self.event_time_max
            )));
        }
        if self.instances_max == 0 {
            return Err(Error::Config("instances_max must be at least 1".into()));
        }
        if self.outbound.in_flight_per_actor == 0 || self.outbound.in_flight_per_node == 0 {
            return Err(Error::Config(
                "outbound requests in flight must be allowed at least 1 per actor and per node"
                    .into(),
            ));
        }
        if self.table_elements_max == 0 {
            return Err(Error::Config(
                "table_elements_max must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// One wasmtime `Engine` per process. Cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<RuntimeInner>,
}

pub(crate) struct RuntimeInner {
    pub(crate) engine: Engine,
    pub(crate) linker: Linker<State>,
    pub(crate) config: RuntimeConfig,
    /// `wasmtime<version>-<hash of the engine's compilation settings>`: a
    /// precompiled component is only reused by an engine with the same key.
    pub(crate) engine_key: String,
    pub(crate) outbound: Arc<OutboundNode>,
}

impl Runtime {
    pub fn new(config: RuntimeConfig) -> Result<Self, Error> {
        config.check()?;
        let engine =
            Engine::new(&engine_config(&config)).map_err(|e| Error::Engine(format!("{e:#}")))?;
        let mut linker = Linker::<State>::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(|e| Error::Engine(format!("{e:#}")))?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)
            .map_err(|e| Error::Engine(format!("{e:#}")))?;
        Actor::add_to_linker::<State, HasSelf<State>>(&mut linker, |state| state)
            .map_err(|e| Error::Engine(format!("{e:#}")))?;
        let outbound = Arc::new(OutboundNode {
            client: wasmkeep_transport::OutboundClient::new(config.outbound.extra_ca.as_deref())
                .map_err(|e| Error::Config(format!("outbound HTTP: {e}")))?,
            slots: Arc::new(tokio::sync::Semaphore::new(
                config.outbound.in_flight_per_node,
            )),
            config: config.outbound.clone(),
        });
        let engine_key = engine_key(&engine);
        start_epoch_ticker(&engine)?;
        Ok(Self {
            inner: Arc::new(RuntimeInner {
                engine,
                linker,
                config,
                engine_key,
                outbound,
            }),
        })
    }

    pub fn config(&self) -> &RuntimeConfig {
        &self.inner.config
    }

    /// Validates (is a component, implements world `actor`, imports only what
    /// the host gives), compiles or loads the precompiled cache. Errors name
    /// what is wrong; nothing is cached on error.
    pub fn load_component(&self, bytes: &[u8]) -> Result<ClassComponent, Error> {
        ClassComponent::load(self, bytes)
    }
}

impl RuntimeInner {
    /// A fresh store for one instance of `id`, owning `host`. WASI gets no
    /// preopened directory, no environment, no arguments and no network;
    /// stdout and stderr go to `tracing` (target `guest`).
    pub(crate) fn new_store(&self, id: ActorId, host: Box<dyn ActorHost>) -> Store<State> {
        let label: Arc<str> = Arc::from(id.to_string());
        let stderr_tail = StderrTail::default();
        let wasi = WasiCtxBuilder::new()
            .stdout(GuestOutput::new(
                label.clone(),
                Stream::Stdout,
                stderr_tail.clone(),
            ))
            .stderr(GuestOutput::new(
                label.clone(),
                Stream::Stderr,
                stderr_tail.clone(),
            ))
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        let mut table = ResourceTable::new();
        table.set_max_capacity(WASI_RESOURCES_MAX);
        let deadline = Instant::now() + self.config.event_time_max;
        let outbound = OutboundHooks {
            node: Arc::clone(&self.outbound),
            scope: host.outbound(),
            slots: Arc::new(tokio::sync::Semaphore::new(
                self.config.outbound.in_flight_per_actor,
            )),
            deadline,
            actor: label,
        };
        let state = State {
            host,
            id,
            wasi,
            table,
            http: wasmtime_wasi_http::WasiHttpCtx::new(),
            outbound,
            limits: Limits {
                memory_bytes_max: self.config.memory_bytes_max,
                table_elements_max: self.config.table_elements_max,
            },
            event_deadline: deadline,
            stderr_tail,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|state| &mut state.limits);
        // At each tick past the store's epoch deadline: stop the guest once the
        // event's deadline has passed, otherwise yield to tokio so a long
        // event does not hold a worker thread, and look again next tick.
        store.epoch_deadline_callback(|context| {
            if Instant::now() >= context.data().event_deadline {
                return Err(wasmtime::Error::new(TimeLimitExceeded));
            }
            Ok(UpdateDeadline::Yield(1))
        });
        store
    }
}

fn engine_config(config: &RuntimeConfig) -> Config {
    let instances = config.instances_max;
    let slots = instances.saturating_mul(MEMORY_SLOTS_PER_INSTANCE);
    let mut pool = PoolingAllocationConfig::new();
    pool.total_component_instances(instances)
        .total_core_instances(instances.saturating_mul(CORE_INSTANCES_PER_COMPONENT_MAX))
        .max_core_instances_per_component(CORE_INSTANCES_PER_COMPONENT_MAX)
        .max_memories_per_component(MEMORIES_PER_COMPONENT_MAX)
        .max_tables_per_component(MEMORIES_PER_COMPONENT_MAX)
        .total_memories(slots)
        .total_tables(slots)
        // One fiber stack per event in flight; at most one event per instance.
        .total_stacks(instances)
        .max_memory_size(config.memory_bytes_max)
        .table_elements(config.table_elements_max)
        // Freed slots are decommitted in batches: one madvise (and one TLB
        // shootdown across cores) per batch instead of per instance.
        .decommit_batch_size(DECOMMIT_BATCH)
        .linear_memory_keep_resident(LINEAR_MEMORY_KEEP_RESIDENT)
        .table_keep_resident(TABLE_KEEP_RESIDENT)
        // A freed fiber stack goes back to the system whole (below).
        .async_stack_keep_resident(0)
        .pagemap_scan(wasmtime::Enabled::Auto);
    let mut engine_config = Config::new();
    engine_config
        .wasm_component_model(true)
        // A store keeps its fiber stack while its instance is loaded. Once
        // the store is dropped (the instance unloaded or the actor gone) the
        // stack's pages are given back, batched like the memories: without
        // this every stack ever used kept the pages its deepest event touched
        // (~8 KiB), about two stacks per busy actor as the pool spreads them
        // over one shard per core. The next event's store faults a few pages
        // in, and no data of one actor's host frames is left on a stack
        // another actor's event may get (docs/adr/0024-instance-idle-timeout.md).
        .async_stack_zeroing(true)
        .epoch_interruption(true)
        // Reserve only what a memory may grow to, plus a small guard: with
        // wasmtime's default (4 GiB reserved per memory slot) ten thousand
        // resident actors would need more address space than x86-64 has.
        // Bounds checks become explicit, a small cost per memory access.
        .memory_reservation(config.memory_bytes_max as u64)
        .memory_guard_size(MEMORY_GUARD_BYTES)
        .memory_reservation_for_growth(0)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    engine_config
}

/// Slots freed before their memory is given back to the system together.
const DECOMMIT_BATCH: usize = 32;

/// Bytes of a freed slot's linear memory that are reset in place (only the
/// pages the instance dirtied, found with the `PAGEMAP_SCAN` ioctl where the
/// kernel has it, Linux 6.7+) instead of being given back with `madvise`.
/// The next instance in the slot then takes no page faults on them, and no
/// fault replaces a zero page, which costs a TLB shootdown across cores: in
/// a profile of first touches (S2) those were a tenth of the node's CPU.
/// Only slots in use or warm keep pages, so resident memory per live actor
/// is unchanged.
const LINEAR_MEMORY_KEEP_RESIDENT: usize = 1 << 20;

/// The same for a freed slot's tables (a guest's function table is filled
/// lazily, at first use of each entry).
const TABLE_KEEP_RESIDENT: usize = 64 << 10;

/// Guard pages after each linear memory.
const MEMORY_GUARD_BYTES: u64 = 64 * 1024;

/// Feeds a `Hash` into SHA-256, so the engine's compatibility hash is stable
/// across processes (std's `DefaultHasher` promises no such thing).
struct Sha256Hasher(Sha256);

impl Hasher for Sha256Hasher {
    fn finish(&self) -> u64 {
        let digest = self.0.clone().finalize();
        u64::from_le_bytes(
            digest[..8]
                .try_into()
                .expect("a SHA-256 digest has 32 bytes"),
        )
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

fn engine_key(engine: &Engine) -> String {
    let mut hasher = Sha256Hasher(Sha256::new());
    engine.precompile_compatibility_hash().hash(&mut hasher);
    let digest = hex::encode(hasher.0.finalize());
    format!("wasmtime{WASMTIME_VERSION}-{}", &digest[..16])
}

/// One thread per engine advances the epoch every [`EPOCH_TICK`]; it ends by
/// itself once the engine (every clone of it) is gone.
fn start_epoch_ticker(engine: &Engine) -> Result<(), Error> {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("wasmkeep-epoch".into())
        .spawn(move || {
            loop {
                std::thread::sleep(EPOCH_TICK);
                match weak.upgrade() {
                    Some(engine) => engine.increment_epoch(),
                    None => return,
                }
            }
        })
        .map(drop)
        .map_err(|e| Error::Engine(format!("could not start the epoch ticker thread: {e}")))
}
